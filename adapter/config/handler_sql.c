/*
 * handler_sql — see handler_sql.h.
 */
#include "config/handler_sql.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/document.h"
#include "config/emit.h"
#include "config/sql_template.h"
#include "config/text.h"

#define CONFIG_MAX_STATEMENTS 64
#define SQL_TEXT_MAX 65536 /* bytes of one statement */

_Static_assert(sizeof(config_on_mismatch) == sizeof(int), "enums are stored as int");

/* The text of a sql handler statement. Newlines and tabs are fine (YAML block scalars); the
 * placeholders are parsed afterwards by parse_statements. */
static int check_sql(const char *text, char *err, size_t err_len)
{
    size_t n = strlen(text);
    bool blank = true;
    for (const char *p = text; *p && blank; p++)
        blank = *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r';
    if (blank) {
        snprintf(err, err_len, "the statement is empty");
        return -1;
    }
    if (n > SQL_TEXT_MAX) {
        snprintf(err, err_len, "the statement is %zu bytes long; at most %d are allowed", n,
                 SQL_TEXT_MAX);
        return -1;
    }
    return 0;
}

static void parse_statements(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                             const char *path);
static void parse_sql_emit(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                           const char *path);

/* clang-format off */
static const char *const on_mismatch_names[] = {"dead_letter", "retry", NULL};

/* One statement of a sql handler; the base struct is config_sql_statement. */
static const opt statement_table[] = {
    {.name = "sql", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_sql_statement, sql), .check = check_sql,
     .help = "the statement, with :field placeholders bound from the message"},
    {.name = "expect_rows", .type = OPT_UINT, .offset = offsetof(config_sql_statement, expect_rows),
     .min = 0, .max = 4294967295u,
     .help = "rows the statement must match (UPDATE/DELETE), insert or return (SELECT)"},
    {0},
};

/* Entries of a sql handler; the base struct is config_handler. */
const opt config_sql_table[] = {
    {.name = "type", .type = OPT_CUSTOM, .parse = config_parse_skip, .help = "handler type"},
    {.name = "statements", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_statements,
     .items = statement_table, .items_path = "[].",
     .help = "a list of {sql: \"... :field ...\", expect_rows: N}, run in order"},
    {.name = "on_mismatch", .type = OPT_ENUM, .offset = offsetof(config_handler, sql.on_mismatch),
     .names = on_mismatch_names, .def = "dead_letter",
     .help = "what a row count other than expect_rows does"},
    {.name = "emit", .type = OPT_CUSTOM, .parse = parse_sql_emit, .items = config_emit_table,
     .items_path = "[].",
     .help = "downstream messages written to the outbox when every statement succeeded"},
    {0},
};
/* clang-format on */

static void parse_sql_emit(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                           const char *path)
{
    config_sql *sql = &((config_handler *)base)->sql;
    (void)o;
    config_parse_emit_list(ctx, node, path, &sql->emits, &sql->emit_count);
}

/* Parses one statement's placeholders into st (see config/sql_template.h for the rule) and
 * refuses statements that would end the transaction. sql_node gives the line. */
static void parse_statement_text(load_ctx *ctx, config_sql_statement *st,
                                 const yaml_node_t *sql_node, const char *path)
{
    sql_template t;
    char why[512], keyword[32];

    if (!sql_keeps_transaction(st->sql, keyword, sizeof keyword)) {
        char shown[128];
        config_report(
            ctx, config_node_line(sql_node),
            "%s.sql: a %s statement cannot run inside idemq's transaction (it would commit "
            "or end it); use SELECT, INSERT, UPDATE, DELETE, REPLACE, WITH, DO, CALL or "
            "SAVEPOINT",
            path, config_show(shown, sizeof shown, keyword));
        return;
    }
    if (sql_template_parse(st->sql, &t, why, sizeof why) < 0) {
        config_report(ctx, config_node_line(sql_node), "%s.sql: %s", path, why);
        return;
    }
    st->prepared = t.sql;
    st->params = t.params;
    st->param_count = t.param_count;
}

static void parse_statements(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                             const char *path)
{
    config_sql *sql = &((config_handler *)base)->sql;
    size_t n;

    if (node->type != YAML_SEQUENCE_NODE) {
        config_report(ctx, config_node_line(node),
                      "%s: expected a list of {sql: ..., expect_rows: N}, got %s", path,
                      config_node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0) {
        config_report(ctx, config_node_line(node),
                      "%s: the list is empty; give at least one statement", path);
        return;
    }
    if (n > CONFIG_MAX_STATEMENTS) {
        config_report(ctx, config_node_line(node), "%s: %zu statements; at most %d are supported",
                      path, n, CONFIG_MAX_STATEMENTS);
        return;
    }
    sql->statements = calloc(n, sizeof *sql->statements);
    if (!sql->statements) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    sql->statement_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = config_get_node(ctx, node->data.sequence.items.start[i]);
        config_sql_statement *st = &sql->statements[i];
        yaml_node_t *sql_node = item;
        char ipath[KEY_PATH_MAX];
        size_t before = ctx->total;

        if (!item)
            continue;
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (item->type == YAML_SCALAR_NODE) {
            /* A bare string is a statement without expect_rows. */
            char spath[KEY_PATH_MAX + 8];
            config_join_path(spath, sizeof spath, ipath, "sql");
            st->sql = config_take_string(ctx, item, spath, "a statement", check_sql);
        } else {
            config_walk_table(ctx, o->items, item, st, ipath, config_node_line(item));
            st->expect_rows_set = config_mapping_get(ctx, item, "expect_rows") != NULL;
            sql_node = config_mapping_get(ctx, item, "sql");
        }
        if (st->sql && ctx->total == before)
            parse_statement_text(ctx, st, sql_node ? sql_node : item, ipath);
    }
}
