/*
 * sql_template — see sql_template.h for the placeholder rule.
 *
 * One left-to-right scan with a small lexer: quoted strings, backtick identifiers and comments
 * are copied verbatim, placeholders are replaced by '?', everything else is copied. Output is
 * never longer than the input, so one allocation of strlen + 1 holds it.
 */
#include "config/sql_template.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_name_char(char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9') || c == '.';
}

/* 1-based line and column of text[offset], for messages about multi-line statements. */
static void locate(const char *text, size_t offset, unsigned long *line, unsigned long *column)
{
    *line = 1;
    *column = 1;
    for (size_t i = 0; i < offset && text[i]; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *column = 1;
        } else {
            (*column)++;
        }
    }
}

static void fail_at(char *err, size_t err_len, const char *text, size_t offset, const char *fmt,
                    ...) __attribute__((format(printf, 5, 6)));

static void fail_at(char *err, size_t err_len, const char *text, size_t offset, const char *fmt,
                    ...)
{
    char what[320];
    unsigned long line, column;
    va_list ap;
    if (!err || err_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    locate(text, offset, &line, &column);
    snprintf(err, err_len, "%s at line %lu, column %lu of the statement", what, line, column);
}

/* Where a comment starting at text[i] ends (the index after it), or 0 when none starts there;
 * (size_t)-1 when it is an unterminated block comment. */
static size_t comment_end(const char *text, size_t i)
{
    if (text[i] == '#' || (text[i] == '-' && text[i + 1] == '-' &&
                           (text[i + 2] == '\0' || (unsigned char)text[i + 2] <= ' '))) {
        const char *nl = strchr(text + i, '\n');
        return nl ? (size_t)(nl - text) + 1 : strlen(text);
    }
    if (text[i] == '/' && text[i + 1] == '*') {
        const char *close = strstr(text + i + 2, "*/");
        return close ? (size_t)(close - text) + 2 : (size_t)-1;
    }
    return 0;
}

/* Where a quoted string or identifier opened at text[i] ends (the index after its closing
 * quote), or (size_t)-1 when unterminated. */
static size_t quoted_end(const char *text, size_t i)
{
    char quote = text[i];
    bool backslash = quote != '`';
    for (size_t j = i + 1; text[j]; j++) {
        if (backslash && text[j] == '\\') {
            if (!text[j + 1])
                break;
            j++;
        } else if (text[j] == quote) {
            if (text[j + 1] != quote)
                return j + 1;
            j++; /* a doubled quote stays inside */
        }
    }
    return (size_t)-1;
}

static const char *quote_kind(char quote)
{
    return quote == '`' ? "backtick identifier" : "string literal";
}

void sql_template_close(sql_template *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->param_count; i++)
        free(t->params[i]);
    free(t->params);
    free(t->sql);
    memset(t, 0, sizeof *t);
}

int sql_template_parse(const char *text, sql_template *out, char *err, size_t err_len)
{
    sql_template t = {0};
    size_t len, o = 0, cap = 0;

    if (err && err_len)
        err[0] = '\0';
    if (!text || !out) {
        if (err && err_len)
            snprintf(err, err_len, "no statement");
        return -1;
    }
    len = strlen(text);
    t.sql = malloc(len + 1);
    if (!t.sql)
        goto oom;
    for (size_t i = 0; i < len;) {
        char c = text[i];
        size_t end;

        if (c == '\'' || c == '"' || c == '`') {
            end = quoted_end(text, i);
            if (end == (size_t)-1) {
                fail_at(err, err_len, text, i, "unterminated %s (%c)", quote_kind(c), c);
                goto fail;
            }
        } else if ((end = comment_end(text, i)) != 0) {
            if (end == (size_t)-1) {
                fail_at(err, err_len, text, i, "unterminated /* comment");
                goto fail;
            }
        } else if (c == '?') {
            fail_at(err, err_len, text, i,
                    "bare '?' parameter: write a :field placeholder instead");
            goto fail;
        } else if (c == ':' && text[i + 1] == ':') {
            end = i + 2;
        } else if (c == ':' && is_name_start(text[i + 1])) {
            size_t start = i + 1, n = 0;
            while (is_name_char(text[start + n]))
                n++;
            if (n > SQL_TEMPLATE_NAME_MAX) {
                fail_at(err, err_len, text, i, "placeholder name is %zu bytes long; at most %d", n,
                        SQL_TEMPLATE_NAME_MAX);
                goto fail;
            }
            if ((unsigned char)text[start + n] >= 0x80) {
                fail_at(err, err_len, text, i,
                        "placeholder ':%.*s' runs into a non-ASCII character; names use only "
                        "A-Z a-z 0-9 _ and .",
                        (int)n, text + start);
                goto fail;
            }
            bool empty_segment = text[start + n - 1] == '.';
            for (size_t k = 0; k + 1 < n && !empty_segment; k++)
                empty_segment = text[start + k] == '.' && text[start + k + 1] == '.';
            if (empty_segment) {
                fail_at(err, err_len, text, i, "placeholder ':%.*s' has an empty path segment",
                        (int)n, text + start);
                goto fail;
            }
            if (t.param_count == SQL_TEMPLATE_MAX_PARAMS) {
                fail_at(err, err_len, text, i, "more than %d placeholders",
                        SQL_TEMPLATE_MAX_PARAMS);
                goto fail;
            }
            if (t.param_count == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                char **np = realloc(t.params, ncap * sizeof *np);
                if (!np)
                    goto oom;
                t.params = np;
                cap = ncap;
            }
            t.params[t.param_count] = strndup(text + start, n);
            if (!t.params[t.param_count])
                goto oom;
            t.param_count++;
            t.sql[o++] = '?';
            i = start + n;
            continue;
        } else {
            end = i + 1;
        }
        memcpy(t.sql + o, text + i, end - i);
        o += end - i;
        i = end;
    }
    t.sql[o] = '\0';
    *out = t;
    return 0;
oom:
    if (err && err_len)
        snprintf(err, err_len, "out of memory");
fail:
    sql_template_close(&t);
    return -1;
}

/* Skips blanks, comments and '(' from text[i]; returns the index of the next token. */
static size_t skip_to_token(const char *text, size_t i)
{
    for (;;) {
        size_t end;
        if (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r' ||
            text[i] == '\f' || text[i] == '\v' || text[i] == '(') {
            i++;
        } else if ((end = comment_end(text, i)) != 0 && end != (size_t)-1) {
            i = end;
        } else {
            return i;
        }
    }
}

/* Copies the keyword at text[i] into buf (clipped); returns the index after it. */
static size_t read_keyword(const char *text, size_t i, char *buf, size_t buf_len)
{
    size_t n = 0;
    while ((text[i] >= 'a' && text[i] <= 'z') || (text[i] >= 'A' && text[i] <= 'Z') ||
           text[i] == '_') {
        if (buf_len && n + 1 < buf_len)
            buf[n++] = text[i];
        i++;
    }
    if (buf_len)
        buf[n] = '\0';
    return i;
}

/* Whether text names idemq's own savepoint (any case): releasing it or rolling back to it would
 * defeat the check that proves the transaction is still idemq's (store/pool.c). */
static bool names_guard_savepoint(const char *text)
{
    static const char guard[] = "idemq_txn_guard";
    for (const char *p = text; *p; p++)
        if (strncasecmp(p, guard, sizeof guard - 1) == 0)
            return true;
    return false;
}

bool sql_keeps_transaction(const char *sql, char *keyword, size_t keyword_len)
{
    static const char *const allowed[] = {
        "SELECT", "INSERT", "UPDATE", "DELETE",    "REPLACE", "WITH", "VALUES",
        "TABLE",  "DO",     "CALL",   "SAVEPOINT", "RELEASE", NULL,
    };
    char first[32], next[32];
    size_t i;

    if (keyword && keyword_len)
        keyword[0] = '\0';
    if (!sql)
        return false;
    if (names_guard_savepoint(sql)) {
        if (keyword && keyword_len)
            snprintf(keyword, keyword_len, "idemq_txn_guard");
        return false;
    }
    i = read_keyword(sql, skip_to_token(sql, 0), first, sizeof first);
    for (size_t k = 0; allowed[k]; k++)
        if (strcasecmp(first, allowed[k]) == 0)
            return true;
    if (strcasecmp(first, "ROLLBACK") == 0) {
        /* ROLLBACK [WORK] TO [SAVEPOINT] name undoes part of the transaction; plain ROLLBACK
         * would undo the dedup row. */
        i = read_keyword(sql, skip_to_token(sql, i), next, sizeof next);
        if (strcasecmp(next, "WORK") == 0)
            read_keyword(sql, skip_to_token(sql, i), next, sizeof next);
        if (strcasecmp(next, "TO") == 0)
            return true;
    }
    if (keyword && keyword_len)
        snprintf(keyword, keyword_len, "%s", first[0] ? first : "(none)");
    return false;
}
