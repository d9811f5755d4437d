/*
 * session — see session.h. Frames become messages in assembly.c and publisher confirms are
 * tracked in confirms.c; this file owns the connection's lifecycle: connect and declare, the
 * drain after every event, consume/cancel, acks, publishes, and reconnecting with backoff. Which
 * node to try next is nodes.c's: a reconnect tries the nodes of a round back to back and backs
 * off between rounds. Thread affinity: loop thread only.
 */
#include "broker/session.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/assembly.h"
#include "broker/nodes.h"
#include "broker/topology.h"
#include "ops/log.h"
#include "policy/backoff.h"
#include "util/rng.h"

#define CONSUMER_TAG_PREFIX "idemq-"

/* Jitter keeps a fleet of instances from reconnecting in lock-step after a broker restart. */
static const backoff_policy reconnect_backoff = {
    .initial_ms = 500, .max_ms = 30000, .jitter_percent = 50};

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
    bool want_consuming;         /* what the owner asked for (broker_set_consuming) */
    bool consuming;              /* what the broker was told on this connection */
    uint64_t subscription;       /* bumped by every basic.consume round: see consumer_tag */
    bool in_drain;               /* drain() is on the stack: a nested call returns at once */
    bool freeing;                /* broker_session_free ran: never reconnect; handles closing */
    unsigned reconnect_attempt;  /* reconnects failed in a row, over every node */
    unsigned failed_rounds;      /* rounds over every node failed in a row: the backoff's count */
    rng random;                  /* reconnect jitter, the order of the nodes */
    broker_nodes nodes;          /* which node to try next */
    broker_assembly assembly;    /* the delivery or return being received */
    broker_confirms confirms;    /* publishes the broker has not confirmed yet */
};

static void drain(broker_session *s);
static void schedule_round(broker_session *s);

static void on_poll_closed(uv_handle_t *handle)
{
    free(handle);
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
    broker_assembly_reset(&s->assembly);
    broker_confirms_fail_all(&s->confirms);
}

static void connection_lost(broker_session *s, const char *reason)
{
    if (!s->conn)
        return;
    log_error(LOG_NO_CONTEXT, "RabbitMQ connection lost: %s", reason);
    drop_connection(s, false);
    if (s->cb->on_down)
        s->cb->on_down(s->cb->ctx, reason);
    s->failed_rounds = 0;
    schedule_round(s);
}

/* A returned copy fails its own publish's confirm, found by the sequence header it carries. */
static void mark_returned(broker_session *s, const broker_message *msg)
{
    int64_t seq;
    if (!message_header_int(&msg->properties, HEADER_PUBLISH_SEQ, &seq)) {
        log_error(LOG_NO_CONTEXT, "broker returned a message idemq did not publish; ignored");
        return;
    }
    broker_confirms_mark_returned(&s->confirms, (uint64_t)seq);
}

/* msg is taken. */
static void message_complete(broker_session *s, broker_message *msg, bool returned)
{
    if (returned) {
        mark_returned(s, msg);
        broker_message_free(msg);
        return;
    }
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
        size_t consumer_index;
        if (consumer_index_of(s, d->consumer_tag, &consumer_index) != 0) {
            connection_lost(s, "delivery for an unknown consumer tag");
            return -1;
        }
        broker_assembly_begin_delivery(&s->assembly, d->delivery_tag, consumer_index,
                                       d->redelivered != 0);
        return 0;
    }
    case AMQP_BASIC_RETURN_METHOD: {
        const amqp_basic_return_t *r = m->decoded;
        log_error(LOG_NO_CONTEXT, "broker returned a retry/DLQ copy as unroutable (%u %.*s); "
                  "the original will be requeued — is the topology intact?",
                  r->reply_code, (int)r->reply_text.len, (const char *)r->reply_text.bytes);
        broker_assembly_begin_return(&s->assembly);
        return 0;
    }
    case AMQP_BASIC_ACK_METHOD: {
        const amqp_basic_ack_t *a = m->decoded;
        broker_confirms_resolve(&s->confirms, a->delivery_tag, a->multiple != 0, true);
        return s->conn ? 0 : -1;
    }
    case AMQP_BASIC_NACK_METHOD: {
        const amqp_basic_nack_t *n = m->decoded;
        broker_confirms_resolve(&s->confirms, n->delivery_tag, n->multiple != 0, false);
        return s->conn ? 0 : -1;
    }
    case AMQP_BASIC_CANCEL_METHOD:
        connection_lost(s, "the broker cancelled a consumer (was a queue deleted?)");
        return -1;
    case AMQP_CHANNEL_CLOSE_METHOD:
    case AMQP_CONNECTION_CLOSE_METHOD:
        connection_lost(s, broker_describe_method(m, reason, sizeof reason));
        return -1;
    default:
        return 0;
    }
}

static int handle_frame(broker_session *s, const amqp_frame_t *frame)
{
    switch (frame->frame_type) {
    case AMQP_FRAME_METHOD:
        return handle_method(s, frame);
    case AMQP_FRAME_HEADER:
    case AMQP_FRAME_BODY: {
        char reason[128];
        broker_message *msg;
        bool returned;
        if (broker_assembly_add_frame(&s->assembly, frame, s->cfg->max_body, &msg, &returned,
                                      reason, sizeof reason) != 0) {
            connection_lost(s, reason);
            return -1;
        }
        if (msg)
            message_complete(s, msg, returned);
        return s->conn ? 0 : -1;
    }
    default:
        return 0;
    }
}

static void drain(broker_session *s)
{
    /* Re-entrant calls (a callback acking from inside a drain) leave the work to the outer loop. */
    if (s->in_drain || !s->conn)
        return;
    s->in_drain = true;
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
    s->in_drain = false;
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

/* Connects to url (borrowed), declares, starts consuming. Returns 0, BROKER_E_REFUSED for
 * configuration conflicts, BROKER_E_FAILED otherwise; err says why. */
static int connect_and_setup(broker_session *s, const char *url, char *err, size_t err_len)
{
    char tls_info[1024];
    broker_open_options opts = {
        .url = url,
        .heartbeat_ms = s->cfg->heartbeat_ms,
        .prefetch = s->cfg->prefetch,
        .confirms = 1,
        .tls = &s->cfg->amqp_tls,
        .tls_info = tls_info,
        .tls_info_len = sizeof tls_info,
    };
    opts.password = s->cfg->amqp_password;
    int rc = broker_open(&opts, &s->conn, err, err_len);
    if (rc != 0)
        return BROKER_E_FAILED;
    if (tls_info[0])
        log_info(LOG_NO_CONTEXT, "RabbitMQ connection uses TLS: %s", tls_info);
    for (size_t i = 0; i < s->cfg->consumer_count; i++) {
        const config_consumer *c = &s->cfg->consumers[i];
        log_context ctx = {.queue = c->queue, .retries = -1};
        rc = topology_declare(s->conn, c, err, err_len);
        if (rc != 0) {
            drop_connection(s, true);
            return rc == TOPOLOGY_E_BROKER ? BROKER_E_FAILED : BROKER_E_REFUSED;
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
            return BROKER_E_FAILED;
        }
        err[0] = '\0';
    }
    s->poll = malloc(sizeof *s->poll);
    if (!s->poll || uv_poll_init(s->loop, s->poll, amqp_get_sockfd(s->conn)) != 0) {
        free(s->poll);
        s->poll = NULL;
        snprintf(err, err_len, "cannot watch the AMQP socket");
        drop_connection(s, true);
        return BROKER_E_FAILED;
    }
    s->poll->data = s;
    uv_poll_start(s->poll, UV_READABLE, on_readable);
    if (apply_consuming(s, err, err_len) != 0) {
        drop_connection(s, true);
        return BROKER_E_FAILED;
    }
    drain(s);
    return s->conn ? 0 : BROKER_E_FAILED;
}

/* "node amqp://user:***@host:port/vhost (2 of 3)" for the node handed out last. */
static const char *node_name(const broker_session *s, char *buf, size_t len)
{
    char shown[512];
    config_redact_url(s->cfg->amqp_urls[broker_nodes_last(&s->nodes)], shown, sizeof shown);
    if (s->nodes.count > 1)
        snprintf(buf, len, "node %s (%zu of %zu)", shown, broker_nodes_last(&s->nodes) + 1,
                 s->nodes.count);
    else
        snprintf(buf, len, "node %s", shown);
    return buf;
}

static void on_reconnect_timer(uv_timer_t *timer)
{
    broker_session *s = timer->data;
    char err[1024], node[600];
    if (s->freeing || s->conn)
        return;
    const char *url = broker_nodes_next(&s->nodes);
    if (!url) { /* not reached: a round is begun before its timer starts */
        schedule_round(s);
        return;
    }
    s->reconnect_attempt++;
    if (connect_and_setup(s, url, err, sizeof err) != 0) {
        log_warn(LOG_NO_CONTEXT, "reconnect to RabbitMQ %s failed (attempt %u): %s",
                 node_name(s, node, sizeof node), s->reconnect_attempt, err);
        if (broker_nodes_round_over(&s->nodes)) {
            s->failed_rounds++;
            schedule_round(s);
        } else {
            /* The next node at once: a node that is down costs no backoff while another is up
             * (the timer still lets the loop serve what is pending in between). */
            uv_timer_start(&s->reconnect_timer, on_reconnect_timer, 0, 0);
        }
        return;
    }
    log_info(LOG_NO_CONTEXT, "reconnected to RabbitMQ %s after %u attempt(s)",
             node_name(s, node, sizeof node), s->reconnect_attempt);
    s->reconnect_attempt = 0;
    s->failed_rounds = 0;
    if (s->cb->on_up)
        s->cb->on_up(s->cb->ctx);
}

/* Begins a round over every node, after the backoff for the rounds that failed in a row (the
 * first round after a loss waits the shortest delay). */
static void schedule_round(broker_session *s)
{
    if (s->freeing)
        return;
    broker_nodes_new_round(&s->nodes);
    uint64_t delay = backoff_delay_ms(&reconnect_backoff, s->failed_rounds, rng_next(&s->random));
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
    rng_init(&s->random, (uint64_t)(uintptr_t)s);
    broker_nodes_init(&s->nodes, cfg->amqp_urls, cfg->amqp_url_count, &s->random);
    broker_assembly_init(&s->assembly);
    broker_confirms_init(&s->confirms);
    uv_timer_init(loop, &s->tick_timer);
    uv_timer_init(loop, &s->reconnect_timer);
    s->tick_timer.data = s;
    s->reconnect_timer.data = s;
    s->open_handles = 2;
    return s;
}

/* The first connection: the nodes in their shuffled order until one answers. A refusal (the
 * topology conflicts with the broker's) is the cluster's, not one node's: no other node is tried
 * then. */
static int connect_first(broker_session *s, char *err, size_t err_len)
{
    char node[600];
    const char *url;
    int rc = BROKER_E_FAILED;
    broker_nodes_new_round(&s->nodes);
    while ((url = broker_nodes_next(&s->nodes)) != NULL) {
        rc = connect_and_setup(s, url, err, err_len);
        if (rc == 0) {
            log_info(LOG_NO_CONTEXT, "connected to RabbitMQ %s", node_name(s, node, sizeof node));
            return 0;
        }
        if (rc == BROKER_E_REFUSED || s->nodes.count == 1)
            return rc;
        if (!broker_nodes_round_over(&s->nodes))
            log_warn(LOG_NO_CONTEXT, "cannot use RabbitMQ %s: %s; trying the next node",
                     node_name(s, node, sizeof node), err);
    }
    /* The others were logged above; the last one's reason goes with the error. */
    char last[1024];
    snprintf(last, sizeof last, "%s", err);
    snprintf(err, err_len, "none of the %zu RabbitMQ nodes could be used; the last, %s: %s",
             s->nodes.count, node_name(s, node, sizeof node), last);
    return rc;
}

int broker_session_start(broker_session *s, char *err, size_t err_len)
{
    int rc = connect_first(s, err, err_len);
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

void broker_nack_requeue(broker_session *s, const broker_message *msg)
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
        return BROKER_E_FAILED;
    uint64_t seq;
    if (broker_confirms_push(&s->confirms, cb, arg, &seq) != 0)
        return BROKER_E_FAILED;
    amqp_pool_t pool;
    amqp_basic_properties_t props;
    init_amqp_pool(&pool, 1024);
    headers->publish_seq = seq;
    int rc = message_copy_properties(msg, headers, (size_t)amqp_get_frame_max(s->conn), &pool,
                                     &props);
    if (rc == 0) {
        amqp_bytes_t body = {.len = msg->body_len, .bytes = msg->body};
        rc = amqp_basic_publish(s->conn, BROKER_CHANNEL, amqp_cstring_bytes(exchange),
                                amqp_cstring_bytes(routing_key), 1, 0, &props, body);
        if (rc != AMQP_STATUS_OK) {
            empty_amqp_pool(&pool);
            broker_confirms_cancel_last(&s->confirms); /* before failing the others */
            connection_lost(s, amqp_error_string2(rc));
            return BROKER_E_FAILED;
        }
    }
    empty_amqp_pool(&pool);
    if (rc != 0) {
        broker_confirms_cancel_last(&s->confirms);
        return BROKER_E_FAILED;
    }
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
    return s->confirms.pending;
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
    s->freeing = true;
    drop_connection(s, true);
    uv_timer_stop(&s->tick_timer);
    uv_timer_stop(&s->reconnect_timer);
    uv_close((uv_handle_t *)&s->tick_timer, on_session_handle_closed);
    uv_close((uv_handle_t *)&s->reconnect_timer, on_session_handle_closed);
}
