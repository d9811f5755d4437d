/*
 * store — the DB worker pool: one MySQL session per thread, many messages per transaction, one
 * outcome per message.
 *
 * The loop thread submits one job per message (or check); a worker runs it on its session
 * (store/session.h):
 *   APPLY  the message's dedup insert, handler and outbox rows (outbox/writer.h). A worker takes up to cfg->batch queued APPLY
 *          jobs of one consumer and applies them in one transaction with one COMMIT
 *          (store/batch.h); each job still gets its own status, exactly as if it had run alone
 *          (store/transaction.h): a duplicate, an illegal transition or a failed handler of one
 *          message never rolls back, retries or dead-letters another.
 *   PING   connect if needed, check the server accepts writes (health)
 *   PROBE  PING, and every statement prepares again (the outage probe)
 * and hands the jobs back to the loop thread through uv_async_send, where on_done runs once per
 * job, in the order of the batch and after its COMMIT. A batch forms from what is queued when a
 * worker looks: workers are woken once per loop turn (not once per job), so the messages of one
 * turn can share a transaction; a worker holding a partial batch while every other worker is
 * busy waits up to cfg->batch_linger_ms for more. An idle pool runs a lone message at once.
 * Connections are opened lazily and dropped after an infrastructure error; the next job
 * reconnects. msg_dedup's DDL and migration are in store/schema.h.
 *
 * Test-only fault injection: with IDEMQ_TEST_KILL_AFTER_COMMITS=N in the environment the process
 * SIGKILLs itself right after its N-th successful COMMIT of a batch of more than one message,
 * before any job of that batch is handed back (so none of them is acked): the crash between
 * COMMIT and the acks that tests/integration/test_batch.c recovers from. Never set it otherwise.
 *
 * Errors: functions that can fail return 0 or -1, with a reason in the caller's err buffer where
 * there is one; a job's result is its status, mysql_errno and error.
 * Thread affinity: store_pool_new/submit/pending/free on the loop thread; on_done runs there.
 */
#ifndef IDEMQ_STORE_H
#define IDEMQ_STORE_H

#include <stdint.h>
#include <uv.h>

#include "config/config.h"
#include "envelope/envelope.h"
#include "policy/outcome.h"

#define STORE_ERROR_MAX 1024

typedef enum store_job_kind {
    STORE_JOB_APPLY = 0,  /* dedup + handler in one transaction */
    STORE_JOB_PING,       /* connect if needed, check the server accepts writes: health */
    STORE_JOB_PROBE,      /* PING, and every statement prepares again: the outage probe */
} store_job_kind;

typedef struct store_job store_job;
typedef void (*store_done_cb)(store_job *job);

struct store_job {
    store_job *next;                  /* owned by the pool while queued */
    store_job_kind kind;
    size_t consumer_index;            /* index into cfg->consumers (and the handler state) */
    const envelope *env;              /* borrowed until on_done */
    const void *body;                 /* raw body, borrowed until on_done; may be NULL (plugins) */
    size_t body_len;
    store_done_cb on_done;            /* runs on the loop thread, exactly once per accepted job */
    /* results, written by the worker */
    apply_status status;              /* APPLY: the message's outcome. PING, PROBE: APPLY_COMMITTED
                                       * when the database passed, else why not (mostly
                                       * APPLY_UNAVAILABLE) */
    unsigned int mysql_errno;
    uint64_t dedup_row_id;            /* APPLY: the id of the dedup row the attempt inserted, 0
                                       * before (tells its own row from another copy's) */
    uint64_t duration_ns;
    char error[STORE_ERROR_MAX];
};

typedef struct store_pool store_pool;

/*
 * Starts cfg->workers threads. cfg is borrowed and must outlive the pool. Connections are made
 * lazily, so this succeeds with the database down. Returns 0, or -1 with a reason in err.
 */
int store_pool_new(uv_loop_t *loop, const config *cfg, store_pool **out, char *err,
                   size_t err_len);

/* Makes the workers call notify(ctx) after each COMMIT that inserted outbox rows (the relay,
 * outbox/relay.h, then publishes them without waiting for its poll). Call before the first
 * store_submit; notify runs on worker threads and must not block. */
void store_pool_set_outbox_notify(store_pool *pool, void (*notify)(void *ctx), void *ctx);

/* Queues job (borrowed until its on_done). Workers are woken before the loop next waits for I/O,
 * so the jobs submitted in one loop turn can share a transaction. Returns 0, or -1 when the pool
 * is shutting down (then on_done never runs). */
int store_submit(store_pool *pool, store_job *job);

/* Jobs queued or running, not yet handed back. */
size_t store_pending(const store_pool *pool);

/*
 * Lets the workers finish every queued job, joins them, runs the remaining on_done callbacks and
 * closes the async handle; the memory is released from its close callback, so keep running the
 * loop afterwards. store_pool_free(NULL) is a no-op.
 */
void store_pool_free(store_pool *pool);

#endif
