/*
 * session — one DB worker's database session: its MySQL connection, the prepared dedup insert,
 * each consumer's handler state (the handlers' prepared statements) and the outbox rows of the
 * transaction in progress (outbox/writer.h). The connection is
 * opened lazily and dropped whole after an infrastructure error, statements and all, so the next
 * job starts from a clean session. The outage probe's two checks run on a session too: the
 * server accepts writes, and every statement a message will run prepares again.
 *
 * Errors: store_session_init and _connect return 0 or -1 (out of memory; the connect reason in
 * err). Steps that return apply_status return APPLY_OK (handlers/handler.h) to go on, or
 * the classified failure with job->error and job->mysql_errno set.
 * Thread affinity: the worker that owns the session.
 */
#ifndef IDEMQ_STORE_SESSION_H
#define IDEMQ_STORE_SESSION_H

#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "db/dsn.h"
#include "policy/outcome.h"
#include "store/store.h"

struct store_batch_state;
struct outbox_writer;

typedef struct store_session {
    const config *cfg;          /* borrowed, outlives the session */
    MYSQL *db;                  /* owned; NULL while disconnected */
    MYSQL_STMT *dedup_insert;   /* owned; prepared on first use */
    MYSQL_STMT *dedup_previous; /* owned; the rotating layout's lookup (store/rotation.h) */
    void **handler_states;      /* owned array, one per consumer; each entry handler-owned */
    struct store_batch_state *batch; /* owned: store/batch.h's arrays and statements */
    bool returning;             /* the server has INSERT … RETURNING (MariaDB 10.5 and later;
                                 * MySQL has none); set at connect */
    struct outbox_writer *outbox; /* owned: the outbox rows of the transaction in progress */
    size_t outbox_committed;    /* outbox rows committed since the pool last told the relay */
} store_session;

/* Fills caller-owned storage for cfg (borrowed), disconnected. Returns 0, or -1 out of memory
 * (then s needs no close). */
int store_session_init(store_session *s, const config *cfg);

/* Disconnects and frees what store_session_init allocated. Safe on zeroed storage. */
void store_session_close(store_session *s);

/* Connects to dsn (borrowed) unless connected, and notes whether the server has INSERT …
 * RETURNING (never with IDEMQ_TEST_NO_RETURNING set: the tests' way to run MySQL's path on
 * MariaDB). Returns 0, or -1 with the reason in err and the MySQL error number in *error_number
 * (db_connect). */
int store_session_connect(store_session *s, const db_dsn *dsn, unsigned *error_number, char *err,
                          size_t err_len);

/* Releases every handler state, closes the dedup insert and the connection. */
void store_session_disconnect(store_session *s);

/* The dedup insert statement (and, in the rotating layout, the msg_dedup_previous lookup):
 * prepared on first use, or again from scratch when fresh. Returns APPLY_OK with them in
 * s->dedup_insert and s->dedup_previous, or the classified failure. */
apply_status store_session_prepare_dedup_insert(store_session *s, store_job *job, bool fresh);

/*
 * The outage probe's first check: the server answers and accepts writes. A read-only server
 * (after a failover, or --read-only) answers pings yet fails every transaction, and resuming on
 * it would only pause again at once. APPLY_OK or APPLY_UNAVAILABLE.
 */
apply_status store_session_check_writable(store_session *s, store_job *job);

/*
 * The outage probe's second check: every statement a message will run prepares again, from
 * scratch (cached ones are dropped first). After a schema error (a table renamed away, a column
 * dropped, a grant revoked) this is what proves the operator's fix, where a ping would not.
 * APPLY_OK, or a classified failure (the dedup insert) or APPLY_UNAVAILABLE (a handler's
 * statement: job->consumer_index says whose).
 */
apply_status store_session_check_statements(store_session *s, store_job *job);

/* Records the last error of s->db in job: job->mysql_errno and "what: MySQL error N (SQLSTATE):
 * text" in job->error. Returns its classification. */
apply_status store_session_fail(store_session *s, store_job *job, const char *what);

#endif
