/*
 * dsn — see dsn.h. User and password are percent-decoded so passwords may hold any byte but NUL.
 */
#include "db/dsn.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/secrets.h"

_Static_assert(CONFIG_SECRET_MAX <= DB_PASSWORD_MAX, "a password file must fit db_dsn.password");
_Static_assert((int)DB_TLS_VERIFY_IDENTITY == (int)CONFIG_MYSQL_TLS_VERIFY_IDENTITY &&
                   (int)DB_TLS_DISABLED == (int)CONFIG_MYSQL_TLS_DISABLED &&
                   (int)DB_TLS_PREFERRED == (int)CONFIG_MYSQL_TLS_PREFERRED &&
                   (int)DB_TLS_REQUIRED == (int)CONFIG_MYSQL_TLS_REQUIRED &&
                   (int)DB_TLS_VERIFY_CA == (int)CONFIG_MYSQL_TLS_VERIFY_CA,
               "db_tls_mode follows config_mysql_tls_mode");

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Decodes [begin, end) into out (NUL-terminated). Returns -1 when it does not fit or is bad. */
static int percent_decode(const char *begin, const char *end, char *out, size_t out_len)
{
    size_t n = 0;
    for (const char *p = begin; p < end; p++) {
        char c = *p;
        if (c == '%') {
            if (end - p < 3 || hex_value(p[1]) < 0 || hex_value(p[2]) < 0)
                return -1;
            c = (char)(hex_value(p[1]) * 16 + hex_value(p[2]));
            if (c == '\0')
                return -1;
            p += 2;
        }
        if (n + 1 >= out_len)
            return -1;
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

int db_dsn_parse(const char *url, db_dsn *dsn, char *err, size_t err_len)
{
    static const char scheme[] = "mysql://";
    memset(dsn, 0, sizeof *dsn);
    dsn->port = 3306;
    if (strncmp(url, scheme, sizeof scheme - 1) != 0) {
        snprintf(err, err_len, "mysql url must start with mysql://");
        return -1;
    }
    const char *p = url + sizeof scheme - 1;
    /* The user-info rule of config/url.h, which amqp_parse_url follows too: one raw '@' at most,
     * ending user[:password]; the user ends at the first ':'; reserved characters inside them
     * are percent-encoded. */
    const char *at = strchr(p, '@');
    if (at && strchr(at + 1, '@')) {
        snprintf(err, err_len,
                 "mysql url: more than one '@' (write an '@' in the user, password "
                 "or socket path as %%40)");
        return -1;
    }
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *user_end = colon ? colon : at;
        if (strcspn(p, "/?#[]") < (size_t)(at - p) ||
            (colon && memchr(colon + 1, ':', (size_t)(at - colon - 1)))) {
            snprintf(err, err_len, "mysql url: user or password is not percent-encoded");
            return -1;
        }
        if (percent_decode(p, user_end, dsn->user, sizeof dsn->user) < 0 ||
            (colon && percent_decode(colon + 1, at, dsn->password, sizeof dsn->password) < 0)) {
            snprintf(err, err_len, "mysql url: user or password is malformed or too long");
            return -1;
        }
        p = at + 1;
    }
    const char *authority_end = p + strcspn(p, "/?");
    const char *host_end = authority_end;
    const char *port_colon = memchr(p, ':', (size_t)(authority_end - p));
    if (port_colon) {
        char *end = NULL;
        long port = strtol(port_colon + 1, &end, 10);
        if (end != authority_end || port < 1 || port > 65535) {
            snprintf(err, err_len, "mysql url: port must be 1..65535");
            return -1;
        }
        dsn->port = (unsigned)port;
        host_end = port_colon;
    }
    if ((size_t)(host_end - p) >= sizeof dsn->host) {
        snprintf(err, err_len, "mysql url: host is too long");
        return -1;
    }
    memcpy(dsn->host, p, (size_t)(host_end - p));
    if (dsn->host[0] == '\0')
        strcpy(dsn->host, "127.0.0.1");
    p = authority_end;
    if (*p == '/') {
        p++;
        size_t len = strcspn(p, "?");
        if (percent_decode(p, p + len, dsn->database, sizeof dsn->database) < 0) {
            snprintf(err, err_len, "mysql url: database name is malformed or too long");
            return -1;
        }
        p += len;
    }
    if (dsn->database[0] == '\0') {
        snprintf(err, err_len, "mysql url: a database name is required (mysql://…/DATABASE)");
        return -1;
    }
    while (*p == '?' || *p == '&') {
        p++;
        size_t len = strcspn(p, "&");
        static const char socket_key[] = "socket=";
        if (strncmp(p, socket_key, sizeof socket_key - 1) == 0) {
            if (percent_decode(p + sizeof socket_key - 1, p + len, dsn->socket,
                               sizeof dsn->socket) < 0) {
                snprintf(err, err_len, "mysql url: socket path is malformed or too long");
                return -1;
            }
        } else if (len > 0) {
            snprintf(err, err_len, "mysql url: unknown parameter '%.*s' (known: socket)",
                     (int)(strcspn(p, "=&") > 64 ? 64 : strcspn(p, "=&")), p);
            return -1;
        }
        p += len;
    }
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
