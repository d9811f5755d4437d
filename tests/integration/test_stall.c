/*
 * test_stall — the loop never stalls (issue 8), against the real broker and database and the real
 * idemq binary: a memory alarm while 900 KB retry copies are in flight, a broker frozen with
 * SIGSTOP for 120 s, idemq started 30 s before the broker and the database, and the outcome
 * counters of /metrics against the outcome log lines after broker restarts.
 *
 * Throughout a fault the suite polls /healthz and /readyz (endpoint_watch): every /healthz must
 * answer within HEALTHZ_BUDGET_MS, /readyz must turn 503 with the reason within
 * READY_BUDGET_MS of the fault and 200 again after it. Afterwards every event must have been
 * applied exactly once and nothing may be left in the retry ladder or the DLQ.
 *
 * Faults are undone whatever happens to the test process: a guard process (fault_guard_arm)
 * thaws the broker, lifts the alarm and starts the servers again once the test's end of a pipe
 * closes, at the end of the test or when the test process dies.
 */
#define _GNU_SOURCE /* pipe2 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* /healthz must not wait on the fault: stuck, it would take seconds (the broker's or the
 * database's timeout); answered, it takes a few ms, up to ~150 ms on a loaded 2-core machine. */
#define HEALTHZ_BUDGET_MS 500
#define READY_BUDGET_MS 5000
#define BIG_BODY_BYTES (900 * 1024)

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static int guard_fd = -1;
static pid_t guard_pid;

/* ------------------------------------------------------------------------------ fault guard */

/* Undoes every fault this suite can inject; each command is harmless when there is nothing to
 * undo. */
static const char undo_faults[] =
    "\"$IDEMQ_SERVICES\" thaw-rabbitmq >/dev/null 2>&1; "
    "\"$IDEMQ_SERVICES\" rabbitmqctl set_vm_memory_high_watermark 0.4 >/dev/null 2>&1; "
    "\"$IDEMQ_SERVICES\" status >/dev/null 2>&1 || \"$IDEMQ_SERVICES\" start >/dev/null 2>&1";

static void fault_guard_arm(void)
{
    int fds[2];
    cr_assert(pipe2(fds, O_CLOEXEC) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setsid(); /* not in the test's process group: survives its kill */
        close(fds[1]);
        char c;
        while (read(fds[0], &c, 1) > 0)
            ;
        execl("/bin/sh", "sh", "-c", undo_faults, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    guard_fd = fds[1];
    guard_pid = pid;
}

static void fault_guard_disarm(void)
{
    if (guard_fd < 0)
        return;
    close(guard_fd);
    guard_fd = -1;
    int status;
    waitpid(guard_pid, &status, 0);
}

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    fault_guard_disarm();
    if (h_ready) {
        /* The daemon's log outlives the test's temp dir, for a failure's post-mortem. */
        char keep[512];
        snprintf(keep, sizeof keep, "cp '%s' /tmp/idemq-%s.log 2>/dev/null", H.log_path, H.name);
        if (system(keep) != 0)
            fprintf(stderr, "could not keep %s\n", H.log_path);
        harness_reconnect_amqp(&H, 60000);
        harness_db_reconnect(&H, 60000);
        harness_fini(&H);
    }
    h_ready = false;
}

TestSuite(stall, .fini = teardown, .timeout = 600);

/* ------------------------------------------------------------------------- endpoint watch */

/* The harness's watch (ep), plus when /readyz told the truth about the fault. */
typedef struct endpoint_watch {
    harness_endpoint_watch ep;
    int64_t fault_at_ms;      /* when the fault began; 0 before */
    int64_t recovered_at_ms;  /* when the fault ended; 0 before */
    int64_t unready_after_ms; /* first 503 after the fault began, relative to it; -1: none yet */
    char unready_reason[1024];
    int64_t ready_again_ms; /* first 200 after recovery, relative to it; -1: none yet */
} endpoint_watch;

static void watch_init(endpoint_watch *w, int port)
{
    *w = (endpoint_watch){.unready_after_ms = -1, .ready_again_ms = -1};
    harness_endpoint_watch_init(&w->ep, port, HEALTHZ_BUDGET_MS);
}

static void watch_poll(endpoint_watch *w)
{
    int ready = harness_endpoint_watch_poll(&w->ep);
    int64_t now = w->ep.readyz_at_ms;
    if (w->fault_at_ms && !w->recovered_at_ms && ready == 503 && w->unready_after_ms < 0) {
        w->unready_after_ms = now - w->fault_at_ms;
        memcpy(w->unready_reason, w->ep.readyz_body, sizeof w->unready_reason);
    }
    if (w->recovered_at_ms && ready == 200 && w->ready_again_ms < 0)
        w->ready_again_ms = now - w->recovered_at_ms;
}

/* Polls the endpoints for duration_ms. */
static void watch_for(endpoint_watch *w, int duration_ms)
{
    int64_t end = harness_now_ms() + duration_ms;
    while (harness_now_ms() < end) {
        watch_poll(w);
        usleep(50 * 1000); /* the polling rate of the watch itself, not a wait for an event */
    }
}

typedef struct watched_wait {
    endpoint_watch *w;
    bool (*cond)(harness *h, void *arg);
    void *arg;
} watched_wait;

static bool watched(harness *h, void *arg)
{
    watched_wait *ww = arg;
    watch_poll(ww->w);
    return ww->cond(h, ww->arg);
}

/* harness_wait_for with the endpoints polled at every step. */
static bool wait_watched(endpoint_watch *w, bool (*cond)(harness *h, void *arg), void *arg,
                         int timeout_ms)
{
    watched_wait ww = {.w = w, .cond = cond, .arg = arg};
    return harness_wait_for(watched, &H, &ww, timeout_ms);
}

static void report(const char *what, const endpoint_watch *w)
{
    fprintf(stderr,
            "[measure] %s: /healthz %ld requests, worst %lld ms, %ld over %d ms; /readyz 503 "
            "after %lld ms (\"%s\"), 200 again %lld ms after recovery\n",
            what, w->ep.healthz_requests, (long long)w->ep.healthz_worst_ms, w->ep.healthz_bad,
            HEALTHZ_BUDGET_MS, (long long)w->unready_after_ms, w->unready_reason,
            (long long)w->ready_again_ms);
}

static void expect_endpoints_truthful(const endpoint_watch *w, const char *reason_part)
{
    cr_expect_eq(w->ep.healthz_bad, 0, "%ld of %ld /healthz requests took over %d ms (worst %lld)",
                 w->ep.healthz_bad, w->ep.healthz_requests, HEALTHZ_BUDGET_MS,
                 (long long)w->ep.healthz_worst_ms);
    cr_expect(w->unready_after_ms >= 0 && w->unready_after_ms <= READY_BUDGET_MS,
              "/readyz turned 503 after %lld ms (budget %d)", (long long)w->unready_after_ms,
              READY_BUDGET_MS);
    cr_expect(strstr(w->unready_reason, reason_part), "/readyz said \"%s\", expected \"%s\"",
              w->unready_reason, reason_part);
    cr_expect(w->ready_again_ms >= 0, "/readyz never answered 200 after recovery");
}

/* ------------------------------------------------------------------------------ workload */

typedef struct count_wait {
    const char *sql;
    long long expected, last;
} count_wait;

static bool count_reached(harness *h, void *arg)
{
    count_wait *c = arg;
    c->last = harness_scalar(h, "%s", c->sql);
    return c->last >= c->expected;
}

static bool ready_200(harness *h, void *arg)
{
    (void)h;
    endpoint_watch *w = arg;
    return w->ep.readyz_status == 200;
}

/* Nothing left in the work queue, the retry ladder or the DLQ (every queue named after H's). */
static bool everything_settled(harness *h, void *arg)
{
    (void)arg;
    return harness_broker_messages_under(h->queue, NULL) == 0;
}

static const char *dlq_depth_queue;

static bool dlq_at_least(harness *h, void *arg)
{
    count_wait *c = arg;
    c->last = harness_queue_depth(h, dlq_depth_queue);
    return c->last >= c->expected;
}

static bool work_queue_empty(harness *h, void *arg)
{
    (void)arg;
    long messages = -1, unacked = -1;
    return harness_broker_queue_stats(h->queue, &messages, &unacked) && messages == 0;
}

/* Orders whose fail_budget row is above zero fail (a deadlock: retryable) that many times. Every
 * update also sleeps sleep_s, so that a fault lands while messages are in flight. */
static void failure_budget(harness *h, double sleep_s)
{
    harness_sql(h, "CREATE TABLE fail_budget (order_id VARCHAR(64) PRIMARY KEY, "
                   "remaining INT NOT NULL) ENGINE=MyISAM");
    harness_sql(h,
                "CREATE TRIGGER orders_fail BEFORE UPDATE ON orders FOR EACH ROW BEGIN "
                "  DO SLEEP(%g); "
                "  IF (SELECT COALESCE(MAX(remaining), 0) FROM fail_budget "
                "      WHERE order_id = OLD.order_id) > 0 THEN "
                "    UPDATE fail_budget SET remaining = remaining - 1 "
                "      WHERE order_id = OLD.order_id; "
                "    SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, "
                "      MESSAGE_TEXT = 'injected deadlock'; "
                "  END IF; "
                "END",
                sleep_s);
}

/* A PAY_SUCCESS event for order PREFIX<i> padded to about BIG_BODY_BYTES. Returned owned. */
static char *big_event(const char *prefix, int i, size_t *len)
{
    char *body = malloc(BIG_BODY_BYTES + 512);
    cr_assert(body);
    int n = snprintf(body, 512,
                     "{\"biz_key\":\"order_id:%s%d:PAY_SUCCESS\",\"order_id\":\"%s%d\","
                     "\"event_type\":\"PAY_SUCCESS\",\"amount\":%d,\"padding\":\"",
                     prefix, i, prefix, i, i + 1);
    memset(body + n, 'x', BIG_BODY_BYTES);
    n += BIG_BODY_BYTES;
    n += snprintf(body + n, 8, "\"}");
    *len = (size_t)n;
    return body;
}

static void expect_applied_once(int count, const char *prefix)
{
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id LIKE '%s%%' AND "
                                    "status = 'PAID'", prefix),
                 count);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), count,
                 "one dedup row per event");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id LIKE '%s%%' AND "
                                    "status = 'PAID' AND amount IS NULL", prefix),
                 0);
}

/* -------------------------------------------------------------------------------- tests */

Test(stall, a_memory_alarm_with_large_retry_copies_in_flight)
{
    enum { EVENTS = 16 };
    harness_options o = {.prefetch = EVENTS, .retry_set = true, .max_retries = 6, .base = "1s"};
    harness_init(&H, "stall_alarm", &o);
    h_ready = true;
    failure_budget(&H, 0);
    harness_insert_orders(&H, "al", EVENTS, "PAYING");
    /* Each event fails four times (900 KB retry copies 1, 2, 4 and 8 s apart), then applies: the
     * ladder keeps publishing through the alarm's first seconds. */
    harness_sql(&H, "INSERT INTO fail_budget SELECT order_id, 4 FROM orders");
    fault_guard_arm();
    harness_start_idemq(&H, "started consuming", 30000, &daemon_pid);
    int port = harness_http_port(&H, 10000);
    endpoint_watch w;
    watch_init(&w, port);

    for (int i = 0; i < EVENTS; i++) {
        size_t len;
        char *body = big_event("al", i, &len);
        harness_publish(&H, NULL, "application/json", body, len, NULL);
        free(body);
    }
    cr_assert(harness_wait_log(&H, "\"outcome\":\"retried\"", 1, 30000),
              "no retry copy was confirmed");
    /* The alarm while the ladder is busy with 900 KB copies. */
    harness_services_ok("rabbitmqctl set_vm_memory_high_watermark absolute 10MB");
    w.fault_at_ms = harness_now_ms();
    watch_for(&w, 60000);
    long blocked_lines = harness_log_count(&H, "RabbitMQ blocked the connection");
    harness_services_ok("rabbitmqctl set_vm_memory_high_watermark 0.4");
    w.recovered_at_ms = harness_now_ms();

    count_wait paid = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                       .expected = EVENTS};
    cr_assert(wait_watched(&w, count_reached, &paid, 120000), "%lld of %d events applied",
              paid.last, EVENTS);
    cr_assert(wait_watched(&w, everything_settled, NULL, 60000),
              "the work queue, the ladder or the DLQ still hold messages");
    cr_assert(wait_watched(&w, ready_200, &w, 10000), "/readyz did not recover");
    report("memory alarm 60 s, 900 KB retry copies", &w);
    /* "blocks the connection" once idemq read the broker's connection.blocked; "has not read a
     * publish" while a 900 KB copy that the broker stopped reading mid-way is still being
     * written. */
    expect_endpoints_truthful(&w, "RabbitMQ");
    cr_expect(blocked_lines >= 1, "idemq did not log the broker's block");
    cr_expect(harness_log_count(&H, "RabbitMQ unblocked the connection") >= 1);
    expect_applied_once(EVENTS, "al");
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"dead_lettered\""), 0);
    char *scrape = NULL;
    cr_assert_eq(harness_http_get(port, "/metrics", &scrape), 200);
    cr_expect(harness_metric_value(scrape, "idemq_broker_blocked_total") >= 1);
    cr_expect_eq(harness_metric_value(scrape, "idemq_broker_blocked"), 0);
    free(scrape);
    harness_stop_idemq(&daemon_pid);
}

Test(stall, a_broker_frozen_for_120_s)
{
    enum { EVENTS = 400 };
    harness_options o = {.prefetch = 32};
    harness_init(&H, "stall_frozen", &o);
    h_ready = true;
    failure_budget(&H, 0.05); /* 400 events take about 5 s: the freeze lands mid-run */
    harness_insert_orders(&H, "fz", EVENTS, "PAYING");
    harness_declare_topology(&H); /* the queue exists before idemq's first connect */
    harness_publish_payments(&H, "fz", EVENTS);
    fault_guard_arm();
    harness_start_idemq(&H, "started consuming", 30000, &daemon_pid);
    int port = harness_http_port(&H, 10000);
    endpoint_watch w;
    watch_init(&w, port);
    count_wait some = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                       .expected = 50};
    cr_assert(wait_watched(&w, count_reached, &some, 30000), "only %lld applied", some.last);

    harness_services_ok("freeze-rabbitmq");
    w.fault_at_ms = harness_now_ms();
    watch_for(&w, 120000);
    harness_services_ok("thaw-rabbitmq");
    w.recovered_at_ms = harness_now_ms();

    count_wait all = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                      .expected = EVENTS};
    cr_assert(wait_watched(&w, count_reached, &all, 180000), "%lld of %d events applied",
              all.last, EVENTS);
    harness_reconnect_amqp(&H, 60000); /* the harness's own connection missed its heartbeats */
    cr_assert(wait_watched(&w, everything_settled, NULL, 60000),
              "the work queue, the ladder or the DLQ still hold messages");
    /* The reconnect backoff is at its cap (10 s, with jitter) after two minutes of failures. */
    cr_assert(wait_watched(&w, ready_200, &w, 60000), "/readyz did not recover");
    report("broker SIGSTOP 120 s", &w);
    expect_endpoints_truthful(&w, "RabbitMQ");
    expect_applied_once(EVENTS, "fz");
    harness_stop_idemq(&daemon_pid);
}

Test(stall, started_30_s_before_the_broker_and_the_database)
{
    enum { EVENTS = 300 };
    harness_options o = {0};
    harness_init(&H, "stall_early", &o);
    h_ready = true;
    harness_insert_orders(&H, "ea", EVENTS, "PAYING");
    harness_declare_topology(&H); /* the queue exists before idemq's first connect */
    harness_publish_payments(&H, "ea", EVENTS); /* quorum queue: survives the broker's stop */
    harness_publish_payments(&H, "ea", EVENTS / 10); /* and duplicates */
    fault_guard_arm();
    cr_assert_eq(harness_services(&H, "stop-rabbitmq"), 0);
    cr_assert_eq(harness_services(&H, "stop-mariadb"), 0);

    daemon_pid = harness_spawn(&H);
    int port = harness_http_port(&H, 5000);
    endpoint_watch w;
    watch_init(&w, port);
    w.fault_at_ms = harness_now_ms();
    watch_for(&w, 30000);
    cr_assert(kill(daemon_pid, 0) == 0, "idemq exited while the servers were down");
    cr_assert_eq(harness_services(&H, "start-mariadb"), 0);
    cr_assert_eq(harness_services(&H, "start-rabbitmq"), 0);
    w.recovered_at_ms = harness_now_ms();
    harness_db_reconnect(&H, 60000);

    count_wait all = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                      .expected = EVENTS};
    cr_assert(wait_watched(&w, count_reached, &all, 120000), "%lld of %d events applied",
              all.last, EVENTS);
    harness_reconnect_amqp(&H, 60000);
    cr_assert(wait_watched(&w, everything_settled, NULL, 60000),
              "the work queue still holds messages");
    cr_assert(wait_watched(&w, ready_200, &w, 30000), "/readyz did not turn 200");
    report("started 30 s before the servers", &w);
    expect_endpoints_truthful(&w, "not connected to RabbitMQ");
    expect_applied_once(EVENTS, "ea");
    harness_stop_idemq(&daemon_pid);
    cr_expect_eq(harness_summary_total(H.log_path, "deduped"), EVENTS / 10);
}

/* The outcome lines of the log, by outcome label, against idemq_messages_total. */
static void expect_counters_match_log(int port)
{
    static const char *const labels[] = {"processed", "deduped", "state_noop",
                                         "retried", "dead_lettered", "requeued"};
    char *scrape = NULL;
    cr_assert_eq(harness_http_get(port, "/metrics", &scrape), 200);
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++) {
        char needle[64], sample[256];
        snprintf(needle, sizeof needle, "\"outcome\":\"%s\"", labels[i]);
        snprintf(sample, sizeof sample, "idemq_messages_total{queue=\"%s\",outcome=\"%s\"}",
                 H.queue, labels[i]);
        long lines = harness_log_count(&H, needle);
        long long counted = harness_metric_value(scrape, sample);
        fprintf(stderr, "[measure] %s: %ld log lines, counter %lld\n", labels[i], lines, counted);
        cr_expect_eq(counted, lines, "%s: counter %lld, %ld log lines", labels[i], counted,
                     lines);
    }
    free(scrape);
}

Test(stall, outcome_counters_equal_outcome_log_lines_across_broker_restarts)
{
    enum { EVENTS = 600 };
    harness_options o = {.prefetch = 64, .retry_set = true, .max_retries = 2, .base = "100ms"};
    harness_init(&H, "stall_counts", &o);
    h_ready = true;
    failure_budget(&H, 0.02); /* about 3 s of work: both restarts land mid-run */
    harness_insert_orders(&H, "ct", EVENTS, "PAYING");
    /* Every 10th fails once (retried), every 50th fails forever (dead-lettered after retries). */
    harness_sql(&H, "INSERT INTO fail_budget SELECT order_id, "
                    "IF(CAST(SUBSTRING(order_id, 3) AS UNSIGNED) %% 50 = 0, 1000, 1) FROM orders "
                    "WHERE CAST(SUBSTRING(order_id, 3) AS UNSIGNED) %% 10 = 0");
    fault_guard_arm();
    harness_start_idemq(&H, "started consuming", 30000, &daemon_pid);
    int port = harness_http_port(&H, 10000);
    harness_publish_payments(&H, "ct", EVENTS);
    /* Duplicates of events that apply: deduped. (A duplicate of an event that fails for good
     * would be a dead letter of its own, with a failure of its own.) */
    for (int i = 1; i <= 60; i++)
        if (i % 50 != 0) {
            char order[16];
            snprintf(order, sizeof order, "ct%d", i);
            harness_publish_event(&H, order, "PAY_SUCCESS", i);
        }
    for (int restart = 0; restart < 2; restart++) {
        count_wait some = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                           .expected = (restart + 1) * EVENTS / 4};
        cr_assert(harness_wait_for(count_reached, &H, &some, 60000), "only %lld applied",
                  some.last);
        cr_assert_eq(harness_services(&H, "restart-rabbitmq"), 0);
        harness_reconnect_amqp(&H, 60000);
    }
    int dead = EVENTS / 50;
    count_wait all = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                      .expected = EVENTS - dead};
    cr_assert(harness_wait_for(count_reached, &H, &all, 120000), "%lld of %d applied", all.last,
              EVENTS - dead);
    char dlq[160];
    snprintf(dlq, sizeof dlq, "%s.dlq", H.queue);
    /* A copy confirmed just before a restart whose original's ack was lost is made again by the
     * redelivery: the DLQ may hold more copies than failures (dlq list collapses them). */
    count_wait dlq_depth = {.expected = dead};
    dlq_depth_queue = dlq;
    cr_assert(harness_wait_for(dlq_at_least, &H, &dlq_depth, 60000),
              "the DLQ holds %lld of %d", dlq_depth.last, dead);
    cr_assert(harness_wait_for(work_queue_empty, &H, NULL, 60000),
              "the work queue still holds messages");
    expect_counters_match_log(port);
    /* Copies of one failure show as one entry, however many a lost ack made. */
    char *out = NULL;
    const char *list[] = {"dlq", "list", "-c", H.config_path, "--queue", H.queue, "--json", NULL};
    cr_assert_eq(harness_run_cli(&H, &out, list), 0, "dlq list failed:\n%s", out);
    json_t *doc = harness_output_json(out);
    fprintf(stderr, "[measure] DLQ: %lld copies, %zu entries for %d failures\n", dlq_depth.last,
            json_array_size(json_object_get(doc, "messages")), dead);
    cr_expect_eq(json_array_size(json_object_get(doc, "messages")), (size_t)dead, "%s", out);
    json_decref(doc);
    free(out);
    harness_stop_idemq(&daemon_pid);
    expect_applied_once(EVENTS - dead, "ct");
}

Test(stall, large_bodies_in_flight_keep_healthz_fast)
{
    enum { EVENTS = 300, BUDGET_MS = HEALTHZ_BUDGET_MS };
    harness_options o = {.prefetch = EVENTS};
    harness_init(&H, "stall_bodies", &o);
    h_ready = true;
    harness_insert_orders(&H, "lb", EVENTS, "PAYING");
    harness_declare_topology(&H);
    for (int i = 0; i < EVENTS; i++) {
        size_t len;
        char *body = big_event("lb", i, &len);
        harness_publish(&H, NULL, "application/json", body, len, NULL);
        free(body);
    }
    harness_start_idemq(&H, "started consuming", 30000, &daemon_pid);
    int port = harness_http_port(&H, 10000);
    endpoint_watch w;
    watch_init(&w, port);
    count_wait all = {.sql = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'",
                      .expected = EVENTS};
    cr_assert(wait_watched(&w, count_reached, &all, 120000), "%lld of %d applied", all.last,
              EVENTS);
    fprintf(stderr, "[measure] %d x 900 KB bodies: /healthz %ld requests, worst %lld ms\n", EVENTS,
            w.ep.healthz_requests, (long long)w.ep.healthz_worst_ms);
    cr_expect(w.ep.healthz_worst_ms < BUDGET_MS, "/healthz took %lld ms (budget %d)",
              (long long)w.ep.healthz_worst_ms, BUDGET_MS);
    cr_expect(w.ep.healthz_requests >= 5, "too few /healthz samples (%ld)", w.ep.healthz_requests);
    expect_applied_once(EVENTS, "lb");
    harness_stop_idemq(&daemon_pid);
}
