/*
 * client — the one seam between idemq and the MySQL client library it was built with: MariaDB
 * Connector/C (Debian's default-libmysqlclient-dev) or Oracle's libmysqlclient (8.0 and later).
 * The two share the classic C API but differ in a few places, and every difference lives here:
 *   - the type of a bound parameter's null flag: my_bool (Connector/C) or bool (libmysqlclient,
 *     which dropped my_bool in 8.0);
 *   - TLS options: Connector/C's MYSQL_OPT_SSL_ENFORCE and MYSQL_OPT_SSL_VERIFY_SERVER_CERT
 *     against libmysqlclient's single MYSQL_OPT_SSL_MODE, which has the same five modes as
 *     mysql.tls.mode;
 *   - a connection's socket (mysql_get_socket is Connector/C's; libmysqlclient keeps it in
 *     MYSQL.net.fd), which a stopping thread shuts down to end a blocked read;
 *   - caching_sha2_password over a plaintext connection: the password travels RSA-encrypted
 *     with the server's public key; libmysqlclient asks the server for it only when told to
 *     (MYSQL_OPT_GET_SERVER_PUBLIC_KEY), Connector/C always does.
 * CMake says which library it found (IDEMQ_MYSQL_CLIENT_MARIADB or IDEMQ_MYSQL_CLIENT_ORACLE);
 * the header checks that the mysql.h it sees agrees, so a mix of one library's headers and the
 * other's pkg-config fails the build instead of misbehaving.
 * Thread affinity: the thread that owns the connection.
 */
#ifndef IDEMQ_DB_CLIENT_H
#define IDEMQ_DB_CLIENT_H

#include <mysql.h>
#include <stdbool.h>

#if defined(MARIADB_PACKAGE_VERSION) || defined(MARIADB_BASE_VERSION)
#define IDEMQ_DB_CLIENT_IS_MARIADB 1
#if defined(IDEMQ_MYSQL_CLIENT_ORACLE)
#error "CMake chose libmysqlclient but <mysql.h> is MariaDB Connector/C's: check IDEMQ_MYSQL_CLIENT"
#endif
/* A bound parameter's or result's null flag (MYSQL_BIND.is_null points at one). */
typedef my_bool db_bool;
#else
#define IDEMQ_DB_CLIENT_IS_MARIADB 0
#if defined(IDEMQ_MYSQL_CLIENT_MARIADB)
#error "CMake chose MariaDB Connector/C but <mysql.h> is libmysqlclient's: check IDEMQ_MYSQL_CLIENT"
#endif
typedef bool db_bool;
#endif

/* How a connection is to use TLS: mysql.tls.mode and its files (all borrowed; NULL: none). */
typedef struct db_client_tls {
    int mode; /* a db_tls_mode (db/dsn.h) */
    const char *ca_file;
    const char *cert_file;
    const char *key_file;
} db_client_tls;

/* Sets db's TLS options for tls (borrowed) before mysql_real_connect, and lets a plaintext
 * login with caching_sha2_password fetch the server's RSA key (see above). */
void db_client_apply_tls(MYSQL *db, const db_client_tls *tls);

/* The socket of an open connection, or -1. */
int db_client_socket(MYSQL *db);

/* "MariaDB Connector/C" or "libmysqlclient", for logs and `idemq version` (with
 * mysql_get_client_info()'s version). */
const char *db_client_library(void);

#endif
