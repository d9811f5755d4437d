/*
 * config — loads and validates the YAML configuration file (contract in config.h).
 *
 * Design: the file (at most 1 MiB) is read whole, checked once with libyaml's event parser
 * (syntax errors, nesting depth, aliases, explicit tags, a single document) and then loaded with
 * yaml_parser_load, so every node keeps its line. The document is walked against declarative
 * tables, one per section (redis config.c, tmux options-table.c): each entry gives the key, its
 * type, range, default (written in the file's own syntax and parsed by the same code), an optional
 * environment override, and a help text. Every problem is collected with its line (h2o, tmux
 * cfg.c), sorted by line and printed as "PATH:LINE: message"; the caller gets the negative count.
 * Values a user typed are echoed escaped and clipped; URLs only ever through config_redact_url.
 *
 * Formats: durations are a decimal count with a unit ms, s, m, h or d ("250ms", "30s", "7d"), or
 * a bare count meaning seconds. Sizes are a decimal count with an optional unit B, KB (1000),
 * MB, GB, KiB (1024), MiB or GiB, units case-insensitive ("64KiB", "1MB", "4096").
 *
 * Handlers: `type` (state_machine when absent) picks the table the rest of `handler:` is checked
 * against. A sql handler's statements are parsed here, once: their `:field` placeholders follow
 * the rule in config/sql_template.h (a pure module), statements that would end the transaction
 * are refused, and the rewritten text and parameter list are stored in the config. A plugin's
 * `config:` subtree is converted to JSON text for its init (plain scalars typed as YAML readers
 * expect: null, booleans, integers, reals; quoted scalars stay strings).
 *
 * Thread affinity: main thread only (getenv, strerror); the loaded config is read-only afterwards.
 */
#include "config/config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <jansson.h>
#include <sys/stat.h>
#include <yaml.h>

#include "config/sql_template.h"

/* Limits that keep a hostile or broken file from costing much memory or time. */
#define CONFIG_MAX_FILE_BYTES (1024 * 1024)
#define CONFIG_MAX_DEPTH 32
#define CONFIG_MAX_ERRORS_SHOWN 100
#define CONFIG_MAX_CONSUMERS 256
#define CONFIG_MAX_TRANSITIONS 1024
#define CONFIG_MAX_FROM 256
#define CONFIG_MAX_SET 256
#define CONFIG_MAX_STATEMENTS 64

#define IDENT_MAX 64        /* MySQL identifier length limit */
#define QUEUE_MAX 200       /* leaves room for ".retry.N" / ".dlq" within AMQP's 255 */
#define HANDLER_NAME_MAX 64 /* width of msg_dedup.handler_name */
#define VALUE_MAX 255       /* states, events, field paths */
#define KEY_PATH_MAX 256    /* "consumers[3].handler.transitions.PAY.from" in messages */
#define SHOW_MAX 60         /* bytes of a user value echoed in a message */
#define OPT_TABLE_MAX 16    /* entries in one section table */
#define SQL_TEXT_MAX 65536  /* bytes of one sql handler statement */
#define PLUGIN_PATH_MAX 4096

_Static_assert(sizeof(config_log_level) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(config_declare_mode) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(config_queue_type) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(config_handler_type) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(config_on_illegal) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(config_on_mismatch) == sizeof(int), "enums are stored as int");

/* ------------------------------------------------------------------------------------------ */
/* Error collection                                                                            */

typedef struct load_error {
    unsigned long line; /* 0 when the problem has no line (missing file, environment) */
    size_t seq;         /* report order, to keep the sort stable */
    char *text;
} load_error;

typedef struct load_ctx {
    const char *path;
    yaml_document_t *doc;
    load_error *errors; /* the first CONFIG_MAX_ERRORS_SHOWN problems */
    size_t stored;
    size_t total; /* every problem, including those not stored */
} load_ctx;

static void report(load_ctx *ctx, unsigned long line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report(load_ctx *ctx, unsigned long line, const char *fmt, ...)
{
    char text[768];
    va_list ap;

    ctx->total++;
    if (ctx->stored >= CONFIG_MAX_ERRORS_SHOWN)
        return;
    if (!ctx->errors) {
        ctx->errors = calloc(CONFIG_MAX_ERRORS_SHOWN, sizeof *ctx->errors);
        if (!ctx->errors)
            return; /* still counted; flush_errors says how many were lost */
    }
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ctx->errors[ctx->stored].line = line;
    ctx->errors[ctx->stored].seq = ctx->stored;
    ctx->errors[ctx->stored].text = strdup(text);
    if (ctx->errors[ctx->stored].text)
        ctx->stored++;
}

static int error_cmp(const void *a, const void *b)
{
    const load_error *x = a, *y = b;
    if (x->line != y->line)
        return x->line < y->line ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Prints the collected problems in line order (so they read top to bottom) and frees them. */
static void flush_errors(load_ctx *ctx, FILE *out)
{
    if (ctx->stored > 1)
        qsort(ctx->errors, ctx->stored, sizeof *ctx->errors, error_cmp);
    for (size_t i = 0; i < ctx->stored; i++) {
        if (out && ctx->errors[i].line)
            fprintf(out, "%s:%lu: %s\n", ctx->path, ctx->errors[i].line, ctx->errors[i].text);
        else if (out)
            fprintf(out, "%s: %s\n", ctx->path, ctx->errors[i].text);
        free(ctx->errors[i].text);
    }
    if (out && ctx->total > ctx->stored)
        fprintf(out, "%s: %zu more problems not shown\n", ctx->path, ctx->total - ctx->stored);
    if (out)
        fflush(out);
    free(ctx->errors);
    ctx->errors = NULL;
    ctx->stored = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Small text helpers                                                                          */

/* Copies text for a message with control bytes escaped and the length clipped, so one bad value
 * cannot break the one-problem-per-line format or flood the terminal. Returns buf. */
static const char *show(char *buf, size_t len, const char *text)
{
    size_t o = 0, n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && o + 5 < len; p++, n++) {
        if (n == SHOW_MAX) {
            if (o + 4 < len) {
                memcpy(buf + o, "...", 3);
                o += 3;
            }
            break;
        }
        if (*p < 0x20 || *p == 0x7f || *p == '\'' || *p == '\\')
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
        else
            buf[o++] = (char)*p;
    }
    buf[o] = '\0';
    return buf;
}

static bool has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* "prefix.name", or "name" at the top level. */
static void join_path(char *dst, size_t len, const char *prefix, const char *name)
{
    snprintf(dst, len, "%s%s%s", prefix, *prefix ? "." : "", name);
}

/* Levenshtein distance, capped: anything over 2 is "not a typo" for the suggestion. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[IDENT_MAX + 1];

    if (la > IDENT_MAX || lb > IDENT_MAX || (la > lb ? la - lb : lb - la) > 2)
        return 3;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* ------------------------------------------------------------------------------------------ */
/* Durations and sizes                                                                         */

/* Reads a run of decimal digits; -1 when there is none or it overflows. */
static int parse_count(const char **text, uint64_t *out)
{
    const char *p = *text;
    uint64_t n = 0;

    if (!is_digit(*p))
        return -1;
    for (; is_digit(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (n > (UINT64_MAX - d) / 10)
            return -1;
        n = n * 10 + d;
    }
    *text = p;
    *out = n;
    return 0;
}

int config_parse_duration(const char *text, uint64_t *out_ms)
{
    static const struct {
        const char *unit;
        uint64_t ms;
    } units[] = {
        {"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000},
    };
    const char *p = text;
    uint64_t n;

    if (!text || !out_ms || parse_count(&p, &n) < 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].unit) != 0)
            continue;
        if (n > UINT64_MAX / units[i].ms)
            return -1;
        *out_ms = n * units[i].ms;
        return 0;
    }
    return -1;
}

int config_parse_size(const char *text, size_t *out_bytes)
{
    static const struct {
        const char *unit;
        uint64_t bytes;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"KB", 1000},
        {"MB", 1000 * 1000},
        {"GB", 1000 * 1000 * 1000},
        {"KiB", 1024},
        {"MiB", 1024 * 1024},
        {"GiB", 1024 * 1024 * 1024},
    };
    const char *p = text;
    uint64_t n;

    if (!text || !out_bytes || parse_count(&p, &n) < 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].unit) != 0)
            continue;
        if (n > UINT64_MAX / units[i].bytes || n * units[i].bytes > SIZE_MAX)
            return -1;
        *out_bytes = (size_t)(n * units[i].bytes);
        return 0;
    }
    return -1;
}

static const char *format_duration(char *buf, size_t len, uint64_t ms)
{
    static const struct {
        const char *unit;
        uint64_t ms;
    } units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (ms && ms % units[i].ms == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(ms / units[i].ms), units[i].unit);
            return buf;
        }
    }
    snprintf(buf, len, "%llums", (unsigned long long)ms);
    return buf;
}

static const char *format_size(char *buf, size_t len, uint64_t bytes)
{
    static const struct {
        const char *unit;
        uint64_t bytes;
    } units[] = {{"GiB", 1u << 30}, {"MiB", 1u << 20}, {"KiB", 1u << 10}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (bytes && bytes % units[i].bytes == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(bytes / units[i].bytes),
                     units[i].unit);
            return buf;
        }
    }
    snprintf(buf, len, "%llu", (unsigned long long)bytes);
    return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* URL redaction                                                                               */

typedef struct out_buf {
    char *buf;
    size_t len, pos;
} out_buf;

static void out_put(out_buf *o, const char *s, size_t n)
{
    while (n-- && o->pos + 1 < o->len)
        o->buf[o->pos++] = *s++;
    o->buf[o->pos] = '\0';
}

/* Copies a query string, replacing the value of any password parameter. */
static void put_query_redacted(out_buf *o, const char *q)
{
    while (*q && *q != '#') {
        size_t n = strcspn(q, "&#");
        size_t name = strcspn(q, "=&#");
        if (name < n && (name == 8 && strncasecmp(q, "password", 8) == 0)) {
            out_put(o, q, name + 1);
            out_put(o, "***", 3);
        } else {
            out_put(o, q, n);
        }
        q += n;
        if (*q == '&')
            out_put(o, q++, 1);
    }
    out_put(o, q, strlen(q));
}

void config_redact_url(const char *url, char *buf, size_t buf_len)
{
    out_buf o = {buf, buf_len, 0};
    const char *sep, *start, *at = NULL, *colon, *rest, *query;
    size_t auth_len;

    if (!buf || buf_len == 0)
        return;
    buf[0] = '\0';
    if (!url)
        return;
    sep = strstr(url, "://");
    start = sep ? sep + 3 : url;
    auth_len = strcspn(start, "/?#");
    for (size_t i = 0; i < auth_len; i++)
        if (start[i] == '@')
            at = start + i;
    /* A password holding an unencoded '/', '?' or '#' ends the authority early and hides the
     * real '@' further on. Such URLs do not work anyway, but they must not leak: take the last
     * '@' and redact everything between the first ':' and it. */
    colon = NULL;
    if (at) {
        colon = memchr(start, ':', (size_t)(at - start));
    } else if ((at = strrchr(start, '@')) != NULL) {
        colon = memchr(start, ':', (size_t)(at - start));
        if (!colon)
            at = NULL; /* an '@' in a path or query, not a user:password */
    }
    rest = start;
    if (colon) {
        out_put(&o, url, (size_t)(colon + 1 - url));
        out_put(&o, "***", 3);
        rest = at;
    } else if (at) {
        out_put(&o, url, (size_t)(at - url));
        rest = at;
    } else {
        out_put(&o, url, (size_t)(start - url));
    }
    query = strchr(rest, '?');
    if (!query) {
        out_put(&o, rest, strlen(rest));
        return;
    }
    out_put(&o, rest, (size_t)(query + 1 - rest));
    put_query_redacted(&o, query + 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Value checks for strings. Each returns 0, or -1 with a reason in why (no secrets in it).     */

typedef int (*check_fn)(const char *text, char *why, size_t why_len);

/* Checks "host:port" (host may be "[v6]"); host_required says whether an empty host is wrong. */
static int check_host_port(const char *s, size_t n, bool host_required, bool port_required,
                           bool port_zero_ok,
                           char *why, size_t why_len)
{
    const char *end = s + n, *port = NULL;
    size_t host_len;

    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close) {
            snprintf(why, why_len, "has an unterminated IPv6 address");
            return -1;
        }
        host_len = (size_t)(close + 1 - s);
        if (close + 1 < end) {
            if (close[1] != ':') {
                snprintf(why, why_len, "has text after the IPv6 address");
                return -1;
            }
            port = close + 2;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        host_len = colon ? (size_t)(colon - s) : n;
        port = colon ? colon + 1 : NULL;
    }
    if (host_required && host_len == 0) {
        snprintf(why, why_len, "has no host");
        return -1;
    }
    if (!port && port_required) {
        snprintf(why, why_len, "has no port (expected HOST:PORT)");
        return -1;
    }
    if (port) {
        unsigned long v = 0;
        const char *p = port;
        for (; p < end && is_digit(*p) && v <= 65535; p++)
            v = v * 10 + (unsigned long)(*p - '0');
        if (p == port || p != end || (v == 0 && !port_zero_ok) || v > 65535) {
            snprintf(why, why_len, "has an invalid port (expected %s..65535)",
                     port_zero_ok ? "0" : "1");
            return -1;
        }
    }
    return 0;
}

static int check_url(const char *text, const char *const *schemes, const char *expect,
                     bool socket_ok, char *why, size_t why_len)
{
    char redacted[256], shown[128];
    const char *auth = NULL, *at;
    size_t auth_len, host_off = 0;
    char sub[160];

    config_redact_url(text, redacted, sizeof redacted);
    show(shown, sizeof shown, redacted);
    for (const char *p = text; *p; p++) {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
            snprintf(why, why_len, "'%s' contains spaces or control characters", shown);
            return -1;
        }
    }
    for (size_t i = 0; schemes[i]; i++) {
        size_t n = strlen(schemes[i]);
        if (strncmp(text, schemes[i], n) == 0 && strncmp(text + n, "://", 3) == 0) {
            auth = text + n + 3;
            break;
        }
    }
    if (!auth) {
        snprintf(why, why_len, "'%s' must start with %s", shown, expect);
        return -1;
    }
    auth_len = strcspn(auth, "/?#");
    at = NULL;
    for (size_t i = 0; i < auth_len; i++)
        if (auth[i] == '@')
            at = auth + i;
    if (at)
        host_off = (size_t)(at + 1 - auth);
    if (auth_len == host_off && socket_ok && (strstr(text, "?socket=") || strstr(text, "&socket=")))
        return 0;
    if (check_host_port(auth + host_off, auth_len - host_off, true, false, false, sub,
                        sizeof sub) < 0) {
        snprintf(why, why_len, "'%s' %s", shown, sub);
        return -1;
    }
    return 0;
}

static int check_amqp_url(const char *text, char *why, size_t why_len)
{
    static const char *const schemes[] = {"amqp", "amqps", NULL};
    return check_url(text, schemes, "amqp:// or amqps://", false, why, why_len);
}

static int check_mysql_url(const char *text, char *why, size_t why_len)
{
    static const char *const schemes[] = {"mysql", NULL};
    return check_url(text, schemes, "mysql://", true, why, why_len);
}

static int check_listen(const char *text, char *why, size_t why_len)
{
    char sub[128], shown[128];
    /* Port 0 asks the kernel for a free port (logged at start): tests run several daemons. */
    if (check_host_port(text, strlen(text), true, true, true, sub, sizeof sub) < 0 ||
        has_control(text)) {
        snprintf(why, why_len, "'%s' is not a listen address: %s", show(shown, sizeof shown, text),
                 has_control(text) ? "contains control characters" : sub);
        return -1;
    }
    return 0;
}

/* A bounded, printable name: the common rule for states, events and similar values. */
static int check_bounded(const char *text, size_t max, const char *what, char *why, size_t why_len)
{
    size_t n = strlen(text);
    char shown[128];
    if (n == 0) {
        snprintf(why, why_len, "%s must not be empty", what);
        return -1;
    }
    if (n > max) {
        snprintf(why, why_len, "%s is %zu bytes long; at most %zu are allowed", what, n, max);
        return -1;
    }
    if (has_control(text)) {
        snprintf(why, why_len, "%s '%s' contains control characters", what,
                 show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

static int check_queue(const char *text, char *why, size_t why_len)
{
    size_t n = strlen(text);
    if (n > QUEUE_MAX) {
        snprintf(why, why_len,
                 "queue name is %zu bytes long; at most %d are allowed (the retry and dead-letter "
                 "queues append suffixes to it)",
                 n, QUEUE_MAX);
        return -1;
    }
    if (check_bounded(text, QUEUE_MAX, "queue name", why, why_len) < 0)
        return -1;
    if (strncmp(text, "amq.", 4) == 0) {
        snprintf(why, why_len, "queue names starting with 'amq.' are reserved by RabbitMQ");
        return -1;
    }
    return 0;
}

static int check_handler_name(const char *text, char *why, size_t why_len)
{
    size_t n = strlen(text);
    if (n > HANDLER_NAME_MAX) {
        snprintf(why, why_len,
                 "handler_name is %zu bytes long; at most %d are allowed (it is stored in "
                 "msg_dedup.handler_name)",
                 n, HANDLER_NAME_MAX);
        return -1;
    }
    return check_bounded(text, HANDLER_NAME_MAX, "handler_name", why, why_len);
}

/* SQL identifiers are pasted into statements (inside backticks), so only a strict alphabet. */
static int check_ident(const char *text, char *why, size_t why_len)
{
    size_t n = strlen(text);
    bool ok = n >= 1 && n <= IDENT_MAX;
    char shown[128];
    for (const char *p = text; ok && *p; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || is_digit(*p) || *p == '_' ||
             *p == '$';
    if (ok)
        return 0;
    snprintf(why, why_len,
             "'%s' is not a valid SQL identifier: use 1 to %d characters from A-Z a-z 0-9 _ $",
             show(shown, sizeof shown, text), IDENT_MAX);
    return -1;
}

static int check_state(const char *text, char *why, size_t why_len)
{
    return check_bounded(text, VALUE_MAX, "state", why, why_len);
}

static int check_event(const char *text, char *why, size_t why_len)
{
    return check_bounded(text, VALUE_MAX, "event name", why, why_len);
}

/* A message field, possibly a dotted path into nested maps ("payment.amount"). */
static int check_field(const char *text, char *why, size_t why_len)
{
    char shown[128];
    if (check_bounded(text, VALUE_MAX, "field path", why, why_len) < 0)
        return -1;
    if (text[0] == '.' || text[strlen(text) - 1] == '.' || strstr(text, "..")) {
        snprintf(why, why_len, "field path '%s' has an empty segment",
                 show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

/* The text of a sql handler statement. Newlines and tabs are fine (YAML block scalars); the
 * placeholders are parsed afterwards by parse_statements. */
static int check_sql(const char *text, char *why, size_t why_len)
{
    size_t n = strlen(text);
    bool blank = true;
    for (const char *p = text; *p && blank; p++)
        blank = *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r';
    if (blank) {
        snprintf(why, why_len, "the statement is empty");
        return -1;
    }
    if (n > SQL_TEXT_MAX) {
        snprintf(why, why_len, "the statement is %zu bytes long; at most %d are allowed", n,
                 SQL_TEXT_MAX);
        return -1;
    }
    return 0;
}

/* A plugin is loaded by absolute path only: a relative one would depend on the working directory
 * and a bare name on the dynamic loader's search path. */
static int check_plugin_path(const char *text, char *why, size_t why_len)
{
    char shown[128];
    if (check_bounded(text, PLUGIN_PATH_MAX, "plugin path", why, why_len) < 0)
        return -1;
    if (text[0] != '/') {
        snprintf(why, why_len, "plugin path '%s' must be absolute (start with /)",
                 show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Option tables                                                                               */

typedef struct opt opt;
typedef void (*parse_fn)(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                         const char *path);

typedef enum opt_type {
    OPT_END = 0,
    OPT_UINT,     /* unsigned; a plain decimal integer */
    OPT_DURATION, /* uint64_t milliseconds */
    OPT_SIZE,     /* size_t bytes */
    OPT_ENUM,     /* an enum (int-sized); index into names */
    OPT_STRING,   /* char *, validated by check */
    OPT_SECTION,  /* a nested mapping; its entries use the same base struct */
    OPT_CUSTOM,   /* parsed by parse */
} opt_type;

enum {
    OPT_REQUIRED = 1u << 0,
    OPT_WHOLE_SECONDS = 1u << 1, /* a duration the protocol carries in seconds */
};

struct opt {
    const char *name;
    opt_type type;
    unsigned flags;
    size_t offset;            /* into the struct the table describes */
    uint64_t min, max;        /* OPT_UINT, OPT_DURATION (ms), OPT_SIZE (bytes) */
    const char *def;          /* default, in the file's syntax; NULL for none */
    const char *env;          /* environment variable that overrides the value */
    const char *const *names; /* OPT_ENUM, NULL-terminated, index = enum value */
    const opt *section;       /* OPT_SECTION */
    check_fn check;           /* OPT_STRING */
    parse_fn parse;           /* OPT_CUSTOM */
    const char *help;
};

static void parse_consumers(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path);
static void parse_handler(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                          const char *path);
static void parse_handler_type(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                               const char *path);
static void parse_transitions(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                              const char *path);
static void parse_from(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                       const char *path);
static void parse_set(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base, const char *path);
static void parse_statements(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                             const char *path);
static void parse_plugin_config(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                                const char *path);

/* The tables are laid out by hand, one entry per paragraph, to read like a reference. */
/* clang-format off */
#define SECONDS(n) ((uint64_t)(n) * 1000)
#define DAYS(n) ((uint64_t)(n) * 86400000)

static const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const declare_names[] = {"create", "passive", NULL};
static const char *const queue_type_names[] = {"quorum", "classic", NULL};
static const char *const handler_type_names[] = {"state_machine", "sql", "plugin", NULL};
static const char *const on_illegal_names[] = {"dead_letter", "retry", NULL};
static const char *const on_mismatch_names[] = {"dead_letter", "retry", NULL};

static const opt amqp_table[] = {
    {.name = "url", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config, amqp_url), .env = "IDEMQ_AMQP_URL", .check = check_amqp_url,
     .help = "broker URL, amqp[s]://user:password@host:port/vhost"},
    {.name = "prefetch", .type = OPT_UINT, .offset = offsetof(config, prefetch), .min = 1,
     .max = 65535, .def = "64", .help = "deliveries in flight before an ack (basic.qos)"},
    {.name = "heartbeat", .type = OPT_DURATION, .flags = OPT_WHOLE_SECONDS,
     .offset = offsetof(config, heartbeat_ms), .min = 0, .max = SECONDS(3600), .def = "30s",
     .help = "AMQP heartbeat interval; 0 turns heartbeats off"},
    {.name = "max_body", .type = OPT_SIZE, .offset = offsetof(config, max_body), .min = 1024,
     .max = 64u << 20, .def = "1MiB", .help = "largest message body accepted"},
    {0},
};

static const opt mysql_table[] = {
    {.name = "url", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config, mysql_url), .env = "IDEMQ_MYSQL_URL", .check = check_mysql_url,
     .help = "database URL, mysql://user:password@host:port/db[?socket=/path]"},
    {.name = "workers", .type = OPT_UINT, .offset = offsetof(config, workers), .min = 1,
     .max = 256, .def = "4", .help = "database worker threads, one connection each"},
    {0},
};

static const opt log_table[] = {
    {.name = "level", .type = OPT_ENUM, .offset = offsetof(config, log_level),
     .names = log_level_names, .def = "info", .help = "lowest level written"},
    {0},
};

static const opt http_table[] = {
    {.name = "listen", .type = OPT_STRING, .offset = offsetof(config, http_listen),
     .check = check_listen, .def = "127.0.0.1:9464",
     .help = "HOST:PORT of /metrics, /healthz and /readyz"},
    {0},
};

/* Retention below 1h is accepted (tests use seconds) but logged as a warning at startup: a row
 * must outlive any redelivery or replay of its message, or that copy is applied again. */
static const opt dedup_table[] = {
    {.name = "retention", .type = OPT_DURATION, .flags = OPT_WHOLE_SECONDS,
     .offset = offsetof(config, dedup.retention_ms), .min = 0, .max = DAYS(3650), .def = "0",
     .help = "age after which msg_dedup rows are deleted; 0 keeps them forever"},
    {.name = "interval", .type = OPT_DURATION, .offset = offsetof(config, dedup.interval_ms),
     .min = SECONDS(1), .max = DAYS(1), .def = "1m", .help = "time between retention sweeps"},
    {.name = "batch", .type = OPT_UINT, .offset = offsetof(config, dedup.batch), .min = 1,
     .max = 100000, .def = "1000", .help = "rows deleted per statement (one commit each)"},
    {0},
};

static const opt top_table[] = {
    {.name = "amqp", .type = OPT_SECTION, .section = amqp_table, .help = "RabbitMQ connection"},
    {.name = "mysql", .type = OPT_SECTION, .section = mysql_table, .help = "MySQL connection"},
    {.name = "log", .type = OPT_SECTION, .section = log_table, .help = "logging"},
    {.name = "http", .type = OPT_SECTION, .section = http_table, .help = "ops endpoint"},
    {.name = "shutdown_timeout", .type = OPT_DURATION,
     .offset = offsetof(config, shutdown_timeout_ms), .min = 0, .max = SECONDS(3600),
     .def = "25s", .help = "time to finish in-flight work after SIGTERM"},
    {.name = "consumers", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_consumers,
     .help = "a list of queues to consume, each with its handler"},
    {.name = "dedup", .type = OPT_SECTION, .section = dedup_table,
     .help = "retention of msg_dedup rows"},
    {0},
};

static const opt retry_table[] = {
    {.name = "max_retries", .type = OPT_UINT, .offset = offsetof(config_consumer, retry.max_retries),
     .min = 0, .max = 32, .def = "6", .help = "retries before dead-lettering"},
    {.name = "base", .type = OPT_DURATION, .offset = offsetof(config_consumer, retry.base_ms),
     .min = 1, .max = DAYS(7), .def = "1s", .help = "delay of the first retry; doubles each time"},
    {.name = "jitter", .type = OPT_DURATION, .offset = offsetof(config_consumer, retry.jitter_ms),
     .min = 0, .max = DAYS(1), .def = "1s", .help = "random extra delay, 0 to jitter"},
    {.name = "max_delay", .type = OPT_DURATION,
     .offset = offsetof(config_consumer, retry.max_delay_ms), .min = 1, .max = DAYS(7),
     .def = "1h", .help = "cap on the doubling delay"},
    {0},
};

static const opt consumer_table[] = {
    {.name = "queue", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_consumer, queue), .check = check_queue,
     .help = "the work queue to consume"},
    {.name = "handler_name", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_consumer, handler_name), .check = check_handler_name,
     .help = "dedup namespace, stored with every processed biz_key"},
    {.name = "declare", .type = OPT_ENUM, .offset = offsetof(config_consumer, declare),
     .names = declare_names, .def = "create", .help = "declare the work queue or only check it"},
    {.name = "queue_type", .type = OPT_ENUM, .offset = offsetof(config_consumer, queue_type),
     .names = queue_type_names, .def = "quorum", .help = "type of the retry and dead-letter queues"},
    {.name = "retry", .type = OPT_SECTION, .section = retry_table, .help = "retry schedule"},
    {.name = "handler", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_handler,
     .help = "what to do with each message: type state_machine, sql or plugin"},
    {0},
};

/* Entries of a state_machine handler; the base struct is config_handler. */
static const opt state_machine_table[] = {
    {.name = "type", .type = OPT_CUSTOM, .parse = parse_handler_type, .help = "handler type"},
    {.name = "table", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, state_machine.table), .check = check_ident,
     .help = "table holding the business rows"},
    {.name = "key_column", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, state_machine.key_column), .check = check_ident,
     .help = "column identifying the row"},
    {.name = "key_field", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, state_machine.key_field), .check = check_field,
     .help = "message field holding the row's key"},
    {.name = "state_column", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, state_machine.state_column), .check = check_ident,
     .help = "column holding the state"},
    {.name = "event_field", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, state_machine.event_field), .check = check_field,
     .help = "message field naming the event"},
    {.name = "on_illegal", .type = OPT_ENUM,
     .offset = offsetof(config_handler, state_machine.on_illegal), .names = on_illegal_names,
     .def = "dead_letter", .help = "what an illegal transition does"},
    {.name = "transitions", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_transitions,
     .help = "EVENT: {from: [STATE, ...], to: STATE}"},
    {.name = "set", .type = OPT_CUSTOM, .parse = parse_set,
     .help = "column: field pairs written with the transition"},
    {0},
};

/* Entries of one transition; the base struct is config_transition. */
static const opt transition_table[] = {
    {.name = "from", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_from,
     .help = "states the event may move from, e.g. [PAYING]"},
    {.name = "to", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_transition, to), .check = check_state,
     .help = "state the event moves to"},
    {0},
};

/* Entries of a sql handler; the base struct is config_handler. */
static const opt sql_table[] = {
    {.name = "type", .type = OPT_CUSTOM, .parse = parse_handler_type, .help = "handler type"},
    {.name = "statements", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_statements,
     .help = "a list of {sql: \"... :field ...\", expect_rows: N}, run in order"},
    {.name = "on_mismatch", .type = OPT_ENUM, .offset = offsetof(config_handler, sql.on_mismatch),
     .names = on_mismatch_names, .def = "dead_letter",
     .help = "what a row count other than expect_rows does"},
    {0},
};

/* One statement of a sql handler; the base struct is config_sql_statement. */
static const opt statement_table[] = {
    {.name = "sql", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_sql_statement, sql), .check = check_sql,
     .help = "the statement, with :field placeholders bound from the message"},
    {.name = "expect_rows", .type = OPT_UINT, .offset = offsetof(config_sql_statement, expect_rows),
     .min = 0, .max = 4294967295u,
     .help = "rows the statement must match (UPDATE/DELETE), insert or return (SELECT)"},
    {0},
};

/* Entries of a plugin handler; the base struct is config_handler. */
static const opt plugin_table[] = {
    {.name = "type", .type = OPT_CUSTOM, .parse = parse_handler_type, .help = "handler type"},
    {.name = "path", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, plugin.path), .check = check_plugin_path,
     .help = "absolute path of the plugin's shared object"},
    {.name = "config", .type = OPT_CUSTOM, .parse = parse_plugin_config,
     .help = "any YAML; passed to the plugin's init as JSON text"},
    {0},
};

/* Handler types and the table that describes each. */
static const struct handler_kind {
    config_handler_type type;
    const opt *table;
} handler_kinds[] = {
    {CONFIG_HANDLER_STATE_MACHINE, state_machine_table},
    {CONFIG_HANDLER_SQL, sql_table},
    {CONFIG_HANDLER_PLUGIN, plugin_table},
};

/* clang-format on */

/* ------------------------------------------------------------------------------------------ */
/* Document helpers                                                                            */

static unsigned long node_line(const yaml_node_t *node)
{
    return node ? (unsigned long)node->start_mark.line + 1 : 0;
}

static const char *scalar_text(const yaml_node_t *node)
{
    return (const char *)node->data.scalar.value;
}

static bool is_null(const yaml_node_t *node)
{
    const char *s;
    if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    s = scalar_text(node);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static bool looks_numeric(const char *s)
{
    if (*s == '-' || *s == '+')
        s++;
    if (!is_digit(*s) && !(*s == '.' && is_digit(s[1])))
        return false;
    for (; *s; s++)
        if (!is_digit(*s) && *s != '.' && *s != 'e' && *s != 'E' && *s != '-' && *s != '+')
            return false;
    return true;
}

static const char *node_kind(const yaml_node_t *node)
{
    switch (node->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_SCALAR_NODE:
        if (is_null(node))
            return "no value";
        if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
            return "a quoted string";
        return looks_numeric(scalar_text(node)) ? "a number" : "a string";
    default:
        return "nothing";
    }
}

static yaml_node_t *get_node(load_ctx *ctx, int index)
{
    return yaml_document_get_node(ctx->doc, index);
}

/* Returns the value of the first pair whose key is the scalar name, or NULL. */
static yaml_node_t *mapping_get(load_ctx *ctx, const yaml_node_t *map, const char *name)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *key = get_node(ctx, p->key);
        if (key && key->type == YAML_SCALAR_NODE && !strcmp(scalar_text(key), name))
            return get_node(ctx, p->value);
    }
    return NULL;
}

/*
 * Returns the text of a scalar that must hold a real string (a key, a name, a value), or NULL
 * after reporting why not. what names the thing in the message.
 */
static const char *want_string(load_ctx *ctx, const yaml_node_t *node, const char *path,
                               const char *what)
{
    if (node->type != YAML_SCALAR_NODE || is_null(node)) {
        report(ctx, node_line(node), "%s: expected %s, got %s", path, what, node_kind(node));
        return NULL;
    }
    /* A "\0" escape would silently cut the C string short; refuse it instead. */
    if (strlen(scalar_text(node)) != node->data.scalar.length) {
        report(ctx, node_line(node), "%s: contains a NUL byte", path);
        return NULL;
    }
    return scalar_text(node);
}

/* ------------------------------------------------------------------------------------------ */
/* Setting values                                                                              */

static void *field_at(void *base, size_t offset)
{
    return (char *)base + offset;
}

/* Parses a plain integer, allowing a sign so "-1" gets a range message rather than a type one. */
static int parse_int(const char *text, bool *negative, uint64_t *out)
{
    const char *p = text;
    *negative = *p == '-';
    if (*p == '-' || *p == '+')
        p++;
    if (parse_count(&p, out) < 0)
        return is_digit(*p) ? -2 : -1; /* -2: digits, but too many */
    return *p ? -1 : 0;
}

/* "a, b, c" for an enum's allowed words. */
static const char *enum_list(const opt *o, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; o->names[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", o->names[i]);
    return buf;
}

/* What a value of o's type looks like, for "expected ..." messages. */
static const char *type_name(const opt *o, char *buf, size_t len)
{
    switch (o->type) {
    case OPT_UINT:
        return "an integer";
    case OPT_DURATION:
        return "a duration such as 250ms, 30s, 5m, 2h or 7d";
    case OPT_SIZE:
        return "a size such as 512, 64KiB or 1MiB";
    case OPT_ENUM:
        snprintf(buf, len, "one of: ");
        enum_list(o, buf + strlen(buf), len - strlen(buf));
        return buf;
    case OPT_STRING:
        return "a string";
    case OPT_SECTION:
        return "a mapping";
    default:
        return "a value";
    }
}

/*
 * Parses text as o's type and stores it at base + o->offset. The same code handles defaults,
 * file values and environment values. Returns 0, or -1 with the reason in why.
 */
static int opt_set(const opt *o, const char *text, void *base, char *why, size_t why_len)
{
    void *dst = field_at(base, o->offset);
    char shown[128], lo[32], hi[32];
    uint64_t v = 0;
    size_t size = 0;
    bool negative;
    int rc;

    switch (o->type) {
    case OPT_UINT:
        rc = parse_int(text, &negative, &v);
        if (rc == -1) {
            snprintf(why, why_len, "expected an integer, got '%s'",
                     show(shown, sizeof shown, text));
            return -1;
        }
        if (rc == -2 || negative || v < o->min || v > o->max) {
            snprintf(why, why_len, "must be between %llu and %llu, got %s (%s)",
                     (unsigned long long)o->min, (unsigned long long)o->max,
                     show(shown, sizeof shown, text), o->help);
            return -1;
        }
        *(unsigned *)dst = (unsigned)v;
        return 0;
    case OPT_DURATION:
        if (config_parse_duration(text, &v) < 0) {
            snprintf(why, why_len,
                     "'%s' is not a valid duration (use a whole number with ms, s, m, h or d, "
                     "e.g. 250ms, 30s, 5m; a bare number means seconds)",
                     show(shown, sizeof shown, text));
            return -1;
        }
        if (v < o->min || v > o->max) {
            snprintf(why, why_len, "must be between %s and %s, got %s (%s)",
                     format_duration(lo, sizeof lo, o->min), format_duration(hi, sizeof hi, o->max),
                     show(shown, sizeof shown, text), o->help);
            return -1;
        }
        if ((o->flags & OPT_WHOLE_SECONDS) && v % 1000) {
            snprintf(why, why_len, "must be whole seconds, got %s",
                     show(shown, sizeof shown, text));
            return -1;
        }
        *(uint64_t *)dst = v;
        return 0;
    case OPT_SIZE:
        if (config_parse_size(text, &size) < 0) {
            snprintf(why, why_len,
                     "'%s' is not a valid size (use a whole number with an optional unit B, KB, "
                     "MB, GB, KiB, MiB or GiB, e.g. 64KiB)",
                     show(shown, sizeof shown, text));
            return -1;
        }
        if (size < o->min || size > o->max) {
            snprintf(why, why_len, "must be between %s and %s, got %s (%s)",
                     format_size(lo, sizeof lo, o->min), format_size(hi, sizeof hi, o->max),
                     show(shown, sizeof shown, text), o->help);
            return -1;
        }
        *(size_t *)dst = size;
        return 0;
    case OPT_ENUM:
        for (int i = 0; o->names[i]; i++) {
            if (!strcmp(text, o->names[i])) {
                memcpy(dst, &i, sizeof i);
                return 0;
            }
        }
        {
            char list[256];
            snprintf(why, why_len, "'%s' is not one of: %s", show(shown, sizeof shown, text),
                     enum_list(o, list, sizeof list));
        }
        return -1;
    case OPT_STRING: {
        char *copy;
        if (o->check && o->check(text, why, why_len) < 0)
            return -1;
        copy = strdup(text);
        if (!copy) {
            snprintf(why, why_len, "out of memory");
            return -1;
        }
        free(*(char **)dst);
        *(char **)dst = copy;
        return 0;
    }
    default:
        snprintf(why, why_len, "internal error: option %s has no scalar type", o->name);
        return -1;
    }
}

static void apply_defaults(load_ctx *ctx, const opt *table, void *base)
{
    char why[512];
    for (const opt *o = table; o->type != OPT_END; o++) {
        if (o->type == OPT_SECTION)
            apply_defaults(ctx, o->section, base);
        else if (o->def && opt_set(o, o->def, base, why, sizeof why) < 0)
            report(ctx, 0, "internal error: the default of %s is invalid: %s", o->name, why);
    }
}

static void walk_table(load_ctx *ctx, const opt *table, yaml_node_t *node, void *base,
                       const char *path, unsigned long line);

/* Applies one key's value node. */
static void apply_node(load_ctx *ctx, const opt *o, yaml_node_t *value, void *base,
                       const char *path, unsigned long key_line)
{
    char why[512], expect[256];
    const char *text;

    switch (o->type) {
    case OPT_SECTION:
        walk_table(ctx, o->section, value, base, path, key_line);
        return;
    case OPT_CUSTOM:
        o->parse(ctx, o, value, base, path);
        return;
    default:
        break;
    }
    if (value->type == YAML_SCALAR_NODE && is_null(value)) {
        report(ctx, node_line(value), "%s: no value given (expected %s%s)", path,
               type_name(o, expect, sizeof expect),
               o->flags & OPT_REQUIRED ? "" : "; remove the key to use the default");
        return;
    }
    text = want_string(ctx, value, path, type_name(o, expect, sizeof expect));
    if (!text)
        return;
    if (o->type == OPT_UINT && value->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        report(ctx, node_line(value), "%s: expected an integer, got a quoted string", path);
        return;
    }
    if (opt_set(o, text, base, why, sizeof why) < 0)
        report(ctx, node_line(value), "%s: %s", path, why);
}

static void report_unknown(load_ctx *ctx, const opt *table, const yaml_node_t *key,
                           const char *path, const char *name)
{
    char shown[128], full[KEY_PATH_MAX], known[256] = "";
    const opt *best = NULL;
    size_t best_d = 3, n = 0;

    for (const opt *o = table; o->type != OPT_END; o++) {
        size_t d = edit_distance(name, o->name);
        if (d < best_d) {
            best = o;
            best_d = d;
        }
        if (n < sizeof known)
            n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", o == table ? "" : ", ",
                                  o->name);
    }
    join_path(full, sizeof full, path, show(shown, sizeof shown, name));
    if (best) {
        char sugg[KEY_PATH_MAX];
        join_path(sugg, sizeof sugg, path, best->name);
        report(ctx, node_line(key), "unknown key '%s' (did you mean '%s'?)", full, sugg);
    } else {
        report(ctx, node_line(key), "unknown key '%s' (known keys%s%s: %s)", full,
               *path ? " in " : "", path, known);
    }
}

/*
 * Walks one mapping against table. node may be NULL (the section is absent): then only missing
 * required keys and environment overrides are handled, reported at line (the parent's).
 */
static void walk_table(load_ctx *ctx, const opt *table, yaml_node_t *node, void *base,
                       const char *path, unsigned long line)
{
    unsigned long seen[OPT_TABLE_MAX] = {0}; /* line where each key first appeared */
    char full[KEY_PATH_MAX], why[512];
    size_t count = 0;

    while (table[count].type != OPT_END)
        count++;
    if (count > OPT_TABLE_MAX) {
        report(ctx, line, "internal error: option table for '%s' is too large", path);
        return;
    }
    if (node) {
        if (node->type != YAML_MAPPING_NODE) {
            report(ctx, node_line(node), "%s: expected a mapping, got %s", *path ? path : "file",
                   node_kind(node));
            return;
        }
        line = node_line(node);
        for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top;
             p++) {
            yaml_node_t *key = get_node(ctx, p->key), *value = get_node(ctx, p->value);
            const char *name;
            size_t i;

            if (!key || !value)
                continue;
            name = want_string(ctx, key, *path ? path : "file", "a key name");
            if (!name)
                continue;
            for (i = 0; i < count && strcmp(table[i].name, name); i++)
                ;
            if (i == count) {
                report_unknown(ctx, table, key, path, name);
                continue;
            }
            join_path(full, sizeof full, path, table[i].name);
            if (seen[i]) {
                report(ctx, node_line(key), "%s: duplicate key (first given at line %lu)", full,
                       seen[i]);
                continue;
            }
            seen[i] = node_line(key);
            apply_node(ctx, &table[i], value, base, full, node_line(key));
        }
    }
    for (size_t i = 0; i < count; i++) {
        const opt *o = &table[i];
        const char *env = o->env ? getenv(o->env) : NULL;

        if (env && !*env)
            env = NULL; /* an empty variable means "not set", as in most daemons */
        join_path(full, sizeof full, path, o->name);
        if (!seen[i] && o->type == OPT_SECTION)
            walk_table(ctx, o->section, NULL, base, full, line);
        else if (!seen[i] && (o->flags & OPT_REQUIRED) && !env)
            report(ctx, line, "missing required key '%s' (%s%s%s)", full, o->help,
                   o->env ? "; or set " : "", o->env ? o->env : "");
        if (env && opt_set(o, env, base, why, sizeof why) < 0)
            report(ctx, 0, "%s (overrides %s): %s", o->env, full, why);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Custom parsers                                                                              */

static bool want_mapping(load_ctx *ctx, const yaml_node_t *node, const char *path, const char *what)
{
    if (node->type == YAML_MAPPING_NODE)
        return true;
    report(ctx, node_line(node), "%s: expected %s, got %s", path, what, node_kind(node));
    return false;
}

static size_t pair_count(const yaml_node_t *map)
{
    return (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
}

/* Owned copy of a checked string, or NULL after reporting. */
static char *take_string(load_ctx *ctx, const yaml_node_t *node, const char *path, const char *what,
                         check_fn check)
{
    char why[512];
    const char *text = want_string(ctx, node, path, what);
    char *copy;

    if (!text)
        return NULL;
    if (check && check(text, why, sizeof why) < 0) {
        report(ctx, node_line(node), "%s: %s", path, why);
        return NULL;
    }
    copy = strdup(text);
    if (!copy)
        report(ctx, node_line(node), "%s: out of memory", path);
    return copy;
}

static void parse_consumers(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path)
{
    config *cfg = base;
    size_t n;
    char cpath[KEY_PATH_MAX];
    (void)o;

    if (node->type != YAML_SEQUENCE_NODE) {
        report(ctx, node_line(node), "%s: expected a list of consumers, got %s", path,
               node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0) {
        report(ctx, node_line(node), "%s: the list is empty; configure at least one consumer",
               path);
        return;
    }
    if (n > CONFIG_MAX_CONSUMERS) {
        report(ctx, node_line(node), "%s: %zu consumers; at most %d are supported", path, n,
               CONFIG_MAX_CONSUMERS);
        return;
    }
    cfg->consumers = calloc(n, sizeof *cfg->consumers);
    if (!cfg->consumers) {
        report(ctx, node_line(node), "%s: out of memory", path);
        return;
    }
    cfg->consumer_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = get_node(ctx, node->data.sequence.items.start[i]);
        config_consumer *c = &cfg->consumers[i];

        snprintf(cpath, sizeof cpath, "%s[%zu]", path, i);
        apply_defaults(ctx, consumer_table, c);
        if (!item)
            continue;
        walk_table(ctx, consumer_table, item, c, cpath, node_line(item));
        if (c->retry.base_ms > c->retry.max_delay_ms) {
            yaml_node_t *retry = mapping_get(ctx, item, "retry");
            char b[32], m[32];
            report(ctx, node_line(retry ? retry : item),
                   "%s.retry: base (%s) is larger than max_delay (%s); every retry would wait "
                   "max_delay",
                   cpath, format_duration(b, sizeof b, c->retry.base_ms),
                   format_duration(m, sizeof m, c->retry.max_delay_ms));
        }
    }
    /* Cross-consumer checks: a queue consumed twice, or a queue that is another consumer's retry
     * or dead-letter queue, would make the topology fight itself. */
    for (size_t j = 0; j < n; j++) {
        const char *qj = cfg->consumers[j].queue;
        yaml_node_t *item = get_node(ctx, node->data.sequence.items.start[j]);
        yaml_node_t *qnode = mapping_get(ctx, item, "queue");
        char shown[128];

        if (!qj)
            continue;
        for (size_t i = 0; i < n; i++) {
            const char *qi = cfg->consumers[i].queue, *suffix;
            size_t li;
            if (i == j || !qi)
                continue;
            if (i < j && !strcmp(qi, qj)) {
                report(ctx, node_line(qnode ? qnode : item),
                       "%s[%zu].queue: queue '%s' is already consumed by %s[%zu]", path, j,
                       show(shown, sizeof shown, qj), path, i);
                break;
            }
            li = strlen(qi);
            if (strncmp(qj, qi, li) != 0 || qj[li] != '.')
                continue;
            suffix = qj + li + 1;
            if (!strcmp(suffix, "dlq")) {
                report(ctx, node_line(qnode ? qnode : item),
                       "%s[%zu].queue: '%s' is the dead-letter queue of %s[%zu]", path, j,
                       show(shown, sizeof shown, qj), path, i);
                break;
            }
            if (!strncmp(suffix, "retry.", 6)) {
                const char *p = suffix + 6;
                uint64_t level;
                if (parse_count(&p, &level) == 0 && !*p && level >= 1 &&
                    level <= cfg->consumers[i].retry.max_retries) {
                    report(ctx, node_line(qnode ? qnode : item),
                           "%s[%zu].queue: '%s' is a retry queue of %s[%zu]", path, j,
                           show(shown, sizeof shown, qj), path, i);
                    break;
                }
            }
        }
    }
}

/* The type key is read by parse_handler before the walk; the walk only has to accept it. */
static void parse_handler_type(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                               const char *path)
{
    (void)ctx, (void)o, (void)node, (void)base, (void)path;
}

static void parse_handler(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                          const char *path)
{
    static const opt type_opt = {.name = "type",
                                 .type = OPT_ENUM,
                                 .offset = offsetof(config_handler, type),
                                 .names = handler_type_names,
                                 .help = "handler type"};
    config_handler *h = &((config_consumer *)base)->handler;
    config_state_machine *sm = &h->state_machine;
    yaml_node_t *type;
    const opt *table = NULL;
    char tpath[KEY_PATH_MAX];
    size_t before = ctx->total;
    (void)o;

    if (!want_mapping(ctx, node, path,
                      "a mapping with type: state_machine, sql or plugin and its settings"))
        return;
    type = mapping_get(ctx, node, "type");
    if (type) {
        /* An unknown type says nothing about which other keys belong: stop at one error. */
        join_path(tpath, sizeof tpath, path, "type");
        apply_node(ctx, &type_opt, type, h, tpath, node_line(type));
        if (ctx->total > before)
            return;
    }
    for (size_t i = 0; i < sizeof handler_kinds / sizeof handler_kinds[0]; i++)
        if (handler_kinds[i].type == h->type)
            table = handler_kinds[i].table;
    if (!table) {
        report(ctx, node_line(node), "internal error: no table for handler type %d", h->type);
        return;
    }
    apply_defaults(ctx, table, h);
    walk_table(ctx, table, node, h, path, node_line(node));
    if (h->type == CONFIG_HANDLER_PLUGIN && !h->plugin.config_json &&
        !(h->plugin.config_json = strdup("{}")))
        report(ctx, node_line(node), "%s: out of memory", path);

    /* The UPDATE writes the state column and the set columns and filters on the key column:
     * any overlap would make the statement ambiguous. */
    if (sm->key_column && sm->state_column && !strcmp(sm->key_column, sm->state_column)) {
        yaml_node_t *n = mapping_get(ctx, node, "state_column");
        report(ctx, node_line(n ? n : node), "%s.state_column: must differ from key_column", path);
    }
    for (size_t i = 0; i < sm->set_count; i++) {
        const char *col = sm->set[i].column;
        yaml_node_t *n = mapping_get(ctx, node, "set");
        if (!col)
            continue;
        if ((sm->key_column && !strcmp(col, sm->key_column)) ||
            (sm->state_column && !strcmp(col, sm->state_column)))
            report(ctx, node_line(n ? n : node),
                   "%s.set: column '%s' is the key or state column; it cannot be set", path, col);
    }
}

static void parse_transitions(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                              const char *path)
{
    config_state_machine *sm = &((config_handler *)base)->state_machine;
    size_t n;
    (void)o;

    if (!want_mapping(ctx, node, path, "a mapping of EVENT: {from: [STATE, ...], to: STATE}"))
        return;
    n = pair_count(node);
    if (n == 0) {
        report(ctx, node_line(node),
               "%s: no transitions; list at least one EVENT: {from: [STATE, ...], to: STATE}",
               path);
        return;
    }
    if (n > CONFIG_MAX_TRANSITIONS) {
        report(ctx, node_line(node), "%s: %zu transitions; at most %d are supported", path, n,
               CONFIG_MAX_TRANSITIONS);
        return;
    }
    sm->transitions = calloc(n, sizeof *sm->transitions);
    if (!sm->transitions) {
        report(ctx, node_line(node), "%s: out of memory", path);
        return;
    }
    sm->transition_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &node->data.mapping.pairs.start[i];
        yaml_node_t *key = get_node(ctx, p->key), *value = get_node(ctx, p->value);
        config_transition *t = &sm->transitions[i];
        char tpath[KEY_PATH_MAX], shown[128];
        bool dup = false;

        if (!key || !value)
            continue;
        t->event = take_string(ctx, key, path, "an event name", check_event);
        if (!t->event)
            continue;
        for (size_t j = 0; j < i && !dup; j++) {
            if (sm->transitions[j].event && !strcmp(sm->transitions[j].event, t->event)) {
                yaml_node_t *first = get_node(ctx, node->data.mapping.pairs.start[j].key);
                report(ctx, node_line(key), "%s: event '%s' is listed twice (first at line %lu)",
                       path, show(shown, sizeof shown, t->event), node_line(first));
                dup = true;
            }
        }
        if (dup)
            continue;
        join_path(tpath, sizeof tpath, path, show(shown, sizeof shown, t->event));
        walk_table(ctx, transition_table, value, t, tpath, node_line(key));
    }
}

static void parse_from(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base, const char *path)
{
    config_transition *t = base;
    size_t n;
    (void)o;

    /* A single state may be written without brackets: from: PAYING. */
    if (node->type == YAML_SCALAR_NODE) {
        char *s = take_string(ctx, node, path, "a list of states", check_state);
        if (!s)
            return;
        t->from = malloc(sizeof *t->from);
        if (!t->from) {
            free(s);
            report(ctx, node_line(node), "%s: out of memory", path);
            return;
        }
        t->from[0] = s;
        t->from_count = 1;
        return;
    }
    if (node->type != YAML_SEQUENCE_NODE) {
        report(ctx, node_line(node), "%s: expected a list of states, got %s", path,
               node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0 || n > CONFIG_MAX_FROM) {
        report(ctx, node_line(node), "%s: list 1 to %d states, got %zu", path, CONFIG_MAX_FROM, n);
        return;
    }
    t->from = calloc(n, sizeof *t->from);
    if (!t->from) {
        report(ctx, node_line(node), "%s: out of memory", path);
        return;
    }
    t->from_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = get_node(ctx, node->data.sequence.items.start[i]);
        char ipath[KEY_PATH_MAX], shown[128];
        if (!item)
            continue;
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        t->from[i] = take_string(ctx, item, ipath, "a state", check_state);
        for (size_t j = 0; t->from[i] && j < i; j++) {
            if (t->from[j] && !strcmp(t->from[j], t->from[i])) {
                report(ctx, node_line(item), "%s: state '%s' is listed twice", path,
                       show(shown, sizeof shown, t->from[i]));
                break;
            }
        }
    }
}

static void parse_set(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base, const char *path)
{
    config_state_machine *sm = &((config_handler *)base)->state_machine;
    size_t n;
    (void)o;

    if (!want_mapping(ctx, node, path, "a mapping of column: field"))
        return;
    n = pair_count(node);
    if (n == 0)
        return;
    if (n > CONFIG_MAX_SET) {
        report(ctx, node_line(node), "%s: %zu columns; at most %d are supported", path, n,
               CONFIG_MAX_SET);
        return;
    }
    sm->set = calloc(n, sizeof *sm->set);
    if (!sm->set) {
        report(ctx, node_line(node), "%s: out of memory", path);
        return;
    }
    sm->set_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &node->data.mapping.pairs.start[i];
        yaml_node_t *key = get_node(ctx, p->key), *value = get_node(ctx, p->value);
        config_set_column *s = &sm->set[i];
        char cpath[KEY_PATH_MAX], shown[128];
        bool dup = false;

        if (!key || !value)
            continue;
        s->column = take_string(ctx, key, path, "a column name", check_ident);
        if (!s->column)
            continue;
        for (size_t j = 0; j < i && !dup; j++) {
            if (sm->set[j].column && !strcmp(sm->set[j].column, s->column)) {
                report(ctx, node_line(key), "%s: column '%s' is listed twice", path, s->column);
                dup = true;
            }
        }
        if (dup)
            continue;
        join_path(cpath, sizeof cpath, path, show(shown, sizeof shown, s->column));
        s->field = take_string(ctx, value, cpath, "a message field", check_field);
    }
}

/* Parses one statement's placeholders into st (see config/sql_template.h for the rule) and
 * refuses statements that would end the transaction. sql_node gives the line. */
static void parse_statement_text(load_ctx *ctx, config_sql_statement *st,
                                 const yaml_node_t *sql_node, const char *path)
{
    sql_template t;
    char why[512], keyword[32];

    if (!sql_keeps_transaction(st->sql, keyword, sizeof keyword)) {
        char shown[128];
        report(ctx, node_line(sql_node),
               "%s.sql: a %s statement cannot run inside idemq's transaction (it would commit "
               "or end it); use SELECT, INSERT, UPDATE, DELETE, REPLACE, WITH, DO, CALL or "
               "SAVEPOINT",
               path, show(shown, sizeof shown, keyword));
        return;
    }
    if (sql_template_parse(st->sql, &t, why, sizeof why) < 0) {
        report(ctx, node_line(sql_node), "%s.sql: %s", path, why);
        return;
    }
    st->prepared = t.sql;
    st->params = t.params;
    st->param_count = t.param_count;
}

static void parse_statements(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                             const char *path)
{
    config_sql *sql = &((config_handler *)base)->sql;
    size_t n;
    (void)o;

    if (node->type != YAML_SEQUENCE_NODE) {
        report(ctx, node_line(node), "%s: expected a list of {sql: ..., expect_rows: N}, got %s",
               path, node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0) {
        report(ctx, node_line(node), "%s: the list is empty; give at least one statement", path);
        return;
    }
    if (n > CONFIG_MAX_STATEMENTS) {
        report(ctx, node_line(node), "%s: %zu statements; at most %d are supported", path, n,
               CONFIG_MAX_STATEMENTS);
        return;
    }
    sql->statements = calloc(n, sizeof *sql->statements);
    if (!sql->statements) {
        report(ctx, node_line(node), "%s: out of memory", path);
        return;
    }
    sql->statement_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = get_node(ctx, node->data.sequence.items.start[i]);
        config_sql_statement *st = &sql->statements[i];
        yaml_node_t *sql_node = item;
        char ipath[KEY_PATH_MAX];
        size_t before = ctx->total;

        if (!item)
            continue;
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (item->type == YAML_SCALAR_NODE) {
            /* A bare string is a statement without expect_rows. */
            char spath[KEY_PATH_MAX + 8];
            join_path(spath, sizeof spath, ipath, "sql");
            st->sql = take_string(ctx, item, spath, "a statement", check_sql);
        } else {
            walk_table(ctx, statement_table, item, st, ipath, node_line(item));
            st->expect_rows_set = mapping_get(ctx, item, "expect_rows") != NULL;
            sql_node = mapping_get(ctx, item, "sql");
        }
        if (st->sql && ctx->total == before)
            parse_statement_text(ctx, st, sql_node ? sql_node : item, ipath);
    }
}

/* A plain YAML scalar as the JSON value a reader of the YAML would expect: null, true/false,
 * an integer, a number, or else a string. Quoted scalars are always strings. */
static json_t *scalar_to_json(const yaml_node_t *node)
{
    const char *s = scalar_text(node);
    char *end = NULL;

    if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return json_stringn(s, node->data.scalar.length);
    if (is_null(node))
        return json_null();
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
        return json_true();
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
        return json_false();
    if (looks_numeric(s)) {
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end && !*end && errno == 0)
            return json_integer((json_int_t)v);
        errno = 0;
        double d = strtod(s, &end);
        if (end && !*end && errno == 0)
            return json_real(d);
    }
    return json_stringn(s, node->data.scalar.length);
}

/* Converts a YAML subtree into a new JSON value, or NULL after reporting why. The event check
 * already bounded the depth and refused aliases. */
static json_t *yaml_to_json(load_ctx *ctx, const yaml_node_t *node, const char *path)
{
    json_t *out;

    switch (node->type) {
    case YAML_SCALAR_NODE:
        out = scalar_to_json(node);
        break;
    case YAML_SEQUENCE_NODE:
        out = json_array();
        for (yaml_node_item_t *it = node->data.sequence.items.start;
             out && it < node->data.sequence.items.top; it++) {
            yaml_node_t *item = get_node(ctx, *it);
            json_t *v = item ? yaml_to_json(ctx, item, path) : json_null();
            if (!v || json_array_append_new(out, v) != 0) {
                json_decref(out);
                return NULL;
            }
        }
        break;
    case YAML_MAPPING_NODE:
        out = json_object();
        for (yaml_node_pair_t *p = node->data.mapping.pairs.start;
             out && p < node->data.mapping.pairs.top; p++) {
            yaml_node_t *key = get_node(ctx, p->key), *value = get_node(ctx, p->value);
            const char *name;
            json_t *v;
            if (!key || !value)
                continue;
            name = want_string(ctx, key, path, "a key name");
            if (!name) {
                json_decref(out);
                return NULL;
            }
            if (json_object_get(out, name)) {
                char shown[128];
                report(ctx, node_line(key), "%s: key '%s' is given twice", path,
                       show(shown, sizeof shown, name));
                json_decref(out);
                return NULL;
            }
            v = yaml_to_json(ctx, value, path);
            if (!v || json_object_set_new(out, name, v) != 0) {
                json_decref(out);
                return NULL;
            }
        }
        break;
    default:
        out = json_null();
        break;
    }
    if (!out)
        report(ctx, node_line(node), "%s: out of memory", path);
    return out;
}

static void parse_plugin_config(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                                const char *path)
{
    config_plugin *plugin = &((config_handler *)base)->plugin;
    json_t *tree = yaml_to_json(ctx, node, path);
    (void)o;

    if (!tree)
        return;
    free(plugin->config_json);
    plugin->config_json = json_dumps(tree, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    json_decref(tree);
    if (!plugin->config_json)
        report(ctx, node_line(node), "%s: out of memory", path);
}

/* ------------------------------------------------------------------------------------------ */
/* Reading and parsing the file                                                                */

static int read_file(load_ctx *ctx, const char *path, unsigned char **out, size_t *out_len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    struct stat st;
    int rc = -1;

    if (!f) {
        report(ctx, 0, "cannot open the config file: %s", strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        report(ctx, 0, "cannot read the config file: it is a directory");
        goto out;
    }
    /* Read at most one byte more than allowed, so pipes and /dev/stdin work and are bounded. */
    for (;;) {
        size_t got;
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 16384;
            unsigned char *nbuf;
            if (ncap > CONFIG_MAX_FILE_BYTES + 1)
                ncap = CONFIG_MAX_FILE_BYTES + 1;
            if (ncap == cap) {
                report(ctx, 0, "the config file is larger than %d bytes (1 MiB)",
                       CONFIG_MAX_FILE_BYTES);
                goto out;
            }
            nbuf = realloc(buf, ncap);
            if (!nbuf) {
                report(ctx, 0, "out of memory reading the config file");
                goto out;
            }
            buf = nbuf, cap = ncap;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                report(ctx, 0, "cannot read the config file: %s", strerror(errno));
                goto out;
            }
            break;
        }
    }
    if (len > CONFIG_MAX_FILE_BYTES) {
        report(ctx, 0, "the config file is larger than %d bytes (1 MiB)", CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    *out = buf;
    *out_len = len;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

static void report_syntax(load_ctx *ctx, const yaml_parser_t *p, const unsigned char *text,
                          size_t len)
{
    unsigned long line = (unsigned long)p->problem_mark.line + 1;

    if (p->error == YAML_MEMORY_ERROR) {
        report(ctx, 0, "out of memory while parsing YAML");
        return;
    }
    if (p->error == YAML_READER_ERROR) {
        /* Reader errors (bad UTF-8, control characters) only carry a byte offset. */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++)
            line += text[i] == '\n';
    }
    if (p->context)
        report(ctx, line, "YAML syntax error: %s (%s at line %lu)",
               p->problem ? p->problem : "unknown problem", p->context,
               (unsigned long)p->context_mark.line + 1);
    else
        report(ctx, line, "YAML syntax error: %s", p->problem ? p->problem : "unknown problem");
}

/*
 * A first pass over the event stream: syntax errors (with the line), nesting depth, aliases,
 * explicit tags and extra documents are all refused here, before the loader builds a tree.
 * Aliases are refused because a few of them can make a small file expand into a huge config
 * ("billion laughs"); nothing in this format needs them. Returns 0 or -1.
 */
static int check_events(load_ctx *ctx, const unsigned char *text, size_t len)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int depth = 0, docs = 0, rc = 0;
    bool done = false;

    if (!yaml_parser_initialize(&parser)) {
        report(ctx, 0, "out of memory while parsing YAML");
        return -1;
    }
    yaml_parser_set_input_string(&parser, text, len);
    while (!done) {
        unsigned long line;
        const yaml_char_t *tag = NULL;

        if (!yaml_parser_parse(&parser, &ev)) {
            report_syntax(ctx, &parser, text, len);
            rc = -1;
            break;
        }
        line = (unsigned long)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                report(ctx, line, "only one YAML document is allowed in the config file");
                rc = -1;
                done = true;
            }
            break;
        case YAML_ALIAS_EVENT:
            report(ctx, line, "YAML aliases (*%s) are not supported; write the value out",
                   (const char *)ev.data.alias.anchor);
            rc = -1;
            break;
        case YAML_SCALAR_EVENT:
            tag = ev.data.scalar.tag;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            tag = ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.tag
                                                       : ev.data.mapping_start.tag;
            if (++depth > CONFIG_MAX_DEPTH) {
                report(ctx, line, "nesting deeper than %d levels", CONFIG_MAX_DEPTH);
                rc = -1;
                done = true;
            }
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        default:
            break;
        }
        if (tag) {
            char shown[128];
            report(ctx, line, "explicit YAML tags (%s) are not supported",
                   show(shown, sizeof shown, (const char *)tag));
            rc = -1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                  */

int config_load(const char *path, FILE *errors, config **out)
{
    load_ctx ctx = {.path = path ? path : "(no path)"};
    unsigned char *text = NULL;
    size_t len = 0;
    yaml_parser_t parser;
    yaml_document_t doc;
    bool parser_ready = false, doc_ready = false;
    yaml_node_t *root;
    config *cfg = NULL;
    int rc;

    if (out)
        *out = NULL;
    if (!path || !out) {
        report(&ctx, 0, "config_load: path and out are required");
        goto out;
    }
    if (read_file(&ctx, path, &text, &len) < 0 || check_events(&ctx, text, len) < 0)
        goto out;
    if (!yaml_parser_initialize(&parser)) {
        report(&ctx, 0, "out of memory while parsing YAML");
        goto out;
    }
    parser_ready = true;
    yaml_parser_set_input_string(&parser, text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        report_syntax(&ctx, &parser, text, len);
        goto out;
    }
    doc_ready = true;
    ctx.doc = &doc;
    root = yaml_document_get_root_node(&doc);
    if (!root || is_null(root)) {
        report(&ctx, 0,
               "the config file is empty (expected a mapping with amqp, mysql and "
               "consumers)");
        goto out;
    }
    if (root->type != YAML_MAPPING_NODE) {
        report(&ctx, node_line(root), "expected a mapping at the top level, got %s",
               node_kind(root));
        goto out;
    }
    cfg = calloc(1, sizeof *cfg);
    if (!cfg || !(cfg->path = strdup(path))) {
        report(&ctx, 0, "out of memory");
        goto out;
    }
    apply_defaults(&ctx, top_table, cfg);
    walk_table(&ctx, top_table, root, cfg, "", node_line(root));
out:
    rc = ctx.total > (size_t)INT32_MAX ? -INT32_MAX : -(int)ctx.total;
    flush_errors(&ctx, errors);
    if (rc == 0)
        *out = cfg;
    else
        config_free(cfg);
    if (doc_ready)
        yaml_document_delete(&doc);
    if (parser_ready)
        yaml_parser_delete(&parser);
    free(text);
    return rc;
}

static void free_state_machine(config_state_machine *sm)
{
    free(sm->table);
    free(sm->key_column);
    free(sm->key_field);
    free(sm->state_column);
    free(sm->event_field);
    for (size_t i = 0; i < sm->transition_count; i++) {
        config_transition *t = &sm->transitions[i];
        free(t->event);
        free(t->to);
        for (size_t j = 0; j < t->from_count; j++)
            free(t->from[j]);
        free(t->from);
    }
    free(sm->transitions);
    for (size_t i = 0; i < sm->set_count; i++) {
        free(sm->set[i].column);
        free(sm->set[i].field);
    }
    free(sm->set);
}

static void free_sql(config_sql *sql)
{
    for (size_t i = 0; i < sql->statement_count; i++) {
        config_sql_statement *st = &sql->statements[i];
        free(st->sql);
        free(st->prepared);
        for (size_t j = 0; j < st->param_count; j++)
            free(st->params[j]);
        free(st->params);
    }
    free(sql->statements);
}

void config_free(config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        free(cfg->consumers[i].queue);
        free(cfg->consumers[i].handler_name);
        free_state_machine(&cfg->consumers[i].handler.state_machine);
        free_sql(&cfg->consumers[i].handler.sql);
        free(cfg->consumers[i].handler.plugin.path);
        free(cfg->consumers[i].handler.plugin.config_json);
    }
    free(cfg->consumers);
    free(cfg->path);
    free(cfg->amqp_url);
    free(cfg->mysql_url);
    free(cfg->http_listen);
    free(cfg);
}

/* ------------------------------------------------------------------------------------------ */
/* Reference: the README's configuration table is generated from the option tables above, so
 * the documentation cannot drift from what the loader accepts (a unit test compares them). */

static void format_ms(uint64_t ms, char *buf, size_t len)
{
    static const struct {
        uint64_t ms;
        const char *unit;
    } units[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}};
    if (ms == 0) {
        snprintf(buf, len, "0");
        return;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (ms % units[i].ms == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(ms / units[i].ms), units[i].unit);
            return;
        }
}

static void format_bytes(uint64_t bytes, char *buf, size_t len)
{
    if (bytes && bytes % (1u << 20) == 0)
        snprintf(buf, len, "%lluMiB", (unsigned long long)(bytes >> 20));
    else if (bytes && bytes % 1024 == 0)
        snprintf(buf, len, "%lluKiB", (unsigned long long)(bytes >> 10));
    else
        snprintf(buf, len, "%llu", (unsigned long long)bytes);
}

static void describe_range(const opt *o, char *buf, size_t len)
{
    char lo[32], hi[32];
    buf[0] = '\0';
    switch (o->type) {
    case OPT_UINT:
        snprintf(buf, len, "%llu..%llu", (unsigned long long)o->min, (unsigned long long)o->max);
        break;
    case OPT_DURATION:
        format_ms(o->min, lo, sizeof lo);
        format_ms(o->max, hi, sizeof hi);
        snprintf(buf, len, "%s..%s", lo, hi);
        break;
    case OPT_SIZE:
        format_bytes(o->min, lo, sizeof lo);
        format_bytes(o->max, hi, sizeof hi);
        snprintf(buf, len, "%s..%s", lo, hi);
        break;
    case OPT_ENUM: {
        size_t n = 0;
        for (size_t i = 0; o->names[i] && n < len; i++)
            n += (size_t)snprintf(buf + n, len - n, "%s`%s`", i ? ", " : "", o->names[i]);
        break;
    }
    default:
        break;
    }
}

static const char *reference_type(const opt *o)
{
    switch (o->type) {
    case OPT_UINT: return "integer";
    case OPT_DURATION: return "duration";
    case OPT_SIZE: return "size";
    case OPT_ENUM: return "enum";
    case OPT_STRING: return "string";
    case OPT_SECTION: return "map";
    default: return "see help";
    }
}

static void write_rows(FILE *out, const opt *table, const char *prefix);

static void write_row(FILE *out, const opt *o, const char *path)
{
    char range[256];
    describe_range(o, range, sizeof range);
    const char *def = o->flags & OPT_REQUIRED ? "required" : o->def ? o->def : "";
    fprintf(out, "| `%s` | %s | %s%s%s | %s | %s%s%s |\n", path, reference_type(o),
            *def && !(o->flags & OPT_REQUIRED) ? "`" : "", def,
            *def && !(o->flags & OPT_REQUIRED) ? "`" : "", range, o->help ? o->help : "",
            o->env ? "; env " : "", o->env ? o->env : "");
}

static void write_rows(FILE *out, const opt *table, const char *prefix)
{
    char path[200];
    for (const opt *o = table; o->name; o++) {
        snprintf(path, sizeof path, "%s%s", prefix, o->name);
        if (o->type == OPT_SECTION) {
            char nested[300];
            snprintf(nested, sizeof nested, "%s.", path);
            write_rows(out, o->section, nested);
            continue;
        }
        write_row(out, o, path);
        char nested[300];
        if (o->parse == parse_consumers) {
            snprintf(nested, sizeof nested, "%s[].", path);
            write_rows(out, consumer_table, nested);
        } else if (o->parse == parse_transitions) {
            snprintf(nested, sizeof nested, "%s.EVENT.", path);
            write_rows(out, transition_table, nested);
        } else if (o->parse == parse_statements) {
            snprintf(nested, sizeof nested, "%s[].", path);
            write_rows(out, statement_table, nested);
        } else if (o->parse == parse_handler) {
            for (size_t k = 0; k < sizeof handler_kinds / sizeof handler_kinds[0]; k++) {
                snprintf(nested, sizeof nested, "%s.", path);
                fprintf(out, "| *`type: %s`* | | | | |\n",
                        handler_type_names[handler_kinds[k].type]);
                for (const opt *h = handler_kinds[k].table; h->name; h++)
                    if (strcmp(h->name, "type") != 0) {
                        const opt one[2] = {*h, {0}};
                        write_rows(out, one, nested);
                    }
            }
        }
    }
}

void config_write_reference(FILE *out)
{
    fprintf(out, "| key | type | default | range | meaning |\n|---|---|---|---|---|\n");
    write_rows(out, top_table, "");
}
