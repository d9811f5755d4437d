/*
 * connect — see db/connect.h.
 */
#include "db/connect.h"

#include <errmsg.h>
#include <mysqld_error.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "db/client.h"
#include "db/error.h"
#include "db/nodes.h"

/* A plain static flag here was a data race: two threads could both see it unset and run
 * mysql_library_init concurrently (it is not thread-safe), or one could see it set before the
 * other's initialisation was visible. uv_once runs it exactly once and makes its effects visible
 * to every caller that returns from uv_once. */
static uv_once_t library_once = UV_ONCE_INIT;

static void library_init_once(void)
{
    mysql_library_init(0, NULL, NULL);
}

void db_library_init(void)
{
    uv_once(&library_once, library_init_once);
}

const char *db_tls_mode_name(db_tls_mode mode)
{
    static const char *const names[] = {"disabled", "preferred", "required", "verify_ca",
                                        "verify_identity"};
    return (unsigned)mode < sizeof names / sizeof names[0] ? names[mode] : "unknown";
}

/* The system trust store for verify_* without ca_file: SSL_CERT_FILE first, as OpenSSL reads
 * it, then where Debian/Ubuntu/Alpine, Fedora/RHEL, SUSE and the BSDs keep the bundle. */
static const char *system_ca_file(void)
{
    static const char *const bundles[] = {"/etc/ssl/certs/ca-certificates.crt",
                                          "/etc/pki/tls/certs/ca-bundle.crt",
                                          "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem", NULL};
    const char *env = getenv("SSL_CERT_FILE");
    if (env && *env && access(env, R_OK) == 0)
        return env;
    for (size_t i = 0; bundles[i]; i++)
        if (access(bundles[i], R_OK) == 0)
            return bundles[i];
    return NULL;
}

/* Where a message says the server is: "host:port" or the socket path. */
static void server_name(const db_dsn *dsn, char *buf, size_t len)
{
    if (dsn->socket[0])
        snprintf(buf, len, "%s", dsn->socket);
    else
        snprintf(buf, len, "%s:%u", dsn->host, dsn->port);
}

/* mysql_init, options, TLS, mysql_real_connect. Returns the connection, or NULL with db's error
 * copied into *failure (number and text; number 0 when mysql_init failed). */
static MYSQL *open_connection(const db_dsn *dsn, const db_connect_timeouts *timeouts,
                              db_tls_mode mode, const char *ca, db_error *failure)
{
    MYSQL *db = mysql_init(NULL);
    if (!db) {
        *failure = (db_error){.number = 0, .message = "mysql_init: out of memory"};
        return NULL;
    }
    unsigned int connect_timeout = timeouts && timeouts->connect_s ? timeouts->connect_s : 5;
    unsigned int io_timeout = dsn->read_timeout_s ? dsn->read_timeout_s : 30;
    unsigned int read_timeout = timeouts && timeouts->read_s ? timeouts->read_s : io_timeout;
    unsigned int write_timeout = timeouts && timeouts->write_s ? timeouts->write_s : io_timeout;
    mysql_options(db, MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout);
    mysql_options(db, MYSQL_OPT_READ_TIMEOUT, &read_timeout);
    mysql_options(db, MYSQL_OPT_WRITE_TIMEOUT, &write_timeout);
    mysql_options(db, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    db_client_tls tls = {.mode = mode,
                         .ca_file = ca,
                         .cert_file = dsn->tls.cert_file,
                         .key_file = dsn->tls.key_file};
    db_client_apply_tls(db, &tls);
    const char *host = dsn->socket[0] ? "localhost" : dsn->host;
    if (!mysql_real_connect(db, host, dsn->user[0] ? dsn->user : NULL, dsn->password, dsn->database,
                            dsn->port, dsn->socket[0] ? dsn->socket : NULL, CLIENT_FOUND_ROWS)) {
        db_error_of_connection(db, failure);
        mysql_close(db);
        return NULL;
    }
    return db;
}

/* What the certificate was checked against, for messages: "mysql.tls.ca_file /x" or "the system
 * trust store /y". */
static void describe_ca(const db_tls *tls, const char *ca, char *buf, size_t len)
{
    if (tls->ca_file)
        snprintf(buf, len, "mysql.tls.ca_file %s", tls->ca_file);
    else
        snprintf(buf, len, "the system trust store %s", ca ? ca : "(none found)");
}

/*
 * Whether a CR_SSL_CONNECTION_ERROR at connect is a setup problem (DB_ERROR_TLS_SETUP) rather
 * than a connection that broke during the handshake (the server restarting: OpenSSL's "unexpected
 * eof", a reset), which is an outage. Connector/C gives only text: OpenSSL's verification
 * results all say "certificate" (not trusted, expired, self-signed, wrong purpose), an alert from
 * the server says "alert" (it refused our certificate), Connector/C's own checks say "SSL is
 * required" and "Validation of SSL server certificate", and a bad client key or PEM file says
 * "key", "PEM", "no start line" or "not found".
 */
static bool tls_setup_failure(const char *text)
{
    static const char *const words[] = {"certificate",
                                        "alert",
                                        "SSL is required",
                                        "key",
                                        "PEM",
                                        "no start line",
                                        "not found",
                                        "Validation",
                                        "wrong version number",
                                        "unsupported protocol",
                                        "no protocols available",
                                        NULL};
    for (size_t i = 0; words[i]; i++)
        if (strstr(text, words[i]))
            return true;
    return false;
}

/* The one-line report of a TLS setup failure, by what the library says went wrong. */
static void describe_tls_failure(const db_dsn *dsn, const char *ca, const char *text,
                                 bool name_mismatch, const char *where, char *err, size_t err_len)
{
    const db_tls *tls = &dsn->tls;
    const char *mode = db_tls_mode_name(tls->mode);
    char trust[600], client[1200] = "";
    describe_ca(tls, ca, trust, sizeof trust);
    if (tls->cert_file)
        snprintf(client, sizeof client, "; client certificate mysql.tls.cert_file %s, key_file %s",
                 tls->cert_file, tls->key_file ? tls->key_file : "(none)");
    if (name_mismatch || strstr(text, "Validation of SSL server certificate failed"))
        snprintf(err, err_len,
                 "MySQL at %s: TLS: the server's certificate does not name '%s' (mysql.tls.mode "
                 "%s checks the URL's host against the certificate's subjectAltName; its chain "
                 "is trusted by %s): connect by a name the certificate holds, or reissue it",
                 where, dsn->socket[0] ? "localhost" : dsn->host, mode, trust);
    else if (strstr(text, "SSL is required") && strstr(text, "support it"))
        snprintf(err, err_len,
                 "MySQL at %s: TLS: the server does not offer TLS, but mysql.tls.mode is %s: give "
                 "the server ssl_cert and ssl_key, or set mode: preferred",
                 where, mode);
    else if ((tls->mode == DB_TLS_VERIFY_CA || tls->mode == DB_TLS_VERIFY_IDENTITY) &&
             (strstr(text, "certificate") || strstr(text, "issuer")))
        snprintf(err, err_len,
                 "MySQL at %s: TLS: the server's certificate is not trusted by %s (mysql.tls.mode "
                 "%s): %s",
                 where, trust, mode, text);
    else
        snprintf(err, err_len, "MySQL at %s: TLS handshake failed (mysql.tls.mode %s%s%s%s): %s",
                 where, mode, tls->mode >= DB_TLS_VERIFY_CA ? "; CA: " : "",
                 tls->mode >= DB_TLS_VERIFY_CA ? trust : "", client, text);
}

/* Whether a verify_identity handshake that failed verification did so for the host name alone.
 * Connector/C says so ("Validation of SSL server certificate failed"); libmysqlclient has
 * OpenSSL check the name with the chain and reports both as "certificate verify failed", so the
 * same login is tried once with verify_ca: if that passes, the chain is trusted and the name is
 * what did not match. */
static bool chain_trusted_but_name_differs(const db_dsn *dsn, const db_connect_timeouts *timeouts,
                                           const char *ca, const db_error *failure)
{
    if (dsn->tls.mode != DB_TLS_VERIFY_IDENTITY || !strstr(failure->message, "verify failed"))
        return false;
    db_error again;
    MYSQL *probe = open_connection(dsn, timeouts, DB_TLS_VERIFY_CA, ca, &again);
    if (!probe)
        return false;
    mysql_close(probe);
    return true;
}

/* MySQL 8's ER_SECURE_TRANSPORT_REQUIRED; not in MariaDB's headers (MariaDB answers 1045). */
#define MYSQL8_SECURE_TRANSPORT_REQUIRED 3159

MYSQL *db_connect(const db_dsn *dsn, unsigned *error_number, char *err, size_t err_len)
{
    return db_connect_timed(dsn, NULL, error_number, err, err_len);
}

/* db_connect_timed to the one node of dsn (its host, port and socket). */
static MYSQL *connect_node(const db_dsn *dsn, const db_connect_timeouts *timeouts,
                           unsigned *error_number, char *err, size_t err_len)
{
    char where[600];
    db_error failure;
    unsigned dummy;
    const db_tls *tls = &dsn->tls;
    const char *ca = NULL;

    if (!error_number)
        error_number = &dummy;
    *error_number = 0;
    db_library_init();
    server_name(dsn, where, sizeof where);
    if (tls->mode == DB_TLS_VERIFY_CA || tls->mode == DB_TLS_VERIFY_IDENTITY) {
        ca = tls->ca_file ? tls->ca_file : system_ca_file();
        if (!ca) {
            snprintf(err, err_len,
                     "MySQL at %s: TLS: mysql.tls.mode %s needs CA certificates: set "
                     "mysql.tls.ca_file (no system trust store found: SSL_CERT_FILE, "
                     "/etc/ssl/certs/ca-certificates.crt, /etc/pki/tls/certs/ca-bundle.crt)",
                     where, db_tls_mode_name(tls->mode));
            *error_number = DB_ERROR_TLS_SETUP;
            return NULL;
        }
    }
    MYSQL *db = open_connection(dsn, timeouts, tls->mode, ca, &failure);
    if (!db && IDEMQ_DB_CLIENT_IS_MARIADB && tls->mode == DB_TLS_PREFERRED &&
        failure.number == ER_ACCESS_DENIED_ERROR) {
        /* Connector/C 3.3 in mode preferred against a MySQL server without TLS falls back to
         * plaintext but then sends a caching_sha2_password account's password as if the
         * connection were encrypted, and the server refuses it (1045). With TLS off from the
         * start it exchanges the password with the server's RSA key instead. A server that
         * offers TLS, or a wrong password, refuses the second try as well: the first error
         * stands. */
        db_error again;
        db = open_connection(dsn, timeouts, DB_TLS_DISABLED, NULL, &again);
        if (!db && again.number != ER_ACCESS_DENIED_ERROR)
            failure = again; /* logged in, then failed further on (e.g. the database's grants) */
    }
    if (!db) {
        *error_number = failure.number;
        if (failure.number == CR_SSL_CONNECTION_ERROR && tls_setup_failure(failure.message)) {
            *error_number = DB_ERROR_TLS_SETUP;
            describe_tls_failure(dsn, ca, failure.message,
                                 chain_trusted_but_name_differs(dsn, timeouts, ca, &failure), where,
                                 err, err_len);
            return NULL;
        }
        bool insecure_refused = failure.number == MYSQL8_SECURE_TRANSPORT_REQUIRED;
        if (!insecure_refused && failure.number == ER_ACCESS_DENIED_ERROR &&
            tls->mode == DB_TLS_DISABLED) {
            /* MariaDB's answer to a plaintext login under require_secure_transport is a plain
             * "access denied": see whether the same login works over TLS. */
            db_error again;
            MYSQL *probe = open_connection(dsn, timeouts, DB_TLS_PREFERRED, NULL, &again);
            insecure_refused = probe && mysql_get_ssl_cipher(probe);
            if (probe)
                mysql_close(probe);
        }
        if (insecure_refused) {
            *error_number = DB_ERROR_TLS_SETUP;
            snprintf(err, err_len,
                     "MySQL at %s: TLS: the server requires TLS (require_secure_transport) but "
                     "mysql.tls.mode is disabled: set mode: verify_identity (with ca_file), or "
                     "required",
                     where);
            return NULL;
        }
        /* A caching_sha2_password login without TLS whose password is not in the server's
         * cache needs the server's RSA key; db/client.c asks for it, so this is a server that
         * has none. */
        bool needs_tls_or_key = strstr(failure.message, "requires secure connection") != NULL;
        snprintf(err, err_len, "cannot connect to MySQL at %s/%s: %s (error %u)%s", where,
                 dsn->database, failure.message, failure.number,
                 needs_tls_or_key
                     ? "; the account's caching_sha2_password login without TLS needs the "
                       "server's RSA key and the server offers none: set mysql.tls.mode to "
                       "preferred or stricter on a server with TLS, or give the server RSA keys "
                       "(caching_sha2_password_auto_generate_rsa_keys)"
                     : "");
        return NULL;
    }
    if (tls->mode >= DB_TLS_REQUIRED && !mysql_get_ssl_cipher(db)) {
        /* Connector/C 3.3 falls back to plaintext unless it verifies the host name. */
        *error_number = DB_ERROR_TLS_SETUP;
        snprintf(err, err_len,
                 "MySQL at %s: TLS: the server does not offer TLS, but mysql.tls.mode is %s: give "
                 "the server ssl_cert and ssl_key, or set mode: preferred",
                 where, db_tls_mode_name(tls->mode));
        mysql_close(db);
        return NULL;
    }
    if (mysql_autocommit(db, 0) != 0) {
        *error_number = mysql_errno(db);
        snprintf(err, err_len, "cannot disable autocommit: %s", mysql_error(db));
        mysql_close(db);
        return NULL;
    }
    /* A row-lock wait must end as a retryable 1205 before the client's 30 s read timeout turns
     * it into "connection lost" (an outage that pauses every consumer). */
    /* MySQL refuses LEAST(...)'s DECIMAL for this integer variable (1232 "Incorrect argument
     * type"); MariaDB takes either. */
    unsigned lock_wait_cap = dsn->read_timeout_s ? dsn->read_timeout_s - 2 : 20;
    char set_lock_wait[160];
    snprintf(set_lock_wait, sizeof set_lock_wait,
             "SET SESSION innodb_lock_wait_timeout = "
             "CAST(LEAST(@@innodb_lock_wait_timeout, %u) AS UNSIGNED)",
             lock_wait_cap < 20 ? lock_wait_cap : 20);
    if (mysql_query(db, set_lock_wait) != 0) {
        *error_number = mysql_errno(db);
        snprintf(err, err_len, "cannot set innodb_lock_wait_timeout: %s", mysql_error(db));
        mysql_close(db);
        return NULL;
    }
    return db;
}

const char *db_describe_tls(MYSQL *db, char *buf, size_t len)
{
    const char *cipher = mysql_get_ssl_cipher(db);
    char version[64] = "TLS";
    if (!cipher) {
        snprintf(buf, len, "not encrypted");
        return buf;
    }
    if (mysql_query(db, "SHOW SESSION STATUS LIKE 'Ssl_version'") == 0) {
        MYSQL_RES *res = mysql_store_result(db);
        MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
        if (row && row[1] && row[1][0])
            snprintf(version, sizeof version, "%s", row[1]);
        if (res)
            mysql_free_result(res);
    }
    mysql_rollback(db);
    snprintf(buf, len, "%s, cipher %s", version, cipher);
    return buf;
}

/*
 * Several nodes (mysql.urls): each in turn from the one last used (db/nodes.h) until one accepts
 * the connection and takes writes. A TLS setup failure ends the round: it needs a person, and
 * trying the next node would only hide it behind that node's answer.
 */
static MYSQL *connect_cluster(const db_dsn *dsn, const db_connect_timeouts *timeouts,
                              unsigned *error_number, char *err, size_t err_len)
{
    size_t n = db_dsn_node_count(dsn), first = db_nodes_first(dsn);
    char why[600], name[520], failures[2048];
    size_t used = 0;
    db_dsn one;
    MYSQL *db = NULL;
    failures[0] = '\0';
    for (size_t k = 0; k < n && !db; k++) {
        size_t i = (first + k) % n;
        unsigned number = 0;
        db_dsn_for_node(dsn, i, &one);
        db = connect_node(&one, timeouts, &number, why, sizeof why);
        if (db && (number = db_node_check_writable(db, why, sizeof why)) != 0) {
            mysql_close(db);
            db = NULL;
        }
        if (db) {
            db_nodes_connected(dsn, i);
            break;
        }
        *error_number = number;
        if (db_error_is_tls(number)) {
            snprintf(err, err_len, "%s", why);
            explicit_bzero(one.password, sizeof one.password);
            return NULL;
        }
        db_dsn_node_name(dsn, i, name, sizeof name);
        if (used < sizeof failures)
            used += (size_t)snprintf(failures + used, sizeof failures - used, "%s %s: %s",
                                     k ? ";" : "", name, why);
    }
    explicit_bzero(one.password, sizeof one.password);
    if (db) {
        /* Callers tell failure by the buffer too (store/retention.c): leave it untouched. */
        *error_number = 0;
        return db;
    }
    snprintf(err, err_len, "no MySQL node of %zu takes writes:%s", n, failures);
    return NULL;
}

MYSQL *db_connect_timed(const db_dsn *dsn, const db_connect_timeouts *timeouts,
                        unsigned *error_number, char *err, size_t err_len)
{
    unsigned ignored;
    if (!error_number)
        error_number = &ignored;
    *error_number = 0;
    if (db_dsn_node_count(dsn) > 1)
        return connect_cluster(dsn, timeouts, error_number, err, err_len);
    MYSQL *db = connect_node(dsn, timeouts, error_number, err, err_len);
    if (db)
        db_nodes_connected(dsn, 0);
    return db;
}

MYSQL *db_connect_config(const struct config *cfg, char *err, size_t err_len)
{
    db_dsn dsn;
    if (db_dsn_from_config(cfg, &dsn, err, err_len) != 0)
        return NULL;
    MYSQL *db = db_connect(&dsn, NULL, err, err_len);
    explicit_bzero(dsn.password, sizeof dsn.password);
    return db;
}
