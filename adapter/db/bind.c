/*
 * bind — see db/bind.h.
 */
#include "db/bind.h"

#include <stdlib.h>
#include <string.h>

void db_bind_string(MYSQL_BIND *bind, db_bind_slot *slot, const char *text, size_t len)
{
    memset(bind, 0, sizeof *bind);
    slot->length = (unsigned long)len;
    bind->buffer_type = MYSQL_TYPE_STRING;
    bind->buffer = (void *)text;
    bind->buffer_length = slot->length;
    bind->length = &slot->length;
}

void db_bind_text(MYSQL_BIND *bind, db_bind_slot *slot, const char *text)
{
    db_bind_string(bind, slot, text, strlen(text));
}

void db_bind_int(MYSQL_BIND *bind, db_bind_slot *slot, long long value)
{
    memset(bind, 0, sizeof *bind);
    slot->integer = value;
    bind->buffer_type = MYSQL_TYPE_LONGLONG;
    bind->buffer = &slot->integer;
}

void db_bind_double(MYSQL_BIND *bind, db_bind_slot *slot, double value)
{
    memset(bind, 0, sizeof *bind);
    slot->real = value;
    bind->buffer_type = MYSQL_TYPE_DOUBLE;
    bind->buffer = &slot->real;
}

void db_bind_bool(MYSQL_BIND *bind, db_bind_slot *slot, bool value)
{
    memset(bind, 0, sizeof *bind);
    slot->boolean = value ? 1 : 0;
    bind->buffer_type = MYSQL_TYPE_TINY;
    bind->buffer = &slot->boolean;
}

void db_bind_null(MYSQL_BIND *bind, db_bind_slot *slot)
{
    memset(bind, 0, sizeof *bind);
    slot->is_null = 1;
    bind->buffer_type = MYSQL_TYPE_NULL;
    bind->is_null = &slot->is_null;
}

int db_bind_json(MYSQL_BIND *bind, db_bind_slot *slot, const json_t *value)
{
    memset(bind, 0, sizeof *bind);
    switch (json_typeof(value)) {
    case JSON_STRING:
        db_bind_string(bind, slot, json_string_value(value), json_string_length(value));
        return 0;
    case JSON_INTEGER:
        db_bind_int(bind, slot, (long long)json_integer_value(value));
        return 0;
    case JSON_REAL:
        db_bind_double(bind, slot, json_real_value(value));
        return 0;
    case JSON_TRUE:
    case JSON_FALSE:
        db_bind_bool(bind, slot, json_is_true(value));
        return 0;
    case JSON_NULL:
        db_bind_null(bind, slot);
        return 0;
    case JSON_OBJECT:
    case JSON_ARRAY:
        slot->owned_text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!slot->owned_text)
            return -1;
        db_bind_text(bind, slot, slot->owned_text);
        return 0;
    }
    return -1;
}

void db_bind_slot_release(db_bind_slot *slot)
{
    free(slot->owned_text);
    slot->owned_text = NULL;
}
