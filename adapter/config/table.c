/*
 * table — see table.h.
 */
#include "config/table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/document.h"
#include "config/text.h"
#include "config/units.h"
#include "util/errors.h"

#define SUGGEST_MAX 64 /* longest key compared for a "did you mean" (MySQL's identifier limit) */

/* Levenshtein distance, capped: anything over 2 is "not a typo" for the suggestion. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[SUGGEST_MAX + 1];

    if (la > SUGGEST_MAX || lb > SUGGEST_MAX || (la > lb ? la - lb : lb - la) > 2)
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

static void *field_at(void *base, size_t offset)
{
    return (char *)base + offset;
}

/* Parses a plain integer, allowing a sign so "-1" gets a range message rather than a type one.
 * Returns 0, CONFIG_E_NOT_INTEGER, or CONFIG_E_OUT_OF_RANGE (digits, but too many). */
static int parse_int(const char *text, bool *negative, uint64_t *out)
{
    const char *p = text;
    *negative = *p == '-';
    if (*p == '-' || *p == '+')
        p++;
    if (config_parse_count(&p, out) < 0)
        return config_is_digit(*p) ? CONFIG_E_OUT_OF_RANGE : CONFIG_E_NOT_INTEGER;
    return *p ? CONFIG_E_NOT_INTEGER : 0;
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
 * file values and environment values. Returns 0, or -1 with the reason in err.
 */
static int opt_set(const opt *o, const char *text, void *base, char *err, size_t err_len)
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
        if (rc == CONFIG_E_NOT_INTEGER) {
            snprintf(err, err_len, "expected an integer, got '%s'",
                     config_show(shown, sizeof shown, text));
            return -1;
        }
        if (rc == CONFIG_E_OUT_OF_RANGE || negative || v < o->min || v > o->max) {
            snprintf(err, err_len, "must be between %llu and %llu, got %s (%s)",
                     (unsigned long long)o->min, (unsigned long long)o->max,
                     config_show(shown, sizeof shown, text), o->help);
            return -1;
        }
        *(unsigned *)dst = (unsigned)v;
        return 0;
    case OPT_DURATION:
        if (config_parse_duration(text, &v) < 0) {
            snprintf(err, err_len,
                     "'%s' is not a valid duration (use a whole number with ms, s, m, h or d, "
                     "e.g. 250ms, 30s, 5m; a bare number means seconds)",
                     config_show(shown, sizeof shown, text));
            return -1;
        }
        if (v < o->min || v > o->max) {
            snprintf(err, err_len, "must be between %s and %s, got %s (%s)",
                     config_format_duration(lo, sizeof lo, o->min),
                     config_format_duration(hi, sizeof hi, o->max),
                     config_show(shown, sizeof shown, text), o->help);
            return -1;
        }
        if ((o->flags & OPT_WHOLE_SECONDS) && v % 1000) {
            snprintf(err, err_len, "must be whole seconds, got %s",
                     config_show(shown, sizeof shown, text));
            return -1;
        }
        *(uint64_t *)dst = v;
        return 0;
    case OPT_SIZE:
        if (config_parse_size(text, &size) < 0) {
            snprintf(err, err_len,
                     "'%s' is not a valid size (use a whole number with an optional unit B, KB, "
                     "MB, GB, KiB, MiB or GiB, e.g. 64KiB)",
                     config_show(shown, sizeof shown, text));
            return -1;
        }
        if (size < o->min || size > o->max) {
            snprintf(err, err_len, "must be between %s and %s, got %s (%s)",
                     config_format_size(lo, sizeof lo, o->min),
                     config_format_size(hi, sizeof hi, o->max),
                     config_show(shown, sizeof shown, text), o->help);
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
            snprintf(err, err_len, "'%s' is not one of: %s", config_show(shown, sizeof shown, text),
                     enum_list(o, list, sizeof list));
        }
        return -1;
    case OPT_STRING: {
        char *copy;
        if (o->check && o->check(text, err, err_len) < 0)
            return -1;
        copy = strdup(text);
        if (!copy) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        free(*(char **)dst);
        *(char **)dst = copy;
        return 0;
    }
    default:
        snprintf(err, err_len, "internal error: option %s has no scalar type", o->name);
        return -1;
    }
}

void config_apply_defaults(load_ctx *ctx, const opt *table, void *base)
{
    char why[512];
    for (const opt *o = table; o->type != OPT_END; o++) {
        if (o->type == OPT_SECTION)
            config_apply_defaults(ctx, o->section, base);
        else if (o->def && opt_set(o, o->def, base, why, sizeof why) < 0)
            config_report(ctx, 0, "internal error: the default of %s is invalid: %s", o->name, why);
    }
}

void config_apply_node(load_ctx *ctx, const opt *o, yaml_node_t *value, void *base,
                       const char *path, unsigned long key_line)
{
    char why[512], expect[256];
    const char *text;

    switch (o->type) {
    case OPT_SECTION:
        config_walk_table(ctx, o->section, value, base, path, key_line);
        return;
    case OPT_CUSTOM:
        o->parse(ctx, o, value, base, path);
        return;
    default:
        break;
    }
    if (value->type == YAML_SCALAR_NODE && config_is_null(value)) {
        config_report(ctx, config_node_line(value), "%s: no value given (expected %s%s)", path,
                      type_name(o, expect, sizeof expect),
                      o->flags & OPT_REQUIRED ? "" : "; remove the key to use the default");
        return;
    }
    text = config_want_string(ctx, value, path, type_name(o, expect, sizeof expect));
    if (!text)
        return;
    if (o->type == OPT_UINT && value->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        config_report(ctx, config_node_line(value), "%s: expected an integer, got a quoted string",
                      path);
        return;
    }
    if (opt_set(o, text, base, why, sizeof why) < 0)
        config_report(ctx, config_node_line(value), "%s: %s", path, why);
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
    config_join_path(full, sizeof full, path, config_show(shown, sizeof shown, name));
    if (best) {
        char sugg[KEY_PATH_MAX];
        config_join_path(sugg, sizeof sugg, path, best->name);
        config_report(ctx, config_node_line(key), "unknown key '%s' (did you mean '%s'?)", full,
                      sugg);
    } else {
        config_report(ctx, config_node_line(key), "unknown key '%s' (known keys%s%s: %s)", full,
                      *path ? " in " : "", path, known);
    }
}

void config_walk_table(load_ctx *ctx, const opt *table, yaml_node_t *node, void *base,
                       const char *path, unsigned long line)
{
    unsigned long seen[OPT_TABLE_MAX] = {0}; /* line where each key first appeared */
    char full[KEY_PATH_MAX], why[512];
    size_t count = 0;

    while (table[count].type != OPT_END)
        count++;
    if (count > OPT_TABLE_MAX) {
        config_report(ctx, line, "internal error: option table for '%s' is too large", path);
        return;
    }
    if (node) {
        if (node->type != YAML_MAPPING_NODE) {
            config_report(ctx, config_node_line(node), "%s: expected a mapping, got %s",
                          *path ? path : "file", config_node_kind(node));
            return;
        }
        line = config_node_line(node);
        for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top;
             p++) {
            yaml_node_t *key = config_get_node(ctx, p->key),
                        *value = config_get_node(ctx, p->value);
            const char *name;
            size_t i;

            if (!key || !value)
                continue;
            name = config_want_string(ctx, key, *path ? path : "file", "a key name");
            if (!name)
                continue;
            for (i = 0; i < count && strcmp(table[i].name, name); i++)
                ;
            if (i == count) {
                report_unknown(ctx, table, key, path, name);
                continue;
            }
            config_join_path(full, sizeof full, path, table[i].name);
            if (seen[i]) {
                config_report(ctx, config_node_line(key),
                              "%s: duplicate key (first given at line %lu)", full, seen[i]);
                continue;
            }
            seen[i] = config_node_line(key);
            config_apply_node(ctx, &table[i], value, base, full, config_node_line(key));
        }
    }
    for (size_t i = 0; i < count; i++) {
        const opt *o = &table[i];
        const char *env = o->env ? getenv(o->env) : NULL;

        if (env && !*env)
            env = NULL; /* an empty variable means "not set", as in most daemons */
        config_join_path(full, sizeof full, path, o->name);
        if (!seen[i] && o->type == OPT_SECTION)
            config_walk_table(ctx, o->section, NULL, base, full, line);
        else if (!seen[i] && (o->flags & OPT_REQUIRED) && !env)
            config_report(ctx, line, "missing required key '%s' (%s%s%s)", full, o->help,
                          o->env ? "; or set " : "", o->env ? o->env : "");
        if (env && opt_set(o, env, base, why, sizeof why) < 0)
            config_report(ctx, 0, "%s (overrides %s): %s", o->env, full, why);
    }
}

char *config_take_string(load_ctx *ctx, const yaml_node_t *node, const char *path, const char *what,
                         check_fn check)
{
    char why[512];
    const char *text = config_want_string(ctx, node, path, what);
    char *copy;

    if (!text)
        return NULL;
    if (check && check(text, why, sizeof why) < 0) {
        config_report(ctx, config_node_line(node), "%s: %s", path, why);
        return NULL;
    }
    copy = strdup(text);
    if (!copy)
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
    return copy;
}

int config_check_bounded(const char *text, size_t max, const char *what, char *err, size_t err_len)
{
    size_t n = strlen(text);
    char shown[128];
    if (n == 0) {
        snprintf(err, err_len, "%s must not be empty", what);
        return -1;
    }
    if (n > max) {
        snprintf(err, err_len, "%s is %zu bytes long; at most %zu are allowed", what, n, max);
        return -1;
    }
    if (config_has_control(text)) {
        snprintf(err, err_len, "%s '%s' contains control characters", what,
                 config_show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

void config_parse_skip(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base, const char *path)
{
    (void)ctx, (void)o, (void)node, (void)base, (void)path;
}
