/*
 * reference — the configuration reference, generated from the option tables.
 *
 * One Markdown row per key (path, type, default, range, help, environment override), in table
 * order, following each entry's section, items and variants exactly as the loader walks them;
 * so the documentation cannot drift from what the loader accepts. The README embeds the output
 * of `idemq help config` and a unit test keeps the two identical. Part of config.h's API.
 * Thread affinity: any; it reads only constant tables.
 */
#ifndef IDEMQ_CONFIG_REFERENCE_H
#define IDEMQ_CONFIG_REFERENCE_H

#include <stdio.h>

/* Writes the reference table to out (borrowed). */
void config_write_reference(FILE *out);

#endif
