/*
 * plugin_loader — loads one handler plugin (include/idemq/plugin.h) and unloads it again.
 *
 * plugin_open dlopens the shared object, looks up idemq_plugin_entry, checks the ABI version and
 * calls the plugin's init with the handler's config subtree and the host table
 * (plugin_host.h). An ABI mismatch, a missing symbol or a failing init is a startup error with a
 * message saying what to fix.
 * Errors: plugin_open returns 0 or -1 with a reason in the caller's err buffer.
 * Thread affinity: open/close on the main thread; plugin_handle on the DB workers (the plugin's
 * handle() must be thread-safe, as the ABI says).
 */
#ifndef IDEMQ_HANDLERS_PLUGIN_LOADER_H
#define IDEMQ_HANDLERS_PLUGIN_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "idemq/plugin.h"

typedef struct plugin plugin;

/*
 * Loads the plugin at path (borrowed) and initialises it with config_json (borrowed; NULL means
 * "{}"). On success returns 0 and an owned plugin in *out; otherwise -1 with a reason in err.
 */
int plugin_open(const char *path, const char *config_json, plugin **out, char *err, size_t err_len);

/* The plugin's name (borrowed from the plugin) and the ABI version it declared. */
const char *plugin_name(const plugin *p);
uint32_t plugin_abi_version(const plugin *p);

/* Calls the plugin's handle() with its state and the host table: msg and tx borrowed for the
 * call, reason (reason_len bytes) filled by the plugin. Returns what handle() returned. */
idemq_result plugin_handle(const plugin *p, const idemq_message *msg, idemq_tx *tx, char *reason,
                           size_t reason_len);

/* Calls the plugin's free and unloads it. plugin_close(NULL) is a no-op. */
void plugin_close(plugin *p);

#endif
