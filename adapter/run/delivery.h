/*
 * delivery — one message of `idemq run` from its receipt to its settlement: the broker's
 * delivery, its decoded envelope, the retry state its headers carry, and the store job that
 * applies it. A delivery has one owner at a time: the loop (run.c), the store while its job runs,
 * the outage's hold list while consumption is paused, the broker while its retry or dead-letter
 * copy waits for a confirm (settle.c).
 *
 * Errors: 0 or -1, with the reason in the delivery's job.error (what a dead-letter copy carries).
 * Thread affinity: loop thread; between store_submit and on_done a DB worker reads the job and
 * what it borrows (the envelope and the body).
 */
#ifndef IDEMQ_RUN_DELIVERY_H
#define IDEMQ_RUN_DELIVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "broker/message.h"
#include "config/config.h"
#include "envelope/envelope.h"
#include "ops/log.h"
#include "ops/metrics.h"
#include "policy/outcome.h"
#include "store/store.h"
#include "util/trace_context.h"

struct settler;

typedef struct delivery {
    store_job job;                   /* first member: the store hands it back (delivery_of) */
    broker_message *msg;             /* owned */
    const config_consumer *consumer; /* borrowed: the consumer it was delivered to */
    envelope env;                    /* owned once decoded */
    bool decoded;
    unsigned retries;           /* idemq-retries of the delivery, capped */
    int64_t first_failed_at_ms; /* idemq-first-failed-at; 0 when this is the first failure */
    outcome out;                /* what settle_delivery decided */
    struct settler *settler;    /* borrowed: carries out its outcome (settle.h) */
    struct delivery *held_next; /* on the outage's hold list while consumption is paused */
    message_trace trace;        /* the producer's identifiers outside the body, for logs */
    trace_context trace_ctx;    /* its W3C trace context, with idemq's span for this delivery */
    uv_work_t decode_work;      /* a large body is decoded on libuv's thread pool (run.c) */
    int decode_rc;              /* delivery_decode's result, read back on the loop */
} delivery;

/* The delivery whose job this is (job is its first member). */
delivery *delivery_of(store_job *job);

/*
 * A delivery for msg (taken on success; still the caller's on NULL, when out of memory), which
 * came for consumer (borrowed, must outlive it); its retry state is read from msg's headers,
 * and its trace context: a valid traceparent gets a new span id, idemq's processing of this
 * delivery (each redelivery and retry is another span of the same trace).
 * Release with delivery_free.
 */
delivery *delivery_new(broker_message *msg, const config_consumer *consumer);

/*
 * Decodes the envelope (a body cut to max_body at receipt is refused here, saying so) and
 * prepares d->job for store_submit (on_done is left to the caller). Returns 0, or -1 when the
 * body can never be applied: d->job.error says why, for the dead-letter copy.
 */
int delivery_decode(delivery *d, size_t max_body);

/* The log context of d with outcome_name (borrowed; may be NULL). */
log_context delivery_log_context(const delivery *d, const char *outcome_name);

/* Counts label for d's queue, a message processed after retries as recovered, and a dead letter
 * by its class (d->out.error_class) and, after retries, as a failed retry. */
void delivery_count_outcome(const delivery *d, metrics *m, outcome_label label);

/* Releases d, its message and its envelope. NULL is a no-op. */
void delivery_free(delivery *d);

#endif
