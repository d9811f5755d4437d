/*
 * Traceability: the identifiers a producer sets outside the body (the AMQP message_id and
 * correlation_id properties, a W3C traceparent header) follow a message into every log line and
 * into `idemq dlq list`, so dead letters without a readable biz_key can still be told apart and
 * found; and a misspelt biz_key is named in the dead letter's reason.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

#define DEADLINE_MS 30000
#define READY_LINE "started consuming"

static harness_fixture F;

static void teardown(void)
{
    harness_fixture_fini(&F);
}

TestSuite(traceability, .fini = teardown, .timeout = 120);

/* Publishes body with the given AMQP message_id / correlation_id (NULL: unset) and traceparent
 * header (NULL: none) to the work queue. */
static void publish_traced(const char *body, const char *message_id, const char *correlation_id,
                           const char *traceparent)
{
    amqp_basic_properties_t props = {0};
    amqp_table_entry_t header;
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    if (message_id) {
        props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        props.message_id = amqp_cstring_bytes(message_id);
    }
    if (correlation_id) {
        props._flags |= AMQP_BASIC_CORRELATION_ID_FLAG;
        props.correlation_id = amqp_cstring_bytes(correlation_id);
    }
    if (traceparent) {
        header.key = amqp_cstring_bytes("traceparent");
        header.value.kind = AMQP_FIELD_KIND_UTF8;
        header.value.value.bytes = amqp_cstring_bytes(traceparent);
        props._flags |= AMQP_BASIC_HEADERS_FLAG;
        props.headers = (amqp_table_t){.num_entries = 1, .entries = &header};
    }
    harness_publish_props(&F.h, NULL, F.h.queue, &props, body, strlen(body));
}

/* The first log line whose "outcome" is outcome and whose field equals value; NULL if none.
 * Returns a borrowed reference into lines. */
static json_t *find_line(json_t *lines, const char *outcome, const char *field, const char *value)
{
    size_t i;
    json_t *line;
    json_array_foreach(lines, i, line) {
        const char *o = json_string_value(json_object_get(line, "outcome"));
        const char *v = json_string_value(json_object_get(line, field));
        if (o && v && strcmp(o, outcome) == 0 && strcmp(v, value) == 0)
            return line;
    }
    return NULL;
}

static const char *field_of(json_t *line, const char *name)
{
    const char *v = json_string_value(json_object_get(line, name));
    return v ? v : "(absent)";
}

Test(traceability, keyless_dead_letters_carry_the_producers_ids_in_logs_and_dlq_list)
{
    harness_options opts = {.workers = 1, .prefetch = 4};
    harness_fixture_init(&F, "trace_keyless", &opts);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);

    static const char tp[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /* Two bodies without biz_key that idemq cannot tell apart by their content. */
    publish_traced("{\"order_id\":\"o1\",\"event_type\":\"PAY_SUCCESS\"}", "msg-X1", "corr-1", tp);
    publish_traced("{\"order_id\":\"o1\",\"event_type\":\"PAY_SUCCESS\"}", "msg-X2", NULL, NULL);
    /* A Go struct without json tags sends BizKey. */
    publish_traced("{\"BizKey\":\"order_id:o2:PAY_SUCCESS\",\"order_id\":\"o2\"}", "msg-X3", NULL,
                   NULL);

    char dlq[160];
    snprintf(dlq, sizeof dlq, "%s.dlq", F.h.queue);
    cr_assert(harness_wait_queue_depth(&F.h, dlq, 3, DEADLINE_MS),
              "the three keyless messages did not all reach %s", dlq);

    json_t *lines = harness_log_load(&F.h);
    json_t *x1 = find_line(lines, "dead_lettered", "message_id", "msg-X1");
    cr_assert(x1, "no dead_lettered log line carries message_id msg-X1");
    cr_expect_str_eq(field_of(x1, "correlation_id"), "corr-1");
    cr_expect_str_eq(field_of(x1, "traceparent"), tp);
    cr_expect(find_line(lines, "dead_lettered", "message_id", "msg-X2"),
              "no dead_lettered log line carries message_id msg-X2");
    json_t *x3 = find_line(lines, "dead_lettered", "message_id", "msg-X3");
    cr_assert(x3, "no dead_lettered log line carries message_id msg-X3");
    cr_expect(strstr(field_of(x3, "msg"), "found \\\"BizKey\\\"") ||
                  strstr(field_of(x3, "msg"), "found \"BizKey\""),
              "the reason does not name the misspelt key: %s", field_of(x3, "msg"));
    json_decref(lines);

    char *out = NULL;
    const char *list_args[] = {"dlq", "list", "-c", F.h.config_path, NULL};
    cr_assert_eq(harness_run_cli(&F.h, &out, list_args), 0, "dlq list failed: %s", out);
    cr_expect(strstr(out, "message_id=msg-X1 correlation_id=corr-1 traceparent="),
              "dlq list does not show msg-X1's ids:\n%s", out);
    cr_expect(strstr(out, "message_id=msg-X2"), "dlq list does not show msg-X2:\n%s", out);
    free(out);

    out = NULL;
    const char *json_args[] = {"dlq", "list", "-c", F.h.config_path, "--json", NULL};
    cr_assert_eq(harness_run_cli(&F.h, &out, json_args), 0, "dlq list --json failed: %s", out);
    json_t *doc = harness_output_json(out);
    json_t *messages = json_object_get(doc, "messages");
    cr_assert_eq(json_array_size(messages), 3);
    bool seen[3] = {false, false, false};
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *id = json_string_value(json_object_get(m, "message_id"));
        cr_assert(id, "a dead letter in the JSON listing has no message_id");
        for (int k = 0; k < 3; k++) {
            char want[16];
            snprintf(want, sizeof want, "msg-X%d", k + 1);
            if (strcmp(id, want) == 0)
                seen[k] = true;
        }
    }
    cr_expect(seen[0] && seen[1] && seen[2], "the JSON listing lacks one of msg-X1..3");
    json_decref(doc);
    free(out);
}

Test(traceability, processed_messages_log_the_property_ids_beside_the_envelopes)
{
    harness_options opts = {.workers = 1, .prefetch = 4};
    harness_fixture_init(&F, "trace_processed", &opts);
    harness_insert_orders(&F.h, "t", 2, "PAYING");
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);

    /* No message_id in the body: the property stands in for it. */
    publish_traced("{\"biz_key\":\"order_id:t0:PAY_SUCCESS\",\"order_id\":\"t0\","
                   "\"event_type\":\"PAY_SUCCESS\",\"amount\":1}",
                   "prop-0", "corr-0", NULL);
    /* Both, different: the body's is message_id, the property's amqp_message_id. */
    publish_traced("{\"biz_key\":\"order_id:t1:PAY_SUCCESS\",\"order_id\":\"t1\","
                   "\"event_type\":\"PAY_SUCCESS\",\"amount\":1,\"message_id\":\"body-1\"}",
                   "prop-1", NULL, NULL);
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"processed\"", 2, DEADLINE_MS));

    json_t *lines = harness_log_load(&F.h);
    json_t *p0 = find_line(lines, "processed", "biz_key", "order_id:t0:PAY_SUCCESS");
    cr_assert(p0, "no processed line for t0");
    cr_expect_str_eq(field_of(p0, "message_id"), "prop-0");
    cr_expect_str_eq(field_of(p0, "correlation_id"), "corr-0");
    json_t *p1 = find_line(lines, "processed", "biz_key", "order_id:t1:PAY_SUCCESS");
    cr_assert(p1, "no processed line for t1");
    cr_expect_str_eq(field_of(p1, "message_id"), "body-1");
    cr_expect_str_eq(field_of(p1, "amqp_message_id"), "prop-1");
    json_decref(lines);
}
