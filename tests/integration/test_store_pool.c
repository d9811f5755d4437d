/*
 * test_store_pool — the DB worker pool (adapter/store/pool.c) driven directly on a libuv loop,
 * against the real MariaDB (or MySQL, IDEMQ_TEST_DB=mysql).
 *
 *   failed fast: once one worker finds the database unavailable, a job taken by a worker with no
 *   connection fails at once ("waiting for the probe") instead of waiting for a connect timeout.
 *   Such a job can reach the loop before the one that failed (CI saw it: a schema error logged as
 *   a plain outage, then "schema error while paused"), so it must carry the error that marked
 *   the database down, errno included: the loop tells a schema or TLS error from an outage by it.
 *   Then a probe that passes clears the mark and a job applies.
 *
 * Each test has its own database (harness.h); no broker is involved. Waits are on the jobs'
 * completions, run on the loop thread as in idemq.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "config/config.h"
#include "db/error.h"
#include "envelope/envelope.h"
#include "harness.h"
#include "store/store.h"

#define DEADLINE_MS 30000

static harness H;
static bool h_ready;
static config *cfg;
static uv_loop_t loop;
static bool loop_ready;
static store_pool *pool;

static void teardown(void)
{
    if (pool)
        store_pool_free(pool);
    pool = NULL;
    if (loop_ready) {
        uv_run(&loop, UV_RUN_DEFAULT); /* the pool's handles close */
        uv_loop_close(&loop);
    }
    loop_ready = false;
    config_free(cfg);
    cfg = NULL;
    if (h_ready)
        harness_fini(&H);
    h_ready = false;
}

TestSuite(store_pool, .fini = teardown, .timeout = 120);

typedef struct applied_job {
    store_job job;
    envelope env;
    char body[256];
    bool done;
} applied_job;

static void on_job_done(store_job *job)
{
    ((applied_job *)job)->done = true; /* job is the first member */
}

static void submit(applied_job *a, store_job_kind kind, const char *order_id)
{
    memset(a, 0, sizeof *a);
    a->job.kind = kind;
    a->job.on_done = on_job_done;
    if (kind == STORE_JOB_APPLY) {
        int n = snprintf(a->body, sizeof a->body,
                         "{\"message_id\":\"m-%s\",\"biz_key\":\"order_id:%s:PAY_SUCCESS\","
                         "\"order_id\":\"%s\",\"event_type\":\"PAY_SUCCESS\",\"amount\":1}",
                         order_id, order_id, order_id);
        char err[256];
        cr_assert_eq(
            envelope_decode(a->body, (size_t)n, "application/json", NULL, &a->env, err, sizeof err),
            ENVELOPE_OK, "%s", err);
        a->job.env = &a->env;
        a->job.body = a->body;
        a->job.body_len = (size_t)n;
    }
    cr_assert_eq(store_submit(pool, &a->job), 0);
}

/* Runs the loop until a's job is handed back. */
static void wait_done(applied_job *a)
{
    uint64_t deadline = uv_hrtime() + (uint64_t)DEADLINE_MS * 1000000u;
    while (!a->done && uv_hrtime() < deadline)
        uv_run(&loop, UV_RUN_ONCE);
    cr_assert(a->done, "the job was not handed back within %d ms", DEADLINE_MS);
}

static void start_pool(const char *name)
{
    harness_options o = {.workers = 2};
    harness_init(&H, name, &o);
    h_ready = true;
    harness_insert_orders(&H, "o", 3, "PAYING");
    cr_assert_eq(config_load(H.config_path, stderr, &cfg), 0, "%s does not load", H.config_path);
    cr_assert_eq(uv_loop_init(&loop), 0);
    loop_ready = true;
    char err[256];
    cr_assert_eq(store_pool_new(&loop, cfg, &pool, err, sizeof err), 0, "%s", err);
}

Test(store_pool, a_job_failed_fast_carries_the_schema_error_that_marked_the_database_down)
{
    start_pool("pool_fail_fast");
    harness_sql(&H, "RENAME TABLE orders TO orders_away");

    applied_job first, failed_fast;
    submit(&first, STORE_JOB_APPLY, "o0");
    wait_done(&first);
    cr_assert_eq(first.job.status, APPLY_UNAVAILABLE, "status %d: %s", first.job.status,
                 first.job.error);
    cr_assert(db_error_is_schema(first.job.mysql_errno), "errno %u: %s", first.job.mysql_errno,
              first.job.error);

    /* Both workers are now without a connection: whichever takes this job fails it fast. */
    submit(&failed_fast, STORE_JOB_APPLY, "o1");
    wait_done(&failed_fast);
    cr_assert_eq(failed_fast.job.status, APPLY_UNAVAILABLE);
    cr_assert_eq(failed_fast.job.mysql_errno, first.job.mysql_errno,
                 "failed fast with errno %u (\"%s\"), the database was marked down by %u",
                 failed_fast.job.mysql_errno, failed_fast.job.error, first.job.mysql_errno);
    cr_assert(strstr(failed_fast.job.error, "waiting for the probe") &&
                  strstr(failed_fast.job.error, "orders"),
              "error: %s", failed_fast.job.error);

    harness_sql(&H, "RENAME TABLE orders_away TO orders");
    applied_job probe, applied;
    submit(&probe, STORE_JOB_PROBE, NULL);
    wait_done(&probe);
    cr_assert_eq(probe.job.status, APPLY_COMMITTED, "probe: %s", probe.job.error);
    submit(&applied, STORE_JOB_APPLY, "o2");
    wait_done(&applied);
    cr_assert_eq(applied.job.status, APPLY_COMMITTED, "status %d: %s", applied.job.status,
                 applied.job.error);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'o2' AND "
                                    "status = 'PAID'"),
                 1);
    envelope_close(&first.env);
    envelope_close(&failed_fast.env);
    envelope_close(&applied.env);
}
