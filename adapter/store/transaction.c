/*
 * transaction — see store/transaction.h. The savepoint guard is what makes "ack only after the
 * commit of idemq's own transaction" hold whatever a handler or plugin ran.
 */
#include "store/transaction.h"

#include <errno.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <stdio.h>
#include <string.h>

#include "db/bind.h"
#include "db/error.h"
#include "db/nodes.h"
#include "db/prepare.h"
#include "handlers/handler.h"
#include "outbox/writer.h"

static const char dedup_lookup_sql[] =
    "SELECT id FROM msg_dedup WHERE biz_key = ? AND handler_name = ?";
/* The rotating layout (store/rotation.h): a rotation may have moved the row since. FORCE INDEX:
 * both tables may carry the statistics of their creation (rotation.c). */
static const char dedup_lookup_rotating_sql[] =
    "SELECT id FROM msg_dedup FORCE INDEX (uk_biz_handler) WHERE biz_key = ? AND handler_name = ? "
    "UNION ALL SELECT id FROM msg_dedup_previous FORCE INDEX (uk_biz_handler) WHERE biz_key = ? "
    "AND handler_name = ?";


/* Binds (biz_key, handler_name) as the two parameters of a dedup statement. */
static void bind_dedup_key(MYSQL_BIND params[2], db_bind_slot slots[2], const char *biz_key,
                           const char *handler_name)
{
    db_bind_text(&params[0], &slots[0], biz_key);
    db_bind_text(&params[1], &slots[1], handler_name);
}

/* The rotating layout: whether the key is in msg_dedup_previous. APPLY_DUPLICATE, APPLY_OK (not
 * there) or the classified failure. */
static apply_status find_in_previous(store_session *s, store_job *job, MYSQL_BIND params[2])
{
    MYSQL_STMT *stmt = s->dedup_previous;
    if (mysql_stmt_bind_param(stmt, params) || mysql_stmt_execute(stmt) ||
        mysql_stmt_store_result(stmt)) {
        job->mysql_errno = db_error_format_statement(job->error, sizeof job->error,
                                                     "msg_dedup_previous lookup", stmt);
        db_stmt_discard_failed_result(stmt);
        return db_error_classify(job->mysql_errno);
    }
    bool found = mysql_stmt_num_rows(stmt) > 0;
    mysql_stmt_free_result(stmt);
    if (!found)
        return APPLY_OK;
    job->mysql_errno = 0;
    return APPLY_DUPLICATE;
}

/* The INSERT of the prepared statement with params bound to job's key. */
static apply_status insert_row(store_session *s, store_job *job, MYSQL_BIND params[2])
{
    if (mysql_stmt_bind_param(s->dedup_insert, params) || mysql_stmt_execute(s->dedup_insert)) {
        job->mysql_errno = mysql_stmt_errno(s->dedup_insert);
        if (job->mysql_errno == ER_DUP_ENTRY)
            return APPLY_DUPLICATE;
        db_error_format_statement(job->error, sizeof job->error, "dedup insert",
                                  s->dedup_insert);
        return db_error_classify(job->mysql_errno);
    }
    job->dedup_row_id = mysql_stmt_insert_id(s->dedup_insert);
    return APPLY_OK;
}

/* Both entries below: prepares, binds job's key, then the lookup (when look_previous and the
 * layout has one) and the insert. */
static apply_status insert_dedup(store_session *s, store_job *job, const char *handler_name,
                                 bool look_previous)
{
    job->dedup_row_id = 0;
    apply_status status = store_session_prepare_dedup_insert(s, job, false);
    if (status != APPLY_OK)
        return status;
    MYSQL_BIND params[2];
    db_bind_slot slots[2] = {{0}};
    bind_dedup_key(params, slots, job->env->biz_key, handler_name);
    if (look_previous && s->dedup_previous &&
        (status = find_in_previous(s, job, params)) != APPLY_OK)
        return status;
    return insert_row(s, job, params);
}

apply_status store_transaction_insert_dedup(store_session *s, store_job *job,
                                            const char *handler_name)
{
    return insert_dedup(s, job, handler_name, true);
}

apply_status store_transaction_insert_dedup_row(store_session *s, store_job *job,
                                                const char *handler_name)
{
    return insert_dedup(s, job, handler_name, false);
}

typedef enum dedup_row_found {
    DEDUP_ROW_UNKNOWN, /* the lookup failed (the connection) */
    DEDUP_ROW_ABSENT,
    DEDUP_ROW_OURS,    /* the row the attempt inserted (or one it cannot tell apart: no id) */
    DEDUP_ROW_A_COPYS, /* another delivery's, committed on another connection or node */
} dedup_row_found;

/* After idemq's transaction ended behind its back and was rolled back: is job's dedup row
 * committed, and by whom? Its id tells: the attempt's own insert has job->dedup_row_id, while a
 * copy of the message that committed after the server rolled this attempt back (a deadlock's
 * other side, a Galera node whose write aborted this one) inserted a row of its own. */
static dedup_row_found find_dedup_row(store_session *s, const store_job *job,
                                      const char *handler_name)
{
    MYSQL_STMT *stmt;
    MYSQL_BIND params[4], result;
    db_bind_slot slots[4] = {{0}};
    db_error error;
    dedup_row_found found = DEDUP_ROW_UNKNOWN;
    unsigned long long id = 0;
    bool rotating = s->cfg->dedup.layout == CONFIG_DEDUP_ROTATING;
    int rc = db_prepare(s->db, rotating ? dedup_lookup_rotating_sql : dedup_lookup_sql, &stmt,
                        &error);
    if (rc == -ENOMEM)
        return DEDUP_ROW_UNKNOWN;
    if (rc == 0) {
        bind_dedup_key(params, slots, job->env->biz_key, handler_name);
        bind_dedup_key(params + 2, slots + 2, job->env->biz_key, handler_name);
        memset(&result, 0, sizeof result);
        result.buffer_type = MYSQL_TYPE_LONGLONG;
        result.buffer = &id;
        result.is_unsigned = 1;
        if (mysql_stmt_bind_param(stmt, params) == 0 && mysql_stmt_execute(stmt) == 0 &&
            mysql_stmt_bind_result(stmt, &result) == 0 && mysql_stmt_store_result(stmt) == 0) {
            if (mysql_stmt_fetch(stmt) != 0)
                found = DEDUP_ROW_ABSENT;
            else if (job->dedup_row_id != 0 && id != job->dedup_row_id)
                found = DEDUP_ROW_A_COPYS;
            else
                found = DEDUP_ROW_OURS;
        }
        mysql_stmt_close(stmt);
    }
    mysql_rollback(s->db); /* the lookup opened a read transaction: autocommit is off */
    return found;
}

apply_status store_transaction_ended(store_session *s, store_job *job, const char *handler_name,
                                     apply_status status, bool *committed_out)
{
    *committed_out = false;
    mysql_rollback(s->db);
    dedup_row_found found = find_dedup_row(s, job, handler_name);
    if (found == DEDUP_ROW_UNKNOWN) {
        snprintf(job->error, sizeof job->error,
                 "idemq's transaction ended during the handler, and checking the dedup row "
                 "failed: MySQL error %u: %s",
                 mysql_errno(s->db), mysql_error(s->db));
        return APPLY_UNAVAILABLE;
    }
    if (found == DEDUP_ROW_A_COPYS) {
        /* The server rolled this attempt back (that is where the savepoint went), whatever the
         * handler made of it, and the message has been applied by its copy since. */
        snprintf(job->error, sizeof job->error,
                 "idemq's transaction was rolled back under the handler, and another delivery of "
                 "the message committed its dedup row since: a duplicate");
        job->mysql_errno = 0;
        return APPLY_DUPLICATE;
    }
    if (found == DEDUP_ROW_OURS) {
        /* Something the handler ran committed the dedup row with part of the effect: a retry
         * would be swallowed as a duplicate, so only a person can put this right. */
        *committed_out = true;
        snprintf(job->error, sizeof job->error,
                 "the handler ended idemq's transaction with a COMMIT (a CALLed procedure that "
                 "commits, or a statement with an implicit commit such as DDL): the dedup row "
                 "was committed with only the effect before that point; idemq rolled back the "
                 "rest. Fix the handler (it must never commit), repair the row, and delete the "
                 "msg_dedup row (biz_key, handler %s) before replaying",
                 handler_name);
        return APPLY_NON_RETRYABLE;
    }
    if (status == APPLY_OK || status == APPLY_STATE_NOOP) {
        snprintf(job->error, sizeof job->error,
                 "the handler reported success, but idemq's transaction had been rolled back "
                 "under it (a deadlock or a lock wait timeout with innodb_rollback_on_timeout "
                 "that the handler ignored, or a ROLLBACK in a CALLed procedure): nothing was "
                 "committed");
        return APPLY_RETRYABLE;
    }
    return status; /* rolled back and the handler already said why (e.g. 1213) */
}

/*
 * Checks the savepoint set after the dedup insert (TXN_GUARD_SAVEPOINT). Returns status
 * unchanged when the transaction is still idemq's; otherwise rolls back whatever runs in its
 * place and returns the status that tells the truth, with the cause in job->error.
 */
static apply_status verify_transaction(store_session *s, store_job *job, const char *handler_name,
                                       apply_status status)
{
    if (mysql_query(s->db, "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT) == 0)
        return status;
    unsigned int error_number = mysql_errno(s->db);
    if (error_number != ER_SP_DOES_NOT_EXIST) {
        job->mysql_errno = error_number;
        snprintf(job->error, sizeof job->error, "checking the transaction: MySQL error %u: %s",
                 error_number, mysql_error(s->db));
        return db_error_classify(error_number);
    }
    bool committed;
    return store_transaction_ended(s, job, handler_name, status, &committed);
}

/* One run of the job's transaction; *commit_failed says whether it got as far as a COMMIT that
 * failed (its error in job). */
static apply_status run_once(store_session *s, store_job *job, bool *commit_failed)
{
    const config_consumer *consumer = &s->cfg->consumers[job->consumer_index];
    outbox_writer_clear(s->outbox);
    apply_status status = store_transaction_insert_dedup(s, job, consumer->handler_name);
    if (status != APPLY_OK) {
        mysql_rollback(s->db);
        return status;
    }
    if (mysql_query(s->db, "SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0) {
        status = store_session_fail(s, job, "savepoint");
        mysql_rollback(s->db);
        return status;
    }
    handler_call call = {
        .db = s->db,
        .consumer = consumer,
        .env = job->env,
        .body = job->body,
        .body_len = job->body_len,
        .state = &s->handler_states[job->consumer_index],
        .error = job->error,
        .error_len = sizeof job->error,
        .outbox = s->outbox,
    };
    status = handler_apply(&call);
    job->mysql_errno = call.mysql_errno;
    size_t emitted = 0;
    if (status == APPLY_OK)
        status = store_transaction_write_outbox(s, job, &emitted);
    else
        outbox_writer_clear(s->outbox);
    if (status != APPLY_UNAVAILABLE)
        status = verify_transaction(s, job, consumer->handler_name, status);
    if (status != APPLY_OK && status != APPLY_STATE_NOOP) {
        mysql_rollback(s->db);
        return status;
    }
    /* Only a successful COMMIT makes the ack safe; a lost connection here leaves the outcome
     * unknown, and the redelivery is settled by the dedup row either way. */
    if (mysql_commit(s->db) != 0) {
        *commit_failed = true;
        return store_session_fail(s, job, "commit");
    }
    s->outbox_committed += emitted;
    return status == APPLY_OK ? APPLY_COMMITTED : APPLY_STATE_NOOP;
}

apply_status store_transaction_run(store_session *s, store_job *job)
{
    for (unsigned run = 1;; run++) {
        bool commit_failed = false;
        apply_status status = run_once(s, job, &commit_failed);
        /* A cluster that refused the COMMIT for another node's write (a hot key written on two
         * nodes) rolled everything back; at once the other write is in, so the next run sees it.
         * Running again here keeps such conflicts off the retry ladder, whose delays and limit
         * are for failures that need time. */
        if (!commit_failed || !db_error_is_commit_conflict(job->mysql_errno) ||
            run > STORE_COMMIT_CONFLICT_RERUNS)
            return status;
        db_nodes_count_conflict();
        job->error[0] = '\0';
        job->mysql_errno = 0;
    }
}

apply_status store_transaction_write_outbox(store_session *s, store_job *job, size_t *inserted)
{
    db_error error;
    int rc = outbox_writer_flush(s->outbox, s->db, inserted, &error);
    if (rc == 0)
        return APPLY_OK;
    if (rc == -ENOMEM) {
        snprintf(job->error, sizeof job->error, "outbox insert: out of memory");
        job->mysql_errno = 0;
        return APPLY_RETRYABLE;
    }
    if (rc == OUTBOX_E_TOO_LARGE) {
        snprintf(job->error, sizeof job->error, "outbox insert: %s", error.message);
        job->mysql_errno = 0;
        return APPLY_NON_RETRYABLE;
    }
    job->mysql_errno = db_error_format(job->error, sizeof job->error, "outbox insert", &error);
    return db_error_classify(job->mysql_errno);
}
