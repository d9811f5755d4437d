/*
 * test_batch — batched transactions (adapter/store/batch.c): many messages in one transaction,
 * each with the outcome it would have alone, driving the real idemq binary against real
 * RabbitMQ and MariaDB.
 *
 * Batches are forced: the messages are published before idemq starts, and idemq runs with one
 * DB worker, mysql.batch 16 and the longest linger (50 ms), so the worker takes them all into
 * one transaction; the debug log line "batch of N messages" proves it did.
 *
 *   mixed batch (state machine, set-based; with INSERT … RETURNING and with MySQL's one INSERT
 *     per message): a legal step, a no-op, a duplicate of a committed message, two copies of
 *     one biz_key, an illegal jump and a missing row, in one COMMIT: processed, state_noop,
 *     deduped, one effect for the two copies (the first one's amount), a dead letter and a retry
 *     that recovers once the row exists — nobody else retried or dead-lettered.
 *   deadlock victim: the same kinds of messages, with the batch made the victim of a real
 *     InnoDB deadlock (the test's own transaction holds one row and then wants one of the
 *     batch's dedup rows): the batch is rolled back as a whole, every message runs again alone
 *     and still gets its own outcome; no innocent message is charged a retry.
 *   sql handler (a savepoint per message): a failed message is undone back to its savepoint —
 *     its ledger insert too — while the others in the same transaction commit.
 *   a handler that commits inside a batch (a CALLed procedure): the messages before it were
 *     committed whole and keep their outcome, it is dead-lettered as a lone message would be,
 *     the ones after it run alone.
 *   a lock wait timeout with innodb_rollback_on_timeout under a plugin that ignores it
 *     (tests/support/plugins/swallow_rollback.c): the batch is found rolled back, every message
 *     runs alone, and only the one whose row is locked is charged a retry.
 *   kill -9 between COMMIT and the acks (test-only IDEMQ_TEST_KILL_AFTER_COMMITS, store.h):
 *     after the restart every effect exists once, the killed batch's redeliveries are deduped.
 *   lost connection mid-batch: the worker's connection is killed (KILL CONNECTION) while its
 *     batch waits for a row lock: every message is held, none retried, and each is applied once
 *     after the probe reconnects.
 *
 * Assertions are made in the database and the broker; waits are on observable conditions with
 * deadlines. Each test has its own database and queue (harness.h).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#ifndef IDEMQ_SWALLOW_ROLLBACK_PLUGIN
#error "CMake passes IDEMQ_SWALLOW_ROLLBACK_PLUGIN (tests/support/plugins/swallow_rollback.c)"
#endif

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define BATCH_LINGER_MS 50

static harness_fixture F;
static MYSQL *locker; /* the test's own transaction, holding a row lock */

static void teardown(void)
{
    if (locker)
        mysql_close(locker); /* rolls back and releases its locks */
    locker = NULL;
    unsetenv("IDEMQ_TEST_NO_RETURNING");
    unsetenv("IDEMQ_TEST_KILL_AFTER_COMMITS");
    harness_fixture_fini(&F);
}

TestSuite(batch, .fini = teardown, .timeout = 180);

/* ------------------------------------------------------------------------------ helpers */

/* One worker, batch 16, the longest linger, debug logs (for the "batch of N" lines). */
static void setup(const char *name, const harness_options *o)
{
    harness_fixture_init(&F, name, o);
    const char *base = getenv("IDEMQ_TEST_MYSQL_URL");
    cr_assert(base, "IDEMQ_TEST_MYSQL_URL is not set");
    const char *path = strchr(base + strlen("mysql://"), '/');
    const char *query = strchr(base, '?');
    cr_assert(path);
    char line[1024];
    snprintf(line, sizeof line,
             "mysql: {url: \"%.*s/%s%s\", workers: 1, batch: 16, batch_linger_ms: %d}",
             (int)(path - base), base, F.h.database, query ? query : "", BATCH_LINGER_MS);
    harness_config_replace_line(&F.h, "mysql: ", line);
    harness_config_replace_line(&F.h, "log: ", "log: {level: debug}");
    harness_declare_topology(&F.h);
}

static void start(void)
{
    harness_start_idemq(&F.h, READY_LINE, DEADLINE_MS, &F.daemon);
}

static void publish(const char *order_id, const char *event, long amount)
{
    harness_publish_event(&F.h, order_id, event, amount);
}

/* The outcomes logged for biz_key "order_id:<order>:<event>", in order, as a JSON array of
 * strings (owned). */
static json_t *outcomes(const char *order, const char *event)
{
    char key[160];
    snprintf(key, sizeof key, "order_id:%s:%s", order, event);
    json_t *log = harness_log_load(&F.h), *out = json_array();
    size_t i;
    json_t *line;
    json_array_foreach(log, i, line)
    {
        const char *k = json_string_value(json_object_get(line, "biz_key"));
        const char *o = json_string_value(json_object_get(line, "outcome"));
        if (k && o && strcmp(k, key) == 0)
            json_array_append_new(out, json_string(o));
    }
    json_decref(log);
    return out;
}

/* Waits until biz_key order:event has logged at least count outcomes (the loop writes a batch's
 * lines one after another) and the first is want; returns the outcomes. */
typedef struct outcomes_wait {
    const char *order, *event;
    size_t count;
    json_t *got; /* the last outcomes read (owned) */
} outcomes_wait;

static bool outcomes_logged(harness *h, void *arg)
{
    (void)h;
    outcomes_wait *w = arg;
    json_decref(w->got);
    w->got = outcomes(w->order, w->event);
    return json_array_size(w->got) >= w->count;
}

static json_t *wait_outcomes(const char *order, const char *event, size_t count, const char *want)
{
    outcomes_wait w = {.order = order, .event = event, .count = count};
    harness_wait_for(outcomes_logged, &F.h, &w, DEADLINE_MS);
    json_t *o = w.got;
    const char *first = json_string_value(json_array_get(o, 0));
    cr_assert(first, "order_id:%s:%s logged no outcome", order, event);
    cr_assert_geq(json_array_size(o), count, "order_id:%s:%s logged %zu outcomes", order, event,
                  json_array_size(o));
    cr_assert_str_eq(first, want, "order_id:%s:%s: first outcome %s, expected %s", order, event,
                     first, want);
    return o;
}

static bool miss_processed_logged(harness *h, void *arg)
{
    (void)arg;
    return harness_log_count_both(h->log_path, "order_id:miss0:PAY_SUCCESS",
                                  "\"outcome\":\"processed\"") >= 1;
}

static json_t *wait_first_outcome(const char *order, const char *event, const char *want)
{
    return wait_outcomes(order, event, 1, want);
}

static void expect_only_outcome(const char *order, const char *event, const char *want)
{
    json_t *o = wait_first_outcome(order, event, want);
    cr_assert_eq(json_array_size(o), 1, "order_id:%s:%s logged %zu outcomes, expected only %s",
                 order, event, json_array_size(o), want);
    json_decref(o);
}

static void expect_order(const char *order, const char *status, long long amount)
{
    long long n = harness_scalar(&F.h,
                                 "SELECT COUNT(*) FROM orders WHERE order_id = '%s' AND status = "
                                 "'%s' AND (amount <=> %lld)",
                                 order, status, amount);
    cr_assert_eq(n, 1, "order %s is not %s with amount %lld", order, status, amount);
}

static void expect_order_unpaid(const char *order, const char *status)
{
    cr_assert_eq(harness_scalar(&F.h,
                                "SELECT COUNT(*) FROM orders WHERE order_id = '%s' AND status = "
                                "'%s' AND amount IS NULL",
                                order, status),
                 1, "order %s must still be %s, untouched", order, status);
}

static const char *queue_named(const char *suffix)
{
    static char name[200];
    snprintf(name, sizeof name, "%s%s", F.h.queue, suffix);
    return name;
}

/* Inserts a committed dedup row, as if an earlier delivery had been processed. */
static void committed_dedup_row(const char *order, const char *event)
{
    harness_sql(&F.h,
                "INSERT INTO msg_dedup (biz_key, handler_name) VALUES ('order_id:%s:%s', "
                "'pay-callback')",
                order, event);
}

/*
 * The state machine batch of the mixed tests: ok (PAYING → PAID), two copies of ok's biz_key
 * with another amount in the second, noop (already PAID), dup (a committed dedup row, order left
 * PAYING), ill (PAYING receiving REFUND_SUCCESS: illegal), miss (no row), vic (PAYING).
 */
static void publish_mixed_batch(void)
{
    harness_insert_orders(&F.h, "ok", 1, "PAYING");
    harness_insert_orders(&F.h, "noop", 1, "PAID");
    harness_insert_orders(&F.h, "dup", 1, "PAYING");
    harness_insert_orders(&F.h, "ill", 1, "PAYING");
    harness_insert_orders(&F.h, "vic", 1, "PAYING");
    committed_dedup_row("dup0", "PAY_SUCCESS");
    publish("ok0", "PAY_SUCCESS", 100);
    publish("noop0", "PAY_SUCCESS", 200);
    publish("dup0", "PAY_SUCCESS", 300);
    publish("ok0", "PAY_SUCCESS", 999); /* the second copy: deduped, its amount never applied */
    publish("ill0", "REFUND_SUCCESS", 400);
    publish("miss0", "PAY_SUCCESS", 500);
    publish("vic0", "PAY_SUCCESS", 600);
}

#define MIXED_BATCH "batch of 7 messages"

/* Every message of the mixed batch got its own outcome; then the missing row appears and that
 * message's retry applies it. */
static void expect_mixed_outcomes(void)
{
    json_t *ok = wait_outcomes("ok0", "PAY_SUCCESS", 2, "processed");
    cr_assert_eq(json_array_size(ok), 2, "ok0's two copies: %zu outcomes", json_array_size(ok));
    cr_assert_str_eq(json_string_value(json_array_get(ok, 1)), "deduped",
                     "the second copy of one biz_key in one batch is deduped");
    json_decref(ok);
    expect_only_outcome("noop0", "PAY_SUCCESS", "state_noop");
    expect_only_outcome("dup0", "PAY_SUCCESS", "deduped");
    expect_only_outcome("ill0", "REFUND_SUCCESS", "dead_lettered");
    expect_only_outcome("vic0", "PAY_SUCCESS", "processed");
    json_decref(wait_first_outcome("miss0", "PAY_SUCCESS", "retried"));
    cr_assert(harness_wait_queue_depth(&F.h, queue_named(".dlq"), 1, DEADLINE_MS),
              "exactly the illegal jump is dead-lettered");

    expect_order("ok0", "PAID", 100); /* one effect, the first copy's */
    expect_order_unpaid("noop0", "PAID");
    expect_order_unpaid("dup0", "PAYING");
    expect_order_unpaid("ill0", "PAYING");
    expect_order("vic0", "PAID", 600);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                      "'order_id:ill0:REFUND_SUCCESS'"),
                 0, "the dead-lettered message left no dedup row");

    /* The missing row's message kept its own retry and applies once the row exists. */
    harness_insert_orders(&F.h, "miss", 1, "PAYING");
    cr_assert(harness_wait_scalar(&F.h, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'miss0' AND "
                                  "status = 'PAID' AND amount = 500"));
    /* The row commits before the loop writes the outcome line: wait for the line too. */
    cr_assert(harness_wait_for(miss_processed_logged, &F.h, NULL, DEADLINE_MS),
              "no processed line for miss0");
    json_t *miss = outcomes("miss0", "PAY_SUCCESS");
    size_t n = json_array_size(miss);
    cr_assert(n >= 2);
    cr_assert_str_eq(json_string_value(json_array_get(miss, n - 1)), "processed");
    json_decref(miss);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 5,
                 "dedup rows: ok0, noop0, dup0 (before), vic0, miss0");
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
}

static void mixed_batch(const char *name, bool returning)
{
    harness_options o = {.workers = 1};
    setup(name, &o);
    publish_mixed_batch();
    if (!returning)
        setenv("IDEMQ_TEST_NO_RETURNING", "1", 1); /* MySQL's path: one INSERT per message */
    start();
    unsetenv("IDEMQ_TEST_NO_RETURNING");
    cr_assert(harness_wait_log(&F.h,
                               MIXED_BATCH ": one COMMIT (applied 2, state_noop 1, deduped 2, "
                                           "failed 2)",
                               1, DEADLINE_MS),
              "the seven messages were not applied in one transaction");
    expect_mixed_outcomes();
    cr_assert_eq(harness_log_count(&F.h, "rolled back as a whole"), 0);
    harness_stop_idemq(&F.daemon);
}

/* ------------------------------------------------------------------------------ tests */

Test(batch, a_mixed_batch_gives_each_message_its_own_outcome_in_one_commit)
{
    mixed_batch("batch_mixed", true);
}

Test(batch, a_mixed_batch_without_insert_returning_gives_the_same_outcomes)
{
    mixed_batch("batch_mixed_mysql", false);
}

/* The connection (other than the locker's) running the batch's locked read and waiting for
 * the locker's row: 0 when there is none yet. PROCESSLIST shows it on MariaDB and MySQL alike,
 * with TIME in whole seconds (TIME_MS is MariaDB's only); INNODB_TRX listed only the locker on
 * both while the batch waited. */
static long long batch_waiting_for_lock(long long locker_id)
{
    return harness_scalar(&F.h,
                          "SELECT COALESCE(MAX(ID), 0) FROM information_schema.PROCESSLIST WHERE "
                          "ID <> %lld AND INFO LIKE 'SELECT CASE%%' AND TIME >= 1",
                          locker_id);
}

static void locker_sql(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void locker_sql(const char *fmt, ...)
{
    char sql[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    cr_assert(mysql_query(locker, sql) == 0, "%s: %s", sql, mysql_error(locker));
    MYSQL_RES *res = mysql_store_result(locker);
    if (res)
        mysql_free_result(res);
}

/* Opens the locker's transaction holding order vic0's row; returns its connection id. The
 * filler rows make it the heavier transaction, so InnoDB picks the batch as a deadlock's
 * victim. */
static long long lock_victim_row(int filler_rows)
{
    harness_sql(&F.h, "CREATE TABLE filler (id INT AUTO_INCREMENT PRIMARY KEY, pad CHAR(100)) "
                      "ENGINE=InnoDB");
    locker = harness_db_open(&F.h);
    locker_sql("START TRANSACTION");
    for (int done = 0; done < filler_rows; done += 100) {
        char sql[4096];
        int n = snprintf(sql, sizeof sql, "INSERT INTO filler (pad) VALUES ('x')");
        for (int i = 1; i < 100; i++)
            n += snprintf(sql + n, sizeof sql - (size_t)n, ",('x')");
        locker_sql("%s", sql);
    }
    locker_sql("SELECT status FROM orders WHERE order_id = 'vic0' FOR UPDATE");
    cr_assert(mysql_query(locker, "SELECT CONNECTION_ID()") == 0);
    MYSQL_RES *res = mysql_store_result(locker);
    long long id = atoll(mysql_fetch_row(res)[0]);
    mysql_free_result(res);
    return id;
}

typedef struct blocked_wait {
    long long locker_id, batch_id; /* batch_id: 0 until found */
} blocked_wait;

static bool batch_blocked(harness *h, void *arg)
{
    (void)h;
    blocked_wait *w = arg;
    return (w->batch_id = batch_waiting_for_lock(w->locker_id)) != 0;
}

static long long wait_batch_blocked(long long locker_id)
{
    blocked_wait w = {.locker_id = locker_id};
    cr_assert(harness_wait_for(batch_blocked, &F.h, &w, DEADLINE_MS),
              "the batch never waited for the locked row");
    return w.batch_id;
}

Test(batch, a_deadlock_victim_batch_runs_each_message_alone_with_its_own_outcome)
{
    harness_options o = {.workers = 1};
    setup("batch_deadlock", &o);
    publish_mixed_batch();
    long long locker_id = lock_victim_row(5000);
    start();
    wait_batch_blocked(locker_id);
    /* The batch holds ok0's dedup row and waits for vic0's row; the locker now wants ok0's dedup
     * row: a cycle. The locker has written 5000 rows, the batch a handful: the batch is the
     * victim, rolled back whole, and the locker's insert goes through. */
    int rc = mysql_query(locker, "INSERT INTO msg_dedup (biz_key, handler_name) VALUES "
                                 "('order_id:ok0:PAY_SUCCESS', 'pay-callback')");
    cr_assert_eq(rc, 0, "the locker was chosen as the deadlock's victim instead of the batch: %s",
                 mysql_error(locker));
    locker_sql("ROLLBACK");
    mysql_close(locker);
    locker = NULL;

    cr_assert(harness_wait_log(&F.h, MIXED_BATCH " rolled back as a whole", 1, DEADLINE_MS),
              "the batch was not rolled back by the deadlock");
    cr_assert_eq(harness_log_count_both(F.h.log_path, "rolled back as a whole", "Deadlock"), 1,
                 "the rollback's reason names the deadlock");
    /* Alone, each message has the outcome it would have had in the batch: no retry for the
     * innocent ones, the victim's row applied. */
    expect_mixed_outcomes();
    harness_stop_idemq(&F.daemon);
}

static bool all_ok_processed_logged(harness *h, void *arg)
{
    (void)arg;
    for (int i = 0; i < 6; i++) {
        char key[64];
        snprintf(key, sizeof key, "order_id:ok%d:PAY_SUCCESS", i);
        if (harness_log_count_both(h->log_path, key, "\"outcome\":\"processed\"") < 1)
            return false;
    }
    return true;
}

Test(batch, a_lost_connection_mid_batch_holds_every_message_and_applies_each_once)
{
    harness_options o = {.workers = 1};
    setup("batch_lost_connection", &o);
    harness_insert_orders(&F.h, "ok", 6, "PAYING");
    harness_insert_orders(&F.h, "vic", 1, "PAYING");
    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "ok%d", i);
        publish(id, "PAY_SUCCESS", 10 + i);
    }
    publish("vic0", "PAY_SUCCESS", 600);
    long long locker_id = lock_victim_row(0);
    start();
    long long worker = wait_batch_blocked(locker_id);
    /* The worker's connection is the same user's: KILL needs no privilege. */
    harness_sql(&F.h, "KILL CONNECTION %lld", worker);
    locker_sql("ROLLBACK");
    mysql_close(locker);
    locker = NULL;

    cr_assert(harness_wait_scalar(&F.h, 7, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"));
    /* The rows commit before the loop writes the outcome lines: wait for the lines too. */
    cr_assert(harness_wait_for(all_ok_processed_logged, &F.h, NULL, DEADLINE_MS),
              "not every ok message has its processed line");
    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "ok%d", i);
        json_t *got = outcomes(id, "PAY_SUCCESS");
        /* held (while the database was away), then processed: never retried or dead-lettered */
        size_t n = json_array_size(got);
        cr_assert(n >= 1);
        cr_assert_str_eq(json_string_value(json_array_get(got, n - 1)), "processed", "%s", id);
        for (size_t k = 0; k + 1 < n; k++)
            cr_assert_str_eq(json_string_value(json_array_get(got, k)), "held", "%s", id);
        json_decref(got);
        expect_order(id, "PAID", 10 + i);
    }
    cr_assert(harness_log_count_both(F.h.log_path, "\"outcome\":\"held\"", "vic0") >= 1,
              "the lost connection held the batch's messages");
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"retried\""), 0);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"dead_lettered\""), 0);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 7);
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
}

/* ------------------------------------------------------------------ sql handler, savepoints */

static const char ledger_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"INSERT INTO ledger (order_id, amount) VALUES (:order_id, :amount)\"\n"
    "        - sql: \"UPDATE orders SET status = 'PAID' WHERE order_id = :order_id AND status = "
    "'PAYING'\"\n"
    "          expect_rows: 1\n";

static void create_ledger(void)
{
    harness_sql(&F.h, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id "
                      "VARCHAR(64) NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB");
}

Test(batch, an_sql_handler_batch_undoes_only_the_failed_message_back_to_its_savepoint)
{
    harness_options o = {.workers = 1, .handler_yaml = ledger_handler};
    setup("batch_sql", &o);
    create_ledger();
    harness_insert_orders(&F.h, "ok", 2, "PAYING");
    harness_insert_orders(&F.h, "paid", 1, "PAID"); /* expect_rows fails after the insert ran */
    harness_insert_orders(&F.h, "dup", 1, "PAYING");
    harness_insert_orders(&F.h, "copy", 1, "PAYING");
    committed_dedup_row("dup0", "PAY_SUCCESS");
    publish("ok0", "PAY_SUCCESS", 1);
    publish("paid0", "PAY_SUCCESS", 2);
    publish("copy0", "PAY_SUCCESS", 3);
    publish("dup0", "PAY_SUCCESS", 4);
    const char body[] = "{\"biz_key\":\"order_id:ok9:PAY_SUCCESS\",\"order_id\":\"ok9\"}";
    harness_publish(&F.h, NULL, "application/json", body, sizeof body - 1, NULL); /* no amount */
    publish("copy0", "PAY_SUCCESS", 5);
    publish("ok1", "PAY_SUCCESS", 6);
    start();
    cr_assert(harness_wait_log(&F.h,
                               "batch of 7 messages: one COMMIT (applied 3, state_noop 0, deduped "
                               "2, failed 2)",
                               1, DEADLINE_MS),
              "the seven messages were not applied in one transaction");
    expect_only_outcome("ok0", "PAY_SUCCESS", "processed");
    expect_only_outcome("ok1", "PAY_SUCCESS", "processed");
    expect_only_outcome("paid0", "PAY_SUCCESS", "dead_lettered");
    expect_only_outcome("ok9", "PAY_SUCCESS", "dead_lettered");
    expect_only_outcome("dup0", "PAY_SUCCESS", "deduped");
    json_t *copies = wait_outcomes("copy0", "PAY_SUCCESS", 2, "processed");
    cr_assert_eq(json_array_size(copies), 2);
    cr_assert_str_eq(json_string_value(json_array_get(copies, 1)), "deduped");
    json_decref(copies);
    cr_assert(harness_wait_queue_depth(&F.h, queue_named(".dlq"), 2, DEADLINE_MS));
    /* The effects: one ledger row each for ok0, ok1 and copy0 (the first copy's amount); none
     * for paid0, whose insert ran before its UPDATE matched no row and was undone with it. */
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM ledger"), 3);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM ledger WHERE (order_id, amount) IN "
                                      "(('ok0', 1), ('ok1', 6), ('copy0', 3))"),
                 3);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 4,
                 "dedup rows: dup0 (before), ok0, ok1, copy0");
    harness_stop_idemq(&F.daemon);
}

/* An sql handler that CALLs a procedure committing when the message says so (as
 * test_transaction_guard's), then updates the order. */
static const char committing_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"CALL audit_and_commit(:order_id, :commit_inside)\"\n"
    "        - sql: \"UPDATE orders SET status = 'PAID' WHERE order_id = :order_id\"\n"
    "          expect_rows: 1\n";

static void publish_commit_inside(const char *order_id, int commit_inside)
{
    char body[256];
    int n = snprintf(body, sizeof body,
                     "{\"biz_key\":\"order_id:%s:PAY\",\"order_id\":\"%s\",\"commit_inside\":%d}",
                     order_id, order_id, commit_inside);
    harness_publish(&F.h, NULL, "application/json", body, (size_t)n, NULL);
}

Test(batch, a_handler_that_commits_inside_a_batch_is_dead_lettered_and_the_others_keep_theirs)
{
    harness_options o = {.workers = 1, .handler_yaml = committing_handler};
    setup("batch_guard_commit", &o);
    harness_sql(&F.h, "CREATE TABLE audit (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id "
                      "VARCHAR(64) NOT NULL) ENGINE=InnoDB");
    harness_sql(&F.h, "CREATE PROCEDURE audit_and_commit(IN oid VARCHAR(64), IN do_commit INT) "
                      "BEGIN INSERT INTO audit (order_id) VALUES (oid); "
                      "IF do_commit THEN COMMIT; END IF; END");
    harness_insert_orders(&F.h, "before", 1, "PAYING");
    harness_insert_orders(&F.h, "c", 1, "PAYING");
    harness_insert_orders(&F.h, "after", 1, "PAYING");
    publish_commit_inside("before0", 0);
    publish_commit_inside("c0", 1); /* its procedure commits the batch's transaction */
    publish_commit_inside("after0", 0);
    start();
    cr_assert(harness_wait_log(&F.h,
                               "batch of 3 messages rolled back as a whole (the transaction of a "
                               "batch ended during one message's handler)",
                               1, DEADLINE_MS));
    /* before0 was committed whole by c0's COMMIT: processed, once. c0's dedup row went with
     * only half its effect: dead-lettered for a person, as a lone message would be. after0 had
     * not run: it runs alone. */
    expect_only_outcome("before0", "PAY", "processed");
    expect_only_outcome("c0", "PAY", "dead_lettered");
    expect_only_outcome("after0", "PAY", "processed");
    cr_assert_eq(harness_log_count_both(F.h.log_path, "\"biz_key\":\"order_id:c0:PAY\"",
                                        "ended idemq's transaction with a COMMIT"),
                 1);
    cr_assert(harness_wait_queue_depth(&F.h, queue_named(".dlq"), 1, DEADLINE_MS));
    expect_order_unpaid("c0", "PAYING");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 2);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM audit"), 3,
                 "one audit row each: before0's and c0's committed by c0's COMMIT, after0's alone");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 3);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"retried\""), 0);
    harness_stop_idemq(&F.daemon);
}

Test(batch,
     a_lock_wait_timeout_that_rolls_back_a_plugins_batch_charges_only_the_message_that_waited)
{
    static char handler[1024];
    snprintf(handler, sizeof handler,
             "      type: plugin\n"
             "      path: \"%s\"\n"
             "      config: {mode: lock_wait}\n",
             IDEMQ_SWALLOW_ROLLBACK_PLUGIN);
    harness_options o = {.workers = 1,
                         .handler_yaml = handler,
                         .retry_set = true,
                         .max_retries = 5,
                         .base = "2s",
                         .jitter = "0"};
    setup("batch_lock_wait", &o);
    if (harness_scalar(&F.h, "SELECT @@innodb_rollback_on_timeout") != 1) {
        teardown(); /* a skipped test gets no .fini */
        cr_skip_test("needs innodb_rollback_on_timeout=ON (test_transaction_guard.c says why)");
    }
    harness_sql(&F.h, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key "
                      "VARBINARY(128) NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB");
    harness_sql(&F.h, "CREATE PROCEDURE short_lock_wait() "
                      "BEGIN SET SESSION innodb_lock_wait_timeout = 1; END");
    harness_insert_orders(&F.h, "ok", 2, "PAYING");
    harness_insert_orders(&F.h, "lw", 1, "PAYING");
    publish_commit_inside("ok0", 0);
    publish_commit_inside("lw0", 0); /* its row is locked: the whole transaction times out */
    publish_commit_inside("ok1", 0);
    locker = harness_db_open(&F.h);
    locker_sql("START TRANSACTION");
    locker_sql("SELECT status FROM orders WHERE order_id = 'lw0' FOR UPDATE");
    start();
    cr_assert(harness_wait_log(&F.h, "batch of 3 messages rolled back as a whole", 1, DEADLINE_MS));
    /* Alone, the others go through at once; only lw0, whose own lock wait timed out again, is
     * charged a retry. */
    expect_only_outcome("ok0", "PAY", "processed");
    expect_only_outcome("ok1", "PAY", "processed");
    json_decref(wait_first_outcome("lw0", "PAY", "retried"));
    locker_sql("ROLLBACK");
    mysql_close(locker);
    locker = NULL;
    cr_assert(harness_wait_scalar(&F.h, 3, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_log(&F.h, "processed after 1 retries", 1, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM ledger"), 3,
                 "one ledger row per message: the effects of the rolled-back batch are gone");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(DISTINCT biz_key) FROM ledger"), 3);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 3);
}

/* ------------------------------------------------------------------ kill -9 after COMMIT */

#define KILLED_MESSAGES 40

static void kill_after_commit(const char *name, const harness_options *o, const char *effects)
{
    setup(name, o);
    if (o->handler_yaml)
        create_ledger();
    harness_insert_orders(&F.h, "k", KILLED_MESSAGES, "PAYING");
    for (int i = 0; i < KILLED_MESSAGES; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        publish(id, "PAY_SUCCESS", 1000 + i);
    }
    setenv("IDEMQ_TEST_KILL_AFTER_COMMITS", "1", 1);
    start();
    unsetenv("IDEMQ_TEST_KILL_AFTER_COMMITS");
    int status = harness_wait_exit(F.daemon, DEADLINE_MS);
    cr_assert(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "idemq did not kill itself after its first batch's COMMIT");
    F.daemon = 0;
    /* A message that ran alone before the first batch formed was settled; the batch was not. */
    long long settled = harness_log_count(&F.h, "\"outcome\":\"processed\"");
    long long killed = harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup") - settled;
    cr_assert(killed >= 2 && killed <= 16, "the killed batch committed %lld messages", killed);
    cr_assert_eq(harness_scalar(&F.h, "%s", effects), killed + settled,
                 "the batch's effects committed with its dedup rows");
    /* None of the batch was acked: its messages are back in the queue with the rest. */
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, KILLED_MESSAGES - settled, DEADLINE_MS));

    start();
    cr_assert(
        harness_wait_scalar(&F.h, KILLED_MESSAGES, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    cr_assert(
        harness_wait_log(&F.h, "\"outcome\":\"processed\"", KILLED_MESSAGES - killed, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"deduped\"", killed, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    /* Every effect exactly once; the killed batch's redeliveries were deduped. */
    cr_assert_eq(harness_scalar(&F.h, "%s", effects), KILLED_MESSAGES);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"processed\""), KILLED_MESSAGES - killed);
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"deduped\""), killed);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND "
                                      "amount = 1000 + CAST(SUBSTRING(order_id, 2) AS SIGNED)"),
                 KILLED_MESSAGES);
}

Test(batch, kill_9_between_the_commit_and_the_acks_applies_every_state_change_once)
{
    harness_options o = {.workers = 1};
    kill_after_commit("batch_kill_sm", &o, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'");
}

Test(batch, kill_9_between_the_commit_and_the_acks_inserts_every_ledger_row_once)
{
    static const char handler[] =
        "      type: sql\n"
        "      statements:\n"
        "        - sql: \"INSERT INTO ledger (order_id, amount) VALUES (:order_id, :amount)\"\n"
        "        - sql: \"UPDATE orders SET status = 'PAID', amount = :amount WHERE order_id = "
        ":order_id\"\n";
    harness_options o = {.workers = 1, .handler_yaml = handler};
    kill_after_commit("batch_kill_sql", &o, "SELECT COUNT(DISTINCT order_id) FROM ledger");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM ledger"), KILLED_MESSAGES,
                 "one ledger row per message: none twice");
}
