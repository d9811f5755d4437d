/*
 * options — the top-level table: amqp, mysql, log, http, shutdown_timeout, consumers, dedup.
 *
 * The small sections live here with their own rules (which URL schemes each connection takes,
 * the listen address); the consumers list has its own file (consumers.h). The walk of a file
 * starts at config_top_table, and so does the reference (reference.c). Internal to config/.
 * Thread affinity: none (constant tables).
 */
#ifndef IDEMQ_CONFIG_OPTIONS_H
#define IDEMQ_CONFIG_OPTIONS_H

#include "config/table.h"

struct config;

/* The keys of the file's top-level mapping; the base struct is config. */
extern const opt config_top_table[];

/* After the whole walk (environment overrides applied): amqp.tls as a whole. cert_file and
 * key_file must come together, and a tls block needs an amqps:// URL — a plain amqp:// URL
 * would silently ignore it. root is the document's top mapping (borrowed). Reports into ctx. */
void config_validate_amqp_tls(load_ctx *ctx, const struct config *cfg, yaml_node_t *root);

/* After the whole walk: mysql.batch against amqp.prefetch. A batch given in the file must fit
 * (workers × batch <= prefetch) or is reported at its line; the default is lowered to prefetch /
 * workers (at least 1) instead. root is the document's top mapping (borrowed). */
void config_validate_batch(load_ctx *ctx, yaml_node_t *root, struct config *cfg);

/* dedup.cache_ttl must stay below dedup.retention when both are on. */
void config_validate_dedup_cache(load_ctx *ctx, yaml_node_t *root, const struct config *cfg);

/* Sets each consumer's may_emit and cfg->outbox_needed (a plugin may emit through host->emit). */
void config_finish_outbox(load_ctx *ctx, yaml_node_t *root, struct config *cfg);

#endif
