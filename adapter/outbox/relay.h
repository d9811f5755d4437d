/*
 * relay — publishes the rows of idemq_outbox (schemas/mysql/003_outbox.sql, outbox/writer.h)
 * after their COMMIT, with publisher confirms, and marks each row only once the broker confirmed
 * it.
 *
 * One thread per relay, with its own MySQL connection (autocommit) and its own AMQP connection
 * (confirm mode, amqp.urls rotated like the session's, broker/nodes.h): nothing here ever waits
 * on the caller's thread. Both connections are reopened with backoff (100 ms doubling to 5 s)
 * after any error, whatever it was; the relay never ends the process.
 *
 * Leader lease: several instances may run a relay on one table; only the holder of the lease row
 * idemq_outbox_lease(name 'default') publishes, so rows go out in id order from one place and
 * replicas neither race nor stall each other. Every relay tries
 *   UPDATE idemq_outbox_lease SET owner = me, expires_at = NOW(6) + lease
 *    WHERE name = 'default' AND (owner = me OR expires_at < NOW(6))
 * (the server's clock, so the instances' clocks do not matter): the leader every lease/3 to
 * renew it, a standby every min(poll_interval, lease/3) to take over once it lapsed. A leader
 * whose renewal fails (the database is gone) stops publishing at once. outbox_relay_stop
 * releases the lease (expires_at in the past, where the owner is still this relay), so a standby
 * takes over within its next attempt rather than a whole lease later. Transitions are logged.
 *
 * A round (leader only): the oldest `batch` pending rows (state 0) in id order; each exchange
 * not yet seen on this connection is checked first (a passive exchange.declare), so the rows of
 * an exchange that does not exist are marked unroutable (state 2, "exchange not found: 404
 * NOT_FOUND - no exchange 'x' in vhost '/'") without publishing into a channel that the broker
 * would close. The others are published in id order, mandatory, persistent, with content_type
 * from the row, message_id = the row's biz_key (deterministic: outbox/writer.h), app_id "idemq",
 * timestamp = created_at and the headers idemq-source-biz-key, idemq-handler, idemq-emit
 * (strings) and idemq-outbox-id (int64). Then every confirm is awaited (at most 10 s; longer is
 * treated as a broken connection) and the rows are marked in one pass:
 *   acked                → state 1, published_at = NOW(3) (deleted instead when retention is 0);
 *   returned (no route)  → state 2, last_error "unroutable: 312 NO_ROUTE (exchange 'x', routing
 *                          key 'y')", counted in unroutable_total and logged at warn;
 *   exchange deleted since its check (the broker closes the channel with 404) → that row state 2
 *                          with the broker's reason; the channel is reopened, and the rows whose
 *                          confirms the close swallowed stay pending for the next round, at once;
 *   nacked               → attempts + 1, last_error, stays pending; the next round waits a
 *                          backoff (100 ms doubling to 5 s per nacked round in a row);
 *   no confirm (connection lost, timeout) → stays pending: published again by the next round.
 * A round that took a full batch is followed by the next one at once; otherwise the relay waits
 * for outbox_relay_notify or poll_interval, whichever comes first. Back to back, the rounds
 * overlap: while the broker stores a full round, the relay marks the round before and fetches the
 * next (leaving out the rows in flight), so the database's share of a round no longer adds to the
 * broker's. A round is held for that only when every row got its answer; one with a nack or a row
 * left without a confirm is marked at once and the next is fetched after it, as without overlap.
 * A held round is marked before the relay stops, stands by or waits.
 *
 * Delivery is at least once: a row is marked after its confirm, so a crash (or a lost database)
 * between the confirm and the mark publishes it again, with the same message_id; a downstream
 * idemq deduplicates it by that key. Nothing confirmed is ever lost, nothing unconfirmed is ever
 * marked.
 *
 * Order: rows go out in id order within a round and across rounds (a row left pending is the
 * first of the next round), so a consumer sees one key's rows in the order their transactions
 * got their ids, with three exceptions a consumer keyed on message_id must tolerate: a re-publish
 * after a crash repeats rows already seen; a nacked row goes out again after the rows behind it;
 * and AUTO_INCREMENT ids are taken at INSERT, not at COMMIT, so a transaction that commits after
 * one with a higher id is published after it (the relay only sees committed rows).
 *
 * Retention: every 10 s the leader deletes published rows older than retention_ms (1000 rows per
 * statement, repeated while full). Stats: at most once a second every relay (standbys too)
 * counts the pending rows and the age of the oldest on the server's clock.
 *
 * Test-only fault injection: with IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS=N in the environment the
 * process SIGKILLs itself after the N-th round whose confirms all arrived (with at least one
 * row), before it marks that round's rows: the crash between confirm and mark that
 * tests/integration/test_outbox_relay.c recovers from. Never set it otherwise.
 *
 * Wiring (cli/run.c): start one relay per instance when cfg->outbox.relay is 1 (and the outbox is
 * used), with an owner unique to the process (e.g. "host:pid:random": two instances with one
 * owner would both think they lead); call outbox_relay_notify after each COMMIT that inserted
 * outbox rows; outbox_relay_stuck for /readyz; outbox_relay_metrics_probe for /metrics; stop it
 * after the workers stopped, so their last rows are still announced.
 *
 * Errors: outbox_relay_start returns 0 or -1 (out of memory, no thread, a bad owner) with a
 * reason in err; what the servers do is state (stats, outbox_relay_stuck), never an error.
 * Thread affinity: outbox_relay_start and outbox_relay_stop on the owner's thread;
 * outbox_relay_notify, outbox_relay_read and outbox_relay_stuck from any thread (the state is
 * under a mutex; notify writes an eventfd). The relay thread runs mysql_thread_init/_end itself.
 */
#ifndef IDEMQ_OUTBOX_RELAY_H
#define IDEMQ_OUTBOX_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "db/dsn.h"
#include "ops/metrics.h"

/* The lease row's owner column is VARBINARY(128). */
#define OUTBOX_RELAY_OWNER_MAX 128
/* The headers every relayed message carries (strings, but the id: an int64), and its app_id. */
#define OUTBOX_HEADER_SOURCE_BIZ_KEY "idemq-source-biz-key"
#define OUTBOX_HEADER_HANDLER "idemq-handler"
#define OUTBOX_HEADER_EMIT "idemq-emit"
#define OUTBOX_HEADER_OUTBOX_ID "idemq-outbox-id"
#define OUTBOX_APP_ID "idemq"
/* The test-only kill hook (see above). */
#define OUTBOX_RELAY_KILL_ENV "IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS"

typedef struct outbox_relay outbox_relay;

typedef struct outbox_relay_stats {
    uint64_t pending;          /* rows in state 0 at the last count (any instance's) */
    double oldest_pending_s;   /* age of the oldest of them then, plus the time since; 0: none */
    uint64_t published_total;  /* rows this process published and marked (state 1) */
    uint64_t unroutable_total; /* rows this process marked unroutable (state 2) */
    uint64_t rounds;           /* rounds that published at least one row, since the start */
    uint64_t scans;            /* looks for pending rows (found or not), since the start */
    bool leader;               /* this relay holds the lease */
    bool connected;            /* this relay's AMQP connection is open (only a leader opens one) */
    bool db_connected;         /* its MySQL connection is open */
    char last_error[512];      /* the last failure (a server, a nack, an unroutable row); "" none */
} outbox_relay_stats;

/*
 * Starts the relay thread; the first lease attempt and round run at once. cfg is borrowed and
 * must outlive the relay (amqp_urls, amqp_tls, amqp_password, heartbeat_ms, outbox.*, whose
 * defaults and bounds are config_load's: a config made by hand sets batch, poll_interval_ms,
 * lease_ms and stuck_after_ms or the start is refused; retention_ms 0 means "delete at the
 * confirm"). dsn is copied (its TLS paths stay borrowed from
 * the config, as db_health's do); owner (this instance's lease id, at most
 * OUTBOX_RELAY_OWNER_MAX bytes, not empty) is copied. A server that is down is no error: the
 * thread keeps trying. Returns 0 with the owned relay in *out, or -1 with a reason in err and *out
 * NULL.
 */
int outbox_relay_start(const config *cfg, const db_dsn *dsn, const char *owner, outbox_relay **out,
                       char *err, size_t err_len);

/* Rows were committed: the relay runs a round now instead of at its next poll. Cheap (one write
 * to an eventfd), from any thread, never blocks; NULL is a no-op. */
void outbox_relay_notify(outbox_relay *r);

/* Copies the relay's state into *out. Any thread. */
void outbox_relay_read(outbox_relay *r, outbox_relay_stats *out);

/*
 * For /readyz: true, with the reason in reason (unless NULL), when the oldest pending row is older
 * than outbox.stuck_after ("outbox relay stuck: the oldest pending row is 75 s old (last error:
 * ...)"), or when the relay thread has not finished a pass of its loop for that long (it hangs
 * inside a call: "outbox relay stuck: its thread has not finished a round for 61 s (...)").
 * Any thread; never blocks on the network.
 */
bool outbox_relay_stuck(outbox_relay *r, char *reason, size_t reason_len);

/* For metrics_set_outbox_probe (ops/metrics.h): ctx is the relay. */
void outbox_relay_metrics_probe(void *ctx, metrics_outbox_sample *out);

/*
 * Stops the relay: the round in progress finishes (its confirms awaited for at most about 4 s
 * more, its rows marked), the lease is released, both connections close, the thread is joined
 * and r is freed. Bounded to about 5 s even while a server is frozen (the sockets are shut down
 * then). NULL is a no-op. On the owner's thread.
 */
void outbox_relay_stop(outbox_relay *r);

#endif
