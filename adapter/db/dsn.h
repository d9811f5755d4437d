/*
 * dsn — parses mysql://user[:password]@host[:port]/database[?socket=/path] URLs into the parts
 * mysql_real_connect takes. User, password, database and socket are percent-decoded; the
 * user-info follows config/url.h's rule (one raw '@', reserved characters percent-encoded).
 * db_dsn_from_config adds what the config says beyond the URL: the password of
 * mysql.password_file and the mysql.tls settings, so every connection idemq makes (DB workers,
 * retention, check, migrate, run's start-up check) is set up from one place.
 * Errors: 0 or -1 with a reason in the caller's err buffer (never the password).
 * Thread affinity: none (pure).
 */
#ifndef IDEMQ_DB_DSN_H
#define IDEMQ_DB_DSN_H

#include <stdbool.h>
#include <stddef.h>

struct config;

/* mysql.tls.mode, in the order of config_mysql_tls_mode (see db/connect.h for what each does). */
typedef enum db_tls_mode {
    DB_TLS_DISABLED = 0,
    DB_TLS_PREFERRED,
    DB_TLS_REQUIRED,
    DB_TLS_VERIFY_CA,
    DB_TLS_VERIFY_IDENTITY,
} db_tls_mode;

/* TLS settings of a connection. The paths are borrowed (from the config, which outlives every
 * connection); NULL when not set. */
typedef struct db_tls {
    db_tls_mode mode;
    const char *ca_file;    /* verify_*: NULL → the system trust store */
    const char *cert_file;  /* client certificate, with key_file */
    const char *key_file;
} db_tls;

#define DB_PASSWORD_MAX 1024 /* bytes; config/secrets.h reads a password file up to this */
#define DB_MAX_NODES 16       /* CONFIG_MAX_MYSQL_URLS */

/* Where one node of a database cluster listens. */
typedef struct db_node {
    char host[256];
    unsigned port;
    char socket[512]; /* empty when TCP */
} db_node;

typedef struct db_dsn {
    char user[128];
    char password[DB_PASSWORD_MAX + 1];
    char host[256];
    unsigned port;          /* 3306 when absent */
    char database[65];
    char socket[512];       /* empty when TCP */
    db_tls tls;             /* db_dsn_parse: DB_TLS_DISABLED (zeroed); db_dsn_from_config: the
                               config's */
    unsigned read_timeout_s; /* the client's read and write timeouts; 0: 30 s (mysql.read_timeout) */
    /* Further nodes of the same cluster (mysql.urls after the first, whose node is host, port
     * and socket above): db_connect tries them too (db/nodes.h). 0 for one server. */
    db_node other_nodes[DB_MAX_NODES - 1];
    size_t other_node_count;
} db_dsn;

/* Fills dsn from url (borrowed). Returns 0, or -1 with a reason in err (never the password). */
int db_dsn_parse(const char *url, db_dsn *dsn, char *err, size_t err_len);

/* db_dsn_parse of cfg->mysql_urls[0] and the node of every further URL (the loader made sure
 * they share the account and database), then cfg->mysql_password (from mysql.password_file) in
 * place of the URL's password when set, and cfg->mysql_tls. cfg is borrowed and must outlive dsn (dsn->tls
 * points into it). Returns 0, or -1 with a reason in err. */
int db_dsn_from_config(const struct config *cfg, db_dsn *dsn, char *err, size_t err_len);

/* The nodes of dsn: 1 + other_node_count. */
size_t db_dsn_node_count(const db_dsn *dsn);

/* dsn (borrowed) with node i (0 <= i < db_dsn_node_count) as its host, port and socket, and no
 * other nodes, into *out: the connection db_connect makes to that one node. */
void db_dsn_for_node(const db_dsn *dsn, size_t i, db_dsn *out);

/* "host:port" or the socket path of node i of dsn, for messages, /readyz and metrics. */
void db_dsn_node_name(const db_dsn *dsn, size_t i, char *buf, size_t len);

#endif
