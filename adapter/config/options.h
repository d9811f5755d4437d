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

/* The keys of the file's top-level mapping; the base struct is config. */
extern const opt config_top_table[];

#endif
