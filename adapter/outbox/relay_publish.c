/*
 * relay_publish — see relay_publish.h.
 */
#include "outbox/relay_publish.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "config/url.h"
#include "ops/log.h"
#include "outbox/relay.h"
#include "util/monotonic.h"
#include "util/trace_context.h"

/* Exchanges remembered per connection; beyond this each is checked every round. */
#define KNOWN_MAX 1024
#define TICK_MS 250

/* What a confirm callback needs. */
typedef struct publish_ref {
    relay_broker *b;
    relay_row *row;
} publish_ref;

static int end_round(relay_broker *b, int rc);

/* snprintf for diagnostics that may be cut to fit (a row's error, err). */
__attribute__((format(printf, 3, 4))) static void text(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

static void unmatched_return(void *ctx, const broker_return *ret)
{
    (void)ctx;
    log_warn(LOG_NO_CONTEXT,
             "outbox relay: the broker returned a message that is not one of "
             "this round's (%u %s); ignored",
             ret->reply_code, ret->reply_text);
}

/* The confirms' settings, kept across a lost channel (broker_confirms_fail_all). */
static void confirms_init(relay_broker *b)
{
    broker_confirms_init(&b->confirms);
    broker_confirms_set_return_key(&b->confirms, OUTBOX_HEADER_OUTBOX_ID);
    broker_confirms_on_unmatched_return(&b->confirms, unmatched_return, b);
}

void relay_broker_init(relay_broker *b, const config *cfg)
{
    *b = (relay_broker){.cfg = cfg};
    rng_init(&b->random, (uint64_t)(uintptr_t)b);
    broker_nodes_init(&b->nodes, cfg->amqp_urls, cfg->amqp_url_count, &b->random);
    confirms_init(b);
}

static void forget_known(relay_broker *b)
{
    for (size_t i = 0; i < b->known_count; i++)
        free(b->known[i]);
    b->known_count = 0;
}

static bool is_known(const relay_broker *b, const relay_bytes *exchange)
{
    for (size_t i = 0; i < b->known_count; i++)
        if (strcmp(b->known[i], exchange->data) == 0)
            return true;
    return false;
}

static void remember(relay_broker *b, const relay_bytes *exchange)
{
    if (b->known_count == b->known_cap) {
        if (b->known_cap >= KNOWN_MAX)
            return;
        size_t cap = b->known_cap ? b->known_cap * 2 : 8;
        char **grown = realloc(b->known, cap * sizeof *grown);
        if (!grown)
            return; /* checked again next round: only slower */
        b->known = grown;
        b->known_cap = cap;
    }
    char *copy = strdup(exchange->data);
    if (copy)
        b->known[b->known_count++] = copy;
}

static void forget(relay_broker *b, const char *exchange)
{
    for (size_t i = 0; i < b->known_count; i++) {
        if (strcmp(b->known[i], exchange) == 0) {
            free(b->known[i]);
            b->known[i] = b->known[--b->known_count];
            return;
        }
    }
}

/* The connection is gone (or given up): the confirms still owed fail with the rows UNKNOWN. */
static void drop(relay_broker *b)
{
    broker_confirms_fail_all(&b->confirms);
    forget_known(b);
    if (b->conn) {
        if (b->socket_closing)
            b->socket_closing(b->socket_ctx);
        amqp_destroy_connection(b->conn);
        b->conn = NULL;
    }
}

void relay_broker_close(relay_broker *b)
{
    if (!b->conn)
        return;
    if (b->socket_closing)
        b->socket_closing(b->socket_ctx);
    amqp_connection_state_t conn = b->conn;
    b->conn = NULL;
    drop(b);
    broker_close(conn);
}

void relay_broker_fini(relay_broker *b)
{
    relay_broker_close(b);
    drop(b);
    end_round(b, 0);
    free(b->known);
    b->known = NULL;
    b->known_cap = 0;
}

int relay_broker_socket(const relay_broker *b)
{
    return b->conn ? amqp_get_sockfd(b->conn) : -1;
}

int relay_broker_connect(relay_broker *b, size_t *node, char *err, size_t err_len)
{
    char one[1024], shown[512];
    int rc = BROKER_E_FAILED;
    size_t used = 0;
    err[0] = '\0';
    drop(b);
    broker_nodes_new_round(&b->nodes);
    for (const char *url; (url = broker_nodes_next(&b->nodes)) != NULL;) {
        broker_open_options opts = {
            .url = url,
            .heartbeat_ms = b->cfg->heartbeat_ms,
            .confirms = 1,
            .tls = &b->cfg->amqp_tls,
            .password = b->cfg->amqp_password,
        };
        one[0] = '\0';
        rc = broker_open(&opts, &b->conn, one, sizeof one);
        if (rc == 0) {
            if (node)
                *node = broker_nodes_last(&b->nodes);
            confirms_init(b);
            return 0;
        }
        b->conn = NULL;
        if (b->cfg->amqp_url_count > 1) {
            config_redact_url(url, shown, sizeof shown);
            int n = snprintf(err + used, err_len - used, "%s%s: %s", used ? "; " : "", shown, one);
            if (n > 0)
                used = (size_t)n + used < err_len ? used + (size_t)n : err_len - 1;
        } else {
            text(err, err_len, "%s", one);
        }
    }
    return rc;
}

static void on_confirm(void *arg, broker_publish_outcome answer, const broker_return *ret)
{
    publish_ref *ref = arg;
    relay_row *row = ref->row;
    if (answer == BROKER_PUBLISH_UNKNOWN || row->outcome != RELAY_ROW_UNKNOWN)
        return; /* no answer: published again next round (or already decided: a 404) */
    if (answer == BROKER_PUBLISH_CONFIRMED) {
        row->outcome = RELAY_ROW_PUBLISHED;
    } else if (answer == BROKER_PUBLISH_RETURNED) {
        row->returned = true;
        row->outcome = RELAY_ROW_UNROUTABLE;
        if (ret)
            text(row->error, sizeof row->error,
                 "unroutable: %u %s (exchange '%s', routing key '%s')", ret->reply_code,
                 ret->reply_text, ret->exchange, ret->routing_key);
        else /* out of memory keeping the return's text */
            text(row->error, sizeof row->error, "unroutable (exchange '%s', routing key '%s')",
                 row->exchange.data, row->routing_key.data);
    } else {
        row->outcome = RELAY_ROW_NACKED;
        text(row->error, sizeof row->error,
             "nacked by the broker (exchange '%s', routing "
             "key '%s')",
             row->exchange.data, row->routing_key.data);
    }
}

/* "404 NOT_FOUND - no exchange 'x' in vhost '/'": the exchange's name into out; false when the
 * text does not name one. */
static bool missing_exchange(const amqp_channel_close_t *m, char *out, size_t out_len)
{
    static const char start[] = "no exchange '", end[] = "' in vhost '";
    if (m->reply_code != AMQP_NOT_FOUND)
        return false;
    char reply[512];
    snprintf(reply, sizeof reply, "%.*s", (int)m->reply_text.len,
             (const char *)m->reply_text.bytes);
    char *a = strstr(reply, start);
    if (!a)
        return false;
    a += sizeof start - 1;
    char *z = NULL;
    for (char *p = strstr(a, end); p; p = strstr(p + 1, end))
        z = p; /* the last one: an exchange name may hold the pattern itself */
    if (!z)
        return false;
    snprintf(out, out_len, "%.*s", (int)(z - a), a);
    return true;
}

/* After a channel.close: close-ok, channel.open, confirm.select; the confirms owed on the old
 * channel fail with their rows UNKNOWN, and numbering starts again at 1. */
static int reopen_channel(relay_broker *b, char *err, size_t err_len)
{
    b->channel_reopened = true;
    if (broker_confirms_reopen_channel(&b->confirms, b->conn, err, err_len) != 0) {
        drop(b);
        return BROKER_E_FAILED;
    }
    return 0;
}

/* The broker closed the channel while rows were in flight. A 404 naming an exchange marks the
 * first unconfirmed row that publishes there (the publish that caused it; the broker drops every
 * later one on the channel). Returns 0 (channel reopened), or BROKER_E_FAILED (dropped). */
static int channel_closed(relay_broker *b, const amqp_channel_close_t *m, char *err, size_t err_len)
{
    char exchange[256];
    if (!missing_exchange(m, exchange, sizeof exchange)) {
        text(err, err_len, "channel closed by broker: %u %.*s", m->reply_code,
             (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        drop(b);
        return BROKER_E_FAILED;
    }
    log_warn(LOG_NO_CONTEXT,
             "outbox relay: the broker closed the channel (%u %.*s); reopening "
             "it, the rows after the one that caused it go out next round",
             m->reply_code, (int)m->reply_text.len, (const char *)m->reply_text.bytes);
    forget(b, exchange);
    for (size_t i = 0; i < b->row_count; i++) {
        relay_row *row = &b->rows[i];
        if (row->seq && row->outcome == RELAY_ROW_UNKNOWN &&
            strcmp(row->exchange.data, exchange) == 0) {
            row->outcome = RELAY_ROW_UNROUTABLE;
            text(row->error, sizeof row->error, "exchange not found: %u %.*s", m->reply_code,
                 (int)m->reply_text.len, (const char *)m->reply_text.bytes);
            break;
        }
    }
    return reopen_channel(b, err, err_len);
}

/* Returns 0, or BROKER_E_FAILED (the connection was dropped, err says why). */
static int handle_frame(relay_broker *b, const amqp_frame_t *frame, char *err, size_t err_len)
{
    int taken = broker_confirms_frame(&b->confirms, frame, err, err_len);
    if (taken < 0) {
        drop(b);
        return BROKER_E_FAILED;
    }
    if (taken)
        return 0;
    if (frame->frame_type == AMQP_FRAME_HEADER || frame->frame_type == AMQP_FRAME_BODY) {
        /* No deliveries on this channel: content without a basic.return before it. */
        text(err, err_len, "unexpected %s frame",
             frame->frame_type == AMQP_FRAME_HEADER ? "content header" : "body");
        drop(b);
        return BROKER_E_FAILED;
    }
    if (frame->frame_type != AMQP_FRAME_METHOD)
        return 0;
    const amqp_method_t *m = &frame->payload.method;
    switch (m->id) {
    case AMQP_CHANNEL_CLOSE_METHOD:
        return channel_closed(b, m->decoded, err, err_len);
    case AMQP_CONNECTION_CLOSE_METHOD: {
        char reason[512];
        text(err, err_len, "%s", broker_describe_method(m, reason, sizeof reason));
        amqp_connection_close_ok_t ok;
        amqp_send_method(b->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        drop(b);
        return BROKER_E_FAILED;
    }
    default:
        return 0;
    }
}

/* Reads frames for up to wait_ms (0: only what is there). Returns 0, or BROKER_E_FAILED. */
static int read_frames(relay_broker *b, int wait_ms, char *err, size_t err_len)
{
    struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
    bool first = true;
    while (b->conn) {
        amqp_frame_t frame;
        struct timeval zero = {0, 0};
        int rc = amqp_simple_wait_frame_noblock(b->conn, &frame, first ? &tv : &zero);
        first = false;
        if (rc == AMQP_STATUS_TIMEOUT)
            return 0;
        if (rc != AMQP_STATUS_OK) {
            text(err, err_len, "%s", broker_describe_status(rc));
            drop(b);
            return BROKER_E_FAILED;
        }
        if (handle_frame(b, &frame, err, err_len) != 0)
            return BROKER_E_FAILED;
    }
    return BROKER_E_FAILED;
}

int relay_broker_service(relay_broker *b, char *err, size_t err_len)
{
    if (!b->conn) {
        text(err, err_len, "not connected");
        return BROKER_E_FAILED;
    }
    b->rows = NULL;
    b->row_count = 0;
    int rc = read_frames(b, 0, err, err_len);
    if (b->conn && b->confirms.assembly.state == BROKER_ASSEMBLY_IDLE)
        amqp_maybe_release_buffers(b->conn);
    return rc;
}

/* Checks each exchange of rows that this connection has not seen; the rows of one that does not
 * exist become UNROUTABLE. Returns 0 or BROKER_E_FAILED (dropped). */
static int check_exchanges(relay_broker *b, relay_row *rows, size_t count, char *err,
                           size_t err_len)
{
    char reason[512];
    for (size_t i = 0; i < count && b->conn; i++) {
        relay_row *row = &rows[i];
        if (row->outcome != RELAY_ROW_UNKNOWN || row->exchange.len == 0 ||
            is_known(b, &row->exchange))
            continue;
        amqp_exchange_declare(b->conn, BROKER_CHANNEL,
                              (amqp_bytes_t){row->exchange.len, row->exchange.data},
                              amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(b->conn);
        if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
            remember(b, &row->exchange);
            continue;
        }
        if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
            reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
            ((const amqp_channel_close_t *)reply.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
            const amqp_channel_close_t *m = reply.reply.decoded;
            for (size_t k = i; k < count; k++) {
                relay_row *same = &rows[k];
                if (same->outcome != RELAY_ROW_UNKNOWN || same->exchange.len != row->exchange.len ||
                    memcmp(same->exchange.data, row->exchange.data, row->exchange.len) != 0)
                    continue;
                same->outcome = RELAY_ROW_UNROUTABLE;
                text(same->error, sizeof same->error, "exchange not found: %u %.*s", m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
            }
            if (reopen_channel(b, err, err_len) != 0)
                return BROKER_E_FAILED;
            continue;
        }
        text(err, err_len, "checking exchange '%s': %s", row->exchange.data,
             broker_describe_reply(reply, reason, sizeof reason));
        drop(b);
        return BROKER_E_FAILED;
    }
    return b->conn ? 0 : BROKER_E_FAILED;
}

static int publish_row(relay_broker *b, relay_row *row, publish_ref *ref, char *err, size_t err_len)
{
    amqp_table_entry_t headers[6] = {
        {.key = amqp_cstring_bytes(OUTBOX_HEADER_SOURCE_BIZ_KEY),
         .value = {.kind = AMQP_FIELD_KIND_UTF8,
                   .value.bytes = {row->source_biz_key.len, row->source_biz_key.data}}},
        {.key = amqp_cstring_bytes(OUTBOX_HEADER_HANDLER),
         .value = {.kind = AMQP_FIELD_KIND_UTF8,
                   .value.bytes = {row->handler_name.len, row->handler_name.data}}},
        {.key = amqp_cstring_bytes(OUTBOX_HEADER_EMIT),
         .value = {.kind = AMQP_FIELD_KIND_UTF8,
                   .value.bytes = {row->emit_name.len, row->emit_name.data}}},
        {.key = amqp_cstring_bytes(OUTBOX_HEADER_OUTBOX_ID),
         .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = row->id}},
    };
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                  AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_HEADERS_FLAG,
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .message_id = {row->biz_key.len, row->biz_key.data},
        .app_id = amqp_cstring_bytes(OUTBOX_APP_ID),
        .timestamp = (uint64_t)(row->created_at_s > 0 ? row->created_at_s : 0),
        .headers = {.num_entries = 4, .entries = headers},
    };
    /* The trace context the writer stored: the incoming message's trace, idemq's span as the
     * parent (util/trace_context.h). A row without one sends neither header. */
    if (row->traceparent.len) {
        headers[props.headers.num_entries++] = (amqp_table_entry_t){
            .key = amqp_cstring_bytes(TRACE_HEADER_TRACEPARENT),
            .value = {.kind = AMQP_FIELD_KIND_UTF8,
                      .value.bytes = {row->traceparent.len, row->traceparent.data}}};
        if (row->tracestate.len)
            headers[props.headers.num_entries++] = (amqp_table_entry_t){
                .key = amqp_cstring_bytes(TRACE_HEADER_TRACESTATE),
                .value = {.kind = AMQP_FIELD_KIND_UTF8,
                          .value.bytes = {row->tracestate.len, row->tracestate.data}}};
    }
    if (row->content_type.len) {
        props._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
        props.content_type = (amqp_bytes_t){row->content_type.len, row->content_type.data};
    }
    broker_publish m = {.exchange = {row->exchange.len, row->exchange.data},
                        .routing_key = {row->routing_key.len, row->routing_key.data},
                        .props = &props,
                        .body = {row->body.len, row->body.data},
                        .key = row->id};
    uint64_t seq;
    ref->b = b;
    ref->row = row;
    int rc = broker_confirms_publish(&b->confirms, b->conn, &m, on_confirm, ref, &seq);
    if (rc != AMQP_STATUS_OK && seq == 0) {
        text(err, err_len, "out of memory");
        drop(b);
        return BROKER_E_FAILED;
    }
    row->seq = seq;
    if (rc != AMQP_STATUS_OK) {
        /* The frames may be half sent: the connection cannot go on. */
        text(err, err_len, "publish failed: %s", broker_describe_status(rc));
        drop(b);
        return BROKER_E_FAILED;
    }
    return 0;
}

/* Ends the round in b: the callbacks point into b->refs, so a round whose confirms are still owed
 * cannot end with the connection up (dropped). Returns rc, or BROKER_E_FAILED after such a drop. */
static int end_round(relay_broker *b, int rc)
{
    if (b->conn && b->confirms.pending) {
        drop(b);
        rc = BROKER_E_FAILED;
    }
    if (b->conn && b->confirms.assembly.state == BROKER_ASSEMBLY_IDLE)
        amqp_maybe_release_buffers(b->conn);
    free(b->refs);
    b->refs = NULL;
    b->rows = NULL;
    b->row_count = 0;
    return rc;
}

int relay_broker_send(relay_broker *b, relay_row *rows, size_t count, char *err, size_t err_len)
{
    end_round(b, 0); /* a round never awaited (the caller gave it up) ends here */
    b->rows = rows;
    b->row_count = count;
    b->channel_reopened = false;
    if (!b->conn) {
        text(err, err_len, "not connected");
        return end_round(b, BROKER_E_FAILED);
    }
    b->refs = calloc(count ? count : 1, sizeof *b->refs);
    if (!b->refs) {
        text(err, err_len, "out of memory");
        return end_round(b, BROKER_E_FAILED);
    }
    if (check_exchanges(b, rows, count, err, err_len) != 0)
        return end_round(b, BROKER_E_FAILED);
    b->channel_reopened = false;
    for (size_t i = 0; i < count; i++) {
        if (rows[i].outcome != RELAY_ROW_UNKNOWN)
            continue;
        if (publish_row(b, &rows[i], &b->refs[i], err, err_len) != 0)
            return end_round(b, BROKER_E_FAILED);
        /* Take the acks in as they come, so the broker never waits for us to read. */
        if (read_frames(b, 0, err, err_len) != 0)
            return end_round(b, BROKER_E_FAILED);
        if (b->channel_reopened)
            break; /* the rest goes out next round, in order behind the rows the close swallowed */
    }
    return 0;
}

int relay_broker_await(relay_broker *b, uint64_t confirm_timeout_ms, relay_tick_fn tick, void *ctx,
                       char *err, size_t err_len)
{
    if (!b->rows)
        return end_round(b, 0);
    int64_t start = monotonic_ms(), next_tick = start + TICK_MS;
    while (b->confirms.pending) {
        int64_t now = monotonic_ms();
        if (now - start >= (int64_t)confirm_timeout_ms) {
            text(err, err_len, "no publisher confirm within %" PRIu64 " ms for %zu message(s)",
                 confirm_timeout_ms, b->confirms.pending);
            drop(b);
            return end_round(b, BROKER_E_FAILED);
        }
        if (now >= next_tick) {
            next_tick = now + TICK_MS;
            if (tick && !tick(ctx)) {
                text(err, err_len, "stopping with %zu publisher confirm(s) still owed",
                     b->confirms.pending);
                drop(b);
                return end_round(b, BROKER_E_FAILED);
            }
        }
        int64_t wait = next_tick - now;
        if (wait > (int64_t)confirm_timeout_ms - (now - start))
            wait = (int64_t)confirm_timeout_ms - (now - start);
        if (read_frames(b, (int)(wait > 0 ? wait : 0), err, err_len) != 0)
            return end_round(b, BROKER_E_FAILED);
    }
    return end_round(b, 0);
}
