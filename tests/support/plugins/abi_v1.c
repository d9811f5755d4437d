/*
 * abi_v1 — a test plugin built for plugin ABI version 1, before host->emit existed. idemq must
 * still load it (versions only append to the host table) and run it.
 */
#include <idemq/plugin.h>

static idemq_result v1_handle(void *state, const idemq_host_v1 *host, const idemq_message *msg,
                              idemq_tx *tx, char *reason, size_t reason_len)
{
    (void)state, (void)host, (void)msg, (void)tx, (void)reason, (void)reason_len;
    return IDEMQ_OK;
}

static const idemq_plugin_v1 v1_plugin = {
    .abi_version = 1, /* what a plugin built against the version 1 header declared */
    .name = "abi_v1",
    .handle = v1_handle,
};

IDEMQ_PLUGIN_EXPORT const idemq_plugin_v1 *idemq_plugin_entry(void)
{
    return &v1_plugin;
}
