/*
 * connect — opens a MySQL connection with idemq's session settings, the same for every part of
 * idemq that talks to the database (the DB workers, the retention job, check, migrate and run's
 * start-up check), from a db_dsn made by db_dsn_from_config:
 *   connect timeout 5 s, read and write timeouts dsn->read_timeout_s (mysql.read_timeout,
 *     default 30 s; db_connect_timed sets others), character set utf8mb4;
 *   CLIENT_FOUND_ROWS, so an UPDATE reports the rows it matched, not the rows it changed (the
 *     state machine and expect_rows rely on it);
 *   autocommit off: every statement runs in a transaction that idemq commits or rolls back;
 *   innodb_lock_wait_timeout at most 20 s and 2 s below the read timeout, so a row-lock wait
 *     ends as a retryable 1205 before the client's read timeout turns it into "connection
 *     lost".
 * With several nodes (mysql.urls) it tries each in turn and keeps one that takes writes
 * (db/nodes.h).
 * A caller may tighten the session afterwards (the retention job shortens its lock wait).
 *
 * TLS follows dsn->tls.mode (mysql.tls), through db/client.h (the options differ between MariaDB
 * Connector/C and libmysqlclient); with Connector/C 3.3 the modes mean:
 *   disabled         MYSQL_OPT_SSL_ENFORCE and MYSQL_OPT_SSL_VERIFY_SERVER_CERT set to 0 and no
 *                    TLS file: 3.3 starts TLS as soon as any TLS option is set, 3.4 verifies by
 *                    default, so "off" is said explicitly;
 *   preferred        ENFORCE: TLS when the server offers it, plaintext when it does not (3.3
 *                    falls back unless verification is on); no certificate check;
 *   required         ENFORCE, and after the handshake the session must have a cipher (3.3 would
 *                    fall back to plaintext): no certificate check;
 *   verify_ca        ENFORCE and MYSQL_OPT_SSL_CA (ca_file, else the system trust store): 3.3
 *                    verifies the chain whenever a CA is set; the host name is not checked;
 *   verify_identity  the same and VERIFY_SERVER_CERT: the certificate must name the URL's host
 *                    (subjectAltName DNS or IP, X509_check_host / X509_check_ip_asc).
 *                    libmysqlclient reports a name that does not match like any failed
 *                    verification; db_connect then tries verify_ca once to tell the two apart.
 * cert_file and key_file (MYSQL_OPT_SSL_CERT/KEY) are sent with every mode but disabled. A TLS
 * setup failure is one line naming the server, the mode, the files and what did not match,
 * with the error number DB_ERROR_TLS_SETUP (db/error.h), including the two mismatches found
 * here: the server offers no TLS but the mode requires it, and the server requires TLS
 * (require_secure_transport) but the mode is disabled. MariaDB refuses the latter with a plain
 * 1045 "access denied"; on that error with mode disabled db_connect tries once more with TLS,
 * and when that login works the mismatch is certain. A handshake the network broke stays a
 * connection failure (CR_SSL_CONNECTION_ERROR: an outage).
 *
 * mysql_library_init is not thread-safe and must run before any thread uses the client library:
 * db_library_init runs it exactly once, and whoever starts threads that connect calls it first.
 * Errors: see db/error.h (here: a returned connection or NULL with a reason in err).
 * Thread affinity: db_library_init any thread (once, synchronised); db_connect the thread that
 * will own the connection.
 */
#ifndef IDEMQ_DB_CONNECT_H
#define IDEMQ_DB_CONNECT_H

#include <mysql.h>
#include <stddef.h>

#include "db/dsn.h"

/* Runs mysql_library_init once per process, however many threads call it. */
void db_library_init(void);

/*
 * Connects to dsn (borrowed) and sets up the session as above. Returns an owned connection
 * (close it with mysql_close), or NULL with a reason in err: "cannot connect to MySQL at
 * host:port/database: text (error N)", a TLS line as above, or which session setting failed;
 * *error_number (unless NULL) gets the MySQL error number of the failure (0 when there was
 * none, e.g. out of memory). Never shows the password.
 */
MYSQL *db_connect(const db_dsn *dsn, unsigned *error_number, char *err, size_t err_len);

/* db_connect to the database cfg (borrowed) names (db_dsn_from_config: its URL, password file
 * and mysql.tls), for the one-shot CLI commands; the password copy is wiped before it returns. */
MYSQL *db_connect_config(const struct config *cfg, char *err, size_t err_len);

/* Per-connection client timeouts in whole seconds (the client library's unit); 0 keeps
 * db_connect's value (connect 5 s, read and write 30 s). Read and write bound each wait for the
 * socket, not a whole statement. */
typedef struct db_connect_timeouts {
    unsigned connect_s;
    unsigned read_s;
    unsigned write_s;
} db_connect_timeouts;

/* db_connect with other client timeouts (timeouts borrowed; NULL: db_connect's), e.g. the
 * health probe's short ones (store/health.h). Everything else, errors included, as db_connect. */
MYSQL *db_connect_timed(const db_dsn *dsn, const db_connect_timeouts *timeouts,
                        unsigned *error_number, char *err, size_t err_len);

/* "TLSv1.3, cipher TLS_AES_256_GCM_SHA384" (the server's Ssl_version, the client's cipher) or
 * "not encrypted", for `idemq check` and run's start-up log. Runs one SHOW STATUS on db (then a
 * rollback: autocommit is off). Returns buf. */
const char *db_describe_tls(MYSQL *db, char *buf, size_t len);

/* The mode's word as the config writes it ("verify_identity"). */
const char *db_tls_mode_name(db_tls_mode mode);

#endif
