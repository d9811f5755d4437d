/*
 * session — see session.h.
 */
#include "broker/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "broker/topology.h"
#include "ops/log.h"

#define CONSUMER_TAG_PREFIX "idemq-"
#define RECONNECT_MIN_MS 500
#define RECONNECT_MAX_MS 30000

typedef struct pending_confirm {
    struct pending_confirm *next;
    uint64_t seq;
    bool returned;
    broker_confirm_cb cb;
    void *arg;
} pending_confirm;

typedef enum assemble_state {
    ASSEMBLE_IDLE = 0,
    ASSEMBLE_HEADER,   /* got basic.deliver / basic.return, waiting for the header frame */
    ASSEMBLE_BODY,     /* waiting for body frames */
} assemble_state;

struct broker_session {
    uv_loop_t *loop;
    const config *cfg;
    const broker_session_callbacks *cb;
    amqp_connection_state_t conn;
    uint64_t generation;
    uv_poll_t *poll;             /* one per connection; freed in its close callback */
    uv_timer_t tick_timer;       /* services heartbeats */
    uv_timer_t reconnect_timer;
    int open_handles;
    bool want_consuming;
    bool consuming;
    uint64_t subscription;       /* bumped by every basic.consume round: see consumer_tag */
    bool draining;
    bool closing;
    unsigned reconnect_attempt;
    /* delivery assembly */
    assemble_state assemble;
    bool assembling_return;
    uint64_t assembling_tag;
    size_t assembling_consumer;
    bool assembling_redelivered;
    broker_message *assembling;
    /* publisher confirms, in publish order */
    uint64_t next_publish_seq;
    pending_confirm *confirm_head, *confirm_tail;
    size_t unconfirmed;
};

static void drain(broker_session *s);
static void schedule_reconnect(broker_session *s);

static void on_poll_closed(uv_handle_t *handle)
{
    free(handle);
}

static void fail_all_confirms(broker_session *s)
{
    pending_confirm *pc = s->confirm_head;
    s->confirm_head = s->confirm_tail = NULL;
    s->unconfirmed = 0;
    while (pc) {
        pending_confirm *next = pc->next;
        pc->cb(pc->arg, false);
        free(pc);
        pc = next;
    }
}

/* Tears the connection down after a failure. polite: try channel/connection close first. */
static void drop_connection(broker_session *s, bool polite)
{
    if (s->poll) {
        uv_poll_stop(s->poll);
        uv_close((uv_handle_t *)s->poll, on_poll_closed);
        s->poll = NULL;
    }
    if (s->conn) {
        if (polite)
            broker_close(s->conn);
        else
            amqp_destroy_connection(s->conn);
        s->conn = NULL;
    }
    s->generation++;
    s->consuming = false;
    s->assemble = ASSEMBLE_IDLE;
    broker_message_free(s->assembling);
    s->assembling = NULL;
    fail_all_confirms(s);
}

static void connection_lost(broker_session *s, const char *reason)
{
    if (!s->conn)
        return;
    log_error(LOG_NO_CONTEXT, "RabbitMQ connection lost: %s", reason);
    drop_connection(s, false);
    if (s->cb->on_down)
        s->cb->on_down(s->cb->ctx, reason);
    schedule_reconnect(s);
}

static void resolve_confirms(broker_session *s, uint64_t tag, bool multiple, bool acked)
{
    pending_confirm **link = &s->confirm_head;
    pending_confirm *prev = NULL;
    while (*link) {
        pending_confirm *pc = *link;
        if (pc->seq > tag)
            break;
        if (multiple || pc->seq == tag) {
            *link = pc->next;
            if (s->confirm_tail == pc)
                s->confirm_tail = prev;
            s->unconfirmed--;
            pc->cb(pc->arg, acked && !pc->returned);
            free(pc);
            if (!multiple)
                break;
        } else {
            prev = pc;
            link = &pc->next;
        }
    }
}

static void mark_returned(broker_session *s, const broker_message *msg)
{
    int64_t seq;
    if (!message_header_int(&msg->properties, HEADER_PUBLISH_SEQ, &seq)) {
        log_error(LOG_NO_CONTEXT, "broker returned a message idemq did not publish; ignored");
        return;
    }
    for (pending_confirm *pc = s->confirm_head; pc; pc = pc->next)
        if (pc->seq == (uint64_t)seq)
            pc->returned = true;
}

static void message_complete(broker_session *s)
{
    broker_message *msg = s->assembling;
    s->assembling = NULL;
    s->assemble = ASSEMBLE_IDLE;
    if (s->assembling_return) {
        mark_returned(s, msg);
        broker_message_free(msg);
        return;
    }
    msg->delivery_tag = s->assembling_tag;
    msg->consumer_index = s->assembling_consumer;
    msg->redelivered = s->assembling_redelivered;
    msg->generation = s->generation;
    s->cb->on_message(s->cb->ctx, msg);
}

/* Consumer tags are "idemq-<consumer index>.<subscription>" (consumer_tag). */
static int consumer_index_of(const broker_session *s, amqp_bytes_t tag, size_t *index)
{
    size_t prefix = sizeof CONSUMER_TAG_PREFIX - 1;
    if (tag.len <= prefix || tag.len > prefix + 32 || memcmp(tag.bytes, CONSUMER_TAG_PREFIX, prefix))
        return -1;
    size_t value = 0, digits = 0, i = prefix;
    for (; i < tag.len && ((const char *)tag.bytes)[i] != '.'; i++, digits++) {
        char c = ((const char *)tag.bytes)[i];
        if (c < '0' || c > '9' || digits >= 8)
            return -1;
        value = value * 10 + (size_t)(c - '0');
    }
    if (digits == 0)
        return -1;
    if (value >= s->cfg->consumer_count)
        return -1;
    *index = value;
    return 0;
}

/* Returns 0 to go on draining, -1 when the connection was dropped. */
static int handle_method(broker_session *s, const amqp_frame_t *frame)
{
    char reason[512];
    const amqp_method_t *m = &frame->payload.method;
    switch (m->id) {
    case AMQP_BASIC_DELIVER_METHOD: {
        const amqp_basic_deliver_t *d = m->decoded;
        if (consumer_index_of(s, d->consumer_tag, &s->assembling_consumer) != 0) {
            connection_lost(s, "delivery for an unknown consumer tag");
            return -1;
        }
        s->assembling_tag = d->delivery_tag;
        s->assembling_redelivered = d->redelivered != 0;
        s->assembling_return = false;
        s->assemble = ASSEMBLE_HEADER;
        return 0;
    }
    case AMQP_BASIC_RETURN_METHOD: {
        const amqp_basic_return_t *r = m->decoded;
        log_error(LOG_NO_CONTEXT, "broker returned a retry/DLQ copy as unroutable (%u %.*s); "
                  "the original will be requeued — is the topology intact?",
                  r->reply_code, (int)r->reply_text.len, (const char *)r->reply_text.bytes);
        s->assembling_return = true;
        s->assemble = ASSEMBLE_HEADER;
        return 0;
    }
    case AMQP_BASIC_ACK_METHOD: {
        const amqp_basic_ack_t *a = m->decoded;
        resolve_confirms(s, a->delivery_tag, a->multiple != 0, true);
        return s->conn ? 0 : -1;
    }
    case AMQP_BASIC_NACK_METHOD: {
        const amqp_basic_nack_t *n = m->decoded;
        resolve_confirms(s, n->delivery_tag, n->multiple != 0, false);
        return s->conn ? 0 : -1;
    }
    case AMQP_BASIC_CANCEL_METHOD:
        connection_lost(s, "the broker cancelled a consumer (was a queue deleted?)");
        return -1;
    case AMQP_CHANNEL_CLOSE_METHOD: {
        const amqp_channel_close_t *c = m->decoded;
        snprintf(reason, sizeof reason, "channel closed by broker: %u %.*s", c->reply_code,
                 (int)c->reply_text.len, (const char *)c->reply_text.bytes);
        connection_lost(s, reason);
        return -1;
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
        const amqp_connection_close_t *c = m->decoded;
        snprintf(reason, sizeof reason, "connection closed by broker: %u %.*s", c->reply_code,
                 (int)c->reply_text.len, (const char *)c->reply_text.bytes);
        connection_lost(s, reason);
        return -1;
    }
    default:
        return 0;
    }
}

static int handle_frame(broker_session *s, const amqp_frame_t *frame)
{
    switch (frame->frame_type) {
    case AMQP_FRAME_METHOD:
        return handle_method(s, frame);
    case AMQP_FRAME_HEADER: {
        if (s->assemble != ASSEMBLE_HEADER) {
            connection_lost(s, "unexpected content header frame");
            return -1;
        }
        uint64_t body_size = frame->payload.properties.body_size;
        /* A returned copy is only matched by its headers; a delivery keeps at most max_body
         * bytes, so prefetch × max_body bounds what deliveries can hold. */
        s->assembling = broker_message_new(frame->payload.properties.decoded, body_size,
                                           s->assembling_return ? 0 : s->cfg->max_body);
        if (!s->assembling) {
            connection_lost(s, "out of memory copying a delivery");
            return -1;
        }
        if (body_size == 0)
            message_complete(s);
        else
            s->assemble = ASSEMBLE_BODY;
        return s->conn ? 0 : -1;
    }
    case AMQP_FRAME_BODY: {
        bool overrun = false;
        if (s->assemble != ASSEMBLE_BODY) {
            connection_lost(s, "unexpected body frame");
            return -1;
        }
        bool complete = broker_message_add_body(s->assembling, frame->payload.body_fragment,
                                                &overrun);
        if (overrun) {
            connection_lost(s, "a body frame longer than its content header announced");
            return -1;
        }
        if (complete)
            message_complete(s);
        return s->conn ? 0 : -1;
    }
    default:
        return 0;
    }
}

static void drain(broker_session *s)
{
    /* Re-entrant calls (a callback acking from inside a drain) leave the work to the outer loop. */
    if (s->draining || !s->conn)
        return;
    s->draining = true;
    struct timeval zero = {0, 0};
    while (s->conn) {
        amqp_frame_t frame;
        int rc = amqp_simple_wait_frame_noblock(s->conn, &frame, &zero);
        if (rc == AMQP_STATUS_TIMEOUT)
            break;
        if (rc != AMQP_STATUS_OK) {
            connection_lost(s, amqp_error_string2(rc));
            break;
        }
        if (handle_frame(s, &frame) != 0)
            break;
    }
    if (s->conn)
        amqp_maybe_release_buffers(s->conn);
    s->draining = false;
}

static void on_readable(uv_poll_t *handle, int status, int events)
{
    broker_session *s = handle->data;
    (void)events;
    if (status < 0) {
        connection_lost(s, uv_strerror(status));
        return;
    }
    drain(s);
}

static void on_tick(uv_timer_t *timer)
{
    drain(timer->data);
}

/* Each basic.consume gets a tag of its own: RabbitMQ 3.10 quorum queues close the channel
 * (541, rabbitmq-server#5927) when a consumer re-subscribes under the tag of a cancelled one
 * whose deliveries are still unacked — exactly what resuming after a pause with held messages
 * does. */
static void consumer_tag(const broker_session *s, size_t index, char *buf, size_t len)
{
    snprintf(buf, len, CONSUMER_TAG_PREFIX "%zu.%llu", index, (unsigned long long)s->subscription);
}

static int apply_consuming(broker_session *s, char *err, size_t err_len)
{
    char reason[512];
    if (s->want_consuming == s->consuming || !s->conn)
        return 0;
    if (s->want_consuming)
        s->subscription++;
    for (size_t i = 0; i < s->cfg->consumer_count; i++) {
        char tag[48];
        consumer_tag(s, i, tag, sizeof tag);
        if (s->want_consuming)
            amqp_basic_consume(s->conn, BROKER_CHANNEL,
                               amqp_cstring_bytes(s->cfg->consumers[i].queue),
                               amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
        else
            amqp_basic_cancel(s->conn, BROKER_CHANNEL, amqp_cstring_bytes(tag));
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(s->conn);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            snprintf(err, err_len, "%s on queue %s failed: %s",
                     s->want_consuming ? "basic.consume" : "basic.cancel",
                     s->cfg->consumers[i].queue, broker_describe_reply(reply, reason, sizeof reason));
            return -1;
        }
    }
    s->consuming = s->want_consuming;
    log_info(LOG_NO_CONTEXT, "%s consuming", s->consuming ? "started" : "stopped");
    return 0;
}

/* Connects, declares, starts consuming. Returns 0, -2 for configuration conflicts, -1 otherwise. */
static int connect_and_setup(broker_session *s, char *err, size_t err_len)
{
    broker_open_options opts = {
        .url = s->cfg->amqp_url,
        .heartbeat_ms = s->cfg->heartbeat_ms,
        .prefetch = s->cfg->prefetch,
        .confirms = 1,
    };
    int rc = broker_open(&opts, &s->conn, err, err_len);
    if (rc != 0)
        return -1;
    s->next_publish_seq = 1;
    for (size_t i = 0; i < s->cfg->consumer_count; i++) {
        const config_consumer *c = &s->cfg->consumers[i];
        log_context ctx = {.queue = c->queue, .retries = -1};
        rc = topology_declare(s->conn, c, err, err_len);
        if (rc != 0) {
            drop_connection(s, true);
            return rc == TOPOLOGY_E_BROKER ? -1 : -2;
        }
        if (err[0])
            log_warn(&ctx, "%s", err);
        /* Redeliveries past a quorum work queue's delivery limit vanish: say so at every
         * connect, since only the operator can lift the limit (a policy). */
        char warning[TOPOLOGY_WARNING_MAX];
        rc = topology_check_work_queue(s->conn, c, warning, sizeof warning);
        if (rc == 1)
            log_warn(&ctx, "%s", warning);
        else if (rc < 0) {
            snprintf(err, err_len, "%s", warning);
            drop_connection(s, true);
            return -1;
        }
        err[0] = '\0';
    }
    s->poll = malloc(sizeof *s->poll);
    if (!s->poll || uv_poll_init(s->loop, s->poll, amqp_get_sockfd(s->conn)) != 0) {
        free(s->poll);
        s->poll = NULL;
        snprintf(err, err_len, "cannot watch the AMQP socket");
        drop_connection(s, true);
        return -1;
    }
    s->poll->data = s;
    uv_poll_start(s->poll, UV_READABLE, on_readable);
    if (apply_consuming(s, err, err_len) != 0) {
        drop_connection(s, true);
        return -1;
    }
    drain(s);
    return s->conn ? 0 : -1;
}

static void on_reconnect_timer(uv_timer_t *timer)
{
    broker_session *s = timer->data;
    char err[1024];
    if (s->closing || s->conn)
        return;
    if (connect_and_setup(s, err, sizeof err) != 0) {
        log_warn(LOG_NO_CONTEXT, "reconnect to RabbitMQ failed (attempt %u): %s",
                 s->reconnect_attempt + 1, err);
        s->reconnect_attempt++;
        schedule_reconnect(s);
        return;
    }
    log_info(LOG_NO_CONTEXT, "reconnected to RabbitMQ after %u attempt(s)",
             s->reconnect_attempt + 1);
    s->reconnect_attempt = 0;
    if (s->cb->on_up)
        s->cb->on_up(s->cb->ctx);
}

static void schedule_reconnect(broker_session *s)
{
    if (s->closing)
        return;
    uint64_t delay = RECONNECT_MIN_MS;
    for (unsigned i = 0; i < s->reconnect_attempt && delay < RECONNECT_MAX_MS; i++)
        delay *= 2;
    if (delay > RECONNECT_MAX_MS)
        delay = RECONNECT_MAX_MS;
    /* Jitter keeps a fleet of instances from reconnecting in lock-step after a broker restart. */
    delay += (uint64_t)rand() % (delay / 2 + 1);
    uv_timer_start(&s->reconnect_timer, on_reconnect_timer, delay, 0);
}

broker_session *broker_session_new(uv_loop_t *loop, const config *cfg,
                                   const broker_session_callbacks *callbacks)
{
    broker_session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->loop = loop;
    s->cfg = cfg;
    s->cb = callbacks;
    s->want_consuming = true;
    s->generation = 1;
    uv_timer_init(loop, &s->tick_timer);
    uv_timer_init(loop, &s->reconnect_timer);
    s->tick_timer.data = s;
    s->reconnect_timer.data = s;
    s->open_handles = 2;
    return s;
}

int broker_session_start(broker_session *s, char *err, size_t err_len)
{
    int rc = connect_and_setup(s, err, err_len);
    if (rc != 0)
        return rc;
    uint64_t tick = s->cfg->heartbeat_ms ? s->cfg->heartbeat_ms / 4 : 5000;
    if (tick < 250)
        tick = 250;
    uv_timer_start(&s->tick_timer, on_tick, tick, tick);
    return 0;
}

void broker_ack(broker_session *s, const broker_message *msg)
{
    if (!s->conn || msg->generation != s->generation)
        return;
    int rc = amqp_basic_ack(s->conn, BROKER_CHANNEL, msg->delivery_tag, 0);
    if (rc != AMQP_STATUS_OK)
        connection_lost(s, amqp_error_string2(rc));
}

void broker_requeue(broker_session *s, const broker_message *msg)
{
    if (!s->conn || msg->generation != s->generation)
        return;
    int rc = amqp_basic_nack(s->conn, BROKER_CHANNEL, msg->delivery_tag, 0, 1);
    if (rc != AMQP_STATUS_OK)
        connection_lost(s, amqp_error_string2(rc));
}

int broker_publish_copy(broker_session *s, const broker_message *msg, const char *exchange,
                        const char *routing_key, copy_headers *headers, broker_confirm_cb cb,
                        void *arg)
{
    if (msg->generation != s->generation)
        return BROKER_E_STALE; /* also when not connected: the generation moved on */
    if (!s->conn)
        return -1;
    pending_confirm *pc = calloc(1, sizeof *pc);
    if (!pc)
        return -1;
    amqp_pool_t pool;
    amqp_basic_properties_t props;
    init_amqp_pool(&pool, 1024);
    headers->publish_seq = s->next_publish_seq;
    int rc = message_copy_properties(msg, headers, &pool, &props);
    if (rc == 0) {
        amqp_bytes_t body = {.len = msg->body_len, .bytes = msg->body};
        rc = amqp_basic_publish(s->conn, BROKER_CHANNEL, amqp_cstring_bytes(exchange),
                                amqp_cstring_bytes(routing_key), 1, 0, &props, body);
        if (rc != AMQP_STATUS_OK) {
            empty_amqp_pool(&pool);
            free(pc);
            connection_lost(s, amqp_error_string2(rc));
            return -1;
        }
    }
    empty_amqp_pool(&pool);
    if (rc != 0) {
        free(pc);
        return -1;
    }
    pc->seq = s->next_publish_seq++;
    pc->cb = cb;
    pc->arg = arg;
    if (s->confirm_tail)
        s->confirm_tail->next = pc;
    else
        s->confirm_head = pc;
    s->confirm_tail = pc;
    s->unconfirmed++;
    /* rabbitmq-c may read frames while sending (an overdue heartbeat): serve them now. */
    drain(s);
    return 0;
}

void broker_set_consuming(broker_session *s, bool consuming)
{
    char err[1024];
    s->want_consuming = consuming;
    if (apply_consuming(s, err, sizeof err) != 0) {
        connection_lost(s, err);
        return;
    }
    drain(s);
}

bool broker_is_connected(const broker_session *s)
{
    return s->conn != NULL;
}

bool broker_is_consuming(const broker_session *s)
{
    return s->consuming;
}

size_t broker_unconfirmed(const broker_session *s)
{
    return s->unconfirmed;
}

static void on_session_handle_closed(uv_handle_t *handle)
{
    broker_session *s = handle->data;
    if (--s->open_handles == 0)
        free(s);
}

void broker_session_free(broker_session *s)
{
    if (!s)
        return;
    s->closing = true;
    drop_connection(s, true);
    uv_timer_stop(&s->tick_timer);
    uv_timer_stop(&s->reconnect_timer);
    uv_close((uv_handle_t *)&s->tick_timer, on_session_handle_closed);
    uv_close((uv_handle_t *)&s->reconnect_timer, on_session_handle_closed);
}
