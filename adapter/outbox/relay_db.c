/*
 * relay_db — see relay_db.h. The statements on idemq_outbox are outbox/table.h's; the lease's are
 * here. Plain text statements (mysql_query): the values spliced in are integers the relay made
 * and strings escaped with mysql_real_escape_string on this connection (the owner, an error
 * text), so there is no statement to prepare and keep per connection.
 */
#include "outbox/relay_db.h"

#include <inttypes.h>
#include <mysqld_error.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/connect.h"
#include "db/error.h"
#include "outbox/table.h"

#define SWEEP_LIMIT 1000

static int query(MYSQL *db, const char *sql, const char *what, char *err, size_t err_len)
{
    if (mysql_query(db, sql) == 0)
        return 0;
    db_error_format_connection(err, err_len, what, db);
    return -1;
}

/* The escaped form of len bytes at s, into out (at least 2 * len + 1 bytes). */
static void escape(MYSQL *db, char *out, const char *s, size_t len)
{
    mysql_real_escape_string(db, out, s, (unsigned long)len);
}

MYSQL *relay_db_connect(const db_dsn *dsn, char *err, size_t err_len)
{
    static const db_connect_timeouts timeouts = {.connect_s = 5, .read_s = 10, .write_s = 10};
    unsigned number = 0;
    MYSQL *db = db_connect_timed(dsn, &timeouts, &number, err, err_len);
    if (!db)
        return NULL;
    /* db_connect turns autocommit off for the workers' transactions; each statement of the relay
     * is a transaction of its own. */
    if (mysql_autocommit(db, 1) != 0) {
        db_error_format_connection(err, err_len, "autocommit", db);
        mysql_close(db);
        return NULL;
    }
    if (query(db,
              "INSERT IGNORE INTO idemq_outbox_lease (name, owner, expires_at) "
              "VALUES ('default', '', NOW(6) - INTERVAL 1 SECOND)",
              "creating the lease row", err, err_len) != 0) {
        mysql_close(db);
        return NULL;
    }
    return db;
}

int relay_db_lease(MYSQL *db, const char *owner, uint64_t lease_ms, bool *leader, char *err,
                   size_t err_len)
{
    char owner_sql[2 * 128 + 1], sql[1024];
    escape(db, owner_sql, owner, strlen(owner));
    /* CLIENT_FOUND_ROWS (db/connect.h): the count is of rows matched, so a renewal that happens to
     * write the same expiry still counts. */
    snprintf(sql, sizeof sql,
             "UPDATE idemq_outbox_lease SET owner = '%s', "
             "expires_at = NOW(6) + INTERVAL %" PRIu64 " MICROSECOND "
             "WHERE name = 'default' AND (owner = '%s' OR expires_at < NOW(6))",
             owner_sql, lease_ms * 1000, owner_sql);
    if (query(db, sql, "lease", err, err_len) != 0)
        return -1;
    *leader = mysql_affected_rows(db) == 1;
    return 0;
}

int relay_db_release(MYSQL *db, const char *owner, char *err, size_t err_len)
{
    char owner_sql[2 * 128 + 1], sql[512];
    escape(db, owner_sql, owner, strlen(owner));
    snprintf(sql, sizeof sql,
             "UPDATE idemq_outbox_lease SET expires_at = NOW(6) - INTERVAL 1 SECOND "
             "WHERE name = 'default' AND owner = '%s'",
             owner_sql);
    return query(db, sql, "releasing the lease", err, err_len);
}

static int copy_bytes(relay_bytes *out, const char *data, unsigned long len)
{
    out->data = malloc(len + 1);
    if (!out->data)
        return -1;
    if (len)
        memcpy(out->data, data, len);
    out->data[len] = '\0';
    out->len = len;
    return 0;
}

static void row_free(relay_row *row)
{
    relay_bytes *fields[] = {&row->source_biz_key, &row->handler_name, &row->emit_name,
                             &row->biz_key,        &row->exchange,     &row->routing_key,
                             &row->content_type,   &row->body,         &row->traceparent,
                             &row->tracestate};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        free(fields[i]->data);
}

void relay_rows_free(relay_row *rows, size_t count)
{
    if (!rows)
        return;
    for (size_t i = 0; i < count; i++)
        row_free(&rows[i]);
    free(rows);
}

int relay_db_fetch(MYSQL *db, unsigned batch, const relay_row *in_flight, size_t in_flight_count,
                   relay_row **rows, size_t *count, char *err, size_t err_len)
{
    *rows = NULL;
    *count = 0;
    /* At most outbox.batch (10000) ids of 20 digits. */
    size_t cap = sizeof OUTBOX_TABLE_FETCH_PENDING_HEAD + 64 + in_flight_count * 22;
    char *sql = malloc(cap);
    if (!sql) {
        snprintf(err, err_len, "out of memory reading pending rows");
        return -1;
    }
    size_t n = (size_t)snprintf(sql, cap, "%s", OUTBOX_TABLE_FETCH_PENDING_HEAD);
    for (size_t i = 0; i < in_flight_count; i++)
        n += (size_t)snprintf(sql + n, cap - n, "%s%" PRId64, i ? "," : " AND id NOT IN (",
                              in_flight[i].id);
    if (in_flight_count)
        n += (size_t)snprintf(sql + n, cap - n, ")");
    snprintf(sql + n, cap - n, OUTBOX_TABLE_FETCH_PENDING_TAIL_FMT, batch);
    int rc = query(db, sql, "reading pending rows", err, err_len);
    free(sql);
    if (rc != 0) {
        if (mysql_errno(db) == ER_BAD_FIELD_ERROR) { /* an idemq_outbox from before its columns */
            size_t used = strlen(err);
            snprintf(err + used, err_len > used ? err_len - used : 0, "; run `idemq migrate`");
        }
        return -1;
    }
    /* Streamed, so a round holds at most RELAY_ROUND_BYTES of bodies however large they are:
     * the rows past the cap are read and dropped here, and lead the next round. */
    MYSQL_RES *res = mysql_use_result(db);
    if (!res) {
        db_error_format_connection(err, err_len, "reading pending rows", db);
        return -1;
    }
    relay_row *out = calloc(batch ? batch : 1, sizeof *out);
    if (!out) {
        mysql_free_result(res);
        snprintf(err, err_len, "out of memory for %u rows", batch);
        return -1;
    }
    size_t i = 0, bytes = 0;
    for (MYSQL_ROW row; i < batch && (row = mysql_fetch_row(res)) != NULL; i++) {
        unsigned long *lens = mysql_fetch_lengths(res);
        if (i > 0 && bytes + lens[8] > RELAY_ROUND_BYTES)
            break;
        bytes += lens[8];
        relay_row *r = &out[i];
        r->id = strtoll(row[0], NULL, 10);
        relay_bytes *fields[] = {&r->source_biz_key, &r->handler_name, &r->emit_name,
                                 &r->biz_key,        &r->exchange,     &r->routing_key,
                                 &r->content_type,   &r->body};
        for (size_t k = 0; k < 8; k++) {
            if (copy_bytes(fields[k], row[k + 1] ? row[k + 1] : "", row[k + 1] ? lens[k + 1] : 0)) {
                relay_rows_free(out, i + 1);
                mysql_free_result(res);
                snprintf(err, err_len, "out of memory for row %" PRId64, r->id);
                return -1;
            }
        }
        r->created_at_s = row[9] ? strtoll(row[9], NULL, 10) : 0;
        relay_bytes *trace[] = {&r->traceparent, &r->tracestate};
        for (size_t k = 0; k < 2; k++) {
            if (copy_bytes(trace[k], row[10 + k] ? row[10 + k] : "",
                           row[10 + k] ? lens[10 + k] : 0)) {
                relay_rows_free(out, i + 1);
                mysql_free_result(res);
                snprintf(err, err_len, "out of memory for row %" PRId64, r->id);
                return -1;
            }
        }
    }
    if (mysql_errno(db) != 0) {
        db_error_format_connection(err, err_len, "reading pending rows", db);
        relay_rows_free(out, i);
        mysql_free_result(res);
        return -1;
    }
    if (i == 0) {
        free(out);
        out = NULL;
    }
    mysql_free_result(res);
    *rows = out;
    *count = i;
    return 0;
}

/* One UPDATE of a row whose outcome carries an error text. */
static int mark_one(MYSQL *db, const relay_row *row, char *err, size_t err_len)
{
    char text[2 * RELAY_ROW_ERROR_MAX + 1], sql[sizeof text + 256];
    size_t len = strnlen(row->error, RELAY_ROW_ERROR_MAX - 1);
    /* last_error is VARCHAR(512) of utf8mb4: cut on a character boundary. */
    while (len > 0 && ((unsigned char)row->error[len] & 0xC0) == 0x80)
        len--;
    escape(db, text, row->error, len);
    if (row->outcome == RELAY_ROW_UNROUTABLE)
        snprintf(sql, sizeof sql, OUTBOX_TABLE_MARK_UNROUTABLE_FMT, text, row->id);
    else
        snprintf(sql, sizeof sql, OUTBOX_TABLE_MARK_NACKED_FMT, text, row->id);
    return query(db, sql, "marking a row", err, err_len);
}

int relay_db_mark(MYSQL *db, const relay_row *rows, size_t count, bool delete_published,
                  relay_mark_result *done, char *err, size_t err_len)
{
    *done = (relay_mark_result){0};
    size_t published = 0;
    for (size_t i = 0; i < count; i++)
        published += rows[i].outcome == RELAY_ROW_PUBLISHED;
    if (published) {
        /* "id IN (...)" with every id: at most outbox.batch (10000) ids of 20 digits. */
        size_t cap = 128 + published * 22;
        char *sql = malloc(cap);
        if (!sql) {
            snprintf(err, err_len, "out of memory marking %zu rows", published);
            return -1;
        }
        size_t n = (size_t)snprintf(sql, cap, "%s",
                                    delete_published ? OUTBOX_TABLE_DELETE_PUBLISHED_HEAD
                                                     : OUTBOX_TABLE_MARK_PUBLISHED_HEAD);
        bool first = true;
        for (size_t i = 0; i < count; i++) {
            if (rows[i].outcome != RELAY_ROW_PUBLISHED)
                continue;
            n += (size_t)snprintf(sql + n, cap - n, "%s%" PRId64, first ? "" : ",", rows[i].id);
            first = false;
        }
        snprintf(sql + n, cap - n, ")");
        int rc = query(db, sql, "marking published rows", err, err_len);
        free(sql);
        if (rc != 0)
            return -1;
        done->published = published;
    }
    for (size_t i = 0; i < count; i++) {
        const relay_row *row = &rows[i];
        if (row->outcome != RELAY_ROW_UNROUTABLE && row->outcome != RELAY_ROW_NACKED)
            continue;
        if (mark_one(db, row, err, err_len) != 0)
            return -1;
        if (row->outcome == RELAY_ROW_UNROUTABLE)
            done->unroutable++;
        else
            done->nacked++;
    }
    return 0;
}

int relay_db_pending(MYSQL *db, uint64_t *pending, double *oldest_s, char *err, size_t err_len)
{
    if (query(db, OUTBOX_TABLE_COUNT_PENDING, "counting pending rows", err, err_len) != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    if (!row) {
        db_error_format_connection(err, err_len, "counting pending rows", db);
        if (res)
            mysql_free_result(res);
        return -1;
    }
    *pending = row[0] ? strtoull(row[0], NULL, 10) : 0;
    double us = row[1] ? strtod(row[1], NULL) : 0;
    *oldest_s = *pending && us > 0 ? us / 1e6 : 0;
    mysql_free_result(res);
    return 0;
}

int relay_db_sweep(MYSQL *db, uint64_t retention_ms, unsigned max_statements, uint64_t *deleted,
                   char *err, size_t err_len)
{
    char sql[512];
    *deleted = 0;
    snprintf(sql, sizeof sql, OUTBOX_TABLE_SWEEP_FMT, retention_ms * 1000, SWEEP_LIMIT);
    for (unsigned i = 0; i < max_statements; i++) {
        if (query(db, sql, "retention", err, err_len) != 0)
            return -1;
        my_ulonglong n = mysql_affected_rows(db);
        *deleted += n;
        if (n < SWEEP_LIMIT)
            break;
    }
    return 0;
}
