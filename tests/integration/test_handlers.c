/*
 * test_handlers — the sql and plugin handlers, driving the real idemq binary against real
 * RabbitMQ and MariaDB (dedup retention has its own suite, test_retention.c).
 *
 *   sql:       injection-looking field values are stored verbatim and the schema stays intact;
 *              wrong field types and a missing field are dead-lettered at once (non_retryable)
 *              with MySQL's reason or the field's name; an expect_rows mismatch is retried or
 *              dead-lettered by on_mismatch; a nested dotted field binds; `idemq check`
 *              prepares each statement against the schema.
 *   plugin:    the example ledger plugin returns each result class (ok → processed, retryable →
 *              retried then retries_exhausted, non-retryable → DLQ); its SQL is rolled back with
 *              the dedup row on failure; plugins with the wrong ABI version or without the entry
 *              symbol make `idemq run` exit 2 with a clear message.
 *
 * Each test has its own database and queue (harness.h). Waits are on observable conditions (row
 * counts, queue depths, log lines) with deadlines; no sleep is used for synchronisation.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/message.h"
#include "harness.h"

#ifndef IDEMQ_LEDGER_PLUGIN
#error "CMake passes IDEMQ_LEDGER_PLUGIN (the example plugin's path)"
#endif

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"

/* ------------------------------------------------------------------------------ fixture */

static harness H;
static bool h_ready;
static pid_t daemon_pid;

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    if (h_ready)
        harness_fini(&H);
    h_ready = false;
}

TestSuite(handlers, .fini = teardown, .timeout = 120);

static void setup(const char *name, const harness_options *o)
{
    harness_init(&H, name, o);
    h_ready = true;
}

static bool wait_log(const char *needle, long at_least)
{
    return harness_wait_log(&H, needle, at_least, DEADLINE_MS);
}

/* Publishes a JSON object (taken) as a message. */
static void publish_json(json_t *doc)
{
    char *body = json_dumps(doc, JSON_COMPACT);
    cr_assert_not_null(body);
    harness_publish(&H, NULL, "application/json", body, strlen(body), NULL);
    free(body);
    json_decref(doc);
}

/* The first column of the first row as an owned string; NULL for SQL NULL or no row. */
static char *fetch_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *fetch_text(const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    cr_assert(mysql_query(H.db, sql) == 0, "%s: %s", sql, mysql_error(H.db));
    MYSQL_RES *res = mysql_store_result(H.db);
    cr_assert_not_null(res, "%s returned no result set", sql);
    MYSQL_ROW row = mysql_fetch_row(res);
    unsigned long *lengths = mysql_fetch_lengths(res);
    char *out = row && row[0] ? strndup(row[0], lengths[0]) : NULL;
    mysql_free_result(res);
    return out;
}

static char dlq_name[200];

static const char *dlq(void)
{
    snprintf(dlq_name, sizeof dlq_name, "%s.dlq", H.queue);
    return dlq_name;
}

/* A dead letter, with the headers the tests look at. */
typedef struct dead_letter {
    char biz_key[200];
    char error_class[64];
    char error[1100];
    char retries[32];
} dead_letter;

static void header(const amqp_message_t *m, const char *name, char *buf, size_t len)
{
    amqp_bytes_t v;
    amqp_table_entry_t *entry = NULL;
    buf[0] = '\0';
    if (message_header_bytes(&m->properties, name, &v)) {
        snprintf(buf, len, "%.*s", (int)v.len, (const char *)v.bytes);
        return;
    }
    if (!(m->properties._flags & AMQP_BASIC_HEADERS_FLAG))
        return;
    for (int i = 0; i < m->properties.headers.num_entries; i++)
        if (strlen(name) == m->properties.headers.entries[i].key.len &&
            !memcmp(name, m->properties.headers.entries[i].key.bytes, strlen(name)))
            entry = &m->properties.headers.entries[i];
    if (entry) {
        int64_t n = 0;
        switch (entry->value.kind) {
        case AMQP_FIELD_KIND_I8:
            n = entry->value.value.i8;
            break;
        case AMQP_FIELD_KIND_U8:
            n = entry->value.value.u8;
            break;
        case AMQP_FIELD_KIND_I16:
            n = entry->value.value.i16;
            break;
        case AMQP_FIELD_KIND_U16:
            n = entry->value.value.u16;
            break;
        case AMQP_FIELD_KIND_I32:
            n = entry->value.value.i32;
            break;
        case AMQP_FIELD_KIND_U32:
            n = entry->value.value.u32;
            break;
        case AMQP_FIELD_KIND_I64:
            n = entry->value.value.i64;
            break;
        case AMQP_FIELD_KIND_U64:
            n = (int64_t)entry->value.value.u64;
            break;
        default:
            return;
        }
        snprintf(buf, len, "%lld", (long long)n);
    }
}

/* Takes every message of the DLQ (expected: count of them) into out, keyed by biz_key order of
 * arrival. */
static void take_dead_letters(dead_letter *out, size_t count)
{
    cr_assert(harness_wait_queue_depth(&H, dlq(), (long)count, DEADLINE_MS));
    for (size_t i = 0; i < count; i++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq(), &m), "DLQ ran dry after %zu of %zu", i, count);
        json_error_t jerr;
        json_t *doc = json_loadb(m.body.bytes, m.body.len, 0, &jerr);
        cr_assert_not_null(doc, "dead letter body is not JSON: %s", jerr.text);
        snprintf(out[i].biz_key, sizeof out[i].biz_key, "%s",
                 json_string_value(json_object_get(doc, "biz_key")));
        json_decref(doc);
        header(&m, "idemq-error-class", out[i].error_class, sizeof out[i].error_class);
        header(&m, "idemq-error", out[i].error, sizeof out[i].error);
        header(&m, "idemq-retries", out[i].retries, sizeof out[i].retries);
        amqp_destroy_message(&m);
    }
}

static const dead_letter *find_dead_letter(const dead_letter *all, size_t count,
                                           const char *biz_key)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp(all[i].biz_key, biz_key) == 0)
            return &all[i];
    cr_assert_fail("no dead letter for %s", biz_key);
    return NULL;
}

static long long dedup_rows(const char *biz_key)
{
    return harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = '%s'", biz_key);
}

/* ------------------------------------------------------------------------------ sql handler */

static const char sql_handler[] =
    "      type: sql\n"
    "      statements:\n"
    "        - sql: \"INSERT INTO notes (biz_key, note, city, amount) VALUES (:biz_key, :note, "
    ":customer.address.city, :amount)\"\n"
    "          expect_rows: 1\n"
    "        - sql: |\n"
    "            UPDATE accounts SET balance = balance + :amount   -- ':amount' in a comment\n"
    "             WHERE id = :account.id\n"
    "          expect_rows: 1\n";

static void create_sql_tables(void)
{
    harness_sql(&H, "CREATE TABLE notes (biz_key VARBINARY(128) PRIMARY KEY, "
                    "note VARCHAR(200) NOT NULL, city VARCHAR(200) NULL, amount BIGINT NOT NULL) "
                    "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4");
    harness_sql(&H, "CREATE TABLE accounts (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL) "
                    "ENGINE=InnoDB");
    harness_sql(&H, "INSERT INTO accounts VALUES ('acc-1', 0), ('acc-2', 100)");
}

/* {biz_key, note, amount, account: {id}, customer: {address: {city}}} */
static json_t *sql_message(const char *biz_key, const char *note, json_t *amount,
                           const char *account, const char *city)
{
    json_t *doc = json_pack("{s:s, s:s, s:o, s:{s:s}}", "biz_key", biz_key, "message_id", biz_key,
                            "amount", amount, "account", "id", account);
    cr_assert_not_null(doc);
    if (note)
        json_object_set_new(doc, "note", json_string(note));
    if (city)
        json_object_set_new(doc, "customer", json_pack("{s:{s:s}}", "address", "city", city));
    return doc;
}

Test(handlers, sql_injection_looking_values_are_stored_verbatim)
{
    harness_options o = {.handler_yaml = sql_handler};
    setup("sql_injection", &o);
    create_sql_tables();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    static const struct {
        const char *key, *note, *city;
        long amount;
    } cases[] = {
        {"inj-1", "'; DROP TABLE orders; --", "Robert'); DROP TABLE notes;--", 5},
        {"inj-2", "\" OR 1=1 -- \\ \\' `x` /* ?", "a:b ::c :amount", 7},
        {"inj-3", "NULL); DELETE FROM accounts; SELECT ('", "\xe6\x9d\xb1\xe4\xba\xac", 11},
        {"inj-4", "0x27 UNION SELECT password FROM mysql.user", "%' OR '1'='1", 13},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        publish_json(sql_message(cases[i].key, cases[i].note, json_integer(cases[i].amount),
                                 "acc-1", cases[i].city));
    cr_assert(harness_wait_scalar(&H, 4, DEADLINE_MS, "SELECT COUNT(*) FROM notes"));
    cr_assert(harness_wait_scalar(&H, 36, DEADLINE_MS,
                                  "SELECT balance FROM accounts WHERE id = 'acc-1'"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *note = fetch_text("SELECT note FROM notes WHERE biz_key = '%s'", cases[i].key);
        char *city = fetch_text("SELECT city FROM notes WHERE biz_key = '%s'", cases[i].key);
        cr_expect_str_eq(note, cases[i].note, "%s", cases[i].key);
        cr_expect_str_eq(city, cases[i].city, "%s (nested dotted field)", cases[i].key);
        free(note);
        free(city);
    }
    /* The schema and the other rows are intact. */
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM information_schema.tables WHERE "
                                    "table_schema = DATABASE() AND table_name IN "
                                    "('orders', 'notes', 'accounts', 'msg_dedup')"),
                 4);
    cr_expect_eq(harness_scalar(&H, "SELECT balance FROM accounts WHERE id = 'acc-2'"), 100);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 4);
    harness_stop_idemq(&daemon_pid);
}

Test(handlers, sql_wrong_types_and_missing_fields_are_dead_lettered_with_the_reason)
{
    harness_options o = {.handler_yaml = sql_handler};
    setup("sql_bad_fields", &o);
    create_sql_tables();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    char long_note[301];
    memset(long_note, 'n', 300);
    long_note[300] = '\0';
    publish_json(sql_message("type-1", "n", json_string("lots"), "acc-1", "c"));
    publish_json(sql_message("type-2", "n", json_pack("{s:i}", "x", 1), "acc-1", "c"));
    publish_json(sql_message("type-3", long_note, json_integer(1), "acc-1", "c"));
    publish_json(sql_message("missing-1", NULL, json_integer(1), "acc-1", "c"));
    publish_json(sql_message("missing-2", "n", json_integer(1), "acc-1", NULL));
    publish_json(sql_message("ok-1", "fine", json_integer(3), "acc-1", "c"));

    dead_letter dl[5];
    take_dead_letters(dl, 5);
    for (size_t i = 0; i < 5; i++) {
        cr_expect_str_eq(dl[i].error_class, "non_retryable", "%s: %s", dl[i].biz_key, dl[i].error);
        cr_expect_str_eq(dl[i].retries, "0", "%s went through the retry ladder", dl[i].biz_key);
    }
    const dead_letter *d = find_dead_letter(dl, 5, "type-1");
    cr_expect(strstr(d->error, "statement 1") && strstr(d->error, "1366") &&
                  strstr(d->error, "Incorrect integer value: 'lots'"),
              "type-1: %s", d->error);
    d = find_dead_letter(dl, 5, "type-2");
    cr_expect(strstr(d->error, "1366") && strstr(d->error, "{\"x\":1}"), "type-2: %s", d->error);
    d = find_dead_letter(dl, 5, "type-3");
    cr_expect(strstr(d->error, "1406") && strstr(d->error, "Data too long for column 'note'"),
              "type-3: %s", d->error);
    d = find_dead_letter(dl, 5, "missing-1");
    cr_expect(strstr(d->error, "field note is missing from the message"), "missing-1: %s",
              d->error);
    d = find_dead_letter(dl, 5, "missing-2");
    cr_expect(strstr(d->error, "field customer.address.city is missing from the message"),
              "missing-2: %s", d->error);

    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS, "SELECT COUNT(*) FROM notes"));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM notes WHERE biz_key = 'ok-1'"), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT balance FROM accounts WHERE id = 'acc-1'"), 3);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 1);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 0);
    harness_stop_idemq(&daemon_pid);
}

/* sql_handler plus extra handler lines. */
static const char *sql_handler_with(const char *extra)
{
    static char yaml[2048];
    snprintf(yaml, sizeof yaml, "%s%s", sql_handler, extra);
    return yaml;
}

Test(handlers, sql_expect_rows_mismatch_is_retried_with_on_mismatch_retry)
{
    harness_options o = {.handler_yaml = sql_handler_with("      on_mismatch: retry\n"),
                         .retry_set = true,
                         .max_retries = 1,
                         .base = "2s",
                         .jitter = "0"};
    setup("sql_mismatch_retry", &o);
    create_sql_tables();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    publish_json(sql_message("late-1", "n", json_integer(4), "acc-late", "c"));
    publish_json(sql_message("never-1", "n", json_integer(4), "acc-never", "c"));
    /* Both fail their first attempt: statement 2 matches no account. */
    cr_assert(wait_log("\"outcome\":\"retried\"", 2));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM notes"), 0,
                 "statement 1 must be rolled back with the failed statement 2");
    /* The account appears before the retry (2 s later): that retry succeeds. */
    harness_sql(&H, "INSERT INTO accounts VALUES ('acc-late', 0)");

    dead_letter dl[1];
    take_dead_letters(dl, 1);
    cr_expect_str_eq(dl[0].biz_key, "never-1");
    cr_expect_str_eq(dl[0].error_class, "retries_exhausted");
    cr_expect_str_eq(dl[0].retries, "1");
    cr_expect(strstr(dl[0].error, "statement 2 changed 0 rows, expected 1"), "%s", dl[0].error);

    cr_assert(harness_wait_scalar(&H, 4, DEADLINE_MS,
                                  "SELECT balance FROM accounts WHERE id = 'acc-late'"));
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM notes"), 1);
    cr_expect_eq(dedup_rows("late-1"), 1);
    cr_expect_eq(dedup_rows("never-1"), 0);
    harness_stop_idemq(&daemon_pid);
}

Test(handlers, sql_expect_rows_mismatch_is_dead_lettered_by_default)
{
    harness_options o = {.handler_yaml = sql_handler};
    setup("sql_mismatch_dlq", &o);
    create_sql_tables();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    publish_json(sql_message("nobody-1", "n", json_integer(4), "acc-nobody", "c"));
    dead_letter dl[1];
    take_dead_letters(dl, 1);
    cr_expect_str_eq(dl[0].error_class, "non_retryable");
    cr_expect_str_eq(dl[0].error, "statement 2 changed 0 rows, expected 1");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM notes"), 0);
    cr_expect_eq(dedup_rows("nobody-1"), 0);
    harness_stop_idemq(&daemon_pid);
}

Test(handlers, check_prepares_sql_statements_against_the_schema)
{
    harness_options o = {.handler_yaml = sql_handler};
    setup("sql_check", &o);
    create_sql_tables();
    const char *args[] = {"check", "-c", H.config_path, NULL};
    char *out = NULL;
    int rc = harness_run_cli(&H, &out, args);
    cr_expect_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "2 sql statement(s) prepared"), "%s", out);
    free(out);

    /* A misspelt column is found without executing anything. */
    o.handler_yaml =
        "      type: sql\n"
        "      statements:\n"
        "        - INSERT INTO notes (biz_key, note, amount) VALUES (:biz_key, 'x', 1)\n"
        "        - UPDATE accounts SET balanse = :amount WHERE id = :account.id\n";
    harness_write_config(&H, &o);
    out = NULL;
    rc = harness_run_cli(&H, &out, args);
    cr_expect_eq(rc, 1, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "statement 2") && strstr(out, "balanse"), "%s", out);
    free(out);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM notes"), 0);
}

/* ------------------------------------------------------------------------------ plugin */

static const char *plugin_yaml(const char *path, const char *config)
{
    static char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "      type: plugin\n"
             "      path: \"%s\"\n"
             "%s%s%s",
             path, config ? "      config: " : "", config ? config : "", config ? "\n" : "");
    return yaml;
}

static void create_ledger(void)
{
    harness_sql(&H, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                    "biz_key VARBINARY(128) NOT NULL, account VARCHAR(64) NULL, "
                    "amount BIGINT NOT NULL) ENGINE=InnoDB");
}

static json_t *ledger_message(const char *biz_key, json_t *amount, json_t *account)
{
    json_t *doc = json_pack("{s:s, s:s}", "biz_key", biz_key, "message_id", biz_key);
    if (amount)
        json_object_set_new(doc, "amount", amount);
    if (account)
        json_object_set_new(doc, "account", account);
    return doc;
}

Test(handlers, plugin_ok_and_non_retryable_results)
{
    harness_options o = {.handler_yaml = plugin_yaml(IDEMQ_LEDGER_PLUGIN, "{fail_first_n: 0}")};
    setup("plugin_results", &o);
    create_ledger();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);
    cr_expect_eq(harness_log_count(&H, "loaded plugin ledger"), 1);

    publish_json(ledger_message("ok-1", json_integer(10), json_string("acc-a")));
    publish_json(ledger_message("ok-1", json_integer(10), json_string("acc-a"))); /* duplicate */
    publish_json(ledger_message("ok-2", json_integer(0), json_pack("{s:s}", "id", "x")));
    publish_json(ledger_message("neg-1", json_integer(-5), json_string("acc-a")));
    publish_json(ledger_message("nomount-1", NULL, NULL));
    publish_json(ledger_message("str-1", json_string("10"), NULL));

    dead_letter dl[3];
    take_dead_letters(dl, 3);
    for (size_t i = 0; i < 3; i++)
        cr_expect_str_eq(dl[i].error_class, "non_retryable", "%s: %s", dl[i].biz_key, dl[i].error);
    cr_expect_str_eq(find_dead_letter(dl, 3, "neg-1")->error,
                     "plugin ledger: negative amount -5 is not allowed");
    cr_expect_str_eq(find_dead_letter(dl, 3, "nomount-1")->error,
                     "plugin ledger: field amount is missing; it must be an integer");
    cr_expect_str_eq(find_dead_letter(dl, 3, "str-1")->error,
                     "plugin ledger: field amount is not an integer; it must be an integer");

    cr_assert(wait_log("\"outcome\":\"deduped\"", 1));
    cr_assert(harness_wait_scalar(&H, 2, DEADLINE_MS, "SELECT COUNT(*) FROM ledger"));
    cr_expect_eq(harness_scalar(&H, "SELECT amount FROM ledger WHERE biz_key = 'ok-1'"), 10);
    char *account = fetch_text("SELECT account FROM ledger WHERE biz_key = 'ok-2'");
    cr_expect_str_eq(account, "{\"id\":\"x\"}", "a map field reaches the plugin as JSON text");
    free(account);
    /* neg-1's ledger row was written by the plugin and rolled back with its dedup row. */
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM ledger WHERE biz_key = 'neg-1'"), 0);
    cr_expect_eq(dedup_rows("neg-1"), 0);
    cr_expect_eq(dedup_rows("ok-1"), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 2);
    harness_stop_idemq(&daemon_pid);
}

Test(handlers, plugin_retryable_is_retried_then_dead_lettered_as_retries_exhausted)
{
    harness_options o = {.handler_yaml =
                             plugin_yaml(IDEMQ_LEDGER_PLUGIN, "{fail_first_n: 1000000}"),
                         .retry_set = true,
                         .max_retries = 1};
    setup("plugin_retryable", &o);
    create_ledger();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    publish_json(ledger_message("r-1", json_integer(10), NULL));
    dead_letter dl[1];
    take_dead_letters(dl, 1);
    cr_expect_str_eq(dl[0].biz_key, "r-1");
    cr_expect_str_eq(dl[0].error_class, "retries_exhausted");
    cr_expect_str_eq(dl[0].retries, "1");
    cr_expect(strstr(dl[0].error, "plugin ledger: failing on purpose (2 of fail_first_n=1000000)"),
              "%s", dl[0].error);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 1);
    /* Both attempts inserted a ledger row; both were rolled back with the dedup row. */
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM ledger"), 0);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 0);
    harness_stop_idemq(&daemon_pid);
}

Test(handlers, plugin_retryable_recovers_on_retry)
{
    harness_options o = {.handler_yaml = plugin_yaml(IDEMQ_LEDGER_PLUGIN, "{fail_first_n: 1}"),
                         .retry_set = true,
                         .max_retries = 3};
    setup("plugin_recovers", &o);
    create_ledger();
    harness_start_declared(&H, READY_LINE, DEADLINE_MS, &daemon_pid);

    publish_json(ledger_message("once-1", json_integer(10), NULL));
    cr_assert(harness_wait_scalar(&H, 1, DEADLINE_MS, "SELECT COUNT(*) FROM ledger"));
    cr_assert(wait_log("processed after 1 retries", 1));
    cr_expect_eq(dedup_rows("once-1"), 1);
    long dlq_depth = -1;
    harness_queue_info(&H, dlq(), &dlq_depth, NULL);
    cr_expect_eq(dlq_depth, 0);
    harness_stop_idemq(&daemon_pid);
}

static void expect_run_refused(const char *yaml, const char *needle)
{
    harness_options o = {.handler_yaml = yaml};
    harness_write_config(&H, &o);
    const char *args[] = {"run", "-c", H.config_path, NULL};
    char *out = NULL;
    int rc = harness_run_cli(&H, &out, args);
    cr_expect_eq(rc, 2, "idemq run should exit 2, got %d:\n%s", rc, out);
    cr_expect(strstr(out, needle), "expected '%s' in:\n%s", needle, out);
    free(out);
}

Test(handlers, bad_plugins_stop_idemq_run_with_exit_2)
{
    setup("plugin_abi", NULL);
    expect_run_refused(plugin_yaml(IDEMQ_BAD_ABI_PLUGIN, NULL),
                       "has plugin ABI version 42, but this idemq loads versions 1 to 2: rebuild the "
                       "plugin against this idemq's include/idemq/plugin.h");
    expect_run_refused(plugin_yaml(IDEMQ_NO_ENTRY_PLUGIN, NULL),
                       "does not export idemq_plugin_entry()");
    expect_run_refused(plugin_yaml("/nonexistent/idemq/plugin.so", NULL),
                       "cannot load plugin /nonexistent/idemq/plugin.so");
    expect_run_refused(plugin_yaml(IDEMQ_LEDGER_PLUGIN, "{fail_first_n: -1}"),
                       "(ledger) refused its config: fail_first_n must be a non-negative integer");

    /* `idemq check` loads the plugin and reports its name and ABI. */
    create_ledger();
    harness_options o = {.handler_yaml = plugin_yaml(IDEMQ_LEDGER_PLUGIN, NULL)};
    harness_write_config(&H, &o);
    const char *args[] = {"check", "-c", H.config_path, NULL};
    char *out = NULL;
    int rc = harness_run_cli(&H, &out, args);
    cr_expect_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "plugin ledger (ABI 2)"), "%s", out);
    free(out);
    /* A plugin built for ABI 1 (before host->emit) still loads. */
    o.handler_yaml = plugin_yaml(IDEMQ_ABI_V1_PLUGIN, NULL);
    harness_write_config(&H, &o);
    out = NULL;
    rc = harness_run_cli(&H, &out, args);
    cr_expect_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "plugin abi_v1 (ABI 1)"), "%s", out);
    free(out);
    o.handler_yaml = plugin_yaml(IDEMQ_BAD_ABI_PLUGIN, NULL);
    harness_write_config(&H, &o);
    out = NULL;
    rc = harness_run_cli(&H, &out, args);
    cr_expect_eq(rc, 1, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "has plugin ABI version 42"), "%s", out);
    free(out);
}
