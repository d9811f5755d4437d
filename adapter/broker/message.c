/*
 * message — see message.h.
 */
#include "broker/message.h"

#include "broker/connection.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int copy_bytes(amqp_pool_t *pool, amqp_bytes_t *dst, amqp_bytes_t src)
{
    if (src.len == 0) {
        *dst = amqp_empty_bytes;
        return 0;
    }
    amqp_pool_alloc_bytes(pool, src.len, dst);
    if (!dst->bytes)
        return -1;
    memcpy(dst->bytes, src.bytes, src.len);
    return 0;
}

/* The short-string properties, by flag: the copy and the size computation walk the same list. */
static const struct {
    amqp_flags_t flag;
    size_t offset;
} string_properties[] = {
    {AMQP_BASIC_CONTENT_TYPE_FLAG, offsetof(amqp_basic_properties_t, content_type)},
    {AMQP_BASIC_CONTENT_ENCODING_FLAG, offsetof(amqp_basic_properties_t, content_encoding)},
    {AMQP_BASIC_CORRELATION_ID_FLAG, offsetof(amqp_basic_properties_t, correlation_id)},
    {AMQP_BASIC_REPLY_TO_FLAG, offsetof(amqp_basic_properties_t, reply_to)},
    {AMQP_BASIC_EXPIRATION_FLAG, offsetof(amqp_basic_properties_t, expiration)},
    {AMQP_BASIC_MESSAGE_ID_FLAG, offsetof(amqp_basic_properties_t, message_id)},
    {AMQP_BASIC_TYPE_FLAG, offsetof(amqp_basic_properties_t, type)},
    {AMQP_BASIC_USER_ID_FLAG, offsetof(amqp_basic_properties_t, user_id)},
    {AMQP_BASIC_APP_ID_FLAG, offsetof(amqp_basic_properties_t, app_id)},
    {AMQP_BASIC_CLUSTER_ID_FLAG, offsetof(amqp_basic_properties_t, cluster_id)},
};

/* Copies the properties whose flag is set; rabbitmq-c leaves the others uninitialised. */
static int copy_properties(amqp_pool_t *pool, const amqp_basic_properties_t *src,
                           amqp_basic_properties_t *dst)
{
    memset(dst, 0, sizeof *dst);
    dst->_flags = src->_flags;
    for (size_t i = 0; i < sizeof string_properties / sizeof string_properties[0]; i++) {
        if (!(src->_flags & string_properties[i].flag))
            continue;
        const amqp_bytes_t *from =
            (const amqp_bytes_t *)((const char *)src + string_properties[i].offset);
        amqp_bytes_t *to = (amqp_bytes_t *)((char *)dst + string_properties[i].offset);
        if (copy_bytes(pool, to, *from) != 0)
            return -1;
    }
    if (src->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
        dst->delivery_mode = src->delivery_mode;
    if (src->_flags & AMQP_BASIC_PRIORITY_FLAG)
        dst->priority = src->priority;
    if (src->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
        dst->timestamp = src->timestamp;
    if ((src->_flags & AMQP_BASIC_HEADERS_FLAG) &&
        amqp_table_clone(&src->headers, &dst->headers, pool) != AMQP_STATUS_OK)
        return -1;
    return 0;
}

broker_message *broker_message_new(const amqp_basic_properties_t *src, uint64_t announced_len,
                                   size_t keep_max)
{
    broker_message *msg = calloc(1, sizeof *msg);
    if (!msg)
        return NULL;
    init_amqp_pool(&msg->pool, 512);
    size_t body_len = announced_len > keep_max ? keep_max : (size_t)announced_len;
    msg->body_len = body_len;
    msg->announced_len = announced_len;
    msg->body = malloc(body_len ? body_len : 1);
    if (!msg->body || copy_properties(&msg->pool, src, &msg->properties) != 0) {
        broker_message_free(msg);
        return NULL;
    }
    return msg;
}

bool broker_message_add_body(broker_message *msg, amqp_bytes_t fragment, bool *overrun)
{
    *overrun = fragment.len > msg->announced_len - msg->announced_received;
    if (*overrun)
        return false;
    size_t room = msg->body_len - msg->body_received;
    size_t kept = fragment.len < room ? fragment.len : room;
    memcpy(msg->body + msg->body_received, fragment.bytes, kept);
    msg->body_received += kept;
    msg->announced_received += fragment.len;
    return msg->announced_received == msg->announced_len;
}

bool broker_message_truncated(const broker_message *msg)
{
    return msg->announced_len > msg->body_len;
}

int message_properties_clone(const amqp_basic_properties_t *src, amqp_pool_t *pool,
                             amqp_basic_properties_t *out)
{
    amqp_basic_properties_t copy;
    if (copy_properties(pool, src, &copy) != 0)
        return BROKER_E_FAILED;
    *out = copy;
    return 0;
}

void broker_message_free(broker_message *msg)
{
    if (!msg)
        return;
    empty_amqp_pool(&msg->pool);
    free(msg->body);
    free(msg);
}

static const amqp_field_value_t *find_header(const amqp_basic_properties_t *props,
                                             const char *name)
{
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    size_t name_len = strlen(name);
    for (int i = 0; i < props->headers.num_entries; i++) {
        const amqp_table_entry_t *e = &props->headers.entries[i];
        if (e->key.len == name_len && memcmp(e->key.bytes, name, name_len) == 0)
            return &e->value;
    }
    return NULL;
}

bool message_header_int(const amqp_basic_properties_t *props, const char *name, int64_t *out)
{
    const amqp_field_value_t *v = find_header(props, name);
    if (!v)
        return false;
    switch (v->kind) {
    case AMQP_FIELD_KIND_I8: *out = v->value.i8; return true;
    case AMQP_FIELD_KIND_U8: *out = v->value.u8; return true;
    case AMQP_FIELD_KIND_I16: *out = v->value.i16; return true;
    case AMQP_FIELD_KIND_U16: *out = v->value.u16; return true;
    case AMQP_FIELD_KIND_I32: *out = v->value.i32; return true;
    case AMQP_FIELD_KIND_U32: *out = v->value.u32; return true;
    case AMQP_FIELD_KIND_I64: *out = v->value.i64; return true;
    case AMQP_FIELD_KIND_U64:
        *out = v->value.u64 > INT64_MAX ? INT64_MAX : (int64_t)v->value.u64;
        return true;
    case AMQP_FIELD_KIND_TIMESTAMP:
        *out = v->value.u64 > INT64_MAX ? INT64_MAX : (int64_t)v->value.u64;
        return true;
    default:
        return false;
    }
}

bool message_header_bytes(const amqp_basic_properties_t *props, const char *name,
                          amqp_bytes_t *out)
{
    const amqp_field_value_t *v = find_header(props, name);
    if (!v || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES))
        return false;
    *out = v->value.bytes;
    return true;
}

static void copy_trace_id(char *dst, amqp_bytes_t src)
{
    size_t n = src.len > MESSAGE_TRACE_ID_MAX ? MESSAGE_TRACE_ID_MAX : src.len;
    memcpy(dst, src.bytes, n);
    dst[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (dst[i] == '\0') /* a NUL inside would hide the rest; show it as a space */
            dst[i] = ' ';
}

void message_trace_read(const amqp_basic_properties_t *props, message_trace *out)
{
    memset(out, 0, sizeof *out);
    if (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        copy_trace_id(out->message_id, props->message_id);
    if (props->_flags & AMQP_BASIC_CORRELATION_ID_FLAG)
        copy_trace_id(out->correlation_id, props->correlation_id);
    amqp_bytes_t traceparent;
    if (message_header_bytes(props, HEADER_TRACEPARENT, &traceparent))
        copy_trace_id(out->traceparent, traceparent);
}

bool message_header_counts_deliveries(amqp_bytes_t key)
{
    static const char *const names[] = {"x-delivery-count", "x-acquired-count"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (key.len == strlen(names[i]) && memcmp(key.bytes, names[i], key.len) == 0)
            return true;
    return false;
}

/* Headers a copy or a replay does not take over from the message it is made from. */
static bool header_is_replaced(amqp_bytes_t key)
{
    static const char *const prefixes[] = {"x-death", "x-first-death-", "x-last-death-", "idemq-"};
    if (message_header_counts_deliveries(key))
        return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t n = strlen(prefixes[i]);
        if (key.len >= n && memcmp(key.bytes, prefixes[i], n) == 0)
            return true;
    }
    return false;
}

/* ------------------------------------------------------------------------- encoded sizes
 * The arithmetic of rabbitmq-c's amqp_encode_properties / amqp_encode_table (0.11), so that a
 * copy can be measured without a scratch buffer of unknown size and each header's share is known;
 * tests/unit/test_message.c compares it with rabbitmq-c's own encoder. */

#define SIZE_UNENCODABLE SIZE_MAX
/* Frame header (type 1, channel 2, size 4) + class 2 + weight 2 + body size 8 + frame end 1. */
#define HEADER_FRAME_OVERHEAD 20
/* Header key (short string), field kind, long-string length: what a string header costs
 * beyond its key and value bytes. */
#define STRING_HEADER_OVERHEAD(key_len) (1 + (key_len) + 1 + 4)

static size_t add_size(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_UNENCODABLE : a + b;
}

static size_t table_size(const amqp_table_t *t);

static size_t field_size(const amqp_field_value_t *v)
{
    size_t payload;
    switch (v->kind) {
    case AMQP_FIELD_KIND_BOOLEAN:
    case AMQP_FIELD_KIND_I8:
    case AMQP_FIELD_KIND_U8: payload = 1; break;
    case AMQP_FIELD_KIND_I16:
    case AMQP_FIELD_KIND_U16: payload = 2; break;
    case AMQP_FIELD_KIND_I32:
    case AMQP_FIELD_KIND_U32:
    case AMQP_FIELD_KIND_F32: payload = 4; break;
    case AMQP_FIELD_KIND_I64:
    case AMQP_FIELD_KIND_U64:
    case AMQP_FIELD_KIND_F64:
    case AMQP_FIELD_KIND_TIMESTAMP: payload = 8; break;
    case AMQP_FIELD_KIND_DECIMAL: payload = 5; break;
    case AMQP_FIELD_KIND_VOID: payload = 0; break;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
        if (v->value.bytes.len > UINT32_MAX)
            return SIZE_UNENCODABLE;
        payload = add_size(4, v->value.bytes.len);
        break;
    case AMQP_FIELD_KIND_ARRAY:
        payload = 4;
        for (int i = 0; i < v->value.array.num_entries; i++)
            payload = add_size(payload, field_size(&v->value.array.entries[i]));
        break;
    case AMQP_FIELD_KIND_TABLE: payload = table_size(&v->value.table); break;
    default: return SIZE_UNENCODABLE;
    }
    return add_size(1, payload);
}

static size_t entry_size(const amqp_table_entry_t *e)
{
    if (e->key.len > UINT8_MAX) /* rabbitmq-c would write a wrong length: never send it */
        return SIZE_UNENCODABLE;
    return add_size(1 + e->key.len, field_size(&e->value));
}

static size_t table_size(const amqp_table_t *t)
{
    size_t size = 4;
    for (int i = 0; i < t->num_entries; i++)
        size = add_size(size, entry_size(&t->entries[i]));
    return size > (size_t)UINT32_MAX + 4 ? SIZE_UNENCODABLE : size;
}

/* The frame without its headers table (as if the headers flag were clear). */
static size_t frame_size_without_headers(const amqp_basic_properties_t *p)
{
    size_t size = HEADER_FRAME_OVERHEAD;
    /* Property flags: 16-bit words of 15 flags each, the lowest bit saying another follows. */
    amqp_flags_t flags = p->_flags;
    do {
        size += 2;
        flags >>= 16;
    } while (flags != 0);
    for (size_t i = 0; i < sizeof string_properties / sizeof string_properties[0]; i++) {
        if (!(p->_flags & string_properties[i].flag))
            continue;
        const amqp_bytes_t *b =
            (const amqp_bytes_t *)((const char *)p + string_properties[i].offset);
        if (b->len > UINT8_MAX)
            return SIZE_UNENCODABLE;
        size += 1 + b->len;
    }
    if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
        size += 1;
    if (p->_flags & AMQP_BASIC_PRIORITY_FLAG)
        size += 1;
    if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
        size += 8;
    return size;
}

size_t message_header_frame_size(const amqp_basic_properties_t *props)
{
    size_t size = frame_size_without_headers(props);
    if (props->_flags & AMQP_BASIC_HEADERS_FLAG)
        size = add_size(size, table_size(&props->headers));
    return size;
}

size_t message_frame_limit(size_t frame_max)
{
    size_t headroom = MESSAGE_BROKER_HEADROOM < frame_max / 2 ? MESSAGE_BROKER_HEADROOM
                                                              : frame_max - frame_max / 2;
    return frame_max - headroom;
}

/* ----------------------------------------------------------------------- fitting a frame */

/* The idemq-dropped-headers text being built: the previous record, then the newly dropped
 * names while they fit MESSAGE_DROPPED_HEADERS_MAX, then how many more did not. */
typedef struct dropped_record {
    char text[MESSAGE_DROPPED_HEADERS_MAX + 1];
    size_t len;
    size_t more; /* dropped, but not named for lack of room */
} dropped_record;

/* Room kept at the end of the record for " and 18446744073709551615 more". */
#define DROPPED_MORE_RESERVE 32

static size_t dropped_record_len(const dropped_record *r)
{
    if (!r->more)
        return r->len;
    char suffix[DROPPED_MORE_RESERVE];
    return r->len + (size_t)snprintf(suffix, sizeof suffix, " and %zu more", r->more);
}

static void dropped_record_init(dropped_record *r, amqp_bytes_t previous)
{
    r->more = 0;
    r->len = previous.len < MESSAGE_DROPPED_HEADERS_MAX - DROPPED_MORE_RESERVE
                 ? previous.len
                 : MESSAGE_DROPPED_HEADERS_MAX - DROPPED_MORE_RESERVE;
    if (r->len)
        memcpy(r->text, previous.bytes, r->len);
    r->text[r->len] = '\0';
}

/* Appends "name (N bytes)"; the name's unprintable bytes as '?', so the record stays text. */
static void dropped_record_add(dropped_record *r, amqp_bytes_t key, size_t size)
{
    char item[UINT8_MAX + 64];
    size_t n = 0;
    if (r->len) {
        item[n++] = ',';
        item[n++] = ' ';
    }
    for (size_t i = 0; i < key.len && i < UINT8_MAX; i++) {
        unsigned char c = ((const unsigned char *)key.bytes)[i];
        item[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (size == SIZE_UNENCODABLE)
        n += (size_t)snprintf(item + n, sizeof item - n, " (unencodable)");
    else
        n += (size_t)snprintf(item + n, sizeof item - n, " (%zu bytes)", size);
    if (r->more || r->len + n > MESSAGE_DROPPED_HEADERS_MAX - DROPPED_MORE_RESERVE) {
        r->more++;
        return;
    }
    memcpy(r->text + r->len, item, n);
    r->len += n;
    r->text[r->len] = '\0';
}

typedef struct ranked {
    int index;
    size_t size;
} ranked;

static int by_size_descending(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return (x->index > y->index) - (x->index < y->index); /* the same order every time */
}

/*
 * out->headers.entries holds `producer` producer headers, then `own` of idemq's, with room for
 * one more. Leaves out producer headers, largest first, until the frame fits limit; writes the
 * record of what was left out (previous, extended) as the last header when there is one.
 */
static int fit_frame(amqp_basic_properties_t *out, int producer, int own, amqp_bytes_t previous,
                     size_t limit, amqp_pool_t *pool)
{
    amqp_table_entry_t *entries = out->headers.entries;
    size_t record_key_len = strlen(HEADER_DROPPED_HEADERS);
    size_t fixed = add_size(frame_size_without_headers(out), 4);
    for (int i = producer; i < producer + own; i++)
        fixed = add_size(fixed, entry_size(&entries[i]));
    size_t producer_total = 0;
    for (int i = 0; i < producer; i++)
        producer_total = add_size(producer_total, entry_size(&entries[i]));
    size_t previous_cost = previous.len ? STRING_HEADER_OVERHEAD(record_key_len) + previous.len : 0;

    bool *dropped = NULL;
    dropped_record *record = NULL;
    ranked *ranks = NULL;
    int rc = 0;
    if (add_size(add_size(fixed, producer_total), previous_cost) > limit) {
        dropped = calloc((size_t)producer + 1, sizeof *dropped);
        record = malloc(sizeof *record);
        ranks = malloc(sizeof *ranks * ((size_t)producer + 1));
        if (!dropped || !record || !ranks) {
            rc = BROKER_E_FAILED;
            goto out;
        }
        for (int i = 0; i < producer; i++)
            ranks[i] = (ranked){.index = i, .size = entry_size(&entries[i])};
        qsort(ranks, (size_t)producer, sizeof *ranks, by_size_descending);
        dropped_record_init(record, previous);
        bool fits = false;
        for (int r = 0; r < producer && !fits; r++) {
            dropped[ranks[r].index] = true;
            dropped_record_add(record, entries[ranks[r].index].key, ranks[r].size);
            if (producer_total != SIZE_UNENCODABLE) {
                producer_total -= ranks[r].size;
            } else if (r + 1 == producer || ranks[r + 1].size != SIZE_UNENCODABLE) {
                /* The unencodable ones (sorted first) saturated the sum; now they are gone. */
                producer_total = 0;
                for (int i = 0; i < producer; i++)
                    if (!dropped[i])
                        producer_total = add_size(producer_total, entry_size(&entries[i]));
            }
            size_t total = add_size(add_size(fixed, producer_total),
                                    STRING_HEADER_OVERHEAD(record_key_len) +
                                        dropped_record_len(record));
            fits = total <= limit;
        }
        if (!fits) {
            rc = MESSAGE_E_TOO_LARGE;
            goto out;
        }
    }

    /* Keep the kept producer headers in their order, then idemq's, then the record. */
    int n = 0;
    for (int i = 0; i < producer; i++)
        if (!dropped || !dropped[i])
            entries[n++] = entries[i];
    memmove(&entries[n], &entries[producer], sizeof *entries * (size_t)own);
    n += own;
    if (dropped) {
        size_t len = dropped_record_len(record);
        char *text = amqp_pool_alloc(pool, len + 1);
        if (!text) {
            rc = BROKER_E_FAILED;
            goto out;
        }
        memcpy(text, record->text, record->len);
        if (record->more)
            snprintf(text + record->len, len + 1 - record->len, " and %zu more", record->more);
        entries[n].key = amqp_cstring_bytes(HEADER_DROPPED_HEADERS);
        entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
        entries[n].value.value.bytes = (amqp_bytes_t){.len = len, .bytes = text};
        n++;
    } else if (previous.len) {
        entries[n].key = amqp_cstring_bytes(HEADER_DROPPED_HEADERS);
        entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
        entries[n].value.value.bytes = previous;
        n++;
    }
    out->headers.num_entries = n;
    if (message_header_frame_size(out) > limit)
        rc = MESSAGE_E_TOO_LARGE; /* cannot happen: the sums above are the same arithmetic */
out:
    free(dropped);
    free(record);
    free(ranks);
    return rc;
}

/* ------------------------------------------------------------------------------- copies */

/* Length of at most max bytes of text that does not split a UTF-8 sequence. */
static size_t utf8_prefix_len(const char *text, size_t max)
{
    size_t len = strlen(text);
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)text[max] & 0xC0) == 0x80)
        max--;
    return max;
}

static void set_string(amqp_table_entry_t *e, const char *key, const char *value, size_t len)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_UTF8;
    e->value.value.bytes.bytes = (void *)value;
    e->value.value.bytes.len = len;
}

static void set_int(amqp_table_entry_t *e, const char *key, int64_t value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_I64;
    e->value.value.i64 = value;
}

/* The idemq-dropped-headers record of props; empty when it has none. */
static amqp_bytes_t previous_record(const amqp_basic_properties_t *props)
{
    amqp_bytes_t record;
    if (!message_header_bytes(props, HEADER_DROPPED_HEADERS, &record))
        return amqp_empty_bytes;
    return record;
}

int message_copy_properties(const broker_message *msg, const copy_headers *h, size_t frame_max,
                            amqp_pool_t *pool, amqp_basic_properties_t *out)
{
    enum { OWN_HEADERS_MAX = 10, RECORD = 1 };
    *out = msg->properties;
    const amqp_table_t *orig = &msg->properties.headers;
    int orig_count = (msg->properties._flags & AMQP_BASIC_HEADERS_FLAG) ? orig->num_entries : 0;
    amqp_table_entry_t *entries =
        amqp_pool_alloc(pool, sizeof *entries * (size_t)(orig_count + OWN_HEADERS_MAX + RECORD));
    if (!entries)
        return BROKER_E_FAILED;
    int n = 0;
    for (int i = 0; i < orig_count; i++)
        if (!header_is_replaced(orig->entries[i].key))
            entries[n++] = orig->entries[i];
    int producer = n;
    set_int(&entries[n++], HEADER_RETRIES, h->retries);
    set_string(&entries[n++], HEADER_ERROR_CLASS, h->error_class, strlen(h->error_class));
    set_string(&entries[n++], HEADER_ERROR, h->error, utf8_prefix_len(h->error, HEADER_ERROR_MAX));
    set_string(&entries[n++], HEADER_HANDLER, h->handler, strlen(h->handler));
    set_string(&entries[n++], HEADER_QUEUE, h->queue, strlen(h->queue));
    set_int(&entries[n++], HEADER_FIRST_FAILED_AT, h->first_failed_at_ms);
    set_int(&entries[n++], HEADER_PUBLISH_SEQ, (int64_t)h->publish_seq);
    if (h->failure_id)
        set_string(&entries[n++], HEADER_FAILURE_ID, h->failure_id,
                   utf8_prefix_len(h->failure_id, MESSAGE_FAILURE_ID_MAX));
    if (h->body_truncated_from)
        set_int(&entries[n++], HEADER_BODY_TRUNCATED,
                h->body_truncated_from > INT64_MAX ? INT64_MAX : (int64_t)h->body_truncated_from);
    if (msg->properties._flags & AMQP_BASIC_USER_ID_FLAG) {
        entries[n].key = amqp_cstring_bytes(HEADER_ORIGINAL_USER_ID);
        entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
        entries[n].value.value.bytes = msg->properties.user_id;
        n++;
    }
    out->headers.entries = entries;
    out->headers.num_entries = n;
    out->_flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    /* RabbitMQ checks user_id against the publishing login: the producer's value on idemq's copy
     * would close the channel (406) and loop the message forever. It travels as a header. */
    out->_flags &= ~AMQP_BASIC_USER_ID_FLAG;
    out->delivery_mode = AMQP_DELIVERY_PERSISTENT;
    if (h->expiration) {
        out->expiration = amqp_cstring_bytes(h->expiration);
        out->_flags |= AMQP_BASIC_EXPIRATION_FLAG;
    } else {
        out->expiration = amqp_empty_bytes;
        out->_flags &= ~AMQP_BASIC_EXPIRATION_FLAG;
    }
    return fit_frame(out, producer, n - producer, previous_record(&msg->properties),
                     message_frame_limit(frame_max), pool);
}

int message_strip_properties(const amqp_basic_properties_t *props, size_t frame_max,
                             amqp_pool_t *pool, amqp_basic_properties_t *out)
{
    *out = *props;
    /* A replay is published by idemq's login; see message_copy_properties. */
    out->_flags &= ~AMQP_BASIC_USER_ID_FLAG;
    size_t limit = message_frame_limit(frame_max);
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG))
        return message_header_frame_size(out) <= limit ? 0 : MESSAGE_E_TOO_LARGE;
    int count = props->headers.num_entries;
    amqp_table_entry_t *entries = amqp_pool_alloc(pool, sizeof *entries * (size_t)(count + 1));
    if (!entries)
        return BROKER_E_FAILED;
    int n = 0;
    for (int i = 0; i < count; i++)
        if (!header_is_replaced(props->headers.entries[i].key))
            entries[n++] = props->headers.entries[i];
    out->headers.entries = entries;
    out->headers.num_entries = n;
    return fit_frame(out, n, 0, previous_record(props), limit, pool);
}

/* ------------------------------------------------------------------------ failure identity */

/* Two FNV-1a lanes with different offset bases, each finished with splitmix64's mixer: 128 bits,
 * so that two different failures in one DLQ never look like copies of one (dlq replay removes
 * such copies). Not cryptographic: nobody gains by forging a collision with their own message. */
typedef struct failure_hash {
    uint64_t a, b;
} failure_hash;

static void hash_bytes(failure_hash *h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h->a = (h->a ^ p[i]) * 0x100000001b3ULL;
        h->b = (h->b ^ p[i]) * 0x100000001b3ULL;
    }
}

static void hash_u64(failure_hash *h, uint64_t v)
{
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(v >> (8 * i));
    hash_bytes(h, le, sizeof le);
}

/* A field as tag, length, bytes: no two different field lists hash the same stream. */
static void hash_field(failure_hash *h, char tag, const void *data, size_t len)
{
    hash_bytes(h, &tag, 1);
    hash_u64(h, len);
    hash_bytes(h, data, len);
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static bool key_has_prefix(amqp_bytes_t key, const char *prefix)
{
    size_t n = strlen(prefix);
    return key.len >= n && strncasecmp(key.bytes, prefix, n) == 0;
}

/* What the producer set outside the body, as the broker hands it out again unchanged on a
 * redelivery: message_id, correlation_id, timestamp, and the headers but the broker's (x-*) and
 * idemq's own (already inputs, or derived from them). So two messages a producer sent separately,
 * with the same body but their own ids or headers, are two failures, not one. */
static void hash_producer_properties(failure_hash *h, const amqp_basic_properties_t *p)
{
    if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        hash_field(h, 'm', p->message_id.bytes ? p->message_id.bytes : "", p->message_id.len);
    if (p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG)
        hash_field(h, 'c', p->correlation_id.bytes ? p->correlation_id.bytes : "",
                   p->correlation_id.len);
    if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
        hash_u64(h, p->timestamp);
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return;
    for (int i = 0; i < p->headers.num_entries; i++) {
        const amqp_table_entry_t *e = &p->headers.entries[i];
        if (key_has_prefix(e->key, "x-") || key_has_prefix(e->key, "idemq-"))
            continue;
        hash_field(h, 'n', e->key.bytes ? e->key.bytes : "", e->key.len);
        const amqp_field_value_t *v = &e->value;
        hash_u64(h, v->kind);
        if (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES)
            hash_field(h, 's', v->value.bytes.bytes ? v->value.bytes.bytes : "",
                       v->value.bytes.len);
        else if (v->kind == AMQP_FIELD_KIND_I64 || v->kind == AMQP_FIELD_KIND_U64 ||
                 v->kind == AMQP_FIELD_KIND_TIMESTAMP)
            hash_u64(h, v->value.u64);
        else if (v->kind == AMQP_FIELD_KIND_I32 || v->kind == AMQP_FIELD_KIND_U32)
            hash_u64(h, v->value.u32);
    }
}

void message_failure_id(const char *biz_key, const void *body, size_t body_len,
                        const amqp_basic_properties_t *props, const char *handler,
                        int64_t delivery_retries, int64_t delivery_first_failed_at_ms, char *out,
                        size_t out_len)
{
    failure_hash h = {.a = 0xcbf29ce484222325ULL, .b = 0x84222325cbf29ce4ULL};
    static const char version[] = "idemq-failure-id/1";
    hash_field(&h, 'v', version, sizeof version - 1);
    hash_field(&h, 'h', handler, strlen(handler));
    if (biz_key && biz_key[0])
        hash_field(&h, 'k', biz_key, strlen(biz_key));
    else
        hash_field(&h, 'b', body_len ? body : "", body_len);
    if (props)
        hash_producer_properties(&h, props);
    hash_u64(&h, (uint64_t)delivery_retries);
    hash_u64(&h, (uint64_t)delivery_first_failed_at_ms);
    char id[MESSAGE_FAILURE_ID_MAX + 1];
    snprintf(id, sizeof id, "%016llx%016llx", (unsigned long long)mix64(h.a),
             (unsigned long long)mix64(h.b ^ 0x9e3779b97f4a7c15ULL));
    if (out_len > 0)
        snprintf(out, out_len, "%s", id);
}
