/*
 * bad_abi — a test plugin that declares a plugin ABI version idemq does not speak. idemq must
 * refuse it at startup with a clear message and exit 2.
 */
#include <idemq/plugin.h>

static idemq_result bad_handle(void *state, const idemq_host_v1 *host, const idemq_message *msg,
                               idemq_tx *tx, char *reason, size_t reason_len)
{
    (void)state, (void)host, (void)msg, (void)tx, (void)reason, (void)reason_len;
    return IDEMQ_OK;
}

static const idemq_plugin_v1 bad_plugin = {
    .abi_version = 42, /* far beyond any version idemq speaks */
    .name = "bad_abi",
    .handle = bad_handle,
};

IDEMQ_PLUGIN_EXPORT const idemq_plugin_v1 *idemq_plugin_entry(void)
{
    return &bad_plugin;
}
