/*
 * run — `idemq run`: wires the broker session, the envelope decoder, the store and the policy.
 *
 * A delivery is decoded on the loop thread (a bad body never reaches the database), applied by a
 * DB worker in one transaction, and its outcome is carried out back on the loop thread: ack after
 * the commit, or publish a retry/DLQ copy and ack only after the broker confirmed it. A database
 * outage or a schema error pauses consumption (basic.cancel) and *holds* what comes back
 * unavailable, unacked, until a probe proves the database accepts writes and every statement
 * prepares again; then the held messages run first and consuming resumes. Holding instead of
 * requeueing matters on quorum queues: every requeue spends one of the broker's delivery
 * attempts (20 by default on RabbitMQ 4.x), and a message past the limit is dropped. A held
 * message returns to the queue only when the connection ends (once per connection, e.g. at the
 * broker's consumer_timeout). The retry budget is not burned on infrastructure. SIGTERM stops consuming, lets
 * in-flight work finish and be acked, then closes; a second signal exits at once (the broker
 * redelivers unacked messages and the dedup row settles them). Thread affinity: loop thread.
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "broker/session.h"
#include "broker/topology.h"
#include "db/error.h"
#include "envelope/envelope.h"
#include "handlers/plugin.h"
#include "ops/http.h"
#include "ops/log.h"
#include "ops/metrics.h"
#include "policy/outcome.h"
#include "store/retention.h"
#include "store/store.h"

#define HEALTH_PING_MS 5000
#define PROBE_MIN_MS 500
#define PROBE_MAX_MS 5000
#define MAX_TRUSTED_RETRIES 1000

typedef struct runner runner;

/* One delivery from receipt to its final ack/requeue; owns the message and its envelope. */
typedef struct inflight {
    store_job job;              /* first member: the store hands it back to us */
    runner *r;
    broker_message *msg;
    envelope env;
    bool decoded;
    unsigned retries;           /* idemq-retries of the delivery */
    int64_t first_failed_at_ms; /* 0 when this is the first failure */
    outcome out;
    struct inflight *held_next; /* on runner.held_* while consumption is paused */
} inflight;

struct runner {
    uv_loop_t *loop;
    const config *cfg;
    broker_session *broker;
    store_pool *store;
    broker_session_callbacks callbacks;
    uv_signal_t sigterm, sigint;
    uv_timer_t probe_timer, shutdown_timer, health_timer;
    store_job probe_job;
    bool probe_pending;
    store_job health_job;        /* periodic ping so idemq_up{mysql} is right when idle */
    bool health_pending;
    unsigned probe_attempt;
    bool paused;
    bool paused_for_schema;
    char pause_reason[STORE_ERROR_MAX];
    inflight *held_head, *held_tail; /* unacked, waiting for the database to come back */
    bool stopping;
    bool closed;
    size_t inflight;
    uint64_t rng;
    metrics *metrics;
    http_server *http;           /* /metrics /healthz /readyz */
};

static uint64_t next_random(runner *r)
{
    /* xorshift64*: jitter needs spread, not cryptographic strength. */
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 2685821657736338717ULL;
}

static int64_t now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void close_everything(runner *r);

static void maybe_finish_shutdown(runner *r)
{
    if (r->stopping && !r->closed && r->inflight == 0 && !r->probe_pending && !r->health_pending)
        close_everything(r);
}

static void release(inflight *f)
{
    runner *r = f->r;
    if (f->decoded)
        envelope_close(&f->env);
    metrics_inflight_add(r->metrics, f->msg->consumer_index, -1);
    broker_message_free(f->msg);
    free(f);
    r->inflight--;
    maybe_finish_shutdown(r);
}

static log_context context_of(const inflight *f, const char *outcome_name)
{
    const config_consumer *c = &f->r->cfg->consumers[f->msg->consumer_index];
    log_context ctx = {
        .queue = c->queue,
        .biz_key = f->decoded ? f->env.biz_key : NULL,
        .message_id = f->decoded ? f->env.message_id : NULL,
        .retries = f->retries,
        .outcome = outcome_name,
    };
    return ctx;
}

static void count(inflight *f, outcome_label label)
{
    metrics_count(f->r->metrics, f->msg->consumer_index, label);
    if (label == OUTCOME_PROCESSED && f->retries > 0)
        metrics_retry_recovered(f->r->metrics, f->msg->consumer_index);
}

static void on_copy_confirmed(void *arg, bool confirmed)
{
    inflight *f = arg;
    runner *r = f->r;
    if (confirmed) {
        broker_ack(r->broker, f->msg);
        count(f, f->out.label);
    } else {
        /* The copy may not exist: keep the original (the broker redelivers it). */
        log_context ctx = context_of(f, "requeued");
        log_warn(&ctx, "broker did not confirm the %s copy; requeueing the original",
                 f->out.action == OUTCOME_RETRY ? "retry" : "dead-letter");
        broker_requeue(r->broker, f->msg);
    }
    release(f);
}

static void start_probe(runner *r);

/* Records why consumption is paused; a schema error outranks an outage (it needs a person). */
static void set_pause_reason(runner *r, const store_job *job)
{
    bool schema = db_error_is_schema(job->mysql_errno);
    if (r->paused_for_schema && !schema && job->mysql_errno == 0)
        return; /* "waiting for the probe" says less than the schema error we already have */
    r->paused_for_schema = schema;
    snprintf(r->pause_reason, sizeof r->pause_reason, "%s",
             job->error[0] ? job->error : "database unavailable");
    metrics_set_pause(r->metrics, schema ? METRICS_PAUSE_SCHEMA : METRICS_PAUSE_DATABASE);
}

static void pause_consuming(runner *r, const store_job *job)
{
    bool was_schema = r->paused_for_schema;
    set_pause_reason(r, job);
    if (r->paused) {
        if (r->paused_for_schema && !was_schema)
            log_error(LOG_NO_CONTEXT, "schema error while paused: %s", r->pause_reason);
        return;
    }
    r->paused = true;
    if (r->paused_for_schema)
        log_error(LOG_NO_CONTEXT,
                  "schema error, pausing consumption until every statement prepares again "
                  "(messages are held, not requeued): %s",
                  r->pause_reason);
    else
        log_error(LOG_NO_CONTEXT,
                  "database unavailable, pausing consumption (messages are held, not requeued): "
                  "%s",
                  r->pause_reason);
    broker_set_consuming(r->broker, false);
    /* probe_attempt is not reset here: an outage that flaps keeps its backoff; a message that
     * commits resets it (finish). */
    start_probe(r);
}

/* Keeps f unacked until the database is back: no requeue, so no broker delivery attempt. */
static void hold(inflight *f)
{
    runner *r = f->r;
    f->held_next = NULL;
    if (r->held_tail)
        r->held_tail->held_next = f;
    else
        r->held_head = f;
    r->held_tail = f;
    metrics_held_add(r->metrics, f->msg->consumer_index, 1);
}

static inflight *take_held(runner *r)
{
    inflight *list = r->held_head;
    r->held_head = r->held_tail = NULL;
    for (inflight *f = list; f; f = f->held_next)
        metrics_held_add(r->metrics, f->msg->consumer_index, -1);
    return list;
}

static void submit(inflight *f);

/* The database is back: the held messages go first, then the broker may send more. */
static void resume_consuming(runner *r)
{
    r->paused = false;
    r->paused_for_schema = false;
    r->pause_reason[0] = '\0';
    metrics_set_pause(r->metrics, METRICS_PAUSE_NONE);
    inflight *f = take_held(r);
    size_t resubmitted = 0;
    while (f) {
        inflight *next = f->held_next;
        submit(f);
        resubmitted++;
        f = next;
    }
    log_info(LOG_NO_CONTEXT, "database reachable again, resuming consumption (%zu held message(s) "
             "first)", resubmitted);
    broker_set_consuming(r->broker, true);
}

/* The connection the held messages came on is gone (the broker requeues them, one delivery
 * attempt) or we are stopping (requeue them now: one attempt, and they are not lost). */
static void drop_held(runner *r, bool requeue)
{
    inflight *f = take_held(r);
    while (f) {
        inflight *next = f->held_next;
        if (requeue) {
            broker_requeue(r->broker, f->msg);
            count(f, OUTCOME_REQUEUED);
            log_context ctx = context_of(f, "requeued");
            log_warn(&ctx, "requeued a held message: shutting down while paused");
        }
        release(f);
        f = next;
    }
}

static void publish_copy(inflight *f)
{
    runner *r = f->r;
    const config_consumer *c = &r->cfg->consumers[f->msg->consumer_index];
    char exchange[TOPOLOGY_NAME_MAX], routing_key[TOPOLOGY_NAME_MAX], expiration[32];
    copy_headers headers = {
        .retries = f->out.retries,
        .error_class = error_class_name(f->out.error_class),
        .error = f->job.error[0] ? f->job.error : "unknown error",
        .handler = c->handler_name,
        .queue = c->queue,
        .first_failed_at_ms = f->first_failed_at_ms ? f->first_failed_at_ms : now_ms(),
        .body_truncated_from = broker_message_truncated(f->msg) ? f->msg->announced_len : 0,
    };
    if (f->out.action == OUTCOME_RETRY) {
        topology_retry_exchange(c, exchange, sizeof exchange);
        topology_retry_queue(c, f->out.level, routing_key, sizeof routing_key);
        snprintf(expiration, sizeof expiration, "%" PRIu64, f->out.delay_ms);
        headers.expiration = expiration;
    } else {
        topology_dead_letter_exchange(c, exchange, sizeof exchange);
        snprintf(routing_key, sizeof routing_key, "%s", c->queue);
    }
    int rc = broker_publish_copy(r->broker, f->msg, exchange, routing_key, &headers,
                                 on_copy_confirmed, f);
    if (rc == BROKER_E_STALE) {
        /* Its connection is gone and the broker hands the delivery out again: a copy now would
         * be a second one for the same failure. */
        log_context ctx = context_of(f, "abandoned");
        log_warn(&ctx, "no %s copy: the delivery's connection closed; the broker redelivers it",
                 f->out.action == OUTCOME_RETRY ? "retry" : "dead-letter");
        release(f);
    } else if (rc != 0) {
        broker_requeue(r->broker, f->msg);
        release(f);
    }
}

/* Carries out the policy's decision for a classified message. */
static void finish(inflight *f, apply_status status)
{
    runner *r = f->r;
    const config_consumer *c = &r->cfg->consumers[f->msg->consumer_index];
    f->out = outcome_decide(status, f->retries, &c->retry, next_random(r));
    log_context ctx = context_of(f, outcome_label_name(f->out.label));
    switch (f->out.action) {
    case OUTCOME_ACK:
        r->probe_attempt = 0;
        if (f->retries > 0 && f->out.label == OUTCOME_PROCESSED)
            log_info(&ctx, "processed after %u retries", f->retries);
        else
            log_info(&ctx, "%s", outcome_label_name(f->out.label));
        broker_ack(r->broker, f->msg);
        count(f, f->out.label);
        release(f);
        return;
    case OUTCOME_RETRY:
        log_warn(&ctx, "retry %u of %u in %" PRIu64 " ms: %s", f->out.retries,
                 c->retry.max_retries, f->out.delay_ms, f->job.error);
        publish_copy(f);
        return;
    case OUTCOME_DEAD_LETTER:
        log_error(&ctx, "dead-lettered (%s): %s", error_class_name(f->out.error_class),
                  f->job.error);
        publish_copy(f);
        return;
    case OUTCOME_HOLD:
        ctx.outcome = "held";
        log_warn(&ctx, "held until the database is usable: %s", f->job.error);
        pause_consuming(r, &f->job);
        hold(f);
        return;
    }
}

static void on_applied(store_job *job)
{
    inflight *f = (inflight *)job;
    metrics_observe_handler(f->r->metrics, job->consumer_index, job->duration_ns);
    metrics_set_up(f->r->metrics, METRICS_DEP_MYSQL, job->status != APPLY_UNAVAILABLE);
    finish(f, job->status);
}

static void on_message(void *ctx, broker_message *msg)
{
    runner *r = ctx;
    if (r->stopping) {
        /* Sent before our basic.cancel reached the broker: give it back untouched. */
        broker_requeue(r->broker, msg);
        broker_message_free(msg);
        return;
    }
    inflight *f = calloc(1, sizeof *f);
    if (!f) {
        broker_requeue(r->broker, msg);
        broker_message_free(msg);
        return;
    }
    f->r = r;
    f->msg = msg;
    r->inflight++;
    metrics_inflight_add(r->metrics, msg->consumer_index, 1);
    int64_t header_value;
    if (message_header_int(&msg->properties, HEADER_RETRIES, &header_value) && header_value > 0)
        f->retries = header_value > MAX_TRUSTED_RETRIES ? MAX_TRUSTED_RETRIES
                                                        : (unsigned)header_value;
    if (message_header_int(&msg->properties, HEADER_FIRST_FAILED_AT, &header_value))
        f->first_failed_at_ms = header_value;

    if (broker_message_truncated(msg)) {
        /* Kept to max_body bytes when it arrived (session.c): the reason says what was cut. */
        snprintf(f->job.error, sizeof f->job.error,
                 "invalid envelope (too_large): body is %" PRIu64 " bytes, over amqp.max_body (%zu "
                 "bytes); the dead-letter copy keeps only its first %zu bytes (header "
                 HEADER_BODY_TRUNCATED " holds the original size)",
                 msg->announced_len, r->cfg->max_body, msg->body_len);
        finish(f, APPLY_NON_RETRYABLE);
        return;
    }
    char content_type[128] = "";
    if (msg->properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
        snprintf(content_type, sizeof content_type, "%.*s",
                 (int)msg->properties.content_type.len,
                 (const char *)msg->properties.content_type.bytes);
    envelope_limits limits = {.max_body = r->cfg->max_body};
    char reason[512];
    int rc = envelope_decode(msg->body, msg->body_len, content_type, &limits, &f->env, reason,
                             sizeof reason);
    if (rc != ENVELOPE_OK) {
        snprintf(f->job.error, sizeof f->job.error, "invalid envelope (%s): %s",
                 envelope_error_name(rc), reason);
        finish(f, APPLY_NON_RETRYABLE);
        return;
    }
    f->decoded = true;
    f->job.kind = STORE_JOB_APPLY;
    f->job.consumer_index = msg->consumer_index;
    f->job.env = &f->env;
    f->job.body = msg->body;
    f->job.body_len = msg->body_len;
    f->job.on_done = on_applied;
    if (r->paused) {
        hold(f); /* sent before our basic.cancel reached the broker */
        return;
    }
    submit(f);
}

static void submit(inflight *f)
{
    if (store_submit(f->r->store, &f->job) != 0) {
        broker_requeue(f->r->broker, f->msg);
        release(f);
    }
}

static void on_probe_done(store_job *job)
{
    runner *r = (runner *)((char *)job - offsetof(runner, probe_job));
    r->probe_pending = false;
    metrics_set_up(r->metrics, METRICS_DEP_MYSQL, job->status == APPLY_COMMITTED);
    if (r->stopping) {
        maybe_finish_shutdown(r);
        return;
    }
    if (job->status == APPLY_COMMITTED) {
        resume_consuming(r);
        return;
    }
    set_pause_reason(r, job);
    if (r->paused_for_schema)
        log_error(LOG_NO_CONTEXT, "schema error persists (probe %u): %s", r->probe_attempt,
                  job->error);
    else
        log_warn(LOG_NO_CONTEXT, "database still unavailable (probe %u): %s", r->probe_attempt,
                 job->error);
    start_probe(r);
}

static void on_probe_timer(uv_timer_t *timer)
{
    runner *r = timer->data;
    if (r->stopping)
        return;
    memset(&r->probe_job, 0, sizeof r->probe_job);
    r->probe_job.kind = STORE_JOB_PROBE;
    r->probe_job.on_done = on_probe_done;
    if (store_submit(r->store, &r->probe_job) == 0)
        r->probe_pending = true;
}

static void start_probe(runner *r)
{
    uint64_t delay = PROBE_MIN_MS;
    for (unsigned i = 0; i < r->probe_attempt && delay < PROBE_MAX_MS; i++)
        delay *= 2;
    if (delay > PROBE_MAX_MS)
        delay = PROBE_MAX_MS;
    r->probe_attempt++;
    uv_timer_start(&r->probe_timer, on_probe_timer, delay, 0);
}

static void on_health_done(store_job *job)
{
    runner *r = (runner *)((char *)job - offsetof(runner, health_job));
    r->health_pending = false;
    metrics_set_up(r->metrics, METRICS_DEP_MYSQL, job->status == APPLY_COMMITTED);
    maybe_finish_shutdown(r);
}

static void on_health_timer(uv_timer_t *timer)
{
    runner *r = timer->data;
    if (r->stopping || r->health_pending || r->paused)
        return; /* while paused the outage probe already pings */
    memset(&r->health_job, 0, sizeof r->health_job);
    r->health_job.kind = STORE_JOB_PING;
    r->health_job.on_done = on_health_done;
    if (store_submit(r->store, &r->health_job) == 0)
        r->health_pending = true;
}

static void on_broker_up(void *ctx)
{
    runner *r = ctx;
    metrics_set_up(r->metrics, METRICS_DEP_RABBITMQ, true);
    log_info(LOG_NO_CONTEXT, "RabbitMQ connection ready%s", r->paused ? " (paused)" : "");
}

static void on_broker_down(void *ctx, const char *reason)
{
    runner *r = ctx;
    metrics_set_up(r->metrics, METRICS_DEP_RABBITMQ, false);
    log_warn(LOG_NO_CONTEXT, "RabbitMQ down (%s); unacked deliveries will be redelivered", reason);
    drop_held(r, false);
}

static void log_summary(runner *r)
{
    for (size_t i = 0; i < r->cfg->consumer_count; i++) {
        log_context ctx = {.queue = r->cfg->consumers[i].queue, .retries = -1};
        log_info(&ctx,
                 "summary processed=%" PRIu64 " deduped=%" PRIu64 " state_noop=%" PRIu64
                 " retried=%" PRIu64 " dead_lettered=%" PRIu64 " requeued=%" PRIu64,
                 metrics_get_count(r->metrics, i, OUTCOME_PROCESSED),
                 metrics_get_count(r->metrics, i, OUTCOME_DEDUPED),
                 metrics_get_count(r->metrics, i, OUTCOME_STATE_NOOP),
                 metrics_get_count(r->metrics, i, OUTCOME_RETRIED),
                 metrics_get_count(r->metrics, i, OUTCOME_DEAD_LETTERED),
                 metrics_get_count(r->metrics, i, OUTCOME_REQUEUED));
    }
}

static void close_everything(runner *r)
{
    r->closed = true;
    http_server_free(r->http); /* first: it reads the broker and metrics */
    r->http = NULL;
    /* Store first: its last results may still ack through the broker session. */
    store_pool_free(r->store);
    r->store = NULL;
    broker_session_free(r->broker);
    r->broker = NULL;
    uv_timer_stop(&r->probe_timer);
    uv_timer_stop(&r->shutdown_timer);
    uv_timer_stop(&r->health_timer);
    uv_close((uv_handle_t *)&r->health_timer, NULL);
    uv_close((uv_handle_t *)&r->probe_timer, NULL);
    uv_close((uv_handle_t *)&r->shutdown_timer, NULL);
    uv_close((uv_handle_t *)&r->sigterm, NULL);
    uv_close((uv_handle_t *)&r->sigint, NULL);
    log_summary(r);
}

static void on_shutdown_timeout(uv_timer_t *timer)
{
    runner *r = timer->data;
    /* Not a graceful close: joining the workers could wait for every queued transaction, and
     * results routed now could be confirmed after we stop listening. Exiting leaves everything
     * unacked, which the broker redelivers and the dedup rows settle. */
    log_warn(LOG_NO_CONTEXT,
             "shutdown timeout: %zu message(s) still in flight; exiting, the broker redelivers them",
             r->inflight);
    fflush(stderr);
    _exit(1);
}

/* Installed at the first signal: a second one must work even while the loop is busy. */
static void exit_on_second_signal(int signum)
{
    static const char line[] =
        "{\"level\":\"warn\",\"msg\":\"second signal: exiting now; unacked messages are "
        "redelivered\"}\n";
    (void)signum;
    ssize_t ignored = write(STDERR_FILENO, line, sizeof line - 1);
    (void)ignored;
    _exit(1);
}

static void on_signal(uv_signal_t *handle, int signum)
{
    runner *r = handle->data;
    if (r->stopping) {
        log_warn(LOG_NO_CONTEXT, "second signal: exiting now; unacked messages are redelivered");
        _exit(1);
    }
    log_info(LOG_NO_CONTEXT, "signal %d: stopping consumption, finishing %zu in-flight message(s)",
             signum, r->inflight);
    r->stopping = true;
    uv_signal_stop(&r->sigterm);
    uv_signal_stop(&r->sigint);
    struct sigaction second = {.sa_handler = exit_on_second_signal};
    sigemptyset(&second.sa_mask);
    sigaction(SIGTERM, &second, NULL);
    sigaction(SIGINT, &second, NULL);
    uv_timer_stop(&r->probe_timer);
    uv_timer_stop(&r->health_timer);
    broker_set_consuming(r->broker, false);
    drop_held(r, true);
    uv_timer_start(&r->shutdown_timer, on_shutdown_timeout, r->cfg->shutdown_timeout_ms, 0);
    maybe_finish_shutdown(r);
}

/* /readyz: ready only when connected to both servers, consuming and not pausing or stopping. */
static bool is_ready(void *ctx, char *reason, size_t reason_len)
{
    runner *r = ctx;
    const char *why = NULL;
    if (r->stopping)
        why = "shutting down";
    else if (!r->broker || !broker_is_connected(r->broker))
        why = "not connected to RabbitMQ";
    else if (r->paused) {
        snprintf(reason, reason_len, "consumption paused: %s: %s",
                 r->paused_for_schema ? "schema error" : "database unavailable", r->pause_reason);
        return false;
    }
    else if (!metrics_get_up(r->metrics, METRICS_DEP_MYSQL))
        why = "database unavailable";
    else if (!broker_is_consuming(r->broker))
        why = "not consuming";
    if (why)
        snprintf(reason, reason_len, "%s", why);
    return why == NULL;
}

static int start_http(runner *r)
{
    char err[512], address[128];
    http_server_options opts = {.listen = r->cfg->http_listen, .metrics = r->metrics,
                                .ready = is_ready, .ready_ctx = r};
    if (http_server_new(r->loop, &opts, &r->http, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "http: %s", err);
        return -1;
    }
    if (http_server_address(r->http, address, sizeof address) != 0)
        snprintf(address, sizeof address, "%s", r->cfg->http_listen);
    log_info(LOG_NO_CONTEXT, "http listening on %s", address);
    return 0;
}

static int run_consumers(const config *cfg)
{
    char err[1024];
    int exit_code = 1;
    uv_loop_t *loop = uv_default_loop();
    runner *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    r->metrics = metrics_new(cfg);
    if (!r->metrics) {
        free(r);
        return 1;
    }
    r->loop = loop;
    r->cfg = cfg;
    r->rng = uv_hrtime() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    signal(SIGPIPE, SIG_IGN); /* a scraper resetting mid-response must not kill us (http.h) */
    srand((unsigned)next_random(r));
    r->callbacks = (broker_session_callbacks){
        .ctx = r, .on_message = on_message, .on_up = on_broker_up, .on_down = on_broker_down};

    if (store_pool_new(loop, cfg, &r->store, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "cannot start DB workers: %s", err);
        goto out;
    }
    r->broker = broker_session_new(loop, cfg, &r->callbacks);
    if (!r->broker) {
        log_error(LOG_NO_CONTEXT, "out of memory");
        goto out;
    }
    uv_timer_init(loop, &r->probe_timer);
    uv_timer_init(loop, &r->shutdown_timer);
    uv_timer_init(loop, &r->health_timer);
    r->probe_timer.data = r->shutdown_timer.data = r->health_timer.data = r;
    uv_signal_init(loop, &r->sigterm);
    uv_signal_init(loop, &r->sigint);
    r->sigterm.data = r->sigint.data = r;
    uv_signal_start(&r->sigterm, on_signal, SIGTERM);
    uv_signal_start(&r->sigint, on_signal, SIGINT);

    int rc = broker_session_start(r->broker, err, sizeof err);
    metrics_set_up(r->metrics, METRICS_DEP_RABBITMQ, rc == 0);
    if (rc != 0) {
        log_error(LOG_NO_CONTEXT, "%s", err);
        exit_code = rc == -2 ? EXIT_USAGE : 1;
        r->stopping = true;
        close_everything(r);
        uv_run(loop, UV_RUN_DEFAULT);
        goto out_freed;
    }
    if (start_http(r) != 0) {
        exit_code = 1;
        r->stopping = true;
        close_everything(r);
        uv_run(loop, UV_RUN_DEFAULT);
        goto out_freed;
    }
    uv_timer_start(&r->health_timer, on_health_timer, 0, HEALTH_PING_MS);
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        log_context ctx = {.queue = cfg->consumers[i].queue, .retries = -1};
        log_info(&ctx, "consuming with handler %s (%zu DB workers, prefetch %u)",
                 cfg->consumers[i].handler_name, (size_t)cfg->workers, cfg->prefetch);
    }
    uv_run(loop, UV_RUN_DEFAULT);
    exit_code = 0;
out_freed:
    uv_loop_close(loop);
    metrics_free(r->metrics);
    free(r);
    return exit_code;
out:
    store_pool_free(r->store);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    metrics_free(r->metrics);
    free(r);
    return exit_code;
}

/* Plugins are loaded before anything connects (a bad plugin is a configuration problem: exit 2)
 * and unloaded after the DB workers that call them have been joined; the dedup retention job
 * runs beside the consumers on its own connection. */
int cli_run(const config *cfg)
{
    char err[1024];
    retention *dedup_retention = NULL;
    if (plugin_registry_load(cfg, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "%s", err);
        return EXIT_USAGE;
    }
    if (retention_start(cfg, &dedup_retention, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "cannot start dedup retention: %s", err);
        plugin_registry_unload();
        return 1;
    }
    int exit_code = run_consumers(cfg);
    retention_stop(dedup_retention);
    plugin_registry_unload();
    return exit_code;
}
