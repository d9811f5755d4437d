/*
 * Delivery assembly limits: a body is kept to the receiver's limit from its content header on,
 * whatever size the header announces, and body frames are checked against the announced size.
 *
 * Copies that fit a frame: message_header_frame_size against what rabbitmq-c really writes (its
 * own frame encoder, over a socketpair), the order producer headers are left out in, the
 * idemq-dropped-headers record, MESSAGE_E_TOO_LARGE; and the failure identity's properties.
 */
#include "broker/amqp_api.h"
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker/connection.h"
#include "broker/message.h"

static amqp_bytes_t text(const char *s)
{
    return (amqp_bytes_t){.len = strlen(s), .bytes = (void *)s};
}

Test(message, a_body_within_the_limit_is_kept_whole)
{
    amqp_basic_properties_t props = {0};
    broker_message *msg = broker_message_new(&props, 10, 16);
    cr_assert(msg);
    bool overrun = true;
    cr_expect(!broker_message_add_body(msg, text("hello"), &overrun));
    cr_expect(!overrun);
    cr_expect(broker_message_add_body(msg, text("world"), &overrun));
    cr_expect(!broker_message_truncated(msg));
    cr_expect_eq(msg->body_len, 10);
    cr_expect(memcmp(msg->body, "helloworld", 10) == 0);
    broker_message_free(msg);
}

Test(message, an_announced_size_far_over_the_limit_allocates_only_the_limit)
{
    amqp_basic_properties_t props = {0};
    /* A hostile header: 16 EiB. Allocating it would fail (or worse); only 8 bytes are kept. */
    broker_message *msg = broker_message_new(&props, UINT64_MAX / 2, 8);
    cr_assert(msg, "the announced size must not decide the allocation");
    cr_expect_eq(msg->body_len, 8);
    cr_expect(broker_message_truncated(msg));
    broker_message_free(msg);
}

Test(message, a_body_over_the_limit_keeps_its_first_bytes_and_completes_on_the_last_frame)
{
    amqp_basic_properties_t props = {0};
    broker_message *msg = broker_message_new(&props, 12, 5);
    cr_assert(msg);
    bool overrun = true;
    cr_expect(!broker_message_add_body(msg, text("abc"), &overrun));
    cr_expect(!broker_message_add_body(msg, text("defg"), &overrun));
    cr_expect(broker_message_add_body(msg, text("hijkl"), &overrun), "12 of 12 bytes arrived");
    cr_expect(!overrun);
    cr_expect_eq(msg->body_received, 5);
    cr_expect(memcmp(msg->body, "abcde", 5) == 0);
    cr_expect(broker_message_truncated(msg));
    cr_expect_eq(msg->announced_len, 12);
    broker_message_free(msg);
}

Test(message, a_frame_longer_than_announced_is_an_overrun)
{
    amqp_basic_properties_t props = {0};
    broker_message *msg = broker_message_new(&props, 4, 64);
    cr_assert(msg);
    bool overrun = false;
    cr_expect(!broker_message_add_body(msg, text("toolong"), &overrun));
    cr_expect(overrun);
    cr_expect_eq(msg->body_received, 0, "nothing of an overrunning frame is copied");
    broker_message_free(msg);
}

/* ------------------------------------------------------------------- encoded frame sizes */

/* rabbitmq-c's frame_max before login (0.11: AMQP_INITIAL_FRAME_POOL_PAGE_SIZE); the frame it
 * refuses over is the same at any value, and amqp_tune_connection cannot change it on a
 * connection that is not logged in. */
#define LIBRARY_FRAME_MAX 65536

/* Sends props as a content-header frame through rabbitmq-c (amqp_send_frame, the function
 * amqp_basic_publish uses) over a socketpair, and returns the bytes that came out, or -1 with the
 * library's status in *status when it refused. */
static long wire_size(const amqp_basic_properties_t *props, int *status)
{
    int fds[2];
    cr_assert(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    int big = 4 << 20;
    setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *sock = amqp_tcp_socket_new(conn);
    cr_assert(conn && sock);
    amqp_tcp_socket_set_sockfd(sock, fds[0]);
    cr_assert_eq(amqp_get_frame_max(conn), LIBRARY_FRAME_MAX);
    amqp_frame_t frame = {.frame_type = AMQP_FRAME_HEADER, .channel = 1};
    frame.payload.properties.class_id = AMQP_BASIC_CLASS;
    frame.payload.properties.body_size = 3;
    frame.payload.properties.decoded = (void *)props;
    *status = amqp_send_frame(conn, &frame);
    long total = -1;
    if (*status == AMQP_STATUS_OK) {
        shutdown(fds[0], SHUT_WR);
        total = 0;
        char buf[65536];
        ssize_t n;
        while ((n = read(fds[1], buf, sizeof buf)) > 0)
            total += n;
    }
    amqp_destroy_connection(conn); /* closes fds[0] */
    close(fds[1]);
    return total;
}

static void set_text(amqp_table_entry_t *e, const char *key, amqp_bytes_t value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_UTF8;
    e->value.value.bytes = value;
}

Test(message_frame, the_computed_size_is_what_rabbitmq_c_sends_for_every_field_kind)
{
    amqp_field_value_t array_items[3] = {
        {.kind = AMQP_FIELD_KIND_I32, .value.i32 = 7},
        {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("in an array")},
        {.kind = AMQP_FIELD_KIND_VOID},
    };
    amqp_table_entry_t inner[2];
    set_text(&inner[0], "region", amqp_cstring_bytes("eu"));
    inner[1] = (amqp_table_entry_t){.key = amqp_cstring_bytes("empty"),
                                    .value = {.kind = AMQP_FIELD_KIND_ARRAY}};
    amqp_table_entry_t h[] = {
        {.key = amqp_cstring_bytes("bool"), .value = {.kind = AMQP_FIELD_KIND_BOOLEAN}},
        {.key = amqp_cstring_bytes("i8"), .value = {.kind = AMQP_FIELD_KIND_I8, .value.i8 = -1}},
        {.key = amqp_cstring_bytes("u8"), .value = {.kind = AMQP_FIELD_KIND_U8, .value.u8 = 1}},
        {.key = amqp_cstring_bytes("i16"), .value = {.kind = AMQP_FIELD_KIND_I16}},
        {.key = amqp_cstring_bytes("u16"), .value = {.kind = AMQP_FIELD_KIND_U16}},
        {.key = amqp_cstring_bytes("i32"), .value = {.kind = AMQP_FIELD_KIND_I32}},
        {.key = amqp_cstring_bytes("u32"), .value = {.kind = AMQP_FIELD_KIND_U32}},
        {.key = amqp_cstring_bytes("i64"), .value = {.kind = AMQP_FIELD_KIND_I64}},
        {.key = amqp_cstring_bytes("u64"), .value = {.kind = AMQP_FIELD_KIND_U64}},
        {.key = amqp_cstring_bytes("f32"), .value = {.kind = AMQP_FIELD_KIND_F32}},
        {.key = amqp_cstring_bytes("f64"), .value = {.kind = AMQP_FIELD_KIND_F64}},
        {.key = amqp_cstring_bytes("dec"), .value = {.kind = AMQP_FIELD_KIND_DECIMAL}},
        {.key = amqp_cstring_bytes("ts"), .value = {.kind = AMQP_FIELD_KIND_TIMESTAMP}},
        {.key = amqp_cstring_bytes("void"), .value = {.kind = AMQP_FIELD_KIND_VOID}},
        {.key = amqp_cstring_bytes("bytes"),
         .value = {.kind = AMQP_FIELD_KIND_BYTES, .value.bytes = amqp_cstring_bytes("\x01\x02")}},
        {.key = amqp_cstring_bytes("text"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("hello")}},
        {.key = amqp_cstring_bytes("array"),
         .value = {.kind = AMQP_FIELD_KIND_ARRAY,
                   .value.array = {.num_entries = 3, .entries = array_items}}},
        {.key = amqp_cstring_bytes("table"),
         .value = {.kind = AMQP_FIELD_KIND_TABLE,
                   .value.table = {.num_entries = 2, .entries = inner}}},
    };
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                  AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                  AMQP_BASIC_PRIORITY_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
                  AMQP_BASIC_REPLY_TO_FLAG | AMQP_BASIC_EXPIRATION_FLAG |
                  AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_TYPE_FLAG |
                  AMQP_BASIC_USER_ID_FLAG | AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_CLUSTER_ID_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .content_encoding = amqp_cstring_bytes("gzip"),
        .headers = {.num_entries = sizeof h / sizeof h[0], .entries = h},
        .delivery_mode = 2,
        .priority = 3,
        .correlation_id = amqp_cstring_bytes("corr"),
        .reply_to = amqp_cstring_bytes("replies"),
        .expiration = amqp_cstring_bytes("60000"),
        .message_id = amqp_cstring_bytes("m-1"),
        .timestamp = 1700000000,
        .type = amqp_cstring_bytes("PAY"),
        .user_id = amqp_cstring_bytes("guest"),
        .app_id = amqp_cstring_bytes("payments"),
        .cluster_id = amqp_cstring_bytes("c"),
    };
    int status;
    long sent = wire_size(&props, &status);
    cr_assert_eq(status, AMQP_STATUS_OK, "%s", amqp_error_string2(status));
    cr_expect_eq(message_header_frame_size(&props), (size_t)sent);

    /* No properties at all, and headers only. */
    amqp_basic_properties_t none = {0};
    cr_expect_eq(message_header_frame_size(&none), (size_t)wire_size(&none, &status));
    amqp_basic_properties_t only = {._flags = AMQP_BASIC_HEADERS_FLAG, .headers = props.headers};
    cr_expect_eq(message_header_frame_size(&only), (size_t)wire_size(&only, &status));
}

/* Headers of `count` string entries "hNNN" whose frame is exactly `target` bytes: the last
 * value takes up the difference. */
static amqp_basic_properties_t headers_of_size(amqp_table_entry_t *entries, int count,
                                               size_t target, char *storage)
{
    amqp_basic_properties_t p = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                 .headers = {.num_entries = count, .entries = entries}};
    static char keys[64][8];
    for (int i = 0; i < count; i++) {
        snprintf(keys[i], sizeof keys[i], "h%03d", i % 1000);
        set_text(&entries[i], keys[i], (amqp_bytes_t){.len = 0, .bytes = storage});
    }
    size_t base = message_header_frame_size(&p);
    cr_assert(target >= base);
    size_t each = (target - base) / (size_t)count;
    for (int i = 0; i < count; i++)
        entries[i].value.value.bytes.len = each;
    entries[count - 1].value.value.bytes.len += target - message_header_frame_size(&p);
    cr_assert_eq(message_header_frame_size(&p), target);
    return p;
}

Test(message_frame, a_frame_of_exactly_frame_max_is_sent_and_one_byte_more_is_refused)
{
    static char storage[200000];
    memset(storage, 'v', sizeof storage);
    amqp_table_entry_t entries[8];
    amqp_basic_properties_t p = headers_of_size(entries, 8, LIBRARY_FRAME_MAX, storage);
    int status;
    cr_expect_eq(wire_size(&p, &status), LIBRARY_FRAME_MAX, "%s", amqp_error_string2(status));
    p = headers_of_size(entries, 8, LIBRARY_FRAME_MAX + 1, storage);
    cr_expect_eq(wire_size(&p, &status), -1);
    /* "table too large for buffer": what broke idemq's connection (issue 8). */
    cr_expect_eq(status, AMQP_STATUS_TABLE_TOO_BIG, "%s", amqp_error_string2(status));
}

Test(message_frame, what_rabbitmq_c_cannot_encode_has_no_size)
{
    static char storage[300];
    amqp_basic_properties_t p = {._flags = AMQP_BASIC_MESSAGE_ID_FLAG,
                                 .message_id = {.len = 256, .bytes = storage}};
    cr_expect_eq(message_header_frame_size(&p), SIZE_MAX, "a short string over 255 bytes");
    amqp_table_entry_t e = {.key = {.len = 256, .bytes = storage},
                            .value = {.kind = AMQP_FIELD_KIND_VOID}};
    p = (amqp_basic_properties_t){._flags = AMQP_BASIC_HEADERS_FLAG,
                                  .headers = {.num_entries = 1, .entries = &e}};
    cr_expect_eq(message_header_frame_size(&p), SIZE_MAX, "a header key over 255 bytes");
    e = (amqp_table_entry_t){.key = amqp_cstring_bytes("k"), .value = {.kind = 'Z'}};
    cr_expect_eq(message_header_frame_size(&p), SIZE_MAX, "an unknown field kind");
}

Test(message_frame, the_limit_leaves_the_headroom)
{
    cr_expect_eq(message_frame_limit(131072), 131072 - MESSAGE_BROKER_HEADROOM);
    cr_expect_eq(message_frame_limit(4096), 2048, "a small frame_max keeps half");
    cr_expect_eq(message_frame_limit(0), 0);
}

/* ------------------------------------------------------------------------------- copies */

static const copy_headers copy_defaults = {
    .retries = 1,
    .error_class = "non_retryable",
    .error = "bad body",
    .handler = "pay-callback",
    .queue = "payments",
    .first_failed_at_ms = 1700000000000,
    .publish_seq = 9,
    .failure_id = "00112233445566778899aabbccddeeff",
};

/* A delivery with the given headers (deep-copied) and a 3-byte body. */
static broker_message *delivery_with(const amqp_table_entry_t *entries, int count)
{
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .headers = {.num_entries = count, .entries = (amqp_table_entry_t *)entries}};
    broker_message *msg = broker_message_new(&props, 3, 3);
    cr_assert(msg);
    bool overrun;
    broker_message_add_body(msg, amqp_cstring_bytes("{1}"), &overrun);
    return msg;
}

static const amqp_table_entry_t *header(const amqp_basic_properties_t *p, const char *key)
{
    for (int i = 0; i < p->headers.num_entries; i++)
        if (p->headers.entries[i].key.len == strlen(key) &&
            memcmp(p->headers.entries[i].key.bytes, key, strlen(key)) == 0)
            return &p->headers.entries[i];
    return NULL;
}

static char *text_of(const amqp_basic_properties_t *p, const char *key, char *buf, size_t len)
{
    amqp_bytes_t v;
    if (!message_header_bytes(p, key, &v))
        return NULL;
    snprintf(buf, len, "%.*s", (int)v.len, (const char *)v.bytes);
    return buf;
}

static void expect_own_headers(const amqp_basic_properties_t *p)
{
    const char *own[] = {HEADER_RETRIES, HEADER_ERROR_CLASS, HEADER_ERROR,
                         HEADER_HANDLER, HEADER_QUEUE,       HEADER_FIRST_FAILED_AT,
                         HEADER_PUBLISH_SEQ, HEADER_FAILURE_ID};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        cr_expect(header(p, own[i]), "%s is missing", own[i]);
}

Test(message_copy, a_copy_that_fits_keeps_every_header_and_records_nothing)
{
    amqp_table_entry_t h[2];
    set_text(&h[0], "trace", amqp_cstring_bytes("abc"));
    set_text(&h[1], "x-death", amqp_cstring_bytes("broker's"));
    broker_message *msg = delivery_with(h, 2);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 131072, &pool, &out), 0);
    expect_own_headers(&out);
    char buf[64];
    cr_expect_str_eq(text_of(&out, HEADER_FAILURE_ID, buf, sizeof buf),
                     copy_defaults.failure_id);
    cr_expect(header(&out, "trace"));
    cr_expect(!header(&out, "x-death"));
    cr_expect(!header(&out, HEADER_DROPPED_HEADERS));
    copy_headers no_id = copy_defaults;
    no_id.failure_id = NULL;
    cr_assert_eq(message_copy_properties(msg, &no_id, 131072, &pool, &out), 0);
    cr_expect(!header(&out, HEADER_FAILURE_ID), "written only when given");
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

/* The frame of msg's copy with no producer header: what the producer headers add to. */
static size_t bare_copy_size(const copy_headers *ch)
{
    broker_message *bare = delivery_with(NULL, 0);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_copy_properties(bare, ch, 131072, &pool, &out), 0);
    size_t size = message_header_frame_size(&out);
    empty_amqp_pool(&pool);
    broker_message_free(bare);
    return size;
}

#define ENTRY(key_len, value_len) (1 + (key_len) + 1 + 4 + (value_len))

Test(message_copy, a_copy_of_exactly_the_limit_is_kept_and_one_byte_more_drops_a_header)
{
    static char storage[200000];
    memset(storage, 'v', sizeof storage);
    size_t limit = message_frame_limit(131072);
    size_t bare = bare_copy_size(&copy_defaults);
    amqp_table_entry_t h[2];
    set_text(&h[0], "small", amqp_cstring_bytes("s"));
    size_t value = limit - bare - ENTRY(5, 1) - ENTRY(3, 0);
    set_text(&h[1], "big", (amqp_bytes_t){.len = value, .bytes = storage});
    broker_message *msg = delivery_with(h, 2);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 131072, &pool, &out), 0);
    cr_expect_eq(message_header_frame_size(&out), limit);
    cr_expect(header(&out, "big") && !header(&out, HEADER_DROPPED_HEADERS));
    broker_message_free(msg);

    h[1].value.value.bytes.len = value + 1;
    msg = delivery_with(h, 2);
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 131072, &pool, &out), 0);
    cr_expect(!header(&out, "big"));
    cr_expect(header(&out, "small"));
    char buf[MESSAGE_DROPPED_HEADERS_MAX + 1], want[64];
    snprintf(want, sizeof want, "big (%zu bytes)", ENTRY(3, value + 1));
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf), want);
    cr_expect_leq(message_header_frame_size(&out), limit);
    expect_own_headers(&out);
    cr_expect(memcmp(msg->body, "{1}", 3) == 0 && msg->body_len == 3, "the body is untouched");
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

Test(message_copy, producer_headers_go_largest_first_and_only_as_many_as_needed)
{
    static char storage[200000];
    memset(storage, 'v', sizeof storage);
    /* frame_max 32768: limit 24576. */
    amqp_table_entry_t h[5];
    set_text(&h[0], "c", (amqp_bytes_t){.len = 9000, .bytes = storage});
    set_text(&h[1], "a", (amqp_bytes_t){.len = 11000, .bytes = storage});
    set_text(&h[2], "tiny", amqp_cstring_bytes("t"));
    set_text(&h[3], "b", (amqp_bytes_t){.len = 10000, .bytes = storage});
    set_text(&h[4], "b2", (amqp_bytes_t){.len = 9999, .bytes = storage});
    broker_message *msg = delivery_with(h, 5);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 32768, &pool, &out), 0);
    /* 40000 bytes of producer headers: a (11007) and b (10007) must go, and then it fits. */
    char buf[MESSAGE_DROPPED_HEADERS_MAX + 1];
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf),
                     "a (11007 bytes), b (10007 bytes)");
    cr_expect_leq(message_header_frame_size(&out), message_frame_limit(32768));
    /* The kept ones in their order, then idemq's, then the record. */
    cr_assert_geq(out.headers.num_entries, 4);
    cr_expect(out.headers.entries[0].key.len == 1 &&
              !memcmp(out.headers.entries[0].key.bytes, "c", 1));
    cr_expect(out.headers.entries[1].key.len == 4 &&
              !memcmp(out.headers.entries[1].key.bytes, "tiny", 4));
    cr_expect(out.headers.entries[2].key.len == 2 &&
              !memcmp(out.headers.entries[2].key.bytes, "b2", 2));
    const amqp_table_entry_t *last = &out.headers.entries[out.headers.num_entries - 1];
    cr_expect(last->key.len == strlen(HEADER_DROPPED_HEADERS));
    expect_own_headers(&out);
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

Test(message_copy, equal_sizes_drop_in_header_order)
{
    static char storage[40000];
    amqp_table_entry_t h[3];
    set_text(&h[0], "x1", (amqp_bytes_t){.len = 10000, .bytes = storage});
    set_text(&h[1], "x2", (amqp_bytes_t){.len = 10000, .bytes = storage});
    set_text(&h[2], "x3", (amqp_bytes_t){.len = 10000, .bytes = storage});
    broker_message *msg = delivery_with(h, 3);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 32768, &pool, &out), 0);
    char buf[MESSAGE_DROPPED_HEADERS_MAX + 1];
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf),
                     "x1 (10008 bytes)");
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

Test(message_copy, the_record_is_bounded_and_counts_what_it_does_not_name)
{
    static char storage[1000];
    enum { COUNT = 400 };
    static amqp_table_entry_t h[COUNT];
    static char keys[COUNT][32];
    for (int i = 0; i < COUNT; i++) {
        snprintf(keys[i], sizeof keys[i], "producer-header-%03d", i);
        set_text(&h[i], keys[i], (amqp_bytes_t){.len = 300, .bytes = storage});
    }
    broker_message *msg = delivery_with(h, COUNT);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    /* 400 x 325 bytes in a limit of 24576: most of them must go. */
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 32768, &pool, &out), 0);
    char buf[MESSAGE_DROPPED_HEADERS_MAX + 64];
    const char *record = text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf);
    cr_assert(record);
    cr_expect_leq(strlen(record), MESSAGE_DROPPED_HEADERS_MAX);
    cr_expect(strncmp(record, "producer-header-000 (325 bytes), producer-header-001", 52) == 0,
              "%s", record);
    int named = 0;
    for (const char *p = record; (p = strstr(p, "(325 bytes)")); p++)
        named++;
    int more = 0;
    const char *tail = strstr(record, " and ");
    cr_assert(tail && sscanf(tail, " and %d more", &more) == 1, "%s", record);
    int kept = 0;
    for (int i = 0; i < COUNT; i++)
        kept += header(&out, keys[i]) != NULL;
    cr_expect_eq(named + more, COUNT - kept, "every dropped header is named or counted");
    cr_expect_leq(message_header_frame_size(&out), message_frame_limit(32768));
    cr_expect_gt(kept, 0, "only as many as needed go");
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

Test(message_copy, a_previous_record_is_carried_and_extended)
{
    static char storage[20000];
    amqp_table_entry_t h[2];
    set_text(&h[0], HEADER_DROPPED_HEADERS, amqp_cstring_bytes("first (100 bytes)"));
    set_text(&h[1], "small", amqp_cstring_bytes("s"));
    broker_message *msg = delivery_with(h, 2);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 131072, &pool, &out), 0);
    char buf[MESSAGE_DROPPED_HEADERS_MAX + 1];
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf), "first (100 bytes)");
    broker_message_free(msg);

    set_text(&h[1], "big", (amqp_bytes_t){.len = 20000, .bytes = storage});
    msg = delivery_with(h, 2);
    cr_assert_eq(message_copy_properties(msg, &copy_defaults, 16384, &pool, &out), 0);
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf),
                     "first (100 bytes), big (20009 bytes)");
    int records = 0;
    for (int i = 0; i < out.headers.num_entries; i++)
        records += out.headers.entries[i].key.len == strlen(HEADER_DROPPED_HEADERS) &&
                   !memcmp(out.headers.entries[i].key.bytes, HEADER_DROPPED_HEADERS,
                           strlen(HEADER_DROPPED_HEADERS));
    cr_expect_eq(records, 1);
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

Test(message_copy, a_copy_too_large_without_producer_headers_is_an_error_of_its_own)
{
    amqp_table_entry_t h[1];
    set_text(&h[0], "p", amqp_cstring_bytes("producer"));
    broker_message *msg = delivery_with(h, 1);
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    /* frame_max 512: limit 256, less than idemq's own headers. */
    int rc = message_copy_properties(msg, &copy_defaults, 512, &pool, &out);
    cr_expect_eq(rc, MESSAGE_E_TOO_LARGE);
    cr_expect_neq(MESSAGE_E_TOO_LARGE, BROKER_E_FAILED);
    cr_expect_neq(MESSAGE_E_TOO_LARGE, BROKER_E_STALE);
    cr_expect_neq(MESSAGE_E_TOO_LARGE, BROKER_E_REFUSED);
    cr_expect_eq(message_copy_properties(msg, &copy_defaults, 0, &pool, &out),
                 MESSAGE_E_TOO_LARGE, "frame_max 0: no connection to publish on");
    /* A small but usable frame_max still gets a copy through. */
    cr_expect_eq(message_copy_properties(msg, &copy_defaults, 4096, &pool, &out), 0);
    empty_amqp_pool(&pool);
    broker_message_free(msg);
}

Test(message_copy, a_replay_is_stripped_and_made_to_fit_too)
{
    static char storage[140000];
    amqp_table_entry_t h[5];
    set_text(&h[0], HEADER_ERROR, amqp_cstring_bytes("old error"));
    set_text(&h[1], "x-death", amqp_cstring_bytes("broker's"));
    set_text(&h[2], HEADER_DROPPED_HEADERS, amqp_cstring_bytes("gone (9 bytes)"));
    set_text(&h[3], "keep", amqp_cstring_bytes("k"));
    set_text(&h[4], "huge", (amqp_bytes_t){.len = 130000, .bytes = storage});
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_USER_ID_FLAG,
                                     .user_id = amqp_cstring_bytes("producer"),
                                     .headers = {.num_entries = 5, .entries = h}};
    amqp_pool_t pool;
    init_amqp_pool(&pool, 4096);
    amqp_basic_properties_t out;
    cr_assert_eq(message_strip_properties(&props, 131072, &pool, &out), 0);
    cr_expect(!(out._flags & AMQP_BASIC_USER_ID_FLAG));
    cr_expect(!header(&out, HEADER_ERROR) && !header(&out, "x-death") && !header(&out, "huge"));
    cr_expect(header(&out, "keep"));
    char buf[MESSAGE_DROPPED_HEADERS_MAX + 1];
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf),
                     "gone (9 bytes), huge (130010 bytes)");
    cr_expect_leq(message_header_frame_size(&out), message_frame_limit(131072));

    h[4].value.value.bytes.len = 10;
    cr_assert_eq(message_strip_properties(&props, 131072, &pool, &out), 0);
    cr_expect_str_eq(text_of(&out, HEADER_DROPPED_HEADERS, buf, sizeof buf), "gone (9 bytes)",
                     "a replay keeps the record of what its message lost");
    cr_expect(header(&out, "huge"));

    amqp_basic_properties_t long_id = {._flags = AMQP_BASIC_MESSAGE_ID_FLAG,
                                       .message_id = {.len = 255, .bytes = storage}};
    cr_expect_eq(message_strip_properties(&long_id, 256, &pool, &out), MESSAGE_E_TOO_LARGE);
    empty_amqp_pool(&pool);
}

/* ------------------------------------------------------------------------ failure identity */

static void id_of(const char *key, const char *body, const char *handler, int64_t retries,
                  int64_t first, char out[MESSAGE_FAILURE_ID_MAX + 1])
{
    message_failure_id(key, body, body ? strlen(body) : 0, NULL, handler, retries, first, out,
                       MESSAGE_FAILURE_ID_MAX + 1);
}

Test(failure_id, the_same_delivery_gets_the_same_id_and_different_failures_differ)
{
    char a[MESSAGE_FAILURE_ID_MAX + 1], b[MESSAGE_FAILURE_ID_MAX + 1];
    id_of("order:1:PAY", "{}", "pay", 0, 0, a);
    cr_expect_eq(strlen(a), MESSAGE_FAILURE_ID_MAX);
    cr_expect_eq(strspn(a, "0123456789abcdef"), MESSAGE_FAILURE_ID_MAX, "%s", a);
    id_of("order:1:PAY", "{}", "pay", 0, 0, b);
    cr_expect_str_eq(a, b, "a redelivery of one delivery gets the same id");
    id_of("order:1:PAY", "{\"other\":1}", "pay", 0, 0, b);
    cr_expect_str_eq(a, b, "with a key, the key names the event");

    struct {
        const char *key, *body, *handler;
        int64_t retries, first;
        const char *why;
    } other[] = {
        {"order:2:PAY", "{}", "pay", 0, 0, "another event"},
        {"order:1:PAY", "{}", "refund", 0, 0, "another handler"},
        {"order:1:PAY", "{}", "pay", 1, 0, "the next retry round"},
        {"order:1:PAY", "{}", "pay", 0, 1700000000000, "another first failure"},
        {NULL, "{}", "pay", 0, 0, "no key: the body"},
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        id_of(other[i].key, other[i].body, other[i].handler, other[i].retries, other[i].first, b);
        cr_expect_str_neq(a, b, "%s must change the id", other[i].why);
    }
}

Test(failure_id, keyless_deliveries_are_told_apart_by_their_body)
{
    char a[MESSAGE_FAILURE_ID_MAX + 1], b[MESSAGE_FAILURE_ID_MAX + 1];
    id_of(NULL, "not json", "pay", 0, 0, a);
    id_of("", "not json", "pay", 0, 0, b);
    cr_expect_str_eq(a, b, "NULL and \"\" both mean no key");
    id_of(NULL, "not json!", "pay", 0, 0, b);
    cr_expect_str_neq(a, b);
    id_of(NULL, NULL, "pay", 0, 0, b);
    cr_expect_str_neq(a, b);
    /* A key equal to a body is still not that body. */
    id_of("not json", NULL, "pay", 0, 0, b);
    cr_expect_str_neq(a, b);
}

Test(failure_id, many_events_and_rounds_never_collide)
{
    enum { EVENTS = 2000, ROUNDS = 5 };
    static char ids[EVENTS * ROUNDS][MESSAGE_FAILURE_ID_MAX + 1];
    int n = 0;
    for (int e = 0; e < EVENTS; e++)
        for (int r = 0; r < ROUNDS; r++) {
            char key[32];
            snprintf(key, sizeof key, "order:%d:PAY", e);
            id_of(key, NULL, "pay", r, r ? 1700000000000 + e : 0, ids[n++]);
        }
    qsort(ids, (size_t)n, sizeof ids[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 1; i < n; i++)
        cr_assert_str_neq(ids[i - 1], ids[i]);
}

Test(failure_id, a_short_buffer_gets_a_terminated_prefix)
{
    char full[MESSAGE_FAILURE_ID_MAX + 1], small[9];
    id_of("k", NULL, "pay", 0, 0, full);
    message_failure_id("k", NULL, 0, NULL, "pay", 0, 0, small, sizeof small);
    cr_expect_eq(strlen(small), 8);
    cr_expect(strncmp(full, small, 8) == 0);
    message_failure_id("k", NULL, 0, NULL, "pay", 0, 0, small, 0); /* writes nothing */
}

/* Two messages a producer sent separately (their own message_id, or headers of their own) are two
 * failures even with one body; what the broker adds on a redelivery (x-delivery-count) is not. */
Test(failure_id, the_producers_properties_tell_separate_messages_apart)
{
    amqp_table_entry_t pad = {.key = amqp_cstring_bytes("pad"),
                              .value = {.kind = AMQP_FIELD_KIND_UTF8,
                                        .value.bytes = amqp_cstring_bytes("aaaa")}};
    amqp_table_entry_t with_count[2] = {
        pad, {.key = amqp_cstring_bytes("x-delivery-count"),
              .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = 3}}};
    amqp_basic_properties_t first = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                     .headers = {.num_entries = 1, .entries = &pad}};
    amqp_basic_properties_t redelivered = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                           .headers = {.num_entries = 2, .entries = with_count}};
    amqp_table_entry_t other_pad = pad;
    other_pad.value.value.bytes = amqp_cstring_bytes("bbbb");
    amqp_basic_properties_t other_headers = {._flags = AMQP_BASIC_HEADERS_FLAG,
                                             .headers = {.num_entries = 1, .entries = &other_pad}};
    amqp_basic_properties_t other_id = first;
    other_id._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    other_id.message_id = amqp_cstring_bytes("m-2");

    char a[MESSAGE_FAILURE_ID_MAX + 1], b[MESSAGE_FAILURE_ID_MAX + 1];
    message_failure_id(NULL, "{}", 2, &first, "pay", 0, 0, a, sizeof a);
    message_failure_id(NULL, "{}", 2, &redelivered, "pay", 0, 0, b, sizeof b);
    cr_expect_str_eq(a, b, "x-delivery-count of a redelivery must not change the id");
    message_failure_id(NULL, "{}", 2, &other_headers, "pay", 0, 0, b, sizeof b);
    cr_expect_str_neq(a, b, "a header of the producer's own tells the messages apart");
    message_failure_id(NULL, "{}", 2, &other_id, "pay", 0, 0, b, sizeof b);
    cr_expect_str_neq(a, b, "a message_id tells the messages apart");
}
