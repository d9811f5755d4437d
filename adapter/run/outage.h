/*
 * outage — what `idemq run` does while the database is unusable (unreachable, read-only, or a
 * statement no longer prepares: a schema error): consumption is paused (basic.cancel), the
 * deliveries that come back unavailable are *held* unacked instead of requeued, and a probe
 * (connect, accept writes, prepare every statement) runs with backoff until it passes; then the
 * held deliveries are applied first and consuming resumes.
 *
 * Holding instead of requeueing matters on quorum queues: every requeue spends one of the
 * broker's delivery attempts (20 by default on RabbitMQ 4.x), and a message past the limit is
 * dropped. A held delivery returns to the queue only when its connection ends (once per
 * connection, e.g. at the broker's consumer_timeout: outage_drop_held) or at shutdown. A schema
 * error or a TLS error (a certificate that is not trusted or names another host, TLS required
 * on one side only) outranks an outage as the reason shown, and is logged as an error: it needs
 * a person. The retry budget is never spent on infrastructure.
 *
 * Errors: these functions cannot fail. Thread affinity: loop thread.
 */
#ifndef IDEMQ_RUN_OUTAGE_H
#define IDEMQ_RUN_OUTAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "broker/session.h"
#include "ops/metrics.h"
#include "run/delivery.h"
#include "store/store.h"

typedef struct outage_hooks {
    void *ctx;
    /* The database is usable again: apply d (taken) again. */
    void (*resubmit)(void *ctx, delivery *d);
    /* d (taken) leaves the hold list for good (requeued, or its connection is gone): release it. */
    void (*retire)(void *ctx, delivery *d);
    /* A probe came back after outage_stop: a shutdown waiting for it may go on. */
    void (*probe_settled)(void *ctx);
} outage_hooks;

typedef struct outage {
    /* borrowed, must outlive the outage */
    store_pool *store;
    broker_session *broker;
    metrics *metrics;
    outage_hooks hooks;
    /* state */
    bool paused;                     /* consumption paused: deliveries are held */
    bool for_schema;                 /* paused for a schema error, not an unreachable server */
    bool for_tls;                    /* paused because TLS to MySQL fails (db_error_is_tls) */
    bool stopped;                    /* outage_stop ran: no more probes */
    char reason[STORE_ERROR_MAX];    /* why paused, for /readyz and the log */
    delivery *held_head, *held_tail; /* unacked, in arrival order */
    uv_timer_t probe_timer;
    store_job probe_job;
    bool probe_pending;     /* probe_job is with the store */
    unsigned probe_attempt; /* probes since the last commit: the backoff step */
} outage;

/* Caller-owned storage; store, broker and m are borrowed, hooks is copied. Close with
 * outage_close. */
void outage_init(outage *o, uv_loop_t *loop, store_pool *store, broker_session *broker, metrics *m,
                 const outage_hooks *hooks);

/* failed (borrowed for the call) found the database unusable: pause consumption, if not paused
 * already, and start probing; its error becomes the reason (a schema error stays the reason
 * until the outage ends). */
void outage_begin(outage *o, const store_job *failed);

/* Keeps d (taken) unacked until the database is back. */
void outage_hold(outage *o, delivery *d);

/* A message committed: the next outage's probes start again from the shortest delay. */
void outage_reset_backoff(outage *o);

/* Gives up the held deliveries, each to the retire hook. Shutting down, they are logged,
 * counted as requeued and given back together (broker_release: one basic.nack for them all,
 * which spends no delivery attempt on RabbitMQ 4.3). Otherwise their connection is gone and the
 * broker requeued them already. */
void outage_drop_held(outage *o, bool shutting_down);

/* Consumption is paused. */
bool outage_is_paused(const outage *o);

/* A probe is with the store (a shutdown waits for it). */
bool outage_probe_pending(const outage *o);

/* "consumption paused: schema error: <reason>" (or "database unavailable") into buf. */
void outage_describe(const outage *o, char *buf, size_t len);

/* Shutting down: no further probes; one with the store still reports to probe_settled. */
void outage_stop(outage *o);

/* Closes the probe timer (on the loop: keep running it). The hold list must be empty. */
void outage_close(outage *o);

#endif
