/*
 * test_failover — idemq against a 3-node RabbitMQ cluster with quorum queues:
 *   - kill -9 of the node idemq is connected to while 5,000 events flow: idemq must go on with
 *     another node within 10 s, apply every event exactly once and leave nothing in the retry
 *     ladder or the DLQ. What the dead connection held comes back as duplicates once the node is
 *     back (RabbitMQ 4.3 holds it until then, or for consumer_disconnected_timeout, 60 s);
 *   - (RabbitMQ 4.3 only: its metadata store is Khepri, a Raft cluster) two of the three nodes
 *     stopped, idemq's among them: the survivor takes connections but no declaration (a binding
 *     waits 30 s for the majority, then fails) and the quorum queues cannot commit. idemq must
 *     stay alive, answer /healthz at once, answer /readyz 503 saying why, retry at the backoff's
 *     rate (no crash loop), and resume on its own when the nodes come back, every event (before
 *     and after) applied once, nothing dead-lettered.
 *
 * The cluster is chosen by IDEMQ_TEST_BROKER: unset (or empty), the RabbitMQ 3.10 cluster
 * (`$IDEMQ_SERVICES start-cluster`, nodes in IDEMQ_TEST_CLUSTER_URLS); 4.3, the 4.3 cluster
 * (`start-cluster43`, IDEMQ_TEST_CLUSTER43_URLS; every deprecated feature refused, so whatever
 * this suite declares is durable); another value fails. Each test starts the cluster (a fresh
 * one: Criterion runs each test in its own process) and the suite's .fini stops it; the shared
 * single brokers are not involved, MariaDB is the shared one. The harness connects to the
 * cluster by pointing IDEMQ_TEST_AMQP_URL at one of its nodes — one that stays up.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "harness.h"

#define EVENTS 5000
#define NODES 3
#define RETRIES 3
#define FAILOVER_LIMIT_MS 10000

/* The minority test: events published before the two nodes stop (some still in flight when
 * they do) and after they are back. */
#define MINORITY_BEFORE 1000
#define MINORITY_AFTER 300
/* /healthz is answered by the loop thread, which never waits on the broker: stuck, it would
 * wait for a declaration's 30 s; answered, it takes a few ms (up to ~150 ms on a loaded machine).
 */
#define HEALTHZ_BUDGET_MS 500

static harness_fixture fixture;
/* The cluster under test: scripts/services' noun for it ("cluster" or "cluster43": start-NOUN,
 * kill-NOUN-node N, NOUN-ctl N ...) and whether it is RabbitMQ 4.3 (Khepri). */
static const char *cluster = "cluster";
static bool khepri;
static char node_url[NODES][256]; /* from IDEMQ_TEST_CLUSTER_URLS or IDEMQ_TEST_CLUSTER43_URLS */
static int node_port[NODES];
static bool cluster_started;

/* Runs `$IDEMQ_SERVICES ARGS` (printf-style), failing the test with the tail of its output
 * when it fails. Returns how long it took. */
static int64_t services(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int64_t services(const char *fmt, ...)
{
    const char *script = getenv("IDEMQ_SERVICES");
    cr_assert(script && *script,
              "IDEMQ_SERVICES is not set: source .state/env (scripts/test does)");
    char args[256], cmd[1024], tail[4096] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "\"%s\" %s 2>&1", script, args);
    int64_t t0 = harness_now_ms();
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen failed");
    char line[512];
    while (fgets(line, sizeof line, p)) {
        size_t have = strlen(tail), add = strlen(line);
        if (have + add >= sizeof tail) { /* keep the last lines */
            memmove(tail, tail + have / 2, have - have / 2 + 1);
            have = strlen(tail);
        }
        if (have + add < sizeof tail)
            memcpy(tail + have, line, add + 1);
    }
    int status = pclose(p);
    cr_assert(status == 0, "`services %s` failed (status %d):\n%s", args, status, tail);
    return harness_now_ms() - t0;
}

/* IDEMQ_TEST_BROKER picks the cluster: 4.3 → cluster43; unset → the 3.10 cluster. Another
 * version has no cluster in scripts/services: failing says so, where falling back to 3.10
 * would report a pass for a broker that was never tested. */
static void pick_cluster(void)
{
    const char *broker = getenv("IDEMQ_TEST_BROKER");
    if (broker && strcmp(broker, "4.3") == 0) {
        cluster = "cluster43";
        khepri = true;
    } else {
        cr_assert(!broker || !*broker,
                  "IDEMQ_TEST_BROKER=%s: scripts/services has 3-node clusters of RabbitMQ 3.10 "
                  "(IDEMQ_TEST_BROKER unset) and 4.3 (IDEMQ_TEST_BROKER=4.3) only",
                  broker);
    }
}

static void parse_cluster_urls(void)
{
    const char *var = khepri ? "IDEMQ_TEST_CLUSTER43_URLS" : "IDEMQ_TEST_CLUSTER_URLS";
    const char *list = getenv(var);
    cr_assert(list && *list, "%s is not set: source .state/env (written by scripts/services start)",
              var);
    for (int i = 0; i < NODES; i++) {
        size_t n = strcspn(list, ",");
        cr_assert(n > 0 && n < sizeof node_url[i], "%s: bad entry %d", var, i + 1);
        memcpy(node_url[i], list, n);
        node_url[i][n] = '\0';
        const char *colon = strrchr(node_url[i], ':');
        cr_assert(colon && (node_port[i] = atoi(colon + 1)) > 0, "no port in %s", node_url[i]);
        list += n;
        cr_assert(i == NODES - 1 || *list == ',', "%s lists fewer than %d nodes", var, NODES);
        if (*list)
            list++;
    }
}

static void suite_init(void)
{
    pick_cluster();
    parse_cluster_urls();
}

/* The start of each test (not the suite's .init: a test that skips must not pay for a cluster
 * it does not use). */
static void start_cluster(void)
{
    cluster_started = true; /* from here on the .fini stops it, even after a failed start */
    cr_log_info("start-%s took %lld ms", cluster, (long long)services("start-%s", cluster));
}

static void suite_fini(void)
{
    harness_fixture_fini(&fixture);
    if (cluster_started)
        cr_log_info("stop-%s took %lld ms", cluster, (long long)services("stop-%s", cluster));
}

TestSuite(failover, .init = suite_init, .fini = suite_fini);

/* Writes to path the harness's config with node first_node (1-based) first in amqp.urls, then,
 * unless only, the other nodes of the cluster in their order. */
static void write_nodes_config(harness *h, const char *path, int first_node, bool only)
{
    FILE *f = fopen(h->config_path, "r");
    cr_assert(f);
    static char text[64 * 1024];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    const char *rest = strchr(text, '\n');
    cr_assert(strncmp(text, "amqp: {", 7) == 0 && rest, "the harness's config changed shape:\n%s",
              text);
    f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "amqp: {urls: [\"%s\"", node_url[first_node - 1]);
    for (int i = 0; i < NODES && !only; i++)
        if (i != first_node - 1)
            fprintf(f, ", \"%s\"", node_url[i]);
    fprintf(f, "], prefetch: 64, heartbeat: 10s}%s", rest);
    fclose(f);
}

static void write_cluster_config(harness *h, const char *path, int first_node)
{
    write_nodes_config(h, path, first_node, false);
}

/* With node `down` (1-based) dead: check reports every node, the dead one as WARN, and passes;
 * topology and dlq, given the dead node first, go on to the next one. No password shows. */
static void one_shot_commands_skip_the_dead_node(harness *h, int down)
{
    char path[400], dead[64], *out = NULL;
    snprintf(path, sizeof path, "%s/dead-first.yaml", h->dir);
    write_cluster_config(h, path, down);
    snprintf(dead, sizeof dead, "@127.0.0.1:%d/", node_port[down - 1]);

    const char *check[] = {"check", "-c", path, NULL};
    int rc = harness_run_cli(h, &out, check);
    cr_expect_eq(rc, 0, "idemq check exited %d with one node of three down:\n%s", rc, out);
    for (int i = 0; i < NODES; i++) {
        char line[128];
        snprintf(line, sizeof line, "amqp    %s amqp://guest:***@127.0.0.1:%d/%%2f",
                 i + 1 == down ? "WARN" : "ok  ", node_port[i]);
        cr_expect(strstr(out, line), "idemq check does not report '%s':\n%s", line, out);
    }
    cr_expect(strstr(out, "(2 of 3 nodes answered)"), "%s", out);
    cr_expect_null(strstr(out, ":guest@"), "a password shows:\n%s", out);
    free(out);

    const char *topology[] = {"topology", "-c", path, NULL};
    rc = harness_run_cli(h, &out, topology);
    cr_expect_eq(rc, 0, "idemq topology exited %d with its first node down:\n%s", rc, out);
    cr_expect(strstr(out, "idemq topology: warning: node amqp://guest:***") && strstr(out, dead),
              "idemq topology does not say that the first node did not answer:\n%s", out);
    cr_expect(strstr(out, "\ndeclared\n"), "%s", out);
    free(out);

    const char *dlq[] = {"dlq", "list", "-c", path, NULL};
    rc = harness_run_cli(h, &out, dlq);
    cr_expect_eq(rc, 0, "idemq dlq list exited %d with its first node down:\n%s", rc, out);
    cr_expect(strstr(out, "0 message(s) in "), "%s", out);
    cr_expect_null(strstr(out, ":guest@"), "a password shows:\n%s", out);
    free(out);
}

/* The work queue as a quorum queue with a member on every node. idemq would declare it classic
 * (no arguments), which lives on one node only: so it is declared here and idemq only checks it
 * (declare: passive). Durable, as RabbitMQ 4.3 requires of a queue that is not exclusive. */
static void declare_replicated_work_queue(harness *h)
{
    amqp_table_entry_t entries[2] = {
        {.key = amqp_cstring_bytes("x-queue-type"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("quorum")}},
        {.key = amqp_cstring_bytes("x-quorum-initial-group-size"),
         .value = {.kind = AMQP_FIELD_KIND_I32, .value.i32 = NODES}},
    };
    amqp_table_t args = {.num_entries = 2, .entries = entries};
    amqp_queue_declare(h->amqp, 1, amqp_cstring_bytes(h->queue), 0, 1, 0, 0, args);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(h->amqp);
    cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL, "declaring %s as a quorum queue failed",
              h->queue);
}

/* The row of queue in `rabbitmqctl list_queues name FIELDS` on node (1-based), the name cut off,
 * into row; false when the queue is not listed. fields is borrowed. */
static bool queue_row(int node, const char *queue, const char *fields, char *row, size_t len)
{
    char cmd[1024], line[1024];
    snprintf(cmd, sizeof cmd,
             "\"%s\" %s-ctl %d -q list_queues --no-table-headers name %s 2>/dev/null",
             getenv("IDEMQ_SERVICES"), cluster, node, fields);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    bool found = false;
    size_t qlen = strlen(queue);
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, queue, qlen) != 0 || line[qlen] != '\t')
            continue;
        snprintf(row, len, "%s", line + qlen + 1);
        found = true;
    }
    cr_assert(pclose(p) == 0, "`services %s-ctl %d list_queues` failed", cluster, node);
    return found;
}

/* Members of queue, seen from node (1-based); -1 when the queue is not listed. */
static int queue_members(int node, const char *queue)
{
    char row[1024];
    if (!queue_row(node, queue, "members", row, sizeof row))
        return -1;
    int members = 0;
    for (const char *c = row; *c; c++)
        members += *c == '@';
    return members;
}

/* Messages of queue, ready and unacknowledged, seen from node (1-based); -1 when not listed. */
static long queue_messages(int node, const char *queue)
{
    char row[1024];
    return queue_row(node, queue, "messages", row, sizeof row) ? atol(row) : -1;
}

typedef struct queue_at {
    int node;
    const char *queue;
    long messages; /* the last count read */
} queue_at;

static bool queue_emptied(harness *h, void *arg)
{
    (void)h;
    queue_at *q = arg;
    q->messages = queue_messages(q->node, q->queue);
    return q->messages == 0;
}

/* Starts the cluster and sets up a test on it: the harness on node 1 (IDEMQ_TEST_AMQP_URL), the
 * config with every node, and every queue of the test (work queue, ladder, DLQ) replicated on
 * all three nodes, so each survives the loss of any one. */
static harness *start_replicated_test(const char *name, const harness_options *opts)
{
    start_cluster();
    setenv("IDEMQ_TEST_AMQP_URL", node_url[0], 1);
    harness_fixture_init(&fixture, name, opts);
    harness *h = &fixture.h;
    int version = harness_broker_version(h);
    cr_assert(!khepri || version == 403, "IDEMQ_TEST_BROKER=4.3 but the %s node at %s is %d.%d",
              cluster, node_url[0], version / 100, version % 100);
    write_cluster_config(h, h->config_path, 1);
    harness_wait_quorum_ready(h, 60000); /* a fresh cluster takes a moment to accept them */

    declare_replicated_work_queue(h);
    harness_declare_topology(h); /* the ladder and DLQ: quorum, on every running node */
    char name_buf[160];
    cr_assert_eq(queue_members(1, h->queue), NODES, "work queue %s is not on every node", h->queue);
    for (int level = 1; level <= RETRIES; level++) {
        snprintf(name_buf, sizeof name_buf, "%s.retry.%d", h->queue, level);
        cr_assert_eq(queue_members(1, name_buf), NODES, "retry queue %s is not on every node",
                     name_buf);
    }
    snprintf(name_buf, sizeof name_buf, "%s.dlq", h->queue);
    cr_assert_eq(queue_members(1, name_buf), NODES, "%s is not on every node", name_buf);
    return h;
}

typedef struct log_event {
    int64_t ts_ms; /* -1: not found */
    long line;     /* index in the log */
    int node;      /* 1-based node index named in the line, 0 if none */
} log_event;

/* The node (1-based) whose port follows "@127.0.0.1:" in msg; 0 when none. */
static int node_in(const char *msg)
{
    const char *at = msg ? strstr(msg, "@127.0.0.1:") : NULL;
    if (!at)
        return 0;
    int port = atoi(at + strlen("@127.0.0.1:"));
    for (int i = 0; i < NODES; i++)
        if (node_port[i] == port)
            return i + 1;
    return 0;
}

/* The first log line at or after index from whose msg starts with prefix (or, with prefix NULL,
 * whose outcome is "processed"). */
static log_event find_line(json_t *all, long from, const char *prefix)
{
    log_event e = {.ts_ms = -1, .line = -1};
    for (size_t i = from < 0 ? 0 : (size_t)from; i < json_array_size(all); i++) {
        json_t *line = json_array_get(all, i);
        const char *msg = json_string_value(json_object_get(line, "msg"));
        const char *outcome = json_string_value(json_object_get(line, "outcome"));
        bool match = prefix ? msg && strncmp(msg, prefix, strlen(prefix)) == 0
                            : outcome && strcmp(outcome, "processed") == 0;
        if (match) {
            e.ts_ms = (int64_t)json_integer_value(json_object_get(line, "_ts_ms"));
            e.line = (long)i;
            e.node = node_in(msg);
            return e;
        }
    }
    return e;
}

/* Lines at or after index from whose msg starts with prefix. */
static long count_lines(json_t *all, long from, const char *prefix)
{
    long n = 0;
    for (size_t i = from < 0 ? 0 : (size_t)from; i < json_array_size(all); i++) {
        const char *msg = json_string_value(json_object_get(json_array_get(all, i), "msg"));
        n += msg && strncmp(msg, prefix, strlen(prefix)) == 0;
    }
    return n;
}

/* The node (1-based) idemq logged it connected to first. */
static int connected_node(harness *h)
{
    json_t *all = harness_log_load(h);
    log_event connected = find_line(all, 0, "connected to RabbitMQ node ");
    json_decref(all);
    cr_assert(connected.node > 0, "idemq did not log which node it connected to (log: %s)",
              h->log_path);
    return connected.node;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool running_nodes_are(harness *h, void *arg)
{
    (void)h;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "\"%s\" %s-ctl 1 -q eval 'length(rabbit_nodes:all_running()).' 2>/dev/null",
             getenv("IDEMQ_SERVICES"), cluster);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char out[64] = "";
    if (!fgets(out, sizeof out, p))
        out[0] = '\0';
    pclose(p);
    return atoi(out) == *(const int *)arg;
}

/* Nothing left anywhere: work queue, ladder, DLQ (idemq is stopped: nothing unacked). */
static void expect_queues_empty(harness *h)
{
    char name[160];
    cr_expect_eq(harness_queue_depth(h, h->queue), 0);
    for (int level = 1; level <= RETRIES; level++) {
        snprintf(name, sizeof name, "%s.retry.%d", h->queue, level);
        cr_expect_eq(harness_queue_depth(h, name), 0, "%s is not empty", name);
    }
    snprintf(name, sizeof name, "%s.dlq", h->queue);
    cr_expect_eq(harness_queue_depth(h, name), 0, "%s is not empty", name);
}

Test(failover, kill_9_of_the_connected_node_fails_over_and_applies_each_event_once, .timeout = 420)
{
    harness_options opts = {.declare = "passive", .retry_set = true, .max_retries = RETRIES};
    /* The harness talks to node 1 until it is the one to die. */
    harness *h = start_replicated_test("failover", &opts);

    harness_insert_orders(h, "f", EVENTS, "PAYING");
    /* 3 ms per update keeps the run going for several seconds, so the kill lands mid-run. */
    harness_sql(h, "CREATE TRIGGER slow_updates BEFORE UPDATE ON orders FOR EACH ROW "
                   "SET @idemq_test_pause = SLEEP(0.003)");
    /* Confirmed: on a majority of the work queue's members. */
    harness_publish_payments(h, "f", EVENTS);

    harness_start_idemq(h, "started consuming", 60000, &fixture.daemon);
    json_t *all = harness_log_load(h);
    log_event connected = find_line(all, 0, "connected to RabbitMQ node ");
    json_decref(all);
    cr_assert(connected.node > 0, "idemq did not log which node it connected to (log: %s)",
              h->log_path);
    int victim = connected.node;
    cr_log_info("idemq connected to node %d (%s)", victim, node_url[victim - 1]);
    if (victim == 1) {
        /* The harness's own connection must outlive the kill. */
        setenv("IDEMQ_TEST_AMQP_URL", node_url[1], 1);
        harness_reconnect_amqp(h, 30000);
    }

    cr_assert(harness_wait_scalar_at_least(h, 500, 60000, "SELECT COUNT(*) FROM msg_dedup") >= 500,
              "idemq applied fewer than 500 events in 60 s (log: %s)", h->log_path);
    long applied_at_kill = (long)harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup");
    cr_assert(applied_at_kill < EVENTS,
              "all %d events were applied before the kill: the test proves nothing", EVENTS);
    int64_t killed_at = wall_ms();
    services("kill-%s-node %d", cluster, victim);

    cr_assert(harness_wait_log(h, "RabbitMQ connection lost", 1, 30000),
              "idemq did not notice that node %d died (log: %s)", victim, h->log_path);
    cr_assert(harness_wait_log(h, "reconnected to RabbitMQ node ", 1, 60000),
              "idemq did not reconnect to another node (log: %s)", h->log_path);
    cr_assert(harness_wait_scalar(h, EVENTS, 180000, "SELECT COUNT(*) FROM msg_dedup"),
              "not every event was applied after the failover (log: %s)", h->log_path);
    /* RabbitMQ 4.3 does not requeue what the dead connection had unacked at once: a consumer on
     * a node that is gone is only suspected down, and keeps its deliveries until the node is
     * back or consumer_disconnected_timeout (60 s) passes. 3.10 requeues them at once. */
    int alive = victim % NODES + 1;
    cr_log_info("%s: every event applied %lld ms after the kill", cluster,
                (long long)(wall_ms() - killed_at));

    one_shot_commands_skip_the_dead_node(h, victim);

    /* The killed node comes back and rejoins the cluster; what its connection held comes back
     * to idemq, which recognises each as a duplicate. */
    cr_log_info("start-%s-node %d took %lld ms", cluster, victim,
                (long long)services("start-%s-node %d", cluster, victim));
    int all_nodes = NODES;
    cr_expect(harness_wait_for(running_nodes_are, h, &all_nodes, 60000),
              "node %d did not rejoin the cluster", victim);
    queue_at work = {.node = alive, .queue = h->queue};
    int64_t back_at = wall_ms();
    cr_expect(harness_wait_for(queue_emptied, h, &work, 90000),
              "the work queue still holds %ld message(s) 90 s after node %d came back (log: %s)",
              work.messages, victim, h->log_path);
    cr_log_info("%s: the work queue was empty %lld ms after node %d was back", cluster,
                (long long)(wall_ms() - back_at), victim);
    harness_stop_idemq(&fixture.daemon);

    /* Continued on another node within the limit: reconnected there, and processing again. */
    all = harness_log_load(h);
    log_event lost = find_line(all, connected.line + 1, "RabbitMQ connection lost");
    log_event again = find_line(all, lost.line + 1, "reconnected to RabbitMQ node ");
    log_event resumed = find_line(all, again.line + 1, NULL);
    json_decref(all);
    cr_assert(lost.line >= 0 && again.line >= 0, "log lines missing (log: %s)", h->log_path);
    cr_log_info("%s: kill -9 of node %d at %lld; connection lost +%lld ms; reconnected to node "
                "%d +%lld ms; first event processed there +%lld ms; %ld of %d applied before the "
                "kill",
                cluster, victim, (long long)killed_at, (long long)(lost.ts_ms - killed_at),
                again.node, (long long)(again.ts_ms - killed_at),
                (long long)(resumed.ts_ms - killed_at), applied_at_kill, EVENTS);
    cr_expect(again.node > 0 && again.node != victim,
              "idemq reconnected to node %d, the one that was killed", again.node);
    cr_expect(again.ts_ms - killed_at <= FAILOVER_LIMIT_MS,
              "idemq reconnected %lld ms after the kill (limit %d ms)",
              (long long)(again.ts_ms - killed_at), FAILOVER_LIMIT_MS);
    cr_expect(resumed.line >= 0 && resumed.ts_ms - killed_at <= FAILOVER_LIMIT_MS,
              "idemq processed its first event on the new node %lld ms after the kill (limit %d "
              "ms)",
              (long long)(resumed.ts_ms - killed_at), FAILOVER_LIMIT_MS);

    /* Exactly once: one dedup row and one transition per event, each committed once; the
     * deliveries whose acks died with the node came back and were recognised as duplicates. */
    cr_expect_eq(harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup"), EVENTS);
    cr_expect_eq(harness_scalar(h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), EVENTS);
    cr_expect_eq(harness_summary_total(h->log_path, "processed"), EVENTS);
    cr_expect_eq(harness_summary_total(h->log_path, "dead_lettered"), 0);
    cr_log_info("%s: deduped redeliveries: %ld", cluster,
                harness_summary_total(h->log_path, "deduped"));
    expect_queues_empty(h);
}

/* ------------------------------------------------------------------- Khepri without a majority */

/* The node (1-based) that leads quorum queue `queue`, seen from node: its name ends in the node's
 * number (c43-2@localhost). */
/* The leader (1-based) a `list_queues name leader` row names, 0 when none is listed. */
static int leader_in(const char *row)
{
    const char *at = strchr(row, '@');
    return at && at > row ? at[-1] - '0' : 0;
}

static int queue_leader(int node, const char *queue)
{
    char row[1024];
    cr_assert(queue_row(node, queue, "leader", row, sizeof row), "%s is not listed", queue);
    int leader = leader_in(row);
    cr_assert(leader >= 1 && leader <= NODES, "no leader listed for %s: %s", queue, row);
    return leader;
}

/* What the broker holds of queue, from node (1-based), for a failure message: its row of
 * `list_queues name messages_ready messages_unacknowledged consumers`, its consumers with their
 * channels (`list_consumers`) and the channels that exist (`list_channels`): a consumer whose
 * channel is not among them belongs to a dead connection. */
static void broker_view(int node, const char *queue, char *buf, size_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "s=\"$IDEMQ_SERVICES\"; \"$s\" %s-ctl %d -q list_queues name messages_ready "
             "messages_unacknowledged consumers | grep -F '%s'; \"$s\" %s-ctl %d -q "
             "list_consumers queue_name channel_pid consumer_tag; \"$s\" %s-ctl %d -q "
             "list_channels pid name messages_unacknowledged",
             cluster, node, queue, cluster, node, cluster, node);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t used = fread(buf, 1, len - 1, p);
    buf[used] = '\0';
    pclose(p);
}

/* What the ops endpoint (the harness's watch, ep) and the process did while the majority was
 * gone. */
typedef struct minority_watch {
    harness_endpoint_watch ep;
    pid_t pid;
    bool exited;               /* idemq is gone */
    const char *needle, *also; /* the log line (with `also` in it, unless NULL) waited for */
} minority_watch;

static void watch_poll(minority_watch *w)
{
    harness_endpoint_watch_poll(&w->ep);
    int wstatus;
    if (!w->exited && waitpid(w->pid, &wstatus, WNOHANG) == w->pid)
        w->exited = true;
}

/* Polls the endpoints until the log holds a line with needle (and also), or idemq exits. */
static bool watched_log(harness *h, void *arg)
{
    minority_watch *w = arg;
    watch_poll(w);
    return w->exited || harness_log_count_both(h->log_path, w->needle, w->also) >= 1;
}

/* harness_wait_for a log line, the endpoints polled at every step; false on timeout or when
 * idemq exited. */
static bool watch_until_log(harness *h, minority_watch *w, const char *needle, const char *also,
                            int timeout_ms)
{
    w->needle = needle;
    w->also = also;
    return harness_wait_for(watched_log, h, w, timeout_ms) && !w->exited;
}

/* The most connect attempts idemq may make in window_ms after its connection was lost: the first
 * round starts 500 ms after the loss, each later one at least twice as long after the one before
 * (at most 10 s; the jitter only adds: broker/session.c, reconnect_backoff), and a round tries
 * each node once. A crash loop, or a retry without backoff, makes far more. */
static long attempts_allowed(int64_t window_ms)
{
    long rounds = 1; /* the one under way */
    int64_t at = 500, delay = 1000;
    while (at <= window_ms) {
        rounds++;
        at += delay;
        delay = delay * 2 > 10000 ? 10000 : delay * 2;
    }
    return rounds * NODES;
}

static bool ready_again(harness *h, void *arg)
{
    (void)h;
    return harness_http_get(*(const int *)arg, "/readyz", NULL) == 200;
}

/*
 * Two of the three 4.3 nodes stopped (kill -9): the node idemq is connected to, then one more. The
 * survivor alone is no majority: it accepts connections and answers lookups (a passive declare, a
 * declaration of an existing queue or exchange), but a binding — which idemq declares at every
 * connect — is a Khepri write that waits for the majority (30 s, then the broker closes the
 * connection with 541) and the quorum queues cannot commit deliveries or acks. Neither node
 * killed is the work queue's leader: killing a consumer's node and the leader (one after the
 * other, or the same node when the consumer is on the leader's) can leave, on 4.3.6, the dead
 * channel's consumer registered with its prefetch window checked out for good (see broker_view;
 * rabbitmq-server#15473 describes the same orphaned unacked messages), which no client can
 * release.
 */
typedef struct leader_wait {
    const char *queue;
    int node; /* 1-based */
} leader_wait;

/* Whether the broker lists w->node as w->queue's leader (none may be listed mid-election). */
static bool leader_is(harness *h, void *arg)
{
    (void)h;
    const leader_wait *w = arg;
    char row[1024];
    return queue_row(w->node, w->queue, "leader", row, sizeof row) && leader_in(row) == w->node;
}

/* Makes node `to` (1-based) the leader of quorum queue `queue`, led by node `from`, with Ra's
 * own transfer (what `rabbitmq-upgrade drain` uses), and waits until the broker lists it.
 * Returns `to`. The 4.3 cluster only (its nodes are c43-N@localhost). */
static int move_leadership(const char *queue, int from, int to)
{
    char call[512];
    snprintf(call, sizeof call,
             "%s-ctl %d -q eval \"ra:transfer_leadership({'%%2F_%s', 'c43-%d@localhost'}, "
             "{'%%2F_%s', 'c43-%d@localhost'}).\"",
             cluster, from, queue, from, queue, to);
    services("%s", call);
    leader_wait w = {.queue = queue, .node = to};
    cr_assert(harness_wait_for(leader_is, NULL, &w, 30000),
              "the leadership of %s did not move from node %d to node %d", queue, from, to);
    cr_log_info("moved the leadership of %s from node %d to node %d", queue, from, to);
    return to;
}

/* Whether the idemq on port `arg` says on /readyz that it is declaring its topology. */
static bool readyz_says_declaring(harness *h, void *arg)
{
    (void)h;
    char *body = NULL;
    harness_http_get(*(int *)arg, "/readyz", &body);
    bool declaring = body && strstr(body, "declaring the topology");
    free(body);
    return declaring;
}

/* A second idemq, given only `node` of a cluster without a majority: its connect is stuck
 * declaring the topology (a binding waits 30 s for a majority). Returns how long a SIGTERM then
 * takes to end it; its exit status into *status. */
static int64_t sigterm_during_a_stuck_declaration(harness *h, int node, int *status)
{
    harness second = *h;
    snprintf(second.config_path, sizeof second.config_path, "%s/one-node.yaml", h->dir);
    snprintf(second.log_path, sizeof second.log_path, "%s/one-node.log", h->dir);
    write_nodes_config(h, second.config_path, node, true);
    pid_t pid = harness_spawn(&second);
    int port = harness_http_port(&second, 10000);
    bool declaring = harness_wait_for(readyz_says_declaring, &second, &port, 20000);
    if (!declaring)
        harness_stop(pid, SIGKILL, 5000);
    cr_assert(declaring, "the second idemq never said it was declaring its topology (log: %s)",
              second.log_path);
    int64_t signalled = harness_now_ms();
    *status = harness_stop(pid, SIGTERM, 40000);
    return harness_now_ms() - signalled;
}

Test(failover, khepri_minority_idemq_stays_up_says_why_and_resumes_by_itself, .timeout = 420)
{
    if (!khepri)
        cr_skip_test("about RabbitMQ 4.3's Khepri metadata store: runs with "
                     "IDEMQ_TEST_BROKER=4.3 (3.10 keeps its metadata in Mnesia)");
    harness_options opts = {.declare = "passive", .retry_set = true, .max_retries = RETRIES};
    harness *h = start_replicated_test("minority", &opts);
    const long total = MINORITY_BEFORE + MINORITY_AFTER;
    int leader = queue_leader(1, h->queue);

    harness_insert_orders(h, "mb", MINORITY_BEFORE, "PAYING");
    harness_insert_orders(h, "ma", MINORITY_AFTER, "PAYING");
    /* 3 ms per update: events are still in flight when the majority goes. */
    harness_sql(h, "CREATE TRIGGER slow_updates BEFORE UPDATE ON orders FOR EACH ROW "
                   "SET @idemq_test_pause = SLEEP(0.003)");

    harness_start_idemq(h, "started consuming", 60000, &fixture.daemon);
    int port = harness_http_port(h, 10000);
    int connected = connected_node(h);
    /* Neither node stopped below may lead the work queue (see the comment above the test: on
     * 4.3 a stopped leader can leave the dead channel's consumer holding its prefetch window for
     * good; CI saw it once with idemq on the leader's node). idemq picks its node at random, so
     * when it picked the leader's, the leadership moves away first. */
    if (connected == leader)
        leader = move_leadership(h->queue, leader, connected % NODES + 1);
    /* Nodes are 1, 2, 3: the one that is neither a nor b is 6 - a - b. Stopped: the node idemq
     * is connected to, then the other one that does not lead; the leader survives. */
    int second = 6 - connected - leader;
    int survivor = leader;
    /* Published once the nodes are chosen, so that a leadership move does not let idemq apply
     * them all before the stop. */
    harness_publish_payments(h, "mb", MINORITY_BEFORE);
    cr_log_info("idemq connected to node %d, the work queue's leader is node %d: stopping nodes "
                "%d and %d, node %d survives",
                connected, leader, connected, second, survivor);
    setenv("IDEMQ_TEST_AMQP_URL", node_url[survivor - 1], 1); /* the harness's connection stays */
    harness_reconnect_amqp(h, 30000);

    cr_assert(harness_wait_scalar_at_least(h, 100, 60000, "SELECT COUNT(*) FROM msg_dedup") >= 100,
              "idemq applied fewer than 100 events in 60 s (log: %s)", h->log_path);
    long applied_at_stop = (long)harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup");
    long consuming_before = harness_log_count(h, "started consuming");
    int64_t stopped_at = harness_now_ms();
    services("kill-%s-node %d", cluster, connected);
    services("kill-%s-node %d", cluster, second);

    /* Without a majority: idemq loses its connection, tries the others, and the survivor's
     * declarations fail (a timeout, or the broker's 541) instead of hanging for good. All the
     * while it lives, /healthz answers at once and /readyz says 503, and why. */
    minority_watch w = {.pid = fixture.daemon};
    harness_endpoint_watch_init(&w.ep, port, HEALTHZ_BUDGET_MS);
    char survivor_in_log[64];
    snprintf(survivor_in_log, sizeof survivor_in_log, "@127.0.0.1:%d/", node_port[survivor - 1]);
    bool lost = watch_until_log(h, &w, "RabbitMQ connection lost", NULL, 30000);
    bool survivor_failed =
        lost && watch_until_log(h, &w, "cannot connect to RabbitMQ", survivor_in_log, 90000);
    int64_t minority_ms = harness_now_ms() - stopped_at;
    json_t *all = harness_log_load(h);
    long attempts = count_lines(all, 0, "cannot connect to RabbitMQ");
    long losses = count_lines(all, 0, "RabbitMQ connection lost");
    const char *survivor_error = "";
    long survivor_error_line = -1; /* the first */
    for (size_t i = 0; i < json_array_size(all); i++) {
        const char *msg = json_string_value(json_object_get(json_array_get(all, i), "msg"));
        if (msg && strncmp(msg, "cannot connect to RabbitMQ", 26) == 0 &&
            strstr(msg, survivor_in_log)) {
            survivor_error = msg;
            if (survivor_error_line < 0)
                survivor_error_line = (long)i;
        }
    }
    char survivor_line[1024];
    snprintf(survivor_line, sizeof survivor_line, "%s", survivor_error);
    json_decref(all);
    cr_log_info("minority for %lld ms: %ld failed connect attempts (at most %ld allowed); the "
                "survivor's: \"%s\"; /healthz %ld requests, worst %lld ms; /readyz %ld requests, "
                "%ld ready; first reason \"%s\", last \"%s\"",
                (long long)minority_ms, attempts, attempts_allowed(minority_ms), survivor_line,
                w.ep.healthz_requests, (long long)w.ep.healthz_worst_ms, w.ep.readyz_requests,
                w.ep.readyz_ready, w.ep.readyz_first_unready, w.ep.readyz_last_unready);
    cr_assert_not(w.exited, "idemq exited while the majority was gone (log: %s)", h->log_path);
    cr_assert(lost, "idemq did not notice that node %d went (log: %s)", connected, h->log_path);
    cr_assert(survivor_failed,
              "no failed connect attempt at the survivor, node %d, within 90 s: a declaration "
              "without a timeout? (log: %s)",
              survivor, h->log_path);
    cr_expect(strstr(survivor_line, "declaring") && strstr(survivor_line, "majority"),
              "the survivor's failure does not say which declaration failed, and why: \"%s\"",
              survivor_line);
    /* Two when idemq got to the second node in the moment before it was stopped. */
    cr_expect(losses >= 1 && losses <= 2, "%ld connection losses logged", losses);
    cr_expect(attempts <= attempts_allowed(minority_ms),
              "%ld failed connect attempts in %lld ms: more than the backoff allows (%ld)",
              attempts, (long long)minority_ms, attempts_allowed(minority_ms));
    cr_expect(w.ep.healthz_bad == 0,
              "%ld of %ld /healthz requests failed or took over %d ms (worst %lld ms)",
              w.ep.healthz_bad, w.ep.healthz_requests, HEALTHZ_BUDGET_MS,
              (long long)w.ep.healthz_worst_ms);
    cr_expect(w.ep.readyz_ready == 0 && w.ep.readyz_other == 0,
              "/readyz answered 200 %ld times and neither 200 nor 503 %ld times of %ld without a "
              "majority",
              w.ep.readyz_ready, w.ep.readyz_other, w.ep.readyz_requests);
    /* The last failure, or the attempt under way. */
    static const char failed[] = "not ready: not connected to RabbitMQ: cannot connect to "
                                 "RabbitMQ node amqp://guest:***@127.0.0.1:";
    static const char declaring[] = "not ready: not connected to RabbitMQ: connected to RabbitMQ "
                                    "node amqp://guest:***@127.0.0.1:";
    cr_expect(strncmp(w.ep.readyz_last_unready, failed, sizeof failed - 1) == 0 ||
                  (strncmp(w.ep.readyz_last_unready, declaring, sizeof declaring - 1) == 0 &&
                   strstr(w.ep.readyz_last_unready, "declaring the topology")),
              "/readyz does not say why: \"%s\"", w.ep.readyz_last_unready);

    /* A shutdown does not wait for a declaration that waits for a majority. */
    int second_status;
    int64_t stop_took = sigterm_during_a_stuck_declaration(h, survivor, &second_status);
    cr_log_info("SIGTERM to an idemq declaring its topology on the survivor: exited %d after "
                "%lld ms",
                second_status, (long long)stop_took);
    cr_expect_eq(second_status, 0, "the idemq stopped while declaring exited %d", second_status);
    cr_expect(stop_took < 10000,
              "SIGTERM took %lld ms to end an idemq stuck declaring its topology: it waited for "
              "the declaration's 30 s",
              (long long)stop_took);

    /* The majority comes back (node `second`: two of three), then the last node. idemq resumes
     * by itself. */
    int64_t majority_from = wall_ms();
    int64_t majority_took = services("start-%s-node %d", cluster, second);
    cr_log_info("start-%s-node %d took %lld ms", cluster, connected,
                (long long)services("start-%s-node %d", cluster, connected));
    cr_assert(harness_wait_log(h, "started consuming", consuming_before + 1, 120000),
              "idemq did not consume again within 120 s of the majority's return (log: %s)",
              h->log_path);
    cr_assert(harness_wait_for(ready_again, h, &port, 30000),
              "/readyz did not answer 200 again (log: %s)", h->log_path);
    cr_assert(waitpid(fixture.daemon, NULL, WNOHANG) == 0, "idemq exited (log: %s)", h->log_path);

    harness_publish_payments(h, "ma", MINORITY_AFTER);
    /* Every event applied, and the work queue empty: what the dead connection held came back
     * and was recognised as a duplicate (the dedup rows alone would not show it stuck). */
    queue_at work = {.node = survivor, .queue = h->queue};
    if (!harness_wait_scalar(h, total, 120000, "SELECT COUNT(*) FROM msg_dedup") ||
        !harness_wait_for(queue_emptied, h, &work, 90000)) {
        char view[8192];
        broker_view(survivor, h->queue, view, sizeof view);
        cr_assert_fail("%lld of %ld events applied and %ld message(s) in the work queue after "
                       "the majority came back (log: %s). The broker's view (a consumer whose "
                       "channel is gone holds messages nobody will get):\n%s",
                       harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup"), total, work.messages,
                       h->log_path, view);
    }
    harness_stop_idemq(&fixture.daemon);

    all = harness_log_load(h);
    log_event resumed = find_line(all, survivor_error_line, "started consuming");
    log_event processed = find_line(all, resumed.line + 1, NULL);
    json_decref(all);
    /* The majority is back at some moment of `start-NOUN-node` (the node boots, then the
     * script waits for it): the times are from the start of that command. */
    cr_log_info("the majority's return: start-%s-node %d took %lld ms; idemq consumed again at "
                "+%lld ms and processed its first event at +%lld ms; %ld of %d applied when the "
                "nodes were stopped; deduped redeliveries: %ld",
                cluster, second, (long long)majority_took,
                (long long)(resumed.ts_ms - majority_from),
                (long long)(processed.ts_ms - majority_from), applied_at_stop, MINORITY_BEFORE,
                harness_summary_total(h->log_path, "deduped"));

    /* Exactly once, nothing dead-lettered, nothing left behind. */
    cr_expect_eq(harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup"), total);
    cr_expect_eq(harness_scalar(h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), total);
    cr_expect_eq(harness_summary_total(h->log_path, "processed"), total);
    cr_expect_eq(harness_summary_total(h->log_path, "dead_lettered"), 0);
    expect_queues_empty(h);
}
