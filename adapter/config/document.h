/*
 * document — reading the libyaml document a config file was loaded into.
 *
 * A node's line and text, its kind in words for messages ("a list", "a quoted string"), the
 * value under a key, and the shape checks that report "PATH: expected X, got Y". Every node
 * returned is borrowed from ctx->doc. Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_DOCUMENT_H
#define IDEMQ_CONFIG_DOCUMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "config/problems.h"

/* The 1-based line where node starts; 0 for NULL. */
unsigned long config_node_line(const yaml_node_t *node);

/* The text of a scalar node. */
const char *config_scalar_text(const yaml_node_t *node);

/* Whether node is a plain scalar that YAML reads as null: empty, ~, null, Null or NULL. */
bool config_is_null(const yaml_node_t *node);

/* Whether s looks like a number: an optional sign, digits, '.', an exponent. */
bool config_looks_numeric(const char *s);

/* What node is, for "got ..." in messages: "a mapping", "a list", "no value", "a quoted string",
 * "a number", "a string" or "nothing". */
const char *config_node_kind(const yaml_node_t *node);

/* The node at index in ctx->doc, or NULL. */
yaml_node_t *config_get_node(load_ctx *ctx, int index);

/* The value of the first pair of map whose key is the scalar name; NULL when there is none or
 * map is NULL or not a mapping. */
yaml_node_t *config_mapping_get(load_ctx *ctx, const yaml_node_t *map, const char *name);

/* The number of pairs in a mapping node. */
size_t config_pair_count(const yaml_node_t *map);

/* The text of a scalar that must hold a real string (a key, a name, a value), or NULL after
 * reporting why not; what names the expected thing in the message. */
const char *config_want_string(load_ctx *ctx, const yaml_node_t *node, const char *path,
                               const char *what);

/* Whether node is a mapping; when not, reports "PATH: expected WHAT, got ..." and returns false. */
bool config_want_mapping(load_ctx *ctx, const yaml_node_t *node, const char *path,
                         const char *what);

/* The 1-based line of the value at the key path names (NULL-terminated, e.g. {"mysql", "tls",
 * "ca_file", NULL}) below map; 0 when any step is missing. For checks that run after the walk
 * and must still name the line. */
unsigned long config_path_line(load_ctx *ctx, const yaml_node_t *map, const char *const *names);

#endif
