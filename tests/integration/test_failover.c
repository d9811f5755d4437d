/*
 * test_failover — idemq against a 3-node RabbitMQ cluster with quorum queues: the node idemq is
 * connected to is killed (kill -9) while 5,000 events flow; idemq must go on with another node
 * within 10 s, apply every event exactly once and leave nothing in the retry ladder or the DLQ.
 *
 * The suite starts its own cluster (`$IDEMQ_SERVICES start-cluster`, nodes listed in
 * IDEMQ_TEST_CLUSTER_URLS) in its .init and stops it in its .fini; the shared 3.10 broker is not
 * involved, MariaDB is the shared one. The harness connects to the cluster by pointing
 * IDEMQ_TEST_AMQP_URL at one of its nodes — one that stays up.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define EVENTS 5000
#define NODES 3
#define RETRIES 3
#define FAILOVER_LIMIT_MS 10000

static harness_fixture fixture;
static char node_url[NODES][256]; /* from IDEMQ_TEST_CLUSTER_URLS */
static int node_port[NODES];
static bool cluster_started;

/* Runs `$IDEMQ_SERVICES ARGS`, failing the test with the tail of its output when it fails.
 * Returns how long it took. */
static int64_t services(const char *args)
{
    const char *script = getenv("IDEMQ_SERVICES");
    cr_assert(script && *script,
              "IDEMQ_SERVICES is not set: source .state/env (scripts/test does)");
    char cmd[1024], tail[4096] = "";
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

static void parse_cluster_urls(void)
{
    const char *list = getenv("IDEMQ_TEST_CLUSTER_URLS");
    cr_assert(list && *list, "IDEMQ_TEST_CLUSTER_URLS is not set: source .state/env (written by "
                             "scripts/services start)");
    for (int i = 0; i < NODES; i++) {
        size_t n = strcspn(list, ",");
        cr_assert(n > 0 && n < sizeof node_url[i], "IDEMQ_TEST_CLUSTER_URLS: bad entry %d", i + 1);
        memcpy(node_url[i], list, n);
        node_url[i][n] = '\0';
        const char *colon = strrchr(node_url[i], ':');
        cr_assert(colon && (node_port[i] = atoi(colon + 1)) > 0, "no port in %s", node_url[i]);
        list += n;
        cr_assert(i == NODES - 1 || *list == ',',
                  "IDEMQ_TEST_CLUSTER_URLS lists fewer than %d nodes", NODES);
        if (*list)
            list++;
    }
}

static void suite_init(void)
{
    parse_cluster_urls();
    cluster_started = true; /* from here on the .fini stops it, even after a failed start */
    cr_log_info("start-cluster took %lld ms", (long long)services("start-cluster"));
}

static void suite_fini(void)
{
    harness_fixture_fini(&fixture);
    if (cluster_started)
        cr_log_info("stop-cluster took %lld ms", (long long)services("stop-cluster"));
}

TestSuite(failover, .init = suite_init, .fini = suite_fini);

/* Writes to path the harness's config with every node of the cluster in amqp.urls, node
 * first_node (1-based) first and the others in their order. */
static void write_cluster_config(harness *h, const char *path, int first_node)
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
    for (int i = 0; i < NODES; i++)
        if (i != first_node - 1)
            fprintf(f, ", \"%s\"", node_url[i]);
    fprintf(f, "], prefetch: 64, heartbeat: 10s}%s", rest);
    fclose(f);
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
 * (declare: passive). */
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

/* Members of queue, from `rabbitmqctl list_queues name members` on node (1-based); -1 when the
 * queue is not listed. */
static int queue_members(int node, const char *queue)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "\"%s\" cluster-ctl %d -q list_queues --no-table-headers name members 2>/dev/null",
             getenv("IDEMQ_SERVICES"), node);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char line[1024];
    int members = -1;
    size_t qlen = strlen(queue);
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, queue, qlen) != 0 || line[qlen] != '\t')
            continue;
        members = 0;
        for (const char *c = line + qlen; *c; c++)
            members += *c == '@';
    }
    cr_assert(pclose(p) == 0, "`services cluster-ctl %d list_queues` failed", node);
    return members;
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
             "\"%s\" cluster-ctl 1 -q eval 'length(rabbit_nodes:all_running()).' 2>/dev/null",
             getenv("IDEMQ_SERVICES"));
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char out[64] = "";
    if (!fgets(out, sizeof out, p))
        out[0] = '\0';
    pclose(p);
    return atoi(out) == *(const int *)arg;
}

Test(failover, kill_9_of_the_connected_node_fails_over_and_applies_each_event_once, .timeout = 420)
{
    harness_options opts = {.declare = "passive", .retry_set = true, .max_retries = RETRIES};
    /* The harness talks to node 1 until it is the one to die. */
    setenv("IDEMQ_TEST_AMQP_URL", node_url[0], 1);
    harness_fixture_init(&fixture, "failover", &opts);
    harness *h = &fixture.h;
    write_cluster_config(h, h->config_path, 1);
    harness_wait_quorum_ready(h, 60000); /* a fresh cluster takes a moment to accept them */

    /* Topology: every queue of this test replicated on all three nodes, so each survives the
     * loss of any one. */
    declare_replicated_work_queue(h);
    harness_declare_topology(h); /* the ladder and DLQ: quorum, on every running node */
    char name[160];
    cr_assert_eq(queue_members(1, h->queue), NODES, "work queue %s is not on every node", h->queue);
    for (int level = 1; level <= RETRIES; level++) {
        snprintf(name, sizeof name, "%s.retry.%d", h->queue, level);
        cr_assert_eq(queue_members(1, name), NODES, "retry queue %s is not on every node", name);
    }
    snprintf(name, sizeof name, "%s.dlq", h->queue);
    cr_assert_eq(queue_members(1, name), NODES, "%s is not on every node", name);

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
    char kill_args[64];
    snprintf(kill_args, sizeof kill_args, "kill-cluster-node %d", victim);
    int64_t killed_at = wall_ms();
    services(kill_args);

    cr_assert(harness_wait_log(h, "RabbitMQ connection lost", 1, 30000),
              "idemq did not notice that node %d died (log: %s)", victim, h->log_path);
    cr_assert(harness_wait_log(h, "reconnected to RabbitMQ node ", 1, 60000),
              "idemq did not reconnect to another node (log: %s)", h->log_path);
    cr_assert(harness_wait_scalar(h, EVENTS, 180000, "SELECT COUNT(*) FROM msg_dedup"),
              "not every event was applied after the failover (log: %s)", h->log_path);
    harness_stop_idemq(&fixture.daemon);

    /* Continued on another node within the limit: reconnected there, and processing again. */
    all = harness_log_load(h);
    log_event lost = find_line(all, connected.line + 1, "RabbitMQ connection lost");
    log_event again = find_line(all, lost.line + 1, "reconnected to RabbitMQ node ");
    log_event resumed = find_line(all, again.line + 1, NULL);
    json_decref(all);
    cr_assert(lost.line >= 0 && again.line >= 0, "log lines missing (log: %s)", h->log_path);
    cr_log_info("kill -9 of node %d at %lld; connection lost +%lld ms; reconnected to node %d "
                "+%lld ms; first event processed there +%lld ms; %ld of %d applied before the "
                "kill",
                victim, (long long)killed_at, (long long)(lost.ts_ms - killed_at), again.node,
                (long long)(again.ts_ms - killed_at), (long long)(resumed.ts_ms - killed_at),
                applied_at_kill, EVENTS);
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
    cr_log_info("deduped redeliveries: %ld", harness_summary_total(h->log_path, "deduped"));
    /* Nothing left anywhere: work queue, ladder, DLQ (idemq is stopped: nothing unacked). */
    cr_expect_eq(harness_queue_depth(h, h->queue), 0);
    for (int level = 1; level <= RETRIES; level++) {
        snprintf(name, sizeof name, "%s.retry.%d", h->queue, level);
        cr_expect_eq(harness_queue_depth(h, name), 0, "%s is not empty", name);
    }
    snprintf(name, sizeof name, "%s.dlq", h->queue);
    cr_expect_eq(harness_queue_depth(h, name), 0, "%s is not empty", name);

    one_shot_commands_skip_the_dead_node(h, victim);

    /* The killed node comes back and rejoins the cluster. */
    char start_args[64];
    snprintf(start_args, sizeof start_args, "start-cluster-node %d", victim);
    cr_log_info("%s took %lld ms", start_args, (long long)services(start_args));
    int all_nodes = NODES;
    cr_expect(harness_wait_for(running_nodes_are, h, &all_nodes, 60000),
              "node %d did not rejoin the cluster", victim);
}
