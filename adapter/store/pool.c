/*
 * pool — DB worker threads and the per-message transaction. See store.h.
 *
 * Jobs travel loop → worker through a mutex/condvar queue and worker → loop through a second list
 * and one uv_async_t (async sends coalesce, so the callback drains the whole list). Each worker
 * owns its MYSQL connection, its prepared dedup insert and the handlers' prepared statements.
 */
#include "store/store.h"

#include <errno.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "db/bind.h"
#include "db/connect.h"
#include "db/dsn.h"
#include "db/error.h"
#include "db/prepare.h"
#include "handlers/handler.h"

/* Kept identical to schemas/mysql/001_msg_dedup.sql (a unit test compares them). biz_key and
 * handler_name are VARBINARY: utf8mb4 collations are case-insensitive and pad trailing spaces,
 * which would make distinct keys (or handlers) collide and silently drop a business event as a
 * "duplicate". */
const char store_dedup_ddl[] =
    "CREATE TABLE IF NOT EXISTS msg_dedup (\n"
    "  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,\n"
    "  biz_key      VARBINARY(128) NOT NULL,\n"
    "  handler_name VARBINARY(64) NOT NULL,\n"
    "  created_at   DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),\n"
    "  UNIQUE KEY uk_biz_handler (biz_key, handler_name),\n"
    "  KEY idx_created_at (created_at)\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

static const char dedup_insert_sql[] =
    "INSERT INTO msg_dedup (biz_key, handler_name) VALUES (?, ?)";
static const char dedup_lookup_sql[] =
    "SELECT 1 FROM msg_dedup WHERE biz_key = ? AND handler_name = ?";

/* A savepoint set right after the dedup insert lives exactly as long as idemq's transaction:
 * COMMIT, ROLLBACK, an implicit commit (DDL) or the server's own rollback (deadlock, lock wait
 * with innodb_rollback_on_timeout) all destroy it. Releasing it before COMMIT therefore proves,
 * on MySQL and MariaDB alike, that the dedup row is still pending in the transaction that will
 * commit the business update. Handlers must not use this name (include/idemq/plugin.h). */
#define TXN_GUARD_SAVEPOINT "idemq_txn_guard"

typedef struct store_worker {
    store_pool *pool;
    uv_thread_t thread;
    MYSQL *db;
    MYSQL_STMT *dedup_insert;
    void **handler_states;    /* one per consumer */
} store_worker;

struct store_pool {
    const config *cfg;
    db_dsn dsn;
    uv_async_t results_ready;
    uv_mutex_t lock;
    uv_cond_t work_available;
    store_job *queue_head, *queue_tail;   /* guarded by lock */
    store_job *done_head, *done_tail;     /* guarded by lock */
    bool stopping;                        /* guarded by lock */
    /* Set when a worker finds the database unreachable, cleared by a successful connect. While
     * set, APPLY jobs fail fast instead of each waiting for a connect timeout. */
    atomic_bool database_down;
    size_t pending;                       /* loop thread only */
    store_worker *workers;
    size_t worker_count;
    size_t workers_allocated;             /* handler_states allocated (may exceed started) */
};

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

/* Until this version msg_dedup.handler_name was VARCHAR(64) utf8mb4: "Orders" and "orders "
 * shared one dedup namespace. The upgrade is safe in place: names equal under byte comparison
 * were already equal under the collation, so the unique key cannot gain a conflict. */
static const char handler_name_upgrade_sql[] =
    "ALTER TABLE msg_dedup MODIFY handler_name VARBINARY(64) NOT NULL";

int store_dedup_schema_check(MYSQL *db, char *report, size_t report_len)
{
    if (mysql_query(db, "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                        "DATABASE() AND TABLE_NAME = 'msg_dedup' AND COLUMN_NAME = "
                        "'handler_name'") != 0) {
        snprintf(report, report_len, "reading msg_dedup's columns failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    int rc;
    if (!row || !row[0]) {
        snprintf(report, report_len, "msg_dedup has no handler_name column; run `idemq migrate`");
        rc = -1;
    } else if (strcasecmp(row[0], "varbinary") != 0) {
        snprintf(report, report_len,
                 "msg_dedup.handler_name is %s, compared by collation (case-insensitive, trailing "
                 "spaces ignored); `idemq migrate` changes it to VARBINARY(64) in place",
                 row[0]);
        rc = 1;
    } else {
        snprintf(report, report_len, "msg_dedup is current");
        rc = 0;
    }
    if (res)
        mysql_free_result(res);
    mysql_rollback(db);
    return rc;
}

int store_migrate(MYSQL *db, char *report, size_t report_len)
{
    char state[512];
    if (mysql_query(db, store_dedup_ddl) != 0 || mysql_commit(db) != 0) {
        snprintf(report, report_len, "creating msg_dedup failed: %s (error %u)", mysql_error(db),
                 mysql_errno(db));
        return -1;
    }
    int rc = store_dedup_schema_check(db, state, sizeof state);
    if (rc < 0) {
        snprintf(report, report_len, "%s", state);
        return -1;
    }
    if (rc == 0) {
        snprintf(report, report_len, "msg_dedup is in place and current");
        return 0;
    }
    if (mysql_query(db, handler_name_upgrade_sql) != 0) {
        snprintf(report, report_len, "upgrading msg_dedup.handler_name failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    snprintf(report, report_len,
             "upgraded msg_dedup.handler_name to VARBINARY(64): handler names now compare byte "
             "for byte (was: %s)",
             state);
    return 0;
}

static void worker_disconnect(store_worker *w)
{
    const config *cfg = w->pool->cfg;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        handler_release(&cfg->consumers[i], w->handler_states[i]);
        w->handler_states[i] = NULL;
    }
    if (w->dedup_insert)
        mysql_stmt_close(w->dedup_insert);
    w->dedup_insert = NULL;
    if (w->db)
        mysql_close(w->db);
    w->db = NULL;
}

static bool worker_connect(store_worker *w, store_job *job)
{
    if (w->db)
        return true;
    if (job->kind == STORE_JOB_APPLY && atomic_load(&w->pool->database_down)) {
        snprintf(job->error, sizeof job->error, "database unavailable (waiting for the probe)");
        return false;
    }
    w->db = db_connect(&w->pool->dsn, job->error, sizeof job->error);
    if (w->db)
        atomic_store(&w->pool->database_down, false);
    return w->db != NULL;
}

static apply_status fail_with_db(store_worker *w, store_job *job, const char *what)
{
    job->mysql_errno = db_error_format_connection(job->error, sizeof job->error, what, w->db);
    return db_error_classify(job->mysql_errno);
}

/* Binds (biz_key, handler_name) as the two parameters of a dedup statement. */
static void bind_dedup_key(MYSQL_BIND params[2], db_bind_slot slots[2], const char *biz_key,
                           const char *handler_name)
{
    db_bind_text(&params[0], &slots[0], biz_key);
    db_bind_text(&params[1], &slots[1], handler_name);
}

/* The dedup insert statement: prepared on first use, or again from scratch when fresh. Returns
 * APPLY_CONTINUE with it in w->dedup_insert, or the classified failure. */
static apply_status prepare_dedup_insert(store_worker *w, store_job *job, bool fresh)
{
    db_error error;
    if (w->dedup_insert && !fresh)
        return APPLY_CONTINUE;
    if (w->dedup_insert)
        mysql_stmt_close(w->dedup_insert);
    w->dedup_insert = NULL;
    int rc = db_prepare(w->db, dedup_insert_sql, &w->dedup_insert, &error);
    if (rc == 0)
        return APPLY_CONTINUE;
    job->mysql_errno = db_error_format(job->error, sizeof job->error,
                                       rc == -ENOMEM ? "dedup insert" : "prepare dedup insert",
                                       &error);
    return db_error_classify(job->mysql_errno);
}

/* Inserts the dedup row: APPLY_CONTINUE when inserted, APPLY_DUPLICATE, or the failure. */
static apply_status insert_dedup_row(store_worker *w, store_job *job, const char *handler_name)
{
    apply_status status = prepare_dedup_insert(w, job, false);
    if (status != APPLY_CONTINUE)
        return status;
    MYSQL_BIND params[2];
    db_bind_slot slots[2] = {{0}};
    bind_dedup_key(params, slots, job->env->biz_key, handler_name);
    if (mysql_stmt_bind_param(w->dedup_insert, params) || mysql_stmt_execute(w->dedup_insert)) {
        job->mysql_errno = mysql_stmt_errno(w->dedup_insert);
        if (job->mysql_errno == ER_DUP_ENTRY)
            return APPLY_DUPLICATE;
        db_error_format_statement(job->error, sizeof job->error, "dedup insert",
                                  w->dedup_insert);
        return db_error_classify(job->mysql_errno);
    }
    return APPLY_CONTINUE;
}

/*
 * The outage probe: the server must answer and accept writes. A read-only server (after a
 * failover, or --read-only) answers pings yet fails every transaction, and resuming on it would
 * only pause again at once.
 */
static apply_status probe_writable(store_worker *w, store_job *job)
{
    if (mysql_query(w->db, "SELECT @@global.read_only") != 0) {
        fail_with_db(w, job, "probe");
        return APPLY_UNAVAILABLE;
    }
    MYSQL_RES *res = mysql_store_result(w->db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    bool read_only = row && row[0] && strcmp(row[0], "0") != 0;
    if (res)
        mysql_free_result(res);
    mysql_rollback(w->db); /* ends the read's transaction: autocommit is off */
    if (!row) {
        fail_with_db(w, job, "probe");
        return APPLY_UNAVAILABLE;
    }
    if (read_only) {
        snprintf(job->error, sizeof job->error, "the database is read-only (@@read_only = 1)");
        return APPLY_UNAVAILABLE;
    }
    return APPLY_CONTINUE;
}

/* After idemq's transaction ended behind its back and was rolled back: is the dedup row
 * committed (1), absent (0), or unknown (-1, the connection failed)? */
static int dedup_row_committed(store_worker *w, const char *biz_key, const char *handler_name)
{
    MYSQL_STMT *stmt;
    MYSQL_BIND params[2];
    db_bind_slot slots[2] = {{0}};
    db_error error;
    int found = -1;
    int rc = db_prepare(w->db, dedup_lookup_sql, &stmt, &error);
    if (rc == -ENOMEM)
        return -1;
    if (rc == 0) {
        bind_dedup_key(params, slots, biz_key, handler_name);
        if (mysql_stmt_bind_param(stmt, params) == 0 && mysql_stmt_execute(stmt) == 0 &&
            mysql_stmt_store_result(stmt) == 0)
            found = mysql_stmt_num_rows(stmt) > 0;
        mysql_stmt_close(stmt);
    }
    mysql_rollback(w->db); /* the lookup opened a read transaction: autocommit is off */
    return found;
}

/*
 * Checks the savepoint set after the dedup insert (TXN_GUARD_SAVEPOINT). Returns status
 * unchanged when the transaction is still idemq's; otherwise rolls back whatever runs in its
 * place and returns the status that tells the truth, with the cause in job->error.
 */
static apply_status verify_transaction(store_worker *w, store_job *job, const char *handler_name,
                                       apply_status status)
{
    if (mysql_query(w->db, "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT) == 0)
        return status;
    unsigned int error_number = mysql_errno(w->db);
    if (error_number != ER_SP_DOES_NOT_EXIST) {
        job->mysql_errno = error_number;
        snprintf(job->error, sizeof job->error, "checking the transaction: MySQL error %u: %s",
                 error_number, mysql_error(w->db));
        return db_error_classify(error_number);
    }
    mysql_rollback(w->db);
    int committed = dedup_row_committed(w, job->env->biz_key, handler_name);
    if (committed < 0) {
        snprintf(job->error, sizeof job->error,
                 "idemq's transaction ended during the handler, and checking the dedup row "
                 "failed: MySQL error %u: %s",
                 mysql_errno(w->db), mysql_error(w->db));
        return APPLY_UNAVAILABLE;
    }
    if (committed) {
        /* Something the handler ran committed the dedup row with part of the effect: a retry
         * would be swallowed as a duplicate, so only a person can put this right. */
        snprintf(job->error, sizeof job->error,
                 "the handler ended idemq's transaction with a COMMIT (a CALLed procedure that "
                 "commits, or a statement with an implicit commit such as DDL): the dedup row "
                 "was committed with only the effect before that point; idemq rolled back the "
                 "rest. Fix the handler (it must never commit), repair the row, and delete the "
                 "msg_dedup row (biz_key, handler %s) before replaying",
                 handler_name);
        return APPLY_NON_RETRYABLE;
    }
    if (status == APPLY_CONTINUE || status == APPLY_STATE_NOOP) {
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
 * The second half of the outage probe: every statement a message will run prepares again, from
 * scratch (cached ones are dropped first). After a schema error (a table renamed away, a column
 * dropped, a grant revoked) this is what proves the operator's fix, where a ping would not.
 */
static apply_status probe_statements(store_worker *w, store_job *job)
{
    const config *cfg = w->pool->cfg;
    apply_status status = prepare_dedup_insert(w, job, true);
    if (status != APPLY_CONTINUE)
        return status;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        handler_release(&cfg->consumers[i], w->handler_states[i]);
        w->handler_states[i] = NULL;
        handler_call call = {
            .db = w->db,
            .consumer = &cfg->consumers[i],
            .state = &w->handler_states[i],
            .error = job->error,
            .error_len = sizeof job->error,
        };
        status = handler_prepare_all(&call);
        if (status != APPLY_CONTINUE) {
            job->mysql_errno = call.mysql_errno;
            job->consumer_index = i;
            /* Whatever failed here, messages cannot be applied yet: keep pausing. */
            return APPLY_UNAVAILABLE;
        }
    }
    return APPLY_CONTINUE;
}

static apply_status run_transaction(store_worker *w, store_job *job)
{
    const config_consumer *consumer = &w->pool->cfg->consumers[job->consumer_index];
    apply_status status = insert_dedup_row(w, job, consumer->handler_name);
    if (status != APPLY_CONTINUE) {
        mysql_rollback(w->db);
        return status;
    }
    if (mysql_query(w->db, "SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0) {
        status = fail_with_db(w, job, "savepoint");
        mysql_rollback(w->db);
        return status;
    }
    handler_call call = {
        .db = w->db,
        .consumer = consumer,
        .env = job->env,
        .body = job->body,
        .body_len = job->body_len,
        .state = &w->handler_states[job->consumer_index],
        .error = job->error,
        .error_len = sizeof job->error,
    };
    status = handler_apply(&call);
    job->mysql_errno = call.mysql_errno;
    if (status != APPLY_UNAVAILABLE)
        status = verify_transaction(w, job, consumer->handler_name, status);
    if (status != APPLY_CONTINUE && status != APPLY_STATE_NOOP) {
        mysql_rollback(w->db);
        return status;
    }
    /* Only a successful COMMIT makes the ack safe; a lost connection here leaves the outcome
     * unknown, and the redelivery is settled by the dedup row either way. */
    if (mysql_commit(w->db) != 0)
        return fail_with_db(w, job, "commit");
    return status == APPLY_CONTINUE ? APPLY_COMMITTED : APPLY_STATE_NOOP;
}

static void run_job(store_worker *w, store_job *job)
{
    uint64_t started = now_ns();
    job->error[0] = '\0';
    job->mysql_errno = 0;
    if (!worker_connect(w, job)) {
        job->status = APPLY_UNAVAILABLE;
    } else if (job->kind == STORE_JOB_PING || job->kind == STORE_JOB_PROBE) {
        job->status = probe_writable(w, job);
        if (job->status == APPLY_CONTINUE && job->kind == STORE_JOB_PROBE)
            job->status = probe_statements(w, job);
        if (job->status == APPLY_CONTINUE) {
            /* A PING or PROBE job reports a database that passed as APPLY_COMMITTED (store.h). */
            job->status = APPLY_COMMITTED;
            atomic_store(&w->pool->database_down, false);
        }
    } else {
        job->status = run_transaction(w, job);
    }
    if (job->status == APPLY_UNAVAILABLE) {
        worker_disconnect(w);
        atomic_store(&w->pool->database_down, true);
    }
    job->duration_ns = now_ns() - started;
}

static void worker_main(void *arg)
{
    store_worker *w = arg;
    store_pool *pool = w->pool;
    mysql_thread_init();
    for (;;) {
        uv_mutex_lock(&pool->lock);
        while (!pool->queue_head && !pool->stopping)
            uv_cond_wait(&pool->work_available, &pool->lock);
        store_job *job = pool->queue_head;
        if (job) {
            pool->queue_head = job->next;
            if (!pool->queue_head)
                pool->queue_tail = NULL;
        }
        uv_mutex_unlock(&pool->lock);
        if (!job)
            break; /* stopping and the queue is empty */

        run_job(w, job);

        job->next = NULL;
        uv_mutex_lock(&pool->lock);
        if (pool->done_tail)
            pool->done_tail->next = job;
        else
            pool->done_head = job;
        pool->done_tail = job;
        uv_mutex_unlock(&pool->lock);
        uv_async_send(&pool->results_ready);
    }
    worker_disconnect(w);
    mysql_thread_end();
}

static void deliver_results(store_pool *pool)
{
    uv_mutex_lock(&pool->lock);
    store_job *job = pool->done_head;
    pool->done_head = pool->done_tail = NULL;
    uv_mutex_unlock(&pool->lock);
    while (job) {
        store_job *next = job->next;
        job->next = NULL;
        pool->pending--;
        job->on_done(job);
        job = next;
    }
}

static void on_results_ready(uv_async_t *handle)
{
    deliver_results(handle->data);
}

static void free_pool_memory(store_pool *pool)
{
    if (pool->workers)
        for (size_t i = 0; i < pool->workers_allocated; i++)
            free(pool->workers[i].handler_states);
    free(pool->workers);
    uv_cond_destroy(&pool->work_available);
    uv_mutex_destroy(&pool->lock);
    free(pool);
}

static void on_async_closed(uv_handle_t *handle)
{
    free_pool_memory(handle->data);
}

int store_pool_new(uv_loop_t *loop, const config *cfg, store_pool **out, char *err,
                   size_t err_len)
{
    /* Before any worker starts: a worker's first call into the client is mysql_thread_init. */
    db_library_init();
    store_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    pool->cfg = cfg;
    if (db_dsn_parse(cfg->mysql_url, &pool->dsn, err, err_len) != 0) {
        free(pool);
        return -1;
    }
    uv_mutex_init(&pool->lock);
    uv_cond_init(&pool->work_available);
    pool->worker_count = cfg->workers;
    pool->workers = calloc(pool->worker_count, sizeof *pool->workers);
    if (!pool->workers)
        goto fail;
    for (size_t i = 0; i < pool->worker_count; i++) {
        pool->workers[i].pool = pool;
        pool->workers[i].handler_states = calloc(cfg->consumer_count, sizeof(void *));
        if (!pool->workers[i].handler_states)
            goto fail;
        pool->workers_allocated = i + 1;
    }
    if (uv_async_init(loop, &pool->results_ready, on_results_ready) != 0)
        goto fail;
    pool->results_ready.data = pool;
    for (size_t i = 0; i < pool->worker_count; i++) {
        int rc = uv_thread_create(&pool->workers[i].thread, worker_main, &pool->workers[i]);
        if (rc != 0) {
            snprintf(err, err_len, "cannot start DB worker: %s", uv_strerror(rc));
            pool->worker_count = i;
            store_pool_free(pool);
            return -1;
        }
    }
    *out = pool;
    return 0;
fail:
    snprintf(err, err_len, "out of memory");
    free_pool_memory(pool);
    return -1;
}

int store_submit(store_pool *pool, store_job *job)
{
    job->next = NULL;
    uv_mutex_lock(&pool->lock);
    if (pool->stopping) {
        uv_mutex_unlock(&pool->lock);
        return -1;
    }
    if (pool->queue_tail)
        pool->queue_tail->next = job;
    else
        pool->queue_head = job;
    pool->queue_tail = job;
    uv_cond_signal(&pool->work_available);
    uv_mutex_unlock(&pool->lock);
    pool->pending++;
    return 0;
}

size_t store_pending(const store_pool *pool)
{
    return pool->pending;
}

void store_pool_free(store_pool *pool)
{
    if (!pool)
        return;
    uv_mutex_lock(&pool->lock);
    pool->stopping = true;
    uv_cond_broadcast(&pool->work_available);
    uv_mutex_unlock(&pool->lock);
    for (size_t i = 0; i < pool->worker_count; i++)
        uv_thread_join(&pool->workers[i].thread);
    deliver_results(pool);
    uv_close((uv_handle_t *)&pool->results_ready, on_async_closed);
}
