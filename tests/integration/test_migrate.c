/*
 * test_migrate — msg_dedup.handler_name as VARBINARY(64): `idemq migrate` upgrades the old
 * VARCHAR(64) utf8mb4 column in place (idempotently), `idemq check` warns about the old layout,
 * and handlers whose names differ only in case or trailing spaces keep separate dedup
 * namespaces end to end (the real idemq binary against real RabbitMQ and MariaDB).
 *
 * Under the old column's collation "orders", "Orders" and "orders " were one handler: the second
 * one's events were dropped as duplicates of the first one's. Assertions are made in the
 * database (information_schema, the unique key, dedup and business rows). Waits are on
 * observable conditions with deadlines; no sleep stands in for an event.
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysqld_error.h>

#include "harness.h"

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

TestSuite(migrate, .fini = teardown, .timeout = 120);

static void setup(const char *name, const harness_options *o)
{
    harness_init(&H, name, o);
    h_ready = true;
}

/* The first column of the first row as an owned string ("(null)" for NULL, "(no row)"). */
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
    char *out = strdup(!row ? "(no row)" : row[0] ? row[0] : "(null)");
    mysql_free_result(res);
    return out;
}

/* Inserts a dedup row; returns 0 or the MySQL error number. */
static unsigned int insert_dedup(const char *biz_key, const char *handler_name)
{
    char sql[512];
    snprintf(sql, sizeof sql, "INSERT INTO msg_dedup (biz_key, handler_name) VALUES ('%s', '%s')",
             biz_key, handler_name);
    return mysql_query(H.db, sql) == 0 ? 0 : mysql_errno(H.db);
}

/* msg_dedup as it was made before handler_name became VARBINARY(64): otherwise exactly
 * schemas/mysql/001_msg_dedup.sql. */
static const char old_dedup_ddl[] =
    "CREATE TABLE msg_dedup (\n"
    "  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,\n"
    "  biz_key      VARBINARY(128) NOT NULL,\n"
    "  handler_name VARCHAR(64)  NOT NULL,\n"
    "  created_at   DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),\n"
    "  UNIQUE KEY uk_biz_handler (biz_key, handler_name),\n"
    "  KEY idx_created_at (created_at)\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

#define HANDLER_NAME_COLUMN                                                                        \
    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "            \
    "'msg_dedup' AND COLUMN_NAME = 'handler_name'"

/* ------------------------------------------------------------------------------ migrate */

Test(migrate, migrate_upgrades_an_old_handler_name_column_in_place)
{
    setup("migrate_upgrade", NULL);
    harness_sql(&H, "DROP TABLE msg_dedup");
    harness_sql(&H, "%s", old_dedup_ddl);
    cr_assert_eq(insert_dedup("k1", "orders"), 0);
    /* A non-ASCII name, to see its bytes survive the conversion: "prüfer" in UTF-8. */
    harness_sql(&H, "INSERT INTO msg_dedup (biz_key, handler_name, created_at) VALUES "
                    "('k2', CONVERT(X'7072C3BC666572' USING utf8mb4), '2020-01-02 03:04:05.678')");
    long long k1_id = harness_scalar(&H, "SELECT id FROM msg_dedup WHERE biz_key = 'k1'");
    /* The old layout really is the problem: "Orders" collides with "orders". */
    cr_assert_eq(insert_dedup("k1", "Orders"), ER_DUP_ENTRY,
                 "the old VARCHAR column should compare case-insensitively");
    /* MariaDB's utf8mb4_general_ci pads; MySQL 8's default utf8mb4_0900_ai_ci does not. */
    if (!harness_db_is_mysql(&H))
        cr_assert_eq(insert_dedup("k1", "orders "), ER_DUP_ENTRY,
                     "the old VARCHAR column should ignore trailing spaces");

    char *out = NULL;
    int rc = harness_run_cli_command(&H, "check", &out);
    cr_expect_eq(rc, 0, "a warning must not fail `idemq check` (exit %d):\n%s", rc, out);
    cr_expect(strstr(out, "mysql   WARN msg_dedup.handler_name is varchar"), "%s", out);
    cr_expect(strstr(out, "idemq migrate"), "the warning should say how to fix it:\n%s", out);
    free(out);

    rc = harness_run_cli_command(&H, "migrate", &out);
    cr_assert_eq(rc, 0, "idemq migrate exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "upgraded msg_dedup.handler_name to VARBINARY(64)"), "%s", out);
    free(out);

    /* The column, in the server's own words. */
    char *type = fetch_text("SELECT COLUMN_TYPE " HANDLER_NAME_COLUMN);
    char *data_type = fetch_text("SELECT DATA_TYPE " HANDLER_NAME_COLUMN);
    char *nullable = fetch_text("SELECT IS_NULLABLE " HANDLER_NAME_COLUMN);
    cr_expect_str_eq(data_type, "varbinary");
    cr_expect_str_eq(type, "varbinary(64)");
    cr_expect_str_eq(nullable, "NO");
    free(type);
    free(data_type);
    free(nullable);
    /* The unique key still spans (biz_key, handler_name), and the old rows are untouched. */
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE "
                                    "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'msg_dedup' AND "
                                    "INDEX_NAME = 'uk_biz_handler' AND NON_UNIQUE = 0 AND "
                                    "((SEQ_IN_INDEX = 1 AND COLUMN_NAME = 'biz_key') OR "
                                    "(SEQ_IN_INDEX = 2 AND COLUMN_NAME = 'handler_name'))"),
                 2);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 2);
    cr_expect_eq(harness_scalar(&H, "SELECT id FROM msg_dedup WHERE biz_key = 'k1' AND "
                                    "handler_name = 'orders'"),
                 k1_id);
    char *hex = fetch_text("SELECT HEX(handler_name) FROM msg_dedup WHERE biz_key = 'k2'");
    char *created = fetch_text("SELECT created_at FROM msg_dedup WHERE biz_key = 'k2'");
    cr_expect_str_eq(hex, "7072C3BC666572", "the UTF-8 bytes of the old name were changed");
    cr_expect_str_eq(created, "2020-01-02 03:04:05.678");
    free(hex);
    free(created);

    /* Now names compare byte for byte: case and trailing spaces make distinct handlers, and the
     * same name still collides. */
    cr_expect_eq(insert_dedup("k1", "Orders"), 0);
    cr_expect_eq(insert_dedup("k1", "orders "), 0);
    cr_expect_eq(insert_dedup("k1", "orders"), ER_DUP_ENTRY);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = 'k1'"), 3);

    /* Idempotent: a second run changes nothing and says so. */
    rc = harness_run_cli_command(&H, "migrate", &out);
    cr_expect_eq(rc, 0, "second idemq migrate exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "current"), "%s", out);
    cr_expect(!strstr(out, "upgraded"), "the second run upgraded again:\n%s", out);
    free(out);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 4);

    rc = harness_run_cli_command(&H, "check", &out);
    cr_expect_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(!strstr(out, "WARN"), "check still warns after the upgrade:\n%s", out);
    cr_expect(!strstr(out, "handler_name is"), "%s", out);
    cr_expect(strstr(out, "mysql   ok"), "%s", out);
    free(out);
}

/* ------------------------------------------------------------------------------ end to end */

/* Rewrites handler_name in the config harness_write_config wrote (it always says
 * pay-callback). name is written as a double-quoted YAML scalar. */
static void set_handler_name(const char *name)
{
    FILE *f = fopen(H.config_path, "r");
    cr_assert(f, "cannot read %s", H.config_path);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    static const char needle[] = "handler_name: pay-callback\n";
    char *at = strstr(text, needle);
    cr_assert(at, "no '%s' in the config", needle);
    f = fopen(H.config_path, "w");
    cr_assert(f);
    fprintf(f, "%.*shandler_name: \"%s\"\n%s", (int)(at - text), text, name, at + strlen(needle));
    fclose(f);
}

/* Both statements of the handler are fixed; `run` tells the two runs' effects apart. */
static const char *applying_handler(int run)
{
    static char yaml[512];
    snprintf(yaml, sizeof yaml,
             "      type: sql\n"
             "      statements:\n"
             "        - sql: \"INSERT INTO applied (biz_key, run) VALUES (:biz_key, %d)\"\n"
             "          expect_rows: 1\n",
             run);
    return yaml;
}

static void publish_k(void)
{
    static const char body[] = "{\"biz_key\":\"order_id:o-1:PAY_SUCCESS\",\"message_id\":\"m-1\"}";
    harness_publish(&H, NULL, "application/json", body, sizeof body - 1, NULL);
}

typedef struct settled_wait {
    long at_least;
} settled_wait;

/* Messages settled as processed or deduped so far (either way: failures are not waited for). */
static long settled(void)
{
    return harness_log_count(&H, "\"outcome\":\"processed\"") +
           harness_log_count(&H, "\"outcome\":\"deduped\"");
}

static bool settled_reached(harness *h, void *arg)
{
    (void)h;
    return settled() >= ((settled_wait *)arg)->at_least;
}

static void wait_settled(long at_least)
{
    settled_wait w = {.at_least = at_least};
    cr_assert(harness_wait_for(settled_reached, &H, &w, DEADLINE_MS),
              "waited for %ld settled messages; %ld were", at_least, settled());
}

Test(migrate, handlers_differing_only_in_case_keep_separate_dedup_namespaces)
{
    harness_options o = {.handler_yaml = applying_handler(1)};
    setup("migrate_namespaces", &o);
    harness_sql(&H, "CREATE TABLE applied (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                    "biz_key VARBINARY(128) NOT NULL, run INT NOT NULL) ENGINE=InnoDB");
    harness_declare_topology(&H);

    /* Run 1: handler "orders" applies the event. */
    set_handler_name("orders");
    harness_start_idemq(&H, READY_LINE, DEADLINE_MS, &daemon_pid);
    publish_k();
    wait_settled(1);
    harness_stop_idemq(&daemon_pid);

    /* Run 2: handler "Orders " (another case, a trailing space) gets the same biz_key twice:
     * applied once — its namespace is its own, and dedup works within it. */
    o.handler_yaml = applying_handler(2);
    harness_write_config(&H, &o);
    set_handler_name("Orders ");
    harness_start_idemq(&H, READY_LINE, DEADLINE_MS, &daemon_pid);
    publish_k();
    publish_k();
    wait_settled(3);
    harness_stop_idemq(&daemon_pid);

    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"processed\""), 2);
    cr_expect_eq(harness_log_count(&H, "\"outcome\":\"deduped\""), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM applied WHERE run = 1"), 1);
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM applied WHERE run = 2"), 1,
                 "handler 'Orders ' had its event dropped as a duplicate of handler 'orders'");
    cr_expect_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = "
                                    "'order_id:o-1:PAY_SUCCESS'"),
                 2);
    /* The two names as stored, byte for byte: "Orders " and "orders". */
    char *names = fetch_text("SELECT GROUP_CONCAT(HEX(handler_name) ORDER BY handler_name) FROM "
                             "msg_dedup");
    cr_expect_str_eq(names, "4F726465727320,6F7264657273");
    free(names);
}
