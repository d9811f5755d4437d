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
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "broker/nodes.h"
#include "broker/topology.h"
#include "envelope/envelope.h"
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

static json_t *dead_letter_json(const dead_letter *d)
{
    char when[40];
    format_time(d->first_failed_at_ms, when, sizeof when);
    return json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:s?, s:s?, s:s?}", "biz_key", d->biz_key,
                     "error_class", d->error_class, "error", d->error, "retries",
                     (json_int_t)d->retries, "first_failed_at", when, "age_seconds",
                     (json_int_t)age_seconds(d), "message_id",
                     d->message_id[0] ? d->message_id : NULL, "correlation_id",
                     d->trace.correlation_id[0] ? d->trace.correlation_id : NULL, "traceparent",
                     d->trace.traceparent[0] ? d->trace.traceparent : NULL);
}

static void print_dead_letter(const dead_letter *d)
{
    char when[40];
    format_time(d->first_failed_at_ms, when, sizeof when);
    printf("%-40s %-18s retries=%-3" PRId64 " first_failed=%s age=%llds\n    reason: %s\n",
           d->biz_key, d->error_class, d->retries, when, (long long)age_seconds(d), d->error);
    if (d->message_id[0] || d->trace.correlation_id[0] || d->trace.traceparent[0])
        printf("    ids:%s%s%s%s%s%s\n", d->message_id[0] ? " message_id=" : "", d->message_id,
               d->trace.correlation_id[0] ? " correlation_id=" : "", d->trace.correlation_id,
               d->trace.traceparent[0] ? " traceparent=" : "", d->trace.traceparent);
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

/* One message of the pass, from its basic.get to its ack. */
typedef enum visit_action { VISIT_KEEP, VISIT_REPLAY } visit_action;

typedef struct visit {
    uint64_t delivery_tag; /* of the basic.get-ok */
    uint64_t publish_seq;  /* of its copy; 0: not published */
    visit_action action;
    bool shown;            /* printed (list: within --limit; replay: selected) */
    bool confirmed;        /* the copy was confirmed and not returned */
    bool settled;          /* confirmed, or failed with reason */
    char reason[TOPOLOGY_NAME_MAX + 64]; /* why the copy failed */
    amqp_message_t message;
    dead_letter d;
} visit;

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
    const config *cfg;
    const config_consumer *c;
    const dlq_options *opts;
    char dlq[TOPOLOGY_NAME_MAX];
    visit *visits;          /* CHUNK_MAX */
    size_t count;           /* visits in the current chunk */
    uint64_t publish_seq;   /* last publish on the channel */
    bool left_unacked;      /* an original of an earlier chunk is still unacked: no multiple ack */
    bool channel_gone;      /* a basic.get failed: nothing more can be published or acked */
    size_t seen, shown, replayed, failed;
    json_t *listing;
} pass;

/* The copy that keeps a dead letter: its own properties and headers, without the broker's
 * x-delivery-count. user_id moves to the idemq-original-user-id header, as on idemq's DLQ
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
        if (key.len == strlen("x-delivery-count") &&
            memcmp(key.bytes, "x-delivery-count", key.len) == 0)
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

/* Publishes the copy of v (mandatory, confirm mode). Returns 0 or -1 (the connection failed). */
static int publish_copy(pass *p, visit *v, amqp_pool_t *pool)
{
    amqp_basic_properties_t props;
    int rc = v->action == VISIT_REPLAY
                 ? message_strip_properties(&v->message.properties,
                                            (size_t)amqp_get_frame_max(p->conn), pool, &props)
                 : keep_properties(&v->message.properties, pool, &props);
    if (rc != 0) {
        snprintf(v->reason, sizeof v->reason, "out of memory");
        v->settled = true;
        return 0;
    }
    const char *routing_key = v->action == VISIT_REPLAY ? p->c->queue : p->dlq;
    rc = amqp_basic_publish(p->conn, BROKER_CHANNEL, amqp_empty_bytes,
                            amqp_cstring_bytes(routing_key), 1, 0, &props, v->message.body);
    if (rc != AMQP_STATUS_OK) {
        snprintf(v->reason, sizeof v->reason, "publish failed: %s", amqp_error_string2(rc));
        v->settled = true;
        return -1;
    }
    v->publish_seq = ++p->publish_seq;
    return 0;
}

/* Marks the visits whose copy has a sequence number in [lo, hi]. returned_seq: the publish a
 * basic.return just before this ack was about (0: none). */
static size_t settle_range(pass *p, uint64_t lo, uint64_t hi, bool ack, uint64_t returned_seq)
{
    size_t settled = 0;
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (v->settled || !v->publish_seq || v->publish_seq < lo || v->publish_seq > hi)
            continue;
        v->settled = true;
        settled++;
        if (!ack)
            snprintf(v->reason, sizeof v->reason, "the broker refused the copy (nack)");
        else if (v->publish_seq == returned_seq)
            snprintf(v->reason, sizeof v->reason, "the copy was unroutable (no queue '%s')",
                     v->action == VISIT_REPLAY ? p->c->queue : p->dlq);
        else
            v->confirmed = true;
    }
    return settled;
}

/* Waits for the confirms of every copy published in this chunk. A mandatory publish that cannot
 * be routed comes back as basic.return, then its basic.ack: RabbitMQ sends both while handling
 * that publish, so the ack right after a return names the returned publish (multiple or not).
 * Returns 0, or -1 when the channel or connection is gone (unsettled copies are failed). */
static int wait_for_confirms(pass *p)
{
    size_t pending = 0;
    uint64_t first = 0;
    for (size_t i = 0; i < p->count; i++)
        if (!p->visits[i].settled && p->visits[i].publish_seq) {
            pending++;
            if (!first)
                first = p->visits[i].publish_seq;
        }
    bool returned = false;
    char returned_key[TOPOLOGY_NAME_MAX] = "";
    const char *gone = NULL;
    while (pending > 0 && !gone) {
        amqp_frame_t frame;
        struct timeval timeout = {.tv_sec = CONFIRM_TIMEOUT_S};
        int rc = amqp_simple_wait_frame_noblock(p->conn, &frame, &timeout);
        if (rc != AMQP_STATUS_OK) {
            gone = amqp_error_string2(rc);
            break;
        }
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue; /* header/body of a basic.return */
        switch (frame.payload.method.id) {
        case AMQP_BASIC_RETURN_METHOD: {
            const amqp_basic_return_t *r = frame.payload.method.decoded;
            returned = true;
            snprintf(returned_key, sizeof returned_key, "%.*s", (int)r->routing_key.len,
                     (const char *)r->routing_key.bytes);
            break;
        }
        case AMQP_BASIC_ACK_METHOD:
        case AMQP_BASIC_NACK_METHOD: {
            bool ack = frame.payload.method.id == AMQP_BASIC_ACK_METHOD;
            uint64_t tag;
            bool multiple;
            if (ack) {
                const amqp_basic_ack_t *a = frame.payload.method.decoded;
                tag = a->delivery_tag;
                multiple = a->multiple;
            } else {
                const amqp_basic_nack_t *a = frame.payload.method.decoded;
                tag = a->delivery_tag;
                multiple = a->multiple;
            }
            uint64_t returned_seq = 0;
            if (returned) {
                returned_seq = tag;
                /* The ack after a return should be that publish's: if its routing key says
                 * otherwise, trust none of this ack's range. */
                for (size_t i = 0; i < p->count; i++) {
                    const visit *v = &p->visits[i];
                    const char *key = v->action == VISIT_REPLAY ? p->c->queue : p->dlq;
                    if (v->publish_seq == tag && strcmp(key, returned_key) != 0)
                        ack = false;
                }
                returned = false;
            }
            pending -= settle_range(p, multiple ? first : tag, tag, ack, returned_seq);
            break;
        }
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
            gone = "the broker closed the channel";
            break;
        default:
            break;
        }
    }
    if (!gone)
        return 0;
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (!v->settled && v->publish_seq) {
            v->settled = true;
            snprintf(v->reason, sizeof v->reason, "no publisher confirm: %s", gone);
        }
    }
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
        return amqp_basic_ack(p->conn, BROKER_CHANNEL, p->visits[p->count - 1].delivery_tag, 1) ==
                       AMQP_STATUS_OK
                   ? 0
                   : -1;
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (!v->confirmed) {
            p->left_unacked = true;
            continue;
        }
        if (amqp_basic_ack(p->conn, BROKER_CHANNEL, v->delivery_tag, 0) != AMQP_STATUS_OK)
            return -1;
    }
    return 0;
}

/* Prints the chunk's selected messages and problems, counts outcomes, frees the messages. */
static void report_chunk(pass *p)
{
    for (size_t i = 0; i < p->count; i++) {
        visit *v = &p->visits[i];
        if (v->action == VISIT_REPLAY && v->confirmed) {
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
        if (v->shown) {
            if (p->opts->json)
                json_array_append_new(p->listing, dead_letter_json(&v->d));
            else
                print_dead_letter(&v->d);
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
        /* Not counted: its delivery tag is unacked and it returns when the channel closes. */
        p->left_unacked = true;
        p->channel_gone = true;
        return -1;
    }
    p->count++;
    p->seen++;
    describe(&v->message, p->cfg, &v->d);
    v->action = VISIT_KEEP;
    const dlq_options *o = p->opts;
    if (o->action == DLQ_LIST) {
        v->shown = !o->limit || p->shown < o->limit;
        p->shown += v->shown;
    } else if ((o->all || (o->biz_key && strcmp(o->biz_key, v->d.biz_key) == 0)) &&
               (!o->limit || p->replayed + *replays_in_chunk < o->limit)) {
        v->action = VISIT_REPLAY;
        v->shown = true;
        ++*replays_in_chunk;
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

    p.visits = calloc(CHUNK_MAX, sizeof *p.visits);
    p.listing = json_array();
    if (!p.visits || !p.listing) {
        fprintf(stderr, "idemq dlq: out of memory\n");
        free(p.visits);
        json_decref(p.listing);
        broker_close(p.conn);
        return 1;
    }
    int exit_code = walk(&p);
    if (opts->json) {
        json_t *doc = opts->action == DLQ_LIST
                          ? json_pack("{s:s, s:O}", "queue", p.dlq, "messages", p.listing)
                          : json_pack("{s:s, s:I, s:I, s:O}", "queue", p.dlq, "replayed",
                                      (json_int_t)p.replayed, "failed", (json_int_t)p.failed,
                                      "messages", p.listing);
        json_dumpf(doc, stdout, JSON_INDENT(2));
        putchar('\n');
        json_decref(doc);
    } else if (opts->action == DLQ_REPLAY) {
        printf("replayed %zu message(s) from %s to %s%s\n", p.replayed, p.dlq, c->queue,
               p.failed ? " (some failed, see above)" : "");
    } else if (p.shown < p.seen) {
        printf("%zu message(s) in %s, the first %zu shown (listed without removing)\n", p.seen,
               p.dlq, p.shown);
    } else {
        printf("%zu message(s) in %s (listed without removing)\n", p.seen, p.dlq);
    }
    json_decref(p.listing);
    free(p.visits);
    /* Everything confirmed was acked; whatever was not returns to the DLQ now. */
    broker_close(p.conn);
    return exit_code;
}
