/*
 * consumers — the `consumers` list: one work queue each, its retry schedule and its handler.
 *
 * Each item is walked against config_consumer_table (its `handler` goes to handler.h); then the
 * retry schedule is checked as a whole, and the list across consumers: a queue consumed twice,
 * or one that is another consumer's retry or dead-letter queue, would make the topology fight
 * itself. Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_CONSUMERS_H
#define IDEMQ_CONFIG_CONSUMERS_H

#include "config/table.h"

/* The keys of one consumer; the base struct is config_consumer. */
extern const opt config_consumer_table[];

/* The parse_fn of `consumers` (base: config): fills cfg->consumers, each item against o->items. */
void config_parse_consumers(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path);

#endif
