/*
 * plugin — the plugin handler: which loaded plugin serves which consumer, and handler_apply for
 * type: plugin (a plugin's handle() inside idemq's transaction, its result mapped to an
 * apply_status).
 *
 * `idemq run` loads every plugin consumer into a process-wide registry before the DB workers
 * start and unloads it after they have been joined; in between the registry is read-only, so
 * workers read it without locks. It is a global because its callers (cli/run.c) load and unload
 * it without a handle, and the store's worker interface has none to pass: handler_apply finds
 * the plugin by its consumer. (Owned by the store pool and passed in handler_call, it would need
 * no global; that changes cli/run.c.) The per-worker handler state (handler_call.state) is that
 * worker's statement cache (plugin_statements.h). Loading one plugin: plugin_loader.h; the host
 * functions: plugin_host.h.
 * Errors: plugin_registry_load returns 0 or -1 with a reason in the caller's err buffer; the
 * handler functions as in handlers/handler.h.
 * Thread affinity: registry load/unload on the main thread; apply/release on DB workers.
 */
#ifndef IDEMQ_HANDLERS_PLUGIN_H
#define IDEMQ_HANDLERS_PLUGIN_H

#include <stddef.h>

#include "config/config.h"
#include "handlers/handler.h"

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
