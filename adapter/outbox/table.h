/*
 * table — the one owner of idemq_outbox's SQL: its state values, the statements the writer,
 * the relay and `idemq outbox` run on it.
 *
 * Where each statement lives:
 *   DDL           store/schema.c (store_outbox_ddl, run by `idemq migrate`), kept identical to
 *                 schemas/mysql/003_outbox.sql: migrations stay together with msg_dedup's.
 *   INSERT        OUTBOX_TABLE_INSERT_HEAD / _ROW below, batched by outbox/writer.c.
 *   relay         OUTBOX_TABLE_FETCH_PENDING_HEAD ... _SWEEP_FMT below, run by outbox/relay_db.c
 *                 (the pending scan, the marks, the pending count, the retention sweep).
 *                 The lease is another table, idemq_outbox_lease, and relay_db.c's alone.
 *   operator      the functions below, for cli/outbox.c: the listing, the per-state counts,
 *                 the rows named by --id, and retry and purge in chunks.
 *
 * A state appears in SQL only through OUTBOX_SQL_PENDING/PUBLISHED/UNROUTABLE, which expand to
 * the same numbers as the enum, so a statement and the C code cannot disagree about them.
 *
 * Errors: the int functions return 0 or -1. After -1, errno is ENOMEM when memory ran out, else
 * 0 and the failure is the connection's (mysql_errno, mysql_error on db).
 * Thread affinity: whichever thread owns db; the functions keep no state of their own.
 */
#ifndef IDEMQ_OUTBOX_TABLE_H
#define IDEMQ_OUTBOX_TABLE_H

#include <inttypes.h>
#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* idemq_outbox.state (schemas/mysql/003_outbox.sql). Both the enum and the SQL text come from
 * these numbers. */
#define OUTBOX_STATE_VALUE_PENDING 0
#define OUTBOX_STATE_VALUE_PUBLISHED 1
#define OUTBOX_STATE_VALUE_UNROUTABLE 2

typedef enum outbox_state {
    OUTBOX_ROW_PENDING = OUTBOX_STATE_VALUE_PENDING,       /* not yet published */
    OUTBOX_ROW_PUBLISHED = OUTBOX_STATE_VALUE_PUBLISHED,   /* confirmed by the broker */
    OUTBOX_ROW_UNROUTABLE = OUTBOX_STATE_VALUE_UNROUTABLE, /* returned, or no such exchange */
} outbox_state;

#define OUTBOX_SQL_TEXT_(x) #x
#define OUTBOX_SQL_TEXT(x) OUTBOX_SQL_TEXT_(x)
/* The states as SQL literals, for string concatenation: "state = " OUTBOX_SQL_PENDING. */
#define OUTBOX_SQL_PENDING OUTBOX_SQL_TEXT(OUTBOX_STATE_VALUE_PENDING)
#define OUTBOX_SQL_PUBLISHED OUTBOX_SQL_TEXT(OUTBOX_STATE_VALUE_PUBLISHED)
#define OUTBOX_SQL_UNROUTABLE OUTBOX_SQL_TEXT(OUTBOX_STATE_VALUE_UNROUTABLE)

/* The writer's INSERT: the head, then one OUTBOX_TABLE_INSERT_ROW per row, comma-separated; its
 * parameters in order: source_biz_key, handler_name, emit_name, biz_key, exchange, routing_key,
 * content_type, body, traceparent, tracestate (the last two NULL when the row has no trace
 * context). state, attempts and created_at take their defaults (pending, 0, now). */
#define OUTBOX_TABLE_INSERT_HEAD                                                                   \
    "INSERT INTO idemq_outbox (source_biz_key, handler_name, emit_name, biz_key, exchange, "       \
    "routing_key, content_type, body, traceparent, tracestate) VALUES "
#define OUTBOX_TABLE_INSERT_ROW "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
#define OUTBOX_TABLE_INSERT_PARAMS 10
/* The parameters of the trace context: bound as NULL when their span is OUTBOX_NO_VALUE. */
#define OUTBOX_TABLE_INSERT_TRACEPARENT 8
#define OUTBOX_TABLE_INSERT_TRACESTATE 9

/* ------------------------------------------------------------------------------ the relay */

/* The relay's statements, run by outbox/relay_db.c on its autocommit connection (the values it
 * splices in: integers it made, strings escaped on that connection). */

/* The oldest pending rows: the head, then optionally " AND id NOT IN (ids)" (the rows of a round
 * still in flight), then the tail with how many (%u); its columns in this order. */
#define OUTBOX_TABLE_FETCH_PENDING_HEAD                                                            \
    "SELECT id, source_biz_key, handler_name, emit_name, biz_key, exchange, routing_key, "         \
    "content_type, body, UNIX_TIMESTAMP(created_at), traceparent, tracestate FROM idemq_outbox "    \
    "WHERE state = " OUTBOX_SQL_PENDING
#define OUTBOX_TABLE_FETCH_PENDING_TAIL_FMT " ORDER BY id LIMIT %u"

/* Published rows: the head of a statement ended by the ids, comma-separated, and ")". */
#define OUTBOX_TABLE_MARK_PUBLISHED_HEAD                                                           \
    "UPDATE idemq_outbox SET state = " OUTBOX_SQL_PUBLISHED ", published_at = NOW(3) "             \
    "WHERE id IN ("
#define OUTBOX_TABLE_DELETE_PUBLISHED_HEAD "DELETE FROM idemq_outbox WHERE id IN ("

/* One pending row (id %" PRId64 ") returned or refused: unroutable, with the error '%s'. */
#define OUTBOX_TABLE_MARK_UNROUTABLE_FMT                                                           \
    "UPDATE idemq_outbox SET state = " OUTBOX_SQL_UNROUTABLE                                       \
    ", attempts = attempts + 1, last_error = '%s' WHERE id = %" PRId64                             \
    " AND state = " OUTBOX_SQL_PENDING

/* One pending row nacked: it stays pending, with the error '%s'. */
#define OUTBOX_TABLE_MARK_NACKED_FMT                                                               \
    "UPDATE idemq_outbox SET attempts = attempts + 1, last_error = '%s' WHERE id = %" PRId64       \
    " AND state = " OUTBOX_SQL_PENDING

/* The pending rows and the age of the oldest in microseconds, on the server's clock. */
#define OUTBOX_TABLE_COUNT_PENDING                                                                 \
    "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(3)) FROM idemq_outbox "      \
    "WHERE state = " OUTBOX_SQL_PENDING

/* Retention: published rows older than %" PRIu64 " microseconds, at most %d of them. */
#define OUTBOX_TABLE_SWEEP_FMT                                                                     \
    "DELETE FROM idemq_outbox WHERE state = " OUTBOX_SQL_PUBLISHED                                 \
    " AND published_at < NOW(3) - INTERVAL %" PRIu64 " MICROSECOND ORDER BY published_at "         \
    "LIMIT %d"

/* --------------------------------------------------------------------- for `idemq outbox` */

/* Rows per transaction of retry and purge, and ids per statement of the --id ones. */
#define OUTBOX_TABLE_CHUNK_ROWS 1000

/* Bit of a selection of states (outbox_table_list's states). */
#define OUTBOX_STATE_BIT(state) (1u << (state))

/* Whether the table can be read: 0, or -1 (ER_NO_SUCH_TABLE: it is missing). */
int outbox_table_probe(MYSQL *db);

/* A column's bytes as the server sent them; data NULL for SQL NULL (len 0). Borrowed from the
 * result: valid only during the callback. */
typedef struct outbox_bytes {
    const char *data;
    size_t len;
} outbox_bytes;

/* One row of the listing. */
typedef struct outbox_listed_row {
    long long id;
    int state; /* an outbox_state, or a number this idemq does not know */
    long long attempts;
    long long age_s;        /* seconds since created_at, on the server's clock */
    long long created_ms;   /* ms since the epoch */
    bool published;         /* published_at is set ... */
    long long published_ms; /* ... to this, in ms since the epoch */
    outbox_bytes handler_name, emit_name, exchange, routing_key, biz_key, source_biz_key,
        content_type, last_error, traceparent, tracestate,
        body; /* body: only when the listing asked for it */
} outbox_listed_row;

typedef struct outbox_list_query {
    unsigned states; /* OUTBOX_STATE_BIT()s, not 0; all three: every row, also a state this
                      * idemq does not know */
    size_t limit;    /* 0: no limit */
    bool with_body;
} outbox_list_query;

/* Called for each listed row (borrowed, see outbox_bytes) with the caller's ctx. */
typedef void (*outbox_list_fn)(const outbox_listed_row *row, void *ctx);

/* The rows of q (borrowed) oldest first (by id), streamed: fn sees each in turn and *shown gets
 * their number. The result is always read to its end. */
int outbox_table_list(MYSQL *db, const outbox_list_query *q, outbox_list_fn fn, void *ctx,
                      size_t *shown);

/* Rows per state over the whole table, from one GROUP BY. */
typedef struct outbox_state_counts {
    long long pending, published, unroutable;
    long long other; /* states this idemq does not know */
} outbox_state_counts;

int outbox_table_count_states(MYSQL *db, outbox_state_counts *counts);

/* The largest id (0: empty table). */
int outbox_table_max_id(MYSQL *db, long long *max_id);

/* Called by the --id operations for each id with the state its row had (an outbox_state, a
 * number this idemq does not know, or -1: no such row); ctx is the caller's. */
typedef void (*outbox_id_fn)(unsigned long long id, int state, void *ctx);

/* Retries ids[0..count) (sorted, without repeats, borrowed), OUTBOX_TABLE_CHUNK_ROWS per
 * transaction: a chunk's rows read FOR UPDATE, the unroutable ones set back to pending
 * (last_error cleared, attempts kept: a pending row is still to be sent and a published one was
 * confirmed), committed; then fn sees each id of the chunk. *requeued (0 at the start) adds each
 * committed chunk's rows. On -1 *doing says what failed ("reading the rows", "requeueing the
 * rows", "committing") and the open chunk is the caller's to roll back. */
int outbox_table_retry_ids(MYSQL *db, const unsigned long long *ids, size_t count, outbox_id_fn fn,
                           void *ctx, unsigned long long *requeued, const char **doing);

/* Purges ids[0..count) (as retry_ids) in chunks: fn sees each id of a chunk once its rows are
 * read, FOR UPDATE when apply; with apply the published and unroutable ones are then deleted
 * (never a pending one: it is a message not yet sent) and the chunk committed, without it the
 * chunk is rolled back. *deleted (0 at the start) adds each committed chunk's rows. On -1
 * *doing says what failed ("reading the rows", "deleting", "committing"), as retry_ids. */
int outbox_table_purge_ids(MYSQL *db, const unsigned long long *ids, size_t count, bool apply,
                           outbox_id_fn fn, void *ctx, unsigned long long *deleted,
                           const char **doing);

/* Every unroutable row with an id up to max_id set back to pending (as requeue_ids),
 * OUTBOX_TABLE_CHUNK_ROWS per committed transaction; *requeued (0 at the start) adds each
 * committed chunk's rows. On -1 the open chunk is the caller's to roll back. */
int outbox_table_requeue_unroutable(MYSQL *db, long long max_id, unsigned long long *requeued);

/* What purge --published or --unroutable deletes. */
typedef struct outbox_purge_query {
    outbox_state state;  /* OUTBOX_ROW_PUBLISHED or OUTBOX_ROW_UNROUTABLE */
    bool older_than_set; /* only rows published before the cutoff outbox_table_purge_cutoff set */
    long long max_id;    /* only rows with ids up to this */
} outbox_purge_query;

/* Sets the session's purge cutoff to now - older_than_ms (on the server's clock); it outlives
 * the transactions of the chunks. */
int outbox_table_purge_cutoff(MYSQL *db, unsigned long long older_than_ms);

/* How many rows q (borrowed) would delete, into *count. */
int outbox_table_purge_count(MYSQL *db, const outbox_purge_query *q, long long *count);

/* Deletes the rows of q (borrowed), OUTBOX_TABLE_CHUNK_ROWS per committed transaction; *deleted
 * (0 at the start) adds each committed chunk's rows. On -1 the open chunk is the caller's to
 * roll back. */
int outbox_table_purge(MYSQL *db, const outbox_purge_query *q, unsigned long long *deleted);

#endif
