/*
 * node_urls — the nodes of a cluster, for the broker (`amqp.url` or `amqp.urls`, or
 * IDEMQ_AMQP_URL) and for the database (`mysql.url` or `mysql.urls`, or IDEMQ_MYSQL_URL).
 *
 * Both keys of a section fill one array of the config: the walker stores `url` into its first
 * slot (an ordinary string option), config_parse_*_urls fills it from the list, and once the
 * whole file has been walked config_finish_node_urls settles the rest: exactly one of the two
 * keys, the environment override, duplicates, and the count. Every URL is checked on its own
 * and reported with its line (a list item at the item's line).
 *
 * The environment variable may hold a comma-separated list: a container gets one variable for
 * the whole cluster, as with a file's `urls`. A comma cannot be part of a URL's host or port,
 * and a password that holds one writes it percent-encoded (%2C). When set (non-empty) it
 * replaces whichever key the file gave.
 *
 * The database's nodes are one cluster reached with one account: their URLs must name the same
 * user, password and database (only host, port and socket differ), because every connection
 * idemq makes may land on any of them. Internal to config/. Thread affinity: the loading thread
 * (getenv).
 */
#ifndef IDEMQ_CONFIG_NODE_URLS_H
#define IDEMQ_CONFIG_NODE_URLS_H

#include <stddef.h>
#include <yaml.h>

#include "config/table.h"

#define AMQP_URLS_ENV "IDEMQ_AMQP_URL"
#define MYSQL_URLS_ENV "IDEMQ_MYSQL_URL"

/* Checks one broker URL: amqp:// or amqps://, a host, a valid port. Returns 0, or -1 with the
 * reason (the URL redacted) in err. */
int config_check_amqp_url(const char *text, char *err, size_t err_len);

/* Checks one database URL: mysql://, a host or socket, a database, known parameters. Returns 0,
 * or -1 with the reason (the URL redacted) in err. */
int config_check_mysql_url(const char *text, char *err, size_t err_len);

/* The parse_fn of `amqp.urls` (base: config): a list of 1..CONFIG_MAX_AMQP_URLS URLs into
 * cfg->amqp_urls. */
void config_parse_amqp_urls(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path);

/* The parse_fn of `mysql.urls` (base: config): a list of 1..CONFIG_MAX_MYSQL_URLS URLs into
 * cfg->mysql_urls. */
void config_parse_mysql_urls(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                             const char *path);

/* After the walk of the whole file (root: its top-level mapping, borrowed), for the broker and
 * then the database: reports a missing or doubly given URL, applies the environment, rejects
 * duplicate nodes (and database nodes that disagree on the account) and sets the counts. */
void config_finish_node_urls(load_ctx *ctx, yaml_node_t *root, void *base);

#endif
