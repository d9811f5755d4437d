/*
 * confirms — the one publisher of idemq's confirm-mode channels (the session's, the outbox
 * relay's, `idemq dlq`'s): it sends mandatory publishes, tracks the publisher confirms each
 * channel still owes in publish order, matches basic.returns to their publishes, and fails what
 * a lost channel still owed. The broker numbers every publish on such a channel from 1 and later
 * acks or nacks each number (or every number up to one, "multiple"); each registered callback
 * runs exactly once, with the publish's outcome: confirmed (an ack, no return), nacked, returned
 * (mandatory and unroutable: basic.return, then its ack) or unknown (the channel or connection
 * went away first: it may or may not have been routed).
 *
 * Matching returns (one rule for every caller): RabbitMQ sends a publish's basic.return while it
 * handles that publish, so returns come in publish order and each comes before the ack or nack of
 * its publish; the acks themselves may be coalesced ("multiple") and out of order with the returns
 * (an unroutable publish is confirmed at once, a routed one only when its queues have it). So "the
 * ack after a return is the returned publish" is not safe: a return is matched to the oldest
 * publish that is still owed a confirm, comes after the last publish matched to a return, and has
 * the return's exchange and routing key — and, when the channel has a return key
 * (broker_confirms_set_return_key), whose key the returned message's header carries. A caller that
 * can put a number unique among its pending publishes into a header (the session its publish
 * number, the relay its outbox id) gets exact matching; without one (the dlq tools republish dead
 * letters unchanged) the order and the route decide.
 *
 * Each channel's confirms belong to the thread that owns its connection: the session's broker
 * thread, the relay thread, the one thread of `idemq dlq`.
 *
 * Errors: 0 or BROKER_E_FAILED (util/errors.h); broker_confirms_publish returns rabbitmq-c's
 * AMQP_STATUS_* (it fails where rabbitmq-c does). Callbacks must not call back into the same
 * broker_confirms (they run in the middle of its list walk). Thread affinity: the thread that
 * owns the connection (above); callbacks run on it, from inside these calls.
 */
#ifndef IDEMQ_BROKER_CONFIRMS_H
#define IDEMQ_BROKER_CONFIRMS_H

#include "broker/amqp_api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/assembly.h"

/* What the session's loop side is told of a copy it asked for (broker_publish_copy): true only
 * for CONFIRMED. */
typedef void (*broker_confirm_cb)(void *arg, bool confirmed);

typedef enum broker_publish_outcome {
    BROKER_PUBLISH_CONFIRMED = 0, /* acked, and not returned */
    BROKER_PUBLISH_NACKED,        /* basic.nack */
    BROKER_PUBLISH_RETURNED,      /* basic.return (mandatory, unroutable), then its ack */
    BROKER_PUBLISH_UNKNOWN,       /* the channel or connection went before the answer */
} broker_publish_outcome;

/* What a basic.return said. */
typedef struct broker_return {
    unsigned reply_code;
    char reply_text[128];
    char exchange[256];
    char routing_key[256];
} broker_return;

/* Runs once per accepted publish. ret: for RETURNED, the return (borrowed for the call); else
 * NULL. */
typedef void (*broker_publish_cb)(void *arg, broker_publish_outcome outcome,
                                  const broker_return *ret);

/* A basic.return that matched no pending publish (ret borrowed for the call). */
typedef void (*broker_unmatched_return_cb)(void *ctx, const broker_return *ret);

/* One publish: everything borrowed for the call. */
typedef struct broker_publish {
    amqp_bytes_t exchange, routing_key;
    const amqp_basic_properties_t *props;
    amqp_bytes_t body;
    int64_t key;      /* the value of the return-key header in props (ignored without one) */
    size_t frame_max; /* >0: body frames cut to this (a connection whose limit was raised for
                         reading); 0: the connection's frame_max */
} broker_publish;

typedef struct broker_pending_confirm broker_pending_confirm;

typedef struct broker_confirms {
    broker_pending_confirm *head, *tail; /* owned */
    size_t pending;                      /* entries between head and tail */
    uint64_t next_seq;                   /* the number the next publish gets */
    /* kept across a lost channel */
    const char *return_key; /* header naming a publish, NULL: none (borrowed, static) */
    broker_unmatched_return_cb unmatched;
    void *unmatched_ctx;
    /* the basic.return being read */
    uint64_t last_returned; /* the publish the last return matched (returns come in order) */
    broker_return ret;
    broker_assembly assembly; /* the return's content frames */
} broker_confirms;

/* Empty, the next publish numbered 1 (caller-owned storage; release with
 * broker_confirms_fail_all). */
void broker_confirms_init(broker_confirms *c);

/* Returns name a publish by this header (an integer, unique among the channel's pending
 * publishes: broker_publish.key); header is borrowed and must outlive c (a string literal). */
void broker_confirms_set_return_key(broker_confirms *c, const char *header);

/* Runs cb(ctx, ret) for a basic.return that matched no pending publish (NULL: ignored). */
void broker_confirms_on_unmatched_return(broker_confirms *c, broker_unmatched_return_cb cb,
                                         void *ctx);

/*
 * Registers cb(arg) for the publish m and sends it on BROKER_CHANNEL, mandatory; *seq gets its
 * number. Returns 0 (cb runs exactly once, later), or a negative AMQP_STATUS_* and cb never runs:
 * with *seq 0 when nothing was sent (out of memory); otherwise sending failed and the frames may
 * be half sent, so the caller must give the channel up.
 */
int broker_confirms_publish(broker_confirms *c, amqp_connection_state_t conn,
                            const broker_publish *m, broker_publish_cb cb, void *arg,
                            uint64_t *seq);

/*
 * Takes one frame read on the channel (borrowed): basic.ack, basic.nack, basic.return and that
 * return's content frames are the confirms' (callbacks run from here). Returns 1 when the frame
 * was taken, 0 when it is the caller's (a channel.close too), or BROKER_E_FAILED when a return's
 * content frames do not fit (err says why: the connection cannot go on).
 */
int broker_confirms_frame(broker_confirms *c, const amqp_frame_t *frame, char *err, size_t err_len);

/* The channel is gone: runs every pending callback with UNKNOWN; numbering restarts at 1, a
 * return half read is dropped. The return key and unmatched hook stay. */
void broker_confirms_fail_all(broker_confirms *c);

/* After the broker closed the channel (a channel.close read by the caller): fails what it owed
 * (broker_confirms_fail_all), answers close-ok, opens BROKER_CHANNEL again and puts it in confirm
 * mode. Returns 0, or BROKER_E_FAILED with err saying which step failed (the caller drops the
 * connection). */
int broker_confirms_reopen_channel(broker_confirms *c, amqp_connection_state_t conn, char *err,
                                   size_t err_len);

#endif
