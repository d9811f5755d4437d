/*
 * test_db_health — the database health monitor (adapter/store/health) against the real MariaDB,
 * reached through a freeze_proxy (tests/support/freeze_proxy) so a test can freeze, reset or
 * take away "the database" without touching the shared server: frozen → not ok within 5 s with a
 * reason that names the timeout, thawed → ok again within 5 s; down at start → not ok with the
 * connect error, then ok once it is reachable; ok throughout while other sessions hold row and
 * table locks and run long statements (the probe touches no table); a connection reset between
 * probes is no outage; db_health_free returns promptly even while frozen; and the staleness
 * bound turns the state not ok even when the client library would wait far longer.
 *
 * Measurements (freeze → not ok, thaw → ok, free) are logged with cr_log_info: run with
 * --verbose to see them. A read-only server is not tested here: that needs SET GLOBAL read_only
 * on the shared server (test_outage does that, one test at a time).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "db/dsn.h"
#include "freeze_proxy.h"
#include "harness.h"
#include "store/health.h"

#define START_MS 5000     /* ok after the start, through the proxy */
#define READINESS_MS 5000 /* the bound: readiness tells the truth within 5 s */
#define FREE_MS 3000

static harness_fixture F;
static freeze_proxy *proxy;
static db_health *health;

static void teardown(void)
{
    db_health_free(health);
    health = NULL;
    freeze_proxy_free(proxy);
    proxy = NULL;
    harness_fixture_fini(&F);
}

TestSuite(db_health, .fini = teardown, .timeout = 120);

/* The test server's dsn (IDEMQ_TEST_MYSQL_URL). */
static db_dsn server_dsn(void)
{
    const char *url = getenv("IDEMQ_TEST_MYSQL_URL");
    char err[256];
    db_dsn dsn;
    cr_assert(url && *url, "IDEMQ_TEST_MYSQL_URL is not set (source .state/env)");
    cr_assert(db_dsn_parse(url, &dsn, err, sizeof err) == 0, "%s", err);
    cr_assert(!dsn.socket[0], "IDEMQ_TEST_MYSQL_URL must be TCP for the proxy");
    return dsn;
}

/* Starts the proxy in front of the test server and returns the dsn that goes through it. */
static db_dsn proxied_dsn(void)
{
    char err[256];
    db_dsn dsn = server_dsn();
    cr_assert(freeze_proxy_start(dsn.host, dsn.port, &proxy, err, sizeof err) == 0, "%s", err);
    snprintf(dsn.host, sizeof dsn.host, "127.0.0.1");
    dsn.port = freeze_proxy_port(proxy);
    return dsn;
}

static void start_health(const db_dsn *dsn, const db_health_options *opts)
{
    char err[256];
    cr_assert(db_health_start(dsn, opts, &health, err, sizeof err) == 0, "%s", err);
}

/* Polls the state every 20 ms until its ok is `ok`, for up to timeout_ms. Returns the ms it took,
 * or -1 on timeout; *last gets the last state read. */
typedef struct state_wait {
    bool ok;         /* the state waited for */
    uint64_t probes; /* or: completed probes waited for */
    db_health_status *last;
} state_wait;

static bool state_is(harness *h, void *arg)
{
    (void)h;
    state_wait *w = arg;
    db_health_read(health, w->last);
    return w->last->ok == w->ok;
}

static int64_t wait_state(bool ok, int timeout_ms, db_health_status *last)
{
    int64_t start = harness_now_ms();
    state_wait w = {.ok = ok, .last = last};
    if (!harness_wait_for(state_is, NULL, &w, timeout_ms))
        return -1;
    return harness_now_ms() - start;
}

static void wait_ok(int timeout_ms, const char *when)
{
    db_health_status s;
    int64_t took = wait_state(true, timeout_ms, &s);
    cr_assert(took >= 0, "health not ok %s within %d ms: %s", when, timeout_ms, s.reason);
    cr_assert_str_eq(s.reason, "");
    cr_log_info("health ok %s after %lld ms", when, (long long)took);
}

static bool probes_done(harness *h, void *arg)
{
    (void)h;
    state_wait *w = arg;
    db_health_read(health, w->last);
    return w->last->probes >= w->probes;
}

/* Waits until at least `more` probes complete after the current one. */
static void wait_probes(uint64_t more, int timeout_ms)
{
    db_health_status s;
    db_health_read(health, &s);
    state_wait w = {.probes = s.probes + more, .last = &s};
    cr_assert(harness_wait_for(probes_done, NULL, &w, timeout_ms),
              "only %llu of %llu probes completed", (unsigned long long)s.probes,
              (unsigned long long)w.probes);
}

typedef struct unread_wait {
    unsigned port;  /* the proxy's */
    bool listening; /* its accept queue; else its accepted connections' unread bytes */
} unread_wait;

static bool unread_pending(harness *h, void *arg)
{
    (void)h;
    const unread_wait *w = arg;
    return harness_tcp_unread(w->port, w->listening) > 0;
}

/* Waits until the frozen proxy holds, unread, a probe's query (listening false: bytes sent on an
 * accepted connection) or its connect (listening true: a connection in the accept queue): the
 * probe is then blocked in that step. Fails the test after timeout_ms. */
static void wait_probe_blocked(bool listening, int timeout_ms)
{
    unread_wait w = {.port = freeze_proxy_port(proxy), .listening = listening};
    cr_assert(harness_wait_for(unread_pending, NULL, &w, timeout_ms),
              "no probe %s reached the frozen proxy within %d ms",
              listening ? "connect" : "query", timeout_ms);
}

static int64_t timed_free(void)
{
    int64_t start = harness_now_ms();
    db_health_free(health);
    health = NULL;
    return harness_now_ms() - start;
}

Test(db_health, ok_soon_after_the_start_and_not_before_the_first_probe)
{
    db_dsn dsn = proxied_dsn();
    /* Frozen from the start: the state must not claim anything before a probe has passed. */
    freeze_proxy_freeze(proxy);
    start_health(&dsn, NULL);
    db_health_status s;
    db_health_read(health, &s);
    cr_assert(!s.ok);
    cr_assert_eq(s.probes, 0);
    cr_assert_eq(s.age_ms, -1);
    cr_assert(strstr(s.reason, "has not completed yet"), "reason: %s", s.reason);
    freeze_proxy_thaw(proxy);
    wait_ok(START_MS, "after the start");
    db_health_read(health, &s);
    cr_assert(s.probes >= 1);
    cr_assert(s.age_ms >= 0 && s.duration_ms >= 0);
    char reason[64] = "untouched";
    cr_assert(db_health_ok(health, reason, sizeof reason));
    cr_assert_str_eq(reason, "untouched", "db_health_ok must leave reason alone when ok");
    cr_assert(freeze_proxy_connections(proxy) == 1, "the probe should keep one connection");
}

Test(db_health, a_frozen_database_fails_within_5_s_and_a_thawed_one_recovers)
{
    db_dsn dsn = proxied_dsn();
    start_health(&dsn, NULL);
    wait_ok(START_MS, "after the start");

    for (int round = 1; round <= 2; round++) {
        db_health_status s;
        freeze_proxy_freeze(proxy);
        int64_t failed = wait_state(false, READINESS_MS, &s);
        cr_assert(failed >= 0, "round %d: still ok %d ms after the freeze", round, READINESS_MS);
        cr_assert(strstr(s.reason, "did not answer within 2 s"), "reason: %s", s.reason);
        cr_assert(s.timed_out, "the probe's own timeout should have fired, not staleness: %s",
                  s.reason);
        cr_assert(!s.stale);
        cr_log_info("round %d: not ok %lld ms after the freeze: %s", round, (long long)failed,
                    s.reason);
        /* The probes after that one reconnect, and their handshake times out the same way. */
        wait_probes(1, READINESS_MS);
        db_health_read(health, &s);
        cr_assert(!s.ok);
        cr_assert(strstr(s.reason, "did not answer within 2 s (health probe): cannot connect"),
                  "reason: %s", s.reason);
        cr_log_info("round %d: then: %s", round, s.reason);
        char reason[1024];
        cr_assert(!db_health_ok(health, reason, sizeof reason));
        cr_assert(strstr(reason, "did not answer within 2 s"), "reason: %s", reason);

        freeze_proxy_thaw(proxy);
        int64_t back = wait_state(true, READINESS_MS, &s);
        cr_assert(back >= 0, "round %d: not ok %d ms after the thaw: %s", round, READINESS_MS,
                  s.reason);
        cr_log_info("round %d: ok %lld ms after the thaw", round, (long long)back);
    }
}

Test(db_health, a_database_down_at_start_reports_the_connect_error_then_recovers)
{
    db_dsn dsn = proxied_dsn();
    unsigned real_port;
    {
        db_dsn server = server_dsn();
        real_port = server.port;
    }
    /* A closed port: bound, then closed. */
    struct sockaddr_in addr = {.sin_family = AF_INET};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
              getsockname(fd, (struct sockaddr *)&addr, &len) == 0);
    close(fd);
    freeze_proxy_set_target(proxy, "127.0.0.1", ntohs(addr.sin_port));

    start_health(&dsn, NULL);
    wait_probes(1, READINESS_MS);
    db_health_status s;
    db_health_read(health, &s);
    cr_assert(!s.ok);
    cr_assert(strstr(s.reason, "cannot connect to MySQL at 127.0.0.1:"), "reason: %s", s.reason);
    cr_assert(!s.timed_out, "a refused connection is no timeout: %s", s.reason);
    cr_assert(s.mysql_errno != 0);
    cr_log_info("down at start: %s", s.reason);

    /* Nothing listening at all: the connect itself is refused. */
    char err[256];
    cr_assert(freeze_proxy_refuse(proxy, true, err, sizeof err) == 0);
    wait_probes(1, READINESS_MS);
    wait_probes(1, READINESS_MS);
    db_health_read(health, &s);
    cr_assert(!s.ok);
    cr_assert(strstr(s.reason, "cannot connect to MySQL at 127.0.0.1:"), "reason: %s", s.reason);
    cr_log_info("refused: %s", s.reason);
    cr_assert(freeze_proxy_refuse(proxy, false, err, sizeof err) == 0, "%s", err);

    freeze_proxy_set_target(proxy, "127.0.0.1", real_port);
    wait_ok(READINESS_MS, "once the database is reachable");
    db_health_read(health, &s);
    cr_assert(s.failures >= 2);
}

Test(db_health, stays_ok_while_other_sessions_hold_locks_and_run_long_statements)
{
    harness_options o = {0};
    harness_fixture_init(&F, "db_health_locks", &o);
    harness_insert_orders(&F.h, "HL", 10, "CREATED");
    db_dsn dsn = proxied_dsn();
    start_health(&dsn, NULL);
    wait_ok(START_MS, "after the start");

    /* One session holds every row lock of orders in an open transaction, another holds the
     * table's write lock queued behind it... */
    MYSQL *rows = harness_db_open(&F.h);
    cr_assert(mysql_query(rows, "BEGIN") == 0);
    cr_assert(mysql_query(rows, "SELECT * FROM orders FOR UPDATE") == 0, "%s", mysql_error(rows));
    mysql_free_result(mysql_store_result(rows));
    MYSQL *table = harness_db_open(&F.h);
    static const char lock_sql[] = "LOCK TABLES orders WRITE";
    cr_assert(mysql_send_query(table, lock_sql, sizeof lock_sql - 1) == 0);
    /* ...and two more are busy, as stuck workers would be (each sleeps 6 s; sent, not awaited). */
    MYSQL *busy[2];
    for (int i = 0; i < 2; i++) {
        busy[i] = harness_db_open(&F.h);
        cr_assert(mysql_send_query(busy[i], "SELECT SLEEP(6)", 15) == 0);
    }

    db_health_status before, s;
    db_health_read(health, &before);
    int64_t start = harness_now_ms();
    while (harness_now_ms() - start < 4000) {
        db_health_read(health, &s);
        cr_assert(s.ok, "health failed while others held locks: %s", s.reason);
        poll(NULL, 0, 50);
    }
    cr_assert(s.probes >= before.probes + 3, "only %llu probes in 4 s",
              (unsigned long long)(s.probes - before.probes));
    cr_assert_eq(s.failures, before.failures);

    for (int i = 0; i < 2; i++)
        mysql_close(busy[i]);
    mysql_close(table);
    mysql_query(rows, "ROLLBACK");
    mysql_close(rows);
}

Test(db_health, a_connection_reset_between_probes_is_no_outage)
{
    db_dsn dsn = proxied_dsn();
    start_health(&dsn, NULL);
    wait_ok(START_MS, "after the start");
    db_health_status before, s;
    db_health_read(health, &before);
    for (int i = 0; i < 3; i++) {
        freeze_proxy_drop(proxy);
        wait_probes(1, READINESS_MS);
        db_health_read(health, &s);
        cr_assert(s.ok, "a reset connection failed the probe: %s", s.reason);
    }
    cr_assert_eq(s.failures, before.failures);
    cr_assert(freeze_proxy_accepted(proxy) >= 4, "each reset should have meant a new connection");
}

Test(db_health, free_returns_promptly_while_frozen)
{
    db_dsn dsn = proxied_dsn();
    db_health_status s;

    /* Blocked in a query on the open connection: the shutdown cuts it short. A probe starts
     * every second; once its query waits unread in the frozen proxy, it is blocked (for 2 s). */
    start_health(&dsn, NULL);
    wait_ok(START_MS, "after the start");
    freeze_proxy_freeze(proxy);
    wait_probe_blocked(false, READINESS_MS);
    db_health_read(health, &s);
    cr_assert(s.ok, "the first frozen probe should still be waiting: %s", s.reason);
    int64_t took = timed_free();
    /* Not cut short, the free would wait out the rest of the probe's 2 s query, which has only
     * just started: the bound must sit below that, not at FREE_MS. */
    cr_assert(took < 1500, "db_health_free took %lld ms while frozen (query)", (long long)took);
    cr_log_info("free while frozen, in a query: %lld ms", (long long)took);

    /* Blocked inside a connect (the greeting never comes): ends with the connect timeout. Once
     * the query has timed out, the next probe starts at once with a new connection. */
    freeze_proxy_thaw(proxy);
    start_health(&dsn, NULL);
    wait_ok(START_MS, "after the restart");
    freeze_proxy_freeze(proxy);
    cr_assert(wait_state(false, READINESS_MS, &s) >= 0);
    wait_probe_blocked(true, READINESS_MS);
    took = timed_free();
    cr_assert(took < FREE_MS, "db_health_free took %lld ms while frozen (connect)",
              (long long)took);
    cr_log_info("free while frozen, in a connect: %lld ms", (long long)took);
    db_health_free(NULL);
}

Test(db_health, staleness_fails_the_state_when_the_client_waits_longer)
{
    /* A client timeout far beyond the bound stands for a probe stuck in the library for any
     * reason: the state must not wait for it. */
    db_dsn dsn = proxied_dsn();
    db_health_options opts = {.interval_ms = 500, .timeout_s = 20, .stale_ms = 1500};
    start_health(&dsn, &opts);
    wait_ok(START_MS, "after the start");
    freeze_proxy_freeze(proxy);
    db_health_status s;
    int64_t failed = wait_state(false, READINESS_MS, &s);
    cr_assert(failed >= 0, "still ok %d ms after the freeze", READINESS_MS);
    /* interval + stale_ms, with room for a loaded machine: without the bound it takes 20 s. */
    cr_assert(failed <= 500 + 1500 + 1500, "stale only after %lld ms", (long long)failed);
    cr_assert(s.stale);
    cr_assert(strstr(s.reason, "did not answer within 20 s (health probe stuck for"), "reason: %s",
              s.reason);
    cr_log_info("stale %lld ms after the freeze: %s", (long long)failed, s.reason);
    int64_t took = timed_free();
    cr_assert(took < FREE_MS, "free took %lld ms with a 20 s client timeout", (long long)took);
    cr_log_info("free with a probe stuck in a query (20 s timeout): %lld ms", (long long)took);
}
