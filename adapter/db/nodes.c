/*
 * nodes — see nodes.h.
 */
#include "db/nodes.h"

#include <errmsg.h>
#include <mysqld_error.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ops/log.h"

#define NODE_NAME_MAX 520

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static char current_name[NODE_NAME_MAX]; /* "" before the first connection */
static uint64_t failovers;
static uint64_t conflicts;

/* Runs sql on db and copies the first row's columns (at most n, NULL as "") into values.
 * Returns 0, or the MySQL error number (0 rows: CR_NO_RESULT_SET-like -1u). */
static unsigned query_row(MYSQL *db, const char *sql, char values[][64], size_t n)
{
    if (mysql_query(db, sql) != 0)
        return mysql_errno(db);
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    unsigned fields = res ? mysql_num_fields(res) : 0;
    for (size_t i = 0; i < n; i++)
        snprintf(values[i], 64, "%s", row && i < fields && row[i] ? row[i] : "");
    if (res)
        mysql_free_result(res);
    return row ? 0 : (unsigned)-1;
}

/* Galera (MariaDB with wsrep_on): the node must be ready and in the primary component, or
 * every statement fails with 1047 (or, with dirty reads on, a write does). */
static unsigned check_galera(MYSQL *db, char *err, size_t err_len)
{
    if (mysql_query(db, "SHOW GLOBAL STATUS WHERE Variable_name IN "
                        "('wsrep_ready', 'wsrep_cluster_status')") != 0) {
        unsigned number = mysql_errno(db);
        snprintf(err, err_len, "checking the Galera state: MySQL error %u: %s", number,
                 mysql_error(db));
        return number;
    }
    MYSQL_RES *res = mysql_store_result(db);
    char ready[64] = "", status[64] = "";
    MYSQL_ROW row;
    while (res && (row = mysql_fetch_row(res))) {
        if (!row[0] || !row[1])
            continue;
        if (strcasecmp(row[0], "wsrep_ready") == 0)
            snprintf(ready, sizeof ready, "%s", row[1]);
        else if (strcasecmp(row[0], "wsrep_cluster_status") == 0)
            snprintf(status, sizeof status, "%s", row[1]);
    }
    if (res)
        mysql_free_result(res);
    if (strcasecmp(ready, "ON") != 0 || strcasecmp(status, "Primary") != 0) {
        snprintf(err, err_len,
                 "the Galera node is not ready for writes (wsrep_ready %s, wsrep_cluster_status "
                 "%s): it is outside the primary component or still joining",
                 ready[0] ? ready : "?", status[0] ? status : "?");
        return DB_NODE_NOT_READY;
    }
    return 0;
}

unsigned db_node_check_writable(MYSQL *db, char *err, size_t err_len)
{
    const char *info = mysql_get_server_info(db);
    bool mariadb = info && strstr(info, "MariaDB");
    char values[2][64];
    unsigned number;
    /* MariaDB has no super_read_only; MySQL has no wsrep_on. */
    number = query_row(db,
                       mariadb ? "SELECT @@global.read_only, @@global.wsrep_on"
                               : "SELECT @@global.read_only, @@global.super_read_only",
                       values, 2);
    if (number == ER_UNKNOWN_SYSTEM_VARIABLE && mariadb) {
        /* A MariaDB built without wsrep: no Galera to ask about. */
        number = query_row(db, "SELECT @@global.read_only", values, 1);
        values[1][0] = '\0';
    }
    if (number != 0) {
        if (number == (unsigned)-1) {
            snprintf(err, err_len, "checking read_only: the server returned no row");
            number = CR_UNKNOWN_ERROR;
        } else {
            snprintf(err, err_len, "checking read_only: MySQL error %u: %s", number,
                     mysql_error(db));
        }
        mysql_rollback(db);
        return number;
    }
    bool read_only = strcmp(values[0], "0") != 0;
    bool second_on = values[1][0] && strcmp(values[1], "0") != 0;
    if (read_only || (!mariadb && second_on)) {
        snprintf(err, err_len,
                 "the server is read-only (%s): a replica, or a cluster member that is not the "
                 "primary",
                 !mariadb && second_on ? "super_read_only = 1" : "read_only = 1");
        mysql_rollback(db);
        return DB_NODE_READ_ONLY;
    }
    number = mariadb && second_on ? check_galera(db, err, err_len) : 0;
    mysql_rollback(db); /* the reads opened a transaction: autocommit is off */
    return number;
}

size_t db_nodes_first(const db_dsn *dsn)
{
    char name[NODE_NAME_MAX];
    size_t n = db_dsn_node_count(dsn), first = 0;
    pthread_mutex_lock(&state_lock);
    for (size_t i = 0; i < n && current_name[0]; i++) {
        db_dsn_node_name(dsn, i, name, sizeof name);
        if (strcmp(name, current_name) == 0) {
            first = i;
            break;
        }
    }
    pthread_mutex_unlock(&state_lock);
    return first;
}

void db_nodes_connected(const db_dsn *dsn, size_t i)
{
    char name[NODE_NAME_MAX], before[NODE_NAME_MAX];
    db_dsn_node_name(dsn, i, name, sizeof name);
    pthread_mutex_lock(&state_lock);
    bool changed = strcmp(name, current_name) != 0;
    snprintf(before, sizeof before, "%s", current_name);
    if (changed) {
        snprintf(current_name, sizeof current_name, "%s", name);
        if (before[0])
            failovers++;
    }
    pthread_mutex_unlock(&state_lock);
    if (!changed || db_dsn_node_count(dsn) < 2)
        return; /* one server: its name is in every connect error already */
    if (before[0])
        log_warn(LOG_NO_CONTEXT, "MySQL node in use is now %s (node %zu of %zu; was %s)", name,
                 i + 1, db_dsn_node_count(dsn), before);
    else
        log_info(LOG_NO_CONTEXT, "MySQL node in use: %s (node %zu of %zu)", name, i + 1,
                 db_dsn_node_count(dsn));
}

void db_nodes_current(char *buf, size_t len)
{
    pthread_mutex_lock(&state_lock);
    snprintf(buf, len, "%s", current_name);
    pthread_mutex_unlock(&state_lock);
}

uint64_t db_nodes_failovers(void)
{
    pthread_mutex_lock(&state_lock);
    uint64_t n = failovers;
    pthread_mutex_unlock(&state_lock);
    return n;
}

void db_nodes_count_conflict(void)
{
    pthread_mutex_lock(&state_lock);
    conflicts++;
    pthread_mutex_unlock(&state_lock);
}

uint64_t db_nodes_conflicts(void)
{
    pthread_mutex_lock(&state_lock);
    uint64_t n = conflicts;
    pthread_mutex_unlock(&state_lock);
    return n;
}
