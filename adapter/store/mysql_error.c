/*
 * mysql_error — see mysql_error.h.
 */
#include "store/mysql_error.h"

#include <errmsg.h>
#include <mysqld_error.h>

apply_status mysql_error_classify(unsigned int error_number)
{
    switch (error_number) {
    case ER_LOCK_DEADLOCK:
    case ER_LOCK_WAIT_TIMEOUT:
    case ER_QUERY_INTERRUPTED:
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
#ifdef ER_CONNECTION_KILLED
    case ER_CONNECTION_KILLED: /* MariaDB only: KILL CONNECTION, e.g. by a failover tool */
#endif
    case ER_OPTION_PREVENTS_STATEMENT: /* --read-only after a failover */
    case ER_READ_ONLY_MODE:
    case ER_NO_SUCH_TABLE:
    case ER_BAD_FIELD_ERROR:
    case ER_BAD_DB_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ER_ACCESS_DENIED_ERROR:
        return APPLY_UNAVAILABLE;
    default:
        return APPLY_RETRYABLE;
    }
}

bool mysql_error_is_schema(unsigned int error_number)
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
