/*
 * units — durations and sizes as the config file writes them, read and written back.
 *
 * A duration is a decimal count with a unit ms, s, m, h or d ("250ms", "30s", "7d"), or a bare
 * count meaning seconds. A size is a decimal count with an optional unit B, KB (1000), MB, GB,
 * KiB (1024), MiB or GiB, units case-insensitive ("64KiB", "1MB", "4096"). The formatters write
 * the largest unit that divides the value, for messages and the reference. config_parse_duration
 * and config_parse_size are part of config.h's API; the rest serves config/. Pure; thread
 * affinity: none.
 *
 * Errors: the parsers return 0, or -1 when the text is malformed or the value overflows (the
 * output is then untouched).
 */
#ifndef IDEMQ_CONFIG_UNITS_H
#define IDEMQ_CONFIG_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* Parses a duration such as "250ms", "30s", "5m", "2h", "30d" or a bare number of seconds into
 * *out_ms. Returns 0, or -1 when malformed or overflowing. */
int config_parse_duration(const char *text, uint64_t *out_ms);

/* Parses a size such as "1MiB", "512KiB", "1048576" into *out_bytes. Returns 0, or -1. */
int config_parse_size(const char *text, size_t *out_bytes);

/* Reads the run of decimal digits at *text into *out and moves *text past it. Returns 0, or -1
 * when there is no digit or the count overflows (then neither is changed). */
int config_parse_count(const char **text, uint64_t *out);

/* Writes ms into buf in the largest of d, h, m, s that divides it, else in ms ("0ms" for 0).
 * Returns buf. */
const char *config_format_duration(char *buf, size_t len, uint64_t ms);

/* Writes bytes into buf in the largest of GiB, MiB, KiB that divides it, else as a bare count.
 * Returns buf. */
const char *config_format_size(char *buf, size_t len, uint64_t bytes);

#endif
