/*
 * plugin_statements — one worker's cache of the statements plugins ran through exec(): up to
 * PLUGIN_STATEMENTS_MAX prepared statements on that worker's connection, keyed by their SQL
 * text, the least recently used one closed to make room; and the parameter arrays exec() binds
 * them with, grown to the widest statement seen, so a message allocates nothing for them.
 * Errors: plugin_statements_get returns 0 or a negative code (below), as db_prepare does.
 * Thread affinity: the DB worker that owns the connection.
 */
#ifndef IDEMQ_HANDLERS_PLUGIN_STATEMENTS_H
#define IDEMQ_HANDLERS_PLUGIN_STATEMENTS_H

#include <mysql.h>

#include "db/bind.h"
#include "db/error.h"

#define PLUGIN_STATEMENTS_MAX 32

typedef struct plugin_statements plugin_statements;

/* An empty cache, owned by the caller, or NULL when out of memory. */
plugin_statements *plugin_statements_new(void);

/* Closes every cached statement and frees the cache. plugin_statements_free(NULL) is a no-op. */
void plugin_statements_free(plugin_statements *cache);

/*
 * The prepared statement for sql (borrowed) on db (borrowed; the connection the cache's
 * statements belong to): from the cache, or freshly prepared and cached. Returns 0 with the
 * statement (owned by the cache) in *out; -ENOMEM when out of memory; -1 when the server refused
 * it, with its error in *error (see db_prepare).
 */
int plugin_statements_get(plugin_statements *cache, MYSQL *db, const char *sql, MYSQL_STMT **out,
                          db_error *error);

/* Parameter scratch for count parameters (count >= 1), owned by the cache and valid until the
 * next call: *binds and *slots (slots zeroed). Returns 0, or -ENOMEM. */
int plugin_statements_binds(plugin_statements *cache, size_t count, MYSQL_BIND **binds,
                            db_bind_slot **slots);

#endif
