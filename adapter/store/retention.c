/*
 * retention — see retention.h. A sweep is a loop of prepared DELETE … LIMIT batch statements,
 * each committed on its own; the wait between sweeps is a condition variable with a timeout, so
 * retention_stop wakes the thread at once instead of waiting out a sleep.
 */
#include "store/retention.h"

#include <errno.h>
#include <mysql.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "db/bind.h"
#include "db/connect.h"
#include "db/dsn.h"
#include "db/prepare.h"
#include "ops/log.h"
#include "store/rotation.h"
#include "util/bgthread.h"

#define RETENTION_WARN_BELOW_MS (3600 * 1000ULL)
#define RETENTION_LOCK_WAIT_S 5

static const char delete_sql[] =
    "DELETE FROM msg_dedup WHERE created_at < NOW(3) - INTERVAL ? SECOND "
    "ORDER BY created_at LIMIT ?";

struct retention {
    const config *cfg;
    db_dsn dsn;
    bgthread thread;
    MYSQL *db;            /* the job thread's */
    MYSQL_STMT *delete_stmt;
};

static void disconnect(retention *job)
{
    if (job->delete_stmt)
        mysql_stmt_close(job->delete_stmt);
    job->delete_stmt = NULL;
    if (job->db)
        mysql_close(job->db);
    job->db = NULL;
}

/* Connects and prepares the DELETE when needed. Returns 0, or -1 with a reason in err. */
static int ensure_ready(retention *job, char *err, size_t err_len)
{
    db_error error;
    if (job->delete_stmt)
        return 0;
    if (!job->db) {
        job->db = db_connect(&job->dsn, NULL, err, err_len);
        if (!job->db)
            return -1;
        /* Shorter than the workers' lock wait: a sweep yields to business transactions. */
        char sql[96];
        snprintf(sql, sizeof sql, "SET SESSION innodb_lock_wait_timeout = %d",
                 RETENTION_LOCK_WAIT_S);
        if (mysql_query(job->db, sql) != 0) {
            snprintf(err, err_len, "cannot set up the retention session: %s (error %u)",
                     mysql_error(job->db), mysql_errno(job->db));
            disconnect(job);
            return -1;
        }
    }
    int rc = db_prepare(job->db, delete_sql, &job->delete_stmt, &error);
    if (rc != 0) {
        snprintf(err, err_len, "cannot prepare the retention DELETE: %s (error %u)",
                 rc == -ENOMEM ? "out of memory" : error.message, rc == -ENOMEM ? 0 : error.number);
        disconnect(job);
        return -1;
    }
    return 0;
}

static const char *format_seconds(char *buf, size_t len, uint64_t s)
{
    if (s % 86400 == 0)
        snprintf(buf, len, "%llud", (unsigned long long)(s / 86400));
    else if (s % 3600 == 0)
        snprintf(buf, len, "%lluh", (unsigned long long)(s / 3600));
    else if (s % 60 == 0)
        snprintf(buf, len, "%llum", (unsigned long long)(s / 60));
    else
        snprintf(buf, len, "%llus", (unsigned long long)s);
    return buf;
}

/* One sweep: batches until one deletes fewer than batch rows, an error, or a stop request. */
static void sweep(retention *job)
{
    const config_dedup *d = &job->cfg->dedup;
    long long age_s = (long long)(d->retention_ms / 1000), limit = d->batch;
    unsigned long long deleted = 0;
    unsigned batches = 0;
    uint64_t started = uv_hrtime();
    char err[768] = "", window[32];

    if (ensure_ready(job, err, sizeof err) != 0)
        goto out;
    for (;;) {
        MYSQL_BIND params[2];
        db_bind_slot slots[2] = {{0}};
        db_bind_int(&params[0], &slots[0], age_s);
        db_bind_int(&params[1], &slots[1], limit);
        if (mysql_stmt_bind_param(job->delete_stmt, params) ||
            mysql_stmt_execute(job->delete_stmt)) {
            snprintf(err, sizeof err, "DELETE failed: %s (error %u)",
                     mysql_stmt_error(job->delete_stmt), mysql_stmt_errno(job->delete_stmt));
            mysql_rollback(job->db);
            break;
        }
        unsigned long long rows = (unsigned long long)mysql_stmt_affected_rows(job->delete_stmt);
        if (mysql_commit(job->db) != 0) {
            snprintf(err, sizeof err, "COMMIT failed: %s (error %u)", mysql_error(job->db),
                     mysql_errno(job->db));
            break;
        }
        deleted += rows;
        batches++;
        if (rows < (unsigned long long)limit || bgthread_stopping(&job->thread))
            break;
    }
out:
    format_seconds(window, sizeof window, (uint64_t)age_s);
    if (err[0]) {
        /* Drop the connection: the next sweep starts from a clean session. */
        disconnect(job);
        log_warn(LOG_NO_CONTEXT,
                 "dedup retention: sweep failed after deleting %llu rows (retention %s): %s",
                 deleted, window, err);
        return;
    }
    log_info(LOG_NO_CONTEXT,
             "dedup retention: deleted %llu msg_dedup rows older than %s in %u batch(es), "
             "%.1f ms",
             deleted, window, batches, (double)(uv_hrtime() - started) / 1e6);
}

/* The rotating layout's turn: one rotation when the period is over (store/rotation.h). */
static void rotate(retention *job)
{
    char err[768], report[1024];
    if (ensure_ready(job, err, sizeof err) != 0) {
        log_warn(LOG_NO_CONTEXT, "dedup rotation: %s", err);
        return;
    }
    int rc = rotation_rotate_if_due(job->db, job->cfg->dedup.retention_ms / 1000, report,
                                    sizeof report);
    if (rc < 0) {
        disconnect(job);
        log_warn(LOG_NO_CONTEXT, "dedup rotation: %s; tried again in %.3g s", report,
                 (double)job->cfg->dedup.interval_ms / 1000.0);
    } else if (rc > 0) {
        log_info(LOG_NO_CONTEXT, "dedup rotation: %s", report);
    }
}

static void job_main(void *arg)
{
    retention *job = arg;
    uint64_t interval_ns = job->cfg->dedup.interval_ms * 1000000ULL;

    mysql_thread_init();
    for (bool running = true; running;) {
        if (job->cfg->dedup.layout == CONFIG_DEDUP_ROTATING)
            rotate(job);
        else
            sweep(job);
        uv_mutex_lock(&job->thread.lock);
        running = bgthread_wait_until(&job->thread, uv_hrtime() + interval_ns);
        uv_mutex_unlock(&job->thread.lock);
    }
    disconnect(job);
    mysql_thread_end();
}

int retention_start(const config *cfg, retention **out, char *err, size_t err_len)
{
    char window[32];
    *out = NULL;
    if (cfg->dedup.retention_ms == 0)
        return 0;
    retention *job = calloc(1, sizeof *job);
    if (!job) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    job->cfg = cfg;
    if (db_dsn_from_config(cfg, &job->dsn, err, err_len) != 0) {
        free(job);
        return -1;
    }
    /* Before the job's thread starts: its first call into the client is mysql_thread_init. */
    db_library_init();
    if (bgthread_init(&job->thread, "the retention thread", err, err_len) != 0 ||
        bgthread_start(&job->thread, job_main, job, "the retention thread", err, err_len) != 0) {
        bgthread_close(&job->thread);
        free(job);
        return -1;
    }
    format_seconds(window, sizeof window, cfg->dedup.retention_ms / 1000);
    if (cfg->dedup.retention_ms < RETENTION_WARN_BELOW_MS)
        log_warn(LOG_NO_CONTEXT,
                 "dedup.retention is %s, under 1h: a redelivery or replay of a message older "
                 "than that is applied again",
                 window);
    if (cfg->dedup.layout == CONFIG_DEDUP_ROTATING)
        log_info(LOG_NO_CONTEXT,
                 "dedup retention on, rotating: the tables rotate every %s (checked every "
                 "%.3g s); a key is kept between one and two periods",
                 window, (double)cfg->dedup.interval_ms / 1000.0);
    else
        log_info(LOG_NO_CONTEXT,
                 "dedup retention on: rows older than %s are deleted every %.3g s, %u per batch",
                 window, (double)cfg->dedup.interval_ms / 1000.0, cfg->dedup.batch);
    *out = job;
    return 0;
}

void retention_stop(retention *job)
{
    if (!job)
        return;
    bgthread_stop_join(&job->thread, NULL, NULL);
    bgthread_close(&job->thread);
    free(job);
}
