/*
 * test_delivery_limit — holds, shutdowns and reconnects must not push messages past a quorum work
 * queue's delivery limit (issue 20, item 4), against RabbitMQ 4.x and MariaDB, driving the real
 * idemq binary.
 *
 * RabbitMQ 4.3 counts a failed delivery attempt (x-delivery-count, which x-delivery-limit is
 * checked against) for basic.reject(requeue=true) and for a delivery left unacked when its
 * channel or connection closes, but not for basic.nack(requeue=true); x-acquired-count counts
 * every delivery. Before 4.3 every return counted, nack included. idemq gives deliveries back
 * with basic.nack(requeue=true) only (broker_nack_requeue): held messages released at shutdown,
 * deliveries arriving while it shuts down, a copy that could not be published.
 *
 * Each test declares the work queue itself, before idemq starts (declare: passive): a quorum
 * queue with x-delivery-limit DELIVERY_LIMIT whose over-limit messages dead-letter, through the
 * default exchange, to a queue of its own (Q.overlimit) that the test counts. The database
 * "outage" is a schema error (the orders table renamed away): it pauses idemq and holds its
 * deliveries like a server outage does, and touches only this test's database, so the suite can
 * run beside the others (no shared server is stopped; a broker-side close targets only idemq's
 * own connection).
 *
 *   broker_counts_reject_requeue_and_not_nack_requeue (4.x), without idemq: on 4.3 a message
 *     nacked (requeue) more often than the limit stays, one rejected (requeue) past the limit
 *     lands in Q.overlimit; before 4.3 both go over. The route the other tests count catches a
 *     reject-requeue.
 *   a_channel_closed_at_once_after_settling_can_spend_attempts (4.3), without idemq: measures
 *     how many of 40 single nacks a channel close sent right after them undoes — each such
 *     delivery comes back as a closed channel's, one attempt spent — against one
 *     nack(multiple), or a close once the broker shows them ready. Asserted: only that the wait
 *     makes the give-back uncounted.
 *   a_long_hold_returns_nothing (4.x): held through several failed probes, then applied once.
 *   shutdowns_while_paused_give_held_messages_back_uncounted (4.3): the same messages held and
 *     given back at N > limit shutdowns; x-delivery-count must stay 0.
 *   sigterm_under_load_repeatedly_spends_no_attempt (4.3): N > limit SIGTERMs under load; after
 *     each, every message left in the queue has x-delivery-count 0.
 *   Not tested, because it is the broker's: deliveries still on their way from a 4.3 quorum
 *     queue to the channel when a basic.cancel lands are neither delivered nor returned until
 *     the channel closes, and then count (measured with a plain rabbitmq-c client that gives
 *     everything back with one nack after the cancel: up to 31 of 64 came back counted). A
 *     shutdown while a burst arrives can spend one attempt of those.
 *   one_reconnect_spends_one_attempt_of_each_held_message (4.x): measures what a connection the
 *     broker closes costs (it does count on 4.3): one attempt of each held message, none of the
 *     rest; under a limit of 2 they are still applied once.
 *
 * Headers are read by peeking: basic.get without ack on a side channel, then one
 * basic.nack(multiple, requeue) and a wait until the broker shows them ready before the channel
 * closes — on 4.3 that spends nothing (x-acquired-count goes up by one); the tests that peek on
 * 4.0 account for the attempt it spends there. No sleep: every wait is on an observable condition
 * with a deadline. Every test ends with harness_fini (the suite's .fini, and before a skip).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "harness.h"

#define DELIVERY_LIMIT 2
/* A channel of the test's own for basic.get without ack (never 1: the harness's confirm
 * channel). */
#define SIDE_CHANNEL 7
#define OVER_LIMIT_SUFFIX ".overlimit"

#define OUT_REQUEUED "\"outcome\":\"requeued\""
#define OUT_HELD "\"outcome\":\"held\""
#define HELD_GIVEN_BACK "requeued a held message: shutting down while paused"
#define PAUSE_LINE "schema error, pausing consumption"

static harness_fixture F;
static char over_limit[200]; /* Q.overlimit, once declared: deleted at teardown */
static int http_port;        /* the ops endpoint of the idemq started last */

static void teardown(void)
{
    harness_kill_idemq(&F.daemon);
    if (F.ready && over_limit[0] && F.h.amqp) {
        amqp_queue_delete(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(over_limit), 0, 0);
        if (amqp_get_rpc_reply(F.h.amqp).reply_type != AMQP_RESPONSE_NORMAL)
            broker_reopen_channel(F.h.amqp);
    }
    over_limit[0] = '\0';
    http_port = 0;
    harness_fixture_fini(&F);
}

TestSuite(delivery_limit, .fini = teardown);

/* ------------------------------------------------------------------------------ helpers */

/* The broker's version (major * 100 + minor). Below min_version the test is skipped, with why
 * (borrowed) as the reason, after cleaning up (a skip ends the test process at once). */
static int broker_at_least(int min_version, const char *why)
{
    harness_broker_major(&F.h); /* with IDEMQ_TEST_BROKER=4.x, fails on an older broker */
    int version = harness_broker_version(&F.h);
    if (version < min_version) {
        char reason[400];
        snprintf(reason, sizeof reason, "RabbitMQ %d.%d: %s", version / 100, version % 100, why);
        teardown();
        cr_skip_test("%s", reason);
    }
    return version;
}

/* Declares Q.overlimit (a durable classic queue) and the work queue H.queue: a durable quorum
 * queue with x-delivery-limit DELIVERY_LIMIT that dead-letters what goes over it to
 * Q.overlimit through the default exchange. idemq (declare: passive) only checks it. */
static void declare_limited_work_queue(void)
{
    harness *h = &F.h;
    snprintf(over_limit, sizeof over_limit, "%s" OVER_LIMIT_SUFFIX, h->queue);
    amqp_table_entry_t classic = harness_field_text("x-queue-type", "classic");
    amqp_queue_declare(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(over_limit), 0, 1, 0, 0,
                       (amqp_table_t){.num_entries = 1, .entries = &classic});
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL, "cannot declare %s",
              over_limit);
    amqp_table_entry_t args[] = {
        harness_field_text("x-queue-type", "quorum"),
        harness_field_int("x-delivery-limit", DELIVERY_LIMIT),
        harness_field_text("x-dead-letter-exchange", ""),
        harness_field_text("x-dead-letter-routing-key", over_limit),
    };
    amqp_queue_declare(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(h->queue), 0, 1, 0, 0,
                       (amqp_table_t){.num_entries = 4, .entries = args});
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL,
              "cannot declare the quorum work queue %s with x-delivery-limit %d", h->queue,
              DELIVERY_LIMIT);
}

/* What went over the delivery limit. */
static long over_limit_depth(void)
{
    return harness_queue_depth(&F.h, over_limit);
}

/* The fixture: idemq's config with declare: passive (the test declares the work queue). */
static void setup(const char *name, unsigned prefetch)
{
    harness_options o = {
        .declare = "passive", .prefetch = prefetch, .workers = 4, .shutdown_timeout = "20s"};
    harness_fixture_init(&F, name, &o);
}

/* The quorum work queue of DELIVERY_LIMIT, its retry ladder and DLQ (idemq topology), and
 * `orders` rows PAYING for o0..o<orders-1>. */
static void prepare_topology_and_orders(int orders)
{
    declare_limited_work_queue();
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "o", orders, "PAYING");
}

static void start_idemq(void)
{
    harness_start_idemq(&F.h, "started consuming", 20000, &F.daemon);
    http_port = harness_http_port(&F.h, 10000);
}

static void stop_idemq(void)
{
    int status = harness_stop(F.daemon, SIGTERM, 25000);
    F.daemon = 0;
    cr_assert_eq(status, 0, "idemq exited %d after SIGTERM (log: %s)", status, F.h.log_path);
}

/* The schema error that stands in for a database outage. */
static void break_schema(void)
{
    harness_sql(&F.h, "RENAME TABLE orders TO orders_away");
}

static void fix_schema(void)
{
    harness_sql(&F.h, "RENAME TABLE orders_away TO orders");
}

/* idemq_held{queue=Q} of the idemq started last; -1 when it does not answer. */
static long long held_now(void)
{
    char *scrape = NULL, sample[256];
    harness_http_get(http_port, "/metrics", &scrape);
    snprintf(sample, sizeof sample, "idemq_held{queue=\"%s\"}", F.h.queue);
    long long held = harness_metric_value(scrape, sample);
    free(scrape);
    return held;
}

typedef struct held_wait {
    long long want, last;
} held_wait;

static bool held_reached(harness *h, void *arg)
{
    (void)h;
    held_wait *w = arg;
    w->last = held_now();
    return w->last == w->want;
}

static void wait_held(long long want, int timeout_ms)
{
    held_wait w = {.want = want, .last = -1};
    cr_assert(harness_wait_for(held_reached, &F.h, &w, timeout_ms),
              "idemq holds %lld deliveries, want %lld (log: %s)", w.last, want, F.h.log_path);
}

static long long applied(void)
{
    return harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup");
}

static void wait_applied(long long want, int timeout_ms)
{
    cr_assert(harness_wait_scalar(&F.h, want, timeout_ms, "SELECT COUNT(*) FROM msg_dedup"),
              "%lld of %lld events applied (log: %s)", applied(), want, F.h.log_path);
}

/* Every event o0..o<events-1> applied exactly once, nothing over the limit, nothing left. */
static void expect_each_applied_once(int events)
{
    cr_expect_eq(applied(), events, "msg_dedup rows");
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(DISTINCT biz_key) FROM msg_dedup"), events);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), events,
                 "orders PAID");
    cr_expect_eq(harness_scalar(&F.h, "SELECT COALESCE(SUM(amount), 0) FROM orders"),
                 (long long)events * (events - 1) / 2, "the amounts of the PAID orders");
    cr_expect_eq(harness_summary_total(F.h.log_path, "processed"), events,
                 "idemq's summaries: processed (log: %s)", F.h.log_path);
    cr_expect_eq(harness_summary_total(F.h.log_path, "dead_lettered"), 0);
    cr_expect_eq(harness_summary_total(F.h.log_path, "retried"), 0);
    cr_expect_eq(over_limit_depth(), 0, "messages went over x-delivery-limit %d", DELIVERY_LIMIT);
    cr_expect_eq(harness_queue_depth(&F.h, F.h.queue), 0, "messages left in the work queue");
}

/* The schema back, a new idemq applies every event: each once, nothing over the limit. */
static void fix_schema_and_apply_all(int events)
{
    fix_schema();
    int64_t fixed = harness_now_ms();
    start_idemq();
    wait_applied(events, 30000);
    int64_t apply_ms = harness_now_ms() - fixed;
    stop_idemq();
    cr_log_info("then all %d applied %lld ms after the fix", events, (long long)apply_ms);
    expect_each_applied_once(events);
}

/* ---------------------------------------------------------------- reading the broker's counts */

/* One delivery's counts: x-delivery-count and x-acquired-count (0 when absent), and the
 * redelivered flag. */
typedef struct delivery_counts {
    int64_t delivery, acquired;
    bool redelivered;
} delivery_counts;

static void read_counts(const amqp_message_t *m, bool redelivered, delivery_counts *out)
{
    int64_t v;
    out->delivery = message_header_int(&m->properties, "x-delivery-count", &v) ? v : 0;
    out->acquired = message_header_int(&m->properties, "x-acquired-count", &v) ? v : 0;
    out->redelivered = redelivered;
}

static void side_channel_open(void)
{
    amqp_channel_open(F.h.amqp, SIDE_CHANNEL);
    cr_assert(amqp_get_rpc_reply(F.h.amqp).reply_type == AMQP_RESPONSE_NORMAL);
}

/* Closes the side channel. Everything got on it must be settled first: closing it with unacked
 * deliveries would spend one of their attempts. */
static void side_channel_close(void)
{
    amqp_channel_close(F.h.amqp, SIDE_CHANNEL, AMQP_REPLY_SUCCESS);
    cr_assert(amqp_get_rpc_reply(F.h.amqp).reply_type == AMQP_RESPONSE_NORMAL);
}

/* basic.get without ack on the side channel: false when queue is empty; else *tag and *counts. */
static bool side_get(const char *queue, uint64_t *tag, delivery_counts *counts)
{
    amqp_connection_state_t c = F.h.amqp;
    amqp_rpc_reply_t reply = amqp_basic_get(c, SIDE_CHANNEL, amqp_cstring_bytes(queue), 0);
    cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL, "basic.get on %s failed", queue);
    if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
        return false;
    cr_assert_eq(reply.reply.id, AMQP_BASIC_GET_OK_METHOD);
    const amqp_basic_get_ok_t *ok = reply.reply.decoded;
    *tag = ok->delivery_tag;
    bool redelivered = ok->redelivered != 0;
    amqp_message_t m;
    cr_assert(amqp_read_message(c, SIDE_CHANNEL, &m, 0).reply_type == AMQP_RESPONSE_NORMAL);
    read_counts(&m, redelivered, counts);
    amqp_destroy_message(&m);
    amqp_maybe_release_buffers_on_channel(c, SIDE_CHANNEL);
    return true;
}

/* Gives back, with one basic.nack(multiple, requeue), every delivery of the side channel up to
 * last_tag, and waits until queue holds `count` ready messages again. The wait is what keeps the
 * give-back uncounted: closing the channel right after the nack can overtake it on 4.3 (the
 * calibration test measures that), and the deliveries are then returned as a closed channel's,
 * each with one more x-delivery-count. */
static void give_back_all(const char *queue, uint64_t last_tag, long count)
{
    cr_assert_eq(amqp_basic_nack(F.h.amqp, SIDE_CHANNEL, last_tag, 1, 1), AMQP_STATUS_OK);
    cr_assert(harness_wait_queue_depth(&F.h, queue, count, 10000),
              "the %ld deliveries given back are not ready again in %s", count, queue);
}

/* What a peek at a whole queue saw. */
typedef struct peek_result {
    long messages, redelivered;
    long counted; /* messages with x-delivery-count > 0 */
    int64_t delivery_max, acquired_min, acquired_max;
} peek_result;

/* Reads every message of queue (at most `at_most`) without acking, then gives them all back with
 * one basic.nack(multiple, requeue): on 4.3 that spends no delivery attempt (before 4.3 it spends
 * one each). */
static void peek_queue(const char *queue, long at_most, peek_result *out)
{
    memset(out, 0, sizeof *out);
    out->acquired_min = INT64_MAX;
    side_channel_open();
    uint64_t tag, last_tag = 0;
    delivery_counts d;
    while (out->messages < at_most && side_get(queue, &tag, &d)) {
        last_tag = tag;
        out->messages++;
        out->redelivered += d.redelivered;
        out->counted += d.delivery > 0;
        if (d.delivery > out->delivery_max)
            out->delivery_max = d.delivery;
        if (d.acquired < out->acquired_min)
            out->acquired_min = d.acquired;
        if (d.acquired > out->acquired_max)
            out->acquired_max = d.acquired;
    }
    if (last_tag)
        give_back_all(queue, last_tag, out->messages);
    side_channel_close();
    if (!out->messages)
        out->acquired_min = 0;
}

/* ------------------------------------------------------------------------------ the tests */

/* The calibration: what RabbitMQ counts, on the very queue shape the other tests use. */
Test(delivery_limit, broker_counts_reject_requeue_and_not_nack_requeue, .timeout = 60)
{
    setup("dl_calibrate", 0);
    int version = broker_at_least(400, "x-delivery-limit is a RabbitMQ 4.x concern (3.x has no "
                                       "default limit, and counts every return)");
    declare_limited_work_queue();
    const char *q = F.h.queue;
    const int returns = DELIVERY_LIMIT + 2;

    /* basic.nack(requeue=true), limit + 2 times. */
    harness_publish(&F.h, NULL, "application/json", "{\"probe\":\"nack\"}", 16, NULL);
    side_channel_open();
    int nacked = 0;
    delivery_counts d[DELIVERY_LIMIT + 3];
    for (; nacked < returns; nacked++) {
        uint64_t tag;
        if (!side_get(q, &tag, &d[nacked]))
            break;
        cr_assert_eq(amqp_basic_nack(F.h.amqp, SIDE_CHANNEL, tag, 0, 1), AMQP_STATUS_OK);
    }
    /* Closing the channel right after the last nack can overtake it (the next test measures
     * that): the message would come back as the closed channel's, one attempt spent. */
    if (version >= 403)
        cr_assert(harness_wait_queue_depth(&F.h, q, 1, 5000),
                  "the nacked message is not ready again");
    side_channel_close();
    for (int i = 0; i < nacked; i++)
        cr_log_info("nack-requeue: delivery %d: x-delivery-count %" PRId64
                    ", x-acquired-count %" PRId64 ", redelivered %d",
                    i + 1, d[i].delivery, d[i].acquired, d[i].redelivered);
    /* Dead-lettering is asynchronous: before 4.3 wait for it; on 4.3 the message was still
     * there at every get, which says it all. */
    bool nack_dead_lettered = version >= 403 ? over_limit_depth() > 0
                                             : harness_wait_queue_depth(&F.h, over_limit, 1, 5000);
    long after_nacks = harness_queue_depth(&F.h, q);
    cr_log_info("RabbitMQ %d.%d: after %d nack-requeue: work queue %ld, over the limit %ld",
                version / 100, version % 100, nacked, after_nacks, over_limit_depth());
    if (version >= 403) {
        cr_assert_eq(nacked, returns, "the nacked message went away after %d nacks", nacked);
        cr_assert_eq(after_nacks, 1, "basic.nack(requeue) spent delivery attempts on %d.%d",
                     version / 100, version % 100);
        cr_assert_eq(over_limit_depth(), 0);
        for (int i = 0; i < nacked; i++) {
            cr_expect_eq(d[i].delivery, 0, "delivery %d: x-delivery-count %" PRId64, i + 1,
                         d[i].delivery);
            cr_expect_eq(d[i].acquired, i, "delivery %d: x-acquired-count %" PRId64, i + 1,
                         d[i].acquired);
        }
        amqp_message_t m;
        cr_assert(harness_get(&F.h, q, &m), "the nacked message is gone");
        amqp_destroy_message(&m);
    } else {
        /* Before 4.3 every return counts: the (limit + 1)-th return goes over. */
        cr_assert(nack_dead_lettered, "before 4.3, %d nacks should exceed x-delivery-limit %d",
                  nacked, DELIVERY_LIMIT);
        cr_expect_eq(nacked, DELIVERY_LIMIT + 1);
        cr_assert_eq(after_nacks, 0);
    }
    long over_before_rejects = over_limit_depth();

    /* basic.reject(requeue=true) until the message goes over the limit. */
    harness_publish(&F.h, NULL, "application/json", "{\"probe\":\"reject\"}", 18, NULL);
    side_channel_open();
    int rejected = 0;
    for (; rejected < returns; rejected++) {
        uint64_t tag;
        if (!side_get(q, &tag, &d[rejected]))
            break;
        cr_assert_eq(amqp_basic_reject(F.h.amqp, SIDE_CHANNEL, tag, 1), AMQP_STATUS_OK);
    }
    side_channel_close();
    for (int i = 0; i < rejected; i++)
        cr_log_info("reject-requeue: delivery %d: x-delivery-count %" PRId64
                    ", x-acquired-count %" PRId64,
                    i + 1, d[i].delivery, d[i].acquired);
    cr_assert(harness_wait_queue_depth(&F.h, over_limit, over_before_rejects + 1, 5000),
              "a message rejected with requeue %d times did not go over x-delivery-limit %d",
              rejected, DELIVERY_LIMIT);
    cr_log_info("RabbitMQ %d.%d: the message went over x-delivery-limit %d after %d "
                "reject-requeue",
                version / 100, version % 100, DELIVERY_LIMIT, rejected);
    cr_expect_eq(rejected, DELIVERY_LIMIT + 1);
    cr_expect_eq(harness_queue_depth(&F.h, q), 0);
}

/* What idemq's shutdown does to held deliveries, without idemq: a consumer takes `n`, cancels
 * (idemq's pause), gives them back with basic.nack(requeue) and closes its channel at once; or
 * waits, before closing, until the broker shows them ready again. Measured, not asserted: how
 * many nacks the close undoes (each such delivery is returned as the closed channel's, one
 * attempt spent) is the broker's business — on 4.3 its quorum-queue client in the channel sends
 * at most 32 commands ahead of the queue and keeps the rest until earlier ones are applied, and
 * a closing channel drops what it kept. Returns how many came back with x-delivery-count > 0. */
typedef enum give_back_mode {
    GIVE_BACK_EACH_THEN_CLOSE, /* what idemq's shutdown does: one nack per delivery */
    GIVE_BACK_EACH_WAIT_CLOSE, /* the same, closing once the broker shows them ready */
    GIVE_BACK_ONE_MULTIPLE,    /* one basic.nack(multiple) for them all, then close */
} give_back_mode;

static long give_back_then_close(int n, give_back_mode mode)
{
    harness *h = &F.h;
    char **bodies = calloc((size_t)n, sizeof *bodies);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint64_t *tags = calloc((size_t)n, sizeof *tags);
    cr_assert(bodies && lens && tags);
    for (int i = 0; i < n; i++) {
        bodies[i] = malloc(32);
        cr_assert(bodies[i]);
        lens[i] = (size_t)snprintf(bodies[i], 32, "{\"probe\":%d}", i);
    }
    harness_publish_batch(h, NULL, "application/json", (const void *const *)bodies, lens,
                          (size_t)n);
    side_channel_open();
    amqp_basic_qos(h->amqp, SIDE_CHANNEL, 0, (uint16_t)n, 0);
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL);
    amqp_basic_consume(h->amqp, SIDE_CHANNEL, amqp_cstring_bytes(h->queue),
                       amqp_cstring_bytes("dl-probe"), 0, 0, 0, amqp_empty_table);
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL);
    for (int i = 0; i < n; i++) {
        amqp_envelope_t env;
        struct timeval timeout = {.tv_sec = 10};
        amqp_maybe_release_buffers(h->amqp);
        amqp_rpc_reply_t r = amqp_consume_message(h->amqp, &env, &timeout, 0);
        cr_assert(r.reply_type == AMQP_RESPONSE_NORMAL, "delivery %d of %d did not come", i + 1, n);
        cr_assert_eq(env.channel, SIDE_CHANNEL);
        tags[i] = env.delivery_tag;
        amqp_destroy_envelope(&env);
    }
    amqp_basic_cancel(h->amqp, SIDE_CHANNEL, amqp_cstring_bytes("dl-probe"));
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL);
    if (mode == GIVE_BACK_ONE_MULTIPLE)
        cr_assert_eq(amqp_basic_nack(h->amqp, SIDE_CHANNEL, tags[n - 1], 1, 1), AMQP_STATUS_OK);
    else
        for (int i = 0; i < n; i++)
            cr_assert_eq(amqp_basic_nack(h->amqp, SIDE_CHANNEL, tags[i], 0, 1), AMQP_STATUS_OK);
    if (mode == GIVE_BACK_EACH_WAIT_CLOSE)
        cr_assert(harness_wait_queue_depth(h, h->queue, n, 10000));
    side_channel_close();
    /* Given back or returned by the close, all n come back: wait for them before looking. */
    cr_assert(harness_wait_queue_depth(h, h->queue, n, 10000),
              "the %d deliveries given back are not all ready again", n);
    peek_result p;
    peek_queue(h->queue, n + 5, &p);
    cr_assert_eq(p.messages, n);
    amqp_queue_purge(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(h->queue));
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL);
    for (int i = 0; i < n; i++)
        free(bodies[i]);
    free(bodies);
    free(lens);
    free(tags);
    return p.counted;
}

Test(delivery_limit, a_channel_closed_at_once_after_settling_can_spend_attempts, .timeout = 60)
{
    setup("dl_nack_close", 0);
    int version = broker_at_least(403, "before 4.3 every nack spends an attempt anyway");
    declare_limited_work_queue();
    const int n = 40, tries = 3;
    long each[3], waited[3], multiple[3];
    for (int i = 0; i < tries; i++) {
        each[i] = give_back_then_close(n, GIVE_BACK_EACH_THEN_CLOSE);
        waited[i] = give_back_then_close(n, GIVE_BACK_EACH_WAIT_CLOSE);
        multiple[i] = give_back_then_close(n, GIVE_BACK_ONE_MULTIPLE);
    }
    cr_log_info("RabbitMQ %d.%d: of %d deliveries given back (nack, requeue) before the channel "
                "closed, counted as failed: one nack each then close at once %ld, %ld, %ld; the "
                "same, closing once they are ready again %ld, %ld, %ld; one nack(multiple) then "
                "close at once %ld, %ld, %ld",
                version / 100, version % 100, n, each[0], each[1], each[2], waited[0], waited[1],
                waited[2], multiple[0], multiple[1], multiple[2]);
    for (int i = 0; i < tries; i++)
        cr_expect_eq(waited[i], 0, "nacks the broker had applied before the close were counted");
}

typedef struct broker_view {
    long want, want_unacked, messages, unacked;
} broker_view;

/* The broker lists H.queue with `want` messages, `want_unacked` of them unacked. */
static bool broker_sees_all_unacked(harness *h, void *arg)
{
    broker_view *v = arg;
    v->messages = v->unacked = -1;
    return harness_broker_queue_stats(h->queue, &v->messages, &v->unacked) &&
           v->messages == v->want && v->unacked == v->want_unacked;
}

/* What idemq holds and what the broker still has ready add up to every event: the pause's
 * basic.cancel can leave part of the burst undelivered, ready in the queue. */
typedef struct hold_wait {
    long events;
    long long held;
    long ready;
} hold_wait;

static bool hold_settled(harness *h, void *arg)
{
    hold_wait *w = arg;
    w->held = held_now();
    w->ready = harness_queue_depth(h, h->queue);
    return w->held >= 1 && w->held + w->ready == w->events;
}

/* (a) A database pause holds what idemq has, unacked, through several failed probes: nothing is
 * given back, so nothing spends an attempt, on 4.0 as on 4.3. */
Test(delivery_limit, a_long_hold_returns_nothing, .timeout = 90)
{
    const int events = 40;
    setup("dl_hold", 64);
    int version = broker_at_least(400, "x-delivery-limit is a RabbitMQ 4.x concern");
    prepare_topology_and_orders(events);
    start_idemq();
    break_schema();
    int64_t t0 = harness_now_ms();
    harness_publish_payments(&F.h, "o", events);
    cr_assert(harness_wait_log(&F.h, PAUSE_LINE, 1, 15000), "idemq did not pause (log: %s)",
              F.h.log_path);
    hold_wait hold = {.events = events};
    cr_assert(harness_wait_for(hold_settled, &F.h, &hold, 15000),
              "idemq holds %lld and %ld are ready, want %d in all (log: %s)", hold.held, hold.ready,
              events, F.h.log_path);
    /* Probes back off (0.5 s, 1 s, 2 s): three failed ones make a hold of about 4 s. A hold
     * that gave deliveries back (and took them again) at each probe would spend the limit's 2
     * attempts in that time. */
    cr_assert(harness_wait_log(&F.h, "schema error persists", 3, 20000),
              "fewer than 3 failed probes (log: %s)", F.h.log_path);
    /* The broker's own view (its queue statistics lag by up to a stats interval): all of them
     * unacked, none ready. */
    broker_view view = {.want = events, .want_unacked = (long)hold.held};
    cr_expect(harness_wait_for(broker_sees_all_unacked, &F.h, &view, 15000),
              "the broker sees %ld messages, %ld unacked during the hold, want %lld unacked",
              view.messages, view.unacked, hold.held);
    int64_t held_ms = harness_now_ms() - t0;
    cr_expect_eq(harness_log_count(&F.h, OUT_REQUEUED), 0,
                 "idemq gave deliveries back while holding them");
    int64_t fixed = harness_now_ms();
    fix_schema();
    wait_applied(events, 30000);
    int64_t apply_ms = harness_now_ms() - fixed;
    stop_idemq();
    cr_log_info("RabbitMQ %d.%d: %d deliveries held %lld ms (%ld failed probes), all applied "
                "%lld ms after the fix; %ld held lines",
                version / 100, version % 100, events, (long long)held_ms,
                harness_log_count(&F.h, "schema error persists"), (long long)apply_ms,
                harness_log_count(&F.h, OUT_HELD));
    expect_each_applied_once(events);
    cr_expect_eq(harness_summary_total(F.h.log_path, "requeued"), 0);
    cr_expect_eq(harness_summary_total(F.h.log_path, "deduped"), 0);
}

/* The same messages delivered, held and given back at every one of N > limit shutdowns. With
 * basic.nack they keep x-delivery-count 0 on 4.3; a reject-requeue (or leaving them to the
 * closing connection) would send all of them to Q.overlimit at the (limit + 1)-th shutdown. */
Test(delivery_limit, shutdowns_while_paused_give_held_messages_back_uncounted, .timeout = 120)
{
    const int events = 40, rounds = DELIVERY_LIMIT + 2;
    setup("dl_paused_stops", 64);
    broker_at_least(403, "before 4.3 basic.nack(requeue) spends a delivery attempt like every "
                         "return, so giving the same held messages back at more shutdowns than "
                         "x-delivery-limit drops them there (the calibration test shows it)");
    prepare_topology_and_orders(events);
    break_schema();
    harness_publish_payments(&F.h, "o", events);
    int64_t t0 = harness_now_ms();
    long in_queue = events, given_back_want = 0;
    for (int round = 1; round <= rounds; round++) {
        start_idemq();
        wait_held(in_queue, 15000);
        stop_idemq();
        given_back_want += in_queue;
        long given_back = harness_log_count(&F.h, HELD_GIVEN_BACK);
        cr_assert_eq(given_back, given_back_want,
                     "after shutdown %d: %ld held messages given back, want %ld (log: %s)", round,
                     given_back, given_back_want, F.h.log_path);
        peek_result r;
        peek_queue(F.h.queue, events + 10, &r);
        cr_log_info("shutdown %d while paused: %ld given back in all; the queue holds %ld, %ld "
                    "with x-delivery-count > 0 (max %" PRId64 "), x-acquired-count %" PRId64
                    "..%" PRId64 "; %ld over the limit",
                    round, given_back, r.messages, r.counted, r.delivery_max, r.acquired_min,
                    r.acquired_max, over_limit_depth());
        in_queue = r.messages;
    }
    int64_t rounds_ms = harness_now_ms() - t0;
    peek_result p;
    peek_queue(F.h.queue, events + 10, &p);
    long over = over_limit_depth();
    cr_log_info("after %d shutdowns while paused: %ld messages in the queue, %ld over the limit, "
                "%ld redelivered, x-delivery-count max %" PRId64 ", x-acquired-count %" PRId64
                "..%" PRId64 " (%lld ms)",
                rounds, p.messages, over, p.redelivered, p.delivery_max, p.acquired_min,
                p.acquired_max, (long long)rounds_ms);
    const char *why = "the held messages idemq gave back at shutdown were counted as failed "
                      "deliveries: on 4.3 a channel closed right after many settlements undoes "
                      "those RabbitMQ had not yet passed to the queue, so idemq must give them "
                      "back in one basic.nack(multiple) "
                      "(a_channel_closed_at_once_after_settling_can_spend_attempts measures it)";
    cr_assert_eq(over, 0,
                 "%ld of %d messages went over x-delivery-limit %d in %d shutdowns: %s; "
                 "log: %s",
                 over, events, DELIVERY_LIMIT, rounds, why, F.h.log_path);
    cr_assert_eq(p.messages, events, "the work queue holds %ld of %d", p.messages, events);
    cr_assert_eq(p.delivery_max, 0,
                 "%ld of %d messages carry x-delivery-count (max %" PRId64 ") after %d "
                 "shutdowns while paused: %s; log: %s",
                 p.counted, events, p.delivery_max, rounds, why, F.h.log_path);
    /* Each round acquired every message twice: idemq's delivery and the test's peek. */
    cr_expect_eq(p.acquired_min, 2 * rounds, "x-acquired-count %" PRId64 "..%" PRId64 ", want %d",
                 p.acquired_min, p.acquired_max, 2 * rounds);

    fix_schema_and_apply_all(events);
    cr_expect_eq(harness_summary_total(F.h.log_path, "requeued"), (long)events * rounds);
    cr_expect_eq(harness_summary_total(F.h.log_path, "deduped"), 0);
}

/* (b) N > limit graceful stops under load. idemq finishes and acks what it received, and gives
 * back (nack) what arrives after the signal; so after each stop every message left in the queue
 * must have x-delivery-count 0 — one left unacked to the closing connection would carry 1. */
Test(delivery_limit, sigterm_under_load_repeatedly_spends_no_attempt, .timeout = 120)
{
    const int events = 1200, rounds = DELIVERY_LIMIT + 2;
    setup("dl_sigterms", 64);
    broker_at_least(403, "before 4.3 the deliveries idemq gives back at a shutdown (basic.nack) "
                         "spend attempts like every return, and so do this test's peeks");
    prepare_topology_and_orders(events);
    /* >= 5 ms per UPDATE keeps the prefetch window full and transactions running when the
     * signal comes. */
    harness_sql(&F.h, "CREATE TRIGGER orders_slow BEFORE UPDATE ON orders FOR EACH ROW "
                      "SET @idemq_test_slow = SLEEP(0.005)");
    harness_publish_payments(&F.h, "o", events);
    int64_t t0 = harness_now_ms();
    long requeued_before = 0;
    int64_t acquired_max = 0;
    long redelivered_max = 0;
    for (int round = 1; round <= rounds; round++) {
        start_idemq();
        long long target = (long long)events * round / (rounds + 1);
        long long got =
            harness_wait_scalar_at_least(&F.h, target, 30000, "SELECT COUNT(*) FROM msg_dedup");
        cr_assert(got >= target, "round %d: %lld of %lld applied (log: %s)", round, got, target,
                  F.h.log_path);
        stop_idemq();
        long long done = applied();
        cr_assert(done < events, "round %d: everything was applied before the signal", round);
        long requeued = harness_summary_total(F.h.log_path, "requeued");
        peek_result p;
        peek_queue(F.h.queue, events, &p);
        cr_log_info("SIGTERM %d: %lld applied, %ld given back (nack) at this stop; the queue "
                    "holds %ld, %ld redelivered, x-delivery-count max %" PRId64
                    ", x-acquired-count max %" PRId64,
                    round, done, requeued - requeued_before, p.messages, p.redelivered,
                    p.delivery_max, p.acquired_max);
        requeued_before = requeued;
        if (p.acquired_max > acquired_max)
            acquired_max = p.acquired_max;
        if (p.redelivered > redelivered_max)
            redelivered_max = p.redelivered;
        /* More than the rest when an applied delivery's ack was lost (it then carries
         * x-delivery-count, asserted below); fewer would be messages lost. */
        cr_assert_geq(p.messages, events - done,
                      "round %d: the queue holds %ld of the %lld not applied", round, p.messages,
                      events - done);
        cr_assert_eq(p.delivery_max, 0,
                     "round %d: %ld message(s) carry x-delivery-count (max %" PRId64 "), %lld "
                     "applied are back: the stop spent delivery attempts (log: %s)",
                     round, p.counted, p.delivery_max, p.messages - (events - done), F.h.log_path);
        cr_assert_eq(over_limit_depth(), 0, "round %d: messages over the limit", round);
    }
    start_idemq();
    wait_applied(events, 60000);
    int64_t total_ms = harness_now_ms() - t0;
    stop_idemq();
    cr_log_info("%d SIGTERMs under load: %ld deliveries given back in all, x-acquired-count "
                "max %" PRId64 ", up to %ld redelivered in one peek; all %d applied in %lld ms",
                rounds, requeued_before, acquired_max, redelivered_max, events,
                (long long)total_ms);
    expect_each_applied_once(events);
    /* Nothing committed was left unacked: no duplicate came back. */
    cr_expect_eq(harness_summary_total(F.h.log_path, "deduped"), 0);
}

/* (c) A connection the broker closes returns what idemq held unacked, and RabbitMQ counts that
 * (4.3 too): measured here, one reconnect costs each held message one attempt and costs the
 * messages idemq had not received nothing; under a limit of 2 they are still applied once. */
Test(delivery_limit, one_reconnect_spends_one_attempt_of_each_held_message, .timeout = 90)
{
    const unsigned prefetch = 10;
    const int events = 30;
    setup("dl_reconnect", prefetch);
    int version = broker_at_least(400, "x-delivery-limit is a RabbitMQ 4.x concern");
    prepare_topology_and_orders(events);
    break_schema();
    harness_publish_payments(&F.h, "o", events);
    start_idemq();
    /* The prefetch window, held: the rest stay ready in the queue. */
    wait_held(prefetch, 15000);
    long lost_before = harness_log_count(&F.h, "RabbitMQ down");
    cr_assert(harness_close_amqp_connection_of(F.daemon, "delivery_limit test"),
              "the broker lists no connection of idemq");
    cr_assert(harness_wait_log(&F.h, "reconnected to RabbitMQ", 1, 20000),
              "idemq did not reconnect (log: %s)", F.h.log_path);
    cr_assert_gt(harness_log_count(&F.h, "RabbitMQ down"), lost_before);
    /* Still paused: nothing is consumed again until the schema is fixed. */
    wait_held(0, 5000);
    stop_idemq();

    /* Who was returned by the closed connection, and what it cost. */
    side_channel_open();
    long counted = 0, uncounted = 0, other = 0;
    int64_t acquired_counted = -1;
    uint64_t tag, last_tag = 0;
    delivery_counts d;
    for (int i = 0; i < events + 5 && side_get(F.h.queue, &tag, &d); i++) {
        last_tag = tag;
        if (d.delivery == 1) {
            counted++;
            acquired_counted = d.acquired;
        } else if (d.delivery == 0)
            uncounted++;
        else
            other++;
    }
    if (last_tag)
        give_back_all(F.h.queue, last_tag, counted + uncounted + other);
    side_channel_close();
    cr_log_info("RabbitMQ %d.%d: one reconnect with %u held: %ld message(s) at x-delivery-count "
                "1 (x-acquired-count %" PRId64 "), %ld at 0, %ld otherwise",
                version / 100, version % 100, prefetch, counted, acquired_counted, uncounted,
                other);
    cr_assert_eq(counted, (long)prefetch,
                 "one reconnect should cost each of the %u held messages one attempt: %ld did",
                 prefetch, counted);
    cr_assert_eq(uncounted, events - (long)prefetch);
    cr_assert_eq(other, 0);
    cr_assert_eq(over_limit_depth(), 0);

    /* One attempt spent (two on 4.0, whose peek spent one more) of the limit's 2: still there. */
    fix_schema_and_apply_all(events);
    cr_expect_eq(harness_summary_total(F.h.log_path, "deduped"), 0);
}
