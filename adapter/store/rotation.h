/*
 * rotation — the rotating layout of the dedup window (dedup.layout: rotating).
 *
 * Why: the single table's retention deletes every expired row one by one, as many deletes as
 * the window gets inserts. Here the window is two tables: msg_dedup, where every new dedup row
 * goes and whose unique index decides duplicates among them, and msg_dedup_previous, the period
 * before it, only read. Once every dedup.retention one instance rotates them: previous is
 * dropped whole, msg_dedup becomes previous and an empty table becomes msg_dedup, all in one
 * RENAME TABLE. A key is therefore kept at least one period and at most two, and the expiry
 * costs one rename and one DROP TABLE, whatever the number of rows.
 *
 * A message is a duplicate when its key is in either table. The store reads msg_dedup_previous
 * with a locking read (it sees the newest committed rows, not a snapshot) before it inserts
 * into msg_dedup, in the same transaction. That is atomic because a RENAME TABLE needs an
 * exclusive metadata lock on both tables, and every transaction that touched either holds its
 * shared lock until it ends: neither table changes identity under a transaction, and nothing
 * inserts into msg_dedup_previous. On Galera the rename runs in total order and aborts local
 * transactions that hold those locks; they run again like any other conflict.
 *
 * Who rotates: idemq_dedup_rotation holds the time msg_dedup became current. The instance whose
 * UPDATE moves it (a row lock, or Galera's certification, lets only one win) renames; a claim
 * whose rename then fails is given back. A crash between claim and rename delays the rotation by
 * a period: keys are kept longer, never shorter. The new msg_dedup's AUTO_INCREMENT starts 2^32
 * above the largest id in use, so an id names one row in both tables (store/transaction.c tells
 * its own row from a copy's by id).
 *
 * `idemq migrate` converts a single table in place: it creates msg_dedup_previous empty (the
 * existing rows stay in msg_dedup and leave with it two rotations later), copies nothing and
 * locks nothing beyond the CREATE's metadata lock.
 *
 * Errors: 0 or -1 with the reason in the caller's buffer, except where a function says more.
 * Thread affinity: the thread that owns db.
 */
#ifndef IDEMQ_STORE_ROTATION_H
#define IDEMQ_STORE_ROTATION_H

#include <mysql.h>
#include <stddef.h>
#include <stdint.h>

/* The DDL the conversion runs; schemas/mysql/005_dedup_rotation.sql holds the same statements
 * (a unit test compares them). */
extern const char rotation_previous_ddl[];
extern const char rotation_state_ddl[];
extern const char rotation_state_row_sql[];

/* The lookups the store runs in the rotating layout: one key, and a batch's keys (the IN list
 * is appended by the caller). */
extern const char rotation_previous_lookup_sql[];
extern const char rotation_previous_batch_head[];
extern const char rotation_previous_batch_tail[];

/* ANALYZE TABLE table. The server reports a failure (a lock wait timed out, a table missing) as
 * a row of the statement's result, not as its error: -1 with that row's text. */
int rotation_analyze(MYSQL *db, const char *table, char *err, size_t err_len);

/* Whether the tables match layout (config_dedup_layout): 0 with the layout described in report,
 * -1 with what is wrong and how to fix it, or 1 when they could not be read (report says why).
 * period_s is dedup.retention, for the next rotation's time. */
int rotation_layout_check(MYSQL *db, int layout, uint64_t period_s, char *report,
                          size_t report_len);

/* `idemq migrate`'s step for layout (config_dedup_layout), after msg_dedup is current: rotating
 * creates msg_dedup_previous and idemq_dedup_rotation when missing; single refuses a database
 * that has msg_dedup_previous. 0 with what it did in report ("" for nothing), or -1. */
int rotation_migrate(MYSQL *db, int layout, char *report, size_t report_len);

/* Rotates when msg_dedup has been current for period_s or longer and no other instance claimed
 * it first. 1 rotated (report says what it did and how long it took), 0 not due, -1 failed. */
int rotation_rotate_if_due(MYSQL *db, uint64_t period_s, char *report, size_t report_len);

#endif
