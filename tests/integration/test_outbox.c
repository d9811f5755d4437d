/*
 * test_outbox — the transactional outbox end to end: the real idemq binary against real RabbitMQ
 * and MariaDB writes one idemq_outbox row per emit of each message it applies, in the
 * transaction that applies it, and none for any other outcome.
 *
 * The first tests run idemq with `outbox: {relay: false}`: it only writes rows, so every row
 * must stay pending (state 0, no attempt, no published_at). The last ones run the relay and a
 * downstream idemq that consumes what it publishes (tests/integration/test_outbox_outage.c has
 * the broker outage, in its own executable).
 *
 *   state machine (emit: under a transition): every applied message has exactly one row per
 *     emit — default exchange and a named one, JSON and MessagePack, fields by dotted path and
 *     constants, the derived biz_key — and duplicates, a copy of one biz_key, state_noop,
 *     illegal transitions, undecodable messages, a transition without emit and retries write
 *     none; three events of one order in one batch (the batch's one-by-one path) write the rows
 *     of each. Run with mysql.batch 32 (the set-based path; the debug log proves batches formed)
 *     and with mysql.batch 1: the two runs' rows are byte for byte the same.
 *   missing emit field: the message is dead-lettered (non_retryable, idemq-error names the emit
 *     and the field), without a row, a dedup row or its business update — also when its row
 *     would not have moved (state_noop) and for a nested path.
 *   sql handler (emit: at handler level): rows only when every statement succeeded; an
 *     expect_rows mismatch or a missing emit field undoes the message (its ledger insert too)
 *     and writes no row; batched (savepoints) and alone.
 *   plugin (host->emit, tests/support/plugins/emitter.c): the plugin's biz_key is replaced by the
 *     derived one; a plugin that emits and then returns IDEMQ_NON_RETRYABLE or IDEMQ_RETRYABLE
 *     leaves no row, and a refused emit (empty name) dead-letters with host->emit's reason.
 *   kill -9 mid-batch (IDEMQ_TEST_KILL_AFTER_COMMITS, store.h), many times: after every crash
 *     the committed messages have all their rows and nothing else has any; at the end every
 *     message has exactly one row per emit: no row lost, none doubled by a redelivery.
 *   a batch of large emits (36 MiB of rows in one batch): written whole, no lost connection
 *     (the writer's multi-row INSERT stays under max_allowed_packet).
 *
 * With the relay (outbox.relay true, lease 1 s) and a downstream idemq (sql handler, dedup on
 * the derived biz_key; its table has no unique key, so a double apply would show):
 *   kill -9 a thousand times: 5,000 events (200 illegal, 100 missing an emit field), the
 *     upstream killed 1,000 times (IDEMQ_TEST_OUTBOX_KILLS) within a 170 s budget
 *     (IDEMQ_TEST_OUTBOX_BUDGET_S) — after its COMMITs (IDEMQ_TEST_KILL_AFTER_COMMITS), between
 *     the relay's confirm and mark (IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS) and at random moments
 *     — and restarted each time: every committed event's message arrives and is applied once
 *     downstream, none for the dead-lettered ones; every kill between confirm and mark shows as
 *     at least one duplicate the downstream deduplicated. IDEMQ_TEST_OUTBOX_TRACE=1 logs each
 *     cycle. Run with --verbose for the numbers (cr_log_info).
 *   two instances (one config, one work queue, one outbox): both consume, one relays; a SIGTERM
 *     to the leader and later a kill -9 hand the lease over; every row published and applied
 *     once downstream; the duplicates (from the kill) are counted and logged.
 *
 * Assertions are made in the database, the broker and idemq's log; waits are on observable
 * conditions with deadlines. Each test has its own database and queue (harness.h).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <libgen.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "envelope/envelope.h"
#include "harness.h"
#include "outbox/writer.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define HANDLER_NAME "pay-callback"
#define OUT_PROCESSED "\"outcome\":\"processed\""
#define OUT_DEDUPED "\"outcome\":\"deduped\""
#define OUT_STATE_NOOP "\"outcome\":\"state_noop\""
#define OUT_DEAD_LETTERED "\"outcome\":\"dead_lettered\""
#define OUT_RETRIED "\"outcome\":\"retried\""
#define RELAY_OFF "outbox: {relay: false}\n"

static harness_fixture F;

/* The downstream idemq of the relay tests: its own config, queue and log in F's directory and
 * database (handler_name "downstream": its dedup rows never meet the upstream's). */
typedef struct downstream {
    char queue[96];
    char config[320];
    char log[320];
    pid_t pid;
    bool declared;
} downstream;

static downstream D;
static pid_t second; /* a second upstream idemq (two_instances) */

static void teardown(void)
{
    unsetenv("IDEMQ_TEST_KILL_AFTER_COMMITS");
    unsetenv("IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS");
    harness_kill_idemq(&D.pid);
    harness_kill_idemq(&second);
    if (F.ready && D.declared)
        harness_delete_topology(&F.h, D.queue);
    D.declared = false;
    harness_fixture_fini(&F);
}

TestSuite(outbox, .fini = teardown, .timeout = 420);

/* ------------------------------------------------------------------------------ helpers */

static const char *queue_named(const char *suffix)
{
    static char name[4][200];
    static int next;
    char *out = name[next++ % 4];
    snprintf(out, sizeof name[0], "%s%s", F.h.queue, suffix);
    return out;
}

/* The mysql: line with workers, batch and the longest linger (so that messages queued at the
 * start share transactions), and debug logs for the "batch of N messages" lines. */
static void set_mysql(unsigned workers, unsigned batch)
{
    const char *base = getenv("IDEMQ_TEST_MYSQL_URL");
    cr_assert(base, "IDEMQ_TEST_MYSQL_URL is not set");
    const char *path = strchr(base + strlen("mysql://"), '/');
    const char *query = strchr(base, '?');
    cr_assert(path);
    char line[1024];
    snprintf(line, sizeof line,
             "mysql: {url: \"%.*s/%s%s\", workers: %u, batch: %u, batch_linger_ms: 50}",
             (int)(path - base), base, F.h.database, query ? query : "", workers, batch);
    harness_config_replace_line(&F.h, "mysql: ", line);
    harness_config_replace_line(&F.h, "log: ", "log: {level: debug}");
}

static void configure(const harness_options *o, unsigned workers, unsigned batch)
{
    harness_write_config(&F.h, o);
    set_mysql(workers, batch);
}

static void start(void)
{
    harness_start_idemq(&F.h, READY_LINE, DEADLINE_MS, &F.daemon);
}

/* A payment event. currency and customer are the fields only the emits read; amount < 0 leaves
 * amount out. extra (may be NULL) is appended inside the object, e.g. ",\"fail\":true". */
typedef struct event {
    const char *order, *event;
    long amount;
    bool no_currency, no_customer;
    const char *extra;
    const char *biz_key; /* NULL: order_id:ORDER:EVENT */
} event;

static size_t event_body(const event *e, char *body, size_t len)
{
    char key[160];
    if (e->biz_key)
        snprintf(key, sizeof key, "%s", e->biz_key);
    else
        snprintf(key, sizeof key, "order_id:%s:%s", e->order, e->event);
    int n = snprintf(body, len,
                     "{\"message_id\":\"m-%s\",\"biz_key\":\"%s\",\"order_id\":\"%s\","
                     "\"event_type\":\"%s\"",
                     key, key, e->order, e->event);
    if (e->amount >= 0)
        n += snprintf(body + n, len - (size_t)n, ",\"amount\":%ld", e->amount);
    if (!e->no_currency)
        n += snprintf(body + n, len - (size_t)n, ",\"currency\":\"EUR\"");
    if (!e->no_customer)
        n += snprintf(body + n, len - (size_t)n, ",\"customer\":{\"id\":%ld}",
                      e->amount >= 0 ? 1000 + e->amount : 0);
    n += snprintf(body + n, len - (size_t)n, "%s}", e->extra ? e->extra : "");
    cr_assert((size_t)n < len);
    return (size_t)n;
}

/* A list of bodies published in one go (harness_publish_batch: confirms per chunk). */
typedef struct outbox_batch {
    char **bodies;
    size_t *lens;
    size_t count, cap;
} outbox_batch;

static void batch_add_raw(outbox_batch *b, const char *body, size_t len)
{
    if (b->count == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->bodies = realloc(b->bodies, b->cap * sizeof *b->bodies);
        b->lens = realloc(b->lens, b->cap * sizeof *b->lens);
        cr_assert(b->bodies && b->lens);
    }
    b->bodies[b->count] = malloc(len + 1);
    cr_assert(b->bodies[b->count]);
    memcpy(b->bodies[b->count], body, len);
    b->bodies[b->count][len] = '\0';
    b->lens[b->count++] = len;
}

static void batch_add(outbox_batch *b, const event *e)
{
    char body[1024];
    size_t n = event_body(e, body, sizeof body);
    batch_add_raw(b, body, n);
}

static void batch_publish(outbox_batch *b)
{
    harness_publish_batch(&F.h, NULL, "application/json", (const void *const *)b->bodies, b->lens,
                          b->count);
    for (size_t i = 0; i < b->count; i++)
        free(b->bodies[i]);
    free(b->bodies);
    free(b->lens);
    memset(b, 0, sizeof *b);
}

typedef struct lines_wait {
    const char *needle, *also;
    long at_least;
} lines_wait;

static bool lines_reached(harness *h, void *arg)
{
    const lines_wait *w = arg;
    return harness_log_count_both(h->log_path, w->needle, w->also) >= w->at_least;
}

/* Waits until the log has at least at_least lines with needle and also (NULL: any). */
static void wait_lines(const char *needle, const char *also, long at_least)
{
    lines_wait w = {needle, also, at_least};
    cr_assert(harness_wait_for(lines_reached, &F.h, &w, DEADLINE_MS),
              "fewer than %ld log lines with %s and %s", at_least, needle, also ? also : "");
}

static long long scalar(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static long long scalar(const char *fmt, ...)
{
    char sql[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    return harness_scalar(&F.h, "%s", sql);
}

/* ----------------------------------------------------------------------- the outbox rows */

/* Every row of idemq_outbox, ordered by (source_biz_key, emit_name), as a JSON array of objects
 * {source, handler, emit, biz_key, exchange, routing_key, content_type, body_hex, body (the body
 * as a downstream idemq decodes it), state, attempts, published}. Owned. */
static json_t *load_rows(void)
{
    MYSQL *db = F.h.db;
    cr_assert(mysql_query(db, "SELECT source_biz_key, handler_name, emit_name, biz_key, exchange, "
                              "routing_key, content_type, body, state, attempts, "
                              "published_at IS NOT NULL FROM idemq_outbox "
                              "ORDER BY source_biz_key, emit_name, id") == 0,
              "%s", mysql_error(db));
    MYSQL_RES *res = mysql_store_result(db);
    cr_assert(res);
    json_t *rows = json_array();
    MYSQL_ROW r;
    static const char *const names[] = {"source",   "handler",     "emit",        "biz_key",
                                        "exchange", "routing_key", "content_type"};
    while ((r = mysql_fetch_row(res))) {
        unsigned long *len = mysql_fetch_lengths(res);
        json_t *row = json_object();
        for (int c = 0; c < 7; c++)
            json_object_set_new(row, names[c], json_stringn(r[c], len[c]));
        char *hex = malloc(2 * len[7] + 1);
        cr_assert(hex);
        for (unsigned long i = 0; i < len[7]; i++)
            sprintf(hex + 2 * i, "%02x", (unsigned char)r[7][i]);
        hex[2 * len[7]] = '\0';
        json_object_set_new(row, "body_hex", json_string(hex));
        free(hex);
        envelope env = {0};
        char err[256];
        int rc = envelope_decode(r[7], len[7], r[6], NULL, &env, err, sizeof err);
        cr_assert_eq(rc, 0, "row of %s/%s: a downstream idemq refuses its body: %s", r[0], r[2],
                     err);
        json_object_set(row, "body", env.root);
        cr_assert_str_eq(env.biz_key, r[3], "the body's biz_key is the row's");
        envelope_close(&env);
        json_object_set_new(row, "state", json_integer(atoll(r[8])));
        json_object_set_new(row, "attempts", json_integer(atoll(r[9])));
        json_object_set_new(row, "published", json_integer(atoll(r[10])));
        json_array_append_new(rows, row);
    }
    mysql_free_result(res);
    return rows;
}

/* The rows as text without what may differ between two runs (nothing should): for comparing
 * runs byte for byte. Owned. */
static char *rows_text(const json_t *rows)
{
    json_t *copy = json_deep_copy(rows);
    size_t i;
    json_t *row;
    json_array_foreach(copy, i, row) json_object_del(row, "body");
    char *text = json_dumps(copy, JSON_SORT_KEYS | JSON_INDENT(1));
    json_decref(copy);
    return text;
}

static const char *str_of(const json_t *row, const char *key)
{
    const char *s = json_string_value(json_object_get(row, key));
    return s ? s : "(none)";
}

/* One expected row: its source biz_key, emit name, target and body (the fields, without
 * biz_key: the derived one is added here). */
typedef struct want_row {
    char source[160];
    char emit[65];
    char exchange[256];
    char routing_key[256];
    const char *content_type;
    json_t *fields; /* owned */
} want_row;

typedef struct want_rows {
    want_row *at;
    size_t count, cap;
} want_rows;

static void want(want_rows *w, const char *source, const char *emit, const char *exchange,
                 const char *routing_key, const char *content_type, json_t *fields)
{
    if (w->count == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->at = realloc(w->at, w->cap * sizeof *w->at);
        cr_assert(w->at);
    }
    want_row *r = &w->at[w->count++];
    snprintf(r->source, sizeof r->source, "%s", source);
    snprintf(r->emit, sizeof r->emit, "%s", emit);
    snprintf(r->exchange, sizeof r->exchange, "%s", exchange);
    snprintf(r->routing_key, sizeof r->routing_key, "%s", routing_key);
    r->content_type = content_type;
    r->fields = fields;
}

static int want_cmp(const void *a, const void *b)
{
    const want_row *x = a, *y = b;
    int c = strcmp(x->source, y->source);
    return c ? c : strcmp(x->emit, y->emit);
}

/* The rows are exactly w (in any order), each pending and never tried (the relay is off). */
static void expect_rows(json_t *rows, want_rows *w)
{
    qsort(w->at, w->count, sizeof *w->at, want_cmp);
    size_t n = json_array_size(rows);
    for (size_t i = 0; i < n && i < w->count; i++) {
        const json_t *row = json_array_get(rows, i);
        const want_row *x = &w->at[i];
        cr_assert_str_eq(str_of(row, "source"), x->source, "row %zu: source (emit %s)", i,
                         str_of(row, "emit"));
        cr_assert_str_eq(str_of(row, "emit"), x->emit, "row %zu of %s: emit", i, x->source);
        char key[OUTBOX_KEY_LEN + 1];
        outbox_derive_key(x->source, HANDLER_NAME, x->emit, key);
        cr_expect_str_eq(str_of(row, "handler"), HANDLER_NAME);
        cr_expect_str_eq(str_of(row, "biz_key"), key, "%s/%s: biz_key", x->source, x->emit);
        cr_expect_str_eq(str_of(row, "exchange"), x->exchange, "%s/%s", x->source, x->emit);
        cr_expect_str_eq(str_of(row, "routing_key"), x->routing_key, "%s/%s", x->source, x->emit);
        cr_expect_str_eq(str_of(row, "content_type"), x->content_type, "%s/%s", x->source, x->emit);
        json_t *body = json_deep_copy(x->fields);
        json_object_set_new(body, "biz_key", json_string(key));
        char *got = json_dumps(json_object_get(row, "body"), JSON_SORT_KEYS);
        char *exp = json_dumps(body, JSON_SORT_KEYS);
        cr_expect(json_equal(json_object_get(row, "body"), body),
                  "%s/%s body\n  got  %s\n  want %s", x->source, x->emit, got, exp);
        free(got);
        free(exp);
        json_decref(body);
        cr_expect_eq(json_integer_value(json_object_get(row, "state")), 0,
                     "%s/%s: pending (relay: false)", x->source, x->emit);
        cr_expect_eq(json_integer_value(json_object_get(row, "attempts")), 0);
        cr_expect_eq(json_integer_value(json_object_get(row, "published")), 0);
    }
    cr_assert_eq(n, w->count, "%zu outbox rows, expected %zu", n, w->count);
}

static void free_want(want_rows *w)
{
    for (size_t i = 0; i < w->count; i++)
        json_decref(w->at[i].fields);
    free(w->at);
    memset(w, 0, sizeof *w);
}

static json_t *fields(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static json_t *fields(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    json_error_t jerr;
    json_t *v = json_loads(text, 0, &jerr);
    cr_assert(v, "%s: %s", text, jerr.text);
    return v;
}

/* ------------------------------------------------------------------------ dead letters */

/* Takes every message of the DLQ: an object biz_key → idemq-error (biz_key "?" when the body
 * does not decode; the class must be non_retryable, or retries_exhausted when allowed). */
static json_t *drain_dlq(bool allow_exhausted)
{
    json_t *out = json_object();
    amqp_message_t m;
    while (harness_get(&F.h, queue_named(".dlq"), &m)) {
        amqp_bytes_t v;
        char cls[64] = "", reason[1024] = "";
        if (message_header_bytes(&m.properties, HEADER_ERROR_CLASS, &v))
            snprintf(cls, sizeof cls, "%.*s", (int)v.len, (const char *)v.bytes);
        if (message_header_bytes(&m.properties, HEADER_ERROR, &v))
            snprintf(reason, sizeof reason, "%.*s", (int)v.len, (const char *)v.bytes);
        cr_expect(!strcmp(cls, "non_retryable") ||
                      (allow_exhausted && !strcmp(cls, "retries_exhausted")),
                  "dead letter class %s (%s)", cls, reason);
        json_t *body = json_loadb(m.body.bytes, m.body.len, 0, NULL);
        const char *key = json_string_value(json_object_get(body, "biz_key"));
        json_object_set_new(out, key ? key : "?", json_string(reason));
        json_decref(body);
        amqp_destroy_message(&m);
    }
    return out;
}

static void expect_dead_letter(const json_t *dlq, const char *biz_key, const char *reason_has)
{
    const char *reason = json_string_value(json_object_get(dlq, biz_key));
    cr_assert(reason, "%s was not dead-lettered", biz_key);
    if (reason_has)
        cr_expect(strstr(reason, reason_has) != NULL, "%s: idemq-error \"%s\" lacks \"%s\"",
                  biz_key, reason, reason_has);
}

/* ------------------------------------------------------------------ state machine emits */

static char sm_handler[4096];

/* PAY_SUCCESS emits two (default exchange + JSON, amq.topic + MessagePack), REFUND_SUCCESS one,
 * REFUND_START none. */
static const char *state_machine_with_emits(void)
{
    snprintf(sm_handler, sizeof sm_handler,
             "      type: state_machine\n"
             "      table: orders\n"
             "      key_column: order_id\n"
             "      key_field: order_id\n"
             "      state_column: status\n"
             "      event_field: event_type\n"
             "      on_illegal: dead_letter\n"
             "      transitions:\n"
             "        PAY_SUCCESS:\n"
             "          from: [PAYING]\n"
             "          to: PAID\n"
             "          emit:\n"
             "            - name: paid\n"
             "              routing_key: \"%s\"\n"
             "              fields:\n"
             "                order_id: order_id\n"
             "                amount: amount\n"
             "                currency: currency\n"
             "                customer: customer.id\n"
             "                source: {value: payments}\n"
             "                version: {value: 2}\n"
             "            - name: paid-mp\n"
             "              exchange: amq.topic\n"
             "              routing_key: payments.paid\n"
             "              content_type: msgpack\n"
             "              fields: {order: order_id, cents: amount}\n"
             "        REFUND_START: {from: [PAID], to: REFUNDING}\n"
             "        REFUND_SUCCESS:\n"
             "          from: [REFUNDING]\n"
             "          to: REFUNDED\n"
             "          emit: {name: refunded, routing_key: \"%s\", fields: {order_id: order_id}}\n"
             "      set: {amount: amount}\n",
             queue_named(".paid"), queue_named(".refunded"));
    return sm_handler;
}

static void want_paid(want_rows *w, const char *order, long amount)
{
    char source[128];
    snprintf(source, sizeof source, "order_id:%s:PAY_SUCCESS", order);
    want(w, source, "paid", "", queue_named(".paid"), OUTBOX_CONTENT_TYPE_JSON,
         fields("{\"order_id\":\"%s\",\"amount\":%ld,\"currency\":\"EUR\",\"customer\":%ld,"
                "\"source\":\"payments\",\"version\":2}",
                order, amount, 1000 + amount));
    want(w, source, "paid-mp", "amq.topic", "payments.paid", OUTBOX_CONTENT_TYPE_MSGPACK,
         fields("{\"order\":\"%s\",\"cents\":%ld}", order, amount));
}

#define SM_APPLIED 60 /* a0..a59 PAY_SUCCESS */
#define SM_SEQ 5      /* s0..s4: PAY_SUCCESS, REFUND_START, REFUND_SUCCESS */

/* The orders of the scenario, fresh. */
static void sm_orders(void)
{
    harness_sql(&F.h, "DELETE FROM orders");
    harness_insert_orders(&F.h, "a", SM_APPLIED, "PAYING");
    harness_insert_orders(&F.h, "n", 5, "PAID");
    harness_insert_orders(&F.h, "i", 5, "PAYING");
    harness_insert_orders(&F.h, "r", 3, "PAID");
    harness_insert_orders(&F.h, "s", SM_SEQ, "PAYING");
    harness_insert_orders(&F.h, "x", 2, "PAYING");
    harness_insert_orders(&F.h, "xn", 1, "PAID");
    harness_insert_orders(&F.h, "d", 2, "PAYING");
}

/* Everything at once, before idemq starts (so that batches form). */
static void sm_publish(void)
{
    outbox_batch b = {0};
    char id[16];
    for (int i = 0; i < SM_APPLIED; i++) {
        snprintf(id, sizeof id, "a%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = 100 + i});
    }
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "a%d", i); /* the second copy: deduped, its amount never used */
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = 999});
        snprintf(id, sizeof id, "n%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = 50});
        snprintf(id, sizeof id, "i%d", i);
        batch_add(&b, &(event){.order = id, .event = "REFUND_SUCCESS", .amount = 60});
    }
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof id, "r%d", i);
        batch_add(&b, &(event){.order = id, .event = "REFUND_START", .amount = 70});
    }
    for (int i = 0; i < SM_SEQ; i++) {
        snprintf(id, sizeof id, "s%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = 300 + i});
        batch_add(&b, &(event){.order = id, .event = "REFUND_START", .amount = 400 + i});
        batch_add(&b, &(event){.order = id, .event = "REFUND_SUCCESS", .amount = 500 + i});
    }
    batch_add(&b,
              &(event){.order = "x0", .event = "PAY_SUCCESS", .amount = 80, .no_currency = true});
    batch_add(&b,
              &(event){.order = "x1", .event = "PAY_SUCCESS", .amount = 81, .no_customer = true});
    batch_add(&b, &(event){.order = "xn0",
                           .event = "PAY_SUCCESS",
                           .amount = 82,
                           .no_currency = true}); /* already PAID */
    batch_add(&b, &(event){.order = "m0",
                           .event = "PAY_SUCCESS",
                           .amount = 90}); /* no order row yet: retried */
    /* Two events of one order in one batch: the second runs alone after the batch's UPDATE
     * (illegal for d0, a state_noop for d1): neither writes a row. */
    batch_add(&b, &(event){.order = "d0", .event = "PAY_SUCCESS", .amount = 91});
    batch_add(&b, &(event){.order = "d0", .event = "REFUND_SUCCESS", .amount = 92});
    batch_add(&b, &(event){.order = "d1", .event = "PAY_SUCCESS", .amount = 93});
    batch_add(&b, &(event){.order = "d1",
                           .event = "PAY_SUCCESS",
                           .amount = 94,
                           .biz_key = "order_id:d1:PAY_SUCCESS:again"});
    batch_add_raw(&b, "not json", 8);
    static const char nokey[] = "{\"biz_key\":\"nokey\",\"event_type\":\"PAY_SUCCESS\"}";
    batch_add_raw(&b, nokey, sizeof nokey - 1);
    batch_publish(&b);
}

#define SM_DEDUP_ROWS (SM_APPLIED + 5 + 3 + 3 * SM_SEQ + 1 + 3)
#define SM_PROCESSED (SM_APPLIED + 3 + 3 * SM_SEQ + 1 + 2)
#define SM_DEAD_LETTERS (5 + 3 + 2 + 1)

/* Runs the scenario on a fresh idemq and returns its rows (owned), checked against the model. */
static json_t *sm_run(unsigned batch)
{
    harness_options o = {.handler_yaml = state_machine_with_emits(), .top_yaml = RELAY_OFF};
    configure(&o, 1, batch);
    sm_orders();
    long processed0 = harness_log_count(&F.h, OUT_PROCESSED);
    long noop0 = harness_log_count(&F.h, OUT_STATE_NOOP);
    long deduped0 = harness_log_count(&F.h, OUT_DEDUPED);
    long retried0 = harness_log_count_both(F.h.log_path, "order_id:m0:PAY_SUCCESS", OUT_RETRIED);
    sm_publish();
    start();

    /* m0's order does not exist yet: it is retried (no row), then applies once it does. */
    wait_lines("order_id:m0:PAY_SUCCESS", OUT_RETRIED, retried0 + 1);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox WHERE source_biz_key = "
                        "'order_id:m0:PAY_SUCCESS'"),
                 0, "a retried message writes no row");
    harness_insert_orders(&F.h, "m", 1, "PAYING");

    cr_assert(
        harness_wait_scalar(&F.h, SM_DEDUP_ROWS, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_queue_depth(&F.h, queue_named(".dlq"), SM_DEAD_LETTERS, DEADLINE_MS));
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, OUT_PROCESSED, processed0 + SM_PROCESSED, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    cr_assert_eq(harness_log_count(&F.h, OUT_PROCESSED), processed0 + SM_PROCESSED);
    cr_expect_eq(harness_log_count(&F.h, OUT_STATE_NOOP), noop0 + 5 + 1);
    cr_expect_eq(harness_log_count(&F.h, OUT_DEDUPED), deduped0 + 5);

    /* The business updates: applied ones moved, the dead-lettered ones did not. */
    cr_expect_eq(scalar("SELECT COUNT(*) FROM orders WHERE order_id LIKE 'a%%' AND status = 'PAID' "
                        "AND amount = 100 + CAST(SUBSTRING(order_id, 2) AS SIGNED)"),
                 SM_APPLIED, "one effect per order, the first copy's amount");
    cr_expect_eq(scalar("SELECT COUNT(*) FROM orders WHERE order_id LIKE 's%%' AND status = "
                        "'REFUNDED'"),
                 SM_SEQ);
    cr_expect_eq(scalar("SELECT COUNT(*) FROM orders WHERE order_id IN ('x0', 'x1') AND status = "
                        "'PAYING' AND amount IS NULL"),
                 2, "a message with a missing emit field changes nothing");
    cr_expect_eq(scalar("SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE 'order_id:x%%'"), 0,
                 "and leaves no dedup row");

    json_t *dlq = drain_dlq(false);
    cr_expect_eq(json_object_size(dlq), SM_DEAD_LETTERS, "dead letters by biz_key");
    for (int i = 0; i < 5; i++) {
        char key[64];
        snprintf(key, sizeof key, "order_id:i%d:REFUND_SUCCESS", i);
        expect_dead_letter(dlq, key, NULL);
    }
    expect_dead_letter(dlq, "order_id:x0:PAY_SUCCESS",
                       "emit paid: the message has no field 'currency'");
    expect_dead_letter(dlq, "order_id:x1:PAY_SUCCESS",
                       "emit paid: the message has no field 'customer.id'");
    expect_dead_letter(dlq, "order_id:xn0:PAY_SUCCESS",
                       "emit paid: the message has no field 'currency'");
    expect_dead_letter(dlq, "order_id:d0:REFUND_SUCCESS", NULL);
    expect_dead_letter(dlq, "nokey", NULL);
    expect_dead_letter(dlq, "?", NULL); /* "not json" */
    json_decref(dlq);

    want_rows w = {0};
    char id[16];
    for (int i = 0; i < SM_APPLIED; i++) {
        snprintf(id, sizeof id, "a%d", i);
        want_paid(&w, id, 100 + i);
    }
    for (int i = 0; i < SM_SEQ; i++) {
        snprintf(id, sizeof id, "s%d", i);
        want_paid(&w, id, 300 + i);
        char source[64];
        snprintf(source, sizeof source, "order_id:%s:REFUND_SUCCESS", id);
        want(&w, source, "refunded", "", queue_named(".refunded"), OUTBOX_CONTENT_TYPE_JSON,
             fields("{\"order_id\":\"%s\"}", id));
    }
    want_paid(&w, "m0", 90);
    want_paid(&w, "d0", 91);
    want_paid(&w, "d1", 93);
    json_t *rows = load_rows();
    expect_rows(rows, &w);
    free_want(&w);
    return rows;
}

Test(outbox, state_machine_rows_only_for_applied_messages_the_same_batched_and_alone)
{
    harness_fixture_init(&F, "outbox_sm", NULL);
    harness_declare_topology(&F.h);

    json_t *batched = sm_run(32);
    long batches = harness_log_count(&F.h, "messages: one COMMIT");
    cr_assert_geq(batches, 1, "mysql.batch 32 put no two messages in one transaction");

    /* Again from scratch, one message per transaction. */
    harness_sql(&F.h, "DELETE FROM idemq_outbox");
    harness_sql(&F.h, "DELETE FROM msg_dedup");
    json_t *alone = sm_run(1);
    cr_assert_eq(harness_log_count(&F.h, "messages: one COMMIT"), batches,
                 "mysql.batch 1 formed a batch");

    char *a = rows_text(batched), *b = rows_text(alone);
    cr_expect_str_eq(a, b, "the batched and the lone run wrote different rows");
    free(a);
    free(b);
    json_decref(batched);
    json_decref(alone);
}

/* --------------------------------------------------------------------- sql handler emits */

static char sql_handler[4096];

static const char *sql_with_emits(void)
{
    snprintf(
        sql_handler, sizeof sql_handler,
        "      type: sql\n"
        "      statements:\n"
        "        - sql: \"INSERT INTO ledger (order_id, amount) VALUES (:order_id, :amount)\"\n"
        "        - sql: \"UPDATE orders SET status = 'PAID' WHERE order_id = :order_id AND "
        "status = 'PAYING'\"\n"
        "          expect_rows: 1\n"
        "      emit:\n"
        "        - name: ledger\n"
        "          routing_key: \"%s\"\n"
        "          fields: {order_id: order_id, amount: amount, currency: currency}\n"
        "        - name: ledger-mp\n"
        "          exchange: amq.direct\n"
        "          routing_key: ledger\n"
        "          content_type: msgpack\n"
        "          fields: {id: order_id, origin: {value: {handler: sql, n: [1, 2]}}}\n",
        queue_named(".ledger"));
    return sql_handler;
}

#define SQL_OK 20

static void sql_emits(const char *name, unsigned batch)
{
    harness_fixture_init(&F, name, NULL);
    harness_options o = {.handler_yaml = sql_with_emits(), .top_yaml = RELAY_OFF};
    configure(&o, 1, batch);
    harness_sql(&F.h, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id "
                      "VARCHAR(64) NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB");
    harness_insert_orders(&F.h, "ok", SQL_OK, "PAYING");
    harness_insert_orders(&F.h, "paid", 1, "PAID"); /* expect_rows fails after the insert ran */
    harness_insert_orders(&F.h, "x", 1, "PAYING");  /* statements fine, the emit's field missing */
    harness_declare_topology(&F.h);
    outbox_batch b = {0};
    char id[16];
    for (int i = 0; i < SQL_OK; i++) {
        snprintf(id, sizeof id, "ok%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = 10 + i});
        if (i == SQL_OK / 2) {
            batch_add(&b, &(event){.order = "paid0", .event = "PAY_SUCCESS", .amount = 7});
            batch_add(
                &b,
                &(event){.order = "x0", .event = "PAY_SUCCESS", .amount = 8, .no_currency = true});
            batch_add(&b, &(event){.order = "ok0",
                                   .event = "PAY_SUCCESS",
                                   .amount = 999}); /* a copy: deduped */
        }
    }
    batch_publish(&b);
    start();
    cr_assert(harness_wait_scalar(&F.h, SQL_OK, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_queue_depth(&F.h, queue_named(".dlq"), 2, DEADLINE_MS));
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, OUT_PROCESSED, SQL_OK, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, OUT_DEDUPED, 1, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    if (batch > 1)
        cr_expect_geq(harness_log_count(&F.h, "messages: one COMMIT"), 1, "no batch formed");

    json_t *dlq = drain_dlq(false);
    expect_dead_letter(dlq, "order_id:paid0:PAY_SUCCESS", NULL);
    expect_dead_letter(dlq, "order_id:x0:PAY_SUCCESS",
                       "emit ledger: the message has no field 'currency'");
    json_decref(dlq);
    cr_expect_eq(scalar("SELECT COUNT(*) FROM ledger"), SQL_OK,
                 "the failed messages' ledger inserts were undone");
    cr_expect_eq(scalar("SELECT COUNT(*) FROM ledger WHERE order_id IN ('paid0', 'x0')"), 0);
    cr_expect_eq(scalar("SELECT COUNT(*) FROM orders WHERE order_id = 'x0' AND status = 'PAYING'"),
                 1);

    want_rows w = {0};
    for (int i = 0; i < SQL_OK; i++) {
        char source[64];
        snprintf(id, sizeof id, "ok%d", i);
        snprintf(source, sizeof source, "order_id:%s:PAY_SUCCESS", id);
        want(&w, source, "ledger", "", queue_named(".ledger"), OUTBOX_CONTENT_TYPE_JSON,
             fields("{\"order_id\":\"%s\",\"amount\":%d,\"currency\":\"EUR\"}", id, 10 + i));
        want(&w, source, "ledger-mp", "amq.direct", "ledger", OUTBOX_CONTENT_TYPE_MSGPACK,
             fields("{\"id\":\"%s\",\"origin\":{\"handler\":\"sql\",\"n\":[1,2]}}", id));
    }
    json_t *rows = load_rows();
    expect_rows(rows, &w);
    json_decref(rows);
    free_want(&w);
}

Test(outbox, sql_handler_rows_only_when_every_statement_succeeded_batched)
{
    sql_emits("outbox_sql_batched", 32);
}

Test(outbox, sql_handler_rows_only_when_every_statement_succeeded_alone)
{
    sql_emits("outbox_sql_alone", 1);
}

/* -------------------------------------------------------------------- a plugin's host->emit */

static char plugin_path[1024];

/* build/tests/plugins/emitter.so, next to the idemq binary the harness runs. */
static const char *emitter_plugin(void)
{
    char bin[1024];
    snprintf(bin, sizeof bin, "%s", IDEMQ_BINARY);
    snprintf(plugin_path, sizeof plugin_path, "%s/tests/plugins/emitter.so", dirname(bin));
    cr_assert(access(plugin_path, R_OK) == 0,
              "%s is missing: build the tests (CMakeLists.txt builds tests/support/plugins)",
              plugin_path);
    return plugin_path;
}

#define PLUGIN_OK 10
#define PLUGIN_MP 3

static void plugin_emits(const char *name, unsigned batch)
{
    static char handler[2048];
    harness_fixture_init(&F, name, NULL);
    snprintf(handler, sizeof handler,
             "      type: plugin\n"
             "      path: \"%s\"\n"
             "      config: {routing_key: \"%s\"}\n",
             emitter_plugin(), queue_named(".plugin"));
    harness_options o = {.handler_yaml = handler,
                         .top_yaml = RELAY_OFF,
                         .retry_set = true,
                         .max_retries = 1,
                         .base = "100ms",
                         .jitter = "0"};
    configure(&o, 1, batch);
    harness_sql(&F.h, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key "
                      "VARBINARY(128) NOT NULL, order_id VARCHAR(64) NOT NULL, amount BIGINT NOT "
                      "NULL) ENGINE=InnoDB");
    harness_declare_topology(&F.h);
    outbox_batch b = {0};
    char id[16];
    for (int i = 0; i < PLUGIN_OK; i++) {
        snprintf(id, sizeof id, "p%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY", .amount = 10 + i});
        if (i == 3) {
            batch_add(
                &b,
                &(event){.order = "pf0", .event = "PAY", .amount = 1, .extra = ",\"fail\":true"});
            batch_add(
                &b,
                &(event){.order = "pr0", .event = "PAY", .amount = 2, .extra = ",\"retry\":true"});
            batch_add(&b, &(event){.order = "pb0",
                                   .event = "PAY",
                                   .amount = 3,
                                   .extra = ",\"bad_emit\":true"});
            batch_add(&b,
                      &(event){.order = "p0", .event = "PAY", .amount = 999}); /* a copy: deduped */
        }
    }
    for (int i = 0; i < PLUGIN_MP; i++) {
        snprintf(id, sizeof id, "pm%d", i);
        batch_add(&b,
                  &(event){.order = id, .event = "PAY", .amount = 50 + i, .extra = ",\"mp\":true"});
    }
    batch_publish(&b);
    start();
    cr_assert(harness_wait_scalar(&F.h, PLUGIN_OK + PLUGIN_MP, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM msg_dedup"));
    /* pf0 and pb0 at once, pr0 after its one retry */
    cr_assert(harness_wait_queue_depth(&F.h, queue_named(".dlq"), 3, DEADLINE_MS));
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, OUT_PROCESSED, PLUGIN_OK + PLUGIN_MP, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    cr_expect_geq(harness_log_count_both(F.h.log_path, "order_id:pr0:PAY", OUT_RETRIED), 1,
                  "pr0 was retried before it was dead-lettered");
    if (batch > 1)
        cr_expect_geq(harness_log_count(&F.h, "messages: one COMMIT"), 1, "no batch formed");

    json_t *dlq = drain_dlq(true);
    expect_dead_letter(dlq, "order_id:pf0:PAY", "asked to fail after emitting");
    expect_dead_letter(dlq, "order_id:pr0:PAY", "asked to retry after emitting");
    expect_dead_letter(dlq, "order_id:pb0:PAY", "the name must be 1 to 64 bytes");
    json_decref(dlq);
    cr_expect_eq(scalar("SELECT COUNT(*) FROM ledger"), PLUGIN_OK + PLUGIN_MP,
                 "one ledger row per applied message, none for the failed ones");

    want_rows w = {0};
    for (int i = 0; i < PLUGIN_OK + PLUGIN_MP; i++) {
        bool mp = i >= PLUGIN_OK;
        char source[64];
        snprintf(id, sizeof id, mp ? "pm%d" : "p%d", mp ? i - PLUGIN_OK : i);
        snprintf(source, sizeof source, "order_id:%s:PAY", id);
        /* the plugin's own "biz_key" replaced by the derived one (want adds it) */
        want(&w, source, "plugin.paid", "", queue_named(".plugin"),
             mp ? OUTBOX_CONTENT_TYPE_MSGPACK : OUTBOX_CONTENT_TYPE_JSON,
             fields("{\"order_id\":\"%s\",\"amount\":%d,\"via\":\"emitter\"}", id,
                    mp ? 50 + i - PLUGIN_OK : 10 + i));
    }
    json_t *rows = load_rows();
    expect_rows(rows, &w);
    json_decref(rows);
    free_want(&w);
}

Test(outbox, plugin_rows_only_when_handle_returns_ok_batched)
{
    plugin_emits("outbox_plugin_batched", 32);
}

Test(outbox, plugin_rows_only_when_handle_returns_ok_alone)
{
    plugin_emits("outbox_plugin_alone", 1);
}

/* ------------------------------------------------------------------ large emits in one batch */

#define LARGE_MESSAGES 12
#define LARGE_BLOB (3 * 1024 * 1024) /* under amqp.max_body (4 MiB here): 12 of them 36 MiB */

Test(outbox, a_batch_of_large_emits_is_written_whole)
{
    harness_fixture_init(&F, "outbox_large", NULL);
    static char handler[2048];
    snprintf(handler, sizeof handler,
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
             "          emit: {name: large, routing_key: \"%s\", fields: {blob: blob}}\n",
             queue_named(".large"));
    harness_options o = {.handler_yaml = handler, .top_yaml = RELAY_OFF};
    configure(&o, 1, 32);
    char amqp[512];
    snprintf(amqp, sizeof amqp, "amqp: {url: \"%s\", prefetch: 64, heartbeat: 10s, max_body: 4MiB}",
             getenv("IDEMQ_TEST_AMQP_URL"));
    harness_config_replace_line(&F.h, "amqp: ", amqp);
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "g", LARGE_MESSAGES, "PAYING");
    outbox_batch b = {0};
    char *body = malloc(LARGE_BLOB + 256);
    cr_assert(body);
    for (int i = 0; i < LARGE_MESSAGES; i++) {
        int n = sprintf(body,
                        "{\"biz_key\":\"order_id:g%d:PAY_SUCCESS\",\"order_id\":\"g%d\","
                        "\"event_type\":\"PAY_SUCCESS\",\"blob\":\"",
                        i, i);
        memset(body + n, 'a' + i % 26, LARGE_BLOB);
        n += LARGE_BLOB;
        n += sprintf(body + n, "\"}");
        batch_add_raw(&b, body, (size_t)n);
    }
    free(body);
    batch_publish(&b);
    start();
    cr_assert(harness_wait_scalar(&F.h, LARGE_MESSAGES, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM idemq_outbox"));
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, OUT_PROCESSED, LARGE_MESSAGES, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    cr_expect_geq(harness_log_count(&F.h, "messages: one COMMIT"), 1, "no batch formed");
    cr_expect_eq(harness_log_count(&F.h, OUT_RETRIED), 0);
    cr_expect_eq(harness_log_count(&F.h, "\"outcome\":\"held\""), 0,
                 "the batch's INSERT lost the connection");
    cr_expect_eq(scalar("SELECT COUNT(*) FROM idemq_outbox WHERE LENGTH(body) > %d", LARGE_BLOB),
                 LARGE_MESSAGES);
    cr_expect_eq(scalar("SELECT COUNT(DISTINCT source_biz_key) FROM idemq_outbox"), LARGE_MESSAGES);
}

/* ------------------------------------------------------------------------- kill -9 mid-batch */

#define KILL_MESSAGES 300

/* Every committed message (a dedup row) has both its rows, and no row is anyone else's or twice
 * there. */
static void expect_rows_match_commits(const char *when)
{
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox"),
                 2 * scalar("SELECT COUNT(*) FROM msg_dedup"), "%s: two rows per commit", when);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM msg_dedup d WHERE (SELECT COUNT(*) FROM idemq_outbox "
                        "o WHERE o.source_biz_key = d.biz_key) <> 2"),
                 0, "%s: a committed message without both its rows", when);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM (SELECT source_biz_key, emit_name FROM idemq_outbox "
                        "GROUP BY source_biz_key, emit_name HAVING COUNT(*) > 1) t"),
                 0, "%s: a row twice", when);
}

/* The kill-after-commit rounds: idemq exited (status: its wait status), or it applied every
 * message and the work queue is empty (done). */
typedef struct end_wait {
    int status; /* -1 while it runs */
    bool done;
} end_wait;

static bool ended_or_done(harness *h, void *arg)
{
    end_wait *w = arg;
    if ((w->status = harness_wait_exit(F.daemon, 0)) != -1)
        return true;
    w->done = scalar("SELECT COUNT(*) FROM msg_dedup") == KILL_MESSAGES &&
              harness_queue_depth(h, h->queue) == 0;
    return w->done;
}
Test(outbox, kill_9_mid_batch_again_and_again_loses_and_doubles_no_row)
{
    harness_fixture_init(&F, "outbox_kill", NULL);
    harness_options o = {.handler_yaml = state_machine_with_emits(), .top_yaml = RELAY_OFF};
    configure(&o, 2, 16);
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "k", KILL_MESSAGES, "PAYING");
    outbox_batch b = {0};
    for (int i = 0; i < KILL_MESSAGES; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = i});
    }
    batch_publish(&b);

    unsigned seed = (unsigned)getpid();
    int kills = 0;
    int64_t t0 = harness_now_ms();
    for (int round = 0; round < 100; round++) {
        char n[8];
        snprintf(n, sizeof n, "%d", 1 + (int)(rand_r(&seed) % 3));
        setenv("IDEMQ_TEST_KILL_AFTER_COMMITS", n, 1);
        start();
        unsetenv("IDEMQ_TEST_KILL_AFTER_COMMITS");
        /* Either it kills itself after the N-th batch's COMMIT, or it finishes first (the last
         * messages may come one at a time: no batch, no kill). */
        end_wait w = {.status = -1};
        harness_wait_for(ended_or_done, &F.h, &w, DEADLINE_MS);
        if (w.done)
            break;
        int status = w.status;
        cr_assert(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "round %d: idemq neither finished nor killed itself", round);
        F.daemon = 0;
        kills++;
        char when[32];
        snprintf(when, sizeof when, "after kill %d", kills);
        expect_rows_match_commits(when);
    }
    cr_assert_geq(kills, 3, "only %d kills: the test did not test much", kills);
    /* Every message has committed, but the last idemq may still kill itself after a batch of
     * redelivered duplicates: stop it whichever way it ends, and let a clean one settle what is
     * left in the queue. */
    if (F.daemon > 0) {
        int rc = harness_stop(F.daemon, SIGTERM, 30000);
        cr_assert(rc == 0 || rc == 128 + SIGKILL, "the last killed run exited with %d", rc);
        F.daemon = 0;
    }
    expect_rows_match_commits("before the clean run");
    start();
    cr_assert(harness_wait_queue_depth(&F.h, F.h.queue, 0, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    cr_assert_eq(harness_queue_depth(&F.h, F.h.queue), 0);
    cr_log_info("kill -9: %d kills over %d messages in %lld ms", kills, KILL_MESSAGES,
                (long long)(harness_now_ms() - t0));

    expect_rows_match_commits("at the end");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM msg_dedup"), KILL_MESSAGES);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), KILL_MESSAGES);
    /* The killed batches' redeliveries were deduped (no second row), and their rows are the
     * first delivery's. */
    cr_assert_geq(harness_log_count(&F.h, OUT_DEDUPED), kills);
    want_rows w = {0};
    for (int i = 0; i < KILL_MESSAGES; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        want_paid(&w, id, i);
    }
    json_t *rows = load_rows();
    expect_rows(rows, &w);
    json_decref(rows);
    free_want(&w);
}

/* ======================================================================= phase 2: the relay
 *
 * The relay on (outbox.relay true, a 1 s lease so that a killed leader's lease lapses fast) and
 * a downstream idemq consuming what it publishes, with its own sql handler and dedup on the
 * derived biz_key (the message_id and the body's biz_key). The downstream table has no unique
 * key: a message applied twice shows as two rows. */

#define RELAY_ON "outbox: {relay: true, poll_interval: 50ms, lease: 1s, retention: 1h}\n"
#define RELAY_KILL_LINE "killing the process after the confirms"

/* F's queue and config path trade places with the downstream's: the harness's config writer,
 * topology and spawn then act on the downstream. Call it again to swap back. */
static void swap_downstream(void)
{
    char q[sizeof D.queue], c[sizeof D.config];
    _Static_assert(sizeof D.queue == sizeof F.h.queue, "queue names trade places");
    _Static_assert(sizeof D.config == sizeof F.h.config_path, "config paths trade places");
    memcpy(q, F.h.queue, sizeof q);
    memcpy(F.h.queue, D.queue, sizeof q);
    memcpy(D.queue, q, sizeof q);
    memcpy(c, F.h.config_path, sizeof c);
    memcpy(F.h.config_path, D.config, sizeof c);
    memcpy(D.config, c, sizeof c);
}

static const char downstream_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"INSERT INTO downstream (biz_key, source, order_id, step) VALUES (:biz_key, "
    ":source, :order_id, :step)\"\n";

/* The downstream's table, config and topology (declared now: the relay's mandatory publishes
 * need its queue before the first row goes out). */
static void down_setup(unsigned workers, unsigned batch)
{
    harness_sql(&F.h, "CREATE TABLE downstream (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key "
                      "VARBINARY(128) NOT NULL, source VARBINARY(128) NOT NULL, order_id "
                      "VARCHAR(64) NOT NULL, step INT NOT NULL, KEY (source), KEY (biz_key)) "
                      "ENGINE=InnoDB");
    char queue[200];
    snprintf(queue, sizeof queue, "%s.down", F.h.queue);
    cr_assert(strlen(queue) < sizeof D.queue);
    memcpy(D.queue, queue, strlen(queue) + 1);
    snprintf(D.config, sizeof D.config, "%s/down.yaml", F.h.dir);
    snprintf(D.log, sizeof D.log, "%s/down.log", F.h.dir);
    swap_downstream();
    harness_options o = {.handler_yaml = downstream_handler, .workers = workers};
    harness_write_config(&F.h, &o);
    harness_config_replace_line(&F.h, "    handler_name: ", "    handler_name: downstream");
    set_mysql(workers, batch);
    harness_config_replace_line(&F.h, "log: ", "log: {level: info}");
    harness_declare_topology(&F.h);
    swap_downstream();
    D.declared = true;
}

static void down_start(void)
{
    long before = harness_log_count_in(D.log, READY_LINE);
    swap_downstream();
    D.pid = harness_spawn_logged(&F.h, D.log);
    swap_downstream();
    cr_assert(harness_wait_log_in(D.log, READY_LINE, before + 1, DEADLINE_MS),
              "the downstream idemq did not start (log: %s)", D.log);
}

/* An upstream idemq logging to log_path (borrowed), started with env NAME=VALUE (NULL: none);
 * returns once it logged its ready line. */
static pid_t upstream_start(const char *log_path, const char *env_name, const char *env_value)
{
    long before = harness_log_count_in(log_path, READY_LINE);
    if (env_name)
        setenv(env_name, env_value, 1);
    pid_t pid = harness_spawn_logged(&F.h, log_path);
    if (env_name)
        unsetenv(env_name);
    cr_assert(harness_wait_log_in(log_path, READY_LINE, before + 1, DEADLINE_MS),
              "idemq did not start (log: %s)", log_path);
    return pid;
}

/* PAY_SUCCESS emits "paid" to the downstream queue; REFUND_START "refund-started" and
 * REFUND_SUCCESS "refunded" (steps 1, 2, 3: the per-key order the outage test checks). */
static char relay_handler[4096];

static const char *upstream_handler(void)
{
    snprintf(relay_handler, sizeof relay_handler,
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
             "          emit:\n"
             "            name: paid\n"
             "            routing_key: \"%s\"\n"
             "            fields: {order_id: order_id, currency: currency, source: biz_key,\n"
             "                     step: {value: 1}}\n"
             "        REFUND_START:\n"
             "          from: [PAID]\n"
             "          to: REFUNDING\n"
             "          emit: {name: refund-started, routing_key: \"%s\",\n"
             "                 fields: {order_id: order_id, source: biz_key, step: {value: 2}}}\n"
             "        REFUND_SUCCESS:\n"
             "          from: [REFUNDING]\n"
             "          to: REFUNDED\n"
             "          emit: {name: refunded, routing_key: \"%s\",\n"
             "                 fields: {order_id: order_id, source: biz_key, step: {value: 3}}}\n"
             "      set: {amount: amount}\n",
             D.queue, D.queue, D.queue);
    return relay_handler;
}

/* Every upstream dedup row has its one outbox row and no other row exists (one emit each). */
static void expect_one_row_per_commit(const char *when)
{
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox"),
                 scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = '" HANDLER_NAME "'"),
                 "%s: one row per committed message", when);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM msg_dedup d LEFT JOIN idemq_outbox o ON "
                        "o.source_biz_key = d.biz_key WHERE d.handler_name = '" HANDLER_NAME
                        "' AND o.id IS NULL"),
                 0, "%s: a committed message without its row", when);
}

/* The end state of a relay run: every applied upstream message's row published (state 1) and
 * applied downstream exactly once, under its derived key; nothing else downstream. */
static void expect_delivered_once(long long applied)
{
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox"), applied);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 1"), applied,
                 "every row published (state 1), none pending or unroutable");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM downstream"), applied,
                 "one downstream row per upstream row");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM (SELECT biz_key FROM downstream GROUP BY biz_key "
                        "HAVING COUNT(*) <> 1) t"),
                 0, "a downstream message applied twice");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM idemq_outbox o JOIN downstream d ON d.biz_key = "
                        "o.biz_key AND d.source = o.source_biz_key"),
                 applied, "each row's message arrived under its derived key");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = 'downstream'"),
                 applied);
}

/* ---------------------------------------------------- (f) kill -9 a thousand times, relayed */

#define CRASH_EVENTS 5000
#define CRASH_ILLEGAL 200 /* REFUND_SUCCESS on a PAYING order: dead-lettered */
#define CRASH_MISSING 100 /* PAY_SUCCESS without currency: dead-lettered, emit field missing */
#define CRASH_APPLIED (CRASH_EVENTS - CRASH_ILLEGAL - CRASH_MISSING)

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v && *v ? atol(v) : def;
}

/* Event i of the crash run: every 25th illegal, every 50th (offset 1) missing its currency. */
static event crash_event(int i, char *id, size_t id_len)
{
    if (i % 25 == 0) {
        snprintf(id, id_len, "ci%d", i / 25);
        return (event){.order = id, .event = "REFUND_SUCCESS", .amount = i};
    }
    if (i % 50 == 1) {
        snprintf(id, id_len, "cx%d", i / 50);
        return (event){.order = id, .event = "PAY_SUCCESS", .amount = i, .no_currency = true};
    }
    snprintf(id, id_len, "c%d", i);
    return (event){.order = id, .event = "PAY_SUCCESS", .amount = i};
}

static int publish_crash_events(int next, int count)
{
    outbox_batch b = {0};
    for (; count > 0 && next < CRASH_EVENTS; count--, next++) {
        char id[16];
        event e = crash_event(next, id, sizeof id);
        batch_add(&b, &e);
    }
    if (b.count)
        batch_publish(&b);
    return next;
}

typedef struct settled_wait {
    long long upstream, dead, downstream;
} settled_wait;

static bool relay_settled(harness *h, void *arg)
{
    const settled_wait *w = arg;
    return scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = '" HANDLER_NAME "'") ==
               w->upstream &&
           scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0") == 0 &&
           scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = 'downstream'") ==
               w->downstream &&
           harness_queue_depth(h, h->queue) == 0 && harness_queue_depth(h, D.queue) == 0 &&
           /* at least: a kill between a dead letter's confirm and the ack dead-letters the
            * redelivery again (the DLQ is at least once) */
           harness_queue_depth(h, queue_named(".dlq")) >= w->dead;
}

Test(outbox, relay_kill_9_a_thousand_times_delivers_every_committed_event_once, .timeout = 600)
{
    harness_fixture_init(&F, "outbox_crash", NULL);
    down_setup(2, 32);
    /* A classic work queue: the upstream is killed with unacked deliveries a thousand times, and
     * RabbitMQ 4.x would drop a quorum queue's message after 20 returns (topology.h). */
    harness_options o = {
        .handler_yaml = upstream_handler(), .top_yaml = RELAY_ON, .queue_type = "classic"};
    configure(&o, 1, 4);
    harness_config_replace_line(&F.h, "log: ", "log: {level: info}");
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "c", CRASH_EVENTS, "PAYING");
    harness_insert_orders(&F.h, "ci", CRASH_ILLEGAL, "PAYING");
    harness_insert_orders(&F.h, "cx", CRASH_MISSING, "PAYING");
    down_start();

    long target = env_long("IDEMQ_TEST_OUTBOX_KILLS", 1000);
    int64_t budget_ms = env_long("IDEMQ_TEST_OUTBOX_BUDGET_S", 170) * 1000;
    char cycle_log[400];
    snprintf(cycle_log, sizeof cycle_log, "%s/cycle.log", F.h.dir);
    unsigned seed = (unsigned)getpid();
    long kills = 0, commit_kills = 0, relay_kills = 0, test_kills = 0;
    int64_t cycle_ms[3] = {0};
    long cycles[3] = {0};
    int next = 0;
    int64_t t0 = harness_now_ms();
    /* A backlog, so that the upstream always finds several messages to batch; each cycle but
     * the relay's adds a few. */
    next = publish_crash_events(next, 30);
    while (kills < target && harness_now_ms() - t0 < budget_ms) {
        /* 76 %: the commit window (IDEMQ_TEST_KILL_AFTER_COMMITS=1..2 batches); 4 %: the relay's
         * window between confirm and mark (IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS=1); 20 %: a kill
         * -9 at a random moment within 60 ms of the start, or after 8..15 batches if that comes
         * first (which keeps each cycle's share of the events small). */
        int64_t cycle_t0 = harness_now_ms();
        int kind = (int)(rand_r(&seed) % 100);
        enum { COMMIT, RELAY, RANDOM } type = kind < 76 ? COMMIT : kind < 80 ? RELAY : RANDOM;
        if (type != RELAY) {
            /* at least 5 new events, and a backlog of 30 (a relay cycle drains it): the first
             * message of an idle pool runs alone, batches form behind it */
            long depth = harness_queue_depth(&F.h, F.h.queue);
            next = publish_crash_events(next, depth < 25 ? 30 - (int)depth : 5);
        }
        if (type == COMMIT && next >= CRASH_EVENTS && harness_queue_depth(&F.h, F.h.queue) < 10)
            type = RANDOM; /* too little left to form batches */
        if (type == RELAY && next >= CRASH_EVENTS &&
            scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0") == 0)
            type = RANDOM; /* nothing left to relay */
        FILE *truncate = fopen(cycle_log, "w");
        cr_assert(truncate);
        fclose(truncate);
        char n[8];
        snprintf(n, sizeof n, "%d",
                 type == RANDOM ? 8 + (int)(rand_r(&seed) % 8) : 1 + (int)(rand_r(&seed) % 2));
        /* No wait for the ready line: a kill during the start is one more moment to crash in,
         * and anything but SIGKILL ending the process fails the test below. */
        const char *env = type == RELAY ? "IDEMQ_TEST_RELAY_KILL_AFTER_CONFIRMS"
                                        : "IDEMQ_TEST_KILL_AFTER_COMMITS";
        setenv(env, type == RELAY ? "1" : n, 1);
        F.daemon = harness_spawn_logged(&F.h, cycle_log);
        unsetenv(env);
        int status;
        if (type == RANDOM) {
            struct timespec pause = {.tv_nsec = (long)(rand_r(&seed) % 60) * 1000000};
            nanosleep(&pause, NULL); /* the fault's moment, not a wait for anything */
            status = harness_wait_exit(F.daemon, 0);
        } else {
            /* the lease of the last leader lapses within 1 s; then a round, then the kill */
            status = harness_wait_exit(F.daemon, type == RELAY ? 3000 : 1000);
        }
        bool by_test = status == -1;
        if (by_test) {
            kill(F.daemon, SIGKILL);
            status = harness_wait_exit(F.daemon, 10000);
        }
        cr_assert(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "cycle %ld: idemq ended otherwise than by SIGKILL (status %d, log %s)", kills,
                  status, cycle_log);
        F.daemon = 0;
        kills++;
        cycle_ms[type] += harness_now_ms() - cycle_t0;
        if (getenv("IDEMQ_TEST_OUTBOX_TRACE"))
            cr_log_info("cycle %ld: type %d, %lld ms, by test %d, depth %ld, dedup %lld", kills,
                        (int)type, (long long)(harness_now_ms() - cycle_t0), (int)by_test,
                        harness_queue_depth(&F.h, F.h.queue),
                        scalar("SELECT COUNT(*) FROM msg_dedup"));
        cycles[type]++;
        if (by_test)
            test_kills++;
        else if (harness_log_count_in(cycle_log, RELAY_KILL_LINE) > 0)
            relay_kills++;
        else
            commit_kills++;
        if (kills % 50 == 0) {
            char when[48];
            snprintf(when, sizeof when, "after %ld kills", kills);
            expect_one_row_per_commit(when);
        }
    }
    int64_t killing_ms = harness_now_ms() - t0;
    cr_log_info("cycles: commit %ld (%lld ms each), relay %ld (%lld ms), random %ld (%lld ms)",
                cycles[0], cycles[0] ? (long long)(cycle_ms[0] / cycles[0]) : 0, cycles[1],
                cycles[1] ? (long long)(cycle_ms[1] / cycles[1]) : 0, cycles[2],
                cycles[2] ? (long long)(cycle_ms[2] / cycles[2]) : 0);
    expect_one_row_per_commit("after the last kill");

    /* The rest of the events, and a clean upstream that settles everything. */
    next = publish_crash_events(next, CRASH_EVENTS);
    F.daemon = upstream_start(F.h.log_path, NULL, NULL);
    settled_wait w = {CRASH_APPLIED, CRASH_ILLEGAL + CRASH_MISSING, CRASH_APPLIED};
    cr_assert(harness_wait_for(relay_settled, &F.h, &w, 120000),
              "not settled: upstream %lld/%d, pending %lld, downstream %lld, queues %ld/%ld, dlq "
              "%ld",
              scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = '" HANDLER_NAME "'"),
              CRASH_APPLIED, scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
              scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = 'downstream'"),
              harness_queue_depth(&F.h, F.h.queue), harness_queue_depth(&F.h, D.queue),
              harness_queue_depth(&F.h, queue_named(".dlq")));
    harness_stop_idemq(&F.daemon);
    harness_stop_idemq(&D.pid);
    int64_t total_ms = harness_now_ms() - t0;

    expect_one_row_per_commit("at the end");
    expect_delivered_once(CRASH_APPLIED);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM orders WHERE order_id LIKE 'c%%' AND order_id NOT "
                        "LIKE 'ci%%' AND order_id NOT LIKE 'cx%%' AND status = 'PAID'"),
                 CRASH_APPLIED);
    cr_assert_eq(scalar("SELECT COUNT(*) FROM downstream WHERE source LIKE 'order_id:ci%%' OR "
                        "source LIKE 'order_id:cx%%'"),
                 0, "a downstream message for a dead-lettered event");
    cr_assert_eq(scalar("SELECT COUNT(*) FROM orders WHERE (order_id LIKE 'ci%%' OR order_id LIKE "
                        "'cx%%') AND status <> 'PAYING'"),
                 0);
    long dead_letters = harness_queue_depth(&F.h, queue_named(".dlq"));
    json_t *dlq = drain_dlq(false);
    cr_expect_eq(json_object_size(dlq), CRASH_ILLEGAL + CRASH_MISSING,
                 "the dead-lettered events by biz_key");
    expect_dead_letter(dlq, "order_id:cx0:PAY_SUCCESS",
                       "emit paid: the message has no field 'currency'");
    json_decref(dlq);
    long duplicates = harness_log_count_in(D.log, OUT_DEDUPED);
    cr_log_info("relay crash run: %ld kills in %lld ms (%ld after a commit, %ld between the "
                "relay's confirm and its mark, %ld at random moments), %d events (%d applied), "
                "%ld duplicates delivered downstream and deduplicated, %ld dead letters for %d "
                "events, %lld ms in all",
                kills, (long long)killing_ms, commit_kills, relay_kills, test_kills, CRASH_EVENTS,
                CRASH_APPLIED, duplicates, dead_letters, CRASH_ILLEGAL + CRASH_MISSING,
                (long long)total_ms);
    cr_assert_geq(kills, target < 100 ? target : 100, "only %ld kills", kills);
    cr_assert_geq(commit_kills, kills / 4, "the commit window was hit %ld times", commit_kills);
    cr_assert_geq(relay_kills, 1, "the relay's confirm-to-mark window was never hit");
    /* Each kill between confirm and mark leaves its round's rows to be published again. */
    cr_assert_geq(duplicates, relay_kills, "fewer duplicates than relay kills");
}

/* ------------------------------------------- (g) two instances relaying one outbox, handovers */

#define TWO_EVENTS 6000

/* The pid in the owner ("host:pid:random") of the current lease; 0 when none is current. */
static pid_t leader_pid(void)
{
    MYSQL *db = F.h.db;
    cr_assert(mysql_query(db, "SELECT owner FROM idemq_outbox_lease WHERE name = 'default' AND "
                              "expires_at > NOW(6)") == 0,
              "%s", mysql_error(db));
    MYSQL_RES *res = mysql_store_result(db);
    cr_assert(res);
    MYSQL_ROW row = mysql_fetch_row(res);
    pid_t pid = 0;
    if (row && row[0]) {
        char owner[160];
        snprintf(owner, sizeof owner, "%s", row[0]);
        char *last = strrchr(owner, ':');
        if (last) {
            *last = '\0';
            char *before = strrchr(owner, ':');
            if (before)
                pid = (pid_t)atol(before + 1);
        }
    }
    mysql_free_result(res);
    return pid;
}

typedef struct leader_wait {
    pid_t not ;
    pid_t found;
} leader_wait;

static bool leader_other_than(harness *h, void *arg)
{
    (void)h;
    leader_wait *w = arg;
    w->found = leader_pid();
    return w->found > 0 && w->found != w->not ;
}

/* Waits until a current lease is held by some pid other than not (0: any); returns it. */
static pid_t wait_leader(pid_t not )
{
    leader_wait w = {.not = not };
    cr_assert(harness_wait_for(leader_other_than, &F.h, &w, DEADLINE_MS),
              "no relay other than %d took the lease", (int)not );
    return w.found;
}

static void publish_two(int from, int to)
{
    outbox_batch b = {0};
    for (int i = from; i < to; i++) {
        char id[16];
        snprintf(id, sizeof id, "t%d", i);
        batch_add(&b, &(event){.order = id, .event = "PAY_SUCCESS", .amount = i});
    }
    batch_publish(&b);
}

/* Which of the two upstream processes pid is: 0 (F.daemon), 1 (second); fails otherwise. */
static pid_t *instance_of(pid_t pid)
{
    cr_assert(pid == F.daemon || pid == second, "the lease owner %d is neither instance (%d, %d)",
              (int)pid, (int)F.daemon, (int)second);
    return pid == F.daemon ? &F.daemon : &second;
}

Test(outbox, two_instances_relay_one_outbox_every_row_published_across_handovers)
{
    harness_fixture_init(&F, "outbox_two", NULL);
    down_setup(2, 32);
    harness_options o = {.handler_yaml = upstream_handler(), .top_yaml = RELAY_ON};
    configure(&o, 2, 16);
    harness_config_replace_line(&F.h, "log: ", "log: {level: info}");
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "t", TWO_EVENTS, "PAYING");
    char logs[2][400];
    snprintf(logs[0], sizeof logs[0], "%s", F.h.log_path);
    snprintf(logs[1], sizeof logs[1], "%s/second.log", F.h.dir);
    down_start();
    F.daemon = upstream_start(logs[0], NULL, NULL);
    second = upstream_start(logs[1], NULL, NULL);
    int64_t t0 = harness_now_ms();

    /* The events arrive in chunks while both consume; two handovers in the middle of the
     * stream: at a third, the leader stopped with SIGTERM (it releases the lease: the standby
     * takes over at once); at two thirds, the leader killed with kill -9 (the standby takes
     * over once the lease lapses). Each is started again and the stream goes on. */
    pid_t first_leader = 0, killed_leader = 0;
    long long pending_at[2] = {0};
    for (int sent = 0; sent < TWO_EVENTS; sent += 100) {
        publish_two(sent, sent + 100);
        int step = sent + 100 == TWO_EVENTS / 3 ? 0 : sent + 100 == 2 * TWO_EVENTS / 3 ? 1 : -1;
        if (step < 0)
            continue;
        pid_t leader = wait_leader(0);
        pid_t *slot = instance_of(leader);
        const char *log = slot == &F.daemon ? logs[0] : logs[1];
        pending_at[step] = scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0");
        int64_t at = harness_now_ms();
        if (step == 0) {
            first_leader = leader;
            cr_assert_eq(harness_stop(leader, SIGTERM, 30000), 0, "the graceful stop failed");
        } else {
            killed_leader = leader;
            kill(leader, SIGKILL);
            cr_assert_eq(harness_stop(leader, SIGKILL, 10000), 128 + SIGKILL);
        }
        *slot = 0;
        pid_t next = wait_leader(leader);
        cr_log_info("two instances: %s to leader %d (%lld rows pending), %d took over in %lld ms",
                    step == 0 ? "SIGTERM" : "kill -9", (int)leader, pending_at[step], (int)next,
                    (long long)(harness_now_ms() - at));
        *slot = upstream_start(log, NULL, NULL);
    }
    settled_wait w = {TWO_EVENTS, 0, TWO_EVENTS};
    cr_assert(harness_wait_for(relay_settled, &F.h, &w, 120000),
              "not settled: upstream %lld, pending %lld, downstream %lld",
              scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = '" HANDLER_NAME "'"),
              scalar("SELECT COUNT(*) FROM idemq_outbox WHERE state = 0"),
              scalar("SELECT COUNT(*) FROM msg_dedup WHERE handler_name = 'downstream'"));
    int64_t took = harness_now_ms() - t0;
    harness_stop_idemq(&F.daemon);
    harness_stop_idemq(&second);
    harness_stop_idemq(&D.pid);

    expect_delivered_once(TWO_EVENTS);
    long processed[2], acquired[2], released[2];
    for (int i = 0; i < 2; i++) {
        processed[i] = harness_log_count_in(logs[i], OUT_PROCESSED);
        acquired[i] = harness_log_count_in(logs[i], "leader lease acquired");
        released[i] = harness_log_count_in(logs[i], "leader lease released");
    }
    cr_expect(processed[0] > 0 && processed[1] > 0,
              "both instances consumed the work queue (%ld, %ld)", processed[0], processed[1]);
    cr_expect_geq(acquired[0] + acquired[1], 3, "the lease changed hands twice");
    cr_expect_geq(released[0] + released[1], 1, "the graceful stop released the lease");
    cr_expect_neq(first_leader, 0);
    cr_expect_neq(killed_leader, 0);
    long duplicates = harness_log_count_in(D.log, OUT_DEDUPED);
    cr_log_info("two instances: %d events in %lld ms, processed %ld + %ld, lease acquired %ld + "
                "%ld times, %ld duplicates delivered downstream (deduplicated)",
                TWO_EVENTS, (long long)took, processed[0], processed[1], acquired[0], acquired[1],
                duplicates);
}
