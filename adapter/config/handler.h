/*
 * handler — a consumer's `handler:` mapping, whose `type` picks the table for the rest.
 *
 * The type (state_machine when absent) is read first; an unknown one stops there, since it says
 * nothing about which other keys belong. The mapping is then walked against that type's table
 * and checked by that type's validate function, one file per type beside this one (h2o's
 * configurator per handler): handler_state_machine.h, handler_sql.h, handler_plugin.h.
 * Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_HANDLER_H
#define IDEMQ_CONFIG_HANDLER_H

#include "config/table.h"

/* The words of `type`, index = config_handler_type; NULL-terminated. */
extern const char *const config_handler_type_names[];

/* config_handler_variants[t] is the table and validation of type t. */
extern const opt_variant config_handler_variants[];

/* The parse_fn of `handler` (base: config_consumer): o->names and o->variants are the two
 * arrays above. */
void config_parse_handler(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                          const char *path);

#endif
