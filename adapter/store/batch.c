/*
 * batch — see store/batch.h.
 *
 * Bookkeeping: outcome[i] is what job i found inside the open transaction (APPLY_OK or
 * APPLY_STATE_NOOP: applied, waiting for the COMMIT); final[i] marks a job whose status stands
 * even when the batch as a whole does not commit (the messages a handler's own COMMIT already
 * committed). A batch that commits hands every outcome out; one that is rolled back runs every
 * job not final again alone; one whose connection broke reports those jobs unavailable.
 */
#include "store/batch.h"

#include <errno.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bind.h"
#include "db/error.h"
#include "db/prepare.h"
#include "handlers/handler.h"
#include "outbox/writer.h"
#include "ops/log.h"
#include "store/rotation.h"
#include "store/transaction.h"

struct store_batch_state {
    size_t cap;
    apply_status *outcome;
    unsigned char *final;
    store_job **sorted;        /* the batch in biz_key order: the order dedup rows are locked */
    unsigned char *inserted;   /* by position in sorted */
    handler_batch_item *items; /* the messages handed to handler_apply_batch */
    size_t *item_job;          /* the job of each item */
    MYSQL_BIND *binds;         /* 2 × the padded cap */
    db_bind_slot *slots;
    MYSQL_STMT *insert_returning[HANDLER_BATCH_SIZE_CLASSES];
    MYSQL_STMT *delete_rows[HANDLER_BATCH_SIZE_CLASSES];
    MYSQL_STMT *previous_rows[HANDLER_BATCH_SIZE_CLASSES]; /* the rotating layout's lookup */
    size_t outbox_rows;       /* outbox rows inserted in the open transaction */
    unsigned int mysql_errno; /* why the batch as a whole failed */
    char error[STORE_ERROR_MAX];
};

store_batch_state *store_batch_state_new(const config *cfg)
{
    size_t cap = cfg->batch ? cfg->batch : 1, padded;
    handler_batch_size_class(cap, &padded);
    store_batch_state *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->cap = cap;
    b->outcome = calloc(cap, sizeof *b->outcome);
    b->final = calloc(cap, sizeof *b->final);
    b->sorted = calloc(cap, sizeof *b->sorted);
    b->inserted = calloc(cap, sizeof *b->inserted);
    b->items = calloc(cap, sizeof *b->items);
    b->item_job = calloc(cap, sizeof *b->item_job);
    b->binds = calloc(2 * padded, sizeof *b->binds);
    b->slots = calloc(2 * padded, sizeof *b->slots);
    if (!b->outcome || !b->final || !b->sorted || !b->inserted || !b->items || !b->item_job ||
        !b->binds || !b->slots) {
        store_batch_state_free(b);
        return NULL;
    }
    return b;
}

void store_batch_state_disconnect(store_batch_state *b)
{
    if (!b)
        return;
    for (size_t c = 0; c < HANDLER_BATCH_SIZE_CLASSES; c++) {
        if (b->insert_returning[c])
            mysql_stmt_close(b->insert_returning[c]);
        if (b->delete_rows[c])
            mysql_stmt_close(b->delete_rows[c]);
        if (b->previous_rows[c])
            mysql_stmt_close(b->previous_rows[c]);
        b->insert_returning[c] = b->delete_rows[c] = b->previous_rows[c] = NULL;
    }
}

void store_batch_state_free(store_batch_state *b)
{
    if (!b)
        return;
    store_batch_state_disconnect(b);
    free(b->outcome);
    free(b->final);
    free(b->sorted);
    free(b->inserted);
    free(b->items);
    free(b->item_job);
    free(b->binds);
    free(b->slots);
    free(b);
}

/* ---------------------------------------------------------------------------------- failures */

/* The batch ends without its COMMIT: rolls back and returns what the jobs not final become —
 * APPLY_UNAVAILABLE (held) for status APPLY_UNAVAILABLE, else APPLY_RETRYABLE (run again
 * alone). The caller has put the cause in the batch's error. */
static apply_status abandon(store_session *s, apply_status status)
{
    mysql_rollback(s->db);
    outbox_writer_clear(s->outbox);
    s->batch->outbox_rows = 0;
    return status == APPLY_UNAVAILABLE ? APPLY_UNAVAILABLE : APPLY_RETRYABLE;
}

/* The last error of the connection, as the batch's cause. */
static apply_status connection_failed(store_session *s, store_batch_state *b, const char *what)
{
    b->mysql_errno = db_error_format_connection(b->error, sizeof b->error, what, s->db);
    return abandon(s, db_error_classify(b->mysql_errno));
}

static apply_status statement_failed(store_session *s, store_batch_state *b, const char *what,
                                     MYSQL_STMT *stmt)
{
    b->mysql_errno = db_error_format_statement(b->error, sizeof b->error, what, stmt);
    return abandon(s, db_error_classify(b->mysql_errno));
}

/* A job's own failure that ends the batch (its error is the batch's cause). */
static apply_status job_failed(store_session *s, store_batch_state *b, const store_job *job,
                               apply_status status)
{
    b->mysql_errno = job->mysql_errno;
    snprintf(b->error, sizeof b->error, "%s", job->error);
    return abandon(s, status);
}

static apply_status commit(store_session *s, store_batch_state *b)
{
    /* Only a successful COMMIT makes the acks safe; a lost connection here leaves the outcome
     * unknown, and the redeliveries are settled by the dedup rows either way. */
    if (mysql_commit(s->db) != 0)
        return connection_failed(s, b, "commit");
    s->outbox_committed += b->outbox_rows;
    b->outbox_rows = 0;
    return APPLY_COMMITTED;
}

/* ------------------------------------------------------------------------ one message at a time */

/* The transaction ended while job i's handler ran (its savepoint is gone). */
static apply_status transaction_ended(store_session *s, store_batch_state *b, store_job **jobs,
                                      size_t i, const char *handler_name, apply_status status)
{
    bool committed;
    apply_status truth = store_transaction_ended(s, jobs[i], handler_name, status, &committed);
    if (truth == APPLY_UNAVAILABLE)
        return job_failed(s, b, jobs[i], truth);
    if (committed) {
        /* The handler's COMMIT took every message before it along, each whole: their outcomes
         * stand. This one's dedup row went with part of its effect (store_transaction_ended). */
        for (size_t k = 0; k < i; k++)
            b->final[k] = 1;
        b->outcome[i] = truth;
        b->final[i] = 1;
    }
    snprintf(b->error, sizeof b->error,
             "the transaction of a batch ended during one message's "
             "handler");
    b->mysql_errno = 0;
    return APPLY_RETRYABLE; /* already rolled back */
}

static apply_status run_each(store_session *s, store_batch_state *b, store_job **jobs, size_t n)
{
    const config_consumer *consumer = &s->cfg->consumers[jobs[0]->consumer_index];
    for (size_t i = 0; i < n; i++) {
        store_job *job = jobs[i];
        if (mysql_query(s->db, "SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0)
            return connection_failed(s, b, "savepoint");
        apply_status status = store_transaction_insert_dedup(s, job, consumer->handler_name);
        if (status == APPLY_DUPLICATE) {
            b->outcome[i] = status; /* the failed insert changed nothing */
            continue;
        }
        if (status != APPLY_OK)
            return job_failed(s, b, job, status);
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
        if (status == APPLY_UNAVAILABLE)
            return job_failed(s, b, job, status);
        if (status == APPLY_OK) {
            /* Inside the message's savepoint: a failure below undoes its rows with it. */
            size_t emitted = 0;
            apply_status written = store_transaction_write_outbox(s, job, &emitted);
            if (written != APPLY_OK)
                return job_failed(s, b, job, written);
            b->outbox_rows += emitted;
        } else {
            outbox_writer_clear(s->outbox);
        }
        bool success = status == APPLY_OK || status == APPLY_STATE_NOOP;
        /* Either way the savepoint must still exist: that is the proof the transaction is still
         * idemq's (store/transaction.h). A failed message is undone back to it. */
        if (mysql_query(s->db, success ? "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT
                                       : "ROLLBACK TO SAVEPOINT " TXN_GUARD_SAVEPOINT) == 0) {
            b->outcome[i] = status;
            continue;
        }
        if (mysql_errno(s->db) != ER_SP_DOES_NOT_EXIST)
            return connection_failed(s, b, "checking the transaction");
        return transaction_ended(s, b, jobs, i, consumer->handler_name, status);
    }
    return commit(s, b);
}

/* -------------------------------------------------------------------------------- set-based */

/* Sorts jobs[0..n) into sorted by biz_key, stably: copies of one key keep their order of
 * arrival, so the first copy delivered is the one applied. Insertion sort: batches are small, and
 * it needs no allocation. */
static void sort_by_biz_key(store_job **sorted, store_job *const *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && strcmp(sorted[j - 1]->env->biz_key, jobs[i]->env->biz_key) > 0) {
            sorted[j] = sorted[j - 1];
            j--;
        }
        sorted[j] = jobs[i];
    }
}

static MYSQL_STMT *prepared(store_session *s, store_batch_state *b, MYSQL_STMT **slot,
                            const char *head, const char *row, const char *tail, size_t rows)
{
    if (*slot)
        return *slot;
    size_t cap = strlen(head) + strlen(tail) + rows * (strlen(row) + 2) + 1;
    char *sql = malloc(cap);
    if (!sql) {
        snprintf(b->error, sizeof b->error, "out of memory");
        b->mysql_errno = 0;
        return NULL;
    }
    size_t len = (size_t)snprintf(sql, cap, "%s", head);
    for (size_t i = 0; i < rows; i++)
        len += (size_t)snprintf(sql + len, cap - len, "%s%s", i ? ", " : "", row);
    snprintf(sql + len, cap - len, "%s", tail);
    db_error error;
    if (db_prepare(s->db, sql, slot, &error) != 0) {
        b->mysql_errno = db_error_format(b->error, sizeof b->error, "prepare", &error);
        *slot = NULL;
    }
    free(sql);
    return *slot;
}

/* A statement's one result column: a biz_key. */
typedef struct key_result {
    char key[130];
    unsigned long len;
    MYSQL_BIND bind;
} key_result;

/* Binds stmt's (executed) biz_key column to k and stores the rows: APPLY_OK, or the batch's
 * failure (what names the statement). */
static apply_status store_keys(store_session *s, store_batch_state *b, MYSQL_STMT *stmt,
                               const char *what, key_result *k)
{
    memset(k, 0, sizeof *k);
    k->bind.buffer_type = MYSQL_TYPE_STRING;
    k->bind.buffer = k->key;
    k->bind.buffer_length = sizeof k->key - 1;
    k->bind.length = &k->len;
    if (mysql_stmt_bind_result(stmt, &k->bind) || mysql_stmt_store_result(stmt)) {
        apply_status status = statement_failed(s, b, what, stmt);
        db_stmt_discard_failed_result(stmt);
        return status;
    }
    return APPLY_OK;
}

/* The next row's key, NUL-terminated, or NULL after the last. */
static const char *next_key(MYSQL_STMT *stmt, key_result *k)
{
    if (mysql_stmt_fetch(stmt) != 0)
        return NULL;
    k->key[k->len < sizeof k->key - 1 ? k->len : sizeof k->key - 1] = '\0';
    return k->key;
}

/* One INSERT IGNORE … RETURNING for the batch's dedup rows (MariaDB). Marks the jobs whose row
 * it inserted; the others are duplicates. */
static apply_status insert_returning(store_session *s, store_batch_state *b, size_t n,
                                     const char *handler_name)
{
    size_t size, c = handler_batch_size_class(n, &size);
    MYSQL_STMT *stmt = prepared(s, b, &b->insert_returning[c],
                                "INSERT IGNORE INTO msg_dedup (biz_key, handler_name) VALUES ",
                                "(?, ?)", " RETURNING biz_key", size);
    if (!stmt)
        return abandon(s, db_error_classify(b->mysql_errno));
    for (size_t i = 0; i < size; i++) {
        /* Padding repeats the last row: a duplicate of it, ignored. */
        const store_job *job = b->sorted[i < n ? i : n - 1];
        db_bind_text(&b->binds[2 * i], &b->slots[2 * i], job->env->biz_key);
        db_bind_text(&b->binds[2 * i + 1], &b->slots[2 * i + 1], handler_name);
    }
    if (mysql_stmt_bind_param(stmt, b->binds) || mysql_stmt_execute(stmt))
        return statement_failed(s, b, "dedup insert", stmt);
    key_result k;
    apply_status status = store_keys(s, b, stmt, "dedup insert", &k);
    if (status != APPLY_OK)
        return status;
    size_t inserted = 0;
    memset(b->inserted, 0, n);
    for (const char *key; (key = next_key(stmt, &k)) != NULL;) {
        /* Rows come back in VALUES order, so the first copy of a key is the one inserted. */
        for (size_t i = 0; i < n; i++)
            if (!b->inserted[i] && strcmp(b->sorted[i]->env->biz_key, key) == 0) {
                b->inserted[i] = 1;
                inserted++;
                break;
            }
    }
    mysql_stmt_free_result(stmt);
    /* IGNORE would also skip a row for reasons other than a duplicate key, each with a warning
     * of its own: every skipped row must be a duplicate's, or the batch runs one by one. */
    if (mysql_warning_count(s->db) != size - inserted) {
        snprintf(b->error, sizeof b->error,
                 "dedup insert: %u warnings for %zu rows skipped as duplicates",
                 mysql_warning_count(s->db), size - inserted);
        b->mysql_errno = 0;
        return abandon(s, APPLY_RETRYABLE);
    }
    return APPLY_OK;
}

/* The rotating layout (store/rotation.h): looks the batch's keys up in msg_dedup_previous in
 * one statement and packs the jobs it does not find to the front of sorted, in their order:
 * *live is how many; the caller marked every job a duplicate until its row is inserted. */
static apply_status drop_previous_keys(store_session *s, store_batch_state *b, size_t n,
                                       const char *handler_name, size_t *live)
{
    size_t size, c = handler_batch_size_class(n, &size);
    MYSQL_STMT *stmt = prepared(s, b, &b->previous_rows[c], rotation_previous_batch_head, "?",
                                rotation_previous_batch_tail, size);
    if (!stmt)
        return abandon(s, db_error_classify(b->mysql_errno));
    db_bind_text(&b->binds[0], &b->slots[0], handler_name);
    for (size_t i = 0; i < size; i++)
        db_bind_text(&b->binds[1 + i], &b->slots[1 + i],
                     b->sorted[i < n ? i : n - 1]->env->biz_key);
    if (mysql_stmt_bind_param(stmt, b->binds) || mysql_stmt_execute(stmt))
        return statement_failed(s, b, "msg_dedup_previous lookup", stmt);
    key_result k;
    apply_status status = store_keys(s, b, stmt, "msg_dedup_previous lookup", &k);
    if (status != APPLY_OK)
        return status;
    memset(b->inserted, 0, n); /* here: found in msg_dedup_previous */
    for (const char *key; (key = next_key(stmt, &k)) != NULL;) {
        for (size_t i = 0; i < n; i++)
            if (strcmp(b->sorted[i]->env->biz_key, key) == 0)
                b->inserted[i] = 1; /* every copy of the key */
    }
    mysql_stmt_free_result(stmt);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (!b->inserted[i])
            b->sorted[kept++] = b->sorted[i];
    *live = kept;
    return APPLY_OK;
}

/* The dedup rows, in biz_key order: a fixed lock order, so that concurrent batches holding
 * copies of one message wait for each other instead of deadlocking. */
static apply_status insert_dedup_rows(store_session *s, store_batch_state *b, store_job **jobs,
                                      size_t n, const char *handler_name)
{
    sort_by_biz_key(b->sorted, jobs, n);
    for (size_t i = 0; i < n; i++)
        jobs[i]->status = APPLY_DUPLICATE; /* until its row is inserted */
    size_t live = n;
    if (s->cfg->dedup.layout == CONFIG_DEDUP_ROTATING) {
        apply_status status = drop_previous_keys(s, b, n, handler_name, &live);
        if (status != APPLY_OK)
            return status;
    }
    if (live > 0 && s->returning) {
        apply_status status = insert_returning(s, b, live, handler_name);
        if (status != APPLY_OK)
            return status;
    } else {
        for (size_t i = 0; i < live; i++) {
            store_job *job = b->sorted[i];
            apply_status status = store_transaction_insert_dedup_row(s, job, handler_name);
            if (status != APPLY_OK && status != APPLY_DUPLICATE)
                return job_failed(s, b, job, status);
            job->mysql_errno = 0; /* a duplicate's 1062 is not its error */
            b->inserted[i] = status == APPLY_OK;
        }
    }
    for (size_t i = 0; i < live; i++)
        b->sorted[i]->status = b->inserted[i] ? APPLY_OK : APPLY_DUPLICATE;
    for (size_t i = 0; i < n; i++)
        b->outcome[i] = jobs[i]->status;
    return APPLY_OK;
}

/* Deletes the dedup rows of the messages that failed: inserted in this transaction and seen by
 * no other, so deleting one undoes its insert as a rollback would. The multi-table form only for
 * its index hint: a msg_dedup just rotated into place has the statistics of an empty table, and
 * the optimizer would scan (and lock) the whole table (store/rotation.c). */
static apply_status delete_failed_rows(store_session *s, store_batch_state *b, store_job **jobs,
                                       size_t n, const char *handler_name)
{
    size_t failed = 0;
    for (size_t i = 0; i < n; i++)
        if (b->outcome[i] != APPLY_OK && b->outcome[i] != APPLY_STATE_NOOP &&
            b->outcome[i] != APPLY_DUPLICATE)
            b->sorted[failed++] = jobs[i];
    if (failed == 0)
        return APPLY_OK;
    size_t size, c = handler_batch_size_class(failed, &size);
    MYSQL_STMT *stmt =
        prepared(s, b, &b->delete_rows[c],
                 "DELETE msg_dedup FROM msg_dedup FORCE INDEX (uk_biz_handler) WHERE "
                 "handler_name = ? AND biz_key IN (",
                 "?", ")", size);
    if (!stmt)
        return abandon(s, db_error_classify(b->mysql_errno));
    db_bind_text(&b->binds[0], &b->slots[0], handler_name);
    for (size_t i = 0; i < size; i++)
        db_bind_text(&b->binds[1 + i], &b->slots[1 + i],
                     b->sorted[i < failed ? i : failed - 1]->env->biz_key);
    if (mysql_stmt_bind_param(stmt, b->binds) || mysql_stmt_execute(stmt))
        return statement_failed(s, b, "undo the dedup rows of failed messages", stmt);
    if (mysql_stmt_affected_rows(stmt) != failed) {
        snprintf(b->error, sizeof b->error, "undoing %zu dedup rows deleted %llu", failed,
                 (unsigned long long)mysql_stmt_affected_rows(stmt));
        b->mysql_errno = 0;
        return abandon(s, APPLY_RETRYABLE);
    }
    return APPLY_OK;
}

static apply_status run_set_based(store_session *s, store_batch_state *b, store_job **jobs,
                                  size_t n)
{
    const config_consumer *consumer = &s->cfg->consumers[jobs[0]->consumer_index];
    /* One savepoint guards the whole batch: only idemq's own statements run in it, so the
     * transaction can end only by the server's rollback, which its release then proves absent. */
    if (mysql_query(s->db, "SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0)
        return connection_failed(s, b, "savepoint");
    apply_status status = insert_dedup_rows(s, b, jobs, n, consumer->handler_name);
    if (status != APPLY_OK)
        return status;
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
        if (b->outcome[i] == APPLY_DUPLICATE)
            continue;
        b->items[live] = (handler_batch_item){
            .env = jobs[i]->env,
            .status = APPLY_OK,
            .error = jobs[i]->error,
            .error_len = sizeof jobs[i]->error,
        };
        b->item_job[live++] = i;
    }
    if (live > 0) {
        handler_call call = {
            .db = s->db,
            .consumer = consumer,
            .state = &s->handler_states[jobs[0]->consumer_index],
            .error = b->error,
            .error_len = sizeof b->error,
            .batch_max = (unsigned)b->cap,
            .outbox = s->outbox,
        };
        status = handler_apply_batch(&call, b->items, live);
        if (status != APPLY_OK) {
            b->mysql_errno = call.mysql_errno;
            return abandon(s, status);
        }
        for (size_t m = 0; m < live; m++) {
            size_t i = b->item_job[m];
            b->outcome[i] = b->items[m].status;
            jobs[i]->mysql_errno = b->items[m].mysql_errno;
            if (b->items[m].status != APPLY_OK)
                outbox_writer_drop_item(s->outbox, m);
        }
        db_error error;
        int rc = outbox_writer_flush(s->outbox, s->db, &b->outbox_rows, &error);
        if (rc == -ENOMEM || rc == OUTBOX_E_TOO_LARGE) {
            /* Run alone, each message gets its own answer: the one whose emit is too large is
             * dead-lettered, the others apply. */
            snprintf(b->error, sizeof b->error, "outbox insert: %s",
                     rc == -ENOMEM ? "out of memory" : error.message);
            b->mysql_errno = 0;
            return abandon(s, APPLY_RETRYABLE);
        }
        if (rc != 0) {
            b->mysql_errno = db_error_format(b->error, sizeof b->error, "outbox insert", &error);
            return abandon(s, db_error_classify(b->mysql_errno));
        }
    }
    if ((status = delete_failed_rows(s, b, jobs, n, consumer->handler_name)) != APPLY_OK)
        return status;
    if (mysql_query(s->db, "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0)
        return connection_failed(s, b, "checking the transaction");
    return commit(s, b);
}

/* ------------------------------------------------------------------------------------- entry */

int store_batch_run(store_session *s, store_job **jobs, size_t n)
{
    store_batch_state *b = s->batch;
    if (n == 1 || n > b->cap) {
        bool unavailable = false;
        for (size_t i = 0; i < n; i++) {
            jobs[i]->status = unavailable ? APPLY_UNAVAILABLE : store_transaction_run(s, jobs[i]);
            unavailable |= jobs[i]->status == APPLY_UNAVAILABLE;
        }
        return unavailable ? -1 : 0;
    }
    const config_consumer *consumer = &s->cfg->consumers[jobs[0]->consumer_index];
    memset(b->final, 0, n);
    outbox_writer_clear(s->outbox);
    b->outbox_rows = 0;
    b->error[0] = '\0';
    b->mysql_errno = 0;
    apply_status batch =
        handler_has_batch_path(consumer) ? run_set_based(s, b, jobs, n) : run_each(s, b, jobs, n);
    log_context ctx = {.queue = consumer->queue, .retries = -1};
    if (batch == APPLY_COMMITTED && log_enabled(LOG_LEVEL_DEBUG)) {
        size_t counts[APPLY_OK + 1] = {0};
        for (size_t i = 0; i < n; i++)
            counts[b->outcome[i]]++;
        log_debug(&ctx,
                  "batch of %zu messages: one COMMIT (applied %zu, state_noop %zu, deduped %zu, "
                  "failed %zu)",
                  n, counts[APPLY_OK], counts[APPLY_STATE_NOOP], counts[APPLY_DUPLICATE],
                  counts[APPLY_RETRYABLE] + counts[APPLY_NON_RETRYABLE]);
    } else if (batch == APPLY_RETRYABLE) {
        log_info(&ctx, "batch of %zu messages rolled back as a whole (%s): each runs alone", n,
                 b->error);
    }
    bool unavailable = false;
    for (size_t i = 0; i < n; i++) {
        store_job *job = jobs[i];
        if (batch == APPLY_COMMITTED || b->final[i]) {
            apply_status o = b->outcome[i];
            job->status = o == APPLY_OK ? APPLY_COMMITTED : o;
            if (o == APPLY_OK || o == APPLY_STATE_NOOP || o == APPLY_DUPLICATE) {
                job->error[0] = '\0';
                job->mysql_errno = 0;
            }
        } else if (batch == APPLY_UNAVAILABLE || unavailable) {
            job->status = APPLY_UNAVAILABLE;
            job->mysql_errno = b->mysql_errno;
            snprintf(job->error, sizeof job->error, "%s", b->error);
        } else {
            /* The batch was rolled back: this message runs alone, with its own outcome. */
            job->error[0] = '\0';
            job->mysql_errno = 0;
            job->status = store_transaction_run(s, job);
            if (job->status == APPLY_UNAVAILABLE) {
                unavailable = true;
                b->mysql_errno = job->mysql_errno;
                snprintf(b->error, sizeof b->error, "%s", job->error);
            }
        }
    }
    return batch == APPLY_UNAVAILABLE || unavailable ? -1 : 0;
}
