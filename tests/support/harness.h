/*
 * harness — what integration tests share: real RabbitMQ and MariaDB (started by
 * scripts/services, URLs in IDEMQ_TEST_AMQP_URL / IDEMQ_TEST_MYSQL_URL), a fresh database and
 * fresh queue names per test, a config file writer, publishing with confirms, spawning the real
 * idemq binary, and waiting for observable conditions with a deadline (never a bare sleep).
 *
 * Sections, in the order of a test: the fixture; waiting; the test database; the broker through
 * the harness's own connection; the idemq process, its log and its ops endpoint; the shared
 * servers (scripts/services: stopping them, and the broker's own view of queues and connections).
 *
 * Test-only code, called from the test's own thread (Criterion runs each test in its own
 * process): failures end the test through cr_assert, unless a function says it returns them.
 */
#ifndef IDEMQ_TEST_HARNESS_H
#define IDEMQ_TEST_HARNESS_H

#include "broker/amqp_api.h"
#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct json_t;

/* -------------------------------------------------------------------------------------- fixture */

typedef struct harness {
    char name[64];          /* unique per test: queue name and database suffix */
    char queue[96];
    char database[96];
    char dir[256];          /* temp dir for config and logs */
    char config_path[320];
    char log_path[320];
    MYSQL *db;              /* connected to `database` */
    amqp_connection_state_t amqp; /* confirm-mode channel 1 */
    uint64_t publish_seq;
} harness;

typedef struct harness_options {
    unsigned workers;       /* 0 → 4 */
    unsigned prefetch;      /* 0 → 64 */
    unsigned max_retries;   /* used when retry_set */
    bool retry_set;
    const char *base;       /* e.g. "100ms"; NULL → 100ms */
    const char *jitter;     /* NULL → 50ms */
    const char *max_delay;  /* NULL → 1h */
    const char *queue_type; /* NULL → quorum */
    const char *on_illegal; /* NULL → dead_letter */
    const char *declare;    /* NULL → create */
    const char *extra_consumer_yaml; /* appended inside the consumer (indented 4 spaces) */
    const char *shutdown_timeout;    /* NULL → 25s */
    const char *handler_yaml; /* replaces the whole state_machine body under "    handler:"
                                 (lines indented 6 spaces); NULL → the orders state machine */
    const char *top_yaml;     /* appended at the top level, e.g. "dedup: {retention: 1h}\n" */
} harness_options;

/* An AMQP table entry (queue arguments, headers): key and value are borrowed. */
amqp_table_entry_t harness_field_text(const char *key, const char *value);
amqp_table_entry_t harness_field_int(const char *key, int64_t value);

/* Whether a and b (borrowed) hold the same bytes; two empty ones are equal whatever their
 * pointers. For a C string, pass amqp_cstring_bytes(text). */
bool harness_bytes_eq(amqp_bytes_t a, amqp_bytes_t b);

struct freeze_proxy;

/* Starts a freeze_proxy (tests/support/freeze_proxy.h) in front of the broker of
 * IDEMQ_TEST_AMQP_URL and writes that URL, through the proxy on 127.0.0.1, into url. The proxy
 * is returned owned in *out (freeze_proxy_free). Fails the test when either cannot be done. */
void harness_start_broker_proxy(struct freeze_proxy **out, char *url, size_t url_len);

/* Creates database + orders/msg_dedup tables, a unique queue name, a config file, and an AMQP
 * connection. Fails the test (cr_assert) when the services are not reachable. */
void harness_init(harness *h, const char *test_name, const harness_options *opts);
/* Deletes the queues/exchanges and the database, closes connections. */
void harness_fini(harness *h);

/* Rewrites the config file with other options (same queue and database). */
void harness_write_config(harness *h, const harness_options *opts);

/* A suite's per-test state: one harness and the idemq it runs. Criterion runs each test in its
 * own process, so a suite keeps one in a static and gives TestSuite a .fini that calls
 * harness_fixture_fini: a test that an assertion ends early leaves no idemq, database or queue
 * behind. */
typedef struct harness_fixture {
    harness h;
    bool ready;   /* harness_init done: harness_fixture_fini runs harness_fini */
    pid_t daemon; /* the `idemq run` of harness_fixture_start; 0: none */
} harness_fixture;

/* harness_init(&f->h, test_name, opts), then f->ready. */
void harness_fixture_init(harness_fixture *f, const char *test_name, const harness_options *opts);
/* harness_start_declared(&f->h, ready_line, timeout_ms, &f->daemon): declares the topology, then
 * starts `idemq run` into f->daemon and waits up to timeout_ms for ready_line (borrowed). */
void harness_fixture_start(harness_fixture *f, const char *ready_line, int timeout_ms);
/* Kills f->daemon if it runs (harness_kill_idemq), then harness_fini when f->ready; clears both. */
void harness_fixture_fini(harness_fixture *f);

/* -------------------------------------------------------------------------------------- waiting */

/* Milliseconds since an arbitrary epoch (monotonic). */
int64_t harness_now_ms(void);

/* Polls cond(arg) every 20 ms until true or timeout_ms passes; returns whether it became true. */
bool harness_wait_for(bool (*cond)(harness *h, void *arg), harness *h, void *arg, int timeout_ms);
/* Convenience: waits until `SELECT ...` returns expected. */
bool harness_wait_scalar(harness *h, long long expected, int timeout_ms, const char *sql);

/* Waits up to timeout_ms until `SELECT ...` (sql, borrowed) returns at least min, polling like
 * harness_wait_scalar; returns the last value read: >= min when it got there. On timeout it logs
 * (cr_log_error) the last value; the caller asserts, with its own message. */
long long harness_wait_scalar_at_least(harness *h, long long min, int timeout_ms, const char *sql);

/* ---------------------------------------------------------------------------- the test database */

/* SQL on the test database; fails the test on error. */
void harness_sql(harness *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
long long harness_scalar(harness *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Inserts `count` orders named PREFIX<i> in state `state`. */
void harness_insert_orders(harness *h, const char *prefix, int count, const char *state);

/* Rewrites the mysql.url of h's config to log in as user with password (both borrowed), the
 * server and database unchanged: for tests that run idemq under an account of their own. */
void harness_config_set_mysql_login(harness *h, const char *user, const char *password);

/* True when the harness's server is Oracle's MySQL rather than MariaDB (its VERSION() lacks
 * "MariaDB"): for the few assertions whose SQL or expectation differs between the two. */
bool harness_db_is_mysql(harness *h);

/* A second connection to h->database (autocommit on), e.g. to hold a row lock while h->db keeps
 * polling. Returned owned: the caller mysql_close()s it. Fails the test when it cannot connect. */
MYSQL *harness_db_open(harness *h);

/* Closes h->db and connects again to h->database, retrying for up to timeout_ms (the server may
 * still be starting). Fails the test when it cannot. */
void harness_db_reconnect(harness *h, int timeout_ms);

/* ----------------------------------------------------------------------------------- the broker */

/* Publishes body to the default exchange with routing key `routing_key` (NULL: h->queue) and
 * waits for the confirm. content_type may be NULL. Optional headers table. */
void harness_publish(harness *h, const char *routing_key, const char *content_type,
                     const void *body, size_t len, const amqp_table_t *headers);
/* Publishes a JSON payment event {biz_key, order_id, event_type, amount, message_id}. */
void harness_publish_event(harness *h, const char *order_id, const char *event, long amount);

/* Publishes body to `exchange` (NULL or "": the default exchange) with `routing_key` and the given
 * properties (borrowed, used as they are), mandatory, and waits for the confirm. Fails the test
 * on a nack or when the broker returns the message as unroutable. */
void harness_publish_props(harness *h, const char *exchange, const char *routing_key,
                           const amqp_basic_properties_t *props, const void *body, size_t len);

/* Publishes count bodies to the default exchange (routing_key NULL: h->queue) back to back,
 * waiting for all publisher confirms once per chunk instead of once per message: as fast as the
 * broker takes them. bodies[i]/lens[i] are borrowed. content_type may be NULL. Fails the test on
 * a nack or a missing confirm. */
void harness_publish_batch(harness *h, const char *routing_key, const char *content_type,
                           const void *const *bodies, const size_t *lens, size_t count);

/* Publishes count PAY_SUCCESS events for orders PREFIX0..PREFIX<count-1> (biz_key
 * order_id:PREFIX<i>:PAY_SUCCESS, amount i) with harness_publish_batch. prefix is borrowed. */
void harness_publish_payments(harness *h, const char *prefix, int count);

/* Ready messages in a queue (passive declare). */
long harness_queue_depth(harness *h, const char *queue);

/* Waits up to timeout_ms until queue (borrowed) holds exactly expected ready messages (-1: until
 * it does not exist). On timeout logs (cr_log_error) what it holds and returns false: the caller
 * asserts, with its own message. */
bool harness_wait_queue_depth(harness *h, const char *queue, long expected, int timeout_ms);

/* The queue named h->queue followed by suffix (borrowed: "" for the work queue, ".dlq",
 * ".retry.1", ...): its ready messages, -1 when it does not exist (harness_queue_depth); and
 * waiting for it to hold expected (harness_wait_queue_depth, same return). */
long harness_queue_depth_of(harness *h, const char *suffix);
bool harness_wait_queue_depth_of(harness *h, const char *suffix, long expected, int timeout_ms);

/* Ready messages and consumers of a queue (passive declare); false when it does not exist. */
bool harness_queue_info(harness *h, const char *queue, long *messages, long *consumers);

/* Gets one message from queue (auto-ack) into an owned amqp_message_t; false when empty. */
bool harness_get(harness *h, const char *queue, amqp_message_t *out);

/* Drops h->amqp and connects again (the broker was restarted), retrying for up to timeout_ms. */
void harness_reconnect_amqp(harness *h, int timeout_ms);

/* Waits until a quorum queue can be declared (the broker's quorum system is up after a
 * restart); fails the test after timeout_ms. */
void harness_wait_quorum_ready(harness *h, int timeout_ms);

/* Major version of the broker behind h->amqp, read from its server properties ("version":
 * "4.0.5" → 4; 0 when it does not say). Independent of idemq's own parsing, so a test can check
 * that. When IDEMQ_TEST_BROKER is set (e.g. "4"), fails the test unless the broker's major
 * version is at least that: a suite meant for 4.x must not skip its 4.x tests silently. */
int harness_broker_major(harness *h);

/* The broker's major * 100 + minor version from its server properties (403 for 4.3.6). */
int harness_broker_version(harness *h);

/* ---------------------------------------------------------------------------- the idemq process */

/* Starts the real idemq binary: `idemq run -c h->config_path`, stderr+stdout to h->log_path
 * (appending). Returns the pid. */
pid_t harness_spawn(harness *h);
/* Like harness_spawn, but stdout+stderr go to log_path (appending): for a second idemq process
 * on the same test. */
pid_t harness_spawn_logged(harness *h, const char *log_path);
/* Waits up to timeout_ms (0: just looks) for the child pid to exit and reaps it; returns its wait
 * status (WIFEXITED...), or -1 when it still runs (it is left running). */
int harness_wait_exit(pid_t pid, int timeout_ms);

/* Sends sig and waits up to timeout_ms for exit; returns the exit status (or -1 on timeout,
 * after which the process is killed). */
int harness_stop(pid_t pid, int sig, int timeout_ms);

/* Starts `idemq run` (harness_spawn) and waits up to timeout_ms until h->log_path holds one more
 * line containing ready_line (borrowed; e.g. "started consuming") than before the start. The pid
 * is stored in *pid before the wait, so a fixture that kills *pid also cleans up after a failed
 * start. Fails the test ("idemq did not start consuming") when the line does not come. */
void harness_start_idemq(harness *h, const char *ready_line, int timeout_ms, pid_t *pid);

/* harness_declare_topology(h), then harness_start_idemq(h, ready_line, timeout_ms, pid): for a
 * test that loads the work queue, or checks the DLQ, without depending on idemq's own
 * declaration. */
void harness_start_declared(harness *h, const char *ready_line, int timeout_ms, pid_t *pid);

/* Stops the idemq at *pid with SIGTERM (harness_stop: 30 s, then SIGKILL), sets *pid to 0 and
 * expects (cr_expect: the test goes on) exit status 0. */
void harness_stop_idemq(pid_t *pid);

/* For a fixture's teardown: when *pid > 0, kills it (SIGKILL, up to 5 s) and sets *pid to 0. */
void harness_kill_idemq(pid_t *pid);

/* Runs `idemq ARGS...` to completion; returns the exit code, output captured into *output
 * (malloc'd, may be NULL). */
int harness_run_cli(harness *h, char **output, const char *const *args);

/* Runs `idemq COMMAND -c h->config_path` (command borrowed, e.g. "check") with harness_run_cli;
 * returns its exit code, *output gets the output (malloc'd). */
int harness_run_cli_command(harness *h, const char *command, char **output);

/* Runs `idemq topology -c h->config_path` (declares the work queue, retry ladder and DLQ) so a
 * test can load the work queue before starting idemq. Fails the test unless it exits 0. */
void harness_declare_topology(harness *h);

/* Deletes what idemq declares for the work queue `queue` (borrowed): the queue, its retry
 * ladder, DLQ and exchanges. harness_fini does it for h->queue; a test that started a second
 * consumer (a downstream idemq) calls it for that one's queue. */
void harness_delete_topology(harness *h, const char *queue);

/* The JSON document in CLI output that also holds stderr lines (harness_run_cli merges them):
 * parsed from the first line that starts with '{'. Returns a new reference; fails the test when
 * there is none or it does not parse. output is borrowed. */
struct json_t *harness_output_json(const char *output);

/* -------------------------------------------------------------------------------------- its log */

/* Lines in the idemq log containing needle. */
long harness_log_count(harness *h, const char *needle);

/* Lines of the file at log_path containing needle (0 when the file does not exist). */
long harness_log_count_in(const char *log_path, const char *needle);

/* Lines of the file at log_path (borrowed) containing needle and, unless also is NULL, also
 * (anywhere in the same line); 0 when the file does not exist. harness_log_count and
 * harness_log_count_in are this with also = NULL. */
long harness_log_count_both(const char *log_path, const char *needle, const char *also);

/* Waits up to timeout_ms until h->log_path holds at least at_least lines containing needle
 * (borrowed). On timeout logs (cr_log_error) how many it found and returns false: the caller
 * asserts, with its own message. */
bool harness_wait_log(harness *h, const char *needle, long at_least, int timeout_ms);

/* harness_wait_log for the file at log_path (borrowed; e.g. a second idemq's, from
 * harness_spawn_logged): waits up to timeout_ms until it holds at least at_least lines containing
 * needle; on timeout logs how many it found and returns false. */
bool harness_wait_log_in(const char *log_path, const char *needle, long at_least, int timeout_ms);

/* Reads the idemq log (one JSON object per line) into a JSON array. Lines that are not JSON are
 * skipped; two objects glued together by a crash mid-write are split. Each object gets "_line"
 * (0-based index in the array) and "_ts_ms" (its "ts" as ms since the Unix epoch). */
struct json_t *harness_log_load(harness *h);

/* obj's string member key (obj and key borrowed; obj may be NULL): borrowed from obj; "" when
 * obj is no object, or has no string member key. */
const char *harness_json_str(const struct json_t *obj, const char *key);

/* Sum of counter (e.g. "processed") over every "summary" line of the log at log_path (one per
 * run of idemq); 0 when the file does not exist. */
long harness_summary_total(const char *log_path, const char *counter);

/* ----------------------------------------------------------------------------- its ops endpoint */

/* Waits up to timeout_ms for an "http listening on 127.0.0.1:PORT" line in h->log_path and
 * returns the PORT of the last one (the newest idemq). Fails the test on timeout. */
int harness_http_port(harness *h, int timeout_ms);

/* GET path from 127.0.0.1:port (the daemon closes after each answer; 5 s deadline). Returns the
 * HTTP status, or -1 when there was no answer; *body (unless body is NULL) gets the malloc'd
 * body, "" when none (NULL only when the connection failed). */
int harness_http_get(int port, const char *path, char **body);

/* A watch on an idemq's /healthz and /readyz while a test makes trouble: each
 * harness_endpoint_watch_poll asks both once (harness_http_get) and adds up what they said.
 * Caller-owned; harness_endpoint_watch_init sets it up. A test that needs more (when /readyz
 * turned 503 after a fault, whether idemq exited) wraps the poll and reads the last answer. */
typedef struct harness_endpoint_watch {
    int port;              /* the idemq's ops endpoint, 127.0.0.1 */
    int healthz_budget_ms; /* a /healthz answer slower than this counts as bad */
    long healthz_requests;
    long healthz_bad; /* not 200, no answer, or slower than healthz_budget_ms */
    int64_t healthz_worst_ms;
    long readyz_requests;
    long readyz_ready;      /* 200 */
    long readyz_other;      /* neither 200 nor 503, or no answer */
    int readyz_status;      /* of the last /readyz: 200, 503, ...; -1: no answer (or none yet) */
    char readyz_body[1024]; /* of the last /readyz; "" when none */
    int64_t readyz_at_ms;   /* harness_now_ms when the last /readyz answer came */
    char readyz_first_unready[1024], readyz_last_unready[1024]; /* the first and last 503 body */
} harness_endpoint_watch;

/* Clears *w and watches the endpoint on port, /healthz held to healthz_budget_ms. */
void harness_endpoint_watch_init(harness_endpoint_watch *w, int port, int healthz_budget_ms);

/* GET /healthz (timed), then GET /readyz, and counts both into *w; returns the /readyz status
 * (-1: no answer). */
int harness_endpoint_watch_poll(harness_endpoint_watch *w);

/* Value of the sample `sample` (e.g. "idemq_paused{reason=\"schema\"}": the name and labels as
 * /metrics prints them) in a scrape (borrowed, may be NULL); -1 when absent. */
long long harness_metric_value(const char *scrape, const char *sample);

/* ------------------------------------------------------------------------- the shared servers
 * scripts/services ($IDEMQ_SERVICES) acts on the one RabbitMQ and the one MariaDB every suite
 * uses (IDEMQ_TEST_BROKER picks the broker). Stopping MariaDB (test_outage.c,
 * test_http_daemon.c): the guard makes sure it is started again whatever happens to the test
 * process. */

/* Runs `$IDEMQ_SERVICES ARGS` through the shell (ARGS may hold several words, e.g.
 * "rabbitmqctl stop_app"), output discarded; fails the test unless it exits 0. */
void harness_services_ok(const char *args);

/* Runs `$IDEMQ_SERVICES cmd` (e.g. "stop-mariadb", "start-mariadb") to completion, its output
 * appended to h->dir/services.log; returns its exit status (128 + signal when killed). Fails the
 * test when IDEMQ_SERVICES is not set or fork fails. */
int harness_services(harness *h, const char *cmd);

/* Caller-owned; initialise with HARNESS_DB_GUARD_INIT. */
typedef struct harness_db_guard {
    bool db_stopped; /* set by the test from just before stop-mariadb until start-mariadb
                        succeeded: harness_db_guard_recover starts MariaDB again then */
    int fd;          /* write end of the guard process's pipe; -1: no guard process */
    pid_t pid;
} harness_db_guard;
#define HARNESS_DB_GUARD_INIT {.db_stopped = false, .fd = -1, .pid = 0}

/* Forks a guard process that runs `$IDEMQ_SERVICES start-mariadb` (output appended to
 * h->dir/guard.log) once the write end of its pipe closes: at harness_db_guard_disarm (after the
 * test restarted MariaDB, so a no-op), or when the test process dies for any reason (crash,
 * Criterion timeout, kill). The guard leaves the test's process group and closes the test's
 * sockets; the pipe is close-on-exec, so idemq and CLI children do not hold it. Fails the test
 * when IDEMQ_SERVICES is not set or pipe/fork fail. */
void harness_db_guard_arm(harness *h, harness_db_guard *g);

/* Closes the pipe (the guard then runs start-mariadb) and waits for the guard; no-op when no
 * guard is armed. */
void harness_db_guard_disarm(harness_db_guard *g);

/* For a fixture's teardown: when g->db_stopped, runs start-mariadb, clears the flag and
 * reconnects h->db (harness_db_reconnect, 60 s); then disarms the guard. */
void harness_db_guard_recover(harness *h, harness_db_guard *g);

/* Local port of pid's established TCP connection to the AMQP port of IDEMQ_TEST_AMQP_URL
 * (through /proc/<pid>/fd and /proc/net/tcp); 0 when it has none. */
int harness_amqp_local_port(pid_t pid);

/* What the kernel holds unread for the TCP sockets whose local port is port (IPv4, from
 * /proc/net/tcp), summed over them: with listening, the LISTEN socket's accept queue (connections
 * the owner has not accepted yet); without, the ESTABLISHED sockets' unread received bytes.
 * Returns -1 when no such socket exists. For a test that must see a peer reach a point nothing
 * else shows, e.g. a client's query, or its connect, waiting in a frozen freeze_proxy. */
long harness_tcp_unread(unsigned port, bool listening);

/* Closes, with `rabbitmqctl close_connection`, only pid's AMQP connection (found by its client
 * port in `rabbitmqctl list_connections pid name`); other tests' connections stay up. reason may
 * be NULL. Returns false when pid has no connection the broker lists; fails the test when
 * rabbitmqctl fails. */
bool harness_close_amqp_connection_of(pid_t pid, const char *reason);

/* The broker's counts for queue (borrowed): messages (ready + unacked) and unacked, from
 * `rabbitmqctl list_queues`; false when the queue is not listed. */
bool harness_broker_queue_stats(const char *queue, long *messages, long *unacked);

/* Waits up to timeout_ms until the broker lists queue (borrowed) with nothing ready and nothing
 * unacked: every delivery was settled, so the consumer has counted it (a ready count of 0 alone
 * leaves the deliveries the consumer holds, which a stop gives back uncounted). On timeout logs
 * what the queue holds and returns false: the caller asserts. */
bool harness_wait_queue_settled(harness *h, const char *queue, int timeout_ms);

/* Sum of `messages` (ready + unacked) over every queue whose name starts with prefix
 * (borrowed); *queues (unless NULL) gets how many queues matched. */
long harness_broker_messages_under(const char *prefix, int *queues);

/* -------------------------------------------------- the config file, line by line (issue 9)
 * The TLS and secrets suites point one connection of the harness's config elsewhere (another
 * server, another user, a tls: block) while everything else stays as harness_write_config made
 * it. */

/* Replaces the line of h->config_path that starts with prefix (borrowed, e.g. "mysql: ") by
 * line (borrowed, without its newline). Fails the test when no line starts with prefix. */
void harness_config_replace_line(harness *h, const char *prefix, const char *line);

#endif
