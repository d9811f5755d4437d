/*
 * yaml_json — converts a YAML subtree of the config (a plugin's `config:`) into JSON.
 *
 * Plain scalars are typed as a reader of the YAML would expect: null, true/false, an integer, a
 * number, or else a string; quoted scalars are always strings. A key given twice is a problem.
 * The syntax pre-pass (config.c) has already bounded the depth and refused aliases and tags.
 * Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_YAML_JSON_H
#define IDEMQ_CONFIG_YAML_JSON_H

#include <jansson.h>
#include <yaml.h>

#include "config/problems.h"

/* A new JSON value for node (returned owned: json_decref it), or NULL after reporting why. */
json_t *config_yaml_to_json(load_ctx *ctx, const yaml_node_t *node, const char *path);

#endif
