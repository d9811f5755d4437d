/*
 * handler — the business step that runs inside the dedup transaction.
 *
 * The store opens the transaction and inserts the dedup row; the consumer's handler then applies
 * the business update on the same connection and reports an apply_status with a reason. The store
 * commits on APPLY_COMMITTED / APPLY_STATE_NOOP and rolls back otherwise, so a failed business
 * step never leaves a dedup row behind. Handlers may keep per-connection state (prepared
 * statements) in *state; it is released before the connection closes. Handlers: state_machine,
 * sql and plugin.
 * Thread affinity: the DB worker that owns db.
 */
#ifndef IDEMQ_HANDLER_H
#define IDEMQ_HANDLER_H

#include <mysql.h>
#include <stddef.h>

#include "config/config.h"
#include "envelope/envelope.h"
#include "policy/outcome.h"

typedef struct handler_call {
    MYSQL *db;                          /* borrowed; a transaction is open */
    const config_consumer *consumer;    /* borrowed */
    const envelope *env;                /* borrowed */
    void **state;                       /* this worker's slot for this consumer, handler-owned */
    char *error;                        /* reason for anything but APPLY_COMMITTED */
    size_t error_len;
    unsigned int mysql_errno;           /* set when a MySQL error decided the status */
    const void *body;                   /* borrowed raw message body; may be NULL */
    size_t body_len;
} handler_call;

/* Runs the consumer's handler. Never commits or rolls back. */
apply_status handler_apply(handler_call *call);

/*
 * Prepares every statement the handler will run (into its per-connection state, as
 * handler_apply would on first use), executing none: proof that the tables and columns it names
 * exist and are permitted. APPLY_COMMITTED when all prepared; otherwise the classified failure
 * with the server's message (naming the table or column) in call->error. call->env is unused.
 * A plugin's statements are its own: nothing to prepare, APPLY_COMMITTED.
 */
apply_status handler_prepare_all(handler_call *call);

/* Frees what handler_apply kept in state (NULL is fine). Call before closing the connection. */
void handler_release(const config_consumer *consumer, void *state);

/* The state machine handler; see state_machine.c. */
apply_status state_machine_apply(handler_call *call);
apply_status state_machine_prepare_all(handler_call *call);
void state_machine_release(const config_consumer *consumer, void *state);

/* The sql handler: the configured statements with :field placeholders; see sql.c. */
apply_status sql_handler_apply(handler_call *call);
apply_status sql_handler_prepare_all(handler_call *call);
void sql_handler_release(const config_consumer *consumer, void *state);

/* The plugin handler: calls the consumer's loaded plugin (handlers/plugin.h); see plugin.c. */
apply_status plugin_handler_apply(handler_call *call);
void plugin_handler_release(const config_consumer *consumer, void *state);

#endif
