/*
 * trace_context — see trace_context.h.
 */
#include "util/trace_context.h"

#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The spec allows only lowercase: "00F0..." is not the same id written differently, it is
 * invalid, and passing it on would hand the next vendor something it must reject. */
static bool lower_hex(const char *p, size_t n, bool *all_zero)
{
    bool zero = true;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
        if (c != '0')
            zero = false;
    }
    if (all_zero)
        *all_zero = zero;
    return true;
}

bool trace_parent_parse(const char *text, size_t len, trace_context *out)
{
    enum {
        TRACE_AT = 3,
        PARENT_AT = TRACE_AT + TRACE_ID_HEX + 1,
        FLAGS_AT = PARENT_AT + TRACE_SPAN_ID_HEX + 1
    };
    if (!text || len < TRACE_TRACEPARENT_LEN)
        return false;
    bool zero;
    if (!lower_hex(text, 2, NULL) || text[2] != '-')
        return false;
    bool version_00 = text[0] == '0' && text[1] == '0';
    if (text[0] == 'f' && text[1] == 'f')
        return false;
    /* A later version may append fields; version 00 has none. */
    if (version_00 ? len != TRACE_TRACEPARENT_LEN
                   : len > TRACE_TRACEPARENT_LEN && text[TRACE_TRACEPARENT_LEN] != '-')
        return false;
    if (text[PARENT_AT - 1] != '-' || text[FLAGS_AT - 1] != '-')
        return false;
    if (!lower_hex(text + TRACE_AT, TRACE_ID_HEX, &zero) || zero)
        return false;
    if (!lower_hex(text + PARENT_AT, TRACE_SPAN_ID_HEX, &zero) || zero)
        return false;
    if (!lower_hex(text + FLAGS_AT, TRACE_FLAGS_HEX, NULL))
        return false;
    memcpy(out->trace_id, text + TRACE_AT, TRACE_ID_HEX);
    out->trace_id[TRACE_ID_HEX] = '\0';
    memcpy(out->parent_id, text + PARENT_AT, TRACE_SPAN_ID_HEX);
    out->parent_id[TRACE_SPAN_ID_HEX] = '\0';
    memcpy(out->flags, text + FLAGS_AT, TRACE_FLAGS_HEX);
    out->flags[TRACE_FLAGS_HEX] = '\0';
    return true;
}

static bool printable_ascii(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || (unsigned char)p[i] > 0x7e)
            return false;
    return true;
}

trace_context_status trace_context_read(trace_context *out, const char *traceparent,
                                        size_t traceparent_len, const char *tracestate,
                                        size_t tracestate_len)
{
    memset(out, 0, sizeof *out);
    if (!traceparent) {
        out->status = TRACE_CONTEXT_ABSENT;
        return out->status;
    }
    if (!trace_parent_parse(traceparent, traceparent_len, out)) {
        out->status = TRACE_CONTEXT_INVALID;
        return out->status;
    }
    out->status = TRACE_CONTEXT_VALID;
    if (!tracestate || tracestate_len == 0 || !printable_ascii(tracestate, tracestate_len))
        return out->status;
    size_t keep = tracestate_len;
    if (keep > TRACE_TRACESTATE_MAX) {
        /* Whole list members from the left: a member cut in half would be garbage to its
         * vendor, a missing one only means that vendor starts afresh. */
        keep = 0;
        for (size_t i = TRACE_TRACESTATE_MAX + 1; i-- > 0;)
            if (tracestate[i] == ',') {
                keep = i;
                break;
            }
        while (keep > 0 && (tracestate[keep - 1] == ' ' || tracestate[keep - 1] == '\t'))
            keep--;
    }
    memcpy(out->tracestate, tracestate, keep);
    out->tracestate[keep] = '\0';
    out->tracestate_len = keep;
    return out->status;
}

void trace_context_start_span(trace_context *t, uint64_t random)
{
    if (random == 0)
        random = 1;
    snprintf(t->span_id, sizeof t->span_id, "%016llx", (unsigned long long)random);
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* RAND_bytes costs about 1.7 us a call here, on the loop thread for every message; a span id
 * needs uniqueness, not secrecy. So each thread draws its seed from RAND_bytes once and then
 * walks splitmix64: its output is a bijection of the counter, so one thread never repeats an id
 * within 2^64 draws, and the random seed keeps threads and processes apart. */
static _Thread_local uint64_t span_state;
static _Thread_local bool span_seeded;

uint64_t trace_span_id_random(void)
{
    if (!span_seeded) {
        unsigned char b[8];
        if (RAND_bytes(b, sizeof b) == 1) {
            for (size_t i = 0; i < sizeof b; i++)
                span_state = span_state << 8 | b[i];
        } else {
            static atomic_uint_fast64_t counter;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            span_state = mix64((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec +
                               atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ULL);
        }
        span_seeded = true;
    }
    span_state += 0x9E3779B97F4A7C15ULL;
    uint64_t v = mix64(span_state);
    return v ? v : 1;
}

bool trace_context_child(const trace_context *t, char *out, size_t out_len)
{
    if (out_len > 0)
        out[0] = '\0';
    if (t->status != TRACE_CONTEXT_VALID || !t->span_id[0] || out_len < TRACE_TRACEPARENT_LEN + 1)
        return false;
    snprintf(out, out_len, "00-%s-%s-%s", t->trace_id, t->span_id, t->flags);
    return true;
}

bool trace_id_of(const char *traceparent, size_t len, char *out, size_t out_len)
{
    trace_context t;
    if (out_len > 0)
        out[0] = '\0';
    if (out_len < TRACE_ID_HEX + 1 || !trace_parent_parse(traceparent, len, &t))
        return false;
    memcpy(out, t.trace_id, TRACE_ID_HEX + 1);
    return true;
}
