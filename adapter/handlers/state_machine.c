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
 *
 * A batch (handler_apply_batch) gives the same results with three statements for all its
 * messages instead of one or two each:
 *   SELECT CASE WHEN `key` = ? THEN 0 … END, `key`, `state` FROM `table`
 *          WHERE `key` IN (?, …) FOR UPDATE                     the batch's rows, locked
 *   decisions in C, message by message in batch order, each seeing the state the ones before
 *   it left
 *   UPDATE `table` SET `state` = CASE WHEN `key` = ? THEN ? … ELSE `state` END,
 *          `col` = CASE WHEN `key` = ? THEN IF(?, ?, `col`) … ELSE `col` END
 *          WHERE `key` IN (?, …)                                 every row that moved, once
 * The row locks make the decision as atomic as the guarded UPDATE's. C decides only what byte
 * comparison settles for any collation: a state equal to a `from` state moves, a state equal to
 * the target (and like no `from` state) is a no-op. Everything else — a key without a row, an
 * illegal or collation-dependent state, and any later message on such a row, to keep their
 * order — runs afterwards through the one-message path above, in the same transaction, so its
 * result and its reason are exactly the ones a lone message gets. A case the batch does not
 * settle (a key matching several rows, set values of mixed types, an oversized key) fails the
 * batch as a whole and the store runs its messages one by one.
 *
 * Thread affinity: the DB worker owning call->db. Prepared statements and scratch arrays are
 * cached per worker; nothing is allocated per message.
 */
#include "handlers/state_machine.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "db/bind.h"
#include "db/client.h"
#include "db/prepare.h"
#include "outbox/writer.h"

#define STATE_VALUE_MAX 256
#define KEY_TEXT_MAX 256

/* The per-connection state of a batch, sized for call->batch_max items. */
typedef struct batch_scratch {
    size_t cap;
    MYSQL_BIND *binds; /* for the widest statement: (3 + 3 × set_count) × padded cap */
    db_bind_slot *slots;
    size_t bind_cap;
    /* per item */
    size_t *transition;   /* index into transitions */
    size_t *key_of;       /* index into keys */
    unsigned char *deferred; /* runs through the one-message path after the UPDATE */
    /* per distinct key */
    const json_t **keys;
    long *row_of_key;     /* index into the rows read, -1 for none */
    /* per row read */
    char (*row_key)[KEY_TEXT_MAX + 1];
    unsigned long *row_key_len;
    char (*row_state)[STATE_VALUE_MAX + 1];
    unsigned long *row_state_len;
    unsigned char *row_state_null;
    const char **row_to;  /* the state the batch moves the row to; NULL: unchanged */
    unsigned char *row_deferred; /* a message on this row was deferred: so are later ones */
    long *row_setter;     /* rows × set_count: the last item giving the column's field, -1 */
    size_t *changed;      /* the rows that moved */
    MYSQL_STMT *select_locked[HANDLER_BATCH_SIZE_CLASSES];
    MYSQL_STMT *update_rows[HANDLER_BATCH_SIZE_CLASSES];
} batch_scratch;

typedef struct state_machine_statements {
    MYSQL_STMT **updates;     /* one per transition, prepared on first use */
    MYSQL_STMT *select_state;
    MYSQL_BIND *params;       /* scratch for the widest guarded UPDATE */
    db_bind_slot *slots;
    batch_scratch *batch;     /* NULL until the first batch */
} state_machine_statements;

static apply_status prepare(handler_call *call, const char *sql, MYSQL_STMT **out)
{
    db_error error;
    int rc = db_prepare(call->db, sql, out, &error);
    if (rc == -ENOMEM) {
        snprintf(call->error, call->error_len, "out of memory preparing a statement");
        return APPLY_RETRYABLE;
    }
    return rc == 0 ? APPLY_OK : handler_fail(call, "prepare", &error);
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

static void free_batch(batch_scratch *b)
{
    if (!b)
        return;
    for (size_t c = 0; c < HANDLER_BATCH_SIZE_CLASSES; c++) {
        if (b->select_locked[c])
            mysql_stmt_close(b->select_locked[c]);
        if (b->update_rows[c])
            mysql_stmt_close(b->update_rows[c]);
    }
    free(b->binds);
    free(b->slots);
    free(b->transition);
    free(b->key_of);
    free(b->deferred);
    free(b->keys);
    free(b->row_of_key);
    free(b->row_key);
    free(b->row_key_len);
    free(b->row_state);
    free(b->row_state_len);
    free(b->row_state_null);
    free(b->row_to);
    free(b->row_deferred);
    free(b->row_setter);
    free(b->changed);
    free(b);
}

static state_machine_statements *statements_for(handler_call *call)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    state_machine_statements *stmts = *call->state;
    if (stmts)
        return stmts;
    size_t widest = 0;
    for (size_t i = 0; i < sm->transition_count; i++)
        if (sm->transitions[i].from_count > widest)
            widest = sm->transitions[i].from_count;
    widest += 2 + 2 * sm->set_count;
    stmts = calloc(1, sizeof *stmts);
    if (!stmts)
        return NULL;
    stmts->updates = calloc(sm->transition_count + 1, sizeof *stmts->updates);
    stmts->params = calloc(widest, sizeof *stmts->params);
    stmts->slots = calloc(widest, sizeof *stmts->slots);
    if (!stmts->updates || !stmts->params || !stmts->slots) {
        free(stmts->updates);
        free(stmts->params);
        free(stmts->slots);
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
    if (!stmts->select_state && (status = prepare_select_state(call, stmts)) != APPLY_OK)
        return status;
    MYSQL_STMT *stmt = stmts->select_state;
    MYSQL_BIND param;
    db_bind_slot param_slot = {0};
    if (db_bind_json(&param, &param_slot, key) != 0 || mysql_stmt_bind_param(stmt, &param) ||
        mysql_stmt_execute(stmt))
        return handler_fail_statement(call, "read current state", stmt);

    char current[STATE_VALUE_MAX + 1] = {0};
    unsigned long current_len = 0;
    db_bool current_null = 0;
    MYSQL_BIND result = {0};
    result.buffer_type = MYSQL_TYPE_STRING;
    result.buffer = current;
    result.buffer_length = STATE_VALUE_MAX;
    result.length = &current_len;
    result.is_null = &current_null;
    if (mysql_stmt_bind_result(stmt, &result) || mysql_stmt_store_result(stmt)) {
        status = handler_fail_statement(call, "read current state", stmt);
        db_stmt_discard_failed_result(stmt);
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

/* The message's transition and row key, or its non-retryable failure in err. */
static apply_status resolve(const config_state_machine *sm, const envelope *env, size_t *index,
                            const json_t **key, const char **event_name, char *err, size_t err_len)
{
    const json_t *event = envelope_field(env, sm->event_field);
    if (!json_is_string(event)) {
        snprintf(err, err_len, "field %s is %s; it must be a string naming the event",
                 sm->event_field, event ? "not a string" : "missing");
        return APPLY_NON_RETRYABLE;
    }
    *event_name = json_string_value(event);
    size_t i = 0;
    while (i < sm->transition_count && strcmp(sm->transitions[i].event, *event_name) != 0)
        i++;
    if (i == sm->transition_count) {
        snprintf(err, err_len, "event %.64s has no transition in the state machine", *event_name);
        return APPLY_NON_RETRYABLE;
    }
    *index = i;
    *key = envelope_field(env, sm->key_field);
    if (!value_is_key(*key)) {
        snprintf(err, err_len, "field %s is %s; it must be a string or an integer", sm->key_field,
                 *key ? "of the wrong type" : "missing");
        return APPLY_NON_RETRYABLE;
    }
    /* A message whose transition emits must carry the emit's fields whether or not the row
     * moves: one rule for the lone and the batched path, decided before any statement runs. */
    const config_transition *tr = &sm->transitions[i];
    for (size_t e = 0; e < tr->emit_count; e++) {
        for (size_t f = 0; f < tr->emits[e].field_count; f++) {
            const config_emit_field *field = &tr->emits[e].fields[f];
            if (field->from && !envelope_field(env, field->from)) {
                snprintf(err, err_len,
                         "emit %s: the message has no field '%s' (for the outgoing field '%s')",
                         tr->emits[e].name, field->from, field->name);
                return APPLY_NON_RETRYABLE;
            }
        }
    }
    return APPLY_OK;
}

/* Adds the rows of tr's emits for env, tagged item: before the UPDATE, so that a row that cannot
 * be built fails the message while nothing of it has run. The caller drops them again when the
 * row does not move. */
static apply_status add_emits(handler_call *call, const config_transition *tr, const envelope *env,
                              size_t item, char *err, size_t err_len)
{
    for (size_t e = 0; e < tr->emit_count; e++) {
        int rc =
            outbox_writer_add(call->outbox, item, call->consumer, &tr->emits[e], env, err, err_len);
        if (rc == -ENOMEM) {
            snprintf(err, err_len, "out of memory");
            return APPLY_RETRYABLE;
        }
        if (rc != 0)
            return APPLY_NON_RETRYABLE;
    }
    return APPLY_OK;
}

static apply_status out_of_memory(handler_call *call)
{
    snprintf(call->error, call->error_len, "out of memory");
    return APPLY_RETRYABLE;
}

apply_status state_machine_apply(handler_call *call)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    size_t index;
    const json_t *key;
    const char *event_name;
    apply_status status =
        resolve(sm, call->env, &index, &key, &event_name, call->error, call->error_len);
    if (status != APPLY_OK)
        return status;
    const config_transition *tr = &sm->transitions[index];
    state_machine_statements *stmts = statements_for(call);
    if (!stmts)
        return out_of_memory(call);
    if (!stmts->updates[index]) {
        char *sql = build_update_sql(sm, tr);
        if (!sql)
            return out_of_memory(call);
        status = prepare(call, sql, &stmts->updates[index]);
        free(sql);
        if (status != APPLY_OK)
            return status;
    }

    if (tr->emit_count &&
        (status = add_emits(call, tr, call->env, call->outbox_item, call->error,
                            call->error_len)) != APPLY_OK) {
        outbox_writer_drop_item(call->outbox, call->outbox_item);
        return status;
    }

    MYSQL_BIND *params = stmts->params;
    db_bind_slot *slots = stmts->slots;
    size_t p = 0;
    db_bind_text(&params[p], &slots[p], tr->to);
    p++;
    for (size_t i = 0; i < sm->set_count; i++, p++) {
        const json_t *value = envelope_field(call->env, sm->set[i].field);
        db_bind_bool(&params[p], &slots[p], value != NULL);
        p++;
        if (db_bind_json(&params[p], &slots[p], value ? value : json_null()) != 0) {
            status = out_of_memory(call);
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
    for (size_t i = 0; i < p; i++)
        db_bind_slot_release(&slots[i]);
    if (status != APPLY_OK && tr->emit_count)
        outbox_writer_drop_item(call->outbox, call->outbox_item); /* the row did not move */
    return status;
}

/* ---------------------------------------------------------------------------------- batches */

static batch_scratch *batch_for(handler_call *call, state_machine_statements *stmts)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    size_t cap = call->batch_max ? call->batch_max : 1, padded;
    if (stmts->batch && stmts->batch->cap >= cap)
        return stmts->batch;
    free_batch(stmts->batch);
    stmts->batch = NULL;
    handler_batch_size_class(cap, &padded);
    batch_scratch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->cap = cap;
    b->bind_cap = (3 + 3 * sm->set_count) * padded;
    size_t setters = sm->set_count ? cap * sm->set_count : 1;
    b->binds = calloc(b->bind_cap, sizeof *b->binds);
    b->slots = calloc(b->bind_cap, sizeof *b->slots);
    b->transition = calloc(cap, sizeof *b->transition);
    b->key_of = calloc(cap, sizeof *b->key_of);
    b->deferred = calloc(cap, sizeof *b->deferred);
    b->keys = calloc(cap, sizeof *b->keys);
    b->row_of_key = calloc(cap, sizeof *b->row_of_key);
    b->row_key = calloc(cap, sizeof *b->row_key);
    b->row_key_len = calloc(cap, sizeof *b->row_key_len);
    b->row_state = calloc(cap, sizeof *b->row_state);
    b->row_state_len = calloc(cap, sizeof *b->row_state_len);
    b->row_state_null = calloc(cap, sizeof *b->row_state_null);
    b->row_to = calloc(cap, sizeof *b->row_to);
    b->row_deferred = calloc(cap, sizeof *b->row_deferred);
    b->row_setter = calloc(setters, sizeof *b->row_setter);
    b->changed = calloc(cap, sizeof *b->changed);
    if (!b->binds || !b->slots || !b->transition || !b->key_of || !b->deferred || !b->keys ||
        !b->row_of_key || !b->row_key || !b->row_key_len || !b->row_state ||
        !b->row_state_len || !b->row_state_null || !b->row_to || !b->row_deferred ||
        !b->row_setter || !b->changed) {
        free_batch(b);
        return NULL;
    }
    stmts->batch = b;
    return b;
}

/* A statement text of unknown length, built with a cursor that never runs past cap. */
typedef struct sql_text {
    char *text;
    size_t len, cap;
} sql_text;

static void put(sql_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(sql_text *t, const char *fmt, ...)
{
    va_list ap;
    if (t->len >= t->cap)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(t->text + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += n > 0 ? (size_t)n : 0;
}

static apply_status prepare_text(handler_call *call, sql_text *t, MYSQL_STMT **out)
{
    if (!t->text || t->len >= t->cap) {
        free(t->text);
        return out_of_memory(call);
    }
    apply_status status = prepare(call, t->text, out);
    free(t->text);
    return status;
}

static apply_status prepare_select_locked(handler_call *call, size_t size, MYSQL_STMT **out)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    sql_text t = {.cap = 512 + size * (strlen(sm->key_column) + 32)};
    t.text = malloc(t.cap);
    put(&t, "SELECT CASE");
    for (size_t i = 0; i < size; i++)
        put(&t, " WHEN `%s` = ? THEN %zu", sm->key_column, i);
    put(&t, " END, `%s`, `%s` FROM `%s` WHERE `%s` IN (", sm->key_column, sm->state_column,
        sm->table, sm->key_column);
    for (size_t i = 0; i < size; i++)
        put(&t, i ? ", ?" : "?");
    put(&t, ") FOR UPDATE");
    return prepare_text(call, &t, out);
}

static apply_status prepare_update_rows(handler_call *call, size_t size, MYSQL_STMT **out)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    size_t widest = strlen(sm->key_column) + strlen(sm->state_column);
    for (size_t j = 0; j < sm->set_count; j++)
        if (strlen(sm->set[j].column) + strlen(sm->key_column) > widest)
            widest = strlen(sm->set[j].column) + strlen(sm->key_column);
    sql_text t = {.cap = 512 + 256 * sm->set_count + size * (sm->set_count + 1) * (widest + 48)};
    t.text = malloc(t.cap);
    put(&t, "UPDATE `%s` SET `%s` = CASE", sm->table, sm->state_column);
    for (size_t i = 0; i < size; i++)
        put(&t, " WHEN `%s` = ? THEN ?", sm->key_column);
    put(&t, " ELSE `%s` END", sm->state_column);
    for (size_t j = 0; j < sm->set_count; j++) {
        put(&t, ", `%s` = CASE", sm->set[j].column);
        for (size_t i = 0; i < size; i++)
            put(&t, " WHEN `%s` = ? THEN IF(?, ?, `%s`)", sm->key_column, sm->set[j].column);
        put(&t, " ELSE `%s` END", sm->set[j].column);
    }
    put(&t, " WHERE `%s` IN (", sm->key_column);
    for (size_t i = 0; i < size; i++)
        put(&t, i ? ", ?" : "?");
    put(&t, ")");
    return prepare_text(call, &t, out);
}

static apply_status batch_fails(handler_call *call, const char *why)
{
    snprintf(call->error, call->error_len, "batch not decided as a whole: %s", why);
    return APPLY_RETRYABLE;
}

static void release_slots(batch_scratch *b, size_t count)
{
    for (size_t i = 0; i < count; i++)
        db_bind_slot_release(&b->slots[i]);
}

/* Reads and locks the rows of keys[0..key_count), filling row_of_key and the rows. */
static apply_status read_rows(handler_call *call, batch_scratch *b, size_t key_count,
                              size_t *row_count)
{
    size_t size, c = handler_batch_size_class(key_count, &size);
    apply_status status;
    if (!b->select_locked[c] &&
        (status = prepare_select_locked(call, size, &b->select_locked[c])) != APPLY_OK)
        return status;
    MYSQL_STMT *stmt = b->select_locked[c];
    for (size_t i = 0; i < 2 * size; i++) {
        size_t k = i % size < key_count ? i % size : key_count - 1;
        /* Keys are strings or integers: db_bind_json allocates nothing for them. */
        db_bind_json(&b->binds[i], &b->slots[i], b->keys[k]);
    }
    if (mysql_stmt_bind_param(stmt, b->binds) || mysql_stmt_execute(stmt))
        return handler_fail_statement(call, "read the batch's rows", stmt);

    long long index = 0;
    char key[KEY_TEXT_MAX + 1], state[STATE_VALUE_MAX + 1];
    unsigned long key_len = 0, state_len = 0;
    db_bool index_null = 0, key_null = 0, state_null = 0;
    MYSQL_BIND out[3];
    memset(out, 0, sizeof out);
    out[0].buffer_type = MYSQL_TYPE_LONGLONG, out[0].buffer = &index;
    out[0].is_null = &index_null;
    out[1].buffer_type = MYSQL_TYPE_STRING, out[1].buffer = key;
    out[1].buffer_length = sizeof key, out[1].length = &key_len, out[1].is_null = &key_null;
    out[2].buffer_type = MYSQL_TYPE_STRING, out[2].buffer = state;
    out[2].buffer_length = sizeof state, out[2].length = &state_len;
    out[2].is_null = &state_null;
    if (mysql_stmt_bind_result(stmt, out) || mysql_stmt_store_result(stmt)) {
        status = handler_fail_statement(call, "read the batch's rows", stmt);
        db_stmt_discard_failed_result(stmt);
        return status;
    }
    for (size_t k = 0; k < key_count; k++)
        b->row_of_key[k] = -1;
    size_t rows = 0;
    const char *why = NULL;
    int fetched;
    while ((fetched = mysql_stmt_fetch(stmt)) == 0 || fetched == MYSQL_DATA_TRUNCATED) {
        if (fetched == MYSQL_DATA_TRUNCATED || key_len > KEY_TEXT_MAX ||
            state_len > STATE_VALUE_MAX)
            why = "a key or state longer than 256 bytes";
        else if (index_null || key_null || index < 0 || (size_t)index >= key_count)
            why = "a row that no key names";
        else if (b->row_of_key[index] >= 0 || rows == b->cap)
            why = "a key that matches more than one row";
        if (why)
            continue; /* drain the result */
        memcpy(b->row_key[rows], key, key_len);
        b->row_key[rows][key_len] = '\0';
        b->row_key_len[rows] = key_len;
        memcpy(b->row_state[rows], state, state_null ? 0 : state_len);
        b->row_state[rows][state_null ? 0 : state_len] = '\0';
        b->row_state_len[rows] = state_null ? 0 : state_len;
        b->row_state_null[rows] = state_null != 0;
        b->row_of_key[index] = (long)rows;
        rows++;
    }
    if (fetched == 1)
        why = NULL, status = handler_fail_statement(call, "read the batch's rows", stmt);
    else
        status = APPLY_OK;
    mysql_stmt_free_result(stmt);
    if (status != APPLY_OK)
        return status;
    if (why)
        return batch_fails(call, why);
    *row_count = rows;
    return APPLY_OK;
}

/* Whether C can tell, for any collation, that a row in state s does not take this transition
 * from s and is already at its target (a state_noop): s equals the target byte for byte, and
 * both are ASCII with no `from` state that could compare equal to s (the same letters but for
 * case, or but for a trailing part such as spaces). */
static bool ascii(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80)
            return false;
    return true;
}

static bool surely_noop(const config_transition *tr, const char *s)
{
    if (strcmp(s, tr->to) != 0 || !ascii(s))
        return false; /* beyond ASCII, collations equate more than case (accents, widths) */
    size_t len = strlen(s);
    for (size_t i = 0; i < tr->from_count; i++) {
        if (!ascii(tr->from[i]))
            return false;
        size_t from_len = strlen(tr->from[i]), shorter = from_len < len ? from_len : len;
        if (strncasecmp(tr->from[i], s, shorter) == 0)
            return false; /* equal but for case or a trailing part: let SQL decide */
    }
    return true;
}

static bool in_from(const config_transition *tr, const char *s)
{
    for (size_t i = 0; i < tr->from_count; i++)
        if (strcmp(tr->from[i], s) == 0)
            return true;
    return false;
}

/* Decides, in batch order, what C settles, deferring the rest (see the file comment). Fills
 * row_to, row_setter and the items' statuses; returns the number of rows that move. */
static size_t decide(const config_state_machine *sm, batch_scratch *b, handler_batch_item *items,
                     size_t n, size_t rows)
{
    size_t moved = 0;
    for (size_t r = 0; r < rows; r++) {
        b->row_to[r] = NULL;
        b->row_deferred[r] = 0;
        for (size_t j = 0; j < sm->set_count; j++)
            b->row_setter[r * sm->set_count + j] = -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (items[i].status != APPLY_OK || b->deferred[i])
            continue;
        long r = b->row_of_key[b->key_of[i]];
        if (r < 0 || b->row_deferred[r]) {
            b->deferred[i] = 1; /* no row (or one a deferred message changes first) */
            if (r >= 0)
                b->row_deferred[r] = 1;
            continue;
        }
        const config_transition *tr = &sm->transitions[b->transition[i]];
        const char *current = b->row_to[r] ? b->row_to[r]
                              : b->row_state_null[r] ? NULL
                                                     : b->row_state[r];
        if (current && in_from(tr, current)) {
            if (!b->row_to[r])
                b->changed[moved++] = (size_t)r;
            b->row_to[r] = tr->to;
            for (size_t j = 0; j < sm->set_count; j++)
                if (envelope_field(items[i].env, sm->set[j].field))
                    b->row_setter[r * sm->set_count + j] = (long)i;
        } else if (current && surely_noop(tr, current)) {
            items[i].status = APPLY_STATE_NOOP;
        } else {
            b->deferred[i] = 1;
            b->row_deferred[r] = 1;
        }
    }
    return moved;
}

/* Whether every value bound to each set column has one JSON type (the CASE of the UPDATE would
 * otherwise convert them all to a common type, which a lone UPDATE never does). */
static bool set_values_uniform(const config_state_machine *sm, batch_scratch *b,
                               handler_batch_item *items, size_t moved)
{
    for (size_t j = 0; j < sm->set_count; j++) {
        int type = -1;
        for (size_t m = 0; m < moved; m++) {
            long setter = b->row_setter[b->changed[m] * sm->set_count + j];
            if (setter < 0)
                continue;
            const json_t *v = envelope_field(items[setter].env, sm->set[j].field);
            int t = json_is_boolean(v) ? JSON_TRUE : (int)json_typeof(v);
            if (t == JSON_NULL)
                continue;
            if (type >= 0 && t != type)
                return false;
            type = t;
        }
    }
    return true;
}

/* The multi-row UPDATE of the rows that move. */
static apply_status update_rows(handler_call *call, batch_scratch *b, handler_batch_item *items,
                                size_t moved)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    size_t size, c = handler_batch_size_class(moved, &size);
    apply_status status;
    if (!set_values_uniform(sm, b, items, moved))
        return batch_fails(call, "values of different types for one column");
    if (!b->update_rows[c] &&
        (status = prepare_update_rows(call, size, &b->update_rows[c])) != APPLY_OK)
        return status;
    MYSQL_STMT *stmt = b->update_rows[c];
    size_t p = 0;
    status = APPLY_OK;
    for (size_t i = 0; i < size; i++, p += 2) {
        size_t r = b->changed[i < moved ? i : moved - 1];
        db_bind_string(&b->binds[p], &b->slots[p], b->row_key[r], b->row_key_len[r]);
        db_bind_text(&b->binds[p + 1], &b->slots[p + 1], b->row_to[r]);
    }
    for (size_t j = 0; j < sm->set_count; j++) {
        for (size_t i = 0; i < size; i++, p += 3) {
            size_t r = b->changed[i < moved ? i : moved - 1];
            long setter = b->row_setter[r * sm->set_count + j];
            const json_t *v = setter >= 0 ? envelope_field(items[setter].env, sm->set[j].field)
                                          : NULL;
            db_bind_string(&b->binds[p], &b->slots[p], b->row_key[r], b->row_key_len[r]);
            db_bind_bool(&b->binds[p + 1], &b->slots[p + 1], v != NULL);
            if (db_bind_json(&b->binds[p + 2], &b->slots[p + 2], v ? v : json_null()) != 0) {
                p += 3;
                status = out_of_memory(call);
                goto out;
            }
        }
    }
    for (size_t i = 0; i < size; i++, p++) {
        size_t r = b->changed[i < moved ? i : moved - 1];
        db_bind_string(&b->binds[p], &b->slots[p], b->row_key[r], b->row_key_len[r]);
    }
    if (mysql_stmt_bind_param(stmt, b->binds) || mysql_stmt_execute(stmt)) {
        status = handler_fail_statement(call, "batch state transition", stmt);
        goto out;
    }
    if (mysql_stmt_affected_rows(stmt) != moved) {
        char why[96];
        snprintf(why, sizeof why, "the UPDATE matched %llu rows of %zu",
                 (unsigned long long)mysql_stmt_affected_rows(stmt), moved);
        status = batch_fails(call, why);
    }
out:
    release_slots(b, p);
    return status;
}

/* The messages C did not settle, one by one through the one-message path, in batch order. */
static apply_status run_deferred(handler_call *call, batch_scratch *b, handler_batch_item *items,
                                 size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!b->deferred[i])
            continue;
        handler_call one = *call;
        one.env = items[i].env;
        one.error = items[i].error;
        one.error_len = items[i].error_len;
        one.mysql_errno = 0;
        one.outbox_item = i;
        items[i].status = state_machine_apply(&one);
        items[i].mysql_errno = one.mysql_errno;
        if (one.mysql_errno || items[i].status == APPLY_UNAVAILABLE) {
            /* A statement failed: whether the transaction survived is the store's to find out,
             * by running every message alone. */
            call->mysql_errno = one.mysql_errno;
            snprintf(call->error, call->error_len, "%s", items[i].error);
            return items[i].status == APPLY_UNAVAILABLE ? APPLY_UNAVAILABLE : APPLY_RETRYABLE;
        }
    }
    return APPLY_OK;
}

apply_status state_machine_apply_batch(handler_call *call, handler_batch_item *items, size_t n)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    state_machine_statements *stmts = statements_for(call);
    batch_scratch *b = stmts ? batch_for(call, stmts) : NULL;
    if (!b)
        return out_of_memory(call);
    if (n > b->cap)
        return batch_fails(call, "more messages than mysql.batch");
    size_t key_count = 0;
    int key_type = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *key;
        const char *event_name;
        b->deferred[i] = 0;
        items[i].mysql_errno = 0;
        items[i].status = resolve(sm, items[i].env, &b->transition[i], &key, &event_name,
                                  items[i].error, items[i].error_len);
        if (items[i].status != APPLY_OK)
            continue;
        if (key_type >= 0 && key_type != (int)json_typeof(key))
            return batch_fails(call, "keys of different types");
        key_type = (int)json_typeof(key);
        size_t k = 0;
        while (k < key_count && !json_equal(b->keys[k], key))
            k++;
        if (k == key_count)
            b->keys[key_count++] = key;
        b->key_of[i] = k;
    }
    if (key_count == 0)
        return APPLY_OK;
    size_t rows = 0;
    apply_status status = read_rows(call, b, key_count, &rows);
    if (status != APPLY_OK)
        return status;
    size_t moved = decide(sm, b, items, n, rows);
    /* The messages the multi-row UPDATE moves are decided: their emits now, before it runs. */
    for (size_t i = 0; i < n; i++) {
        const config_transition *tr = &sm->transitions[b->transition[i]];
        if (items[i].status != APPLY_OK || b->deferred[i] || !tr->emit_count)
            continue;
        if (add_emits(call, tr, items[i].env, i, items[i].error, items[i].error_len) !=
            APPLY_OK)
            return batch_fails(call, "an emit could not be built");
    }
    if (moved > 0 && (status = update_rows(call, b, items, moved)) != APPLY_OK)
        return status;
    return run_deferred(call, b, items, n);
}

apply_status state_machine_prepare_all(handler_call *call)
{
    const config_state_machine *sm = &call->consumer->handler.state_machine;
    state_machine_statements *stmts = statements_for(call);
    if (!stmts)
        return out_of_memory(call);
    for (size_t i = 0; i < sm->transition_count; i++) {
        if (stmts->updates[i])
            continue;
        char *sql = build_update_sql(sm, &sm->transitions[i]);
        if (!sql)
            return out_of_memory(call);
        apply_status status = prepare(call, sql, &stmts->updates[i]);
        free(sql);
        if (status != APPLY_OK)
            return status;
    }
    return stmts->select_state ? APPLY_OK : prepare_select_state(call, stmts);
}

void state_machine_release(const config_consumer *consumer, void *state)
{
    state_machine_statements *stmts = state;
    for (size_t i = 0; i < consumer->handler.state_machine.transition_count; i++)
        if (stmts->updates[i])
            mysql_stmt_close(stmts->updates[i]);
    if (stmts->select_state)
        mysql_stmt_close(stmts->select_state);
    free_batch(stmts->batch);
    free(stmts->updates);
    free(stmts->params);
    free(stmts->slots);
    free(stmts);
}
