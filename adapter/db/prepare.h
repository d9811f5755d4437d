/*
 * prepare — the one way idemq prepares a statement: mysql_stmt_init + mysql_stmt_prepare, with
 * the failed statement closed and its error kept for the caller to report.
 * Errors: see db/error.h. Thread affinity: the thread that owns the connection.
 */
#ifndef IDEMQ_DB_PREPARE_H
#define IDEMQ_DB_PREPARE_H

#include <mysql.h>

#include "db/error.h"

/*
 * Prepares sql (borrowed, NUL-terminated) on db (borrowed). Returns 0 with an owned statement
 * in *out (close it with mysql_stmt_close). Otherwise *out is NULL and:
 *   -ENOMEM  the client library could not allocate a statement (mysql_stmt_init failed);
 *            *error holds the connection's error;
 *   -1       the server refused the statement (a syntax error, a missing table or column, no
 *            grant, the connection lost…); *error holds the statement's error.
 */
int db_prepare(MYSQL *db, const char *sql, MYSQL_STMT **out, db_error *error);

/*
 * After mysql_stmt_store_result failed on stmt (borrowed): frees what was read and returns the
 * statement to "prepared", so that it can be executed again. An error that arrives in the middle
 * of a result set (a deadlock or lock wait on a row of INSERT … RETURNING or SELECT … FOR UPDATE)
 * leaves MariaDB Connector/C's statement believing rows are still unread on the wire; its next
 * mysql_stmt_execute then waits to read them from a connection with nothing to read, until
 * read_timeout ends it with "server has gone away". Costs one round trip (COM_STMT_RESET); a
 * failure here is the connection's, and its next statement reports it.
 */
void db_stmt_discard_failed_result(MYSQL_STMT *stmt);

#endif
