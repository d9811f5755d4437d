/*
 * test_outage — a database outage pauses consumption instead of burning the retry budget (no
 * message enters the retry ladder or the DLQ because the database is away): MariaDB stopped for
 * 20 s under load, and a server that answers but is read-only (after a failover), on which the
 * outage probe must not resume.
 *
 * A separate executable because it stops the shared MariaDB server (scripts/services
 * stop-mariadb / start-mariadb) and sets its global read_only: every other suite running at the
 * same time sees the outage.
 * MariaDB is started again by the test's teardown even when an assertion fails, and by a guard
 * process (harness_db_guard_arm: it waits on a pipe and starts MariaDB when the test process goes
 * away, whatever the reason: crash, Criterion timeout, kill); read_only is turned off again by
 * the teardown.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TOTAL 2000
#define BEFORE_OUTAGE 1500      /* published before the stop; the rest while MariaDB is down */
#define APPLIED_BEFORE_STOP 300
#define DOWNTIME_MS 20000

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static harness_db_guard db_guard = HARNESS_DB_GUARD_INIT;
static bool read_only_set; /* SET GLOBAL read_only = 1 is in force: teardown undoes it */
static char db_user[64];   /* a MariaDB account made by the test: teardown drops it */

static long long wait_timeout_before; /* the global wait_timeout a test shortened, or 0 */

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    harness_db_guard_recover(&H, &db_guard);
    /* On MySQL, read_only = 0 also turns super_read_only off. */
    if (h_ready && read_only_set)
        harness_sql(&H, "SET GLOBAL read_only = 0");
    read_only_set = false;
    if (h_ready && wait_timeout_before)
        harness_sql(&H, "SET GLOBAL wait_timeout = %lld", wait_timeout_before);
    wait_timeout_before = 0;
    if (h_ready && db_user[0])
        harness_sql(&H, "DROP USER '%s'@'%%'", db_user);
    db_user[0] = '\0';
    if (h_ready) {
        harness_fini(&H);
        h_ready = false;
    }
}

static void publish_range(int from, int to)
{
    size_t n = (size_t)(to - from);
    char **bodies = calloc(n, sizeof *bodies);
    size_t *lens = calloc(n, sizeof *lens);
    cr_assert(bodies && lens);
    for (int i = from; i < to; i++) {
        char *body = malloc(256);
        cr_assert(body);
        int len = snprintf(body, 256,
                           "{\"message_id\":\"m-o%d\",\"biz_key\":\"order_id:o%d:PAY_SUCCESS\","
                           "\"order_id\":\"o%d\",\"event_type\":\"PAY_SUCCESS\",\"amount\":%d}",
                           i, i, i, i);
        bodies[i - from] = body;
        lens[i - from] = (size_t)len;
    }
    harness_publish_batch(&H, NULL, "application/json", (const void *const *)bodies, lens, n);
    for (size_t i = 0; i < n; i++)
        free(bodies[i]);
    free(bodies);
    free(lens);
}

Test(outage, mariadb_down_20s_under_load_burns_no_retries, .fini = teardown, .timeout = 150)
{
    /* A short ladder: a message wrongly sent down it during 20 s of outage reaches the DLQ. */
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "100ms", .jitter = "50ms",
                         .workers = 4, .prefetch = 64};
    harness_init(&H, "outage", &o);
    h_ready = true;
    harness_insert_orders(&H, "o", TOTAL, "PAYING");
    /* Keeps transactions in flight when the server goes down (each UPDATE takes >= 5 ms), so
     * the outage hits running transactions, not just an idle pool. */
    harness_sql(&H, "CREATE TRIGGER orders_slow BEFORE UPDATE ON orders FOR EACH ROW "
                    "SET @idemq_test_slow = SLEEP(0.005)");
    harness_declare_topology(&H);
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);

    int64_t t0 = harness_now_ms();
    publish_range(0, BEFORE_OUTAGE);
    long long applied = harness_wait_scalar_at_least(&H, APPLIED_BEFORE_STOP, 30000,
                                                     "SELECT COUNT(*) FROM msg_dedup");
    cr_assert(applied >= APPLIED_BEFORE_STOP, "only %lld applied", applied);

    harness_db_guard_arm(&H, &db_guard);
    int64_t stop_started = harness_now_ms();
    db_guard.db_stopped = true;
    long long applied_at_stop = harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup");
    cr_assert_eq(harness_services(&H, "stop-mariadb"), 0,
                 "stop-mariadb failed (see %s/services.log)", H.dir);
    int64_t stopped = harness_now_ms();
    mysql_close(H.db);
    H.db = NULL;

    /* Load keeps coming while the database is down. */
    publish_range(BEFORE_OUTAGE, TOTAL);
    cr_assert(harness_wait_log(&H, "pausing consumption", 1, 15000), "idemq did not pause");
    long dlq_during = harness_queue_depth_of(&H, ".dlq");
    long ladder_during = harness_queue_depth_of(&H, ".retry.1") +
                         harness_queue_depth_of(&H, ".retry.2") +
                         harness_queue_depth_of(&H, ".retry.3");
    long queued_during = harness_queue_depth_of(&H, "");

    /* The scenario: 20 s of downtime (this is not synchronisation). */
    int64_t remaining = DOWNTIME_MS - (harness_now_ms() - stop_started);
    if (remaining > 0) {
        struct timespec pause = {.tv_sec = remaining / 1000,
                                 .tv_nsec = (remaining % 1000) * 1000000};
        while (nanosleep(&pause, &pause) < 0 && errno == EINTR)
            ;
    }
    long probes = harness_log_count(&H, "database still unavailable");
    int64_t start_started = harness_now_ms();
    cr_assert_eq(harness_services(&H, "start-mariadb"), 0,
                 "start-mariadb failed (see %s/services.log)", H.dir);
    db_guard.db_stopped = false;
    int64_t restarted = harness_now_ms();
    harness_db_reconnect(&H, 30000);
    harness_db_guard_disarm(&db_guard);

    cr_assert(harness_wait_scalar(&H, TOTAL, 40000, "SELECT COUNT(*) FROM msg_dedup"),
              "not every message was applied after the outage");
    int64_t done = harness_now_ms();
    cr_assert(harness_wait_log(&H, "resuming consumption", 1, 5000),
              "idemq did not log that it resumed");
    harness_stop_idemq(&daemon_pid);

    fprintf(stderr,
            "[measure] outage: %lld applied when the stop began (at +%lld ms); stop took %lld "
            "ms; down %lld ms (until start-mariadb began), start took %lld ms; during the "
            "outage: Q %ld, ladder %ld, DLQ %ld; %ld failed probe(s); all %d applied %lld ms "
            "after the restart\n",
            applied_at_stop, (long long)(stop_started - t0), (long long)(stopped - stop_started),
            (long long)(start_started - stop_started), (long long)(restarted - start_started),
            queued_during, ladder_during, dlq_during, probes, TOTAL,
            (long long)(done - restarted));

    /* Nothing burned its retry budget, nothing was dead-lettered. */
    cr_assert_eq(dlq_during, 0, "messages reached the DLQ during the outage");
    cr_assert_eq(ladder_during, 0, "messages entered the retry ladder during the outage");
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 0);
    cr_assert_eq(harness_queue_depth_of(&H, ".retry.1") + harness_queue_depth_of(&H, ".retry.2") +
                     harness_queue_depth_of(&H, ".retry.3"),
                 0);
    cr_assert_eq(harness_queue_depth_of(&H, ""), 0);
    cr_assert_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 0,
                 "the outage pushed messages down the retry ladder");
    cr_assert_eq(harness_log_count(&H, "\"outcome\":\"dead_lettered\""), 0);

    /* Every message applied exactly once. */
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), TOTAL);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(DISTINCT biz_key) FROM msg_dedup"), TOTAL);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), TOTAL);
    cr_assert_eq(harness_scalar(&H, "SELECT SUM(amount) FROM orders"),
                 (long long)TOTAL * (TOTAL - 1) / 2);
    /* A commit whose answer was lost with the server is settled by its dedup row on redelivery
     * ("deduped"): a message is logged processed at most once, and processed or deduped. */
    long processed = harness_log_count(&H, "\"outcome\":\"processed\"");
    long deduped = harness_log_count(&H, "\"outcome\":\"deduped\"");
    fprintf(stderr, "[measure] outage: processed %ld, deduped %ld, requeued %ld\n", processed,
            deduped, harness_log_count(&H, "\"outcome\":\"requeued\""));
    cr_assert(processed <= TOTAL && processed + deduped >= TOTAL, "processed %ld, deduped %ld",
              processed, deduped);

    /* It paused and resumed. */
    cr_assert(harness_log_count(&H, "database unavailable, pausing consumption") >= 1);
    cr_assert(harness_log_count(&H, "database reachable again, resuming consumption") >= 1);
    cr_assert(applied_at_stop < BEFORE_OUTAGE, "the outage should hit while work is queued");
}

/* ------------------------------------------------------------------------------ read-only */

/* With the server's global `variable` (read_only or super_read_only) on, `events` events for
 * orders PREFIX0.. pause consumption, and `probes` probes in a row fail without resuming it;
 * once writes are allowed again every event is applied once, none retried or dead-lettered.
 * Setting read_only off turns super_read_only off too (MySQL). */
static void expect_paused_while_read_only(const char *prefix, int events, const char *variable,
                                          long probes)
{
    harness_insert_orders(&H, prefix, events, "PAYING");
    harness_declare_topology(&H);
    read_only_set = true;
    harness_sql(&H, "SET GLOBAL %s = 1", variable);
    for (int i = 0; i < events; i++) {
        char id[16];
        snprintf(id, sizeof id, "%s%d", prefix, i);
        harness_publish_event(&H, id, "PAY_SUCCESS", i);
    }
    daemon_pid = harness_spawn(&H);
    bool was_paused = harness_wait_log(&H, "pausing consumption", 1, 30000);
    /* Stay read-only for several probes (they back off: 0.5 s, 1 s, 2 s): each must fail. */
    bool probed =
        was_paused && harness_wait_log(&H, "database still unavailable (probe", probes, 30000);
    long pauses = harness_log_count(&H, "pausing consumption");
    harness_sql(&H, "SET GLOBAL read_only = 0");
    read_only_set = false;
    cr_assert(was_paused, "%s did not pause consumption (log: %s)", variable, H.log_path);
    cr_expect(probed, "fewer than %ld failed probes under %s (log: %s)", probes, variable,
              H.log_path);
    cr_expect_eq(pauses, 1,
                 "consumption paused %ld times over %ld probes: the probe resumed on a "
                 "read-only server",
                 pauses, probes);
    cr_assert(harness_wait_scalar(&H, events, 60000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), events);
    cr_assert_eq(harness_stop(daemon_pid, SIGTERM, 25000), 0);
    daemon_pid = 0;
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"dead_lettered\""), 0);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 0);
}

/* A server that answers but refuses writes (read_only after a failover) is an outage too: the
 * probe must not resume consumption on it, or consumption flaps between paused and failing. */
Test(outage, a_read_only_database_keeps_consumption_paused_until_it_accepts_writes,
     .fini = teardown, .timeout = 120)
{
    harness_init(&H, "readonly", NULL);
    h_ready = true;
    /* read_only binds only accounts without SUPER / READ ONLY ADMIN: use a plain one. */
    snprintf(db_user, sizeof db_user, "app_%d", (int)getpid());
    const char *user = db_user;
    harness_sql(&H, "CREATE USER '%s'@'%%' IDENTIFIED BY 'pw'", user);
    harness_sql(&H, "GRANT SELECT, INSERT, UPDATE, DELETE ON `%s`.* TO '%s'@'%%'", H.database,
                user);
    harness_config_set_mysql_login(&H, user, "pw");
    expect_paused_while_read_only("r", 50, "read_only", 3);
}

/* MySQL's super_read_only binds every account, SUPER too (read_only lets an account with SUPER
 * or CONNECTION_ADMIN write, and idemq's often has them): its writes fail with 1290, which is an
 * outage like read_only's, not a message's failure. MariaDB has no super_read_only. */
Test(outage, super_read_only_pauses_an_account_that_read_only_would_let_write, .fini = teardown,
     .timeout = 120)
{
    harness_init(&H, "superro", NULL);
    h_ready = true;
    if (!harness_db_is_mysql(&H))
        cr_skip_test("super_read_only is MySQL's (MariaDB 10.11 has none)");
    expect_paused_while_read_only("s", 30, "super_read_only", 2);
}

static long long connections_of(const char *user)
{
    return harness_scalar(&H, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '%s'",
                          user);
}

typedef struct {
    const char *user;
    long long below;
} fewer_connections;

static bool has_fewer_connections(harness *h, void *arg)
{
    (void)h;
    fewer_connections *f = arg;
    return connections_of(f->user) < f->below;
}

/* The server closes connections idle past wait_timeout (MySQL 8.0.24+ says so first, with 4031
 * "disconnected by the server because of inactivity"; MariaDB just closes). A worker finds out
 * at its next statement: the message it carried is held and applied on a new connection, with no
 * retry charged and nothing dead-lettered. */
Test(outage, connections_the_server_closed_for_inactivity_cost_no_retry, .fini = teardown,
     .timeout = 120)
{
    harness_options o = {.workers = 2};
    harness_init(&H, "idle", &o);
    h_ready = true;
    snprintf(db_user, sizeof db_user, "idle_%d", (int)getpid());
    harness_sql(&H, "CREATE USER '%s'@'%%' IDENTIFIED BY 'pw'", db_user);
    harness_sql(&H, "GRANT SELECT, INSERT, UPDATE, DELETE ON `%s`.* TO '%s'@'%%'", H.database,
                db_user);
    harness_config_set_mysql_login(&H, db_user, "pw");
    harness_insert_orders(&H, "i", 40, "PAYING");
    harness_declare_topology(&H);
    /* Sessions opened from now on (idemq's) time out after 2 s idle; the harness's own keeps
     * the value it started with. The health monitor's probe every second keeps its own alive. */
    wait_timeout_before = harness_scalar(&H, "SELECT @@global.wait_timeout");
    harness_sql(&H, "SET GLOBAL wait_timeout = 2");
    harness_start_idemq(&H, "consuming with handler", 15000, &daemon_pid);
    for (int i = 0; i < 20; i++) {
        char id[16];
        snprintf(id, sizeof id, "i%d", i);
        harness_publish_event(&H, id, "PAY_SUCCESS", i);
    }
    cr_assert(harness_wait_scalar(&H, 20, 30000, "SELECT COUNT(*) FROM msg_dedup"));
    fewer_connections f = {.user = db_user, .below = connections_of(db_user)};
    cr_assert_geq(f.below, 2, "idemq holds %lld connections", f.below);
    cr_assert(harness_wait_for(has_fewer_connections, &H, &f, 30000),
              "the server closed none of idemq's %lld idle connections", f.below);
    for (int i = 20; i < 40; i++) {
        char id[16];
        snprintf(id, sizeof id, "i%d", i);
        harness_publish_event(&H, id, "PAY_SUCCESS", i);
    }
    cr_assert(harness_wait_scalar(&H, 40, 30000, "SELECT COUNT(*) FROM msg_dedup"),
              "the messages after the idle spell were not all applied (log: %s)", H.log_path);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 40);
    cr_assert_eq(harness_stop(daemon_pid, SIGTERM, 25000), 0);
    daemon_pid = 0;
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 0);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"dead_lettered\""), 0);
    cr_log_info("idle disconnects: %ld pause(s) of consumption",
                harness_log_count(&H, "pausing consumption"));
}
