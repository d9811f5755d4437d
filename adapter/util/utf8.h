/*
 * utf8 — the UTF-8 rules jansson applies to JSON text (no overlong forms, no surrogates, nothing
 * above U+10FFFF), for the modules that check text before it reaches a JSON document or a
 * header: envelope/ (a body's strings) and ops/log (a log line written without jansson).
 * Thread affinity: any.
 */
#ifndef IDEMQ_UTF8_H
#define IDEMQ_UTF8_H

#include <stddef.h>

/* Length (1..4) of the valid UTF-8 sequence at s (n > 0 bytes available), or 0 when it is
 * truncated, overlong, a surrogate or above U+10FFFF. */
size_t utf8_seq(const unsigned char *s, size_t n);

/* The offset of the first invalid byte of s, or n when all n bytes are valid UTF-8. */
size_t utf8_invalid_at(const char *s, size_t n);

#endif
