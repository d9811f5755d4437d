/*
 * test_transaction_guard — the savepoint that proves idemq's transaction survived the handler
 * (adapter/store/pool.c: SAVEPOINT idemq_txn_guard after the dedup insert, RELEASE before COMMIT,
 * verify_transaction), driving the real idemq binary against real RabbitMQ and MariaDB.
 *
 *   commit:   an sql handler CALLs a procedure that COMMITs. The dedup row was committed with
 *             the first half of the effect, so a retry would be swallowed as a duplicate: the
 *             message is dead-lettered (non_retryable, "ended idemq's transaction"), the
 *             statement after the COMMIT is rolled back, and nothing is logged as processed. A
 *             control message through the same handler, whose CALL does not commit, is applied.
 *   rollback: a plugin (tests/support/plugins/swallow_rollback.c) loses the transaction under
 *             it and returns IDEMQ_OK anyway — a lock wait timeout with
 *             innodb_rollback_on_timeout=ON that it ignores (skipped when the server option is
 *             OFF), or a CALLed procedure that runs ROLLBACK (needs no server option). Without
 *             the guard idemq would commit the effect with no dedup row; with it the attempt is
 *             retried ("rolled back under it") and the retry applies the effect exactly once.
 *   whose row: store_transaction_ended on a real deadlock whose other side then commits a copy's
 *             dedup row (what a Galera node's write does to a transaction on another node): the
 *             row's id is not the attempt's, so the message is a duplicate, not a handler's
 *             COMMIT; and the control, the attempt's own row committed under it.
 *
 * Every assertion that matters is made in the database (dedup rows, business rows). Waits are on
 * observable conditions (log lines, row counts, queue depths) with deadlines; no sleep stands in
 * for an event. Each test has its own database and queue (harness.h).
 */
#include <criterion/criterion.h>
#include <mysqld_error.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/message.h"
#include "envelope/envelope.h"
#include "harness.h"
#include "store/session.h"
#include "store/transaction.h"

#ifndef IDEMQ_SWALLOW_ROLLBACK_PLUGIN
#error "CMake passes IDEMQ_SWALLOW_ROLLBACK_PLUGIN (tests/support/plugins/swallow_rollback.c)"
#endif

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define GUARD_COMMIT_REASON "the handler ended idemq's transaction with a COMMIT"
#define GUARD_ROLLBACK_REASON                                                                      \
    "the handler reported success, but idemq's transaction had been rolled back under it"

/* ------------------------------------------------------------------------------ fixture */

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static MYSQL *locker; /* the test's own connection, holding a row lock */

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    if (locker)
        mysql_close(locker); /* rolls back and releases its lock */
    locker = NULL;
    if (h_ready)
        harness_fini(&H);
    h_ready = false;
}

TestSuite(transaction_guard, .fini = teardown, .timeout = 120);

static void setup(const char *name, const harness_options *o)
{
    harness_init(&H, name, o);
    h_ready = true;
}

static char dlq_name[200];

static const char *dlq(void)
{
    snprintf(dlq_name, sizeof dlq_name, "%s.dlq", H.queue);
    return dlq_name;
}

/* Publishes {biz_key: "order_id:<order_id>:PAY", message_id, order_id, commit_inside}. */
static void publish_order_event(const char *order_id, int commit_inside)
{
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"biz_key\":\"order_id:%s:PAY\",\"message_id\":\"m-%s\",\"order_id\":\"%s\","
                     "\"commit_inside\":%d}",
                     order_id, order_id, order_id, commit_inside);
    harness_publish(&H, NULL, "application/json", body, (size_t)n, NULL);
}

static long long dedup_rows(const char *order_id)
{
    return harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = 'order_id:%s:PAY'",
                          order_id);
}

/* The status of an order; the caller frees it. */
static char *order_status(const char *order_id)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT status FROM orders WHERE order_id = '%s'", order_id);
    cr_assert(mysql_query(H.db, sql) == 0, "%s: %s", sql, mysql_error(H.db));
    MYSQL_RES *res = mysql_store_result(H.db);
    cr_assert_not_null(res);
    MYSQL_ROW row = mysql_fetch_row(res);
    char *status = strdup(row && row[0] ? row[0] : "(no row)");
    mysql_free_result(res);
    return status;
}

/* Log lines about order_id's message (its biz_key) that also contain needle. */
static long log_lines_for(const char *order_id, const char *needle)
{
    char key[160];
    snprintf(key, sizeof key, "\"biz_key\":\"order_id:%s:PAY\"", order_id);
    return harness_log_count_both(H.log_path, key, needle);
}

/* The n-th (1-based) log line about order_id's message that carries an outcome, into buf ("" when
 * there is none). */
static void outcome_line(const char *order_id, long n, char *buf, size_t len)
{
    char key[160];
    snprintf(key, sizeof key, "\"biz_key\":\"order_id:%s:PAY\"", order_id);
    buf[0] = '\0';
    FILE *f = fopen(H.log_path, "r");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0)
        if (strstr(line, key) && strstr(line, "\"outcome\":") && --n == 0) {
            snprintf(buf, len, "%s", line);
            break;
        }
    free(line);
    fclose(f);
}

/* Waits until order_id's message has had n outcomes (processed, retried, dead_lettered, ...)
 * and returns the n-th log line in buf: the test then asserts on what happened, instead of
 * waiting out a deadline for the one outcome it expects. */
typedef struct outcome_wait {
    const char *key;
    long n;
} outcome_wait;

static bool outcomes_reached(harness *h, void *arg)
{
    const outcome_wait *w = arg;
    return harness_log_count_both(h->log_path, w->key, "\"outcome\":") >= w->n;
}

static void wait_outcome(const char *order_id, long n, char *buf, size_t len)
{
    char key[160];
    snprintf(key, sizeof key, "\"biz_key\":\"order_id:%s:PAY\"", order_id);
    outcome_wait w = {.key = key, .n = n};
    cr_assert(harness_wait_for(outcomes_reached, &H, &w, DEADLINE_MS),
              "%s's message had no outcome %ld within %d ms", order_id, n, DEADLINE_MS);
    outcome_line(order_id, n, buf, len);
}

static void header_text(const amqp_message_t *m, const char *name, char *buf, size_t len)
{
    amqp_bytes_t v;
    buf[0] = '\0';
    if (message_header_bytes(&m->properties, name, &v))
        snprintf(buf, len, "%.*s", (int)v.len, (const char *)v.bytes);
}

static void create_ledger(void)
{
    harness_sql(&H, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                    "biz_key VARBINARY(128) NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB");
}

static const char *plugin_yaml(const char *plugin_config)
{
    static char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "      type: plugin\n"
             "      path: \"%s\"\n"
             "      config: %s\n",
             IDEMQ_SWALLOW_ROLLBACK_PLUGIN, plugin_config);
    return yaml;
}

/* ------------------------------------------------------------------------------ COMMIT */

/* The CALL commits when the message says so; the UPDATE after it must then not survive. */
static const char committing_sql_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"CALL audit_and_commit(:order_id, :commit_inside)\"\n"
    "        - sql: \"UPDATE orders SET status = 'PAID' WHERE order_id = :order_id\"\n"
    "          expect_rows: 1\n";

Test(transaction_guard, a_called_procedure_that_commits_is_dead_lettered_not_acked)
{
    harness_options o = {.handler_yaml = committing_sql_handler};
    setup("guard_commit", &o);
    harness_sql(&H, "CREATE TABLE audit (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                    "order_id VARCHAR(64) NOT NULL) ENGINE=InnoDB");
    harness_sql(&H, "CREATE PROCEDURE audit_and_commit(IN oid VARCHAR(64), IN do_commit INT) "
                    "BEGIN INSERT INTO audit (order_id) VALUES (oid); "
                    "IF do_commit THEN COMMIT; END IF; END");
    harness_sql(&H, "INSERT INTO orders (order_id, status) VALUES ('c-1', 'PAYING'), "
                    "('plain-1', 'PAYING')");
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    publish_order_event("c-1", 1);     /* the procedure commits idemq's transaction */
    publish_order_event("plain-1", 0); /* control: same handler, the procedure does not commit */

    char line[2048];
    wait_outcome("plain-1", 1, line, sizeof line);
    cr_expect(strstr(line, "\"outcome\":\"processed\""), "the control message: %s", line);
    wait_outcome("c-1", 1, line, sizeof line);
    cr_assert(strstr(line, "\"outcome\":\"dead_lettered\"") && strstr(line, GUARD_COMMIT_REASON),
              "the committing message should be dead-lettered by the guard: %s", line);

    /* The control shows the handler works: both statements are applied with the dedup row. */
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'plain-1' AND "
                                  "status = 'PAID'"));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM audit WHERE order_id = 'plain-1'"), 1);
    cr_expect_eq(dedup_rows("plain-1"), 1);

    cr_assert(harness_wait_queue_depth(&H, dlq(), 1, DEADLINE_MS));
    amqp_message_t m;
    cr_assert(harness_get(&H, dlq(), &m));
    char dead_letter_class[64], error[1100];
    int64_t retries = -1;
    header_text(&m, "idemq-error-class", dead_letter_class, sizeof dead_letter_class);
    header_text(&m, "idemq-error", error, sizeof error);
    message_header_int(&m.properties, "idemq-retries", &retries);
    char body[512];
    snprintf(body, sizeof body, "%.*s", (int)m.body.len, (const char *)m.body.bytes);
    cr_expect(strstr(body, "\"order_id\":\"c-1\""), "the dead letter is not c-1's: %s", body);
    amqp_destroy_message(&m);
    cr_expect_str_eq(dead_letter_class, "non_retryable", "%s", error);
    cr_expect_eq(retries, 0, "a committed dedup row must not go through the retry ladder");
    cr_expect(strstr(error, "ended idemq's transaction"), "idemq-error: %s", error);
    cr_expect(strstr(error, GUARD_COMMIT_REASON), "idemq-error: %s", error);

    /* In the database: the UPDATE after the COMMIT ran in a transaction of its own, which idemq
     * rolled back; the audit row and the dedup row were committed by the procedure. That dedup
     * row is exactly why the message must go to a person: a retry or a replay would be
     * swallowed as a duplicate, and only half of the effect happened. */
    char *status = order_status("c-1");
    cr_expect_str_eq(status, "PAYING", "the UPDATE after the procedure's COMMIT was committed");
    free(status);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM audit WHERE order_id = 'c-1'"), 1,
                 "the procedure's own INSERT was committed by its COMMIT");
    cr_expect_eq(dedup_rows("c-1"), 1, "the procedure's COMMIT committed the dedup row");

    /* The log: dead-lettered as non_retryable, never processed, never retried. */
    cr_expect_eq(log_lines_for("c-1", "\"outcome\":\"processed\""), 0);
    cr_expect_eq(log_lines_for("c-1", "\"outcome\":\"retried\""), 0);
    cr_expect_eq(log_lines_for("c-1", "\"outcome\":\"dead_lettered\""), 1);
    cr_expect_eq(log_lines_for("plain-1", "\"outcome\":\"processed\""), 1);

    /* Settled, not left unacked: after idemq stops, nothing comes back to the work queue. */
    harness_stop_idemq(&daemon_pid);
    cr_expect_eq(harness_queue_depth(&H, H.queue), 0);
    cr_expect_eq(harness_queue_depth(&H, dlq()), 0);
}

/* ------------------------------------------------------------------------------ ROLLBACK */

Test(transaction_guard, a_plugin_that_swallows_a_rolled_back_transaction_is_retried)
{
    harness_options o = {.handler_yaml = plugin_yaml("{mode: lock_wait}"),
                         .workers = 1,
                         .retry_set = true,
                         .max_retries = 5,
                         .base = "2s",
                         .jitter = "0"};
    setup("guard_lock_wait", &o);
    if (harness_scalar(&H, "SELECT @@innodb_rollback_on_timeout") != 1) {
        teardown(); /* a skipped test gets no .fini: drop its database and queues now */
        cr_skip_test("needs innodb_rollback_on_timeout=ON (not dynamic: set it in the server's "
                     "my.cnf). With it OFF a lock wait timeout undoes only the statement, the "
                     "transaction and its dedup row stay: there is nothing for the guard to find. "
                     "a_rollback_in_a_called_procedure_swallowed_by_a_plugin_is_retried covers the "
                     "guard without it.");
    }
    create_ledger();
    /* The plugin CALLs this first: a short lock wait for idemq's own session only, so no GLOBAL
     * variable changes under the other suites (plugins may not run SET themselves). */
    harness_sql(&H, "CREATE PROCEDURE short_lock_wait() "
                    "BEGIN SET SESSION innodb_lock_wait_timeout = 1; END");
    harness_sql(&H, "INSERT INTO orders (order_id, status) VALUES ('lw-1', 'PAYING')");

    /* Hold the order row's lock from another connection: the plugin's UPDATE waits 1 s, times
     * out, and the server rolls back idemq's whole transaction, dedup row included. */
    locker = harness_db_open(&H);
    cr_assert(mysql_query(locker, "START TRANSACTION") == 0, "%s", mysql_error(locker));
    cr_assert(mysql_query(locker, "SELECT status FROM orders WHERE order_id = 'lw-1' FOR UPDATE") ==
                  0,
              "%s", mysql_error(locker));
    mysql_free_result(mysql_store_result(locker));

    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);
    publish_order_event("lw-1", 0);

    /* The first attempt: 1205 ignored by the plugin, OK returned, retried by the guard. */
    char line[2048];
    wait_outcome("lw-1", 1, line, sizeof line);
    cr_assert(strstr(line, "\"outcome\":\"retried\"") && strstr(line, GUARD_ROLLBACK_REASON),
              "the swallowed rollback should be retried with the guard's reason: %s", line);
    cr_expect_eq(harness_log_count_both(H.log_path, "ignoring MySQL error 1205", "lw-1"), 1,
                 "the first attempt did not hit a lock wait timeout");
    cr_expect_eq(log_lines_for("lw-1", "\"outcome\":\"retried\""), 1);
    cr_expect_geq(harness_log_count_both(H.log_path, "retry 1 of 5", GUARD_ROLLBACK_REASON), 1);
    /* Nothing of the first attempt was committed: the ledger row it inserted after the
     * rollback (in a transaction of its own) was rolled back by idemq. */
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM ledger"), 0);
    cr_expect_eq(dedup_rows("lw-1"), 0);

    /* Release the lock; the retry (2 s later) then goes through. */
    cr_assert(mysql_query(locker, "ROLLBACK") == 0, "%s", mysql_error(locker));
    wait_outcome("lw-1", 2, line, sizeof line);
    cr_assert(strstr(line, "processed after 1 retries"), "the retry should succeed: %s", line);

    cr_expect_eq(dedup_rows("lw-1"), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM ledger"), 1, "the effect, exactly once");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM ledger WHERE biz_key = "
                                    "'order_id:lw-1:PAY'"),
                 1);
    char *status = order_status("lw-1");
    cr_expect_str_eq(status, "PAID");
    free(status);
    cr_expect_eq(log_lines_for("lw-1", "\"outcome\":\"dead_lettered\""), 0);
    harness_stop_idemq(&daemon_pid);
    cr_expect_eq(harness_queue_depth(&H, dlq()), 0);
    cr_expect_eq(harness_queue_depth(&H, H.queue), 0);
}

Test(transaction_guard, a_rollback_in_a_called_procedure_swallowed_by_a_plugin_is_retried)
{
    harness_options o = {.handler_yaml = plugin_yaml("{mode: call_rollback, first_n: 1}"),
                         .retry_set = true,
                         .max_retries = 3};
    setup("guard_call_rollback", &o);
    create_ledger();
    harness_sql(&H, "CREATE PROCEDURE rollback_everything() BEGIN ROLLBACK; END");
    harness_sql(&H, "INSERT INTO orders (order_id, status) VALUES ('rb-1', 'PAYING')");
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);
    publish_order_event("rb-1", 0);

    /* The first attempt CALLs the procedure (its ROLLBACK takes the dedup row), then writes the
     * effect in the implicit transaction that follows and returns OK: retried by the guard.
     * Without the guard idemq would commit that effect with no dedup row. */
    char line[2048];
    wait_outcome("rb-1", 1, line, sizeof line);
    cr_assert(strstr(line, "\"outcome\":\"retried\"") && strstr(line, GUARD_ROLLBACK_REASON),
              "the swallowed rollback should be retried with the guard's reason: %s", line);
    wait_outcome("rb-1", 2, line, sizeof line);
    cr_assert(strstr(line, "processed after 1 retries"), "the retry should succeed: %s", line);
    cr_expect_eq(log_lines_for("rb-1", "called rollback_everything()"), 1);
    cr_expect_eq(log_lines_for("rb-1", "\"outcome\":\"retried\""), 1);
    cr_expect_eq(harness_log_count_both(H.log_path, "retry 1 of 3", GUARD_ROLLBACK_REASON), 1);

    cr_expect_eq(dedup_rows("rb-1"), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM ledger"), 1, "the effect, exactly once");
    char *status = order_status("rb-1");
    cr_expect_str_eq(status, "PAID");
    free(status);
    cr_expect_eq(log_lines_for("rb-1", "\"outcome\":\"dead_lettered\""), 0);
    harness_stop_idemq(&daemon_pid);
    cr_expect_eq(harness_queue_depth(&H, dlq()), 0);
    cr_expect_eq(harness_queue_depth(&H, H.queue), 0);
}

/* ---------------------------------------------------------- a deadlock victim and its copy */

typedef struct victim_update {
    MYSQL *db;
    unsigned int error_number; /* the UPDATE's error, 0 when it went through */
} victim_update;

static void *run_victim_update(void *arg)
{
    victim_update *v = arg;
    if (mysql_query(v->db, "UPDATE orders SET status = 'PAID' WHERE order_id = 'g0'") != 0)
        v->error_number = mysql_errno(v->db);
    return NULL;
}

typedef struct waiting_statement {
    unsigned long connection_id;
} waiting_statement;

static bool update_waits(harness *h, void *arg)
{
    const waiting_statement *w = arg;
    return harness_scalar(h,
                          "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %lu AND "
                          "INFO LIKE 'UPDATE orders%%'",
                          w->connection_id) == 1;
}

/* A connection as store_transaction_run leaves it when its handler runs: biz_key's dedup row
 * inserted (its id in *row_id), the guard's savepoint set, the transaction open. */
static MYSQL *open_attempt(const char *biz_key, uint64_t *row_id)
{
    MYSQL *db = harness_db_open(&H);
    cr_assert(mysql_autocommit(db, 0) == 0);
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO msg_dedup (biz_key, handler_name) VALUES ('%s', 'pay-callback')",
             biz_key);
    cr_assert(mysql_query(db, sql) == 0, "%s", mysql_error(db));
    *row_id = mysql_insert_id(db);
    cr_assert_gt(*row_id, 0);
    cr_assert(mysql_query(db, "SAVEPOINT " TXN_GUARD_SAVEPOINT) == 0);
    return db;
}

/* What a Galera node did in a full run: idemq's transaction on one node, a copy of its message
 * committed on another, whose write then aborted idemq's (a deadlock, 1213) and committed the
 * dedup row. The savepoint is gone because the server rolled back, not because the handler
 * committed: the row found is the copy's (another id), so the message is a duplicate — never
 * dead-lettered as a handler that commits. Driven on store_transaction_ended itself, with a real
 * deadlock: in the daemon the copy's COMMIT races idemq's lookup. */
Test(transaction_guard, a_deadlock_victim_whose_copy_committed_the_dedup_row_is_a_duplicate)
{
    setup("guard_deadlock_copy", NULL);
    harness_insert_orders(&H, "g", 1, "PAYING");
    static const char biz_key[] = "order_id:g0:PAY";

    uint64_t own_row_id;
    MYSQL *idemq_db = open_attempt(biz_key, &own_row_id);

    /* The other side holds the order's row and has written more (the filler rows), so InnoDB
     * picks idemq's side as the deadlock's victim. */
    harness_sql(&H, "CREATE TABLE filler (id INT AUTO_INCREMENT PRIMARY KEY, pad CHAR(100)) "
                    "ENGINE=InnoDB");
    locker = harness_db_open(&H);
    cr_assert(mysql_query(locker, "START TRANSACTION") == 0);
    cr_assert(mysql_query(locker, "INSERT INTO filler (pad) SELECT 'x' FROM "
                                  "information_schema.COLUMNS LIMIT 1000") == 0,
              "%s", mysql_error(locker));
    cr_assert(mysql_query(locker, "SELECT status FROM orders WHERE order_id = 'g0' FOR UPDATE") ==
              0);
    mysql_free_result(mysql_store_result(locker));

    victim_update victim = {.db = idemq_db};
    pthread_t thread;
    cr_assert(pthread_create(&thread, NULL, run_victim_update, &victim) == 0);
    waiting_statement w = {.connection_id = mysql_thread_id(idemq_db)};
    bool waited = harness_wait_for(update_waits, &H, &w, DEADLINE_MS);
    /* The copy wants the dedup row: a cycle; the victim's rollback lets it through. */
    int copy_rc = mysql_query(locker, "INSERT INTO msg_dedup (biz_key, handler_name) VALUES "
                                      "('order_id:g0:PAY', 'pay-callback')");
    char copy_error[512];
    snprintf(copy_error, sizeof copy_error, "%s", mysql_error(locker));
    cr_assert(mysql_query(locker, "COMMIT") == 0 || copy_rc != 0);
    pthread_join(thread, NULL);
    cr_assert(waited, "idemq's side never waited for the order's row");
    cr_assert_eq(copy_rc, 0, "the copy was the deadlock's victim instead: %s", copy_error);
    cr_assert_eq(victim.error_number, ER_LOCK_DEADLOCK, "idemq's side got %u, not a deadlock",
                 victim.error_number);
    cr_assert(mysql_query(idemq_db, "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0 &&
                  mysql_errno(idemq_db) == ER_SP_DOES_NOT_EXIST,
              "the deadlock left the savepoint");
    cr_assert_eq(dedup_rows("g0"), 1, "the copy's dedup row is committed");

    static const config single_table = {0}; /* dedup.layout single */
    store_session session = {.db = idemq_db, .cfg = &single_table};
    envelope env = {.biz_key = biz_key};
    /* Whatever the handler made of the rollback: its own failure (as an sql handler reports the
     * deadlock), or success (a plugin that swallowed it). */
    const apply_status reported[] = {APPLY_RETRYABLE, APPLY_NON_RETRYABLE, APPLY_OK};
    for (size_t i = 0; i < sizeof reported / sizeof reported[0]; i++) {
        store_job job = {.env = &env, .mysql_errno = ER_LOCK_DEADLOCK, .dedup_row_id = own_row_id};
        snprintf(job.error, sizeof job.error, "statement 1: MySQL error 1213: Deadlock found");
        bool committed = true;
        apply_status status =
            store_transaction_ended(&session, &job, "pay-callback", reported[i], &committed);
        cr_assert_eq(status, APPLY_DUPLICATE, "handler status %d: got %d: %s", (int)reported[i],
                     (int)status, job.error);
        cr_assert_not(committed, "the copy's row was taken for the handler's COMMIT");
    }
    mysql_close(idemq_db);
}

/* The control: the row found is the attempt's own (its id), committed by the handler — the case
 * the guard exists for, whatever the handler then reported. */
Test(transaction_guard, an_attempts_own_dedup_row_committed_under_it_is_the_handlers_commit)
{
    setup("guard_own_commit", NULL);
    static const char biz_key[] = "order_id:g1:PAY";
    uint64_t own_row_id;
    MYSQL *idemq_db = open_attempt(biz_key, &own_row_id);
    cr_assert(mysql_query(idemq_db, "COMMIT") == 0); /* what a CALLed procedure's COMMIT does */
    cr_assert(mysql_query(idemq_db, "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0);

    static const config single_table = {0}; /* dedup.layout single */
    store_session session = {.db = idemq_db, .cfg = &single_table};
    envelope env = {.biz_key = biz_key};
    const apply_status reported[] = {APPLY_OK, APPLY_RETRYABLE};
    for (size_t i = 0; i < sizeof reported / sizeof reported[0]; i++) {
        store_job job = {.env = &env, .dedup_row_id = own_row_id};
        bool committed = false;
        apply_status status =
            store_transaction_ended(&session, &job, "pay-callback", reported[i], &committed);
        cr_assert_eq(status, APPLY_NON_RETRYABLE, "handler status %d: got %d: %s",
                     (int)reported[i], (int)status, job.error);
        cr_assert(committed);
        cr_assert(strstr(job.error, GUARD_COMMIT_REASON), "%s", job.error);
    }
    mysql_close(idemq_db);
}

/* The rotating layout (store/rotation.h): a rotation between the attempt and the lookup moves
 * the dedup row into msg_dedup_previous, where the lookup must still find it and tell whose it
 * is by its id. The single layout's lookup, on the same tables, finds nothing: the contrast shows
 * the second table is what is read. */
static void rotate_tables(void)
{
    harness_sql(&H, "RENAME TABLE msg_dedup_previous TO msg_dedup_expired, msg_dedup TO "
                    "msg_dedup_previous, msg_dedup_expired TO msg_dedup");
}

Test(transaction_guard, after_a_rotation_the_dedup_row_is_found_in_msg_dedup_previous)
{
    setup("guard_rotated", NULL);
    harness_sql(&H, "CREATE TABLE msg_dedup_previous LIKE msg_dedup");
    static const config single_table = {0};
    static const config rotating = {.dedup = {.layout = CONFIG_DEDUP_ROTATING}};

    /* The attempt's own row, committed by its handler, then rotated away. */
    static const char own_key[] = "order_id:g2:PAY";
    uint64_t own_row_id;
    MYSQL *idemq_db = open_attempt(own_key, &own_row_id);
    cr_assert(mysql_query(idemq_db, "COMMIT") == 0);
    cr_assert(mysql_query(idemq_db, "RELEASE SAVEPOINT " TXN_GUARD_SAVEPOINT) != 0);
    rotate_tables();
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup_previous WHERE biz_key = '%s'",
                                own_key),
                 1);
    envelope own_env = {.biz_key = own_key};
    store_session session = {.db = idemq_db, .cfg = &rotating};
    store_job job = {.env = &own_env, .dedup_row_id = own_row_id};
    bool committed = false;
    apply_status status =
        store_transaction_ended(&session, &job, "pay-callback", APPLY_OK, &committed);
    cr_assert_eq(status, APPLY_NON_RETRYABLE, "got %d: %s", (int)status, job.error);
    cr_assert(committed, "the handler's COMMIT in msg_dedup_previous was not found");
    session.cfg = &single_table;
    job = (store_job){.env = &own_env, .dedup_row_id = own_row_id};
    status = store_transaction_ended(&session, &job, "pay-callback", APPLY_OK, &committed);
    cr_assert_eq(status, APPLY_RETRYABLE, "the single layout's lookup reads msg_dedup only");

    /* A copy's row (another id), committed after the server rolled the attempt back, then
     * rotated away. */
    static const char copy_key[] = "order_id:g3:PAY";
    uint64_t attempt_row_id;
    MYSQL *attempt_db = open_attempt(copy_key, &attempt_row_id);
    cr_assert(mysql_query(attempt_db, "ROLLBACK") == 0); /* as the server's deadlock rollback */
    harness_sql(&H, "INSERT INTO msg_dedup (biz_key, handler_name) VALUES ('%s', 'pay-callback')",
                copy_key);
    rotate_tables();
    envelope copy_env = {.biz_key = copy_key};
    store_session attempt = {.db = attempt_db, .cfg = &rotating};
    store_job copy_job = {.env = &copy_env, .dedup_row_id = attempt_row_id};
    status = store_transaction_ended(&attempt, &copy_job, "pay-callback", APPLY_RETRYABLE,
                                     &committed);
    cr_assert_eq(status, APPLY_DUPLICATE, "got %d: %s", (int)status, copy_job.error);
    cr_assert_not(committed);
    mysql_close(attempt_db);
    mysql_close(idemq_db);
}
