/*
 * handler — see handler.h.
 */
#include "config/handler.h"

#include <stddef.h>

#include "config/config.h"
#include "config/document.h"
#include "config/handler_plugin.h"
#include "config/handler_sql.h"
#include "config/handler_state_machine.h"
#include "config/text.h"

_Static_assert(sizeof(config_handler_type) == sizeof(int), "enums are stored as int");

const char *const config_handler_type_names[] = {"state_machine", "sql", "plugin", NULL};

const opt_variant config_handler_variants[] = {
    [CONFIG_HANDLER_STATE_MACHINE] = {config_state_machine_table, config_validate_state_machine},
    [CONFIG_HANDLER_SQL] = {config_sql_table, NULL},
    [CONFIG_HANDLER_PLUGIN] = {config_plugin_table, config_validate_plugin},
};

#define HANDLER_TYPES (sizeof config_handler_variants / sizeof config_handler_variants[0])

_Static_assert(HANDLER_TYPES + 1 ==
                   sizeof config_handler_type_names / sizeof config_handler_type_names[0],
               "one variant per handler type name");

void config_parse_handler(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                          const char *path)
{
    const opt type_opt = {.name = "type",
                          .type = OPT_ENUM,
                          .offset = offsetof(config_handler, type),
                          .names = o->names,
                          .help = "handler type"};
    config_handler *h = &((config_consumer *)base)->handler;
    const opt_variant *variant = NULL;
    yaml_node_t *type;
    char tpath[KEY_PATH_MAX];
    size_t before = ctx->total;

    if (!config_want_mapping(ctx, node, path,
                             "a mapping with type: state_machine, sql or plugin and its settings"))
        return;
    type = config_mapping_get(ctx, node, "type");
    if (type) {
        /* An unknown type says nothing about which other keys belong: stop at one error. */
        config_join_path(tpath, sizeof tpath, path, "type");
        config_apply_node(ctx, &type_opt, type, h, tpath, config_node_line(type));
        if (ctx->total > before)
            return;
    }
    for (size_t i = 0; o->names[i]; i++)
        if ((int)i == (int)h->type)
            variant = &o->variants[i];
    if (!variant || !variant->table) {
        config_report(ctx, config_node_line(node), "internal error: no table for handler type %d",
                      h->type);
        return;
    }
    config_apply_defaults(ctx, variant->table, h);
    config_walk_table(ctx, variant->table, node, h, path, config_node_line(node));
    if (variant->validate)
        variant->validate(ctx, node, h, path);
}
