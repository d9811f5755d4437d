/*
 * rotation — see store/rotation.h.
 */
#include "store/rotation.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "config/config.h"

/* Kept identical to schemas/mysql/005_dedup_rotation.sql (a unit test compares them). */
const char rotation_previous_ddl[] = "CREATE TABLE IF NOT EXISTS msg_dedup_previous LIKE msg_dedup";
const char rotation_state_ddl[] = "CREATE TABLE IF NOT EXISTS idemq_dedup_rotation (\n"
                                  "  table_name VARBINARY(64) NOT NULL PRIMARY KEY,\n"
                                  "  rotated_at DATETIME(3)   NOT NULL\n"
                                  ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4";
const char rotation_state_row_sql[] =
    "INSERT IGNORE INTO idemq_dedup_rotation (table_name, rotated_at) VALUES ('msg_dedup', NOW(3))";

/*
 * The lookups of msg_dedup_previous, each idemq's first statement in a transaction:
 * - LOCK IN SHARE MODE, not a plain read: a read in the transaction's snapshot could miss a row
 *   committed before the last rotation if the snapshot was older (a transaction that reached
 *   here after a ROLLBACK TO SAVEPOINT released its metadata locks). MariaDB 10.11 has no FOR
 *   SHARE.
 * - FORCE INDEX: a table whose statistics say it is empty is read whole instead of by the unique
 *   key (MariaDB; the rotation also refreshes them, see swap_tables).
 * - The subquery on msg_dedup, false without reading a row, takes that table's metadata lock in
 *   the same statement. Taken one statement apart (previous here, msg_dedup at the insert), a
 *   rename that holds msg_dedup and waits for msg_dedup_previous deadlocks with the transaction;
 *   taken together by a transaction's first statement, the server backs off and waits for the
 *   rename instead.
 */
#define PREVIOUS_LOOKUP_FROM "FROM msg_dedup_previous AS p FORCE INDEX (uk_biz_handler) "
#define PREVIOUS_LOOKUP_LOCKS                                                                      \
    " AND NOT EXISTS (SELECT 1 FROM msg_dedup WHERE 1 = 0) LOCK IN SHARE MODE"
const char rotation_previous_lookup_sql[] =
    "SELECT 1 " PREVIOUS_LOOKUP_FROM
    "WHERE p.biz_key = ? AND p.handler_name = ?" PREVIOUS_LOOKUP_LOCKS;
const char rotation_previous_batch_head[] =
    "SELECT p.biz_key " PREVIOUS_LOOKUP_FROM "WHERE p.handler_name = ? AND p.biz_key IN (";
const char rotation_previous_batch_tail[] = ")" PREVIOUS_LOOKUP_LOCKS;

/* A rename waits for every transaction on either table, and new ones queue behind it: the
 * consumers' next transactions wait as long as the rename does. A short wait bounds that pause
 * when a long transaction (a person's open session) holds a table; the rotation is tried again
 * at the next interval. */
#define ROTATION_LOCK_WAIT_S 2
/* Room between the largest id in use and the new table's first: the rows inserted between the
 * read and the rename, with any auto_increment_increment. */
#define ROTATION_ID_GAP 4294967296ULL

static int run(MYSQL *db, const char *sql, const char *what, char *err, size_t err_len)
{
    if (mysql_query(db, sql) == 0) {
        mysql_free_result(mysql_store_result(db));
        return 0;
    }
    snprintf(err, err_len, "%s failed: %s (error %u)", what, mysql_error(db), mysql_errno(db));
    return -1;
}

int rotation_analyze(MYSQL *db, const char *table, char *err, size_t err_len)
{
    char sql[96];
    snprintf(sql, sizeof sql, "ANALYZE TABLE %s", table);
    MYSQL_RES *res = mysql_query(db, sql) == 0 ? mysql_store_result(db) : NULL;
    if (!res) {
        snprintf(err, err_len, "analyzing %s failed: %s (error %u)", table, mysql_error(db),
                 mysql_errno(db));
        return -1;
    }
    /* Table, Op, Msg_type, Msg_text: the server's own error comes first, then a "status"
     * row saying the operation failed, so the first error row is the reason. */
    int rc = 0;
    MYSQL_ROW row;
    while (rc == 0 && (row = mysql_fetch_row(res)) != NULL) {
        if (mysql_num_fields(res) >= 4 && row[2] && strcasecmp(row[2], "error") == 0) {
            snprintf(err, err_len, "analyzing %s failed: %s", table, row[3] ? row[3] : "");
            rc = -1;
        }
    }
    mysql_free_result(res);
    return rc;
}

/* The first column of the first row of sql into buf ("" for NULL or no row). 0 or -1. */
static int scalar(MYSQL *db, const char *sql, const char *what, char *buf, size_t buf_len,
                  char *err, size_t err_len)
{
    buf[0] = '\0';
    if (mysql_query(db, sql) != 0) {
        snprintf(err, err_len, "%s failed: %s (error %u)", what, mysql_error(db), mysql_errno(db));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    if (row && row[0])
        snprintf(buf, buf_len, "%s", row[0]);
    if (res)
        mysql_free_result(res);
    if (!res && mysql_errno(db)) {
        snprintf(err, err_len, "%s failed: %s (error %u)", what, mysql_error(db), mysql_errno(db));
        return -1;
    }
    return 0;
}

typedef struct layout_tables {
    bool previous, state;
} layout_tables;

static int read_tables(MYSQL *db, layout_tables *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    if (mysql_query(db, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
                        "DATABASE() AND TABLE_NAME IN ('msg_dedup_previous', "
                        "'idemq_dedup_rotation')") != 0) {
        snprintf(err, err_len, "reading the dedup tables failed: %s (error %u)", mysql_error(db),
                 mysql_errno(db));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row;
    while (res && (row = mysql_fetch_row(res))) {
        if (row[0] && !strcasecmp(row[0], "msg_dedup_previous"))
            t->previous = true;
        if (row[0] && !strcasecmp(row[0], "idemq_dedup_rotation"))
            t->state = true;
    }
    if (res)
        mysql_free_result(res);
    mysql_rollback(db);
    return 0;
}

static const char fold_back_hint[] =
    "set dedup.layout: rotating, or fold it back into msg_dedup: INSERT IGNORE INTO msg_dedup "
    "(biz_key, handler_name, created_at) SELECT biz_key, handler_name, created_at FROM "
    "msg_dedup_previous; DROP TABLE msg_dedup_previous, idemq_dedup_rotation; DROP TABLE IF "
    "EXISTS msg_dedup_next, msg_dedup_expired";

/* The refusal of a single layout over a database that has msg_dedup_previous. -1. */
static int single_over_rotating(char *report, size_t report_len)
{
    snprintf(report, report_len,
             "msg_dedup_previous exists (the rotating layout) but dedup.layout is single: its "
             "keys would not count as duplicates; %s",
             fold_back_hint);
    return -1;
}

int rotation_layout_check(MYSQL *db, int layout, uint64_t period_s, char *report, size_t report_len)
{
    layout_tables t;
    if (read_tables(db, &t, report, report_len) != 0)
        return 1;
    if (layout != CONFIG_DEDUP_ROTATING) {
        if (t.previous)
            return single_over_rotating(report, report_len);
        snprintf(report, report_len, "layout single: msg_dedup, expired rows deleted in batches");
        return 0;
    }
    if (!t.previous || !t.state) {
        snprintf(report, report_len,
                 "dedup.layout is rotating but %s is missing; run `idemq migrate` (it converts "
                 "msg_dedup in place)",
                 !t.previous ? "msg_dedup_previous" : "idemq_dedup_rotation");
        return -1;
    }
    char sql[256], window[96];
    snprintf(sql, sizeof sql,
             "SELECT CONCAT(rotated_at, ', due to rotate at ', rotated_at + INTERVAL %" PRIu64
             " SECOND) FROM idemq_dedup_rotation WHERE table_name = 'msg_dedup'",
             period_s);
    int rc =
        scalar(db, sql, "reading idemq_dedup_rotation", window, sizeof window, report, report_len);
    mysql_rollback(db);
    if (rc != 0)
        return 1;
    if (!window[0]) {
        snprintf(report, report_len,
                 "idemq_dedup_rotation has no row for msg_dedup; run `idemq migrate`");
        return -1;
    }
    snprintf(report, report_len,
             "layout rotating: msg_dedup current since %s; msg_dedup_previous holds the period "
             "before",
             window);
    return 0;
}

int rotation_migrate(MYSQL *db, int layout, char *report, size_t report_len)
{
    layout_tables t;
    report[0] = '\0';
    if (read_tables(db, &t, report, report_len) != 0)
        return -1;
    if (layout != CONFIG_DEDUP_ROTATING) {
        return t.previous ? single_over_rotating(report, report_len) : 0;
    }
    if (t.previous && t.state)
        return 0;
    char rows[32];
    /* The statistics' estimate: a COUNT(*) would read the whole table. */
    if (scalar(db,
               "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
               "AND TABLE_NAME = 'msg_dedup'",
               "reading msg_dedup's size", rows, sizeof rows, report, report_len) != 0 ||
        run(db, rotation_previous_ddl, "creating msg_dedup_previous", report, report_len) != 0 ||
        run(db, rotation_state_ddl, "creating idemq_dedup_rotation", report, report_len) != 0 ||
        run(db, rotation_state_row_sql, "recording the rotation", report, report_len) != 0 ||
        run(db, "COMMIT", "recording the rotation", report, report_len) != 0)
        return -1;
    snprintf(report, report_len,
             "; converted msg_dedup to the rotating layout: created msg_dedup_previous (empty) "
             "and idemq_dedup_rotation; msg_dedup's rows (about %s) stay and expire with it two "
             "rotations from now",
             rows[0] ? rows : "0");
    return 0;
}

/* Claims the rotation: moves rotated_at to now if msg_dedup has been current for period_s. 1
 * claimed (the old value in previous_at, to give the claim back), 0 not due, -1 failed. */
static int claim(MYSQL *db, uint64_t period_s, char *previous_at, size_t previous_at_len, char *err,
                 size_t err_len)
{
    char sql[256], due[8];
    snprintf(sql, sizeof sql,
             "SELECT rotated_at, rotated_at <= NOW(3) - INTERVAL %" PRIu64
             " SECOND FROM idemq_dedup_rotation WHERE table_name = 'msg_dedup' FOR UPDATE",
             period_s);
    if (mysql_query(db, sql) != 0) {
        snprintf(err, err_len, "reading idemq_dedup_rotation failed: %s (error %u)",
                 mysql_error(db), mysql_errno(db));
        mysql_rollback(db);
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    bool found = row && row[0] && row[1];
    if (found) {
        snprintf(previous_at, previous_at_len, "%s", row[0]);
        snprintf(due, sizeof due, "%s", row[1]);
    }
    if (res)
        mysql_free_result(res);
    if (!found) {
        mysql_rollback(db);
        snprintf(err, err_len,
                 "idemq_dedup_rotation has no row for msg_dedup; run `idemq migrate`");
        return -1;
    }
    if (strcmp(due, "1") != 0) {
        mysql_rollback(db);
        return 0;
    }
    if (run(db,
            "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) WHERE table_name = "
            "'msg_dedup'",
            "claiming the rotation", err, err_len) != 0 ||
        mysql_commit(db) != 0) {
        if (!err[0])
            snprintf(err, err_len, "claiming the rotation failed: %s (error %u)", mysql_error(db),
                     mysql_errno(db));
        mysql_rollback(db);
        return -1;
    }
    return 1;
}

static void give_back(MYSQL *db, const char *previous_at)
{
    char sql[160], ignored[256];
    snprintf(sql, sizeof sql,
             "UPDATE idemq_dedup_rotation SET rotated_at = '%s' WHERE table_name = 'msg_dedup'",
             previous_at);
    if (run(db, sql, "giving the claim back", ignored, sizeof ignored) == 0)
        mysql_commit(db);
    else
        mysql_rollback(db);
}

/* Creates msg_dedup_next with its ids above every id in use, and renames the three tables. */
static int swap_tables(MYSQL *db, char *err, size_t err_len)
{
    char max_id[32], sql[128];
    if (run(db, "DROP TABLE IF EXISTS msg_dedup_next", "dropping a left-over msg_dedup_next", err,
            err_len) != 0 ||
        run(db, "CREATE TABLE msg_dedup_next LIKE msg_dedup", "creating msg_dedup_next", err,
            err_len) != 0 ||
        scalar(db,
               "SELECT GREATEST((SELECT COALESCE(MAX(id), 0) FROM msg_dedup), (SELECT "
               "COALESCE(MAX(id), 0) FROM msg_dedup_previous))",
               "reading the largest dedup id", max_id, sizeof max_id, err, err_len) != 0)
        return -1;
    mysql_rollback(db);
    snprintf(sql, sizeof sql, "ALTER TABLE msg_dedup_next AUTO_INCREMENT = %llu",
             strtoull(max_id, NULL, 10) + ROTATION_ID_GAP);
    if (run(db, sql, "setting msg_dedup_next's first id", err, err_len) != 0)
        return -1;
    /* Statistics for msg_dedup as it is: a rename reloads the table with its stored ones, and
     * those of a table created empty say "0 rows" until InnoDB's background refresh, which a
     * short period may never see; MySQL then scans the whole unique index for every lookup,
     * index hint or not. */
    if (rotation_analyze(db, "msg_dedup", err, err_len) != 0)
        return -1;
    return run(db,
               "RENAME TABLE msg_dedup_previous TO msg_dedup_expired, msg_dedup TO "
               "msg_dedup_previous, msg_dedup_next TO msg_dedup",
               "renaming the dedup tables", err, err_len);
}

int rotation_rotate_if_due(MYSQL *db, uint64_t period_s, char *report, size_t report_len)
{
    char previous_at[64], sql[96];
    report[0] = '\0';
    int claimed = claim(db, period_s, previous_at, sizeof previous_at, report, report_len);
    if (claimed <= 0)
        return claimed;
    snprintf(sql, sizeof sql, "SET SESSION lock_wait_timeout = %d", ROTATION_LOCK_WAIT_S);
    uint64_t started = uv_hrtime();
    /* Only once claimed: a DDL, even one that finds nothing, runs cluster-wide on Galera. A
     * msg_dedup_expired is left by a rotation that stopped after its rename, expired by
     * construction. */
    if (run(db, sql, "setting the lock wait", report, report_len) != 0 ||
        run(db, "DROP TABLE IF EXISTS msg_dedup_expired", "dropping msg_dedup_expired", report,
            report_len) != 0 ||
        swap_tables(db, report, report_len) != 0) {
        give_back(db, previous_at);
        return -1;
    }
    uint64_t renamed = uv_hrtime();
    /* The claim's time was a little before the rename: the period starts now. */
    char ignored[256];
    if (run(db,
            "UPDATE idemq_dedup_rotation SET rotated_at = NOW(3) WHERE table_name = "
            "'msg_dedup'",
            "recording the rotation", ignored, sizeof ignored) == 0)
        mysql_commit(db);
    else
        mysql_rollback(db);
    int dropped = run(db, "DROP TABLE msg_dedup_expired", "dropping msg_dedup_expired", ignored,
                      sizeof ignored);
    uint64_t done = uv_hrtime();
    snprintf(report, report_len,
             "rotated the dedup tables: msg_dedup (current since %s) is now msg_dedup_previous, "
             "an empty msg_dedup took its place (%.1f ms); the period before was %s (%.1f ms)",
             previous_at, (double)(renamed - started) / 1e6,
             dropped == 0 ? "dropped whole"
                          : "not dropped yet (msg_dedup_expired; the next rotation drops it)",
             (double)(done - renamed) / 1e6);
    return 1;
}
