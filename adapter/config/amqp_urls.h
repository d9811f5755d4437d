/*
 * amqp_urls — the broker nodes: `amqp.url` (one) or `amqp.urls` (a list), or IDEMQ_AMQP_URL.
 *
 * Both keys fill config.amqp_urls: the walker stores `url` into its first slot (an ordinary
 * string option), config_parse_amqp_urls fills it from the list, and once the whole file has
 * been walked config_finish_amqp_urls settles the rest: exactly one of the two keys, the
 * environment override, duplicates, and amqp_url_count. Every URL is checked on its own and
 * reported with its line (a list item at the item's line).
 *
 * IDEMQ_AMQP_URL may hold a comma-separated list: a container gets one variable for the whole
 * cluster, as with a file's `urls`. A comma cannot be part of a URL's host or port, and a
 * password that holds one writes it percent-encoded (%2C), which rabbitmq-c decodes. When set
 * (non-empty) it replaces whichever key the file gave. Internal to config/. Thread affinity: the
 * loading thread (getenv).
 */
#ifndef IDEMQ_CONFIG_AMQP_URLS_H
#define IDEMQ_CONFIG_AMQP_URLS_H

#include <stddef.h>
#include <yaml.h>

#include "config/table.h"

#define AMQP_URLS_ENV "IDEMQ_AMQP_URL"

/* Checks one broker URL: amqp:// or amqps://, a host, a valid port. Returns 0, or -1 with the
 * reason (the URL redacted) in err. */
int config_check_amqp_url(const char *text, char *err, size_t err_len);

/* The parse_fn of `amqp.urls` (base: config): a list of 1..CONFIG_MAX_AMQP_URLS URLs into
 * cfg->amqp_urls. */
void config_parse_amqp_urls(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path);

/* After the walk of the whole file (root: its top-level mapping, borrowed): reports a missing
 * or doubly given URL, applies IDEMQ_AMQP_URL, rejects duplicate nodes and sets
 * cfg->amqp_url_count. */
void config_finish_amqp_urls(load_ctx *ctx, yaml_node_t *root, void *base);

#endif
