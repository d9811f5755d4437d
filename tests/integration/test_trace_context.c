/*
 * test_trace_context — W3C trace context follows a message through everything idemq publishes
 * because of it: the real idemq binary against real RabbitMQ and MariaDB (or MySQL 9.7).
 *
 *   configured emit     a state machine transition's emit, relayed: the downstream message's
 *                       traceparent has the producer's trace id and flags, a parent id that is
 *                       not the producer's but the span_id idemq logged for the message, and the
 *                       tracestate unchanged; every log line of the message carries trace_id;
 *                       the relay's line about the row does too. A message without traceparent
 *                       emits none, one with an invalid traceparent (uppercase) emits neither
 *                       header and logs no trace_id.
 *   plugin emit         the same through a plugin's host->emit (tests/support/plugins/emitter.c).
 *   copies              a message that retries and is then dead-lettered: the retried delivery
 *                       logs the same traceparent and trace_id with a span of its own, the dead
 *                       letter (made from the retry copy) carries traceparent and tracestate, and
 *                       `idemq dlq replay` puts them back on the work queue unchanged.
 *   migrate             an idemq_outbox from before the trace context columns: `idemq check`
 *                       fails naming the column; `idemq run` pauses at the first emit saying to
 *                       run `idemq migrate`; `idemq migrate` adds both, the run resumes by itself
 *                       and the held message's emit carries the trace; check passes.
 *   batched             emits of messages applied in one transaction (the state machine's
 *                       set-based path, the sql handler's savepoints) each carry their own
 *                       message's trace id and span.
 *
 * Each test has its own database and queues (harness.h).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "harness.h"
#include "util/trace_context.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define RELAY_ON "outbox: {relay: true, lease: 1s, poll_interval: 200ms}\n"

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"
#define PRODUCER_SPAN "00f067aa0ba902b7"
#define TRACEPARENT "00-" TID "-" PRODUCER_SPAN "-01"
#define TRACESTATE "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"

static harness_fixture F;
static char emit_queue[200];

static void teardown(void)
{
    if (F.ready && emit_queue[0] && F.h.amqp) {
        amqp_queue_delete(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(emit_queue), 0, 0);
        amqp_get_rpc_reply(F.h.amqp);
    }
    emit_queue[0] = '\0';
    harness_fixture_fini(&F);
}

TestSuite(trace_context, .fini = teardown, .timeout = 240);

/* ------------------------------------------------------------------------------ helpers */

/* Publishes body to the work queue with traceparent / tracestate headers (NULL: none). */
static void publish_traced(const char *body, const char *traceparent, const char *tracestate)
{
    amqp_basic_properties_t props = {0};
    amqp_table_entry_t headers[2];
    int n = 0;
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    if (traceparent)
        headers[n++] = harness_field_text("traceparent", traceparent);
    if (tracestate)
        headers[n++] = harness_field_text("tracestate", tracestate);
    if (n) {
        props._flags |= AMQP_BASIC_HEADERS_FLAG;
        props.headers = (amqp_table_t){.num_entries = n, .entries = headers};
    }
    harness_publish_props(&F.h, NULL, F.h.queue, &props, body, strlen(body));
}

static void declare_emit_queue(const char *suffix)
{
    snprintf(emit_queue, sizeof emit_queue, "%s%s", F.h.queue, suffix);
    amqp_queue_declare(F.h.amqp, BROKER_CHANNEL, amqp_cstring_bytes(emit_queue), 0, 1, 0, 0,
                       amqp_empty_table);
    cr_assert(amqp_get_rpc_reply(F.h.amqp).reply_type == AMQP_RESPONSE_NORMAL,
              "declaring %s failed", emit_queue);
}

/* mysql: the harness's line with one worker, and debug logs (the relay's per-row line). */
static void debug_logs(void)
{
    harness_config_replace_line(&F.h, "log: ", "log: {level: debug}");
}

/* One message from queue within timeout_ms (true), or false. */
static bool get_message(const char *queue, amqp_message_t *msg, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    while (!harness_get(&F.h, queue, msg)) {
        if (harness_now_ms() > deadline)
            return false;
        usleep(20 * 1000);
    }
    return true;
}

/* The string header name of msg as a NUL-terminated copy in out; false when absent. */
static bool header_text(const amqp_message_t *msg, const char *name, char *out, size_t out_len)
{
    amqp_bytes_t v;
    out[0] = '\0';
    if (!message_header_bytes(&msg->properties, name, &v))
        return false;
    snprintf(out, out_len, "%.*s", (int)v.len, (const char *)v.bytes);
    return true;
}

/* The emitted message whose body mentions needle (the emits of the test's messages arrive in any
 * order between them); copies its traceparent and tracestate ("" when absent). */
typedef struct emitted {
    char body[1024];
    char traceparent[128];
    char tracestate[1024];
    bool has_traceparent, has_tracestate;
} emitted;

static void collect_emits(emitted *out, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        amqp_message_t msg;
        cr_assert(get_message(emit_queue, &msg, DEADLINE_MS),
                  "emit %zu of %zu did not arrive on %s", i + 1, count, emit_queue);
        snprintf(out[i].body, sizeof out[i].body, "%.*s", (int)msg.body.len,
                 (const char *)msg.body.bytes);
        out[i].has_traceparent =
            header_text(&msg, "traceparent", out[i].traceparent, sizeof out[i].traceparent);
        out[i].has_tracestate =
            header_text(&msg, "tracestate", out[i].tracestate, sizeof out[i].tracestate);
        amqp_destroy_message(&msg);
    }
}

static const emitted *emit_with(const emitted *e, size_t count, const char *needle)
{
    for (size_t i = 0; i < count; i++)
        if (strstr(e[i].body, needle))
            return &e[i];
    cr_assert_fail("no emitted message mentions %s", needle);
    return NULL;
}

/* The log lines (borrowed from lines) of biz_key, into out (at most max); returns how many. */
static size_t lines_of(json_t *lines, const char *biz_key, json_t **out, size_t max)
{
    size_t n = 0, i;
    json_t *line;
    json_array_foreach(lines, i, line)
    {
        if (n < max && strcmp(harness_json_str(line, "biz_key"), biz_key) == 0)
            out[n++] = line;
    }
    return n;
}

/* The span_id of biz_key's line with outcome (borrowed from lines); fails the test without one. */
static const char *span_logged(json_t *lines, const char *biz_key, const char *outcome)
{
    json_t *mine[32];
    size_t n = lines_of(lines, biz_key, mine, 32);
    for (size_t i = 0; i < n; i++)
        if (strcmp(harness_json_str(mine[i], "outcome"), outcome) == 0)
            return harness_json_str(mine[i], "span_id");
    cr_assert_fail("no %s log line for %s", outcome, biz_key);
    return NULL;
}

/* What a continued trace must look like: the producer's trace id and flags, idemq's span
 * (logged_span, from the message's own log line) as the parent, valid W3C, tracestate as sent. */
static void expect_child(const emitted *e, const char *logged_span, const char *what)
{
    cr_assert(e->has_traceparent, "%s: the emitted message has no traceparent", what);
    trace_context t;
    memset(&t, 0, sizeof t);
    cr_assert(trace_parent_parse(e->traceparent, strlen(e->traceparent), &t),
              "%s: emitted traceparent '%s' is not valid W3C", what, e->traceparent);
    cr_expect_eq(strncmp(e->traceparent, "00-", 3), 0, "%s: version", what);
    cr_expect_str_eq(t.trace_id, TID, "%s: the trace id changed", what);
    cr_expect_str_eq(t.flags, "01", "%s: the trace flags changed", what);
    cr_expect_str_neq(t.parent_id, PRODUCER_SPAN, "%s: the parent is still the producer's", what);
    cr_expect_str_eq(t.parent_id, logged_span,
                     "%s: the parent id is not the span idemq logged for the message", what);
    cr_expect(e->has_tracestate, "%s: the emitted message has no tracestate", what);
    cr_expect_str_eq(e->tracestate, TRACESTATE, "%s: tracestate changed", what);
}

/* Every log line of biz_key carries trace_id TID and the same span_id; at least one line. */
static void expect_lines_traced(json_t *lines, const char *biz_key)
{
    json_t *mine[32];
    size_t n = lines_of(lines, biz_key, mine, 32);
    cr_assert_gt(n, 0, "no log line for %s", biz_key);
    for (size_t i = 0; i < n; i++) {
        cr_expect_str_eq(harness_json_str(mine[i], "trace_id"), TID, "line %zu of %s: %s", i,
                         biz_key, harness_json_str(mine[i], "msg"));
        cr_expect_str_eq(harness_json_str(mine[i], "traceparent"), TRACEPARENT);
        cr_expect_eq(strlen(harness_json_str(mine[i], "span_id")), TRACE_SPAN_ID_HEX);
    }
}

/* -------------------------------------------------------------------------- configured emit */

Test(trace_context, a_configured_emit_continues_the_trace_of_its_message)
{
    static char handler[2048];
    harness_fixture_init(&F, "trace_emit", NULL);
    snprintf(
        handler, sizeof handler,
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
        "          emit: {name: paid, routing_key: \"%s.paid\", fields: {order_id: order_id}}\n",
        F.h.queue);
    harness_options o = {.handler_yaml = handler, .top_yaml = RELAY_ON, .workers = 2};
    harness_write_config(&F.h, &o);
    debug_logs();
    harness_insert_orders(&F.h, "tr", 3, "PAYING");
    declare_emit_queue(".paid");
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);

    publish_traced("{\"biz_key\":\"order_id:tr0:PAY_SUCCESS\",\"order_id\":\"tr0\","
                   "\"event_type\":\"PAY_SUCCESS\"}",
                   TRACEPARENT, TRACESTATE);
    publish_traced("{\"biz_key\":\"order_id:tr1:PAY_SUCCESS\",\"order_id\":\"tr1\","
                   "\"event_type\":\"PAY_SUCCESS\"}",
                   NULL, TRACESTATE);
    /* Uppercase hex is invalid W3C: not propagated as if it were valid. */
    publish_traced("{\"biz_key\":\"order_id:tr2:PAY_SUCCESS\",\"order_id\":\"tr2\","
                   "\"event_type\":\"PAY_SUCCESS\"}",
                   "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", TRACESTATE);

    emitted e[3];
    collect_emits(e, 3);
    cr_assert(harness_wait_scalar(&F.h, 3, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"),
              "the three rows were not marked published");
    json_t *lines = harness_log_load(&F.h);
    const char *span = span_logged(lines, "order_id:tr0:PAY_SUCCESS", "processed");
    expect_child(emit_with(e, 3, "\"tr0\""), span, "configured emit");
    expect_lines_traced(lines, "order_id:tr0:PAY_SUCCESS");

    const emitted *none = emit_with(e, 3, "\"tr1\"");
    cr_expect(!none->has_traceparent && !none->has_tracestate,
              "a message without traceparent emitted traceparent '%s' tracestate '%s'",
              none->traceparent, none->tracestate);
    const emitted *invalid = emit_with(e, 3, "\"tr2\"");
    cr_expect(!invalid->has_traceparent && !invalid->has_tracestate,
              "an invalid traceparent was propagated: traceparent '%s' tracestate '%s'",
              invalid->traceparent, invalid->tracestate);
    json_t *mine[32];
    size_t n = lines_of(lines, "order_id:tr2:PAY_SUCCESS", mine, 32);
    cr_assert_gt(n, 0);
    for (size_t i = 0; i < n; i++) {
        cr_expect_str_eq(harness_json_str(mine[i], "trace_id"), "",
                         "an invalid traceparent logged a trace_id");
        cr_expect_str_eq(harness_json_str(mine[i], "traceparent"),
                         "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
                         "the producer's header is still logged as it came");
    }

    /* The relay's line about the row names the trace too. */
    size_t i;
    json_t *line;
    bool relay_line = false;
    json_array_foreach(lines, i, line)
    {
        if (strstr(harness_json_str(line, "msg"), "outbox relay: published row") &&
            strstr(harness_json_str(line, "msg"), "order_id:tr0:PAY_SUCCESS")) {
            relay_line = true;
            cr_expect_str_eq(harness_json_str(line, "trace_id"), TID);
        }
    }
    cr_expect(relay_line, "no relay line about tr0's row");
    json_decref(lines);

    /* The stored row is what the relay sent. */
    cr_expect_eq(harness_scalar(&F.h,
                                "SELECT COUNT(*) FROM idemq_outbox WHERE source_biz_key = "
                                "'order_id:tr0:PAY_SUCCESS' AND tracestate = '%s'",
                                TRACESTATE),
                 1);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM idemq_outbox WHERE traceparent IS "
                                      "NULL AND tracestate IS NULL"),
                 2);
}

/* ------------------------------------------------------------------------------ plugin emit */

Test(trace_context, a_plugin_emit_continues_the_trace_of_its_message)
{
    static char handler[2048], plugin[1024];
    char bin[1024];
    snprintf(bin, sizeof bin, "%s", IDEMQ_BINARY);
    snprintf(plugin, sizeof plugin, "%s/tests/plugins/emitter.so", dirname(bin));
    cr_assert(access(plugin, R_OK) == 0, "%s is missing: build the tests", plugin);
    harness_fixture_init(&F, "trace_plugin", NULL);
    snprintf(handler, sizeof handler,
             "      type: plugin\n"
             "      path: \"%s\"\n"
             "      config: {routing_key: \"%s.plugin\"}\n",
             plugin, F.h.queue);
    harness_options o = {.handler_yaml = handler, .top_yaml = RELAY_ON, .workers = 1};
    harness_write_config(&F.h, &o);
    harness_sql(&F.h, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key "
                      "VARBINARY(128) NOT NULL, order_id VARCHAR(64) NOT NULL, amount BIGINT NOT "
                      "NULL) ENGINE=InnoDB");
    declare_emit_queue(".plugin");
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);

    publish_traced("{\"biz_key\":\"ledger:p0\",\"order_id\":\"p0\",\"amount\":5}", TRACEPARENT,
                   TRACESTATE);
    publish_traced("{\"biz_key\":\"ledger:p1\",\"order_id\":\"p1\",\"amount\":6}", NULL, NULL);
    emitted e[2];
    collect_emits(e, 2);
    json_t *lines = harness_log_load(&F.h);
    const char *span = span_logged(lines, "ledger:p0", "processed");
    expect_child(emit_with(e, 2, "\"p0\""), span, "plugin emit");
    expect_lines_traced(lines, "ledger:p0");
    const emitted *none = emit_with(e, 2, "\"p1\"");
    cr_expect(!none->has_traceparent && !none->has_tracestate,
              "a message without traceparent emitted one through the plugin: '%s'",
              none->traceparent);
    json_decref(lines);
}

/* ------------------------------------------------- retry copy, dead letter, dlq replay */

Test(trace_context, retry_copies_dead_letters_and_replays_keep_the_trace_headers)
{
    /* No order rows: every message is retryable (row missing), retried once, then dead. */
    harness_options o = {
        .retry_set = true, .max_retries = 1, .base = "100ms", .jitter = "0", .workers = 1};
    harness_fixture_init(&F, "trace_copies", &o);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    publish_traced("{\"biz_key\":\"order_id:c0:PAY_SUCCESS\",\"order_id\":\"c0\","
                   "\"event_type\":\"PAY_SUCCESS\"}",
                   TRACEPARENT, TRACESTATE);
    publish_traced("{\"biz_key\":\"order_id:c1:PAY_SUCCESS\",\"order_id\":\"c1\","
                   "\"event_type\":\"PAY_SUCCESS\"}",
                   TRACEPARENT, TRACESTATE);
    char dlq[160];
    snprintf(dlq, sizeof dlq, "%s.dlq", F.h.queue);
    cr_assert(harness_wait_queue_depth(&F.h, dlq, 2, DEADLINE_MS), "the two did not reach %s", dlq);

    /* The retried delivery (the retry copy, consumed) carried the trace: same traceparent and
     * trace id in its lines, and a span of its own (another processing of the message). */
    json_t *lines = harness_log_load(&F.h);
    expect_lines_traced(lines, "order_id:c0:PAY_SUCCESS");
    const char *first = span_logged(lines, "order_id:c0:PAY_SUCCESS", "retried");
    const char *second = span_logged(lines, "order_id:c0:PAY_SUCCESS", "dead_lettered");
    cr_expect_str_neq(first, second, "a retried delivery must be a span of its own");
    json_decref(lines);
    harness_stop_idemq(&F.daemon);

    /* The dead letter, made from the retry copy, keeps both headers as the producer sent them. */
    amqp_message_t msg;
    char value[1024];
    cr_assert(get_message(dlq, &msg, DEADLINE_MS));
    char body[512];
    snprintf(body, sizeof body, "%.*s", (int)msg.body.len, (const char *)msg.body.bytes);
    cr_expect(header_text(&msg, "traceparent", value, sizeof value), "DLQ copy: no traceparent");
    cr_expect_str_eq(value, TRACEPARENT);
    cr_expect(header_text(&msg, "tracestate", value, sizeof value), "DLQ copy: no tracestate");
    cr_expect_str_eq(value, TRACESTATE);
    int64_t retries = -1;
    cr_expect(message_header_int(&msg.properties, "idemq-retries", &retries) && retries == 1,
              "the dead letter did not come through the retry ladder (idemq-retries %lld)",
              (long long)retries);
    amqp_destroy_message(&msg);

    /* The other one is replayed by `idemq dlq replay`: back on the work queue, headers kept. */
    char *out = NULL;
    const char *args[] = {"dlq",     "replay",  "-c",    F.h.config_path,
                          "--queue", F.h.queue, "--all", NULL};
    cr_assert_eq(harness_run_cli(&F.h, &out, args), 0, "dlq replay failed: %s", out);
    free(out);
    cr_assert(get_message(F.h.queue, &msg, DEADLINE_MS), "the replay is not on %s", F.h.queue);
    cr_expect(header_text(&msg, "traceparent", value, sizeof value), "replay: no traceparent");
    cr_expect_str_eq(value, TRACEPARENT);
    cr_expect(header_text(&msg, "tracestate", value, sizeof value), "replay: no tracestate");
    cr_expect_str_eq(value, TRACESTATE);
    cr_expect(!message_header_int(&msg.properties, "idemq-retries", &retries),
              "a replay starts afresh (no idemq-retries)");
    cr_expect(strstr(body, "c0") || strstr(body, "c1"));
    amqp_destroy_message(&msg);
}

/* ---------------------------------------------------------------------------------- migrate */

Test(trace_context, migrate_adds_the_columns_and_check_and_run_name_them_until_then)
{
    static char handler[1024];
    harness_fixture_init(&F, "trace_migrate", NULL);
    snprintf(handler, sizeof handler,
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
             "          emit: {name: paid, routing_key: \"%s.paid\", fields: {order_id: "
             "order_id}}\n",
             F.h.queue);
    harness_options o = {.handler_yaml = handler, .top_yaml = RELAY_ON, .workers = 1};
    harness_write_config(&F.h, &o);
    harness_insert_orders(&F.h, "m", 1, "PAYING");
    declare_emit_queue(".paid");
    /* The layout of an idemq_outbox written before this version. */
    harness_sql(&F.h, "ALTER TABLE idemq_outbox DROP COLUMN traceparent, DROP COLUMN tracestate");

    char *out = NULL;
    const char *check[] = {"check", "-c", F.h.config_path, NULL};
    cr_expect_eq(harness_run_cli(&F.h, &out, check), 1, "check passed on an old outbox: %s", out);
    cr_expect(strstr(out, "idemq_outbox has no traceparent column") && strstr(out, "idemq migrate"),
              "check does not name the missing column and the fix:\n%s", out);
    free(out);

    /* Run without the migration: the message's emit cannot be written; consumption pauses as
     * for any schema error, saying what fixes it, and the message waits (not dead-lettered). */
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    publish_traced("{\"biz_key\":\"order_id:m0:PAY_SUCCESS\",\"order_id\":\"m0\","
                   "\"event_type\":\"PAY_SUCCESS\"}",
                   TRACEPARENT, TRACESTATE);
    cr_assert(harness_wait_log(&F.h, "run `idemq migrate`", 1, DEADLINE_MS),
              "idemq run did not say to run idemq migrate");
    /* ... and the outage probe keeps it paused (it prepares the outbox insert too) instead of
     * resuming into the same failure. */
    cr_assert(harness_wait_log(&F.h, "schema error persists", 1, DEADLINE_MS),
              "the probe did not find the outbox unmigrated");
    cr_expect(harness_log_count_both(F.h.log_path, "schema error persists", "idemq migrate") > 0,
              "the probe's line does not say to run idemq migrate");
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 0);

    out = NULL;
    const char *migrate[] = {"migrate", "-c", F.h.config_path, NULL};
    cr_assert_eq(harness_run_cli(&F.h, &out, migrate), 0, "migrate failed: %s", out);
    cr_expect(strstr(out, "added idemq_outbox.traceparent and tracestate"), "migrate said: %s",
              out);
    free(out);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE "
                                      "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idemq_outbox' "
                                      "AND COLUMN_NAME IN ('traceparent', 'tracestate') AND "
                                      "IS_NULLABLE = 'YES'"),
                 2);

    /* The paused run resumes by itself once the probe can prepare the outbox insert, and the
     * held message's emit continues its trace. */
    emitted e[1];
    collect_emits(e, 1);
    cr_expect(e[0].has_traceparent && strncmp(e[0].traceparent, "00-" TID "-", 36) == 0,
              "the emit after the migration: traceparent '%s'", e[0].traceparent);
    cr_expect_str_eq(e[0].tracestate, TRACESTATE);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 1);

    out = NULL;
    cr_assert_eq(harness_run_cli(&F.h, &out, migrate), 0, "a second migrate failed: %s", out);
    cr_expect(!strstr(out, "added idemq_outbox"), "the second migrate added again: %s", out);
    free(out);
    out = NULL;
    cr_expect_eq(harness_run_cli(&F.h, &out, check), 0, "check after migrate: %s", out);
    free(out);
}

/* --------------------------------------------- batched: each message continues its own trace */

#define BATCHED 12

/* Messages tr-b0.. published before idemq starts (so they share transactions: mysql.batch 32,
 * the longest linger), each with its own trace id: each emit carries its own message's trace id
 * and span, never a neighbour's in the batch. */
static void batched_emits(const char *name, const char *handler_head, const char *handler_tail,
                          bool ledger)
{
    static char handler[2048];
    harness_fixture_init(&F, name, NULL);
    /* The emit's routing key (the queue named after this test's) goes between head and tail. */
    snprintf(handler, sizeof handler, "%s%s.out%s", handler_head, F.h.queue, handler_tail);
    harness_options o = {.handler_yaml = handler, .top_yaml = RELAY_ON, .workers = 1};
    harness_write_config(&F.h, &o);
    const char *base = getenv("IDEMQ_TEST_MYSQL_URL");
    const char *path = strchr(base + strlen("mysql://"), '/');
    const char *query = strchr(base, '?');
    char mysql[1024];
    snprintf(mysql, sizeof mysql,
             "mysql: {url: \"%.*s/%s%s\", workers: 1, batch: 32, batch_linger_ms: 50}",
             (int)(path - base), base, F.h.database, query ? query : "");
    harness_config_replace_line(&F.h, "mysql: ", mysql);
    debug_logs();
    if (ledger)
        harness_sql(&F.h, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id "
                          "VARCHAR(64) NOT NULL) ENGINE=InnoDB");
    harness_insert_orders(&F.h, "b", BATCHED, "PAYING");
    declare_emit_queue(".out");
    harness_declare_topology(&F.h);
    char body[256], tp[512], tid[BATCHED][TRACE_ID_HEX + 1];
    for (int i = 0; i < BATCHED; i++) {
        snprintf(tid[i], sizeof tid[i], "%032x", 0xa0 + i);
        snprintf(tp, sizeof tp, "00-%s-%016x-00", tid[i], 0xb0 + i);
        snprintf(body, sizeof body,
                 "{\"biz_key\":\"order_id:b%d:PAY_SUCCESS\",\"order_id\":\"b%d\","
                 "\"event_type\":\"PAY_SUCCESS\"}",
                 i, i);
        publish_traced(body, tp, i % 2 ? "k=odd" : NULL);
    }
    harness_start_idemq(&F.h, READY_LINE, DEADLINE_MS, &F.daemon);
    emitted e[BATCHED];
    collect_emits(e, BATCHED);
    json_t *lines = harness_log_load(&F.h);
    size_t i;
    json_t *line;
    bool batched = false;
    json_array_foreach(lines, i, line)
    {
        int n = 0;
        if (sscanf(harness_json_str(line, "msg"), "batch of %d messages", &n) == 1 && n > 1)
            batched = true;
    }
    cr_expect(batched, "no batch of more than one message formed");
    for (int k = 0; k < BATCHED; k++) {
        char key[64], needle[16];
        snprintf(key, sizeof key, "order_id:b%d:PAY_SUCCESS", k);
        snprintf(needle, sizeof needle, "\"b%d\"", k);
        const emitted *em = emit_with(e, BATCHED, needle);
        const char *span = span_logged(lines, key, "processed");
        char want[512]; /* larger than a traceparent: a wrong span must show whole */
        snprintf(want, sizeof want, "00-%s-%s-00", tid[k], span);
        cr_expect_str_eq(em->traceparent, want, "%s", key);
        cr_expect_str_eq(em->tracestate, k % 2 ? "k=odd" : "", "%s", key);
        cr_expect_eq(em->has_tracestate, k % 2 == 1, "%s", key);
    }
    json_decref(lines);
}

Test(trace_context, batched_state_machine_emits_each_continue_their_own_trace)
{
    batched_emits("trace_batch_sm",
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
                  "          emit: {name: paid, routing_key: \"",
                  "\", fields: {order_id: order_id}}\n", false);
}

Test(trace_context, batched_sql_handler_emits_each_continue_their_own_trace)
{
    batched_emits("trace_batch_sql",
                  "      type: sql\n"
                  "      statements:\n"
                  "        - sql: \"INSERT INTO ledger (order_id) VALUES (:order_id)\"\n"
                  "      emit: {name: booked, routing_key: \"",
                  "\", fields: {order_id: order_id}}\n", true);
}
