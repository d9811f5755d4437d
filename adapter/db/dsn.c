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
    if (db_dsn_parse(cfg->mysql_url, dsn, err, err_len) != 0)
        return -1;
    if (cfg->mysql_password) {
        size_t n = strlen(cfg->mysql_password);
        if (n >= sizeof dsn->password) {
            snprintf(err, err_len, "mysql.password_file: the password is too long");
            return -1;
        }
        memcpy(dsn->password, cfg->mysql_password, n + 1);
    }
    dsn->tls = (db_tls){
        .mode = (db_tls_mode)cfg->mysql_tls.mode,
        .ca_file = cfg->mysql_tls.ca_file,
        .cert_file = cfg->mysql_tls.cert_file,
        .key_file = cfg->mysql_tls.key_file,
    };
    return 0;
}
