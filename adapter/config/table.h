/*
 * table — the declarative option tables, and the walker that applies a YAML mapping to one.
 *
 * A table is an array of opt entries ended by {0}, one per key (redis config.c, tmux
 * options-table.c): its name, type, range, default (written in the file's own syntax and parsed
 * by the same code as a value from the file), an optional environment override and a help
 * text; each entry stores its value at an offset into the struct the table describes. The walker
 * reports unknown keys (with a "did you mean"), duplicate keys, wrong types, out-of-range values
 * and missing required keys, each at its line, and applies environment overrides after the file.
 * A value with its own shape (a list of consumers, a map of events) is an OPT_CUSTOM entry whose
 * parse function walks it, against the table in `items` or the one its type key selects from
 * `variants`; the reference generator (reference.c) follows the same links, so it documents
 * exactly what the walker accepts. Internal to config/. Thread affinity: the loading thread
 * (getenv).
 *
 * Errors: check functions return 0, or -1 with a reason in the caller's err buffer. Parse and
 * validate functions return nothing: they report into ctx and go on (a caller that must know
 * compares ctx->total before and after).
 */
#ifndef IDEMQ_CONFIG_TABLE_H
#define IDEMQ_CONFIG_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "config/problems.h"

#define KEY_PATH_MAX 256 /* "consumers[3].handler.transitions.PAY.from" in messages */
#define OPT_TABLE_MAX 16 /* entries in one table */

#define SECONDS(n) ((uint64_t)(n) * 1000)
#define DAYS(n) ((uint64_t)(n) * 86400000)

typedef struct opt opt;

/* Checks a string value (borrowed). Returns 0, or -1 with the reason in err. */
typedef int (*check_fn)(const char *text, char *err, size_t err_len);

/* Parses node, the value of entry o, into base (the struct o's table describes); path is the
 * key path for messages. */
typedef void (*parse_fn)(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                         const char *path);

/* Cross-field checks once node (a mapping) has been walked into base. */
typedef void (*validate_fn)(load_ctx *ctx, yaml_node_t *node, void *base, const char *path);

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

/* One shape of a value whose type key selects its table (a handler). */
typedef struct opt_variant {
    const opt *table;     /* the keys of this shape, its type key among them */
    validate_fn validate; /* optional: cross-field checks after the walk */
} opt_variant;

struct opt {
    const char *name;
    opt_type type;
    unsigned flags;
    size_t offset;            /* into the struct the table describes */
    uint64_t min, max;        /* OPT_UINT, OPT_DURATION (ms), OPT_SIZE (bytes) */
    const char *def;          /* default, in the file's syntax; NULL for none */
    const char *env;          /* environment variable that overrides the value */
    const char *const *names; /* OPT_ENUM: NULL-terminated, index = enum value; with variants:
                                 the words of the type key */
    const opt *section;       /* OPT_SECTION */
    check_fn check;           /* OPT_STRING */
    parse_fn parse;           /* OPT_CUSTOM */
    const opt *items;         /* OPT_CUSTOM: the table each item or entry is walked against */
    const char *items_path;   /* how the reference writes an item's keys below this key */
    const opt_variant *variants; /* OPT_CUSTOM: variants[i] is the shape of type names[i] */
    const char *help;
};

/* Stores the default of every entry of table (and of its sections) into base. */
void config_apply_defaults(load_ctx *ctx, const opt *table, void *base);

/*
 * Walks the mapping node against table, storing values into base; path is the key path of node
 * ("" at the top). node may be NULL (the section is absent): then only missing required keys and
 * environment overrides are handled, reported at line (the parent's).
 */
void config_walk_table(load_ctx *ctx, const opt *table, yaml_node_t *node, void *base,
                       const char *path, unsigned long line);

/* Applies value, the node given for entry o, into base; key_line is the line of its key. */
void config_apply_node(load_ctx *ctx, const opt *o, yaml_node_t *value, void *base,
                       const char *path, unsigned long key_line);

/* An owned copy of the string in node, checked by check (optional), or NULL after reporting. */
char *config_take_string(load_ctx *ctx, const yaml_node_t *node, const char *path,
                         const char *what, check_fn check);

/* The common rule for names (states, events, queue names...): 1 to max bytes, no control
 * bytes; what names the value in the reason. */
int config_check_bounded(const char *text, size_t max, const char *what, char *err, size_t err_len);

/* The parse_fn of a key its parent reads before the walk (a handler's type): it only has to be
 * accepted. */
void config_parse_skip(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                       const char *path);

#endif
