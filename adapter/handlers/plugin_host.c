/*
 * plugin_host — see handlers/plugin_host.h.
 */
#include "handlers/plugin_host.h"

#include <errno.h>
#include <mysqld_error.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bind.h"
#include "db/error.h"
#include "db/prepare.h"
#include "config/sql_template.h"
#include "ops/log.h"
#include "outbox/writer.h"
#include "util/trace_context.h"

static int host_field(const idemq_message *msg, const char *dotted_path, idemq_value *out)
{
    /* The host owns the message; handing texts out through a const pointer is its business. */
    idemq_message *m = (idemq_message *)msg;
    const json_t *v = dotted_path ? envelope_field(m->env, dotted_path) : NULL;
    memset(out, 0, sizeof *out);
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_STRING:
        out->type = IDEMQ_TYPE_STRING;
        out->s = json_string_value(v);
        out->len = json_string_length(v);
        return 0;
    case JSON_INTEGER:
        out->type = IDEMQ_TYPE_INT;
        out->i = (int64_t)json_integer_value(v);
        out->d = (double)out->i;
        return 0;
    case JSON_REAL:
        out->type = IDEMQ_TYPE_DOUBLE;
        out->d = json_real_value(v);
        return 0;
    case JSON_TRUE:
    case JSON_FALSE:
        out->type = IDEMQ_TYPE_BOOL;
        out->i = json_is_true(v);
        return 0;
    case JSON_NULL:
        out->type = v ? IDEMQ_TYPE_NULL : IDEMQ_TYPE_MISSING;
        return v ? 0 : -1;
    case JSON_OBJECT:
    case JSON_ARRAY: {
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (text && m->text_count == m->text_cap) {
            size_t ncap = m->text_cap ? m->text_cap * 2 : 4;
            char **nt = realloc(m->texts, ncap * sizeof *nt);
            if (!nt) {
                free(text);
                text = NULL;
            } else {
                m->texts = nt;
                m->text_cap = ncap;
            }
        }
        if (!text) {
            /* Reported as missing; handle()'s result is then overridden (see apply). */
            m->out_of_memory = true;
            out->type = IDEMQ_TYPE_MISSING;
            return -1;
        }
        m->texts[m->text_count++] = text;
        out->type = json_is_object(v) ? IDEMQ_TYPE_OBJECT : IDEMQ_TYPE_ARRAY;
        out->s = text;
        out->len = strlen(text);
        return 0;
    }
    }
    out->type = IDEMQ_TYPE_MISSING;
    return -1;
}

static const char *host_biz_key(const idemq_message *msg)
{
    return msg->env->biz_key;
}

static const char *host_message_id(const idemq_message *msg)
{
    return msg->env->message_id;
}

static const void *host_body(const idemq_message *msg, size_t *len)
{
    if (len)
        *len = msg->body ? msg->body_len : 0;
    return msg->body;
}

static idemq_result host_classify(unsigned int mysql_errno)
{
    switch (db_error_classify(mysql_errno)) {
    case APPLY_NON_RETRYABLE:
        return IDEMQ_NON_RETRYABLE;
    default:
        return IDEMQ_RETRYABLE;
    }
}

static void host_log(const idemq_message *msg, idemq_log_level level, const char *text)
{
    static const log_level levels[] = {LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN,
                                       LOG_LEVEL_ERROR};
    log_level l = (unsigned)level < 4 ? levels[level] : LOG_LEVEL_ERROR;
    if (!log_enabled(l))
        return;
    if (!msg) {
        log_write(l, LOG_NO_CONTEXT, "plugin: %s", text ? text : "");
        return;
    }
    log_context ctx = {
        .queue = msg->consumer->queue,
        .biz_key = msg->env->biz_key,
        .message_id = msg->env->message_id,
        .trace_id = msg->env->trace ? msg->env->trace->trace_id : NULL,
        .span_id = msg->env->trace ? msg->env->trace->span_id : NULL,
        .retries = -1,
    };
    log_write(l, &ctx, "plugin %s: %s", msg->consumer->handler_name, text ? text : "");
}

static int exec_fail(idemq_exec_result *out, unsigned int mysql_errno, const char *sqlstate,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int exec_fail(idemq_exec_result *out, unsigned int mysql_errno, const char *sqlstate,
                     const char *fmt, ...)
{
    va_list ap;
    if (!out)
        return -1;
    out->mysql_errno = mysql_errno;
    snprintf(out->sqlstate, sizeof out->sqlstate, "%s", sqlstate ? sqlstate : "HY000");
    va_start(ap, fmt);
    vsnprintf(out->error, sizeof out->error, fmt, ap);
    va_end(ap);
    return -1;
}

/* Remembers errors after which the transaction is gone: InnoDB rolls the whole transaction back
 * on a deadlock (the dedup row with it), and a lost connection takes it along. */
static void note_error(idemq_tx *tx, unsigned int mysql_errno)
{
    tx->last_errno = mysql_errno;
    if (mysql_errno == ER_LOCK_DEADLOCK || db_error_classify(mysql_errno) == APPLY_UNAVAILABLE)
        tx->fatal_errno = mysql_errno;
}

/* Binds parameter index (0-based) of exec() from v (borrowed), using slot for storage. Returns 0,
 * or -1 with the reason in out. */
static int bind_value(MYSQL_BIND *bind, db_bind_slot *slot, const idemq_value *v, size_t index,
                      idemq_exec_result *out)
{
    switch (v->type) {
    case IDEMQ_TYPE_STRING:
    case IDEMQ_TYPE_OBJECT:
    case IDEMQ_TYPE_ARRAY:
        if (!v->s && v->len)
            return exec_fail(out, 0, NULL, "parameter %zu has no string", index + 1);
        db_bind_string(bind, slot, v->s ? v->s : "", v->len);
        return 0;
    case IDEMQ_TYPE_INT:
        db_bind_int(bind, slot, (long long)v->i);
        return 0;
    case IDEMQ_TYPE_DOUBLE:
        db_bind_double(bind, slot, v->d);
        return 0;
    case IDEMQ_TYPE_BOOL:
        db_bind_bool(bind, slot, v->i != 0);
        return 0;
    case IDEMQ_TYPE_NULL:
        db_bind_null(bind, slot);
        return 0;
    default:
        return exec_fail(out, 0, NULL, "parameter %zu has no value (type %d)", index + 1,
                         (int)v->type);
    }
}

static int host_exec(idemq_tx *tx, const char *sql, const idemq_value *params, size_t param_count,
                     idemq_exec_result *out)
{
    idemq_exec_result scratch;
    MYSQL_BIND *binds = NULL;
    db_bind_slot *slots = NULL;
    MYSQL_STMT *stmt;
    db_error error;
    char keyword[32];
    int rc = -1;

    if (!out)
        out = &scratch;
    memset(out, 0, sizeof *out);
    snprintf(out->sqlstate, sizeof out->sqlstate, "00000");
    if (!sql)
        return exec_fail(out, 0, NULL, "no statement");
    if (tx->fatal_errno)
        return exec_fail(out, tx->fatal_errno, NULL,
                         "the transaction was already ended by MySQL error %u", tx->fatal_errno);
    if (!sql_keeps_transaction(sql, keyword, sizeof keyword))
        return exec_fail(out, 0, NULL,
                         "a %s statement cannot run inside idemq's transaction (it would end it)",
                         keyword);
    if (param_count && !params)
        return exec_fail(out, 0, NULL, "param_count is %zu but params is NULL", param_count);
    int prepared = plugin_statements_get(tx->statements, tx->db, sql, &stmt, &error);
    if (prepared == -ENOMEM)
        return exec_fail(out, 0, NULL, "out of memory preparing the statement");
    if (prepared != 0) {
        exec_fail(out, error.number, error.sqlstate, "prepare: %s", error.message);
        note_error(tx, out->mysql_errno);
        return -1;
    }
    if (mysql_stmt_param_count(stmt) != param_count)
        return exec_fail(out, 0, NULL, "the statement has %lu parameters, %zu were given",
                         (unsigned long)mysql_stmt_param_count(stmt), param_count);
    if (param_count &&
        plugin_statements_binds(tx->statements, param_count, &binds, &slots) != 0) {
        exec_fail(out, 0, NULL, "out of memory binding parameters");
        goto out;
    }
    for (size_t i = 0; i < param_count; i++)
        if (bind_value(&binds[i], &slots[i], &params[i], i, out) != 0)
            goto out;
    if ((param_count && mysql_stmt_bind_param(stmt, binds)) || mysql_stmt_execute(stmt)) {
        exec_fail(out, mysql_stmt_errno(stmt), mysql_stmt_sqlstate(stmt), "%s",
                  mysql_stmt_error(stmt));
        note_error(tx, out->mysql_errno);
        goto out;
    }
    if (mysql_stmt_field_count(stmt) > 0) {
        if (mysql_stmt_store_result(stmt) != 0) {
            exec_fail(out, mysql_stmt_errno(stmt), mysql_stmt_sqlstate(stmt), "%s",
                      mysql_stmt_error(stmt));
            note_error(tx, out->mysql_errno);
            db_stmt_discard_failed_result(stmt);
            goto out;
        }
        out->rows = (uint64_t)mysql_stmt_num_rows(stmt);
        mysql_stmt_free_result(stmt);
    } else {
        out->rows = (uint64_t)mysql_stmt_affected_rows(stmt);
        out->insert_id = (uint64_t)mysql_stmt_insert_id(stmt);
    }
    rc = 0;
out:
    return rc;
}

static int host_emit(idemq_tx *tx, const idemq_message *msg, const idemq_emit *e, char *err,
                     size_t err_len)
{
    char why[512];
    if (!tx || !msg || !e) {
        snprintf(err, err_len, "emit: tx, msg and e must not be NULL");
        return -1;
    }
    if (!e->fields_json) {
        snprintf(err, err_len, "emit %s: fields_json is NULL", e->name ? e->name : "?");
        return -1;
    }
    json_error_t parse_error;
    json_t *fields = json_loads(e->fields_json, JSON_REJECT_DUPLICATES, &parse_error);
    if (!fields) {
        snprintf(err, err_len, "emit %s: fields_json is not JSON: %s", e->name ? e->name : "?",
                 parse_error.text);
        return -1;
    }
    int rc = outbox_writer_add_fields(tx->outbox, tx->outbox_item, msg->consumer, msg->env,
                                      e->name, e->exchange, e->routing_key,
                                      e->msgpack ? CONFIG_EMIT_MSGPACK : CONFIG_EMIT_JSON, fields,
                                      why, sizeof why);
    json_decref(fields);
    if (rc == 0)
        return 0;
    snprintf(err, err_len, "%s", rc == -ENOMEM ? "emit: out of memory" : why);
    return -1;
}

const idemq_host_v1 plugin_host_table = {
    .abi_version = IDEMQ_PLUGIN_ABI_VERSION,
    .size = sizeof(idemq_host_v1),
    .field = host_field,
    .biz_key = host_biz_key,
    .message_id = host_message_id,
    .body = host_body,
    .exec = host_exec,
    .classify = host_classify,
    .log = host_log,
    .emit = host_emit,
};

void plugin_host_message_close(idemq_message *msg)
{
    for (size_t i = 0; i < msg->text_count; i++)
        free(msg->texts[i]);
    free(msg->texts);
    msg->texts = NULL;
    msg->text_count = msg->text_cap = 0;
}
