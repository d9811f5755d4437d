/*
 * transaction — one message's transaction on a worker's session:
 *   INSERT INTO msg_dedup(biz_key, handler_name)  (the unique index decides duplicates)
 *   SAVEPOINT idemq_txn_guard
 *   the consumer's handler (same transaction)
 *   RELEASE SAVEPOINT idemq_txn_guard  (proof the transaction is still idemq's)
 *   COMMIT, or ROLLBACK on anything but success
 * Errors: returns the message's apply_status, with job->error and job->mysql_errno set for
 * anything but APPLY_COMMITTED. Thread affinity: the worker that owns the session.
 */
#ifndef IDEMQ_STORE_TRANSACTION_H
#define IDEMQ_STORE_TRANSACTION_H

#include "policy/outcome.h"
#include "store/session.h"
#include "store/store.h"

/* Applies job (an APPLY job, borrowed) on the connected session s (borrowed). Never leaves a
 * transaction open: it ends committed or rolled back. */
apply_status store_transaction_run(store_session *s, store_job *job);

#endif
