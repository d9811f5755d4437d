/*
 * schema — see store/schema.h.
 */
#include "store/schema.h"

#include <mysql.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "store/rotation.h"

/* Kept identical to schemas/mysql/001_msg_dedup.sql (a unit test compares them). biz_key and
 * handler_name are VARBINARY: utf8mb4 collations are case-insensitive and pad trailing spaces,
 * which would make distinct keys (or handlers) collide and silently drop a business event as a
 * "duplicate". */
const char store_dedup_ddl[] =
    "CREATE TABLE IF NOT EXISTS msg_dedup (\n"
    "  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,\n"
    "  biz_key      VARBINARY(128) NOT NULL,\n"
    "  handler_name VARBINARY(64) NOT NULL,\n"
    "  created_at   DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),\n"
    "  UNIQUE KEY uk_biz_handler (biz_key, handler_name),\n"
    "  KEY idx_created_at (created_at)\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/* Kept identical to schemas/mysql/003_outbox.sql (a unit test compares them); why each column
 * is there: that file. The state values and every statement on the table: outbox/table.h. */
const char store_outbox_ddl[] =
    "CREATE TABLE IF NOT EXISTS idemq_outbox (\n"
    "  id             BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,\n"
    "  source_biz_key VARBINARY(128) NOT NULL,\n"
    "  handler_name   VARBINARY(64)  NOT NULL,\n"
    "  emit_name      VARBINARY(64)  NOT NULL,\n"
    "  biz_key        VARBINARY(128) NOT NULL,\n"
    "  exchange       VARBINARY(255) NOT NULL,\n"
    "  routing_key    VARBINARY(255) NOT NULL,\n"
    "  content_type   VARBINARY(64)  NOT NULL,\n"
    "  body           MEDIUMBLOB     NOT NULL,\n"
    "  state          TINYINT        NOT NULL DEFAULT 0,\n"
    "  attempts       INT UNSIGNED   NOT NULL DEFAULT 0,\n"
    "  created_at     DATETIME(3)    NOT NULL DEFAULT CURRENT_TIMESTAMP(3),\n"
    "  published_at   DATETIME(3)    NULL,\n"
    "  last_error     VARCHAR(512)   NULL,\n"
    "  traceparent    VARBINARY(55)  NULL,\n"
    "  tracestate     VARBINARY(512) NULL,\n"
    "  KEY idx_outbox_state_id (state, id),\n"
    "  KEY idx_outbox_published_at (published_at)\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/* Kept identical to schemas/mysql/004_outbox_trace_context.sql (a unit test compares them): the
 * trace context columns for an idemq_outbox created before them. */
const char store_outbox_trace_upgrade_sql[] =
    "ALTER TABLE idemq_outbox ADD COLUMN traceparent VARBINARY(55) NULL,\n"
    "  ADD COLUMN tracestate VARBINARY(512) NULL";

const char store_outbox_lease_ddl[] =
    "CREATE TABLE IF NOT EXISTS idemq_outbox_lease (\n"
    "  name       VARBINARY(64)  NOT NULL PRIMARY KEY,\n"
    "  owner      VARBINARY(128) NOT NULL,\n"
    "  expires_at DATETIME(6)    NOT NULL\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";

/* Until this version msg_dedup.handler_name was VARCHAR(64) utf8mb4: "Orders" and "orders "
 * shared one dedup namespace. The upgrade is safe in place: names equal under byte comparison
 * were already equal under the collation, so the unique key cannot gain a conflict. */
static const char handler_name_upgrade_sql[] =
    "ALTER TABLE msg_dedup MODIFY handler_name VARBINARY(64) NOT NULL";

int store_dedup_schema_check(MYSQL *db, char *report, size_t report_len)
{
    if (mysql_query(db, "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                        "DATABASE() AND TABLE_NAME = 'msg_dedup' AND COLUMN_NAME = "
                        "'handler_name'") != 0) {
        snprintf(report, report_len, "reading msg_dedup's columns failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    int rc;
    if (!row || !row[0]) {
        snprintf(report, report_len, "msg_dedup has no handler_name column; run `idemq migrate`");
        rc = -1;
    } else if (strcasecmp(row[0], "varbinary") != 0) {
        snprintf(report, report_len,
                 "msg_dedup.handler_name is %s, compared by collation (case-insensitive, trailing "
                 "spaces ignored); `idemq migrate` changes it to VARBINARY(64) in place",
                 row[0]);
        rc = 1;
    } else {
        snprintf(report, report_len, "msg_dedup is current");
        rc = 0;
    }
    if (res)
        mysql_free_result(res);
    mysql_rollback(db);
    return rc;
}

/* The idemq_outbox columns added after its first layout, in the order
 * store_outbox_trace_upgrade_sql adds them. */
static const char *const outbox_trace_columns[] = {"traceparent", "tracestate"};
#define OUTBOX_TRACE_COLUMNS (sizeof outbox_trace_columns / sizeof outbox_trace_columns[0])

/* How many of outbox_trace_columns idemq_outbox has, into *present: 0 or -1 (report says why). */
static int outbox_trace_columns_present(MYSQL *db, size_t *present, const char **missing,
                                        char *report, size_t report_len)
{
    if (mysql_query(db, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                        "DATABASE() AND TABLE_NAME = 'idemq_outbox' AND COLUMN_NAME IN "
                        "('traceparent', 'tracestate')") != 0) {
        snprintf(report, report_len, "reading idemq_outbox's columns failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    bool found[OUTBOX_TRACE_COLUMNS] = {false};
    MYSQL_ROW row;
    while (res && (row = mysql_fetch_row(res)))
        for (size_t i = 0; i < OUTBOX_TRACE_COLUMNS; i++)
            if (row[0] && !strcasecmp(row[0], outbox_trace_columns[i]))
                found[i] = true;
    if (res)
        mysql_free_result(res);
    mysql_rollback(db);
    *present = 0;
    *missing = NULL;
    for (size_t i = 0; i < OUTBOX_TRACE_COLUMNS; i++) {
        if (found[i])
            (*present)++;
        else if (!*missing)
            *missing = outbox_trace_columns[i];
    }
    return 0;
}

int store_outbox_schema_check(MYSQL *db, char *report, size_t report_len)
{
    static const char *const tables[] = {"idemq_outbox", "idemq_outbox_lease"};
    if (mysql_query(db, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
                        "DATABASE() AND TABLE_NAME IN ('idemq_outbox', 'idemq_outbox_lease')") !=
        0) {
        snprintf(report, report_len, "reading the outbox tables failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    bool found[2] = {false, false};
    MYSQL_ROW row;
    while (res && (row = mysql_fetch_row(res)))
        for (size_t i = 0; i < 2; i++)
            if (row[0] && !strcasecmp(row[0], tables[i]))
                found[i] = true;
    if (res)
        mysql_free_result(res);
    mysql_rollback(db);
    for (size_t i = 0; i < 2; i++) {
        if (!found[i]) {
            snprintf(report, report_len,
                     "table %s is missing: a consumer emits downstream messages; run `idemq "
                     "migrate` (schemas/mysql/003_outbox.sql)",
                     tables[i]);
            return -1;
        }
    }
    size_t present;
    const char *missing;
    if (outbox_trace_columns_present(db, &present, &missing, report, report_len) != 0)
        return -1;
    if (missing) {
        snprintf(report, report_len,
                 "idemq_outbox has no %s column (the trace context of emitted messages); run "
                 "`idemq migrate` (schemas/mysql/004_outbox_trace_context.sql)",
                 missing);
        return -1;
    }
    snprintf(report, report_len, "the outbox tables are in place");
    return 0;
}

/* Adds the trace context columns to an idemq_outbox created before them. *added tells whether it
 * did. 0 or -1 (report says why). */
static int upgrade_outbox(MYSQL *db, bool *added, char *report, size_t report_len)
{
    size_t present;
    const char *missing;
    *added = false;
    if (outbox_trace_columns_present(db, &present, &missing, report, report_len) != 0)
        return -1;
    if (!missing)
        return 0;
    if (present != 0) {
        /* Not a layout any idemq wrote: someone added one by hand. Left for a person to fix. */
        snprintf(report, report_len,
                 "idemq_outbox has some trace context columns but not %s; add it as "
                 "schemas/mysql/004_outbox_trace_context.sql defines it",
                 missing);
        return -1;
    }
    if (mysql_query(db, store_outbox_trace_upgrade_sql) != 0) {
        snprintf(report, report_len,
                 "adding the trace context columns to idemq_outbox failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    *added = true;
    return 0;
}

int store_migrate(MYSQL *db, int dedup_layout, char *report, size_t report_len)
{
    char state[512], layout_note[512];
    if (mysql_query(db, store_dedup_ddl) != 0 || mysql_commit(db) != 0) {
        snprintf(report, report_len, "creating msg_dedup failed: %s (error %u)", mysql_error(db),
                 mysql_errno(db));
        return -1;
    }
    /* The outbox tables are created whether or not a consumer emits yet: adding an emit: later
     * then needs no migration of its own. */
    if (mysql_query(db, store_outbox_ddl) != 0 || mysql_commit(db) != 0 ||
        mysql_query(db, store_outbox_lease_ddl) != 0 || mysql_commit(db) != 0) {
        snprintf(report, report_len, "creating the outbox tables failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    bool outbox_added;
    if (upgrade_outbox(db, &outbox_added, report, report_len) != 0)
        return -1;
    const char *outbox_note =
        outbox_added ? "; added idemq_outbox.traceparent and tracestate (the trace context of "
                       "emitted messages)"
                     : "";
    int rc = store_dedup_schema_check(db, state, sizeof state);
    if (rc < 0) {
        snprintf(report, report_len, "%s", state);
        return -1;
    }
    if (rc > 0 && mysql_query(db, handler_name_upgrade_sql) != 0) {
        snprintf(report, report_len, "upgrading msg_dedup.handler_name failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        return -1;
    }
    /* After the upgrade: msg_dedup_previous is made LIKE msg_dedup. */
    if (rotation_migrate(db, dedup_layout, layout_note, sizeof layout_note) != 0) {
        snprintf(report, report_len, "%s", layout_note);
        return -1;
    }
    if (rc == 0)
        snprintf(report, report_len, "msg_dedup is in place and current%s%s", outbox_note,
                 layout_note);
    else
        snprintf(report, report_len,
                 "upgraded msg_dedup.handler_name to VARBINARY(64): handler names now compare "
                 "byte for byte (was: %s)%s%s",
                 state, outbox_note, layout_note);
    return 0;
}
