/*
 * client — see db/client.h.
 */
#include "db/client.h"

#include "db/dsn.h"

#if IDEMQ_DB_CLIENT_IS_MARIADB

void db_client_apply_tls(MYSQL *db, const db_client_tls *tls)
{
    /* Connector/C 3.3 starts TLS as soon as any TLS option is set and 3.4 verifies by default,
     * so "off" is said explicitly; it verifies the chain whenever a CA is set, and the host name
     * only with VERIFY_SERVER_CERT. */
    my_bool yes = 1, no = 0, verify_name = tls->mode == DB_TLS_VERIFY_IDENTITY;
    if (tls->mode == DB_TLS_DISABLED) {
        mysql_optionsv(db, MYSQL_OPT_SSL_ENFORCE, &no);
        mysql_optionsv(db, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &no);
        return;
    }
    mysql_optionsv(db, MYSQL_OPT_SSL_ENFORCE, &yes);
    mysql_optionsv(db, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify_name);
    if (tls->ca_file)
        mysql_optionsv(db, MYSQL_OPT_SSL_CA, tls->ca_file);
    if (tls->cert_file)
        mysql_optionsv(db, MYSQL_OPT_SSL_CERT, tls->cert_file);
    if (tls->key_file)
        mysql_optionsv(db, MYSQL_OPT_SSL_KEY, tls->key_file);
}

int db_client_socket(MYSQL *db)
{
    return db ? (int)mysql_get_socket(db) : -1;
}

const char *db_client_library(void)
{
    return "MariaDB Connector/C";
}

#else /* Oracle's libmysqlclient */

void db_client_apply_tls(MYSQL *db, const db_client_tls *tls)
{
    static const unsigned modes[] = {
        [DB_TLS_DISABLED] = SSL_MODE_DISABLED,   [DB_TLS_PREFERRED] = SSL_MODE_PREFERRED,
        [DB_TLS_REQUIRED] = SSL_MODE_REQUIRED,   [DB_TLS_VERIFY_CA] = SSL_MODE_VERIFY_CA,
        [DB_TLS_VERIFY_IDENTITY] = SSL_MODE_VERIFY_IDENTITY,
    };
    unsigned mode = (unsigned)tls->mode < sizeof modes / sizeof modes[0] ? modes[tls->mode]
                                                                         : SSL_MODE_REQUIRED;
    mysql_options(db, MYSQL_OPT_SSL_MODE, &mode);
    /* Without TLS a caching_sha2_password login (the default since MySQL 8.0) that misses the
     * server's cache must encrypt the password with the server's RSA key; unless asked, the
     * client refuses with "Authentication requires secure connection" (2061). Fetching the key
     * over the same plaintext connection trusts the network as much as mode disabled already
     * does. */
    bool fetch_key = true;
    mysql_options(db, MYSQL_OPT_GET_SERVER_PUBLIC_KEY, &fetch_key);
    if (tls->mode == DB_TLS_DISABLED)
        return;
    if (tls->ca_file)
        mysql_options(db, MYSQL_OPT_SSL_CA, tls->ca_file);
    if (tls->cert_file)
        mysql_options(db, MYSQL_OPT_SSL_CERT, tls->cert_file);
    if (tls->key_file)
        mysql_options(db, MYSQL_OPT_SSL_KEY, tls->key_file);
}

int db_client_socket(MYSQL *db)
{
    return db ? (int)db->net.fd : -1;
}

const char *db_client_library(void)
{
    return "libmysqlclient";
}

#endif
