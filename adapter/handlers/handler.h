/*
 * handler — the business step that runs inside the dedup transaction, and the dispatch to the
 * configured handler type.
 *
 * The store opens the transaction and inserts the dedup row; the consumer's handler then applies
 * the business update on the same connection and reports an apply_status with a reason. The store
 * commits on APPLY_OK / APPLY_STATE_NOOP and rolls back otherwise, so a failed business
 * step never leaves a dedup row behind. Handlers may keep per-connection state (prepared
 * statements) in *state; it is released before the connection closes. Handlers: state_machine
 * (handlers/state_machine.h), sql (handlers/sql.h) and plugin (handlers/plugin.h). They talk to
 * MySQL through db/ only; nothing here knows the store.
 *
 * Batches: the store may apply many messages of one consumer in one transaction. A handler with
 * a set-based path (handler_has_batch_path: the state machine) gets them all at once through
 * handler_apply_batch and runs a few statements for the whole batch; the others (sql, plugin)
 * are called once per message through handler_apply, each between savepoints of the store.
 *
 * Emits: a handler that applies a message adds the rows of its emits to call->outbox (a state
 * machine transition's, a sql handler's, a plugin's host->emit); a message whose emit cannot be
 * built (a field it lacks) fails non-retryable with the reason, and nothing of it is applied.
 *
 * Errors: apply and prepare functions return an apply_status: APPLY_OK when the step
 * succeeded, APPLY_STATE_NOOP for an idempotent success, otherwise the failure with its reason
 * in call->error (and call->mysql_errno when a MySQL error decided it).
 * Thread affinity: the DB worker that owns db.
 */
#ifndef IDEMQ_HANDLER_H
#define IDEMQ_HANDLER_H

#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "db/error.h"
#include "envelope/envelope.h"
#include "policy/outcome.h"

struct outbox_writer;

typedef struct handler_call {
    MYSQL *db;                          /* borrowed; a transaction is open */
    const config_consumer *consumer;    /* borrowed */
    const envelope *env;                /* borrowed */
    void **state;                       /* this worker's slot for this consumer, handler-owned */
    char *error;                        /* reason for anything but APPLY_OK */
    size_t error_len;
    unsigned int mysql_errno;           /* set when a MySQL error decided the status */
    const void *body;                   /* borrowed raw message body; may be NULL */
    size_t body_len;
    unsigned batch_max;                 /* handler_apply_batch: the most items it is given on
                                         * this connection (sizes per-connection scratch) */
    struct outbox_writer *outbox;       /* borrowed: where emits go (outbox/writer.h), tagged
                                         * with outbox_item by handler_apply and with the item's
                                         * index by handler_apply_batch. The store inserts the
                                         * rows of the messages that succeed, before COMMIT. */
    size_t outbox_item;                 /* handler_apply: the tag of its rows (0 unless a
                                         * batch's handler runs one item through it) */
} handler_call;

/* Multi-row statements are prepared once per power-of-two row count and padded by repeating
 * the last row, so a connection holds a handful of them: 1, 2, 4, ... 1024 (CONFIG_MAX_BATCH). */
#define HANDLER_BATCH_SIZE_CLASSES 11

/* The size class of n rows (1 <= n <= 1024), with its padded row count in *padded. */
static inline size_t handler_batch_size_class(size_t n, size_t *padded)
{
    size_t c = 0, size = 1;
    while (size < n)
        size <<= 1, c++;
    *padded = size;
    return c;
}

/* One message of handler_apply_batch. */
typedef struct handler_batch_item {
    const envelope *env;       /* borrowed */
    apply_status status;       /* out: APPLY_OK (applied), APPLY_STATE_NOOP, or the
                                * message's own failure with its reason in error */
    unsigned int mysql_errno;  /* out: set when a MySQL error decided status */
    char *error;               /* borrowed buffer of error_len bytes */
    size_t error_len;
} handler_batch_item;

/* Whether the consumer's handler has a set-based path (handler_apply_batch). */
bool handler_has_batch_path(const config_consumer *consumer);

/*
 * Applies items[0..n) (1 <= n <= call->batch_max) inside the open transaction, whose dedup rows
 * are already inserted, with the same result for each as handler_apply would give running them
 * one after another in that order. call->env, body and body_len are unused. Never commits or
 * rolls back. Returns APPLY_OK when every item has its status (its failure included: the
 * caller removes the failed items' dedup rows); otherwise the batch failed as a whole — a
 * statement error, or a case the set-based path does not decide — with the reason in
 * call->error, the statuses of the items meaningless, and the caller rolls back (and runs the
 * messages one by one).
 */
apply_status handler_apply_batch(handler_call *call, handler_batch_item *items, size_t n);

/* Runs the consumer's handler. Never commits or rolls back. */
apply_status handler_apply(handler_call *call);

/*
 * Prepares every statement the handler will run (into its per-connection state, as
 * handler_apply would on first use), executing none: proof that the tables and columns it names
 * exist and are permitted. APPLY_OK when all prepared; otherwise the classified failure
 * with the server's message (naming the table or column) in call->error. call->env is unused.
 * A plugin's statements are its own: nothing to prepare, APPLY_OK.
 */
apply_status handler_prepare_all(handler_call *call);

/* Frees what handler_apply kept in state (NULL is fine). Call before closing the connection. */
void handler_release(const config_consumer *consumer, void *state);

/*
 * For the handlers: fails call with error (borrowed): sets call->mysql_errno and writes
 * "what: MySQL error N (SQLSTATE): text" into call->error. Returns the error's classification.
 */
apply_status handler_fail(handler_call *call, const char *what, const db_error *error);

/* handler_fail with the last error of stmt (borrowed). */
apply_status handler_fail_statement(handler_call *call, const char *what, MYSQL_STMT *stmt);

#endif
