/*
 * test_frame_max — copies that always fit a frame, and dead letters that a lost ack duplicated,
 * against real RabbitMQ (3.10 and 4.x) and MariaDB, driving the real idemq binary.
 *
 * rabbitmq-c sends basic.publish's method frame before it encodes the content header, so a copy
 * whose header does not fit frame_max breaks the connection; one that only just fits grows past
 * frame_max in the broker (x-death, x-first-death-*, x-last-death-*, x-delivery-count) and can
 * then no longer be read. A copy therefore leaves MESSAGE_BROKER_HEADROOM free and gives up
 * producer headers, largest first, recording them in idemq-dropped-headers (broker/message.h).
 * The first test measures what brokers add, with the longest queue names the config allows, and
 * checks that it fits the headroom; the others drive idemq with producer headers that come within
 * 200 and 300 bytes of frame_max, and `idemq dlq` over near-frame_max and duplicated dead letters.
 *
 * Waiting is on observable conditions with deadlines, never a sleep.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "broker/topology.h"
#include "harness.h"

/* A channel of the test's own for reads that return messages unacked (never 1: the harness's
 * confirm channel, never 2: the probe channel of topology_declare). */
#define SIDE_CHANNEL 7
#define CANARY_MS 5000

static harness_fixture F;
static config_consumer long_consumer; /* the long-named topology of broker_additions_... */
static char long_queue[TOPOLOGY_NAME_MAX];

static void delete_long_topology(void)
{
    harness *h = &F.h;
    char name[TOPOLOGY_NAME_MAX];
    for (unsigned level = 1; level <= long_consumer.retry.max_retries; level++) {
        topology_retry_queue(&long_consumer, level, name, sizeof name);
        amqp_queue_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0, 0);
        if (amqp_get_rpc_reply(h->amqp).reply_type != AMQP_RESPONSE_NORMAL)
            broker_reopen_channel(h->amqp);
    }
    const char *queues[] = {long_queue, NULL};
    topology_dead_letter_queue(&long_consumer, name, sizeof name);
    queues[1] = name;
    for (int i = 0; i < 2; i++) {
        amqp_queue_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(queues[i]), 0, 0);
        if (amqp_get_rpc_reply(h->amqp).reply_type != AMQP_RESPONSE_NORMAL)
            broker_reopen_channel(h->amqp);
    }
    topology_retry_exchange(&long_consumer, name, sizeof name);
    amqp_exchange_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0);
    if (amqp_get_rpc_reply(h->amqp).reply_type != AMQP_RESPONSE_NORMAL)
        broker_reopen_channel(h->amqp);
    topology_dead_letter_exchange(&long_consumer, name, sizeof name);
    amqp_exchange_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0);
    if (amqp_get_rpc_reply(h->amqp).reply_type != AMQP_RESPONSE_NORMAL)
        broker_reopen_channel(h->amqp);
}

static void teardown(void)
{
    harness_kill_idemq(&F.daemon);
    if (F.ready && long_queue[0])
        delete_long_topology();
    long_queue[0] = '\0';
    harness_fixture_fini(&F);
}

/* ------------------------------------------------------------------------------ helpers */

static void set_i64(amqp_table_entry_t *e, const char *key, int64_t value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_I64;
    e->value.value.i64 = value;
}

static size_t frame_max(void)
{
    return (size_t)amqp_get_frame_max(F.h.amqp);
}

/* The x-delivery-count header of a delivery: -1 when absent. */
static int64_t delivery_count(const amqp_message_t *m)
{
    int64_t count;
    return message_header_int(&m->properties, "x-delivery-count", &count) ? count : -1;
}

static void header_names(const amqp_table_t *t, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->num_entries && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%.*s", i ? " " : "",
                                 (int)t->entries[i].key.len,
                                 (const char *)t->entries[i].key.bytes);
}

/* basic.get on the side channel without ack; the channel's close returns it. */
static bool side_get(const char *queue, amqp_message_t *out)
{
    amqp_rpc_reply_t reply =
        amqp_basic_get(F.h.amqp, SIDE_CHANNEL, amqp_cstring_bytes(queue), 0);
    cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL, "basic.get on %s failed", queue);
    if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
        return false;
    cr_assert(amqp_read_message(F.h.amqp, SIDE_CHANNEL, out, 0).reply_type ==
              AMQP_RESPONSE_NORMAL);
    return true;
}

static void side_open(void)
{
    amqp_channel_open(F.h.amqp, SIDE_CHANNEL);
    cr_assert(amqp_get_rpc_reply(F.h.amqp).reply_type == AMQP_RESPONSE_NORMAL);
}

static void side_close(void)
{
    amqp_channel_close(F.h.amqp, SIDE_CHANNEL, AMQP_REPLY_SUCCESS);
    cr_assert(amqp_get_rpc_reply(F.h.amqp).reply_type == AMQP_RESPONSE_NORMAL);
}

typedef struct get_wait {
    const char *queue;
    amqp_message_t *out;
} get_wait;

static bool got_one(harness *h, void *arg)
{
    get_wait *w = arg;
    return harness_get(h, w->queue, w->out);
}

/* got_one on the side channel (side_get). */
static bool side_got(harness *h, void *arg)
{
    (void)h;
    get_wait *w = arg;
    return side_get(w->queue, w->out);
}

/* A message whose producer headers make its header frame exactly `target` bytes: an optional
 * header "big" of big_len bytes, then headers "p-NNN" of about piece bytes each. */
#define PIECES_MAX 1200
typedef struct near_frame {
    amqp_table_entry_t entries[PIECES_MAX + 1];
    char keys[PIECES_MAX][16];
    amqp_basic_properties_t props;
} near_frame;

static char filler[200000];

static void near_frame_max(near_frame *nf, size_t target, size_t big_len, size_t piece)
{
    memset(filler, 'v', sizeof filler);
    amqp_basic_properties_t *p = &nf->props;
    *p = (amqp_basic_properties_t){
        ._flags =
            AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .headers = {.num_entries = 0, .entries = nf->entries}};
    int n = 0;
    if (big_len)
        nf->entries[n++] = harness_field_text("big", "");
    if (big_len)
        nf->entries[0].value.value.bytes = (amqp_bytes_t){.len = big_len, .bytes = filler};
    p->headers.num_entries = n;
    size_t entry = 1 + 5 + 1 + 4 + piece; /* "p-NNN" */
    while (message_header_frame_size(p) + entry <= target && n < PIECES_MAX + (big_len ? 1 : 0)) {
        snprintf(nf->keys[n], sizeof nf->keys[n], "p-%03d", n);
        nf->entries[n].key = amqp_cstring_bytes(nf->keys[n]);
        nf->entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
        nf->entries[n].value.value.bytes = (amqp_bytes_t){.len = piece, .bytes = filler};
        p->headers.num_entries = ++n;
    }
    cr_assert_gt(n, 0);
    size_t size = message_header_frame_size(p);
    cr_assert_leq(size, target, "cannot fill %zu bytes", target);
    nf->entries[n - 1].value.value.bytes.len += target - size;
    cr_assert_eq(message_header_frame_size(p), target);
}

/* The header frame of a delivery as it was published: without the broker's x-delivery-count. */
static size_t frame_size_as_published(const amqp_basic_properties_t *in)
{
    amqp_basic_properties_t p = *in;
    amqp_table_entry_t *entries = calloc((size_t)in->headers.num_entries + 1, sizeof *entries);
    cr_assert(entries);
    int n = 0;
    for (int i = 0; i < in->headers.num_entries; i++)
        if (!harness_bytes_eq(in->headers.entries[i].key, amqp_cstring_bytes("x-delivery-count")))
            entries[n++] = in->headers.entries[i];
    p.headers = (amqp_table_t){.num_entries = n, .entries = entries};
    size_t size = message_header_frame_size(&p);
    free(entries);
    return size;
}

static bool has_header(const amqp_basic_properties_t *p, const char *key)
{
    for (int i = 0; i < p->headers.num_entries; i++)
        if (harness_bytes_eq(p->headers.entries[i].key, amqp_cstring_bytes(key)))
            return true;
    return false;
}

/* Runs `idemq dlq ARGS... -c config` and returns its exit code; *out owned by the caller. */
static int dlq_cli(char **out, const char *a1, const char *a2, const char *a3, const char *a4)
{
    const char *args[10] = {"dlq", a1, "-c", F.h.config_path};
    size_t n = 4;
    if (a2)
        args[n++] = a2;
    if (a3)
        args[n++] = a3;
    if (a4)
        args[n++] = a4;
    args[n] = NULL;
    return harness_run_cli(&F.h, out, args);
}

static void dlq_name(char *buf, size_t len)
{
    snprintf(buf, len, "%s.dlq", F.h.queue);
}

/* Publishes the canary event for order `order` (in PAYING) and asserts it is applied within
 * CANARY_MS. */
static void expect_canary(const char *order)
{
    int64_t start = harness_now_ms();
    harness_publish_event(&F.h, order, "PAY_SUCCESS", 7);
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM orders WHERE order_id = '%s' AND status = 'PAID'", order);
    bool applied = harness_wait_scalar(&F.h, 1, CANARY_MS, sql);
    int64_t took = harness_now_ms() - start;
    fprintf(stderr, "[measure] canary %s processed after %" PRId64 " ms\n", order, took);
    cr_assert(applied, "the canary %s behind a near-frame_max message was not processed within "
                       "%d ms",
              order, CANARY_MS);
}

/* idemq kept its broker connection: nothing in its log says it lost or replaced one. */
static void expect_no_lost_connection(void)
{
    long lost = harness_log_count(&F.h, "connection lost");
    long reconnects = harness_log_count(&F.h, "reconnect");
    cr_expect_eq(lost, 0, "idemq lost its broker connection %ld time(s) (log %s)", lost,
                 F.h.log_path);
    cr_expect_eq(reconnects, 0, "idemq reconnected %ld time(s) (log %s)", reconnects,
                 F.h.log_path);
}

/* `idemq dlq list`: exit 0, text and JSON; returns the JSON document. */
static json_t *expect_listing(size_t entries)
{
    char *out = NULL;
    int rc = dlq_cli(&out, "list", NULL, NULL, NULL);
    cr_assert_eq(rc, 0, "dlq list exited %d:\n%s", rc, out);
    free(out);
    rc = dlq_cli(&out, "list", "--json", NULL, NULL);
    cr_assert_eq(rc, 0, "dlq list --json exited %d:\n%s", rc, out);
    json_t *doc = harness_output_json(out);
    cr_assert_eq(json_array_size(json_object_get(doc, "messages")), entries, "%s", out);
    free(out);
    return doc;
}

/* ------------------------------------------------------------------------------ tests */

/*
 * What the broker adds on the way, measured as the growth of message_header_frame_size (checked
 * against rabbitmq-c's own encoder in tests/unit/test_message.c) with the longest names the
 * config allows: a copy as idemq publishes it to Q.retry -> Q.retry.N, dead-lettered back to a
 * quorum work queue Q; and a quorum queue's x-delivery-count on a message returned unacked.
 */
Test(frame_max, broker_additions_fit_the_headroom, .fini = teardown, .timeout = 60)
{
    harness_fixture_init(&F, "frame_max_measure", NULL);
    harness *h = &F.h;
    int major = harness_broker_major(h);
    /* 200 bytes: the config's longest queue name (config/consumers.c QUEUE_MAX). */
    int n = snprintf(long_queue, sizeof long_queue, "%s.", h->queue);
    memset(long_queue + n, 'q', 200 - (size_t)n);
    long_queue[200] = '\0';
    long_consumer = (config_consumer){
        .queue = long_queue,
        .handler_name = (char *)"pay-callback",
        .queue_type = CONFIG_QUEUE_QUORUM,
        .declare = CONFIG_DECLARE_PASSIVE,
        .retry = {.max_retries = 2, .base_ms = 50, .jitter_ms = 10, .max_delay_ms = 3600000}};
    /* The work queue as quorum, the worst case: it adds x-delivery-count too. */
    amqp_table_entry_t quorum;
    quorum = harness_field_text("x-queue-type", "quorum");
    amqp_queue_declare(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(long_queue), 0, 1, 0, 0,
                       (amqp_table_t){.num_entries = 1, .entries = &quorum});
    cr_assert(amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL);
    char warning[TOPOLOGY_WARNING_MAX];
    cr_assert_eq(topology_declare(h->amqp, &long_consumer, warning, sizeof warning), 0, "%s",
                 warning);

    /* A copy like idemq's (message_copy_properties of a delivery with no headers). */
    amqp_basic_properties_t in = {._flags = AMQP_BASIC_CONTENT_TYPE_FLAG,
                                  .content_type = amqp_cstring_bytes("application/json")};
    broker_message *msg = broker_message_new(&in, 2, 2);
    cr_assert(msg);
    copy_headers ch = {.retries = 2,
                       .error_class = "retryable",
                       .error = "row missing",
                       .handler = "pay-callback",
                       .queue = long_queue,
                       .first_failed_at_ms = 1700000000000,
                       .publish_seq = 1,
                       .expiration = "10",
                       .failure_id = "0123456789abcdef0123456789abcdef"};
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t copy;
    cr_assert_eq(message_copy_properties(msg, &ch, frame_max(), &pool, &copy), 0);
    size_t published = message_header_frame_size(&copy);
    char retry_exchange[TOPOLOGY_NAME_MAX], retry_queue[TOPOLOGY_NAME_MAX];
    topology_retry_exchange(&long_consumer, retry_exchange, sizeof retry_exchange);
    topology_retry_queue(&long_consumer, 2, retry_queue, sizeof retry_queue);
    harness_publish_props(h, retry_exchange, retry_queue, &copy, "{}", 2);

    /* Back on the work queue after the hop, read as idemq reads it (unacked, first delivery),
     * then returned once and read again (x-delivery-count 1). */
    side_open();
    amqp_message_t first, again;
    get_wait back = {.queue = long_queue, .out = &first};
    cr_assert(harness_wait_for(side_got, h, &back, 10000), "the copy did not come back from %s",
              retry_queue);
    side_close();
    side_open();
    cr_assert(side_get(long_queue, &again), "the returned copy is not in %s", long_queue);
    side_close();
    size_t hop = message_header_frame_size(&first.properties) - published;
    size_t returned = message_header_frame_size(&again.properties) - published;
    char names[2048];
    header_names(&again.properties.headers, names, sizeof names);
    fprintf(stderr,
            "[measure] RabbitMQ %d, 200-byte queue name: one retry hop adds %zu bytes to the "
            "header frame (x-delivery-count on the first delivery: %" PRId64
            "), returned once %zu bytes; headers now: %s\n",
            major, hop, delivery_count(&first), returned, names);
    cr_assert(message_header_bytes(&again.properties, "x-first-death-queue", &(amqp_bytes_t){0}),
              "no x-first-death-queue: the hop did not dead-letter as expected (%s)", names);
    /* Two hops (a delivery-limit dead-lettering on top, see message.h) must fit. */
    cr_expect_leq(2 * returned, (size_t)MESSAGE_BROKER_HEADROOM,
                  "RabbitMQ %d adds %zu bytes per hop: MESSAGE_BROKER_HEADROOM (%d) is too small",
                  major, returned, MESSAGE_BROKER_HEADROOM);
    amqp_destroy_message(&first);
    amqp_destroy_message(&again);
    /* Drain the work queue (the returned copy is ready again). */
    amqp_message_t m;
    get_wait w = {.queue = long_queue, .out = &m};
    cr_assert(harness_wait_for(got_one, h, &w, 5000));
    amqp_destroy_message(&m);
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

static const char keyless_body[] = "{\"order_id\":\"nokey\",\"event_type\":\"PAY_SUCCESS\","
                                   "\"note\":\"no biz_key: non-retryable\"}";

Test(frame_max, dlq_bound_messages_near_frame_max_reach_the_dlq_and_the_queue_flows,
     .fini = teardown, .timeout = 120)
{
    harness_fixture_init(&F, "frame_max_dlq", NULL);
    harness *h = &F.h;
    harness_broker_major(h);
    harness_insert_orders(h, "canary", 2, "PAYING");
    harness_fixture_start(&F, "started consuming", 20000);
    const size_t gaps[] = {200, 300};
    static near_frame nf[2];
    for (int i = 0; i < 2; i++) {
        near_frame_max(&nf[i], frame_max() - gaps[i], 20000, 1000);
        harness_publish_props(h, NULL, h->queue, &nf[i].props, keyless_body,
                              strlen(keyless_body));
        char canary[16];
        snprintf(canary, sizeof canary, "canary%d", i);
        expect_canary(canary);
    }
    char dlq[200];
    dlq_name(dlq, sizeof dlq);
    cr_assert(harness_wait_queue_depth(h, dlq, 2, 10000), "the dead letters did not arrive");

    json_t *doc = expect_listing(2);
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(json_object_get(doc, "messages"), i);
        cr_expect_str_eq(harness_json_str(e, "error_class"), "non_retryable");
        cr_expect_eq(json_integer_value(json_object_get(e, "copies")), 1);
    }
    json_decref(doc);

    /* What the DLQ holds (after the listing, which republished each one unchanged). */
    for (int i = 0; i < 2; i++) {
        amqp_message_t m;
        cr_assert(harness_get(h, dlq, &m), "dead letter %d is missing", i);
        cr_expect(harness_bytes_eq(m.body, amqp_cstring_bytes(keyless_body)),
                  "#%d: the body changed", i);
        amqp_bytes_t record;
        cr_assert(message_header_bytes(&m.properties, HEADER_DROPPED_HEADERS, &record),
                  "#%d: no %s header", i, HEADER_DROPPED_HEADERS);
        cr_expect(record.len > 4 && memcmp(record.bytes, "big (", 5) == 0,
                  "#%d: the largest header must be the one left out: %.*s", i, (int)record.len,
                  (const char *)record.bytes);
        cr_expect(!has_header(&m.properties, "big"));
        cr_expect(has_header(&m.properties, "p-001"), "#%d: only as many as needed go", i);
        cr_expect(has_header(&m.properties, HEADER_ERROR_CLASS) &&
                  has_header(&m.properties, HEADER_QUEUE));
        size_t size = frame_size_as_published(&m.properties);
        cr_expect_leq(size, message_frame_limit(frame_max()),
                      "#%d: the copy's header frame (%zu bytes) leaves no headroom", i, size);
        fprintf(stderr, "[measure] near frame_max - %zu: DLQ copy header frame %zu bytes (%.*s)\n",
                gaps[i], size, (int)record.len, (const char *)record.bytes);
        amqp_destroy_message(&m);
    }
    cr_expect_eq(harness_log_count(h, "\"outcome\":\"dead_lettered\""), 2,
                 "each message is dead-lettered once");
    expect_no_lost_connection();
    harness_stop_idemq(&F.daemon);
}

Test(frame_max, a_retried_copy_near_frame_max_climbs_the_ladder_and_stays_readable,
     .fini = teardown, .timeout = 120)
{
    harness_options o = {.retry_set = true, .max_retries = 2, .base = "100ms", .jitter = "50ms"};
    harness_fixture_init(&F, "frame_max_retry", &o);
    harness *h = &F.h;
    harness_broker_major(h);
    harness_insert_orders(h, "canary", 1, "PAYING");
    harness_fixture_start(&F, "started consuming", 20000);
    /* Many small headers: the copy ends close under the limit, and each hop's x-death goes on
     * top of it. The order does not exist: retryable, until the retries are spent. */
    static near_frame nf;
    near_frame_max(&nf, frame_max() - 200, 0, 300);
    static const char body[] = "{\"biz_key\":\"order_id:ghost:PAY_SUCCESS\",\"order_id\":\"ghost\","
                               "\"event_type\":\"PAY_SUCCESS\",\"amount\":1}";
    harness_publish_props(h, NULL, h->queue, &nf.props, body, strlen(body));
    expect_canary("canary0");
    char dlq[200];
    dlq_name(dlq, sizeof dlq);
    cr_assert(harness_wait_queue_depth(h, dlq, 1, 20000), "the retried message did not reach %s",
              dlq);

    json_t *doc = expect_listing(1);
    json_t *e = json_array_get(json_object_get(doc, "messages"), 0);
    cr_expect_str_eq(harness_json_str(e, "biz_key"), "order_id:ghost:PAY_SUCCESS");
    cr_expect_str_eq(harness_json_str(e, "error_class"), "retries_exhausted");
    cr_expect_eq(json_integer_value(json_object_get(e, "retries")), 2);
    json_decref(doc);

    amqp_message_t m;
    cr_assert(harness_get(h, dlq, &m));
    cr_expect(harness_bytes_eq(m.body, amqp_cstring_bytes(body)), "the body changed");
    int64_t retries = -1;
    cr_expect(message_header_int(&m.properties, HEADER_RETRIES, &retries) && retries == 2,
              "the copy went up the ladder %" PRId64 " time(s), want 2", retries);
    amqp_bytes_t record;
    cr_expect(message_header_bytes(&m.properties, HEADER_DROPPED_HEADERS, &record) &&
                  memcmp(record.bytes, "p-", 2) == 0,
              "no record of the headers left out");
    cr_expect(!has_header(&m.properties, "x-death"), "the hop's x-death is not carried on");
    size_t size = frame_size_as_published(&m.properties);
    cr_expect_leq(size, message_frame_limit(frame_max()));
    fprintf(stderr, "[measure] retried near frame_max - 200: DLQ copy header frame %zu bytes\n",
            size);
    amqp_destroy_message(&m);
    expect_no_lost_connection();
    harness_stop_idemq(&F.daemon);
}

/* The header frame an older idemq could write: right up to frame_max, pushed over it by the
 * broker's x-delivery-count once the message was returned. idemq dlq must still read it. */
Test(frame_max, dlq_reads_and_replays_a_dead_letter_that_the_broker_pushed_over_frame_max,
     .fini = teardown, .timeout = 60)
{
    harness_fixture_init(&F, "frame_max_legacy", NULL);
    harness *h = &F.h;
    harness_broker_major(h);
    harness_declare_topology(h);
    size_t fm = frame_max();
    /* The test's own connection must read it too; its publishes stay small. */
    cr_assert_eq(amqp_tune_connection(h->amqp, amqp_get_channel_max(h->amqp),
                                      (int)fm + MESSAGE_BROKER_HEADROOM,
                                      amqp_get_heartbeat(h->amqp)),
                 AMQP_STATUS_OK);
    static near_frame nf;
    near_frame_max(&nf, fm, 0, 1000);
    static const char body[] = "{\"biz_key\":\"order_id:legacy:PAY_SUCCESS\","
                               "\"order_id\":\"legacy\",\"event_type\":\"PAY_SUCCESS\","
                               "\"amount\":1}";
    char dlq[200];
    dlq_name(dlq, sizeof dlq);
    harness_publish_props(h, NULL, dlq, &nf.props, body, strlen(body));
    /* Returned once: from now on every delivery carries x-delivery-count (3.10 and 4.x). */
    side_open();
    amqp_message_t m;
    cr_assert(side_get(dlq, &m));
    amqp_destroy_message(&m);
    side_close();
    side_open();
    cr_assert(side_get(dlq, &m));
    size_t delivered = message_header_frame_size(&m.properties);
    amqp_destroy_message(&m);
    side_close();
    cr_assert_gt(delivered, fm, "the delivery (%zu bytes) must be over frame_max (%zu) for this "
                                "test to mean anything",
                 delivered, fm);

    json_t *doc = expect_listing(1);
    cr_expect_str_eq(
        harness_json_str(json_array_get(json_object_get(doc, "messages"), 0), "biz_key"),
        "order_id:legacy:PAY_SUCCESS");
    json_decref(doc);
    char *out = NULL;
    int rc = dlq_cli(&out, "replay", "--all", "--json", NULL);
    cr_assert_eq(rc, 0, "dlq replay exited %d:\n%s", rc, out);
    doc = harness_output_json(out);
    cr_expect_eq(json_integer_value(json_object_get(doc, "replayed")), 1, "%s", out);
    json_decref(doc);
    free(out);
    cr_assert(harness_wait_queue_depth(h, dlq, 0, 5000));
    cr_assert(harness_get(h, h->queue, &m), "the replay is not in the work queue");
    cr_expect(harness_bytes_eq(m.body, amqp_cstring_bytes(body)));
    cr_expect_leq(frame_size_as_published(&m.properties), message_frame_limit(fm),
                  "the replay must leave the headroom");
    amqp_bytes_t record;
    cr_expect(message_header_bytes(&m.properties, HEADER_DROPPED_HEADERS, &record),
              "the replay must say what it left out");
    amqp_destroy_message(&m);
}

/* ----------------------------------------------------------------- copies of one failure */

typedef struct copy_spec {
    char body[256];
    char error[64];
    char failure_id[MESSAGE_FAILURE_ID_MAX + 1];
    amqp_table_entry_t headers[8];
    amqp_basic_properties_t props;
} copy_spec;

/* A dead letter as idemq writes one; failure_id NULL: as an older idemq did, without one. */
static void make_copy(copy_spec *s, const char *order, const char *failure_id)
{
    memset(s, 0, sizeof *s);
    snprintf(s->body, sizeof s->body,
             "{\"biz_key\":\"order_id:%s:PAY_SUCCESS\",\"order_id\":\"%s\","
             "\"event_type\":\"PAY_SUCCESS\",\"amount\":5}",
             order, order);
    snprintf(s->error, sizeof s->error, "illegal transition for %s", order);
    int n = 0;
    set_i64(&s->headers[n++], HEADER_RETRIES, 0);
    s->headers[n++] = harness_field_text(HEADER_ERROR_CLASS, "non_retryable");
    s->headers[n++] = harness_field_text(HEADER_ERROR, s->error);
    s->headers[n++] = harness_field_text(HEADER_HANDLER, "pay-callback");
    s->headers[n++] = harness_field_text(HEADER_QUEUE, F.h.queue);
    set_i64(&s->headers[n++], HEADER_FIRST_FAILED_AT, 1700000000000);
    if (failure_id) {
        snprintf(s->failure_id, sizeof s->failure_id, "%s", failure_id);
        s->headers[n++] = harness_field_text(HEADER_FAILURE_ID, s->failure_id);
    }
    s->props = (amqp_basic_properties_t){
        ._flags =
            AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .headers = {.num_entries = n, .entries = s->headers}};
}

static void failure_id_of(const char *order, char out[MESSAGE_FAILURE_ID_MAX + 1])
{
    char key[64];
    snprintf(key, sizeof key, "order_id:%s:PAY_SUCCESS", order);
    message_failure_id(key, NULL, 0, NULL, "pay-callback", 0, 0, out, MESSAGE_FAILURE_ID_MAX + 1);
}

static void dead_letter(const char *order, bool with_id)
{
    char id[MESSAGE_FAILURE_ID_MAX + 1];
    failure_id_of(order, id);
    copy_spec s;
    make_copy(&s, order, with_id ? id : NULL);
    char dlq[200];
    dlq_name(dlq, sizeof dlq);
    harness_publish_props(&F.h, NULL, dlq, &s.props, s.body, strlen(s.body));
}

/* The biz_keys of the listing's entries, "key*copies" when more than one, joined by ' '. */
static void listing_keys(json_t *doc, char *buf, size_t len)
{
    json_t *messages = json_object_get(doc, "messages");
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(messages) && used < len; i++) {
        json_t *e = json_array_get(messages, i);
        json_int_t copies = json_integer_value(json_object_get(e, "copies"));
        const char *key = harness_json_str(e, "biz_key");
        key = strncmp(key, "order_id:", 9) == 0 ? key + 9 : key; /* "order_id:a:PAY" -> "a" */
        int key_len = (int)strcspn(key, ":");
        used += (size_t)snprintf(buf + used, len - used, "%s%.*s", i ? " " : "", key_len, key);
        if (copies != 1 && used < len)
            used += (size_t)snprintf(buf + used, len - used, "*%lld", (long long)copies);
    }
}

Test(frame_max, copies_of_one_failure_are_one_entry_and_one_replay, .fini = teardown,
     .timeout = 60)
{
    harness_fixture_init(&F, "frame_max_copies", NULL);
    harness *h = &F.h;
    harness_broker_major(h);
    harness_declare_topology(h);
    /* As the broker holds them after a lost ack: the copy, then the redelivery's copy. */
    dead_letter("a", true);
    dead_letter("b", true);
    dead_letter("a", true);
    char dlq[200];
    dlq_name(dlq, sizeof dlq);
    cr_assert(harness_wait_queue_depth(h, dlq, 3, 5000));

    char *out = NULL;
    int rc = dlq_cli(&out, "list", NULL, NULL, NULL);
    cr_assert_eq(rc, 0, "dlq list exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "2 copies (a lost ack duplicated this dead letter)"), "%s", out);
    cr_expect(strstr(out, "3 message(s) in"), "%s", out);
    free(out);
    json_t *doc = expect_listing(2);
    char keys[256];
    listing_keys(doc, keys, sizeof keys);
    cr_expect_str_eq(keys, "a*2 b");
    json_decref(doc);
    cr_assert_eq(harness_queue_depth(h, dlq), 3, "listing removed something");

    rc = dlq_cli(&out, "replay", "--all", "--json", NULL);
    cr_assert_eq(rc, 0, "dlq replay --all exited %d:\n%s", rc, out);
    doc = harness_output_json(out);
    cr_expect_eq(json_integer_value(json_object_get(doc, "replayed")), 2, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(doc, "removed_copies")), 1, "%s", out);
    cr_expect_eq(json_integer_value(json_object_get(doc, "failed")), 0, "%s", out);
    listing_keys(doc, keys, sizeof keys);
    cr_expect_str_eq(keys, "a*2 b");
    json_decref(doc);
    free(out);
    cr_assert(harness_wait_queue_depth(h, dlq, 0, 5000), "replay --all must empty the DLQ");
    cr_assert(harness_wait_queue_depth(h, h->queue, 2, 5000),
              "the work queue must hold one replay per failure");
    const char *want[] = {"order_id:a:PAY_SUCCESS", "order_id:b:PAY_SUCCESS"};
    for (int i = 0; i < 2; i++) {
        amqp_message_t m;
        cr_assert(harness_get(h, h->queue, &m));
        cr_expect(strstr((const char *)m.body.bytes, want[i]) != NULL, "replay %d: %.*s", i,
                  (int)m.body.len, (const char *)m.body.bytes);
        cr_expect(!has_header(&m.properties, HEADER_FAILURE_ID), "a replay starts afresh");
        amqp_destroy_message(&m);
    }
}

Test(frame_max, copies_across_chunks_are_counted_and_messages_without_an_id_never_are,
     .fini = teardown, .timeout = 60)
{
    harness_fixture_init(&F, "frame_max_chunks", NULL);
    harness *h = &F.h;
    harness_broker_major(h);
    harness_declare_topology(h);
    /* a, 20 others (more than a chunk of 16), a's copy; c twice without an id; d with a's id
     * but another body (not a copy of a). */
    dead_letter("a", true);
    for (int i = 0; i < 20; i++) {
        char order[8];
        snprintf(order, sizeof order, "f%02d", i);
        dead_letter(order, true);
    }
    dead_letter("a", true);
    dead_letter("c", false);
    dead_letter("c", false);
    char id_a[MESSAGE_FAILURE_ID_MAX + 1];
    failure_id_of("a", id_a);
    copy_spec d;
    make_copy(&d, "d", id_a);
    char dlq[200];
    dlq_name(dlq, sizeof dlq);
    harness_publish_props(h, NULL, dlq, &d.props, d.body, strlen(d.body));
    cr_assert(harness_wait_queue_depth(h, dlq, 25, 5000));

    static char want[512], keys[512];
    size_t used = (size_t)snprintf(want, sizeof want, "a*2");
    for (int i = 0; i < 20; i++)
        used += (size_t)snprintf(want + used, sizeof want - used, " f%02d", i);
    snprintf(want + used, sizeof want - used, " c c d");
    json_t *doc = expect_listing(24);
    listing_keys(doc, keys, sizeof keys);
    cr_expect_str_eq(keys, want);
    json_decref(doc);

    /* --limit counts replays, not the copies they remove. */
    char *out = NULL;
    int rc = dlq_cli(&out, "replay", "--all", "--limit", "1");
    cr_assert_eq(rc, 0, "dlq replay --all --limit 1 exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "replayed 1 message(s)") && strstr(out, "removed 1 copy"), "%s", out);
    free(out);
    cr_assert(harness_wait_queue_depth(h, dlq, 23, 5000));
    cr_assert(harness_wait_queue_depth(h, h->queue, 1, 5000));
    used = 0;
    for (int i = 0; i < 20; i++)
        used += (size_t)snprintf(want + used, sizeof want - used, "%sf%02d", i ? " " : "", i);
    snprintf(want + used, sizeof want - used, " c c d");
    doc = expect_listing(23);
    listing_keys(doc, keys, sizeof keys);
    cr_expect_str_eq(keys, want, "the others keep their order");
    json_decref(doc);
}
