/*
 * text — the small text helpers every part of the config loader shares.
 *
 * A value a user typed reaches a problem message only through config_show: control bytes,
 * quotes and backslashes escaped, at most 60 bytes, so one bad value cannot break the
 * one-problem-per-line format or flood the terminal. Internal to config/. Pure; thread affinity:
 * none.
 */
#ifndef IDEMQ_CONFIG_TEXT_H
#define IDEMQ_CONFIG_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* Copies text (borrowed) into buf (len bytes) escaped and clipped for a message. Returns buf. */
const char *config_show(char *buf, size_t len, const char *text);

/* Whether s (borrowed) holds a control byte: below 0x20, or 0x7f. */
bool config_has_control(const char *s);

/* An ASCII decimal digit, whatever the locale. */
static inline bool config_is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Writes the key path "prefix.name" into dst, or "name" when prefix is "" (the top level). */
void config_join_path(char *dst, size_t len, const char *prefix, const char *name);

#endif
