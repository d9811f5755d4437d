/*
 * log — JSON lines on stderr. See log.h.
 *
 * The level is the one process-wide setting in this module, and it stays global on purpose: every
 * module logs, from every thread, without a handle, and threading a logger through each call
 * would change every signature in the tree for one integer. It is written once, by main after the
 * config is loaded and before any thread starts (log_set_level), and only read afterwards; it is
 * an atomic so those reads are race-free without a lock. Thread affinity: any thread.
 *
 * Lines are built by hand into one buffer, not as a jansson object: every settled message writes
 * one, on the loop thread, and the object (a dozen allocations, a hash table, json_dumps) cost
 * about 5 µs a line, a fifth of a message's whole cost at the rates a duplicate flood reaches.
 * The text is what jansson wrote (same escapes, same field order, invalid UTF-8 treated alike);
 * tests/unit/test_log.c holds the two side by side.
 */
#include "ops/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "util/utf8.h"

static atomic_int current_level = LOG_LEVEL_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(log_level level)
{
    atomic_store(&current_level, (int)level);
}

bool log_enabled(log_level level)
{
    return (int)level >= atomic_load(&current_level);
}

/* gmtime_r and strftime cost more than the rest of a line: each thread keeps the text of the
 * second it last wrote in. */
static void format_timestamp(char *buf, size_t len)
{
    static _Thread_local time_t cached_second = -1;
    static _Thread_local char cached_text[24];
    struct timeval now;
    gettimeofday(&now, NULL);
    if (now.tv_sec != cached_second) {
        struct tm utc;
        gmtime_r(&now.tv_sec, &utc);
        if (strftime(cached_text, sizeof cached_text, "%Y-%m-%dT%H:%M:%S", &utc) == 0)
            cached_text[0] = '\0';
        cached_second = now.tv_sec;
    }
    snprintf(buf, len, "%s.%03ldZ", cached_text, (long)(now.tv_usec / 1000));
}

/* The line being built: on the stack for any ordinary line, on the heap past that. A line that
 * cannot grow (out of memory) is dropped whole, never written cut. */
typedef struct line_buffer {
    char *text;
    size_t len, cap;
    bool failed;
    char stack[4096];
} line_buffer;

static void line_reserve(line_buffer *b, size_t more)
{
    if (b->failed || b->len + more <= b->cap)
        return;
    size_t cap = b->cap * 2;
    while (cap < b->len + more)
        cap *= 2;
    char *text = b->text == b->stack ? malloc(cap) : realloc(b->text, cap);
    if (!text) {
        b->failed = true;
        return;
    }
    if (b->text == b->stack)
        memcpy(text, b->stack, b->len);
    b->text = text;
    b->cap = cap;
}

static void line_append(line_buffer *b, const char *s, size_t n)
{
    line_reserve(b, n);
    if (b->failed)
        return;
    memcpy(b->text + b->len, s, n);
    b->len += n;
}

static void line_append_text(line_buffer *b, const char *s)
{
    line_append(b, s, strlen(s));
}

/* s as a JSON string, escaped as jansson's json_dumps escapes it (so lines read the same as
 * when jansson wrote them): \" \\ \b \f \n \r \t, other bytes below 0x20 as \u00XX, the rest
 * as is. s must be valid UTF-8 (the caller checked). */
static void line_append_string(line_buffer *b, const char *s, size_t n)
{
    line_reserve(b, n * 6 + 2);
    if (b->failed)
        return;
    char *out = b->text + b->len;
    *out++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            out += sprintf(out, "u%04X", c);
        }
    }
    *out++ = '"';
    b->len = (size_t)(out - b->text);
}

/* ,"name":"value" — left out when value is NULL or not valid UTF-8, as a jansson string that
 * could not be made is left out of its object. */
static void line_append_field(line_buffer *b, const char *name, const char *value)
{
    if (!value)
        return;
    size_t n = strlen(value);
    if (utf8_invalid_at(value, n) != n)
        return;
    line_append(b, ",\"", 2);
    line_append_text(b, name);
    line_append(b, "\":", 2);
    line_append_string(b, value, n);
}

void log_write(log_level level, const log_context *ctx, const char *fmt, ...)
{
    char message[2048];
    char timestamp[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    format_timestamp(timestamp, sizeof timestamp);

    line_buffer b = {.cap = sizeof b.stack};
    b.text = b.stack;
    line_append_text(&b, "{\"ts\":");
    line_append_string(&b, timestamp, strlen(timestamp));
    line_append_text(&b, ",\"level\":");
    line_append_string(&b, level_names[level], strlen(level_names[level]));
    /* Message text may contain bytes from a body: never write invalid UTF-8 into the line. */
    size_t message_len = strlen(message);
    if (utf8_invalid_at(message, message_len) != message_len)
        line_append_field(&b, "msg", "(message not valid UTF-8)");
    else
        line_append_field(&b, "msg", message);
    if (ctx) {
        line_append_field(&b, "queue", ctx->queue);
        line_append_field(&b, "biz_key", ctx->biz_key);
        line_append_field(&b, "message_id", ctx->message_id);
        line_append_field(&b, "amqp_message_id", ctx->amqp_message_id);
        line_append_field(&b, "correlation_id", ctx->correlation_id);
        line_append_field(&b, "traceparent", ctx->traceparent);
        line_append_field(&b, "trace_id", ctx->trace_id);
        line_append_field(&b, "span_id", ctx->span_id);
        if (ctx->retries >= 0) {
            char retries[32];
            int n = snprintf(retries, sizeof retries, ",\"retries\":%ld", ctx->retries);
            line_append(&b, retries, (size_t)n);
        }
        line_append_field(&b, "outcome", ctx->outcome);
    }
    line_append(&b, "}\n", 2);
    /* One fwrite of the whole line: on unbuffered stderr that is one write(2), which the stdio
     * lock keeps whole against the other threads' lines. */
    if (!b.failed) {
        flockfile(stderr);
        fwrite(b.text, 1, b.len, stderr);
        funlockfile(stderr);
    }
    if (b.text != b.stack)
        free(b.text);
}
