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

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    harness_db_guard_recover(&H, &db_guard);
    if (h_ready && read_only_set)
        harness_sql(&H, "SET GLOBAL read_only = 0");
    read_only_set = false;
    if (h_ready && db_user[0])
        harness_sql(&H, "DROP USER '%s'@'%%'", db_user);
    db_user[0] = '\0';
    if (h_ready) {
        harness_fini(&H);
        h_ready = false;
    }
}

static long depth_of(const char *suffix)
{
    char name[200];
    long messages = -1;
    snprintf(name, sizeof name, "%s%s", H.queue, suffix);
    if (!harness_queue_info(&H, name, &messages, NULL))
        return -1;
    return messages;
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
    /* harness_insert_orders formats into an 8 KiB statement buffer: too small for 500-row
     * batches. MariaDB's sequence engine makes the rows instead. */
    harness_sql(&H, "INSERT INTO orders (order_id, status) SELECT CONCAT('o', seq), 'PAYING' "
                    "FROM seq_0_to_%d", TOTAL - 1);
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
    long dlq_during = depth_of(".dlq");
    long ladder_during = depth_of(".retry.1") + depth_of(".retry.2") + depth_of(".retry.3");
    long queued_during = depth_of("");

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
    cr_assert_eq(depth_of(".dlq"), 0);
    cr_assert_eq(depth_of(".retry.1") + depth_of(".retry.2") + depth_of(".retry.3"), 0);
    cr_assert_eq(depth_of(""), 0);
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

/* Rewrites the mysql URL's credentials in the generated config. */
static void use_mysql_login(harness *h, const char *user, const char *password)
{
    FILE *f = fopen(h->config_path, "r");
    cr_assert(f);
    static char text[16384], out[16400];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *url = strstr(text, "mysql://");
    cr_assert(url);
    char *at = strchr(url, '@');
    cr_assert(at);
    snprintf(out, sizeof out, "%.*smysql://%s:%s%s", (int)(url - text), text, user, password, at);
    f = fopen(h->config_path, "w");
    cr_assert(f);
    fputs(out, f);
    fclose(f);
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
    use_mysql_login(&H, user, "pw");
    harness_insert_orders(&H, "r", 50, "PAYING");
    harness_declare_topology(&H);

    read_only_set = true;
    harness_sql(&H, "SET GLOBAL read_only = 1");
    for (int i = 0; i < 50; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        harness_publish_event(&H, id, "PAY_SUCCESS", i);
    }
    daemon_pid = harness_spawn(&H);
    bool was_paused = harness_wait_log(&H, "pausing consumption", 1, 30000);
    /* Stay read-only for several probes (they back off: 0.5 s, 1 s, 2 s): each must fail. */
    bool probed = was_paused && harness_wait_log(&H, "database still unavailable (probe", 3, 30000);
    long pauses = harness_log_count(&H, "pausing consumption");
    harness_sql(&H, "SET GLOBAL read_only = 0");
    read_only_set = false;
    cr_assert(was_paused, "a read-only database did not pause consumption (log: %s)", H.log_path);
    cr_expect(probed, "fewer than 3 failed probes on a read-only server (log: %s)", H.log_path);
    cr_expect_eq(pauses, 1,
                 "consumption paused %ld times over 3 probes: the probe resumed on a "
                 "read-only server",
                 pauses);
    cr_assert(harness_wait_scalar(&H, 50, 60000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert_eq(harness_stop(daemon_pid, SIGTERM, 25000), 0);
    daemon_pid = 0;
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"dead_lettered\""), 0);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 0);
}
