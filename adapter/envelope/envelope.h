/*
 * envelope — turns a producer's message body (JSON or MessagePack) into one record type.
 *
 * Both encodings decode into the same jansson tree so that handlers read fields one way,
 * whatever language or encoding the producer used. The module enforces the contract's limits
 * (body size, nesting depth, biz_key rules) and does no I/O. Thread affinity: none; a decoded
 * envelope is owned by one thread at a time.
 */
#ifndef IDEMQ_ENVELOPE_H
#define IDEMQ_ENVELOPE_H

#include <stddef.h>
#include <jansson.h>

#define ENVELOPE_BIZ_KEY_MAX 128
#define ENVELOPE_DEFAULT_MAX_BODY (1024 * 1024)
#define ENVELOPE_DEFAULT_MAX_DEPTH 32

/* Every decode failure is deterministic: the same bytes fail the same way on every delivery,
 * so the caller treats all of them as non-retryable. The names are the stable strings used in
 * schemas/vectors and in the DLQ reason. */
typedef enum envelope_error {
    ENVELOPE_OK = 0,
    ENVELOPE_E_TOO_LARGE = -1,     /* body larger than limits.max_body */
    ENVELOPE_E_EMPTY = -2,         /* zero-length body */
    ENVELOPE_E_SYNTAX = -3,        /* not valid JSON / MessagePack, or trailing bytes */
    ENVELOPE_E_NOT_MAP = -4,       /* top level is not an object/map */
    ENVELOPE_E_TOO_DEEP = -5,      /* nesting deeper than limits.max_depth */
    ENVELOPE_E_UNSUPPORTED = -6,   /* msgpack bin/ext, non-string map key, int out of range,
                                      unknown content type */
    ENVELOPE_E_BIZ_KEY_MISSING = -7,
    ENVELOPE_E_BIZ_KEY_TYPE = -8,  /* biz_key present but not a string */
    ENVELOPE_E_BIZ_KEY_EMPTY = -9,
    ENVELOPE_E_BIZ_KEY_TOO_LONG = -10, /* more than ENVELOPE_BIZ_KEY_MAX bytes */
    ENVELOPE_E_BIZ_KEY_UTF8 = -11,     /* not valid UTF-8, or contains NUL */
    ENVELOPE_E_DUPLICATE_KEY = -12,    /* the same map key twice: ambiguous, reject */
} envelope_error;

typedef enum envelope_format {
    ENVELOPE_FORMAT_JSON = 1,
    ENVELOPE_FORMAT_MSGPACK = 2,
} envelope_format;

typedef struct envelope_limits {
    size_t max_body;  /* bytes; 0 means ENVELOPE_DEFAULT_MAX_BODY */
    int max_depth;    /* nested maps/arrays; <= 0 means ENVELOPE_DEFAULT_MAX_DEPTH. msgpack-c's
                         parser stack is fixed at 32 levels, so more only applies to JSON. */
} envelope_limits;

typedef struct envelope {
    json_t *root;            /* owned: the whole decoded map */
    const char *biz_key;     /* borrowed from root; never NULL after a successful decode */
    const char *message_id;  /* borrowed from root; NULL when absent or not a string */
    const char *event_type;  /* borrowed from root; NULL when absent or not a string */
    envelope_format format;
} envelope;

/*
 * Decodes body into out.
 *   body, content_type: borrowed. content_type may be NULL or empty: the first non-blank byte
 *     decides ('{' or '[' → JSON, a body of only white space → JSON and so a syntax error,
 *     otherwise MessagePack). Content types match case-insensitively; parameters after ';' are
 *     ignored.
 *   limits: borrowed, may be NULL for defaults.
 *   out: caller-owned storage; filled only on success, then release it with envelope_close.
 *   err/err_len: optional buffer for a human-readable reason (never contains more than 200 bytes
 *     of the body).
 * Returns ENVELOPE_OK or a negative envelope_error.
 */
int envelope_decode(const void *body, size_t body_len, const char *content_type,
                    const envelope_limits *limits, envelope *out, char *err, size_t err_len);

/* Releases what envelope_decode filled in; safe on a zeroed envelope. */
void envelope_close(envelope *env);

/*
 * Looks up a field by dotted path ("customer.address.city"); keys themselves cannot contain dots.
 * Returns a borrowed pointer into env->root, or NULL when any step is missing or not a map.
 */
const json_t *envelope_field(const envelope *env, const char *dotted_path);

/* Stable name of an error code, e.g. "biz_key_too_long"; "ok" for 0, "unknown" otherwise. */
const char *envelope_error_name(int code);

#endif
