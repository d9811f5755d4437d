/*
 * settle — carries out the policy's decision (policy/outcome.h) for a classified delivery:
 *   processed / deduped / state_noop → basic.ack
 *   retry or dead-letter             → publish the copy (original body and properties plus the
 *                                      idemq-* headers) and ack the original only once the broker
 *                                      confirmed the copy; requeue it when the broker did not
 *   database unusable                → hold it and pause consumption (outage.h)
 * A copy is never published for a delivery whose connection is gone: the broker hands that one
 * out again, and a copy now would be a second one for the same failure.
 *
 * Errors: settle_delivery cannot fail; every path ends in the retire hook or the hold list.
 * Thread affinity: loop thread.
 */
#ifndef IDEMQ_RUN_SETTLE_H
#define IDEMQ_RUN_SETTLE_H

#include "broker/session.h"
#include "ops/metrics.h"
#include "policy/outcome.h"
#include "run/delivery.h"
#include "run/outage.h"
#include "run/seen_keys.h"
#include "util/rng.h"

typedef struct settler {
    broker_session *broker; /* borrowed */
    metrics *metrics;       /* borrowed */
    outage *outage;         /* borrowed: where unavailable deliveries are held */
    rng random;             /* the jitter of retry delays */
    seen_keys *seen;        /* owned by the caller: dedup.cache, NULL when off */
    /* d (taken) is settled — acked, requeued or abandoned: release it. */
    void (*retire)(void *ctx, delivery *d);
    void *ctx;
} settler;

/*
 * Decides d's outcome from status and its retry state, logs it, and carries it out. d is taken:
 * it ends in s->retire (at once, or when its copy's confirm arrives) or on the outage's hold
 * list.
 */
void settle_delivery(settler *s, delivery *d, apply_status status);

/* The store's on_done for a delivery's apply job (its settler set): records the handler's
 * duration and whether the database answered, then settles the delivery. */
void settle_applied(store_job *job);

#endif
