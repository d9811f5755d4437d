/*
 * dsn — see dsn.h. The URL grammar is config/url.c's (config_parse_mysql_url), shared with the
 * config loader's check of mysql.url.
 */
#include "db/dsn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/secrets.h"
#include "config/url.h"

_Static_assert(CONFIG_SECRET_MAX <= DB_PASSWORD_MAX, "a password file must fit db_dsn.password");
_Static_assert((int)DB_TLS_VERIFY_IDENTITY == (int)CONFIG_MYSQL_TLS_VERIFY_IDENTITY &&
                   (int)DB_TLS_DISABLED == (int)CONFIG_MYSQL_TLS_DISABLED &&
                   (int)DB_TLS_PREFERRED == (int)CONFIG_MYSQL_TLS_PREFERRED &&
                   (int)DB_TLS_REQUIRED == (int)CONFIG_MYSQL_TLS_REQUIRED &&
                   (int)DB_TLS_VERIFY_CA == (int)CONFIG_MYSQL_TLS_VERIFY_CA,
               "db_tls_mode follows config_mysql_tls_mode");

#define SAME_SIZE(field) (sizeof((db_dsn *)0)->field == sizeof((config_mysql_url *)0)->field)
_Static_assert(SAME_SIZE(user) && SAME_SIZE(password) && SAME_SIZE(host) && SAME_SIZE(database) &&
                   SAME_SIZE(socket),
               "db_dsn holds what config_parse_mysql_url parses");

int db_dsn_parse(const char *url, db_dsn *dsn, char *err, size_t err_len)
{
    config_mysql_url parts;
    char why[160];
    memset(dsn, 0, sizeof *dsn);
    if (config_parse_mysql_url(url, &parts, why, sizeof why) != 0) {
        snprintf(err, err_len, "mysql url: %s", why);
        return -1;
    }
    memcpy(dsn->user, parts.user, sizeof dsn->user);
    memcpy(dsn->password, parts.password, sizeof dsn->password);
    memcpy(dsn->host, parts.host, sizeof dsn->host);
    dsn->port = parts.port;
    memcpy(dsn->database, parts.database, sizeof dsn->database);
    memcpy(dsn->socket, parts.socket, sizeof dsn->socket);
    /* The parts hold a password: leave no copy on the stack. */
    explicit_bzero(&parts, sizeof parts);
    return 0;
}

int db_dsn_from_config(const config *cfg, db_dsn *dsn, char *err, size_t err_len)
{
    if (db_dsn_parse(cfg->mysql_urls[0], dsn, err, err_len) != 0)
        return -1;
    for (size_t i = 1; i < cfg->mysql_url_count && i < DB_MAX_NODES; i++) {
        db_dsn node;
        int rc = db_dsn_parse(cfg->mysql_urls[i], &node, err, err_len);
        explicit_bzero(node.password, sizeof node.password);
        if (rc != 0)
            return -1;
        db_node *n = &dsn->other_nodes[dsn->other_node_count++];
        memcpy(n->host, node.host, sizeof n->host);
        n->port = node.port;
        memcpy(n->socket, node.socket, sizeof n->socket);
    }
    if (cfg->mysql_password) {
        size_t n = strlen(cfg->mysql_password);
        if (n >= sizeof dsn->password) {
            snprintf(err, err_len, "mysql.password_file: the password is too long");
            return -1;
        }
        memcpy(dsn->password, cfg->mysql_password, n + 1);
    }
    dsn->read_timeout_s = (unsigned)(cfg->mysql_read_timeout_ms / 1000);
    dsn->tls = (db_tls){
        .mode = (db_tls_mode)cfg->mysql_tls.mode,
        .ca_file = cfg->mysql_tls.ca_file,
        .cert_file = cfg->mysql_tls.cert_file,
        .key_file = cfg->mysql_tls.key_file,
    };
    return 0;
}

size_t db_dsn_node_count(const db_dsn *dsn)
{
    return 1 + dsn->other_node_count;
}

void db_dsn_for_node(const db_dsn *dsn, size_t i, db_dsn *out)
{
    *out = *dsn;
    out->other_node_count = 0;
    if (i == 0)
        return;
    const db_node *n = &dsn->other_nodes[i - 1];
    memcpy(out->host, n->host, sizeof out->host);
    out->port = n->port;
    memcpy(out->socket, n->socket, sizeof out->socket);
}

void db_dsn_node_name(const db_dsn *dsn, size_t i, char *buf, size_t len)
{
    const char *host = i == 0 ? dsn->host : dsn->other_nodes[i - 1].host;
    const char *socket = i == 0 ? dsn->socket : dsn->other_nodes[i - 1].socket;
    unsigned port = i == 0 ? dsn->port : dsn->other_nodes[i - 1].port;
    if (socket[0])
        snprintf(buf, len, "%s", socket);
    else if (strchr(host, ':'))
        snprintf(buf, len, "[%s]:%u", host, port); /* IPv6, as the URL writes it */
    else
        snprintf(buf, len, "%s:%u", host, port);
}
