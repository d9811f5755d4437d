/*
 * connect — opens a MySQL connection with idemq's session settings, the same for every part of
 * idemq that talks to the database (the DB workers, the retention job, check and migrate):
 *   connect timeout 5 s, read and write timeouts 30 s, character set utf8mb4;
 *   CLIENT_FOUND_ROWS, so an UPDATE reports the rows it matched, not the rows it changed (the
 *     state machine and expect_rows rely on it);
 *   autocommit off: every statement runs in a transaction that idemq commits or rolls back;
 *   innodb_lock_wait_timeout at most 20 s, so a row-lock wait ends as a retryable 1205 before
 *     the client's 30 s read timeout turns it into "connection lost".
 * A caller may tighten the session afterwards (the retention job shortens its lock wait).
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
 * host:port/database: text (error N)" or which session setting failed. Never logs the password.
 */
MYSQL *db_connect(const db_dsn *dsn, char *err, size_t err_len);

/* db_dsn_parse of url (borrowed), then db_connect: one connection for a one-shot command. */
MYSQL *db_connect_url(const char *url, char *err, size_t err_len);

#endif
