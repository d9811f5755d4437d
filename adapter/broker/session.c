/*
 * session — see session.h for the design (a broker thread, two queues). Frames become messages
 * in assembly.c and publisher confirms are tracked in confirms.c, both on the broker thread; which
 * node to try next is nodes.c's. This file has three parts: the queues between the threads, the
 * broker thread (connect and declare, drain, commands, coalesced acks, liveness probe, reconnect),
 * and the loop side (the public functions and the events they turn into callbacks).
 *
 * Fields are grouped by the thread that may touch them: "loop", "thread", or shared (atomics, or
 * under lock). Thread affinity: public functions on the loop thread; see the field groups.
 */
#include "broker/session.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "broker/assembly.h"
#include "broker/nodes.h"
#include "broker/topology.h"
#include "ops/log.h"
#include "policy/backoff.h"
#include "util/rng.h"
#include "util/monotonic.h"

#define CONSUMER_TAG_PREFIX "idemq-"


/* Nothing arrived for this long: send the liveness probe. */
#define PROBE_AFTER_MS 1000
/* Nothing arrived for this long although a probe went out: the broker is silent. */
#define SILENT_AFTER_MS 3000
/* The broker thread wakes at least this often (heartbeats, the probe, reconnect timing). */
#define THREAD_TICK_MS 250
/* Acks behind an open delivery wait this long for it (flush_acks): a batch in flight at the head
 * usually commits within it, and one basic.ack(multiple) then settles everything behind it. */
#define ACKS_BEHIND_WAIT_MS 50
/* Acks at the head of the ring wait this long for others to join their basic.ack(multiple): the
 * loop settles a batch message by message, and the thread, woken by the first, took a few at a
 * time (8,496 ack frames for about 60,600 messages at batch 32 in a bench run, 2,264 with the
 * wait), each frame a write here and a command for the broker's channel and queue. */
#define ACKS_GATHER_MS 2

/* Jitter keeps a fleet of instances from reconnecting in lock-step after a broker restart. The cap
 * bounds how long consumption stays off after the broker is back: at 30 s (45 with the jitter)
 * a broker down for a minute was consumed from again up to 45 s after it returned, while the
 * outbox relay (5 s) had long reconnected. RabbitMQ's Java client retries every 5 s. */
static const backoff_policy reconnect_backoff = {
    .initial_ms = 500, .max_ms = 10000, .jitter_percent = 50};

typedef enum command_kind {
    CMD_ACK,
    CMD_NACK,
    CMD_RELEASE,
    CMD_REJECT,
    CMD_PUBLISH,
    CMD_CONSUME,
    CMD_ABANDON_HELD,
    CMD_STOP,
} command_kind;

typedef struct command {
    struct command *next;
    command_kind kind;
    uint64_t generation;   /* ACK, NACK, REJECT, PUBLISH: the connection of the delivery */
    uint64_t delivery_tag; /* ACK, NACK, REJECT */
    bool consuming;        /* CONSUME */
    /* PUBLISH: everything the thread sends, owned (but body: the caller's message) */
    struct broker_session *session;
    char *exchange, *routing_key;
    amqp_pool_t pool;
    bool pool_ready;
    amqp_basic_properties_t props;
    amqp_bytes_t body;
    broker_confirm_cb cb;
    void *arg;
} command;

typedef enum event_kind {
    EV_MESSAGE,
    EV_CONFIRM,
    EV_UP,
    EV_DOWN,
    EV_CONNECT_FAILED,
    EV_DECLARING,
    EV_BLOCKED,
    EV_UNBLOCKED,
    EV_CONSUMING,
    EV_CONSUMER_CANCELLED,
    EV_FATAL,
    EV_EXITED,
} event_kind;

typedef struct event {
    struct event *next;
    event_kind kind;
    broker_message *msg; /* MESSAGE: owned */
    broker_confirm_cb cb; /* CONFIRM */
    void *arg;
    bool flag;  /* CONFIRM: confirmed; CONSUMING: consuming */
    int code;   /* FATAL; CONSUMER_CANCELLED: the consumer's index */
    char *text; /* DOWN, CONNECT_FAILED, BLOCKED, FATAL: owned (NULL when out of memory) */
} event;

/* Delivery tags handed to the loop and not yet settled on this connection, in tag order. */
/* TAG_ACKED and TAG_RELEASED are settled by the loop and not yet sent (flush_acks coalesces
 * them); TAG_GONE was sent on its own. */
typedef enum tag_state { TAG_OPEN, TAG_ACKED, TAG_RELEASED, TAG_GONE } tag_state;
typedef struct tag_entry {
    uint64_t tag;
    tag_state state;
} tag_entry;

/* What the broker knows of one consumer on the current connection. */
typedef struct consumer_subscription {
    uint64_t subscription;    /* the number in its current tag */
    bool cancelled_by_broker; /* a basic.cancel came for that tag: re-subscribe it */
} consumer_subscription;

typedef struct tag_ring {
    tag_entry *entries;
    size_t capacity, head, count;
    size_t acked; /* entries in TAG_ACKED: flush_acks decides on it without a scan */
} tag_ring;

struct broker_session {
    /* set at creation, read by both threads */
    uv_loop_t *loop;
    const config *cfg;
    const broker_session_callbacks *cb;
    int wake_fd; /* eventfd: the loop wakes the thread */

    /* shared under lock */
    uv_mutex_t lock;
    int setup_fd;      /* the socket of a connection still declaring its topology; -1: none */
    bool abort_setup;  /* stopping: a connection being set up is cut short */
    command *commands_head, *commands_tail;
    event *events_head, *events_tail;
    command *free_commands;
    event *free_events;

    /* shared atomics */
    _Atomic uint64_t generation;    /* the connection deliveries now belong to */
    _Atomic uint64_t frame_max;     /* negotiated on the current connection */
    _Atomic int64_t last_rx_ms;     /* monotonic time a frame last arrived */
    _Atomic int64_t sending_since_ms; /* a publish is being written since then; 0: none */

    /* loop */
    uv_async_t events_async;
    uv_thread_t thread;
    bool thread_started;
    bool connected, consuming, blocked, freeing, fatal;
    char blocked_reason[256];
    char last_error[512];  /* why not connected, for /readyz */
    size_t unconfirmed;    /* publishes queued whose callback has not run */

    /* thread */
    amqp_connection_state_t conn;
    uint64_t thread_generation;
    bool stop;
    bool want_consuming;         /* what the owner asked for */
    bool thread_consuming;       /* what the broker was told on this connection */
    bool thread_blocked;         /* connection.blocked received, not yet unblocked */
    bool ever_connected;
    uint64_t subscription;       /* bumped by every basic.consume: see consumer_tag */
    consumer_subscription *subscribed; /* per consumer: its tag, and whether the broker ended it */
    int64_t probe_sent_ms;       /* 0: no probe outstanding */
    int64_t next_attempt_ms;     /* monotonic time of the next connect attempt */
    unsigned reconnect_attempt;  /* connects failed in a row, over every node */
    unsigned failed_rounds;      /* rounds over every node failed in a row: the backoff's count */
    rng random;                  /* reconnect jitter, the order of the nodes */
    broker_nodes nodes;
    broker_assembly assembly;
    broker_confirms confirms;
    tag_ring tags;
    int64_t acks_behind_since_ms;   /* 0, or since when flush_acks holds acks back */
    int64_t acks_behind_due_ms;     /* 0, or when it sends them (the thread wakes for it) */
    int64_t head_acks_since_ms;     /* 0, or since when acks at the head gather (flush_acks) */
    int64_t head_acks_due_ms;       /* 0, or when they go out (the thread wakes for it) */
    command *held_head, *held_tail; /* publishes waiting for connection.unblocked */
};


/* ---- the queues ---------------------------------------------------------------------------- */

static command *command_get(broker_session *s)
{
    uv_mutex_lock(&s->lock);
    command *c = s->free_commands;
    if (c)
        s->free_commands = c->next;
    uv_mutex_unlock(&s->lock);
    if (!c)
        c = malloc(sizeof *c);
    if (c)
        memset(c, 0, sizeof *c);
    return c;
}

static void command_release(broker_session *s, command *c)
{
    if (c->pool_ready)
        empty_amqp_pool(&c->pool);
    free(c->exchange);
    free(c->routing_key);
    c->pool_ready = false;
    c->exchange = c->routing_key = NULL;
    uv_mutex_lock(&s->lock);
    c->next = s->free_commands;
    s->free_commands = c;
    uv_mutex_unlock(&s->lock);
}

/* Loop → thread. Wakes the thread only when the queue was empty: it takes the whole queue. */
static void command_post(broker_session *s, command *c)
{
    c->next = NULL;
    uv_mutex_lock(&s->lock);
    bool was_empty = s->commands_head == NULL;
    if (s->commands_tail)
        s->commands_tail->next = c;
    else
        s->commands_head = c;
    s->commands_tail = c;
    uv_mutex_unlock(&s->lock);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t ignored = write(s->wake_fd, &one, sizeof one);
        (void)ignored; /* a full counter still wakes the thread */
    }
}

static command *commands_take(broker_session *s)
{
    uv_mutex_lock(&s->lock);
    command *head = s->commands_head;
    s->commands_head = s->commands_tail = NULL;
    uv_mutex_unlock(&s->lock);
    return head;
}

/* Thread → loop. text is copied. Out of memory loses the event's text, never a delivery or a
 * confirm: those spin until memory is back, since losing one would break "exactly once". */
static void event_post(broker_session *s, event_kind kind, broker_message *msg,
                       broker_confirm_cb cb, void *arg, bool flag, int code, const char *text)
{
    event *e = NULL;
    for (;;) {
        uv_mutex_lock(&s->lock);
        e = s->free_events;
        if (e)
            s->free_events = e->next;
        uv_mutex_unlock(&s->lock);
        if (!e)
            e = malloc(sizeof *e);
        if (e || (kind != EV_MESSAGE && kind != EV_CONFIRM && kind != EV_EXITED))
            break;
        usleep(1000);
    }
    if (!e) {
        if (msg)
            broker_message_free(msg);
        return;
    }
    *e = (event){.kind = kind, .msg = msg, .cb = cb, .arg = arg, .flag = flag, .code = code,
                 .text = text ? strdup(text) : NULL};
    uv_mutex_lock(&s->lock);
    if (s->events_tail)
        s->events_tail->next = e;
    else
        s->events_head = e;
    s->events_tail = e;
    uv_mutex_unlock(&s->lock);
    uv_async_send(&s->events_async);
}

/* ---- tag ring (thread) --------------------------------------------------------------------- */

static tag_entry *tag_at(tag_ring *r, size_t i)
{
    return &r->entries[(r->head + i) % r->capacity];
}

static int tag_push(tag_ring *r, uint64_t tag)
{
    if (r->count == r->capacity) {
        size_t capacity = r->capacity ? r->capacity * 2 : 256;
        tag_entry *entries = malloc(capacity * sizeof *entries);
        if (!entries)
            return -1;
        for (size_t i = 0; i < r->count; i++)
            entries[i] = *tag_at(r, i);
        free(r->entries);
        r->entries = entries;
        r->capacity = capacity;
        r->head = 0;
    }
    r->count++;
    *tag_at(r, r->count - 1) = (tag_entry){.tag = tag, .state = TAG_OPEN};
    return 0;
}

/* The entry of tag (tags are pushed in increasing order), or NULL. */
static tag_entry *tag_find(tag_ring *r, uint64_t tag)
{
    size_t lo = 0, hi = r->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        tag_entry *e = tag_at(r, mid);
        if (e->tag == tag)
            return e;
        if (e->tag < tag)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void tag_clear(tag_ring *r)
{
    r->head = r->count = r->acked = 0;
}

/* Drops settled entries behind an unsettled head: a delivery that stays open for long (a slow
 * transaction) must not make the ring grow with everything settled after it. Order is kept. */
static void tag_compact(tag_ring *r)
{
    size_t kept = 0;
    for (size_t i = 0; i < r->count; i++) {
        tag_entry e = *tag_at(r, i);
        if (e.state != TAG_GONE)
            *tag_at(r, kept++) = e;
    }
    r->count = kept;
}

/* ---- broker thread ------------------------------------------------------------------------- */

static void thread_connection_lost(broker_session *s, const char *reason);

static void fail_held_publishes(broker_session *s)
{
    command *c = s->held_head;
    s->held_head = s->held_tail = NULL;
    while (c) {
        command *next = c->next;
        event_post(s, EV_CONFIRM, NULL, c->cb, c->arg, false, 0, NULL);
        command_release(s, c);
        c = next;
    }
}

/* Tears the connection down. polite: try channel/connection close first. */
static void drop_connection(broker_session *s, bool polite)
{
    if (s->conn) {
        if (polite)
            broker_close(s->conn);
        else
            amqp_destroy_connection(s->conn);
        s->conn = NULL;
    }
    s->thread_generation++;
    atomic_store(&s->generation, s->thread_generation);
    s->thread_consuming = false;
    s->thread_blocked = false;
    s->probe_sent_ms = 0;
    tag_clear(&s->tags);
    s->acks_behind_since_ms = s->acks_behind_due_ms = 0;
    s->head_acks_since_ms = s->head_acks_due_ms = 0;
    broker_assembly_reset(&s->assembly);
    fail_held_publishes(s);
    broker_confirms_fail_all(&s->confirms);
}

static void schedule_round(broker_session *s)
{
    broker_nodes_new_round(&s->nodes);
    uint64_t delay = backoff_delay_ms(&reconnect_backoff, s->failed_rounds, rng_next(&s->random));
    s->next_attempt_ms = monotonic_ms() + (int64_t)delay;
}

static void thread_connection_lost(broker_session *s, const char *reason)
{
    if (!s->conn)
        return;
    log_error(LOG_NO_CONTEXT, "RabbitMQ connection lost: %s", reason);
    drop_connection(s, false);
    event_post(s, EV_DOWN, NULL, NULL, NULL, false, 0, reason);
    s->failed_rounds = 0;
    schedule_round(s);
}

/* A basic.return that names none of the channel's pending publishes by the sequence header
 * (broker/confirms.h matches the others to their publish, whose confirm then fails). */
static void unmatched_return(void *ctx, const broker_return *ret)
{
    (void)ctx;
    (void)ret;
    log_error(LOG_NO_CONTEXT, "broker returned a message idemq did not publish; ignored");
}

/* msg (a delivery) is taken. */
static void message_complete(broker_session *s, broker_message *msg)
{
    if (tag_push(&s->tags, msg->delivery_tag) != 0) {
        /* Not tracked, it could never be acked: give it back now. */
        amqp_basic_nack(s->conn, BROKER_CHANNEL, msg->delivery_tag, 0, 1);
        broker_message_free(msg);
        return;
    }
    msg->generation = s->thread_generation;
    event_post(s, EV_MESSAGE, msg, NULL, NULL, false, 0, NULL);
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

static void apply_consuming(broker_session *s);
static void send_publish(broker_session *s, command *c);
static void consumer_tag(const broker_session *s, size_t index, char *buf, size_t len);

static void set_blocked(broker_session *s, bool blocked, const char *reason)
{
    if (s->thread_blocked == blocked)
        return;
    s->thread_blocked = blocked;
    if (blocked) {
        event_post(s, EV_BLOCKED, NULL, NULL, NULL, false, 0, reason);
        return;
    }
    event_post(s, EV_UNBLOCKED, NULL, NULL, NULL, false, 0, NULL);
    command *c = s->held_head;
    s->held_head = s->held_tail = NULL;
    while (c && s->conn && !s->thread_blocked) {
        command *next = c->next;
        send_publish(s, c);
        c = next;
    }
    if (c) { /* blocked again, or the connection went: keep or fail what is left */
        s->held_head = c;
        for (s->held_tail = c; s->held_tail->next; s->held_tail = s->held_tail->next)
            ;
        if (!s->conn)
            fail_held_publishes(s);
    }
}

/* A basic.cancel from the broker (we advertise consumer_cancel_notify): RabbitMQ ends a consumer
 * whose delivery stayed unacked past consumer_timeout (4.x quorum queues), whose queue was deleted,
 * or whose quorum member was removed. The connection and the other consumers carry on; the
 * consumer is subscribed again after this drain (resubscribe_cancelled). What it held goes back
 * to the queue (4.3 returns it without spending a delivery attempt, and ignores the acks that
 * still come for it): work already committed comes back as a duplicate and is settled by its
 * dedup row. */
static void broker_cancelled_consumer(broker_session *s, const amqp_basic_cancel_t *cancel)
{
    size_t index;
    char current[48];
    int tag_len = (int)cancel->consumer_tag.len;
    const char *tag = cancel->consumer_tag.bytes;
    if (consumer_index_of(s, cancel->consumer_tag, &index) == 0)
        consumer_tag(s, index, current, sizeof current);
    else
        current[0] = '\0';
    if (!s->thread_consuming || strlen(current) != (size_t)tag_len ||
        memcmp(current, tag, (size_t)tag_len) != 0) {
        /* Crossed our own basic.cancel (a pause), or a tag of an earlier subscription. */
        log_info(LOG_NO_CONTEXT, "RabbitMQ cancelled consumer %.*s, which idemq no longer uses",
                 tag_len, tag);
        return;
    }
    log_context ctx = {.queue = s->cfg->consumers[index].queue, .retries = -1};
    log_warn(&ctx,
             "RabbitMQ cancelled idemq's consumer on queue %s (a delivery stayed unacked past "
             "consumer_timeout or the queue's x-consumer-timeout, or the queue was deleted, or "
             "its quorum member removed): what it held goes back to the queue; subscribing again",
             s->cfg->consumers[index].queue);
    s->subscribed[index].cancelled_by_broker = true;
    event_post(s, EV_CONSUMER_CANCELLED, NULL, NULL, NULL, false, (int)index, NULL);
}

/* Subscribes again each consumer the broker cancelled. A queue that is gone fails the
 * basic.consume (404 closes the channel): the connection starts over, and the topology
 * declaration recreates the queue or says that it is missing. */
static void resubscribe_cancelled(broker_session *s)
{
    char reason[512], err[1024], tag[48];
    for (size_t i = 0; s->conn && i < s->cfg->consumer_count; i++) {
        if (!s->subscribed[i].cancelled_by_broker || !s->thread_consuming)
            continue;
        s->subscribed[i].cancelled_by_broker = false;
        s->subscribed[i].subscription = ++s->subscription;
        consumer_tag(s, i, tag, sizeof tag);
        const char *queue = s->cfg->consumers[i].queue;
        amqp_basic_consume(s->conn, BROKER_CHANNEL, amqp_cstring_bytes(queue),
                           amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(s->conn);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            snprintf(err, sizeof err,
                     "subscribing again to queue %s after RabbitMQ cancelled its consumer "
                     "failed (does the queue still exist?): %s",
                     queue, broker_describe_reply(reply, reason, sizeof reason));
            thread_connection_lost(s, err);
            return;
        }
        log_context ctx = {.queue = queue, .retries = -1};
        log_info(&ctx, "subscribed again to queue %s", queue);
    }
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
            thread_connection_lost(s, "delivery for an unknown consumer tag");
            return -1;
        }
        broker_assembly_begin_delivery(&s->assembly, d->delivery_tag, consumer_index,
                                       d->redelivered != 0);
        return 0;
    }
    case AMQP_CONNECTION_BLOCKED_METHOD: {
        const amqp_connection_blocked_t *b = m->decoded;
        snprintf(reason, sizeof reason, "%.*s", (int)b->reason.len, (const char *)b->reason.bytes);
        set_blocked(s, true, reason);
        return s->conn ? 0 : -1;
    }
    case AMQP_CONNECTION_UNBLOCKED_METHOD:
        set_blocked(s, false, NULL);
        return s->conn ? 0 : -1;
    case AMQP_BASIC_CANCEL_METHOD:
        broker_cancelled_consumer(s, m->decoded);
        return 0;
    case AMQP_CHANNEL_CLOSE_METHOD:
    case AMQP_CONNECTION_CLOSE_METHOD:
        thread_connection_lost(s, broker_describe_method(m, reason, sizeof reason));
        return -1;
    default: /* basic.qos-ok of the liveness probe, consume-ok/cancel-ok queued by an RPC */
        return 0;
    }
}

static int handle_frame(broker_session *s, const amqp_frame_t *frame)
{
    char why[128];
    if (frame->frame_type == AMQP_FRAME_METHOD &&
        frame->payload.method.id == AMQP_BASIC_RETURN_METHOD) {
        const amqp_basic_return_t *r = frame->payload.method.decoded;
        log_error(LOG_NO_CONTEXT,
                  "broker returned a retry/DLQ copy as unroutable (%u %.*s); "
                  "the original will be requeued — is the topology intact?",
                  r->reply_code, (int)r->reply_text.len, (const char *)r->reply_text.bytes);
    }
    /* Acks, nacks, returns and a return's content are the publisher's. */
    int taken = broker_confirms_frame(&s->confirms, frame, why, sizeof why);
    if (taken < 0) {
        thread_connection_lost(s, why);
        return -1;
    }
    if (taken)
        return s->conn ? 0 : -1;
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
            thread_connection_lost(s, reason);
            return -1;
        }
        if (msg)
            message_complete(s, msg); /* returns are assembled by broker/confirms */
        return s->conn ? 0 : -1;
    }
    default:
        return 0;
    }
}

/* Reads every frame rabbitmq-c can give without waiting (it also sends due heartbeats and
 * notices missed ones). */
static void drain(broker_session *s)
{
    struct timeval zero = {0, 0};
    bool received = false;
    while (s->conn) {
        amqp_frame_t frame;
        int rc = amqp_simple_wait_frame_noblock(s->conn, &frame, &zero);
        if (rc == AMQP_STATUS_TIMEOUT)
            break;
        if (rc != AMQP_STATUS_OK) {
            thread_connection_lost(s, broker_describe_status(rc));
            break;
        }
        received = true;
        if (handle_frame(s, &frame) != 0)
            break;
    }
    if (received) {
        atomic_store(&s->last_rx_ms, monotonic_ms());
        s->probe_sent_ms = 0;
    }
    if (s->conn)
        amqp_maybe_release_buffers(s->conn);
}

/* Each basic.consume gets a tag of its own: RabbitMQ 3.10 quorum queues close the channel
 * (541, rabbitmq-server#5927) when a consumer re-subscribes under the tag of a cancelled one
 * whose deliveries are still unacked — exactly what resuming after a pause with held messages
 * does. */
static void consumer_tag(const broker_session *s, size_t index, char *buf, size_t len)
{
    snprintf(buf, len, CONSUMER_TAG_PREFIX "%zu.%llu", index,
             (unsigned long long)s->subscribed[index].subscription);
}

/* Brings the broker in line with want_consuming. (Not with the blocked state: a blocked connection
 * is not read by the broker, so a basic.cancel would only wait for its RPC timeout; the prefetch
 * window stops new deliveries by itself, since the broker reads none of our acks meanwhile.) */
static void apply_consuming(broker_session *s)
{
    char reason[512], err[1024];
    bool want = s->want_consuming;
    if (want == s->thread_consuming || !s->conn)
        return;
    if (want)
        s->subscription++;
    for (size_t i = 0; i < s->cfg->consumer_count; i++) {
        char tag[48];
        if (want)
            s->subscribed[i].subscription = s->subscription;
        else if (s->subscribed[i].cancelled_by_broker) {
            s->subscribed[i].cancelled_by_broker = false; /* nothing left to cancel */
            continue;
        }
        s->subscribed[i].cancelled_by_broker = false;
        consumer_tag(s, i, tag, sizeof tag);
        if (want)
            amqp_basic_consume(s->conn, BROKER_CHANNEL,
                               amqp_cstring_bytes(s->cfg->consumers[i].queue),
                               amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
        else
            amqp_basic_cancel(s->conn, BROKER_CHANNEL, amqp_cstring_bytes(tag));
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(s->conn);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            snprintf(err, sizeof err, "%s on queue %s failed: %s",
                     want ? "basic.consume" : "basic.cancel", s->cfg->consumers[i].queue,
                     broker_describe_reply(reply, reason, sizeof reason));
            thread_connection_lost(s, err);
            return;
        }
    }
    s->thread_consuming = want;
    log_info(LOG_NO_CONTEXT, "%s consuming", want ? "started" : "stopped");
    event_post(s, EV_CONSUMING, NULL, NULL, NULL, want, 0, NULL);
}

/* The outcome of a publish (arg: its command) is known: hand it to the loop, which only tells
 * confirmed (acked, not returned) from everything else. */
static void forward_confirm(void *arg, broker_publish_outcome answer, const broker_return *ret)
{
    command *c = arg;
    broker_session *s = c->session;
    (void)ret;
    event_post(s, EV_CONFIRM, NULL, c->cb, c->arg, answer == BROKER_PUBLISH_CONFIRMED, 0, NULL);
    command_release(s, c);
}

/* The publish sequence header was written by the loop as a placeholder: the number is the
 * channel's, known only here. */
static void set_publish_seq(amqp_basic_properties_t *props, uint64_t seq)
{
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG))
        return;
    for (int i = 0; i < props->headers.num_entries; i++) {
        amqp_table_entry_t *e = &props->headers.entries[i];
        if (e->key.len == sizeof HEADER_PUBLISH_SEQ - 1 &&
            memcmp(e->key.bytes, HEADER_PUBLISH_SEQ, e->key.len) == 0) {
            e->value.kind = AMQP_FIELD_KIND_I64;
            e->value.value.i64 = (int64_t)seq;
        }
    }
}

/* c is taken: it ends in forward_confirm, or its callback is failed now. */
static void send_publish(broker_session *s, command *c)
{
    if (!s->conn || c->generation != s->thread_generation) {
        /* The delivery's connection is gone: nothing is published, the broker redelivers it. */
        event_post(s, EV_CONFIRM, NULL, c->cb, c->arg, false, 0, NULL);
        command_release(s, c);
        return;
    }
    if (s->thread_blocked) {
        /* Sending now would block the connection (and this thread) until the alarm clears. */
        c->next = NULL;
        if (s->held_tail)
            s->held_tail->next = c;
        else
            s->held_head = c;
        s->held_tail = c;
        return;
    }
    /* The number the channel gives this publish names it in a basic.return (the return key). */
    uint64_t seq = s->confirms.next_seq;
    set_publish_seq(&c->props, seq);
    broker_publish m = {.exchange = amqp_cstring_bytes(c->exchange),
                        .routing_key = amqp_cstring_bytes(c->routing_key),
                        .props = &c->props,
                        .body = c->body,
                        .key = (int64_t)seq};
    /* The write blocks while the broker does not read (a resource alarm, a hung broker): the loop
     * reads this to say so. */
    atomic_store(&s->sending_since_ms, monotonic_ms());
    int rc = broker_confirms_publish(&s->confirms, s->conn, &m, forward_confirm, c, &seq);
    atomic_store(&s->sending_since_ms, 0);
    if (rc == AMQP_STATUS_OK)
        return;
    /* Not published (forward_confirm will not run): the copy fails here. */
    event_post(s, EV_CONFIRM, NULL, c->cb, c->arg, false, 0, NULL);
    command_release(s, c);
    if (seq != 0) /* the frames may be half sent: the connection cannot go on */
        thread_connection_lost(s, broker_describe_status(rc));
}

static void settle_tag(broker_session *s, uint64_t generation, uint64_t tag, command_kind kind)
{
    if (!s->conn || generation != s->thread_generation)
        return; /* the broker requeued it with its connection */
    tag_entry *e = tag_find(&s->tags, tag);
    if (!e || e->state != TAG_OPEN)
        return;
    if (kind == CMD_ACK || kind == CMD_RELEASE) {
        e->state = kind == CMD_ACK ? TAG_ACKED : TAG_RELEASED; /* sent by flush_acks, coalesced */
        s->tags.acked += kind == CMD_ACK;
        return;
    }
    e->state = TAG_GONE;
    int rc = amqp_basic_nack(s->conn, BROKER_CHANNEL, tag, 0, kind == CMD_NACK);
    if (rc != AMQP_STATUS_OK)
        thread_connection_lost(s, broker_describe_status(rc));
}

/* Acked tags this many stop the broker's deliveries soon: they go out without waiting. */
static size_t half_prefetch_window(const broker_session *s)
{
    return s->cfg->prefetch ? (size_t)s->cfg->prefetch / 2 : SIZE_MAX;
}

/* Whether the acked tags behind the open head of the ring should go out on their own now
 * rather than wait for one basic.ack(multiple): when they have waited ACKS_BEHIND_WAIT_MS
 * without the head moving (a held delivery, a slow transaction), or they hold half of the
 * prefetch window (the broker would stop delivering), or the session stops. Otherwise the
 * thread's wake-up is set for their deadline. With four workers at batch 32, three batches out
 * of four commit behind another's still open: sent at once, three messages in four were acked
 * one frame each (30,194 single acks against 4,341 multiple in a bench run), each a write and
 * a command for the broker. */
static bool send_acks_behind_now(broker_session *s, bool stopping)
{
    size_t acked = s->tags.acked;
    int64_t now = monotonic_ms();
    if (acked && !s->acks_behind_since_ms)
        s->acks_behind_since_ms = now;
    int64_t due = s->acks_behind_since_ms + ACKS_BEHIND_WAIT_MS;
    size_t half_window = half_prefetch_window(s);
    bool now_or_never = !acked || stopping || acked >= half_window || now >= due;
    s->acks_behind_since_ms = now_or_never ? 0 : s->acks_behind_since_ms;
    s->acks_behind_due_ms = now_or_never ? 0 : due;
    return acked && now_or_never;
}

/* Whether the settled tags at the head of the ring go out now: at once unless the first is an
 * ack, which waits up to ACKS_GATHER_MS for the acks after it (less when they fill half the
 * prefetch window, none when the session stops); otherwise the thread's wake-up is set for it. */
static bool head_settlements_due(broker_session *s, bool stopping)
{
    tag_ring *r = &s->tags;
    if (!r->count || tag_at(r, 0)->state != TAG_ACKED) {
        s->head_acks_since_ms = s->head_acks_due_ms = 0;
        return true;
    }
    int64_t now = monotonic_ms();
    if (!s->head_acks_since_ms)
        s->head_acks_since_ms = now;
    size_t half_window = half_prefetch_window(s);
    if (stopping || r->acked >= half_window || now - s->head_acks_since_ms >= ACKS_GATHER_MS) {
        s->head_acks_since_ms = s->head_acks_due_ms = 0;
        return true;
    }
    s->head_acks_due_ms = s->head_acks_since_ms + ACKS_GATHER_MS;
    return false;
}

/* The settled tags at the head of the ring, one command per run: basic.ack(multiple) for acked
 * ones, basic.nack(multiple, requeue) for released ones (tags sent on their own join either run:
 * the broker skips what is settled). Then single acks for acked tags behind an unsettled one,
 * when send_acks_behind_now says (a held or still-running delivery must not hold the others'
 * acks back for long); released ones there wait. Few commands matter: RabbitMQ forwards a
 * channel's settlements to a quorum queue about 32 at a time, and a channel that closes drops
 * the rest (its deliveries then come back as returned, which 4.3 counts toward the delivery
 * limit). */
static void flush_acks(broker_session *s, bool stopping)
{
    tag_ring *r = &s->tags;
    if (!head_settlements_due(s, stopping))
        return; /* what is behind the head is decided when the head goes */
    while (r->count && tag_at(r, 0)->state != TAG_OPEN && s->conn) {
        tag_state run = TAG_GONE;
        uint64_t last = 0;
        while (r->count) {
            tag_entry *e = tag_at(r, 0);
            if (e->state == TAG_OPEN || (run != TAG_GONE && e->state != TAG_GONE &&
                                         e->state != run))
                break;
            if (e->state != TAG_GONE) {
                run = e->state;
                last = e->tag;
            }
            r->acked -= e->state == TAG_ACKED;
            r->head = (r->head + 1) % r->capacity;
            r->count--;
            s->acks_behind_since_ms = 0; /* the head moved: what is behind it waits afresh */
        }
        int rc = AMQP_STATUS_OK;
        if (run == TAG_ACKED)
            rc = amqp_basic_ack(s->conn, BROKER_CHANNEL, last, 1);
        else if (run == TAG_RELEASED)
            rc = amqp_basic_nack(s->conn, BROKER_CHANNEL, last, 1, 1);
        if (rc != AMQP_STATUS_OK) {
            thread_connection_lost(s, "cannot send basic.ack");
            return;
        }
    }
    if (!s->conn || !send_acks_behind_now(s, stopping))
        return;
    size_t gone = 0;
    for (size_t i = 0; i < r->count && s->conn; i++) {
        tag_entry *e = tag_at(r, i);
        if (e->state == TAG_GONE)
            gone++;
        if (e->state != TAG_ACKED)
            continue;
        e->state = TAG_GONE;
        r->acked--;
        gone++;
        int rc = amqp_basic_ack(s->conn, BROKER_CHANNEL, e->tag, 0);
        if (rc != AMQP_STATUS_OK)
            thread_connection_lost(s, broker_describe_status(rc));
    }
    if (s->conn && gone > 1024 && gone * 2 > r->count)
        tag_compact(r);
}

static void run_commands(broker_session *s)
{
    command *c = commands_take(s);
    while (c) {
        command *next = c->next;
        switch (c->kind) {
        case CMD_ACK:
        case CMD_NACK:
        case CMD_RELEASE:
        case CMD_REJECT:
            settle_tag(s, c->generation, c->delivery_tag, c->kind);
            command_release(s, c);
            break;
        case CMD_PUBLISH:
            send_publish(s, c); /* takes c */
            break;
        case CMD_CONSUME:
            s->want_consuming = c->consuming;
            command_release(s, c);
            apply_consuming(s);
            break;
        case CMD_ABANDON_HELD:
            fail_held_publishes(s);
            command_release(s, c);
            break;
        case CMD_STOP:
            s->stop = true;
            command_release(s, c);
            break;
        }
        c = next;
    }
    if (s->conn)
        flush_acks(s, s->stop);
}

/* The liveness probe: basic.qos with the prefetch already in force changes nothing, needs no
 * permission and is answered at once by any broker that runs. */
static void probe_liveness(broker_session *s)
{
    int64_t now = monotonic_ms();
    if (!s->conn || s->probe_sent_ms || now - atomic_load(&s->last_rx_ms) < PROBE_AFTER_MS)
        return;
    amqp_basic_qos_t qos = {.prefetch_count = (uint16_t)s->cfg->prefetch};
    if (amqp_send_method(s->conn, BROKER_CHANNEL, AMQP_BASIC_QOS_METHOD, &qos) != AMQP_STATUS_OK) {
        thread_connection_lost(s, "cannot send the liveness probe");
        return;
    }
    s->probe_sent_ms = now;
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

/* Connects to url (borrowed), declares, starts consuming. Returns 0, BROKER_E_REFUSED for
 * configuration conflicts, BROKER_E_FAILED otherwise; err says why. */
/* Publishes (fd >= 0) or withdraws (-1) the socket of the connection being set up, so that
 * broker_session_free can cut a declaration short: without a majority, a RabbitMQ 4.x cluster
 * makes each one wait 30 s (the RPC timeout), and a shutdown must not wait for it. Withdrawn
 * before the connection is closed, so the loop never touches a closed (or reused) descriptor. */
static void set_setup_fd(broker_session *s, int fd)
{
    uv_mutex_lock(&s->lock);
    s->setup_fd = fd;
    if (fd >= 0 && s->abort_setup)
        shutdown(fd, SHUT_RDWR); /* the stop came while the connection was being opened */
    uv_mutex_unlock(&s->lock);
}

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
        .password = s->cfg->amqp_password,
        .session_capabilities = 1,
    };
    err[0] = '\0';
    int rc = broker_open(&opts, &s->conn, err, err_len);
    if (rc != 0) {
        s->conn = NULL;
        return rc;
    }
    set_setup_fd(s, amqp_get_sockfd(s->conn));
    /* /readyz says where a connect that takes long is: a cluster without a majority makes each
     * declaration wait 30 s. */
    char node[600], text[700];
    snprintf(text, sizeof text, "connected to RabbitMQ %s, declaring the topology",
             node_name(s, node, sizeof node));
    event_post(s, EV_DECLARING, NULL, NULL, NULL, false, 0, text);
    if (tls_info[0])
        log_info(LOG_NO_CONTEXT, "RabbitMQ connection uses TLS: %s", tls_info);
    for (size_t i = 0; i < s->cfg->consumer_count; i++) {
        const config_consumer *c = &s->cfg->consumers[i];
        log_context ctx = {.queue = c->queue, .retries = -1};
        rc = topology_declare(s->conn, c, err, err_len);
        if (rc != 0) {
            set_setup_fd(s, -1);
            broker_close(s->conn);
            s->conn = NULL;
            return rc == BROKER_E_FAILED ? BROKER_E_FAILED : BROKER_E_REFUSED;
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
            set_setup_fd(s, -1);
            broker_close(s->conn);
            s->conn = NULL;
            return BROKER_E_FAILED;
        }
        err[0] = '\0';
    }
    set_setup_fd(s, -1);
    atomic_store(&s->frame_max, (uint64_t)amqp_get_frame_max(s->conn));
    atomic_store(&s->last_rx_ms, monotonic_ms());
    s->probe_sent_ms = 0;
    event_post(s, EV_UP, NULL, NULL, NULL, false, 0, NULL);
    apply_consuming(s);
    return s->conn ? 0 : BROKER_E_FAILED;
}

/* One connect attempt to the next node of the round; schedules the next attempt on failure. */
static void try_connect(broker_session *s)
{
    char err[TOPOLOGY_WARNING_MAX + 1024], node[600], text[sizeof err + 700];
    const char *url = broker_nodes_next(&s->nodes);
    if (!url) {
        schedule_round(s);
        return;
    }
    s->reconnect_attempt++;
    int rc = connect_and_setup(s, url, err, sizeof err);
    if (rc == 0) {
        if (s->ever_connected)
            log_info(LOG_NO_CONTEXT, "reconnected to RabbitMQ %s after %u attempt(s)",
                     node_name(s, node, sizeof node), s->reconnect_attempt);
        else
            log_info(LOG_NO_CONTEXT, "connected to RabbitMQ %s", node_name(s, node, sizeof node));
        s->ever_connected = true;
        s->reconnect_attempt = 0;
        s->failed_rounds = 0;
        return;
    }
    snprintf(text, sizeof text, "cannot connect to RabbitMQ %s: %s",
             node_name(s, node, sizeof node), err[0] ? err : "unknown error");
    if (rc == BROKER_E_REFUSED && !s->ever_connected) {
        /* Before anything worked, a refusal is the configuration's: waiting will not fix it. */
        log_error(LOG_NO_CONTEXT, "%s", text);
        event_post(s, EV_FATAL, NULL, NULL, NULL, false, rc, text);
        s->next_attempt_ms = INT64_MAX;
        return;
    }
    event_post(s, EV_CONNECT_FAILED, NULL, NULL, NULL, false, rc, text);
    if (broker_nodes_round_over(&s->nodes)) {
        s->failed_rounds++;
        schedule_round(s);
        log_warn(LOG_NO_CONTEXT, "%s (attempt %u); next attempt in %lld ms", text,
                 s->reconnect_attempt, (long long)(s->next_attempt_ms - monotonic_ms()));
    } else {
        /* The next node at once: a node that is down costs no backoff while another is up. */
        log_warn(LOG_NO_CONTEXT, "%s (attempt %u); trying the next node", text,
                 s->reconnect_attempt);
        s->next_attempt_ms = monotonic_ms();
    }
}

/* Sleeps until the socket is readable, the loop posts a command, or timeout_ms pass. */
static void wait_for_work(broker_session *s, int timeout_ms)
{
    struct pollfd fds[2] = {{.fd = s->wake_fd, .events = POLLIN}};
    nfds_t n = 1;
    int64_t dues[] = {s->acks_behind_due_ms, s->head_acks_due_ms};
    for (size_t i = 0; i < sizeof dues / sizeof dues[0]; i++) {
        if (!dues[i])
            continue;
        int64_t left = dues[i] - monotonic_ms();
        if (left < timeout_ms)
            timeout_ms = left > 0 ? (int)left : 0;
    }
    if (s->conn) {
        if (amqp_frames_enqueued(s->conn) || amqp_data_in_buffer(s->conn))
            timeout_ms = 0;
        fds[1] = (struct pollfd){.fd = amqp_get_sockfd(s->conn), .events = POLLIN};
        n = 2;
    }
    if (poll(fds, n, timeout_ms) > 0 && (fds[0].revents & POLLIN)) {
        uint64_t count;
        ssize_t ignored = read(s->wake_fd, &count, sizeof count);
        (void)ignored;
    }
}

static void thread_main(void *arg)
{
    broker_session *s = arg;
    s->next_attempt_ms = monotonic_ms();
    broker_nodes_new_round(&s->nodes);
    while (!s->stop) {
        if (!s->conn) {
            run_commands(s);
            if (s->stop)
                break;
            int64_t wait = s->next_attempt_ms - monotonic_ms();
            if (wait <= 0) {
                try_connect(s);
                continue;
            }
            wait_for_work(s, wait > THREAD_TICK_MS ? THREAD_TICK_MS : (int)wait);
            continue;
        }
        drain(s);
        resubscribe_cancelled(s);
        run_commands(s);
        drain(s); /* what an RPC above queued */
        probe_liveness(s);
        if (s->conn && !s->stop)
            wait_for_work(s, THREAD_TICK_MS);
    }
    fail_held_publishes(s);
    if (s->conn) {
        /* Every delivery still unsettled (given back at shutdown, or never handed to the loop)
         * goes back with one basic.nack(multiple, requeue) before the channel closes: RabbitMQ
         * 4.3 counts what a closing channel returns toward a quorum queue's delivery limit, and
         * not a nack; and one command rather than one per delivery, because the broker forwards
         * a channel's settlements to a quorum queue about 32 at a time and drops the rest when
         * the channel closes. */
        if (amqp_basic_nack(s->conn, BROKER_CHANNEL, 0, 1, 1) != AMQP_STATUS_OK)
            log_warn(LOG_NO_CONTEXT, "cannot give the unsettled deliveries back before closing: "
                                     "the broker returns them with the channel");
        broker_close(s->conn);
        s->conn = NULL;
    }
    broker_assembly_reset(&s->assembly);
    broker_confirms_fail_all(&s->confirms);
    event_post(s, EV_EXITED, NULL, NULL, NULL, false, 0, NULL);
}

/* ---- loop side ----------------------------------------------------------------------------- */

static void on_async_closed(uv_handle_t *handle)
{
    broker_session *s = handle->data;
    /* Posted after the thread took its last batch: nothing to carry out any more. */
    for (command *c = s->commands_head; c;) {
        command *next = c->next;
        if (c->pool_ready)
            empty_amqp_pool(&c->pool);
        free(c->exchange);
        free(c->routing_key);
        free(c);
        c = next;
    }
    for (command *c = s->free_commands; c;) {
        command *next = c->next;
        free(c);
        c = next;
    }
    for (event *e = s->free_events; e;) {
        event *next = e->next;
        free(e);
        e = next;
    }
    free(s->tags.entries);
    free(s->subscribed);
    close(s->wake_fd);
    uv_mutex_destroy(&s->lock);
    free(s);
}

static void set_text(char *buf, size_t len, const char *text)
{
    snprintf(buf, len, "%s", text ? text : "out of memory");
}

static void handle_event(broker_session *s, event *e)
{
    switch (e->kind) {
    case EV_MESSAGE:
        if (s->freeing)
            broker_message_free(e->msg); /* unacked: the broker requeues it with the connection */
        else
            s->cb->on_message(s->cb->ctx, e->msg);
        break;
    case EV_CONFIRM:
        s->unconfirmed--;
        e->cb(e->arg, e->flag);
        break;
    case EV_UP:
        s->connected = true;
        s->last_error[0] = '\0';
        if (!s->freeing && s->cb->on_up)
            s->cb->on_up(s->cb->ctx);
        break;
    case EV_DOWN: {
        bool was_blocked = s->blocked;
        s->connected = s->consuming = s->blocked = false;
        set_text(s->last_error, sizeof s->last_error, e->text);
        if (was_blocked && !s->freeing && s->cb->on_blocked)
            s->cb->on_blocked(s->cb->ctx, NULL); /* a new connection starts unblocked */
        if (!s->freeing && s->cb->on_down)
            s->cb->on_down(s->cb->ctx, s->last_error);
        break;
    }
    case EV_CONNECT_FAILED:
    case EV_DECLARING:
        set_text(s->last_error, sizeof s->last_error, e->text);
        break;
    case EV_BLOCKED:
        s->blocked = true;
        set_text(s->blocked_reason, sizeof s->blocked_reason, e->text);
        if (!s->freeing && s->cb->on_blocked)
            s->cb->on_blocked(s->cb->ctx, s->blocked_reason);
        break;
    case EV_UNBLOCKED:
        s->blocked = false;
        if (!s->freeing && s->cb->on_blocked)
            s->cb->on_blocked(s->cb->ctx, NULL);
        break;
    case EV_CONSUMING:
        s->consuming = e->flag;
        if (!s->freeing && s->cb->on_consuming)
            s->cb->on_consuming(s->cb->ctx, e->flag);
        break;
    case EV_CONSUMER_CANCELLED:
        if (!s->freeing && s->cb->on_consumer_cancelled)
            s->cb->on_consumer_cancelled(s->cb->ctx, (size_t)e->code);
        break;
    case EV_FATAL:
        s->fatal = true;
        set_text(s->last_error, sizeof s->last_error, e->text);
        if (!s->freeing && s->cb->on_fatal)
            s->cb->on_fatal(s->cb->ctx, e->code, s->last_error);
        break;
    case EV_EXITED:
        uv_thread_join(&s->thread);
        s->thread_started = false;
        uv_close((uv_handle_t *)&s->events_async, on_async_closed);
        break;
    }
}

static void on_events(uv_async_t *async)
{
    broker_session *s = async->data;
    uv_mutex_lock(&s->lock);
    event *e = s->events_head;
    s->events_head = s->events_tail = NULL;
    uv_mutex_unlock(&s->lock);
    while (e) {
        event *next = e->next;
        bool exited = e->kind == EV_EXITED;
        handle_event(s, e);
        free(e->text);
        if (exited) {
            free(e); /* the session is being released: no free list any more */
            for (e = next; e; e = next) { /* nothing follows EV_EXITED; be safe */
                next = e->next;
                free(e->text);
                free(e);
            }
            return;
        }
        uv_mutex_lock(&s->lock);
        e->next = s->free_events;
        s->free_events = e;
        uv_mutex_unlock(&s->lock);
        e = next;
    }
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
    s->setup_fd = -1;
    s->thread_generation = 1;
    atomic_init(&s->generation, 1);
    atomic_init(&s->frame_max, AMQP_DEFAULT_FRAME_SIZE);
    atomic_init(&s->last_rx_ms, monotonic_ms());
    snprintf(s->last_error, sizeof s->last_error, "connecting to RabbitMQ");
    s->subscribed = calloc(cfg->consumer_count, sizeof *s->subscribed);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->subscribed || s->wake_fd < 0 || uv_mutex_init(&s->lock) != 0) {
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        free(s->subscribed);
        free(s);
        return NULL;
    }
    if (uv_async_init(loop, &s->events_async, on_events) != 0) {
        uv_mutex_destroy(&s->lock);
        close(s->wake_fd);
        free(s->subscribed);
        free(s);
        return NULL;
    }
    s->events_async.data = s;
    rng_init(&s->random, (uint64_t)(uintptr_t)s);
    broker_nodes_init(&s->nodes, cfg->amqp_urls, cfg->amqp_url_count, &s->random);
    broker_assembly_init(&s->assembly);
    broker_confirms_init(&s->confirms);
    broker_confirms_set_return_key(&s->confirms, HEADER_PUBLISH_SEQ);
    broker_confirms_on_unmatched_return(&s->confirms, unmatched_return, s);
    return s;
}

int broker_session_start(broker_session *s, char *err, size_t err_len)
{
    int rc = uv_thread_create(&s->thread, thread_main, s);
    if (rc != 0) {
        snprintf(err, err_len, "cannot start the broker thread: %s", uv_strerror(rc));
        return BROKER_E_FAILED;
    }
    s->thread_started = true;
    return 0;
}

static void post_settle(broker_session *s, const broker_message *msg, command_kind kind)
{
    if (s->freeing || msg->generation != atomic_load(&s->generation))
        return; /* its connection is gone: the broker requeued it already */
    command *c = command_get(s);
    if (!c)
        return; /* unacked: redelivered at the next reconnect, and the dedup row settles it */
    c->kind = kind;
    c->generation = msg->generation;
    c->delivery_tag = msg->delivery_tag;
    command_post(s, c);
}

void broker_ack(broker_session *s, const broker_message *msg)
{
    post_settle(s, msg, CMD_ACK);
}

void broker_nack_requeue(broker_session *s, const broker_message *msg)
{
    post_settle(s, msg, CMD_NACK);
}

void broker_release(broker_session *s, const broker_message *msg)
{
    post_settle(s, msg, CMD_RELEASE);
}

void broker_reject(broker_session *s, const broker_message *msg)
{
    post_settle(s, msg, CMD_REJECT);
}

int broker_publish_copy(broker_session *s, const broker_message *msg, const char *exchange,
                        const char *routing_key, copy_headers *headers, broker_confirm_cb cb,
                        void *arg)
{
    if (msg->generation != atomic_load(&s->generation))
        return BROKER_E_STALE; /* also when not connected: the generation moved on */
    if (s->freeing || !s->thread_started)
        return BROKER_E_FAILED;
    command *c = command_get(s);
    if (!c)
        return BROKER_E_FAILED;
    c->kind = CMD_PUBLISH;
    c->session = s;
    c->generation = msg->generation;
    c->cb = cb;
    c->arg = arg;
    c->exchange = strdup(exchange);
    c->routing_key = strdup(routing_key);
    init_amqp_pool(&c->pool, 1024);
    c->pool_ready = true;
    headers->publish_seq = 0; /* the broker thread writes the channel's number */
    int rc = c->exchange && c->routing_key
                 ? message_copy_properties(msg, headers, (size_t)atomic_load(&s->frame_max),
                                           &c->pool, &c->props)
                 : BROKER_E_FAILED;
    /* message_copy_properties borrows the caller's strings (the error text, the expiration) for
     * the call only, and the broker thread sends later: the command owns a deep copy. */
    if (rc == 0)
        rc = message_properties_clone(&c->props, &c->pool, &c->props);
    if (rc != 0) {
        command_release(s, c);
        return rc == MESSAGE_E_TOO_LARGE ? BROKER_E_TOO_LARGE : BROKER_E_FAILED;
    }
    c->body = (amqp_bytes_t){.len = msg->body_len, .bytes = msg->body};
    s->unconfirmed++;
    command_post(s, c);
    return 0;
}

static void post_simple(broker_session *s, command_kind kind, bool consuming)
{
    command *c = command_get(s);
    while (!c) { /* a few bytes: a stop or a pause must not be lost */
        usleep(1000);
        c = command_get(s);
    }
    c->kind = kind;
    c->consuming = consuming;
    command_post(s, c);
}

void broker_set_consuming(broker_session *s, bool consuming)
{
    post_simple(s, CMD_CONSUME, consuming);
}

void broker_abandon_held_publishes(broker_session *s)
{
    post_simple(s, CMD_ABANDON_HELD, false);
}

bool broker_is_connected(const broker_session *s)
{
    return s->connected;
}

bool broker_is_consuming(const broker_session *s)
{
    return s->consuming;
}

size_t broker_unconfirmed(const broker_session *s)
{
    return s->unconfirmed;
}

bool broker_is_blocked(const broker_session *s, char *reason, size_t reason_len)
{
    if (s->blocked && reason && reason_len)
        snprintf(reason, reason_len, "%s", s->blocked_reason);
    return s->blocked;
}

bool broker_describe_unready(const broker_session *s, char *buf, size_t len)
{
    if (!s->connected) {
        snprintf(buf, len, "not connected to RabbitMQ: %s", s->last_error);
        return true;
    }
    if (s->blocked) {
        snprintf(buf, len, "RabbitMQ blocks the connection (resource alarm: %s); no new "
                 "deliveries until it clears", s->blocked_reason);
        return true;
    }
    /* broker_session is borrowed const, the atomics are only read. */
    broker_session *rs = (broker_session *)s;
    int64_t now = monotonic_ms(), sending_since = atomic_load(&rs->sending_since_ms);
    if (sending_since && now - sending_since > 1000) {
        snprintf(buf, len, "RabbitMQ has not read a publish for %lld s (a resource alarm blocks "
                 "the connection, or the broker hangs)", (long long)((now - sending_since) / 1000));
        return true;
    }
    int64_t quiet = now - atomic_load(&rs->last_rx_ms);
    if (quiet > SILENT_AFTER_MS) {
        snprintf(buf, len, "RabbitMQ has not answered for %lld s (liveness probe unanswered)",
                 (long long)(quiet / 1000));
        return true;
    }
    return false;
}

void broker_session_free(broker_session *s)
{
    if (!s)
        return;
    s->freeing = true;
    if (!s->thread_started) {
        uv_close((uv_handle_t *)&s->events_async, on_async_closed);
        return;
    }
    post_simple(s, CMD_STOP, false);
    /* A connect stuck declaring its topology reads the stop only once that returns: end it now
     * (its RPC fails at once and the thread goes on to the stop). */
    uv_mutex_lock(&s->lock);
    s->abort_setup = true;
    if (s->setup_fd >= 0)
        shutdown(s->setup_fd, SHUT_RDWR);
    uv_mutex_unlock(&s->lock);
}
