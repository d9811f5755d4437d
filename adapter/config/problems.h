/*
 * problems — collects every problem found while a config file loads, then prints them.
 *
 * Every part of the loader reports into one load_ctx with the line of the node at fault and
 * goes on, so one run shows every mistake (h2o, tmux cfg.c). At the end the problems are printed
 * sorted by line (they read top to bottom) as "PATH:LINE: message", or "PATH: message" when
 * there is no line (a missing file, an environment variable); past the first 100 only their
 * number is printed. Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_PROBLEMS_H
#define IDEMQ_CONFIG_PROBLEMS_H

#include <stddef.h>
#include <stdio.h>
#include <yaml.h>

#define CONFIG_MAX_PROBLEMS_SHOWN 100

typedef struct load_problem {
    unsigned long line; /* 0 when the problem has no line (missing file, environment) */
    size_t seq;         /* report order, to keep the sort stable */
    char *text;         /* owned */
} load_problem;

/* What the parts of one config_load share. */
typedef struct load_ctx {
    const char *path;       /* borrowed: the file as given, at the start of every message */
    yaml_document_t *doc;   /* borrowed: the loaded document, once there is one */
    load_problem *problems; /* owned: the first CONFIG_MAX_PROBLEMS_SHOWN problems */
    size_t stored;
    size_t total;           /* every problem reported, including those not stored */
} load_ctx;

/* Records a problem at line (1-based; 0 for none), printf-style. Cannot fail: a problem that
 * cannot be stored (out of memory, or past the first 100) is still counted in ctx->total. */
void config_report(load_ctx *ctx, unsigned long line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prints the stored problems to out (borrowed; NULL prints nothing) in line order, then how many
 * more there were, and frees them. */
void config_flush_problems(load_ctx *ctx, FILE *out);

#endif
