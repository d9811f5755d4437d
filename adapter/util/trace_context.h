/*
 * trace_context — W3C Trace Context (https://www.w3.org/TR/trace-context/) for the messages idemq
 * publishes because of an incoming one.
 *
 * A producer's `traceparent` header is parsed once per delivery. When it is valid, idemq's
 * processing of that delivery is a span of the producer's trace: it gets its own random span id,
 * and the messages the outbox emits for it carry `00-<trace-id>-<our span id>-<flags>`, so a
 * downstream consumer continues the trace as our child. `tracestate` is vendor data: it is
 * passed on unchanged (see trace_context_read for the one exception, an overlong value).
 * An invalid traceparent is not repaired or guessed at: emits get neither header (the spec
 * says a vendor that cannot parse traceparent must not use tracestate either). Retry and DLQ
 * copies are the same message, not children of it: they keep the producer's headers as they
 * are, valid or not (broker/message.c), and are not this module's concern.
 *
 * Pure: no I/O, no allocation. trace_span_id_random seeds from OpenSSL's CSPRNG once per thread.
 * Errors: trace_context_read returns TRACE_CONTEXT_VALID, _ABSENT or _INVALID.
 * Thread affinity: any thread; a trace_context has one owner at a time.
 */
#ifndef IDEMQ_TRACE_CONTEXT_H
#define IDEMQ_TRACE_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_HEADER_TRACEPARENT "traceparent"
#define TRACE_HEADER_TRACESTATE "tracestate"

#define TRACE_ID_HEX 32      /* 16 bytes */
#define TRACE_SPAN_ID_HEX 16 /* 8 bytes */
#define TRACE_FLAGS_HEX 2
/* "00-" trace-id "-" span-id "-" flags: the only version idemq writes. */
#define TRACE_TRACEPARENT_LEN (3 + TRACE_ID_HEX + 1 + TRACE_SPAN_ID_HEX + 1 + TRACE_FLAGS_HEX)
/* The spec asks a vendor to propagate at least 512 characters of tracestate; idemq keeps that
 * much (the outbox column is VARBINARY of this size). */
#define TRACE_TRACESTATE_MAX 512

typedef enum trace_context_status {
    TRACE_CONTEXT_VALID = 0,
    TRACE_CONTEXT_ABSENT = 1,  /* no traceparent header */
    TRACE_CONTEXT_INVALID = 2, /* a traceparent that does not parse: ignored, with tracestate */
} trace_context_status;

typedef struct trace_context {
    trace_context_status status;
    char trace_id[TRACE_ID_HEX + 1];       /* lowercase hex, not all zero; "" unless VALID */
    char parent_id[TRACE_SPAN_ID_HEX + 1]; /* the producer's span */
    char flags[TRACE_FLAGS_HEX + 1];       /* trace-flags as received (sampled bit and the rest) */
    char span_id[TRACE_SPAN_ID_HEX + 1];   /* idemq's span: "" until trace_context_start_span */
    size_t tracestate_len;                 /* 0: none to pass on */
    char tracestate[TRACE_TRACESTATE_MAX + 1];
} trace_context;

/*
 * Parses a traceparent value of len bytes (borrowed, need not be NUL-terminated) into out's
 * trace_id, parent_id and flags. Version 00 must be exactly 55 bytes; a later version (not ff)
 * is read by its first 55 bytes when what follows starts with '-', as the spec asks. Rejected:
 * a wrong length or separator, anything but lowercase hex, version ff, an all-zero trace id or
 * parent id. Returns true when valid; out is then filled, else left unchanged.
 */
bool trace_parent_parse(const char *text, size_t len, trace_context *out);

/*
 * Fills out (caller-owned) from the two headers of a delivery (either may be NULL: absent; both
 * borrowed). VALID: trace_id, parent_id, flags set; tracestate copied when it is 1..512 bytes of
 * printable ASCII; when longer, its leading list members that fit in 512 bytes are kept (cut at
 * a ',', the spec's way of shortening it); when it holds other bytes, it is not passed on.
 * ABSENT or INVALID: nothing is kept, tracestate included. span_id is left "".
 */
trace_context_status trace_context_read(trace_context *out, const char *traceparent,
                                        size_t traceparent_len, const char *tracestate,
                                        size_t tracestate_len);

/* Sets out->span_id to the 16 hex digits of random (big-endian). random 0 is not a valid span id:
 * it is replaced by 1 (the caller draws from trace_span_id_random, which never returns 0). */
void trace_context_start_span(trace_context *t, uint64_t random);

/* 64 random bits, never 0: a per-thread splitmix64 sequence seeded once from OpenSSL's
 * RAND_bytes (from the clock if that fails, so a span id always exists). Uniqueness, not
 * secrecy, is what a span id needs; see trace_context.c. */
uint64_t trace_span_id_random(void);

/* Writes the traceparent of a child of t's span ("00-" trace_id "-" span_id "-" flags) into out
 * (TRACE_TRACEPARENT_LEN + 1 bytes). Returns false, writing "", unless t is VALID with a span. */
bool trace_context_child(const trace_context *t, char *out, size_t out_len);

/* The trace id inside a traceparent value of len bytes (borrowed) into out (TRACE_ID_HEX + 1
 * bytes): for log lines of something that only has the header (the relay's rows). Returns false,
 * writing "", when the value is not a valid traceparent. */
bool trace_id_of(const char *traceparent, size_t len, char *out, size_t out_len);

#endif
