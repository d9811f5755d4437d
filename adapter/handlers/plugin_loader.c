/*
 * plugin_loader — see handlers/plugin_loader.h.
 */
#include "handlers/plugin_loader.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/plugin_host.h"

struct plugin {
    void *so;                    /* dlopen handle */
    const idemq_plugin_v1 *desc; /* borrowed from the shared object */
    void *state;                 /* the plugin's, from init */
    char *path;
};

int plugin_open(const char *path, const char *config_json, plugin **out, char *err, size_t err_len)
{
    typedef const idemq_plugin_v1 *(*entry_fn)(void);
    char init_err[512] = "";
    plugin *p = NULL;
    void *so, *sym;
    entry_fn entry;
    const idemq_plugin_v1 *desc;

    *out = NULL;
    so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        const char *why = dlerror();
        snprintf(err, err_len, "cannot load plugin %s: %s", path, why ? why : "unknown error");
        return -1;
    }
    dlerror();
    sym = dlsym(so, IDEMQ_PLUGIN_ENTRY_SYMBOL);
    if (!sym) {
        snprintf(err, err_len,
                 "plugin %s does not export %s(): it is not an idemq plugin, or was not built "
                 "against include/idemq/plugin.h (export the symbol with IDEMQ_PLUGIN_EXPORT)",
                 path, IDEMQ_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    memcpy(&entry, &sym, sizeof entry); /* object → function pointer, as POSIX dlsym intends */
    desc = entry();
    if (!desc) {
        snprintf(err, err_len, "plugin %s: %s() returned NULL", path, IDEMQ_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    /* abi_version is the first member in every version, so reading it is always safe. */
    if (desc->abi_version < IDEMQ_PLUGIN_ABI_OLDEST ||
        desc->abi_version > IDEMQ_PLUGIN_ABI_VERSION) {
        snprintf(err, err_len,
                 "plugin %s has plugin ABI version %u, but this idemq loads versions %d to %d: "
                 "rebuild the plugin against this idemq's include/idemq/plugin.h",
                 path, (unsigned)desc->abi_version, IDEMQ_PLUGIN_ABI_OLDEST,
                 IDEMQ_PLUGIN_ABI_VERSION);
        goto fail;
    }
    if (!desc->handle) {
        snprintf(err, err_len, "plugin %s has no handle function", path);
        goto fail;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(path))) {
        snprintf(err, err_len, "out of memory loading plugin %s", path);
        goto fail;
    }
    p->so = so;
    p->desc = desc;
    if (desc->init && desc->init(&plugin_host_table, config_json ? config_json : "{}", &p->state,
                                 init_err, sizeof init_err) != 0) {
        init_err[sizeof init_err - 1] = '\0';
        snprintf(err, err_len, "plugin %s (%s) refused its config: %s", path,
                 desc->name ? desc->name : "unnamed", init_err[0] ? init_err : "init failed");
        goto fail;
    }
    *out = p;
    return 0;
fail:
    if (p)
        free(p->path);
    free(p);
    dlclose(so);
    return -1;
}

const char *plugin_name(const plugin *p)
{
    return p->desc->name && p->desc->name[0] ? p->desc->name : "(unnamed)";
}

uint32_t plugin_abi_version(const plugin *p)
{
    return p->desc->abi_version;
}

idemq_result plugin_handle(const plugin *p, const idemq_message *msg, idemq_tx *tx, char *reason,
                           size_t reason_len)
{
    return p->desc->handle(p->state, &plugin_host_table, msg, tx, reason, reason_len);
}

void plugin_close(plugin *p)
{
    if (!p)
        return;
    if (p->desc->free)
        p->desc->free(p->state);
    dlclose(p->so);
    free(p->path);
    free(p);
}
