/*
 * batch — many messages of one consumer in one transaction, each keeping its own outcome.
 *
 * The result of every message is the one it would get in a transaction of its own
 * (store/transaction.h): processed, deduped, state_noop, or its own failure, and a failure of one
 * message never touches another. Two shapes, chosen by measurement (README, Benchmarks):
 *   set-based (the state machine, handlers/handler.h handler_apply_batch):
 *     SAVEPOINT idemq_txn_guard; the dedup rows, in biz_key order — one INSERT IGNORE …
 *     RETURNING where the server has it (MariaDB), else one INSERT each; the handler's batch
 *     statements; the outbox rows of the messages applied (outbox/writer.h); one DELETE of the
 *     dedup rows of the messages that failed; RELEASE SAVEPOINT idemq_txn_guard; COMMIT
 *   per message (sql, plugin): for each message SAVEPOINT idemq_txn_guard, dedup INSERT, the
 *     handler, its outbox rows, then RELEASE SAVEPOINT on success or ROLLBACK TO SAVEPOINT on
 *     failure — either
 *     finding the savepoint gone proves the handler ended the transaction (store/transaction.h),
 *     which is then explained exactly as for a lone message; one COMMIT
 * When the transaction cannot finish as a whole — a deadlock, a lock wait timeout (with
 * innodb_rollback_on_timeout the server rolls the whole transaction back), a statement error,
 * a failed COMMIT — it is rolled back and every message runs again alone, so no message is
 * charged a retry for another's failure. A lost connection (or a COMMIT whose outcome is
 * unknown) leaves them all unavailable: the outage holds them, and the dedup row settles any
 * that did commit when they run again.
 *
 * Errors: see store_batch_run. Thread affinity: the worker that owns the session.
 */
#ifndef IDEMQ_STORE_BATCH_H
#define IDEMQ_STORE_BATCH_H

#include <stddef.h>

#include "config/config.h"
#include "store/session.h"
#include "store/store.h"

typedef struct store_batch_state store_batch_state;

/* The arrays a session needs for batches of up to cfg->batch messages (cfg borrowed). NULL when
 * out of memory. */
store_batch_state *store_batch_state_new(const config *cfg);

/* Closes the statements prepared on the session's connection (before it closes). */
void store_batch_state_disconnect(store_batch_state *b);

/* Frees b; NULL is a no-op. */
void store_batch_state_free(store_batch_state *b);

/*
 * Applies jobs[0..n) — APPLY jobs of one consumer, 1 <= n <= cfg->batch, borrowed — on the
 * connected session s, setting each job's status, mysql_errno and error as store.h says. Never
 * leaves a transaction open. Returns 0, or -1 when the connection is no longer usable (some job
 * is APPLY_UNAVAILABLE): the caller disconnects.
 */
int store_batch_run(store_session *s, store_job **jobs, size_t n);

#endif
