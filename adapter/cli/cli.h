/*
 * cli — the subcommands. main.c parses argv and loads the config; these do the work.
 *
 * Errors: unlike the modules below them (0 or a negative code), each subcommand returns the
 * process exit code: 0 ok, 1 runtime failure, EXIT_USAGE (2) usage or configuration problem; the
 * detail has been logged or printed already. Thread affinity: the main thread.
 */
#ifndef IDEMQ_CLI_H
#define IDEMQ_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

#define EXIT_USAGE 2

/* idemq run: consume until SIGTERM/SIGINT. */
int cli_run(const config *cfg);

/* idemq check: config is valid (already), both servers answer, print the plan. */
int cli_check(const config *cfg);

/* idemq migrate: create msg_dedup if missing. */
int cli_migrate(const config *cfg);

/* idemq topology [--dry-run]: declare (or only print) every consumer's topology. */
int cli_topology(const config *cfg, bool dry_run);

typedef enum dlq_action { DLQ_LIST, DLQ_REPLAY, DLQ_PURGE } dlq_action;

typedef struct dlq_options {
    dlq_action action;
    const char *queue;       /* work queue Q; NULL: the only consumer's queue */
    const char *biz_key;     /* replay: only this key */
    bool all;                /* replay: everything */
    size_t limit;            /* 0: no limit */
    bool json;
    bool yes;                /* purge confirmation */
} dlq_options;

/* idemq dlq list|replay|purge. */
int cli_dlq(const config *cfg, const dlq_options *opts);

#endif
