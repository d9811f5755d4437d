/*
 * test_outbox_writer — the outbox writer (adapter/outbox/writer.c): the rows and bodies it builds
 * from an `emit:` or a plugin's map, with the derived biz_key, and what it refuses. (The derived
 * key itself is checked against outside vectors, server-free, in tests/unit/test_outbox_key.c.)
 *
 * The writer shows its rows only by inserting them, so the row tests flush into a real MariaDB
 * (IDEMQ_TEST_MYSQL_URL, a scratch database per test, created from store_outbox_ddl) and read
 * them back; bodies are decoded with jansson and msgpack-c directly and once more with
 * envelope_decode, as a downstream idemq would.
 *
 * Thread affinity: Criterion runs each test in its own process; nothing here is shared.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <msgpack.h>
#include <mysql.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "db/dsn.h"
#include "envelope/envelope.h"
#include "outbox/writer.h"
#include "store/schema.h"

/* --------------------------------------------------------------------- a scratch database */

static MYSQL *db;
static char database[96];
static outbox_writer *writer;
static envelope env;

static void suite_fini(void)
{
    outbox_writer_free(writer); /* before the connection: it closes its statement */
    writer = NULL;
    envelope_close(&env);
    memset(&env, 0, sizeof env);
    if (db) {
        char sql[160];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS `%s`", database);
        mysql_query(db, sql);
        mysql_close(db);
        db = NULL;
    }
}

static void sql_ok(const char *sql)
{
    cr_assert(mysql_query(db, sql) == 0, "%s: %s", sql, mysql_error(db));
    MYSQL_RES *res = mysql_store_result(db);
    if (res)
        mysql_free_result(res);
}

/* Connects to IDEMQ_TEST_MYSQL_URL's server, creates a scratch database with idemq_outbox, and
 * a writer. */
static void suite_init(void)
{
    const char *url = getenv("IDEMQ_TEST_MYSQL_URL");
    cr_assert(url && *url, "IDEMQ_TEST_MYSQL_URL is not set: run through scripts/test, or source "
                           ".state/env (the writer's rows are read back from MariaDB)");
    db_dsn dsn;
    char err[256];
    cr_assert(db_dsn_parse(url, &dsn, err, sizeof err) == 0, "%s", err);
    db = mysql_init(NULL);
    cr_assert(db);
    const char *host = dsn.socket[0] ? "localhost" : dsn.host;
    cr_assert(mysql_real_connect(db, host, dsn.user, dsn.password, NULL, dsn.port,
                                 dsn.socket[0] ? dsn.socket : NULL, 0),
              "cannot connect to MariaDB: %s", mysql_error(db));
    snprintf(database, sizeof database, "idemq_u_outbox_writer_%d", (int)getpid());
    char sql[256];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS `%s`", database);
    sql_ok(sql);
    snprintf(sql, sizeof sql, "CREATE DATABASE `%s` CHARACTER SET utf8mb4", database);
    sql_ok(sql);
    cr_assert(mysql_select_db(db, database) == 0, "%s", mysql_error(db));
    sql_ok(store_outbox_ddl);
    writer = outbox_writer_new();
    cr_assert(writer);
}

TestSuite(outbox_writer, .init = suite_init, .fini = suite_fini, .timeout = 60);

/* -------------------------------------------------------------------------------- helpers */

static const config_consumer consumer = {.handler_name = (char *)"pay-callback"};

/* The incoming message every row test uses (JSON, decoded by envelope_decode). */
static const char incoming[] =
    "{\"biz_key\":\"order_id:o1:PAY_SUCCESS\",\"order_id\":\"o1\",\"event_type\":\"PAY_SUCCESS\","
    "\"amount\":1250,\"ratio\":0.25,\"paid\":true,\"note\":null,"
    "\"quoted\":\"say \\\"hi\\\"\\\\ \\n\\t\\u0001 caf\\u00e9 \\u20ac\","
    "\"customer\":{\"id\":7,\"address\":{\"city\":\"Lyon\"}},\"tags\":[\"a\",2,{\"b\":false}]}";

static void decode_incoming(const char *text)
{
    char err[256];
    envelope_close(&env);
    memset(&env, 0, sizeof env);
    envelope_limits lim = {.max_body = 64 * 1024 * 1024};
    cr_assert_eq(
        envelope_decode(text, strlen(text), "application/json", &lim, &env, err, sizeof err), 0,
        "the test's incoming message: %s", err);
}

/* One row of idemq_outbox as read back. Each column owned, NUL-terminated (body may hold more
 * NULs: body_len says how long it is). */
typedef struct row {
    char *col[8]; /* source_biz_key, handler_name, emit_name, biz_key, exchange, routing_key,
                     content_type, body */
    size_t body_len;
    long state, attempts;
} row;

typedef struct rows {
    row *at;
    size_t count;
} rows;

static rows read_rows(void)
{
    cr_assert(mysql_query(db, "SELECT source_biz_key, handler_name, emit_name, biz_key, exchange, "
                              "routing_key, content_type, body, state, attempts FROM idemq_outbox "
                              "ORDER BY id") == 0,
              "%s", mysql_error(db));
    MYSQL_RES *res = mysql_store_result(db);
    cr_assert(res);
    rows out = {.count = mysql_num_rows(res)};
    out.at = calloc(out.count + 1, sizeof *out.at);
    cr_assert(out.at);
    for (size_t i = 0; i < out.count; i++) {
        MYSQL_ROW r = mysql_fetch_row(res);
        unsigned long *len = mysql_fetch_lengths(res);
        cr_assert(r && len);
        for (int c = 0; c < 8; c++) {
            cr_assert(r[c], "column %d is NULL", c);
            out.at[i].col[c] = malloc(len[c] + 1);
            cr_assert(out.at[i].col[c]);
            memcpy(out.at[i].col[c], r[c], len[c]);
            out.at[i].col[c][len[c]] = '\0';
        }
        out.at[i].body_len = len[7];
        out.at[i].state = atol(r[8]);
        out.at[i].attempts = atol(r[9]);
    }
    mysql_free_result(res);
    return out;
}

static void free_rows(rows *r)
{
    for (size_t i = 0; i < r->count; i++)
        for (int c = 0; c < 8; c++)
            free(r->at[i].col[c]);
    free(r->at);
    r->at = NULL;
    r->count = 0;
}

static size_t flush_ok(void)
{
    size_t inserted = 12345;
    db_error error = {0};
    int rc = outbox_writer_flush(writer, db, &inserted, &error);
    cr_assert_eq(rc, 0, "flush: %s (%u)", error.message, error.number);
    cr_assert_eq(outbox_writer_pending(writer), 0, "a flush forgets its rows");
    return inserted;
}

static json_t *msgpack_to_json(const msgpack_object *o);

/* The MessagePack map body, as jansson (fails on anything the envelope could not carry:
 * non-string keys, bin, ext, a key twice). */
static json_t *msgpack_to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return json_null();
    case MSGPACK_OBJECT_BOOLEAN:
        return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        cr_assert(o->via.u64 <= INT64_MAX);
        return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR:
        return json_stringn(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++)
            json_array_append_new(a, msgpack_to_json(&o->via.array.ptr[i]));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            cr_assert_eq(k->type, MSGPACK_OBJECT_STR, "map keys are strings");
            char name[512];
            cr_assert(k->via.str.size < sizeof name);
            memcpy(name, k->via.str.ptr, k->via.str.size);
            name[k->via.str.size] = '\0';
            cr_assert_null(json_object_get(m, name), "key %s twice in the map", name);
            json_object_set_new(m, name, msgpack_to_json(&o->via.map.ptr[i].val));
        }
        return m;
    }
    default:
        cr_assert_fail("msgpack type %d in an outgoing body", (int)o->type);
    }
    return NULL;
}

/* The body of r decoded by its content type, with the library of that format (owned). */
static json_t *body_of(const row *r)
{
    if (!strcmp(r->col[6], OUTBOX_CONTENT_TYPE_JSON)) {
        json_error_t jerr;
        json_t *v = json_loadb(r->col[7], r->body_len, JSON_REJECT_DUPLICATES, &jerr);
        cr_assert(v, "the JSON body does not parse: %s: %s", jerr.text, r->col[7]);
        cr_assert(json_is_object(v));
        return v;
    }
    cr_assert_str_eq(r->col[6], OUTBOX_CONTENT_TYPE_MSGPACK);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, r->col[7], r->body_len, &off), MSGPACK_UNPACK_SUCCESS,
                 "the MessagePack body does not unpack");
    cr_assert_eq(off, r->body_len, "trailing bytes after the MessagePack map");
    cr_assert_eq(u.data.type, MSGPACK_OBJECT_MAP);
    json_t *v = msgpack_to_json(&u.data);
    msgpack_unpacked_destroy(&u);
    return v;
}

/* What a downstream idemq reads from r's body: its biz_key must be the row's. */
static void expect_downstream_reads(const row *r, const json_t *want)
{
    envelope down = {0};
    char err[256];
    int rc = envelope_decode(r->col[7], r->body_len, r->col[6], NULL, &down, err, sizeof err);
    cr_assert_eq(rc, 0, "a downstream idemq refuses the body: %s", err);
    cr_expect_str_eq(down.biz_key, r->col[3]);
    cr_expect(json_equal(down.root, want), "the downstream record differs");
    envelope_close(&down);
}

static void expect_row(const row *r, const char *source, const char *emit_name,
                       const char *exchange, const char *routing_key, const char *content_type)
{
    char key[OUTBOX_KEY_LEN + 1];
    outbox_derive_key(source, consumer.handler_name, emit_name, key);
    cr_expect_str_eq(r->col[0], source);
    cr_expect_str_eq(r->col[1], consumer.handler_name);
    cr_expect_str_eq(r->col[2], emit_name);
    cr_expect_str_eq(r->col[3], key);
    cr_expect_str_eq(r->col[4], exchange);
    cr_expect_str_eq(r->col[5], routing_key);
    cr_expect_str_eq(r->col[6], content_type);
    cr_expect_eq(r->state, 0, "a new row is pending");
    cr_expect_eq(r->attempts, 0);
}

/* An emit of the fields {name: path-or-NULL, constant} listed. */
typedef struct field_spec {
    const char *name;
    const char *from;       /* NULL: constant */
    const char *value_json; /* the constant, as JSON */
} field_spec;

typedef struct emit_holder {
    config_emit emit;
    config_emit_field fields[16];
} emit_holder;

static void make_emit(emit_holder *h, const char *name, const char *exchange,
                      const char *routing_key, config_emit_format format, const field_spec *specs,
                      size_t count)
{
    memset(h, 0, sizeof *h);
    cr_assert(count <= 16);
    h->emit.name = (char *)name;
    h->emit.exchange = (char *)exchange;
    h->emit.routing_key = (char *)routing_key;
    h->emit.format = format;
    h->emit.fields = h->fields;
    h->emit.field_count = count;
    for (size_t i = 0; i < count; i++) {
        h->fields[i].name = (char *)specs[i].name;
        h->fields[i].from = (char *)specs[i].from;
        if (specs[i].value_json) {
            json_error_t jerr;
            h->fields[i].value = json_loads(specs[i].value_json, JSON_DECODE_ANY, &jerr);
            cr_assert(h->fields[i].value, "constant %s: %s", specs[i].value_json, jerr.text);
        }
    }
}

static void free_emit(emit_holder *h)
{
    for (size_t i = 0; i < h->emit.field_count; i++)
        json_decref(h->fields[i].value);
}

/* Every kind of value by path (scalars, nested, arrays, maps, escapes) and every kind of
 * constant. */
static const field_spec all_kinds[] = {
    {"order", "order_id", NULL},
    {"amount", "amount", NULL},
    {"ratio", "ratio", NULL},
    {"paid", "paid", NULL},
    {"note", "note", NULL},
    {"quoted", "quoted", NULL},
    {"city", "customer.address.city", NULL},
    {"customer", "customer", NULL},
    {"tags", "tags", NULL},
    {"we\"ird\\ name\n", "order_id", NULL},
    {"kind", NULL, "\"payment.settled\""},
    {"version", NULL, "3"},
    {"neg", NULL, "-9007199254740993"},
    {"flag", NULL, "false"},
    {"nothing", NULL, "null"},
    {"schema", NULL, "{\"v\":[1,2.5,\"x\",{\"deep\":true}]}"},
};

/* The outgoing map all_kinds gives for `incoming`, biz_key included. */
static json_t *all_kinds_expected(const char *emit_name)
{
    char key[OUTBOX_KEY_LEN + 1];
    outbox_derive_key("order_id:o1:PAY_SUCCESS", consumer.handler_name, emit_name, key);
    json_error_t jerr;
    json_t *want = json_loads(
        "{\"order\":\"o1\",\"amount\":1250,\"ratio\":0.25,\"paid\":true,\"note\":null,"
        "\"quoted\":\"say \\\"hi\\\"\\\\ \\n\\t\\u0001 caf\\u00e9 \\u20ac\","
        "\"city\":\"Lyon\",\"customer\":{\"id\":7,\"address\":{\"city\":\"Lyon\"}},"
        "\"tags\":[\"a\",2,{\"b\":false}],\"we\\\"ird\\\\ name\\n\":\"o1\","
        "\"kind\":\"payment.settled\",\"version\":3,\"neg\":-9007199254740993,\"flag\":false,"
        "\"nothing\":null,\"schema\":{\"v\":[1,2.5,\"x\",{\"deep\":true}]}}",
        0, &jerr);
    cr_assert(want, "%s", jerr.text);
    json_object_set_new(want, "biz_key", json_string(key));
    return want;
}

static void add_ok(size_t item, const config_emit *e)
{
    char err[256] = "";
    cr_assert_eq(outbox_writer_add(writer, item, &consumer, e, &env, err, sizeof err), 0, "add: %s",
                 err);
}

/* --------------------------------------------------------------------------------- bodies */

static void every_kind_of_field(config_emit_format format, const char *content_type)
{
    decode_incoming(incoming);
    emit_holder h;
    make_emit(&h, "settled", NULL, "payments.settled", format, all_kinds,
              sizeof all_kinds / sizeof all_kinds[0]);
    add_ok(0, &h.emit);
    cr_assert_eq(outbox_writer_pending(writer), 1);
    cr_assert_eq(flush_ok(), 1, "one row inserted");

    rows r = read_rows();
    cr_assert_eq(r.count, 1);
    /* No exchange configured: the default exchange, "". */
    expect_row(&r.at[0], "order_id:o1:PAY_SUCCESS", "settled", "", "payments.settled",
               content_type);
    json_t *want = all_kinds_expected("settled");
    json_t *got = body_of(&r.at[0]);
    char *g = json_dumps(got, JSON_SORT_KEYS), *w = json_dumps(want, JSON_SORT_KEYS);
    cr_expect(json_equal(got, want), "body\n  got  %s\n  want %s", g, w);
    free(g);
    free(w);
    cr_expect_eq(json_object_size(got), sizeof all_kinds / sizeof all_kinds[0] + 1,
                 "the fields and biz_key, nothing else");
    expect_downstream_reads(&r.at[0], want);
    json_decref(got);
    json_decref(want);
    free_rows(&r);
    free_emit(&h);
}

Test(outbox_writer, a_json_body_carries_every_field_constant_and_the_derived_biz_key)
{
    every_kind_of_field(CONFIG_EMIT_JSON, OUTBOX_CONTENT_TYPE_JSON);
}

Test(outbox_writer, a_msgpack_body_carries_every_field_constant_and_the_derived_biz_key)
{
    every_kind_of_field(CONFIG_EMIT_MSGPACK, OUTBOX_CONTENT_TYPE_MSGPACK);
}

Test(outbox_writer, an_incoming_msgpack_message_gives_the_same_outgoing_map)
{
    /* The incoming message in the other encoding: the outgoing body must not depend on it. */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "biz_key", 7);
    msgpack_pack_str_with_body(&pk, "k-mp", 4);
    msgpack_pack_str_with_body(&pk, "amount", 6);
    msgpack_pack_int64(&pk, -5);
    msgpack_pack_str_with_body(&pk, "nested", 6);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_double(&pk, 1.5);
    char err[256];
    envelope_close(&env);
    memset(&env, 0, sizeof env);
    cr_assert_eq(
        envelope_decode(sb.data, sb.size, "application/msgpack", NULL, &env, err, sizeof err), 0,
        "%s", err);
    msgpack_sbuffer_destroy(&sb);

    const field_spec specs[] = {{"amount", "amount", NULL}, {"x", "nested.x", NULL}};
    emit_holder hj, hm;
    make_emit(&hj, "j", "ex.j", "rk", CONFIG_EMIT_JSON, specs, 2);
    make_emit(&hm, "m", "ex.m", "rk", CONFIG_EMIT_MSGPACK, specs, 2);
    add_ok(0, &hj.emit);
    add_ok(0, &hm.emit);
    cr_assert_eq(flush_ok(), 2);
    rows r = read_rows();
    cr_assert_eq(r.count, 2);
    expect_row(&r.at[0], "k-mp", "j", "ex.j", "rk", OUTBOX_CONTENT_TYPE_JSON);
    expect_row(&r.at[1], "k-mp", "m", "ex.m", "rk", OUTBOX_CONTENT_TYPE_MSGPACK);
    json_t *a = body_of(&r.at[0]), *b = body_of(&r.at[1]);
    cr_expect_eq(json_integer_value(json_object_get(a, "amount")), -5);
    cr_expect(json_real_value(json_object_get(a, "x")) == 1.5);
    /* Same fields; only the biz_key differs (the emit names differ). */
    json_object_del(a, "biz_key");
    json_object_del(b, "biz_key");
    cr_expect(json_equal(a, b), "one map in both encodings");
    json_decref(a);
    json_decref(b);
    free_rows(&r);
    free_emit(&hj);
    free_emit(&hm);
}

/* ----------------------------------------------------------------------- missing fields */

Test(outbox_writer, a_missing_field_is_refused_with_its_name_and_leaves_no_partial_row)
{
    decode_incoming(incoming);
    const field_spec specs[] = {
        {"order", "order_id", NULL},
        {"kind", NULL, "\"k\""},
        {"zip", "customer.address.zip", NULL},
    };
    emit_holder h;
    make_emit(&h, "settled", "ex", "rk", CONFIG_EMIT_JSON, specs, 3);
    char err[256] = "";
    cr_assert_eq(outbox_writer_add(writer, 0, &consumer, &h.emit, &env, err, sizeof err), -1);
    cr_expect(strstr(err, "emit settled") != NULL, "the emit's name: %s", err);
    cr_expect(strstr(err, "customer.address.zip") != NULL, "the missing path: %s", err);
    cr_expect(strstr(err, "'zip'") != NULL, "the outgoing field: %s", err);
    cr_assert_eq(outbox_writer_pending(writer), 0, "no row for the refused emit");

    /* A path through a value that is not a map is missing too. */
    const field_spec through[] = {{"x", "order_id.inner", NULL}};
    emit_holder h2;
    make_emit(&h2, "through", "ex", "rk", CONFIG_EMIT_MSGPACK, through, 1);
    err[0] = '\0';
    cr_assert_eq(outbox_writer_add(writer, 0, &consumer, &h2.emit, &env, err, sizeof err), -1);
    cr_expect(strstr(err, "order_id.inner") != NULL, "%s", err);
    cr_assert_eq(outbox_writer_pending(writer), 0);

    /* The writer is still good: the next row is whole. */
    const field_spec fine[] = {{"order", "order_id", NULL}};
    emit_holder h3;
    make_emit(&h3, "fine", "ex", "rk", CONFIG_EMIT_JSON, fine, 1);
    add_ok(0, &h3.emit);
    cr_assert_eq(flush_ok(), 1);
    rows r = read_rows();
    cr_assert_eq(r.count, 1);
    expect_row(&r.at[0], "order_id:o1:PAY_SUCCESS", "fine", "ex", "rk", OUTBOX_CONTENT_TYPE_JSON);
    json_t *got = body_of(&r.at[0]);
    cr_expect_eq(json_object_size(got), 2);
    cr_expect_str_eq(json_string_value(json_object_get(got, "order")), "o1");
    json_decref(got);
    free_rows(&r);
    free_emit(&h);
    free_emit(&h2);
    free_emit(&h3);
}

Test(outbox_writer, a_body_over_the_mediumblob_limit_is_refused_and_the_writer_goes_on)
{
    /* A 16 MiB string field: the body would not fit idemq_outbox.body. */
    size_t big = OUTBOX_BODY_MAX + 1;
    char *text = malloc(big + 128);
    cr_assert(text);
    int n = sprintf(text, "{\"biz_key\":\"big\",\"blob\":\"");
    memset(text + n, 'b', big);
    strcpy(text + n + big, "\"}");
    decode_incoming(text);
    free(text);

    const field_spec specs[] = {{"blob", "blob", NULL}};
    emit_holder h;
    make_emit(&h, "big", "ex", "rk", CONFIG_EMIT_JSON, specs, 1);
    char err[256] = "";
    cr_assert_eq(outbox_writer_add(writer, 0, &consumer, &h.emit, &env, err, sizeof err), -1);
    cr_expect(strstr(err, "emit big") && strstr(err, "at most"), "%s", err);
    cr_assert_eq(outbox_writer_pending(writer), 0);

    decode_incoming(incoming);
    const field_spec small[] = {{"order", "order_id", NULL}};
    emit_holder h2;
    make_emit(&h2, "small", "ex", "rk", CONFIG_EMIT_MSGPACK, small, 1);
    add_ok(0, &h2.emit);
    cr_assert_eq(flush_ok(), 1);
    rows r = read_rows();
    cr_assert_eq(r.count, 1);
    expect_row(&r.at[0], "order_id:o1:PAY_SUCCESS", "small", "ex", "rk",
               OUTBOX_CONTENT_TYPE_MSGPACK);
    json_t *got = body_of(&r.at[0]);
    cr_expect_str_eq(json_string_value(json_object_get(got, "order")), "o1");
    json_decref(got);
    free_rows(&r);
    free_emit(&h);
    free_emit(&h2);
}

/* ---------------------------------------------------------------------- items and flushes */

Test(outbox_writer, drop_item_removes_only_that_messages_rows)
{
    const field_spec specs[] = {{"order", "order_id", NULL}};
    emit_holder a, b;
    make_emit(&a, "a", "ex", "rk.a", CONFIG_EMIT_JSON, specs, 1);
    make_emit(&b, "b", "ex", "rk.b", CONFIG_EMIT_JSON, specs, 1);
    const char *sources[] = {"k0", "k1", "k2", "k3"};
    for (size_t i = 0; i < 4; i++) {
        char text[128];
        snprintf(text, sizeof text, "{\"biz_key\":\"%s\",\"order_id\":\"o%zu\"}", sources[i], i);
        decode_incoming(text);
        add_ok(i, &a.emit);
        add_ok(i, &b.emit);
    }
    cr_assert_eq(outbox_writer_pending(writer), 8);
    outbox_writer_drop_item(writer, 1);
    cr_assert_eq(outbox_writer_pending(writer), 6, "item 1's two rows dropped");
    outbox_writer_drop_item(writer, 1);
    cr_assert_eq(outbox_writer_pending(writer), 6, "dropping twice changes nothing");
    outbox_writer_drop_item(writer, 3);
    outbox_writer_drop_item(writer, 99); /* no such item */
    cr_assert_eq(outbox_writer_pending(writer), 4);
    cr_assert_eq(flush_ok(), 2 * 2, "*inserted counts the rows that were written");

    rows r = read_rows();
    cr_assert_eq(r.count, 4);
    expect_row(&r.at[0], "k0", "a", "ex", "rk.a", OUTBOX_CONTENT_TYPE_JSON);
    expect_row(&r.at[1], "k0", "b", "ex", "rk.b", OUTBOX_CONTENT_TYPE_JSON);
    expect_row(&r.at[2], "k2", "a", "ex", "rk.a", OUTBOX_CONTENT_TYPE_JSON);
    expect_row(&r.at[3], "k2", "b", "ex", "rk.b", OUTBOX_CONTENT_TYPE_JSON);
    json_t *body = body_of(&r.at[2]);
    cr_expect_str_eq(json_string_value(json_object_get(body, "order")), "o2");
    json_decref(body);
    free_rows(&r);

    /* Only dropped rows: nothing to insert. */
    add_ok(5, &a.emit);
    outbox_writer_drop_item(writer, 5);
    cr_assert_eq(flush_ok(), 0);
    r = read_rows();
    cr_assert_eq(r.count, 4, "no row for a dropped item");
    free_rows(&r);
    free_emit(&a);
    free_emit(&b);
}

Test(outbox_writer, many_rows_across_growing_buffers_and_flushes_stay_whole)
{
    /* Enough rows and bytes to grow the arena and the row array many times while they are
     * added (rows point into the arena by offset), then a second transaction reusing them. */
    const field_spec specs[] = {{"order", "order_id", NULL}, {"pad", "pad", NULL}};
    emit_holder e;
    make_emit(&e, "grow", "ex.grow", "rk.grow", CONFIG_EMIT_MSGPACK, specs, 2);
    for (int round = 0; round < 2; round++) {
        int count = round == 0 ? 700 : 300;
        for (int i = 0; i < count; i++) {
            char text[1024], pad[700];
            memset(pad, 'a' + (i % 26), sizeof pad - 1);
            pad[(size_t)(i % 600) + 50] = '\0';
            snprintf(text, sizeof text,
                     "{\"biz_key\":\"r%d-k%d\",\"order_id\":\"o%d\",\"pad\":\"%s\"}", round, i, i,
                     pad);
            decode_incoming(text);
            add_ok((size_t)i, &e.emit);
        }
        cr_assert_eq(outbox_writer_pending(writer), (size_t)count);
        sql_ok("START TRANSACTION");
        cr_assert_eq(flush_ok(), (size_t)count);
        sql_ok("COMMIT");
    }
    rows r = read_rows();
    cr_assert_eq(r.count, 1000);
    for (size_t n = 0; n < r.count; n++) {
        int round = n < 700 ? 0 : 1, i = n < 700 ? (int)n : (int)n - 700;
        char source[32], order[32];
        snprintf(source, sizeof source, "r%d-k%d", round, i);
        snprintf(order, sizeof order, "o%d", i);
        expect_row(&r.at[n], source, "grow", "ex.grow", "rk.grow", OUTBOX_CONTENT_TYPE_MSGPACK);
        json_t *body = body_of(&r.at[n]);
        cr_assert_str_eq(json_string_value(json_object_get(body, "order")), order, "row %zu", n);
        const char *pad = json_string_value(json_object_get(body, "pad"));
        cr_assert(pad && strlen(pad) == (size_t)(i % 600) + 50 && pad[0] == 'a' + (i % 26),
                  "row %zu: pad", n);
        cr_assert_str_eq(json_string_value(json_object_get(body, "biz_key")), r.at[n].col[3]);
        json_decref(body);
    }
    free_rows(&r);
    free_emit(&e);
}

Test(outbox_writer, rows_flushed_in_a_rolled_back_transaction_are_gone)
{
    decode_incoming(incoming);
    const field_spec specs[] = {{"order", "order_id", NULL}};
    emit_holder e;
    make_emit(&e, "rb", "ex", "rk", CONFIG_EMIT_JSON, specs, 1);
    add_ok(0, &e.emit);
    sql_ok("START TRANSACTION");
    cr_assert_eq(flush_ok(), 1);
    sql_ok("ROLLBACK");
    rows r = read_rows();
    cr_assert_eq(r.count, 0, "the rows belong to the caller's transaction");
    free_rows(&r);
    free_emit(&e);
}

Test(outbox_writer, clear_forgets_every_row)
{
    decode_incoming(incoming);
    const field_spec specs[] = {{"order", "order_id", NULL}};
    emit_holder e;
    make_emit(&e, "c", "ex", "rk", CONFIG_EMIT_JSON, specs, 1);
    add_ok(0, &e.emit);
    add_ok(1, &e.emit);
    outbox_writer_clear(writer);
    cr_assert_eq(outbox_writer_pending(writer), 0);
    cr_assert_eq(flush_ok(), 0);
    rows r = read_rows();
    cr_assert_eq(r.count, 0);
    free_rows(&r);
    free_emit(&e);
    outbox_writer_free(NULL); /* a no-op */
}

Test(outbox_writer, a_failed_insert_reports_the_mysql_error_and_the_next_flush_prepares_again)
{
    decode_incoming(incoming);
    const field_spec specs[] = {{"order", "order_id", NULL}};
    emit_holder e;
    make_emit(&e, "f", "ex", "rk", CONFIG_EMIT_JSON, specs, 1);

    /* The table is missing: the prepare fails. */
    sql_ok("DROP TABLE idemq_outbox");
    add_ok(0, &e.emit);
    size_t inserted = 99;
    db_error error = {0};
    cr_assert_eq(outbox_writer_flush(writer, db, &inserted, &error), -1);
    cr_expect_neq(error.number, 0, "the MySQL error number");
    cr_expect(strstr(error.message, "idemq_outbox") != NULL, "%s", error.message);
    cr_expect_eq(inserted, 0);
    cr_expect_eq(outbox_writer_pending(writer), 0, "a failed flush forgets its rows too");

    sql_ok(store_outbox_ddl);
    add_ok(0, &e.emit);
    cr_assert_eq(flush_ok(), 1, "prepared again on the next flush");

    /* Prepared, and the execute fails: a routing key longer than the column under a strict
     * sql_mode (the writer checks only what a plugin hands it). */
    sql_ok("SET SESSION sql_mode = 'STRICT_ALL_TABLES'");
    sql_ok("DELETE FROM idemq_outbox");
    sql_ok("ALTER TABLE idemq_outbox MODIFY routing_key VARBINARY(1) NOT NULL");
    add_ok(0, &e.emit);
    add_ok(1, &e.emit);
    memset(&error, 0, sizeof error);
    cr_assert_eq(outbox_writer_flush(writer, db, &inserted, &error), -1);
    cr_expect_neq(error.number, 0);
    cr_expect(error.message[0] != '\0');
    cr_expect_eq(inserted, 0, "nothing inserted before the first row failed");
    cr_expect_eq(outbox_writer_pending(writer), 0);
    free_emit(&e);
}

/* ------------------------------------------------------------------ a plugin's map (host->emit) */

static int add_fields(size_t item, const char *name, const char *exchange, const char *routing_key,
                      config_emit_format format, const char *fields_json, char *err, size_t err_len)
{
    json_error_t jerr;
    json_t *fields = json_loads(fields_json, JSON_DECODE_ANY, &jerr);
    cr_assert(fields, "%s", jerr.text);
    int rc = outbox_writer_add_fields(writer, item, &consumer, &env, name, exchange, routing_key,
                                      format, fields, err, err_len);
    json_decref(fields);
    return rc;
}

static void plugin_map(config_emit_format format, const char *content_type)
{
    decode_incoming(incoming);
    char err[256] = "";
    /* The plugin's own biz_key is replaced by idemq's; a map without one gets it added. */
    cr_assert_eq(add_fields(0, "ledger.posted", "ex.ledger", "ledger", format,
                            "{\"biz_key\":\"the plugin's own\",\"entry\":17,\"lines\":[1,2]}", err,
                            sizeof err),
                 0, "%s", err);
    cr_assert_eq(
        add_fields(0, "audit", NULL, "audit.q", format, "{\"who\":\"plugin\"}", err, sizeof err), 0,
        "%s", err);
    cr_assert_eq(add_fields(0, "bare", "", "bare.q", format, "{}", err, sizeof err), 0, "%s", err);
    cr_assert_eq(flush_ok(), 3);

    rows r = read_rows();
    cr_assert_eq(r.count, 3);
    expect_row(&r.at[0], "order_id:o1:PAY_SUCCESS", "ledger.posted", "ex.ledger", "ledger",
               content_type);
    expect_row(&r.at[1], "order_id:o1:PAY_SUCCESS", "audit", "", "audit.q", content_type);
    expect_row(&r.at[2], "order_id:o1:PAY_SUCCESS", "bare", "", "bare.q", content_type);
    const char *want_text[] = {"{\"entry\":17,\"lines\":[1,2]}", "{\"who\":\"plugin\"}", "{}"};
    for (int i = 0; i < 3; i++) {
        json_t *want = json_loads(want_text[i], 0, NULL);
        json_object_set_new(want, "biz_key", json_string(r.at[i].col[3]));
        /* body_of fails on a key twice (JSON_REJECT_DUPLICATES, and the msgpack map check) */
        json_t *got = body_of(&r.at[i]);
        char *g = json_dumps(got, JSON_SORT_KEYS);
        cr_expect(json_equal(got, want), "row %d: %s", i, g);
        free(g);
        expect_downstream_reads(&r.at[i], want);
        json_decref(got);
        json_decref(want);
    }
    free_rows(&r);
}

Test(outbox_writer, a_plugins_json_map_gets_idemqs_biz_key_in_place_of_its_own)
{
    plugin_map(CONFIG_EMIT_JSON, OUTBOX_CONTENT_TYPE_JSON);
}

Test(outbox_writer, a_plugins_msgpack_map_gets_idemqs_biz_key_in_place_of_its_own)
{
    plugin_map(CONFIG_EMIT_MSGPACK, OUTBOX_CONTENT_TYPE_MSGPACK);
}

Test(outbox_writer, a_plugins_bad_names_targets_and_maps_are_refused)
{
    decode_incoming(incoming);
    char n64[65], n65[66], t255[256], t256[257];
    memset(n64, 'n', 64);
    n64[64] = '\0';
    memset(n65, 'n', 65);
    n65[65] = '\0';
    memset(t255, 't', 255);
    t255[255] = '\0';
    memset(t256, 't', 256);
    t256[256] = '\0';

    typedef struct bad {
        const char *why, *name, *exchange, *routing_key, *fields, *err_has;
    } bad;
    const bad cases[] = {
        {"empty name", "", "ex", "rk", "{}", "name"},
        {"NULL name", NULL, "ex", "rk", "{}", "name"},
        {"65-byte name", n65, "ex", "rk", "{}", "name"},
        {"control character in the name", "a\nb", "ex", "rk", "{}", "name"},
        {"256-byte exchange", "n", t256, "rk", "{}", "exchange"},
        {"control character in the exchange", "n", "e\tx", "rk", "{}", "exchange"},
        {"NULL routing key", "n", "ex", NULL, "{}", "routing key"},
        {"256-byte routing key", "n", "ex", t256, "{}", "routing key"},
        {"control character in the routing key", "n", "ex", "r\x01k", "{}", "routing key"},
        {"fields an array", "n", "ex", "rk", "[1,2]", "JSON object"},
        {"fields a string", "n", "ex", "rk", "\"x\"", "JSON object"},
        {"fields null", "n", "ex", "rk", "null", "JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        int rc = add_fields(0, cases[i].name, cases[i].exchange, cases[i].routing_key,
                            CONFIG_EMIT_JSON, cases[i].fields, err, sizeof err);
        cr_expect_eq(rc, -1, "%s: accepted", cases[i].why);
        cr_expect(strstr(err, cases[i].err_has) != NULL, "%s: reason \"%s\" lacks \"%s\"",
                  cases[i].why, err, cases[i].err_has);
    }
    cr_assert_eq(outbox_writer_pending(writer), 0, "a refused emit adds nothing");

    /* The limits themselves are fine: the columns hold them. */
    char err[256] = "";
    cr_assert_eq(add_fields(0, n64, t255, t255, CONFIG_EMIT_JSON, "{\"a\":1}", err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(add_fields(0, "empty-rk", "", "", CONFIG_EMIT_JSON, "{\"a\":1}", err, sizeof err),
                 0, "%s", err);
    cr_assert_eq(flush_ok(), 2);
    rows r = read_rows();
    cr_assert_eq(r.count, 2);
    expect_row(&r.at[0], "order_id:o1:PAY_SUCCESS", n64, t255, t255, OUTBOX_CONTENT_TYPE_JSON);
    expect_row(&r.at[1], "order_id:o1:PAY_SUCCESS", "empty-rk", "", "", OUTBOX_CONTENT_TYPE_JSON);
    free_rows(&r);
}

Test(outbox_writer, rows_whose_bodies_together_exceed_max_allowed_packet_are_all_inserted)
{
    /* A batch's rows may be large each (an incoming message of amqp.max_body, copied into an
     * emit) and many: together they may exceed the server's max_allowed_packet, which must not
     * fail the transaction while every row alone fits. */
    MYSQL_RES *res;
    cr_assert(mysql_query(db, "SELECT @@max_allowed_packet") == 0);
    res = mysql_store_result(db);
    long long packet = atoll(mysql_fetch_row(res)[0]);
    mysql_free_result(res);
    /* 2 × max_allowed_packet in all, each row below the column's limit (MariaDB's default
     * packet is 16 MiB: 8 rows of 4 MiB; MySQL's is 64 MiB: 9 rows of almost 16 MiB). */
    size_t each = (size_t)packet / 4;
    if (each > OUTBOX_BODY_MAX - 1024)
        each = OUTBOX_BODY_MAX - 1024;
    size_t count = ((size_t)packet * 2 + each - 1) / each;
    char *text = malloc(each + 128);
    cr_assert(text);
    int n = sprintf(text, "{\"biz_key\":\"large\",\"blob\":\"");
    memset(text + n, 'L', each);
    strcpy(text + n + each, "\"}");
    decode_incoming(text);
    free(text);
    const field_spec specs[] = {{"blob", "blob", NULL}};
    emit_holder e;
    make_emit(&e, "large", "ex", "rk", CONFIG_EMIT_JSON, specs, 1);
    for (size_t i = 0; i < count; i++)
        add_ok(i, &e.emit);
    size_t inserted = 0;
    db_error error = {0};
    int rc = outbox_writer_flush(writer, db, &inserted, &error);
    cr_assert_eq(rc, 0, "%zu rows of %zu bytes (max_allowed_packet %lld): %s (%u)", count, each,
                 packet, error.message, error.number);
    cr_assert_eq(inserted, count);
    cr_assert_eq(mysql_query(db, "SELECT COUNT(*), MIN(LENGTH(body)) FROM idemq_outbox"), 0, "%s",
                 mysql_error(db));
    res = mysql_store_result(db);
    MYSQL_ROW r = mysql_fetch_row(res);
    cr_expect_eq(atoll(r[0]), (long long)count);
    cr_expect_gt(atoll(r[1]), (long long)each);
    mysql_free_result(res);

    /* Mid-sized rows: several to a statement, never a statement too large; each row whole. */
    sql_ok("DELETE FROM idemq_outbox");
    size_t mid = 300 * 1024, mids = 40;
    text = malloc(mid + 128);
    cr_assert(text);
    for (size_t i = 0; i < mids; i++) {
        n = sprintf(text, "{\"biz_key\":\"mid%zu\",\"blob\":\"", i);
        memset(text + n, 'a' + (int)(i % 26), mid + i);
        strcpy(text + n + mid + i, "\"}");
        decode_incoming(text);
        add_ok(i, &e.emit);
    }
    free(text);
    cr_assert_eq(outbox_writer_flush(writer, db, &inserted, &error), 0, "%s", error.message);
    cr_assert_eq(inserted, mids);
    rows got = read_rows();
    cr_assert_eq(got.count, mids);
    for (size_t i = 0; i < mids; i++) {
        char source[32];
        snprintf(source, sizeof source, "mid%zu", i);
        cr_assert_str_eq(got.at[i].col[0], source);
        json_t *body = body_of(&got.at[i]);
        const char *blob = json_string_value(json_object_get(body, "blob"));
        cr_assert(blob && strlen(blob) == mid + i && blob[0] == 'a' + (int)(i % 26) &&
                      blob[mid + i - 1] == blob[0],
                  "row %zu: its own blob", i);
        json_decref(body);
    }
    free_rows(&got);
    free_emit(&e);
}

Test(outbox_writer, a_plugin_emitting_one_name_twice_for_one_message_is_refused)
{
    decode_incoming(incoming);
    char err[256] = "";
    cr_assert_eq(add_fields(0, "posted", "", "q", CONFIG_EMIT_JSON, "{\"a\":1}", err, sizeof err),
                 0, "%s", err);
    /* The same name again for the same message would derive the same outgoing biz_key. */
    cr_assert_eq(add_fields(0, "posted", "", "q", CONFIG_EMIT_JSON, "{\"a\":2}", err, sizeof err),
                 -1);
    cr_expect(strstr(err, "emit posted: this message already emitted one of that name"), "%s",
              err);
    /* Another message (item) may use it, and so may the first one once its rows were dropped. */
    cr_assert_eq(add_fields(1, "posted", "", "q", CONFIG_EMIT_JSON, "{\"a\":3}", err, sizeof err),
                 0, "%s", err);
    outbox_writer_drop_item(writer, 0);
    cr_assert_eq(add_fields(0, "posted", "", "q", CONFIG_EMIT_JSON, "{\"a\":4}", err, sizeof err),
                 0, "%s", err);
    cr_assert_eq(flush_ok(), 2);
}

Test(outbox_writer, a_row_over_the_servers_max_allowed_packet_is_refused_not_sent)
{
    cr_assert(mysql_query(db, "SELECT @@max_allowed_packet") == 0, "%s", mysql_error(db));
    MYSQL_RES *res = mysql_store_result(db);
    cr_assert(res);
    unsigned long long packet_max = strtoull(mysql_fetch_row(res)[0], NULL, 10);
    mysql_free_result(res);
    if (packet_max < 4096 || packet_max - 2048 + 64 > OUTBOX_BODY_MAX)
        cr_skip_test("max_allowed_packet %llu: no body fits the column but not the packet",
                     packet_max);
    /* A body the column takes (under 16 MiB) but the server's packet does not: sending it would
     * only make the server drop the connection, on every try. */
    size_t big = (size_t)packet_max - 2048;
    char *text = malloc(big + 128);
    cr_assert(text);
    int n = sprintf(text, "{\"biz_key\":\"big\",\"blob\":\"");
    memset(text + n, 'b', big);
    strcpy(text + n + big, "\"}");
    decode_incoming(text);
    free(text);
    const field_spec specs[] = {{"blob", "blob", NULL}};
    emit_holder h;
    make_emit(&h, "big", "ex", "rk", CONFIG_EMIT_JSON, specs, 1);
    char err[256] = "";
    cr_assert_eq(outbox_writer_add(writer, 0, &consumer, &h.emit, &env, err, sizeof err), 0, "%s",
                 err);
    size_t inserted = 99;
    db_error error = {0};
    cr_assert_eq(outbox_writer_flush(writer, db, &inserted, &error), OUTBOX_E_TOO_LARGE);
    cr_expect_eq(inserted, 0);
    cr_expect(strstr(error.message, "does not fit the server's max_allowed_packet"), "%s",
              error.message);
    cr_expect_eq(outbox_writer_pending(writer), 0);
    /* The connection is still good. */
    sql_ok("SELECT 1");
    free_emit(&h);
}
