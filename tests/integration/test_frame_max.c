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

static void set_utf8(amqp_table_entry_t *e, const char *key, const char *value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_UTF8;
    e->value.value.bytes = amqp_cstring_bytes(value);
}

__attribute__((unused)) static void set_i64(amqp_table_entry_t *e, const char *key, int64_t value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_I64;
    e->value.value.i64 = value;
}

static size_t frame_max(void)
{
    return (size_t)amqp_get_frame_max(F.h.amqp);
}

__attribute__((unused)) static bool bytes_eq(amqp_bytes_t a, amqp_bytes_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.bytes, b.bytes, a.len) == 0);
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
    set_utf8(&quorum, "x-queue-type", "quorum");
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
    int64_t deadline = harness_now_ms() + 10000;
    bool got = false;
    while (!got && harness_now_ms() < deadline)
        got = side_get(long_queue, &first);
    cr_assert(got, "the copy did not come back from %s", retry_queue);
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
