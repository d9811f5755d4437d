/*
 * test_db_nodes — mysql.urls on one machine: the "nodes" are addresses of the test servers, so
 * that the rules of node choice are pinned without a cluster (the cluster suites test
 * failovers with real Galera and Group Replication nodes):
 *   - a node that refuses connections is passed over, and the node in use is named in the log,
 *     in idemq_mysql_node, in /readyz and by `idemq check`;
 *   - a node that answers but is read-only (the TLS MariaDB with read_only set) is passed over;
 *   - a node that freezes under load (a freeze_proxy in front of MariaDB) is left for the next
 *     one, and every message is applied exactly once: both addresses reach one database, so the
 *     dedup rows and the business rows can be counted (the frozen node's open transactions are
 *     killed, as a real cluster would never have seen them).
 * The failover pause of the frozen node is logged with cr_log_info (run with --verbose).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <arpa/inet.h>
#include <mysql.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "db/connect.h"
#include "db/dsn.h"
#include "freeze_proxy.h"
#include "harness.h"

static harness_fixture F;
static freeze_proxy *proxy;
static MYSQL *tls_server; /* root of the read-only test: read_only is undone in teardown */

static void teardown(void)
{
    if (tls_server) {
        mysql_query(tls_server, "SET GLOBAL read_only = 0");
        mysql_close(tls_server);
        tls_server = NULL;
    }
    harness_fixture_fini(&F);
    freeze_proxy_free(proxy);
    proxy = NULL;
}

TestSuite(db_nodes, .fini = teardown, .timeout = 180);

/* A loopback port nothing listens on: bound, then closed (the kernel does not hand it out again
 * at once). */
static unsigned closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The test server's dsn (IDEMQ_TEST_MYSQL_URL, TCP). */
static db_dsn test_server(const char *variable)
{
    const char *url = getenv(variable);
    char err[256];
    db_dsn dsn;
    cr_assert(url && *url, "%s is not set (source .state/env)", variable);
    cr_assert(db_dsn_parse(url, &dsn, err, sizeof err) == 0, "%s", err);
    cr_assert(!dsn.socket[0], "%s must be TCP", variable);
    return dsn;
}

/* Points the harness's config at the nodes (host:port, borrowed), in order, with the test's
 * database and the test server's account; more (borrowed) is YAML for the mysql mapping. */
static void use_nodes(harness *h, const char *const *nodes, size_t n, const char *more)
{
    db_dsn dsn = test_server("IDEMQ_TEST_MYSQL_URL");
    char line[2048];
    int used = snprintf(line, sizeof line, "mysql: {workers: 2, %s urls: [", more);
    for (size_t i = 0; i < n; i++)
        used += snprintf(line + used, sizeof line - (size_t)used, "%s\"mysql://%s:%s@%s/%s\"",
                         i ? ", " : "", dsn.user, dsn.password, nodes[i], h->database);
    snprintf(line + used, sizeof line - (size_t)used, "]}");
    harness_config_replace_line(h, "mysql: ", line);
}

static void start(harness_fixture *f)
{
    harness_fixture_start(f, "started consuming", 30000);
}

/* Publishes count payments for orders prefix0.. (the orders exist, PAYING) and waits until each
 * has its dedup row. */
static void pay_and_wait(harness *h, const char *prefix, int count, long long total_rows)
{
    harness_insert_orders(h, prefix, count, "PAYING");
    harness_publish_payments(h, prefix, count);
    cr_assert(harness_wait_scalar(h, total_rows, 60000, "SELECT COUNT(*) FROM msg_dedup"),
              "expected %lld dedup rows, have %lld", total_rows,
              harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup"));
}

Test(db_nodes, a_refused_node_is_passed_over_and_the_node_in_use_is_named_everywhere)
{
    harness_fixture_init(&F, "db_nodes_refused", NULL);
    db_dsn server = test_server("IDEMQ_TEST_MYSQL_URL");
    char dead[64], live[300];
    snprintf(dead, sizeof dead, "127.0.0.1:%u", closed_port());
    snprintf(live, sizeof live, "%s:%u", server.host, server.port);
    const char *nodes[] = {dead, live};
    use_nodes(&F.h, nodes, 2, "");

    char *out = NULL;
    harness_run_cli_command(&F.h, "check", &out);
    char expect[400];
    snprintf(expect, sizeof expect, "mysql   node %s: not usable now", dead);
    cr_assert(strstr(out, expect), "idemq check does not say the first node is down:\n%s", out);
    snprintf(expect, sizeof expect, "mysql   node %s: writable", live);
    cr_assert(strstr(out, expect), "idemq check does not say the second node works:\n%s", out);
    snprintf(expect, sizeof expect, "mysql   using node %s", live);
    cr_assert(strstr(out, expect), "idemq check does not name the node it uses:\n%s", out);
    free(out);

    /* A connection that found its node after a refusal reports no error: callers also read
     * the buffer (the retention job took a filled one for a failed sweep). */
    char connect_err[1024] = "";
    db_dsn two = server;
    snprintf(two.host, sizeof two.host, "127.0.0.1");
    sscanf(dead, "127.0.0.1:%u", &two.port);
    two.other_nodes[0] = (db_node){.port = server.port};
    snprintf(two.other_nodes[0].host, sizeof two.other_nodes[0].host, "%s", server.host);
    two.other_node_count = 1;
    snprintf(two.database, sizeof two.database, "%.64s", F.h.database);
    MYSQL *direct = db_connect(&two, NULL, connect_err, sizeof connect_err);
    cr_assert(direct, "%s", connect_err);
    cr_assert_str_eq(connect_err, "", "a successful connect wrote '%s'", connect_err);
    mysql_close(direct);

    start(&F);
    pay_and_wait(&F.h, "r", 20, 20);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 20);
    snprintf(expect, sizeof expect, "MySQL node in use: %s (node 2 of 2)", live);
    cr_assert(harness_log_count(&F.h, expect) >= 1, "the log does not name the node in use");

    int port = harness_http_port(&F.h, 10000);
    char *body = NULL;
    cr_assert_eq(harness_http_get(port, "/readyz", &body), 200, "%s", body ? body : "");
    snprintf(expect, sizeof expect, "ready: MySQL node %s\n", live);
    cr_assert_str_eq(body, expect);
    free(body);
    cr_assert_eq(harness_http_get(port, "/metrics", &body), 200);
    snprintf(expect, sizeof expect, "idemq_mysql_node{node=\"%s\"}", live);
    cr_assert_eq(harness_metric_value(body, expect), 1, "no %s 1 in /metrics", expect);
    cr_assert_eq(harness_metric_value(body, "idemq_mysql_failovers_total"), 0);
    free(body);
}

/* The TLS MariaDB (IDEMQ_TEST_MYSQL_TLS_URL) with the test's database, as the idemq account. */
static MYSQL *open_tls_server(harness *h)
{
    db_dsn dsn = test_server("IDEMQ_TEST_MYSQL_TLS_URL");
    char err[512];
    dsn.tls.mode = DB_TLS_REQUIRED;
    MYSQL *db = db_connect(&dsn, NULL, err, sizeof err);
    cr_assert(db, "%s", err);
    char sql[256];
    snprintf(sql, sizeof sql, "CREATE DATABASE IF NOT EXISTS `%s`", h->database);
    cr_assert(mysql_query(db, sql) == 0, "%s", mysql_error(db));
    return db;
}

Test(db_nodes, a_read_only_node_is_passed_over)
{
    if (getenv("IDEMQ_TEST_DB") && strcmp(getenv("IDEMQ_TEST_DB"), "mysql") == 0)
        cr_skip_test("the read-only node is the TLS MariaDB");
    harness_fixture_init(&F, "db_nodes_read_only", NULL);
    tls_server = open_tls_server(&F.h);
    cr_assert(mysql_query(tls_server, "SET GLOBAL read_only = 1") == 0, "%s",
              mysql_error(tls_server));
    db_dsn server = test_server("IDEMQ_TEST_MYSQL_URL");
    db_dsn tls = test_server("IDEMQ_TEST_MYSQL_TLS_URL");
    char read_only[300], live[300];
    snprintf(read_only, sizeof read_only, "%s:%u", tls.host, tls.port);
    snprintf(live, sizeof live, "%s:%u", server.host, server.port);
    const char *nodes[] = {read_only, live};
    use_nodes(&F.h, nodes, 2, "");

    char *out = NULL;
    harness_run_cli_command(&F.h, "check", &out);
    char expect[400];
    snprintf(expect, sizeof expect, "mysql   node %s: not usable now: the server is read-only",
             read_only);
    cr_assert(strstr(out, expect), "idemq check does not say the first node is read-only:\n%s",
              out);
    free(out);

    start(&F);
    pay_and_wait(&F.h, "ro", 10, 10);
    snprintf(expect, sizeof expect, "MySQL node in use: %s (node 2 of 2)", live);
    cr_assert(harness_log_count(&F.h, expect) >= 1, "the read-only node was not passed over");
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM information_schema.tables WHERE "
             "table_schema = '%s' AND table_name = 'msg_dedup'",
             F.h.database);
    cr_assert(mysql_query(tls_server, sql) == 0, "%s", mysql_error(tls_server));
    MYSQL_RES *res = mysql_store_result(tls_server);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    cr_assert(row && strcmp(row[0], "0") == 0, "something wrote to the read-only node");
    mysql_free_result(res);
}

/* Kills every session on the test's database but the harness's own. */
static void kill_sessions_but_mine(harness *h)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT id FROM information_schema.processlist WHERE db = '%s' AND id <> "
             "CONNECTION_ID()",
             h->database);
    cr_assert(mysql_query(h->db, sql) == 0, "%s", mysql_error(h->db));
    MYSQL_RES *res = mysql_store_result(h->db);
    cr_assert(res);
    unsigned long long ids[64];
    size_t n = 0;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res)) && n < 64)
        ids[n++] = strtoull(row[0], NULL, 10);
    mysql_free_result(res);
    for (size_t i = 0; i < n; i++) {
        snprintf(sql, sizeof sql, "KILL %llu", ids[i]);
        mysql_query(h->db, sql); /* one that ended meanwhile is no error here */
    }
}

/* A node that stops answering (a frozen host: its sockets stay open) under load: the workers'
 * statements time out, the probe finds the next node, and nothing is lost or applied twice. */
Test(db_nodes, a_frozen_node_under_load_is_left_for_the_next_and_each_message_applies_once,
     .timeout = 240)
{
    harness_fixture_init(&F, "db_nodes_frozen", NULL);
    db_dsn server = test_server("IDEMQ_TEST_MYSQL_URL");
    char err[256], frozen[64], live[300];
    cr_assert(freeze_proxy_start(server.host, server.port, &proxy, err, sizeof err) == 0, "%s",
              err);
    snprintf(frozen, sizeof frozen, "127.0.0.1:%u", freeze_proxy_port(proxy));
    snprintf(live, sizeof live, "%s:%u", server.host, server.port);
    const char *nodes[] = {frozen, live};
    /* The statements in flight on the frozen node end at the read timeout: the pause. */
    use_nodes(&F.h, nodes, 2, "read_timeout: 5s,");
    start(&F);

    enum { ORDERS = 1000, DUPLICATES = 200 };
    harness_insert_orders(&F.h, "f", ORDERS, "PAYING");
    harness_publish_payments(&F.h, "f", ORDERS);
    harness_wait_scalar_at_least(&F.h, 100, 60000, "SELECT COUNT(*) FROM msg_dedup");
    freeze_proxy_freeze(proxy);
    int64_t frozen_at = harness_now_ms();
    /* Both "nodes" are one server, so the frozen node's open transactions would hold their row
     * locks against the next node until the server's wait_timeout. On a real cluster they are
     * local to the frozen node (Galera and Group Replication certify at COMMIT): end them. */
    kill_sessions_but_mine(&F.h);
    /* Nothing sent through the proxy reaches the server any more: the next row is the next
     * node's. */
    long long before = harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup");
    harness_publish_payments(&F.h, "f", DUPLICATES); /* duplicates of the first 200 */
    char expect[800];
    snprintf(expect, sizeof expect, "MySQL node in use is now %s (node 2 of 2; was %s)", live,
             frozen);
    cr_assert(harness_wait_log(&F.h, expect, 1, 90000), "idemq did not move to the next node");
    int64_t moved_at = harness_now_ms();
    cr_assert(harness_wait_scalar_at_least(&F.h, before + 1, 90000,
                                           "SELECT COUNT(*) FROM msg_dedup") > before);
    cr_log_info("frozen node: %lld ms from the freeze to the move to the next node, %lld ms to "
                "its first commit there (statements on the frozen node wait for the read "
                "timeout)",
                (long long)(moved_at - frozen_at), (long long)(harness_now_ms() - frozen_at));

    cr_assert(harness_wait_scalar(&F.h, ORDERS, 120000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_queue_settled(&F.h, F.h.queue, 60000), "the work queue did not settle");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), ORDERS);
    cr_assert_eq(harness_queue_depth_of(&F.h, ".dlq"), 0, "a message was dead-lettered");
    harness_stop_idemq(&F.daemon);
    /* A COMMIT that landed just before the freeze, its answer held by the proxy, is unknown to
     * idemq: its redelivery is then a duplicate. Every delivery is settled once either way. */
    long processed = harness_summary_total(F.h.log_path, "processed");
    long deduped = harness_summary_total(F.h.log_path, "deduped");
    cr_assert_eq(processed + deduped, ORDERS + DUPLICATES, "processed %ld, deduped %ld", processed,
                 deduped);
    cr_assert(processed <= ORDERS, "processed %ld > %d orders", processed, ORDERS);
}
