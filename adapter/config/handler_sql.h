/*
 * handler_sql — the keys of a sql handler: its statements, parsed here once.
 *
 * Each statement is {sql: ..., expect_rows: N} or a bare string. Its `:field` placeholders follow
 * the rule in config/sql_template.h; statements that would end idemq's transaction (COMMIT, DDL,
 * SET...) are refused; the rewritten text and the parameter list are stored in the config, so
 * the worker only prepares and binds. Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_HANDLER_SQL_H
#define IDEMQ_CONFIG_HANDLER_SQL_H

#include "config/table.h"

/* The keys of a sql handler; the base struct is config_handler. */
extern const opt config_sql_table[];

#endif
