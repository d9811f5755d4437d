/*
 * test_retention — dedup retention (`dedup: {retention, interval, batch}`) in a real `idemq run`
 * against real RabbitMQ and MariaDB: expired msg_dedup rows are deleted in batches while
 * messages flow, fresh rows stay, the DELETE is a range scan on idx_created_at, and SIGTERM stops
 * a job that waits for a long interval.
 *
 * Each test has its own database and queue (harness.h). Waits are on observable conditions (row
 * counts, log lines) with deadlines; no sleep is used for synchronisation.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"

/* ------------------------------------------------------------------------------ fixture */

static harness_fixture F;

static void teardown(void)
{
    harness_fixture_fini(&F);
}

TestSuite(retention, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------------------------ helpers */

/* Inserts count msg_dedup rows PREFIX<i> for handler, created `age` ago (an SQL interval). */
static void insert_dedup_rows(const char *prefix, int count, const char *handler, const char *age)
{
    for (int start = 0; start < count; start += 100) {
        char sql[8192];
        int n = snprintf(sql, sizeof sql,
                         "INSERT INTO msg_dedup (biz_key, handler_name, created_at) VALUES ");
        for (int i = start; i < count && i < start + 100; i++)
            n += snprintf(sql + n, sizeof sql - (size_t)n,
                          "%s('%s%d', '%s', NOW(3) - INTERVAL %s - INTERVAL %d SECOND)",
                          i == start ? "" : ",", prefix, i, handler, age, i);
        cr_assert((size_t)n < sizeof sql);
        harness_sql(&F.h, "%s", sql);
    }
}

static void publish_events(int from, int to)
{
    enum { MAX = 400 };
    static char bodies[MAX][256];
    const void *ptrs[MAX];
    size_t lens[MAX];
    cr_assert(to - from <= MAX);
    for (int i = from; i < to; i++) {
        int k = i - from;
        lens[k] = (size_t)snprintf(bodies[k], sizeof bodies[k],
                                   "{\"biz_key\":\"order_id:o%d:PAY_SUCCESS\",\"order_id\":\"o%d\","
                                   "\"event_type\":\"PAY_SUCCESS\",\"amount\":%d}",
                                   i, i, i);
        ptrs[k] = bodies[k];
    }
    harness_publish_batch(&F.h, NULL, "application/json", ptrs, lens, (size_t)(to - from));
}

/* Orders o0..o<count-1> in PAYING (200 rows per statement: harness_sql has an 8 KiB buffer). */
static void insert_orders(int count)
{
    for (int start = 0; start < count; start += 200) {
        char sql[8192];
        int n = snprintf(sql, sizeof sql, "INSERT INTO orders (order_id, status) VALUES ");
        for (int i = start; i < count && i < start + 200; i++)
            n += snprintf(sql + n, sizeof sql - (size_t)n, "%s('o%d','PAYING')",
                          i == start ? "" : ",", i);
        cr_assert((size_t)n < sizeof sql);
        harness_sql(&F.h, "%s", sql);
    }
}

/* Sum of N over the "dedup retention: deleted N msg_dedup rows" log lines; *during counts the
 * sweeps that deleted rows between the first and the last processed message. */
static long long retention_deleted_total(long *during)
{
    json_t *all = harness_log_load(&F.h);
    long long total = 0, first = -1, last = -1;
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line)
    {
        const char *outcome = json_string_value(json_object_get(line, "outcome"));
        long long ts = json_integer_value(json_object_get(line, "_ts_ms"));
        if (outcome && !strcmp(outcome, "processed")) {
            if (first < 0)
                first = ts;
            last = ts;
        }
    }
    *during = 0;
    json_array_foreach(all, i, line)
    {
        const char *msg = json_string_value(json_object_get(line, "msg"));
        long long n, ts = json_integer_value(json_object_get(line, "_ts_ms"));
        if (msg && sscanf(msg, "dedup retention: deleted %lld msg_dedup rows", &n) == 1) {
            total += n;
            if (n > 0 && ts > first && ts < last)
                (*during)++;
        }
    }
    json_decref(all);
    return total;
}

#define TRAFFIC_ORDERS 4000
#define TRAFFIC_WAVE 5

typedef struct traffic {
    int published;
} traffic;

/* Publishes one small wave of payment events per poll (every 20 ms, about 250 messages/s) and is
 * done when no expired dedup row is left: the sweep ran while messages were flowing. */
static bool sweep_done_under_traffic(harness *h, void *arg)
{
    traffic *t = arg;
    cr_assert(t->published + TRAFFIC_WAVE <= TRAFFIC_ORDERS, "ran out of orders to publish");
    publish_events(t->published, t->published + TRAFFIC_WAVE);
    t->published += TRAFFIC_WAVE;
    return harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup WHERE created_at < NOW(3) - "
                             "INTERVAL 1 HOUR") == 0;
}

Test(retention, deletes_only_expired_rows_in_batches_while_traffic_flows)
{
    harness_options o = {.top_yaml = "dedup: {retention: 1h, interval: 1s, batch: 100}\n"};
    harness_fixture_init(&F, "retention", &o);

    /* The sweep's DELETE is a range scan on idx_created_at, not a table scan. (On a table of a
     * handful of rows, all expired, the optimizer rightly prefers a scan: test a mixed one.) */
    insert_dedup_rows("probe-", 5, "old", "2 HOUR");
    insert_dedup_rows("keep-", 50, "old", "50 MINUTE");
    /* MySQL 9's default EXPLAIN format (TREE) has no plan for a single-table DELETE. */
    if (harness_db_is_mysql(&F.h))
        harness_sql(&F.h, "SET SESSION explain_format = TRADITIONAL");
    cr_assert(mysql_query(F.h.db, "EXPLAIN DELETE FROM msg_dedup WHERE created_at < NOW(3) - "
                                  "INTERVAL 3600 SECOND ORDER BY created_at LIMIT 100") == 0,
              "%s", mysql_error(F.h.db));
    MYSQL_RES *res = mysql_store_result(F.h.db);
    cr_assert_not_null(res);
    MYSQL_FIELD *fields = mysql_fetch_fields(res);
    unsigned nf = mysql_num_fields(res);
    MYSQL_ROW row = mysql_fetch_row(res);
    cr_assert_not_null(row);
    const char *used_key = NULL, *access = NULL;
    for (unsigned i = 0; i < nf; i++) {
        if (!strcmp(fields[i].name, "key"))
            used_key = row[i];
        if (!strcmp(fields[i].name, "type"))
            access = row[i];
    }
    cr_expect(used_key && !strcmp(used_key, "idx_created_at"), "EXPLAIN key: %s",
              used_key ? used_key : "NULL");
    cr_expect(access && !strcmp(access, "range"), "EXPLAIN type: %s", access ? access : "NULL");
    mysql_free_result(res);

    insert_orders(TRAFFIC_ORDERS);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    cr_expect_eq(harness_log_count(&F.h, "dedup retention on: rows older than 1h"), 1);

    /* Twice: expired rows appear while payment events keep flowing, until a sweep removed them. */
    traffic t = {0};
    publish_events(0, 100);
    t.published = 100;
    for (int round = 0; round < 2; round++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "old-%d-", round);
        insert_dedup_rows(prefix, 250, "old", "2 HOUR");
        cr_assert(harness_wait_for(sweep_done_under_traffic, &F.h, &t, DEADLINE_MS),
                  "expired rows were not deleted in time");
    }
    publish_events(t.published, t.published + 100);
    t.published += 100;

    char sql[256];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'");
    cr_assert(harness_wait_scalar(&F.h, t.published, DEADLINE_MS, sql));
    cr_expect_eq(
        harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE 'keep-%%'"), 50);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE handler_name = "
                                      "'pay-callback'"),
                 t.published);
    /* One more sweep after the last deletion, then the counts in the log add up. */
    long sweeps = harness_log_count(&F.h, "dedup retention: deleted");
    cr_assert(harness_wait_log(&F.h, "dedup retention: deleted", sweeps + 1, DEADLINE_MS));
    long during = 0;
    cr_expect_eq(retention_deleted_total(&during), 505);
    cr_expect_geq(during, 2, "sweeps that deleted rows while messages were processed: %ld", during);
    cr_expect_eq(harness_log_count(&F.h, "sweep failed"), 0);
    cr_expect_eq(harness_log_count(&F.h, "\"outcome\":\"dead_lettered\""), 0);
    cr_log_info("retention under traffic: %d messages published, %ld sweeps deleted rows "
                "meanwhile",
                t.published, during);
    harness_stop_idemq(&F.daemon);
}

Test(retention, a_job_waiting_for_a_one_day_interval_stops_promptly_on_sigterm)
{
    harness_options o = {.top_yaml = "dedup: {retention: 2s, interval: 1d}\n"};
    harness_fixture_init(&F, "retention_stop", &o);
    insert_dedup_rows("old-", 3, "old", "1 MINUTE");
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    cr_assert(harness_wait_log(&F.h, "dedup retention: deleted 3 msg_dedup rows older than 2s", 1,
                               DEADLINE_MS));
    cr_expect_eq(harness_log_count(&F.h, "dedup.retention is 2s, under 1h"), 1);
    int64_t t0 = harness_now_ms();
    int rc = harness_stop(F.daemon, SIGTERM, 30000);
    F.daemon = 0;
    int64_t took = harness_now_ms() - t0;
    cr_expect_eq(rc, 0);
    cr_expect_lt(took, 5000,
                 "idemq took %lld ms to stop while its retention job waited for a "
                 "1-day interval",
                 (long long)took);
}
