/*
 * error — what a MySQL/MariaDB client or server error means, and the one way idemq writes it.
 *
 * Classification maps an error number to an apply status (what it means for the message). It
 * uses the symbolic names both client libraries share (<mysqld_error.h>, <errmsg.h>); MySQL and
 * MariaDB numbers diverge above ~1900, and the few used there are written out in error.c (the
 * server sends them, whichever library reads them). A db_error is the error copied out of a connection or
 * statement, so the statement can be closed before the error is reported; db_error_format
 * writes every such report as "what: MySQL error N (SQLSTATE): text".
 *
 * Errors in db/: functions that can fail return 0 or a negative value (each says which); the
 * MySQL error behind a failure goes into a caller-supplied db_error, the text of any other
 * failure into a caller-supplied err buffer. Functions returning apply_status return a
 * classification, never a code. Thread affinity: none (the callers' connections are theirs).
 */
#ifndef IDEMQ_DB_ERROR_H
#define IDEMQ_DB_ERROR_H

#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "policy/outcome.h"

#define DB_ERROR_MESSAGE_MAX 512 /* MYSQL_ERRMSG_SIZE: the longest text the client reports */

/* A MySQL error, copied out of the connection or statement that reported it. */
typedef struct db_error {
    unsigned int number; /* mysql_errno / mysql_stmt_errno */
    char sqlstate[6];    /* five characters and a NUL */
    char message[DB_ERROR_MESSAGE_MAX];
} db_error;

/*
 * Maps an error number to what it means for the message:
 *   deadlock, lock wait timeout, interrupted query         → APPLY_RETRYABLE
 *   NULL into NOT NULL, bad value, too long, missing FK row → APPLY_NON_RETRYABLE
 *   Group Replication's rollback at COMMIT (3101)          → APPLY_RETRYABLE
 *   connection refused/lost/killed/timed out (MySQL's 4031), too many connections, read-only
 *     after failover (1290 read_only/super_read_only, 1836, 1792), a Galera node outside the
 *     primary component (1047), a Group Replication member that cannot commit (3100), schema
 *     objects missing or not permitted                     → APPLY_UNAVAILABLE (pause, don't burn
 *                                                            the retry budget on an operator fix)
 * Unknown errors are retryable: the ladder ends in the DLQ, so nothing is lost either way.
 * ER_DUP_ENTRY is not classified here: only the dedup insert knows whether it means "duplicate".
 */
apply_status db_error_classify(unsigned int error_number);

/* True for the errors a COMMIT gets when a database cluster refuses the transaction for a
 * conflict with another node's write: Galera's certification failure (1213, the deadlock number)
 * and Group Replication's rollback during commit (3101). Nothing of the transaction stays, and
 * running it again is the cure (store/transaction.c does, in place). */
bool db_error_is_commit_conflict(unsigned int error_number);

/* True for the APPLY_UNAVAILABLE errors that an operator fixes in the schema or the grants (a
 * missing table, column or database; access denied) rather than ones that pass by themselves (a
 * lost connection, a read-only server): they are reported louder. */
bool db_error_is_schema(unsigned int error_number);

/*
 * Not a MySQL error number (theirs stay far below): what db_connect reports for a TLS failure
 * that needs a person, not time (db/connect.h): a certificate that is not trusted or names
 * another host, a client certificate or key that does not work, TLS required on one side and
 * off on the other. The client's own CR_SSL_CONNECTION_ERROR is not enough to tell: it is also
 * what a TLS connection that the server closed or lost reports (OpenSSL's "unexpected eof"), and
 * that is an outage like any lost connection.
 */
#define DB_ERROR_TLS_SETUP 1000000u

/* True for DB_ERROR_TLS_SETUP. Like a schema error it is reported louder. */
bool db_error_is_tls(unsigned int error_number);

/* Copies the last error of db (borrowed) into *out. */
void db_error_of_connection(MYSQL *db, db_error *out);

/* Copies the last error of stmt (borrowed) into *out. */
void db_error_of_statement(MYSQL_STMT *stmt, db_error *out);

/*
 * Writes "what: MySQL error N (SQLSTATE): text" into buf (buf_len bytes, truncated to fit; what
 * borrowed) and returns N, so a caller can record and classify the number in one line.
 */
unsigned int db_error_format(char *buf, size_t buf_len, const char *what, const db_error *error);

/* db_error_format for the last error of stmt (borrowed). Returns the error number. */
unsigned int db_error_format_statement(char *buf, size_t buf_len, const char *what,
                                       MYSQL_STMT *stmt);

/* db_error_format for the last error of db (borrowed). Returns the error number. */
unsigned int db_error_format_connection(char *buf, size_t buf_len, const char *what, MYSQL *db);

#endif
