/*
 * run — `idemq run`: wires the broker session, the store, the HTTP endpoint and the delivery
 * pipeline (adapter/run/), and owns signals and shutdown.
 *
 * Nothing here waits on the network: the broker connection is the broker thread's
 * (broker/session.h) and the database the DB workers' (store/store.h), so /healthz, /readyz and
 * /metrics answer at once whatever the servers do. The HTTP endpoint starts first; a broker or a
 * database that is down at start-up is waited for, with /readyz saying why; only a refusal (bad
 * credentials, a topology conflict) or a configuration error ends the run (exit 2).
 * A delivery is decoded before it reaches the database (a bad body never does; a large body is
 * decoded on libuv's thread pool so the loop is never busy for long), applied by a DB worker in
 * one transaction, and its outcome is carried out back on the loop thread (run/settle.h): ack
 * after the commit, or publish a retry/DLQ copy and ack only after the broker confirmed it. Every
 * outcome is logged once it is final, with one count in idemq_messages_total. A database
 * outage or a schema error pauses consumption and holds what comes back unavailable, unacked,
 * until a probe passes (run/outage.h). Where a consumer emits, the outbox relay
 * (outbox/relay.h) runs on its own thread and connections; the workers wake it after each
 * COMMIT that wrote rows. SIGTERM stops consuming, lets in-flight work finish and be acked,
 * then stops the relay and closes; a second signal exits at once (the broker redelivers unacked
 * messages and the dedup row settles them). Thread affinity: loop thread.
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "broker/session.h"
#include "broker/tls.h"
#include "db/connect.h"
#include "db/error.h"
#include "db/nodes.h"
#include "handlers/plugin.h"
#include "ops/http_server.h"
#include "ops/log.h"
#include "ops/metrics.h"
#include "ops/sd_notify.h"
#include "outbox/relay.h"
#include "policy/outcome.h"
#include "run/delivery.h"
#include "run/outage.h"
#include "run/settle.h"
#include "store/health.h"
#include "store/retention.h"
#include "store/rotation.h"
#include "store/store.h"
#include "util/monotonic.h"
#include "util/rng.h"

/* How often the loop reads the database health monitor (store/health.h) into idemq_up{mysql}
 * and the log; the monitor itself probes every second on its own thread. */
#define HEALTH_POLL_MS 500
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
/* Bodies above this are decoded off the loop: 900 KB of JSON takes milliseconds to parse. */
#define DECODE_OFF_LOOP_BYTES (64 * 1024)

/* Where the run is between start and exit. */
typedef enum run_state {
    RUN_ACTIVE,   /* consuming, or paused by an outage */
    RUN_STOPPING, /* a signal came (or start failed): no new deliveries, in-flight ones settle */
    RUN_CLOSED,   /* close_everything ran: handles are closing and uv_run is about to return */
} run_state;

typedef struct runner {
    uv_loop_t *loop;
    const config *cfg;
    broker_session *broker;
    store_pool *store;
    broker_session_callbacks callbacks;
    settler settler;  /* carries out outcomes */
    seen_keys *seen;  /* dedup.cache (NULL: off), lent to the settler */
    outage outage;    /* pause, hold, probe */
    uv_signal_t sigterm, sigint;
    uv_timer_t shutdown_timer, health_timer;
    db_health *db_health; /* its own thread and connection: never behind busy workers */
    outbox_relay *relay;  /* NULL unless a consumer emits and outbox.relay is on */
    bool db_healthy;      /* what the last poll of db_health said (for the transition log) */
    run_state state;
    int exit_code;         /* what run_consumers returns once the loop ends */
    bool announced;        /* the consumers were logged (at the first connection) */
    size_t inflight_count; /* deliveries received and not yet retired */
    metrics *metrics;
    http_server *http; /* /metrics /healthz /readyz */
    sd_notify notify;  /* systemd's Type=notify; disabled without $NOTIFY_SOCKET */
    bool notified_ready;
} runner;

static void close_everything(runner *r);

static void maybe_finish_shutdown(runner *r)
{
    if (r->state == RUN_STOPPING && r->inflight_count == 0 &&
        !outage_probe_pending(&r->outage))
        close_everything(r);
}

/* d is settled (acked, requeued or abandoned): free it, and finish a shutdown waiting for it. */
static void retire_delivery(void *ctx, delivery *d)
{
    runner *r = ctx;
    metrics_inflight_add(r->metrics, d->msg->consumer_index, -1);
    delivery_free(d);
    r->inflight_count--;
    maybe_finish_shutdown(r);
}

static void submit_delivery(void *ctx, delivery *d)
{
    runner *r = ctx;
    if (store_submit(r->store, &d->job) != 0) {
        log_context log_ctx = delivery_log_context(d, outcome_label_name(OUTCOME_REQUEUED));
        log_warn(&log_ctx, "requeued: the DB workers are shutting down");
        broker_nack_requeue(r->broker, d->msg);
        delivery_count_outcome(d, r->metrics, OUTCOME_REQUEUED);
        retire_delivery(r, d);
    }
}

static void on_probe_settled(void *ctx)
{
    maybe_finish_shutdown(ctx);
}

/* Counts and logs a delivery given back untouched before it became a delivery of ours. While
 * stopping, such deliveries go back together (broker_release), as the channel closes soon. */
static void give_back(runner *r, broker_message *msg, const char *why)
{
    log_context ctx = {.queue = r->cfg->consumers[msg->consumer_index].queue, .retries = -1,
                       .outcome = outcome_label_name(OUTCOME_REQUEUED)};
    log_info(&ctx, "requeued: %s", why);
    metrics_count(r->metrics, msg->consumer_index, OUTCOME_REQUEUED);
    if (r->state == RUN_ACTIVE)
        broker_nack_requeue(r->broker, msg);
    else
        broker_release(r->broker, msg);
    broker_message_free(msg);
}

/* The decoded (or undecodable) delivery goes on to the database, or to the hold list. */
static void continue_delivery(runner *r, delivery *d)
{
    if (d->decode_rc != 0) {
        settle_delivery(&r->settler, d, APPLY_NON_RETRYABLE);
        return;
    }
    d->job.on_done = settle_applied;
    /* A copy of a key this instance saw committed needs no transaction, nor the database up. */
    if (r->seen && seen_keys_contains(r->seen, d->consumer->handler_name, d->env.biz_key,
                                      (uint64_t)monotonic_ms())) {
        metrics_seen_key_hit(r->metrics, d->msg->consumer_index);
        settle_delivery(&r->settler, d, APPLY_DUPLICATE);
        return;
    }
    if (outage_is_paused(&r->outage)) {
        outage_hold(&r->outage, d); /* sent before our basic.cancel reached the broker */
        return;
    }
    submit_delivery(r, d);
}

static void decode_on_pool(uv_work_t *work)
{
    delivery *d = container_of(work, delivery, decode_work);
    runner *r = work->data;
    d->decode_rc = delivery_decode(d, r->cfg->max_body); /* cfg is read-only: safe here */
}

static void after_decode_on_pool(uv_work_t *work, int status)
{
    delivery *d = container_of(work, delivery, decode_work);
    runner *r = work->data;
    if (status != 0) /* not cancelled by us; decode here then */
        d->decode_rc = delivery_decode(d, r->cfg->max_body);
    continue_delivery(r, d);
}

static void on_message(void *ctx, broker_message *msg)
{
    runner *r = ctx;
    if (r->state != RUN_ACTIVE) {
        /* Sent before our basic.cancel reached the broker: give it back untouched. */
        give_back(r, msg, "arrived while shutting down");
        return;
    }
    delivery *d = delivery_new(msg, &r->cfg->consumers[msg->consumer_index]);
    if (!d) {
        give_back(r, msg, "out of memory");
        return;
    }
    d->settler = &r->settler;
    r->inflight_count++;
    metrics_inflight_add(r->metrics, msg->consumer_index, 1);
    if (msg->body_len > DECODE_OFF_LOOP_BYTES) {
        d->decode_work.data = r;
        if (uv_queue_work(r->loop, &d->decode_work, decode_on_pool, after_decode_on_pool) == 0)
            return;
    }
    d->decode_rc = delivery_decode(d, r->cfg->max_body);
    continue_delivery(r, d);
}

static void on_health_timer(uv_timer_t *timer)
{
    runner *r = timer->data;
    char reason[1024];
    bool ok = db_health_ok(r->db_health, reason, sizeof reason);
    metrics_set_up(r->metrics, METRICS_DEP_MYSQL, ok);
    if (ok != r->db_healthy) {
        if (ok)
            log_info(LOG_NO_CONTEXT, "database health probe passes again");
        else
            log_warn(LOG_NO_CONTEXT, "database health probe fails: %s", reason);
    }
    r->db_healthy = ok;
}

static void on_broker_up(void *ctx)
{
    runner *r = ctx;
    if (!r->announced) { /* once, when the first connection works */
        r->announced = true;
        for (size_t i = 0; i < r->cfg->consumer_count; i++) {
            log_context log_ctx = {.queue = r->cfg->consumers[i].queue, .retries = -1};
            log_info(&log_ctx, "consuming with handler %s (%zu DB workers, prefetch %u)",
                     r->cfg->consumers[i].handler_name, (size_t)r->cfg->workers,
                     r->cfg->prefetch);
        }
    }
    metrics_set_up(r->metrics, METRICS_DEP_RABBITMQ, true);
    log_info(LOG_NO_CONTEXT, "RabbitMQ connection ready%s",
             outage_is_paused(&r->outage) ? " (paused)" : "");
}

static void on_broker_down(void *ctx, const char *reason)
{
    runner *r = ctx;
    metrics_set_up(r->metrics, METRICS_DEP_RABBITMQ, false);
    log_warn(LOG_NO_CONTEXT, "RabbitMQ down (%s); unacked deliveries will be redelivered", reason);
    if (r->state == RUN_ACTIVE) /* `systemctl status` must not keep saying "consuming" */
        sd_notify_send(&r->notify, "STATUS=RabbitMQ connection lost, reconnecting (see /readyz)");
    outage_drop_held(&r->outage, false);
}

static void on_broker_blocked(void *ctx, const char *reason)
{
    runner *r = ctx;
    metrics_set_broker_blocked(r->metrics, reason != NULL);
    if (reason)
        log_warn(LOG_NO_CONTEXT,
                 "RabbitMQ blocked the connection (resource alarm: %s): taking no new deliveries "
                 "and holding retry/DLQ copies unsent until it clears",
                 reason);
    else
        log_info(LOG_NO_CONTEXT, "RabbitMQ unblocked the connection: resuming");
}

/* READY=1 waits for the first time every consumer is subscribed, not for the process to start:
 * `systemctl start` (and units ordered after idemq) then return once messages are taken. */
static void on_consuming(void *ctx, bool consuming)
{
    runner *r = ctx;
    char state[128];
    if (r->state != RUN_ACTIVE)
        return;
    if (consuming)
        snprintf(state, sizeof state, "%sSTATUS=consuming from %zu queue(s)",
                 r->notified_ready ? "" : "READY=1\n", r->cfg->consumer_count);
    else
        snprintf(state, sizeof state, "STATUS=paused, not consuming (see /readyz)");
    sd_notify_send(&r->notify, state);
    r->notified_ready = r->notified_ready || consuming;
}

/* Logged by the session, which subscribes the consumer again. */
static void on_consumer_cancelled(void *ctx, size_t consumer_index)
{
    runner *r = ctx;
    metrics_consumer_cancelled(r->metrics, consumer_index);
}

static void begin_stopping(runner *r);

static void on_broker_fatal(void *ctx, int code, const char *reason)
{
    runner *r = ctx;
    (void)reason; /* logged by the session */
    if (r->state != RUN_ACTIVE)
        return;
    r->exit_code = code == BROKER_E_REFUSED ? EXIT_USAGE : 1;
    begin_stopping(r);
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
    r->state = RUN_CLOSED;
    http_server_free(r->http); /* first: it reads the broker and metrics */
    r->http = NULL;
    /* Store first: its last results may still ack through the broker session. */
    store_pool_free(r->store);
    r->store = NULL;
    /* After the store: the last commits' rows are published (or left for the next relay) and
     * the lease is released, so a standby takes over at once. */
    outbox_relay_stop(r->relay);
    r->relay = NULL;
    db_health_free(r->db_health);
    r->db_health = NULL;
    broker_session_free(r->broker);
    r->broker = NULL;
    outage_close(&r->outage);
    uv_timer_stop(&r->shutdown_timer);
    uv_timer_stop(&r->health_timer);
    uv_close((uv_handle_t *)&r->health_timer, NULL);
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
             r->inflight_count);
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

/* No new deliveries; in-flight ones settle; then close_everything. */
static void begin_stopping(runner *r)
{
    r->state = RUN_STOPPING;
    /* systemd then waits TimeoutStopSec (the unit sets it above shutdown_timeout), not its
     * start timeout, and shows the unit as deactivating. */
    char state[96];
    snprintf(state, sizeof state, "STOPPING=1\nSTATUS=stopping, finishing %zu in-flight message(s)",
             r->inflight_count);
    sd_notify_send(&r->notify, state);
    uv_signal_stop(&r->sigterm);
    uv_signal_stop(&r->sigint);
    struct sigaction second = {.sa_handler = exit_on_second_signal};
    sigemptyset(&second.sa_mask);
    sigaction(SIGTERM, &second, NULL);
    sigaction(SIGINT, &second, NULL);
    outage_stop(&r->outage);
    uv_timer_stop(&r->health_timer);
    broker_set_consuming(r->broker, false);
    /* A resource alarm can last: copies it holds unsent are given up, their originals go back. */
    broker_abandon_held_publishes(r->broker);
    outage_drop_held(&r->outage, true);
    uv_timer_start(&r->shutdown_timer, on_shutdown_timeout, r->cfg->shutdown_timeout_ms, 0);
    maybe_finish_shutdown(r);
}

static void on_signal(uv_signal_t *handle, int signum)
{
    runner *r = handle->data;
    if (r->state != RUN_ACTIVE) {
        log_warn(LOG_NO_CONTEXT, "second signal: exiting now; unacked messages are redelivered");
        _exit(1);
    }
    log_info(LOG_NO_CONTEXT, "signal %d: stopping consumption, finishing %zu in-flight message(s)",
             signum, r->inflight_count);
    begin_stopping(r);
}

/* The monitor's answer, written to idemq_up{mysql} as well: a /readyz answer and the metric
 * scraped after it never disagree (the poll timer alone could lag by HEALTH_POLL_MS). */
static bool db_health_ok_synced(runner *r, char *reason, size_t reason_len)
{
    bool ok = db_health_ok(r->db_health, reason, reason_len);
    metrics_set_up(r->metrics, METRICS_DEP_MYSQL, ok);
    return ok;
}

/* /readyz: ready only when the broker connection works (connected, not blocked, answering),
 * the database answers, and idemq consumes (not paused, not stopping). Waits on nothing. */
static bool is_ready(void *ctx, char *reason, size_t reason_len)
{
    runner *r = ctx;
    const char *why = NULL;
    if (r->state != RUN_ACTIVE)
        why = "shutting down";
    else if (!r->broker)
        why = "not connected to RabbitMQ";
    else if (broker_describe_unready(r->broker, reason, reason_len))
        return false;
    else if (outage_is_paused(&r->outage)) {
        outage_describe(&r->outage, reason, reason_len);
        return false;
    } else if (!db_health_ok_synced(r, reason, reason_len)) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", reason);
        snprintf(reason, reason_len, "database unavailable: %s", detail);
        return false;
    } else if (r->relay && outbox_relay_stuck(r->relay, reason, reason_len))
        return false;
    else if (!broker_is_consuming(r->broker))
        why = "not consuming";
    if (why) {
        snprintf(reason, reason_len, "%s", why);
        return false;
    }
    reason[0] = '\0';
    if (r->cfg->mysql_url_count > 1) {
        char node[520];
        db_nodes_current(node, sizeof node);
        snprintf(reason, reason_len, "MySQL node %s", node);
    }
    return true;
}

static int start_http(runner *r)
{
    char err[512], address[128];
    http_server_options opts = {.listen = r->cfg->http_listen, .metrics = r->metrics,
                                .ready = is_ready, .ready_ctx = r};
    metrics_set_ready_probe(r->metrics, is_ready, r); /* idemq_ready: the /readyz answer */
    if (http_server_new(r->loop, &opts, &r->http, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "http: %s", err);
        return -1;
    }
    if (http_server_address(r->http, address, sizeof address) != 0)
        snprintf(address, sizeof address, "%s", r->cfg->http_listen);
    log_info(LOG_NO_CONTEXT, "http listening on %s", address);
    return 0;
}

static void notify_relay(void *ctx)
{
    outbox_relay_notify(ctx);
}

/* The relay runs where a consumer emits (a plugin may) and outbox.relay is on; its lease owner
 * names this process for the lease row and the logs. The workers wake it after each COMMIT that
 * wrote rows. */
static int start_relay(runner *r, const db_dsn *dsn, char *err, size_t err_len)
{
    if (!r->cfg->outbox_needed || !r->cfg->outbox.relay)
        return 0;
    char host[64] = "", owner[OUTBOX_RELAY_OWNER_MAX];
    rng random; /* two containers may share a host name and a pid */
    rng_init(&random, (uint64_t)getpid());
    gethostname(host, sizeof host - 1);
    snprintf(owner, sizeof owner, "%.63s:%ld:%016" PRIx64, host[0] ? host : "idemq",
             (long)getpid(), rng_next(&random));
    if (outbox_relay_start(r->cfg, dsn, owner, &r->relay, err, err_len) != 0)
        return -1;
    store_pool_set_outbox_notify(r->store, notify_relay, r->relay);
    metrics_set_outbox_probe(r->metrics, outbox_relay_metrics_probe, r->relay);
    log_info(LOG_NO_CONTEXT, "outbox relay started (lease owner %s)", owner);
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
    if (sd_notify_init(&r->notify, err, sizeof err) != 0)
        log_warn(LOG_NO_CONTEXT, "%s; not notifying the service manager", err);
    signal(SIGPIPE, SIG_IGN); /* a scraper resetting mid-response must not kill us (http_server) */
    r->callbacks = (broker_session_callbacks){.ctx = r,
                                              .on_message = on_message,
                                              .on_up = on_broker_up,
                                              .on_down = on_broker_down,
                                              .on_blocked = on_broker_blocked,
                                              .on_consumer_cancelled = on_consumer_cancelled,
                                              .on_consuming = on_consuming,
                                              .on_fatal = on_broker_fatal};

    if (cfg->dedup.cache && !(r->seen = seen_keys_new(cfg->dedup.cache, cfg->dedup.cache_ttl_ms))) {
        log_error(LOG_NO_CONTEXT, "out of memory for dedup.cache (%u keys)", cfg->dedup.cache);
        goto out;
    }
    if (store_pool_new(loop, cfg, &r->store, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "cannot start DB workers: %s", err);
        goto out;
    }
    db_dsn dsn;
    int health_rc = db_dsn_from_config(cfg, &dsn, err, sizeof err);
    if (health_rc == 0)
        health_rc = db_health_start(&dsn, NULL, &r->db_health, err, sizeof err);
    if (health_rc != 0) {
        explicit_bzero(dsn.password, sizeof dsn.password);
        log_error(LOG_NO_CONTEXT, "cannot start the database health monitor: %s", err);
        goto out;
    }
    int relay_rc = start_relay(r, &dsn, err, sizeof err);
    explicit_bzero(dsn.password, sizeof dsn.password);
    if (relay_rc != 0) {
        log_error(LOG_NO_CONTEXT, "cannot start the outbox relay: %s", err);
        goto out;
    }
    r->broker = broker_session_new(loop, cfg, &r->callbacks);
    if (!r->broker) {
        log_error(LOG_NO_CONTEXT, "out of memory");
        goto out;
    }
    outage_hooks hooks = {.ctx = r,
                          .resubmit = submit_delivery,
                          .retire = retire_delivery,
                          .probe_settled = on_probe_settled};
    outage_init(&r->outage, loop, r->store, r->broker, r->metrics, &hooks);
    r->settler = (settler){.broker = r->broker, .metrics = r->metrics, .outage = &r->outage,
                           .retire = retire_delivery, .ctx = r};
    r->settler.seen = r->seen;
    rng_init(&r->settler.random, (uint64_t)(uintptr_t)r);
    uv_timer_init(loop, &r->shutdown_timer);
    uv_timer_init(loop, &r->health_timer);
    r->shutdown_timer.data = r->health_timer.data = r;
    uv_signal_init(loop, &r->sigterm);
    uv_signal_init(loop, &r->sigint);
    r->sigterm.data = r->sigint.data = r;
    uv_signal_start(&r->sigterm, on_signal, SIGTERM);
    uv_signal_start(&r->sigint, on_signal, SIGINT);

    const char *tls_warning = broker_tls_warning(cfg->amqp_urls[0], &cfg->amqp_tls);
    if (tls_warning)
        log_warn(LOG_NO_CONTEXT, "%s", tls_warning);
    /* HTTP first: /healthz answers, and /readyz says why not, while the servers are awaited. */
    if (start_http(r) != 0) {
        exit_code = 1;
        r->state = RUN_STOPPING;
        close_everything(r);
        uv_run(loop, UV_RUN_DEFAULT);
        goto out_freed;
    }
    if (broker_session_start(r->broker, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "%s", err);
        exit_code = 1;
        r->state = RUN_STOPPING;
        close_everything(r);
        uv_run(loop, UV_RUN_DEFAULT);
        goto out_freed;
    }
    r->db_healthy = true; /* the first failing poll logs */
    uv_timer_start(&r->health_timer, on_health_timer, HEALTH_POLL_MS, HEALTH_POLL_MS);
    uv_run(loop, UV_RUN_DEFAULT);
    exit_code = r->exit_code;
out_freed:
    uv_loop_close(loop);
    sd_notify_close(&r->notify);
    metrics_free(r->metrics);
    seen_keys_free(r->seen);
    free(r);
    return exit_code;
out:
    db_health_free(r->db_health);
    store_pool_free(r->store);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    sd_notify_close(&r->notify);
    metrics_free(r->metrics);
    seen_keys_free(r->seen);
    free(r);
    return exit_code;
}

/*
 * The first MySQL connection, made before anything is consumed. A TLS failure (a certificate
 * that is not trusted or names another host, TLS required on one side and off on the other) is
 * a configuration problem: exit 2 now, with no message taken. Any other failure (the server is
 * down) is left to the outage probe, as always. A TLS failure later on (a certificate rotated
 * under a running idemq) pauses loudly instead of exiting (run/outage.h): a crash loop would
 * return the held messages to the queue at every restart, each time spending one of a RabbitMQ
 * 4.x quorum queue's delivery attempts.
 */
static int check_database_at_start(const config *cfg)
{
    char err[1024], tls[160];
    unsigned number = 0;
    db_dsn dsn;
    if (db_dsn_from_config(cfg, &dsn, err, sizeof err) != 0) {
        log_error(LOG_NO_CONTEXT, "%s", err);
        return EXIT_USAGE;
    }
    MYSQL *db = db_connect(&dsn, &number, err, sizeof err);
    explicit_bzero(dsn.password, sizeof dsn.password);
    if (!db && db_error_is_tls(number)) {
        log_error(LOG_NO_CONTEXT, "%s", err);
        return EXIT_USAGE;
    }
    if (!db) {
        log_warn(LOG_NO_CONTEXT,
                 "MySQL at start: %s; consumption pauses at the first message until a "
                 "connection works",
                 err);
        return 0;
    }
    log_info(LOG_NO_CONTEXT, "MySQL connection: %s (mysql.tls.mode %s)",
             db_describe_tls(db, tls, sizeof tls), db_tls_mode_name(dsn.tls.mode));
    /* A layout that does not match the config would miss the duplicates in msg_dedup_previous
     * (single) or fail every message (rotating before `idemq migrate`). */
    int rc = rotation_layout_check(db, cfg->dedup.layout, cfg->dedup.retention_ms / 1000, err,
                                   sizeof err);
    mysql_close(db);
    if (rc < 0) {
        log_error(LOG_NO_CONTEXT, "%s", err);
        return EXIT_USAGE;
    }
    if (rc > 0)
        log_warn(LOG_NO_CONTEXT, "MySQL at start: %s; the layout of msg_dedup is not checked", err);
    else
        log_info(LOG_NO_CONTEXT, "dedup %s", err);
    return 0;
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
    int db_rc = check_database_at_start(cfg);
    if (db_rc != 0) {
        plugin_registry_unload();
        return db_rc;
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
