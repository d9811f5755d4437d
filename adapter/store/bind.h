/*
 * bind — binds decoded message values (jansson) as prepared-statement parameters.
 *
 * Values are never pasted into SQL text: strings bind as MYSQL_TYPE_STRING, integers as
 * LONGLONG, reals as DOUBLE, booleans as TINY, null as NULL, maps and arrays as their compact
 * JSON text. Thread affinity: the calling worker.
 */
#ifndef IDEMQ_BIND_H
#define IDEMQ_BIND_H

#include <jansson.h>
#include <mysql.h>
#include <stdbool.h>

/* Storage one bound parameter points into; lives until the statement has executed. */
typedef struct bind_slot {
    long long integer;
    double real;
    signed char boolean;
    char *owned_text;       /* JSON text of a map/array, freed by bind_slot_release */
    unsigned long length;
    my_bool is_null;
} bind_slot;

/* Points bind at value (borrowed: must outlive the execution), using slot for storage. */
int bind_json_value(MYSQL_BIND *bind, bind_slot *slot, const json_t *value);

/* Points bind at a NUL-terminated string (borrowed). */
void bind_text(MYSQL_BIND *bind, bind_slot *slot, const char *text);

void bind_slot_release(bind_slot *slot);

#endif
