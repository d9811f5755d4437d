/*
 * health — see store/health.h.
 *
 * The probe thread owns the connection; the owner's thread only reads the published state and,
 * at db_health_free, shuts down the connection's socket (published under the lock while the
 * connection is open, withdrawn before mysql_close, so the descriptor cannot be another one's
 * by then) to cut a blocked read short.
 */
#include "store/health.h"

#include <errmsg.h>
#include <inttypes.h>
#include <mysql.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <uv.h>

#include "db/client.h"
#include "db/connect.h"
#include "db/error.h"
#include "util/bgthread.h"

#define NS_PER_MS UINT64_C(1000000)
#define TEXT_MAX 900 /* a failure's text; the reason adds a prefix */

/* No table, no lock, no snapshot: only whether the server takes writes. */
static const char health_sql[] = "SELECT @@global.read_only, @@global.innodb_read_only";

typedef struct probe_result {
    bool ok;
    bool timed_out;
    unsigned mysql_errno;
    char reason[sizeof((db_health_status *)0)->reason];
} probe_result;

struct db_health {
    db_dsn dsn;
    db_connect_timeouts timeouts;
    uint64_t interval_ns, stale_ns;
    unsigned timeout_s;
    bgthread thread; /* its lock guards the fields below */
    int fd;                /* the connection's socket while connected, else -1 */
    uint64_t started_ns;   /* db_health_start: the staleness clock before the first probe */
    uint64_t completed_ns; /* when the last probe completed; 0: none yet */
    uint64_t duration_ns;
    uint64_t probes, failures;
    probe_result last;
};

static bool stopping(db_health *h)
{
    return bgthread_stopping(&h->thread);
}

static void publish_fd(db_health *h, MYSQL *db)
{
    uv_mutex_lock(&h->thread.lock);
    h->fd = db ? db_client_socket(db) : -1;
    uv_mutex_unlock(&h->thread.lock);
}

static void disconnect(db_health *h, MYSQL **db)
{
    if (!*db)
        return;
    publish_fd(h, NULL);
    mysql_close(*db);
    *db = NULL;
}

/* Records a failed step that took elapsed_ns. The client reports a timeout in several ways (lost
 * connection, can't connect, a handshake that broke off), so a step that ran into its timeout is
 * recognised by how long it took. */
static void fail(db_health *h, probe_result *r, unsigned error_number, const char *text,
                 uint64_t elapsed_ns)
{
    r->ok = false;
    r->mysql_errno = error_number;
    r->timed_out = elapsed_ns + 100 * NS_PER_MS >= (uint64_t)h->timeout_s * 1000 * NS_PER_MS;
    static const char own[] = "health probe: ";
    if (r->timed_out && strncmp(text, own, sizeof own - 1) == 0)
        text += sizeof own - 1; /* the prefix says it already */
    if (r->timed_out)
        snprintf(r->reason, sizeof r->reason,
                 "database did not answer within %u s (health probe): %s", h->timeout_s, text);
    else
        snprintf(r->reason, sizeof r->reason, "%s", text);
}

/* Connects when not connected (*fresh then true). Returns false with the failure in r. */
static bool ensure_connected(db_health *h, MYSQL **db, bool *fresh, probe_result *r)
{
    char err[TEXT_MAX];
    unsigned error_number = 0;
    *fresh = false;
    if (*db)
        return true;
    if (stopping(h)) {
        fail(h, r, 0, "the database health probe is stopping", 0);
        return false;
    }
    uint64_t t0 = uv_hrtime();
    *db = db_connect_timed(&h->dsn, &h->timeouts, &error_number, err, sizeof err);
    if (!*db) {
        fail(h, r, error_number, err, uv_hrtime() - t0);
        return false;
    }
    /* db_connect turns autocommit off for the workers' transactions; the probe wants none. */
    if (mysql_autocommit(*db, 1) != 0) {
        error_number = db_error_format_connection(err, sizeof err, "health probe: autocommit", *db);
        mysql_close(*db);
        *db = NULL;
        fail(h, r, error_number, err, uv_hrtime() - t0);
        return false;
    }
    publish_fd(h, *db);
    *fresh = true;
    return true;
}

/* One probe. The connection stays open across probes while it works. */
static void probe(db_health *h, MYSQL **db, probe_result *r)
{
    memset(r, 0, sizeof *r);
    for (int attempt = 0; attempt < 2; attempt++) {
        bool fresh;
        if (!ensure_connected(h, db, &fresh, r))
            return;
        uint64_t t0 = uv_hrtime();
        if (mysql_query(*db, health_sql) == 0) {
            MYSQL_RES *res = mysql_store_result(*db);
            MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
            if (row) {
                bool read_only = row[0] && strcmp(row[0], "0") != 0;
                bool innodb_read_only = row[1] && strcmp(row[1], "0") != 0;
                mysql_free_result(res);
                r->ok = !read_only && !innodb_read_only;
                if (!r->ok)
                    snprintf(r->reason, sizeof r->reason, "the database is read-only (%s = 1)",
                             read_only ? "@@read_only" : "@@innodb_read_only");
                return;
            }
            if (res)
                mysql_free_result(res);
        }
        char text[TEXT_MAX];
        unsigned error_number = db_error_format_connection(text, sizeof text, "health probe", *db);
        uint64_t elapsed = uv_hrtime() - t0;
        disconnect(h, db);
        /* A connection that broke while idle (the server restarted, a reset) says so at once:
         * that alone is no outage, a fresh connection tells. */
        bool broke_idle =
            (error_number == CR_SERVER_GONE_ERROR || error_number == CR_SERVER_LOST) &&
            elapsed < (uint64_t)h->timeout_s * 500 * NS_PER_MS;
        if (fresh || !broke_idle) {
            fail(h, r, error_number, text, elapsed);
            return;
        }
    }
}

static void health_main(void *arg)
{
    db_health *h = arg;
    MYSQL *db = NULL;
    probe_result r;
    mysql_thread_init();
    uv_mutex_lock(&h->thread.lock);
    while (!bgthread_stopping(&h->thread)) {
        uv_mutex_unlock(&h->thread.lock);
        uint64_t start = uv_hrtime();
        probe(h, &db, &r);
        uint64_t end = uv_hrtime();
        uv_mutex_lock(&h->thread.lock);
        if (bgthread_stopping(&h->thread))
            break;
        h->last = r;
        h->completed_ns = end;
        h->duration_ns = end - start;
        h->probes++;
        if (!r.ok)
            h->failures++;
        bgthread_wait_until(&h->thread, start + h->interval_ns);
    }
    uv_mutex_unlock(&h->thread.lock);
    disconnect(h, &db);
    mysql_thread_end();
}

int db_health_start(const db_dsn *dsn, const db_health_options *opts, db_health **out, char *err,
                    size_t err_len)
{
    static const db_health_options defaults = {0};
    *out = NULL;
    if (!opts)
        opts = &defaults;
    db_health *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, err_len, "database health monitor: out of memory");
        return -1;
    }
    h->dsn = *dsn;
    h->timeout_s = opts->timeout_s ? opts->timeout_s : 2;
    h->timeouts = (db_connect_timeouts){h->timeout_s, h->timeout_s, h->timeout_s};
    h->interval_ns = (opts->interval_ms ? opts->interval_ms : 1000) * NS_PER_MS;
    h->stale_ns = opts->stale_ms ? opts->stale_ms * NS_PER_MS
                                 : h->interval_ns + (h->timeout_s * 1000ull + 500) * NS_PER_MS;
    h->fd = -1;
    snprintf(h->last.reason, sizeof h->last.reason,
             "the database health probe has not completed yet");
    if (bgthread_init(&h->thread, "the database health monitor", err, err_len) != 0)
        goto fail;
    db_library_init(); /* before the thread: mysql_library_init is not thread-safe */
    h->started_ns = uv_hrtime();
    if (bgthread_start(&h->thread, health_main, h, "the database health monitor's thread", err,
                       err_len) != 0)
        goto fail;
    *out = h;
    return 0;
fail:
    bgthread_close(&h->thread);
    explicit_bzero(h->dsn.password, sizeof h->dsn.password);
    free(h);
    return -1;
}

void db_health_read(db_health *h, db_health_status *out)
{
    uint64_t now = uv_hrtime();
    uv_mutex_lock(&h->thread.lock);
    uint64_t since = h->completed_ns ? h->completed_ns : h->started_ns;
    out->ok = h->last.ok;
    out->stale = now > since && now - since > h->stale_ns;
    out->timed_out = h->last.timed_out;
    out->mysql_errno = h->last.mysql_errno;
    out->probes = h->probes;
    out->failures = h->failures;
    out->age_ms = h->completed_ns ? (int64_t)((now - h->completed_ns) / NS_PER_MS) : -1;
    out->duration_ms = h->completed_ns ? (int64_t)(h->duration_ns / NS_PER_MS) : -1;
    if (out->stale) {
        out->ok = false;
        snprintf(out->reason, sizeof out->reason,
                 "database did not answer within %u s (health probe stuck for %" PRIu64 " ms)",
                 h->timeout_s, (now - since) / NS_PER_MS);
    } else {
        snprintf(out->reason, sizeof out->reason, "%s", out->ok ? "" : h->last.reason);
    }
    uv_mutex_unlock(&h->thread.lock);
}

bool db_health_ok(db_health *h, char *reason, size_t reason_len)
{
    db_health_status status;
    db_health_read(h, &status);
    if (!status.ok && reason && reason_len)
        snprintf(reason, reason_len, "%s", status.reason);
    return status.ok;
}

/* Under the thread's lock, at the stop: a read or write blocked on the socket returns now. */
static void shut_probe_socket(void *arg)
{
    db_health *h = arg;
    if (h->fd >= 0)
        shutdown(h->fd, SHUT_RDWR);
}

void db_health_free(db_health *h)
{
    if (!h)
        return;
    bgthread_stop_join(&h->thread, shut_probe_socket, h);
    bgthread_close(&h->thread);
    explicit_bzero(h->dsn.password, sizeof h->dsn.password);
    free(h);
}
