/*
 * log — JSON lines on stderr. See log.h.
 *
 * The level is the one process-wide setting in this module, and it stays global on purpose: every
 * module logs, from every thread, without a handle, and threading a logger through each call
 * would change every signature in the tree for one integer. It is written once, by main after the
 * config is loaded and before any thread starts (log_set_level), and only read afterwards; it is
 * an atomic so those reads are race-free without a lock. Thread affinity: any thread.
 */
#include "ops/log.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

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

static void format_timestamp(char *buf, size_t len)
{
    struct timeval now;
    struct tm utc;
    gettimeofday(&now, NULL);
    gmtime_r(&now.tv_sec, &utc);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &utc);
    snprintf(buf + n, len - n, ".%03ldZ", (long)(now.tv_usec / 1000));
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

    json_t *line = json_object();
    if (!line)
        return;
    json_object_set_new(line, "ts", json_string(timestamp));
    json_object_set_new(line, "level", json_string(level_names[level]));
    /* Message text may contain bytes from a body; json_stringn_nocheck would emit invalid UTF-8. */
    json_t *msg = json_string(message);
    json_object_set_new(line, "msg", msg ? msg : json_string("(message not valid UTF-8)"));
    if (ctx) {
        if (ctx->queue)
            json_object_set_new(line, "queue", json_string(ctx->queue));
        if (ctx->biz_key)
            json_object_set_new(line, "biz_key", json_string(ctx->biz_key));
        if (ctx->message_id)
            json_object_set_new(line, "message_id", json_string(ctx->message_id));
        if (ctx->amqp_message_id)
            json_object_set_new(line, "amqp_message_id", json_string(ctx->amqp_message_id));
        if (ctx->correlation_id)
            json_object_set_new(line, "correlation_id", json_string(ctx->correlation_id));
        if (ctx->traceparent)
            json_object_set_new(line, "traceparent", json_string(ctx->traceparent));
        if (ctx->trace_id)
            json_object_set_new(line, "trace_id", json_string(ctx->trace_id));
        if (ctx->span_id)
            json_object_set_new(line, "span_id", json_string(ctx->span_id));
        if (ctx->retries >= 0)
            json_object_set_new(line, "retries", json_integer(ctx->retries));
        if (ctx->outcome)
            json_object_set_new(line, "outcome", json_string(ctx->outcome));
    }
    char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(line);
    if (!text)
        return;
    flockfile(stderr);
    fputs(text, stderr);
    fputc('\n', stderr);
    funlockfile(stderr);
    free(text);
}
