/*
 * transaction — one message's transaction on a worker's session (store/batch.h runs many in one
 * and falls back to this one for each message when a batch cannot finish as a whole):
 *   INSERT INTO msg_dedup(biz_key, handler_name)  (the unique index decides duplicates)
 *   SAVEPOINT idemq_txn_guard
 *   the consumer's handler (same transaction)
 *   INSERT INTO idemq_outbox …  (the rows of the handler's emits, outbox/writer.h)
 *   RELEASE SAVEPOINT idemq_txn_guard  (proof the transaction is still idemq's)
 *   COMMIT, or ROLLBACK on anything but success
 * Errors: returns the message's apply_status, with job->error and job->mysql_errno set for
 * anything but APPLY_COMMITTED. Thread affinity: the worker that owns the session.
 */
#ifndef IDEMQ_STORE_TRANSACTION_H
#define IDEMQ_STORE_TRANSACTION_H

#include <stdbool.h>

#include "policy/outcome.h"
#include "store/session.h"
#include "store/store.h"

/* A savepoint set in idemq's transaction lives exactly as long as the transaction: COMMIT,
 * ROLLBACK, an implicit commit (DDL) or the server's own rollback (deadlock, lock wait with
 * innodb_rollback_on_timeout) all destroy it. Releasing it before COMMIT therefore proves, on
 * MySQL and MariaDB alike, that the dedup row inserted after it was set (or just before, in the
 * lone transaction) is still pending in the transaction that will commit the business update.
 * Handlers must not use this name, nor any beginning with idemq_ (include/idemq/plugin.h). */
#define TXN_GUARD_SAVEPOINT "idemq_txn_guard"

/* How many times a transaction whose COMMIT a cluster refused for a conflict with another node
 * (db_error_is_commit_conflict) runs again at once, before its failure counts as retryable. */
#define STORE_COMMIT_CONFLICT_RERUNS 3

/* Applies job (an APPLY job, borrowed) on the connected session s (borrowed) in a transaction of
 * its own, again at once (up to STORE_COMMIT_CONFLICT_RERUNS times) when its COMMIT lost a
 * cluster's conflict. Never leaves a transaction open: it ends committed or rolled back. */
apply_status store_transaction_run(store_session *s, store_job *job);

/* Inserts job's dedup row (biz_key, handler_name borrowed) in the open transaction:
 * APPLY_OK when inserted, APPLY_DUPLICATE, or the classified failure (job->error set). A
 * failed insert is undone by the server alone; the transaction goes on unless the failure says
 * otherwise (deadlock, lock wait timeout, connection). In the rotating layout a key found in
 * msg_dedup_previous is APPLY_DUPLICATE before any insert (store/rotation.h). */
apply_status store_transaction_insert_dedup(store_session *s, store_job *job,
                                            const char *handler_name);

/* The insert alone, for a caller that has looked msg_dedup_previous up itself (a batch). */
apply_status store_transaction_insert_dedup_row(store_session *s, store_job *job,
                                                const char *handler_name);

/* Inserts the outbox rows s->outbox holds, in the open transaction: APPLY_OK with their
 * number in *inserted, or the classified failure (job->error set; the caller rolls back). */
apply_status store_transaction_write_outbox(store_session *s, store_job *job, size_t *inserted);

/*
 * After a savepoint set in idemq's transaction was found gone (ER_SP_DOES_NOT_EXIST) while job's
 * handler ran, which had reported status: rolls back whatever runs in the transaction's place,
 * looks job's dedup row up and returns the status that tells the truth, with the cause in
 * job->error. *committed is set when the dedup row the attempt inserted (job->dedup_row_id)
 * turned out committed — by something the handler ran, which then committed everything before it
 * in the transaction too. A row with another id is a copy's, committed after the server rolled
 * the attempt back (a deadlock, a cluster's conflict): APPLY_DUPLICATE.
 */
apply_status store_transaction_ended(store_session *s, store_job *job, const char *handler_name,
                                     apply_status status, bool *committed);

#endif
