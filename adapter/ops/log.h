/*
 * log — one JSON object per line on stderr.
 *
 * Every line carries the message context (queue, biz_key, message_id, retries) when there is one,
 * so an operator can grep a key across the retry ladder. Values are escaped by jansson; secrets are
 * never passed in (URLs go through config_redact_url first). Thread affinity: any thread; each
 * line is written with one fwrite under the stdio lock, so lines from workers never interleave.
 */
#ifndef IDEMQ_LOG_H
#define IDEMQ_LOG_H

#include <stdbool.h>
#include "config/config.h"

/* Context of the message a line is about; every pointer is borrowed and may be NULL. */
typedef struct log_context {
    const char *queue;
    const char *biz_key;
    const char *message_id;
    long retries;          /* < 0: omitted */
    const char *outcome;
} log_context;

#define LOG_NO_CONTEXT ((const log_context *)0)

void log_set_level(config_log_level level);
bool log_enabled(config_log_level level);

/* Writes {"ts":…,"level":…,"msg":…, context…} when level is enabled. fmt is printf-style. */
void log_write(config_log_level level, const log_context *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_debug(ctx, ...) \
    do { if (log_enabled(CONFIG_LOG_DEBUG)) log_write(CONFIG_LOG_DEBUG, ctx, __VA_ARGS__); } while (0)
#define log_info(ctx, ...) \
    do { if (log_enabled(CONFIG_LOG_INFO)) log_write(CONFIG_LOG_INFO, ctx, __VA_ARGS__); } while (0)
#define log_warn(ctx, ...) \
    do { if (log_enabled(CONFIG_LOG_WARN)) log_write(CONFIG_LOG_WARN, ctx, __VA_ARGS__); } while (0)
#define log_error(ctx, ...) \
    do { if (log_enabled(CONFIG_LOG_ERROR)) log_write(CONFIG_LOG_ERROR, ctx, __VA_ARGS__); } while (0)

#endif
