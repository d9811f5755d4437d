/*
 * message — a delivery copied out of rabbitmq-c's buffers, and the headers idemq reads and writes.
 *
 * rabbitmq-c's decoded frames die at amqp_maybe_release_buffers, so a delivery's properties live
 * in the message's own amqp_pool_t and its body in one malloc'd buffer. Retry and DLQ copies are
 * built from these untouched originals: a copy never changes the body.
 *
 * A copy must also fit one content-header frame, with room to spare for what brokers add on the
 * way (see MESSAGE_BROKER_HEADROOM): rabbitmq-c sends basic.publish's method frame before it
 * encodes the header frame, so a header that does not fit breaks the connection instead of
 * failing one publish, and a header that only just fits grows past frame_max in the broker and
 * can then no longer be read. Copies are measured before they are published and give up
 * producer headers, largest first, until they fit; what was left out is recorded in
 * idemq-dropped-headers.
 *
 * Errors: int functions return 0, BROKER_E_FAILED (util/errors.h; here out of memory) or
 * MESSAGE_E_TOO_LARGE (the copy does not fit even without any producer header); a constructor
 * returns NULL when out of memory; header lookups return false when the header is absent.
 *
 * Thread affinity: one owner at a time (the loop thread builds and frees messages).
 */
#ifndef IDEMQ_BROKER_MESSAGE_H
#define IDEMQ_BROKER_MESSAGE_H

#include "broker/amqp_api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/errors.h"
#include "util/trace_context.h"

#define HEADER_RETRIES "idemq-retries"
#define HEADER_ERROR_CLASS "idemq-error-class"
#define HEADER_ERROR "idemq-error"
#define HEADER_HANDLER "idemq-handler"
#define HEADER_QUEUE "idemq-queue"
#define HEADER_FIRST_FAILED_AT "idemq-first-failed-at"
/* Identifies a copy in a basic.return, so an unroutable publish fails only its own original. */
#define HEADER_PUBLISH_SEQ "idemq-publish-seq"
/* The producer's user_id property, which a copy cannot carry (the broker checks it against
 * idemq's login). */
#define HEADER_ORIGINAL_USER_ID "idemq-original-user-id"
/* Set on the DLQ copy of a body larger than amqp.max_body: the size the producer sent; the copy
 * carries only the first max_body bytes. */
#define HEADER_BODY_TRUNCATED "idemq-body-truncated"
#define HEADER_ERROR_MAX 1024
/* The identity of one failure of one delivery: equal on the copies that the original delivery and
 * its redelivery make (a copy confirmed, then the connection lost before the original's ack), and
 * different for different events and for different retry rounds of one event. See
 * message_failure_id. */
#define HEADER_FAILURE_ID "idemq-failure-id"
#define MESSAGE_FAILURE_ID_MAX 32 /* hex digits; buffers take MESSAGE_FAILURE_ID_MAX + 1 */
/* Producer headers a copy had to leave out to fit frame_max: "name (N bytes), ..." with N the
 * header's encoded size, at most MESSAGE_DROPPED_HEADERS_MAX bytes (the rest counted as
 * " and K more"). Carried on to later copies and replays, and extended when they drop more. */
#define HEADER_DROPPED_HEADERS "idemq-dropped-headers"
#define MESSAGE_DROPPED_HEADERS_MAX 512

/*
 * Bytes of a frame that a copy leaves free for what brokers add to its header on the way, so that
 * it can still be delivered (rabbitmq-c refuses a frame over frame_max with "invalid AMQP data").
 * Measured by tests/integration/test_frame_max.c (broker_additions_fit_the_headroom, which fails
 * when two hops no longer fit), with the longest queue name the config allows (200 bytes): one
 * hop of a copy through Q.retry.N, dead-lettered back to a quorum work queue, adds an x-death
 * entry, x-first-death-*, on 4.x x-last-death-*, and x-delivery-count (26 bytes; 3.10 adds it at
 * the first delivery, 4.0 at the first return): 1286 bytes on 3.10.8, 1783 bytes on 4.0.5. idemq
 * strips them from every copy, so one hop is what a copy meets before it is read again; a second
 * (a quorum work queue whose delivery limit dead-letters to Q.dlx by policy) doubles it: 3566.
 * 8 KiB covers that with room for a broker version that adds more, at 6% of the default
 * frame_max (131072).
 */
#define MESSAGE_BROKER_HEADROOM 8192

typedef struct broker_message {
    uint64_t delivery_tag;
    uint64_t generation;        /* connection generation the tag belongs to */
    size_t consumer_index;
    bool redelivered;
    amqp_pool_t pool;           /* owns everything properties points to */
    amqp_basic_properties_t properties;
    size_t body_len;            /* bytes kept in body: at most the receiver's body limit */
    size_t body_received;       /* bytes of body filled so far */
    uint64_t announced_len;     /* body size the content header announced (>= body_len) */
    uint64_t announced_received;/* body bytes that arrived, kept or not */
    unsigned char *body;        /* owned */
} broker_message;

/* A new message with properties deep-copied from src (borrowed), for a body of announced_len
 * bytes of which at most keep_max are kept: memory is bounded before anything is allocated,
 * whatever the content header claims. NULL when out of memory. */
broker_message *broker_message_new(const amqp_basic_properties_t *src, uint64_t announced_len,
                                   size_t keep_max);

/* Takes one body frame: copies what fits, counts the rest. Returns true once the whole announced
 * body has arrived; false until then, and for a fragment longer than what is left (*overrun). */
bool broker_message_add_body(broker_message *msg, amqp_bytes_t fragment, bool *overrun);

/* The body was cut to the receiver's limit (announced_len > body_len). */
bool broker_message_truncated(const broker_message *msg);
void broker_message_free(broker_message *msg);

/* Deep-copies src's properties (those whose flag is set, and the headers) into pool; out may be
 * src. Returns 0 or BROKER_E_FAILED (out of memory). */
int message_properties_clone(const amqp_basic_properties_t *src, amqp_pool_t *pool,
                             amqp_basic_properties_t *out);

/* Integer header value of any AMQP integer type; returns false when absent or not an integer. */
bool message_header_int(const amqp_basic_properties_t *props, const char *name, int64_t *out);

/* True for the headers a broker adds to a delivery to count its attempts: x-delivery-count
 * (quorum queues) and, since RabbitMQ 4.3, x-acquired-count. They describe one delivery, not the
 * message: no copy or kept dead letter takes them over. */
bool message_header_counts_deliveries(amqp_bytes_t key);

/* String header value (borrowed bytes); returns false when absent or not a string. */
bool message_header_bytes(const amqp_basic_properties_t *props, const char *name,
                          amqp_bytes_t *out);

/* W3C trace context header, logged when a producer sets it (as it came; util/trace_context.h
 * parses it for the emits). */
#define HEADER_TRACEPARENT TRACE_HEADER_TRACEPARENT
#define MESSAGE_TRACE_ID_MAX 128

/* The identifiers a producer may set outside the body, copied as NUL-terminated text (cut to
 * MESSAGE_TRACE_ID_MAX bytes); "" when absent. They trace a message whose body cannot be read. */
typedef struct message_trace {
    char message_id[MESSAGE_TRACE_ID_MAX + 1];     /* the message_id property */
    char correlation_id[MESSAGE_TRACE_ID_MAX + 1]; /* the correlation_id property */
    char traceparent[MESSAGE_TRACE_ID_MAX + 1];    /* the traceparent header */
} message_trace;

/* Fills out from props (borrowed). */
void message_trace_read(const amqp_basic_properties_t *props, message_trace *out);

/* What a retry or DLQ copy carries in addition to the original properties. */
typedef struct copy_headers {
    int64_t retries;
    const char *error_class;
    const char *error;          /* cut to HEADER_ERROR_MAX bytes on a UTF-8 boundary */
    const char *handler;
    const char *queue;
    int64_t first_failed_at_ms;
    uint64_t publish_seq;
    const char *expiration;     /* NULL: the copy must not expire (DLQ) */
    uint64_t body_truncated_from; /* 0, or the announced size of a body cut to max_body */
    const char *failure_id;     /* NULL: no idemq-failure-id header; else message_failure_id's */
} copy_headers;

/*
 * Encoded size in bytes of the content-header frame that carries props (borrowed), exactly as
 * rabbitmq-c encodes it (frame header and end, class, weight, body size, property flags, every
 * present property); SIZE_MAX when rabbitmq-c could not encode it (a short string over 255
 * bytes, an unknown field kind). A publish whose value is over the connection's frame_max
 * (amqp_get_frame_max) must not be attempted: it would break the connection.
 */
size_t message_header_frame_size(const amqp_basic_properties_t *props);

/* The largest header frame a copy may have on a connection with this frame_max: frame_max minus
 * MESSAGE_BROKER_HEADROOM, or half of frame_max when that is smaller (a broker tuned to a small
 * frame_max still gets copies through, with proportionally less room). 0 for frame_max 0. */
size_t message_frame_limit(size_t frame_max);

/*
 * Fills out with the original properties plus the copy headers. Broker-added x-death /
 * x-first-death-* / x-last-death-* / x-delivery-count and old idemq-* headers are dropped (a
 * previous idemq-dropped-headers record is carried on); the copy is persistent; user_id moves to
 * the idemq-original-user-id header.
 * frame_max: the connection's negotiated value (amqp_get_frame_max). When the header frame would
 * be over message_frame_limit(frame_max), producer headers are left out, largest first, until it
 * fits, and named in idemq-dropped-headers; idemq's own headers, the other properties and the
 * body are never changed.
 * Allocations come from pool (borrowed, caller releases); out points into it and into msg. Returns
 * 0, BROKER_E_FAILED (out of memory) or MESSAGE_E_TOO_LARGE (does not fit even without producer
 * headers: a per-message failure, nothing was published).
 */
int message_copy_properties(const broker_message *msg, const copy_headers *headers,
                            size_t frame_max, amqp_pool_t *pool, amqp_basic_properties_t *out);

/*
 * Fills out with props (borrowed) minus every header idemq or the broker's dead-lettering added
 * (idemq-dropped-headers stays: those headers are gone for good), for replaying a dead letter as
 * if it were new (its retry count starts again at 0). Made to fit message_frame_limit(frame_max)
 * by the same rule as message_copy_properties. Allocations come from pool. Returns 0,
 * BROKER_E_FAILED (out of memory) or MESSAGE_E_TOO_LARGE.
 */
int message_strip_properties(const amqp_basic_properties_t *props, size_t frame_max,
                             amqp_pool_t *pool, amqp_basic_properties_t *out);

/*
 * Writes the failure identity of one delivery's failure to out (out_len bytes, at least
 * MESSAGE_FAILURE_ID_MAX + 1 for the whole id; always NUL-terminated when out_len > 0): 32 hex
 * digits of a 128-bit hash over handler, the event (biz_key when the envelope had one, else the
 * body), what the producer set outside the body (props, when not NULL: message_id,
 * correlation_id, timestamp, headers other than x-* and idemq-*), delivery_retries (the delivery's idemq-retries, 0 when absent) and
 * delivery_first_failed_at_ms (its idemq-first-failed-at, 0 when absent). Everything comes from
 * the delivery itself, never from the clock, so a redelivery of the same delivery gets the same
 * id; the next retry round reads a higher idemq-retries and gets another.
 * biz_key: NULL or "" when the envelope had none; body/handler borrowed (handler not NULL).
 */
void message_failure_id(const char *biz_key, const void *body, size_t body_len,
                        const amqp_basic_properties_t *props,
                        const char *handler, int64_t delivery_retries,
                        int64_t delivery_first_failed_at_ms, char *out, size_t out_len);

#endif
