/*
 * test_dlq — reading the dead-letter queue spends nothing, against real RabbitMQ (3.10 and 4.x)
 * and MariaDB, driving the real idemq binary.
 *
 * RabbitMQ 4.x counts every return of an unacked message against a quorum queue's delivery limit
 * (20 by default) and drops the message past it. `idemq dlq list` and the messages `dlq replay`
 * skips must therefore never be returned unacked: each is republished (identical) to the tail
 * and acked after the confirm. These tests list and skip far more often than 20 times and check
 * that nothing is lost, nothing changes (order, bodies, properties, headers) and no message was
 * ever redelivered (redelivered flag, x-delivery-count) — the latter also catches a regression on
 * 3.10, which has no default limit. Topology: on 4.x the DLQ is declared with x-delivery-limit
 * -1 (and must not be on 3.x, where -1 drops a message at its first return); an older DLQ
 * without it is kept, with the set_policy advice; work queues that are quorum queues with a
 * limit are reported by topology_check_work_queue.
 *
 * 4.x-only tests skip on 3.x (cr_skip_test); with IDEMQ_TEST_BROKER=4 the harness fails instead
 * when the broker is older. Waiting is on observable conditions with deadlines, never a sleep.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "broker/topology.h"
#include "harness.h"

#define DEAD_LETTERS 5
/* A channel of the test's own for declarations that may be refused (never 1: the harness's
 * confirm channel, never 2: idemq's probe channel). */
#define SIDE_CHANNEL 7

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static char extra_queues[8][200]; /* deleted at teardown */
static size_t extra_queue_count;

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    if (!h_ready)
        return;
    for (size_t i = 0; i < extra_queue_count; i++) {
        amqp_queue_delete(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(extra_queues[i]), 0, 0);
        if (amqp_get_rpc_reply(H.amqp).reply_type != AMQP_RESPONSE_NORMAL)
            broker_reopen_channel(H.amqp);
    }
    extra_queue_count = 0;
    harness_fini(&H);
    h_ready = false;
}

static void setup(const char *name, const harness_options *o)
{
    harness_init(&H, name, o);
    h_ready = true;
}

/* ------------------------------------------------------------------------------ helpers */

static void queue_name(char *buf, size_t len, const char *suffix)
{
    snprintf(buf, len, "%s%s", H.queue, suffix);
}

static void biz_key_of(int i, char *buf, size_t len)
{
    snprintf(buf, len, "order_id:o%d:PAY_SUCCESS", i);
}

/* Everything one dead letter was published with, to compare against what comes out. */
typedef struct dead_letter_spec {
    char body[256];
    char message_id[32];
    char correlation_id[32];
    char error[64];
    amqp_table_entry_t headers[10];
    int header_count;
    amqp_table_entry_t nested[2];
    amqp_basic_properties_t props;
} dead_letter_spec;

/* A dead letter like idemq writes one (DLQ copy headers), plus headers of other types a producer
 * might have set. The spec must stay in place while its props are used. */
static void make_dead_letter(dead_letter_spec *s, int i)
{
    memset(s, 0, sizeof *s);
    char key[64];
    biz_key_of(i, key, sizeof key);
    snprintf(s->body, sizeof s->body,
             "{\"message_id\":\"m-o%d\",\"biz_key\":\"%s\",\"order_id\":\"o%d\","
             "\"event_type\":\"PAY_SUCCESS\",\"amount\":%d}",
             i, key, i, 100 + i);
    snprintf(s->message_id, sizeof s->message_id, "m-o%d", i);
    snprintf(s->correlation_id, sizeof s->correlation_id, "corr-%d", i);
    snprintf(s->error, sizeof s->error, "illegal transition #%d", i);
    amqp_table_entry_t *h = s->headers;
    int n = 0;
    h[n++] = harness_field_int(HEADER_RETRIES, i);
    h[n++] = harness_field_text(HEADER_ERROR_CLASS, "non_retryable");
    h[n++] = harness_field_text(HEADER_ERROR, s->error);
    h[n++] = harness_field_text(HEADER_HANDLER, "pay-callback");
    h[n++] = harness_field_text(HEADER_QUEUE, H.queue);
    h[n++] = harness_field_int(HEADER_FIRST_FAILED_AT, 1700000000000 + i);
    h[n++] = harness_field_text("trace-id", s->correlation_id);
    h[n].key = amqp_cstring_bytes("sampled");
    h[n].value.kind = AMQP_FIELD_KIND_BOOLEAN;
    h[n++].value.value.boolean = i % 2;
    s->nested[0] = harness_field_text("region", "eu");
    s->nested[1].key = amqp_cstring_bytes("shard");
    s->nested[1].value.kind = AMQP_FIELD_KIND_I32;
    s->nested[1].value.value.i32 = -i;
    h[n].key = amqp_cstring_bytes("origin");
    h[n].value.kind = AMQP_FIELD_KIND_TABLE;
    h[n++].value.value.table = (amqp_table_t){.num_entries = 2, .entries = s->nested};
    s->header_count = n;

    amqp_basic_properties_t *p = &s->props;
    p->_flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
                AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                AMQP_BASIC_HEADERS_FLAG;
    p->content_type = amqp_cstring_bytes("application/json");
    p->delivery_mode = AMQP_DELIVERY_PERSISTENT;
    p->message_id = amqp_cstring_bytes(s->message_id);
    p->correlation_id = amqp_cstring_bytes(s->correlation_id);
    p->app_id = amqp_cstring_bytes("payments");
    p->type = amqp_cstring_bytes("PAY_SUCCESS");
    p->timestamp = 1700000000 + (uint64_t)i;
    p->headers = (amqp_table_t){.num_entries = n, .entries = s->headers};
}

/* Dead-letters DEAD_LETTERS messages the way idemq does: a confirmed publish to Q.dlx with
 * routing key Q (the topology must exist). */
static void dead_letter_all(dead_letter_spec specs[DEAD_LETTERS])
{
    char dlx[200];
    queue_name(dlx, sizeof dlx, ".dlx");
    for (int i = 0; i < DEAD_LETTERS; i++) {
        make_dead_letter(&specs[i], i);
        harness_publish_props(&H, dlx, H.queue, &specs[i].props, specs[i].body,
                              strlen(specs[i].body));
    }
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", DEAD_LETTERS, 10000),
              "the dead letters did not arrive");
}

/* Runs `idemq dlq ARGS... -c config` and returns its exit code; *out owned by the caller. */
static int dlq_cli(char **out, const char *a1, const char *a2, const char *a3, const char *a4)
{
    const char *args[10] = {"dlq", a1, "-c", H.config_path};
    size_t n = 4;
    if (a2)
        args[n++] = a2;
    if (a3)
        args[n++] = a3;
    if (a4)
        args[n++] = a4;
    args[n] = NULL;
    return harness_run_cli(&H, out, args);
}

/* `idemq dlq list --json`: asserts exit 0 and returns the messages' biz_keys joined by ' '. */
static void list_keys(char *buf, size_t len, char **raw)
{
    char *out = NULL;
    int rc = dlq_cli(&out, "list", "--json", NULL, NULL);
    cr_assert_eq(rc, 0, "dlq list exited %d:\n%s", rc, out);
    json_t *doc = harness_output_json(out);
    json_t *messages = json_object_get(doc, "messages");
    cr_assert(json_is_array(messages), "%s", out);
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(messages); i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? " " : "",
                                 harness_json_str(json_array_get(messages, i), "biz_key"));
    json_decref(doc);
    if (raw)
        *raw = out;
    else
        free(out);
}

/* name with its dots escaped, as in a policy pattern. */
static void escape_dots(const char *name, char *buf, size_t len)
{
    size_t n = 0;
    for (const char *p = name; *p && n + 3 < len; p++) {
        if (*p == '.')
            buf[n++] = '\\';
        buf[n++] = *p;
    }
    buf[n] = '\0';
}

static void expected_keys(char *buf, size_t len)
{
    size_t used = 0;
    for (int i = 0; i < DEAD_LETTERS; i++) {
        char key[64];
        biz_key_of(i, key, sizeof key);
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? " " : "", key);
    }
}

/* A declaration on the test's side channel; returns the 406/404 text or "" for declare-ok. */
static void side_declare(const char *queue, int passive, amqp_table_t args, char *text, size_t len)
{
    amqp_channel_open(H.amqp, SIDE_CHANNEL);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    amqp_queue_declare(H.amqp, SIDE_CHANNEL, amqp_cstring_bytes(queue), passive, 1, 0, 0, args);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(H.amqp);
    text[0] = '\0';
    if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
        amqp_channel_close(H.amqp, SIDE_CHANNEL, AMQP_REPLY_SUCCESS);
        cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
        return;
    }
    cr_assert(reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
                  reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD,
              "declaring %s failed outside the channel", queue);
    const amqp_channel_close_t *close = reply.reply.decoded;
    snprintf(text, len, "%u %.*s", close->reply_code, (int)close->reply_text.len,
             (const char *)close->reply_text.bytes);
    amqp_channel_close_ok_t ok;
    cr_assert(amqp_send_method(H.amqp, SIDE_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) ==
              AMQP_STATUS_OK);
}

/* Declares queue (durable) on channel 1 with x-queue-type and an optional extra argument. */
static void create_queue(const char *queue, const char *type, const amqp_table_entry_t *extra,
                         int extra_count)
{
    amqp_table_entry_t entries[4];
    entries[0] = harness_field_text("x-queue-type", type);
    for (int i = 0; i < extra_count; i++)
        entries[1 + i] = extra[i];
    amqp_table_t args = {.num_entries = 1 + extra_count, .entries = entries};
    amqp_queue_declare(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0, args);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL,
              "cannot create %s queue %s", type, queue);
}

/* The x-delivery-count header of a delivery: -1 when absent. */
static int64_t delivery_count(const amqp_message_t *m)
{
    int64_t count;
    return message_header_int(&m->properties, "x-delivery-count", &count) ? count : -1;
}

static bool field_eq(const amqp_field_value_t *a, const amqp_field_value_t *b);

/* Same keys with equal values; order does not count (RabbitMQ 4 sorts header tables). got's
 * x-delivery-count is skipped when skip_delivery_count. */
static bool table_eq(const amqp_table_t *want, const amqp_table_t *got, bool skip_delivery_count)
{
    int matched = 0;
    for (int i = 0; i < got->num_entries; i++) {
        const amqp_table_entry_t *e = &got->entries[i];
        if (skip_delivery_count && harness_bytes_eq(e->key, amqp_cstring_bytes("x-delivery-count")))
            continue;
        bool found = false;
        for (int j = 0; j < want->num_entries && !found; j++)
            found = harness_bytes_eq(want->entries[j].key, e->key) &&
                    field_eq(&want->entries[j].value, &e->value);
        if (!found)
            return false;
        matched++;
    }
    return matched == want->num_entries;
}

static bool field_eq(const amqp_field_value_t *a, const amqp_field_value_t *b)
{
    if (a->kind != b->kind)
        return false;
    switch (a->kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
        return harness_bytes_eq(a->value.bytes, b->value.bytes);
    case AMQP_FIELD_KIND_BOOLEAN:
        return !a->value.boolean == !b->value.boolean;
    case AMQP_FIELD_KIND_I32:
        return a->value.i32 == b->value.i32;
    case AMQP_FIELD_KIND_I64:
        return a->value.i64 == b->value.i64;
    case AMQP_FIELD_KIND_TABLE:
        return table_eq(&a->value.table, &b->value.table, false);
    default:
        return false;
    }
}

/* "key:kind=value ..." of a table, for failure messages. */
static void describe_table(const amqp_table_t *t, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->num_entries && used < len; i++) {
        const amqp_table_entry_t *e = &t->entries[i];
        used += (size_t)snprintf(buf + used, len - used, "%s%.*s:%c", i ? " " : "", (int)e->key.len,
                                 (const char *)e->key.bytes, e->value.kind);
        if (used >= len)
            break;
        if (e->value.kind == AMQP_FIELD_KIND_UTF8 || e->value.kind == AMQP_FIELD_KIND_BYTES)
            used += (size_t)snprintf(buf + used, len - used, "=%.*s", (int)e->value.value.bytes.len,
                                     (const char *)e->value.value.bytes.bytes);
        else if (e->value.kind == AMQP_FIELD_KIND_I64)
            used += (size_t)snprintf(buf + used, len - used, "=%" PRId64, e->value.value.i64);
        else if (e->value.kind == AMQP_FIELD_KIND_I32)
            used += (size_t)snprintf(buf + used, len - used, "=%d", (int)e->value.value.i32);
        else if (e->value.kind == AMQP_FIELD_KIND_BOOLEAN)
            used += (size_t)snprintf(buf + used, len - used, "=%d", e->value.value.boolean);
        else if (e->value.kind == AMQP_FIELD_KIND_TABLE) {
            char inner[256];
            describe_table(&e->value.value.table, inner, sizeof inner);
            used += (size_t)snprintf(buf + used, len - used, "={%s}", inner);
        }
    }
}

/* Gets every message of Q.dlq (auto-ack) and checks they are specs[0..n), in order, unchanged
 * and never redelivered. */
static void expect_identical_dead_letters(const dead_letter_spec *specs, int n)
{
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    for (int i = 0; i < n; i++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq, &m), "dead letter #%d is missing", i);
        const dead_letter_spec *s = &specs[i];
        const amqp_basic_properties_t *p = &m.properties;
        cr_expect(harness_bytes_eq(m.body, amqp_cstring_bytes(s->body)), "#%d: body %.*s, want %s",
                  i, (int)m.body.len, (const char *)m.body.bytes, s->body);
        cr_expect_eq(p->_flags, s->props._flags, "#%d: property flags 0x%x, want 0x%x", i,
                     p->_flags, s->props._flags);
        cr_expect(harness_bytes_eq(p->content_type, s->props.content_type), "#%d: content_type", i);
        cr_expect(harness_bytes_eq(p->message_id, s->props.message_id), "#%d: message_id", i);
        cr_expect(harness_bytes_eq(p->correlation_id, s->props.correlation_id),
                  "#%d: correlation_id", i);
        cr_expect(harness_bytes_eq(p->app_id, s->props.app_id), "#%d: app_id", i);
        cr_expect(harness_bytes_eq(p->type, s->props.type), "#%d: type", i);
        cr_expect_eq(p->timestamp, s->props.timestamp, "#%d: timestamp", i);
        cr_expect_eq(p->delivery_mode, AMQP_DELIVERY_PERSISTENT, "#%d: delivery_mode", i);
        char want[1024], got[1024];
        describe_table(&s->props.headers, want, sizeof want);
        describe_table(&p->headers, got, sizeof got);
        cr_expect(table_eq(&s->props.headers, &p->headers, true),
                  "#%d: headers differ from what was dead-lettered:\n  got  %s\n  want %s", i, got,
                  want);
        /* A message that was returned unacked comes back with a delivery count (and, on 3.10,
         * the redelivered flag): a fresh copy has none (4.x) or 0 (3.10). */
        int64_t count = delivery_count(&m);
        cr_expect(count <= 0, "#%d: x-delivery-count %" PRId64 ": it was returned unacked", i,
                  count);
        amqp_destroy_message(&m);
    }
    amqp_message_t extra;
    bool more = harness_get(&H, dlq, &extra);
    if (more)
        amqp_destroy_message(&extra);
    cr_expect(!more, "the DLQ holds more than the %d dead letters", n);
}

/* Peeks at every message of Q.dlq on the side channel (basic.get without ack) and checks that
 * none was ever returned unacked, then closes the channel: they all return once (harmless on
 * 3.x and on an unlimited 4.x DLQ) and are ready again. */
static void expect_never_returned(void)
{
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    amqp_channel_open(H.amqp, SIDE_CHANNEL);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    for (int i = 0; i < DEAD_LETTERS; i++) {
        amqp_rpc_reply_t reply = amqp_basic_get(H.amqp, SIDE_CHANNEL, amqp_cstring_bytes(dlq), 0);
        cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL &&
                      reply.reply.id == AMQP_BASIC_GET_OK_METHOD,
                  "dead letter #%d is missing", i);
        bool redelivered = ((const amqp_basic_get_ok_t *)reply.reply.decoded)->redelivered;
        amqp_message_t m;
        cr_assert(amqp_read_message(H.amqp, SIDE_CHANNEL, &m, 0).reply_type ==
                  AMQP_RESPONSE_NORMAL);
        cr_expect(!redelivered, "dead letter #%d was redelivered", i);
        cr_expect(delivery_count(&m) <= 0, "dead letter #%d has x-delivery-count %" PRId64, i,
                  delivery_count(&m));
        amqp_destroy_message(&m);
    }
    amqp_channel_close(H.amqp, SIDE_CHANNEL, AMQP_REPLY_SUCCESS);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", DEAD_LETTERS, 10000));
}

/* ------------------------------------------------------------------------------ tests */

Test(dlq, hundred_listings_and_thirty_unmatched_replays_lose_nothing, .fini = teardown,
     .timeout = 240)
{
    setup("dlq_hundred", NULL);
    int major = harness_broker_major(&H);
    harness_insert_orders(&H, "o", DEAD_LETTERS, "PAYING");
    harness_declare_topology(&H);
    dead_letter_spec specs[DEAD_LETTERS];
    dead_letter_all(specs);
    char want[512], got[512];
    expected_keys(want, sizeof want);

    int64_t start = harness_now_ms();
    for (int round = 0; round < 100; round++) {
        list_keys(got, sizeof got, NULL);
        cr_assert_str_eq(got, want, "listing %d shows [%s], want [%s] in this order", round + 1,
                         got, want);
    }
    int64_t listed = harness_now_ms();
    for (int round = 0; round < 30; round++) {
        char *out = NULL;
        int rc = dlq_cli(&out, "replay", "--biz-key", "NOPE", "--json");
        cr_assert_eq(rc, 0, "dlq replay --biz-key NOPE exited %d:\n%s", rc, out);
        json_t *doc = harness_output_json(out);
        cr_assert_eq(json_integer_value(json_object_get(doc, "replayed")), 0, "%s", out);
        cr_assert_eq(json_array_size(json_object_get(doc, "messages")), 0, "%s", out);
        json_decref(doc);
        free(out);
    }
    int64_t skipped = harness_now_ms();
    fprintf(stderr,
            "[measure] RabbitMQ %d: 100 x dlq list %" PRId64 " ms, 30 x dlq replay (no match) "
            "%" PRId64 " ms\n",
            major, listed - start, skipped - listed);
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), DEAD_LETTERS, "the DLQ lost dead letters");
    list_keys(got, sizeof got, NULL);
    cr_assert_str_eq(got, want, "the order changed");
    /* None of them was ever returned unacked (on 4.x the fresh Q.dlq is unlimited, so a
     * returning listing would not lose them here: this is what shows it). */
    expect_never_returned();

    char *out = NULL;
    int rc = dlq_cli(&out, "replay", "--all", "--json", NULL);
    cr_assert_eq(rc, 0, "dlq replay --all exited %d:\n%s", rc, out);
    json_t *doc = harness_output_json(out);
    cr_assert_eq(json_integer_value(json_object_get(doc, "replayed")), DEAD_LETTERS, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(doc, "failed")), 0, "%s", out);
    json_decref(doc);
    free(out);
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 0, "replay --all must empty the DLQ");
    cr_assert_eq(harness_queue_depth_of(&H, ""), DEAD_LETTERS,
                 "the work queue must hold exactly the replays");

    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    cr_assert(harness_wait_scalar(&H, DEAD_LETTERS, 15000,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"));
    cr_assert(harness_wait_log(&H, "\"outcome\":\"processed\"", DEAD_LETTERS, 10000));
    cr_assert(harness_wait_queue_depth_of(&H, "", 0, 10000));
    harness_stop_idemq(&daemon_pid);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), DEAD_LETTERS);
    for (int i = 0; i < DEAD_LETTERS; i++) {
        char key[64];
        biz_key_of(i, key, sizeof key);
        cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = '%s'", key),
                     1, "%s must be applied exactly once", key);
        cr_expect_eq(harness_scalar(&H, "SELECT amount FROM orders WHERE order_id = 'o%d'", i),
                     100 + i);
    }
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"processed\""), DEAD_LETTERS);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"deduped\""), 0);
    cr_expect_eq(harness_queue_depth_of(&H, ".dlq"), 0);
}

Test(dlq, listing_preserves_order_and_bodies, .fini = teardown, .timeout = 60)
{
    setup("dlq_order", NULL);
    harness_broker_major(&H);
    harness_declare_topology(&H);
    dead_letter_spec specs[DEAD_LETTERS];
    dead_letter_all(specs);

    char *out = NULL;
    int rc = dlq_cli(&out, "list", NULL, NULL, NULL);
    cr_assert_eq(rc, 0, "dlq list exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "order_id:o0:PAY_SUCCESS") && strstr(out, "illegal transition #4"), "%s",
              out);
    cr_assert(strstr(out, "5 message(s) in"), "%s", out);
    free(out);

    /* --limit prints two, but still walks (and so keeps in order) all five. */
    rc = dlq_cli(&out, "list", "--limit", "2", "--json");
    cr_assert_eq(rc, 0, "dlq list --limit 2 exited %d:\n%s", rc, out);
    json_t *doc = harness_output_json(out);
    json_t *messages = json_object_get(doc, "messages");
    cr_assert_eq(json_array_size(messages), 2, "%s", out);
    cr_assert_str_eq(harness_json_str(json_array_get(messages, 0), "biz_key"),
                     "order_id:o0:PAY_SUCCESS");
    cr_assert_str_eq(harness_json_str(json_array_get(messages, 1), "biz_key"),
                     "order_id:o1:PAY_SUCCESS");
    json_t *first = json_array_get(messages, 0);
    cr_assert_str_eq(harness_json_str(first, "error_class"), "non_retryable");
    cr_assert_str_eq(harness_json_str(first, "error"), "illegal transition #0");
    cr_assert_str_eq(harness_json_str(first, "first_failed_at"), "2023-11-14T22:13:20Z");
    json_decref(doc);
    free(out);

    /* A replay that matches one message in the middle: the others keep their order. */
    rc = dlq_cli(&out, "replay", "--biz-key", "order_id:o2:PAY_SUCCESS", "--json");
    cr_assert_eq(rc, 0, "dlq replay --biz-key exited %d:\n%s", rc, out);
    doc = harness_output_json(out);
    cr_assert_eq(json_integer_value(json_object_get(doc, "replayed")), 1, "%s", out);
    json_decref(doc);
    free(out);
    cr_assert(harness_wait_queue_depth_of(&H, "", 1, 5000));

    dead_letter_spec rest[DEAD_LETTERS - 1]; /* a spec's props point into the spec itself */
    for (int i = 0, j = 0; i < DEAD_LETTERS; i++)
        if (i != 2)
            make_dead_letter(&rest[j++], i);
    expect_identical_dead_letters(rest, DEAD_LETTERS - 1);

    /* The replay reached the work queue with the original body and the idemq headers gone. */
    amqp_message_t m;
    cr_assert(harness_get(&H, H.queue, &m));
    cr_expect(harness_bytes_eq(m.body, amqp_cstring_bytes(specs[2].body)));
    amqp_bytes_t value;
    cr_expect(!message_header_bytes(&m.properties, HEADER_ERROR_CLASS, &value));
    cr_expect(message_header_bytes(&m.properties, "trace-id", &value) &&
              harness_bytes_eq(value, amqp_cstring_bytes("corr-2")));
    amqp_destroy_message(&m);
}

Test(dlq, old_dlq_without_delivery_limit_is_detected_and_still_lossless, .fini = teardown,
     .timeout = 120)
{
    setup("dlq_old", NULL);
    if (harness_broker_major(&H) < 4)
        cr_skip_test("RabbitMQ 3.x has no default delivery limit");
    char dlq[200], text[512];
    queue_name(dlq, sizeof dlq, ".dlq");
    /* What an older idemq declared: a quorum queue without x-delivery-limit. */
    create_queue(dlq, "quorum", NULL, 0);

    /* idemq topology keeps it (no 406) ... */
    harness_declare_topology(&H);
    /* ... and so does topology_declare, which says why, and leaves channel 1 in confirm mode. */
    config_consumer c = {
        .queue = H.queue,
        .handler_name = (char *)"pay-callback",
        .queue_type = CONFIG_QUEUE_QUORUM,
        .retry = {.max_retries = 3, .base_ms = 100, .jitter_ms = 50, .max_delay_ms = 3600000}};
    char warning[TOPOLOGY_WARNING_MAX];
    cr_assert_eq(topology_declare(H.amqp, &c, warning, sizeof warning), 0, "%s", warning);
    char policy[800], escaped[300];
    escape_dots(dlq, escaped, sizeof escaped);
    snprintf(policy, sizeof policy,
             "rabbitmqctl set_policy --vhost '/' --apply-to quorum_queues --priority 10 "
             "'idemq-dlq-%s' '^%s$' '{\"delivery-limit\":-1}'",
             H.queue, escaped);
    cr_assert(strstr(warning, policy), "topology_declare's warning lacks [%s]:\n%s", policy,
              warning);
    cr_assert(strstr(warning, "older idemq") && strstr(warning, "20"), "%s", warning);
    harness_publish(&H, dlq, "application/json", "{}", 2, NULL); /* waits for its confirm */
    amqp_message_t probe;
    cr_assert(harness_get(&H, dlq, &probe));
    amqp_destroy_message(&probe);
    /* The DLQ was not changed: it still has no x-delivery-limit. */
    amqp_table_entry_t quorum;
    quorum = harness_field_text("x-queue-type", "quorum");
    side_declare(dlq, 0, (amqp_table_t){.num_entries = 1, .entries = &quorum}, text, sizeof text);
    cr_assert_str_eq(text, "", "the old DLQ was changed: %s", text);

    /* idemq run dead-letters through it (its channel still confirms after the fallback). */
    harness_insert_orders(&H, "d", DEAD_LETTERS, "PAYING");
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    /* ... and idemq run logs the advice (session.c logs topology_declare's warning). */
    char logged[300];
    snprintf(logged, sizeof logged, "--priority 10 'idemq-dlq-%s'", H.queue);
    cr_expect(harness_log_count(&H, logged) >= 1, "idemq run did not log [%s]", logged);
    for (int i = 0; i < DEAD_LETTERS; i++) {
        char id[8];
        snprintf(id, sizeof id, "d%d", i);
        harness_publish_event(&H, id, "REFUND_START", 0); /* needs PAID: illegal → DLQ */
    }
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", DEAD_LETTERS, 15000));
    harness_stop_idemq(&daemon_pid);

    /* Workers finish in any order: the first listing fixes the order the others must keep. */
    char first[512] = "";
    for (int round = 0; round < 25; round++) {
        char keys[512];
        char *out = NULL;
        list_keys(keys, sizeof keys, &out);
        if (round == 0) {
            snprintf(first, sizeof first, "%s", keys);
            for (int i = 0; i < DEAD_LETTERS; i++) {
                char key[64];
                snprintf(key, sizeof key, "order_id:d%d:REFUND_START", i);
                cr_assert(strstr(first, key), "%s is not listed: [%s]", key, first);
            }
        }
        cr_assert_str_eq(keys, first, "listing %d: [%s], the first was [%s]", round + 1, keys,
                         first);
        cr_assert(strstr(out, policy), "dlq list must warn with [%s]:\n%s", policy, out);
        free(out);
    }
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), DEAD_LETTERS);
    for (int i = 0; i < DEAD_LETTERS; i++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq, &m));
        cr_expect(delivery_count(&m) <= 0, "dead letter %d was returned unacked", i);
        amqp_destroy_message(&m);
    }
}

Test(dlq, dlq_is_unlimited_on_4x_and_plain_on_3x, .fini = teardown, .timeout = 60)
{
    setup("dlq_limit", NULL);
    int major = harness_broker_major(&H);
    harness_declare_topology(&H);
    char dlq[200], text[512];
    queue_name(dlq, sizeof dlq, ".dlq");
    amqp_table_entry_t quorum;
    quorum = harness_field_text("x-queue-type", "quorum");
    side_declare(dlq, 0, (amqp_table_t){.num_entries = 1, .entries = &quorum}, text, sizeof text);
    if (major >= 4)
        cr_expect(strstr(text, "inequivalent arg 'x-delivery-limit'") &&
                      strstr(text, "current is the value '-1'"),
                  "on RabbitMQ 4.x Q.dlq must have x-delivery-limit -1; declaring it without "
                  "said: [%s]",
                  text);
    else
        cr_expect_str_eq(text, "",
                         "on RabbitMQ 3.x (where -1 would drop a message at its "
                         "first return) Q.dlq must not have x-delivery-limit");
    /* The retry ladder never gets it. */
    char retry[200];
    queue_name(retry, sizeof retry, ".retry.1");
    side_declare(retry, 1, amqp_empty_table, text, sizeof text);
    cr_expect_str_eq(text, "");

    char *out = NULL;
    const char *args[] = {"topology", "--dry-run", "-c", H.config_path, NULL};
    cr_assert_eq(harness_run_cli(&H, &out, args), 0, "%s", out);
    char line[300];
    snprintf(line, sizeof line, "%s.dlq", H.queue);
    const char *at = strstr(out, line);
    cr_assert(at, "%s", out);
    const char *eol = strchr(at, '\n');
    cr_expect(strstr(at, "x-delivery-limit=-1 on RabbitMQ 4.x") &&
                  strstr(at, "x-delivery-limit=-1 on RabbitMQ 4.x") < eol,
              "the dry run must show the DLQ's limit:\n%s", out);
    free(out);
}

/* Creates name (remembered for teardown) and returns topology_check_work_queue's result. */
static int check_queue(const char *suffix, const char *type, const amqp_table_entry_t *extra,
                       int extra_count, char *warning, size_t len)
{
    cr_assert(extra_queue_count < sizeof extra_queues / sizeof extra_queues[0]);
    char *name = extra_queues[extra_queue_count++];
    queue_name(name, sizeof extra_queues[0], suffix);
    if (type)
        create_queue(name, type, extra, extra_count);
    config_consumer c = {.queue = name, .handler_name = (char *)"pay-callback"};
    return topology_check_work_queue(H.amqp, &c, warning, len);
}

Test(dlq, work_queue_quorum_warning, .fini = teardown, .timeout = 60)
{
    harness_options o = {.declare = "passive"};
    setup("dlq_wq", &o);
    if (harness_broker_major(&H) < 4)
        cr_skip_test("RabbitMQ 3.x has no default delivery limit");
    char w[TOPOLOGY_WARNING_MAX], text[512];

    /* The configured work queue, pre-created as a quorum queue (declare: passive). */
    create_queue(H.queue, "quorum", NULL, 0);
    harness_declare_topology(&H);
    config_consumer c = {.queue = H.queue, .handler_name = (char *)"pay-callback"};
    cr_assert_eq(topology_check_work_queue(H.amqp, &c, w, sizeof w), 1, "%s", w);
    char policy[800], escaped[300];
    escape_dots(H.queue, escaped, sizeof escaped);
    snprintf(policy, sizeof policy,
             "rabbitmqctl set_policy --vhost '/' --apply-to quorum_queues 'idemq-%s' '^%s$' "
             "'{\"delivery-limit\":-1}'",
             H.queue, escaped);
    cr_assert(strstr(w, policy), "the warning lacks [%s]:\n%s", policy, w);
    char dlx[300];
    snprintf(dlx, sizeof dlx,
             "'{\"dead-letter-exchange\":\"%s.dlx\",\"dead-letter-routing-key\":\"%s\"}'", H.queue,
             H.queue);
    cr_assert(strstr(w, dlx), "the warning lacks [%s]:\n%s", dlx, w);
    cr_assert(strstr(w, "default delivery limit (20)") && strstr(w, "drops"), "%s", w);
    /* Channel 1 is still open and in confirm mode: this waits for the confirm. */
    harness_publish(&H, NULL, "application/json", "{}", 2, NULL);
    cr_assert(harness_wait_queue_depth_of(&H, "", 1, 5000));
    /* idemq run checks it at every connect and logs the advice. */
    char logged[300];
    snprintf(logged, sizeof logged, "--apply-to quorum_queues 'idemq-%s'", H.queue);
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    cr_expect(harness_log_count(&H, logged) >= 1, "idemq run did not log [%s]", logged);
    /* "{}" has no biz_key: dead-lettered. Stopping before its outcome would requeue it (a race
     * that RabbitMQ 4.3 lost). */
    cr_assert(harness_wait_log(&H, "\"outcome\":\"dead_lettered\"", 1, 15000),
              "the message without biz_key was not dead-lettered (log: %s)", H.log_path);
    harness_stop_idemq(&daemon_pid);
    cr_assert(harness_wait_queue_depth_of(&H, "", 0, 5000));

    cr_expect_eq(check_queue(".classic", "classic", NULL, 0, w, sizeof w), 0, "%s", w);
    cr_expect_str_eq(w, "");
    amqp_table_entry_t unlimited = harness_field_int("x-delivery-limit", -1);
    cr_expect_eq(check_queue(".unlimited", "quorum", &unlimited, 1, w, sizeof w), 0, "%s", w);
    amqp_table_entry_t five = harness_field_int("x-delivery-limit", 5);
    cr_expect_eq(check_queue(".five", "quorum", &five, 1, w, sizeof w), 1);
    cr_expect(strstr(w, "x-delivery-limit=5"), "%s", w);
    /* Other arguments are repeated until the broker names x-delivery-limit (or accepts). */
    amqp_table_entry_t ttl_unlimited[2] = {harness_field_int("x-max-length", 1000),
                                           harness_field_int("x-delivery-limit", -1)};
    cr_expect_eq(check_queue(".ttl_unlimited", "quorum", ttl_unlimited, 2, w, sizeof w), 0, "%s",
                 w);
    amqp_table_entry_t with_dlx[2];
    with_dlx[0] = harness_field_text("x-dead-letter-exchange", "elsewhere");
    with_dlx[1] = harness_field_int("x-message-ttl", 60000);
    cr_expect_eq(check_queue(".dlx", "quorum", with_dlx, 2, w, sizeof w), 1);
    cr_expect(strstr(w, "dead-letters it to exchange 'elsewhere'") &&
                  strstr(w, "default delivery limit (20)"),
              "%s", w);
    /* A transient (non-durable) queue cannot be a quorum queue. RabbitMQ 4.3 as scripts/services
     * runs it refuses transient non-exclusive queues (a deprecated feature, not permitted), and
     * an exclusive one cannot be probed from the check's channel there (RESOURCE_LOCKED): the
     * case exists only before 4.3. */
    if (harness_broker_version(&H) < 403) {
        char *transient = extra_queues[extra_queue_count++];
        queue_name(transient, sizeof extra_queues[0], ".transient");
        amqp_queue_declare(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(transient), 0, 0, 0, 0,
                           amqp_empty_table);
        cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
        config_consumer tc = {.queue = transient, .handler_name = (char *)"pay-callback"};
        cr_expect_eq(topology_check_work_queue(H.amqp, &tc, w, sizeof w), 0, "%s", w);
    }
    /* A queue that does not exist is not checked, and not created. */
    cr_expect_eq(check_queue(".missing", NULL, NULL, 0, w, sizeof w), 0, "%s", w);
    side_declare(extra_queues[extra_queue_count - 1], 1, amqp_empty_table, text, sizeof text);
    cr_expect(strstr(text, "404"), "the check created the queue: [%s]", text);
    /* After all those refused probes channel 1 still confirms. */
    harness_publish(&H, NULL, "application/json", "{}", 2, NULL);
    cr_assert(harness_wait_queue_depth_of(&H, "", 1, 5000));
}

Test(dlq, unroutable_replay_keeps_the_dead_letter, .fini = teardown, .timeout = 60)
{
    setup("dlq_unroutable", NULL);
    harness_broker_major(&H);
    harness_declare_topology(&H);
    dead_letter_spec specs[DEAD_LETTERS];
    dead_letter_all(specs);
    /* Without the work queue a replay is returned as unroutable: its original must stay, while
     * the kept ones around it (same chunk) are acked as usual. */
    amqp_queue_delete(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(H.queue), 0, 0);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    char *out = NULL;
    int rc = dlq_cli(&out, "replay", "--biz-key", "order_id:o2:PAY_SUCCESS", "--json");
    cr_assert_eq(rc, 1, "a replay that was returned must exit 1, got %d:\n%s", rc, out);
    cr_assert(strstr(out, "unroutable"), "%s", out);
    json_t *doc = harness_output_json(out);
    cr_assert_eq(json_integer_value(json_object_get(doc, "replayed")), 0, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(doc, "failed")), 1, "%s", out);
    json_decref(doc);
    free(out);
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", DEAD_LETTERS, 10000),
              "a dead letter was lost");
    /* o2 came back by being returned; the four others are fresh copies. */
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    int returned = 0, o2 = 0;
    for (int i = 0; i < DEAD_LETTERS; i++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq, &m), "dead letter #%d is missing", i);
        bool is_o2 = harness_bytes_eq(m.body, amqp_cstring_bytes(specs[2].body));
        o2 += is_o2;
        if (delivery_count(&m) > 0) {
            returned++;
            cr_expect(is_o2, "a kept dead letter was returned unacked");
        }
        amqp_destroy_message(&m);
    }
    cr_expect_eq(o2, 1, "o2 must be in the DLQ exactly once");
    cr_expect_eq(returned, 1, "exactly the unroutable replay's original returns");
}

/* Every replay of a chunk returned: RabbitMQ sends the returns as it handles the publishes and may
 * ack them all with one "multiple" ack after the last return, so a return must be matched to its
 * own publish (broker/confirms.h), not taken to be the ack that follows it. */
Test(dlq, replay_all_returned_keeps_every_dead_letter, .fini = teardown, .timeout = 60)
{
    enum { CHUNK = 16 }; /* one chunk of the pass: its 16 replays published back to back */
    setup("dlq_unroutable_all", NULL);
    harness_broker_major(&H);
    harness_declare_topology(&H);
    static char bodies[CHUNK][64];
    const void *ptrs[CHUNK];
    size_t lens[CHUNK];
    for (int i = 0; i < CHUNK; i++) {
        lens[i] = (size_t)snprintf(bodies[i], sizeof bodies[i], "{\"biz_key\":\"r%02d\"}", i);
        ptrs[i] = bodies[i];
    }
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    harness_publish_batch(&H, dlq, "application/json", ptrs, lens, CHUNK);
    cr_assert(harness_wait_queue_depth(&H, dlq, CHUNK, 10000));
    amqp_queue_delete(H.amqp, BROKER_CHANNEL, amqp_cstring_bytes(H.queue), 0, 0);
    cr_assert(amqp_get_rpc_reply(H.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    for (int round = 0; round < 3; round++) {
        char *out = NULL;
        int rc = dlq_cli(&out, "replay", "--all", "--json", NULL);
        cr_assert_eq(rc, 1, "returned replays must exit 1, got %d:\n%s", rc, out);
        json_t *doc = harness_output_json(out);
        cr_assert_eq(json_integer_value(json_object_get(doc, "replayed")), 0,
                     "round %d counted a returned replay as replayed:\n%s", round, out);
        cr_assert_eq(json_integer_value(json_object_get(doc, "failed")), CHUNK, "%s", out);
        json_decref(doc);
        free(out);
        cr_assert(harness_wait_queue_depth(&H, dlq, CHUNK, 10000), "round %d lost a dead letter",
                  round);
    }
}

Test(dlq, many_dead_letters_span_chunks_in_order, .fini = teardown, .timeout = 60)
{
    enum { MANY = 250 }; /* three chunks of the pass */
    setup("dlq_many", NULL);
    harness_broker_major(&H);
    harness_declare_topology(&H);
    static char bodies[MANY][64];
    const void *ptrs[MANY];
    size_t lens[MANY];
    for (int i = 0; i < MANY; i++) {
        lens[i] = (size_t)snprintf(bodies[i], sizeof bodies[i], "{\"biz_key\":\"k%03d\"}", i);
        ptrs[i] = bodies[i];
    }
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    harness_publish_batch(&H, dlq, "application/json", ptrs, lens, MANY);
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", MANY, 10000));

    static char want[MANY * 6], got[MANY * 6];
    size_t used = 0;
    for (int i = 0; i < MANY; i++)
        used += (size_t)snprintf(want + used, sizeof want - used, "%sk%03d", i ? " " : "", i);
    for (int round = 0; round < 3; round++) {
        list_keys(got, sizeof got, NULL);
        cr_assert_str_eq(got, want, "listing %d changed the order or lost messages", round + 1);
    }
    /* One replay in the middle chunk; the rest keeps its order. */
    char *out = NULL;
    int rc = dlq_cli(&out, "replay", "--biz-key", "k150", "--json");
    cr_assert_eq(rc, 0, "%s", out);
    json_t *doc = harness_output_json(out);
    cr_assert_eq(json_integer_value(json_object_get(doc, "replayed")), 1, "%s", out);
    json_decref(doc);
    free(out);
    used = 0;
    for (int i = 0; i < MANY; i++)
        if (i != 150)
            used +=
                (size_t)snprintf(want + used, sizeof want - used, "%sk%03d", used ? " " : "", i);
    list_keys(got, sizeof got, NULL);
    cr_assert_str_eq(got, want);
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), MANY - 1);
    cr_assert(harness_wait_queue_depth_of(&H, "", 1, 5000),
              "the replay did not reach the work queue");
    /* Not one was returned unacked (an ack lost at the end of a pass would show here). */
    for (int i = 0; i < MANY - 1; i++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq, &m), "dead letter #%d is missing", i);
        cr_expect(delivery_count(&m) <= 0,
                  "dead letter %.*s was returned unacked (count %" PRId64 ")", (int)m.body.len,
                  (const char *)m.body.bytes, delivery_count(&m));
        amqp_destroy_message(&m);
    }
}
