/*
 * test_copies — a retry/DLQ copy is published only for a delivery whose connection is still the
 * one it came on (adapter/broker/session.c broker_publish_copy → BROKER_E_STALE; run.c
 * publish_copy logs "no dead-letter copy: the delivery's connection closed; the broker
 * redelivers it" and drops it). Otherwise a broker reconnect while failures are being processed
 * makes two copies of one failure: one from the result that comes back after the connection is
 * gone, one from the redelivery.
 *
 * The failures wait at a gate on purpose: an sql handler whose first statement updates a row the
 * test holds locked, and whose second matches no row (expect_rows 1, on_mismatch dead_letter:
 * non-retryable). With 4 workers and prefetch 10, all 10 deliveries are inside idemq when only
 * idemq's own AMQP connection is closed by the broker (rabbitmqctl close_connection, found by its
 * client port: other suites' connections stay up). The test opens the gate only once idemq has
 * logged the loss, so every result of the first connection comes back after it is gone, however
 * long rabbitmqctl takes on a loaded machine (a fixed DO SLEEP(3) here once let results come
 * back before the close).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define FAILURES 10
#define GATE_SQL "UPDATE copies_gate SET passes = passes + 1 WHERE id = 1"
#define STALE_LINE "the delivery's connection closed and the broker redelivers it"
#define DEAD_LETTERED_LINE "\"outcome\":\"dead_lettered\""

static harness H;
static bool h_ready;
static pid_t daemon_pid;

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    if (h_ready) {
        harness_fini(&H);
        h_ready = false;
    }
}

#define STR2(x) #x
#define STR(x) STR2(x)

static const char slow_failing_handler[] =
    "      type: sql\n"
    "      on_mismatch: dead_letter\n"
    "      statements:\n"
    "        - sql: \"" GATE_SQL "\"\n"
    "        - sql: \"UPDATE orders SET status = 'SEEN' WHERE order_id = :order_id\"\n"
    "          expect_rows: 1\n";

typedef struct depth_wait {
    const char *queue;
    long expected, last;
} depth_wait;

static bool depth_at_least(harness *h, void *arg)
{
    depth_wait *w = arg;
    w->last = harness_queue_depth(h, w->queue);
    return w->last >= w->expected;
}

Test(copies, a_reconnect_while_failures_are_pending_makes_exactly_one_copy_each, .fini = teardown,
     .timeout = 180)
{
    harness_options o = {.workers = 4, .prefetch = FAILURES, .handler_yaml = slow_failing_handler};
    harness_init(&H, "copies_reconnect", &o);
    h_ready = true;
    /* The gate: idemq's workers queue behind this lock (its lock wait is at most 20 s). */
    harness_sql(&H, "CREATE TABLE copies_gate (id INT PRIMARY KEY, passes INT NOT NULL)");
    harness_sql(&H, "INSERT INTO copies_gate VALUES (1, 0)");
    MYSQL *gate = harness_db_open(&H);
    cr_assert(mysql_query(gate, "START TRANSACTION") == 0, "%s", mysql_error(gate));
    cr_assert(mysql_query(gate, "SELECT passes FROM copies_gate WHERE id = 1 FOR UPDATE") == 0, "%s",
              mysql_error(gate));
    mysql_free_result(mysql_store_result(gate));
    harness_start_idemq(&H, "started consuming", 20000, &daemon_pid);

    for (int i = 0; i < FAILURES; i++) {
        char order_id[32];
        snprintf(order_id, sizeof order_id, "c%d", i);
        harness_publish_event(&H, order_id, "PAY_SUCCESS", i + 1);
    }
    /* Every worker waits at the gate: the first connection's results are all still to come. */
    char busy_sql[512];
    snprintf(busy_sql, sizeof busy_sql,
             "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '%s' AND "
             "INFO LIKE 'UPDATE copies_gate%%'",
             H.database);
    long long busy = harness_wait_scalar_at_least(&H, 4, 15000, busy_sql);
    cr_assert(busy >= 4, "only %lld DB worker(s) at the gate", busy);
    long early_dead_letters = harness_log_count(&H, DEAD_LETTERED_LINE);
    cr_assert_eq(early_dead_letters, 0, "a failure came back before the connection was closed");

    cr_assert(harness_close_amqp_connection_of(daemon_pid, "idemq test: reconnect mid-failure"),
              "the broker lists no connection of idemq (pid %d)", (int)daemon_pid);
    cr_assert(harness_wait_log(&H, "RabbitMQ connection lost", 1, 10000),
              "idemq did not notice its connection closing");
    /* The loss is logged after the session dropped the connection: from now on every result of
     * the first connection is stale. */
    cr_assert(mysql_query(gate, "COMMIT") == 0, "%s", mysql_error(gate));
    mysql_close(gate);
    cr_assert(harness_wait_log(&H, "reconnected to RabbitMQ", 1, 20000), "idemq did not reconnect");

    /* 10 results of the first connection (stale) and 10 of the redeliveries: 20 failures, of
     * which only the redeliveries may make copies. */
    char dlq[160];
    snprintf(dlq, sizeof dlq, "%s.dlq", H.queue);
    depth_wait d = {.queue = dlq, .expected = FAILURES};
    cr_assert(harness_wait_for(depth_at_least, &H, &d, 60000), "the DLQ holds %ld of %d", d.last,
              FAILURES);
    /* An outcome is logged once it is final: the redeliveries' confirmed copies as dead-lettered,
     * the stale results as requeued. */
    cr_assert(harness_wait_log(&H, DEAD_LETTERED_LINE, FAILURES, 60000),
              "idemq did not finish the redeliveries' failures");
    cr_assert(harness_wait_log(&H, STALE_LINE, FAILURES, 60000),
              "idemq did not finish the first connection's failures");
    cr_assert(harness_wait_queue_settled(&H, H.queue, 30000), "the work queue did not settle");
    /* Stopping settles the question "could a late copy still come": after exit nothing can. */
    harness_stop_idemq(&daemon_pid);

    long stale = harness_log_count(&H, STALE_LINE);
    long dead_lettered = harness_log_count(&H, DEAD_LETTERED_LINE);
    long unconfirmed = harness_log_count(&H, "broker did not confirm");
    long summary_ok = harness_log_count(&H, "dead_lettered=" STR(FAILURES) " ");
    fprintf(stderr,
            "[measure] copies: %ld stale result(s) logged \"no dead-letter copy\", %ld "
            "dead-lettered outcome lines, %ld unconfirmed copies, DLQ depth %ld\n",
            stale, dead_lettered, unconfirmed, harness_queue_depth(&H, dlq));

    /* Exactly one copy per failure. */
    int seen[FAILURES] = {0};
    long total = 0, unknown = 0;
    amqp_message_t m;
    while (harness_get(&H, dlq, &m)) {
        total++;
        json_t *body = json_loadb(m.body.bytes, m.body.len, 0, NULL);
        const char *biz_key = json_string_value(json_object_get(body, "biz_key"));
        int i = -1;
        if (!biz_key || sscanf(biz_key, "order_id:c%d:PAY_SUCCESS", &i) != 1 || i < 0 ||
            i >= FAILURES)
            unknown++;
        else
            seen[i]++;
        json_decref(body);
        amqp_destroy_message(&m);
    }
    cr_assert_eq(total, FAILURES, "the DLQ held %ld copies for %d failures", total, FAILURES);
    cr_assert_eq(unknown, 0);
    for (int i = 0; i < FAILURES; i++)
        cr_assert_eq(seen[i], 1, "order_id:c%d:PAY_SUCCESS has %d DLQ copies", i, seen[i]);
    cr_assert(stale >= 1,
              "no \"%s\" line: the results of the closed connection did not take the stale path "
              "(the gate opened too early)",
              STALE_LINE);
    cr_assert_eq(stale, FAILURES, "each failure runs once per connection");
    cr_assert_eq(dead_lettered, FAILURES, "a dead-lettered line only for a confirmed copy");
    cr_assert_eq(unconfirmed, 0);
    cr_assert_eq(summary_ok, 1, "idemq's summary should count %d dead-lettered messages", FAILURES);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 0,
                 "a failed message left a dedup row");
}
