/*
 * text — see text.h.
 */
#include "config/text.h"

#include <stdio.h>
#include <string.h>

#define SHOW_MAX 60 /* bytes of a user value echoed in a message */

const char *config_show(char *buf, size_t len, const char *text)
{
    size_t o = 0, n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && o + 5 < len; p++, n++) {
        if (n == SHOW_MAX) {
            if (o + 4 < len) {
                memcpy(buf + o, "...", 3);
                o += 3;
            }
            break;
        }
        if (*p < 0x20 || *p == 0x7f || *p == '\'' || *p == '\\')
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
        else
            buf[o++] = (char)*p;
    }
    buf[o] = '\0';
    return buf;
}

bool config_has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

void config_join_path(char *dst, size_t len, const char *prefix, const char *name)
{
    snprintf(dst, len, "%s%s%s", prefix, *prefix ? "." : "", name);
}
