/*
 * outage — see outage.h. Thread affinity: loop thread.
 */
#include "run/outage.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ops/log.h"
#include "policy/backoff.h"
#include "db/error.h"

/* No jitter: one instance's probes need no spreading, and the first one comes soon. */
static const backoff_policy probe_backoff = {.initial_ms = 500, .max_ms = 5000};

static void start_probe(outage *o);

/* Records why consumption is paused; a schema or TLS error outranks an outage (it needs a
 * person). */
static void set_reason(outage *o, const store_job *job)
{
    bool schema = db_error_is_schema(job->mysql_errno);
    bool tls = db_error_is_tls(job->mysql_errno);
    if ((o->for_schema || o->for_tls) && !schema && !tls && job->mysql_errno == 0)
        return; /* "waiting for the probe" says less than the error we already have */
    o->for_schema = schema;
    o->for_tls = tls;
    snprintf(o->reason, sizeof o->reason, "%s",
             job->error[0] ? job->error : "database unavailable");
    metrics_set_pause(o->metrics, tls      ? METRICS_PAUSE_TLS
                                  : schema ? METRICS_PAUSE_SCHEMA
                                           : METRICS_PAUSE_DATABASE);
}

void outage_begin(outage *o, const store_job *failed)
{
    bool was_schema = o->for_schema, was_tls = o->for_tls;
    set_reason(o, failed);
    if (o->paused) {
        if (o->for_schema && !was_schema)
            log_error(LOG_NO_CONTEXT, "schema error while paused: %s", o->reason);
        if (o->for_tls && !was_tls)
            log_error(LOG_NO_CONTEXT, "TLS error while paused: %s", o->reason);
        return;
    }
    o->paused = true;
    if (o->for_tls)
        log_error(LOG_NO_CONTEXT,
                  "TLS error connecting to MySQL, pausing consumption until a connection passes "
                  "mysql.tls (messages are held, not requeued): %s",
                  o->reason);
    else if (o->for_schema)
        log_error(LOG_NO_CONTEXT,
                  "schema error, pausing consumption until every statement prepares again "
                  "(messages are held, not requeued): %s",
                  o->reason);
    else
        log_error(LOG_NO_CONTEXT,
                  "database unavailable, pausing consumption (messages are held, not requeued): "
                  "%s",
                  o->reason);
    broker_set_consuming(o->broker, false);
    /* probe_attempt is not reset here: an outage that flaps keeps its backoff; a message that
     * commits resets it (outage_reset_backoff). */
    start_probe(o);
}

void outage_hold(outage *o, delivery *d)
{
    d->held_next = NULL;
    if (o->held_tail)
        o->held_tail->held_next = d;
    else
        o->held_head = d;
    o->held_tail = d;
    metrics_held_add(o->metrics, d->msg->consumer_index, 1);
}

static delivery *take_held(outage *o)
{
    delivery *list = o->held_head;
    o->held_head = o->held_tail = NULL;
    for (delivery *d = list; d; d = d->held_next)
        metrics_held_add(o->metrics, d->msg->consumer_index, -1);
    return list;
}

/* The database is back: the held deliveries go first, then the broker may send more. */
static void resume_consuming(outage *o)
{
    o->paused = false;
    o->for_schema = false;
    o->for_tls = false;
    o->reason[0] = '\0';
    metrics_set_pause(o->metrics, METRICS_PAUSE_NONE);
    delivery *d = take_held(o);
    size_t resubmitted = 0;
    while (d) {
        delivery *next = d->held_next;
        o->hooks.resubmit(o->hooks.ctx, d);
        resubmitted++;
        d = next;
    }
    log_info(LOG_NO_CONTEXT,
             "database reachable again, resuming consumption (%zu held message(s) "
             "first)",
             resubmitted);
    broker_set_consuming(o->broker, true);
}

void outage_drop_held(outage *o, bool shutting_down)
{
    delivery *d = take_held(o);
    while (d) {
        delivery *next = d->held_next;
        if (shutting_down) {
            broker_release(o->broker, d->msg); /* one nack for them all, not one each */
            delivery_count_outcome(d, o->metrics, OUTCOME_REQUEUED);
            log_context ctx = delivery_log_context(d, "requeued");
            log_warn(&ctx, "requeued a held message: shutting down while paused");
        }
        o->hooks.retire(o->hooks.ctx, d);
        d = next;
    }
}

static void on_probe_done(store_job *job)
{
    outage *o = (outage *)((char *)job - offsetof(outage, probe_job));
    o->probe_pending = false;
    metrics_set_up(o->metrics, METRICS_DEP_MYSQL, job->status == APPLY_COMMITTED);
    if (o->stopped) {
        o->hooks.probe_settled(o->hooks.ctx);
        return;
    }
    if (job->status == APPLY_COMMITTED) {
        resume_consuming(o);
        return;
    }
    bool was_tls = o->for_tls;
    set_reason(o, job);
    if (o->for_tls)
        log_error(LOG_NO_CONTEXT, "TLS error %s (probe %u): %s",
                  was_tls ? "persists" : "while paused", o->probe_attempt, job->error);
    else if (o->for_schema)
        log_error(LOG_NO_CONTEXT, "schema error persists (probe %u): %s", o->probe_attempt,
                  job->error);
    else
        log_warn(LOG_NO_CONTEXT, "database still unavailable (probe %u): %s", o->probe_attempt,
                 job->error);
    start_probe(o);
}

static void on_probe_timer(uv_timer_t *timer)
{
    outage *o = timer->data;
    if (o->stopped)
        return;
    memset(&o->probe_job, 0, sizeof o->probe_job);
    o->probe_job.kind = STORE_JOB_PROBE;
    o->probe_job.on_done = on_probe_done;
    if (store_submit(o->store, &o->probe_job) == 0)
        o->probe_pending = true;
}

static void start_probe(outage *o)
{
    uint64_t delay = backoff_delay_ms(&probe_backoff, o->probe_attempt, 0);
    o->probe_attempt++;
    uv_timer_start(&o->probe_timer, on_probe_timer, delay, 0);
}

void outage_init(outage *o, uv_loop_t *loop, store_pool *store, broker_session *broker, metrics *m,
                 const outage_hooks *hooks)
{
    memset(o, 0, sizeof *o);
    o->store = store;
    o->broker = broker;
    o->metrics = m;
    o->hooks = *hooks;
    uv_timer_init(loop, &o->probe_timer);
    o->probe_timer.data = o;
}

void outage_reset_backoff(outage *o)
{
    o->probe_attempt = 0;
}

bool outage_is_paused(const outage *o)
{
    return o->paused;
}

bool outage_probe_pending(const outage *o)
{
    return o->probe_pending;
}

void outage_describe(const outage *o, char *buf, size_t len)
{
    snprintf(buf, len, "consumption paused: %s: %s",
             o->for_tls      ? "TLS error"
             : o->for_schema ? "schema error"
                             : "database unavailable",
             o->reason);
}

void outage_stop(outage *o)
{
    o->stopped = true;
    uv_timer_stop(&o->probe_timer);
}

void outage_close(outage *o)
{
    uv_timer_stop(&o->probe_timer);
    uv_close((uv_handle_t *)&o->probe_timer, NULL);
}
