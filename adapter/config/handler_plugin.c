/*
 * handler_plugin — see handler_plugin.h.
 */
#include "config/handler_plugin.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/document.h"
#include "config/text.h"
#include "config/yaml_json.h"

#define PLUGIN_PATH_MAX 4096

/* A plugin is loaded by absolute path only: a relative one would depend on the working directory
 * and a bare name on the dynamic loader's search path. */
static int check_plugin_path(const char *text, char *err, size_t err_len)
{
    char shown[128];
    if (config_check_bounded(text, PLUGIN_PATH_MAX, "plugin path", err, err_len) < 0)
        return -1;
    if (text[0] != '/') {
        snprintf(err, err_len, "plugin path '%s' must be absolute (start with /)",
                 config_show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

static void parse_plugin_config(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                                const char *path);

/* clang-format off */
/* Entries of a plugin handler; the base struct is config_handler. */
const opt config_plugin_table[] = {
    {.name = "type", .type = OPT_CUSTOM, .parse = config_parse_skip, .help = "handler type"},
    {.name = "path", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_handler, plugin.path), .check = check_plugin_path,
     .help = "absolute path of the plugin's shared object"},
    {.name = "config", .type = OPT_CUSTOM, .parse = parse_plugin_config,
     .help = "any YAML; passed to the plugin's init as JSON text"},
    {0},
};
/* clang-format on */

static void parse_plugin_config(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                                const char *path)
{
    config_plugin *plugin = &((config_handler *)base)->plugin;
    json_t *tree = config_yaml_to_json(ctx, node, path);
    (void)o;

    if (!tree)
        return;
    free(plugin->config_json);
    plugin->config_json = json_dumps(tree, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    json_decref(tree);
    if (!plugin->config_json)
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
}

void config_validate_plugin(load_ctx *ctx, yaml_node_t *node, void *base, const char *path)
{
    config_plugin *plugin = &((config_handler *)base)->plugin;

    if (!plugin->config_json && !(plugin->config_json = strdup("{}")))
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
}
