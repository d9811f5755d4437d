/*
 * relay_db — the relay's SQL (outbox/relay.h): its connection, the lease, the rows of a round and
 * how they are marked, the pending count, the retention sweep; the statements on idemq_outbox
 * and its states are outbox/table.h's. Internal to the relay.
 *
 * The connection runs in autocommit: every statement here is one transaction of its own (the
 * lease must be visible to the other instances at once; a round's marks need no atomicity beyond
 * one statement, since a row left unmarked is only published again).
 *
 * Errors: int functions return 0 or -1 with the MySQL error (or what failed) in err; after -1
 * the caller closes the connection and reconnects, whatever the error was.
 * Thread affinity: the relay thread (it owns the connection).
 */
#ifndef IDEMQ_OUTBOX_RELAY_DB_H
#define IDEMQ_OUTBOX_RELAY_DB_H

#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db/dsn.h"

#define RELAY_ROW_ERROR_MAX 512 /* last_error is VARCHAR(512) */

/* What the broker said about one row of a round. */
typedef enum relay_outcome {
    RELAY_ROW_UNKNOWN = 0, /* no confirm (yet): the row stays pending and goes out again */
    RELAY_ROW_PUBLISHED,   /* acked and not returned: published (or deleted) */
    RELAY_ROW_UNROUTABLE,  /* returned, or its exchange does not exist: unroutable, error */
    RELAY_ROW_NACKED,      /* nacked: attempts + 1, error, stays pending */
} relay_outcome;

/* Bytes of a column, copied and NUL-terminated (VARBINARY may hold a NUL: len counts). */
typedef struct relay_bytes {
    char *data;
    size_t len;
} relay_bytes;

typedef struct relay_row {
    int64_t id;
    relay_bytes source_biz_key, handler_name, emit_name, biz_key, exchange, routing_key,
        content_type, body;
    int64_t created_at_s; /* UNIX_TIMESTAMP(created_at), whole seconds */
    relay_bytes traceparent, tracestate; /* len 0: NULL, the header is not sent */
    /* filled in by the round (relay_publish.c) */
    uint64_t seq;  /* the channel's publish number; 0: not published */
    bool returned; /* a basic.return named it (its confirm then fails) */
    relay_outcome outcome;
    char error[RELAY_ROW_ERROR_MAX]; /* UNROUTABLE, NACKED: last_error */
} relay_row;

/* Connects (client timeouts: connect 5 s, read and write 10 s), turns autocommit on and makes
 * sure the lease row exists (INSERT IGNORE). Returns the owned connection or NULL with err. */
MYSQL *relay_db_connect(const db_dsn *dsn, char *err, size_t err_len);

/* One lease attempt for owner (borrowed) for lease_ms: *leader is whether this relay holds it
 * now. */
int relay_db_lease(MYSQL *db, const char *owner, uint64_t lease_ms, bool *leader, char *err,
                   size_t err_len);

/* Ends owner's lease now (no-op when another owner holds it). */
int relay_db_release(MYSQL *db, const char *owner, char *err, size_t err_len);

/* The body bytes one round holds at most (a single larger row still goes alone). */
#define RELAY_ROUND_BYTES ((size_t)16 * 1024 * 1024)

/* The oldest `batch` pending rows in id order but those of in_flight[0..in_flight_count) (a round
 * published and not yet marked; none: NULL, 0), at most RELAY_ROUND_BYTES of bodies, into *rows
 * (returned owned: relay_rows_free) and *count (0 with *rows NULL when none). */
int relay_db_fetch(MYSQL *db, unsigned batch, const relay_row *in_flight, size_t in_flight_count,
                   relay_row **rows, size_t *count, char *err, size_t err_len);

void relay_rows_free(relay_row *rows, size_t count);

/* What relay_db_mark did. */
typedef struct relay_mark_result {
    size_t published;  /* rows marked published (or deleted) */
    size_t unroutable; /* rows marked unroutable */
    size_t nacked;     /* rows whose attempts went up */
} relay_mark_result;

/* Marks rows[0..count) by their outcome: PUBLISHED → published, published_at NOW(3) (deleted
 * when delete_published), one statement; UNROUTABLE → unroutable with the error; NACKED →
 * attempts + 1 with the error; UNKNOWN untouched. *done says what went through, also on failure
 * (the rows marked before it). */
int relay_db_mark(MYSQL *db, const relay_row *rows, size_t count, bool delete_published,
                  relay_mark_result *done, char *err, size_t err_len);

/* The pending rows and the age in seconds of the oldest (0 when none), on the server's clock. */
int relay_db_pending(MYSQL *db, uint64_t *pending, double *oldest_s, char *err, size_t err_len);

/* Deletes published rows older than retention_ms, 1000 per statement while a statement deletes
 * 1000, at most max_statements statements; *deleted gets how many. */
int relay_db_sweep(MYSQL *db, uint64_t retention_ms, unsigned max_statements, uint64_t *deleted,
                   char *err, size_t err_len);

#endif
