/*
 * delivery — see delivery.h. Thread affinity: loop thread.
 */
#include "run/delivery.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A producer-set idemq-retries beyond this is not believed (it only sizes the retry ladder). */
#define MAX_TRUSTED_RETRIES 1000

delivery *delivery_of(store_job *job)
{
    return (delivery *)job;
}

delivery *delivery_new(broker_message *msg, const config_consumer *consumer)
{
    delivery *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->msg = msg;
    d->consumer = consumer;
    int64_t header_value;
    if (message_header_int(&msg->properties, HEADER_RETRIES, &header_value) && header_value > 0)
        d->retries =
            header_value > MAX_TRUSTED_RETRIES ? MAX_TRUSTED_RETRIES : (unsigned)header_value;
    if (message_header_int(&msg->properties, HEADER_FIRST_FAILED_AT, &header_value))
        d->first_failed_at_ms = header_value;
    message_trace_read(&msg->properties, &d->trace);
    amqp_bytes_t parent, state;
    bool has_parent = message_header_bytes(&msg->properties, TRACE_HEADER_TRACEPARENT, &parent);
    bool has_state = message_header_bytes(&msg->properties, TRACE_HEADER_TRACESTATE, &state);
    if (trace_context_read(&d->trace_ctx, has_parent ? parent.bytes : NULL,
                           has_parent ? parent.len : 0, has_state ? state.bytes : NULL,
                           has_state ? state.len : 0) == TRACE_CONTEXT_VALID)
        trace_context_start_span(&d->trace_ctx, trace_span_id_random());
    return d;
}

int delivery_decode(delivery *d, size_t max_body)
{
    const broker_message *msg = d->msg;
    if (broker_message_truncated(msg)) {
        /* Kept to max_body bytes when it arrived (broker/assembly.c): the reason says what was
         * cut. */
        snprintf(d->job.error, sizeof d->job.error,
                 "invalid envelope (too_large): body is %" PRIu64 " bytes, over amqp.max_body (%zu "
                 "bytes); the dead-letter copy keeps only its first %zu bytes "
                 "(header " HEADER_BODY_TRUNCATED " holds the original size)",
                 msg->announced_len, max_body, msg->body_len);
        return -1;
    }
    char content_type[128] = "";
    if (msg->properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
        snprintf(content_type, sizeof content_type, "%.*s", (int)msg->properties.content_type.len,
                 (const char *)msg->properties.content_type.bytes);
    envelope_limits limits = {.max_body = max_body};
    char reason[512];
    int rc = envelope_decode(msg->body, msg->body_len, content_type, &limits, &d->env, reason,
                             sizeof reason);
    if (rc != ENVELOPE_OK) {
        snprintf(d->job.error, sizeof d->job.error, "invalid envelope (%s): %s",
                 envelope_error_name(rc), reason);
        return -1;
    }
    d->decoded = true;
    d->env.trace = d->trace_ctx.status == TRACE_CONTEXT_VALID ? &d->trace_ctx : NULL;
    d->job.kind = STORE_JOB_APPLY;
    d->job.consumer_index = msg->consumer_index;
    d->job.env = &d->env;
    d->job.body = msg->body;
    d->job.body_len = msg->body_len;
    return 0;
}

static const char *or_null(const char *text)
{
    return text && text[0] ? text : NULL;
}

log_context delivery_log_context(const delivery *d, const char *outcome_name)
{
    const char *body_id = d->decoded ? or_null(d->env.message_id) : NULL;
    const char *property_id = or_null(d->trace.message_id);
    log_context ctx = {
        .queue = d->consumer->queue,
        .biz_key = d->decoded ? d->env.biz_key : NULL,
        .message_id = body_id ? body_id : property_id,
        .amqp_message_id = body_id && property_id && strcmp(body_id, property_id) != 0
                               ? property_id
                               : NULL,
        .correlation_id = or_null(d->trace.correlation_id),
        .traceparent = or_null(d->trace.traceparent),
        .trace_id = or_null(d->trace_ctx.trace_id),
        .span_id = or_null(d->trace_ctx.span_id),
        .retries = d->retries,
        .outcome = outcome_name,
    };
    return ctx;
}

void delivery_count_outcome(const delivery *d, metrics *m, outcome_label label)
{
    metrics_count(m, d->msg->consumer_index, label);
    if (label == OUTCOME_PROCESSED && d->retries > 0)
        metrics_retry_recovered(m, d->msg->consumer_index);
    if (label == OUTCOME_DEAD_LETTERED)
        metrics_dead_lettered(m, d->msg->consumer_index, d->out.error_class, d->retries > 0);
}

void delivery_free(delivery *d)
{
    if (!d)
        return;
    if (d->decoded)
        envelope_close(&d->env);
    broker_message_free(d->msg);
    free(d);
}
