/*
 * mysql_error — classifies MySQL/MariaDB client and server errors into apply statuses.
 *
 * Uses the client library's symbolic names (<mysqld_error.h>, <errmsg.h>) because MySQL and
 * MariaDB numbers diverge above ~1900. Thread affinity: none (pure).
 */
#ifndef IDEMQ_MYSQL_ERROR_H
#define IDEMQ_MYSQL_ERROR_H

#include <stdbool.h>

#include "policy/outcome.h"

/*
 * Maps an error number to what it means for the message:
 *   deadlock, lock wait timeout, interrupted query         → APPLY_RETRYABLE
 *   NULL into NOT NULL, bad value, too long, missing FK row → APPLY_NON_RETRYABLE
 *   connection refused/lost, too many connections, read-only after failover, schema objects
 *     missing or not permitted                             → APPLY_UNAVAILABLE (pause, don't burn
 *                                                            the retry budget on an operator fix)
 * Unknown errors are retryable: the ladder ends in the DLQ, so nothing is lost either way.
 * ER_DUP_ENTRY is not classified here: only the dedup insert knows whether it means "duplicate".
 */
apply_status mysql_error_classify(unsigned int error_number);

/* True for the APPLY_UNAVAILABLE errors that an operator fixes in the schema or the grants (a
 * missing table, column or database; access denied) rather than ones that pass by themselves (a
 * lost connection, a read-only server): they are reported louder. */
bool mysql_error_is_schema(unsigned int error_number);

#endif
