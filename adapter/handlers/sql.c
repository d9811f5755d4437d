/*
 * sql — runs the consumer's configured statements, in order, inside the dedup transaction.
 *
 * The config loader already parsed each statement's `:field` placeholders (sql_template.h): the
 * worker prepares the rewritten text once per connection and binds, for every message, the
 * fields by dotted path as typed parameters (db_bind_json: strings as strings, integers as
 * BIGINT, reals as DOUBLE, booleans as TINYINT, null as NULL, maps and arrays as JSON text).
 * Field values are never pasted into SQL, so `'; DROP TABLE orders; --` is just a string.
 *
 * Results: every field is looked up before anything runs, so a missing one is reported by name
 * and is non-retryable (the same message will always miss it). A wrong type is left to MySQL
 * (1366 incorrect value, 1406 too long, 1048 NULL…), which db_error_classify judges. With
 * expect_rows, the statement's row count — matched rows for UPDATE (the connection uses
 * CLIENT_FOUND_ROWS), affected rows for INSERT/DELETE, returned rows for a SELECT — must equal
 * it; a mismatch is retryable or non-retryable by on_mismatch. The store rolls everything back
 * on any failure. Thread affinity: the DB worker owning call->db; statements are per worker.
 */
#include "handlers/sql.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bind.h"
#include "db/prepare.h"
#include "outbox/writer.h"

typedef struct sql_state {
    MYSQL_STMT **stmts; /* one per configured statement, prepared on first use */
    size_t stmt_count;
    MYSQL_BIND *binds; /* scratch for the widest statement */
    db_bind_slot *slots;
    size_t bind_cap;
} sql_state;

static sql_state *state_for(handler_call *call)
{
    const config_sql *cs = &call->consumer->handler.sql;
    sql_state *st = *call->state;
    size_t widest = 1;

    if (st)
        return st;
    for (size_t i = 0; i < cs->statement_count; i++)
        if (cs->statements[i].param_count > widest)
            widest = cs->statements[i].param_count;
    st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->stmt_count = cs->statement_count;
    st->bind_cap = widest;
    st->stmts = calloc(st->stmt_count, sizeof *st->stmts);
    st->binds = calloc(widest, sizeof *st->binds);
    st->slots = calloc(widest, sizeof *st->slots);
    if (!st->stmts || !st->binds || !st->slots) {
        free(st->stmts);
        free(st->binds);
        free(st->slots);
        free(st);
        return NULL;
    }
    *call->state = st;
    return st;
}

/* What a failure of statement index (0-based) during what ("prepare", "execute"…) is called. */
static const char *statement_step(char *buf, size_t buf_len, size_t index, const char *what)
{
    snprintf(buf, buf_len, "statement %zu (%s)", index + 1, what);
    return buf;
}

static apply_status fail_statement(handler_call *call, MYSQL_STMT *stmt, size_t index,
                                   const char *what)
{
    char step[64];
    return handler_fail_statement(call, statement_step(step, sizeof step, index, what), stmt);
}

static apply_status prepare(handler_call *call, sql_state *st, size_t index)
{
    const config_sql_statement *cs = &call->consumer->handler.sql.statements[index];
    MYSQL_STMT *stmt;
    db_error error;
    char step[64];
    int rc = db_prepare(call->db, cs->prepared, &stmt, &error);
    if (rc == -ENOMEM) {
        snprintf(call->error, call->error_len, "statement %zu: out of memory", index + 1);
        return APPLY_RETRYABLE;
    }
    if (rc != 0)
        return handler_fail(call, statement_step(step, sizeof step, index, "prepare"), &error);
    if (mysql_stmt_param_count(stmt) != cs->param_count) {
        /* Only possible if the lexer and the server disagree about a '?': refuse to guess. */
        snprintf(call->error, call->error_len,
                 "statement %zu: the server sees %lu parameters, the config %zu placeholders",
                 index + 1, (unsigned long)mysql_stmt_param_count(stmt), cs->param_count);
        mysql_stmt_close(stmt);
        return APPLY_NON_RETRYABLE;
    }
    st->stmts[index] = stmt;
    return APPLY_OK;
}

/* Runs statement index; on success stores its row count in *rows. */
static apply_status run_statement(handler_call *call, sql_state *st, size_t index,
                                  unsigned long long *rows)
{
    const config_sql_statement *cs = &call->consumer->handler.sql.statements[index];
    apply_status status = APPLY_OK;
    MYSQL_STMT *stmt;
    size_t bound = 0;

    if (!st->stmts[index] && (status = prepare(call, st, index)) != APPLY_OK)
        return status;
    stmt = st->stmts[index];
    for (; bound < cs->param_count; bound++) {
        const json_t *value = envelope_field(call->env, cs->params[bound]);
        memset(&st->slots[bound], 0, sizeof st->slots[bound]);
        if (db_bind_json(&st->binds[bound], &st->slots[bound], value) != 0) {
            snprintf(call->error, call->error_len, "statement %zu: out of memory binding %s",
                     index + 1, cs->params[bound]);
            status = APPLY_RETRYABLE;
            goto out;
        }
    }
    if ((cs->param_count && mysql_stmt_bind_param(stmt, st->binds)) || mysql_stmt_execute(stmt)) {
        status = fail_statement(call, stmt, index, "execute");
        goto out;
    }
    if (mysql_stmt_field_count(stmt) > 0) {
        /* A SELECT: its row count is what expect_rows checks (e.g. "the row exists"). */
        if (mysql_stmt_store_result(stmt) != 0) {
            status = fail_statement(call, stmt, index, "read result");
            db_stmt_discard_failed_result(stmt);
            goto out;
        }
        *rows = (unsigned long long)mysql_stmt_num_rows(stmt);
        mysql_stmt_free_result(stmt);
    } else {
        *rows = (unsigned long long)mysql_stmt_affected_rows(stmt);
    }
out:
    for (size_t i = 0; i < bound; i++)
        db_bind_slot_release(&st->slots[i]);
    return status;
}

apply_status sql_handler_apply(handler_call *call)
{
    const config_sql *cs = &call->consumer->handler.sql;
    sql_state *st;

    /* Look every field up first: a missing one fails the same way on every delivery, and naming
     * it beats a NULL constraint error from whichever statement happens to use it. */
    for (size_t i = 0; i < cs->statement_count; i++) {
        const config_sql_statement *s = &cs->statements[i];
        for (size_t j = 0; j < s->param_count; j++) {
            if (!envelope_field(call->env, s->params[j])) {
                snprintf(call->error, call->error_len,
                         "field %.255s is missing from the message (statement %zu, :%.255s)",
                         s->params[j], i + 1, s->params[j]);
                return APPLY_NON_RETRYABLE;
            }
        }
    }
    st = state_for(call);
    if (!st) {
        snprintf(call->error, call->error_len, "out of memory");
        return APPLY_RETRYABLE;
    }
    for (size_t i = 0; i < cs->statement_count; i++) {
        const config_sql_statement *s = &cs->statements[i];
        unsigned long long rows = 0;
        apply_status status = run_statement(call, st, i, &rows);
        if (status != APPLY_OK)
            return status;
        if (s->expect_rows_set && rows != s->expect_rows) {
            snprintf(call->error, call->error_len, "statement %zu changed %llu rows, expected %u",
                     i + 1, rows, s->expect_rows);
            return cs->on_mismatch == CONFIG_ON_MISMATCH_RETRY ? APPLY_RETRYABLE
                                                               : APPLY_NON_RETRYABLE;
        }
    }
    /* Every statement succeeded: the emits go with them (a field the message lacks fails it,
     * and the store rolls the statements back too). */
    for (size_t e = 0; e < cs->emit_count; e++) {
        int rc = outbox_writer_add(call->outbox, call->outbox_item, call->consumer,
                                   &cs->emits[e], call->env, call->error, call->error_len);
        if (rc == -ENOMEM) {
            snprintf(call->error, call->error_len, "out of memory");
            return APPLY_RETRYABLE;
        }
        if (rc != 0)
            return APPLY_NON_RETRYABLE;
    }
    return APPLY_OK;
}

apply_status sql_handler_prepare_all(handler_call *call)
{
    sql_state *st = state_for(call);
    if (!st) {
        snprintf(call->error, call->error_len, "out of memory");
        return APPLY_RETRYABLE;
    }
    for (size_t i = 0; i < st->stmt_count; i++) {
        apply_status status;
        if (!st->stmts[i] && (status = prepare(call, st, i)) != APPLY_OK)
            return status;
    }
    return APPLY_OK;
}

void sql_handler_release(const config_consumer *consumer, void *state)
{
    sql_state *st = state;
    (void)consumer;
    for (size_t i = 0; i < st->stmt_count; i++)
        if (st->stmts[i])
            mysql_stmt_close(st->stmts[i]);
    free(st->stmts);
    free(st->binds);
    free(st->slots);
    free(st);
}
