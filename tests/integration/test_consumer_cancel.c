/*
 * test_consumer_cancel — RabbitMQ ends one of idemq's consumers with basic.cancel (idemq
 * advertises consumer_cancel_notify): at a consumer timeout (RabbitMQ 4.3 checks
 * x-consumer-timeout on quorum queues while the consumer holds a delivery unacked) and when the
 * work queue is deleted. idemq keeps its connection, counts the cancel, subscribes again, and
 * every event is applied once; the timeout's returned deliveries spend no delivery attempt.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "harness.h"

static harness_fixture fixture;
#define H (fixture.h)

static void teardown(void)
{
    harness_fixture_fini(&fixture);
}

TestSuite(consumer_cancel, .fini = teardown);

static void declare_queue(const char *queue, const amqp_table_entry_t *args, int count)
{
    amqp_queue_declare(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0,
                       (amqp_table_t){.num_entries = count, .entries = (amqp_table_entry_t *)args});
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL,
              "cannot declare queue %s", queue);
}

static long long scrape(const char *sample)
{
    char *body = NULL;
    int port = harness_http_port(&H, 10000);
    cr_assert_eq(harness_http_get(port, "/metrics", &body), 200);
    long long value = harness_metric_value(body, sample);
    free(body);
    return value;
}

/* The work queue, before idemq starts (declare: passive): quorum, a 2 s x-consumer-timeout, and
 * x-delivery-limit 1 with a dead-letter route to Q.over_limit (its name into over_limit), where a
 * return that spent a delivery attempt would land. */
static void declare_timed_work_queue(char *over_limit, size_t len)
{
    snprintf(over_limit, len, "%s.over_limit", H.queue);
    declare_queue(over_limit, (amqp_table_entry_t[]){harness_field_text("x-queue-type", "quorum")},
                  1);
    amqp_table_entry_t work[] = {
        harness_field_text("x-queue-type", "quorum"),
        harness_field_int("x-consumer-timeout", 2000),
        harness_field_int("x-delivery-limit", 1),
        harness_field_text("x-dead-letter-exchange", ""),
        harness_field_text("x-dead-letter-routing-key", over_limit),
    };
    declare_queue(H.queue, work, (int)(sizeof work / sizeof work[0]));
}

#define TIMEOUT_EVENTS 60

/* Deliveries wait in idemq (one worker, 50 ms per row) longer than the queue's 2 s
 * x-consumer-timeout while idemq consumes: RabbitMQ 4.3 cancels the consumer and returns what it
 * held. A return that spent a delivery attempt would send the message over x-delivery-limit 1
 * into the over-limit queue. */
Test(consumer_cancel, a_consumer_timeout_cancels_and_idemq_subscribes_again, .timeout = 120)
{
    harness_options o = {.declare = "passive", .workers = 1, .prefetch = 100};
    harness_fixture_init(&fixture, "cancel_timeout", &o);
    int version = harness_broker_version(&H);
    if (version < 403)
        cr_skip_test("before 4.3 RabbitMQ times consumers out on the channel (it closes it), not "
                     "with the queue's x-consumer-timeout and a basic.cancel");
    char over_limit[160];
    declare_timed_work_queue(over_limit, sizeof over_limit);
    harness_declare_topology(&H);
    harness_insert_orders(&H, "t", TIMEOUT_EVENTS, "PAYING");
    harness_sql(&H, "CREATE TRIGGER slow_updates BEFORE UPDATE ON orders FOR EACH ROW "
                    "SET @idemq_test_pause = SLEEP(0.05)");
    harness_publish_payments(&H, "t", TIMEOUT_EVENTS);

    int64_t t0 = harness_now_ms();
    harness_fixture_start(&fixture, "started consuming", 15000);
    cr_assert(harness_wait_log(&H, "RabbitMQ cancelled idemq's consumer", 1, 30000),
              "no consumer timeout cancelled idemq's consumer (log: %s)", H.log_path);
    int64_t cancelled_at = harness_now_ms() - t0;
    cr_assert(harness_wait_log(&H, "subscribed again to queue", 1, 15000),
              "idemq did not subscribe again (log: %s)", H.log_path);
    cr_assert(harness_wait_scalar(&H, TIMEOUT_EVENTS, 60000,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"),
              "not every event was applied after the cancel (log: %s)", H.log_path);
    cr_assert(harness_wait_queue_settled(&H, H.queue, 30000),
              "the returned deliveries were not all settled");
    char sample[200];
    snprintf(sample, sizeof sample, "idemq_consumer_cancels_total{queue=\"%s\"}", H.queue);
    long long counted = scrape(sample);
    harness_stop_idemq(&fixture.daemon);

    cr_expect(counted >= 1, "idemq_consumer_cancels_total is %lld", counted);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), TIMEOUT_EVENTS);
    cr_expect_eq(harness_summary_total(H.log_path, "processed"), TIMEOUT_EVENTS);
    cr_expect_eq(harness_summary_total(H.log_path, "dead_lettered"), 0);
    cr_expect_eq(harness_queue_depth(&H, over_limit), 0,
                 "a returned delivery spent a delivery attempt and went over the limit");
    long deduped = harness_summary_total(H.log_path, "deduped");
    /* The connection stayed: only the consumer was cancelled. */
    cr_expect_eq(harness_log_count(&H, "RabbitMQ down"), 0,
                 "the cancel cost the connection (log: %s)", H.log_path);
    cr_log_info("consumer timeout: cancelled %lld ms after start, %lld cancel(s), %ld returned "
                "deliveries settled as duplicates, over-limit queue empty",
                (long long)cancelled_at, counted, deduped);
    amqp_queue_delete(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(over_limit), 0, 0);
    amqp_get_rpc_reply(H.amqp);
}

#define PAUSE_EVENTS 100

/* A pause (here a schema error: orders renamed away) holds deliveries past the queue's 2 s
 * x-consumer-timeout. idemq cancelled its own consumer when it paused, so RabbitMQ 4.3 has no
 * consumer to cancel: it closes the channel and returns the held deliveries. idemq reconnects,
 * still paused, and resumes when the table is back. The returns spend no delivery attempt
 * (x-delivery-limit 1 would send a counted one to the over-limit queue). */
Test(consumer_cancel, a_pause_past_the_consumer_timeout_loses_nothing_and_spends_no_attempt,
     .timeout = 120)
{
    harness_options o = {.declare = "passive"};
    harness_fixture_init(&fixture, "cancel_pause", &o);
    if (harness_broker_version(&H) < 403)
        cr_skip_test("before 4.3 RabbitMQ has no x-consumer-timeout on quorum queues here");
    char over_limit[160];
    declare_timed_work_queue(over_limit, sizeof over_limit);
    harness_declare_topology(&H);
    harness_insert_orders(&H, "p", PAUSE_EVENTS, "PAYING");
    harness_fixture_start(&fixture, "started consuming", 15000);
    harness_sql(&H, "RENAME TABLE orders TO orders_away");
    harness_publish_payments(&H, "p", PAUSE_EVENTS);
    cr_assert(harness_wait_log(&H, "schema error, pausing consumption", 1, 15000),
              "idemq did not pause (log: %s)", H.log_path);
    int64_t paused_at = harness_now_ms();
    cr_assert(harness_wait_log(&H, "RabbitMQ down", 1, 30000),
              "the held deliveries outlived x-consumer-timeout without the broker noticing "
              "(log: %s)",
              H.log_path);
    int64_t timed_out_after = harness_now_ms() - paused_at;
    cr_assert(harness_wait_log(&H, "RabbitMQ connection ready (paused)", 1, 30000),
              "idemq did not reconnect, paused (log: %s)", H.log_path);
    harness_sql(&H, "RENAME TABLE orders_away TO orders");
    int64_t restored = harness_now_ms();
    cr_assert(harness_wait_scalar(&H, PAUSE_EVENTS, 60000,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"),
              "not every held event was applied after the pause (log: %s)", H.log_path);
    int64_t resumed_in = harness_now_ms() - restored;
    harness_stop_idemq(&fixture.daemon);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), PAUSE_EVENTS);
    cr_expect_eq(harness_summary_total(H.log_path, "processed"), PAUSE_EVENTS);
    cr_expect_eq(harness_summary_total(H.log_path, "dead_lettered"), 0);
    cr_expect_eq(harness_queue_depth(&H, over_limit), 0,
                 "a held delivery spent a delivery attempt and went over the limit");
    cr_log_info("pause past the consumer timeout: channel closed %lld ms into the pause, every "
                "event applied %lld ms after the table came back, over-limit queue empty",
                (long long)timed_out_after, (long long)resumed_in);
    amqp_queue_delete(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(over_limit), 0, 0);
    amqp_get_rpc_reply(H.amqp);
}

/* Deleting the work queue cancels idemq's consumer; subscribing again fails (404 closes the
 * channel), the connection starts over and its topology declaration creates the queue again. */
Test(consumer_cancel, a_deleted_work_queue_is_declared_again_and_consumed, .timeout = 90)
{
    harness_fixture_init(&fixture, "cancel_deleted", NULL);
    harness_declare_topology(&H);
    harness_insert_orders(&H, "d", 40, "PAYING");
    harness_fixture_start(&fixture, "started consuming", 15000);
    harness_publish_payments(&H, "d", 20);
    cr_assert(harness_wait_scalar(&H, 20, 30000, "SELECT COUNT(*) FROM msg_dedup"));

    amqp_queue_delete(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(H.queue), 0, 0);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    cr_assert(harness_wait_log(&H, "RabbitMQ cancelled idemq's consumer", 1, 15000),
              "idemq was not told of the deleted queue (log: %s)", H.log_path);
    cr_assert(harness_wait_log(&H, "RabbitMQ connection ready", 2, 30000),
              "idemq did not start over after the queue was deleted (log: %s)", H.log_path);
    cr_expect(harness_log_count(&H, "(does the queue still exist?)") >= 1,
              "idemq did not say why subscribing again failed (log: %s)", H.log_path);
    cr_assert(harness_wait_log(&H, "started consuming", 2, 30000));

    /* The rest of the orders, published to the queue idemq declared again. */
    for (int i = 20; i < 40; i++) {
        char order[32];
        snprintf(order, sizeof order, "d%d", i);
        harness_publish_event(&H, order, "PAY_SUCCESS", i);
    }
    cr_assert(
        harness_wait_scalar(&H, 40, 30000, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"),
        "the events published after the queue came back were not applied (log: %s)", H.log_path);
    char sample[200];
    snprintf(sample, sizeof sample, "idemq_consumer_cancels_total{queue=\"%s\"}", H.queue);
    long long counted = scrape(sample);
    harness_stop_idemq(&fixture.daemon);
    cr_expect(counted >= 1, "idemq_consumer_cancels_total is %lld", counted);
    cr_expect_eq(harness_summary_total(H.log_path, "processed"), 40);
    cr_expect_eq(harness_summary_total(H.log_path, "dead_lettered"), 0);
}
