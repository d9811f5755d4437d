/*
 * confirms — see confirms.h. A singly linked list in publish order: the broker confirms in
 * order too, so resolving walks only the head; a return walks the list once to find its publish.
 * Thread affinity: the connection's thread.
 */
#include "broker/confirms.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "broker/message.h"

struct broker_pending_confirm {
    broker_pending_confirm *next;
    uint64_t seq;
    bool returned;
    broker_publish_cb cb;
    void *arg;
    /* what a return is matched on, and what it said */
    char *exchange, *routing_key; /* owned, NUL-terminated */
    int64_t key;
    broker_return *ret; /* owned; set when returned */
};

static void entry_free(broker_pending_confirm *pc)
{
    free(pc->exchange);
    free(pc->routing_key);
    free(pc->ret);
    free(pc);
}

static void entry_settle(broker_pending_confirm *pc, broker_publish_outcome outcome)
{
    pc->cb(pc->arg, outcome, outcome == BROKER_PUBLISH_RETURNED ? pc->ret : NULL);
}

void broker_confirms_init(broker_confirms *c)
{
    *c = (broker_confirms){.next_seq = 1};
    broker_assembly_init(&c->assembly);
}

void broker_confirms_set_return_key(broker_confirms *c, const char *header)
{
    c->return_key = header;
}

void broker_confirms_on_unmatched_return(broker_confirms *c, broker_unmatched_return_cb cb,
                                         void *ctx)
{
    c->unmatched = cb;
    c->unmatched_ctx = ctx;
}

static void append(broker_confirms *c, broker_pending_confirm *pc)
{
    pc->seq = c->next_seq++;
    if (c->tail)
        c->tail->next = pc;
    else
        c->head = pc;
    c->tail = pc;
    c->pending++;
}

/* Removes the newest entry (its number stays used: the channel is given up after a failed
 * send, so numbering never resumes on it). */
static void unlink_tail(broker_confirms *c)
{
    broker_pending_confirm *prev = NULL;
    for (broker_pending_confirm *pc = c->head; pc && pc != c->tail; pc = pc->next)
        prev = pc;
    if (prev)
        prev->next = NULL;
    else
        c->head = NULL;
    c->tail = prev;
    c->pending--;
}

static char *copy_bytes(amqp_bytes_t b)
{
    char *s = malloc(b.len + 1);
    if (s) {
        if (b.len)
            memcpy(s, b.bytes, b.len);
        s[b.len] = '\0';
    }
    return s;
}

/* The publish's frames, body cut to frame_max (which may be below the connection's). */
static int send_frames(amqp_connection_state_t conn, const broker_publish *m, size_t frame_max)
{
    amqp_basic_publish_t method = {
        .exchange = m->exchange, .routing_key = m->routing_key, .mandatory = 1};
    int rc = amqp_send_method(conn, BROKER_CHANNEL, AMQP_BASIC_PUBLISH_METHOD, &method);
    if (rc != AMQP_STATUS_OK)
        return rc;
    amqp_frame_t frame = {.frame_type = AMQP_FRAME_HEADER, .channel = BROKER_CHANNEL};
    frame.payload.properties.class_id = AMQP_BASIC_CLASS;
    frame.payload.properties.body_size = m->body.len;
    frame.payload.properties.decoded = (void *)m->props;
    if ((rc = amqp_send_frame(conn, &frame)) != AMQP_STATUS_OK)
        return rc;
    size_t fragment_max = frame_max - 8; /* frame header and end */
    for (size_t offset = 0; offset < m->body.len; offset += fragment_max) {
        size_t n = m->body.len - offset < fragment_max ? m->body.len - offset : fragment_max;
        frame = (amqp_frame_t){.frame_type = AMQP_FRAME_BODY, .channel = BROKER_CHANNEL};
        frame.payload.body_fragment =
            (amqp_bytes_t){.len = n, .bytes = (char *)m->body.bytes + offset};
        if ((rc = amqp_send_frame(conn, &frame)) != AMQP_STATUS_OK)
            return rc;
    }
    return AMQP_STATUS_OK;
}

int broker_confirms_publish(broker_confirms *c, amqp_connection_state_t conn,
                            const broker_publish *m, broker_publish_cb cb, void *arg, uint64_t *seq)
{
    *seq = 0;
    broker_pending_confirm *pc = calloc(1, sizeof *pc);
    if (!pc)
        return AMQP_STATUS_NO_MEMORY;
    pc->cb = cb;
    pc->arg = arg;
    pc->key = m->key;
    pc->exchange = copy_bytes(m->exchange);
    pc->routing_key = copy_bytes(m->routing_key);
    if (!pc->exchange || !pc->routing_key) {
        entry_free(pc);
        return AMQP_STATUS_NO_MEMORY;
    }
    append(c, pc);
    *seq = pc->seq;
    int rc = m->frame_max ? send_frames(conn, m, m->frame_max)
                          : amqp_basic_publish(conn, BROKER_CHANNEL, m->exchange, m->routing_key, 1,
                                               0, m->props, m->body);
    if (rc == AMQP_STATUS_OK)
        return 0;
    /* The call failed, so its callback must never run (the caller settles this publish): take
     * the entry back. It is the tail, nothing having run since the append. */
    unlink_tail(c);
    entry_free(pc);
    return rc;
}

/* The broker acked (acked) or nacked publish tag, or every publish up to it (multiple). Unknown
 * numbers are ignored. */
static void resolve(broker_confirms *c, uint64_t tag, bool multiple, bool acked)
{
    broker_pending_confirm **link = &c->head;
    broker_pending_confirm *prev = NULL;
    while (*link) {
        broker_pending_confirm *pc = *link;
        if (pc->seq > tag)
            break;
        if (multiple || pc->seq == tag) {
            *link = pc->next;
            if (c->tail == pc)
                c->tail = prev;
            c->pending--;
            /* A return says why a nacked publish went nowhere: it decides (the relay marks
             * such a row unroutable rather than publishing it again). */
            entry_settle(pc, pc->returned ? BROKER_PUBLISH_RETURNED
                             : !acked     ? BROKER_PUBLISH_NACKED
                                          : BROKER_PUBLISH_CONFIRMED);
            entry_free(pc);
            if (!multiple)
                break;
        } else {
            prev = pc;
            link = &pc->next;
        }
    }
}

/* The rule of confirms.h: the oldest pending publish after the last returned one, with the
 * return's exchange and routing key (and key, when the channel has a return key). */
static void match_return(broker_confirms *c, const amqp_basic_properties_t *props)
{
    int64_t key = 0;
    bool has_key = c->return_key && message_header_int(props, c->return_key, &key);
    for (broker_pending_confirm *pc = c->head; pc; pc = pc->next) {
        if (pc->returned || pc->seq <= c->last_returned)
            continue;
        if (strcmp(pc->exchange, c->ret.exchange) != 0 ||
            strcmp(pc->routing_key, c->ret.routing_key) != 0)
            continue;
        if (c->return_key && (!has_key || pc->key != key))
            continue;
        pc->ret = malloc(sizeof *pc->ret); /* NULL: RETURNED all the same, without its text */
        if (pc->ret)
            *pc->ret = c->ret;
        pc->returned = true;
        c->last_returned = pc->seq;
        return;
    }
    if (c->unmatched)
        c->unmatched(c->unmatched_ctx, &c->ret);
}

static void text_of(char *buf, size_t len, amqp_bytes_t b)
{
    snprintf(buf, len, "%.*s", (int)b.len, (const char *)b.bytes);
}

int broker_confirms_frame(broker_confirms *c, const amqp_frame_t *frame, char *err, size_t err_len)
{
    if (frame->frame_type == AMQP_FRAME_HEADER || frame->frame_type == AMQP_FRAME_BODY) {
        if (c->assembly.state == BROKER_ASSEMBLY_IDLE)
            return 0; /* a delivery's */
        broker_message *msg = NULL;
        bool is_return = false;
        if (broker_assembly_add_frame(&c->assembly, frame, 0, &msg, &is_return, err, err_len))
            return BROKER_E_FAILED;
        if (msg)
            match_return(c, &msg->properties);
        broker_message_free(msg);
        return 1;
    }
    if (frame->frame_type != AMQP_FRAME_METHOD)
        return 0;
    const amqp_method_t *m = &frame->payload.method;
    switch (m->id) {
    case AMQP_BASIC_ACK_METHOD: {
        const amqp_basic_ack_t *a = m->decoded;
        resolve(c, a->delivery_tag, a->multiple != 0, true);
        return 1;
    }
    case AMQP_BASIC_NACK_METHOD: {
        const amqp_basic_nack_t *n = m->decoded;
        resolve(c, n->delivery_tag, n->multiple != 0, false);
        return 1;
    }
    case AMQP_BASIC_RETURN_METHOD: {
        const amqp_basic_return_t *r = m->decoded;
        c->ret.reply_code = r->reply_code;
        text_of(c->ret.reply_text, sizeof c->ret.reply_text, r->reply_text);
        text_of(c->ret.exchange, sizeof c->ret.exchange, r->exchange);
        text_of(c->ret.routing_key, sizeof c->ret.routing_key, r->routing_key);
        broker_assembly_begin_return(&c->assembly);
        return 1;
    }
    default:
        return 0;
    }
}

void broker_confirms_fail_all(broker_confirms *c)
{
    broker_pending_confirm *pc = c->head;
    const char *return_key = c->return_key;
    broker_unmatched_return_cb unmatched = c->unmatched;
    void *unmatched_ctx = c->unmatched_ctx;
    broker_assembly_reset(&c->assembly);
    broker_confirms_init(c);
    c->return_key = return_key;
    c->unmatched = unmatched;
    c->unmatched_ctx = unmatched_ctx;
    while (pc) {
        broker_pending_confirm *next = pc->next;
        entry_settle(pc, BROKER_PUBLISH_UNKNOWN);
        entry_free(pc);
        pc = next;
    }
}

int broker_confirms_reopen_channel(broker_confirms *c, amqp_connection_state_t conn, char *err,
                                   size_t err_len)
{
    char reason[256];
    broker_confirms_fail_all(c);
    if (broker_reopen_channel(conn) != 0) {
        snprintf(err, err_len, "cannot reopen the channel after the broker closed it");
        return BROKER_E_FAILED;
    }
    amqp_confirm_select(conn, BROKER_CHANNEL);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        snprintf(err, err_len, "confirm.select on the reopened channel failed: %s",
                 broker_describe_reply(reply, reason, sizeof reason));
        return BROKER_E_FAILED;
    }
    return 0;
}
