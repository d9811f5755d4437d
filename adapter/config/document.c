/*
 * document — see document.h.
 */
#include "config/document.h"

#include <string.h>

#include "config/text.h"

unsigned long config_node_line(const yaml_node_t *node)
{
    return node ? (unsigned long)node->start_mark.line + 1 : 0;
}

const char *config_scalar_text(const yaml_node_t *node)
{
    return (const char *)node->data.scalar.value;
}

bool config_is_null(const yaml_node_t *node)
{
    const char *s;
    if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    s = config_scalar_text(node);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

bool config_looks_numeric(const char *s)
{
    if (*s == '-' || *s == '+')
        s++;
    if (!config_is_digit(*s) && !(*s == '.' && config_is_digit(s[1])))
        return false;
    for (; *s; s++)
        if (!config_is_digit(*s) && *s != '.' && *s != 'e' && *s != 'E' && *s != '-' && *s != '+')
            return false;
    return true;
}

const char *config_node_kind(const yaml_node_t *node)
{
    switch (node->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_SCALAR_NODE:
        if (config_is_null(node))
            return "no value";
        if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
            return "a quoted string";
        return config_looks_numeric(config_scalar_text(node)) ? "a number" : "a string";
    default:
        return "nothing";
    }
}

yaml_node_t *config_get_node(load_ctx *ctx, int index)
{
    return yaml_document_get_node(ctx->doc, index);
}

yaml_node_t *config_mapping_get(load_ctx *ctx, const yaml_node_t *map, const char *name)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *key = config_get_node(ctx, p->key);
        if (key && key->type == YAML_SCALAR_NODE && !strcmp(config_scalar_text(key), name))
            return config_get_node(ctx, p->value);
    }
    return NULL;
}

const char *config_want_string(load_ctx *ctx, const yaml_node_t *node, const char *path,
                               const char *what)
{
    if (node->type != YAML_SCALAR_NODE || config_is_null(node)) {
        config_report(ctx, config_node_line(node), "%s: expected %s, got %s", path, what,
                      config_node_kind(node));
        return NULL;
    }
    /* A "\0" escape would silently cut the C string short; refuse it instead. */
    if (strlen(config_scalar_text(node)) != node->data.scalar.length) {
        config_report(ctx, config_node_line(node), "%s: contains a NUL byte", path);
        return NULL;
    }
    return config_scalar_text(node);
}

bool config_want_mapping(load_ctx *ctx, const yaml_node_t *node, const char *path, const char *what)
{
    if (node->type == YAML_MAPPING_NODE)
        return true;
    config_report(ctx, config_node_line(node), "%s: expected %s, got %s", path, what,
                  config_node_kind(node));
    return false;
}

size_t config_pair_count(const yaml_node_t *map)
{
    return (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
}

unsigned long config_path_line(load_ctx *ctx, const yaml_node_t *map, const char *const *names)
{
    const yaml_node_t *node = map;
    for (size_t i = 0; node && names[i]; i++)
        node = config_mapping_get(ctx, node, names[i]);
    return node == map ? 0 : config_node_line(node);
}
