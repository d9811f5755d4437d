/*
 * test_dedup_cache — dedup.cache in a real `idemq run` against real RabbitMQ and MariaDB: a copy
 * of a key this instance saw committed is settled as deduped without a transaction, a key the
 * database reported as a duplicate is remembered too, a remembered key is trusted for
 * dedup.cache_ttl and not after, and with the cache off (the default) the database decides every
 * copy.
 *
 * "Without a transaction" is shown the only way it can be: the test deletes the committed dedup
 * rows (what an operator would do to apply a message again) and sets the orders back to PAYING;
 * a copy the cache settles leaves both as they are, while one that reaches the database applies
 * again. That is also the cache's documented blind spot, and why it is off by default.
 *
 * Each test has its own database and queue (harness.h). Waits are on log lines and row counts
 * with deadlines; the one sleep lets dedup.cache_ttl pass, which is what is tested.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define EVENTS 10

static harness_fixture F;

static void teardown(void)
{
    harness_fixture_fini(&F);
}

TestSuite(dedup_cache, .fini = teardown, .timeout = 120);

static void start_with(const char *name, const char *top_yaml)
{
    harness_options o = {.top_yaml = top_yaml};
    harness_fixture_init(&F, name, &o);
    harness_insert_orders(&F.h, "c", EVENTS, "PAYING");
    harness_fixture_start(&F, READY_LINE, 30000);
}

static void wait_outcomes(const char *outcome, long at_least)
{
    char needle[64];
    snprintf(needle, sizeof needle, "\"outcome\":\"%s\"", outcome);
    cr_assert(harness_wait_log(&F.h, needle, at_least, DEADLINE_MS), "fewer than %ld %s", at_least,
              outcome);
}

/* The idemq's counter sample name{queue="<the test's queue>"}. */
static long long queue_metric(const char *name)
{
    int port = harness_http_port(&F.h, 10000);
    char *body = NULL, sample[400];
    cr_assert_eq(harness_http_get(port, "/metrics", &body), 200);
    snprintf(sample, sizeof sample, "%s{queue=\"%s\"}", name, F.h.queue);
    long long v = harness_metric_value(body, sample);
    free(body);
    return v;
}

/* What an operator does to apply the events again: their dedup rows gone, orders PAYING. */
static void forget_in_the_database(void)
{
    harness_sql(&F.h, "DELETE FROM msg_dedup");
    harness_sql(&F.h, "UPDATE orders SET status = 'PAYING'");
}

/* Publishes one more batch of copies and waits until all of them are settled (deduped or
 * processed: settled_before + EVENTS outcome lines in all). */
static void publish_copies_and_settle(long settled_before)
{
    harness_publish_payments(&F.h, "c", EVENTS);
    long settled = 0;
    for (int64_t deadline = harness_now_ms() + DEADLINE_MS;
         (settled = harness_log_count(&F.h, "\"outcome\":\"deduped\"") +
                    harness_log_count(&F.h, "\"outcome\":\"processed\"")) <
             settled_before + EVENTS &&
         harness_now_ms() < deadline;) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(settled, settled_before + EVENTS, "the copies were not all settled");
}

Test(dedup_cache, copies_of_keys_committed_here_are_deduped_without_a_transaction)
{
    start_with("cache_hits", "dedup: {cache: 1000}\n");
    harness_publish_payments(&F.h, "c", EVENTS);
    wait_outcomes("processed", EVENTS);
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), 0);

    forget_in_the_database();
    publish_copies_and_settle(EVENTS);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"deduped\""), EVENTS,
                 "every copy was settled from the cache");
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), EVENTS);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 0,
                 "a copy reached the database");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 0,
                 "a copy was applied again");

    /* A key it never saw goes to the database. */
    harness_insert_orders(&F.h, "n", 1, "PAYING");
    harness_publish_payments(&F.h, "n", 1);
    wait_outcomes("processed", EVENTS + 1);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE order_id = 'n0' AND "
                                      "status = 'PAID'"),
                 1);
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), EVENTS);
}

Test(dedup_cache, a_duplicate_the_database_found_is_remembered)
{
    start_with("cache_db_duplicates", "dedup: {cache: 1000}\n");
    /* Committed elsewhere (another instance): the database finds each a duplicate. */
    for (int i = 0; i < EVENTS; i++)
        harness_sql(&F.h,
                    "INSERT INTO msg_dedup (biz_key, handler_name) VALUES "
                    "('order_id:c%d:PAY_SUCCESS', 'pay-callback')",
                    i);
    harness_publish_payments(&F.h, "c", EVENTS);
    wait_outcomes("deduped", EVENTS);
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), 0, "the first copies went to MySQL");

    forget_in_the_database();
    publish_copies_and_settle(EVENTS);
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), EVENTS);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 0);
}

Test(dedup_cache, a_key_is_trusted_for_cache_ttl_and_then_the_database_decides)
{
    start_with("cache_ttl", "dedup: {cache: 1000, cache_ttl: 1s}\n");
    harness_publish_payments(&F.h, "c", EVENTS);
    wait_outcomes("processed", EVENTS);
    forget_in_the_database();
    /* What is tested is the passing of time itself: no event marks it. */
    struct timespec ttl_passed = {1, 200 * 1000000};
    nanosleep(&ttl_passed, NULL);
    publish_copies_and_settle(EVENTS);
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), 0, "an expired key was trusted");
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"processed\""), 2 * EVENTS,
                 "past cache_ttl the database decides: the forgotten rows let the copies apply");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), EVENTS);
}

Test(dedup_cache, off_by_default_every_copy_goes_to_the_database)
{
    start_with("cache_off", NULL);
    harness_publish_payments(&F.h, "c", EVENTS);
    wait_outcomes("processed", EVENTS);
    publish_copies_and_settle(EVENTS);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"deduped\""), EVENTS,
                 "the database found every copy");
    cr_assert_eq(queue_metric("idemq_dedup_cache_hits_total"), 0);
    forget_in_the_database();
    publish_copies_and_settle(2 * EVENTS);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"processed\""), 2 * EVENTS,
                 "with the rows gone, the database applied the copies again");
}
