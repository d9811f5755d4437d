/*
 * emit — the `emit:` list of a state-machine transition or of a sql handler: the downstream
 * messages written to the outbox with the business update (config.h, config_emit).
 *
 * Each item is {name, exchange, routing_key, content_type: json|msgpack, fields: {KEY: SOURCE}},
 * where SOURCE is a dotted path into the incoming message (a string) or {value: CONSTANT} (any
 * YAML). A single mapping is accepted for a list of one. Names are 1..64 bytes of
 * [A-Za-z0-9._-] and unique within their list (they are part of the outgoing biz_key); the key
 * "biz_key" is idemq's. Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_EMIT_H
#define IDEMQ_CONFIG_EMIT_H

#include <stddef.h>

#include "config/config.h"
#include "config/table.h"

/* Parses node (the value of an `emit:` key at path) into a new array in *emits / *count. */
void config_parse_emit_list(load_ctx *ctx, yaml_node_t *node, const char *path, config_emit **emits,
                            size_t *count);

/* Frees emits[0..count) and the array. */
void config_free_emits(config_emit *emits, size_t count);

/* The keys of one emit (for the reference). */
extern const opt config_emit_table[];

#endif
