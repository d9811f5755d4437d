/*
 * log — one JSON object per line on stderr.
 *
 * Every line carries the message context (queue, biz_key, message_id, correlation_id,
 * traceparent with its trace_id and idemq's span_id, retries) when there is one, so an operator can grep a key across the retry ladder
 * and find a message whose body could not be read by the identifiers its producer set. Values are escaped as jansson escapes them; secrets are
 * never passed in (URLs go through config_redact_url first). Thread affinity: any thread; each
 * line is written under the stdio lock (flockfile), so lines from workers never interleave.
 */
#ifndef IDEMQ_LOG_H
#define IDEMQ_LOG_H

#include <stdbool.h>

/* Lowest to highest; config/ has its own enum for the `log.level` key, in the same order, and
 * main maps one onto the other. */
typedef enum log_level {
    LOG_LEVEL_DEBUG = 0,
    LOG_LEVEL_INFO = 1,
    LOG_LEVEL_WARN = 2,
    LOG_LEVEL_ERROR = 3,
} log_level;

/* Context of the message a line is about; every pointer is borrowed and may be NULL. */
typedef struct log_context {
    const char *queue;
    const char *biz_key;
    const char *message_id;      /* the envelope's, else the AMQP property */
    const char *amqp_message_id; /* the AMQP property when it differs from the envelope's */
    const char *correlation_id;  /* the AMQP property */
    const char *traceparent;     /* the W3C trace context header, as the producer sent it */
    const char *trace_id;        /* its trace id when it is valid (util/trace_context.h) */
    const char *span_id;         /* idemq's span for this message: the parent id of its emits */
    long retries;          /* < 0: omitted */
    const char *outcome;
} log_context;

#define LOG_NO_CONTEXT ((const log_context *)0)

/* Sets the lowest level written (LOG_LEVEL_INFO until then). Call it once, from main, before any
 * thread starts; see log.c for why this one setting is process-wide. */
void log_set_level(log_level level);

/* Whether a line at level would be written: check it before formatting (redis serverLog). */
bool log_enabled(log_level level);

/* Writes {"ts":…,"level":…,"msg":…, context…}. It does not check the level: callers check
 * log_enabled first (the log_* macros below do). fmt is printf-style. */
void log_write(log_level level, const log_context *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_debug(ctx, ...) \
    do { if (log_enabled(LOG_LEVEL_DEBUG)) log_write(LOG_LEVEL_DEBUG, ctx, __VA_ARGS__); } while (0)
#define log_info(ctx, ...) \
    do { if (log_enabled(LOG_LEVEL_INFO)) log_write(LOG_LEVEL_INFO, ctx, __VA_ARGS__); } while (0)
#define log_warn(ctx, ...) \
    do { if (log_enabled(LOG_LEVEL_WARN)) log_write(LOG_LEVEL_WARN, ctx, __VA_ARGS__); } while (0)
#define log_error(ctx, ...) \
    do { if (log_enabled(LOG_LEVEL_ERROR)) log_write(LOG_LEVEL_ERROR, ctx, __VA_ARGS__); } while (0)

#endif
