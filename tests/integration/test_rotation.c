/*
 * test_rotation — dedup.layout: rotating (adapter/store/rotation.h) in a real `idemq` against
 * real RabbitMQ and MariaDB (or MySQL): `idemq migrate` converts a single msg_dedup in place and
 * `check`/`run` refuse a layout that does not match the config; a key rotated into
 * msg_dedup_previous still makes its copies duplicates, on the one-message path, on the batched
 * path with and without INSERT … RETURNING and in a batch of savepoints (the sql handler); a key
 * is forgotten after two rotations; copies racing rotations apply once, also among failures
 * rolled back to their savepoints; the tables a rotation stopped half-way left are dropped by
 * the next; two instances rotate once per period between them; a long transaction on msg_dedup
 * delays a rotation without stopping the consumers.
 *
 * The effect that counts: each message is a TICK whose transition goes from OPEN to OPEN, so a
 * copy that slipped past the dedup would apply again (it would not be a state_noop), and an
 * AFTER UPDATE trigger on orders writes one `effects` row per application. A key applied twice
 * shows up as two effects rows and as one processed outcome too many.
 *
 * Rotations are forced by moving idemq_dedup_rotation.rotated_at back, then waiting for the
 * rotation's log line. Each test has its own database and queue (harness.h). Waits are on log
 * lines, row counts and exits, with deadlines; no sleep stands in for an event.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "harness.h"
#include "store/rotation.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define ROTATED "dedup rotation: rotated the dedup tables"
#define PROCESSED "\"outcome\":\"processed\""
#define DEDUPED "\"outcome\":\"deduped\""

/* ------------------------------------------------------------------------------ fixture */

static harness_fixture F;
static pid_t second_daemon; /* two_instances_rotate_once_per_period's other idemq */
static MYSQL *locker;       /* a test's own open transaction, holding a lock idemq needs */

static void teardown(void)
{
    if (locker)
        mysql_close(locker); /* rolls back, releasing its locks */
    locker = NULL;
    harness_kill_idemq(&second_daemon);
    unsetenv("IDEMQ_TEST_NO_RETURNING");
    harness_fixture_fini(&F);
}

TestSuite(rotation, .fini = teardown, .timeout = 180);

/* ------------------------------------------------------------------------------ helpers */

/* A TICK moves an OPEN order to OPEN: applying a copy again is a real second application. */
static const char tick_handler[] = "      type: state_machine\n"
                                   "      table: orders\n"
                                   "      key_column: order_id\n"
                                   "      key_field: order_id\n"
                                   "      state_column: status\n"
                                   "      event_field: event_type\n"
                                   "      on_illegal: dead_letter\n"
                                   "      transitions:\n"
                                   "        TICK: {from: [OPEN], to: OPEN}\n";

/* The same TICK as a sql handler, which has no set-based batch path: in a batch each message
 * runs in a savepoint of its own (store/batch.c), and a failed one is rolled back to it. An order
 * that does not exist matches no row: that message fails and is dead-lettered. */
static const char sql_tick_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"UPDATE orders SET status = 'OPEN' WHERE order_id = :order_id AND status = "
    "'OPEN'\"\n"
    "          expect_rows: 1\n";

typedef struct rotation_setup {
    const char *handler_yaml;           /* NULL: tick_handler */
    unsigned workers, batch, linger_ms; /* 0: the config's defaults (4 workers, batch default) */
    const char *dedup_yaml;             /* the whole top-level dedup line; NULL: rotating, 1h, 1s */
    bool debug;                         /* log level debug (the "batch of N messages" lines) */
    bool no_migrate;                    /* leave the database as harness_init made it */
} rotation_setup;

/* Rewrites the config's mysql line (same server and database) with workers, batch and linger. */
static void set_mysql_line(const rotation_setup *r)
{
    const char *base = getenv("IDEMQ_TEST_MYSQL_URL");
    cr_assert(base, "IDEMQ_TEST_MYSQL_URL is not set");
    const char *path = strchr(base + strlen("mysql://"), '/');
    const char *query = strchr(base, '?');
    cr_assert(path);
    char line[1024], extra[128] = "";
    int n = 0;
    if (r->batch)
        n += snprintf(extra + n, sizeof extra - (size_t)n, ", batch: %u", r->batch);
    if (r->linger_ms)
        snprintf(extra + n, sizeof extra - (size_t)n, ", batch_linger_ms: %u", r->linger_ms);
    snprintf(line, sizeof line, "mysql: {url: \"%.*s/%s%s\", workers: %u%s}", (int)(path - base),
             base, F.h.database, query ? query : "", r->workers ? r->workers : 4, extra);
    harness_config_replace_line(&F.h, "mysql: ", line);
}

/* Runs `idemq migrate` and expects it to succeed; returns its output (owned). */
static char *migrate_ok(void)
{
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "migrate", &out);
    cr_assert_eq(rc, 0, "idemq migrate exited %d:\n%s", rc, out ? out : "");
    return out;
}

/* The fixture with the TICK handler, the effects table and its trigger, the config of r, the
 * topology declared and (unless r->no_migrate) the database converted by `idemq migrate`. */
static void setup(const char *name, const rotation_setup *r)
{
    char top[256];
    snprintf(top, sizeof top, "%s\n",
             r->dedup_yaml ? r->dedup_yaml
                           : "dedup: {layout: rotating, retention: 1h, interval: 1s}");
    harness_options o = {.handler_yaml = r->handler_yaml ? r->handler_yaml : tick_handler,
                         .top_yaml = top};
    harness_fixture_init(&F, name, &o);
    set_mysql_line(r);
    if (r->debug)
        harness_config_replace_line(&F.h, "log: ", "log: {level: debug}");
    harness_sql(&F.h, "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) "
                      "NOT NULL, KEY (k)) ENGINE=InnoDB");
    harness_sql(&F.h, "CREATE TRIGGER orders_effect AFTER UPDATE ON orders FOR EACH ROW "
                      "INSERT INTO effects (k) VALUES (NEW.order_id)");
    if (!r->no_migrate) {
        char *out = migrate_ok();
        if (!r->dedup_yaml || strstr(r->dedup_yaml, "rotating"))
            cr_assert(strstr(out, "converted msg_dedup to the rotating layout"), "%s", out);
        free(out);
    }
    harness_declare_topology(&F.h);
}

static void start(void)
{
    harness_start_idemq(&F.h, READY_LINE, DEADLINE_MS, &F.daemon);
}

/* Orders PREFIX<from>..PREFIX<to-1> in OPEN (200 rows per statement: harness_sql's buffer). */
static void insert_open_orders(const char *prefix, int from, int to)
{
    for (int start_at = from; start_at < to; start_at += 200) {
        char sql[8192];
        int n = snprintf(sql, sizeof sql, "INSERT INTO orders (order_id, status) VALUES ");
        for (int i = start_at; i < to && i < start_at + 200; i++)
            n += snprintf(sql + n, sizeof sql - (size_t)n, "%s('%s%d','OPEN')",
                          i == start_at ? "" : ",", prefix, i);
        cr_assert((size_t)n < sizeof sql);
        harness_sql(&F.h, "%s", sql);
    }
}

/* One published message: key PREFIX<index>. */
typedef struct tick {
    const char *prefix;
    int index;
} tick;

/* Publishes the TICKs of ticks[0..count) in that order (biz_key tick:PREFIX<i>), confirmed. */
static void publish_ticks(const tick *ticks, size_t count)
{
    char(*bodies)[160] = calloc(count, sizeof *bodies);
    const void **ptrs = calloc(count, sizeof *ptrs);
    size_t *lens = calloc(count, sizeof *lens);
    cr_assert(bodies && ptrs && lens);
    for (size_t i = 0; i < count; i++) {
        lens[i] =
            (size_t)snprintf(bodies[i], sizeof bodies[i],
                             "{\"biz_key\":\"tick:%s%d\",\"order_id\":\"%s%d\","
                             "\"event_type\":\"TICK\"}",
                             ticks[i].prefix, ticks[i].index, ticks[i].prefix, ticks[i].index);
        ptrs[i] = bodies[i];
    }
    harness_publish_batch(&F.h, NULL, "application/json", ptrs, lens, count);
    free(bodies);
    free(ptrs);
    free(lens);
}

/* Publishes keys PREFIX<from>..PREFIX<to-1>, each `copies` times back to back. */
static void publish_keys(const char *prefix, int from, int to, int copies)
{
    size_t count = (size_t)(to - from) * (size_t)copies, k = 0;
    tick *ticks = calloc(count, sizeof *ticks);
    cr_assert(ticks);
    for (int i = from; i < to; i++)
        for (int c = 0; c < copies; c++)
            ticks[k++] = (tick){prefix, i};
    publish_ticks(ticks, count);
    free(ticks);
}

static long outcomes(const char *needle)
{
    return harness_log_count(&F.h, needle);
}

/* Waits until processed + deduped outcome lines reach total; fails the test otherwise. */
typedef struct settle_wait {
    long total, seen;
} settle_wait;

static bool settled(harness *h, void *arg)
{
    settle_wait *w = arg;
    w->seen = harness_log_count(h, PROCESSED) + harness_log_count(h, DEDUPED);
    return w->seen >= w->total;
}

static void wait_settled(long total)
{
    settle_wait w = {.total = total};
    cr_assert(harness_wait_for(settled, &F.h, &w, DEADLINE_MS),
              "only %ld of %ld outcomes (processed or deduped) were logged; dead-lettered %ld, "
              "state_noop %ld, retried %ld",
              w.seen, total, outcomes("\"outcome\":\"dead_lettered\""),
              outcomes("\"outcome\":\"state_noop\""), outcomes("\"outcome\":\"retried\""));
    cr_assert_eq(w.seen, total, "more outcomes than messages: %ld of %ld", w.seen, total);
}

/* Rows of `effects` for keys starting with prefix: all of them, and distinct keys. */
static void expect_effects(const char *prefix, long long keys)
{
    long long all =
        harness_scalar(&F.h, "SELECT COUNT(*) FROM effects WHERE k LIKE '%s%%'", prefix);
    long long distinct =
        harness_scalar(&F.h, "SELECT COUNT(DISTINCT k) FROM effects WHERE k LIKE '%s%%'", prefix);
    cr_expect_eq(distinct, keys, "keys %s* applied: %lld, expected %lld", prefix, distinct, keys);
    cr_expect_eq(all, keys, "effects of keys %s*: %lld rows for %lld keys (a copy applied again)",
                 prefix, all, keys);
}

/* Forces one rotation: moves msg_dedup's start two hours back (retention is shorter) and waits
 * for the rotation's log line. */
static void force_rotation(void)
{
    long before = outcomes(ROTATED);
    harness_sql(&F.h, "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) - INTERVAL 2 HOUR "
                      "WHERE table_name = 'msg_dedup'");
    cr_assert(harness_wait_log(&F.h, ROTATED, before + 1, DEADLINE_MS),
              "the forced rotation did not happen");
}

static bool table_exists(const char *table)
{
    return harness_scalar(&F.h,
                          "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
                          "DATABASE() AND TABLE_NAME = '%s'",
                          table) == 1;
}

/* The idemq's idemq_messages_total{queue=<the test's queue>, outcome=<outcome>}. */
static long long messages_metric(const char *outcome)
{
    int port = harness_http_port(&F.h, 10000);
    char *body = NULL, sample[400];
    cr_assert_eq(harness_http_get(port, "/metrics", &body), 200);
    snprintf(sample, sizeof sample, "idemq_messages_total{queue=\"%s\",outcome=\"%s\"}", F.h.queue,
             outcome);
    long long v = harness_metric_value(body, sample);
    free(body);
    return v;
}

/* "2026-01-02T03:04:05.678Z" → ms since the Unix epoch; -1 when it does not parse. */
static long long parse_ts(const char *text)
{
    struct tm tm;
    int ms = 0;
    memset(&tm, 0, sizeof tm);
    if (!text || sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                        &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (long long)timegm(&tm) * 1000 + ms;
}

/* The lines of the log at path (borrowed) as a JSON array of objects (owned); lines that are not
 * JSON are skipped. */
static json_t *load_log(const char *path)
{
    json_t *all = json_array();
    FILE *f = fopen(path, "r");
    if (!f)
        return all;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        json_t *obj = json_loads(line, 0, NULL);
        if (json_is_object(obj))
            json_array_append(all, obj);
        json_decref(obj);
    }
    free(line);
    fclose(f);
    return all;
}

/* ------------------------------------------------------------------------------ the layout */

Test(rotation, migrate_converts_a_single_table_in_place)
{
    rotation_setup r = {.dedup_yaml = "dedup: {retention: 1h}", .no_migrate = true};
    setup("rotation_migrate", &r);
    char *out = migrate_ok(); /* layout single: msg_dedup current, nothing else */
    cr_expect(!strstr(out, "rotating"), "%s", out);
    free(out);
    cr_assert(!table_exists("msg_dedup_previous"));
    for (int i = 0; i < 5; i++)
        harness_sql(&F.h,
                    "INSERT INTO msg_dedup (biz_key, handler_name) VALUES ('old%d', "
                    "'pay-callback')",
                    i);
    long long max_id = harness_scalar(&F.h, "SELECT MAX(id) FROM msg_dedup");

    harness_config_replace_line(
        &F.h, "dedup: ", "dedup: {layout: rotating, retention: 1h, interval: 1s}");
    out = migrate_ok();
    cr_expect(strstr(out, "converted msg_dedup to the rotating layout"), "%s", out);
    /* The size is the statistics' estimate (a COUNT(*) would read a large table whole). */
    cr_expect(strstr(out, "msg_dedup's rows (about ") && strstr(out, ") stay"), "%s", out);
    free(out);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE 'old%%'"),
                 5, "the existing rows stay in msg_dedup");
    cr_assert_eq(harness_scalar(&F.h, "SELECT MAX(id) FROM msg_dedup"), max_id);
    cr_assert(table_exists("msg_dedup_previous"));
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous"), 0);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM idemq_dedup_rotation WHERE table_name "
                                      "= 'msg_dedup' AND rotated_at > NOW(3) - INTERVAL 1 HOUR"),
                 1, "idemq_dedup_rotation has msg_dedup's row, recorded now");
    /* msg_dedup_previous has msg_dedup's columns and unique key. */
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE "
                                      "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
                                      "'msg_dedup_previous' AND INDEX_NAME = 'uk_biz_handler' AND "
                                      "NON_UNIQUE = 0"),
                 2);

    /* Again: nothing changes, not even the recorded time. */
    harness_sql(&F.h, "UPDATE idemq_dedup_rotation SET rotated_at = '2020-01-02 03:04:05.678'");
    out = migrate_ok();
    cr_expect(!strstr(out, "converted"), "a second migrate converted again:\n%s", out);
    free(out);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 5);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous"), 0);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM idemq_dedup_rotation"), 1);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM idemq_dedup_rotation WHERE rotated_at "
                                      "= '2020-01-02 03:04:05.678'"),
                 1, "a second migrate moved rotated_at");

    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_expect_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "dedup   layout rotating: msg_dedup current since 2020-01-02 "
                          "03:04:05.678"),
              "%s", out);
    free(out);

    /* Back to layout single while msg_dedup_previous exists: check and run refuse. */
    harness_config_replace_line(&F.h, "dedup: ", "dedup: {retention: 1h}");
    rc = harness_run_cli_command(&F.h, "check", &out);
    cr_expect_neq(rc, 0, "idemq check passed a single layout with msg_dedup_previous:\n%s", out);
    cr_expect(strstr(out, "FAIL msg_dedup_previous exists"), "%s", out);
    free(out);
    rc = harness_run_cli_command(&F.h, "migrate", &out);
    cr_expect_neq(rc, 0, "idemq migrate accepted layout single with msg_dedup_previous:\n%s", out);
    cr_expect(strstr(out, "fold it back"), "%s", out);
    free(out);

    F.daemon = harness_spawn(&F.h);
    int status = harness_wait_exit(F.daemon, DEADLINE_MS);
    cr_assert_neq(status, -1, "idemq run kept running with layout single and msg_dedup_previous");
    F.daemon = 0;
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "idemq run: wait status %d", status);
    cr_expect_eq(harness_log_count(&F.h, "fold it back"), 1);
    cr_expect_eq(harness_log_count(&F.h, READY_LINE), 0);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 5, "nothing was touched");
}

Test(rotation, rotating_layout_without_migrate_refuses_to_start)
{
    rotation_setup r = {.no_migrate = true};
    setup("rotation_unmigrated", &r);
    F.daemon = harness_spawn(&F.h);
    int status = harness_wait_exit(F.daemon, DEADLINE_MS);
    cr_assert_neq(status, -1, "idemq run kept running on a database never converted");
    F.daemon = 0;
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "idemq run: wait status %d", status);
    cr_expect_eq(harness_log_count_both(F.h.log_path, "msg_dedup_previous is missing",
                                        "run `idemq migrate`"),
                 1);
    cr_expect_eq(harness_log_count(&F.h, READY_LINE), 0);

    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_expect_neq(rc, 0, "idemq check passed an unconverted database:\n%s", out);
    cr_expect(strstr(out, "run `idemq migrate`"), "%s", out);
    free(out);
    cr_expect(!table_exists("msg_dedup_previous"), "run or check created the table");
}

/* ------------------------------------------------------------- duplicates across a rotation */

#define KEYS 40

#define FAILING_EVERY 4 /* PATH_SAVEPOINTS: a failing message before every fourth key's copies */

typedef enum path_kind {
    PATH_SINGLE,
    PATH_BATCH_RETURNING,
    PATH_BATCH_NO_RETURNING,
    PATH_SAVEPOINTS, /* batched, one savepoint per message (the sql handler) */
} path_kind;

/* Applies KEYS keys a*, rotates them into msg_dedup_previous, then, with idemq stopped so its
 * batches fill from the backlog, publishes two copies of each a* key interleaved with two copies
 * of each fresh key f*: every a* copy and the second f* copy are deduped, each key applies once.
 * On PATH_SAVEPOINTS a message that fails (its order m* does not exist) comes before every
 * fourth key's copies: the copies after it are looked up after a ROLLBACK TO SAVEPOINT, which
 * releases the metadata locks taken since the savepoint on MariaDB. */
static void duplicates_across_a_rotation(const char *name, path_kind path)
{
    rotation_setup r = {.handler_yaml = path == PATH_SAVEPOINTS ? sql_tick_handler : NULL,
                        .workers = 1,
                        .batch = path == PATH_SINGLE ? 1 : 16,
                        .linger_ms = path == PATH_SINGLE ? 0 : 50,
                        .debug = true};
    setup(name, &r);
    if (path == PATH_BATCH_NO_RETURNING)
        setenv("IDEMQ_TEST_NO_RETURNING", "1", 1); /* MySQL's path: one INSERT per message */
    insert_open_orders("a", 0, KEYS);
    insert_open_orders("f", 0, KEYS);
    start();
    publish_keys("a", 0, KEYS, 1);
    wait_settled(KEYS);
    cr_assert_eq(outcomes(PROCESSED), KEYS);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), KEYS);

    force_rotation();
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 0,
                 "msg_dedup is the new, empty table");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous WHERE biz_key LIKE "
                                      "'tick:a%%' AND handler_name = 'pay-callback'"),
                 KEYS, "the keys moved to msg_dedup_previous");
    cr_expect(!table_exists("msg_dedup_expired"), "the period before was not dropped");
    cr_expect(!table_exists("msg_dedup_next"));
    cr_expect_eq(harness_log_count(&F.h, "the period before was dropped whole"), 1);
    harness_stop_idemq(&F.daemon);

    tick ticks[5 * KEYS];
    size_t published = 0;
    long failing = 0;
    for (int i = 0; i < KEYS; i++) {
        if (path == PATH_SAVEPOINTS && i % FAILING_EVERY == 0)
            ticks[published++] = (tick){"m", (int)failing++};
        ticks[published++] = (tick){"a", i};
        ticks[published++] = (tick){"a", i};
        ticks[published++] = (tick){"f", i};
        ticks[published++] = (tick){"f", i};
    }
    publish_ticks(ticks, published);
    long processed_before = outcomes(PROCESSED);
    start();
    wait_settled(KEYS + 4 * KEYS);
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"dead_lettered\"", failing, DEADLINE_MS));
    cr_expect_eq(outcomes(PROCESSED) - processed_before, KEYS, "only the fresh keys apply");
    cr_expect_eq(outcomes(DEDUPED), 3 * KEYS, "both copies of a*, the second of f*");
    cr_expect_eq(outcomes("\"outcome\":\"state_noop\""), 0);
    cr_expect_eq(outcomes("\"outcome\":\"dead_lettered\""), failing);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE "
                                      "'tick:m%%'"),
                 0, "a failed message kept its dedup row");
    cr_expect_eq(messages_metric("deduped"), 3 * KEYS);
    cr_expect_eq(messages_metric("processed"), KEYS);
    expect_effects("a", KEYS);
    expect_effects("f", KEYS);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE "
                                      "'tick:a%%'"),
                 0, "a copy of a rotated key got a row in msg_dedup");
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE "
                                      "'tick:f%%'"),
                 KEYS);
    /* The new table's ids start above the old one's: an id names one row in both. */
    cr_expect_gt(harness_scalar(&F.h, "SELECT MIN(id) FROM msg_dedup"),
                 harness_scalar(&F.h, "SELECT MAX(id) FROM msg_dedup_previous"));

    if (path != PATH_SINGLE) {
        /* The copies were decided inside batches, not one by one. */
        json_t *log = harness_log_load(&F.h);
        size_t i, batches = 0, deduped_in_batches = 0, failed_in_batches = 0;
        json_t *line;
        json_array_foreach(log, i, line)
        {
            unsigned n, applied, noop, deduped, failed;
            if (sscanf(harness_json_str(line, "msg"),
                       "batch of %u messages: one COMMIT (applied %u, state_noop %u, deduped %u, "
                       "failed %u)",
                       &n, &applied, &noop, &deduped, &failed) == 5 &&
                n > 1) {
                batches++;
                deduped_in_batches += deduped;
                failed_in_batches += failed;
            }
        }
        json_decref(log);
        cr_log_info("%s: %zu batches of several messages, %zu copies deduped and %zu messages "
                    "failed in them",
                    name, batches, deduped_in_batches, failed_in_batches);
        cr_expect_geq(deduped_in_batches, KEYS, "the copies were not decided in batches");
        if (path == PATH_SAVEPOINTS)
            cr_expect_geq(failed_in_batches, (size_t)failing / 2,
                          "the failing messages were not rolled back inside batches");
        cr_expect_eq(outcomes("rolled back as a whole"), 0);
    }
    harness_stop_idemq(&F.daemon);
}

Test(rotation, a_duplicate_across_a_rotation_is_caught_one_message_at_a_time)
{
    duplicates_across_a_rotation("rotation_dup_single", PATH_SINGLE);
}

Test(rotation, a_duplicate_across_a_rotation_is_caught_in_a_batch)
{
    duplicates_across_a_rotation("rotation_dup_batch", PATH_BATCH_RETURNING);
}

Test(rotation, a_duplicate_across_a_rotation_is_caught_in_a_batch_without_returning)
{
    duplicates_across_a_rotation("rotation_dup_batch_noret", PATH_BATCH_NO_RETURNING);
}

Test(rotation, a_duplicate_across_a_rotation_is_caught_in_a_batch_of_savepoints)
{
    duplicates_across_a_rotation("rotation_dup_savepoints", PATH_SAVEPOINTS);
}

Test(rotation, a_key_is_freed_after_two_rotations)
{
    rotation_setup r = {.workers = 1};
    setup("rotation_freed", &r);
    insert_open_orders("k", 0, 1);
    start();
    publish_keys("k", 0, 1, 1);
    wait_settled(1);

    force_rotation();
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous WHERE biz_key = "
                                      "'tick:k0'"),
                 1);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 0);
    publish_keys("k", 0, 1, 1); /* one period later: still a duplicate */
    wait_settled(2);
    cr_assert_eq(outcomes(DEDUPED), 1);

    force_rotation();
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous"), 0);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 0);
    cr_expect(!table_exists("msg_dedup_expired"));
    publish_keys("k", 0, 1, 1); /* two periods later: the window's end, it applies again */
    wait_settled(3);
    cr_assert_eq(outcomes(PROCESSED), 2);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM effects WHERE k = 'k0'"), 2);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = 'tick:k0'"),
                 1);
    harness_stop_idemq(&F.daemon);
}

/* A rotation stopped half-way (idemq killed, its connection lost) leaves msg_dedup_next (stopped
 * before the rename) or msg_dedup_expired (after the rename, before the drop). Neither is ever
 * read for duplicates, and the next rotation drops both and rotates as usual. */
Test(rotation, the_tables_an_interrupted_rotation_left_are_dropped_by_the_next)
{
    rotation_setup r = {.workers = 1};
    setup("rotation_leftovers", &r);
    insert_open_orders("k", 0, 2);
    harness_sql(&F.h, "CREATE TABLE msg_dedup_next LIKE msg_dedup");
    harness_sql(&F.h, "CREATE TABLE msg_dedup_expired LIKE msg_dedup");
    harness_sql(&F.h, "INSERT INTO msg_dedup_next (biz_key, handler_name) VALUES ('tick:k0', "
                      "'pay-callback')");
    harness_sql(&F.h, "INSERT INTO msg_dedup_expired (biz_key, handler_name) VALUES ('tick:k1', "
                      "'pay-callback')");
    start();
    publish_keys("k", 0, 2, 1);
    wait_settled(2);
    cr_expect_eq(outcomes(PROCESSED), 2, "a key in a left-over table counted as a duplicate");

    force_rotation();
    cr_expect(!table_exists("msg_dedup_next"), "the left-over msg_dedup_next is still there");
    cr_expect(!table_exists("msg_dedup_expired"), "the left-over msg_dedup_expired is still there");
    cr_expect_eq(harness_log_count(&F.h, "the period before was dropped whole"), 1);
    cr_expect_eq(harness_log_count_both(F.h.log_path, "\"level\":\"warn\"", "dedup rotation:"), 0);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous WHERE biz_key LIKE "
                                      "'tick:k%%'"),
                 2, "the rotation did not move the period's keys");
    publish_keys("k", 0, 2, 1);
    wait_settled(4);
    cr_expect_eq(outcomes(DEDUPED), 2);
    expect_effects("k", 2);
    harness_stop_idemq(&F.daemon);
}

/* ------------------------------------------------------------- copies racing rotations */

#define RACE_ORDERS 3000
#define RACE_MIN_KEYS 1000
#define RACE_WAVE 5   /* new keys per poll (20 ms): about 250 keys, 750 messages a second */
#define RACE_DELAY 10 /* waves between a key's first two copies and its third */
#define RACE_PERIOD_MS 2000

typedef struct race {
    int keys; /* published: r0..r<keys-1>, three copies each (the last RACE_DELAY waves': two) */
    long rotations_at_start;
    bool failing; /* a message that fails (its order m* does not exist) leads each wave */
    int failed;   /* such messages published */
} race;

/* Publishes one wave: two copies, back to back, of each of RACE_WAVE new keys, then the third
 * copy of the keys that were new RACE_DELAY waves ago (a few hundred ms, well within a period):
 * copies in flight together, and copies that a rotation falls between. */
static void publish_wave(race *t, bool new_keys)
{
    tick ticks[3 * RACE_WAVE + 1];
    size_t n = 0;
    if (t->failing)
        ticks[n++] = (tick){"m", t->failed++};
    for (int i = 0; new_keys && i < RACE_WAVE; i++) {
        ticks[n++] = (tick){"r", t->keys + i};
        ticks[n++] = (tick){"r", t->keys + i};
    }
    for (int i = 0, old = t->keys - RACE_DELAY * RACE_WAVE; i < RACE_WAVE; i++)
        if (old + i >= 0)
            ticks[n++] = (tick){"r", old + i};
    if (n)
        publish_ticks(ticks, n);
    t->keys += RACE_WAVE;
}

/* One wave per poll; done when at least RACE_MIN_KEYS keys went out and the tables rotated three
 * times since the first wave, so that rotations fell among the copies. */
static bool race_done(harness *h, void *arg)
{
    race *t = arg;
    cr_assert(t->keys + RACE_WAVE <= RACE_ORDERS,
              "%d keys published and the tables rotated only %ld times", t->keys,
              harness_log_count(h, ROTATED) - t->rotations_at_start);
    publish_wave(t, true);
    return t->keys >= RACE_MIN_KEYS && harness_log_count(h, ROTATED) - t->rotations_at_start >= 3;
}

/* What the log says of the race: the rotations logged while copies were being settled, the
 * widest spread of one key's outcomes, and the keys whose copies a rotation fell between (the
 * first applied before it, a copy deduped after it). */
typedef struct race_report {
    long rotations_during, keys_straddling;
    long long first_ms, last_ms, widest_spread_ms;
    double longest_rename_ms; /* the slowest rotation's claim to rename */
} race_report;

static void race_read_log(int keys, race_report *rep)
{
    long long *first = calloc((size_t)keys, sizeof *first),
              *last = calloc((size_t)keys, sizeof *last);
    long long rotations[64];
    size_t n_rotations = 0;
    cr_assert(first && last);
    memset(rep, 0, sizeof *rep);
    rep->first_ms = rep->last_ms = -1;
    json_t *log = harness_log_load(&F.h);
    size_t i;
    json_t *line;
    json_array_foreach(log, i, line)
    {
        const char *outcome = harness_json_str(line, "outcome");
        long long ts = json_integer_value(json_object_get(line, "_ts_ms"));
        int k;
        const char *msg = harness_json_str(line, "msg");
        const char *took = strstr(msg, "an empty msg_dedup took its place (");
        double rename_ms;
        if (strstr(msg, ROTATED) && n_rotations < 64)
            rotations[n_rotations++] = ts;
        if (took && sscanf(took, "an empty msg_dedup took its place (%lf ms)", &rename_ms) == 1 &&
            rename_ms > rep->longest_rename_ms)
            rep->longest_rename_ms = rename_ms;
        if (strcmp(outcome, "processed") != 0 && strcmp(outcome, "deduped") != 0)
            continue;
        if (rep->first_ms < 0)
            rep->first_ms = ts;
        rep->last_ms = ts;
        if (sscanf(harness_json_str(line, "biz_key"), "tick:r%d", &k) == 1 && k >= 0 && k < keys) {
            if (!first[k])
                first[k] = ts;
            last[k] = ts;
        }
    }
    json_decref(log);
    for (size_t r = 0; r < n_rotations; r++)
        if (rotations[r] > rep->first_ms && rotations[r] < rep->last_ms)
            rep->rotations_during++;
    for (int k = 0; k < keys; k++) {
        if (last[k] - first[k] > rep->widest_spread_ms)
            rep->widest_spread_ms = last[k] - first[k];
        bool straddles = false;
        for (size_t r = 0; r < n_rotations; r++)
            straddles |= first[k] < rotations[r] && rotations[r] < last[k];
        rep->keys_straddling += straddles;
    }
    free(first);
    free(last);
}

/* Copies of keys published while the tables rotate every RACE_PERIOD_MS; with failing, a
 * message that fails leads each wave. With the sql handler (its batches run one savepoint per
 * message), those failures are rolled back to their savepoints among the copies: on MariaDB a
 * ROLLBACK TO SAVEPOINT releases the metadata locks taken since, so a rename can come between
 * two messages of one transaction. */
static void duplicates_racing_rotations(const char *name, const char *handler_yaml, bool failing)
{
    rotation_setup r = {.handler_yaml = handler_yaml,
                        .workers = 4,
                        .batch = 16,
                        .dedup_yaml = "dedup: {layout: rotating, retention: 2s, interval: 1s}"};
    setup(name, &r);
    insert_open_orders("r", 0, RACE_ORDERS);
    start();
    race t = {.rotations_at_start = outcomes(ROTATED), .failing = failing};
    cr_assert(harness_wait_for(race_done, &F.h, &t, DEADLINE_MS), "the race did not finish");
    for (int w = 0; w < RACE_DELAY; w++)
        publish_wave(&t, false); /* the last keys' third copies */
    t.keys -= RACE_DELAY * RACE_WAVE;
    wait_settled(3L * t.keys);
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"dead_lettered\"", t.failed, DEADLINE_MS));

    long processed = outcomes(PROCESSED), deduped = outcomes(DEDUPED);
    cr_expect_eq(processed, t.keys, "processed %ld of %d keys", processed, t.keys);
    cr_expect_eq(deduped, 2L * t.keys);
    cr_expect_eq(outcomes("\"outcome\":\"state_noop\""), 0);
    cr_expect_eq(outcomes("\"outcome\":\"dead_lettered\""), t.failed);
    expect_effects("r", t.keys);

    race_report rep;
    race_read_log(t.keys, &rep);
    long retried = outcomes("\"outcome\":\"retried\"");
    long failed_rotations =
        harness_log_count_both(F.h.log_path, "\"level\":\"warn\"", "dedup rotation:");
    cr_log_info("%s: %d keys, %d messages (and %d failing) in %lld ms, %ld rotations meanwhile, "
                "%ld keys with a rotation between their copies, widest spread of one key's copies "
                "%lld ms, the slowest rotation %.1f ms to its rename, %ld retried, %ld rotation "
                "warnings",
                name, t.keys, 3 * t.keys, t.failed, rep.last_ms - rep.first_ms,
                rep.rotations_during, rep.keys_straddling, rep.widest_spread_ms,
                rep.longest_rename_ms, retried, failed_rotations);
    /* The premises: rotations fell among the copies, and every key's copies stayed within one
     * period (beyond two rotations a copy may rightly apply again). */
    cr_expect_geq(rep.rotations_during, 2, "rotations while the copies were applied: %ld",
                  rep.rotations_during);
    cr_expect_geq(rep.keys_straddling, 1, "no rotation fell between the copies of a key");
    cr_expect_lt(rep.widest_spread_ms, RACE_PERIOD_MS, "one key's copies were %lld ms apart",
                 rep.widest_spread_ms);
    cr_expect_eq(failed_rotations, 0, "a rotation failed under load");
    harness_stop_idemq(&F.daemon);
}

Test(rotation, duplicates_racing_a_rotation_apply_once)
{
    duplicates_racing_rotations("rotation_race", NULL, false);
}

Test(rotation, duplicates_racing_a_rotation_apply_once_among_failures_rolled_back_to_savepoints)
{
    duplicates_racing_rotations("rotation_race_savepoints", sql_tick_handler, true);
}

/* ------------------------------------------------------------- two instances */

/* One rotation line: its log time, the time msg_dedup had been current since, and how long the
 * rotation took after its rename (recording its time, then dropping the old table): the line is
 * written that long after the rotation recorded the time the next period counts from. */
typedef struct rotation_line {
    long long ts_ms;
    char since[32];
    double after_rename_ms;
} rotation_line;

/* The rotation lines of the log at path, appended at out[*n] (up to max). */
static void collect_rotations(const char *path, rotation_line *out, size_t *n, size_t max)
{
    json_t *log = load_log(path);
    size_t i;
    json_t *line;
    json_array_foreach(log, i, line)
    {
        const char *msg = harness_json_str(line, "msg"), *at = strstr(msg, "(current since ");
        if (!strstr(msg, ROTATED))
            continue;
        cr_assert(*n < max);
        cr_assert(at, "a rotation line without its time: %s", msg);
        out[*n].ts_ms = parse_ts(harness_json_str(line, "ts"));
        cr_assert_geq(out[*n].ts_ms, 0);
        snprintf(out[*n].since, sizeof out[*n].since, "%.23s", at + strlen("(current since "));
        const char *last_paren = strrchr(msg, '(');
        cr_assert(last_paren && sscanf(last_paren, "(%lf ms)", &out[*n].after_rename_ms) == 1,
                  "a rotation line without its drop time: %s", msg);
        (*n)++;
    }
    json_decref(log);
}

static int compare_ts(const void *a, const void *b)
{
    long long x = ((const rotation_line *)a)->ts_ms, y = ((const rotation_line *)b)->ts_ms;
    return (x > y) - (x < y);
}

typedef struct two_run {
    int64_t started_ms;
    const char *second_log;
    const char *forced_since; /* of the period the test made due */
} two_run;

static long rotations_of_both(harness *h, const two_run *t)
{
    return harness_log_count(h, ROTATED) + harness_log_count_in(t->second_log, ROTATED);
}

/* A run of 7 s, and at least three rotations in it. */
static bool two_run_done(harness *h, void *arg)
{
    two_run *t = arg;
    return harness_now_ms() - t->started_ms >= 7000 && rotations_of_both(h, t) >= 3;
}

/* The rotation of the period the test made due is logged, and one after it. */
static bool forced_and_next_rotated(harness *h, void *arg)
{
    two_run *t = arg;
    enum { MAX_ROTATIONS = 64 };
    rotation_line rot[MAX_ROTATIONS];
    size_t n = 0;
    collect_rotations(h->log_path, rot, &n, MAX_ROTATIONS);
    collect_rotations(t->second_log, rot, &n, MAX_ROTATIONS);
    long long forced_ms = -1;
    for (size_t k = 0; k < n; k++)
        if (strcmp(rot[k].since, t->forced_since) == 0)
            forced_ms = rot[k].ts_ms;
    for (size_t k = 0; k < n && forced_ms >= 0; k++)
        if (rot[k].ts_ms > forced_ms)
            return true;
    return false;
}

/* Every message settled (processed or deduped) by one of the two. */
static bool both_settled(harness *h, void *arg)
{
    two_run *t = arg;
    return harness_log_count(h, PROCESSED) + harness_log_count(h, DEDUPED) +
               harness_log_count_in(t->second_log, PROCESSED) +
               harness_log_count_in(t->second_log, DEDUPED) >=
           400;
}

/* Who waits for the test's lock on idemq_dedup_rotation's row: rotation checks (their claim's
 * locking read) and rotations that were under way (their last UPDATE). */
typedef struct row_waiters {
    long long claims, updates;
} row_waiters;

static bool claims_wait(harness *h, void *arg)
{
    row_waiters *w = arg;
    static const char who[] = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = "
                              "DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE '%s'";
    w->claims = harness_scalar(h, who, "SELECT rotated_at, %%idemq_dedup_rotation%%FOR UPDATE");
    w->updates = harness_scalar(h, who, "UPDATE idemq_dedup_rotation%%");
    return w->claims >= 2 || w->updates > 0;
}

/* Makes the two instances' claims meet: holds msg_dedup's row, with the rotation due, until
 * both instances' checks wait for it, then lets them go. Returns (into since) the time the test
 * recorded, which the rotation of that period reports. A rotation that was under way when the
 * test took the row (its last UPDATE waits too) would overwrite that time: the test lets it
 * finish and tries again. */
static void make_claims_meet(char *since, size_t since_len)
{
    for (int attempt = 1;; attempt++) {
        locker = harness_db_open(&F.h);
        cr_assert(mysql_query(locker, "BEGIN") == 0, "%s", mysql_error(locker));
        cr_assert(mysql_query(locker, "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) - "
                                      "INTERVAL 2 HOUR WHERE table_name = 'msg_dedup'") == 0,
                  "%s", mysql_error(locker));
        cr_assert(mysql_query(locker, "SELECT rotated_at FROM idemq_dedup_rotation") == 0, "%s",
                  mysql_error(locker));
        MYSQL_RES *res = mysql_store_result(locker);
        MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
        cr_assert(row && row[0]);
        snprintf(since, since_len, "%s", row[0]);
        mysql_free_result(res);
        row_waiters w = {0};
        cr_assert(harness_wait_for(claims_wait, &F.h, &w, DEADLINE_MS),
                  "the two instances' rotation checks did not both wait for the row");
        bool clean = w.updates == 0;
        cr_assert(mysql_query(locker, clean ? "COMMIT" : "ROLLBACK") == 0, "%s",
                  mysql_error(locker));
        mysql_close(locker);
        locker = NULL;
        if (clean)
            return;
        cr_assert_lt(attempt, 3,
                     "an UPDATE of idemq_dedup_rotation waited for the test's lock %d times: a "
                     "rotation under way each time, or a claim that updates without a locking "
                     "read first",
                     attempt);
    }
}

Test(rotation, two_instances_rotate_once_per_period)
{
    rotation_setup r = {.workers = 2,
                        .dedup_yaml = "dedup: {layout: rotating, retention: 2s, interval: 1s}"};
    setup("rotation_two", &r);
    insert_open_orders("t", 0, 200);
    char second_log[400];
    snprintf(second_log, sizeof second_log, "%s/second.log", F.h.dir);
    /* Started together, so that their checks (every dedup.interval from their start) come
     * close together. */
    int64_t started = harness_now_ms();
    F.daemon = harness_spawn(&F.h);
    second_daemon = harness_spawn_logged(&F.h, second_log);
    cr_assert(harness_wait_log(&F.h, READY_LINE, 1, DEADLINE_MS), "idemq did not start consuming");
    cr_assert(harness_wait_log_in(second_log, READY_LINE, 1, DEADLINE_MS),
              "the second idemq did not start consuming");
    publish_keys("t", 0, 200, 2);

    two_run t = {.started_ms = started, .second_log = second_log};
    cr_assert(harness_wait_for(two_run_done, &F.h, &t, DEADLINE_MS),
              "fewer than three rotations in a minute");
    cr_assert(harness_wait_for(both_settled, &F.h, &t, DEADLINE_MS),
              "the two instances did not settle the 400 messages");

    /* Their claims made to meet: the test holds the row with the rotation due, until both
     * instances' checks wait for it; released, one of them rotates and the other finds the
     * period already rotated. */
    char forced_since[32];
    make_claims_meet(forced_since, sizeof forced_since);
    t.forced_since = forced_since;
    cr_assert(harness_wait_for(forced_and_next_rotated, &F.h, &t, DEADLINE_MS),
              "the period made due by the test (since %s) and the next were not both rotated",
              forced_since);

    harness_stop_idemq(&F.daemon);
    cr_expect_eq(harness_stop(second_daemon, SIGTERM, 30000), 0);
    second_daemon = 0;
    int64_t elapsed = harness_now_ms() - started;

    enum { MAX_ROTATIONS = 64 };
    rotation_line rot[MAX_ROTATIONS];
    size_t n = 0;
    collect_rotations(F.h.log_path, rot, &n, MAX_ROTATIONS);
    size_t first_instance = n;
    collect_rotations(second_log, rot, &n, MAX_ROTATIONS);
    cr_log_info("two instances: %zu rotations in %lld ms (%zu by the first, %zu by the second)", n,
                (long long)elapsed, first_instance, n - first_instance);
    /* One per period, plus the forced one. */
    cr_expect_leq((long long)n, elapsed / 2000 + 2, "%zu rotations in %lld ms with a 2 s period", n,
                  (long long)elapsed);
    /* Each period was rotated by one instance: no two rotations ended the same period (two
     * claims that both won would both report the time they read). */
    for (size_t a = 0; a < n; a++)
        for (size_t b = a + 1; b < n; b++)
            cr_expect_str_neq(rot[a].since, rot[b].since,
                              "two rotations of the period current since %s", rot[a].since);
    /* And never two within one period: a rotation starts at least 2 s (the database's clock)
     * after the one before recorded its time, which is its log line's time less its time after
     * the rename (a slow DROP on a loaded machine moves the line, not the period). The forced
     * one is the exception, by construction. */
    qsort(rot, n, sizeof rot[0], compare_ts);
    long forced = 0;
    for (size_t k = 0; k < n; k++) {
        bool is_forced = strcmp(rot[k].since, forced_since) == 0;
        forced += is_forced;
        if (k == 0 || is_forced)
            continue;
        long long period_ms =
            rot[k].ts_ms - (rot[k - 1].ts_ms - (long long)rot[k - 1].after_rename_ms);
        cr_expect_geq(period_ms, 1500,
                      "two rotations %lld ms apart (the later of the period since %s)", period_ms,
                      rot[k].since);
    }
    cr_expect_eq(forced, 1, "the period made due by the test (since %s) was rotated %ld times",
                 forced_since, forced);
    cr_expect_eq(harness_log_count_both(F.h.log_path, "\"level\":\"warn\"", "dedup rotation:"), 0);
    cr_expect_eq(harness_log_count_both(second_log, "\"level\":\"warn\"", "dedup rotation:"), 0);

    /* Both consumed; the two copies of each key were applied once between them. */
    cr_expect_eq(harness_log_count(&F.h, PROCESSED) + harness_log_count_in(second_log, PROCESSED),
                 200);
    expect_effects("t", 200);
}

/* ------------------------------------------------------------- a long transaction */

Test(rotation, a_long_transaction_delays_a_rotation_without_stopping_the_consumers)
{
    rotation_setup r = {.workers = 2};
    setup("rotation_locked", &r);
    insert_open_orders("b", 0, 20);
    insert_open_orders("c", 0, 20);
    start();
    publish_keys("b", 0, 20, 1);
    wait_settled(20);

    /* A person's session, holding msg_dedup open: a row of its own, locked by its primary key
     * (a lock on a message's row, or a gap, would hold that message, not the rotation). */
    harness_sql(&F.h, "INSERT INTO msg_dedup (biz_key, handler_name) VALUES ('held', 'person')");
    long long held = harness_scalar(&F.h, "SELECT id FROM msg_dedup WHERE biz_key = 'held'");
    locker = harness_db_open(&F.h);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT * FROM msg_dedup WHERE id = %lld FOR UPDATE", held);
    cr_assert(mysql_query(locker, "BEGIN") == 0, "%s", mysql_error(locker));
    cr_assert(mysql_query(locker, sql) == 0, "%s", mysql_error(locker));
    mysql_free_result(mysql_store_result(locker));

    harness_sql(&F.h, "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) - INTERVAL 2 HOUR "
                      "WHERE table_name = 'msg_dedup'");
    cr_assert(
        harness_wait_log(&F.h, "dedup rotation: renaming the dedup tables failed", 1, DEADLINE_MS),
        "the blocked rotation did not say so");
    cr_expect_eq(
        harness_log_count_both(F.h.log_path, "renaming the dedup tables failed", "(error 1205)"),
        harness_log_count(&F.h, "renaming the dedup tables failed"),
        "the rename failed for another reason than the lock wait");
    cr_expect_eq(harness_log_count(&F.h, ROTATED), 0);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 21, "nothing moved");
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous"), 0);

    /* Meanwhile messages are still applied; copies of b* are still duplicates. */
    publish_keys("c", 0, 20, 1);
    publish_keys("b", 0, 20, 1);
    wait_settled(60);
    cr_expect_eq(outcomes(PROCESSED), 40);
    cr_expect_eq(outcomes(DEDUPED), 20);
    cr_expect_eq(harness_log_count(&F.h, ROTATED), 0);

    mysql_close(locker); /* the session ends: the next try rotates */
    locker = NULL;
    cr_assert(harness_wait_log(&F.h, ROTATED, 1, DEADLINE_MS),
              "the rotation did not happen once the transaction ended");
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 0);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup_previous"), 41);
    cr_expect(!table_exists("msg_dedup_expired"));
    publish_keys("b", 0, 20, 1);
    publish_keys("c", 0, 20, 1);
    wait_settled(100);
    cr_expect_eq(outcomes(DEDUPED), 60);
    expect_effects("b", 20);
    expect_effects("c", 20);
    harness_stop_idemq(&F.daemon);
}

/* ANALYZE TABLE succeeds as a statement even when it could not analyze: the failure is a row of
 * its result. The rotation analyzes msg_dedup just before its rename (swap_tables), after it
 * released the table; a session that took LOCK TABLES ... WRITE in between made the ANALYZE wait
 * lock_wait_timeout and "succeed", and the rename went ahead with stale statistics. */
Test(rotation, an_analyze_that_could_not_run_fails_with_the_servers_reason)
{
    rotation_setup r = {0};
    setup("rotation_analyze", &r);
    char err[512] = "";
    MYSQL *analyzer = harness_db_open(&F.h);
    cr_assert(mysql_query(analyzer, "SET SESSION lock_wait_timeout = 1") == 0, "%s",
              mysql_error(analyzer));
    cr_assert_eq(rotation_analyze(analyzer, "msg_dedup", err, sizeof err), 0, "%s", err);

    locker = harness_db_open(&F.h);
    cr_assert(mysql_query(locker, "LOCK TABLES msg_dedup WRITE") == 0, "%s", mysql_error(locker));
    err[0] = '\0';
    cr_expect_eq(rotation_analyze(analyzer, "msg_dedup", err, sizeof err), -1,
                 "an ANALYZE that waited out a table lock counted as done");
    cr_expect(strstr(err, "analyzing msg_dedup failed: ") && strstr(err, "Lock wait timeout"),
              "the reason: \"%s\"", err);
    mysql_close(locker);
    locker = NULL;

    err[0] = '\0';
    cr_expect_eq(rotation_analyze(analyzer, "msg_dedup_missing", err, sizeof err), -1);
    cr_expect(strstr(err, "msg_dedup_missing") && strstr(err, "doesn't exist"),
              "the reason: \"%s\"", err);
    /* The session is usable afterwards: the result was read to its end. */
    cr_expect_eq(rotation_analyze(analyzer, "msg_dedup", err, sizeof err), 0, "%s", err);
    mysql_close(analyzer);
}
