/*
 * plugin — loads handler plugins (include/idemq/plugin.h) and runs them inside the transaction.
 *
 * Loading: plugin_open dlopens the shared object, looks up idemq_plugin_entry, checks the ABI
 * version and calls the plugin's init with the handler's config subtree. An ABI mismatch, a
 * missing symbol or a failing init is a startup error with a message saying what to fix.
 *
 * Running: `idemq run` loads every plugin consumer into a process-wide registry before the DB
 * workers start and unloads it after they have been joined; in between the registry is read-only,
 * so workers read it without locks. A registry (instead of a handle threaded through the store)
 * keeps the store's worker interface unchanged: handler_apply finds the plugin by its consumer.
 * The per-worker handler state (handler_call.state) holds the host side of exec: a small cache of
 * prepared statements on that worker's connection.
 * Errors: plugin_open and plugin_registry_load return 0 or -1 with a reason in the caller's err
 * buffer; the handler functions as in handlers/handler.h.
 * Thread affinity: open/close and registry load/unload on the main thread; apply on DB workers.
 */
#ifndef IDEMQ_HANDLERS_PLUGIN_H
#define IDEMQ_HANDLERS_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "handlers/handler.h"

typedef struct plugin plugin;

/*
 * Loads the plugin at path (borrowed) and initialises it with config_json (borrowed; NULL means
 * "{}"). On success returns 0 and an owned plugin in *out; otherwise -1 with a reason in err.
 */
int plugin_open(const char *path, const char *config_json, plugin **out, char *err, size_t err_len);

/* The plugin's name (borrowed from the plugin) and the ABI version it declared. */
const char *plugin_name(const plugin *p);
uint32_t plugin_abi_version(const plugin *p);

/* Calls the plugin's free and unloads it. plugin_close(NULL) is a no-op. */
void plugin_close(plugin *p);

/*
 * Opens the plugin of every consumer with type: plugin (cfg borrowed, must outlive the registry).
 * Returns 0, or -1 with the first problem in err (nothing stays loaded then). Call before the DB
 * workers start.
 */
int plugin_registry_load(const config *cfg, char *err, size_t err_len);

/* Closes every registered plugin. Call after the DB workers have been joined. */
void plugin_registry_unload(void);

/* handler_apply and handler_release for type: plugin (handler_prepare_all has nothing to do: a
 * plugin's statements are its own). */
apply_status plugin_handler_apply(handler_call *call);
void plugin_handler_release(const config_consumer *consumer, void *state);

#endif
