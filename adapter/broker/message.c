/*
 * message — see message.h.
 */
#include "broker/message.h"

#include "broker/connection.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

/* Copies the properties whose flag is set; rabbitmq-c leaves the others uninitialised. */
static int copy_properties(amqp_pool_t *pool, const amqp_basic_properties_t *src,
                           amqp_basic_properties_t *dst)
{
    static const struct {
        amqp_flags_t flag;
        size_t offset;
    } byte_fields[] = {
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
    memset(dst, 0, sizeof *dst);
    dst->_flags = src->_flags;
    for (size_t i = 0; i < sizeof byte_fields / sizeof byte_fields[0]; i++) {
        if (!(src->_flags & byte_fields[i].flag))
            continue;
        const amqp_bytes_t *from =
            (const amqp_bytes_t *)((const char *)src + byte_fields[i].offset);
        amqp_bytes_t *to = (amqp_bytes_t *)((char *)dst + byte_fields[i].offset);
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
    init_amqp_pool(&msg->pool, 4096);
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

static bool header_is_replaced(amqp_bytes_t key)
{
    static const char *const prefixes[] = {"x-death", "x-first-death-", "x-last-death-",
                                           "x-delivery-count", "idemq-"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t n = strlen(prefixes[i]);
        if (key.len >= n && memcmp(key.bytes, prefixes[i], n) == 0)
            return true;
    }
    return false;
}

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

int message_copy_properties(const broker_message *msg, const copy_headers *h, amqp_pool_t *pool,
                            amqp_basic_properties_t *out)
{
    enum { ADDED_HEADERS = 9 };
    *out = msg->properties;
    const amqp_table_t *orig = &msg->properties.headers;
    int orig_count = (msg->properties._flags & AMQP_BASIC_HEADERS_FLAG) ? orig->num_entries : 0;
    amqp_table_entry_t *entries =
        amqp_pool_alloc(pool, sizeof *entries * (size_t)(orig_count + ADDED_HEADERS));
    if (!entries)
        return BROKER_E_FAILED;
    int n = 0;
    for (int i = 0; i < orig_count; i++)
        if (!header_is_replaced(orig->entries[i].key))
            entries[n++] = orig->entries[i];
    set_int(&entries[n++], HEADER_RETRIES, h->retries);
    set_string(&entries[n++], HEADER_ERROR_CLASS, h->error_class, strlen(h->error_class));
    set_string(&entries[n++], HEADER_ERROR, h->error, utf8_prefix_len(h->error, HEADER_ERROR_MAX));
    set_string(&entries[n++], HEADER_HANDLER, h->handler, strlen(h->handler));
    set_string(&entries[n++], HEADER_QUEUE, h->queue, strlen(h->queue));
    set_int(&entries[n++], HEADER_FIRST_FAILED_AT, h->first_failed_at_ms);
    set_int(&entries[n++], HEADER_PUBLISH_SEQ, (int64_t)h->publish_seq);
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
    return 0;
}

int message_strip_properties(const amqp_basic_properties_t *props, amqp_pool_t *pool,
                             amqp_basic_properties_t *out)
{
    *out = *props;
    /* A replay is published by idemq's login; see message_copy_properties. */
    out->_flags &= ~AMQP_BASIC_USER_ID_FLAG;
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG))
        return 0;
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
    return 0;
}
