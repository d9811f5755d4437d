/*
 * prepare — see db/prepare.h.
 */
#include "db/prepare.h"

#include <errno.h>
#include <string.h>

int db_prepare(MYSQL *db, const char *sql, MYSQL_STMT **out, db_error *error)
{
    MYSQL_STMT *stmt = mysql_stmt_init(db);
    *out = NULL;
    if (!stmt) {
        db_error_of_connection(db, error);
        return -ENOMEM;
    }
    if (mysql_stmt_prepare(stmt, sql, (unsigned long)strlen(sql)) != 0) {
        db_error_of_statement(stmt, error);
        mysql_stmt_close(stmt);
        return -1;
    }
    *out = stmt;
    return 0;
}

void db_stmt_discard_failed_result(MYSQL_STMT *stmt)
{
    mysql_stmt_free_result(stmt);
    mysql_stmt_reset(stmt);
}
