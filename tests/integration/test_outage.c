/*
 * test_outage — MariaDB stopped for 20 s under load (issue 3, "Must show"; DESIGN.md invariant
 * 6: an infrastructure outage does not burn the retry budget).
 *
 * A separate executable because it stops the shared MariaDB server (scripts/services
 * stop-mariadb / start-mariadb): every other suite running at the same time sees the outage.
 * MariaDB is started again by the test's teardown even when an assertion fails, and by a guard
 * process (it waits on a pipe and starts MariaDB when the test process goes away, whatever the
 * reason: crash, Criterion timeout, kill).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
static bool db_stopped;
static int guard_fd = -1;
static pid_t guard_pid;

static const char *services_script(void)
{
    const char *s = getenv("IDEMQ_SERVICES");
    cr_assert(s && *s, "IDEMQ_SERVICES is not set: source .state/env");
    return s;
}

/* Runs `$IDEMQ_SERVICES cmd`, output appended to DIR/services.log; returns its exit status. */
static int services(const char *cmd)
{
    char path[400];
    snprintf(path, sizeof path, "%s/services.log", H.dir);
    const char *script = services_script();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(script, script, cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A child that starts MariaDB once the write end of its pipe closes: when we close it after
 * the restart (a no-op then), or when this process dies for any reason. */
static void start_guard(void)
{
    int p[2];
    cr_assert(pipe(p) == 0);
    const char *script = services_script();
    char path[400];
    snprintf(path, sizeof path, "%s/guard.log", H.dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* not hit by signals sent to the test's process group */
        close(p[1]);
        int log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != p[0] && fd != log_fd)
                close(fd); /* do not keep the test's broker or database sockets open */
        char c;
        for (;;) {
            ssize_t n = read(p[0], &c, 1);
            if (n == 0 || (n < 0 && errno != EINTR))
                break;
        }
        if (log_fd >= 0) {
            dup2(log_fd, STDOUT_FILENO);
            dup2(log_fd, STDERR_FILENO);
        }
        execl(script, script, "start-mariadb", (char *)NULL);
        _exit(127);
    }
    close(p[0]);
    fcntl(p[1], F_SETFD, FD_CLOEXEC); /* idemq and CLI children must not hold it */
    guard_fd = p[1];
    guard_pid = pid;
}

static void stop_guard(void)
{
    if (guard_fd < 0)
        return;
    close(guard_fd);
    guard_fd = -1;
    int status;
    while (waitpid(guard_pid, &status, 0) < 0 && errno == EINTR)
        ;
}

static void teardown(void)
{
    if (daemon_pid > 0) {
        harness_stop(daemon_pid, SIGKILL, 5000);
        daemon_pid = 0;
    }
    if (db_stopped) {
        services("start-mariadb");
        db_stopped = false;
        if (h_ready)
            harness_db_reconnect(&H, 60000);
    }
    stop_guard();
    if (h_ready) {
        harness_fini(&H);
        h_ready = false;
    }
}

typedef struct at_least {
    const char *sql;
    long long min;
    long long last;
} at_least;

static bool scalar_at_least(harness *h, void *arg)
{
    at_least *w = arg;
    w->last = harness_scalar(h, "%s", w->sql);
    return w->last >= w->min;
}

typedef struct log_wait {
    const char *needle;
    long at_least;
} log_wait;

static bool log_reached(harness *h, void *arg)
{
    log_wait *w = arg;
    return harness_log_count(h, w->needle) >= w->at_least;
}

static bool wait_log(const char *needle, long count, int timeout_ms)
{
    log_wait w = {.needle = needle, .at_least = count};
    return harness_wait_for(log_reached, &H, &w, timeout_ms);
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
    daemon_pid = harness_spawn(&H);
    cr_assert(wait_log("started consuming", 1, 15000), "idemq did not start consuming");

    int64_t t0 = harness_now_ms();
    publish_range(0, BEFORE_OUTAGE);
    at_least w = {.sql = "SELECT COUNT(*) FROM msg_dedup", .min = APPLIED_BEFORE_STOP};
    cr_assert(harness_wait_for(scalar_at_least, &H, &w, 30000), "only %lld applied", w.last);

    start_guard();
    int64_t stop_started = harness_now_ms();
    db_stopped = true;
    long long applied_at_stop = harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup");
    cr_assert_eq(services("stop-mariadb"), 0, "stop-mariadb failed (see %s/services.log)", H.dir);
    int64_t stopped = harness_now_ms();
    mysql_close(H.db);
    H.db = NULL;

    /* Load keeps coming while the database is down. */
    publish_range(BEFORE_OUTAGE, TOTAL);
    cr_assert(wait_log("pausing consumption", 1, 15000), "idemq did not pause");
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
    cr_assert_eq(services("start-mariadb"), 0, "start-mariadb failed (see %s/services.log)",
                 H.dir);
    db_stopped = false;
    int64_t restarted = harness_now_ms();
    harness_db_reconnect(&H, 30000);
    stop_guard();

    cr_assert(harness_wait_scalar(&H, TOTAL, 40000, "SELECT COUNT(*) FROM msg_dedup"),
              "not every message was applied after the outage");
    int64_t done = harness_now_ms();
    cr_assert(wait_log("resuming consumption", 1, 5000), "idemq did not log that it resumed");
    int rc = harness_stop(daemon_pid, SIGTERM, 30000);
    daemon_pid = 0;
    cr_expect_eq(rc, 0, "idemq run should exit 0 on SIGTERM, got %d", rc);

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
