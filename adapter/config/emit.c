/*
 * emit — see emit.h.
 */
#include "config/emit.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/document.h"
#include "config/text.h"
#include "config/yaml_json.h"

#define CONFIG_MAX_EMITS 16 /* per transition or sql handler */
#define CONFIG_MAX_EMIT_FIELDS 256
#define EMIT_NAME_MAX 64    /* idemq_outbox.emit_name */
#define EMIT_TARGET_MAX 255 /* idemq_outbox.exchange, routing_key; AMQP's shortstr */
#define FIELD_PATH_MAX 255

_Static_assert(sizeof(config_emit_format) == sizeof(int), "enums are stored as int");

/* Emit names end up in the outgoing biz_key's derivation and in `idemq outbox list`: a plain
 * alphabet keeps them unambiguous in both. */
static int check_emit_name(const char *text, char *err, size_t err_len)
{
    char shown[128];
    if (config_check_bounded(text, EMIT_NAME_MAX, "emit name", err, err_len) < 0)
        return -1;
    for (const char *p = text; *p; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || config_is_digit(*p) ||
              *p == '_' || *p == '-' || *p == '.')) {
            snprintf(err, err_len,
                     "emit name '%s' may only use A-Z a-z 0-9 _ - . (it is part of the outgoing "
                     "biz_key)",
                     config_show(shown, sizeof shown, text));
            return -1;
        }
    }
    return 0;
}

/* An exchange may be "" (the default exchange); both are AMQP short strings. */
static int check_target(const char *text, const char *what, char *err, size_t err_len)
{
    size_t n = strlen(text);
    if (n > EMIT_TARGET_MAX) {
        snprintf(err, err_len, "%s is %zu bytes long; at most %d are allowed", what, n,
                 EMIT_TARGET_MAX);
        return -1;
    }
    if (config_has_control(text)) {
        snprintf(err, err_len, "%s must not contain control characters", what);
        return -1;
    }
    return 0;
}

static int check_exchange(const char *text, char *err, size_t err_len)
{
    return check_target(text, "exchange", err, err_len);
}

static int check_routing_key(const char *text, char *err, size_t err_len)
{
    return check_target(text, "routing_key", err, err_len);
}

static void parse_fields(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                         const char *path);

/* clang-format off */
static const char *const format_names[] = {"json", "msgpack", NULL};

const opt config_emit_table[] = {
    {.name = "name", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_emit, name), .check = check_emit_name,
     .help = "unique within its emit list; part of the outgoing biz_key"},
    {.name = "exchange", .type = OPT_STRING, .offset = offsetof(config_emit, exchange),
     .check = check_exchange,
     .help = "exchange to publish to; absent or \"\": the default exchange"},
    {.name = "routing_key", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_emit, routing_key), .check = check_routing_key,
     .help = "routing key (the queue name with the default exchange)"},
    {.name = "content_type", .type = OPT_ENUM, .offset = offsetof(config_emit, format),
     .names = format_names, .def = "json", .help = "encoding of the outgoing envelope"},
    {.name = "fields", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = parse_fields,
     .help = "KEY: field.path (from the incoming message) or KEY: {value: CONSTANT}"},
    {0},
};
/* clang-format on */

static int check_field_path(const char *text, char *err, size_t err_len)
{
    char shown[128];
    if (config_check_bounded(text, FIELD_PATH_MAX, "field path", err, err_len) < 0)
        return -1;
    if (text[0] == '.' || text[strlen(text) - 1] == '.' || strstr(text, "..")) {
        snprintf(err, err_len, "field path '%s' has an empty segment",
                 config_show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

static void parse_field_source(load_ctx *ctx, yaml_node_t *value, config_emit_field *f,
                               const char *path)
{
    if (value->type == YAML_SCALAR_NODE) {
        f->from = config_take_string(ctx, value, path, "a message field", check_field_path);
        return;
    }
    if (value->type != YAML_MAPPING_NODE) {
        config_report(ctx, config_node_line(value),
                      "%s: expected a message field (a dotted path) or {value: CONSTANT}, got %s",
                      path, config_node_kind(value));
        return;
    }
    yaml_node_t *constant = config_mapping_get(ctx, value, "value");
    if (!constant || config_pair_count(value) != 1) {
        config_report(ctx, config_node_line(value),
                      "%s: a constant is written {value: CONSTANT}, with no other key", path);
        return;
    }
    char vpath[KEY_PATH_MAX];
    config_join_path(vpath, sizeof vpath, path, "value");
    f->value = config_yaml_to_json(ctx, constant, vpath);
}

static void parse_fields(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                         const char *path)
{
    config_emit *e = base;
    (void)o;

    if (!config_want_mapping(ctx, node, path,
                             "a mapping of KEY: field.path or KEY: {value: CONSTANT}"))
        return;
    size_t n = config_pair_count(node);
    if (n == 0 || n > CONFIG_MAX_EMIT_FIELDS) {
        config_report(ctx, config_node_line(node), "%s: list 1 to %d fields, got %zu", path,
                      CONFIG_MAX_EMIT_FIELDS, n);
        return;
    }
    e->fields = calloc(n, sizeof *e->fields);
    if (!e->fields) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    e->field_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = &node->data.mapping.pairs.start[i];
        yaml_node_t *key = config_get_node(ctx, p->key), *value = config_get_node(ctx, p->value);
        config_emit_field *f = &e->fields[i];
        char fpath[KEY_PATH_MAX], shown[128];

        if (!key || !value)
            continue;
        f->name = config_take_string(ctx, key, path, "a field name", NULL);
        if (!f->name)
            continue;
        config_join_path(fpath, sizeof fpath, path, config_show(shown, sizeof shown, f->name));
        if (!strcmp(f->name, "biz_key")) {
            config_report(ctx, config_node_line(key),
                          "%s: idemq sets the outgoing biz_key itself (derived from the incoming "
                          "biz_key, the handler and the emit's name); remove this field",
                          fpath);
            continue;
        }
        if (strlen(f->name) > FIELD_PATH_MAX) {
            config_report(ctx, config_node_line(key), "%s: a field name is at most %d bytes", path,
                          FIELD_PATH_MAX);
            continue;
        }
        parse_field_source(ctx, value, f, fpath);
    }
}

void config_parse_emit_list(load_ctx *ctx, yaml_node_t *node, const char *path, config_emit **emits,
                            size_t *count)
{
    yaml_node_t *single = NULL;
    size_t n;

    if (node->type == YAML_MAPPING_NODE) {
        single = node; /* emit: {name: ...} is a list of one */
        n = 1;
    } else if (node->type == YAML_SEQUENCE_NODE) {
        n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    } else {
        config_report(ctx, config_node_line(node),
                      "%s: expected a list of {name, exchange, routing_key, fields}, got %s", path,
                      config_node_kind(node));
        return;
    }
    if (n == 0 || n > CONFIG_MAX_EMITS) {
        config_report(ctx, config_node_line(node), "%s: list 1 to %d emits, got %zu", path,
                      CONFIG_MAX_EMITS, n);
        return;
    }
    *emits = calloc(n, sizeof **emits);
    if (!*emits) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    *count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item =
            single ? single : config_get_node(ctx, node->data.sequence.items.start[i]);
        char ipath[KEY_PATH_MAX];
        if (!item)
            continue;
        if (single)
            snprintf(ipath, sizeof ipath, "%s", path);
        else
            snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (!config_want_mapping(ctx, item, ipath,
                                 "a mapping {name, exchange, routing_key, fields}"))
            continue;
        config_walk_table(ctx, config_emit_table, item, &(*emits)[i], ipath,
                          config_node_line(item));
        /* One message goes through one list (one transition, or the sql handler's), so only a
         * name repeated within it would derive one outgoing biz_key for two messages — and a
         * downstream idemq would drop the second as a duplicate. */
        for (size_t j = 0; (*emits)[i].name && j < i; j++)
            if ((*emits)[j].name && !strcmp((*emits)[j].name, (*emits)[i].name))
                config_report(ctx, config_node_line(item),
                              "%s: emit name '%s' is used twice in this list (it is part of the "
                              "outgoing biz_key)",
                              ipath, (*emits)[i].name);
    }
}

void config_free_emits(config_emit *emits, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        free(emits[i].name);
        free(emits[i].exchange);
        free(emits[i].routing_key);
        for (size_t j = 0; j < emits[i].field_count; j++) {
            free(emits[i].fields[j].name);
            free(emits[i].fields[j].from);
            if (emits[i].fields[j].value)
                json_decref(emits[i].fields[j].value);
        }
        free(emits[i].fields);
    }
    free(emits);
}
