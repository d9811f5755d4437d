/*
 * session — see store/session.h.
 */
#include "store/session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/connect.h"
#include "db/error.h"
#include "db/prepare.h"
#include "handlers/handler.h"
#include "outbox/writer.h"
#include "store/batch.h"
#include "store/rotation.h"

static const char dedup_insert_sql[] =
    "INSERT INTO msg_dedup (biz_key, handler_name) VALUES (?, ?)";

int store_session_init(store_session *s, const config *cfg)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->handler_states = calloc(cfg->consumer_count, sizeof *s->handler_states);
    s->batch = store_batch_state_new(cfg);
    s->outbox = outbox_writer_new();
    if (!s->handler_states || !s->batch || !s->outbox) {
        store_session_close(s);
        return -1;
    }
    return 0;
}

void store_session_close(store_session *s)
{
    store_session_disconnect(s);
    free(s->handler_states);
    s->handler_states = NULL;
    store_batch_state_free(s->batch);
    s->batch = NULL;
    outbox_writer_free(s->outbox);
    s->outbox = NULL;
}

int store_session_connect(store_session *s, const db_dsn *dsn, unsigned *error_number, char *err,
                          size_t err_len)
{
    *error_number = 0;
    if (s->db)
        return 0;
    s->db = db_connect(dsn, error_number, err, err_len);
    if (!s->db)
        return -1;
    const char *info = mysql_get_server_info(s->db);
    s->returning = mysql_get_server_version(s->db) >= 100500 && info &&
                   strstr(info, "MariaDB") && !getenv("IDEMQ_TEST_NO_RETURNING");
    return 0;
}

void store_session_disconnect(store_session *s)
{
    if (s->handler_states)
        for (size_t i = 0; i < s->cfg->consumer_count; i++) {
            handler_release(&s->cfg->consumers[i], s->handler_states[i]);
            s->handler_states[i] = NULL;
        }
    if (s->dedup_insert)
        mysql_stmt_close(s->dedup_insert);
    s->dedup_insert = NULL;
    if (s->dedup_previous)
        mysql_stmt_close(s->dedup_previous);
    s->dedup_previous = NULL;
    store_batch_state_disconnect(s->batch);
    if (s->outbox)
        outbox_writer_disconnect(s->outbox);
    if (s->db)
        mysql_close(s->db);
    s->db = NULL;
}

apply_status store_session_fail(store_session *s, store_job *job, const char *what)
{
    job->mysql_errno = db_error_format_connection(job->error, sizeof job->error, what, s->db);
    return db_error_classify(job->mysql_errno);
}

apply_status store_session_prepare_dedup_insert(store_session *s, store_job *job, bool fresh)
{
    db_error error;
    bool rotating = s->cfg->dedup.layout == CONFIG_DEDUP_ROTATING;
    if (s->dedup_insert && (s->dedup_previous || !rotating) && !fresh)
        return APPLY_OK;
    if (s->dedup_insert)
        mysql_stmt_close(s->dedup_insert);
    if (s->dedup_previous)
        mysql_stmt_close(s->dedup_previous);
    s->dedup_insert = s->dedup_previous = NULL;
    const char *what = "dedup insert";
    int rc = db_prepare(s->db, dedup_insert_sql, &s->dedup_insert, &error);
    if (rc == 0 && rotating) {
        what = "msg_dedup_previous lookup";
        rc = db_prepare(s->db, rotation_previous_lookup_sql, &s->dedup_previous, &error);
    }
    if (rc == 0)
        return APPLY_OK;
    char label[64];
    snprintf(label, sizeof label, "%s%s", rc == -ENOMEM ? "" : "prepare ", what);
    job->mysql_errno = db_error_format(job->error, sizeof job->error, label, &error);
    return db_error_classify(job->mysql_errno);
}

apply_status store_session_check_writable(store_session *s, store_job *job)
{
    if (mysql_query(s->db, "SELECT @@global.read_only") != 0) {
        store_session_fail(s, job, "probe");
        return APPLY_UNAVAILABLE;
    }
    MYSQL_RES *res = mysql_store_result(s->db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    bool read_only = row && row[0] && strcmp(row[0], "0") != 0;
    if (res)
        mysql_free_result(res);
    mysql_rollback(s->db); /* ends the read's transaction: autocommit is off */
    if (!row) {
        store_session_fail(s, job, "probe");
        return APPLY_UNAVAILABLE;
    }
    if (read_only) {
        snprintf(job->error, sizeof job->error, "the database is read-only (@@read_only = 1)");
        return APPLY_UNAVAILABLE;
    }
    return APPLY_OK;
}

apply_status store_session_check_statements(store_session *s, store_job *job)
{
    const config *cfg = s->cfg;
    apply_status status = store_session_prepare_dedup_insert(s, job, true);
    if (status != APPLY_OK)
        return status;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        handler_release(&cfg->consumers[i], s->handler_states[i]);
        s->handler_states[i] = NULL;
        handler_call call = {
            .db = s->db,
            .consumer = &cfg->consumers[i],
            .state = &s->handler_states[i],
            .error = job->error,
            .error_len = sizeof job->error,
        };
        status = handler_prepare_all(&call);
        if (status != APPLY_OK) {
            job->mysql_errno = call.mysql_errno;
            job->consumer_index = i;
            /* Whatever failed here, messages cannot be applied yet: keep pausing. */
            return APPLY_UNAVAILABLE;
        }
    }
    /* A configured emit writes outbox rows with every message that takes it: an outbox that
     * lacks a column (not yet migrated) would fail each of them again the moment the probe
     * resumed consumption. A plugin's emits are its own choice, as in `idemq check`. */
    bool configured_emit = false;
    for (size_t i = 0; i < cfg->consumer_count; i++)
        configured_emit |= cfg->consumers[i].may_emit &&
                           cfg->consumers[i].handler.type != CONFIG_HANDLER_PLUGIN;
    if (configured_emit) {
        db_error error = {0};
        int rc = outbox_writer_prepare(s->outbox, s->db, &error);
        if (rc == -ENOMEM) {
            job->mysql_errno = 0;
            snprintf(job->error, sizeof job->error, "outbox insert: out of memory");
            return APPLY_UNAVAILABLE;
        }
        if (rc != 0) {
            job->mysql_errno =
                db_error_format(job->error, sizeof job->error, "outbox insert", &error);
            return APPLY_UNAVAILABLE;
        }
    }
    return APPLY_OK;
}
