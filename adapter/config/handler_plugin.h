/*
 * handler_plugin — the keys of a plugin handler: the shared object's path and its config.
 *
 * A plugin is loaded by absolute path only. Its `config:` subtree, any YAML, is stored as JSON
 * text for the plugin's init (yaml_json.h); "{}" when absent. Internal to config/. Thread
 * affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_HANDLER_PLUGIN_H
#define IDEMQ_CONFIG_HANDLER_PLUGIN_H

#include "config/table.h"

/* The keys of a plugin handler; the base struct is config_handler. */
extern const opt config_plugin_table[];

/* Completes a walked plugin handler (base: config_handler): an absent config becomes "{}". */
void config_validate_plugin(load_ctx *ctx, yaml_node_t *node, void *base, const char *path);

#endif
