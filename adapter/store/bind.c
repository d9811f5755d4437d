/*
 * bind — see bind.h.
 */
#include "store/bind.h"

#include <stdlib.h>
#include <string.h>

void bind_text(MYSQL_BIND *bind, bind_slot *slot, const char *text)
{
    memset(bind, 0, sizeof *bind);
    slot->length = (unsigned long)strlen(text);
    bind->buffer_type = MYSQL_TYPE_STRING;
    bind->buffer = (void *)text;
    bind->buffer_length = slot->length;
    bind->length = &slot->length;
}

int bind_json_value(MYSQL_BIND *bind, bind_slot *slot, const json_t *value)
{
    memset(bind, 0, sizeof *bind);
    switch (json_typeof(value)) {
    case JSON_STRING:
        slot->length = (unsigned long)json_string_length(value);
        bind->buffer_type = MYSQL_TYPE_STRING;
        bind->buffer = (void *)json_string_value(value);
        bind->buffer_length = slot->length;
        bind->length = &slot->length;
        return 0;
    case JSON_INTEGER:
        slot->integer = (long long)json_integer_value(value);
        bind->buffer_type = MYSQL_TYPE_LONGLONG;
        bind->buffer = &slot->integer;
        return 0;
    case JSON_REAL:
        slot->real = json_real_value(value);
        bind->buffer_type = MYSQL_TYPE_DOUBLE;
        bind->buffer = &slot->real;
        return 0;
    case JSON_TRUE:
    case JSON_FALSE:
        slot->boolean = json_is_true(value) ? 1 : 0;
        bind->buffer_type = MYSQL_TYPE_TINY;
        bind->buffer = &slot->boolean;
        return 0;
    case JSON_NULL:
        slot->is_null = 1;
        bind->buffer_type = MYSQL_TYPE_NULL;
        bind->is_null = &slot->is_null;
        return 0;
    case JSON_OBJECT:
    case JSON_ARRAY:
        slot->owned_text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!slot->owned_text)
            return -1;
        slot->length = (unsigned long)strlen(slot->owned_text);
        bind->buffer_type = MYSQL_TYPE_STRING;
        bind->buffer = slot->owned_text;
        bind->buffer_length = slot->length;
        bind->length = &slot->length;
        return 0;
    }
    return -1;
}

void bind_slot_release(bind_slot *slot)
{
    free(slot->owned_text);
    slot->owned_text = NULL;
}
