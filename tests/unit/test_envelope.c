/*
 * test_envelope — the envelope decoder against the shared vectors in schemas/vectors and the
 * cases the vectors cannot express: limits, error text, dotted paths, hostile allocation sizes.
 *
 * Thread affinity: Criterion runs each test in its own process; nothing here is shared.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <msgpack.h>

#include "envelope/envelope.h"

#ifndef IDEMQ_SOURCE_DIR
#error "IDEMQ_SOURCE_DIR must name the source tree (the CMake test support target sets it)"
#endif

#define VECTORS IDEMQ_SOURCE_DIR "/schemas/vectors/vectors.json"

/* Returns an owned buffer of the case's body (body_hex, body_text or body_json). */
static unsigned char *vector_body(const json_t *c, size_t *len)
{
    const json_t *v;
    unsigned char *buf = NULL;

    if ((v = json_object_get(c, "body_hex"))) {
        const char *hex = json_string_value(v);
        size_t n = json_string_length(v) / 2;
        buf = malloc(n + 1);
        cr_assert(buf);
        for (size_t i = 0; i < n; i++) {
            unsigned byte;
            cr_assert(sscanf(hex + 2 * i, "%2x", &byte) == 1, "bad body_hex");
            buf[i] = (unsigned char)byte;
        }
        *len = n;
    } else if ((v = json_object_get(c, "body_text"))) {
        *len = json_string_length(v);
        buf = malloc(*len + 1);
        cr_assert(buf);
        memcpy(buf, json_string_value(v), *len);
    } else if ((v = json_object_get(c, "body_json"))) {
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        cr_assert(text);
        *len = strlen(text);
        buf = (unsigned char *)text;
    } else {
        cr_assert_fail("vector %s has no body", json_string_value(json_object_get(c, "name")));
    }
    return buf;
}

/* Compares an expected optional string (JSON null = absent) with what the decoder found. */
static void expect_optional(const char *name, const json_t *expect, const char *field,
                            const char *got)
{
    const json_t *want = json_object_get(expect, field);
    if (!want)
        return;
    if (json_is_null(want))
        cr_expect_null(got, "vector %s: %s should be absent, got \"%s\"", name, field, got);
    else
        cr_expect(got && !strcmp(got, json_string_value(want)),
                  "vector %s: %s should be \"%s\", got \"%s\"", name, field,
                  json_string_value(want), got ? got : "(null)");
}

Test(envelope, every_shared_vector_decodes_as_it_expects)
{
    json_error_t jerr;
    json_t *cases = json_load_file(VECTORS, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    cr_assert(cases, "cannot load %s: %s (line %d)", VECTORS, jerr.text, jerr.line);
    cr_assert(json_is_array(cases) && json_array_size(cases) >= 100,
              "%s should hold an array of at least 100 cases", VECTORS);

    json_t *records = json_object(); /* name → decoded root, for same_record_as */
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *expect = json_object_get(c, "expect");
        const char *ct = json_string_value(json_object_get(c, "content_type"));
        cr_assert(name && expect, "case %zu lacks name or expect", i);

        size_t len = 0;
        unsigned char *body = vector_body(c, &len);
        envelope env = {0};
        char err[512];
        int rc = envelope_decode(body, len, ct, NULL, &env, err, sizeof err);

        const char *want_error = json_string_value(json_object_get(expect, "error"));
        if (want_error) {
            cr_expect_str_eq(envelope_error_name(rc), want_error,
                             "vector %s: expected error %s, got %s (%s)", name, want_error,
                             envelope_error_name(rc), rc ? err : "decoded");
            cr_expect(rc == 0 || err[0] != '\0', "vector %s: error without a reason", name);
        } else {
            const char *want_key = json_string_value(json_object_get(expect, "biz_key"));
            cr_expect_eq(rc, 0, "vector %s: expected biz_key \"%s\", got error %s (%s)", name,
                         want_key, envelope_error_name(rc), err);
            if (rc == 0) {
                cr_expect_str_eq(env.biz_key, want_key, "vector %s: wrong biz_key", name);
                expect_optional(name, expect, "message_id", env.message_id);
                expect_optional(name, expect, "event_type", env.event_type);
                json_object_set(records, name, env.root);
            }
        }
        envelope_close(&env);
        free(body);
    }

    /* Both encodings of one message must give the same record, or handlers would see two
     * different messages depending on the producer's language. */
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *ref = json_string_value(json_object_get(c, "same_record_as"));
        if (!ref)
            continue;
        json_t *mine = json_object_get(records, name), *theirs = json_object_get(records, ref);
        cr_expect(mine && theirs, "vector %s: %s or %s did not decode", name, name, ref);
        if (mine && theirs)
            cr_expect(json_equal(mine, theirs), "vector %s: record differs from %s", name, ref);
    }
    json_decref(records);
    json_decref(cases);
}

/* ---- helpers for hand-made bodies -------------------------------------------------------- */

static int decode(const char *text, const char *ct, const envelope_limits *lim, envelope *env)
{
    return envelope_decode(text, strlen(text), ct, lim, env, NULL, 0);
}

/* The seed's payment callback, packed with msgpack-c so the test does not trust the vectors. */
static void pack_seed(msgpack_sbuffer *sb)
{
    static const char *const kv[][2] = {
        {"message_id", "7f3c2a9e"},
        {"biz_key", "order_id:20250101_0001:PAY_SUCCESS"},
        {"order_id", "20250101_0001"},
        {"event_type", "PAY_SUCCESS"},
    };
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 7);
    for (size_t i = 0; i < 4; i++) {
        msgpack_pack_str_with_body(&pk, kv[i][0], strlen(kv[i][0]));
        msgpack_pack_str_with_body(&pk, kv[i][1], strlen(kv[i][1]));
    }
    msgpack_pack_str_with_body(&pk, "amount", 6);
    msgpack_pack_int64(&pk, 10000);
    msgpack_pack_str_with_body(&pk, "rate", 4);
    msgpack_pack_double(&pk, 0.25);
    msgpack_pack_str_with_body(&pk, "customer", 8);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "vip", 3);
    msgpack_pack_true(&pk);
    msgpack_pack_str_with_body(&pk, "tags", 4);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_nil(&pk);
    msgpack_pack_int(&pk, -3);
}

static const char SEED_JSON[] =
    "{\"message_id\":\"7f3c2a9e\",\"biz_key\":\"order_id:20250101_0001:PAY_SUCCESS\","
    "\"order_id\":\"20250101_0001\",\"event_type\":\"PAY_SUCCESS\",\"amount\":10000,"
    "\"rate\":0.25,\"customer\":{\"vip\":true,\"tags\":[null,-3]}}";

Test(envelope, json_and_msgpack_give_equal_records)
{
    msgpack_sbuffer sb;
    envelope j = {0}, m = {0};
    pack_seed(&sb);

    cr_assert_eq(decode(SEED_JSON, "application/json", NULL, &j), 0);
    cr_assert_eq(envelope_decode(sb.data, sb.size, "application/msgpack", NULL, &m, NULL, 0), 0);
    cr_expect(json_equal(j.root, m.root), "the two encodings decoded to different trees");
    cr_expect_eq(j.format, ENVELOPE_FORMAT_JSON);
    cr_expect_eq(m.format, ENVELOPE_FORMAT_MSGPACK);
    cr_expect_str_eq(m.biz_key, "order_id:20250101_0001:PAY_SUCCESS");
    cr_expect_str_eq(m.message_id, "7f3c2a9e");
    cr_expect_str_eq(m.event_type, "PAY_SUCCESS");
    /* borrowed from root, not copied */
    cr_expect_eq(m.biz_key, json_string_value(json_object_get(m.root, "biz_key")));

    envelope_close(&j);
    envelope_close(&m);
    msgpack_sbuffer_destroy(&sb);
}

Test(envelope, a_missing_content_type_is_sniffed_from_the_first_byte)
{
    msgpack_sbuffer sb;
    envelope j = {0}, m = {0};
    pack_seed(&sb);
    cr_assert_eq(decode(SEED_JSON, NULL, NULL, &j), 0);
    cr_assert_eq(envelope_decode(sb.data, sb.size, "", NULL, &m, NULL, 0), 0);
    cr_expect_eq(j.format, ENVELOPE_FORMAT_JSON);
    cr_expect_eq(m.format, ENVELOPE_FORMAT_MSGPACK);
    envelope_close(&j);
    envelope_close(&m);
    msgpack_sbuffer_destroy(&sb);
}

Test(envelope, fields_are_found_by_dotted_path_through_objects_only)
{
    envelope env = {0};
    cr_assert_eq(decode("{\"biz_key\":\"k\",\"amount\":5,\"items\":[{\"sku\":\"A\"}],"
                        "\"customer\":{\"address\":{\"city\":\"Hangzhou\",\"zip\":null}}}",
                        NULL, NULL, &env),
                 0);

    cr_expect_str_eq(json_string_value(envelope_field(&env, "biz_key")), "k");
    cr_expect_eq(json_integer_value(envelope_field(&env, "amount")), 5);
    cr_expect_str_eq(json_string_value(envelope_field(&env, "customer.address.city")), "Hangzhou");
    cr_expect(json_is_object(envelope_field(&env, "customer.address")));
    cr_expect(json_is_null(envelope_field(&env, "customer.address.zip")), "null is a value");
    cr_expect(json_is_array(envelope_field(&env, "items")));

    cr_expect_null(envelope_field(&env, "customer.address.country"), "missing last step");
    cr_expect_null(envelope_field(&env, "nobody.address.city"), "missing first step");
    cr_expect_null(envelope_field(&env, "amount.cents"), "step through a number");
    cr_expect_null(envelope_field(&env, "items.0.sku"), "arrays are not indexed");
    cr_expect_null(envelope_field(&env, "customer.address.city.x"), "step through a string");
    cr_expect_null(envelope_field(&env, ""));
    cr_expect_null(envelope_field(&env, ".customer"));
    cr_expect_null(envelope_field(&env, "customer."));
    cr_expect_null(envelope_field(&env, "customer..address"));
    cr_expect_null(envelope_field(&env, NULL));
    cr_expect_null(envelope_field(NULL, "biz_key"));
    envelope_close(&env);

    envelope zero = {0};
    cr_expect_null(envelope_field(&zero, "biz_key"));
}

Test(envelope, a_body_over_max_body_is_too_large_and_one_at_it_is_not)
{
    envelope env = {0};
    char err[256];
    const char *body = "{\"biz_key\":\"k1\"}"; /* 16 bytes */
    envelope_limits exact = {.max_body = 16}, small = {.max_body = 15};

    cr_expect_eq(decode(body, NULL, &exact, &env), 0);
    envelope_close(&env);
    cr_expect_eq(envelope_decode(body, 16, NULL, &small, &env, err, sizeof err),
                 ENVELOPE_E_TOO_LARGE);
    cr_expect_str_eq(err, "body is 16 bytes; the limit is 15");
}

Test(envelope, two_mib_body_is_too_large)
{
    size_t len = 2u << 20;
    char *body = malloc(len + 1);
    char err[256];
    envelope env = {0};
    cr_assert(body);
    /* A well-formed envelope: the size alone must decide. */
    memset(body, 'x', len);
    memcpy(body, "{\"biz_key\":\"k1\",\"pad\":\"", 23);
    memcpy(body + len - 2, "\"}", 2);

    cr_expect_eq(envelope_decode(body, len, "application/json", NULL, &env, err, sizeof err),
                 ENVELOPE_E_TOO_LARGE);
    cr_expect(strstr(err, "2097152 bytes") && strstr(err, "1048576"), "err: %s", err);

    envelope_limits big = {.max_body = 4u << 20};
    cr_expect_eq(envelope_decode(body, len, "application/json", &big, &env, err, sizeof err), 0,
                 "%s", err);
    envelope_close(&env);
    free(body);
}

Test(envelope, nesting_deeper_than_max_depth_is_too_deep)
{
    envelope env = {0};
    char err[256];
    envelope_limits two = {.max_depth = 2};
    const char *three_json = "{\"biz_key\":\"k\",\"a\":{\"b\":[]}}"; /* [] is level 3 */
    const char *two_json = "{\"biz_key\":\"k\",\"a\":{\"b\":1}}";
    const unsigned char ok2_mp[] = {0x82, 0xa7, 'b',  'i', 'z',  '_',  'k', 'e', 'y',
                                    0xa1, 'k',  0xa1, 'a', 0x81, 0xa1, 'b', 0x01};
    const unsigned char deep_mp[] = {0x82, 0xa7, 'b',  'i', 'z',  '_',  'k', 'e', 'y',
                                     0xa1, 'k',  0xa1, 'a', 0x81, 0xa1, 'b', 0x90};

    cr_expect_eq(decode(two_json, NULL, &two, &env), 0);
    envelope_close(&env);
    cr_expect_eq(envelope_decode(three_json, strlen(three_json), NULL, &two, &env, err, sizeof err),
                 ENVELOPE_E_TOO_DEEP);
    cr_expect_str_eq(err, "JSON nesting is deeper than 2 levels");
    cr_expect_eq(decode(three_json, NULL, NULL, &env), 0, "3 levels are fine by default");
    envelope_close(&env);

    cr_expect_eq(envelope_decode(ok2_mp, sizeof ok2_mp, NULL, &two, &env, NULL, 0), 0);
    envelope_close(&env);
    cr_expect_eq(envelope_decode(deep_mp, sizeof deep_mp, NULL, &two, &env, err, sizeof err),
                 ENVELOPE_E_TOO_DEEP);
    cr_expect_str_eq(err, "MessagePack nesting is deeper than 2 levels");
}

/* In the byte strings below, an octal escape stands where a hex escape would swallow the next
 * letter ("\247b" is 0xa7 then 'b'; "\xa7b" would be one out-of-range escape). */

/* Builds an envelope nested `levels` deep (top-level map = 1) in the given encoding. */
static char *nested_body(int levels, int msgpack, size_t *len)
{
    char *buf = malloc((size_t)levels * 16 + 64);
    size_t n = 0;
    cr_assert(buf);
    if (msgpack) {
        memcpy(buf, "\x82\247biz_key\xa1k", 11);
        n = 11;
        for (int i = 1; i < levels; i++) {
            memcpy(buf + n, "\241d\x81", 3);
            n += 3;
        }
        memcpy(buf + n, "\241d\x01", 3);
        n += 3;
    } else {
        n = (size_t)sprintf(buf, "{\"biz_key\":\"k\"");
        for (int i = 1; i < levels; i++)
            n += (size_t)sprintf(buf + n, ",\"d\":{\"x\":0");
        n += (size_t)sprintf(buf + n, ",\"d\":1");
        for (int i = 0; i < levels; i++)
            buf[n++] = '}';
    }
    *len = n;
    return buf;
}

Test(envelope, depth_limits_of_each_encoding)
{
    envelope env = {0};
    envelope_limits deep = {.max_depth = 64};
    size_t len;
    char *b;

    b = nested_body(32, 1, &len);
    cr_expect_eq(envelope_decode(b, len, NULL, NULL, &env, NULL, 0), 0, "msgpack 32 levels");
    envelope_close(&env);
    free(b);
    b = nested_body(33, 1, &len);
    cr_expect_eq(envelope_decode(b, len, NULL, NULL, &env, NULL, 0), ENVELOPE_E_TOO_DEEP);
    /* msgpack-c's parser stack is 32 containers, compiled in: a larger max_depth cannot lift it */
    cr_expect_eq(envelope_decode(b, len, NULL, &deep, &env, NULL, 0), ENVELOPE_E_TOO_DEEP);
    free(b);

    b = nested_body(33, 0, &len);
    cr_expect_eq(envelope_decode(b, len, NULL, NULL, &env, NULL, 0), ENVELOPE_E_TOO_DEEP);
    cr_expect_eq(envelope_decode(b, len, NULL, &deep, &env, NULL, 0), 0, "JSON honours 64");
    envelope_close(&env);
    free(b);

    /* deeper than jansson's own fixed limit (2048) is still too_deep, not syntax */
    envelope_limits huge = {.max_depth = 100000};
    b = nested_body(3000, 0, &len);
    cr_expect_eq(envelope_decode(b, len, NULL, &huge, &env, NULL, 0), ENVELOPE_E_TOO_DEEP);
    free(b);
}

#define BODY(literal) literal, sizeof(literal) - 1

/* Hostile headers: msgpack-c would allocate count * sizeof(msgpack_object) up front. */
Test(envelope, huge_container_headers_fail_without_allocating)
{
    static const struct {
        const char *name;
        const char *body;
        size_t len;
    } cases[] = {
        {"map32 2^32-1", BODY("\xdf\xff\xff\xff\xff")},
        {"array32 2^32-1", BODY("\xdd\xff\xff\xff\xff")},
        /* 2^24 entries: 384 MiB for msgpack-c, enough to succeed without the address-space
         * limit below, so only the pre-scan keeps this one from allocating */
        {"nested array32 2^24", BODY("\x82\247biz_key\xa1k\xa1x\xdd\x01\x00\x00\x00\x01\x02")},
        {"nested map16 65535", BODY("\x82\247biz_key\xa1k\xa1x\xde\xff\xff\xa1x\x01")},
        {"str32 2^32-1", BODY("\x81\247biz_key\xdb\xff\xff\xff\xff")},
        {"bin32 2^32-1", BODY("\x81\247biz_key\xc6\xff\xff\xff\xff")},
    };
    struct rlimit old;
    int limited = 0;

#if defined(__SANITIZE_ADDRESS__)
#define ENVELOPE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ENVELOPE_TEST_ASAN 1
#endif
#endif
#ifndef ENVELOPE_TEST_ASAN
    /* ASan reserves terabytes of shadow address space, so the cap only works without it;
     * under ASan an oversized allocation aborts the test by itself. */
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f && fscanf(f, "%lu", &pages) == 1 && getrlimit(RLIMIT_AS, &old) == 0) {
        struct rlimit cap = old;
        cap.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (64u << 20);
        limited = setrlimit(RLIMIT_AS, &cap) == 0;
    }
    if (f)
        fclose(f);
#endif

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        envelope env = {0};
        char err[256];
        int rc = envelope_decode(cases[i].body, cases[i].len, "application/msgpack", NULL, &env,
                                 err, sizeof err);
        cr_expect_eq(rc, ENVELOPE_E_SYNTAX, "%s: got %s (%s)", cases[i].name,
                     envelope_error_name(rc), err);
    }
    if (limited)
        setrlimit(RLIMIT_AS, &old);
}

Test(envelope, error_text_is_clear_and_bounded)
{
    char err[512];
    char body[400];
    envelope env = {0};

    int n = snprintf(body, sizeof body, "{\"biz_key\":\"");
    memset(body + n, 'Z', 300);
    strcpy(body + n + 300, "\"}");
    cr_expect_eq(envelope_decode(body, strlen(body), NULL, NULL, &env, err, sizeof err),
                 ENVELOPE_E_BIZ_KEY_TOO_LONG);
    cr_expect(strstr(err, "biz_key is 300 bytes; the limit is 128"), "err: %s", err);
    cr_expect_null(strstr(err, "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"),
                   "quotes at most 40 bytes of the key: %s", err);

    /* A long token in broken JSON: jansson quotes it; we must stay under 200 body bytes. */
    memset(body, 'Y', 399);
    body[399] = '\0';
    body[0] = '{';
    cr_expect_eq(envelope_decode(body, 399, NULL, NULL, &env, err, sizeof err), ENVELOPE_E_SYNTAX);
    size_t ys = 0;
    for (const char *p = err; *p; p++)
        ys += *p == 'Y';
    cr_expect(ys <= 200, "err quotes %zu body bytes: %s", ys, err);

    cr_expect_eq(decode("{\"biz_key\":\"k\"}", "text/plain\x01; x=y", NULL, &env),
                 ENVELOPE_E_UNSUPPORTED);
    envelope_decode("{}", 2, "text/plain\x01; x=y", NULL, &env, err, sizeof err);
    cr_expect_str_eq(err, "content type \"text/plain\\x01\" is not supported; use "
                          "application/json or application/msgpack");

    envelope_decode("{\"bizKey\":\"k\"}", 14, NULL, NULL, &env, err, sizeof err);
    cr_expect(strstr(err, "bizKey"), "hints at the camelCase key: %s", err);
    envelope_decode("{\"biz_key\":7}", 13, NULL, NULL, &env, err, sizeof err);
    cr_expect_str_eq(err, "biz_key is a number; it must be a string");
    envelope_decode("", 0, NULL, NULL, &env, err, sizeof err);
    cr_expect_str_eq(err, "body is empty");

    /* A tiny buffer is truncated and terminated; no buffer at all is fine. */
    char tiny[8];
    memset(tiny, '#', sizeof tiny);
    envelope_decode("", 0, NULL, NULL, &env, tiny, sizeof tiny);
    cr_expect_str_eq(tiny, "body is");
    cr_expect_eq(envelope_decode("", 0, NULL, NULL, &env, NULL, 0), ENVELOPE_E_EMPTY);
    cr_expect_eq(envelope_decode(NULL, 0, NULL, NULL, &env, tiny, 0), ENVELOPE_E_EMPTY);
    /* a successful decode leaves an empty reason */
    err[0] = 'x';
    cr_expect_eq(envelope_decode("{\"biz_key\":\"k\"}", 15, NULL, NULL, &env, err, sizeof err), 0);
    cr_expect_str_eq(err, "");
    envelope_close(&env);
}

Test(envelope, a_failed_decode_leaves_the_output_untouched)
{
    envelope env;
    memset(&env, 0xa5, sizeof env);
    envelope before = env;
    cr_expect_eq(decode("{\"biz_key\":\"\"}", NULL, NULL, &env), ENVELOPE_E_BIZ_KEY_EMPTY);
    cr_expect(memcmp(&env, &before, sizeof env) == 0, "out was written on failure");
}

Test(envelope, close_clears_the_record_and_a_second_close_or_null_is_a_noop)
{
    envelope zero = {0};
    envelope_close(&zero);
    envelope_close(&zero);
    envelope_close(NULL);

    envelope env = {0};
    cr_assert_eq(decode("{\"biz_key\":\"k\"}", NULL, NULL, &env), 0);
    envelope_close(&env);
    cr_expect_null(env.root);
    cr_expect_null(env.biz_key);
    envelope_close(&env); /* a second close is a no-op, not a double free */
}

Test(envelope, every_error_code_has_its_name_and_others_are_unknown)
{
    static const struct {
        int code;
        const char *name;
    } names[] = {
        {ENVELOPE_OK, "ok"},
        {ENVELOPE_E_TOO_LARGE, "too_large"},
        {ENVELOPE_E_EMPTY, "empty"},
        {ENVELOPE_E_SYNTAX, "syntax"},
        {ENVELOPE_E_NOT_MAP, "not_map"},
        {ENVELOPE_E_TOO_DEEP, "too_deep"},
        {ENVELOPE_E_UNSUPPORTED, "unsupported"},
        {ENVELOPE_E_BIZ_KEY_MISSING, "biz_key_missing"},
        {ENVELOPE_E_BIZ_KEY_TYPE, "biz_key_type"},
        {ENVELOPE_E_BIZ_KEY_EMPTY, "biz_key_empty"},
        {ENVELOPE_E_BIZ_KEY_TOO_LONG, "biz_key_too_long"},
        {ENVELOPE_E_BIZ_KEY_UTF8, "biz_key_utf8"},
        {ENVELOPE_E_DUPLICATE_KEY, "duplicate_key"},
        {-13, "unknown"},
        {1, "unknown"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_expect_str_eq(envelope_error_name(names[i].code), names[i].name);
}

Test(envelope, a_near_miss_of_biz_key_in_any_case_or_separator_is_named_in_the_reason)
{
    /* Each ecosystem misspells the key its own way: a Go struct without tags sends BizKey, a
     * Java bean bizKey, a hand-written producer biz-key or BIZ_KEY. */
    static const char *const bodies[] = {
        "{\"BizKey\":\"k\"}", "{\"bizKey\":\"k\"}", "{\"biz-key\":\"k\"}",
        "{\"BIZ_KEY\":\"k\"}", "{\"Biz.Key\":\"k\"}",
    };
    static const char *const names[] = {"BizKey", "bizKey", "biz-key", "BIZ_KEY", "Biz.Key"};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        envelope env;
        char err[256] = "";
        char expected[128];
        int rc = envelope_decode(bodies[i], strlen(bodies[i]), NULL, NULL, &env, err, sizeof err);
        cr_expect_eq(rc, ENVELOPE_E_BIZ_KEY_MISSING, "%s", bodies[i]);
        snprintf(expected, sizeof expected, "found \"%s\"", names[i]);
        cr_expect(strstr(err, expected), "%s: the reason does not name the key: %s", bodies[i],
                  err);
    }
    envelope env;
    char err[256] = "";
    /* Not a near miss: another word that merely contains the letters. */
    envelope_decode("{\"bizkeys\":\"k\",\"key\":1}", 23, NULL, NULL, &env, err, sizeof err);
    cr_expect_str_eq(err, "biz_key is missing");
}
