/*
 * plugin_statements — see handlers/plugin_statements.h.
 */
#include "handlers/plugin_statements.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "db/prepare.h"

typedef struct cached_stmt {
    char *sql;
    MYSQL_STMT *stmt;
    uint64_t used;
} cached_stmt;

struct plugin_statements {
    cached_stmt cache[PLUGIN_STATEMENTS_MAX];
    uint64_t tick;
    MYSQL_BIND *binds;
    db_bind_slot *slots;
    size_t bind_cap;
};

plugin_statements *plugin_statements_new(void)
{
    return calloc(1, sizeof(plugin_statements));
}

void plugin_statements_free(plugin_statements *cache)
{
    if (!cache)
        return;
    for (size_t i = 0; i < PLUGIN_STATEMENTS_MAX; i++) {
        if (cache->cache[i].stmt)
            mysql_stmt_close(cache->cache[i].stmt);
        free(cache->cache[i].sql);
    }
    free(cache->binds);
    free(cache->slots);
    free(cache);
}

int plugin_statements_binds(plugin_statements *cache, size_t count, MYSQL_BIND **binds,
                            db_bind_slot **slots)
{
    if (count > cache->bind_cap) {
        MYSQL_BIND *b = calloc(count, sizeof *b);
        db_bind_slot *sl = calloc(count, sizeof *sl);
        if (!b || !sl) {
            free(b);
            free(sl);
            return -ENOMEM;
        }
        free(cache->binds);
        free(cache->slots);
        cache->binds = b;
        cache->slots = sl;
        cache->bind_cap = count;
    }
    memset(cache->slots, 0, count * sizeof *cache->slots);
    *binds = cache->binds;
    *slots = cache->slots;
    return 0;
}

int plugin_statements_get(plugin_statements *cache, MYSQL *db, const char *sql, MYSQL_STMT **out,
                          db_error *error)
{
    cached_stmt *slot = &cache->cache[0];
    MYSQL_STMT *stmt;
    *out = NULL;
    cache->tick++;
    for (size_t i = 0; i < PLUGIN_STATEMENTS_MAX; i++) {
        cached_stmt *c = &cache->cache[i];
        if (c->sql && strcmp(c->sql, sql) == 0) {
            c->used = cache->tick;
            *out = c->stmt;
            return 0;
        }
        if (!c->sql || (slot->sql && c->used < slot->used))
            slot = c;
    }
    int rc = db_prepare(db, sql, &stmt, error);
    if (rc != 0)
        return rc;
    char *copy = strdup(sql);
    if (!copy) {
        mysql_stmt_close(stmt);
        return -ENOMEM;
    }
    if (slot->sql) {
        mysql_stmt_close(slot->stmt);
        free(slot->sql);
    }
    slot->sql = copy;
    slot->stmt = stmt;
    slot->used = cache->tick;
    *out = stmt;
    return 0;
}
