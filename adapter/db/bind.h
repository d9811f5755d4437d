/*
 * bind — the one way idemq points a prepared statement's parameter at a value.
 *
 * Values are never pasted into SQL text: each is bound as a typed parameter. The primitives bind
 * a string (MYSQL_TYPE_STRING), an integer (LONGLONG), a real (DOUBLE), a boolean (TINY) or NULL;
 * db_bind_json picks one for a decoded message value (jansson): strings as strings, integers as
 * LONGLONG, reals as DOUBLE, booleans as TINY, null as NULL, maps and arrays as their compact
 * JSON text. Every function fills *bind completely (no need to zero it first) and keeps what
 * the parameter points at in *slot, which must live until the statement has executed.
 * Errors: db_bind_json returns 0 or -1 (out of memory, or not a JSON value); the rest cannot
 * fail. Thread affinity: the calling worker.
 */
#ifndef IDEMQ_DB_BIND_H
#define IDEMQ_DB_BIND_H

#include <jansson.h>
#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "db/client.h"

/* Storage one bound parameter points into; lives until the statement has executed. Zero it
 * before its first use. */
typedef struct db_bind_slot {
    long long integer;
    double real;
    signed char boolean;
    char *owned_text;       /* JSON text of a map/array, freed by db_bind_slot_release */
    unsigned long length;
    db_bool is_null;
} db_bind_slot;

/* Points bind at len bytes at text (borrowed: must outlive the execution). */
void db_bind_string(MYSQL_BIND *bind, db_bind_slot *slot, const char *text, size_t len);

/* Points bind at a NUL-terminated string (borrowed). */
void db_bind_text(MYSQL_BIND *bind, db_bind_slot *slot, const char *text);

/* Binds a copy of value (kept in slot) as a BIGINT, a DOUBLE or a TINYINT 0/1. */
void db_bind_int(MYSQL_BIND *bind, db_bind_slot *slot, long long value);
void db_bind_double(MYSQL_BIND *bind, db_bind_slot *slot, double value);
void db_bind_bool(MYSQL_BIND *bind, db_bind_slot *slot, bool value);

/* Binds SQL NULL. */
void db_bind_null(MYSQL_BIND *bind, db_bind_slot *slot);

/* Points bind at value (borrowed: must outlive the execution), using slot for storage. Returns
 * 0, or -1 when the JSON text of a map or array cannot be allocated. */
int db_bind_json(MYSQL_BIND *bind, db_bind_slot *slot, const json_t *value);

/* Frees the JSON text db_bind_json may have kept in slot; the slot can be bound again. */
void db_bind_slot_release(db_bind_slot *slot);

#endif
