/*
 * relay — see relay.h for the design. This file is the relay thread's loop (lease, rounds,
 * stats, retention, waiting) and the owner's side (start, notify, read, stuck, stop); the SQL is
 * relay_db.c's, the AMQP side relay_publish.c's.
 *
 * Fields are grouped by who may touch them: set at start (read by both), shared under lock, and
 * the thread's own.
 */
#include "outbox/relay.h"

#include <errno.h>
#include <inttypes.h>
#include <mysql.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "config/url.h"
#include "db/client.h"
#include "db/connect.h"
#include "ops/log.h"
#include "outbox/relay_db.h"
#include "outbox/relay_publish.h"
#include "policy/backoff.h"
#include "util/rng.h"
#include "util/trace_context.h"
#include "util/monotonic.h"

#define CONFIRM_TIMEOUT_MS 10000
#define STATS_EVERY_MS 1000
#define SWEEP_EVERY_MS 10000
#define SWEEP_MAX_STATEMENTS 100 /* 100 000 rows per sweep; the rest 10 s later */
/* The thread wakes at least this often: rabbitmq-c sends heartbeats only from inside its calls. */
#define TICK_MS 250
/* outbox_relay_stop: the round's confirms get this much more; then the sockets are shut down. */
#define STOP_CONFIRMS_MS 4000
#define STOP_FORCE_MS 5000

/* 100 ms doubling to 5 s, a little jitter so that replicas do not retry in step. */
static const backoff_policy retry_backoff = {
    .initial_ms = 100, .max_ms = 5000, .jitter_percent = 20};

struct outbox_relay {
    /* set at start */
    const config *cfg;
    db_dsn dsn;
    char owner[OUTBOX_RELAY_OWNER_MAX + 1];
    unsigned batch;
    uint64_t poll_ms, lease_ms, retention_ms, stuck_ms;
    unsigned long kill_after; /* test hook; 0: off */
    int wake_fd;
    uv_thread_t thread;

    /* shared under lock */
    uv_mutex_t lock;
    uv_cond_t exited_cond;
    bool stopping, exited;
    int64_t stop_ms;    /* when outbox_relay_stop was called */
    int db_fd, amqp_fd; /* the connections' sockets while open, else -1 */
    outbox_relay_stats stats;
    int64_t stats_ms;    /* when stats.pending / oldest_pending_s were counted; 0: never */
    int64_t progress_ms; /* when the loop last finished a pass */

    /* the thread's */
    MYSQL *db;
    relay_broker broker;
    rng random;
    bool leader;
    int64_t leader_until_ms; /* a renewal at t holds the lease until t + lease on the server */
    int64_t next_lease_ms, next_db_ms, next_amqp_ms, next_scan_ms, next_stats_ms, next_sweep_ms;
    int64_t nack_until_ms;
    unsigned db_failures, amqp_failures, nack_rounds;
    bool scan_wanted; /* notified, or the poll interval passed */
    /* run_round's pipeline: a round confirmed and not yet marked, and the round fetched after
     * it; both set, or both empty, between rounds. */
    relay_row *confirmed, *next;
    size_t confirmed_count, next_count;
    unsigned long confirmed_rounds;
    char last_logged[512];
    int64_t last_logged_ms;
};

/* Copies src into dst (cap bytes), cut to fit: texts here are diagnostics. */
static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}


static bool is_stopping(outbox_relay *r)
{
    uv_mutex_lock(&r->lock);
    bool s = r->stopping;
    uv_mutex_unlock(&r->lock);
    return s;
}

static void publish_fds(outbox_relay *r)
{
    uv_mutex_lock(&r->lock);
    r->db_fd = r->db ? db_client_socket(r->db) : -1;
    r->amqp_fd = relay_broker_socket(&r->broker);
    r->stats.db_connected = r->db != NULL;
    r->stats.connected = r->broker.conn != NULL;
    r->stats.leader = r->leader;
    uv_mutex_unlock(&r->lock);
}

/* relay_broker's socket_closing: the AMQP socket must not be shut down once it may be another's. */
static void amqp_socket_closing(void *ctx)
{
    outbox_relay *r = ctx;
    uv_mutex_lock(&r->lock);
    r->amqp_fd = -1;
    uv_mutex_unlock(&r->lock);
}

static void close_db(outbox_relay *r)
{
    if (!r->db)
        return;
    uv_mutex_lock(&r->lock);
    r->db_fd = -1; /* withdrawn before the socket closes */
    uv_mutex_unlock(&r->lock);
    mysql_close(r->db);
    r->db = NULL;
}

static void set_error(outbox_relay *r, const char *text)
{
    uv_mutex_lock(&r->lock);
    copy_text(r->stats.last_error, sizeof r->stats.last_error, text);
    uv_mutex_unlock(&r->lock);
}

/* A failure is logged when it differs from the last one logged, or 30 s after it: a server that
 * stays down every 5 s must not fill the log. */
static void report(outbox_relay *r, const char *text)
{
    set_error(r, text);
    int64_t now = monotonic_ms();
    if (strcmp(text, r->last_logged) == 0 && now - r->last_logged_ms < 30000)
        return;
    copy_text(r->last_logged, sizeof r->last_logged, text);
    r->last_logged_ms = now;
    log_warn(LOG_NO_CONTEXT, "outbox relay: %s", text);
}

static uint64_t backoff(outbox_relay *r, unsigned failures)
{
    return backoff_delay_ms(&retry_backoff, failures, rng_next(&r->random));
}

static void set_leader(outbox_relay *r, bool leader, const char *why)
{
    if (leader == r->leader)
        return;
    r->leader = leader;
    if (leader) {
        log_info(LOG_NO_CONTEXT, "outbox relay: leader lease acquired (owner %s); publishing",
                 r->owner);
        r->scan_wanted = true;
        r->next_amqp_ms = 0;
    } else {
        log_info(LOG_NO_CONTEXT, "outbox relay: leader lease lost (owner %s): %s; standing by",
                 r->owner, why);
    }
    publish_fds(r);
}

/* ------------------------------------------------------------------------------- connections */

static void db_down(outbox_relay *r, const char *text)
{
    report(r, text);
    close_db(r);
    set_leader(r, false, "the database connection failed");
    r->next_db_ms = monotonic_ms() + (int64_t)backoff(r, r->db_failures++);
    publish_fds(r);
}

static void db_up(outbox_relay *r)
{
    char err[1024];
    r->db = relay_db_connect(&r->dsn, err, sizeof err);
    if (!r->db) {
        db_down(r, err);
        return;
    }
    if (r->db_failures)
        log_info(LOG_NO_CONTEXT, "outbox relay: connected to MySQL again");
    r->db_failures = 0;
    r->next_lease_ms = 0;
    r->next_stats_ms = 0;
    publish_fds(r);
}

static void amqp_down(outbox_relay *r, const char *text)
{
    char line[1200];
    snprintf(line, sizeof line, "RabbitMQ: %s", text);
    report(r, line);
    relay_broker_close(&r->broker); /* dropped already after an error: a no-op then */
    r->next_amqp_ms = monotonic_ms() + (int64_t)backoff(r, r->amqp_failures++);
    publish_fds(r);
}

static void amqp_up(outbox_relay *r)
{
    char err[4096], shown[512];
    size_t node = 0;
    if (relay_broker_connect(&r->broker, &node, err, sizeof err) != 0) {
        amqp_down(r, err);
        return;
    }
    config_redact_url(r->cfg->amqp_urls[node], shown, sizeof shown);
    log_info(LOG_NO_CONTEXT, "outbox relay: connected to RabbitMQ %s", shown);
    r->amqp_failures = 0;
    r->scan_wanted = true;
    publish_fds(r);
}

/* -------------------------------------------------------------------------------------- lease */

/* One lease attempt (renewal when leader). Returns false when the database failed. */
static bool lease_step(outbox_relay *r)
{
    char err[1024];
    bool leader = false;
    int64_t start = monotonic_ms();
    if (relay_db_lease(r->db, r->owner, r->lease_ms, &leader, err, sizeof err) != 0) {
        db_down(r, err);
        return false;
    }
    if (leader)
        r->leader_until_ms = start + (int64_t)r->lease_ms;
    set_leader(r, leader, "another relay holds it");
    uint64_t every = r->lease_ms / 3;
    if (!leader && r->poll_ms < every)
        every = r->poll_ms;
    r->next_lease_ms = monotonic_ms() + (int64_t)(every ? every : 1);
    return true;
}

/* relay_broker_await's tick: keeps the lease while confirms are awaited; gives up the wait
 * once outbox_relay_stop has waited long enough. */
static bool round_tick(void *ctx)
{
    outbox_relay *r = ctx;
    uv_mutex_lock(&r->lock);
    bool give_up = r->stopping && monotonic_ms() - r->stop_ms > STOP_CONFIRMS_MS;
    r->progress_ms = monotonic_ms(); /* waiting for confirms is progress, not a hang */
    uv_mutex_unlock(&r->lock);
    if (give_up)
        return false;
    if (r->db && monotonic_ms() >= r->next_lease_ms)
        lease_step(r); /* losing the lease now: the rows in flight are still marked */
    return true;
}

/* -------------------------------------------------------------------------------------- round */

/* Marks a round whose confirms are in (or given up on), logs its unroutable rows (and, at debug,
 * its published ones), counts it and frees it. Returns false when the database failed (err says
 * why; the caller takes it down, so the confirmed rows are published again). */
static bool mark_round(outbox_relay *r, relay_row *rows, size_t count, char *err, size_t err_len)
{
    char line[1200];
    relay_mark_result done = {0};
    int64_t started = monotonic_ms();
    int mark_rc =
        r->db ? relay_db_mark(r->db, rows, count, r->retention_ms == 0, &done, err, err_len) : -1;
    if (!r->db)
        snprintf(err, err_len, "no database connection");
    log_debug(LOG_NO_CONTEXT, "outbox relay: marked %zu row(s) in %" PRId64 " ms", count,
              monotonic_ms() - started);
    bool debug = log_enabled(LOG_LEVEL_DEBUG);
    for (size_t i = 0; i < count; i++) {
        if (rows[i].outcome != RELAY_ROW_UNROUTABLE &&
            !(debug && rows[i].outcome == RELAY_ROW_PUBLISHED))
            continue;
        /* The emit's own trace: its trace id is the incoming message's, so one search finds
         * both ends. */
        char trace_id[TRACE_ID_HEX + 1];
        trace_id_of(rows[i].traceparent.data, rows[i].traceparent.len, trace_id, sizeof trace_id);
        log_context ctx = {.biz_key = rows[i].biz_key.data,
                           .traceparent = rows[i].traceparent.len ? rows[i].traceparent.data : NULL,
                           .trace_id = trace_id[0] ? trace_id : NULL,
                           .retries = -1};
        if (rows[i].outcome == RELAY_ROW_UNROUTABLE)
            log_warn(&ctx,
                     "outbox relay: row %" PRId64 " (biz_key %s) is unroutable "
                     "and will not be retried: %s",
                     rows[i].id, rows[i].biz_key.data, rows[i].error);
        else
            log_debug(&ctx, "outbox relay: published row %" PRId64 " (emit %s of %s)", rows[i].id,
                      rows[i].emit_name.data, rows[i].source_biz_key.data);
    }
    uv_mutex_lock(&r->lock);
    r->stats.published_total += done.published;
    r->stats.unroutable_total += done.unroutable;
    r->stats.rounds += done.published || done.unroutable;
    uv_mutex_unlock(&r->lock);
    if (done.unroutable)
        for (size_t i = count; i-- > 0;)
            if (rows[i].outcome == RELAY_ROW_UNROUTABLE) {
                snprintf(line, sizeof line, "row %" PRId64 ": %s", rows[i].id, rows[i].error);
                set_error(r, line);
                break;
            }
    relay_rows_free(rows, count);
    return mark_rc == 0;
}

/* The round held back for marking (run_round), marked now: the next round will not run (the
 * relay stops, lost the lease or a connection), and a confirmed row must not wait for it. */
static void mark_held_round(outbox_relay *r)
{
    char err[1024], text[1200];
    relay_rows_free(r->next, r->next_count);
    r->next = NULL;
    r->next_count = 0;
    if (!r->confirmed)
        return;
    relay_row *rows = r->confirmed;
    r->confirmed = NULL;
    if (!mark_round(r, rows, r->confirmed_count, err, sizeof err) && r->db) {
        snprintf(text, sizeof text, "%s (the confirmed rows will be published again)", err);
        db_down(r, text);
    }
}

/*
 * Publishes one batch and marks it. Returns true when the next round should follow at once (a
 * full batch, or rows a channel close left unanswered).
 *
 * While the broker stores a full round, the database does the work of the rounds around it: the
 * round before is marked and the next one fetched (the rows in flight left out), so neither server
 * waits for the other. A round whose every row got its answer is then held, to be marked while the
 * next one is at the broker; any other round is marked at once and the next is fetched again after
 * it, so the rows it left pending stay first.
 */
static bool run_round(outbox_relay *r)
{
    char err[1024], db_err[1024], text[1200];
    relay_row *rows = r->next;
    size_t count = r->next_count;
    r->next = NULL;
    r->next_count = 0;
    bool again = false;
    r->scan_wanted = false;
    int64_t started = monotonic_ms();
    if (!rows) {
        if (relay_db_fetch(r->db, r->batch, NULL, 0, &rows, &count, err, sizeof err) != 0) {
            db_down(r, err);
            return false;
        }
        uv_mutex_lock(&r->lock);
        r->stats.scans++;
        uv_mutex_unlock(&r->lock);
        if (count == 0)
            return false;
    }
    int64_t fetched = monotonic_ms();
    int rc = relay_broker_send(&r->broker, rows, count, err, sizeof err);
    int64_t sent = monotonic_ms();
    if (r->confirmed) {
        relay_row *before = r->confirmed;
        r->confirmed = NULL;
        if (!mark_round(r, before, r->confirmed_count, db_err, sizeof db_err) && r->db) {
            snprintf(text, sizeof text, "%s (the confirmed rows will be published again)", db_err);
            db_down(r, text);
        }
    }
    int64_t marked = monotonic_ms();
    if (rc == 0 && r->db && count == r->batch) {
        if (relay_db_fetch(r->db, r->batch, rows, count, &r->next, &r->next_count, db_err,
                           sizeof db_err) != 0) {
            db_down(r, db_err);
        } else {
            uv_mutex_lock(&r->lock);
            r->stats.scans++;
            uv_mutex_unlock(&r->lock);
        }
    }
    int64_t prefetched = monotonic_ms();
    if (rc == 0)
        rc = relay_broker_await(&r->broker, CONFIRM_TIMEOUT_MS, round_tick, r, err, sizeof err);
    int64_t confirmed = monotonic_ms();
    bool broker_failed = rc != 0;
    size_t unknown = 0, nacked = 0;
    for (size_t i = 0; i < count; i++) {
        unknown += rows[i].outcome == RELAY_ROW_UNKNOWN;
        nacked += rows[i].outcome == RELAY_ROW_NACKED;
    }
    if (!broker_failed && unknown == 0 && r->kill_after && ++r->confirmed_rounds >= r->kill_after) {
        log_warn(LOG_NO_CONTEXT,
                 "outbox relay: %s=%lu: killing the process after the confirms "
                 "of round %lu, before marking its %zu row(s)",
                 OUTBOX_RELAY_KILL_ENV, r->kill_after, r->confirmed_rounds, count);
        raise(SIGKILL);
    }
    if (log_enabled(LOG_LEVEL_DEBUG))
        log_debug(LOG_NO_CONTEXT,
                  "outbox relay: round of %zu row(s): fetch %" PRId64 " ms, publish %" PRId64
                  " ms, the round before marked in %" PRId64 " ms and the next fetched in %" PRId64
                  " ms meanwhile, then the last confirms %" PRId64 " ms",
                  count, fetched - started, sent - fetched, marked - sent, prefetched - marked,
                  confirmed - prefetched);
    if (!broker_failed && unknown == 0 && nacked == 0 && r->next_count > 0) {
        r->confirmed = rows;
        r->confirmed_count = count;
        r->nack_rounds = 0;
        return true;
    }
    relay_rows_free(r->next, r->next_count);
    r->next = NULL;
    r->next_count = 0;
    if (nacked) {
        for (size_t i = 0; i < count; i++)
            if (rows[i].outcome == RELAY_ROW_NACKED) {
                snprintf(text, sizeof text, "row %" PRId64 ": %s; retried", rows[i].id,
                         rows[i].error);
                report(r, text);
                break;
            }
    }
    bool marked_ok = mark_round(r, rows, count, db_err, sizeof db_err);
    if (nacked) {
        r->nack_until_ms = monotonic_ms() + (int64_t)backoff(r, r->nack_rounds++);
        r->scan_wanted = true;
    } else if (!broker_failed) {
        r->nack_rounds = 0;
    }
    if (broker_failed) {
        /* The rows without a confirm stay pending; the next round, on a new connection, takes
         * them first. */
        snprintf(text, sizeof text, "%s (%zu row(s) left pending)", err, unknown);
        amqp_down(r, text);
        r->scan_wanted = true;
    }
    if (!marked_ok && r->db) {
        snprintf(text, sizeof text, "%s (the confirmed rows will be published again)", db_err);
        db_down(r, text);
    } else if (!broker_failed && !nacked) {
        again = count == r->batch || unknown > 0;
    }
    return again;
}

static void count_pending(outbox_relay *r)
{
    char err[1024];
    uint64_t pending;
    double oldest;
    if (relay_db_pending(r->db, &pending, &oldest, err, sizeof err) != 0) {
        db_down(r, err);
        return;
    }
    uv_mutex_lock(&r->lock);
    r->stats.pending = pending;
    r->stats.oldest_pending_s = oldest;
    r->stats_ms = monotonic_ms();
    uv_mutex_unlock(&r->lock);
}

static void sweep(outbox_relay *r)
{
    char err[1024];
    uint64_t deleted = 0;
    if (relay_db_sweep(r->db, r->retention_ms, SWEEP_MAX_STATEMENTS, &deleted, err, sizeof err) !=
        0) {
        db_down(r, err);
        return;
    }
    if (deleted)
        log_info(LOG_NO_CONTEXT, "outbox relay: retention deleted %" PRIu64 " published row(s)",
                 deleted);
}

/* ----------------------------------------------------------------------------------- the loop */

static bool drain_wake(outbox_relay *r)
{
    uint64_t count;
    return read(r->wake_fd, &count, sizeof count) == (ssize_t)sizeof count;
}

/* Sleeps until notified, the AMQP socket is readable, or until (at most TICK_MS). */
static void wait_until(outbox_relay *r, int64_t until)
{
    int64_t wait = until - monotonic_ms();
    if (wait > TICK_MS)
        wait = TICK_MS;
    if (wait < 0)
        wait = 0;
    struct pollfd fds[2] = {{.fd = r->wake_fd, .events = POLLIN}};
    nfds_t n = 1;
    if (r->broker.conn) {
        if (amqp_frames_enqueued(r->broker.conn) || amqp_data_in_buffer(r->broker.conn))
            wait = 0;
        fds[1] = (struct pollfd){.fd = relay_broker_socket(&r->broker), .events = POLLIN};
        n = 2;
    }
    poll(fds, n, (int)wait);
}

static int64_t earliest(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static void relay_main(void *arg)
{
    outbox_relay *r = arg;
    char err[1024];
    mysql_thread_init();
    while (!is_stopping(r)) {
        int64_t now = monotonic_ms();
        if (drain_wake(r) || now >= r->next_scan_ms)
            r->scan_wanted = true;
        if (!r->db && now >= r->next_db_ms)
            db_up(r);
        if (r->db && now >= r->next_lease_ms)
            lease_step(r);
        if (r->leader && now >= r->leader_until_ms)
            set_leader(r, false, "not renewed in time");
        if (!r->leader && r->broker.conn) {
            relay_broker_close(&r->broker); /* only the leader keeps a connection */
            publish_fds(r);
        }
        if (r->leader && !r->broker.conn && now >= r->next_amqp_ms)
            amqp_up(r);
        if (r->broker.conn && relay_broker_service(&r->broker, err, sizeof err) != 0)
            amqp_down(r, err);
        bool again = false;
        if ((r->scan_wanted || r->confirmed) && r->leader && r->db && r->broker.conn &&
            monotonic_ms() >= r->nack_until_ms) {
            again = run_round(r);
            r->next_scan_ms = monotonic_ms() + (int64_t)r->poll_ms;
            /* run_round cleared scan_wanted: without this, a full round was followed by the next
             * only when a notify came meanwhile, else a whole poll_interval later (the end of a
             * backlog waited 1 s a round with the default). */
            if (again)
                r->scan_wanted = true;
        }
        if (!again)
            mark_held_round(r);
        if (r->db && monotonic_ms() >= r->next_stats_ms) {
            count_pending(r);
            r->next_stats_ms = monotonic_ms() + STATS_EVERY_MS;
        }
        if (r->db && r->leader && r->retention_ms && monotonic_ms() >= r->next_sweep_ms) {
            sweep(r);
            r->next_sweep_ms = monotonic_ms() + SWEEP_EVERY_MS;
        }
        uv_mutex_lock(&r->lock);
        r->progress_ms = monotonic_ms();
        uv_mutex_unlock(&r->lock);
        if (again)
            continue;
        int64_t until = earliest(r->next_stats_ms, r->db ? r->next_lease_ms : r->next_db_ms);
        if (r->leader && r->broker.conn)
            until = earliest(until, r->scan_wanted ? r->nack_until_ms : r->next_scan_ms);
        else if (r->leader)
            until = earliest(until, r->next_amqp_ms);
        wait_until(r, until);
    }
    mark_held_round(r);
    if (r->db && r->leader) {
        if (relay_db_release(r->db, r->owner, err, sizeof err) != 0)
            log_warn(LOG_NO_CONTEXT, "outbox relay: %s", err);
        else
            log_info(LOG_NO_CONTEXT, "outbox relay: leader lease released (owner %s)", r->owner);
    }
    r->leader = false;
    relay_broker_close(&r->broker);
    close_db(r);
    mysql_thread_end();
    uv_mutex_lock(&r->lock);
    r->exited = true;
    r->stats.leader = r->stats.connected = r->stats.db_connected = false;
    uv_cond_signal(&r->exited_cond);
    uv_mutex_unlock(&r->lock);
}

/* -------------------------------------------------------------------------------- owner's side */

int outbox_relay_start(const config *cfg, const db_dsn *dsn, const char *owner, outbox_relay **out,
                       char *err, size_t err_len)
{
    *out = NULL;
    if (!owner || !*owner || strlen(owner) > OUTBOX_RELAY_OWNER_MAX) {
        snprintf(err, err_len, "outbox relay: the owner must be 1 to %d bytes",
                 OUTBOX_RELAY_OWNER_MAX);
        return -1;
    }
    if (cfg->amqp_url_count == 0 || !cfg->amqp_urls[0]) {
        snprintf(err, err_len, "outbox relay: no amqp url");
        return -1;
    }
    if (!cfg->outbox.batch || !cfg->outbox.poll_interval_ms || !cfg->outbox.lease_ms ||
        !cfg->outbox.stuck_after_ms) {
        snprintf(err, err_len, "outbox relay: the config's outbox batch, poll_interval, lease and "
                               "stuck_after must all be set");
        return -1;
    }
    outbox_relay *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, err_len, "outbox relay: out of memory");
        return -1;
    }
    r->cfg = cfg;
    r->dsn = *dsn;
    snprintf(r->owner, sizeof r->owner, "%s", owner);
    /* The defaults and bounds are the config table's (config/options.c): a config that did not
     * come from config_load must set every outbox field. */
    r->batch = cfg->outbox.batch;
    r->poll_ms = cfg->outbox.poll_interval_ms;
    r->lease_ms = cfg->outbox.lease_ms;
    r->retention_ms = cfg->outbox.retention_ms;
    r->stuck_ms = cfg->outbox.stuck_after_ms;
    const char *kill = getenv(OUTBOX_RELAY_KILL_ENV);
    r->kill_after = kill && *kill ? strtoul(kill, NULL, 10) : 0;
    r->db_fd = r->amqp_fd = -1;
    rng_init(&r->random, (uint64_t)(uintptr_t)r);
    relay_broker_init(&r->broker, cfg);
    r->broker.socket_closing = amqp_socket_closing;
    r->broker.socket_ctx = r;
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->wake_fd < 0) {
        snprintf(err, err_len, "outbox relay: eventfd: %s", strerror(errno));
        goto fail;
    }
    if (uv_mutex_init(&r->lock) != 0) {
        snprintf(err, err_len, "outbox relay: cannot create a mutex");
        goto fail_fd;
    }
    if (uv_cond_init(&r->exited_cond) != 0) {
        snprintf(err, err_len, "outbox relay: cannot create a condition variable");
        goto fail_mutex;
    }
    r->progress_ms = monotonic_ms();
    db_library_init(); /* before the thread: mysql_library_init is not thread-safe */
    int rc = uv_thread_create(&r->thread, relay_main, r);
    if (rc != 0) {
        snprintf(err, err_len, "outbox relay: cannot start its thread: %s", uv_strerror(rc));
        uv_cond_destroy(&r->exited_cond);
        goto fail_mutex;
    }
    *out = r;
    return 0;
fail_mutex:
    uv_mutex_destroy(&r->lock);
fail_fd:
    close(r->wake_fd);
fail:
    relay_broker_fini(&r->broker);
    explicit_bzero(r->dsn.password, sizeof r->dsn.password);
    free(r);
    return -1;
}

void outbox_relay_notify(outbox_relay *r)
{
    if (!r)
        return;
    uint64_t one = 1;
    ssize_t ignored = write(r->wake_fd, &one, sizeof one); /* EAGAIN: a wake is pending anyway */
    (void)ignored;
}

void outbox_relay_read(outbox_relay *r, outbox_relay_stats *out)
{
    int64_t now = monotonic_ms();
    uv_mutex_lock(&r->lock);
    *out = r->stats;
    if (out->pending && r->stats_ms)
        out->oldest_pending_s += (double)(now - r->stats_ms) / 1000.0;
    uv_mutex_unlock(&r->lock);
}

bool outbox_relay_stuck(outbox_relay *r, char *reason, size_t reason_len)
{
    outbox_relay_stats s;
    outbox_relay_read(r, &s);
    uv_mutex_lock(&r->lock);
    int64_t since_progress = monotonic_ms() - r->progress_ms;
    bool exited = r->exited;
    uv_mutex_unlock(&r->lock);
    const char *last = s.last_error[0] ? s.last_error : "none";
    if (!exited && since_progress > (int64_t)r->stuck_ms) {
        if (reason && reason_len)
            snprintf(reason, reason_len,
                     "outbox relay stuck: its thread has not finished a round "
                     "for %" PRId64 " s (last error: %s)",
                     since_progress / 1000, last);
        return true;
    }
    if (s.pending && s.oldest_pending_s * 1000.0 > (double)r->stuck_ms) {
        if (reason && reason_len)
            snprintf(reason, reason_len,
                     "outbox relay stuck: the oldest pending row is %.0f s "
                     "old (last error: %s)",
                     s.oldest_pending_s, last);
        return true;
    }
    if (reason && reason_len)
        reason[0] = '\0';
    return false;
}

void outbox_relay_metrics_probe(void *ctx, metrics_outbox_sample *out)
{
    outbox_relay_stats s;
    outbox_relay_read(ctx, &s);
    *out = (metrics_outbox_sample){.pending = s.pending,
                                   .oldest_pending_s = s.oldest_pending_s,
                                   .published_total = s.published_total,
                                   .unroutable_total = s.unroutable_total,
                                   .leader = s.leader};
}

void outbox_relay_stop(outbox_relay *r)
{
    if (!r)
        return;
    uv_mutex_lock(&r->lock);
    r->stopping = true;
    r->stop_ms = monotonic_ms();
    uv_mutex_unlock(&r->lock);
    outbox_relay_notify(r);
    uv_mutex_lock(&r->lock);
    for (int64_t now = monotonic_ms(); !r->exited && now - r->stop_ms < STOP_FORCE_MS; now = monotonic_ms())
        uv_cond_timedwait(&r->exited_cond, &r->lock,
                          (uint64_t)(STOP_FORCE_MS - (now - r->stop_ms)) * 1000000u);
    if (!r->exited) {
        /* A server that does not answer: a read or write blocked on its socket returns now. */
        if (r->db_fd >= 0)
            shutdown(r->db_fd, SHUT_RDWR);
        if (r->amqp_fd >= 0)
            shutdown(r->amqp_fd, SHUT_RDWR);
        log_warn(LOG_NO_CONTEXT, "outbox relay: stopping took over %d ms; connections cut",
                 STOP_FORCE_MS);
    }
    uv_mutex_unlock(&r->lock);
    uv_thread_join(&r->thread);
    relay_broker_fini(&r->broker);
    uv_cond_destroy(&r->exited_cond);
    uv_mutex_destroy(&r->lock);
    close(r->wake_fd);
    explicit_bzero(r->dsn.password, sizeof r->dsn.password);
    free(r);
}
