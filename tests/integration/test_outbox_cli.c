/*
 * test_outbox_cli — `idemq outbox list|retry|purge` against real MariaDB, driving the real idemq
 * binary with the harness's config (each test its own database, where the harness created
 * idemq_outbox). Rows are inserted directly, in the states the relay would leave them; each test
 * then checks what the command printed and, in the table itself, exactly which rows it changed:
 * list's filters, order, summary and JSON; retry moving only the unroutable rows it was given;
 * purge refusing without --yes, deleting exactly the selected rows with it and never a pending
 * one; the missing-table error; usage errors (exit 2, nothing touched).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { PENDING = 0, PUBLISHED = 1, UNROUTABLE = 2 };

static harness_fixture F;
#define H (F.h)

static void teardown(void)
{
    harness_fixture_fini(&F);
}

TestSuite(outbox_cli, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------------------------ helpers */

typedef struct row_spec {
    int state;
    int created_ago_s;   /* created_at = NOW(3) - this */
    int published_ago_s; /* < 0: published_at NULL */
    unsigned attempts;
    const char *biz_key;    /* NULL: "emit-<n>" */
    const char *last_error; /* NULL: NULL */
} row_spec;

/* Inserts one row; returns its id. */
static long long insert_row(const row_spec *r)
{
    static int n;
    char key[64], published[96], error[600];
    n++;
    snprintf(key, sizeof key, "emit-%d", n);
    if (r->published_ago_s >= 0)
        snprintf(published, sizeof published, "NOW(3) - INTERVAL %d SECOND", r->published_ago_s);
    else
        snprintf(published, sizeof published, "NULL");
    if (r->last_error)
        snprintf(error, sizeof error, "'%s'", r->last_error);
    else
        snprintf(error, sizeof error, "NULL");
    harness_sql(&H,
                "INSERT INTO idemq_outbox (source_biz_key, handler_name, emit_name, biz_key, "
                "exchange, routing_key, content_type, body, state, attempts, created_at, "
                "published_at, last_error) VALUES ('order_id:o%d:PAY_SUCCESS', 'pay-callback', "
                "'paid', '%s', 'orders.events', 'order.paid', 'application/json', "
                "'{\"biz_key\":\"%s\"}', %d, %u, NOW(3) - INTERVAL %d SECOND, %s, %s)",
                n, r->biz_key ? r->biz_key : key, r->biz_key ? r->biz_key : key, r->state,
                r->attempts, r->created_ago_s, published, error);
    return harness_scalar(&H, "SELECT LAST_INSERT_ID()");
}

static long long insert_state(int state)
{
    row_spec r = {.state = state,
                  .published_ago_s = state == PUBLISHED ? 60 : -1,
                  .attempts = state == UNROUTABLE ? 3 : (state == PUBLISHED ? 1 : 0),
                  .last_error = state == UNROUTABLE ? "NO_ROUTE: returned by the broker" : NULL};
    return insert_row(&r);
}

/* Inserts count rows in state with one statement (a recursive CTE). */
static void insert_many(int count, int state)
{
    harness_sql(&H, "SET SESSION max_recursive_iterations = %d", count + 1);
    harness_sql(&H,
                "INSERT INTO idemq_outbox (source_biz_key, handler_name, emit_name, biz_key, "
                "exchange, routing_key, content_type, body, state, attempts, published_at, "
                "last_error) WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq "
                "WHERE n < %d) SELECT CONCAT('src-', n), 'pay-callback', 'paid', "
                "CONCAT('bulk-', n), 'x', 'k', 'application/json', '{}', %d, 1, %s, %s FROM seq",
                count, state, state == PUBLISHED ? "NOW(3) - INTERVAL 1 DAY" : "NULL",
                state == UNROUTABLE ? "'NO_ROUTE'" : "NULL");
}

/* Runs `idemq outbox ARGS... -c config` (args NULL-terminated after the subcommand); returns the
 * exit code, *out (stdout and stderr) owned by the caller. */
static int outbox_cli(char **out, const char *sub, ...)
{
    const char *args[32] = {"outbox", sub, "-c", H.config_path};
    size_t n = 4;
    va_list ap;
    va_start(ap, sub);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 31)
        args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    return harness_run_cli(&H, out, args);
}

static long long state_of(long long id)
{
    return harness_scalar(&H,
                          "SELECT COALESCE((SELECT state FROM idemq_outbox WHERE id = %lld), "
                          "-1)",
                          id);
}

static long long count_where(const char *condition)
{
    return harness_scalar(&H, "SELECT COUNT(*) FROM idemq_outbox WHERE %s", condition);
}

/* The line of out that starts with the id (the table's first column), or NULL. */
static const char *line_of_id(const char *out, long long id)
{
    char want[32];
    int len = snprintf(want, sizeof want, "%lld ", id);
    for (const char *line = out; line && *line;) {
        if (strncmp(line, want, (size_t)len) == 0)
            return line;
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return NULL;
}

/* The ids of the table's rows, in output order, into ids; returns how many. (The summary line,
 * "N row(s) shown ...", is not a row.) */
static size_t listed_ids(const char *out, long long *ids, size_t max)
{
    size_t n = 0;
    for (const char *line = out; line && *line && n < max;) {
        char *end;
        long long id = strtoll(line, &end, 10);
        if (end != line && *end == ' ' && strncmp(end, " row(s) shown", 13) != 0)
            ids[n++] = id;
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return n;
}

/* The JSON objects on the lines of out that start with '{', parsed into a new array. */
static json_t *json_lines(const char *out)
{
    json_t *lines = json_array();
    for (const char *line = out; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (line[0] == '{') {
            json_error_t jerr;
            json_t *obj = json_loadb(line, len, 0, &jerr);
            cr_assert(obj, "not JSON (%s): %.*s", jerr.text, (int)len, line);
            json_array_append_new(lines, obj);
        }
        line = end ? end + 1 : NULL;
    }
    return lines;
}

static const char *jstr(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "(absent)";
}

static long long jint(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_integer(v), "%s is not an integer", key);
    return (long long)json_integer_value(v);
}

/* ------------------------------------------------------------------------------ list */

Test(outbox_cli, list_filters_orders_and_counts)
{
    harness_fixture_init(&F, "outbox_list", NULL);
    long long p1 = insert_state(PENDING);
    long long d1 = insert_state(PUBLISHED);
    long long u1 = insert_state(UNROUTABLE);
    long long p2 = insert_state(PENDING);
    long long d2 = insert_state(PUBLISHED);
    long long d3 = insert_state(PUBLISHED);

    char *out = NULL;
    long long ids[16];
    cr_assert_eq(outbox_cli(&out, "list", NULL), 0, "%s", out);
    size_t n = listed_ids(out, ids, 16);
    cr_assert_eq(n, 3, "default: pending and unroutable only:\n%s", out);
    cr_expect(ids[0] == p1 && ids[1] == u1 && ids[2] == p2, "oldest first:\n%s", out);
    cr_expect(strstr(out, "pending 2, unroutable 1, published 3"), "summary:\n%s", out);
    cr_expect(strstr(out, "3 row(s) shown"), "%s", out);
    cr_expect(strncmp(out, "id ", 3) == 0 && strstr(out, "routing key") &&
                  strstr(out, "source biz_key") && strstr(out, "last_error"),
              "a header line first:\n%s", out);
    const char *line = line_of_id(out, u1);
    cr_assert(line, "%s", out);
    const char *eol = strchr(line, '\n');
    const char *want[] = {"unroutable",
                          "pay-callback",
                          "paid",
                          "orders.events",
                          "order.paid",
                          "order_id:o3:PAY_SUCCESS",
                          "NO_ROUTE: returned by the broker"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *at = strstr(line, want[i]);
        cr_expect(at && at < eol, "the unroutable row's line lacks %s:\n%s", want[i], out);
    }
    free(out);

    cr_assert_eq(outbox_cli(&out, "list", "--state", "published", NULL), 0, "%s", out);
    n = listed_ids(out, ids, 16);
    cr_expect(n == 3 && ids[0] == d1 && ids[1] == d2 && ids[2] == d3, "published only:\n%s", out);
    cr_expect(strstr(out, "pending 2, unroutable 1, published 3"),
              "the summary counts the whole table:\n%s", out);
    free(out);

    cr_assert_eq(outbox_cli(&out, "list", "--state", "all", NULL), 0, "%s", out);
    n = listed_ids(out, ids, 16);
    cr_expect_eq(n, 6, "%s", out);
    for (size_t i = 1; i < n; i++)
        cr_expect(ids[i - 1] < ids[i], "oldest first:\n%s", out);
    free(out);

    cr_assert_eq(outbox_cli(&out, "list", "--state", "unroutable,published", "--limit", "2", NULL),
                 0, "%s", out);
    n = listed_ids(out, ids, 16);
    cr_expect(n == 2 && ids[0] == d1 && ids[1] == u1, "the two oldest of those:\n%s", out);
    cr_expect(strstr(out, "--limit reached"), "%s", out);
    free(out);

    harness_sql(&H, "DELETE FROM idemq_outbox WHERE state <> 1");
    cr_assert_eq(outbox_cli(&out, "list", NULL), 0, "%s", out);
    cr_expect(strstr(out, "0 row(s) shown") && strstr(out, "pending 0, unroutable 0, published 3"),
              "%s", out);
    cr_expect(strncmp(out, "id ", 3) != 0, "no header without rows:\n%s", out);
    free(out);
}

Test(outbox_cli, list_text_truncates_and_escapes)
{
    harness_fixture_init(&F, "outbox_list_text", NULL);
    char long_key[121];
    memset(long_key, 'k', 120);
    long_key[120] = '\0';
    char long_error[301];
    memset(long_error, 'e', 300);
    long_error[300] = '\0';
    row_spec r = {.state = UNROUTABLE,
                  .created_ago_s = 7200 + 300,
                  .published_ago_s = -1,
                  .attempts = 7,
                  .biz_key = long_key,
                  .last_error = long_error};
    long long id = insert_row(&r);
    harness_sql(&H,
                "UPDATE idemq_outbox SET routing_key = CONCAT('a', CHAR(10), 'b', "
                "UNHEX('FF')) WHERE id = %lld",
                id);

    char *out = NULL;
    cr_assert_eq(outbox_cli(&out, "list", NULL), 0, "%s", out);
    const char *line = line_of_id(out, id);
    cr_assert(line, "%s", out);
    const char *eol = strchr(line, '\n');
    cr_assert(eol);
    cr_expect(!strstr(out, long_key) && strstr(line, "kkkk...") && strstr(line, "kkkk...") < eol,
              "a long biz_key is cut:\n%s", out);
    cr_expect(!strstr(out, long_error) && strstr(line, "eeee...") && strstr(line, "eeee...") < eol,
              "a long last_error is cut:\n%s", out);
    cr_expect(strstr(line, "a\\x0ab\\xff") && strstr(line, "a\\x0ab\\xff") < eol,
              "control and invalid bytes are escaped on one line:\n%s", out);
    cr_expect(strstr(line, "2h5m") && strstr(line, "2h5m") < eol, "the age:\n%s", out);
    free(out);
}

Test(outbox_cli, list_json_has_every_column)
{
    harness_fixture_init(&F, "outbox_list_json", NULL);
    long long pending = insert_state(PENDING);
    long long unroutable = insert_state(UNROUTABLE);
    row_spec pub = {
        .state = PUBLISHED, .created_ago_s = 3600, .published_ago_s = 1800, .attempts = 1};
    long long published = insert_row(&pub);
    /* A MessagePack-like body: not UTF-8, so it comes as base64. */
    harness_sql(&H,
                "UPDATE idemq_outbox SET body = UNHEX('82A16101FF00'), content_type = "
                "'application/msgpack' WHERE id = %lld",
                unroutable);

    char *out = NULL;
    cr_assert_eq(outbox_cli(&out, "list", "--state", "all", "--json", NULL), 0, "%s", out);
    json_t *lines = json_lines(out);
    cr_assert_eq(json_array_size(lines), 4, "three rows and the summary:\n%s", out);

    json_t *p = json_array_get(lines, 0);
    cr_expect_eq(jint(p, "id"), pending);
    cr_expect_str_eq(jstr(p, "state"), "pending");
    cr_expect_eq(jint(p, "attempts"), 0);
    cr_expect_str_eq(jstr(p, "body_encoding"), "text");
    cr_expect_str_eq(jstr(p, "content_type"), "application/json");
    cr_expect(json_is_null(json_object_get(p, "published_at")), "%s", out);
    cr_expect(json_is_null(json_object_get(p, "last_error")), "%s", out);
    static const char *const keys[] = {
        "id",           "source_biz_key", "handler_name", "emit_name",    "biz_key",  "exchange",
        "routing_key",  "content_type",   "body",         "state",        "attempts", "created_at",
        "published_at", "last_error",     "age_seconds",  "body_encoding"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_expect(json_object_get(p, keys[i]), "no %s in %s", keys[i], out);
    char body[64];
    snprintf(body, sizeof body, "{\"biz_key\":\"%s\"}", jstr(p, "biz_key"));
    cr_expect_str_eq(jstr(p, "body"), body);
    cr_expect_str_eq(jstr(p, "handler_name"), "pay-callback");
    cr_expect_str_eq(jstr(p, "emit_name"), "paid");
    cr_expect_str_eq(jstr(p, "exchange"), "orders.events");
    cr_expect_str_eq(jstr(p, "routing_key"), "order.paid");
    cr_expect(strncmp(jstr(p, "source_biz_key"), "order_id:o", 10) == 0, "%s", out);

    json_t *u = json_array_get(lines, 1);
    cr_expect_eq(jint(u, "id"), unroutable);
    cr_expect_str_eq(jstr(u, "state"), "unroutable");
    cr_expect_eq(jint(u, "attempts"), 3);
    cr_expect_str_eq(jstr(u, "last_error"), "NO_ROUTE: returned by the broker");
    cr_expect_str_eq(jstr(u, "body_encoding"), "base64");
    cr_expect_str_eq(jstr(u, "body"), "gqFhAf8A");

    json_t *d = json_array_get(lines, 2);
    cr_expect_eq(jint(d, "id"), published);
    cr_expect_str_eq(jstr(d, "state"), "published");
    long long age = jint(d, "age_seconds");
    cr_expect(age >= 3600 && age < 3700, "age_seconds %lld", age);
    const char *created = jstr(d, "created_at"), *sent = jstr(d, "published_at");
    cr_expect(strlen(created) == 24 && created[10] == 'T' && created[23] == 'Z', "ISO 8601 UTC: %s",
              created);
    cr_expect(strcmp(created, sent) < 0, "created %s before published %s", created, sent);

    json_t *summary = json_object_get(json_array_get(lines, 3), "summary");
    cr_assert(summary, "%s", out);
    cr_expect_eq(jint(summary, "pending"), 1);
    cr_expect_eq(jint(summary, "unroutable"), 1);
    cr_expect_eq(jint(summary, "published"), 1);
    cr_expect_eq(jint(json_array_get(lines, 3), "shown"), 3);
    json_decref(lines);
    free(out);
}

/* ------------------------------------------------------------------------------ retry */

Test(outbox_cli, retry_ids_moves_only_the_unroutable_rows_named)
{
    harness_fixture_init(&F, "outbox_retry_ids", NULL);
    long long u1 = insert_state(UNROUTABLE);
    long long u2 = insert_state(UNROUTABLE);
    long long p = insert_state(PENDING);
    long long d = insert_state(PUBLISHED);
    long long u3 = insert_state(UNROUTABLE);
    harness_sql(&H, "UPDATE idemq_outbox SET attempts = 5 WHERE id = %lld", u1);
    long long published_at = harness_scalar(
        &H, "SELECT UNIX_TIMESTAMP(published_at) * 1000 FROM idemq_outbox WHERE id = %lld", d);

    char *out = NULL;
    char a[32], b[32], c[32];
    snprintf(a, sizeof a, "%lld", u1);
    snprintf(b, sizeof b, "%lld", p);
    snprintf(c, sizeof c, "%lld", d);
    int rc = outbox_cli(&out, "retry", "--id", a, "--id", b, "--id", c, "--id", "99999", "--id", a,
                        NULL);
    cr_expect_eq(rc, 1, "ids that were not requeued make it exit 1:\n%s", out);
    cr_expect(strstr(out, "requeued 1 unroutable row(s)"), "%s", out);
    cr_expect(strstr(out, "is pending (not yet published): left alone") &&
                  strstr(out, "was published: left alone, it is not sent again") &&
                  strstr(out, "id 99999: no such row") &&
                  strstr(out, "only unroutable rows are retried"),
              "%s", out);
    free(out);
    cr_expect_eq(state_of(u1), PENDING);
    cr_expect_eq(
        harness_scalar(&H, "SELECT last_error IS NULL FROM idemq_outbox WHERE id = %lld", u1), 1,
        "last_error cleared");
    cr_expect_eq(harness_scalar(&H, "SELECT attempts FROM idemq_outbox WHERE id = %lld", u1), 5,
                 "attempts kept");
    cr_expect_eq(state_of(u2), UNROUTABLE, "not named: untouched");
    cr_expect_eq(state_of(u3), UNROUTABLE, "not named: untouched");
    cr_expect_eq(state_of(p), PENDING);
    cr_expect_eq(state_of(d), PUBLISHED, "a published row is never requeued");
    cr_expect_eq(harness_scalar(&H,
                                "SELECT UNIX_TIMESTAMP(published_at) * 1000 FROM idemq_outbox "
                                "WHERE id = %lld",
                                d),
                 published_at);

    snprintf(a, sizeof a, "%lld", u2);
    cr_expect_eq(outbox_cli(&out, "retry", "--id", a, "--json", NULL), 0, "%s", out);
    json_t *lines = json_lines(out);
    cr_assert_eq(json_array_size(lines), 1, "%s", out);
    cr_expect_eq(jint(json_array_get(lines, 0), "requeued"), 1);
    cr_expect_eq(json_array_size(json_object_get(json_array_get(lines, 0), "left_alone")), 0);
    json_decref(lines);
    free(out);
    cr_expect_eq(state_of(u2), PENDING);
    cr_expect_eq(state_of(u3), UNROUTABLE);

    snprintf(a, sizeof a, "%lld", p);
    cr_expect_eq(outbox_cli(&out, "retry", "--id", a, "--json", NULL), 1, "%s", out);
    lines = json_lines(out);
    cr_assert_eq(json_array_size(lines), 1, "%s", out);
    json_t *left = json_object_get(json_array_get(lines, 0), "left_alone");
    cr_expect_eq(jint(json_array_get(lines, 0), "requeued"), 0);
    cr_expect(json_array_size(left) == 1 && jint(json_array_get(left, 0), "id") == p &&
                  strcmp(jstr(json_array_get(left, 0), "state"), "pending") == 0,
              "%s", out);
    json_decref(lines);
    free(out);
}

Test(outbox_cli, retry_unroutable_requeues_every_unroutable_row_in_chunks)
{
    harness_fixture_init(&F, "outbox_retry_all", NULL);
    long long p = insert_state(PENDING);
    long long d = insert_state(PUBLISHED);
    insert_many(2345, UNROUTABLE); /* more than two chunks of 1000 */
    insert_many(10, PUBLISHED);

    char *out = NULL;
    cr_assert_eq(outbox_cli(&out, "retry", "--unroutable", NULL), 0, "%s", out);
    cr_expect(strstr(out, "requeued 2345 unroutable row(s)"), "%s", out);
    free(out);
    cr_expect_eq(count_where("state = 2"), 0);
    cr_expect_eq(count_where("state = 0"), 2346);
    cr_expect_eq(count_where("state = 0 AND last_error IS NOT NULL"), 0);
    cr_expect_eq(count_where("state = 1"), 11, "published rows untouched");
    cr_expect_eq(state_of(p), PENDING);
    cr_expect_eq(state_of(d), PUBLISHED);

    cr_assert_eq(outbox_cli(&out, "retry", "--unroutable", "--json", NULL), 0, "%s", out);
    json_t *lines = json_lines(out);
    cr_expect_eq(jint(json_array_get(lines, 0), "requeued"), 0, "nothing left:\n%s", out);
    json_decref(lines);
    free(out);
}

/* ------------------------------------------------------------------------------ purge */

Test(outbox_cli, purge_refuses_without_yes_and_says_what_it_would_delete)
{
    harness_fixture_init(&F, "outbox_purge_refuse", NULL);
    insert_state(PENDING);
    insert_state(PUBLISHED);
    insert_state(PUBLISHED);
    long long u = insert_state(UNROUTABLE);
    long long p = insert_state(PENDING);

    char *out = NULL;
    cr_expect_eq(outbox_cli(&out, "purge", "--published", NULL), 2, "%s", out);
    cr_expect(strstr(out, "would delete 2 published row(s); pass --yes") &&
                  strstr(out, "pending rows are never purged"),
              "%s", out);
    free(out);
    cr_expect_eq(outbox_cli(&out, "purge", "--unroutable", NULL), 2, "%s", out);
    cr_expect(strstr(out, "would delete 1 unroutable row(s)"), "%s", out);
    free(out);
    cr_expect_eq(outbox_cli(&out, "purge", "--published", "--older-than", "1d", NULL), 2, "%s",
                 out);
    cr_expect(strstr(out, "would delete 0 published row(s) published more than 1d ago"), "%s", out);
    free(out);
    char a[32], b[32];
    snprintf(a, sizeof a, "%lld", u);
    snprintf(b, sizeof b, "%lld", p);
    cr_expect_eq(outbox_cli(&out, "purge", "--id", a, "--id", b, NULL), 2, "%s", out);
    cr_expect(strstr(out, "would delete 1 of the named row(s)"), "%s", out);
    cr_expect(strstr(out, "is pending: not purged"), "%s", out);
    free(out);
    cr_expect_eq(count_where("1"), 5, "nothing was deleted");
}

Test(outbox_cli, purge_deletes_exactly_the_selected_rows_and_never_pending)
{
    harness_fixture_init(&F, "outbox_purge", NULL);
    row_spec old = {.state = PUBLISHED,
                    .created_ago_s = 11 * 86400,
                    .published_ago_s = 10 * 86400,
                    .attempts = 1};
    row_spec recent = {
        .state = PUBLISHED, .created_ago_s = 7200, .published_ago_s = 3600, .attempts = 1};
    row_spec old_pending = {.state = PENDING, .created_ago_s = 30 * 86400, .published_ago_s = -1};
    long long old1 = insert_row(&old), old2 = insert_row(&old);
    long long new1 = insert_row(&recent);
    long long p1 = insert_row(&old_pending);
    long long p2 = insert_state(PENDING);
    long long u1 = insert_state(UNROUTABLE), u2 = insert_state(UNROUTABLE);

    char *out = NULL;
    cr_assert_eq(outbox_cli(&out, "purge", "--published", "--older-than", "7d", "--yes", NULL), 0,
                 "%s", out);
    cr_expect(strstr(out, "deleted 2 published row(s) published more than 7d ago"), "%s", out);
    free(out);
    cr_expect_eq(state_of(old1), -1);
    cr_expect_eq(state_of(old2), -1);
    cr_expect_eq(state_of(new1), PUBLISHED, "published 1h ago: kept");
    cr_expect_eq(count_where("1"), 5);

    cr_assert_eq(outbox_cli(&out, "purge", "--unroutable", "--yes", "--json", NULL), 0, "%s", out);
    json_t *lines = json_lines(out);
    cr_expect_eq(jint(json_array_get(lines, 0), "deleted"), 2, "%s", out);
    json_decref(lines);
    free(out);
    cr_expect_eq(state_of(u1), -1);
    cr_expect_eq(state_of(u2), -1);
    cr_expect_eq(state_of(new1), PUBLISHED);

    cr_assert_eq(outbox_cli(&out, "purge", "--published", "--yes", NULL), 0, "%s", out);
    cr_expect(strstr(out, "deleted 1 published row(s)"), "%s", out);
    free(out);
    cr_expect_eq(count_where("1"), 2, "only the pending rows are left");
    cr_expect_eq(state_of(p1), PENDING, "a 30-day-old pending row is still a message to send");
    cr_expect_eq(state_of(p2), PENDING);
}

Test(outbox_cli, purge_ids_deletes_named_rows_but_not_pending_ones)
{
    harness_fixture_init(&F, "outbox_purge_ids", NULL);
    long long d = insert_state(PUBLISHED);
    long long u = insert_state(UNROUTABLE);
    long long p = insert_state(PENDING);
    long long other = insert_state(UNROUTABLE);

    char *out = NULL;
    char a[32], b[32], c[32];
    snprintf(a, sizeof a, "%lld", d);
    snprintf(b, sizeof b, "%lld", u);
    snprintf(c, sizeof c, "%lld", p);
    cr_expect_eq(
        outbox_cli(&out, "purge", "--id", a, "--id", b, "--id", c, "--id", "424242", "--yes", NULL),
        1, "a named row that was not deleted makes it exit 1:\n%s", out);
    cr_expect(strstr(out, "deleted 2 row(s) named by --id"), "%s", out);
    cr_expect(strstr(out, "is pending: not purged (pending rows are never purged: they are "
                          "messages not yet sent)"),
              "%s", out);
    cr_expect(strstr(out, "id 424242: no such row"), "%s", out);
    free(out);
    cr_expect_eq(state_of(d), -1);
    cr_expect_eq(state_of(u), -1);
    cr_expect_eq(state_of(p), PENDING);
    cr_expect_eq(state_of(other), UNROUTABLE, "not named: kept");
}

Test(outbox_cli, purge_many_rows_in_chunks)
{
    harness_fixture_init(&F, "outbox_purge_many", NULL);
    insert_many(2500, PUBLISHED);
    insert_many(1200, PENDING);
    char *out = NULL;
    cr_assert_eq(outbox_cli(&out, "purge", "--published", "--yes", NULL), 0, "%s", out);
    cr_expect(strstr(out, "deleted 2500 published row(s)"), "%s", out);
    free(out);
    cr_expect_eq(count_where("state = 1"), 0);
    cr_expect_eq(count_where("state = 0"), 1200, "pending rows are never purged");
}

/* ------------------------------------------------------------------------------ errors */

Test(outbox_cli, missing_table_says_to_migrate)
{
    harness_fixture_init(&F, "outbox_missing", NULL);
    harness_sql(&H, "DROP TABLE idemq_outbox");
    const char *const commands[][4] = {
        {"list", NULL},
        {"list", "--json", NULL},
        {"retry", "--unroutable", NULL},
        {"retry", "--id", "1", NULL},
        {"purge", "--published", "--yes", NULL},
        {"purge", "--id", "1", NULL},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char *out = NULL;
        int rc =
            outbox_cli(&out, commands[i][0], commands[i][1], commands[i][2], commands[i][3], NULL);
        cr_expect_eq(rc, 1, "outbox %s %s: %s", commands[i][0], commands[i][1], out);
        cr_expect(strstr(out, "idemq_outbox does not exist; run `idemq migrate`"), "%s", out);
        free(out);
    }
}

Test(outbox_cli, usage_errors_exit_2_and_touch_nothing)
{
    harness_fixture_init(&F, "outbox_usage", NULL);
    insert_state(PUBLISHED);
    insert_state(UNROUTABLE);
    const char *const bad[][6] = {
        {"frob", NULL},
        {"retry", NULL},
        {"retry", "--id", "1", "--unroutable", NULL},
        {"retry", "--id", "abc", NULL},
        {"retry", "--id", "0", NULL},
        {"retry", "--id", "-3", NULL},
        {"retry", "--unroutable", "--yes", NULL},
        {"purge", "--yes", NULL},
        {"purge", "--published", "--unroutable", "--yes", NULL},
        {"purge", "--unroutable", "--older-than", "1d", "--yes", NULL},
        {"purge", "--published", "--older-than", "5x", "--yes", NULL},
        {"purge", "--published", "--state", "all", "--yes", NULL},
        {"list", "--state", "bogus", NULL},
        {"list", "--id", "3", NULL},
        {"list", "--yes", NULL},
        {"list", "--limit", "0", NULL},
        {"list", "--queue", "q", NULL},
        {"list", "extra", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        int rc = outbox_cli(&out, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4], bad[i][5]);
        cr_expect_eq(rc, 2, "outbox %s %s %s: exit %d\n%s", bad[i][0], bad[i][1] ? bad[i][1] : "",
                     bad[i][2] ? bad[i][2] : "", rc, out);
        cr_expect(strstr(out, "usage: idemq COMMAND"), "the usage text follows:\n%s", out);
        free(out);
    }
    /* Without a subcommand, and outbox options given to another command. */
    char *out = NULL;
    const char *no_sub[] = {"outbox", NULL};
    cr_expect_eq(harness_run_cli(&H, &out, no_sub), 2, "%s", out);
    cr_expect(strstr(out, "outbox needs list, retry or purge"), "%s", out);
    free(out);
    const char *dlq[] = {"dlq", "list", "-c", H.config_path, "--state", "all", NULL};
    cr_expect_eq(harness_run_cli(&H, &out, dlq), 2, "%s", out);
    cr_expect(strstr(out, "--state is not an option of dlq"), "%s", out);
    free(out);
    /* Each command declares its options: one it does not take is refused, not ignored. */
    const char *run[] = {"run", "-c", H.config_path, "--queue", "q", NULL};
    cr_expect_eq(harness_run_cli(&H, &out, run), 2, "%s", out);
    cr_expect(strstr(out, "--queue is not an option of run"), "%s", out);
    free(out);
    const char *topology[] = {"topology", "-c", H.config_path, "--yes", NULL};
    cr_expect_eq(harness_run_cli(&H, &out, topology), 2, "%s", out);
    cr_expect(strstr(out, "--yes is not an option of topology"), "%s", out);
    free(out);
    cr_expect_eq(count_where("1"), 2, "nothing was touched");
    cr_expect_eq(count_where("state = 2"), 1);
}
