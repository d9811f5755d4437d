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

#include "util/errors.h"

#define ENVELOPE_BIZ_KEY_MAX 128
#define ENVELOPE_DEFAULT_MAX_BODY (1024 * 1024)
#define ENVELOPE_DEFAULT_MAX_DEPTH 32

/* Every decode failure is deterministic: the same bytes fail the same way on every delivery,
 * so the caller treats all of them as non-retryable. The codes are the ENVELOPE_E_* of
 * util/errors.h; their names (envelope_error_name) are the stable strings used in schemas/vectors
 * and in the DLQ reason. */
#define ENVELOPE_OK 0

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
    /* Not from the body: the delivery's W3C trace context (AMQP headers), set by its owner after
     * the decode so that every handler's emits continue the trace (outbox/writer.c). Borrowed;
     * NULL when the delivery has none or an invalid one. envelope_decode leaves it as it was. */
    const struct trace_context *trace;
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
 * Returns ENVELOPE_OK or a negative ENVELOPE_E_* code (util/errors.h).
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
