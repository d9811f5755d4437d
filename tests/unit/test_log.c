/*
 * test_log — ops/log.h: every line is one JSON object that jansson reads back and would have
 * written byte for byte the same (log.c builds lines by hand for speed, and operators' parsers
 * were written against jansson's output), bad UTF-8 never reaches a line, long and escaped
 * values outgrow the stack buffer safely, and threads never interleave lines. Pure memory and
 * one temporary file, no servers.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "ops/log.h"

/* ---- capturing stderr ------------------------------------------------------------------- */

static FILE *capture;
static int saved_stderr = -1;

static void capture_start(void)
{
    fflush(stderr);
    capture = tmpfile();
    cr_assert_not_null(capture);
    saved_stderr = dup(STDERR_FILENO);
    cr_assert(saved_stderr >= 0);
    cr_assert(dup2(fileno(capture), STDERR_FILENO) >= 0);
}

/* Restores stderr and returns what was written, one line per entry (the caller frees both);
 * *count gets the number of lines. Every line must end in '\n'. */
static char **capture_lines(size_t *count)
{
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    long size = ftell(capture);
    cr_assert(size >= 0);
    char *all = malloc((size_t)size + 1);
    rewind(capture);
    cr_assert_eq(fread(all, 1, (size_t)size, capture), (size_t)size);
    all[size] = '\0';
    fclose(capture);
    cr_assert(size == 0 || all[size - 1] == '\n', "the output does not end with a newline");
    size_t n = 0, cap = 16;
    char **lines = malloc(cap * sizeof *lines);
    for (char *p = all, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        *nl = '\0';
        if (n == cap)
            lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[n++] = strdup(p);
    }
    free(all);
    *count = n;
    return lines;
}

static void free_lines(char **lines, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(lines[i]);
    free(lines);
}

/* One log_write, captured; returns its line (the caller frees it). */
static char *one_line(log_level level, const log_context *ctx, const char *message)
{
    capture_start();
    log_write(level, ctx, "%s", message);
    size_t count;
    char **lines = capture_lines(&count);
    cr_assert_eq(count, 1, "%zu lines for one log_write", count);
    char *line = lines[0];
    free(lines);
    return line;
}

/* Parses line, checks that jansson writes it back byte for byte (escapes, field order, no
 * spaces) and returns the object (the caller decrefs it). */
static json_t *parse_as_jansson_writes(const char *line)
{
    json_error_t error;
    json_t *object = json_loads(line, JSON_REJECT_DUPLICATES, &error);
    cr_assert_not_null(object, "not JSON: %s (%s)", line, error.text);
    cr_assert(json_is_object(object));
    char *again = json_dumps(object, JSON_COMPACT | JSON_PRESERVE_ORDER);
    cr_assert_str_eq(line, again, "jansson would have written this line differently");
    free(again);
    return object;
}

static const char *string_field(json_t *object, const char *name)
{
    return json_string_value(json_object_get(object, name));
}

/* The names of object's fields in their order in the line, joined with ','. */
static void field_order(json_t *object, char *buf, size_t len)
{
    buf[0] = '\0';
    const char *key;
    json_t *value;
    json_object_foreach(object, key, value)
    {
        (void)value;
        if (buf[0])
            strncat(buf, ",", len - strlen(buf) - 1);
        strncat(buf, key, len - strlen(buf) - 1);
    }
}

/* ---- tests --------------------------------------------------------------------------------- */

Test(log, a_full_context_is_written_in_order_with_jansson_escapes)
{
    /* Every byte class that JSON escapes, the ones it does not (/, DEL, multi-byte characters,
     * U+2028), and quotes that would end the string early. */
    const char *tricky = "q\"uo\\te/slash\b\f\n\r\t\x01\x1f\x7f é€😀 \xe2\x80\xa8 end";
    log_context ctx = {.queue = "orders", .biz_key = tricky, .message_id = "m-1",
                       .amqp_message_id = "amqp-1", .correlation_id = "corr \"x\"",
                       .traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                       .trace_id = "0af7651916cd43dd8448eb211c80319c",
                       .span_id = "b7ad6b7169203331", .retries = 3, .outcome = "processed"};
    char *line = one_line(LOG_LEVEL_WARN, &ctx, tricky);
    json_t *object = parse_as_jansson_writes(line);
    char order[512];
    field_order(object, order, sizeof order);
    cr_assert_str_eq(order, "ts,level,msg,queue,biz_key,message_id,amqp_message_id,"
                            "correlation_id,traceparent,trace_id,span_id,retries,outcome");
    cr_assert_str_eq(string_field(object, "level"), "warn");
    cr_assert_str_eq(string_field(object, "msg"), tricky);
    cr_assert_str_eq(string_field(object, "biz_key"), tricky);
    cr_assert_str_eq(string_field(object, "correlation_id"), "corr \"x\"");
    cr_assert_eq(json_integer_value(json_object_get(object, "retries")), 3);
    cr_assert(strstr(line, "\\u0001\\u001F"), "control bytes as jansson writes them: %s", line);
    json_decref(object);
    free(line);
}

Test(log, absent_context_fields_and_negative_retries_are_left_out)
{
    log_context ctx = {.queue = "orders", .retries = -1};
    char *line = one_line(LOG_LEVEL_INFO, &ctx, "consuming");
    json_t *object = parse_as_jansson_writes(line);
    char order[256];
    field_order(object, order, sizeof order);
    cr_assert_str_eq(order, "ts,level,msg,queue");
    json_decref(object);
    free(line);

    line = one_line(LOG_LEVEL_DEBUG, LOG_NO_CONTEXT, "no context");
    object = parse_as_jansson_writes(line);
    field_order(object, order, sizeof order);
    cr_assert_str_eq(order, "ts,level,msg");
    cr_assert_str_eq(string_field(object, "level"), "debug");
    json_decref(object);
    free(line);

    line = one_line(LOG_LEVEL_ERROR, &(log_context){.retries = 0}, "zero retries");
    object = parse_as_jansson_writes(line);
    cr_assert_eq(json_integer_value(json_object_get(object, "retries")), 0, "0 is written");
    cr_assert_str_eq(string_field(object, "level"), "error");
    json_decref(object);
    free(line);
}

Test(log, invalid_utf8_never_reaches_a_line)
{
    /* A biz_key from a body that was not valid UTF-8 (overlong '/', a lone surrogate, a cut
     * sequence): the field is left out, the rest of the line stays. */
    const char *bad_keys[] = {"key-\xc0\xaf", "key-\xed\xa0\x80", "key-\xe2\x82", "\xff"};
    for (size_t i = 0; i < sizeof bad_keys / sizeof *bad_keys; i++) {
        log_context ctx = {.queue = "orders", .biz_key = bad_keys[i], .message_id = "m-2",
                           .retries = 1};
        char *line = one_line(LOG_LEVEL_INFO, &ctx, "bad key");
        json_t *object = parse_as_jansson_writes(line);
        char order[256];
        field_order(object, order, sizeof order);
        cr_assert_str_eq(order, "ts,level,msg,queue,message_id,retries", "key %zu", i);
        json_decref(object);
        free(line);
    }
    /* A message text with such bytes is replaced as a whole. */
    char *line = one_line(LOG_LEVEL_WARN, &(log_context){.queue = "orders", .retries = -1},
                          "body said \xc3(");
    json_t *object = parse_as_jansson_writes(line);
    cr_assert_str_eq(string_field(object, "msg"), "(message not valid UTF-8)");
    cr_assert_str_eq(string_field(object, "queue"), "orders");
    json_decref(object);
    free(line);
}

Test(log, long_and_heavily_escaped_values_outgrow_the_stack_buffer)
{
    /* 3000 control bytes: 18,000 bytes escaped, four times the line's stack buffer. */
    char *controls = malloc(3001);
    memset(controls, '\x02', 3000);
    controls[3000] = '\0';
    char *message = malloc(5001);
    memset(message, 'm', 5000);
    message[5000] = '\0';
    log_context ctx = {.queue = "orders", .biz_key = controls, .retries = -1};
    char *line = one_line(LOG_LEVEL_INFO, &ctx, message);
    json_t *object = parse_as_jansson_writes(line);
    cr_assert_str_eq(string_field(object, "biz_key"), controls);
    /* The message text is cut at 2047 bytes (log_write's format buffer), never the line. */
    cr_assert_eq(strlen(string_field(object, "msg")), 2047);
    json_decref(object);
    free(line);
    free(message);
    free(controls);
}

Test(log, the_timestamp_is_utc_with_milliseconds_and_current)
{
    /* The bounds come from the clock log_write reads. time() is the kernel's coarse clock, which
     * lags it by up to a tick: at a second's boundary a line stamped 09:12:36.003 fell after a
     * time() of 09:12:35 taken after it. */
    struct timeval before_tv, after_tv;
    gettimeofday(&before_tv, NULL);
    char *line = one_line(LOG_LEVEL_INFO, LOG_NO_CONTEXT, "now");
    gettimeofday(&after_tv, NULL);
    time_t before = before_tv.tv_sec;
    time_t after = after_tv.tv_sec;
    json_t *object = parse_as_jansson_writes(line);
    const char *ts = string_field(object, "ts");
    regex_t re;
    cr_assert_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
                         REG_EXTENDED | REG_NOSUB),
                 0);
    cr_assert_eq(regexec(&re, ts, 0, NULL, 0), 0, "ts %s", ts);
    regfree(&re);
    struct tm utc = {0};
    cr_assert_eq(sscanf(ts, "%d-%d-%dT%d:%d:%d", &utc.tm_year, &utc.tm_mon, &utc.tm_mday,
                        &utc.tm_hour, &utc.tm_min, &utc.tm_sec),
                 6);
    utc.tm_year -= 1900;
    utc.tm_mon -= 1;
    time_t at = timegm(&utc);
    cr_assert(at >= before && at <= after, "ts %s is not between %lld and %lld", ts,
              (long long)before, (long long)after);
    json_decref(object);
    free(line);
}

/* ---- threads ------------------------------------------------------------------------------ */

#define WRITERS 4
#define LINES_PER_WRITER 2000

static void write_lines(void *arg)
{
    long writer = (long)(intptr_t)arg;
    /* Long enough that a line takes several copies into stdio's path. */
    char key[600];
    memset(key, 'a' + (int)writer, sizeof key - 1);
    key[sizeof key - 1] = '\0';
    log_context ctx = {.queue = "orders", .biz_key = key, .retries = writer};
    for (int i = 0; i < LINES_PER_WRITER; i++)
        log_write(LOG_LEVEL_INFO, &ctx, "writer %ld line %d", writer, i);
}

Test(log, lines_from_threads_never_interleave)
{
    capture_start();
    uv_thread_t threads[WRITERS];
    for (long w = 0; w < WRITERS; w++)
        cr_assert_eq(uv_thread_create(&threads[w], write_lines, (void *)(intptr_t)w), 0);
    for (int w = 0; w < WRITERS; w++)
        uv_thread_join(&threads[w]);
    size_t count;
    char **lines = capture_lines(&count);
    cr_assert_eq(count, (size_t)WRITERS * LINES_PER_WRITER);
    int next[WRITERS] = {0};
    for (size_t i = 0; i < count; i++) {
        json_t *object = parse_as_jansson_writes(lines[i]);
        long writer = (long)json_integer_value(json_object_get(object, "retries"));
        cr_assert(writer >= 0 && writer < WRITERS);
        char expected[64];
        snprintf(expected, sizeof expected, "writer %ld line %d", writer, next[writer]++);
        cr_assert_str_eq(string_field(object, "msg"), expected, "lost or reordered line");
        cr_assert_eq(strlen(string_field(object, "biz_key")), 599);
        json_decref(object);
    }
    free_lines(lines, count);
}
