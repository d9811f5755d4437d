/*
 * settle — see settle.h. Thread affinity: loop thread.
 */
#include "run/settle.h"

#include <inttypes.h>
#include <stdio.h>

#include "broker/topology.h"
#include "ops/log.h"
#include "util/monotonic.h"
#include "util/wallclock.h"

/* The copy's outcome line, written once the outcome is final (the broker confirmed the copy). */
static void log_copy_outcome(const delivery *d)
{
    const config_consumer *c = d->consumer;
    log_context ctx = delivery_log_context(d, outcome_label_name(d->out.label));
    if (d->out.action == OUTCOME_RETRY)
        log_warn(&ctx, "retry %u of %u in %" PRIu64 " ms: %s", d->out.retries, c->retry.max_retries,
                 d->out.delay_ms, d->job.error);
    else
        log_error(&ctx, "dead-lettered (%s): %s", error_class_name(d->out.error_class),
                  d->job.error);
}

static const char *copy_kind(const delivery *d)
{
    return d->out.action == OUTCOME_RETRY ? "retry" : "dead-letter";
}

/* Gives d back to its queue with its outcome line and count: "requeued" is an outcome too. */
static void requeue(settler *s, delivery *d, const char *why)
{
    log_context ctx = delivery_log_context(d, outcome_label_name(OUTCOME_REQUEUED));
    log_warn(&ctx, "requeued: %s", why);
    broker_nack_requeue(s->broker, d->msg);
    delivery_count_outcome(d, s->metrics, OUTCOME_REQUEUED);
    s->retire(s->ctx, d);
}

static void on_copy_confirmed(void *arg, bool confirmed)
{
    delivery *d = arg;
    settler *s = d->settler;
    if (!confirmed) {
        /* The copy may not exist: keep the original (the broker redelivers it). */
        requeue(s, d, d->out.action == OUTCOME_RETRY
                          ? "the broker did not confirm the retry copy"
                          : "the broker did not confirm the dead-letter copy");
        return;
    }
    log_copy_outcome(d);
    broker_ack(s->broker, d->msg);
    delivery_count_outcome(d, s->metrics, d->out.label);
    s->retire(s->ctx, d);
}

/* Publishes d's retry or dead-letter copy; d is acked once the broker confirmed it. */
static void publish_copy(settler *s, delivery *d)
{
    const config_consumer *c = d->consumer;
    char exchange[TOPOLOGY_NAME_MAX], routing_key[TOPOLOGY_NAME_MAX], expiration[32];
    /* The same for this delivery and its redelivery: a copy a lost ack made twice is recognised
     * (dlq list shows one entry, dlq replay publishes one). */
    char failure_id[MESSAGE_FAILURE_ID_MAX + 1];
    message_failure_id(d->decoded ? d->env.biz_key : NULL, d->msg->body, d->msg->body_len,
                       &d->msg->properties,
                       c->handler_name, d->retries, d->first_failed_at_ms, failure_id,
                       sizeof failure_id);
    copy_headers headers = {
        .failure_id = failure_id,
        .retries = d->out.retries,
        .error_class = error_class_name(d->out.error_class),
        .error = d->job.error[0] ? d->job.error : "unknown error",
        .handler = c->handler_name,
        .queue = c->queue,
        .first_failed_at_ms = d->first_failed_at_ms ? d->first_failed_at_ms : wallclock_ms(),
        .body_truncated_from = broker_message_truncated(d->msg) ? d->msg->announced_len : 0,
    };
    if (d->out.action == OUTCOME_RETRY) {
        topology_retry_exchange(c, exchange, sizeof exchange);
        topology_retry_queue(c, d->out.level, routing_key, sizeof routing_key);
        snprintf(expiration, sizeof expiration, "%" PRIu64, d->out.delay_ms);
        headers.expiration = expiration;
    } else {
        topology_dead_letter_exchange(c, exchange, sizeof exchange);
        snprintf(routing_key, sizeof routing_key, "%s", c->queue);
    }
    int rc = broker_publish_copy(s->broker, d->msg, exchange, routing_key, &headers,
                                 on_copy_confirmed, d);
    if (rc == 0)
        return;
    if (rc == BROKER_E_STALE) {
        /* Its connection is gone and the broker hands the delivery out again: a copy now would
         * be a second one for the same failure. */
        log_context ctx = delivery_log_context(d, outcome_label_name(OUTCOME_REQUEUED));
        log_warn(&ctx, "requeued: no %s copy, the delivery's connection closed and the broker "
                 "redelivers it", copy_kind(d));
        delivery_count_outcome(d, s->metrics, OUTCOME_REQUEUED);
        s->retire(s->ctx, d);
    } else if (rc == BROKER_E_TOO_LARGE) {
        /* Not the connection's fault, and not the next message's: this one alone leaves by the
         * work queue's own dead-letter route (or is dropped by the broker if it has none), and
         * the queue behind it keeps flowing. */
        log_context ctx = delivery_log_context(d, "rejected");
        log_error(&ctx,
                  "rejected without requeue: its %s copy cannot be encoded within the "
                  "connection's frame_max even without the producer's headers; the work queue's "
                  "dead-letter route (x-dead-letter-exchange), if it has one, takes it: %s",
                  copy_kind(d), d->job.error);
        broker_reject(s->broker, d->msg);
        metrics_copy_unpublishable(s->metrics, d->msg->consumer_index);
        s->retire(s->ctx, d);
    } else {
        requeue(s, d, "the copy could not be queued for publishing (not connected, or out of "
                      "memory)");
    }
}

void settle_applied(store_job *job)
{
    delivery *d = delivery_of(job);
    settler *s = d->settler;
    /* The database has just said the key is committed: its copies can skip it (seen_keys.h). */
    if (s->seen && d->decoded &&
        (job->status == APPLY_COMMITTED || job->status == APPLY_STATE_NOOP ||
         job->status == APPLY_DUPLICATE))
        seen_keys_remember(s->seen, d->consumer->handler_name, d->env.biz_key,
                           (uint64_t)monotonic_ms());
    metrics_observe_handler(s->metrics, job->consumer_index, job->duration_ns);
    metrics_set_up(s->metrics, METRICS_DEP_MYSQL, job->status != APPLY_UNAVAILABLE);
    settle_delivery(s, d, job->status);
}

void settle_delivery(settler *s, delivery *d, apply_status status)
{
    const config_consumer *c = d->consumer;
    d->out = outcome_decide(status, d->retries, &c->retry, rng_next(&s->random));
    log_context ctx = delivery_log_context(d, outcome_label_name(d->out.label));
    switch (d->out.action) {
    case OUTCOME_ACK:
        outage_reset_backoff(s->outage);
        if (d->retries > 0 && d->out.label == OUTCOME_PROCESSED)
            log_info(&ctx, "processed after %u retries", d->retries);
        else
            log_info(&ctx, "%s", outcome_label_name(d->out.label));
        broker_ack(s->broker, d->msg);
        delivery_count_outcome(d, s->metrics, d->out.label);
        s->retire(s->ctx, d);
        return;
    case OUTCOME_RETRY:
    case OUTCOME_DEAD_LETTER:
        publish_copy(s, d); /* logged when the outcome is final */
        return;
    case OUTCOME_HOLD:
        ctx.outcome = "held";
        log_warn(&ctx, "held until the database is usable: %s", d->job.error);
        outage_begin(s->outage, &d->job);
        outage_hold(s->outage, d);
        return;
    }
}
