/*
 * dlq — `idemq dlq list|replay|purge`: inspect and re-deliver dead letters.
 *
 * Reading the DLQ spends nothing. RabbitMQ 4.x counts every return of an unacked message
 * (nack/reject with requeue, a channel closed with unacked messages) against a quorum queue's
 * delivery limit, 20 by default, and drops the message past it; so a listing that fetched without
 * acking and let the channel close return everything would lose each dead letter after ~20
 * listings. Instead, one pass walks the messages that were in the DLQ when the command started
 * (the first basic.get-ok's message_count + 1) and settles each one: KEEP republishes the
 * identical message (body, properties, headers; minus the broker's x-delivery-count) to the
 * default exchange with routing key Q.dlq; REPLAY publishes it to the work queue (routing key Q)
 * with idemq's and dead-lettering's headers removed, so its retry count starts again. Both are
 * mandatory publishes in confirm mode, and the original is acked only after its copy was
 * confirmed. Copies join the tail in order and the pass visits the whole snapshot (also with
 * --limit, which only limits what is printed or replayed), so after a pass the DLQ holds the
 * same messages in the same order. This needs no policy and no broker version, and also works on
 * a DLQ declared without an unlimited delivery limit. A crash between a confirm and its ack
 * leaves that message twice in the DLQ (at-least-once: never lost); an unconfirmed copy leaves
 * its original unacked, and it returns to the DLQ when the channel closes (spending one attempt).
 *
 * Pipelined in chunks: up to CHUNK_MAX basic.gets, then their publishes, then all their confirms,
 * then the acks. Gets and confirms never overlap, because rabbitmq-c's basic.get RPC would queue
 * a confirm ahead of the message's content frames. Chunks are small for a quorum-queue reason
 * given at CHUNK_MAX. Blocking, single-threaded: a one-shot tool.
 *
 * Copies of one failure: a DLQ copy can be confirmed and its original's ack lost with the
 * connection; the redelivery then makes a second copy with the same idemq-failure-id
 * (broker/message.h). Messages with the same id and the same body are one entry with a count in
 * the listing, and a replay publishes the first of them and removes the others: each of those is
 * acked only once the first one's replay was confirmed (else it stays, unacked, and returns).
 * Messages without the header (from an older idemq) are never taken for copies.
 *
 * Frames: the pass reads with rabbitmq-c's limit raised by MESSAGE_BROKER_HEADROOM over the
 * negotiated frame_max, so that a dead letter an older idemq wrote right up to frame_max, which
 * the broker's x-delivery-count then pushed over it, can still be listed and replayed instead of
 * ending the pass with "invalid AMQP data". Publishing splits bodies by the negotiated frame_max
 * itself (broker_publish.frame_max) and never sends a header frame over it.
 *
 * Publishes, confirms and returns go through broker/confirms.h like the session's and the relay's:
 * the copies carry no header of idemq's to name them (a kept dead letter is republished
 * unchanged), so a return is matched by its routing key in publish order.
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "broker/confirms.h"
#include "broker/connection.h"
#include "broker/message.h"
#include "broker/nodes.h"
#include "broker/topology.h"
#include "envelope/envelope.h"
#include "util/fnv1a.h"
#include "util/wallclock.h"

#define CONFIRM_TIMEOUT_S 30

typedef struct dead_letter {
    char biz_key[ENVELOPE_BIZ_KEY_MAX * 2 + 64];
    char error_class[64];
    char error[HEADER_ERROR_MAX + 1];
    int64_t retries;
    int64_t first_failed_at_ms;
    /* The producer's identifiers: what tells keyless dead letters apart. message_id is the
     * envelope's, else the AMQP property; "" when absent. */
    char message_id[MESSAGE_TRACE_ID_MAX + 1];
    message_trace trace;
    char failure_id[MESSAGE_FAILURE_ID_MAX + 1]; /* "" when the header is absent */
    uint64_t body_hash;                          /* with the id: copies have the same body */
} dead_letter;

static const config_consumer *find_consumer(const config *cfg, const char *queue)
{
    if (!queue)
        return cfg->consumer_count == 1 ? &cfg->consumers[0] : NULL;
    for (size_t i = 0; i < cfg->consumer_count; i++)
        if (strcmp(cfg->consumers[i].queue, queue) == 0)
            return &cfg->consumers[i];
    return NULL;
}

static void header_text(const amqp_basic_properties_t *props, const char *name, char *buf,
                        size_t len)
{
    amqp_bytes_t value;
    if (message_header_bytes(props, name, &value))
        snprintf(buf, len, "%.*s", (int)value.len, (const char *)value.bytes);
    else
        snprintf(buf, len, "-");
}

static void describe(const amqp_message_t *m, const config *cfg, dead_letter *out)
{
    memset(out, 0, sizeof *out);
    char content_type[128] = "";
    if (m->properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
        snprintf(content_type, sizeof content_type, "%.*s", (int)m->properties.content_type.len,
                 (const char *)m->properties.content_type.bytes);
    envelope env;
    char reason[256];
    envelope_limits limits = {.max_body = cfg->max_body};
    int rc = envelope_decode(m->body.bytes, m->body.len, content_type, &limits, &env, reason,
                             sizeof reason);
    message_trace_read(&m->properties, &out->trace);
    snprintf(out->message_id, sizeof out->message_id, "%s", out->trace.message_id);
    if (rc == ENVELOPE_OK) {
        snprintf(out->biz_key, sizeof out->biz_key, "%s", env.biz_key);
        if (env.message_id && env.message_id[0])
            snprintf(out->message_id, sizeof out->message_id, "%s", env.message_id);
        envelope_close(&env);
    } else {
        snprintf(out->biz_key, sizeof out->biz_key, "(no key: %s)", envelope_error_name(rc));
    }
    header_text(&m->properties, HEADER_ERROR_CLASS, out->error_class, sizeof out->error_class);
    header_text(&m->properties, HEADER_ERROR, out->error, sizeof out->error);
    if (!message_header_int(&m->properties, HEADER_RETRIES, &out->retries))
        out->retries = 0;
    if (!message_header_int(&m->properties, HEADER_FIRST_FAILED_AT, &out->first_failed_at_ms))
        out->first_failed_at_ms = 0;
    amqp_bytes_t id;
    if (message_header_bytes(&m->properties, HEADER_FAILURE_ID, &id) && id.len > 0 &&
        id.len <= MESSAGE_FAILURE_ID_MAX)
        snprintf(out->failure_id, sizeof out->failure_id, "%.*s", (int)id.len,
                 (const char *)id.bytes);
    out->body_hash = fnv1a64(m->body.bytes, m->body.len);
}

static void format_time(int64_t ms, char *buf, size_t len)
{
    if (ms <= 0) {
        snprintf(buf, len, "-");
        return;
    }
    time_t seconds = (time_t)(ms / 1000);
    struct tm utc;
    gmtime_r(&seconds, &utc);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

/* Seconds since the message first failed; 0 when the header is missing. */
static int64_t age_seconds(const dead_letter *d)
{
    return d->first_failed_at_ms ? (wallclock_ms() - d->first_failed_at_ms) / 1000 : 0;
}

/* The copies field is added when the pass is over (print_result). */
static json_t *dead_letter_json(const dead_letter *d)
{
    char when[40];
    format_time(d->first_failed_at_ms, when, sizeof when);
    return json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:s?, s:s?, s:s?, s:s?}", "biz_key",
                     d->biz_key, "error_class", d->error_class, "error", d->error, "retries",
                     (json_int_t)d->retries, "first_failed_at", when, "age_seconds",
                     (json_int_t)age_seconds(d), "message_id",
                     d->message_id[0] ? d->message_id : NULL, "correlation_id",
                     d->trace.correlation_id[0] ? d->trace.correlation_id : NULL, "traceparent",
                     d->trace.traceparent[0] ? d->trace.traceparent : NULL, "failure_id",
                     d->failure_id[0] ? d->failure_id : NULL);
}

/* The text of one entry, without the copies line; returned owned (NULL: out of memory). */
static char *dead_letter_text(const dead_letter *d)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    char when[40];
    format_time(d->first_failed_at_ms, when, sizeof when);
    fprintf(f, "%-40s %-18s retries=%-3" PRId64 " first_failed=%s age=%llds\n    reason: %s\n",
            d->biz_key, d->error_class, d->retries, when, (long long)age_seconds(d), d->error);
    if (d->message_id[0] || d->trace.correlation_id[0] || d->trace.traceparent[0])
        fprintf(f, "    ids:%s%s%s%s%s%s\n", d->message_id[0] ? " message_id=" : "",
                d->message_id, d->trace.correlation_id[0] ? " correlation_id=" : "",
                d->trace.correlation_id, d->trace.traceparent[0] ? " traceparent=" : "",
                d->trace.traceparent);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

static int purge(amqp_connection_state_t conn, const char *dlq, const dlq_options *opts)
{
    char reason[512];
    amqp_queue_purge_ok_t *ok = amqp_queue_purge(conn, BROKER_CHANNEL, amqp_cstring_bytes(dlq));
    if (!ok) {
        fprintf(stderr, "idemq dlq purge: %s\n",
                broker_describe_reply(amqp_get_rpc_reply(conn), reason, sizeof reason));
        return 1;
    }
    if (opts->json)
        printf("{\"queue\":\"%s\",\"purged\":%u}\n", dlq, ok->message_count);
    else
        printf("purged %u message(s) from %s\n", ok->message_count, dlq);
    return 0;
}

/* One message of the pass, from its basic.get to its ack. DROP: a copy of a failure whose first
 * copy this pass replays; it is acked, without a copy of its own, once that replay is confirmed. */
typedef enum visit_action { VISIT_KEEP, VISIT_REPLAY, VISIT_DROP } visit_action;

typedef struct visit {
    uint64_t delivery_tag; /* of the basic.get-ok */
    uint64_t publish_seq;  /* of its copy; 0: not published */
    struct pass *pass;     /* while its copy is owed a confirm (borrowed) */
    visit_action action;
    bool shown;            /* printed (list: within --limit; replay: selected) */
    bool confirmed;        /* the copy was confirmed and not returned (DROP: may be acked) */
    bool settled;          /* confirmed, or failed with reason */
    size_t group;          /* index in pass.groups; SIZE_MAX: no idemq-failure-id */
    size_t entry;          /* index in pass.entries when shown */
    char reason[TOPOLOGY_NAME_MAX + 64]; /* why the copy failed */
    amqp_message_t message;
    dead_letter d;
} visit;

/* One entry of the output: a dead letter and how many copies of it the pass met. */
typedef struct entry {
    json_t *json; /* --json */
    char *text;   /* otherwise; owned */
    size_t copies;
} entry;

/* Dead letters with one idemq-failure-id and body, as the pass met them. */
typedef enum group_state {
    GROUP_KEPT,           /* the first was kept (listed, or not selected for replay) */
    GROUP_REPLAY_PENDING, /* the first is being replayed in this chunk */
    GROUP_REPLAYED,       /* the first's replay was confirmed: later copies are removed */
    GROUP_REPLAY_FAILED,  /* the first stays: so do its copies */
} group_state;

typedef struct group {
    char id[MESSAGE_FAILURE_ID_MAX + 1];
    uint64_t body_hash;
    size_t body_len;
    group_state state;
    size_t entry; /* index in pass.entries; SIZE_MAX: the first was not shown */
} group;

/*
 * Why so small a chunk: on a quorum queue RabbitMQ turns the ack of each basic.get'd message into
 * its own settle command, and a channel with 32 or more commands in flight to a queue holds
 * further settles back until earlier ones are applied (rabbit_fifo_client's soft limit). A held
 * back settle is dropped when the channel closes right after the ack, so that message returns
 * (spending a delivery attempt, out of its place). Measured on 3.10.8 and 4.0.5: acking 34 or
 * more at the end of the pass returned all but 33 of them. Chunks of 16 keep every settle sent
 * at once, with room for the previous chunk's. The test many_dead_letters_span_chunks_in_order
 * would see it.
 */
#define CHUNK_MAX 16
_Static_assert(CHUNK_MAX <= 16, "see above: larger chunks lose acks on quorum queues");
#define CHUNK_BYTES_MAX ((size_t)16 << 20)

typedef struct pass {
    amqp_connection_state_t conn;
    broker_confirms confirms; /* of the channel's copies */
    const char *gone;         /* why the channel or connection went, for the copies it owed */
    const config *cfg;
    const config_consumer *c;
    const dlq_options *opts;
    char dlq[TOPOLOGY_NAME_MAX];
    visit *visits;          /* CHUNK_MAX */
    size_t count;           /* visits in the current chunk */
    bool left_unacked;      /* an original of an earlier chunk is still unacked: no multiple ack */
    bool channel_gone;      /* a basic.get failed: nothing more can be published or acked */
    /* rabbitmq-c failed on the socket or the data: its state is not fit for a closing handshake
     * (after "invalid AMQP data" it would read past a buffer), so the connection is dropped. */
    bool connection_broken;
    size_t seen, shown, replayed, removed, failed, copies;
    size_t frame_max;       /* negotiated: no frame idemq sends is larger */
    entry *entries;         /* the output, in the DLQ's order */
    size_t entry_count, entry_cap;
    group *groups;
    size_t group_count, group_cap;
    size_t *slots;          /* open addressing over groups: index + 1, 0 = empty */
    size_t slot_cap;        /* a power of two, at least twice group_count */
    bool out_of_memory;
} pass;

static uint64_t group_hash(const char *id, uint64_t body_hash, size_t body_len)
{
    uint64_t h = body_hash ^ ((uint64_t)body_len * 0x9e3779b97f4a7c15ULL);
    for (const char *c = id; *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ULL;
    return h;
}

static bool group_matches(const group *g, const dead_letter *d, size_t body_len)
{
    return g->body_hash == d->body_hash && g->body_len == body_len &&
           strcmp(g->id, d->failure_id) == 0;
}

static int grow_slots(pass *p)
{
    size_t cap = p->slot_cap ? p->slot_cap * 2 : 64;
    size_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i < p->group_count; i++) {
        const group *g = &p->groups[i];
        size_t at = (size_t)group_hash(g->id, g->body_hash, g->body_len) & (cap - 1);
        while (slots[at])
            at = (at + 1) & (cap - 1);
        slots[at] = i + 1;
    }
    free(p->slots);
    p->slots = slots;
    p->slot_cap = cap;
    return 0;
}

/* The group of d (whose body is body_len bytes): found, or added in state `state`. *added tells
 * which. Returns SIZE_MAX when out of memory. */
static size_t find_or_add_group(pass *p, const dead_letter *d, size_t body_len, group_state state,
                                bool *added)
{
    *added = false;
    if (p->group_count * 2 >= p->slot_cap && grow_slots(p) != 0)
        return SIZE_MAX;
    size_t at = (size_t)group_hash(d->failure_id, d->body_hash, body_len) & (p->slot_cap - 1);
    for (; p->slots[at]; at = (at + 1) & (p->slot_cap - 1))
        if (group_matches(&p->groups[p->slots[at] - 1], d, body_len))
            return p->slots[at] - 1;
    if (p->group_count == p->group_cap) {
        size_t cap = p->group_cap ? p->group_cap * 2 : 64;
        group *groups = realloc(p->groups, cap * sizeof *groups);
        if (!groups)
            return SIZE_MAX;
        p->groups = groups;
        p->group_cap = cap;
    }
    group *g = &p->groups[p->group_count];
    memcpy(g->id, d->failure_id, sizeof g->id);
    g->body_hash = d->body_hash;
    g->body_len = body_len;
    g->state = state;
    g->entry = SIZE_MAX;
    p->slots[at] = ++p->group_count;
    *added = true;
    return p->group_count - 1;
}

/* A new output entry for v (shown); returns its index, SIZE_MAX when out of memory. */
static size_t add_entry(pass *p, const visit *v)
{
    if (p->entry_count == p->entry_cap) {
        size_t cap = p->entry_cap ? p->entry_cap * 2 : 64;
        entry *entries = realloc(p->entries, cap * sizeof *entries);
        if (!entries)
            return SIZE_MAX;
        p->entries = entries;
        p->entry_cap = cap;
    }
    entry *e = &p->entries[p->entry_count];
    e->copies = 1;
    e->json = p->opts->json ? dead_letter_json(&v->d) : NULL;
    e->text = p->opts->json ? NULL : dead_letter_text(&v->d);
    if (!e->json && !e->text)
        return SIZE_MAX;
    return p->entry_count++;
}

/* The copy that keeps a dead letter: its own properties and headers, without the broker's
 * delivery counts (x-delivery-count, 4.3's x-acquired-count). user_id moves to the idemq-original-user-id header, as on idemq's DLQ
 * copies: RabbitMQ refuses a user_id that is not the publishing login. */
static int keep_properties(const amqp_basic_properties_t *in, amqp_pool_t *pool,
                           amqp_basic_properties_t *out)
{
    *out = *in;
    bool move_user = (in->_flags & AMQP_BASIC_USER_ID_FLAG) != 0;
    if (!(in->_flags & AMQP_BASIC_HEADERS_FLAG) && !move_user)
        return 0;
    int count = (in->_flags & AMQP_BASIC_HEADERS_FLAG) ? in->headers.num_entries : 0;
    amqp_table_entry_t *entries = amqp_pool_alloc(pool, sizeof *entries * (size_t)(count + 1));
    if (!entries)
        return -1;
    int n = 0;
    bool has_user_header = false;
    for (int i = 0; i < count; i++) {
        amqp_bytes_t key = in->headers.entries[i].key;
        if (message_header_counts_deliveries(key))
            continue;
        if (key.len == strlen(HEADER_ORIGINAL_USER_ID) &&
            memcmp(key.bytes, HEADER_ORIGINAL_USER_ID, key.len) == 0)
            has_user_header = true;
        entries[n++] = in->headers.entries[i];
    }
    if (move_user) {
        out->_flags &= ~AMQP_BASIC_USER_ID_FLAG;
        if (!has_user_header) {
            entries[n].key = amqp_cstring_bytes(HEADER_ORIGINAL_USER_ID);
            entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
            entries[n].value.value.bytes = in->user_id;
            n++;
        }
    }
    out->headers.entries = entries;
    out->headers.num_entries = n;
    if (n > 0 || (in->_flags & AMQP_BASIC_HEADERS_FLAG))
        out->_flags |= AMQP_BASIC_HEADERS_FLAG;
    return 0;
}

/* The outcome of v's copy (arg: v). A visit already settled (its publish failed) keeps its
 * reason. */
static void copy_outcome(void *arg, broker_publish_outcome outcome, const broker_return *ret)
{
    visit *v = arg;
    pass *p = v->pass;
    (void)ret;
    if (v->settled)
        return;
    v->settled = true;
    switch (outcome) {
    case BROKER_PUBLISH_CONFIRMED:
        v->confirmed = true;
        break;
    case BROKER_PUBLISH_NACKED:
        snprintf(v->reason, sizeof v->reason, "the broker refused the copy (nack)");
        break;
    case BROKER_PUBLISH_RETURNED:
        snprintf(v->reason, sizeof v->reason, "the copy was unroutable (no queue '%s')",
                 v->action == VISIT_REPLAY ? p->c->queue : p->dlq);
        break;
    case BROKER_PUBLISH_UNKNOWN:
        snprintf(v->reason, sizeof v->reason, "no publisher confirm: %s",
                 p->gone ? p->gone : "the channel failed");
        break;
    }
}

/* Publishes the copy of v (mandatory, confirm mode). A copy that cannot be made (out of memory,
 * too large) fails v alone. Returns 0, or -1 when the connection failed. */
static int publish_copy(pass *p, visit *v, amqp_pool_t *pool)
{
    if (v->action == VISIT_DROP)
        return 0;
    amqp_basic_properties_t props;
    int rc = v->action == VISIT_REPLAY
                 ? message_strip_properties(&v->message.properties, p->frame_max, pool, &props)
                 : keep_properties(&v->message.properties, pool, &props);
    /* A kept dead letter is republished unchanged: it must fit frame_max as it is (only one
     * from outside idemq, which moved a user_id into a header, can grow). */
    if (rc == 0 && v->action == VISIT_KEEP && message_header_frame_size(&props) > p->frame_max)
        rc = MESSAGE_E_TOO_LARGE;
    if (rc != 0) {
        if (rc == MESSAGE_E_TOO_LARGE && v->action == VISIT_REPLAY)
            snprintf(v->reason, sizeof v->reason,
                     "its properties do not fit a frame of %zu bytes even without its headers",
                     p->frame_max);
        else if (rc == MESSAGE_E_TOO_LARGE)
            snprintf(v->reason, sizeof v->reason,
                     "its header frame would be over frame_max (%zu bytes) as it is",
                     p->frame_max);
        else
            snprintf(v->reason, sizeof v->reason, "out of memory");
        v->settled = true;
        return 0;
    }
    const char *routing_key = v->action == VISIT_REPLAY ? p->c->queue : p->dlq;
    broker_publish m = {.exchange = amqp_empty_bytes,
                        .routing_key = amqp_cstring_bytes(routing_key),
                        .props = &props,
                        .body = v->message.body,
                        .frame_max = p->frame_max};
    uint64_t seq;
    v->pass = p;
    rc = broker_confirms_publish(&p->confirms, p->conn, &m, copy_outcome, v, &seq);
    if (rc != AMQP_STATUS_OK && seq == 0) {
        snprintf(v->reason, sizeof v->reason, "out of memory");
        v->settled = true;
        return 0;
    }
    if (rc != AMQP_STATUS_OK) {
        snprintf(v->reason, sizeof v->reason, "publish failed: %s", amqp_error_string2(rc));
        v->settled = true;
        p->connection_broken = true;
        return -1;
    }
    v->publish_seq = seq;
    return 0;
}

/* After the chunk's confirms: the replays' groups learn their outcome, then the copies they
 * stand for may be acked (confirmed) or must stay. */
static void settle_copies(pass *p)
{
    for (size_t i = 0; i < p->count; i++) {
        const visit *v = &p->visits[i];
        if (v->action == VISIT_REPLAY && v->group != SIZE_MAX &&
            p->groups[v->group].state == GROUP_REPLAY_PENDING)
            p->groups[v->group].state = v->confirmed ? GROUP_REPLAYED : GROUP_REPLAY_FAILED;
    }
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (v->action != VISIT_DROP)
            continue;
        v->confirmed = p->groups[v->group].state == GROUP_REPLAYED;
        if (!v->confirmed)
            snprintf(v->reason, sizeof v->reason,
                     "the replay of the dead letter it is a copy of was not confirmed");
    }
}

/* Copies published and not yet settled. */
static size_t copies_owed(const pass *p)
{
    size_t pending = 0;
    for (size_t i = 0; i < p->count; i++)
        if (!p->visits[i].settled && p->visits[i].publish_seq)
            pending++;
    return pending;
}

/* Waits for the confirms of every copy published in this chunk (broker/confirms.h matches a
 * basic.return to its copy). Returns 0, or -1 when the channel or connection is gone (unsettled
 * copies are failed). */
static int wait_for_confirms(pass *p)
{
    char err[256];
    const char *gone = NULL;
    while (copies_owed(p) > 0 && !gone) {
        amqp_frame_t frame;
        struct timeval timeout = {.tv_sec = CONFIRM_TIMEOUT_S};
        int rc = amqp_simple_wait_frame_noblock(p->conn, &frame, &timeout);
        if (rc != AMQP_STATUS_OK) {
            gone = amqp_error_string2(rc);
            p->connection_broken = true;
            break;
        }
        int taken = broker_confirms_frame(&p->confirms, &frame, err, sizeof err);
        if (taken < 0) {
            gone = err;
            p->connection_broken = true;
        } else if (taken == 0 && frame.frame_type == AMQP_FRAME_METHOD &&
                   (frame.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
                    frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD)) {
            gone = "the broker closed the channel";
        }
    }
    if (!gone)
        return 0;
    p->gone = gone;
    broker_confirms_fail_all(&p->confirms);
    p->gone = NULL;
    return -1;
}

static int ack(pass *p, uint64_t delivery_tag, bool multiple)
{
    if (amqp_basic_ack(p->conn, BROKER_CHANNEL, delivery_tag, multiple) == AMQP_STATUS_OK)
        return 0;
    p->connection_broken = true;
    return -1;
}

/* Acks the originals whose copy was confirmed: one multiple ack when the whole chunk was and no
 * earlier original is still unacked, else one by one. Returns 0 or -1. */
static int ack_originals(pass *p)
{
    bool all = !p->left_unacked;
    for (size_t i = 0; i < p->count; i++)
        all = all && p->visits[i].confirmed;
    if (all && p->count > 0)
        return ack(p, p->visits[p->count - 1].delivery_tag, true);
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (!v->confirmed) {
            p->left_unacked = true;
            continue;
        }
        if (ack(p, v->delivery_tag, false) != 0)
            return -1;
    }
    return 0;
}

/* Reports the chunk's problems, counts outcomes, frees the messages. */
static void report_chunk(pass *p)
{
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (v->action == VISIT_DROP && v->confirmed) {
            p->removed++;
        } else if (v->action == VISIT_DROP) {
            fprintf(stderr, "idemq dlq replay: a copy of %s kept in %s: %s\n", v->d.biz_key,
                    p->dlq, v->reason);
            p->failed++;
        } else if (v->action == VISIT_REPLAY && v->confirmed) {
            p->replayed++;
        } else if (v->action == VISIT_REPLAY) {
            fprintf(stderr, "idemq dlq replay: %s kept in %s: %s\n", v->d.biz_key, p->dlq,
                    v->reason);
            p->failed++;
        } else if (!v->confirmed) {
            fprintf(stderr,
                    "idemq dlq: %s: %s; its original was left unacked and returns to %s when "
                    "the channel closes (on RabbitMQ 4.x that spends one of its delivery "
                    "attempts, and it may no longer be in its place)\n",
                    v->d.biz_key, v->reason, p->dlq);
            p->failed++;
        }
        amqp_destroy_message(&v->message);
    }
    p->count = 0;
}

/* Fetches the next message of the snapshot into a new visit. Returns 1 when one was added, 0
 * when the DLQ is empty, -1 on failure. */
static int fetch(pass *p, size_t *snapshot, size_t *replays_in_chunk)
{
    char reason[512];
    amqp_rpc_reply_t reply =
        amqp_basic_get(p->conn, BROKER_CHANNEL, amqp_cstring_bytes(p->dlq), 0);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        fprintf(stderr, "idemq dlq: reading %s failed: %s\n", p->dlq,
                broker_describe_reply(reply, reason, sizeof reason));
        p->channel_gone = true;
        p->connection_broken |= reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION;
        return -1;
    }
    if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
        return 0;
    const amqp_basic_get_ok_t *got = reply.reply.decoded;
    visit *v = &p->visits[p->count];
    memset(v, 0, sizeof *v);
    v->delivery_tag = got->delivery_tag;
    /* Visit only what was there when we started: copies (and replays that fail again) join the
     * tail behind us, and chasing them would never end. */
    if (p->seen == 0)
        *snapshot = (size_t)got->message_count + 1;
    reply = amqp_read_message(p->conn, BROKER_CHANNEL, &v->message, 0);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        fprintf(stderr, "idemq dlq: reading a message failed: %s\n",
                broker_describe_reply(reply, reason, sizeof reason));
        p->connection_broken |= reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION;
        /* Not counted: its delivery tag is unacked and it returns when the channel closes. */
        p->left_unacked = true;
        p->channel_gone = true;
        return -1;
    }
    p->count++;
    p->seen++;
    describe(&v->message, p->cfg, &v->d);
    v->action = VISIT_KEEP;
    v->group = SIZE_MAX;
    const dlq_options *o = p->opts;
    bool selected = o->action == DLQ_REPLAY &&
                    (o->all || (o->biz_key && strcmp(o->biz_key, v->d.biz_key) == 0));
    if (v->d.failure_id[0]) {
        bool added;
        bool replay = selected && (!o->limit || p->replayed + *replays_in_chunk < o->limit);
        v->group = find_or_add_group(p, &v->d, v->message.body.len,
                                     replay ? GROUP_REPLAY_PENDING : GROUP_KEPT, &added);
        if (v->group == SIZE_MAX) {
            p->out_of_memory = true;
            return 1;
        }
        group *g = &p->groups[v->group];
        if (!added) {
            /* A copy of one met before: it counts there, and goes if that one was replayed. */
            p->copies++;
            if (g->entry != SIZE_MAX)
                p->entries[g->entry].copies++;
            if (g->state == GROUP_REPLAY_PENDING || g->state == GROUP_REPLAYED) {
                v->action = VISIT_DROP;
                v->settled = true; /* nothing to publish; settle_copies decides its ack */
                v->confirmed = g->state == GROUP_REPLAYED;
            }
            return 1;
        }
    }
    if (o->action == DLQ_LIST) {
        v->shown = !o->limit || p->shown < o->limit;
    } else if (selected && (!o->limit || p->replayed + *replays_in_chunk < o->limit)) {
        v->action = VISIT_REPLAY;
        v->shown = true;
        ++*replays_in_chunk;
    }
    if (v->shown) {
        p->shown++;
        v->entry = add_entry(p, v);
        if (v->entry == SIZE_MAX)
            p->out_of_memory = true;
        else if (v->group != SIZE_MAX)
            p->groups[v->group].entry = v->entry;
    }
    return 1;
}

/* The pass over the snapshot. Returns the exit code. */
static int walk(pass *p)
{
    int exit_code = 0;
    size_t snapshot = 1; /* messages in the DLQ at the first basic.get-ok */
    amqp_pool_t pool;
    init_amqp_pool(&pool, 16384);
    bool done = false;
    while (!done && p->seen < snapshot) {
        size_t bytes = 0, replays = 0;
        while (p->count < CHUNK_MAX && bytes < CHUNK_BYTES_MAX && p->seen < snapshot) {
            int rc = fetch(p, &snapshot, &replays);
            if (rc < 0)
                exit_code = 1;
            if (rc <= 0) {
                done = true;
                break;
            }
            if (p->out_of_memory) {
                /* This chunk is settled as usual; nothing more is fetched. */
                fprintf(stderr, "idemq dlq: out of memory; the pass stops here\n");
                exit_code = 1;
                done = true;
                break;
            }
            bytes += p->visits[p->count - 1].message.body.len;
            amqp_maybe_release_buffers(p->conn);
        }
        bool broken = p->channel_gone;
        for (size_t i = 0; i < p->count && !broken; i++)
            broken = publish_copy(p, &p->visits[i], &pool) != 0;
        for (size_t i = 0; i < p->count; i++) {
            visit *v = &p->visits[i];
            if (!v->settled && !v->publish_seq) {
                v->settled = true;
                snprintf(v->reason, sizeof v->reason, "not copied: the channel failed");
            }
        }
        if (wait_for_confirms(p) != 0 || broken)
            done = true;
        settle_copies(p);
        if (!p->channel_gone && ack_originals(p) != 0) {
            fprintf(stderr, "idemq dlq: acking in %s failed: the messages whose copy was "
                            "confirmed are now in it twice (nothing is lost)\n",
                    p->dlq);
            done = true;
            exit_code = 1;
        }
        for (size_t i = 0; i < p->count; i++)
            if (!p->visits[i].confirmed)
                exit_code = 1;
        report_chunk(p);
        recycle_amqp_pool(&pool);
        amqp_maybe_release_buffers(p->conn);
    }
    empty_amqp_pool(&pool);
    return exit_code;
}

static const char copies_note[] = "a lost ack duplicated this dead letter";

/* The entries and the summary, once the pass is over (a count can grow until its end). */
static void print_result(pass *p)
{
    const dlq_options *opts = p->opts;
    if (opts->json) {
        json_t *listing = json_array();
        for (size_t i = 0; listing && i < p->entry_count; i++) {
            json_t *e = p->entries[i].json;
            json_object_set_new(e, "copies", json_integer((json_int_t)p->entries[i].copies));
            json_array_append(listing, e);
        }
        json_t *doc =
            opts->action == DLQ_LIST
                ? json_pack("{s:s, s:o?}", "queue", p->dlq, "messages", listing)
                : json_pack("{s:s, s:I, s:I, s:I, s:o?}", "queue", p->dlq, "replayed",
                            (json_int_t)p->replayed, "removed_copies", (json_int_t)p->removed,
                            "failed", (json_int_t)p->failed, "messages", listing);
        if (!doc) {
            fprintf(stderr, "idemq dlq: out of memory\n");
            return;
        }
        json_dumpf(doc, stdout, JSON_INDENT(2));
        putchar('\n');
        json_decref(doc);
        return;
    }
    for (size_t i = 0; i < p->entry_count; i++) {
        fputs(p->entries[i].text, stdout);
        if (p->entries[i].copies > 1)
            printf("    copies: %zu copies (%s)\n", p->entries[i].copies, copies_note);
    }
    if (opts->action == DLQ_REPLAY) {
        printf("replayed %zu message(s) from %s to %s", p->replayed, p->dlq, p->c->queue);
        if (p->removed)
            printf(", removed %zu copy(ies) of them (%s)", p->removed,
                   "a lost ack had duplicated those dead letters");
        printf("%s\n", p->failed ? " (some failed, see above)" : "");
        return;
    }
    printf("%zu message(s) in %s", p->seen, p->dlq);
    if (p->copies)
        printf(" (%zu of them copies of another: %s)", p->copies, "shown once, with a count");
    if (p->shown < p->seen - p->copies)
        printf(", the first %zu shown", p->shown);
    printf(" (listed without removing)\n");
}

int cli_dlq(const config *cfg, const dlq_options *opts)
{
    const config_consumer *c = find_consumer(cfg, opts->queue);
    if (!c) {
        fprintf(stderr, "idemq dlq: %s\n",
                opts->queue ? "no consumer has that queue in the config"
                            : "the config has several consumers: pass --queue Q");
        return EXIT_USAGE;
    }
    if (opts->action == DLQ_REPLAY && !opts->all && !opts->biz_key) {
        fprintf(stderr, "idemq dlq replay: pass --biz-key K or --all\n");
        return EXIT_USAGE;
    }
    if (opts->action == DLQ_PURGE && !opts->yes) {
        fprintf(stderr, "idemq dlq purge: this deletes every dead letter of %s; pass --yes\n",
                c->queue);
        return EXIT_USAGE;
    }
    char err[1024];
    pass p = {.cfg = cfg, .c = c, .opts = opts};
    broker_confirms_init(&p.confirms);
    topology_dead_letter_queue(c, p.dlq, sizeof p.dlq);
    broker_open_options open_opts = {.confirms = opts->action != DLQ_PURGE,
                                     .tls = &cfg->amqp_tls,
                                     .password = cfg->amqp_password};
    if (broker_open_first(cfg->amqp_urls, cfg->amqp_url_count, &open_opts, &p.conn, NULL, err,
                          sizeof err) != 0) {
        fprintf(stderr, "idemq dlq: %s\n", err);
        return 1;
    }
    if (err[0])
        fprintf(stderr, "idemq dlq: warning: %s\n", err);
    if (opts->action == DLQ_PURGE) {
        int rc = purge(p.conn, p.dlq, opts);
        broker_close(p.conn);
        return rc;
    }
    char warning[TOPOLOGY_WARNING_MAX];
    int rc = topology_check_dead_letter_queue(p.conn, c, warning, sizeof warning);
    if (rc < 0) {
        fprintf(stderr, "idemq dlq: %s\n", warning);
        broker_close(p.conn);
        return 1;
    }
    if (rc > 0)
        fprintf(stderr, "idemq dlq: warning: %s\n", warning);

    /* Raised for reading only (see the top of this file); nothing is in flight on the
     * connection now, as amqp_tune_connection requires. */
    p.frame_max = (size_t)amqp_get_frame_max(p.conn);
    if (amqp_tune_connection(p.conn, amqp_get_channel_max(p.conn),
                             amqp_get_frame_max(p.conn) + MESSAGE_BROKER_HEADROOM,
                             amqp_get_heartbeat(p.conn)) != AMQP_STATUS_OK) {
        fprintf(stderr, "idemq dlq: out of memory\n");
        broker_close(p.conn);
        return 1;
    }
    p.visits = calloc(CHUNK_MAX, sizeof *p.visits);
    if (!p.visits) {
        fprintf(stderr, "idemq dlq: out of memory\n");
        broker_close(p.conn);
        return 1;
    }
    int exit_code = walk(&p);
    print_result(&p);
    for (size_t i = 0; i < p.entry_count; i++) {
        json_decref(p.entries[i].json);
        free(p.entries[i].text);
    }
    free(p.entries);
    free(p.groups);
    free(p.slots);
    /* A publish that failed to send stays owed after its pass stopped: its visit is settled. */
    broker_confirms_fail_all(&p.confirms);
    free(p.visits);
    /* Everything confirmed was acked; whatever was not returns to the DLQ now. */
    if (p.connection_broken)
        amqp_destroy_connection(p.conn);
    else
        broker_close(p.conn);
    return exit_code;
}
