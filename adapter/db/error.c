/*
 * error — see db/error.h.
 */
#include "db/error.h"

#include <errmsg.h>
#include <mysqld_error.h>
#include <stdio.h>

/* Numbers only one of the servers sends, written out: the number is the server's, while the
 * header that would name it is the client library's, and each library names only its own
 * server's (Connector/C lacks 4031, libmysqlclient 1927). Neither clashes with the other
 * server's use of the number where it matters: MariaDB's 4031 is a CREATE TRIGGER error and
 * MySQL has no 1927. */
enum {
    SERVER_CONNECTION_KILLED = 1927,          /* MariaDB: KILL CONNECTION (a failover tool) */
    SERVER_CLIENT_INTERACTION_TIMEOUT = 4031, /* MySQL 8.0.24+: disconnected after wait_timeout */
    /* Group Replication (MySQL): a member that cannot commit (no majority, ERROR state) and the
     * rollback of a transaction that lost certification to another member's write. */
    SERVER_GR_HOOK_ERROR = 3100,              /* ER_RUN_HOOK_ERROR, before_commit */
    SERVER_GR_ROLLBACK_DURING_COMMIT = 3101,  /* ER_TRANSACTION_ROLLBACK_DURING_COMMIT */
    /* MySQL: a write in a read-only transaction, as a GR secondary can answer. */
    SERVER_READ_ONLY_TRANSACTION = 1792,      /* ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION */
};

apply_status db_error_classify(unsigned int error_number)
{
    if (db_error_is_schema(error_number))
        return APPLY_UNAVAILABLE; /* an operator's fix: pause rather than burn the retry budget */
    switch (error_number) {
    case ER_LOCK_DEADLOCK: /* also Galera's certification conflict at COMMIT */
    case ER_LOCK_WAIT_TIMEOUT:
    case ER_QUERY_INTERRUPTED:
    case SERVER_GR_ROLLBACK_DURING_COMMIT:
        return APPLY_RETRYABLE;
    case ER_BAD_NULL_ERROR:
    case ER_TRUNCATED_WRONG_VALUE_FOR_FIELD:
    case ER_TRUNCATED_WRONG_VALUE:
    case ER_WARN_DATA_OUT_OF_RANGE:
    case ER_DATA_TOO_LONG:
    case ER_NO_REFERENCED_ROW_2:
    case ER_DUP_ENTRY: /* a unique index of the business table, not the dedup row */
    case ER_DUP_ENTRY_WITH_KEY_NAME:
        return APPLY_NON_RETRYABLE;
    case CR_CONNECTION_ERROR:
    case CR_CONN_HOST_ERROR:
    case CR_UNKNOWN_HOST:
    case CR_SERVER_GONE_ERROR:
    case CR_SERVER_LOST:
    case CR_SERVER_LOST_EXTENDED:
    case CR_COMMANDS_OUT_OF_SYNC:
    case ER_CON_COUNT_ERROR:
    case ER_SERVER_SHUTDOWN:
    case SERVER_CONNECTION_KILLED:
    case SERVER_CLIENT_INTERACTION_TIMEOUT:
    case CR_SSL_CONNECTION_ERROR: /* a TLS connection closed or lost (setup: DB_ERROR_TLS_SETUP) */
    case ER_OPTION_PREVENTS_STATEMENT: /* --read-only after a failover */
    case ER_READ_ONLY_MODE:
    case SERVER_READ_ONLY_TRANSACTION:
    case ER_UNKNOWN_COM_ERROR: /* Galera: the node is outside the primary component (1047) */
    case SERVER_GR_HOOK_ERROR: /* Group Replication: the member cannot commit now */
        return APPLY_UNAVAILABLE;
    default:
        return APPLY_RETRYABLE;
    }
}

bool db_error_is_commit_conflict(unsigned int error_number)
{
    return error_number == ER_LOCK_DEADLOCK || error_number == SERVER_GR_ROLLBACK_DURING_COMMIT;
}

bool db_error_is_schema(unsigned int error_number)
{
    switch (error_number) {
    case ER_NO_SUCH_TABLE:
    case ER_BAD_FIELD_ERROR:
    case ER_BAD_DB_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ER_ACCESS_DENIED_ERROR:
        return true;
    default:
        return false;
    }
}

bool db_error_is_tls(unsigned int error_number)
{
    return error_number == DB_ERROR_TLS_SETUP;
}

void db_error_of_connection(MYSQL *db, db_error *out)
{
    out->number = mysql_errno(db);
    snprintf(out->sqlstate, sizeof out->sqlstate, "%s", mysql_sqlstate(db));
    snprintf(out->message, sizeof out->message, "%s", mysql_error(db));
}

void db_error_of_statement(MYSQL_STMT *stmt, db_error *out)
{
    out->number = mysql_stmt_errno(stmt);
    snprintf(out->sqlstate, sizeof out->sqlstate, "%s", mysql_stmt_sqlstate(stmt));
    snprintf(out->message, sizeof out->message, "%s", mysql_stmt_error(stmt));
}

unsigned int db_error_format(char *buf, size_t buf_len, const char *what, const db_error *error)
{
    snprintf(buf, buf_len, "%s: MySQL error %u (%s): %s", what, error->number, error->sqlstate,
             error->message);
    return error->number;
}

unsigned int db_error_format_statement(char *buf, size_t buf_len, const char *what,
                                       MYSQL_STMT *stmt)
{
    db_error error;
    db_error_of_statement(stmt, &error);
    return db_error_format(buf, buf_len, what, &error);
}

unsigned int db_error_format_connection(char *buf, size_t buf_len, const char *what, MYSQL *db)
{
    db_error error;
    db_error_of_connection(db, &error);
    return db_error_format(buf, buf_len, what, &error);
}
