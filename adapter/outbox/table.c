/*
 * table — see table.h. Plain text statements (mysql_query): the values spliced in are ids and
 * numbers, never text, so there is nothing to escape or to prepare per connection.
 *
 * Retry and purge change rows the relay may be working on at the same time, so they walk the
 * table in chunks of OUTBOX_TABLE_CHUNK_ROWS rows, one transaction each (short row locks, never
 * one statement over a whole table), and only up to the largest id the caller saw first
 * (walk_chunks).
 */
#include "outbox/table.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_ROWS OUTBOX_TABLE_CHUNK_ROWS

/* The first column of the one row of sql as a number (NULL: 0). */
static int scalar(MYSQL *db, const char *sql, long long *out)
{
    errno = 0;
    if (mysql_query(db, sql) != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(db);
    if (!res)
        return -1;
    MYSQL_ROW row = mysql_fetch_row(res);
    *out = row && row[0] ? strtoll(row[0], NULL, 10) : 0;
    mysql_free_result(res);
    return 0;
}

int outbox_table_probe(MYSQL *db)
{
    errno = 0;
    if (mysql_query(db, "SELECT 1 FROM idemq_outbox LIMIT 0") != 0)
        return -1;
    mysql_free_result(mysql_store_result(db));
    return 0;
}

/* -------------------------------------------------------------------------------------- list */

/* The columns of the listing's SELECT, in this order. */
enum {
    COL_ID,
    COL_STATE,
    COL_ATTEMPTS,
    COL_AGE,
    COL_HANDLER,
    COL_EMIT,
    COL_EXCHANGE,
    COL_ROUTING_KEY,
    COL_BIZ_KEY,
    COL_SOURCE,
    COL_CONTENT_TYPE,
    COL_CREATED_MS,
    COL_PUBLISHED_MS,
    COL_LAST_ERROR,
    COL_TRACEPARENT,
    COL_TRACESTATE,
    COL_BODY, /* with_body only */
};

/* The listing's WHERE for states, into buf. */
static void state_condition(unsigned states, char *buf, size_t len)
{
    static const outbox_state known[] = {OUTBOX_ROW_PENDING, OUTBOX_ROW_PUBLISHED,
                                         OUTBOX_ROW_UNROUTABLE};
    unsigned all = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        all |= OUTBOX_STATE_BIT(known[i]);
    if (states == all) {
        buf[0] = '\0'; /* every row, also a state this idemq does not know */
        return;
    }
    size_t n = (size_t)snprintf(buf, len, " WHERE state IN (");
    const char *sep = "";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!(states & OUTBOX_STATE_BIT(known[i])))
            continue;
        n += (size_t)snprintf(buf + n, len - n, "%s%d", sep, (int)known[i]);
        sep = ", ";
    }
    snprintf(buf + n, len - n, ")");
}

static outbox_bytes bytes_of(MYSQL_ROW row, const unsigned long *lengths, int col)
{
    return (outbox_bytes){row[col], row[col] ? lengths[col] : 0};
}

int outbox_table_list(MYSQL *db, const outbox_list_query *q, outbox_list_fn fn, void *ctx,
                      size_t *shown)
{
    char where[64], limit[32] = "", sql[1024];
    *shown = 0;
    state_condition(q->states, where, sizeof where);
    if (q->limit)
        snprintf(limit, sizeof limit, " LIMIT %zu", q->limit);
    /* Times as the server computes them: age against its clock (the one created_at came
     * from), the timestamps in ms since the epoch (UNIX_TIMESTAMP reads them in the session's
     * time zone, the server's default like every idemq session). The body only when asked: it
     * may be megabytes. */
    snprintf(sql, sizeof sql,
             "SELECT id, state, attempts, TIMESTAMPDIFF(SECOND, created_at, NOW(3)), "
             "handler_name, emit_name, exchange, routing_key, biz_key, source_biz_key, "
             "content_type, FLOOR(UNIX_TIMESTAMP(created_at) * 1000), "
             "FLOOR(UNIX_TIMESTAMP(published_at) * 1000), last_error, traceparent, tracestate%s "
             "FROM idemq_outbox%s ORDER BY id%s",
             q->with_body ? ", body" : "", where, limit);
    errno = 0;
    if (mysql_query(db, sql) != 0)
        return -1;
    /* Streamed: a backlog of a million rows is listed without holding it in memory. */
    MYSQL_RES *res = mysql_use_result(db);
    if (!res)
        return -1;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res))) {
        const unsigned long *lengths = mysql_fetch_lengths(res);
        outbox_listed_row r = {
            .id = strtoll(row[COL_ID], NULL, 10),
            .state = atoi(row[COL_STATE]),
            .attempts = strtoll(row[COL_ATTEMPTS], NULL, 10),
            .age_s = row[COL_AGE] ? strtoll(row[COL_AGE], NULL, 10) : 0,
            .created_ms = strtoll(row[COL_CREATED_MS], NULL, 10),
            .published = row[COL_PUBLISHED_MS] != NULL,
            .published_ms = row[COL_PUBLISHED_MS] ? strtoll(row[COL_PUBLISHED_MS], NULL, 10) : 0,
            .handler_name = bytes_of(row, lengths, COL_HANDLER),
            .emit_name = bytes_of(row, lengths, COL_EMIT),
            .exchange = bytes_of(row, lengths, COL_EXCHANGE),
            .routing_key = bytes_of(row, lengths, COL_ROUTING_KEY),
            .biz_key = bytes_of(row, lengths, COL_BIZ_KEY),
            .source_biz_key = bytes_of(row, lengths, COL_SOURCE),
            .content_type = bytes_of(row, lengths, COL_CONTENT_TYPE),
            .last_error = bytes_of(row, lengths, COL_LAST_ERROR),
            .traceparent = bytes_of(row, lengths, COL_TRACEPARENT),
            .tracestate = bytes_of(row, lengths, COL_TRACESTATE),
            .body = q->with_body ? bytes_of(row, lengths, COL_BODY) : (outbox_bytes){NULL, 0},
        };
        fn(&r, ctx);
        (*shown)++;
    }
    bool read_failed = mysql_errno(db) != 0;
    mysql_free_result(res);
    return read_failed ? -1 : 0;
}

int outbox_table_count_states(MYSQL *db, outbox_state_counts *counts)
{
    *counts = (outbox_state_counts){0};
    errno = 0;
    if (mysql_query(db, "SELECT state, COUNT(*) FROM idemq_outbox GROUP BY state") != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(db);
    if (!res)
        return -1;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res))) {
        long long count = strtoll(row[1], NULL, 10);
        switch (atoi(row[0])) {
        case OUTBOX_ROW_PENDING:
            counts->pending = count;
            break;
        case OUTBOX_ROW_PUBLISHED:
            counts->published = count;
            break;
        case OUTBOX_ROW_UNROUTABLE:
            counts->unroutable = count;
            break;
        default:
            counts->other += count;
            break;
        }
    }
    mysql_free_result(res);
    return 0;
}

int outbox_table_max_id(MYSQL *db, long long *max_id)
{
    return scalar(db, "SELECT COALESCE(MAX(id), 0) FROM idemq_outbox", max_id);
}

/* ------------------------------------------------------------------------ rows named by --id */

/* "1, 5, 9" for an IN list of ids[0..count); returned owned, NULL when out of memory. */
static char *id_list(const unsigned long long *ids, size_t count)
{
    char *text = malloc(count * 22 + 1);
    if (!text)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        n += (size_t)sprintf(text + n, "%s%llu", i ? ", " : "", ids[i]);
    text[n] = '\0';
    return text;
}

/* The states of ids[0..count) (sorted), -1 for a missing row, into states[]: one SELECT, with
 * FOR UPDATE when lock (the caller then changes them in the same transaction). */
static int read_states(MYSQL *db, const unsigned long long *ids, size_t count, bool lock,
                       int *states)
{
    char *in = id_list(ids, count);
    char *sql = in ? malloc(strlen(in) + 128) : NULL;
    if (!sql) {
        free(in);
        errno = ENOMEM;
        return -1;
    }
    sprintf(sql, "SELECT id, state FROM idemq_outbox WHERE id IN (%s) ORDER BY id%s", in,
            lock ? " FOR UPDATE" : "");
    free(in);
    int rc = mysql_query(db, sql);
    free(sql);
    MYSQL_RES *res = rc == 0 ? mysql_store_result(db) : NULL;
    if (!res) {
        errno = 0;
        return -1;
    }
    for (size_t i = 0; i < count; i++)
        states[i] = -1;
    size_t at = 0;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res))) {
        unsigned long long id = strtoull(row[0], NULL, 10);
        while (at < count && ids[at] < id)
            at++;
        if (at < count && ids[at] == id)
            states[at] = atoi(row[1]);
    }
    mysql_free_result(res);
    return 0;
}

/* Runs the statement `head (ids...)`, head ending in "id IN", with the ids[0..count); *affected
 * gets the rows it changed. */
static int run_with_ids(MYSQL *db, const char *head, const unsigned long long *ids, size_t count,
                        unsigned long long *affected)
{
    char *in = id_list(ids, count);
    char *sql = in ? malloc(strlen(head) + strlen(in) + 4) : NULL;
    if (!sql) {
        free(in);
        errno = ENOMEM;
        return -1;
    }
    sprintf(sql, "%s (%s)", head, in);
    free(in);
    int rc = mysql_query(db, sql);
    free(sql);
    if (rc != 0) {
        errno = 0;
        return -1;
    }
    *affected = (unsigned long long)mysql_affected_rows(db);
    return 0;
}

/* Only unroutable rows go back to pending: a pending row is still to be sent and a published
 * one was confirmed by the broker. */
#define REQUEUE_HEAD "UPDATE idemq_outbox SET state = " OUTBOX_SQL_PENDING ", last_error = NULL"
#define REQUEUE_CONDITION "state = " OUTBOX_SQL_UNROUTABLE

/* Pending rows are never deleted: they are messages not yet sent. */
#define DELETE_IDS_HEAD                                                                            \
    "DELETE FROM idemq_outbox WHERE state IN (" OUTBOX_SQL_PUBLISHED ", " OUTBOX_SQL_UNROUTABLE    \
    ") AND id IN"

int outbox_table_retry_ids(MYSQL *db, const unsigned long long *ids, size_t count, outbox_id_fn fn,
                           void *ctx, unsigned long long *requeued, const char **doing)
{
    int *states = malloc(CHUNK_ROWS * sizeof *states);
    if (!states) {
        *doing = "requeueing the rows";
        errno = ENOMEM;
        return -1;
    }
    int rc = -1;
    for (size_t start = 0; start < count; start += CHUNK_ROWS) {
        size_t n = count - start < CHUNK_ROWS ? count - start : CHUNK_ROWS;
        unsigned long long affected = 0;
        *doing = "reading the rows";
        if (read_states(db, ids + start, n, true, states) != 0)
            goto out;
        *doing = "requeueing the rows";
        if (run_with_ids(db, REQUEUE_HEAD " WHERE " REQUEUE_CONDITION " AND id IN", ids + start, n,
                         &affected) != 0)
            goto out;
        *doing = "committing";
        errno = 0;
        if (mysql_commit(db) != 0)
            goto out;
        *requeued += affected;
        for (size_t i = 0; i < n; i++)
            fn(ids[start + i], states[i], ctx);
    }
    rc = 0;
out:
    free(states);
    return rc;
}

int outbox_table_purge_ids(MYSQL *db, const unsigned long long *ids, size_t count, bool apply,
                           outbox_id_fn fn, void *ctx, unsigned long long *deleted,
                           const char **doing)
{
    int *states = malloc(CHUNK_ROWS * sizeof *states);
    if (!states) {
        *doing = "reading the rows";
        errno = ENOMEM;
        return -1;
    }
    int rc = -1;
    for (size_t start = 0; start < count; start += CHUNK_ROWS) {
        size_t n = count - start < CHUNK_ROWS ? count - start : CHUNK_ROWS;
        *doing = "reading the rows";
        if (read_states(db, ids + start, n, apply, states) != 0)
            goto out;
        for (size_t i = 0; i < n; i++)
            fn(ids[start + i], states[i], ctx);
        if (!apply) {
            mysql_rollback(db);
            continue;
        }
        unsigned long long affected = 0;
        *doing = "deleting";
        if (run_with_ids(db, DELETE_IDS_HEAD, ids + start, n, &affected) != 0)
            goto out;
        *doing = "committing";
        errno = 0;
        if (mysql_commit(db) != 0)
            goto out;
        *deleted += affected;
    }
    rc = 0;
out:
    free(states);
    return rc;
}

/* ----------------------------------------------------------------------------------- chunks */

/*
 * Applies `head WHERE condition AND id IN (...)` (head an UPDATE or DELETE of idemq_outbox) to
 * the rows matching condition with ids up to max_id, CHUNK_ROWS per transaction, walking the id
 * forward. Each chunk's ids come from a consistent (non-locking) read, and the statement then
 * locks only those rows by primary key and checks condition again: a plain `DELETE ... WHERE
 * state = 1 ORDER BY id LIMIT 1000` may scan the primary key and, under REPEATABLE READ, lock
 * every row it passes, the relay's pending rows included. A row that stopped matching between
 * the two is left alone. *changed (0 at the start) adds the rows changed by each committed
 * chunk. Returns 0 or -1 (the open chunk is rolled back by the caller).
 */
static int walk_chunks(MYSQL *db, const char *condition, long long max_id, const char *head,
                       unsigned long long *changed)
{
    unsigned long long *ids = malloc(CHUNK_ROWS * sizeof *ids);
    size_t head_len = strlen(head) + strlen(condition) + 32;
    char *chunk_head = malloc(head_len);
    int rc = -1;
    if (!ids || !chunk_head) {
        errno = ENOMEM;
        goto out;
    }
    snprintf(chunk_head, head_len, "%s WHERE %s AND id IN", head, condition);
    long long after = 0;
    for (;;) {
        char sql[512];
        snprintf(sql, sizeof sql,
                 "SELECT id FROM idemq_outbox WHERE %s AND id > %lld AND id <= %lld ORDER BY id "
                 "LIMIT %d",
                 condition, after, max_id, CHUNK_ROWS);
        errno = 0;
        if (mysql_query(db, sql) != 0)
            goto out;
        MYSQL_RES *res = mysql_store_result(db);
        if (!res)
            goto out;
        size_t n = 0;
        MYSQL_ROW row;
        while ((row = mysql_fetch_row(res)) && n < CHUNK_ROWS)
            ids[n++] = strtoull(row[0], NULL, 10);
        mysql_free_result(res);
        if (n == 0)
            break;
        unsigned long long affected = 0;
        if (run_with_ids(db, chunk_head, ids, n, &affected) != 0)
            goto out;
        errno = 0;
        if (mysql_commit(db) != 0)
            goto out;
        *changed += affected;
        after = (long long)ids[n - 1];
        if (n < CHUNK_ROWS)
            break;
    }
    rc = 0;
out:
    free(ids);
    free(chunk_head);
    return rc;
}

int outbox_table_requeue_unroutable(MYSQL *db, long long max_id, unsigned long long *requeued)
{
    return walk_chunks(db, REQUEUE_CONDITION, max_id, REQUEUE_HEAD, requeued);
}

/* ------------------------------------------------------------------------------------ purge */

int outbox_table_purge_cutoff(MYSQL *db, unsigned long long older_than_ms)
{
    /* A user variable: it outlives the chunks' transactions. One before year 1 is NULL: nothing
     * is that old, and nothing is deleted. */
    char sql[512];
    snprintf(sql, sizeof sql,
             "SET @idemq_purge_cutoff = NOW(3) - INTERVAL %llu SECOND - INTERVAL %llu "
             "MICROSECOND",
             older_than_ms / 1000, older_than_ms % 1000 * 1000);
    errno = 0;
    return mysql_query(db, sql) != 0 ? -1 : 0;
}

/* What q deletes, into buf: rows of its state (published before @idemq_purge_cutoff). */
static void purge_condition(const outbox_purge_query *q, char *buf, size_t len)
{
    snprintf(buf, len, "state = %d%s", (int)q->state,
             q->older_than_set ? " AND published_at < @idemq_purge_cutoff" : "");
}

int outbox_table_purge_count(MYSQL *db, const outbox_purge_query *q, long long *count)
{
    char sql[512], condition[160];
    purge_condition(q, condition, sizeof condition);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM idemq_outbox WHERE %s AND id <= %lld",
             condition, q->max_id);
    return scalar(db, sql, count);
}

int outbox_table_purge(MYSQL *db, const outbox_purge_query *q, unsigned long long *deleted)
{
    char condition[160];
    purge_condition(q, condition, sizeof condition);
    return walk_chunks(db, condition, q->max_id, "DELETE FROM idemq_outbox", deleted);
}
