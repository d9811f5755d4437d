/*
 * test_outbox_outage — the outbox relay while the shared RabbitMQ is down for 30 s under load:
 * rows committed during the outage stay pending (idemq_outbox state 0, read every half second:
 * never 0 while the broker is away), then drain to 0 once it is back, and a downstream idemq
 * applies every emitted message exactly once, each order's three messages in the order of their
 * transactions.
 *
 * Rows committed while the broker is away: the upstream's one DB worker is made to wait on a row
 * lock the test holds (order lk0) with a batch of deliveries in hand; the test stops RabbitMQ,
 * then releases the lock: the batch commits its rows with no broker to publish them to. The
 * acks are lost with the connection: those deliveries come back after the outage and are
 * deduplicated (no second row).
 *
 * This test stops the shared broker (scripts/services stop-rabbitmq / start-rabbitmq), so it
 * lives in its own executable; scripts/test runs integration suites one at a time. The teardown
 * starts the broker again whatever happened to the test.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "broker/connection.h"
#include "harness.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define HANDLER_NAME "pay-callback"
#define OUTAGE_MS 30000
#define ORDERS 500
#define RELAY_ON "outbox: {relay: true, poll_interval: 50ms, lease: 1s, retention: 1h}\n"

static harness_fixture F;
static MYSQL *locker;
static bool broker_stopped;

/* The downstream idemq: its own config, queue and log in F's directory and database. */
typedef struct downstream {
    char queue[96];
    char config[320];
    char log[320];
    pid_t pid;
    bool declared;
} downstream;

static downstream D;

static void teardown(void)
{
    if (locker)
        mysql_close(locker);
    locker = NULL;
    if (broker_stopped) {
        harness_services(&F.h, "start-rabbitmq");
        broker_stopped = false;
        if (F.ready)
            harness_reconnect_amqp(&F.h, 60000);
    }
    harness_kill_idemq(&D.pid);
    if (F.ready && D.declared)
        harness_delete_topology(&F.h, D.queue);
    D.declared = false;
    harness_fixture_fini(&F);
}

TestSuite(outbox_outage, .fini = teardown, .timeout = 300);

/* ------------------------------------------------------------------------------ helpers */

static long long scalar(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static long long scalar(const char *fmt, ...)
{
    char sql[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    return harness_scalar(&F.h, "%s", sql);
}

static void set_mysql(unsigned workers, unsigned batch)
{
    const char *base = getenv("IDEMQ_TEST_MYSQL_URL");
    cr_assert(base, "IDEMQ_TEST_MYSQL_URL is not set");
    const char *path = strchr(base + strlen("mysql://"), '/');
    const char *query = strchr(base, '?');
    cr_assert(path);
    char line[1024];
    snprintf(line, sizeof line,
             "mysql: {url: \"%.*s/%s%s\", workers: %u, batch: %u, batch_linger_ms: 50}",
             (int)(path - base), base, F.h.database, query ? query : "", workers, batch);
    harness_config_replace_line(&F.h, "mysql: ", line);
}

/* F's queue and config path trade places with the downstream's (call again to swap back). */
static void swap_downstream(void)
{
    char q[sizeof D.queue], c[sizeof D.config];
    _Static_assert(sizeof D.queue == sizeof F.h.queue, "queue names trade places");
    _Static_assert(sizeof D.config == sizeof F.h.config_path, "config paths trade places");
    memcpy(q, F.h.queue, sizeof q);
    memcpy(F.h.queue, D.queue, sizeof q);
    memcpy(D.queue, q, sizeof q);
    memcpy(c, F.h.config_path, sizeof c);
    memcpy(F.h.config_path, D.config, sizeof c);
    memcpy(D.config, c, sizeof c);
}

static const char downstream_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"INSERT INTO downstream (biz_key, source, order_id, step) VALUES (:biz_key, "
    ":source, :order_id, :step)\"\n";

/* One worker: the downstream applies in arrival order, so its ids show the order. */
static void down_setup(void)
{
    harness_sql(&F.h, "CREATE TABLE downstream (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key "
                      "VARBINARY(128) NOT NULL, source VARBINARY(128) NOT NULL, order_id "
                      "VARCHAR(64) NOT NULL, step INT NOT NULL, KEY (source), KEY (biz_key)) "
                      "ENGINE=InnoDB");
    char queue[200];
    snprintf(queue, sizeof queue, "%s.down", F.h.queue);
    cr_assert(strlen(queue) < sizeof D.queue);
    memcpy(D.queue, queue, strlen(queue) + 1);
    snprintf(D.config, sizeof D.config, "%s/down.yaml", F.h.dir);
    snprintf(D.log, sizeof D.log, "%s/down.log", F.h.dir);
    swap_downstream();
    harness_options o = {.handler_yaml = downstream_handler, .workers = 1};
    harness_write_config(&F.h, &o);
    harness_config_replace_line(&F.h, "    handler_name: ", "    handler_name: downstream");
    set_mysql(1, 32);
    harness_declare_topology(&F.h);
    swap_downstream();
    D.declared = true;
}

static void down_start(void)
{
    long before = harness_log_count_in(D.log, READY_LINE);
    swap_downstream();
    D.pid = harness_spawn_logged(&F.h, D.log);
    swap_downstream();
    cr_assert(harness_wait_log_in(D.log, READY_LINE, before + 1, DEADLINE_MS),
              "the downstream idemq did not start (log: %s)", D.log);
}

/* Each step of an order emits one message to the downstream queue, with its step number. */
static char upstream_handler[4096];

static const char *upstream(void)
{
    snprintf(upstream_handler, sizeof upstream_handler,
             "      type: state_machine\n"
             "      table: orders\n"
             "      key_column: order_id\n"
             "      key_field: order_id\n"
             "      state_column: status\n"
             "      event_field: event_type\n"
             "      transitions:\n"
             "        PAY_SUCCESS:\n"
             "          from: [PAYING]\n"
             "          to: PAID\n"
             "          emit: {name: paid, routing_key: \"%s\",\n"
             "                 fields: {order_id: order_id, source: biz_key, step: {value: 1}}}\n"
             "        REFUND_START:\n"
             "          from: [PAID]\n"
             "          to: REFUNDING\n"
             "          emit: {name: refund-started, routing_key: \"%s\",\n"
             "                 fields: {order_id: order_id, source: biz_key, step: {value: 2}}}\n"
             "        REFUND_SUCCESS:\n"
             "          from: [REFUNDING]\n"
             "          to: REFUNDED\n"
             "          emit: {name: refunded, routing_key: \"%s\",\n"
             "                 fields: {order_id: order_id, source: biz_key, step: {value: 3}}}\n",
             D.queue, D.queue, D.queue);
    return upstream_handler;
}

typedef struct bodies {
    char **at;
    size_t *lens;
    size_t count, cap;
} bodies;

static void add_event(bodies *b, const char *order, const char *event)
{
    if (b->count == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->at = realloc(b->at, b->cap * sizeof *b->at);
        b->lens = realloc(b->lens, b->cap * sizeof *b->lens);
        cr_assert(b->at && b->lens);
    }
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"biz_key\":\"order_id:%s:%s\",\"order_id\":\"%s\",\"event_type\":\"%s\"}",
                     order, event, order, event);
    b->at[b->count] = strdup(body);
    cr_assert(b->at[b->count]);
    b->lens[b->count++] = (size_t)n;
}

static void publish_all(bodies *b)
{
    harness_publish_batch(&F.h, NULL, "application/json", (const void *const *)b->at, b->lens,
                          b->count);
    for (size_t i = 0; i < b->count; i++)
        free(b->at[i]);
    free(b->at);
    free(b->lens);
    memset(b, 0, sizeof *b);
}

/* A statement of the upstream's worker that has waited over 200 ms (for the test's lock). */
static bool worker_blocked(harness *h, void *arg)
{
    long long locker_id = *(const long long *)arg;
    return harness_scalar(h,
                          "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '%s' AND "
                          "ID <> CONNECTION_ID() AND ID <> %lld AND INFO IS NOT NULL AND TIME_MS "
                          "> 200",
                          h->database, locker_id) > 0;
}

typedef struct settled {
    long long rows;
} settled;

static bool drained(harness *h, void *arg)
{
    const settled *s = arg;
    (void)h;
    return scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0") == 0 &&
           scalar("SELECT COUNT(*) FROM idemq_outbox") == s->rows &&
           scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = 'downstream'") == s->rows;
}

static void locker_sql(const char *sql)
{
    cr_assert(mysql_query(locker, sql) == 0, "%s: %s", sql, mysql_error(locker));
    MYSQL_RES *res = mysql_store_result(locker);
    if (res)
        mysql_free_result(res);
}

/* ------------------------------------------------------------------------------ the test */

Test(outbox_outage, rows_pile_up_while_the_broker_is_down_and_drain_in_order_after)
{
    harness_fixture_init(&F, "outbox_outage", NULL);
    down_setup();
    harness_options o = {.handler_yaml = upstream(), .top_yaml = RELAY_ON, .workers = 1};
    harness_write_config(&F.h, &o);
    set_mysql(1, 16);
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "o", ORDERS, "PAYING");
    harness_insert_orders(&F.h, "lk", 1, "PAYING");

    /* The load: each order pays, starts a refund and is refunded; an order's three events are
     * ORDERS messages apart. lk0's payment comes after the first 600: the worker stops there,
     * waiting for the test's lock, with the next messages of its batch. */
    bodies b = {0};
    static const char *const steps[] = {"PAY_SUCCESS", "REFUND_START", "REFUND_SUCCESS"};
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < ORDERS; i++) {
            char order[16];
            snprintf(order, sizeof order, "o%d", i);
            add_event(&b, order, steps[s]);
            if (s == 1 && i == 99)
                add_event(&b, "lk0", "PAY_SUCCESS");
        }
    }
    long long events = (long long)b.count;
    locker = harness_db_open(&F.h);
    locker_sql("START TRANSACTION");
    locker_sql("SELECT status FROM orders WHERE order_id = 'lk0' FOR UPDATE");
    cr_assert(mysql_query(locker, "SELECT CONNECTION_ID()") == 0);
    MYSQL_RES *res = mysql_store_result(locker);
    long long locker_id = atoll(mysql_fetch_row(res)[0]);
    mysql_free_result(res);
    publish_all(&b);

    down_start();
    harness_start_idemq(&F.h, READY_LINE, DEADLINE_MS, &F.daemon);
    cr_assert(harness_wait_for(worker_blocked, &F.h, &locker_id, DEADLINE_MS),
              "the upstream worker never waited for lk0's row");
    /* Everything committed so far is out: the relay had the broker. */
    cr_assert(harness_wait_scalar(&F.h, 0, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"));
    long long before = scalar("SELECT COUNT(*) FROM idemq_outbox");
    cr_assert(before >= ORDERS, "only %lld rows before the outage", before);

    broker_stopped = true;
    int64_t t_stop = harness_now_ms();
    cr_assert_eq(harness_services(&F.h, "stop-rabbitmq"), 0, "stop-rabbitmq failed");
    /* The broker is gone: now the waiting batch commits its rows, with no broker to take them. */
    locker_sql("ROLLBACK");
    mysql_close(locker);
    locker = NULL;
    long long low = -1, high = 0;
    long samples = 0;
    int64_t back_at = t_stop + OUTAGE_MS;
    cr_assert(harness_wait_scalar_at_least(&F.h, before + 1, DEADLINE_MS,
                                           "SELECT COUNT(*) FROM idemq_outbox") > before,
              "the waiting batch wrote no row after the lock was released");
    while (harness_now_ms() < back_at) {
        long long pending = scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0");
        cr_assert_gt(pending, 0, "a row went out while the broker was down (sample %ld)", samples);
        low = low < 0 || pending < low ? pending : low;
        high = pending > high ? pending : high;
        samples++;
        struct timespec pause = {.tv_nsec = 500 * 1000000};
        nanosleep(&pause, NULL); /* the outage's own length: sampled, not awaited */
    }
    int64_t t_start = harness_now_ms();
    cr_assert_eq(harness_services(&F.h, "start-rabbitmq"), 0, "start-rabbitmq failed");
    broker_stopped = false;
    int64_t outage_ms = harness_now_ms() - t_stop, start_ms = harness_now_ms() - t_start;
    harness_reconnect_amqp(&F.h, 60000);
    harness_wait_quorum_ready(&F.h, 60000);

    settled s = {events};
    int64_t t_back = harness_now_ms();
    cr_assert(harness_wait_for(drained, &F.h, &s, 180000),
              "not drained: %lld pending, %lld rows of %lld, %lld applied downstream",
              scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
              scalar("SELECT COUNT(*) FROM idemq_outbox"), events,
              scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = 'downstream'"));
    int64_t drain_ms = harness_now_ms() - t_back;
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    cr_assert(harness_wait_queue_depth(&F.h, D.queue, 0, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    harness_stop_idemq(&D.pid);

    /* Every event applied once upstream, its row published, its message applied once
     * downstream. */
    cr_assert_eq(scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = '" HANDLER_NAME "'"),
                 events);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM orders WHERE status = 'REFUNDED'"), ORDERS);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"), events);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM downstream"), events);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM (SELECT biz_key FROM downstream GROUP BY biz_key "
                        "HAVING COUNT(*) <> 1) t"),
                 0);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox o JOIN downstream d ON d.biz_key = "
                        "o.biz_key AND d.source = o.source_biz_key"),
                 events);
    /* Per order, downstream in the order of the upstream's transactions: step 1, 2, 3. */
    cr_assert_eq(scalar("SELECT COUNT(*) FROM downstream a JOIN downstream b ON a.order_id = "
                        "b.order_id AND a.step < b.step AND a.id > b.id"),
                 0, "an order's messages applied downstream out of order");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM (SELECT order_id FROM downstream WHERE order_id "
                        "LIKE 'o%%' GROUP BY order_id HAVING COUNT(*) = 3 AND MIN(step) = 1 AND "
                        "MAX(step) = 3) t"),
                 ORDERS);
    long duplicates = harness_log_count_in(D.log, "\"outcome\":\"deduped\"");
    long upstream_deduped = harness_log_count(&F.h, "\"outcome\":\"deduped\"");
    cr_log_info("broker outage: %lld ms down (stop-rabbitmq to start-rabbitmq returning; start "
                "took %lld ms), %lld rows out before it, pending %lld..%lld over %ld samples "
                "while down, drained in %lld ms after; %lld events; upstream redeliveries "
                "deduplicated %ld, downstream duplicates deduplicated %ld",
                (long long)outage_ms, (long long)start_ms, before, low, high, samples,
                (long long)drain_ms, events, upstream_deduped, duplicates);
}
