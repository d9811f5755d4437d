/*
 * handler_state_machine — see handler_state_machine.h.
 */
#include "config/handler_state_machine.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/document.h"
#include "config/emit.h"
#include "config/text.h"

#define CONFIG_MAX_TRANSITIONS 1024
#define CONFIG_MAX_FROM 256
#define CONFIG_MAX_SET 256
#define IDENT_MAX 64  /* MySQL identifier length limit */
#define VALUE_MAX 255 /* states, events, field paths */

_Static_assert(sizeof(config_on_illegal) == sizeof(int), "enums are stored as int");

/* SQL identifiers are pasted into statements (inside backticks), so only a strict alphabet. */
static int check_ident(const char *text, char *err, size_t err_len)
{
    size_t n = strlen(text);
    bool ok = n >= 1 && n <= IDENT_MAX;
    char shown[128];
    for (const char *p = text; ok && *p; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || config_is_digit(*p) ||
             *p == '_' || *p == '$';
    if (ok)
        return 0;
    snprintf(err, err_len,
             "'%s' is not a valid SQL identifier: use 1 to %d characters from A-Z a-z 0-9 _ $",
             config_show(shown, sizeof shown, text), IDENT_MAX);
    return -1;
}

static int check_state(const char *text, char *err, size_t err_len)
{
    return config_check_bounded(text, VALUE_MAX, "state", err, err_len);
}

static int check_event(const char *text, char *err, size_t err_len)
{
    return config_check_bounded(text, VALUE_MAX, "event name", err, err_len);
}

/* A message field, possibly a dotted path into nested maps ("payment.amount"). */
static int check_field(const char *text, char *err, size_t err_len)
{
    char shown[128];
    if (config_check_bounded(text, VALUE_MAX, "field path", err, err_len) < 0)
        return -1;
    if (text[0] == '.' || text[strlen(text) - 1] == '.' || strstr(text, "..")) {
        snprintf(err, err_len, "field path '%s' has an empty segment",
                 config_show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

static void parse_transitions(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                              const char *path);
static void parse_from(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                       const char *path);
static void parse_set(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base, const char *path);
static void parse_transition_emit(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                                  const char *path);

/* clang-format off */
static const char *const on_illegal_names[] = {"dead_letter", "retry", NULL};

/* Entries of one transition; the base struct is config_transition. */
static const opt transition_table[] = {
    {.name = "from", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_from,
     .help = "states the event may move from, e.g. [PAYING]"},
    {.name = "to", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_transition, to), .check = check_state,
     .help = "state the event moves to"},
    {.name = "emit", .type = OPT_CUSTOM, .parse = parse_transition_emit,
     .items = config_emit_table, .items_path = "[].",
     .help = "downstream messages written to the outbox when this transition applies"},
    {0},
};

/* Entries of a state_machine handler; the base struct is config_handler. */
const opt config_state_machine_table[] = {
    {.name = "type", .type = OPT_CUSTOM, .parse = config_parse_skip, .help = "handler type"},
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
     .items = transition_table, .items_path = ".EVENT.",
     .help = "EVENT: {from: [STATE, ...], to: STATE}"},
    {.name = "set", .type = OPT_CUSTOM, .parse = parse_set,
     .help = "column: field pairs written with the transition"},
    {0},
};
/* clang-format on */

static void parse_transitions(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                              const char *path)
{
    config_state_machine *sm = &((config_handler *)base)->state_machine;
    size_t n;

    if (!config_want_mapping(ctx, node, path,
                             "a mapping of EVENT: {from: [STATE, ...], to: STATE}"))
        return;
    n = config_pair_count(node);
    if (n == 0) {
        config_report(
            ctx, config_node_line(node),
            "%s: no transitions; list at least one EVENT: {from: [STATE, ...], to: STATE}", path);
        return;
    }
    if (n > CONFIG_MAX_TRANSITIONS) {
        config_report(ctx, config_node_line(node), "%s: %zu transitions; at most %d are supported",
                      path, n, CONFIG_MAX_TRANSITIONS);
        return;
    }
    sm->transitions = calloc(n, sizeof *sm->transitions);
    if (!sm->transitions) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    sm->transition_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &node->data.mapping.pairs.start[i];
        yaml_node_t *key = config_get_node(ctx, p->key), *value = config_get_node(ctx, p->value);
        config_transition *t = &sm->transitions[i];
        char tpath[KEY_PATH_MAX], shown[128];
        bool dup = false;

        if (!key || !value)
            continue;
        t->event = config_take_string(ctx, key, path, "an event name", check_event);
        if (!t->event)
            continue;
        for (size_t j = 0; j < i && !dup; j++) {
            if (sm->transitions[j].event && !strcmp(sm->transitions[j].event, t->event)) {
                yaml_node_t *first = config_get_node(ctx, node->data.mapping.pairs.start[j].key);
                config_report(ctx, config_node_line(key),
                              "%s: event '%s' is listed twice (first at line %lu)", path,
                              config_show(shown, sizeof shown, t->event), config_node_line(first));
                dup = true;
            }
        }
        if (dup)
            continue;
        config_join_path(tpath, sizeof tpath, path, config_show(shown, sizeof shown, t->event));
        config_walk_table(ctx, o->items, value, t, tpath, config_node_line(key));
    }
}

static void parse_transition_emit(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                                  const char *path)
{
    config_transition *t = base;
    (void)o;
    config_parse_emit_list(ctx, node, path, &t->emits, &t->emit_count);
}

static void parse_from(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base, const char *path)
{
    config_transition *t = base;
    size_t n;
    (void)o;

    /* A single state may be written without brackets: from: PAYING. */
    if (node->type == YAML_SCALAR_NODE) {
        char *s = config_take_string(ctx, node, path, "a list of states", check_state);
        if (!s)
            return;
        t->from = malloc(sizeof *t->from);
        if (!t->from) {
            free(s);
            config_report(ctx, config_node_line(node), "%s: out of memory", path);
            return;
        }
        t->from[0] = s;
        t->from_count = 1;
        return;
    }
    if (node->type != YAML_SEQUENCE_NODE) {
        config_report(ctx, config_node_line(node), "%s: expected a list of states, got %s", path,
                      config_node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0 || n > CONFIG_MAX_FROM) {
        config_report(ctx, config_node_line(node), "%s: list 1 to %d states, got %zu", path,
                      CONFIG_MAX_FROM, n);
        return;
    }
    t->from = calloc(n, sizeof *t->from);
    if (!t->from) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    t->from_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = config_get_node(ctx, node->data.sequence.items.start[i]);
        char ipath[KEY_PATH_MAX], shown[128];
        if (!item)
            continue;
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        t->from[i] = config_take_string(ctx, item, ipath, "a state", check_state);
        for (size_t j = 0; t->from[i] && j < i; j++) {
            if (t->from[j] && !strcmp(t->from[j], t->from[i])) {
                config_report(ctx, config_node_line(item), "%s: state '%s' is listed twice", path,
                              config_show(shown, sizeof shown, t->from[i]));
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

    if (!config_want_mapping(ctx, node, path, "a mapping of column: field"))
        return;
    n = config_pair_count(node);
    if (n == 0)
        return;
    if (n > CONFIG_MAX_SET) {
        config_report(ctx, config_node_line(node), "%s: %zu columns; at most %d are supported",
                      path, n, CONFIG_MAX_SET);
        return;
    }
    sm->set = calloc(n, sizeof *sm->set);
    if (!sm->set) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    sm->set_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &node->data.mapping.pairs.start[i];
        yaml_node_t *key = config_get_node(ctx, p->key), *value = config_get_node(ctx, p->value);
        config_set_column *s = &sm->set[i];
        char cpath[KEY_PATH_MAX], shown[128];
        bool dup = false;

        if (!key || !value)
            continue;
        s->column = config_take_string(ctx, key, path, "a column name", check_ident);
        if (!s->column)
            continue;
        for (size_t j = 0; j < i && !dup; j++) {
            if (sm->set[j].column && !strcmp(sm->set[j].column, s->column)) {
                config_report(ctx, config_node_line(key), "%s: column '%s' is listed twice", path,
                              s->column);
                dup = true;
            }
        }
        if (dup)
            continue;
        config_join_path(cpath, sizeof cpath, path, config_show(shown, sizeof shown, s->column));
        s->field = config_take_string(ctx, value, cpath, "a message field", check_field);
    }
}

/* The UPDATE writes the state column and the set columns and filters on the key column: any
 * overlap would make the statement ambiguous. */
void config_validate_state_machine(load_ctx *ctx, yaml_node_t *node, void *base, const char *path)
{
    config_state_machine *sm = &((config_handler *)base)->state_machine;

    if (sm->key_column && sm->state_column && !strcmp(sm->key_column, sm->state_column)) {
        yaml_node_t *n = config_mapping_get(ctx, node, "state_column");
        config_report(ctx, config_node_line(n ? n : node),
                      "%s.state_column: must differ from key_column", path);
    }
    for (size_t i = 0; i < sm->set_count; i++) {
        const char *col = sm->set[i].column;
        yaml_node_t *n = config_mapping_get(ctx, node, "set");
        if (!col)
            continue;
        if ((sm->key_column && !strcmp(col, sm->key_column)) ||
            (sm->state_column && !strcmp(col, sm->state_column)))
            config_report(ctx, config_node_line(n ? n : node),
                          "%s.set: column '%s' is the key or state column; it cannot be set", path,
                          col);
    }
}
