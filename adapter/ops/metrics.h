/*
 * metrics — counters, gauges and the handler-duration histogram, rendered in the Prometheus
 * text format (version 0.0.4).
 *
 *   idemq_build_info{version}                1: the version of this binary
 *   idemq_messages_total{queue,outcome}      processed, deduped, state_noop, retried,
 *                                            dead_lettered, requeued
 *   idemq_dead_lettered_total{queue,class}   dead letters by class: non_retryable,
 *                                            retries_exhausted
 *   idemq_retry_recovered_total{queue}       processed after at least one retry
 *   idemq_retry_dead_lettered_total{queue}   dead-lettered after at least one retry
 *   idemq_handler_duration_seconds{queue}    histogram of the DB transaction time (a batch's, per message)
 *   idemq_inflight{queue}                    deliveries received and not yet settled
 *   idemq_held{queue}                        deliveries held unacked while paused
 *   idemq_paused{reason="database"|"schema"} 1 while consumption is paused for that reason
 *   idemq_schema_errors_total                pauses caused by a schema error
 *   idemq_up{dependency="rabbitmq"|"mysql"}  1 when the dependency answers
 *   idemq_mysql_node{node}                   1 for the MySQL node in use (host:port or socket;
 *                                            absent before the first connection; db/nodes.h)
 *   idemq_mysql_failovers_total              times the node in use changed (mysql.urls)
 *   idemq_mysql_commit_conflicts_total       COMMITs a cluster refused for a conflict between
 *                                            nodes, each run again in place
 *   idemq_broker_blocked                     1 while RabbitMQ blocks the connection (a resource
 *                                            alarm: connection.blocked)
 *   idemq_broker_blocked_total               connection.blocked notifications received
 *   idemq_copies_unpublishable_total{queue}  retry/DLQ copies that could not be encoded within
 *                                            frame_max: their originals were rejected to the
 *                                            work queue's own dead-letter route
 *   idemq_consumer_cancels_total{queue}     consumers RabbitMQ cancelled (basic.cancel: a
 *                                            consumer timeout, the queue deleted); subscribed
 *                                            again
 *   idemq_ready                              1 when /readyz answers 200 (asked at each render,
 *                                            when a readiness probe is set)
 *   idemq_outbox_pending                     outbox rows not yet published (state 0), counted
 *                                            by the relay at most once a second
 *   idemq_outbox_oldest_pending_seconds      age of the oldest of them (0: none)
 *   idemq_outbox_published_total             outbox rows this process published (confirmed)
 *   idemq_outbox_unroutable_total            outbox rows this process marked unroutable
 *   idemq_outbox_relay_leader                1 while this instance's relay holds the lease
 *                                            (the five outbox series: read from the relay at
 *                                            each render, when an outbox probe is set)
 *   process_*                                the standard process metrics, read from /proc at
 *                                            each render (left out where /proc cannot be read):
 *                                            cpu_seconds_total, resident_memory_bytes,
 *                                            virtual_memory_bytes, open_fds, max_fds,
 *                                            start_time_seconds
 *
 * Thread affinity: loop thread only (updates come from the loop after each outcome; the HTTP
 * endpoint renders on the loop too), so no locks. Rendering reads local /proc files, never the
 * network.
 */
#ifndef IDEMQ_METRICS_H
#define IDEMQ_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "policy/outcome.h"

typedef enum metrics_dependency {
    METRICS_DEP_RABBITMQ = 0,
    METRICS_DEP_MYSQL = 1,
} metrics_dependency;

typedef enum metrics_pause {
    METRICS_PAUSE_NONE = 0,
    METRICS_PAUSE_DATABASE,  /* unreachable, lost, read-only */
    METRICS_PAUSE_SCHEMA,    /* a table, column or grant a statement needs is missing */
    METRICS_PAUSE_TLS,       /* TLS to MySQL fails: certificate, or TLS required vs disabled */
} metrics_pause;

typedef struct metrics metrics;

/* cfg is borrowed (queue names) and must outlive the metrics. NULL when out of memory. */
metrics *metrics_new(const config *cfg);
void metrics_free(metrics *m);

void metrics_count(metrics *m, size_t consumer, outcome_label label);
void metrics_retry_recovered(metrics *m, size_t consumer);
/* A dead letter confirmed by the broker: cls is its idemq-error-class (non_retryable or
 * retries_exhausted; anything else counts nowhere), after_retry whether the delivery had been
 * retried before (idemq-retries > 0), which counts it as a failed retry too. */
void metrics_dead_lettered(metrics *m, size_t consumer, error_class cls, bool after_retry);
void metrics_observe_handler(metrics *m, size_t consumer, uint64_t duration_ns);
void metrics_inflight_add(metrics *m, size_t consumer, int delta);
void metrics_set_up(metrics *m, metrics_dependency dependency, bool up);
void metrics_held_add(metrics *m, size_t consumer, int delta);
/* A blocked → true transition counts one idemq_broker_blocked_total. */
void metrics_set_broker_blocked(metrics *m, bool blocked);
void metrics_copy_unpublishable(metrics *m, size_t consumer);
/* A delivery of consumer's queue settled as deduped from dedup.cache (run/seen_keys.h). */
void metrics_seen_key_hit(metrics *m, size_t consumer);
/* RabbitMQ cancelled the consumer of consumer's queue (basic.cancel). */
void metrics_consumer_cancelled(metrics *m, size_t consumer);
/* Entering METRICS_PAUSE_SCHEMA from another state counts one schema error. */
void metrics_set_pause(metrics *m, metrics_pause pause);
metrics_pause metrics_get_pause(const metrics *m);

/* The readiness answer idemq_ready renders (the same callback as /readyz: it must not block);
 * ready NULL leaves idemq_ready out. ctx is borrowed and must outlive the metrics' last render. */
typedef bool (*metrics_ready_fn)(void *ctx, char *reason, size_t reason_len);
void metrics_set_ready_probe(metrics *m, metrics_ready_fn ready, void *ctx);

/* What the outbox relay reports (outbox/relay.h), read at each render: it must not block. A
 * struct of its own so that this header does not depend on the relay. */
typedef struct metrics_outbox_sample {
    uint64_t pending;
    double oldest_pending_s;
    uint64_t published_total;
    uint64_t unroutable_total;
    bool leader;
} metrics_outbox_sample;
typedef void (*metrics_outbox_fn)(void *ctx, metrics_outbox_sample *out);
/* read NULL (the default) leaves the idemq_outbox_* series out. ctx is borrowed and must outlive
 * the metrics' last render (or the next call). */
void metrics_set_outbox_probe(metrics *m, metrics_outbox_fn read, void *ctx);

uint64_t metrics_get_count(const metrics *m, size_t consumer, outcome_label label);
bool metrics_get_up(const metrics *m, metrics_dependency dependency);

/* Renders everything into a malloc'd NUL-terminated buffer (*out, returned owned) of *len
 * bytes. Returns 0 or -1 (out of memory). */
int metrics_render(const metrics *m, char **out, size_t *len);

#endif
