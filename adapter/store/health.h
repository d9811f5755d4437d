/*
 * health — the database health monitor behind /readyz and idemq_up{mysql}: its own thread and
 * its own MySQL connection, never a DB worker's, so a frozen database or workers stuck in long
 * transactions cannot make it wait (the store's PING job queued behind them and kept /readyz
 * green for 30 s of a frozen database).
 *
 * Every interval (1 s) the thread probes: connect if not connected, then one query that touches
 * no table, SELECT @@global.read_only, @@global.innodb_read_only. The database is healthy when
 * it answers and accepts writes (the check of the store's PING and outage probe,
 * store_session_check_writable). The connection has its own short client timeouts (2 s for the
 * connect and each read and write), so a frozen server fails the probe in about 2 s. A
 * connection that broke between probes (a server restart, a reset) gets one fresh connect in
 * the same probe, so it does not read as an outage by itself.
 *
 * Staleness counts as failure: when no probe has completed for stale_ms (interval + timeout +
 * 0.5 s), the state reads "not ok" whatever the last probe said, even if the thread is stuck
 * inside the client library beyond its timeouts. So readiness turns false within about
 * interval + timeout + 0.5 s (3.5 s by default) of the database freezing, whatever happens
 * (a host name whose lookup hangs, which no client timeout bounds, included).
 *
 * Transitions: the state is read, not pushed. The loop can poll db_health_read from a timer
 * (every 250-500 ms) and log when `ok` changes; `failures` tells it a probe failed between two
 * polls even when the state is ok again. There is no callback because a stuck probe thread
 * could not deliver the one transition that matters (to stale).
 *
 * Errors: db_health_start returns 0 or -1 (out of memory, no thread) with a reason in err; what
 * the database does is state, never an error. Thread affinity: db_health_start and
 * db_health_free from one thread (the owner's); db_health_read and db_health_ok from any thread
 * (a mutex guards the state). The probe thread runs mysql_thread_init/_end itself;
 * db_health_start runs db_library_init before starting it.
 */
#ifndef IDEMQ_STORE_HEALTH_H
#define IDEMQ_STORE_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db/dsn.h"

typedef struct db_health db_health;

typedef struct db_health_options {
    unsigned interval_ms; /* from one probe's start to the next; 0 → 1000 */
    unsigned timeout_s;   /* the client's connect, read and write timeouts (whole seconds: the
                             client library's unit); 0 → 2 */
    unsigned stale_ms;    /* not ok when no probe completed for this long; 0 → interval_ms +
                             1000 * timeout_s + 500 */
} db_health_options;

typedef struct db_health_status {
    bool ok;              /* the last probe passed and it is recent */
    bool stale;           /* not ok because no probe completed within stale_ms */
    bool timed_out;       /* the last probe failed by running into its timeout */
    unsigned mysql_errno; /* of the last failed probe (0: none, or not a MySQL error) */
    uint64_t probes;      /* completed probes since the start */
    uint64_t failures;    /* ... of which failed */
    int64_t age_ms;       /* since the last probe completed; -1: none yet */
    int64_t duration_ms;  /* the last completed probe's; -1: none yet */
    char reason[1024];    /* why not ok (see db_health_read); "" when ok */
} db_health_status;

/*
 * Copies dsn (borrowed; its TLS file paths stay borrowed and must outlive the monitor, as the
 * config's do) and starts the probe thread; the first probe starts at once. opts is borrowed;
 * NULL takes every default. Until the first probe completes the state is not ok ("the database
 * health probe has not completed yet"). Returns 0 with the owned monitor in *out, or -1 with a
 * reason in err and *out NULL.
 */
int db_health_start(const db_dsn *dsn, const db_health_options *opts, db_health **out, char *err,
                    size_t err_len);

/*
 * Fills *out with the state now. Reasons when not ok:
 *   "database did not answer within 2 s (health probe): <the client's error>"  a timeout
 *   "database did not answer within 2 s (health probe stuck for 3712 ms)"     stale
 *   "cannot connect to MySQL at host:port/db: <text> (error N)"                 db_connect's
 *   "health probe: MySQL error N (SQLSTATE): text"                             the query failed
 *   "the database is read-only (@@read_only = 1)" (or @@innodb_read_only)
 *   "the database health probe has not completed yet"
 * Any thread.
 */
void db_health_read(db_health *h, db_health_status *out);

/* Whether the database is healthy now (db_health_read's ok); when not, the reason goes into
 * reason (unless NULL; truncated to reason_len). Any thread. */
bool db_health_ok(db_health *h, char *reason, size_t reason_len);

/* Stops the probe thread and joins it, then frees h. A probe waiting on a connected socket is cut
 * short (the socket is shut down); one inside a connect ends within its connect timeout, so this
 * returns within about timeout_s even while the database is frozen. NULL is a no-op. */
void db_health_free(db_health *h);

#endif
