/*
 * state_machine — applies a declarative transition table to one row.
 *
 * One guarded UPDATE decides the transition atomically:
 *   UPDATE `table` SET `state`=?, `col`=IF(?, ?, `col`)… WHERE `key`=? AND `state` IN (?, …)
 * A `set` column whose field is absent from the message keeps its value (the flag parameter is
 * 0), so one transition table serves events that carry the field and events that don't.
 * The connection uses CLIENT_FOUND_ROWS, so the affected-row count is the matched-row count. When
 * nothing matched, the current state tells why: already at the target → an idempotent success
 * (state_noop); no row → retryable (the row's creating event may still be on its way); any other
 * state → an illegal transition, dead-lettered or retried as configured. Identifiers come from
 * the validated config and are backtick-quoted; every value is a bound parameter.
 * Thread affinity: the DB worker owning call->db. Prepared statements are cached per worker.
 */
#include "handlers/state_machine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bind.h"
#include "db/prepare.h"

#define STATE_VALUE_MAX 256

typedef struct state_machine_statements {
    MYSQL_STMT **updates;     /* one per transition, prepared on first use */
    MYSQL_STMT *select_state;
} state_machine_statements;

static apply_status prepare(handler_call *call, const char *sql, MYSQL_STMT **out)
{
    db_error error;
    int rc = db_prepare(call->db, sql, out, &error);
    if (rc == -ENOMEM) {
        snprintf(call->error, call->error_len, "out of memory preparing a statement");
        return APPLY_RETRYABLE;
    }
    return rc == 0 ? APPLY_CONTINUE : handler_fail(call, "prepare", &error);
}

static char *build_update_sql(const config_state_machine *sm, const config_transition *tr)
{
    /* Identifiers are ≤ 64 validated chars; 128 bytes per column is ample. */
    size_t cap = 256 + 200 * (sm->set_count + 3) + 4 * tr->from_count;
    char *sql = malloc(cap);
    if (!sql)
        return NULL;
    int n = snprintf(sql, cap, "UPDATE `%s` SET `%s` = ?", sm->table, sm->state_column);
    for (size_t i = 0; i < sm->set_count; i++)
        n += snprintf(sql + n, cap - (size_t)n, ", `%s` = IF(?, ?, `%s`)", sm->set[i].column,
                      sm->set[i].column);
    n += snprintf(sql + n, cap - (size_t)n, " WHERE `%s` = ? AND `%s` IN (", sm->key_column,
                  sm->state_column);
    for (size_t i = 0; i < tr->from_count; i++)
        n += snprintf(sql + n, cap - (size_t)n, i ? ", ?" : "?");
    snprintf(sql + n, cap - (size_t)n, ")");
    return sql;
}

static state_machine_statements *statements_for(handler_call *call)
{
    state_machine_statements *stmts = *call->state;
    if (stmts)
        return stmts;
    stmts = calloc(1, sizeof *stmts);
    if (!stmts)
        return NULL;
    stmts->updates = calloc(call->consumer->handler.state_machine.transition_count + 1,
                            sizeof *stmts->updates);
    if (!stmts->updates) {
        free(stmts);
        return NULL;
    }
    *call->state = stmts;
    return stmts;
}

static apply_status prepare_select_state(handler_call *call, state_machine_statements *stmts)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT `%s` FROM `%s` WHERE `%s` = ?", sm->state_column, sm->table,
             sm->key_column);
    return prepare(call, sql, &stmts->select_state);
}

static bool value_is_key(const json_t *value)
{
    return json_is_string(value) || json_is_integer(value);
}

/* Looks at the row when the guarded UPDATE matched nothing and explains why. */
static apply_status classify_unmatched(handler_call *call, state_machine_statements *stmts,
                                       const json_t *key, const config_transition *tr,
                                       const char *event)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    apply_status status;
    if (!stmts->select_state && (status = prepare_select_state(call, stmts)) != APPLY_CONTINUE)
        return status;
    MYSQL_STMT *stmt = stmts->select_state;
    MYSQL_BIND param;
    db_bind_slot param_slot = {0};
    if (db_bind_json(&param, &param_slot, key) != 0 || mysql_stmt_bind_param(stmt, &param) ||
        mysql_stmt_execute(stmt))
        return handler_fail_statement(call, "read current state", stmt);

    char current[STATE_VALUE_MAX + 1] = {0};
    unsigned long current_len = 0;
    my_bool current_null = 0;
    MYSQL_BIND result = {0};
    result.buffer_type = MYSQL_TYPE_STRING;
    result.buffer = current;
    result.buffer_length = STATE_VALUE_MAX;
    result.length = &current_len;
    result.is_null = &current_null;
    if (mysql_stmt_bind_result(stmt, &result) || mysql_stmt_store_result(stmt)) {
        status = handler_fail_statement(call, "read current state", stmt);
        mysql_stmt_free_result(stmt);
        return status;
    }
    int fetched = mysql_stmt_fetch(stmt);
    mysql_stmt_free_result(stmt);
    if (fetched == MYSQL_NO_DATA) {
        snprintf(call->error, call->error_len, "row %s = %s not found in table %s",
                 sm->key_column, json_is_string(key) ? json_string_value(key) : "(number)",
                 sm->table);
        return APPLY_RETRYABLE;
    }
    if (fetched == 1)
        return handler_fail_statement(call, "read current state", stmt);
    if (current_len > STATE_VALUE_MAX)
        current_len = STATE_VALUE_MAX;
    current[current_len] = '\0';
    if (!current_null && strcmp(current, tr->to) == 0)
        return APPLY_STATE_NOOP;
    snprintf(call->error, call->error_len,
             "illegal transition: event %s moves %s from [%s%s] to %s, but the row is in %s", event,
             sm->state_column, tr->from[0], tr->from_count > 1 ? ", …" : "", tr->to,
             current_null ? "NULL" : current);
    return sm->on_illegal == CONFIG_ON_ILLEGAL_RETRY ? APPLY_RETRYABLE : APPLY_NON_RETRYABLE;
}

apply_status state_machine_apply(handler_call *call)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    const json_t *event = envelope_field(call->env, sm->event_field);
    if (!json_is_string(event)) {
        snprintf(call->error, call->error_len, "field %s is %s; it must be a string naming the event",
                 sm->event_field, event ? "not a string" : "missing");
        return APPLY_NON_RETRYABLE;
    }
    const char *event_name = json_string_value(event);
    size_t index = 0;
    while (index < sm->transition_count && strcmp(sm->transitions[index].event, event_name) != 0)
        index++;
    if (index == sm->transition_count) {
        snprintf(call->error, call->error_len, "event %.64s has no transition in the state machine",
                 event_name);
        return APPLY_NON_RETRYABLE;
    }
    const config_transition *tr = &sm->transitions[index];
    const json_t *key = envelope_field(call->env, sm->key_field);
    if (!value_is_key(key)) {
        snprintf(call->error, call->error_len, "field %s is %s; it must be a string or an integer",
                 sm->key_field, key ? "of the wrong type" : "missing");
        return APPLY_NON_RETRYABLE;
    }

    state_machine_statements *stmts = statements_for(call);
    if (!stmts) {
        snprintf(call->error, call->error_len, "out of memory");
        return APPLY_RETRYABLE;
    }
    apply_status status;
    if (!stmts->updates[index]) {
        char *sql = build_update_sql(sm, tr);
        if (!sql) {
            snprintf(call->error, call->error_len, "out of memory");
            return APPLY_RETRYABLE;
        }
        status = prepare(call, sql, &stmts->updates[index]);
        free(sql);
        if (status != APPLY_CONTINUE)
            return status;
    }

    size_t param_count = 2 + 2 * sm->set_count + tr->from_count;
    MYSQL_BIND *params = calloc(param_count, sizeof *params);
    db_bind_slot *slots = calloc(param_count, sizeof *slots);
    if (!params || !slots) {
        free(params);
        free(slots);
        snprintf(call->error, call->error_len, "out of memory");
        return APPLY_RETRYABLE;
    }
    size_t p = 0;
    status = APPLY_CONTINUE;
    db_bind_text(&params[p], &slots[p], tr->to);
    p++;
    for (size_t i = 0; i < sm->set_count; i++, p++) {
        const json_t *value = envelope_field(call->env, sm->set[i].field);
        db_bind_bool(&params[p], &slots[p], value != NULL);
        p++;
        if (db_bind_json(&params[p], &slots[p], value ? value : json_null()) != 0) {
            snprintf(call->error, call->error_len, "out of memory");
            status = APPLY_RETRYABLE;
            goto out;
        }
    }
    db_bind_json(&params[p], &slots[p], key);
    p++;
    for (size_t i = 0; i < tr->from_count; i++, p++)
        db_bind_text(&params[p], &slots[p], tr->from[i]);

    MYSQL_STMT *update = stmts->updates[index];
    if (mysql_stmt_bind_param(update, params) || mysql_stmt_execute(update)) {
        status = handler_fail_statement(call, "state transition", update);
        goto out;
    }
    if (mysql_stmt_affected_rows(update) == 0)
        status = classify_unmatched(call, stmts, key, tr, event_name);
out:
    for (size_t i = 0; i < param_count; i++)
        db_bind_slot_release(&slots[i]);
    free(slots);
    free(params);
    return status;
}

apply_status state_machine_prepare_all(handler_call *call)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    state_machine_statements *stmts = statements_for(call);
    if (!stmts) {
        snprintf(call->error, call->error_len, "out of memory");
        return APPLY_RETRYABLE;
    }
    for (size_t i = 0; i < sm->transition_count; i++) {
        if (stmts->updates[i])
            continue;
        char *sql = build_update_sql(sm, &sm->transitions[i]);
        if (!sql) {
            snprintf(call->error, call->error_len, "out of memory");
            return APPLY_RETRYABLE;
        }
        apply_status status = prepare(call, sql, &stmts->updates[i]);
        free(sql);
        if (status != APPLY_CONTINUE)
            return status;
    }
    return stmts->select_state ? APPLY_CONTINUE : prepare_select_state(call, stmts);
}

void state_machine_release(const config_consumer *consumer, void *state)
{
    state_machine_statements *stmts = state;
    for (size_t i = 0; i < consumer->handler.state_machine.transition_count; i++)
        if (stmts->updates[i])
            mysql_stmt_close(stmts->updates[i]);
    if (stmts->select_state)
        mysql_stmt_close(stmts->select_state);
    free(stmts->updates);
    free(stmts);
}
