/*
 * pool — DB worker threads and their job queues. See store.h.
 *
 * Jobs travel loop → worker through a mutex/condvar queue and worker → loop through a second list
 * and one uv_async_t (async sends coalesce, so the callback drains the whole list). Each worker
 * owns one session (store/session.h): its MySQL connection and the statements prepared on it.
 */
#include "store/store.h"

#include <mysql.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/connect.h"
#include "db/dsn.h"
#include "db/error.h"
#include "handlers/handler.h"
#include "store/session.h"
#include "store/transaction.h"

typedef struct store_worker {
    store_pool *pool;
    uv_thread_t thread;
    store_session session;
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
    size_t sessions_initialised;          /* sessions to close (may exceed workers started) */
};

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

static bool worker_connect(store_worker *w, store_job *job)
{
    if (w->session.db)
        return true;
    if (job->kind == STORE_JOB_APPLY && atomic_load(&w->pool->database_down)) {
        snprintf(job->error, sizeof job->error, "database unavailable (waiting for the probe)");
        return false;
    }
    unsigned error_number;
    if (store_session_connect(&w->session, &w->pool->dsn, &error_number, job->error,
                              sizeof job->error) != 0) {
        /* Only a TLS failure is recorded (the outage then says "TLS error", loudly); any other
         * connect failure stays an outage, as it always was. */
        if (db_error_is_tls(error_number))
            job->mysql_errno = error_number;
        return false;
    }
    atomic_store(&w->pool->database_down, false);
    return true;
}

/* A PING or PROBE job: the checks of store/session.h; a database that passes them is reported
 * as APPLY_COMMITTED (store.h). */
static apply_status check_database(store_worker *w, store_job *job)
{
    apply_status status = store_session_check_writable(&w->session, job);
    if (status == APPLY_CONTINUE && job->kind == STORE_JOB_PROBE)
        status = store_session_check_statements(&w->session, job);
    if (status != APPLY_CONTINUE)
        return status;
    atomic_store(&w->pool->database_down, false);
    return APPLY_COMMITTED;
}

static void run_job(store_worker *w, store_job *job)
{
    uint64_t started = now_ns();
    job->error[0] = '\0';
    job->mysql_errno = 0;
    if (!worker_connect(w, job))
        job->status = APPLY_UNAVAILABLE;
    else if (job->kind == STORE_JOB_PING || job->kind == STORE_JOB_PROBE)
        job->status = check_database(w, job);
    else
        job->status = store_transaction_run(&w->session, job);
    if (job->status == APPLY_UNAVAILABLE) {
        store_session_disconnect(&w->session);
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
    store_session_disconnect(&w->session);
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
    for (size_t i = 0; i < pool->sessions_initialised; i++)
        store_session_close(&pool->workers[i].session);
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
    if (db_dsn_from_config(cfg, &pool->dsn, err, err_len) != 0) {
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
        if (store_session_init(&pool->workers[i].session, cfg) != 0)
            goto fail;
        pool->sessions_initialised = i + 1;
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
