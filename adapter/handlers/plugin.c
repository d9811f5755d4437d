/*
 * plugin — the host side of include/idemq/plugin.h. See handlers/plugin.h for the design.
 *
 * The host table hands plugins read access to the decoded message (jansson stays inside idemq:
 * field() converts values into idemq_value) and exec(), which prepares the plugin's SQL on the
 * worker's connection, caches up to PLUGIN_STMT_CACHE statements per worker (least recently used
 * out), binds idemq_values as typed parameters and runs them inside the open transaction.
 */
#include "handlers/plugin.h"

#include <dlfcn.h>
#include <errno.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bind.h"
#include "db/error.h"
#include "db/prepare.h"
#include "handlers/handler.h"
#include "handlers/sql_template.h"
#include "idemq/plugin.h"
#include "ops/log.h"

#define PLUGIN_STMT_CACHE 32
#define PLUGIN_REASON_MAX 768

struct plugin {
    void *so;                    /* dlopen handle */
    const idemq_plugin_v1 *desc; /* borrowed from the shared object */
    void *state;                 /* the plugin's, from init */
    char *path;
};

/* The message as plugins see it. Strings handed out for maps and arrays live in texts until
 * handle() returns. */
struct idemq_message {
    const envelope *env;
    const void *body;
    size_t body_len;
    const config_consumer *consumer;
    char **texts;
    size_t text_count, text_cap;
    bool out_of_memory;
};

typedef struct cached_stmt {
    char *sql;
    MYSQL_STMT *stmt;
    uint64_t used;
} cached_stmt;

/* Per worker and consumer: the prepared statements of exec(). */
typedef struct plugin_worker {
    cached_stmt cache[PLUGIN_STMT_CACHE];
    uint64_t tick;
} plugin_worker;

struct idemq_tx {
    MYSQL *db;
    plugin_worker *worker;
    unsigned int fatal_errno; /* an error that ended the transaction; exec refuses to go on */
    unsigned int last_errno;  /* the last failed exec, reported with a non-OK result */
};

/* ------------------------------------------------------------------------------------------ */
/* Host functions                                                                              */

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
    static const config_log_level levels[] = {CONFIG_LOG_DEBUG, CONFIG_LOG_INFO, CONFIG_LOG_WARN,
                                              CONFIG_LOG_ERROR};
    config_log_level l = (unsigned)level < 4 ? levels[level] : CONFIG_LOG_ERROR;
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

/* The prepared statement for sql on this worker, from the cache or freshly prepared. Returns 0,
 * -ENOMEM, or -1 with the server's error in *error (see db_prepare). */
static int statement_for(idemq_tx *tx, const char *sql, MYSQL_STMT **out, db_error *error)
{
    plugin_worker *w = tx->worker;
    cached_stmt *slot = &w->cache[0];
    MYSQL_STMT *stmt;
    *out = NULL;
    w->tick++;
    for (size_t i = 0; i < PLUGIN_STMT_CACHE; i++) {
        cached_stmt *c = &w->cache[i];
        if (c->sql && strcmp(c->sql, sql) == 0) {
            c->used = w->tick;
            *out = c->stmt;
            return 0;
        }
        if (!c->sql || (slot->sql && c->used < slot->used))
            slot = c;
    }
    int rc = db_prepare(tx->db, sql, &stmt, error);
    if (rc != 0)
        return rc;
    char *copy = strdup(sql);
    if (!copy) {
        mysql_stmt_close(stmt);
        return -ENOMEM;
    }
    if (slot->sql) {
        mysql_stmt_close(slot->stmt);
        free(slot->sql);
    }
    slot->sql = copy;
    slot->stmt = stmt;
    slot->used = w->tick;
    *out = stmt;
    return 0;
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
    int prepared = statement_for(tx, sql, &stmt, &error);
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
    if (param_count) {
        binds = calloc(param_count, sizeof *binds);
        slots = calloc(param_count, sizeof *slots);
        if (!binds || !slots) {
            exec_fail(out, 0, NULL, "out of memory binding parameters");
            goto out;
        }
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
            mysql_stmt_free_result(stmt);
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
    free(binds);
    free(slots);
    return rc;
}

static const idemq_host_v1 host_table = {
    .abi_version = IDEMQ_PLUGIN_ABI_VERSION,
    .size = sizeof(idemq_host_v1),
    .field = host_field,
    .biz_key = host_biz_key,
    .message_id = host_message_id,
    .body = host_body,
    .exec = host_exec,
    .classify = host_classify,
    .log = host_log,
};

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                     */

int plugin_open(const char *path, const char *config_json, plugin **out, char *err, size_t err_len)
{
    typedef const idemq_plugin_v1 *(*entry_fn)(void);
    char init_err[512] = "";
    plugin *p = NULL;
    void *so, *sym;
    entry_fn entry;
    const idemq_plugin_v1 *desc;

    *out = NULL;
    so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        const char *why = dlerror();
        snprintf(err, err_len, "cannot load plugin %s: %s", path, why ? why : "unknown error");
        return -1;
    }
    dlerror();
    sym = dlsym(so, IDEMQ_PLUGIN_ENTRY_SYMBOL);
    if (!sym) {
        snprintf(err, err_len,
                 "plugin %s does not export %s(): it is not an idemq plugin, or was not built "
                 "against include/idemq/plugin.h (export the symbol with IDEMQ_PLUGIN_EXPORT)",
                 path, IDEMQ_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    memcpy(&entry, &sym, sizeof entry); /* object → function pointer, as POSIX dlsym intends */
    desc = entry();
    if (!desc) {
        snprintf(err, err_len, "plugin %s: %s() returned NULL", path, IDEMQ_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    /* abi_version is the first member in every version, so reading it is always safe. */
    if (desc->abi_version != IDEMQ_PLUGIN_ABI_VERSION) {
        snprintf(err, err_len,
                 "plugin %s has plugin ABI version %u, but this idemq needs version %d: rebuild "
                 "the plugin against this idemq's include/idemq/plugin.h",
                 path, (unsigned)desc->abi_version, IDEMQ_PLUGIN_ABI_VERSION);
        goto fail;
    }
    if (!desc->handle) {
        snprintf(err, err_len, "plugin %s has no handle function", path);
        goto fail;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(path))) {
        snprintf(err, err_len, "out of memory loading plugin %s", path);
        goto fail;
    }
    p->so = so;
    p->desc = desc;
    if (desc->init && desc->init(&host_table, config_json ? config_json : "{}", &p->state, init_err,
                                 sizeof init_err) != 0) {
        init_err[sizeof init_err - 1] = '\0';
        snprintf(err, err_len, "plugin %s (%s) refused its config: %s", path,
                 desc->name ? desc->name : "unnamed", init_err[0] ? init_err : "init failed");
        goto fail;
    }
    *out = p;
    return 0;
fail:
    if (p)
        free(p->path);
    free(p);
    dlclose(so);
    return -1;
}

const char *plugin_name(const plugin *p)
{
    return p->desc->name && p->desc->name[0] ? p->desc->name : "(unnamed)";
}

uint32_t plugin_abi_version(const plugin *p)
{
    return p->desc->abi_version;
}

void plugin_close(plugin *p)
{
    if (!p)
        return;
    if (p->desc->free)
        p->desc->free(p->state);
    dlclose(p->so);
    free(p->path);
    free(p);
}

/* Written on the main thread before the workers start and after they are joined; read-only in
 * between (thread creation and join order the accesses). */
static struct {
    const config *cfg;
    plugin **by_consumer;
} registry;

int plugin_registry_load(const config *cfg, char *err, size_t err_len)
{
    plugin_registry_unload();
    registry.by_consumer =
        calloc(cfg->consumer_count ? cfg->consumer_count : 1, sizeof *registry.by_consumer);
    if (!registry.by_consumer) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    registry.cfg = cfg;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        const config_consumer *c = &cfg->consumers[i];
        char why[1024];
        if (c->handler.type != CONFIG_HANDLER_PLUGIN)
            continue;
        if (plugin_open(c->handler.plugin.path, c->handler.plugin.config_json,
                        &registry.by_consumer[i], why, sizeof why) != 0) {
            snprintf(err, err_len, "consumer %s: %s", c->queue, why);
            plugin_registry_unload();
            return -1;
        }
        log_context ctx = {.queue = c->queue, .retries = -1};
        log_info(&ctx, "loaded plugin %s from %s (plugin ABI %u)",
                 plugin_name(registry.by_consumer[i]), c->handler.plugin.path,
                 (unsigned)plugin_abi_version(registry.by_consumer[i]));
    }
    return 0;
}

void plugin_registry_unload(void)
{
    if (registry.by_consumer && registry.cfg)
        for (size_t i = 0; i < registry.cfg->consumer_count; i++)
            plugin_close(registry.by_consumer[i]);
    free(registry.by_consumer);
    registry.by_consumer = NULL;
    registry.cfg = NULL;
}

static plugin *registered(const config_consumer *consumer)
{
    if (!registry.cfg || !registry.by_consumer || consumer < registry.cfg->consumers ||
        consumer >= registry.cfg->consumers + registry.cfg->consumer_count)
        return NULL;
    return registry.by_consumer[consumer - registry.cfg->consumers];
}

/* ------------------------------------------------------------------------------------------ */
/* Running                                                                                     */

apply_status plugin_handler_apply(handler_call *call)
{
    plugin *p = registered(call->consumer);
    char reason[PLUGIN_REASON_MAX] = "";
    apply_status status;

    if (!p) {
        snprintf(call->error, call->error_len, "plugin for handler %s is not loaded",
                 call->consumer->handler_name);
        return APPLY_RETRYABLE;
    }
    plugin_worker *w = *call->state;
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) {
            snprintf(call->error, call->error_len, "out of memory");
            return APPLY_RETRYABLE;
        }
        *call->state = w;
    }
    idemq_message msg = {
        .env = call->env,
        .body = call->body,
        .body_len = call->body_len,
        .consumer = call->consumer,
    };
    idemq_tx tx = {.db = call->db, .worker = w};
    idemq_result result = p->desc->handle(p->state, &host_table, &msg, &tx, reason, sizeof reason);
    reason[sizeof reason - 1] = '\0';
    for (size_t i = 0; i < msg.text_count; i++)
        free(msg.texts[i]);
    free(msg.texts);

    if (tx.fatal_errno) {
        /* Whatever the plugin concluded, the transaction is gone: retry it (deadlock) or pause
         * (database unreachable). Committing now would lose the dedup row. */
        call->mysql_errno = tx.fatal_errno;
        snprintf(call->error, call->error_len,
                 "plugin %s: MySQL error %u ended the transaction%s%s", plugin_name(p),
                 tx.fatal_errno, reason[0] ? ": " : "", reason);
        status = db_error_classify(tx.fatal_errno);
        return status == APPLY_UNAVAILABLE ? APPLY_UNAVAILABLE : APPLY_RETRYABLE;
    }
    if (msg.out_of_memory && result == IDEMQ_OK) {
        snprintf(call->error, call->error_len, "plugin %s: out of memory reading a field",
                 plugin_name(p));
        return APPLY_RETRYABLE;
    }
    switch (result) {
    case IDEMQ_OK:
        return APPLY_CONTINUE;
    case IDEMQ_RETRYABLE:
        status = APPLY_RETRYABLE;
        break;
    case IDEMQ_NON_RETRYABLE:
        status = APPLY_NON_RETRYABLE;
        break;
    default:
        snprintf(reason, sizeof reason, "handle() returned %d, which is not an idemq_result",
                 (int)result);
        status = APPLY_NON_RETRYABLE;
        break;
    }
    call->mysql_errno = tx.last_errno;
    snprintf(call->error, call->error_len, "plugin %s: %s", plugin_name(p),
             reason[0]
                 ? reason
                 : (status == APPLY_RETRYABLE ? "asked for a retry" : "rejected the message"));
    return status;
}

void plugin_handler_release(const config_consumer *consumer, void *state)
{
    plugin_worker *w = state;
    (void)consumer;
    for (size_t i = 0; i < PLUGIN_STMT_CACHE; i++) {
        if (w->cache[i].stmt)
            mysql_stmt_close(w->cache[i].stmt);
        free(w->cache[i].sql);
    }
    free(w);
}
