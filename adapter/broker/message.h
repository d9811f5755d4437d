/*
 * message — a delivery copied out of rabbitmq-c's buffers, and the headers idemq reads and writes.
 *
 * rabbitmq-c's decoded frames die at amqp_maybe_release_buffers, so a delivery's properties live
 * in the message's own amqp_pool_t and its body in one malloc'd buffer. Retry and DLQ copies are
 * built from these untouched originals: a copy never changes the body.
 *
 * Errors: int functions return 0 or BROKER_E_FAILED (connection.h: out of memory); a constructor
 * returns NULL when out of memory; header lookups return false when the header is absent.
 *
 * Thread affinity: one owner at a time (the loop thread builds and frees messages).
 */
#ifndef IDEMQ_BROKER_MESSAGE_H
#define IDEMQ_BROKER_MESSAGE_H

#include <amqp.h>
#include <stdbool.h>
#include <stdint.h>

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

/* Integer header value of any AMQP integer type; returns false when absent or not an integer. */
bool message_header_int(const amqp_basic_properties_t *props, const char *name, int64_t *out);

/* String header value (borrowed bytes); returns false when absent or not a string. */
bool message_header_bytes(const amqp_basic_properties_t *props, const char *name,
                          amqp_bytes_t *out);

/* W3C trace context header, logged when a producer sets it. */
#define HEADER_TRACEPARENT "traceparent"
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
} copy_headers;

/*
 * Fills out with the original properties plus the copy headers. Broker-added x-death /
 * x-first-death-* / x-last-death-* and old idemq-* headers are dropped; the copy is persistent;
 * user_id moves to the idemq-original-user-id header.
 * Allocations come from pool (borrowed, caller releases). Returns 0 or BROKER_E_FAILED (out of
 * memory).
 */
int message_copy_properties(const broker_message *msg, const copy_headers *headers,
                            amqp_pool_t *pool, amqp_basic_properties_t *out);

/*
 * Fills out with props minus every header idemq or the broker's dead-lettering added, for
 * replaying a dead letter as if it were new (its retry count starts again at 0). Allocations
 * come from pool. Returns 0 or BROKER_E_FAILED (out of memory).
 */
int message_strip_properties(const amqp_basic_properties_t *props, amqp_pool_t *pool,
                             amqp_basic_properties_t *out);

#endif
