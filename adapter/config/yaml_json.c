/*
 * yaml_json — see yaml_json.h.
 */
#include "config/yaml_json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config/document.h"
#include "config/text.h"

/* A plain YAML scalar as the JSON value a reader of the YAML would expect: null, true/false,
 * an integer, a number, or else a string. Quoted scalars are always strings. */
static json_t *scalar_to_json(const yaml_node_t *node)
{
    const char *s = config_scalar_text(node);
    char *end = NULL;

    if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return json_stringn(s, node->data.scalar.length);
    if (config_is_null(node))
        return json_null();
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
        return json_true();
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
        return json_false();
    if (config_looks_numeric(s)) {
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
json_t *config_yaml_to_json(load_ctx *ctx, const yaml_node_t *node, const char *path)
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
            yaml_node_t *item = config_get_node(ctx, *it);
            json_t *v = item ? config_yaml_to_json(ctx, item, path) : json_null();
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
            yaml_node_t *key = config_get_node(ctx, p->key),
                        *value = config_get_node(ctx, p->value);
            const char *name;
            json_t *v;
            if (!key || !value)
                continue;
            name = config_want_string(ctx, key, path, "a key name");
            if (!name) {
                json_decref(out);
                return NULL;
            }
            if (json_object_get(out, name)) {
                char shown[128];
                config_report(ctx, config_node_line(key), "%s: key '%s' is given twice", path,
                              config_show(shown, sizeof shown, name));
                json_decref(out);
                return NULL;
            }
            v = config_yaml_to_json(ctx, value, path);
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
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
    return out;
}
