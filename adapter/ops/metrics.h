/*
 * metrics — counters, gauges and the handler-duration histogram, rendered in the Prometheus
 * text format (version 0.0.4).
 *
 *   idemq_messages_total{queue,outcome}      processed, deduped, state_noop, retried,
 *                                            dead_lettered, requeued
 *   idemq_retry_recovered_total{queue}       processed after at least one retry
 *   idemq_handler_duration_seconds{queue}    histogram of the DB transaction time
 *   idemq_inflight{queue}                    deliveries received and not yet settled
 *   idemq_held{queue}                        deliveries held unacked while paused
 *   idemq_paused{reason="database"|"schema"} 1 while consumption is paused for that reason
 *   idemq_schema_errors_total                pauses caused by a schema error
 *   idemq_up{dependency="rabbitmq"|"mysql"}  1 when the dependency answers
 *
 * Thread affinity: loop thread only (updates come from the loop after each outcome; the HTTP
 * endpoint renders on the loop too), so no locks.
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
void metrics_observe_handler(metrics *m, size_t consumer, uint64_t duration_ns);
void metrics_inflight_add(metrics *m, size_t consumer, int delta);
void metrics_set_up(metrics *m, metrics_dependency dependency, bool up);
void metrics_held_add(metrics *m, size_t consumer, int delta);
/* Entering METRICS_PAUSE_SCHEMA from another state counts one schema error. */
void metrics_set_pause(metrics *m, metrics_pause pause);
metrics_pause metrics_get_pause(const metrics *m);

uint64_t metrics_get_count(const metrics *m, size_t consumer, outcome_label label);
bool metrics_get_up(const metrics *m, metrics_dependency dependency);

/* Renders everything into a malloc'd NUL-terminated buffer (*out, returned owned) of *len
 * bytes. Returns 0 or -1 (out of memory). */
int metrics_render(const metrics *m, char **out, size_t *len);

#endif
