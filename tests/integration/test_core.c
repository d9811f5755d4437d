/*
 * test_core — effective-once processing end to end, the real idemq binary against real RabbitMQ
 * and MariaDB: duplicates (in one process and across two) apply once, kill -9 mid-run loses and
 * doubles nothing, the state machine's outcomes, bad input dead-lettered untouched, MessagePack
 * like JSON, a bad config refused before connecting, and a failed business update rolling back
 * its dedup row.
 *
 * Each test has its own database and queue (harness.h), so Criterion may run them in parallel.
 * Every wait is on an observable condition (a row count, a queue depth, a log line) with a
 * generous deadline; no sleep is used as synchronisation.
 *
 * Outcomes are read from idemq's JSON log lines ("outcome":"processed" …) and from the
 * "summary processed=… deduped=…" line it writes when it stops on SIGTERM.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "freeze_proxy.h"
#include "harness.h"

#define DEADLINE_MS 60000
#define STOP_MS 30000
#define MAX_BODY (1024 * 1024) /* amqp.max_body: the harness config keeps the default */

#define OUT_PROCESSED "\"outcome\":\"processed\""
#define OUT_DEDUPED "\"outcome\":\"deduped\""
#define OUT_STATE_NOOP "\"outcome\":\"state_noop\""
#define OUT_RETRIED "\"outcome\":\"retried\""
#define OUT_DEAD_LETTERED "\"outcome\":\"dead_lettered\""
#define READY_LINE "consuming with handler"

/* ---- per-test state and cleanup ------------------------------------------------------------ */

/* Criterion runs each test in its own process: these statics are per test. The fini hook kills
 * any idemq a failed assertion left behind, then drops the test's database and queues. */
static harness H;
static bool h_ready;
static pid_t spawned[8];

static void track(pid_t pid)
{
    for (size_t i = 0; i < sizeof spawned / sizeof spawned[0]; i++)
        if (spawned[i] == 0) {
            spawned[i] = pid;
            return;
        }
    cr_assert_fail("too many idemq processes in one test");
}

static int stop_idemq(pid_t pid, int sig)
{
    for (size_t i = 0; i < sizeof spawned / sizeof spawned[0]; i++)
        if (spawned[i] == pid)
            spawned[i] = 0;
    return harness_stop(pid, sig, STOP_MS);
}

static void core_fini(void)
{
    for (size_t i = 0; i < sizeof spawned / sizeof spawned[0]; i++)
        harness_kill_idemq(&spawned[i]);
    if (h_ready)
        harness_fini(&H);
    h_ready = false;
}

TestSuite(core, .fini = core_fini);

static void setup(const char *name, const harness_options *opts)
{
    harness_init(&H, name, opts);
    h_ready = true;
}

/* ---- log reading ------------------------------------------------------------------------- */

typedef struct log_wait {
    const char *path;
    const char *needle, *needle2;
    long at_least;
} log_wait;

static bool log_reached(harness *h, void *arg)
{
    (void)h;
    const log_wait *w = arg;
    return harness_log_count_both(w->path, w->needle, w->needle2) >= w->at_least;
}

/* Waits until path has at least `at_least` lines with needle (and needle2). */
static bool wait_log(const char *path, const char *needle, const char *needle2, long at_least)
{
    log_wait w = {path, needle, needle2, at_least};
    bool ok = harness_wait_for(log_reached, &H, &w, DEADLINE_MS);
    if (!ok)
        cr_log_error("waited %d ms for %ld line(s) with %s%s%s in %s; found %ld", DEADLINE_MS,
                     at_least, needle, needle2 ? " and " : "", needle2 ? needle2 : "", path,
                     harness_log_count_both(path, needle, needle2));
    return ok;
}

/* Waits until the processed + deduped lines over `count` logs, minus `baseline`, reach `want`. */
typedef struct outcome_wait {
    const char *paths[2];
    int count;
    long baseline, want;
    long last;
} outcome_wait;

static bool outcomes_reached(harness *h, void *arg)
{
    (void)h;
    outcome_wait *w = arg;
    long total = 0;
    for (int i = 0; i < w->count; i++)
        total += harness_log_count_both(w->paths[i], OUT_PROCESSED, NULL) +
                 harness_log_count_both(w->paths[i], OUT_DEDUPED, NULL);
    w->last = total - w->baseline;
    return w->last >= w->want;
}

typedef struct summary {
    long processed, deduped, state_noop, retried, dead_lettered, requeued;
} summary;

/* The last "summary processed=…" line of the log (written at a clean shutdown). */
static summary last_summary(const char *path)
{
    summary s = {-1, -1, -1, -1, -1, -1};
    FILE *f = fopen(path, "r");
    cr_assert(f, "no log at %s", path);
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (getline(&line, &cap, f) >= 0) {
        const char *p = strstr(line, "summary processed=");
        if (!p)
            continue;
        found = sscanf(p,
                       "summary processed=%ld deduped=%ld state_noop=%ld retried=%ld "
                       "dead_lettered=%ld requeued=%ld",
                       &s.processed, &s.deduped, &s.state_noop, &s.retried, &s.dead_lettered,
                       &s.requeued) == 6;
    }
    free(line);
    fclose(f);
    cr_assert(found, "no summary line in %s", path);
    return s;
}

/* Starts idemq on H's config, logging to path (NULL: H.log_path), and waits until it consumes. */
static pid_t start_idemq(const char *path)
{
    const char *log = path ? path : H.log_path;
    long before = harness_log_count_both(log, READY_LINE, NULL);
    pid_t pid = path ? harness_spawn_logged(&H, path) : harness_spawn(&H);
    track(pid);
    cr_assert(wait_log(log, READY_LINE, NULL, before + 1), "idemq did not start consuming");
    return pid;
}

/* ---- waiting on the broker and the database ------------------------------------------------ */

typedef struct queue_wait {
    const char *queue;
    long messages;  /* -1: any */
    long consumers; /* -1: any */
    long last_messages, last_consumers;
} queue_wait;

static bool queue_reached(harness *h, void *arg)
{
    queue_wait *w = arg;
    if (!harness_queue_info(h, w->queue, &w->last_messages, &w->last_consumers))
        return false;
    return (w->messages < 0 || w->last_messages == w->messages) &&
           (w->consumers < 0 || w->last_consumers == w->consumers);
}

static bool wait_queue(const char *queue, long messages, long consumers)
{
    queue_wait w = {queue, messages, consumers, -1, -1};
    bool ok = harness_wait_for(queue_reached, &H, &w, DEADLINE_MS);
    if (!ok)
        cr_log_error("waited for %s: %ld messages / %ld consumers; last %ld / %ld", queue, messages,
                     consumers, w.last_messages, w.last_consumers);
    return ok;
}

static void dlq_name(char *buf, size_t len)
{
    snprintf(buf, len, "%s.dlq", H.queue);
}

/* Waits until the work queue is drained, stops idemq (SIGTERM, asserting exit 0) and returns
 * the summary it logged. */
static summary drain_and_stop(pid_t pid)
{
    cr_assert(wait_queue(H.queue, 0, -1));
    cr_assert_eq(stop_idemq(pid, SIGTERM), 0);
    return last_summary(H.log_path);
}

/* ---- idemq's broker connection through a proxy -------------------------------------------- */

/* The harness config's `amqp:` line (harness_write_config) with url, so a test can move idemq
 * between the broker and a proxy in front of it. */
static void amqp_config_line(char *buf, size_t len, const char *url)
{
    cr_assert(url && *url, "IDEMQ_TEST_AMQP_URL is not set (source .state/env)");
    snprintf(buf, len, "amqp: {url: \"%s\", prefetch: 64, heartbeat: 10s}", url);
}

/* Starts a freeze_proxy in front of the broker and writes into line the config's `amqp:` line
 * that goes through it; the proxy is returned owned in *out. */
static void start_broker_proxy(freeze_proxy **out, char *line, size_t line_len)
{
    char proxied[600];
    harness_start_broker_proxy(out, proxied, sizeof proxied);
    amqp_config_line(line, line_len, proxied);
}

/* ---- message bodies and headers --------------------------------------------------------- */

/* A JSON payment event; amount < 0 leaves the field out. Returns the length. */
static int event_json(char *buf, size_t cap, const char *biz_key, const char *message_id,
                      const char *order_id, const char *event, long amount)
{
    int n = snprintf(buf, cap,
                     "{\"message_id\":\"%s\",\"biz_key\":\"%s\",\"order_id\":\"%s\","
                     "\"event_type\":\"%s\"",
                     message_id, biz_key, order_id, event);
    if (amount >= 0)
        n += snprintf(buf + n, cap - (size_t)n, ",\"amount\":%ld", amount);
    n += snprintf(buf + n, cap - (size_t)n, "}");
    cr_assert(n > 0 && (size_t)n < cap);
    return n;
}

static void publish_json(const char *biz_key, const char *order_id, const char *event, long amount)
{
    char body[512], message_id[160];
    snprintf(message_id, sizeof message_id, "m-%s", biz_key);
    int n = event_json(body, sizeof body, biz_key, message_id, order_id, event, amount);
    harness_publish(&H, NULL, "application/json", body, (size_t)n, NULL);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* A MessagePack payment event in sbuf (caller inits and destroys it). */
static void event_msgpack(msgpack_sbuffer *sbuf, const char *biz_key, const char *order_id,
                          const char *event, long amount)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sbuf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    pack_str(&pk, "message_id");
    pack_str(&pk, biz_key);
    pack_str(&pk, "biz_key");
    pack_str(&pk, biz_key);
    pack_str(&pk, "order_id");
    pack_str(&pk, order_id);
    pack_str(&pk, "event_type");
    pack_str(&pk, event);
    pack_str(&pk, "amount");
    msgpack_pack_long(&pk, amount);
}

static const amqp_field_value_t *header(const amqp_basic_properties_t *p, const char *name)
{
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    size_t len = strlen(name);
    for (int i = 0; i < p->headers.num_entries; i++) {
        const amqp_table_entry_t *e = &p->headers.entries[i];
        if (e->key.len == len && memcmp(e->key.bytes, name, len) == 0)
            return &e->value;
    }
    return NULL;
}

/* A string header copied into buf ("" when absent or not a string). */
static const char *header_text(const amqp_basic_properties_t *p, const char *name, char *buf,
                               size_t len)
{
    const amqp_field_value_t *v = header(p, name);
    buf[0] = '\0';
    if (v && (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES))
        snprintf(buf, len, "%.*s", (int)v->value.bytes.len, (const char *)v->value.bytes.bytes);
    return buf;
}

static bool header_int(const amqp_basic_properties_t *p, const char *name, int64_t *out)
{
    const amqp_field_value_t *v = header(p, name);
    if (!v)
        return false;
    switch (v->kind) {
    case AMQP_FIELD_KIND_I8:
        *out = v->value.i8;
        return true;
    case AMQP_FIELD_KIND_U8:
        *out = v->value.u8;
        return true;
    case AMQP_FIELD_KIND_I16:
        *out = v->value.i16;
        return true;
    case AMQP_FIELD_KIND_U16:
        *out = v->value.u16;
        return true;
    case AMQP_FIELD_KIND_I32:
        *out = v->value.i32;
        return true;
    case AMQP_FIELD_KIND_U32:
        *out = v->value.u32;
        return true;
    case AMQP_FIELD_KIND_I64:
        *out = v->value.i64;
        return true;
    case AMQP_FIELD_KIND_U64:
        *out = (int64_t)v->value.u64;
        return true;
    default:
        return false;
    }
}

/* Takes the next message from dlq into *m (owned: amqp_destroy_message), expects its
 * idemq-error-class to be non_retryable and copies its idemq-error header into text. */
static void get_non_retryable(const char *dlq, amqp_message_t *m, char *text, size_t len)
{
    cr_assert(harness_get(&H, dlq, m));
    cr_expect_str_eq(header_text(&m->properties, "idemq-error-class", text, len), "non_retryable");
    header_text(&m->properties, "idemq-error", text, len);
}

static bool body_contains(amqp_bytes_t b, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= b.len; i++)
        if (memcmp((const char *)b.bytes + i, needle, n) == 0)
            return true;
    return false;
}

/* Fixed-seed xorshift for reproducible shuffles. */
static uint64_t rng_next(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* ---- duplicates ----------------------------------------------------------------------- */

Test(core, a_thousand_events_each_sent_twice_in_random_order_apply_once, .timeout = 240)
{
    enum { ORDERS = 1000, MESSAGES = 2 * ORDERS };
    setup("dup1000", NULL);
    harness_insert_orders(&H, "o", ORDERS, "PAYING");
    pid_t pid = start_idemq(NULL);

    /* Each event twice; the copy has another message_id (a gateway's second callback), so only
     * biz_key can tell they are the same. */
    static char bodies[MESSAGES][256];
    static const void *ptrs[MESSAGES];
    static size_t lens[MESSAGES];
    for (int i = 0; i < MESSAGES; i++) {
        int order = i % ORDERS;
        char order_id[16], biz_key[64], message_id[64];
        snprintf(order_id, sizeof order_id, "o%d", order);
        snprintf(biz_key, sizeof biz_key, "order_id:o%d:PAY_SUCCESS", order);
        snprintf(message_id, sizeof message_id, "m-o%d-%d", order, i / ORDERS);
        lens[i] = (size_t)event_json(bodies[i], sizeof bodies[i], biz_key, message_id, order_id,
                                     "PAY_SUCCESS", order * 10L + 7);
        ptrs[i] = bodies[i];
    }
    uint64_t seed = 0x1d3e9a7c5b2f4081ULL;
    for (int i = MESSAGES - 1; i > 0; i--) {
        int j = (int)(rng_next(&seed) % (uint64_t)(i + 1));
        const void *p = ptrs[i];
        size_t l = lens[i];
        ptrs[i] = ptrs[j];
        lens[i] = lens[j];
        ptrs[j] = p;
        lens[j] = l;
    }
    harness_publish_batch(&H, NULL, "application/json", ptrs, lens, MESSAGES);

    cr_assert(harness_wait_scalar(&H, ORDERS, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(wait_log(H.log_path, OUT_DEDUPED, NULL, ORDERS));
    cr_assert(wait_log(H.log_path, OUT_PROCESSED, NULL, ORDERS));
    cr_assert(wait_queue(H.queue, 0, -1), "work queue not drained");

    cr_assert_eq(stop_idemq(pid, SIGTERM), 0, "idemq did not exit 0 on SIGTERM");
    summary s = last_summary(H.log_path);
    cr_expect_eq(s.processed, ORDERS, "summary processed=%ld", s.processed);
    cr_expect_eq(s.deduped, ORDERS, "summary deduped=%ld", s.deduped);
    cr_expect_eq(s.state_noop, 0, "summary state_noop=%ld", s.state_noop);
    cr_expect_eq(s.dead_lettered, 0, "summary dead_lettered=%ld", s.dead_lettered);
    cr_expect_eq(harness_log_count_both(H.log_path, OUT_DEDUPED, NULL), ORDERS);
    cr_expect_eq(harness_log_count_both(H.log_path, OUT_PROCESSED, NULL), ORDERS);

    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), ORDERS);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup d JOIN orders o ON "
                                    "d.biz_key = CONCAT('order_id:', o.order_id, ':PAY_SUCCESS') "
                                    "WHERE d.handler_name = 'pay-callback'"),
                 ORDERS, "every dedup row names one of the orders' events");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND "
                                    "amount = CAST(SUBSTRING(order_id, 2) AS UNSIGNED) * 10 + 7"),
                 ORDERS, "every order PAID with its amount");
    long messages = -1, consumers = -1;
    cr_assert(harness_queue_info(&H, H.queue, &messages, &consumers));
    cr_expect_eq(messages, 0, "work queue holds %ld message(s) after the stop", messages);
    char dlq[160];
    dlq_name(dlq, sizeof dlq);
    cr_expect_eq(harness_queue_depth(&H, dlq), 0);
}

/* ---- two processes, concurrent duplicates ------------------------------------------------- */

Test(core, fifty_copies_of_one_message_across_two_processes_apply_once, .timeout = 120)
{
    enum { COPIES = 50 };
    setup("two_procs", NULL);
    harness_insert_orders(&H, "x", 1, "PAYING");
    char log2[400];
    snprintf(log2, sizeof log2, "%s/idemq-2.log", H.dir);
    pid_t a = start_idemq(NULL);
    pid_t b = start_idemq(log2);
    cr_assert(wait_queue(H.queue, -1, 2), "both processes must be consuming before the burst");

    char body[256];
    int n =
        event_json(body, sizeof body, "order_id:x0:PAY_SUCCESS", "m-x0", "x0", "PAY_SUCCESS", 4242);
    const void *ptrs[COPIES];
    size_t lens[COPIES];
    for (int i = 0; i < COPIES; i++) {
        ptrs[i] = body;
        lens[i] = (size_t)n;
    }
    harness_publish_batch(&H, NULL, "application/json", ptrs, lens, COPIES);

    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    /* Each of the 50 deliveries ends as processed or deduped, in one of the two logs. */
    outcome_wait w = {{H.log_path, log2}, 2, 0, COPIES, 0};
    cr_assert(harness_wait_for(outcomes_reached, &H, &w, DEADLINE_MS),
              "only %ld of %d copies settled", w.last, COPIES);
    cr_assert(wait_queue(H.queue, 0, -1));
    cr_assert_eq(stop_idemq(a, SIGTERM), 0);
    cr_assert_eq(stop_idemq(b, SIGTERM), 0);

    long processed =
        harness_log_count_in(H.log_path, OUT_PROCESSED) + harness_log_count_in(log2, OUT_PROCESSED);
    long deduped =
        harness_log_count_in(H.log_path, OUT_DEDUPED) + harness_log_count_in(log2, OUT_DEDUPED);
    cr_expect_eq(processed, 1, "processed %ld times across both processes", processed);
    cr_expect_eq(deduped, COPIES - 1, "deduped %ld times across both processes", deduped);
    summary sa = last_summary(H.log_path), sb = last_summary(log2);
    cr_expect_eq(sa.processed + sb.processed, 1);
    cr_expect_eq(sa.deduped + sb.deduped, COPIES - 1);
    cr_expect_eq(sa.state_noop + sb.state_noop, 0);
    cr_expect_eq(sa.dead_lettered + sb.dead_lettered, 0);
    /* Round-robin delivery to two consumers with free prefetch: both saw copies, so the
     * duplicates really raced across processes, not only across one process's workers. */
    cr_expect(sa.processed + sa.deduped > 0 && sb.processed + sb.deduped > 0,
              "one process got no copy (a: %ld, b: %ld)", sa.processed + sa.deduped,
              sb.processed + sb.deduped);

    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'x0' AND "
                                    "status = 'PAID' AND amount = 4242"),
                 1);
    cr_expect_eq(harness_queue_depth(&H, H.queue), 0);
}

/* ---- kill -9 mid-run ---------------------------------------------------------------- */

/* Whether the proxy holds a basic.ack frame from idemq: its size (13) and its class and method
 * ids (60, 80), on any channel. */
static bool ack_is_held(harness *h, void *arg)
{
    (void)h;
    static const unsigned char basic_ack[] = {0, 0, 0, 13, 0, 60, 0, 80};
    return freeze_proxy_held_requests_contain(arg, basic_ack, sizeof basic_ack);
}

Test(core, kill_9_mid_run_then_restart_applies_each_message_once, .timeout = 300)
{
    enum { MESSAGES = 5000, KILL_AT = 1000 };
    setup("kill9", NULL);
    char processlist_sql[512], direct_amqp_line[700];
    snprintf(processlist_sql, sizeof processlist_sql,
             "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '%s' AND "
             "ID <> CONNECTION_ID()",
             H.database);
    amqp_config_line(direct_amqp_line, sizeof direct_amqp_line, getenv("IDEMQ_TEST_AMQP_URL"));
    harness_insert_orders(&H, "k", MESSAGES, "PAYING");
    harness_declare_topology(&H);

    char *bodies = malloc((size_t)MESSAGES * 160);
    const void **ptrs = calloc(MESSAGES, sizeof *ptrs);
    size_t *lens = calloc(MESSAGES, sizeof *lens);
    cr_assert(bodies && ptrs && lens);
    for (int i = 0; i < MESSAGES; i++) {
        char *b = bodies + (size_t)i * 160;
        char order_id[16], biz_key[64], message_id[64];
        snprintf(order_id, sizeof order_id, "k%d", i);
        snprintf(biz_key, sizeof biz_key, "order_id:k%d:PAY_SUCCESS", i);
        snprintf(message_id, sizeof message_id, "m-k%d", i);
        lens[i] = (size_t)event_json(b, 160, biz_key, message_id, order_id, "PAY_SUCCESS", i + 1L);
        ptrs[i] = b;
    }
    harness_publish_batch(&H, NULL, "application/json", ptrs, lens, MESSAGES);
    free(bodies);
    free(ptrs);
    free(lens);
    cr_assert(wait_queue(H.queue, MESSAGES, 0));

    /* Two kills. The first lands wherever KILL_AT commits happen to be: it checks that a kill
     * at a random point loses and doubles nothing. Whether it leaves committed-but-unacked
     * messages (the case the dedup row exists for) is chance: only a kill between a COMMIT the
     * server received and the ack reaching the broker does (measured on MariaDB 10.11 and
     * RabbitMQ 3.10: 9 kills in 20; the acks go out as soon as the commit is in). The
     * second kill makes that case certain: idemq reaches the broker through a proxy that stops
     * passing on what idemq sends (its acks) while deliveries still arrive, so every row
     * committed from then on is unacked when the kill lands. */
    freeze_proxy *ack_holder = NULL;
    char amqp_line[700];
    start_broker_proxy(&ack_holder, amqp_line, sizeof amqp_line);
    long long committed = 0, acked = 0, committed_unacked = 0;
    long ready = MESSAGES;
    for (int kill = 1; kill <= 2; kill++) {
        bool holding_acks = kill == 2;
        if (holding_acks)
            harness_config_replace_line(&H, "amqp:", amqp_line);
        long long threshold = committed + KILL_AT;
        pid_t victim = harness_spawn(&H);
        track(victim);
        long long rows = harness_wait_scalar_at_least(&H, threshold, DEADLINE_MS,
                                                      "SELECT COUNT(*) FROM msg_dedup");
        cr_assert(rows >= threshold, "only %lld rows committed", rows);
        if (holding_acks) {
            freeze_proxy_hold_requests(ack_holder, true);
            /* idemq acks only after its COMMIT returned, so one held basic.ack means at least
             * one committed row whose ack the broker never gets. Counting rows committed after
             * the hold proves nothing: the hold can land after the whole prefetch window
             * committed but before its acks went out, and then no row follows it. */
            cr_assert(harness_wait_for(ack_is_held, &H, ack_holder, DEADLINE_MS),
                      "idemq sent no basic.ack after the hold");
        }
        cr_assert_eq(stop_idemq(victim, SIGKILL), 128 + SIGKILL);
        /* The broker notices the dead connection (held bytes and all) only when it is reset. */
        if (holding_acks)
            freeze_proxy_drop(ack_holder);

        /* Let the server finish what the dead process had sent (a COMMIT already received
         * still commits; an open transaction rolls back): wait until its connections are gone. */
        cr_assert(harness_wait_scalar(&H, 0, DEADLINE_MS, processlist_sql));
        committed = harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup");
        cr_assert(committed >= threshold && committed < MESSAGES,
                  "kill %d was not mid-run: %lld of %d committed", kill, committed, MESSAGES);
        cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"),
                     committed, "dedup rows and business updates committed together");

        /* The broker requeues the dead consumer's unacked deliveries with its channel. */
        cr_assert(wait_queue(H.queue, -1, 0));
        ready = harness_queue_depth(&H, H.queue);
        acked = MESSAGES - ready;
        cr_assert(committed >= acked,
                  "more messages acked (%lld) than committed (%lld): an ack preceded its commit",
                  acked, committed);
        committed_unacked = committed - acked;
        cr_log_info("kill -9 #%d after %lld commits: %lld acked, %lld committed but unacked", kill,
                    committed, acked, committed_unacked);
    }
    cr_assert(committed_unacked >= 1,
              "the kill with held acks left no committed-but-unacked message to redeliver");
    harness_config_replace_line(&H, "amqp:", direct_amqp_line);
    freeze_proxy_free(ack_holder);
    long processed_before = harness_log_count_both(H.log_path, OUT_PROCESSED, NULL);
    long deduped_before = harness_log_count_both(H.log_path, OUT_DEDUPED, NULL);

    pid_t pid = start_idemq(NULL);
    cr_assert(harness_wait_scalar(&H, MESSAGES, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    /* Every redelivered or never-delivered message ends with exactly one outcome line. */
    outcome_wait ow = {{H.log_path, NULL}, 1, processed_before + deduped_before, ready, 0};
    cr_assert(harness_wait_for(outcomes_reached, &H, &ow, DEADLINE_MS),
              "only %ld of %ld requeued messages settled after the restart", ow.last, ready);
    cr_assert(wait_queue(H.queue, 0, -1));
    cr_assert_eq(stop_idemq(pid, SIGTERM), 0, "idemq did not exit 0 on SIGTERM");

    /* Nothing left unacked: after a clean stop, the queue is empty. */
    long messages = -1, consumers = -1;
    cr_assert(harness_queue_info(&H, H.queue, &messages, &consumers));
    cr_expect_eq(messages, 0, "%ld message(s) left in the work queue", messages);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), MESSAGES);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND "
                                    "amount = CAST(SUBSTRING(order_id, 2) AS UNSIGNED) + 1"),
                 MESSAGES);

    /* The final run got `ready` messages: the committed-but-unacked ones come back deduped,
     * the rest are processed — exactly. */
    long processed_after =
        harness_log_count_both(H.log_path, OUT_PROCESSED, NULL) - processed_before;
    long deduped_after = harness_log_count_both(H.log_path, OUT_DEDUPED, NULL) - deduped_before;
    cr_expect_eq(processed_after, MESSAGES - committed, "after the restart: processed %ld",
                 processed_after);
    cr_expect_eq(deduped_after, committed_unacked,
                 "every committed-but-unacked message comes back as deduped (got %ld, want %lld)",
                 deduped_after, committed_unacked);
    summary s = last_summary(H.log_path);
    cr_expect_eq(s.processed, MESSAGES - committed);
    cr_expect_eq(s.deduped, committed_unacked);
    cr_expect_eq(s.dead_lettered, 0);
}

/* ---- state machine -------------------------------------------------------------------- */

Test(core, state_machine_applies_legal_steps_noops_repeats_and_dead_letters_illegal_ones,
     .timeout = 120)
{
    setup("state_machine", NULL);
    harness_sql(&H, "INSERT INTO orders VALUES ('a', 'PAYING', NULL), ('b', 'PAID', 500), "
                    "('c', 'PAYING', NULL)");
    pid_t pid = start_idemq(NULL);
    char dlq[160];
    dlq_name(dlq, sizeof dlq);

    /* Repeat transition with a new biz_key: the row is already at the target → state_noop,
     * committed (its dedup row exists), row unchanged. */
    publish_json("order_id:a:PAY_SUCCESS", "a", "PAY_SUCCESS", 100);
    cr_assert(wait_log(H.log_path, "\"biz_key\":\"order_id:a:PAY_SUCCESS\"", OUT_PROCESSED, 1));
    publish_json("order_id:a:PAY_SUCCESS:again", "a", "PAY_SUCCESS", 999);
    cr_assert(
        wait_log(H.log_path, "\"biz_key\":\"order_id:a:PAY_SUCCESS:again\"", OUT_STATE_NOOP, 1));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'a' AND "
                                    "status = 'PAID' AND amount = 100"),
                 1, "state_noop must not touch the row");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                    "'order_id:a:PAY_SUCCESS:again'"),
                 1, "a state_noop commits its dedup row");

    /* PAID → REFUND_SUCCESS skips REFUNDING: illegal → DLQ now, and the dedup row rolls back. */
    char body[512];
    int n = event_json(body, sizeof body, "order_id:b:REFUND_SUCCESS", "m-b-refund", "b",
                       "REFUND_SUCCESS", 1);
    harness_publish(&H, NULL, "application/json", body, (size_t)n, NULL);
    cr_assert(wait_queue(dlq, 1, -1), "the illegal transition did not reach %s", dlq);
    amqp_message_t m;
    char text[1200];
    get_non_retryable(dlq, &m, text, sizeof text);
    cr_expect(strstr(text, "illegal transition") && strstr(text, "REFUND_SUCCESS") &&
                  strstr(text, "PAID"),
              "idemq-error: %s", text);
    cr_expect_eq(m.body.len, (size_t)n);
    cr_expect(m.body.len == (size_t)n && memcmp(m.body.bytes, body, (size_t)n) == 0,
              "DLQ body differs from the published one");
    amqp_destroy_message(&m);
    cr_expect(
        wait_log(H.log_path, "\"biz_key\":\"order_id:b:REFUND_SUCCESS\"", OUT_DEAD_LETTERED, 1));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'b' AND "
                                    "status = 'PAID' AND amount = 500"),
                 1, "an illegal transition must not touch the row");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                    "'order_id:b:REFUND_SUCCESS'"),
                 0, "the dedup row of a dead-lettered message must roll back");

    /* The full legal path, one step at a time (workers do not order events of one key). */
    publish_json("order_id:c:PAY_SUCCESS", "c", "PAY_SUCCESS", 300);
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'c' AND "
                                  "status = 'PAID' AND amount = 300"));
    publish_json("order_id:c:REFUND_START", "c", "REFUND_START", -1);
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'c' AND "
                                  "status = 'REFUNDING'"));
    publish_json("order_id:c:REFUND_SUCCESS", "c", "REFUND_SUCCESS", -1);
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'c' AND "
                                  "status = 'REFUNDED'"));
    cr_expect_eq(harness_scalar(&H, "SELECT amount FROM orders WHERE order_id = 'c'"), 300,
                 "events without amount keep the column");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE "
                                    "'order_id:c:%%'"),
                 3);

    summary s = drain_and_stop(pid);
    cr_expect_eq(s.processed, 4);
    cr_expect_eq(s.state_noop, 1);
    cr_expect_eq(s.dead_lettered, 1);
    cr_expect_eq(s.deduped, 0);
    cr_expect_eq(s.retried, 0);
    cr_expect_eq(harness_queue_depth(&H, dlq), 0);
}

/* ---- bad input ------------------------------------------------------------------------ */

typedef struct bad_case {
    const char *id;
    const char *content_type;
    char *body;
    size_t len;
    const char *reason[2]; /* substrings the idemq-error header must contain */
    bool seen;
} bad_case;

static void publish_with_headers(const bad_case *c)
{
    amqp_table_entry_t entries[2];
    entries[0].key = amqp_cstring_bytes("test-id");
    entries[0].value.kind = AMQP_FIELD_KIND_UTF8;
    entries[0].value.value.bytes = amqp_cstring_bytes(c->id);
    entries[1].key = amqp_cstring_bytes("test-tag");
    entries[1].value.kind = AMQP_FIELD_KIND_UTF8;
    entries[1].value.value.bytes = amqp_cstring_bytes("keep-me");
    amqp_table_t headers = {.num_entries = 2, .entries = entries};
    harness_publish(&H, NULL, c->content_type, c->body, c->len, &headers);
}

Test(core, bad_input_is_dead_lettered_untouched_and_never_stalls_the_queue, .timeout = 120)
{
    enum { GOOD = 6, BIG = 2 * 1024 * 1024 };
    /* One worker, prefetch 1: a bad message that were not settled would block everything. */
    harness_options opts = {.workers = 1, .prefetch = 1};
    setup("bad_input", &opts);
    harness_insert_orders(&H, "g", GOOD, "PAYING");
    pid_t pid = start_idemq(NULL);

    bad_case cases[5] = {
        {"malformed", "application/json", NULL, 0, {"(syntax)", "JSON"}, false},
        {"no-biz-key",
         "application/json",
         NULL,
         0,
         {"(biz_key_missing)", "biz_key is missing"},
         false},
        {"long-biz-key",
         "application/json",
         NULL,
         0,
         {"(biz_key_too_long)", "biz_key is 300 bytes"},
         false},
        {"two-mib", "application/json", NULL, 0, {"(too_large)", "body is 2097152 bytes"}, false},
        {"msgpack-bin", "application/msgpack", NULL, 0, {"(unsupported)", "bin"}, false},
    };
    cases[0].body = strdup("{\"biz_key\":\"bad-1\",\"order_id\":\"g0\",\"event_type\":");
    cases[0].len = strlen(cases[0].body);
    cases[1].body = strdup("{\"order_id\":\"g1\",\"event_type\":\"PAY_SUCCESS\",\"amount\":1}");
    cases[1].len = strlen(cases[1].body);
    char long_key[301];
    memset(long_key, 'k', 300);
    long_key[300] = '\0';
    cases[2].body = malloc(512);
    cases[2].len =
        (size_t)event_json(cases[2].body, 512, long_key, "m-long", "g2", "PAY_SUCCESS", 1);
    /* A well-formed envelope whose only fault is its size. */
    cases[3].body = malloc(BIG);
    int head = snprintf(cases[3].body, BIG,
                        "{\"biz_key\":\"big-1\",\"order_id\":\"g3\",\"event_type\":"
                        "\"PAY_SUCCESS\",\"pad\":\"");
    memset(cases[3].body + head, 'p', BIG - (size_t)head - 2);
    memcpy(cases[3].body + BIG - 2, "\"}", 2);
    cases[3].len = BIG;
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pack_str(&pk, "biz_key");
    pack_str(&pk, "order_id:g4:PAY_SUCCESS:bin");
    pack_str(&pk, "order_id");
    pack_str(&pk, "g4");
    pack_str(&pk, "event_type");
    pack_str(&pk, "PAY_SUCCESS");
    pack_str(&pk, "blob");
    msgpack_pack_bin(&pk, 3);
    msgpack_pack_bin_body(&pk, "\x01\x02\x03", 3);
    cases[4].body = malloc(sbuf.size);
    memcpy(cases[4].body, sbuf.data, sbuf.size);
    cases[4].len = sbuf.size;
    msgpack_sbuffer_destroy(&sbuf);

    /* good, bad, good, bad, …, good */
    for (int i = 0; i < GOOD; i++) {
        char order_id[16], biz_key[64];
        snprintf(order_id, sizeof order_id, "g%d", i);
        snprintf(biz_key, sizeof biz_key, "order_id:g%d:PAY_SUCCESS", i);
        publish_json(biz_key, order_id, "PAY_SUCCESS", 50 + i);
        if (i < 5)
            publish_with_headers(&cases[i]);
    }

    cr_assert(harness_wait_scalar(&H, GOOD, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND "
                                  "amount = CAST(SUBSTRING(order_id, 2) AS UNSIGNED) + 50"),
              "good messages after bad ones were not all processed");
    char dlq[160];
    dlq_name(dlq, sizeof dlq);
    cr_assert(wait_queue(dlq, 5, -1), "not every bad message reached %s", dlq);
    cr_assert(wait_queue(H.queue, 0, -1));

    for (int k = 0; k < 5; k++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq, &m), "DLQ message %d missing", k);
        char id[64], text[1200];
        header_text(&m.properties, "test-id", id, sizeof id);
        bad_case *c = NULL;
        for (int i = 0; i < 5; i++)
            if (strcmp(cases[i].id, id) == 0)
                c = &cases[i];
        cr_assert(c, "DLQ message without a known test-id header ('%s')", id);
        cr_expect(!c->seen, "%s dead-lettered twice", id);
        c->seen = true;
        if (c->len > MAX_BODY) {
            /* Memory is bounded before allocation: the copy keeps max_body bytes and says so. */
            int64_t original = -1;
            cr_expect(m.body.len == MAX_BODY && memcmp(m.body.bytes, c->body, MAX_BODY) == 0,
                      "%s: DLQ body (%zu bytes) is not the published body's first %d bytes", id,
                      m.body.len, MAX_BODY);
            cr_expect(header_int(&m.properties, "idemq-body-truncated", &original) &&
                          original == (int64_t)c->len,
                      "%s: idemq-body-truncated %" PRId64 ", want %zu", id, original, c->len);
        } else {
            cr_expect(m.body.len == c->len && memcmp(m.body.bytes, c->body, c->len) == 0,
                      "%s: DLQ body (%zu bytes) is not the published body (%zu bytes)", id,
                      m.body.len, c->len);
        }
        cr_expect((m.properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) &&
                      harness_bytes_eq(m.properties.content_type, amqp_cstring_bytes(c->content_type)),
                  "%s: content_type not preserved", id);
        cr_expect_str_eq(header_text(&m.properties, "test-tag", text, sizeof text), "keep-me",
                         "%s: custom header not preserved", id);
        cr_expect_str_eq(header_text(&m.properties, "idemq-error-class", text, sizeof text),
                         "non_retryable", "%s: class", id);
        cr_expect_str_eq(header_text(&m.properties, "idemq-queue", text, sizeof text), H.queue);
        int64_t retries = -1;
        cr_expect(header_int(&m.properties, "idemq-retries", &retries) && retries == 0,
                  "%s: idemq-retries %" PRId64, id, retries);
        header_text(&m.properties, "idemq-error", text, sizeof text);
        cr_expect(strstr(text, c->reason[0]) && strstr(text, c->reason[1]),
                  "%s: idemq-error '%s' does not name the problem ('%s', '%s')", id, text,
                  c->reason[0], c->reason[1]);
        amqp_destroy_message(&m);
    }
    for (int i = 0; i < 5; i++)
        free(cases[i].body);

    cr_assert_eq(stop_idemq(pid, SIGTERM), 0);
    summary s = last_summary(H.log_path);
    cr_expect_eq(s.processed, GOOD);
    cr_expect_eq(s.dead_lettered, 5);
    cr_expect_eq(s.requeued, 0);
    cr_expect_eq(harness_log_count_both(H.log_path, OUT_DEAD_LETTERED, "invalid envelope"), 5);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), GOOD,
                 "a bad body must never reach the dedup table");
    cr_expect_eq(harness_queue_depth(&H, dlq), 0);
}

/* ---- MessagePack ---------------------------------------------------------------------- */

static void publish_msgpack(const char *content_type, const char *biz_key, const char *order_id,
                            long amount)
{
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    event_msgpack(&sbuf, biz_key, order_id, "PAY_SUCCESS", amount);
    cr_assert((unsigned char)sbuf.data[0] == 0x85, "expected a fixmap of 5");
    harness_publish(&H, NULL, content_type, sbuf.data, sbuf.size, NULL);
    msgpack_sbuffer_destroy(&sbuf);
}

Test(core, msgpack_events_are_processed_like_json, .timeout = 120)
{
    setup("msgpack", NULL);
    harness_insert_orders(&H, "m", 3, "PAYING");
    harness_insert_orders(&H, "j", 1, "PAYING");
    pid_t pid = start_idemq(NULL);

    publish_msgpack("application/msgpack", "order_id:m0:PAY_SUCCESS", "m0", 70000);
    publish_msgpack(NULL, "order_id:m1:PAY_SUCCESS", "m1", 71); /* sniffed */
    publish_msgpack("application/x-msgpack", "order_id:m2:PAY_SUCCESS", "m2", 72);
    publish_json("order_id:j0:PAY_SUCCESS", "j0", "PAY_SUCCESS", 80);
    cr_assert(harness_wait_scalar(&H, 4, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(wait_log(H.log_path, OUT_PROCESSED, NULL, 4));

    /* The same biz_key in the other encoding is the same event. */
    publish_json("order_id:m0:PAY_SUCCESS", "m0", "PAY_SUCCESS", 70000);
    publish_msgpack("application/msgpack", "order_id:j0:PAY_SUCCESS", "j0", 80);
    cr_assert(wait_log(H.log_path, OUT_DEDUPED, NULL, 2));
    cr_assert(wait_queue(H.queue, 0, -1));
    cr_assert_eq(stop_idemq(pid, SIGTERM), 0);

    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 4);
    cr_expect_eq(harness_scalar(&H, "SELECT amount FROM orders WHERE order_id = 'm0'"), 70000);
    cr_expect_eq(harness_scalar(&H, "SELECT amount FROM orders WHERE order_id = 'm1'"), 71);
    cr_expect_eq(harness_scalar(&H, "SELECT amount FROM orders WHERE order_id = 'm2'"), 72);
    cr_expect_eq(harness_scalar(&H, "SELECT amount FROM orders WHERE order_id = 'j0'"), 80);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key IN "
                                    "('order_id:m0:PAY_SUCCESS', 'order_id:m1:PAY_SUCCESS', "
                                    "'order_id:m2:PAY_SUCCESS', 'order_id:j0:PAY_SUCCESS')"),
                 4);
    cr_expect_eq(harness_log_count_both(H.log_path, "\"message_id\":\"order_id:m1:PAY_SUCCESS\"",
                                        OUT_PROCESSED),
                 1, "the msgpack message_id is logged");
    summary s = last_summary(H.log_path);
    cr_expect_eq(s.processed, 4);
    cr_expect_eq(s.deduped, 2);
    cr_expect_eq(s.dead_lettered, 0);
}

/* ---- config errors ------------------------------------------------------------------- */

Test(core, config_with_five_mistakes_exits_2_and_connects_nowhere, .timeout = 60)
{
    /* A listener stands in for both servers: any connection attempt would be queued on it. */
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    cr_assert(listener >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t addr_len = sizeof addr;
    cr_assert(bind(listener, (struct sockaddr *)&addr, sizeof addr) == 0);
    cr_assert(listen(listener, 16) == 0);
    cr_assert(getsockname(listener, (struct sockaddr *)&addr, &addr_len) == 0);
    int port = ntohs(addr.sin_port);
    unsetenv("IDEMQ_AMQP_URL");
    unsetenv("IDEMQ_MYSQL_URL");
    unsetenv("IDEMQ_CONFIG");

    harness h = {0};
    snprintf(h.dir, sizeof h.dir, "/tmp/idemq-test-XXXXXX");
    cr_assert(mkdtemp(h.dir));
    char path[400];
    snprintf(path, sizeof path, "%s/bad.yaml", h.dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f,
            "amqp:\n"                                              /* 1 */
            "  url: \"amqp://guest:guest@127.0.0.1:%d/%%2f\"\n"    /* 2 */
            "  prefech: 64\n"                                      /* 3 */
            "mysql:\n"                                             /* 4 */
            "  url: \"mysql://root:hunter2@127.0.0.1:%d/idemq\"\n" /* 5 */
            "  workers: 0\n"                                       /* 6 */
            "log:\n"                                               /* 7 */
            "  level: verbose\n"                                   /* 8 */
            "shutdown_timeout: 25x\n"                              /* 9 */
            "consumers:\n"                                         /* 10 */
            "  - queue: payments\n"                                /* 11 */
            "    handler_name: pay-callback\n"                     /* 12 */
            "    handler:\n"                                       /* 13 */
            "      type: state_machine\n"                          /* 14 */
            "      table: \"orders; DROP TABLE x\"\n"              /* 15 */
            "      key_column: order_id\n"                         /* 16 */
            "      key_field: order_id\n"                          /* 17 */
            "      state_column: status\n"                         /* 18 */
            "      event_field: event_type\n"                      /* 19 */
            "      transitions:\n"                                 /* 20 */
            "        PAY_SUCCESS: {from: [PAYING], to: PAID}\n",   /* 21 */
            port, port);
    fclose(f);

    static const struct {
        unsigned line;
        const char *text;
    } expected[] = {
        {3, "unknown key 'amqp.prefech'"},
        {6, "mysql.workers: must be between 1 and 256, got 0"},
        {8, "log.level: 'verbose' is not one of"},
        {9, "shutdown_timeout: '25x' is not a valid duration"},
        {15, "consumers[0].handler.table: 'orders; DROP TABLE x' is not a valid SQL identifier"},
    };
    const char *commands[] = {"check", "run"};
    for (int c = 0; c < 2; c++) {
        char *out = NULL;
        const char *args[] = {commands[c], "-c", path, NULL};
        int rc = harness_run_cli(&h, &out, args);
        cr_expect_eq(rc, 2, "idemq %s exited %d:\n%s", commands[c], rc, out);
        for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
            char needle[512];
            snprintf(needle, sizeof needle, "%s:%u: %s", path, expected[i].line, expected[i].text);
            cr_expect(strstr(out, needle), "idemq %s: missing '%s' in:\n%s", commands[c], needle,
                      out);
        }
        cr_expect_null(strstr(out, "hunter2"), "idemq %s printed the password:\n%s", commands[c],
                       out);
        cr_expect_null(strstr(out, READY_LINE), "idemq %s started consuming:\n%s", commands[c],
                       out);
        free(out);
        int conn = accept(listener, NULL, NULL);
        cr_expect(conn < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
                  "idemq %s connected to a server with an invalid config", commands[c]);
        if (conn >= 0)
            close(conn);
    }
    close(listener);
    unlink(path);
    char cli_out[400];
    snprintf(cli_out, sizeof cli_out, "%s/cli.out", h.dir);
    unlink(cli_out);
    rmdir(h.dir);
}

/* ---- the business update fails: nothing commits, nothing is swallowed ---------------- */

Test(core, failed_business_update_rolls_back_the_dedup_row, .timeout = 120)
{
    harness_options opts = {.retry_set = true, .max_retries = 6, .base = "200ms", .jitter = "50ms"};
    setup("rollback", &opts);
    cr_assert_eq(harness_scalar(&H, "SELECT @@GLOBAL.sql_mode LIKE '%%STRICT_TRANS_TABLES%%'"), 1,
                 "this test needs a strict sql_mode (the MariaDB default) so that an out-of-range "
                 "value is an error, not a warning");
    /* r*: amount too small for the column (strict mode: 1264 out of range → non-retryable).
     * t0: a trigger refuses the update while failctl.fail = 1 (SIGNAL 45000 → retryable). */
    harness_sql(&H, "ALTER TABLE orders MODIFY amount TINYINT NULL");
    harness_sql(&H, "CREATE TABLE failctl (fail INT NOT NULL)");
    harness_sql(&H, "INSERT INTO failctl VALUES (1)");
    harness_sql(&H, "CREATE TRIGGER refuse_t0 BEFORE UPDATE ON orders FOR EACH ROW "
                    "BEGIN "
                    "  IF NEW.order_id = 't0' AND (SELECT fail FROM failctl) = 1 THEN "
                    "    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'test trigger refuses t0'; "
                    "  END IF; "
                    "END");
    harness_sql(&H, "INSERT INTO orders VALUES ('r0', 'PAYING', NULL), ('r1', 'PAYING', NULL), "
                    "('t0', 'PAYING', NULL)");
    pid_t pid = start_idemq(NULL);
    char dlq[160];
    dlq_name(dlq, sizeof dlq);

    /* Non-retryable failure of the business step: dead-lettered, no dedup row, row untouched. */
    publish_json("order_id:r0:PAY_SUCCESS", "r0", "PAY_SUCCESS", 1000);
    publish_json("order_id:r1:PAY_SUCCESS", "r1", "PAY_SUCCESS", 100);
    cr_assert(wait_queue(dlq, 1, -1));
    amqp_message_t m;
    char text[1200];
    get_non_retryable(dlq, &m, text, sizeof text);
    cr_expect(strstr(text, "1264") && strstr(text, "amount"), "idemq-error: %s", text);
    cr_expect(body_contains(m.body, "\"order_id\":\"r0\""), "the dead letter is not r0's message");
    amqp_destroy_message(&m);
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'r1' AND "
                                  "status = 'PAID' AND amount = 100"));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                    "'order_id:r0:PAY_SUCCESS'"),
                 0, "the dedup row must roll back with the failed update");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'r0' AND "
                                    "status = 'PAYING' AND amount IS NULL"),
                 1);

    /* Retryable failure: while the trigger refuses, each attempt rolls back and leaves no dedup
     * row; once it stops refusing, the retry is applied — not swallowed as a duplicate. */
    publish_json("order_id:t0:PAY_SUCCESS", "t0", "PAY_SUCCESS", 42);
    cr_assert(wait_log(H.log_path, "\"biz_key\":\"order_id:t0:PAY_SUCCESS\"", OUT_RETRIED, 1));
    cr_expect_eq(harness_log_count_both(H.log_path, OUT_RETRIED, "test trigger refuses t0"),
                 harness_log_count_both(H.log_path, OUT_RETRIED, NULL),
                 "the retry reason is the trigger's");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                    "'order_id:t0:PAY_SUCCESS'"),
                 0, "a failed attempt left its dedup row behind");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 't0' AND "
                                    "status = 'PAYING'"),
                 1);
    harness_sql(&H, "UPDATE failctl SET fail = 0");
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 't0' AND "
                                  "status = 'PAID' AND amount = 42"),
              "the retry after the failure was not applied");
    cr_assert(wait_log(H.log_path, "\"biz_key\":\"order_id:t0:PAY_SUCCESS\"", OUT_PROCESSED, 1));
    cr_expect_eq(
        harness_log_count_both(H.log_path, "\"biz_key\":\"order_id:t0:PAY_SUCCESS\"", OUT_DEDUPED),
        0);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                    "'order_id:t0:PAY_SUCCESS'"),
                 1);

    summary s = drain_and_stop(pid);
    cr_expect_eq(s.processed, 2);
    cr_expect_eq(s.dead_lettered, 1);
    cr_expect_eq(s.deduped, 0);
    cr_expect(s.retried >= 1);
    cr_expect_eq(harness_queue_depth(&H, dlq), 0);
}

/* A caching_sha2_password account (MySQL 8's default) logging in without TLS for the first time
 * since the server started (a new account: the server has no cached hash of it) must send its
 * password encrypted with the server's RSA key. libmysqlclient fetches the key only when asked
 * (db/client.c asks); without it every command fails with "Authentication requires secure
 * connection". On MariaDB the account is mysql_native_password's: the same login, the same
 * checks. */
Test(core, a_first_login_without_tls_works_with_the_servers_default_authentication,
     .timeout = 120)
{
    harness_init(&H, "first_login", NULL);
    h_ready = true;
    char user[64], password[64];
    snprintf(user, sizeof user, "first_%d", (int)getpid());
    snprintf(password, sizeof password, "pw-%d", (int)getpid());
    harness_sql(&H, "CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, password);
    harness_sql(&H, "GRANT SELECT, INSERT, UPDATE, DELETE ON `%s`.* TO '%s'@'%%'", H.database,
                user);
    if (harness_db_is_mysql(&H))
        cr_assert_eq(harness_scalar(&H,
                                    "SELECT COUNT(*) FROM mysql.user WHERE user = '%s' AND "
                                    "plugin = 'caching_sha2_password'",
                                    user),
                     1, "the new account does not use caching_sha2_password");
    harness_config_set_mysql_login(&H, user, password);
    harness_insert_orders(&H, "f", 3, "PAYING");
    harness_declare_topology(&H);

    char *out = NULL;
    const char *args[] = {"check", "-c", H.config_path, NULL};
    int rc = harness_run_cli(&H, &out, args);
    cr_assert_eq(rc, 0, "idemq check as %s exited %d:\n%s", user, rc, out);
    cr_assert(strstr(out, "not encrypted"), "the login was not plaintext:\n%s", out);
    free(out);

    pid_t pid;
    harness_start_idemq(&H, READY_LINE, 15000, &pid);
    track(pid);
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "f%d", i);
        harness_publish_event(&H, id, "PAY_SUCCESS", i);
    }
    cr_assert(harness_wait_scalar(&H, 3, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"));
    cr_assert_eq(stop_idemq(pid, SIGTERM), 0);
    harness_sql(&H, "DROP USER '%s'@'%%'", user);
}

/* The acks of deliveries that committed after one still waiting (its row locked by another
 * session) go out while it waits: the broker thread holds them back a moment for one
 * basic.ack(multiple) (broker/session.c flush_acks), never until the first delivery ends. Held
 * for good, they would stay unacked, and a crash would bring every one of them back. */
Test(core, acks_behind_a_delivery_waiting_on_a_lock_are_sent_while_it_waits, .timeout = 120)
{
    enum { AFTER = 20 };
    harness_options opts = {.workers = 2, .prefetch = 200};
    setup("acks_behind", &opts);
    /* One message a transaction, so that only the locked order's delivery waits. */
    FILE *f = fopen(H.config_path, "r");
    cr_assert(f);
    char config[8192];
    size_t len = fread(config, 1, sizeof config - 1, f);
    fclose(f);
    config[len] = '\0';
    char *workers = strstr(config, "workers: 2}");
    cr_assert(workers, "no \"workers: 2}\" in %s", H.config_path);
    f = fopen(H.config_path, "w");
    cr_assert(f);
    fprintf(f, "%.*sworkers: 2, batch: 1}%s", (int)(workers - config), config,
            workers + strlen("workers: 2}"));
    fclose(f);

    harness_insert_orders(&H, "w", 1, "PAYING");
    harness_insert_orders(&H, "a", AFTER, "PAYING");
    MYSQL *locker = harness_db_open(&H);
    cr_assert(mysql_query(locker, "BEGIN") == 0, "%s", mysql_error(locker));
    cr_assert(mysql_query(locker, "SELECT * FROM orders WHERE order_id = 'w0' FOR UPDATE") == 0,
              "%s", mysql_error(locker));
    mysql_free_result(mysql_store_result(locker));
    pid_t pid = start_idemq(NULL);
    harness_publish_payments(&H, "w", 1); /* first: the oldest delivery, the one that waits */
    harness_publish_payments(&H, "a", AFTER);
    cr_assert(harness_wait_scalar(&H, AFTER, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id LIKE 'a%%' AND "
                                  "status = 'PAID'"),
              "the events after the waiting one were not applied");

    long messages = -1, unacked = -1;
    int64_t deadline = harness_now_ms() + 10000;
    while (harness_broker_queue_stats(H.queue, &messages, &unacked) &&
           (messages != 1 || unacked != 1) && harness_now_ms() < deadline) {
        struct timespec pause = {.tv_nsec = 100 * 1000000};
        nanosleep(&pause, NULL);
    }
    cr_expect_eq(unacked, 1, "%ld deliveries unacked while only w0 waits (%ld in the queue)",
                 unacked, messages);
    cr_expect_eq(messages, 1, "%ld messages in the queue while only w0 waits", messages);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'w0' AND "
                                    "status = 'PAID'"),
                 0, "w0 was applied through the lock");

    mysql_close(locker); /* rolls back: w0's transaction goes on */
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'w0' AND "
                                  "status = 'PAID'"));
    summary s = drain_and_stop(pid);
    cr_expect_eq(s.processed, AFTER + 1);
    cr_expect_eq(s.deduped, 0);
}
