/*
 * writer — see writer.h.
 *
 * Every row's strings and body live in one byte arena that is reset, not freed, at each flush:
 * after the first few transactions a worker writes its rows without allocating. Rows point into
 * the arena by offset, since it may move while it grows.
 */
#include "outbox/writer.h"

#include <errno.h>
#include <msgpack.h>
#include <mysqld_error.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/bind.h"
#include "db/prepare.h"
#include "outbox/table.h"
#include "util/trace_context.h"

#define INSERT_PARAMS OUTBOX_TABLE_INSERT_PARAMS
/* A flush inserts n rows with one statement per set bit of n: rows 2^k at a time, k < 12, so a
 * connection prepares at most 12 statements and a batch of up to 4095 rows takes at most 12 round
 * trips (a batch of 32 messages, one emit each: one). */
#define INSERT_CLASSES 12
#define INSERT_ROWS_MAX ((size_t)1 << (INSERT_CLASSES - 1))
/* ... and no more rows than fit this many bytes of parameters (a row larger than that goes
 * alone): the statement travels in one packet, and one beyond the server's max_allowed_packet
 * (MySQL 5.7's default is 4 MiB, MariaDB's 16 MiB) makes the server drop the connection. A
 * batch of large emits (bodies near amqp.max_body) would otherwise never insert. */
#define INSERT_BYTES_MAX ((size_t)2 * 1024 * 1024)
#define INSERT_PARAM_OVERHEAD 9 /* a parameter's length prefix, at most */

static const char insert_head[] = OUTBOX_TABLE_INSERT_HEAD;
static const char insert_row[] = OUTBOX_TABLE_INSERT_ROW;

/* A span of the arena. */
typedef struct span {
    size_t off, len;
} span;

/* A span for SQL NULL (no trace context). */
#define NO_VALUE SIZE_MAX

typedef struct outbox_row {
    size_t item;
    bool dropped;
    /* source_biz_key, handler_name, emit_name, biz_key, exchange, routing_key, content_type,
     * body, traceparent, tracestate: the INSERT's parameters in order */
    span parts[INSERT_PARAMS];
} outbox_row;

struct outbox_writer {
    char *arena;
    size_t used, cap;
    bool out_of_memory; /* an append failed: the row being built is abandoned */
    outbox_row *rows;
    size_t count, rows_cap;
    MYSQL_STMT *insert[INSERT_CLASSES]; /* 2^k rows each; prepared on first use */
    MYSQL_BIND *binds;                  /* INSERT_PARAMS × INSERT_ROWS_MAX, on first flush */
    unsigned long long packet_max;      /* the server's max_allowed_packet; 0: not read yet */
    db_bind_slot *slots;
};

void outbox_derive_key(const char *source_biz_key, const char *handler_name, const char *emit_name,
                       char *out)
{
    const char *parts[3] = {source_biz_key, handler_name, emit_name};
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    /* Each part behind its length: ("a", "bc") and ("ab", "c") must not derive one key. */
    bool ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
    for (size_t i = 0; ok && i < 3; i++) {
        uint64_t n = strlen(parts[i]);
        unsigned char le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (unsigned char)(n >> (8 * b));
        ok = EVP_DigestUpdate(md, le, sizeof le) == 1 && EVP_DigestUpdate(md, parts[i], n) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(md, digest, &digest_len) == 1 && digest_len == 32;
    EVP_MD_CTX_free(md);
    if (!ok)
        abort(); /* SHA-256 cannot fail but for memory: a key we cannot derive must not exist */
    memcpy(out, OUTBOX_KEY_PREFIX, sizeof OUTBOX_KEY_PREFIX - 1);
    char *hex = out + sizeof OUTBOX_KEY_PREFIX - 1;
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
}

outbox_writer *outbox_writer_new(void)
{
    return calloc(1, sizeof(outbox_writer));
}

void outbox_writer_disconnect(outbox_writer *w)
{
    if (!w)
        return;
    for (size_t k = 0; k < INSERT_CLASSES; k++) {
        if (w->insert[k])
            mysql_stmt_close(w->insert[k]);
        w->insert[k] = NULL;
    }
    w->packet_max = 0;
}

void outbox_writer_free(outbox_writer *w)
{
    if (!w)
        return;
    outbox_writer_disconnect(w);
    free(w->arena);
    free(w->rows);
    free(w->binds);
    free(w->slots);
    free(w);
}

static bool reserve(outbox_writer *w, size_t more)
{
    if (w->out_of_memory)
        return false;
    if (w->cap - w->used >= more)
        return true;
    size_t cap = w->cap ? w->cap : 4096;
    while (cap - w->used < more) {
        if (cap > SIZE_MAX / 2) {
            w->out_of_memory = true;
            return false;
        }
        cap *= 2;
    }
    char *arena = realloc(w->arena, cap);
    if (!arena) {
        w->out_of_memory = true;
        return false;
    }
    w->arena = arena;
    w->cap = cap;
    return true;
}

static void append(outbox_writer *w, const void *data, size_t len)
{
    if (!reserve(w, len))
        return;
    memcpy(w->arena + w->used, data, len);
    w->used += len;
}

static span append_text(outbox_writer *w, const char *text)
{
    span s = {.off = w->used, .len = strlen(text)};
    append(w, text, s.len);
    return s;
}

/* --------------------------------------------------------------------------------- JSON body */

static void append_json_string(outbox_writer *w, const char *s, size_t len)
{
    static const char hexdig[] = "0123456789abcdef";
    append(w, "\"", 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            append(w, esc, 2);
        } else if (c < 0x20) {
            char esc[6] = {'\\', 'u', '0', '0', hexdig[c >> 4], hexdig[c & 15]};
            append(w, esc, 6);
        } else {
            append(w, &s[i], 1);
        }
    }
    append(w, "\"", 1);
}

static void append_json_value(outbox_writer *w, const json_t *value)
{
    size_t need = json_dumpb(value, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
    if (need == 0 || !reserve(w, need)) {
        w->out_of_memory = true;
        return;
    }
    w->used += json_dumpb(value, w->arena + w->used, need, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* ---------------------------------------------------------------------------- MessagePack body */

static int msgpack_to_arena(void *data, const char *buf, size_t len)
{
    outbox_writer *w = data;
    append(w, buf, len);
    return w->out_of_memory ? -1 : 0;
}

static void pack_json(msgpack_packer *pk, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        const json_t *member;
        msgpack_pack_map(pk, json_object_size(v));
        json_object_foreach((json_t *)v, key, member)
        {
            size_t n = strlen(key);
            msgpack_pack_str(pk, n);
            msgpack_pack_str_body(pk, key, n);
            pack_json(pk, member);
        }
        break;
    }
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++)
            pack_json(pk, json_array_get(v, i));
        break;
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(v));
        msgpack_pack_str_body(pk, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(v));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(v));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    case JSON_NULL:
        msgpack_pack_nil(pk);
        break;
    }
}

/* ----------------------------------------------------------------------------------- rows */

/* The value of field f for env: the incoming message's, or the constant. NULL when missing. */
static const json_t *field_value(const config_emit_field *f, const envelope *env)
{
    return f->value ? f->value : envelope_field(env, f->from);
}

typedef struct body_source {
    const config_emit *emit; /* configured fields, or */
    const json_t *fields;    /* a plugin's map */
    const envelope *env;
} body_source;

static void append_body(outbox_writer *w, const body_source *src, config_emit_format format,
                        const char *key)
{
    size_t n = src->emit ? src->emit->field_count : json_object_size(src->fields);
    void *iter = src->fields ? json_object_iter((json_t *)src->fields) : NULL;
    msgpack_packer pk;

    if (format == CONFIG_EMIT_MSGPACK) {
        msgpack_packer_init(&pk, w, msgpack_to_arena);
        bool replaces = src->fields && json_object_get(src->fields, "biz_key");
        msgpack_pack_map(&pk, n + (replaces ? 0 : 1));
        msgpack_pack_str(&pk, 7);
        msgpack_pack_str_body(&pk, "biz_key", 7);
        msgpack_pack_str(&pk, strlen(key));
        msgpack_pack_str_body(&pk, key, strlen(key));
    } else {
        append(w, "{\"biz_key\":", 11);
        append_json_string(w, key, strlen(key));
    }
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const json_t *value;
        if (src->emit) {
            name = src->emit->fields[i].name;
            value = field_value(&src->emit->fields[i], src->env);
        } else {
            name = json_object_iter_key(iter);
            value = json_object_iter_value(iter);
            iter = json_object_iter_next((json_t *)src->fields, iter);
            if (!strcmp(name, "biz_key"))
                continue; /* idemq's: the plugin's own one is replaced */
        }
        if (format == CONFIG_EMIT_MSGPACK) {
            msgpack_pack_str(&pk, strlen(name));
            msgpack_pack_str_body(&pk, name, strlen(name));
            pack_json(&pk, value);
        } else {
            append(w, ",", 1);
            append_json_string(w, name, strlen(name));
            append(w, ":", 1);
            append_json_value(w, value);
        }
    }
    if (format != CONFIG_EMIT_MSGPACK)
        append(w, "}", 1);
}

static int add_row(outbox_writer *w, size_t item, const config_consumer *c, const envelope *env,
                   const char *name, const char *exchange, const char *routing_key,
                   config_emit_format format, const body_source *src, char *err, size_t err_len)
{
    char key[OUTBOX_KEY_LEN + 1];
    size_t mark = w->used;

    if (w->count == w->rows_cap) {
        size_t cap = w->rows_cap ? 2 * w->rows_cap : 16;
        outbox_row *rows = realloc(w->rows, cap * sizeof *rows);
        if (!rows)
            return -ENOMEM;
        w->rows = rows;
        w->rows_cap = cap;
    }
    outbox_derive_key(env->biz_key, c->handler_name, name, key);
    outbox_row *row = &w->rows[w->count];
    row->item = item;
    row->dropped = false;
    row->parts[0] = append_text(w, env->biz_key);
    row->parts[1] = append_text(w, c->handler_name);
    row->parts[2] = append_text(w, name);
    row->parts[3] = append_text(w, key);
    row->parts[4] = append_text(w, exchange ? exchange : "");
    row->parts[5] = append_text(w, routing_key);
    row->parts[6] = append_text(w, format == CONFIG_EMIT_MSGPACK ? OUTBOX_CONTENT_TYPE_MSGPACK
                                                                 : OUTBOX_CONTENT_TYPE_JSON);
    row->parts[7].off = w->used;
    append_body(w, src, format, key);
    row->parts[7].len = w->used - row->parts[7].off;
    /* The emit continues the incoming message's trace as a child of idemq's span for it. */
    char traceparent[TRACE_TRACEPARENT_LEN + 1];
    if (env->trace && trace_context_child(env->trace, traceparent, sizeof traceparent)) {
        row->parts[OUTBOX_TABLE_INSERT_TRACEPARENT] = append_text(w, traceparent);
        row->parts[OUTBOX_TABLE_INSERT_TRACESTATE] =
            env->trace->tracestate_len ? append_text(w, env->trace->tracestate)
                                       : (span){.off = NO_VALUE, .len = 0};
    } else {
        row->parts[OUTBOX_TABLE_INSERT_TRACEPARENT] = (span){.off = NO_VALUE, .len = 0};
        row->parts[OUTBOX_TABLE_INSERT_TRACESTATE] = (span){.off = NO_VALUE, .len = 0};
    }
    if (w->out_of_memory) {
        w->out_of_memory = false;
        w->used = mark;
        return -ENOMEM;
    }
    if (row->parts[7].len > OUTBOX_BODY_MAX) {
        w->used = mark;
        snprintf(err, err_len, "emit %s: the outgoing message is %zu bytes; at most %zu fit", name,
                 row->parts[7].len, OUTBOX_BODY_MAX);
        return -1;
    }
    w->count++;
    return 0;
}

int outbox_writer_add(outbox_writer *w, size_t item, const config_consumer *c, const config_emit *e,
                      const envelope *env, char *err, size_t err_len)
{
    /* Every field is looked up before anything is written: a message that lacks one is
     * dead-lettered with the field's name, and no partial row exists. */
    for (size_t i = 0; i < e->field_count; i++) {
        if (!field_value(&e->fields[i], env)) {
            snprintf(err, err_len,
                     "emit %s: the message has no field '%s' (for the outgoing field '%s')",
                     e->name, e->fields[i].from, e->fields[i].name);
            return -1;
        }
    }
    body_source src = {.emit = e, .env = env};
    return add_row(w, item, c, env, e->name, e->exchange, e->routing_key, e->format, &src, err,
                   err_len);
}

static int check_name(const char *what, const char *text, size_t min, size_t max, char *err,
                      size_t err_len)
{
    size_t n = text ? strlen(text) : 0;
    if (!text || n < min || n > max) {
        snprintf(err, err_len, "emit: %s must be %zu to %zu bytes (got %zu)", what, min, max, n);
        return -1;
    }
    for (const char *p = text; *p; p++) {
        if ((unsigned char)*p < 0x20) {
            snprintf(err, err_len, "emit: %s must not contain control characters", what);
            return -1;
        }
    }
    return 0;
}

int outbox_writer_add_fields(outbox_writer *w, size_t item, const config_consumer *c,
                             const envelope *env, const char *name, const char *exchange,
                             const char *routing_key, config_emit_format format,
                             const json_t *fields, char *err, size_t err_len)
{
    if (check_name("the name", name, 1, OUTBOX_NAME_MAX, err, err_len) < 0 ||
        check_name("the exchange", exchange ? exchange : "", 0, OUTBOX_EXCHANGE_MAX, err, err_len) <
            0 ||
        check_name("the routing key", routing_key, 0, OUTBOX_ROUTING_KEY_MAX, err, err_len) < 0)
        return -1;
    if (!json_is_object(fields)) {
        snprintf(err, err_len, "emit %s: the fields must be a JSON object", name);
        return -1;
    }
    /* Two messages of one name would derive one outgoing biz_key, and a downstream idemq would
     * drop the second as a duplicate: configured emits are checked at load, a plugin's here. */
    for (size_t i = 0; i < w->count; i++) {
        const outbox_row *row = &w->rows[i];
        if (!row->dropped && row->item == item && row->parts[2].len == strlen(name) &&
            !memcmp(w->arena + row->parts[2].off, name, row->parts[2].len)) {
            snprintf(err, err_len,
                     "emit %s: this message already emitted one of that name (the name is part "
                     "of the outgoing biz_key: give each emit of a message its own)",
                     name);
            return -1;
        }
    }
    body_source src = {.fields = fields, .env = env};
    return add_row(w, item, c, env, name, exchange, routing_key, format, &src, err, err_len);
}

size_t outbox_writer_pending(const outbox_writer *w)
{
    size_t n = 0;
    for (size_t i = 0; i < w->count; i++)
        n += !w->rows[i].dropped;
    return n;
}

void outbox_writer_drop_item(outbox_writer *w, size_t item)
{
    for (size_t i = 0; i < w->count; i++)
        if (w->rows[i].item == item)
            w->rows[i].dropped = true;
}

void outbox_writer_clear(outbox_writer *w)
{
    w->count = 0;
    w->used = 0;
    w->out_of_memory = false;
}

/* A table or column of the outbox that is missing is an idemq_outbox from before this version
 * (or none): say what fixes it, since `idemq run` pauses on it until someone does. */
static void migrate_hint(db_error *error)
{
    if (error->number != ER_BAD_FIELD_ERROR && error->number != ER_NO_SUCH_TABLE)
        return;
    size_t n = strlen(error->message);
    snprintf(error->message + n, sizeof error->message - n,
             "; idemq_outbox is missing or older than this idemq: run `idemq migrate`");
}

/* The statement inserting 2^k rows, prepared on first use. */
static int insert_statement(outbox_writer *w, MYSQL *db, size_t k, MYSQL_STMT **out,
                            db_error *error)
{
    if (!w->insert[k]) {
        size_t rows = (size_t)1 << k;
        size_t cap = sizeof insert_head + rows * (sizeof insert_row + 2);
        char *sql = malloc(cap);
        if (!sql)
            return -ENOMEM;
        size_t len = (size_t)snprintf(sql, cap, "%s", insert_head);
        for (size_t i = 0; i < rows; i++)
            len += (size_t)snprintf(sql + len, cap - len, "%s%s", i ? ", " : "", insert_row);
        int rc = db_prepare(db, sql, &w->insert[k], error);
        free(sql);
        if (rc == -1)
            migrate_hint(error);
        if (rc != 0)
            return rc;
    }
    *out = w->insert[k];
    return 0;
}

int outbox_writer_prepare(outbox_writer *w, MYSQL *db, db_error *error)
{
    MYSQL_STMT *stmt;
    outbox_writer_disconnect(w);
    return insert_statement(w, db, 0, &stmt, error);
}

static size_t row_bytes(const outbox_row *row)
{
    size_t n = 0;
    for (size_t p = 0; p < INSERT_PARAMS; p++)
        n += row->parts[p].len + INSERT_PARAM_OVERHEAD;
    return n;
}

/* The server's max_allowed_packet, read once per connection. A row the server cannot take would
 * make it drop the connection on every try (an outage that never ends), so the writer refuses
 * it as the message's own fault instead. */
static int read_packet_max(outbox_writer *w, MYSQL *db, db_error *error)
{
    if (w->packet_max)
        return 0;
    if (mysql_query(db, "SELECT @@max_allowed_packet") != 0) {
        db_error_of_connection(db, error);
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    w->packet_max = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
    if (res)
        mysql_free_result(res);
    if (!w->packet_max) {
        db_error_of_connection(db, error);
        return -1;
    }
    return 0;
}

int outbox_writer_flush(outbox_writer *w, MYSQL *db, size_t *inserted, db_error *error)
{
    size_t done = 0, live = 0;
    int rc = 0;

    if (inserted)
        *inserted = 0;
    /* The rows to insert, packed to the front (dropped ones left out), in the order added. */
    for (size_t i = 0; i < w->count; i++)
        if (!w->rows[i].dropped)
            w->rows[live++] = w->rows[i];
    if (live > 0 && (!w->binds || !w->slots)) {
        free(w->binds);
        free(w->slots);
        w->binds = calloc(INSERT_PARAMS * INSERT_ROWS_MAX, sizeof *w->binds);
        w->slots = calloc(INSERT_PARAMS * INSERT_ROWS_MAX, sizeof *w->slots);
        if (!w->binds || !w->slots)
            rc = -ENOMEM;
    }
    if (rc == 0 && live > 0)
        rc = read_packet_max(w, db, error);
    for (size_t i = 0; rc == 0 && i < live; i++) {
        /* What the statement adds around one row's values stays far below this headroom. */
        if (row_bytes(&w->rows[i]) + 4096 > w->packet_max) {
            memset(error, 0, sizeof *error);
            snprintf(error->sqlstate, sizeof error->sqlstate, "HY000");
            snprintf(error->message, sizeof error->message,
                     "an outgoing message of %zu bytes does not fit the server's "
                     "max_allowed_packet (%llu bytes)",
                     w->rows[i].parts[7].len, w->packet_max);
            rc = OUTBOX_E_TOO_LARGE;
        }
    }
    while (rc == 0 && done < live) {
        size_t left = live - done, k = INSERT_CLASSES - 1, fit = 0, bytes = 0;
        while (((size_t)1 << k) > left)
            k--;
        while (fit < ((size_t)1 << k)) {
            size_t more = row_bytes(&w->rows[done + fit]);
            if (fit > 0 && bytes + more > INSERT_BYTES_MAX)
                break;
            bytes += more;
            fit++;
        }
        while (((size_t)1 << k) > fit)
            k--;
        size_t rows = (size_t)1 << k;
        MYSQL_STMT *stmt;
        rc = insert_statement(w, db, k, &stmt, error);
        if (rc != 0)
            break;
        for (size_t r = 0; r < rows; r++) {
            const outbox_row *row = &w->rows[done + r];
            for (size_t p = 0; p < INSERT_PARAMS; p++) {
                size_t at = r * INSERT_PARAMS + p;
                memset(&w->slots[at], 0, sizeof w->slots[at]);
                if (row->parts[p].off == NO_VALUE)
                    db_bind_null(&w->binds[at], &w->slots[at]);
                else
                    db_bind_string(&w->binds[at], &w->slots[at], w->arena + row->parts[p].off,
                                   row->parts[p].len);
            }
        }
        if (mysql_stmt_bind_param(stmt, w->binds) != 0 || mysql_stmt_execute(stmt) != 0) {
            db_error_of_statement(stmt, error);
            migrate_hint(error);
            rc = -1;
            break;
        }
        done += rows;
    }
    outbox_writer_clear(w);
    if (inserted)
        *inserted = rc == 0 ? done : 0;
    return rc;
}
