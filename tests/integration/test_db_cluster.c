/*
 * test_db_cluster — idemq's guarantee through a database failover, on real clusters that
 * scripts/services starts on loopback (start-galera, start-gr): every test runs 5,000 payment
 * events plus 1,000 duplicates and breaks the cluster while they flow, then counts on a node
 * that survived: one dedup row and one PAID order per event, no state_noop (a second
 * application would find its order already PAID), nothing dead-lettered, and every delivery
 * settled once (processed + deduped = 6,000).
 *   galera/            three MariaDB 10.11 nodes with Galera (IDEMQ_TEST_GALERA_URLS)
 *     the node idemq works on killed (kill -9), with mysql.urls;
 *     two idemq instances on different nodes of one queue, every message updating one of four
 *       hot rows (certification conflicts at COMMIT), a node killed: conflicts counted;
 *     the node idemq works on frozen (SIGSTOP): the other two go on as the primary component,
 *       idemq moves to them, and the frozen node, thawed, holds no write of its own;
 *     two instances on two nodes with the rotating dedup layout, a rotation forced while the
 *       workload flows (instead of a break), then the copies: one rotation, each event once;
 *   group_replication/ three MySQL 9.7 nodes, single primary, MySQL Router in front
 *     (IDEMQ_TEST_GR_URLS, IDEMQ_TEST_GR_ROUTER_URL): the primary killed, idemq connected
 *       through the Router, and separately through mysql.urls; a forced rotation instead (Router).
 * Each test starts its cluster if it is not running (scripts/services leaves a running one
 * alone) and restores it after (a killed node started again, a frozen one thawed), so that the
 * tests share one start; scripts/test stops both clusters after the suite. Release build only:
 * the time is the clusters'. Pauses and conflict counts are logged with cr_log_info (--verbose).
 */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <jansson.h>
#include <mysql.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "db/dsn.h"
#include "harness.h"
#include "store/rotation.h"

#define EVENTS 5000
#define DUPLICATES 1000
#define MAX_NODES 3

static harness_fixture F;
static pid_t second_daemon;
static char restore_command[256]; /* run by teardown: the node a test broke, made whole */

static void teardown(void)
{
    if (second_daemon > 0)
        harness_kill_idemq(&second_daemon);
    harness_fixture_fini(&F);
    if (restore_command[0]) {
        harness_services_ok(restore_command);
        restore_command[0] = '\0';
    }
}

TestSuite(galera, .fini = teardown, .timeout = 300);
TestSuite(group_replication, .fini = teardown, .timeout = 300);

/* ------------------------------------------------------------------------------ the cluster */

typedef struct cluster {
    char urls[MAX_NODES][512]; /* the nodes' URLs from .state/env (database idemq) */
    size_t count;
} cluster;

/* Starts the cluster (scripts/services start-galera or start-gr: one already running is left
 * alone, so the tests of a pass share one start; scripts/test stops it after the pass). */
static void require_cluster(const char *kind)
{
    if (geteuid() != 0)
        cr_skip_test("the %s cluster needs root (chroot, mounts, mysqld --user)", kind);
    char command[32];
    snprintf(command, sizeof command, "start-%s", kind);
    harness_services_ok(command);
}

static cluster cluster_from(const char *variable)
{
    cluster c = {.count = 0};
    const char *list = getenv(variable);
    cr_assert(list && *list, "%s is not set (source .state/env)", variable);
    for (const char *p = list; *p && c.count < MAX_NODES;) {
        size_t len = strcspn(p, ",");
        snprintf(c.urls[c.count++], sizeof c.urls[0], "%.*s", (int)len, p);
        p += len + (p[len] == ',');
    }
    cr_assert_eq(c.count, MAX_NODES, "%s names %zu nodes", variable, c.count);
    return c;
}

/* url (borrowed, database idemq) with the test's database instead. */
static void with_database(const char *url, const char *database, char *out, size_t len)
{
    const char *path = strrchr(url, '/');
    cr_assert(path && path > url + strlen("mysql://"));
    snprintf(out, len, "%.*s/%s", (int)(path - url), url, database);
}

/* The harness creates the test's database, its tables and its own connection on url (a node
 * that the test keeps running, or the Router): set before harness_fixture_init. */
static void harness_server(const char *url)
{
    setenv("IDEMQ_TEST_MYSQL_URL", url, 1);
}

/* Replaces the config's mysql line: the nodes (indexes into c, in that order) and more YAML. */
static void use_nodes(harness *h, const cluster *c, const int *order, size_t n, const char *more)
{
    char line[4096], url[600];
    int used =
        snprintf(line, sizeof line, "mysql: {workers: 4, read_timeout: 5s, %s urls: [", more);
    for (size_t i = 0; i < n; i++) {
        with_database(c->urls[order[i]], h->database, url, sizeof url);
        used += snprintf(line + used, sizeof line - (size_t)used, "%s\"%s\"", i ? ", " : "", url);
    }
    snprintf(line + used, sizeof line - (size_t)used, "]}");
    harness_config_replace_line(h, "mysql: ", line);
}

/* A connection to the test's database on node url (borrowed), for counting there. */
static MYSQL *open_node(const char *url, const char *database)
{
    db_dsn dsn;
    char err[256];
    cr_assert(db_dsn_parse(url, &dsn, err, sizeof err) == 0, "%s", err);
    MYSQL *db = mysql_init(NULL);
    unsigned timeout = 5;
    mysql_options(db, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(db, MYSQL_OPT_READ_TIMEOUT, &timeout);
    cr_assert(mysql_real_connect(db, dsn.host, dsn.user, dsn.password, database, dsn.port, NULL, 0),
              "cannot connect to %s:%u: %s", dsn.host, dsn.port, mysql_error(db));
    return db;
}

/* The first column of the first row of sql on db; -1 when the query fails. */
static long long node_scalar(MYSQL *db, const char *sql)
{
    if (mysql_query(db, sql) != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    long long v = row && row[0] ? strtoll(row[0], NULL, 10) : -1;
    if (res)
        mysql_free_result(res);
    return v;
}

/* Polls sql on db every 20 ms until it is at least min; returns the last value. */
static long long wait_node_scalar(MYSQL *db, const char *sql, long long min, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    long long v;
    while ((v = node_scalar(db, sql)) < min && harness_now_ms() < deadline) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    return v;
}

/* ----------------------------------------------------------------------------- the workload */

static int strcmp_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* 5,000 orders PAYING; their payments, then 1,000 duplicates of the first ones. */
static void publish_workload(harness *h)
{
    harness_insert_orders(h, "c", EVENTS, "PAYING");
    harness_publish_payments(h, "c", EVENTS);
}

static void publish_duplicates(harness *h)
{
    harness_publish_payments(h, "c", DUPLICATES);
}

/* Waits until every event has its dedup row on node db (borrowed) and every delivery of the work
 * queue was settled (counted in the summary): then idemq may be stopped. */
static void wait_all_settled(harness *h, MYSQL *db)
{
    cr_assert_eq(wait_node_scalar(db, "SELECT COUNT(*) FROM msg_dedup", EVENTS, 180000), EVENTS,
                 "dedup rows on the surviving node");
    cr_assert(harness_wait_queue_settled(h, h->queue, 120000), "the work queue did not settle");
}

/* The string header name of m into buf ("" when absent). */
static const char *header_text(const amqp_message_t *m, const char *name, char *buf, size_t len)
{
    buf[0] = '\0';
    if (!(m->properties._flags & AMQP_BASIC_HEADERS_FLAG))
        return buf;
    for (int i = 0; i < m->properties.headers.num_entries; i++) {
        const amqp_table_entry_t *e = &m->properties.headers.entries[i];
        if (e->key.len == strlen(name) && memcmp(e->key.bytes, name, e->key.len) == 0 &&
            (e->value.kind == AMQP_FIELD_KIND_UTF8 || e->value.kind == AMQP_FIELD_KIND_BYTES))
            snprintf(buf, len, "%.*s", (int)e->value.value.bytes.len,
                     (const char *)e->value.value.bytes.bytes);
    }
    return buf;
}

/* Logs what was dead-lettered (its class, error and body; up to five): a dead letter here is a
 * failure a full run shows once, and the DLQ is deleted with the test's vhost. */
static void log_dead_letters(harness *h, const char *const *log_paths, size_t n)
{
    char dlq[300], error_class[64], error[512];
    snprintf(dlq, sizeof dlq, "%s.dlq", h->queue);
    amqp_message_t m;
    for (int i = 0; i < 5 && harness_get(h, dlq, &m); i++) {
        cr_log_error("dead letter: class %s, error \"%s\", body %.*s",
                     header_text(&m, "idemq-error-class", error_class, sizeof error_class),
                     header_text(&m, "idemq-error", error, sizeof error), (int)m.body.len,
                     (const char *)m.body.bytes);
        /* Its story in the instances' logs: the lines that name its biz_key. */
        const char *key = memmem(m.body.bytes, m.body.len, "order_id:", 9);
        const char *end = key ? memchr(key, '"', m.body.len - (size_t)(key - (char *)m.body.bytes))
                              : NULL;
        char needle[96];
        snprintf(needle, sizeof needle, "%.*s", end ? (int)(end - key) : 0, key ? key : "");
        for (size_t l = 0; needle[0] && l < n; l++) {
            FILE *f = fopen(log_paths[l], "r");
            char *line = NULL;
            size_t cap = 0;
            while (f && getline(&line, &cap, f) >= 0)
                if (strstr(line, needle))
                    cr_log_error("  %s: %s", l ? "second" : "first", line);
            free(line);
            if (f)
                fclose(f);
        }
        amqp_destroy_message(&m);
    }
}

/* Every event applied once, on node db (borrowed): the counts of the header, the dedup rows
 * counted by dedup_rows_sql. log_paths: the logs of the idemq instances that ran, stopped (their
 * summaries add up). With all_processed, every event was also processed exactly once (nothing
 * broke a commit's answer, which would make a committed event's redelivery a duplicate). */
static void assert_events_applied_once(harness *h, MYSQL *db, const char *dedup_rows_sql,
                                       bool all_processed, const char *const *log_paths, size_t n)
{
    cr_assert_eq(node_scalar(db, dedup_rows_sql), EVENTS, "one dedup row per event");
    cr_assert_eq(node_scalar(db, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), EVENTS);
    long dead_letters = harness_queue_depth_of(h, ".dlq");
    if (dead_letters != 0)
        log_dead_letters(h, log_paths, n);
    cr_assert_eq(dead_letters, 0, "%ld messages were dead-lettered", dead_letters);
    long processed = 0, deduped = 0, state_noop = 0;
    for (size_t i = 0; i < n; i++) {
        processed += harness_summary_total(log_paths[i], "processed");
        deduped += harness_summary_total(log_paths[i], "deduped");
        state_noop += harness_summary_total(log_paths[i], "state_noop");
    }
    cr_assert_eq(state_noop, 0, "a message was applied to an order already PAID");
    if (all_processed)
        cr_assert_eq(processed, EVENTS);
    cr_assert_eq(processed + deduped, EVENTS + DUPLICATES, "processed %ld + deduped %ld", processed,
                 deduped);
}

static void assert_each_event_once(harness *h, MYSQL *db, const char *const *log_paths, size_t n)
{
    assert_events_applied_once(h, db, "SELECT COUNT(*) FROM msg_dedup", false, log_paths, n);
}

/* The database's clock (the nodes share the machine's) when the cluster was broken, and the ms
 * from then until the next row arrived on the surviving node that counts. */
static char broken_at[32];
static long long arrival_pause_ms;

/* Milliseconds from since_ms until count_sql on survivor passes its value at the call: when the
 * next row arrives there. */
static long long wait_next_row(MYSQL *survivor, const char *count_sql, int64_t since_ms)
{
    long long before = node_scalar(survivor, count_sql);
    if (before >= EVENTS)
        return -1;
    wait_node_scalar(survivor, count_sql, before + 1, 120000);
    return harness_now_ms() - since_ms;
}

static void note_break_time(MYSQL *survivor)
{
    cr_assert(mysql_query(survivor, "SELECT NOW(3)") == 0, "%s", mysql_error(survivor));
    MYSQL_RES *res = mysql_store_result(survivor);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    cr_assert(row && row[0]);
    snprintf(broken_at, sizeof broken_at, "%s", row[0]);
    mysql_free_result(res);
}

/* The pause, once everything settled: the later of two times after the break, each of which
 * can understate it alone. The next row's arrival on the surviving node: a Group Replication
 * secondary applies asynchronously, so rows committed before the break still arrive after it.
 * The statement time of the first row written after the break (column, the same on every
 * node): on Galera a statement that starts at once can wait at its COMMIT until the cluster
 * has settled its membership. */
static long long measured_pause(MYSQL *survivor, const char *table, const char *column)
{
    char sql[400];
    snprintf(sql, sizeof sql,
             "SELECT TIMESTAMPDIFF(MICROSECOND, '%s', MIN(%s)) DIV 1000 FROM %s WHERE %s > '%s'",
             broken_at, column, table, column, broken_at);
    long long written = node_scalar(survivor, sql);
    return written > arrival_pause_ms ? written : arrival_pause_ms;
}

/* Publishes the workload; once 30% of it is applied (dedup rows on survivor), runs the
 * scripts/services command breaks (borrowed), notes the time and remembers restore (borrowed)
 * for the teardown, then publishes the duplicates. */
static void break_midrun(harness *h, MYSQL *survivor, const char *breaks, const char *restore)
{
    publish_workload(h);
    wait_node_scalar(survivor, "SELECT COUNT(*) FROM msg_dedup", EVENTS * 3 / 10, 120000);
    harness_services_ok(breaks);
    int64_t broken_ms = harness_now_ms();
    note_break_time(survivor);
    snprintf(restore_command, sizeof restore_command, "%s", restore);
    publish_duplicates(h);
    arrival_pause_ms = wait_next_row(survivor, "SELECT COUNT(*) FROM msg_dedup", broken_ms);
}

/* Starts a second idemq on the same queue whose config names the nodes in order (indexes into
 * c), logging to log_path (borrowed). The first instance must have read its file already. */
static void start_second(harness *h, const cluster *c, const int *order, size_t n,
                         const char *log_path)
{
    use_nodes(h, c, order, n, "");
    second_daemon = harness_spawn_logged(h, log_path);
    cr_assert(harness_wait_log_in(log_path, "started consuming", 1, 30000));
}

/* The fixture's idemq on node 1 and a second one (logging to second_log) on node 2, each with
 * node 3 as its fallback. */
static void start_two_on_two_nodes(const cluster *c, char *second_log, size_t second_log_len)
{
    const int first[] = {0, 2}, second[] = {1, 2};
    use_nodes(&F.h, c, first, 2, "");
    harness_fixture_start(&F, "started consuming", 30000);
    snprintf(second_log, second_log_len, "%s/second.log", F.h.dir);
    start_second(&F.h, c, second, 2, second_log);
}

/* --------------------------------------------------------------------------------- Galera */

Test(galera, the_node_idemq_works_on_killed_midrun_applies_each_event_once)
{
    require_cluster("galera");
    cluster c = cluster_from("IDEMQ_TEST_GALERA_URLS");
    harness_server(c.urls[2]);
    harness_fixture_init(&F, "galera_kill", NULL);
    const int order[] = {0, 1, 2};
    use_nodes(&F.h, &c, order, 3, "");
    harness_fixture_start(&F, "started consuming", 30000);
    cr_assert(harness_log_count(&F.h, "MySQL node in use: 127.0.0.1") >= 1);

    MYSQL *survivor = open_node(c.urls[2], F.h.database);
    break_midrun(&F.h, survivor, "kill-galera-node 1", "start-galera-node 1");
    cr_assert(harness_wait_log(&F.h, "MySQL node in use is now", 1, 60000),
              "idemq did not leave the killed node");
    wait_all_settled(&F.h, survivor);
    cr_log_info("galera, node killed: %lld ms from the kill to the next commit",
                measured_pause(survivor, "msg_dedup", "created_at"));
    harness_stop_idemq(&F.daemon);
    const char *logs[] = {F.h.log_path};
    assert_each_event_once(&F.h, survivor, logs, 1);
    mysql_close(survivor);
}

/* The conflicts: every message adds to one of four rows, from two nodes at once. */
static const char hot_rows_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"UPDATE orders SET status = 'PAID' WHERE order_id = :order_id AND status = "
    "'PAYING'\"\n"
    "          expect_rows: 1\n"
    "        - sql: \"UPDATE hot SET n = n + 1, total = total + :amount WHERE id = MOD(:amount, "
    "4)\"\n"
    "          expect_rows: 1\n";

/* "idemq_mysql_commit_conflicts_total" of the idemq whose log is log_path. */
static long long conflicts_of(const char *log_path)
{
    harness probe = {0};
    snprintf(probe.log_path, sizeof probe.log_path, "%s", log_path);
    int port = harness_http_port(&probe, 10000);
    char *body = NULL;
    cr_assert_eq(harness_http_get(port, "/metrics", &body), 200);
    long long n = harness_metric_value(body, "idemq_mysql_commit_conflicts_total");
    free(body);
    return n;
}

Test(galera, two_instances_on_two_nodes_with_hot_rows_and_a_node_killed_apply_each_event_once)
{
    require_cluster("galera");
    cluster c = cluster_from("IDEMQ_TEST_GALERA_URLS");
    harness_server(c.urls[2]);
    harness_options o = {.handler_yaml = hot_rows_handler, .retry_set = true, .max_retries = 10};
    harness_fixture_init(&F, "galera_hot", &o);
    harness_sql(&F.h, "CREATE TABLE hot (id INT PRIMARY KEY, n BIGINT NOT NULL, total BIGINT NOT "
                      "NULL) ENGINE=InnoDB");
    harness_sql(&F.h, "INSERT INTO hot VALUES (0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)");
    char second_log[400];
    start_two_on_two_nodes(&c, second_log, sizeof second_log);

    MYSQL *survivor = open_node(c.urls[2], F.h.database);
    /* Node 1 is the first instance's. */
    break_midrun(&F.h, survivor, "kill-galera-node 1", "start-galera-node 1");
    wait_all_settled(&F.h, survivor);
    long long conflicts = conflicts_of(F.h.log_path) + conflicts_of(second_log);
    cr_log_info("galera, two instances on hot rows, a node killed: %lld ms to the next commit, "
                "%lld commit conflicts run again",
                measured_pause(survivor, "msg_dedup", "created_at"), conflicts);
    cr_assert_gt(conflicts, 0, "two nodes writing four rows had no certification conflict");

    harness_stop_idemq(&F.daemon);
    int rc = harness_stop(second_daemon, SIGTERM, 30000);
    second_daemon = 0;
    cr_expect_eq(rc, 0);
    const char *logs[] = {F.h.log_path, second_log};
    assert_each_event_once(&F.h, survivor, logs, 2);
    cr_assert_eq(node_scalar(survivor, "SELECT SUM(n) FROM hot"), EVENTS,
                 "the hot rows count each event once");
    cr_assert_eq(node_scalar(survivor, "SELECT SUM(total) FROM hot"),
                 (long long)EVENTS * (EVENTS - 1) / 2);
    mysql_close(survivor);
}

Test(galera, the_node_idemq_works_on_frozen_midrun_is_left_and_writes_nothing_of_its_own)
{
    require_cluster("galera");
    cluster c = cluster_from("IDEMQ_TEST_GALERA_URLS");
    harness_server(c.urls[2]);
    harness_fixture_init(&F, "galera_freeze", NULL);
    const int order[] = {0, 1, 2};
    use_nodes(&F.h, &c, order, 3, "");
    harness_fixture_start(&F, "started consuming", 30000);

    MYSQL *survivor = open_node(c.urls[2], F.h.database);
    break_midrun(&F.h, survivor, "freeze-galera-node 1", "thaw-galera-node 1");
    cr_assert(harness_wait_log(&F.h, "MySQL node in use is now", 1, 60000),
              "idemq did not leave the frozen node");
    cr_assert_eq(wait_node_scalar(survivor, "SELECT COUNT(*) FROM msg_dedup", EVENTS, 120000),
                 EVENTS);
    cr_log_info("galera, node frozen: %lld ms from the freeze to the next commit",
                measured_pause(survivor, "msg_dedup", "created_at"));

    /* Thawed, the node finds itself outside the primary component, rejoins and takes the
     * others' state: whatever it held uncommitted when it froze is gone, so it agrees. */
    harness_services_ok("thaw-galera-node 1");
    restore_command[0] = '\0';
    MYSQL *thawed = NULL;
    for (int64_t deadline = harness_now_ms() + 60000; !thawed && harness_now_ms() < deadline;) {
        thawed = open_node(c.urls[0], F.h.database);
        if (node_scalar(thawed, "SELECT COUNT(*) FROM msg_dedup") != EVENTS) {
            mysql_close(thawed);
            thawed = NULL;
            struct timespec ts = {0, 200 * 1000000};
            nanosleep(&ts, NULL);
        }
    }
    cr_assert(thawed, "the thawed node does not agree with the others within 60 s");
    cr_assert_eq(node_scalar(thawed, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), EVENTS);
    mysql_close(thawed);

    wait_all_settled(&F.h, survivor);
    harness_stop_idemq(&F.daemon);
    const char *logs[] = {F.h.log_path};
    assert_each_event_once(&F.h, survivor, logs, 1);
    mysql_close(survivor);
}

/* The upstream handler of the outbox test: PAY_SUCCESS moves the order and emits one message to
 * the downstream queue, whose body carries the derived biz_key (outbox/writer.h). */
static char emit_handler[1024];

static const char *emitting_handler(const char *downstream)
{
    snprintf(emit_handler, sizeof emit_handler,
             "      type: state_machine\n"
             "      table: orders\n"
             "      key_column: order_id\n"
             "      key_field: order_id\n"
             "      state_column: status\n"
             "      event_field: event_type\n"
             "      transitions:\n"
             "        PAY_SUCCESS:\n"
             "          from: [PAYING]\n"
             "          to: PAID\n"
             "          emit: {name: paid, routing_key: \"%s\", fields: {order_id: order_id}}\n",
             downstream);
    return emit_handler;
}

/* The pid in the owner ("host:pid:random") of the current outbox lease, read on db; 0: none. */
static pid_t lease_holder(MYSQL *db)
{
    if (mysql_query(db, "SELECT owner FROM idemq_outbox_lease WHERE name = 'default' AND "
                        "expires_at > NOW(6)") != 0)
        return 0;
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    pid_t pid = 0;
    if (row && row[0]) {
        char owner[160];
        snprintf(owner, sizeof owner, "%s", row[0]);
        char *last = strrchr(owner, ':');
        if (last) {
            *last = '\0';
            char *before = strrchr(owner, ':');
            pid = before ? (pid_t)atol(before + 1) : 0;
        }
    }
    if (res)
        mysql_free_result(res);
    return pid;
}

/* Takes every message off queue; counts them and the distinct biz_keys of their JSON bodies. */
static void drain_downstream(harness *h, const char *queue, long *messages, long *distinct)
{
    size_t cap = EVENTS, n = 0;
    char **keys = malloc(cap * sizeof *keys);
    cr_assert(keys);
    amqp_message_t m;
    while (harness_get(h, queue, &m)) {
        const char *body = m.body.bytes;
        const char *at = memmem(body, m.body.len, "\"biz_key\":\"", 11);
        cr_assert(at, "a downstream message without biz_key");
        at += 11;
        const char *end = memchr(at, '"', m.body.len - (size_t)(at - body));
        cr_assert(end, "a downstream biz_key without its closing quote");
        if (n == cap) {
            keys = realloc(keys, (cap *= 2) * sizeof *keys);
            cr_assert(keys);
        }
        keys[n++] = strndup(at, (size_t)(end - at));
        amqp_destroy_message(&m);
    }
    qsort(keys, n, sizeof *keys, strcmp_ptr);
    long unique = 0;
    for (size_t i = 0; i < n; i++)
        unique += i == 0 || strcmp(keys[i], keys[i - 1]) != 0;
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    *messages = (long)n;
    *distinct = unique;
}

/* Two instances write and relay one outbox through two Galera nodes; the lease holder's node is
 * killed while rows flow. Every row is published, each derived biz_key reaches the downstream
 * queue, and only the handover's republished rows come twice (with the same biz_key, which a
 * downstream idemq deduplicates). */
Test(galera, two_relays_on_two_nodes_and_the_lease_holders_node_killed_publish_every_row)
{
    require_cluster("galera");
    cluster c = cluster_from("IDEMQ_TEST_GALERA_URLS");
    harness_server(c.urls[2]);
    char downstream[160];
    snprintf(downstream, sizeof downstream, "t.galera_outbox_down.%d", (int)getpid());
    harness_options o = {.handler_yaml = emitting_handler(downstream),
                         .top_yaml = "outbox: {relay: true, poll_interval: 50ms, lease: 1s}\n"};
    harness_fixture_init(&F, "galera_outbox", &o);
    amqp_queue_declare(F.h.amqp, 1, amqp_cstring_bytes(downstream), 0, 0, 0, 1, amqp_empty_table);
    cr_assert(amqp_get_rpc_reply(F.h.amqp).reply_type == AMQP_RESPONSE_NORMAL);
    char second_log[400];
    start_two_on_two_nodes(&c, second_log, sizeof second_log);

    MYSQL *survivor = open_node(c.urls[2], F.h.database);
    publish_workload(&F.h);
    wait_node_scalar(survivor, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1", EVENTS / 5,
                     120000);
    pid_t holder = lease_holder(survivor);
    cr_assert(holder == F.daemon || holder == second_daemon, "the lease holder %d is neither",
              (int)holder);
    const char *node = holder == F.daemon ? "1" : "2";
    char command[64];
    snprintf(command, sizeof command, "kill-galera-node %s", node);
    harness_services_ok(command);
    int64_t killed_ms = harness_now_ms();
    note_break_time(survivor);
    snprintf(restore_command, sizeof restore_command, "start-galera-node %s", node);
    publish_duplicates(&F.h);
    arrival_pause_ms =
        wait_next_row(survivor, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1", killed_ms);
    wait_all_settled(&F.h, survivor);
    cr_assert_eq(wait_node_scalar(survivor, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 1",
                                  EVENTS, 120000),
                 EVENTS, "rows still pending: %lld",
                 node_scalar(survivor, "SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"));
    cr_assert_eq(node_scalar(survivor, "SELECT COUNT(*) FROM idemq_outbox"), EVENTS,
                 "one row per applied event");
    for (int64_t deadline = harness_now_ms() + 60000;
         harness_queue_depth(&F.h, downstream) < EVENTS && harness_now_ms() < deadline;) {
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }

    harness_stop_idemq(&F.daemon);
    int rc = harness_stop(second_daemon, SIGTERM, 30000);
    second_daemon = 0;
    cr_expect_eq(rc, 0);
    const char *logs[] = {F.h.log_path, second_log};
    assert_each_event_once(&F.h, survivor, logs, 2);
    long messages, distinct;
    drain_downstream(&F.h, downstream, &messages, &distinct);
    cr_log_info("galera outbox, lease holder's node killed: %lld ms to the next published row; "
                "%ld rows downstream, %ld distinct, %ld republished by the handover",
                measured_pause(survivor, "idemq_outbox", "published_at"), messages, distinct,
                messages - distinct);
    cr_assert_eq(distinct, EVENTS, "every row's message reached the downstream queue");
    mysql_close(survivor);
    amqp_queue_delete(F.h.amqp, 1, amqp_cstring_bytes(downstream), 0, 0);
}

/* Retention deletes in chunks of dedup.batch rows, each a write set of its own: with Galera's
 * wsrep_max_ws_rows set just above the chunk, a sweep of 20,000 expired rows runs while the
 * workload flows, and no chunk is refused. */
Test(galera, retention_chunks_stay_under_the_write_set_limit_while_events_flow)
{
    require_cluster("galera");
    cluster c = cluster_from("IDEMQ_TEST_GALERA_URLS");
    harness_server(c.urls[2]);
    harness_fixture_init(&F, "galera_retention", NULL);
    enum { EXPIRED = 20000, CHUNK = 1000 };
    for (int from = 0; from < EXPIRED; from += CHUNK)
        harness_sql(&F.h,
                    "INSERT INTO msg_dedup (biz_key, handler_name, created_at) "
                    "SELECT CONCAT('old:', seq), 'pay-callback', NOW(3) - INTERVAL 2 DAY "
                    "FROM seq_%d_to_%d",
                    from, from + CHUNK - 1);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), EXPIRED);
    /* Every node refuses a write set of more rows (0, the default, is no limit). */
    for (int n = 1; n <= 3; n++) {
        char command[128];
        snprintf(command, sizeof command, "galera-sql %d -e \"SET GLOBAL wsrep_max_ws_rows = %d\"",
                 n, CHUNK + 100);
        harness_services_ok(command);
    }
    snprintf(restore_command, sizeof restore_command,
             "galera-sql 1 -e \"SET GLOBAL wsrep_max_ws_rows = 0\" && \"$IDEMQ_SERVICES\" "
             "galera-sql 2 -e \"SET GLOBAL wsrep_max_ws_rows = 0\" && \"$IDEMQ_SERVICES\" "
             "galera-sql 3 -e \"SET GLOBAL wsrep_max_ws_rows = 0\"");
    /* The workload's own batches must fit too: 16 messages a batch. */
    char line[128];
    snprintf(line, sizeof line, "dedup: {retention: 1d, interval: 1s, batch: %d}", CHUNK);
    harness_config_replace_line(&F.h, "log: ", "log: {level: info}");
    FILE *f = fopen(F.h.config_path, "a");
    cr_assert(f);
    fprintf(f, "%s\n", line);
    fclose(f);
    const int order[] = {0, 1, 2};
    use_nodes(&F.h, &c, order, 3, "batch: 16,");
    harness_fixture_start(&F, "started consuming", 30000);

    MYSQL *survivor = open_node(c.urls[2], F.h.database);
    int64_t started = harness_now_ms();
    publish_workload(&F.h);
    publish_duplicates(&F.h);
    long long left = -1;
    for (int64_t deadline = harness_now_ms() + 120000; harness_now_ms() < deadline;) {
        left = node_scalar(survivor, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE 'old:%'");
        if (left == 0)
            break;
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    long long swept_ms = harness_now_ms() - started;
    cr_assert_eq(left, 0, "expired rows left: %lld", left);
    wait_all_settled(&F.h, survivor);
    harness_stop_idemq(&F.daemon);
    cr_assert_eq(harness_log_count(&F.h, "sweep failed"), 0, "a retention chunk was refused");
    cr_assert_geq(harness_log_count(&F.h, "dedup retention: deleted"), 1);
    cr_log_info("galera retention: %d expired rows deleted in chunks of %d within %lld ms while "
                "%d events and %d duplicates flowed",
                EXPIRED, CHUNK, swept_ms, EVENTS, DUPLICATES);
    const char *logs[] = {F.h.log_path};
    /* msg_dedup now holds only the workload's rows. */
    assert_each_event_once(&F.h, survivor, logs, 1);
    mysql_close(survivor);
}

/* The rotating layout (store/rotation.h) with a period of an hour, so that the one rotation of a
 * run is the test's: its tables, as `idemq migrate` creates them, and the config. */
static void use_rotating_layout(harness *h)
{
    harness_sql(h, "%s", rotation_previous_ddl);
    harness_sql(h, "%s", rotation_state_ddl);
    harness_sql(h, "%s", rotation_state_row_sql);
    /* The rotation's line is an info line. */
    harness_config_replace_line(h, "log: ", "log: {level: info}");
    FILE *f = fopen(h->config_path, "a");
    cr_assert(f);
    fprintf(f, "dedup: {layout: rotating, retention: 1h, interval: 1s}\n");
    fclose(f);
}

/* The line a rotation logs (store/retention.c). */
static const char rotated[] = "rotated the dedup tables";

/* The message of h's rotation line into out ("" when there is none): the rename's and the
 * drop's times, for --verbose. */
static void rotation_message(harness *h, char *out, size_t len)
{
    json_t *log = harness_log_load(h);
    size_t i;
    json_t *line;
    out[0] = '\0';
    json_array_foreach(log, i, line)
    {
        const char *msg = harness_json_str(line, "msg");
        if (!out[0] && strstr(msg, rotated))
            snprintf(out, len, "%s", msg);
    }
    json_decref(log);
}

/* The dedup rows of the two tables: one per applied event, whichever side of the rotation. */
static const char applied_sql[] =
    "SELECT (SELECT COUNT(*) FROM msg_dedup) + (SELECT COUNT(*) FROM msg_dedup_previous)";

/* Every event applied once across a rotation (the dedup rows of both tables), and each
 * processed once. */
static void assert_each_event_once_across_the_rotation(harness *h, MYSQL *db,
                                                       const char *const *log_paths, size_t n)
{
    assert_events_applied_once(h, db, applied_sql, true, log_paths, n);
}

/* The rotating layout on a cluster: two instances on two nodes, a rotation forced while the
 * workload flows (its RENAME runs in total order on every node, aborting the transactions that
 * hold the tables), then the copies of the first events, whose keys are now in
 * msg_dedup_previous. Exactly one instance rotates, and each event is applied once. */
Test(galera, two_instances_on_two_nodes_across_a_rotation_apply_each_event_once)
{
    require_cluster("galera");
    cluster c = cluster_from("IDEMQ_TEST_GALERA_URLS");
    harness_server(c.urls[2]);
    harness_fixture_init(&F, "galera_rotation", NULL);
    use_rotating_layout(&F.h);
    /* 5 ms an update: the workload lasts seconds, and the rotation, at the next check within
     * dedup.interval (1 s) of being due, falls among the events. Row events replicate, so only
     * the node that runs the UPDATE runs the trigger. */
    harness_sql(&F.h, "CREATE TRIGGER slow_updates BEFORE UPDATE ON orders FOR EACH ROW "
                      "SET @idemq_test_pause = SLEEP(0.005)");
    char second_log[400];
    start_two_on_two_nodes(&c, second_log, sizeof second_log);

    MYSQL *survivor = open_node(c.urls[2], F.h.database);
    /* Node 3 applies the others' writes behind them: a plain count there lagged by up to the
     * whole workload, and the rotation was forced after every event in a clean run. A causal
     * read waits until the node has applied what the cluster committed before it. */
    cr_assert(mysql_query(survivor, "SET SESSION wsrep_sync_wait = 1") == 0, "%s",
              mysql_error(survivor));
    publish_workload(&F.h);
    wait_node_scalar(survivor, applied_sql, EVENTS / 10, 120000);
    cr_assert(mysql_query(survivor, "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) - "
                                    "INTERVAL 2 HOUR") == 0,
              "%s", mysql_error(survivor));
    int64_t deadline = harness_now_ms() + 60000;
    while (harness_log_count_in(F.h.log_path, rotated) + harness_log_count_in(second_log, rotated) <
               1 &&
           harness_now_ms() < deadline) {
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    long long in_previous = node_scalar(survivor, "SELECT COUNT(*) FROM msg_dedup_previous");
    publish_duplicates(&F.h);
    cr_assert_eq(wait_node_scalar(survivor, applied_sql, EVENTS, 180000), EVENTS);
    cr_assert(harness_wait_queue_settled(&F.h, F.h.queue, 120000), "the work queue did not settle");

    harness_stop_idemq(&F.daemon);
    int rc = harness_stop(second_daemon, SIGTERM, 30000);
    second_daemon = 0;
    cr_expect_eq(rc, 0);
    long rotations = harness_log_count_in(F.h.log_path, rotated) +
                     harness_log_count_in(second_log, rotated);
    cr_log_info("galera rotation: %lld of %d events applied at the rotation (in "
                "msg_dedup_previous), %lld after it",
                in_previous, EVENTS, node_scalar(survivor, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert_eq(rotations, 1, "%ld rotations for one period due", rotations);
    cr_assert_geq(in_previous, EVENTS / 10, "the rotation moved the applied keys");
    cr_assert_lt(in_previous, EVENTS, "the rotation came after every event, not among them");
    const char *logs[] = {F.h.log_path, second_log};
    assert_each_event_once_across_the_rotation(&F.h, survivor, logs, 2);
    mysql_close(survivor);
}

/* ----------------------------------------------------------------------- Group Replication */

/* Points the config's mysql line at the Router, router (borrowed) with the test's database. */
static void use_router(harness *h, const char *router)
{
    char line[700], url[600];
    with_database(router, h->database, url, sizeof url);
    snprintf(line, sizeof line, "mysql: {workers: 4, read_timeout: 5s, url: \"%s\"}", url);
    harness_config_replace_line(h, "mysql: ", line);
}

/* Waits until secondary (borrowed) has applied every transaction that the primary, behind the
 * harness's connection (the Router), has committed: a secondary applies asynchronously, and a
 * count read there any earlier can miss rows, or a rotation's RENAME. */
static void wait_caught_up(harness *h, MYSQL *secondary)
{
    cr_assert(mysql_query(h->db, "SELECT @@GLOBAL.gtid_executed") == 0, "%s", mysql_error(h->db));
    MYSQL_RES *res = mysql_store_result(h->db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    cr_assert(row && row[0], "the primary's gtid_executed: %s", mysql_error(h->db));
    char sql[4096];
    int len = snprintf(sql, sizeof sql, "SELECT GTID_SUBSET('%s', @@GLOBAL.gtid_executed)", row[0]);
    mysql_free_result(res);
    cr_assert(len > 0 && (size_t)len < sizeof sql, "the primary's gtid_executed is too long");
    cr_assert_eq(wait_node_scalar(secondary, sql, 1, 60000), 1,
                 "the secondary did not apply the primary's transactions within 60 s");
}

/* Kills the primary (node 1: member weights make the elections follow the Router's order) while
 * the workload runs; idemq reaches the cluster by the Router or by mysql.urls. */
static void kill_the_primary_midrun(bool through_router)
{
    require_cluster("gr");
    cluster c = cluster_from("IDEMQ_TEST_GR_URLS");
    const char *router = getenv("IDEMQ_TEST_GR_ROUTER_URL");
    cr_assert(router && *router, "IDEMQ_TEST_GR_ROUTER_URL is not set");
    /* The harness's own connection goes through the Router too: it follows the primary. */
    harness_server(router);
    harness_fixture_init(&F, through_router ? "gr_kill_router" : "gr_kill_urls", NULL);
    if (through_router) {
        use_router(&F.h, router);
    } else {
        const int order[] = {0, 1, 2};
        use_nodes(&F.h, &c, order, 3, "");
    }
    harness_fixture_start(&F, "started consuming", 30000);

    MYSQL *survivor = open_node(c.urls[2], F.h.database); /* a secondary: it reads */
    /* Back, node 1 is a secondary that the Router's first-available RW port reaches first: it
     * is made the primary again for the next test. */
    break_midrun(&F.h, survivor, "kill-gr-node 1",
                 "start-gr-node 1 && \"$IDEMQ_SERVICES\" gr-sql 1 -e "
                 "\"SELECT group_replication_set_as_primary(@@server_uuid)\"");
    if (!through_router)
        cr_assert(harness_wait_log(&F.h, "MySQL node in use is now", 1, 60000),
                  "idemq did not leave the killed primary");
    wait_all_settled(&F.h, survivor);
    cr_log_info("group replication through %s, primary killed: %lld ms from the kill to the next "
                "commit",
                through_router ? "the Router" : "mysql.urls",
                measured_pause(survivor, "msg_dedup", "created_at"));
    harness_stop_idemq(&F.daemon);
    const char *logs[] = {F.h.log_path};
    assert_each_event_once(&F.h, survivor, logs, 1);
    mysql_close(survivor);
    /* The harness drops its database through the Router at the end: the new primary. */
    harness_db_reconnect(&F.h, 30000);
}

Test(group_replication, the_primary_killed_midrun_through_the_router_applies_each_event_once)
{
    kill_the_primary_midrun(true);
}

Test(group_replication, the_primary_killed_midrun_through_mysql_urls_applies_each_event_once)
{
    kill_the_primary_midrun(false);
}

/* The rotating layout on Group Replication, idemq through the Router: a rotation forced while
 * the workload flows (its DDL runs on the primary, waiting for the transactions that hold the
 * tables, and reaches the secondaries in the group's order), then the copies of the first
 * events, whose keys are now in msg_dedup_previous. One rotation, each event applied once, and a
 * secondary that has caught up holds the same two tables. */
Test(group_replication, a_rotation_while_events_flow_through_the_router_applies_each_event_once)
{
    require_cluster("gr");
    cluster c = cluster_from("IDEMQ_TEST_GR_URLS");
    const char *router = getenv("IDEMQ_TEST_GR_ROUTER_URL");
    cr_assert(router && *router, "IDEMQ_TEST_GR_ROUTER_URL is not set");
    /* The harness's connection, through the Router, is on the primary: the secondaries are read
     * only, so the test forces the rotation and reads what the rotation moved through it. */
    harness_server(router);
    harness_fixture_init(&F, "gr_rotation", NULL);
    use_rotating_layout(&F.h);
    use_router(&F.h, router);
    harness_fixture_start(&F, "started consuming", 30000);

    MYSQL *secondary = open_node(c.urls[2], F.h.database);
    publish_workload(&F.h);
    /* Early (counted on the primary: the secondary lags), so that the rotation, at the next
     * check within dedup.interval, usually falls while the rest flows; the log says if it did. */
    harness_wait_scalar_at_least(&F.h, EVENTS / 10, 120000, applied_sql);
    harness_sql(&F.h, "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) - INTERVAL 2 HOUR");
    cr_assert(harness_wait_log(&F.h, rotated, 1, 60000), "no rotation within 60 s of being due");
    long long in_previous = harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous");
    publish_duplicates(&F.h);
    cr_assert_geq(harness_wait_scalar_at_least(&F.h, EVENTS, 180000, applied_sql), EVENTS,
                  "not every event was applied within 180 s");
    cr_assert(harness_wait_queue_settled(&F.h, F.h.queue, 120000), "the work queue did not settle");

    harness_stop_idemq(&F.daemon);
    wait_caught_up(&F.h, secondary);
    long rotations = harness_log_count(&F.h, rotated);
    char rotation[1024];
    rotation_message(&F.h, rotation, sizeof rotation);
    cr_log_info("group replication rotation: %lld of %d events applied at the rotation (in "
                "msg_dedup_previous), %lld after it; %s",
                in_previous, EVENTS, node_scalar(secondary, "SELECT COUNT(*) FROM msg_dedup"),
                rotation);
    cr_assert_eq(rotations, 1, "%ld rotations for one period due", rotations);
    cr_assert_geq(in_previous, EVENTS / 10, "the rotation moved the applied keys");
    /* Nothing is inserted into msg_dedup_previous after the rotation: the secondary's is the
     * primary's of that moment, or the RENAME did not reach it. */
    cr_assert_eq(node_scalar(secondary, "SELECT COUNT(*) FROM msg_dedup_previous"), in_previous,
                 "the secondary's msg_dedup_previous is not the one the rotation made");
    const char *logs[] = {F.h.log_path};
    assert_each_event_once_across_the_rotation(&F.h, secondary, logs, 1);
    mysql_close(secondary);
}
