/*
 * pool — DB worker threads and their job queue. See store.h.
 *
 * Jobs travel loop → worker through one mutex/condvar queue and worker → loop through a second
 * list and one uv_async_t (async sends coalesce, so the callback drains the whole list). Each
 * worker owns one session (store/session.h): its MySQL connection and the statements prepared on
 * it, and a batch array of cfg->batch job pointers.
 *
 * Forming batches. store_submit only queues; a uv_prepare handle, which runs before the loop
 * next waits for I/O, wakes as many idle workers as the queue fills batches. A worker takes the
 * oldest job and, when it is an APPLY job, every queued APPLY job of the same consumer up to
 * cfg->batch (jobs of other consumers stay queued, in order, for the next worker). When the batch
 * is partial and every other worker is busy — the database is the bottleneck, so a fuller
 * transaction is worth a millisecond — it lingers up to cfg->batch_linger_ms, taking what
 * arrives; jobs submitted meanwhile wake the lingering worker rather than an idle one. With a
 * worker idle nothing waits: a lone message at low load runs at once.
 */
#include "store/store.h"

#include <mysql.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/connect.h"
#include "db/dsn.h"
#include "db/error.h"
#include "handlers/handler.h"
#include "store/batch.h"
#include "store/session.h"
#include "store/transaction.h"

#define WAITING_FOR_PROBE " (waiting for the probe)"

typedef struct store_worker {
    store_pool *pool;
    uv_thread_t thread;
    store_session session;
    store_job **batch; /* cfg->batch slots: the jobs of the transaction being run */
} store_worker;

struct store_pool {
    const config *cfg;
    db_dsn dsn;
    uv_async_t results_ready;
    uv_prepare_t wake;                    /* loop thread: wakes workers once per loop turn */
    bool wake_armed;                      /* loop thread only */
    uv_mutex_t lock;
    uv_cond_t work_available;             /* idle workers wait here */
    uv_cond_t batch_grew;                 /* a lingering worker waits here */
    store_job *queue_head, *queue_tail;   /* guarded by lock */
    size_t queued;                        /* guarded by lock: jobs in the queue */
    unsigned idle;                        /* guarded by lock: workers waiting for work */
    unsigned running;                     /* guarded by lock: workers running jobs */
    unsigned lingering;                   /* guarded by lock: workers filling a batch */
    store_job *done_head, *done_tail;     /* guarded by lock */
    bool stopping;                        /* guarded by lock */
    /* Set when a worker finds the database unreachable, cleared by a successful connect. While
     * set, APPLY jobs fail fast instead of each waiting for a connect timeout, and carry the
     * error that set it: a job failed fast may reach the loop before the one that failed, and the
     * loop tells a schema or TLS error from an outage by that error. Guarded by lock. */
    bool database_down;
    unsigned int down_errno;
    char down_error[STORE_ERROR_MAX - sizeof WAITING_FOR_PROBE + 1];
    size_t pending;                       /* loop thread only */
    unsigned batch_max;
    uint64_t linger_ns;
    atomic_long commits_until_kill;       /* IDEMQ_TEST_KILL_AFTER_COMMITS; 0: never */
    void (*outbox_notify)(void *ctx);     /* set before the first submit; may be NULL */
    void *outbox_notify_ctx;
    store_worker *workers;
    size_t worker_count;
    size_t sessions_initialised;          /* sessions to close (may exceed workers started) */
    int sync_initialised; /* lock, work_available, batch_grew: how many were set up (to destroy) */
};

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

static void mark_database_up(store_pool *pool)
{
    uv_mutex_lock(&pool->lock);
    pool->database_down = false;
    uv_mutex_unlock(&pool->lock);
}

static void mark_database_down(store_pool *pool, const store_job *cause)
{
    uv_mutex_lock(&pool->lock);
    pool->database_down = true;
    pool->down_errno = cause->mysql_errno;
    /* Cut to leave room for WAITING_FOR_PROBE in the jobs failed fast. */
    snprintf(pool->down_error, sizeof pool->down_error, "%.*s", (int)sizeof pool->down_error - 1,
             cause->error[0] ? cause->error : "database unavailable");
    uv_mutex_unlock(&pool->lock);
}

/* Fails job fast if the database is marked down, with the error that marked it. */
static bool failed_fast(store_pool *pool, store_job *job)
{
    uv_mutex_lock(&pool->lock);
    bool down = pool->database_down;
    if (down) {
        job->mysql_errno = pool->down_errno;
        snprintf(job->error, sizeof job->error, "%s" WAITING_FOR_PROBE, pool->down_error);
    }
    uv_mutex_unlock(&pool->lock);
    return down;
}

static bool worker_connect(store_worker *w, store_job *job)
{
    if (w->session.db)
        return true;
    if (job->kind == STORE_JOB_APPLY && failed_fast(w->pool, job))
        return false;
    unsigned error_number;
    if (store_session_connect(&w->session, &w->pool->dsn, &error_number, job->error,
                              sizeof job->error) != 0) {
        /* Only a TLS failure is recorded (the outage then says "TLS error", loudly); any other
         * connect failure stays an outage, as it always was. */
        if (db_error_is_tls(error_number))
            job->mysql_errno = error_number;
        return false;
    }
    mark_database_up(w->pool);
    return true;
}

/* A PING or PROBE job: the checks of store/session.h; a database that passes them is reported
 * as APPLY_COMMITTED (store.h). */
static apply_status check_database(store_worker *w, store_job *job)
{
    apply_status status = store_session_check_writable(&w->session, job);
    if (status == APPLY_OK && job->kind == STORE_JOB_PROBE)
        status = store_session_check_statements(&w->session, job);
    if (status != APPLY_OK)
        return status;
    mark_database_up(w->pool);
    return APPLY_COMMITTED;
}

/* The test-only crash between a batch's COMMIT and its acks (store.h). */
static void maybe_kill_after_commit(store_pool *pool, store_job **jobs, size_t n)
{
    if (n < 2 || atomic_load(&pool->commits_until_kill) <= 0)
        return;
    bool committed = false;
    for (size_t i = 0; i < n; i++)
        committed |= jobs[i]->status == APPLY_COMMITTED || jobs[i]->status == APPLY_STATE_NOOP;
    if (committed && atomic_fetch_sub(&pool->commits_until_kill, 1) == 1)
        raise(SIGKILL);
}

/* The first job that found the database unavailable; the jobs of its batch after it that were
 * not run take its error. */
static const store_job *unavailable_cause(store_job **jobs, size_t n)
{
    const store_job *cause = NULL;
    for (size_t i = 0; i < n; i++) {
        if (jobs[i]->status != APPLY_UNAVAILABLE)
            continue;
        if (!cause) {
            cause = jobs[i];
        } else if (!jobs[i]->error[0]) {
            jobs[i]->mysql_errno = cause->mysql_errno;
            memcpy(jobs[i]->error, cause->error, sizeof jobs[i]->error);
        }
    }
    return cause ? cause : jobs[0];
}

/* Runs the n jobs in w->batch: one PING or PROBE, or APPLY jobs of one consumer. */
static void run_jobs(store_worker *w, size_t n)
{
    store_job **jobs = w->batch;
    store_job *first = jobs[0];
    uint64_t started = now_ns();
    for (size_t i = 0; i < n; i++) {
        jobs[i]->error[0] = '\0';
        jobs[i]->mysql_errno = 0;
    }
    bool unavailable;
    if (!worker_connect(w, first)) {
        for (size_t i = 0; i < n; i++) {
            jobs[i]->status = APPLY_UNAVAILABLE;
            if (i > 0) {
                jobs[i]->mysql_errno = first->mysql_errno;
                memcpy(jobs[i]->error, first->error, sizeof jobs[i]->error);
            }
        }
        unavailable = true;
    } else if (first->kind == STORE_JOB_PING || first->kind == STORE_JOB_PROBE) {
        first->status = check_database(w, first);
        unavailable = first->status == APPLY_UNAVAILABLE;
    } else {
        unavailable = store_batch_run(&w->session, jobs, n) != 0;
        maybe_kill_after_commit(w->pool, jobs, n);
        if (w->session.outbox_committed > 0) {
            w->session.outbox_committed = 0;
            if (w->pool->outbox_notify)
                w->pool->outbox_notify(w->pool->outbox_notify_ctx);
        }
    }
    if (unavailable) {
        store_session_disconnect(&w->session);
        mark_database_down(w->pool, unavailable_cause(jobs, n));
    }
    /* Every job of a batch waited for the same COMMIT: each reports the batch's duration. */
    uint64_t duration = now_ns() - started;
    for (size_t i = 0; i < n; i++)
        jobs[i]->duration_ns = duration;
}

/* Moves queued APPLY jobs of consumer (lock held) into w->batch from slot n until it is full.
 * Returns the new count. */
static size_t take_more(store_pool *pool, store_worker *w, size_t n, size_t consumer)
{
    store_job *prev = NULL, *job = pool->queue_head;
    while (job && n < pool->batch_max) {
        store_job *next = job->next;
        if (job->kind == STORE_JOB_APPLY && job->consumer_index == consumer) {
            if (prev)
                prev->next = next;
            else
                pool->queue_head = next;
            if (pool->queue_tail == job)
                pool->queue_tail = prev;
            job->next = NULL;
            w->batch[n++] = job;
            pool->queued--;
        } else {
            prev = job;
        }
        job = next;
    }
    return n;
}

/* Takes the next batch (lock held, queue not empty): the oldest job, and with an APPLY job the
 * queued APPLY jobs of its consumer, lingering for more while every other worker is busy. */
static size_t take_batch(store_pool *pool, store_worker *w)
{
    store_job *job = pool->queue_head;
    pool->queue_head = job->next;
    if (!pool->queue_head)
        pool->queue_tail = NULL;
    pool->queued--;
    job->next = NULL;
    w->batch[0] = job;
    if (job->kind != STORE_JOB_APPLY || pool->batch_max == 1)
        return 1;
    size_t n = take_more(pool, w, 1, job->consumer_index);
    if (n < pool->batch_max && pool->linger_ns > 0 && pool->running >= pool->worker_count) {
        uint64_t deadline = now_ns() + pool->linger_ns;
        pool->lingering++;
        while (n < pool->batch_max && !pool->stopping) {
            uint64_t now = now_ns();
            if (now >= deadline)
                break;
            int rc = uv_cond_timedwait(&pool->batch_grew, &pool->lock, deadline - now);
            n = take_more(pool, w, n, job->consumer_index);
            if (rc == UV_ETIMEDOUT)
                break;
        }
        pool->lingering--;
    }
    return n;
}

static void worker_main(void *arg)
{
    store_worker *w = arg;
    store_pool *pool = w->pool;
    mysql_thread_init();
    uv_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->queue_head && !pool->stopping) {
            pool->idle++;
            uv_cond_wait(&pool->work_available, &pool->lock);
            pool->idle--;
        }
        if (!pool->queue_head)
            break; /* stopping and the queue is empty */
        pool->running++;
        size_t n = take_batch(pool, w);
        if (pool->queue_head && pool->idle)
            uv_cond_signal(&pool->work_available); /* more than this batch: share it */
        uv_mutex_unlock(&pool->lock);

        run_jobs(w, n);

        uv_mutex_lock(&pool->lock);
        pool->running--;
        for (size_t i = 0; i < n; i++) {
            store_job *job = w->batch[i];
            job->next = NULL;
            if (pool->done_tail)
                pool->done_tail->next = job;
            else
                pool->done_head = job;
            pool->done_tail = job;
        }
        uv_mutex_unlock(&pool->lock);
        uv_async_send(&pool->results_ready);
        uv_mutex_lock(&pool->lock);
    }
    uv_mutex_unlock(&pool->lock);
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

/* Before the loop waits for I/O: wake the workers this turn's jobs need, once. */
static void on_wake(uv_prepare_t *handle)
{
    store_pool *pool = handle->data;
    uv_prepare_stop(handle);
    pool->wake_armed = false;
    uv_mutex_lock(&pool->lock);
    if (pool->lingering)
        uv_cond_broadcast(&pool->batch_grew);
    size_t batches = (pool->queued + pool->batch_max - 1) / pool->batch_max;
    for (size_t i = 0; i < batches && i < pool->idle; i++)
        uv_cond_signal(&pool->work_available);
    uv_mutex_unlock(&pool->lock);
}

static void free_pool_memory(store_pool *pool)
{
    for (size_t i = 0; i < pool->sessions_initialised; i++)
        store_session_close(&pool->workers[i].session);
    for (size_t i = 0; pool->workers && i < pool->cfg->workers; i++)
        free(pool->workers[i].batch);
    free(pool->workers);
    if (pool->sync_initialised >= 3)
        uv_cond_destroy(&pool->batch_grew);
    if (pool->sync_initialised >= 2)
        uv_cond_destroy(&pool->work_available);
    if (pool->sync_initialised >= 1)
        uv_mutex_destroy(&pool->lock);
    free(pool);
}

static void on_handle_closed(uv_handle_t *handle)
{
    store_pool *pool = handle->data;
    /* Both handles point at the pool; the second to close frees it. */
    if (handle == (uv_handle_t *)&pool->wake)
        uv_close((uv_handle_t *)&pool->results_ready, on_handle_closed);
    else
        free_pool_memory(pool);
}

static long kill_after_commits(void)
{
    const char *text = getenv("IDEMQ_TEST_KILL_AFTER_COMMITS");
    long n = text ? strtol(text, NULL, 10) : 0;
    return n > 0 ? n : 0;
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
    pool->batch_max = cfg->batch ? cfg->batch : 1;
    pool->linger_ns = (uint64_t)cfg->batch_linger_ms * 1000000u;
    atomic_init(&pool->commits_until_kill, kill_after_commits());
    if (uv_mutex_init(&pool->lock) != 0)
        goto sync_failed;
    pool->sync_initialised = 1;
    if (uv_cond_init(&pool->work_available) != 0)
        goto sync_failed;
    pool->sync_initialised = 2;
    if (uv_cond_init(&pool->batch_grew) != 0)
        goto sync_failed;
    pool->sync_initialised = 3;
    pool->worker_count = cfg->workers;
    pool->workers = calloc(pool->worker_count, sizeof *pool->workers);
    if (!pool->workers)
        goto fail;
    for (size_t i = 0; i < pool->worker_count; i++) {
        store_worker *w = &pool->workers[i];
        w->pool = pool;
        w->batch = calloc(pool->batch_max, sizeof *w->batch);
        if (!w->batch || store_session_init(&w->session, cfg) != 0)
            goto fail;
        pool->sessions_initialised = i + 1;
    }
    if (uv_async_init(loop, &pool->results_ready, on_results_ready) != 0)
        goto fail;
    pool->results_ready.data = pool;
    uv_prepare_init(loop, &pool->wake);
    pool->wake.data = pool;
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
sync_failed:
    snprintf(err, err_len, "cannot create the DB pool's lock or condition variables");
    free_pool_memory(pool);
    return -1;
}

void store_pool_set_outbox_notify(store_pool *pool, void (*notify)(void *ctx), void *ctx)
{
    pool->outbox_notify = notify;
    pool->outbox_notify_ctx = ctx;
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
    pool->queued++;
    uv_mutex_unlock(&pool->lock);
    pool->pending++;
    if (!pool->wake_armed) {
        pool->wake_armed = true;
        uv_prepare_start(&pool->wake, on_wake);
    }
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
    uv_cond_broadcast(&pool->batch_grew);
    uv_mutex_unlock(&pool->lock);
    for (size_t i = 0; i < pool->worker_count; i++)
        uv_thread_join(&pool->workers[i].thread);
    deliver_results(pool);
    uv_prepare_stop(&pool->wake);
    uv_close((uv_handle_t *)&pool->wake, on_handle_closed);
}
