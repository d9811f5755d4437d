/*
 * envelope — see envelope.h.
 *
 * Design: JSON goes straight through jansson (duplicates rejected, trailing bytes rejected, NUL
 * allowed inside strings so that both encodings accept the same strings); MessagePack is first
 * walked by mp_scan, which allocates nothing and checks structure, container counts and depth,
 * then parsed by msgpack-c and converted into the same jansson tree. The biz_key rules run on
 * that tree, so they cannot differ between encodings.
 *
 * Error precedence (what a producer sees when a body has several faults): empty body, size,
 * content type, well-formedness (syntax, depth), value types (unsupported, duplicate key,
 * invalid UTF-8), top level not a map, then the biz_key rules. A msgpack str that is not valid
 * UTF-8 is a syntax error, except the top-level biz_key value, which reports biz_key_utf8 so
 * that the dead-letter reason names the field the producer has to fix.
 *
 * Thread affinity: none; no global state.
 */
#include "envelope/envelope.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <msgpack.h>

#include "util/utf8.h"

/* msgpack-c parses with a fixed stack of MSGPACK_EMBED_STACK_SIZE (32) containers, compiled into
 * the library; deeper input fails as "out of memory". mp_scan rejects it first as too deep. */
#define MSGPACK_NESTING_MAX 32

/* Body bytes quoted in one error message (a key, the start of a biz_key). jansson's own text is
 * at most JSON_ERROR_TEXT_LENGTH, so no message carries more than 200 bytes of the body. */
#define QUOTE_MAX 40

typedef struct decode_ctx {
    int max_depth;
    char *err;
    size_t err_len;
} decode_ctx;

static int fail(decode_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(decode_ctx *c, int code, const char *fmt, ...)
{
    if (c->err && c->err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* envelope.h has no out-of-memory code; too_large is the nearest truth (the body did not fit).
 * The body is bounded by max_body, so this only happens when the whole process is starving. */
static int fail_oom(decode_ctx *c)
{
    return fail(c, ENVELOPE_E_TOO_LARGE, "out of memory while decoding the body");
}

/*
 * Copies at most max bytes of src into dst as text that is safe in a log line or an AMQP
 * header: valid UTF-8 passes through (cut only between characters), control and invalid bytes
 * become \xNN, and a cut is marked with "...". Returns dst.
 */
static const char *quote(char *dst, size_t dst_len, const char *src, size_t n, size_t max)
{
    const unsigned char *p = (const unsigned char *)src;
    size_t o = 0, i = 0;

    while (i < n && o + 8 < dst_len) {
        size_t len = utf8_seq(p + i, n - i);
        if (i + (len ? len : 1) > max)
            break;
        if (len == 0 || p[i] < 0x20 || p[i] == 0x7f) {
            o += (size_t)snprintf(dst + o, dst_len - o, "\\x%02x", p[i]);
            i++;
        } else {
            memcpy(dst + o, p + i, len);
            o += len;
            i += len;
        }
    }
    if (i < n && o + 4 <= dst_len) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
    return dst;
}

/* ---- content type ---------------------------------------------------------------------- */

static int is_blank(int ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n';
}

static int media_type_is(const char *s, size_t n, const char *want)
{
    return n == strlen(want) && strncasecmp(s, want, n) == 0;
}

/* Media types are case-insensitive and may carry parameters ("; charset=utf-8"). */
static int pick_format(const char *content_type, const unsigned char *body, size_t len,
                       envelope_format *fmt, decode_ctx *c)
{
    const char *s = content_type ? content_type : "";
    while (is_blank((unsigned char)*s))
        s++;
    size_t n = strcspn(s, ";");
    while (n > 0 && is_blank((unsigned char)s[n - 1]))
        n--;

    if (n == 0) {
        /* A JSON envelope starts with '{' (or '[' when the producer got it wrong, which then
         * reports not_map); a msgpack map starts with 0x80..0x8f, 0xde or 0xdf, never blank. */
        size_t i = 0;
        while (i < len && is_blank(body[i]))
            i++;
        *fmt = i == len || body[i] == '{' || body[i] == '[' ? ENVELOPE_FORMAT_JSON
                                                            : ENVELOPE_FORMAT_MSGPACK;
        return 0;
    }
    if (media_type_is(s, n, "application/json")) {
        *fmt = ENVELOPE_FORMAT_JSON;
        return 0;
    }
    if (media_type_is(s, n, "application/msgpack") ||
        media_type_is(s, n, "application/x-msgpack")) {
        *fmt = ENVELOPE_FORMAT_MSGPACK;
        return 0;
    }
    char q[QUOTE_MAX * 4 + 8];
    return fail(c, ENVELOPE_E_UNSUPPORTED,
                "content type \"%s\" is not supported; use application/json or "
                "application/msgpack",
                quote(q, sizeof q, s, n, QUOTE_MAX));
}

/* ---- JSON -------------------------------------------------------------------------------- */

static int json_too_deep(const json_t *v, int depth, int max)
{
    if (!json_is_object(v) && !json_is_array(v))
        return 0;
    if (depth > max)
        return 1;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (json_too_deep(json_array_get(v, i), depth + 1, max))
                return 1;
        return 0;
    }
    for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it))
        if (json_too_deep(json_object_iter_value(it), depth + 1, max))
            return 1;
    return 0;
}

static int json_error_to_code(enum json_error_code code)
{
    switch (code) {
    case json_error_out_of_memory:
        return ENVELOPE_E_TOO_LARGE;
    case json_error_stack_overflow:
        return ENVELOPE_E_TOO_DEEP;
    case json_error_duplicate_key:
        return ENVELOPE_E_DUPLICATE_KEY;
    case json_error_numeric_overflow: /* same rule as a msgpack uint64 above INT64_MAX */
    case json_error_null_byte_in_key: /* same rule as a msgpack key with NUL */
        return ENVELOPE_E_UNSUPPORTED;
    default:
        return ENVELOPE_E_SYNTAX;
    }
}

static int decode_json(const char *body, size_t len, decode_ctx *c, json_t **out)
{
    json_error_t jerr;
    /* JSON_DECODE_ANY so that a top-level scalar reports not_map rather than a syntax error;
     * JSON_ALLOW_NUL because msgpack str may hold NUL too (biz_key still refuses it). */
    json_t *root =
        json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!root) {
        char q[JSON_ERROR_TEXT_LENGTH * 4 + 8];
        int code = json_error_to_code(json_error_code(&jerr));
        if (code == ENVELOPE_E_TOO_DEEP)
            return fail(c, code, "JSON nesting is deeper than %d levels", c->max_depth);
        return fail(c, code, "%s at line %d, column %d: %s",
                    code == ENVELOPE_E_SYNTAX ? "invalid JSON" : "JSON refused", jerr.line,
                    jerr.column,
                    quote(q, sizeof q, jerr.text, strlen(jerr.text), JSON_ERROR_TEXT_LENGTH));
    }
    if (json_too_deep(root, 1, c->max_depth)) {
        json_decref(root);
        return fail(c, ENVELOPE_E_TOO_DEEP, "JSON nesting is deeper than %d levels", c->max_depth);
    }
    *out = root;
    return 0;
}

/* ---- MessagePack ------------------------------------------------------------------------- */

static uint64_t read_be(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/*
 * Walks one MessagePack value at *pos without allocating. msgpack-c allocates
 * count * sizeof(msgpack_object) as soon as it reads a container header, so a 5-byte
 * "map32 with 2^32-1 entries" would ask for 128 GiB before failing on the missing data. Every
 * element takes at least one byte, so a count larger than the bytes left is rejected here, as
 * are truncation, the reserved byte 0xc1 and nesting deeper than max (checked on every container,
 * empty ones too, like the JSON walk). Work is linear in len; recursion is bounded by max + 1.
 */
static int mp_scan(const unsigned char *p, size_t len, size_t *pos, int depth, int max,
                   decode_ctx *c)
{
    enum { SCALAR, ARRAY, MAP } kind = SCALAR;
    size_t at = *pos;
    size_t field = 0;   /* bytes of the big-endian length/count field after the type byte */
    size_t payload = 0; /* bytes after the field that do not depend on it */
    unsigned b = p[at++];

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        /* fixint, nil, bool: the type byte is the whole value */
    } else if (b <= 0x8f) {
        kind = MAP;
    } else if (b <= 0x9f) {
        kind = ARRAY;
    } else if (b <= 0xbf) {
        payload = b & 0x1f; /* fixstr */
    } else {
        switch (b) {
        case 0xc4:
        case 0xc5:
        case 0xc6: /* bin 8/16/32 */
            field = (size_t)1 << (b - 0xc4);
            break;
        case 0xc7:
        case 0xc8:
        case 0xc9: /* ext 8/16/32: length, then a type byte */
            field = (size_t)1 << (b - 0xc7), payload = 1;
            break;
        case 0xca:
        case 0xcb: /* float 32/64 */
            payload = b == 0xca ? 4 : 8;
            break;
        case 0xcc:
        case 0xcd:
        case 0xce:
        case 0xcf: /* uint 8..64 */
            payload = (size_t)1 << (b - 0xcc);
            break;
        case 0xd0:
        case 0xd1:
        case 0xd2:
        case 0xd3: /* int 8..64 */
            payload = (size_t)1 << (b - 0xd0);
            break;
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8: /* fixext 1..16, type byte */
            payload = 1 + ((size_t)1 << (b - 0xd4));
            break;
        case 0xd9:
        case 0xda:
        case 0xdb: /* str 8/16/32 */
            field = (size_t)1 << (b - 0xd9);
            break;
        case 0xdc:
        case 0xdd: /* array 16/32 */
            kind = ARRAY, field = b == 0xdc ? 2 : 4;
            break;
        case 0xde:
        case 0xdf: /* map 16/32 */
            kind = MAP, field = b == 0xde ? 2 : 4;
            break;
        default: /* 0xc1 is reserved */
            return fail(c, ENVELOPE_E_SYNTAX, "invalid MessagePack: byte 0x%02x at offset %zu", b,
                        at - 1);
        }
    }

    if (len - at < field)
        goto truncated;
    uint64_t n = field ? read_be(p + at, field) : b & 0x0f; /* fixmap/fixarray: low nibble */
    at += field;

    if (kind == SCALAR) {
        if (field)
            payload += (size_t)n; /* n < 2^32 */
        if (len - at < payload)
            goto truncated;
        *pos = at + payload;
        return 0;
    }
    if (depth > max)
        return fail(c, ENVELOPE_E_TOO_DEEP, "MessagePack nesting is deeper than %d levels", max);
    uint64_t items = kind == MAP ? 2 * n : n;
    if (items > len - at)
        return fail(
            c, ENVELOPE_E_SYNTAX,
            "invalid MessagePack: %s at offset %zu claims %" PRIu64 " %s but only %zu bytes follow",
            kind == MAP ? "map" : "array", *pos, n, kind == MAP ? "entries" : "elements", len - at);
    *pos = at;
    for (uint64_t i = 0; i < items; i++) {
        if (*pos >= len)
            goto truncated;
        int rc = mp_scan(p, len, pos, depth + 1, max, c);
        if (rc < 0)
            return rc;
    }
    return 0;

truncated:
    return fail(c, ENVELOPE_E_SYNTAX, "invalid MessagePack: truncated (value at offset %zu)", *pos);
}

static const char *mp_type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "str";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_BIN:
        return "bin";
    case MSGPACK_OBJECT_EXT:
        return "ext";
    }
    return "unknown";
}

static int mp_to_json(const msgpack_object *o, int depth, const msgpack_object_str *key,
                      decode_ctx *c, json_t **out);

/* msgpack-c leaves ptr NULL (or stale) for a zero-length str; give jansson and memchr a real
 * pointer. */
static msgpack_object_str mp_str(const msgpack_object_str *s)
{
    msgpack_object_str r = {s->size, s->size ? s->ptr : ""};
    return r;
}

/* Names the map key a value sits under, for error messages. */
static const char *mp_where(char *dst, size_t dst_len, const msgpack_object_str *key)
{
    char q[QUOTE_MAX * 4 + 8];
    if (!key)
        snprintf(dst, dst_len, "at the top level");
    else
        snprintf(dst, dst_len, "under key \"%s\"",
                 quote(q, sizeof q, key->ptr, key->size, QUOTE_MAX));
    return dst;
}

static int mp_map_to_json(const msgpack_object_map *m, int depth, decode_ctx *c, json_t **out)
{
    char q[QUOTE_MAX * 4 + 8];
    int rc = 0;
    json_t *obj = json_object();
    if (!obj)
        return fail_oom(c);

    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        json_t *child = NULL;
        if (k->type != MSGPACK_OBJECT_STR) {
            rc = fail(c, ENVELOPE_E_UNSUPPORTED,
                      "MessagePack map key of type %s is not supported; keys must be str",
                      mp_type_name(k->type));
            goto out;
        }
        const msgpack_object_str key = mp_str(&k->via.str), *ks = &key;
        if (utf8_invalid_at(ks->ptr, ks->size) != ks->size) {
            rc = fail(c, ENVELOPE_E_SYNTAX, "MessagePack map key \"%s\" is not valid UTF-8",
                      quote(q, sizeof q, ks->ptr, ks->size, QUOTE_MAX));
            goto out;
        }
        if (memchr(ks->ptr, '\0', ks->size)) {
            rc = fail(c, ENVELOPE_E_UNSUPPORTED, "map key \"%s\" contains a NUL byte",
                      quote(q, sizeof q, ks->ptr, ks->size, QUOTE_MAX));
            goto out;
        }
        if (json_object_getn(obj, ks->ptr, ks->size)) {
            rc = fail(c, ENVELOPE_E_DUPLICATE_KEY, "duplicate map key \"%s\"",
                      quote(q, sizeof q, ks->ptr, ks->size, QUOTE_MAX));
            goto out;
        }
        rc = mp_to_json(&m->ptr[i].val, depth + 1, ks, c, &child);
        if (rc < 0)
            goto out;
        if (json_object_setn_new_nocheck(obj, ks->ptr, ks->size, child) < 0) {
            rc = fail_oom(c);
            goto out;
        }
    }
out:
    if (rc < 0)
        json_decref(obj);
    else
        *out = obj;
    return rc;
}

/* Converts one msgpack-c object; depth is the nesting level the value would have as a
 * container (the top-level map is 1). */
static int mp_to_json(const msgpack_object *o, int depth, const msgpack_object_str *key,
                      decode_ctx *c, json_t **out)
{
    char where[QUOTE_MAX * 4 + 32];
    json_t *v = NULL;

    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        v = json_null();
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        v = json_boolean(o->via.boolean);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > INT64_MAX)
            return fail(c, ENVELOPE_E_UNSUPPORTED,
                        "integer %" PRIu64 " %s is above the 64-bit signed range", o->via.u64,
                        mp_where(where, sizeof where, key));
        v = json_integer((json_int_t)o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        v = json_integer((json_int_t)o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            return fail(c, ENVELOPE_E_UNSUPPORTED, "float %s is NaN or infinite (no JSON form)",
                        mp_where(where, sizeof where, key));
        v = json_real(o->via.f64);
        break;
    case MSGPACK_OBJECT_STR: {
        const msgpack_object_str str = mp_str(&o->via.str), *s = &str;
        size_t bad = utf8_invalid_at(s->ptr, s->size);
        if (bad != s->size) {
            if (depth == 2 && key && key->size == 7 && !memcmp(key->ptr, "biz_key", 7))
                return fail(c, ENVELOPE_E_BIZ_KEY_UTF8,
                            "biz_key is not valid UTF-8 (byte %zu of %" PRIu32 ")", bad, s->size);
            return fail(c, ENVELOPE_E_SYNTAX, "str %s is not valid UTF-8 (byte %zu of %" PRIu32 ")",
                        mp_where(where, sizeof where, key), bad, s->size);
        }
        v = json_stringn_nocheck(s->ptr, s->size);
        break;
    }
    case MSGPACK_OBJECT_ARRAY: {
        if (depth > c->max_depth)
            return fail(c, ENVELOPE_E_TOO_DEEP, "MessagePack nesting is deeper than %d levels",
                        c->max_depth);
        json_t *arr = json_array();
        if (!arr)
            return fail_oom(c);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            json_t *child = NULL;
            int rc = mp_to_json(&o->via.array.ptr[i], depth + 1, key, c, &child);
            if (rc == 0 && json_array_append_new(arr, child) < 0)
                rc = fail_oom(c);
            if (rc < 0) {
                json_decref(arr);
                return rc;
            }
        }
        *out = arr;
        return 0;
    }
    case MSGPACK_OBJECT_MAP:
        if (depth > c->max_depth)
            return fail(c, ENVELOPE_E_TOO_DEEP, "MessagePack nesting is deeper than %d levels",
                        c->max_depth);
        return mp_map_to_json(&o->via.map, depth, c, out);
    case MSGPACK_OBJECT_BIN:
    case MSGPACK_OBJECT_EXT:
        return fail(c, ENVELOPE_E_UNSUPPORTED,
                    "MessagePack %s %s is not supported (no JSON form); send text as str",
                    mp_type_name(o->type), mp_where(where, sizeof where, key));
    }
    if (!v)
        return fail_oom(c);
    *out = v;
    return 0;
}

static int decode_msgpack(const char *body, size_t len, decode_ctx *c, json_t **out)
{
    msgpack_unpacked up;
    size_t pos = 0, off = 0;
    int max = c->max_depth < MSGPACK_NESTING_MAX ? c->max_depth : MSGPACK_NESTING_MAX;
    int rc = mp_scan((const unsigned char *)body, len, &pos, 1, max, c);
    if (rc < 0)
        return rc;
    if (pos != len)
        return fail(c, ENVELOPE_E_SYNTAX,
                    "invalid MessagePack: %zu trailing byte(s) after the value (offset %zu)",
                    len - pos, pos);

    msgpack_unpacked_init(&up);
    switch (msgpack_unpack_next(&up, body, len, &off)) {
    case MSGPACK_UNPACK_SUCCESS:
        /* mp_scan has vouched for the bytes; anything but a full read is a disagreement
         * between the two parsers, and refusing the body is the safe answer. */
        rc = off == len ? mp_to_json(&up.data, 1, NULL, c, out)
                        : fail(c, ENVELOPE_E_SYNTAX, "invalid MessagePack: trailing bytes");
        break;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        rc = fail_oom(c);
        break;
    default:
        rc = fail(c, ENVELOPE_E_SYNTAX, "invalid MessagePack (rejected by msgpack-c)");
        break;
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

/* ---- envelope ---------------------------------------------------------------------------- */

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "a map";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

/* A top-level key that is biz_key but for case and separators ('_', '-', '.', ' '), or NULL. */
static const char *near_miss_biz_key(const json_t *root)
{
    static const char wanted[] = "bizkey";
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)root, key, value) {
        size_t n = 0;
        bool same = true;
        for (const char *p = key; *p && same; p++) {
            if (*p == '_' || *p == '-' || *p == '.' || *p == ' ')
                continue;
            char lower = (char)tolower((unsigned char)*p);
            same = n < sizeof wanted - 1 && lower == wanted[n];
            n++;
        }
        if (same && n == sizeof wanted - 1)
            return key;
    }
    return NULL;
}

static int check_biz_key(const json_t *root, decode_ctx *c, const char **out)
{
    char q[QUOTE_MAX * 4 + 8];
    const json_t *v = json_object_get(root, "biz_key");

    if (!v) {
        /* The seed's cross-language trap: a producer that spells the key its own way (bizKey,
         * BizKey from an untagged Go struct, biz-key, BIZ_KEY). Say so in the reason. */
        const char *near_miss = near_miss_biz_key(root);
        if (near_miss)
            return fail(c, ENVELOPE_E_BIZ_KEY_MISSING,
                        "biz_key is missing (found \"%s\"; envelope keys are snake_case)",
                        quote(q, sizeof q, near_miss, strlen(near_miss), QUOTE_MAX));
        return fail(c, ENVELOPE_E_BIZ_KEY_MISSING, "biz_key is missing");
    }
    if (!json_is_string(v))
        return fail(c, ENVELOPE_E_BIZ_KEY_TYPE, "biz_key is %s; it must be a string",
                    json_type_name(v));

    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0)
        return fail(c, ENVELOPE_E_BIZ_KEY_EMPTY, "biz_key is empty");
    if (n > ENVELOPE_BIZ_KEY_MAX)
        return fail(c, ENVELOPE_E_BIZ_KEY_TOO_LONG,
                    "biz_key is %zu bytes; the limit is %d (\"%s\")", n, ENVELOPE_BIZ_KEY_MAX,
                    quote(q, sizeof q, s, n, QUOTE_MAX));
    const char *nul = memchr(s, '\0', n);
    if (nul)
        return fail(c, ENVELOPE_E_BIZ_KEY_UTF8, "biz_key contains a NUL byte at offset %zu",
                    (size_t)(nul - s));
    size_t bad = utf8_invalid_at(s, n);
    if (bad != n) /* unreachable today: both decoders validate strings; kept as the rule */
        return fail(c, ENVELOPE_E_BIZ_KEY_UTF8, "biz_key is not valid UTF-8 (byte %zu)", bad);
    *out = s;
    return 0;
}

static const char *optional_string(const json_t *root, const char *name)
{
    return json_string_value(json_object_get(root, name)); /* NULL unless a string */
}

int envelope_decode(const void *body, size_t body_len, const char *content_type,
                    const envelope_limits *limits, envelope *out, char *err, size_t err_len)
{
    decode_ctx c = {ENVELOPE_DEFAULT_MAX_DEPTH, err, err_len};
    size_t max_body = ENVELOPE_DEFAULT_MAX_BODY;
    envelope_format fmt = ENVELOPE_FORMAT_JSON;
    json_t *root = NULL;
    const char *biz_key = NULL;
    int rc;

    if (err && err_len > 0)
        err[0] = '\0';
    if (limits && limits->max_body > 0)
        max_body = limits->max_body;
    if (limits && limits->max_depth > 0)
        c.max_depth = limits->max_depth;
    if (!body)
        body_len = 0;

    if (body_len == 0)
        return fail(&c, ENVELOPE_E_EMPTY, "body is empty");
    if (body_len > max_body)
        return fail(&c, ENVELOPE_E_TOO_LARGE, "body is %zu bytes; the limit is %zu", body_len,
                    max_body);
    rc = pick_format(content_type, body, body_len, &fmt, &c);
    if (rc < 0)
        return rc;

    rc = fmt == ENVELOPE_FORMAT_JSON ? decode_json(body, body_len, &c, &root)
                                     : decode_msgpack(body, body_len, &c, &root);
    if (rc < 0)
        goto out;
    if (!json_is_object(root)) {
        rc = fail(&c, ENVELOPE_E_NOT_MAP, "the top level is %s; the envelope must be a map",
                  json_type_name(root));
        goto out;
    }
    rc = check_biz_key(root, &c, &biz_key);
    if (rc < 0)
        goto out;

    out->root = root;
    out->biz_key = biz_key;
    out->message_id = optional_string(root, "message_id");
    out->event_type = optional_string(root, "event_type");
    out->format = fmt;
    root = NULL;
out:
    json_decref(root);
    return rc;
}

void envelope_close(envelope *env)
{
    if (!env)
        return;
    json_decref(env->root);
    memset(env, 0, sizeof *env);
}

const json_t *envelope_field(const envelope *env, const char *dotted_path)
{
    if (!env || !env->root || !dotted_path)
        return NULL;
    const json_t *v = env->root;
    const char *seg = dotted_path;
    for (;;) {
        const char *dot = strchr(seg, '.');
        size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
        if (n == 0 || !json_is_object(v))
            return NULL;
        v = json_object_getn(v, seg, n);
        if (!v || !dot)
            return v;
        seg = dot + 1;
    }
}

const char *envelope_error_name(int code)
{
    switch (code) {
    case ENVELOPE_OK:
        return "ok";
    case ENVELOPE_E_TOO_LARGE:
        return "too_large";
    case ENVELOPE_E_EMPTY:
        return "empty";
    case ENVELOPE_E_SYNTAX:
        return "syntax";
    case ENVELOPE_E_NOT_MAP:
        return "not_map";
    case ENVELOPE_E_TOO_DEEP:
        return "too_deep";
    case ENVELOPE_E_UNSUPPORTED:
        return "unsupported";
    case ENVELOPE_E_BIZ_KEY_MISSING:
        return "biz_key_missing";
    case ENVELOPE_E_BIZ_KEY_TYPE:
        return "biz_key_type";
    case ENVELOPE_E_BIZ_KEY_EMPTY:
        return "biz_key_empty";
    case ENVELOPE_E_BIZ_KEY_TOO_LONG:
        return "biz_key_too_long";
    case ENVELOPE_E_BIZ_KEY_UTF8:
        return "biz_key_utf8";
    case ENVELOPE_E_DUPLICATE_KEY:
        return "duplicate_key";
    }
    return "unknown";
}
