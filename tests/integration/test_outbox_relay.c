/*
 * test_outbox_relay — the outbox relay (adapter/outbox/relay) in-process against the real
 * RabbitMQ and MariaDB: the test INSERTs idemq_outbox rows into the harness database (as a
 * handler's transaction would), runs one or two relays on it, and reads what they published from
 * queues it declares and binds itself.
 *
 *   publish          pending rows go out in id order with the documented properties and headers,
 *                    become state 1 with published_at, stats drain to 0, published_total counts;
 *   backlog          3000 rows (one larger than frame_max) drain in full batches, in order;
 *   after_confirm    through a frozen freeze_proxy the publish is written but no confirm can come:
 *                    the row stays pending until the thaw, then turns state 1 (marked only after
 *                    its confirm);
 *   notify           poll_interval 60 s: a row nobody announces stays pending, a notified one
 *                    arrives within 2 s (the notify→arrival latency is logged);
 *   unroutable       no binding → state 2 "unroutable: 312 NO_ROUTE (...)"; a missing exchange →
 *                    state 2 "exchange not found: 404 ..."; an exchange deleted after the relay
 *                    saw it (the broker closes the channel) → that row state 2; later rows go out;
 *   two_relays       one leader at a time; stop the leader → the standby takes over at once
 *                    (the lease is released); every row published exactly once;
 *   broker_down      the broker reset and refused for 5 s while rows are inserted: they stay
 *                    pending, stats and outbox_relay_stuck say so; after the restore they drain
 *                    in id order (the drain time is logged);
 *   crash            a forked relay SIGKILLed between its confirms and its marks
 *                    (IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS): after the lease lapses another relay
 *                    publishes the rows again: duplicates, nothing lost;
 *   nack             a full reject-publish queue nacks: the rows stay pending with attempts and
 *                    last_error, and go out in order once the queue has room;
 *   hung_database    MySQL frozen behind a freeze_proxy: outbox_relay_stuck says the thread hangs,
 *                    and outbox_relay_stop still returns within about 5 s;
 *   retention        published rows older than retention_ms are deleted; retention 0 deletes at
 *                    the confirm.
 * Run with --verbose to see the measurements (cr_log_info).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "broker/amqp_api.h"
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "config/config.h"
#include "db/dsn.h"
#include "freeze_proxy.h"
#include "harness.h"
#include "outbox/relay.h"

static harness_fixture F;
static outbox_relay *relays[2];
static freeze_proxy *proxy;
static config cfg;
static char amqp_url[512];
static char names[8][160]; /* exchanges (e*) and queues (q*) to delete */
static size_t name_count;
static bool name_is_queue[8];

static void teardown(void)
{
    for (size_t i = 0; i < 2; i++) {
        outbox_relay_stop(relays[i]);
        relays[i] = NULL;
    }
    freeze_proxy_free(proxy);
    proxy = NULL;
    if (F.ready && F.h.amqp) {
        for (size_t i = 0; i < name_count; i++) {
            if (name_is_queue[i])
                amqp_queue_delete(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(names[i]), 0, 0);
            else
                amqp_exchange_delete(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(names[i]), 0);
            if (amqp_get_rpc_reply(F.h.amqp).reply_type != AMQP_RESPONSE_NORMAL) {
                broker_reopen_channel(F.h.amqp);
                amqp_confirm_select(F.h.amqp, BROKER_CHANNEL);
                amqp_get_rpc_reply(F.h.amqp);
            }
        }
    }
    name_count = 0;
    harness_fixture_fini(&F);
}

TestSuite(outbox_relay, .fini = teardown, .timeout = 180);

/* ------------------------------------------------------------------------------------ helpers */

static void pause_ms(int ms)
{
    poll(NULL, 0, ms);
}

typedef struct relay_settings {
    unsigned batch;
    uint64_t poll_ms, lease_ms, stuck_ms;
    uint64_t retention_ms; /* 0: 1 h (delete_at_confirm for outbox.retention 0) */
    bool delete_at_confirm;
    bool through_proxy;    /* AMQP through `proxy` */
    bool db_through_proxy; /* MySQL through `proxy` (not both) */
} relay_settings;

static bool db_proxied;

/* The harness database and a config for the relay (zeroed, filled in directly). */
static void setup(const char *name, const relay_settings *s)
{
    harness_fixture_init(&F, name, NULL);
    const char *url = getenv("IDEMQ_TEST_AMQP_URL");
    cr_assert(url && *url, "IDEMQ_TEST_AMQP_URL is not set (source .state/env)");
    snprintf(amqp_url, sizeof amqp_url, "%s", url);
    if (s->through_proxy) {
        harness_start_broker_proxy(&proxy, amqp_url, sizeof amqp_url);
    }
    db_proxied = s->db_through_proxy;
    if (db_proxied) {
        char err[256];
        db_dsn dsn;
        cr_assert(db_dsn_parse(getenv("IDEMQ_TEST_MYSQL_URL"), &dsn, err, sizeof err) == 0);
        cr_assert(!dsn.socket[0], "IDEMQ_TEST_MYSQL_URL must be TCP for the proxy");
        cr_assert(freeze_proxy_start(dsn.host, dsn.port, &proxy, err, sizeof err) == 0, "%s", err);
    }
    memset(&cfg, 0, sizeof cfg);
    cfg.amqp_urls[0] = amqp_url;
    cfg.amqp_url_count = 1;
    cfg.heartbeat_ms = 10000;
    cfg.outbox.relay = 1;
    cfg.outbox.batch = s->batch ? s->batch : 256;
    cfg.outbox.poll_interval_ms = s->poll_ms ? s->poll_ms : 100;
    cfg.outbox.lease_ms = s->lease_ms ? s->lease_ms : 3000;
    cfg.outbox.retention_ms = s->delete_at_confirm ? 0
                              : s->retention_ms    ? s->retention_ms
                                                   : 3600000;
    cfg.outbox.stuck_after_ms = s->stuck_ms ? s->stuck_ms : 60000;
}

static db_dsn test_dsn(void)
{
    char err[256];
    db_dsn dsn;
    cr_assert(db_dsn_parse(getenv("IDEMQ_TEST_MYSQL_URL"), &dsn, err, sizeof err) == 0, "%s", err);
    size_t len = strlen(F.h.database);
    cr_assert_lt(len, sizeof dsn.database);
    memcpy(dsn.database, F.h.database, len + 1);
    if (db_proxied) {
        snprintf(dsn.host, sizeof dsn.host, "127.0.0.1");
        dsn.port = freeze_proxy_port(proxy);
    }
    return dsn;
}

static outbox_relay *start_relay(size_t slot, const char *owner)
{
    char err[256];
    db_dsn dsn = test_dsn();
    cr_assert(outbox_relay_start(&cfg, &dsn, owner, &relays[slot], err, sizeof err) == 0, "%s",
              err);
    return relays[slot];
}

static void stop_relay(size_t slot)
{
    outbox_relay_stop(relays[slot]);
    relays[slot] = NULL;
}

static void check_reply(const char *what)
{
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(F.h.amqp);
    char text[256];
    cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL, "%s: %s", what,
              broker_describe_reply(reply, text, sizeof text));
}

/* A name unique to this test: "<queue>.<suffix>", remembered for the teardown. */
static const char *track(const char *suffix, bool queue)
{
    cr_assert(name_count < 8);
    snprintf(names[name_count], sizeof names[0], "%s.%s", F.h.queue, suffix);
    name_is_queue[name_count] = queue;
    return names[name_count++];
}

static const char *declare_exchange(const char *suffix)
{
    const char *name = track(suffix, false);
    amqp_exchange_declare(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(name),
                          amqp_cstring_bytes("direct"), 0, 0, 0, 0, amqp_empty_table);
    check_reply("exchange.declare");
    return name;
}

/* A durable queue (RabbitMQ 4.3 refuses transient non-exclusive ones once that deprecated
 * feature is not permitted, as scripts/services runs it), bound to exchange with key unless
 * exchange is NULL; the teardown deletes it. */
static const char *declare_queue(const char *suffix, const char *exchange, const char *key)
{
    const char *name = track(suffix, true);
    amqp_queue_declare(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0, 1, 0, 0,
                       amqp_empty_table);
    check_reply("queue.declare");
    if (exchange) {
        amqp_queue_bind(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(name),
                        amqp_cstring_bytes(exchange), amqp_cstring_bytes(key), amqp_empty_table);
        check_reply("queue.bind");
    }
    return name;
}

/* Inserts one pending row (as a handler's transaction would) and returns its id. */
static long long insert_row(const char *exchange, const char *routing_key, const char *biz_key,
                            const char *content_type, const char *body)
{
    harness_sql(&F.h,
                "INSERT INTO idemq_outbox (source_biz_key, handler_name, emit_name, biz_key, "
                "exchange, routing_key, content_type, body) VALUES ('src:%s', 'orders', "
                "'shipped', '%s', '%s', '%s', '%s', '%s')",
                biz_key, biz_key, exchange, routing_key, content_type, body);
    return harness_scalar(&F.h, "SELECT LAST_INSERT_ID()");
}

static long long count_state(int state)
{
    return harness_scalar(&F.h, "SELECT COUNT(*) FROM idemq_outbox WHERE state = %d", state);
}

typedef bool (*stats_pred)(const outbox_relay_stats *s, void *arg);

/* Polls r's stats (harness_wait_for: every 20 ms) until pred holds; returns the ms it took, or -1
 * after timeout_ms
 * (*last: the last stats read). */
typedef struct stats_wait {
    outbox_relay *r;
    stats_pred pred;
    void *arg;
    outbox_relay_stats *last;
} stats_wait;

static bool stats_hold(harness *h, void *arg)
{
    (void)h;
    stats_wait *w = arg;
    outbox_relay_read(w->r, w->last);
    return w->pred(w->last, w->arg);
}

static int64_t wait_stats(outbox_relay *r, stats_pred pred, void *arg, int timeout_ms,
                          outbox_relay_stats *last)
{
    int64_t start = harness_now_ms();
    stats_wait w = {.r = r, .pred = pred, .arg = arg, .last = last};
    if (!harness_wait_for(stats_hold, &F.h, &w, timeout_ms))
        return -1;
    return harness_now_ms() - start;
}

static bool is_leader_connected(const outbox_relay_stats *s, void *arg)
{
    (void)arg;
    return s->leader && s->connected;
}

static bool is_leader(const outbox_relay_stats *s, void *arg)
{
    (void)arg;
    return s->leader;
}

static bool db_connected(const outbox_relay_stats *s, void *arg)
{
    (void)arg;
    return s->db_connected;
}

static bool scanned_once(const outbox_relay_stats *s, void *arg)
{
    (void)arg;
    return s->scans >= 1;
}

static bool pending_is(const outbox_relay_stats *s, void *arg)
{
    return s->pending == *(uint64_t *)arg;
}

static bool disconnected(const outbox_relay_stats *s, void *arg)
{
    (void)arg;
    return !s->connected;
}

typedef struct totals {
    uint64_t published, unroutable;
} totals;

static bool totals_are(const outbox_relay_stats *s, void *arg)
{
    const totals *t = arg;
    return s->published_total == t->published && s->unroutable_total == t->unroutable;
}

/* The counters move just after the marks commit: a test that saw the rows marked waits for
 * them. */
static void wait_totals(outbox_relay *r, uint64_t published, uint64_t unroutable)
{
    outbox_relay_stats s;
    totals t = {published, unroutable};
    cr_assert(wait_stats(r, totals_are, &t, 3000, &s) >= 0,
              "published_total %llu (expected %llu), unroutable_total %llu (expected %llu)",
              (unsigned long long)s.published_total, (unsigned long long)published,
              (unsigned long long)s.unroutable_total, (unsigned long long)unroutable);
}

static void wait_leader(outbox_relay *r, int timeout_ms)
{
    outbox_relay_stats s;
    cr_assert(wait_stats(r, is_leader_connected, NULL, timeout_ms, &s) >= 0,
              "the relay did not become leader and connect within %d ms: leader %d connected %d, "
              "last error: %s",
              timeout_ms, s.leader, s.connected, s.last_error);
}

static void wait_pending(outbox_relay *r, uint64_t pending, int timeout_ms)
{
    outbox_relay_stats s;
    cr_assert(wait_stats(r, pending_is, &pending, timeout_ms, &s) >= 0,
              "stats.pending is %llu, not %llu, after %d ms (last error: %s)",
              (unsigned long long)s.pending, (unsigned long long)pending, timeout_ms, s.last_error);
}

/* One message from queue, waiting up to timeout_ms; false when none came. */
static bool get_message(const char *queue, amqp_message_t *msg, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        if (harness_get(&F.h, queue, msg))
            return true;
        if (harness_now_ms() > deadline)
            return false;
        pause_ms(2);
    }
}

static int64_t outbox_id_of(const amqp_message_t *msg)
{
    int64_t id = -1;
    cr_assert(message_header_int(&msg->properties, OUTBOX_HEADER_OUTBOX_ID, &id),
              "a relayed message without %s", OUTBOX_HEADER_OUTBOX_ID);
    return id;
}

static void expect_string_header(const amqp_message_t *msg, const char *name, const char *value)
{
    amqp_bytes_t got;
    cr_assert(message_header_bytes(&msg->properties, name, &got), "header %s missing", name);
    cr_expect(got.len == strlen(value) && memcmp(got.bytes, value, got.len) == 0,
              "header %s is '%.*s', not '%s'", name, (int)got.len, (const char *)got.bytes, value);
}

/* Reads every message of queue (waiting up to timeout_ms for `expected`, then 300 ms for any
 * more) into ids (capacity cap); returns how many. */
static size_t drain_ids(const char *queue, size_t expected, int timeout_ms, int64_t *ids,
                        size_t cap)
{
    size_t n = 0;
    amqp_message_t msg;
    while (n < expected && get_message(queue, &msg, timeout_ms)) {
        cr_assert(n < cap);
        ids[n++] = outbox_id_of(&msg);
        amqp_destroy_message(&msg);
    }
    while (get_message(queue, &msg, 300)) {
        cr_assert(n < cap, "more messages than expected in %s", queue);
        ids[n++] = outbox_id_of(&msg);
        amqp_destroy_message(&msg);
    }
    return n;
}

/* ------------------------------------------------------------------------------------ publish */

Test(outbox_relay, pending_rows_go_out_in_id_order_with_properties_and_are_marked)
{
    setup("outbox_publish", &(relay_settings){0});
    const char *ex = declare_exchange("x");
    const char *q = declare_queue("q", ex, "shipments");
    long long ids[5];
    char key[64], body[64];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "emit-key-%d", i);
        snprintf(body, sizeof body, "{\"biz_key\":\"emit-key-%d\",\"n\":%d}", i, i);
        ids[i] = insert_row(ex, "shipments", key,
                            i % 2 ? "application/msgpack" : "application/json", body);
    }
    cr_assert_eq(count_state(0), 5);
    outbox_relay *r = start_relay(0, "relay-publish");
    cr_assert(harness_wait_scalar(&F.h, 5, 10000,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1 AND "
                                  "published_at IS NOT NULL AND attempts = 0"),
              "the rows were not published and marked");

    for (int i = 0; i < 5; i++) {
        amqp_message_t msg;
        cr_assert(get_message(q, &msg, 5000), "message %d did not arrive", i);
        snprintf(key, sizeof key, "emit-key-%d", i);
        snprintf(body, sizeof body, "{\"biz_key\":\"emit-key-%d\",\"n\":%d}", i, i);
        const amqp_basic_properties_t *p = &msg.properties;
        cr_expect_eq(outbox_id_of(&msg), ids[i], "message %d has outbox id %lld, not %lld (order)",
                     i, (long long)outbox_id_of(&msg), ids[i]);
        cr_expect(msg.body.len == strlen(body) && memcmp(msg.body.bytes, body, msg.body.len) == 0,
                  "body %d changed", i);
        cr_expect(p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG);
        cr_expect(harness_bytes_eq(p->message_id, amqp_cstring_bytes(key)),
                  "message_id is not the row's biz_key");
        cr_expect(harness_bytes_eq(
            p->content_type,
            amqp_cstring_bytes(i % 2 ? "application/msgpack" : "application/json")));
        cr_expect(harness_bytes_eq(p->app_id, amqp_cstring_bytes("idemq")));
        cr_expect_eq(p->delivery_mode, 2);
        long long created = harness_scalar(
            &F.h, "SELECT FLOOR(UNIX_TIMESTAMP(created_at)) FROM idemq_outbox WHERE id = %lld",
            ids[i]);
        cr_expect(p->_flags & AMQP_BASIC_TIMESTAMP_FLAG);
        cr_expect_eq((long long)p->timestamp, created, "timestamp %llu, created_at %lld",
                     (unsigned long long)p->timestamp, created);
        char source[80];
        snprintf(source, sizeof source, "src:%s", key);
        expect_string_header(&msg, OUTBOX_HEADER_SOURCE_BIZ_KEY, source);
        expect_string_header(&msg, OUTBOX_HEADER_HANDLER, "orders");
        expect_string_header(&msg, OUTBOX_HEADER_EMIT, "shipped");
        amqp_destroy_message(&msg);
    }
    amqp_message_t extra;
    cr_assert_not(get_message(q, &extra, 300), "a row was published twice");

    wait_pending(r, 0, 3000);
    wait_totals(r, 5, 0);
    outbox_relay_stats s;
    outbox_relay_read(r, &s);
    cr_assert(s.leader && s.connected && s.db_connected);
    cr_assert_eq(s.oldest_pending_s, 0);
    char reason[256];
    cr_assert_not(outbox_relay_stuck(r, reason, sizeof reason), "%s", reason);
}

/* Rows inserted behind the relay's back: no notify, and a poll interval of a minute. A full
 * round must be followed by the next at once, so the backlog drains well within that minute. */
Test(outbox_relay, a_backlog_drains_in_full_batches_in_order_large_bodies_included)
{
    setup("outbox_backlog", &(relay_settings){.batch = 256, .poll_ms = 60000});
    const char *q = declare_queue("q", NULL, NULL);
    enum { ROWS = 3000, LARGE_AT = 1000, LARGE = 300000 };
    /* One statement per 500 rows; row LARGE_AT gets a body larger than frame_max (131072). */
    for (int start = 0; start < ROWS; start += 500) {
        char *sql = malloc(500 * 200 + 256);
        cr_assert(sql);
        int n = sprintf(sql, "INSERT INTO idemq_outbox (source_biz_key, handler_name, emit_name, "
                             "biz_key, exchange, routing_key, content_type, body) VALUES ");
        for (int i = start; i < start + 500; i++)
            n += sprintf(sql + n,
                         "%s('src:%d', 'orders', 'shipped', 'emit-bulk-%d', '', '%s', "
                         "'application/json', %s)",
                         i == start ? "" : ",", i, i, q,
                         i == LARGE_AT ? "REPEAT('a', 300000)" : "'{}'");
        harness_sql(&F.h, "%s", sql);
        free(sql);
    }
    long long first = harness_scalar(&F.h, "SELECT MIN(id) FROM idemq_outbox");
    int64_t t0 = harness_now_ms();
    outbox_relay *r = start_relay(0, "relay-backlog");
    cr_assert(
        harness_wait_scalar(&F.h, 0, 30000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
        "the backlog did not drain within half the poll interval");
    int64_t drained = harness_now_ms() - t0;
    wait_totals(r, ROWS, 0);
    amqp_message_t msg;
    for (int i = 0; i < ROWS; i++) {
        cr_assert(get_message(q, &msg, 5000), "message %d missing", i);
        cr_assert_eq(outbox_id_of(&msg), first + i, "out of order at %d", i);
        if (i == LARGE_AT)
            cr_assert_eq(msg.body.len, LARGE, "the large body arrived with %zu bytes",
                         msg.body.len);
        amqp_destroy_message(&msg);
    }
    cr_assert_not(get_message(q, &msg, 300), "more messages than rows");
    outbox_relay_stats s;
    outbox_relay_read(r, &s);
    cr_log_info("backlog: %d rows (batch 256, one body of %d bytes) published and marked in %lld "
                "ms from the relay's start (%.0f rows/s), %llu rounds",
                ROWS, LARGE, (long long)drained, ROWS * 1000.0 / (double)(drained ? drained : 1),
                (unsigned long long)s.rounds);
    cr_assert_geq(s.rounds, (ROWS + 255) / 256);
}

Test(outbox_relay, a_row_is_marked_only_after_its_confirm)
{
    setup("outbox_after_confirm", &(relay_settings){.through_proxy = true});
    const char *q = declare_queue("q", NULL, NULL);
    outbox_relay *r = start_relay(0, "relay-confirm");
    wait_leader(r, 10000);
    /* Frozen: the publish is written into the proxy, but nothing comes back, no confirm. */
    freeze_proxy_freeze(proxy);
    long long id = insert_row("", q, "emit-after-confirm", "application/json", "{}");
    outbox_relay_notify(r);
    int64_t frozen_at = harness_now_ms();
    bool marked_while_frozen = false;
    while (harness_now_ms() - frozen_at < 2000) {
        marked_while_frozen |= harness_scalar(&F.h,
                                              "SELECT state FROM idemq_outbox WHERE id = "
                                              "%lld",
                                              id) != 0;
        pause_ms(20);
    }
    cr_assert_not(marked_while_frozen, "the row was marked without a confirm");
    cr_assert_eq(harness_queue_depth(&F.h, q), 0, "the broker got the message while frozen");
    freeze_proxy_thaw(proxy);
    cr_assert(
        harness_wait_scalar(&F.h, 1, 5000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"),
        "the row was not marked after the thaw");
    int64_t ids[4];
    size_t n = drain_ids(q, 1, 5000, ids, 4);
    cr_assert_eq(n, 1, "%zu messages (a thaw within the confirm timeout must not republish)", n);
    cr_assert_eq(ids[0], id);
}

/* ------------------------------------------------------------------------------------- notify */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

Test(outbox_relay, notify_publishes_at_once_while_the_poll_interval_is_a_minute)
{
    setup("outbox_notify", &(relay_settings){.poll_ms = 60000, .lease_ms = 30000});
    const char *q = declare_queue("q", NULL, NULL);
    outbox_relay *r = start_relay(0, "relay-notify");
    wait_leader(r, 10000);
    /* The first scan (made at connect) has passed: the next poll is a minute away. */
    outbox_relay_stats st;
    cr_assert(wait_stats(r, scanned_once, NULL, 10000, &st) >= 0, "the relay never looked for rows");
    long long silent = insert_row("", q, "emit-silent", "application/json", "{}");
    pause_ms(700);
    cr_assert_eq(harness_scalar(&F.h, "SELECT state FROM idemq_outbox WHERE id = %lld", silent), 0,
                 "a row nobody announced went out before the poll interval");
    cr_assert_eq(harness_queue_depth(&F.h, q), 0);

    enum { ROUNDS = 10 };
    int64_t latency[ROUNDS];
    amqp_message_t msg;
    for (int i = 0; i < ROUNDS; i++) {
        char key[32];
        snprintf(key, sizeof key, "emit-notify-%d", i);
        insert_row("", q, key, "application/json", "{}");
        int64_t t0 = harness_now_ms();
        outbox_relay_notify(r);
        cr_assert(get_message(q, &msg, 2000), "round %d: nothing arrived within 2 s of the notify",
                  i);
        latency[i] = harness_now_ms() - t0;
        if (i == 0) { /* the round takes every pending row: the silent one comes first */
            cr_assert_eq(outbox_id_of(&msg), silent);
            amqp_destroy_message(&msg);
            cr_assert(get_message(q, &msg, 2000));
        }
        cr_assert(harness_bytes_eq(msg.properties.message_id, amqp_cstring_bytes(key)),
                  "round %d: another message", i);
        amqp_destroy_message(&msg);
    }
    qsort(latency, ROUNDS, sizeof latency[0], cmp_i64);
    cr_log_info("notify -> arrival (in the test's queue, by basic.get polling every 2 ms), "
                "%d rounds: min %lld ms, median %lld ms, max %lld ms",
                ROUNDS, (long long)latency[0], (long long)latency[ROUNDS / 2],
                (long long)latency[ROUNDS - 1]);
    cr_assert_lt(latency[ROUNDS - 1], 2000);
}

/* --------------------------------------------------------------------------------- unroutable */

/* Whether row id is state 2 with last_error LIKE like (borrowed; single quotes are doubled
 * here). */
static bool error_like(long long id, const char *like)
{
    char quoted[1024];
    size_t n = 0;
    for (const char *p = like; *p && n + 2 < sizeof quoted; p++) {
        if (*p == '\'')
            quoted[n++] = '\'';
        quoted[n++] = *p;
    }
    quoted[n] = '\0';
    return harness_scalar(&F.h,
                          "SELECT COUNT(*) FROM idemq_outbox WHERE id = %lld AND state = 2 AND "
                          "last_error LIKE '%s'",
                          id, quoted) == 1;
}

Test(outbox_relay, unroutable_rows_and_missing_exchanges_are_set_aside_and_the_rest_goes_out)
{
    setup("outbox_unroutable", &(relay_settings){0});
    const char *unbound = declare_exchange("unbound");
    const char *ok = declare_exchange("ok");
    const char *q = declare_queue("q", ok, "k");
    char missing[160];
    snprintf(missing, sizeof missing, "%s.missing", F.h.queue);
    long long r1 = insert_row(unbound, "nokey", "emit-u1", "application/json", "{}");
    long long r2 = insert_row(ok, "k", "emit-u2", "application/json", "{}");
    long long r3 = insert_row(missing, "k", "emit-u3", "application/json", "{}");
    long long r4 = insert_row(ok, "k", "emit-u4", "application/json", "{}");
    outbox_relay *r = start_relay(0, "relay-unroutable");
    cr_assert(
        harness_wait_scalar(&F.h, 0, 10000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
        "rows still pending");
    char like[512];
    snprintf(like, sizeof like, "unroutable: 312 NO\\_ROUTE (exchange '%s', routing key 'nokey')",
             unbound);
    cr_assert(error_like(r1, like), "row 1: %lld, last_error not like %s",
              harness_scalar(&F.h, "SELECT state FROM idemq_outbox WHERE id = %lld", r1), like);
    snprintf(like, sizeof like, "exchange not found: 404 NOT\\_FOUND - no exchange '%s'%%",
             missing);
    cr_assert(error_like(r3, like), "row 3 is not marked with the 404");
    cr_assert_eq(harness_scalar(&F.h,
                                "SELECT COUNT(*) FROM idemq_outbox WHERE id IN (%lld, %lld) "
                                "AND state = 1",
                                r2, r4),
                 2);
    int64_t got[8];
    size_t n = drain_ids(q, 2, 5000, got, 8);
    cr_assert_eq(n, 2);
    cr_assert(got[0] == r2 && got[1] == r4, "order %lld, %lld", (long long)got[0],
              (long long)got[1]);
    wait_totals(r, 2, 2);
    outbox_relay_stats s;
    outbox_relay_read(r, &s);
    cr_assert(strstr(s.last_error, "row "), "last error: %s", s.last_error);

    /* An exchange deleted after the relay saw it: the broker closes the channel at the publish. */
    const char *gone = declare_exchange("gone");
    amqp_queue_bind(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(q), amqp_cstring_bytes(gone),
                    amqp_cstring_bytes("k"), amqp_empty_table);
    check_reply("queue.bind");
    long long r5 = insert_row(gone, "k", "emit-u5", "application/json", "{}");
    outbox_relay_notify(r);
    cr_assert(harness_wait_scalar(&F.h, 1, 5000,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1 AND id = "
                                  "(SELECT MAX(id) FROM idemq_outbox)"));
    amqp_exchange_delete(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(gone), 0);
    check_reply("exchange.delete");
    long long r6 = insert_row(gone, "k", "emit-u6", "application/json", "{}");
    long long r7 = insert_row(ok, "k", "emit-u7", "application/json", "{}");
    long long r8 = insert_row(ok, "k", "emit-u8", "application/json", "{}");
    outbox_relay_notify(r);
    cr_assert(
        harness_wait_scalar(&F.h, 0, 10000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
        "rows still pending after the channel close");
    snprintf(like, sizeof like, "exchange not found: 404 NOT\\_FOUND - no exchange '%s'%%", gone);
    cr_assert(error_like(r6, like), "row 6 is not marked with the 404: state %lld",
              harness_scalar(&F.h, "SELECT state FROM idemq_outbox WHERE id = %lld", r6));
    n = drain_ids(q, 3, 5000, got, 8);
    cr_assert_eq(n, 3, "%zu messages after the channel close", n);
    cr_assert(got[0] == r5 && got[1] == r7 && got[2] == r8, "order %lld %lld %lld",
              (long long)got[0], (long long)got[1], (long long)got[2]);
    wait_totals(r, 5, 3);
    outbox_relay_read(r, &s);
    cr_assert(s.connected, "the relay dropped its connection over a channel error");
}

/* --------------------------------------------------------------------------------- two relays */

Test(outbox_relay, two_relays_one_leader_and_the_standby_takes_over_when_it_stops)
{
    setup("outbox_two_relays", &(relay_settings){.poll_ms = 100, .lease_ms = 2000});
    const char *q = declare_queue("q", NULL, NULL);
    outbox_relay *a = start_relay(0, "relay-a");
    wait_leader(a, 10000);
    outbox_relay *b = start_relay(1, "relay-b");
    outbox_relay_stats sa, sb;
    cr_assert(wait_stats(b, db_connected, NULL, 10000, &sb) >= 0);
    /* Over a whole lease (and renewals), never two leaders. */
    for (int64_t t0 = harness_now_ms(); harness_now_ms() - t0 < 2500; pause_ms(20)) {
        outbox_relay_read(a, &sa);
        outbox_relay_read(b, &sb);
        cr_assert(sa.leader && !sb.leader, "leaders: a %d, b %d", sa.leader, sb.leader);
        cr_assert_not(sb.connected, "a standby holds no AMQP connection");
    }
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof key, "emit-two-%02d", i);
        insert_row("", q, key, "application/json", "{}");
        outbox_relay_notify(a);
        outbox_relay_notify(b);
    }
    cr_assert(
        harness_wait_scalar(&F.h, 20, 10000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"));
    wait_totals(a, 20, 0);
    wait_totals(b, 0, 0);

    int64_t t0 = harness_now_ms();
    stop_relay(0);
    int64_t stop_ms = harness_now_ms() - t0;
    int64_t took = wait_stats(b, is_leader_connected, NULL, 10000, &sb);
    cr_assert(took >= 0, "the standby did not take over: %s", sb.last_error);
    cr_log_info("leader stop took %lld ms; the standby led and was connected %lld ms later "
                "(lease 2000 ms, standby attempts every 100 ms)",
                (long long)stop_ms, (long long)took);
    cr_assert_lt(stop_ms, 5500);
    cr_assert_lt(took, 2000, "took %lld ms: the released lease was not taken at once",
                 (long long)took);
    for (int i = 20; i < 40; i++) {
        char key[32];
        snprintf(key, sizeof key, "emit-two-%02d", i);
        insert_row("", q, key, "application/json", "{}");
        outbox_relay_notify(b);
    }
    cr_assert(
        harness_wait_scalar(&F.h, 40, 10000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"));
    wait_totals(b, 20, 0);
    int64_t ids[64];
    size_t n = drain_ids(q, 40, 5000, ids, 64);
    size_t duplicates = 0;
    for (size_t i = 1; i < n; i++) {
        cr_assert(ids[i] >= ids[i - 1], "out of order at %zu: %lld after %lld", i,
                  (long long)ids[i], (long long)ids[i - 1]);
        duplicates += ids[i] == ids[i - 1];
    }
    cr_log_info("two relays: %zu messages for 40 rows, %zu duplicate(s)", n, duplicates);
    cr_assert_eq(duplicates, 0);
    cr_assert_eq(n, 40);
}

/* -------------------------------------------------------------------------------- broker down */

static bool stuck_now(outbox_relay *r, char *reason, size_t len)
{
    return outbox_relay_stuck(r, reason, len);
}

Test(outbox_relay, rows_wait_while_the_broker_is_down_and_drain_in_order_after)
{
    setup("outbox_broker_down",
          &(relay_settings){.through_proxy = true, .poll_ms = 100, .stuck_ms = 2000});
    const char *q = declare_queue("q", NULL, NULL);
    outbox_relay *r = start_relay(0, "relay-down");
    wait_leader(r, 10000);
    insert_row("", q, "emit-before", "application/json", "{}");
    outbox_relay_notify(r);
    int64_t ids[32];
    cr_assert_eq(drain_ids(q, 1, 5000, ids, 32), 1);

    /* Down: every connection reset, new ones refused. */
    char err[256];
    cr_assert(freeze_proxy_refuse(proxy, true, err, sizeof err) == 0, "%s", err);
    freeze_proxy_drop(proxy);
    int64_t down_at = harness_now_ms();
    outbox_relay_stats s;
    cr_assert(wait_stats(r, disconnected, NULL, 3000, &s) >= 0, "the relay did not notice");
    long long first = 0, last = 0;
    for (int i = 0; i < 10; i++) {
        char key[32];
        snprintf(key, sizeof key, "emit-down-%d", i);
        last = insert_row("", q, key, "application/json", "{}");
        if (i == 0)
            first = last;
        outbox_relay_notify(r);
        pause_ms(300);
    }
    wait_pending(r, 10, 3000);
    cr_assert_eq(count_state(0), 10);
    char reason[512];
    while (harness_now_ms() - down_at < 5000)
        pause_ms(50);
    outbox_relay_read(r, &s);
    cr_assert(!s.connected && s.leader, "connected %d leader %d", s.connected, s.leader);
    cr_assert(s.last_error[0], "no error recorded");
    cr_assert_gt(s.oldest_pending_s, 2.0);
    cr_assert(stuck_now(r, reason, sizeof reason), "not stuck with a %.1f s old row",
              s.oldest_pending_s);
    cr_assert(strstr(reason, "outbox relay stuck: the oldest pending row is"), "%s", reason);
    cr_log_info("while down %lld ms: pending %llu, oldest %.1f s, stuck: %s",
                (long long)(harness_now_ms() - down_at), (unsigned long long)s.pending,
                s.oldest_pending_s, reason);
    cr_assert_eq(harness_queue_depth(&F.h, q), 0);

    cr_assert(freeze_proxy_refuse(proxy, false, err, sizeof err) == 0, "%s", err);
    int64_t up_at = harness_now_ms();
    cr_assert(
        harness_wait_scalar(&F.h, 0, 15000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
        "the rows did not drain after the broker came back");
    int64_t drained = harness_now_ms() - up_at;
    size_t n = drain_ids(q, 10, 5000, ids, 32);
    cr_assert_eq(n, 10, "%zu messages for 10 rows", n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], first + (long long)i, "out of order at %zu", i);
    cr_assert_eq(ids[n - 1], last);
    wait_pending(r, 0, 3000);
    cr_assert_not(stuck_now(r, reason, sizeof reason), "still stuck: %s", reason);
    wait_totals(r, 11, 0);
    outbox_relay_read(r, &s);
    cr_log_info("broker back: 10 rows drained %lld ms after the restore (reconnect backoff "
                "included), published_total %llu",
                (long long)drained, (unsigned long long)s.published_total);
}

/* -------------------------------------------------------------------------------------- crash */

Test(outbox_relay, a_crash_between_confirm_and_mark_republishes_and_loses_nothing)
{
    setup("outbox_crash", &(relay_settings){.lease_ms = 1500});
    const char *q = declare_queue("q", NULL, NULL);
    long long first = 0;
    for (int i = 0; i < 5; i++) {
        char key[32];
        snprintf(key, sizeof key, "emit-crash-%d", i);
        long long id = insert_row("", q, key, "application/json", "{}");
        if (i == 0)
            first = id;
    }
    db_dsn dsn = test_dsn();
    fflush(NULL);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        /* The child only runs a relay until its hook kills it; it never touches the harness. */
        char err[256];
        outbox_relay *r;
        setenv(OUTBOX_RELAY_KILL_ENV, "1", 1);
        if (outbox_relay_start(&cfg, &dsn, "relay-crashing", &r, err, sizeof err) != 0)
            _exit(2);
        pause_ms(20000);
        _exit(3);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "the relay was not killed by its hook (status 0x%x)", status);
    cr_assert_eq(count_state(0), 5, "rows were marked before the kill");
    cr_assert(harness_wait_queue_depth(&F.h, q, 5, 5000), "the confirmed messages are not there");

    /* Another instance: the dead one's lease must lapse first. */
    int64_t t0 = harness_now_ms();
    outbox_relay *r = start_relay(0, "relay-after-crash");
    outbox_relay_stats s;
    int64_t took = wait_stats(r, is_leader, NULL, 10000, &s);
    cr_assert(took >= 0);
    cr_assert(
        harness_wait_scalar(&F.h, 5, 10000, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"));
    int64_t republished = harness_now_ms() - t0;
    int64_t ids[32];
    size_t n = drain_ids(q, 10, 5000, ids, 32);
    cr_assert_eq(n, 10, "%zu messages: each of the 5 rows twice expected", n);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(ids[i], first + i, "first publish out of order at %d", i);
        cr_assert_eq(ids[5 + i], first + i, "second publish out of order at %d", i);
    }
    cr_log_info("after the crash: leader after %lld ms (lease 1500 ms), all 5 rows republished "
                "and marked %lld ms after the start; 5 duplicates, 0 lost",
                (long long)took, (long long)republished);
}

/* ---------------------------------------------------------------------------------- retention */

Test(outbox_relay, published_rows_are_deleted_after_retention_and_at_once_with_zero)
{
    setup("outbox_retention", &(relay_settings){.retention_ms = 1000});
    const char *q = declare_queue("q", NULL, NULL);
    /* A row published long ago (by an earlier run), one pending. */
    harness_sql(&F.h, "INSERT INTO idemq_outbox (source_biz_key, handler_name, emit_name, biz_key, "
                      "exchange, routing_key, content_type, body, state, published_at) VALUES "
                      "('s', 'h', 'e', 'emit-old', '', 'x', 'application/json', '{}', 1, "
                      "NOW(3) - INTERVAL 1 HOUR)");
    insert_row("", q, "emit-new", "application/json", "{}");
    outbox_relay *r = start_relay(0, "relay-retention");
    cr_assert(harness_wait_scalar(&F.h, 0, 5000,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE biz_key = 'emit-old'"),
              "the old published row was not deleted");
    cr_assert(harness_wait_scalar(&F.h, 1, 5000,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE biz_key = 'emit-new' "
                                  "AND state = 1"),
              "the new row was not published (or deleted before its retention)");
    stop_relay(0);

    cfg.outbox.retention_ms = 0;
    r = start_relay(0, "relay-retention-zero");
    long long id = insert_row("", q, "emit-zero", "application/json", "{}");
    outbox_relay_notify(r);
    cr_assert(harness_wait_scalar(&F.h, 0, 5000,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE biz_key = 'emit-zero'"),
              "with retention 0 the row is not deleted at the confirm");
    int64_t ids[4];
    cr_assert_eq(drain_ids(q, 2, 5000, ids, 4), 2);
    cr_assert_eq(ids[1], id);
}

/* --------------------------------------------------------------------------------------- nack */

/* The relay runs only while the test does not read the queue. A get that lands between two
 * publishes of one round makes room for the second while the first was nacked, and then the row
 * behind a nacked one overtakes it: relay.h allows that, so a test that reads during a round
 * asserts on the scheduler (it once saw the last row go out on its first retry). */
Test(outbox_relay, nacked_rows_stay_pending_and_go_out_in_order_once_there_is_room)
{
    setup("outbox_nack", &(relay_settings){0});
    const char *q = track("q", true);
    amqp_table_entry_t args[2] = {
        {.key = amqp_cstring_bytes("x-max-length"),
         .value = {.kind = AMQP_FIELD_KIND_I32, .value.i32 = 1}},
        {.key = amqp_cstring_bytes("x-overflow"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8,
                   .value.bytes = amqp_cstring_bytes("reject-publish")}},
    };
    amqp_queue_declare(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(q), 0, 1, 0, 0,
                       (amqp_table_t){.num_entries = 2, .entries = args});
    check_reply("queue.declare");
    long long first = insert_row("", q, "emit-nack-0", "application/json", "{}");
    insert_row("", q, "emit-nack-1", "application/json", "{}");
    insert_row("", q, "emit-nack-2", "application/json", "{}");
    start_relay(0, "relay-nack");
    cr_assert(harness_wait_scalar(&F.h, 2, 10000,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0 AND "
                                  "attempts >= 1 AND last_error LIKE 'nacked by the broker%'"),
              "the nacked rows are not pending with their attempt and error");
    cr_assert_eq(harness_scalar(&F.h, "SELECT state FROM idemq_outbox WHERE id = %lld", first), 1);
    stop_relay(0);
    /* Room for one at a time: each run of the relay gets the next row through, in id order, and
     * the row behind it is nacked again. */
    amqp_message_t msg;
    for (long long i = 0; i < 3; i++) {
        cr_assert(get_message(q, &msg, 10000), "message %lld did not come", i);
        int64_t id = outbox_id_of(&msg);
        amqp_destroy_message(&msg);
        cr_assert_eq(id, first + i, "out of order at %lld", i);
        if (i == 2)
            break;
        outbox_relay *r = start_relay(0, "relay-nack");
        long long next = first + i + 1;
        long long behind = i == 0 ? 1 : 0;
        char sql[256];
        snprintf(sql, sizeof sql,
                 "SELECT COUNT(*) FROM idemq_outbox WHERE (id = %lld AND state = 1) OR "
                 "(id = %lld AND state = 0 AND attempts >= 2)",
                 next, next + 1);
        cr_assert(harness_wait_scalar(&F.h, 1 + behind, 10000, sql),
                  "row %lld did not go out (or the row behind it was not nacked again)", next);
        wait_totals(r, 1, 0);
        stop_relay(0);
    }
    cr_assert_not(get_message(q, &msg, 300), "a row went out twice");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"), 3);
    long long attempts =
        harness_scalar(&F.h, "SELECT attempts FROM idemq_outbox WHERE id = %lld", first + 2);
    cr_log_info("nack: the last row went out after %lld nacked attempt(s)", attempts);
}

/* ----------------------------------------------------------------------------- hung database */

typedef struct stuck_wait {
    outbox_relay *r;
    char *reason; /* gets outbox_relay_stuck's reason */
    size_t len;
} stuck_wait;

static bool relay_stuck(harness *h, void *arg)
{
    (void)h;
    stuck_wait *w = arg;
    return outbox_relay_stuck(w->r, w->reason, w->len);
}

Test(outbox_relay, a_hung_database_shows_as_stuck_and_stop_stays_bounded)
{
    setup("outbox_hung_db", &(relay_settings){.db_through_proxy = true, .stuck_ms = 2000});
    declare_queue("q", NULL, NULL);
    outbox_relay *r = start_relay(0, "relay-hung");
    wait_leader(r, 10000);
    char reason[512];
    cr_assert_not(outbox_relay_stuck(r, reason, sizeof reason), "%s", reason);
    freeze_proxy_freeze(proxy);
    int64_t frozen_at = harness_now_ms();
    stuck_wait sw = {.r = r, .reason = reason, .len = sizeof reason};
    bool stuck = harness_wait_for(relay_stuck, &F.h, &sw, 8000);
    int64_t took = harness_now_ms() - frozen_at;
    cr_assert(stuck, "not stuck %lld ms into a frozen database", (long long)took);
    cr_assert(strstr(reason, "its thread has not finished a round"), "%s", reason);
    cr_log_info("frozen database: stuck after %lld ms (stuck_after 2000 ms): %s", (long long)took,
                reason);
    int64_t t0 = harness_now_ms();
    stop_relay(0);
    int64_t stop_ms = harness_now_ms() - t0;
    cr_log_info("stop with the database frozen took %lld ms", (long long)stop_ms);
    cr_assert_lt(stop_ms, 6500);
    freeze_proxy_thaw(proxy);
}
