/*
 * schema — idemq's own tables, msg_dedup and the outbox (idemq_outbox, idemq_outbox_lease): their DDL, the check that it has the current layout, and
 * the in-place upgrade `idemq migrate` runs.
 * Errors: store_migrate returns 0 or -1; store_dedup_schema_check 0, 1 or -1 (below); the text
 * goes into the caller's report buffer either way.
 * Thread affinity: the thread that owns db (the CLI's main thread).
 */
#ifndef IDEMQ_STORE_SCHEMA_H
#define IDEMQ_STORE_SCHEMA_H

#include <mysql.h>
#include <stddef.h>

/* Creates msg_dedup and the outbox tables if missing, upgrades older layouts in place and
 * converts msg_dedup to dedup_layout (config_dedup_layout; store/rotation.h) (idempotent).
 * Returns 0 with what it did in report, or -1 with the reason. */
int store_migrate(MYSQL *db, int dedup_layout, char *report, size_t report_len);

/* Whether msg_dedup has the current layout: 0 current, 1 an older one that `idemq migrate`
 * upgrades (report says how it differs), -1 unreadable or missing (report says why). */
int store_dedup_schema_check(MYSQL *db, char *report, size_t report_len);

/* Whether both outbox tables exist, idemq_outbox with its trace context columns: 0, or -1
 * (missing or unreadable: report says which and to run `idemq migrate`). */
int store_outbox_schema_check(MYSQL *db, char *report, size_t report_len);

/* The DDL store_migrate runs; schemas/mysql/001_msg_dedup.sql holds the same statement, and
 * 003_outbox.sql the two outbox ones. */
extern const char store_dedup_ddl[];
extern const char store_outbox_ddl[];
extern const char store_outbox_lease_ddl[];
/* The upgrade store_migrate runs on an idemq_outbox without traceparent and tracestate;
 * schemas/mysql/004_outbox_trace_context.sql holds the same statement. */
extern const char store_outbox_trace_upgrade_sql[];

#endif
