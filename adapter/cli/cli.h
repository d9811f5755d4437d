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
#include <stdint.h>

#include "config/config.h"
#include "outbox/table.h"

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

typedef enum outbox_action { OUTBOX_LIST, OUTBOX_RETRY, OUTBOX_PURGE } outbox_action;

/* idemq_outbox.state values (outbox/table.h), as bits of outbox_options.states. */
#define OUTBOX_STATE_PENDING OUTBOX_STATE_BIT(OUTBOX_ROW_PENDING)       /* not yet published */
#define OUTBOX_STATE_PUBLISHED OUTBOX_STATE_BIT(OUTBOX_ROW_PUBLISHED)   /* confirmed by the broker */
#define OUTBOX_STATE_UNROUTABLE OUTBOX_STATE_BIT(OUTBOX_ROW_UNROUTABLE) /* returned, or no exchange */
#define OUTBOX_STATE_ALL (OUTBOX_STATE_PENDING | OUTBOX_STATE_PUBLISHED | OUTBOX_STATE_UNROUTABLE)

typedef struct outbox_options {
    outbox_action action;
    unsigned states;         /* list --state: OUTBOX_STATE_* bits; 0: pending and unroutable */
    size_t limit;            /* list --limit; 0: no limit */
    const unsigned long long *ids; /* --id, in argv order (borrowed); id_count of them */
    size_t id_count;
    bool unroutable;         /* retry/purge --unroutable: every unroutable row */
    bool published;          /* purge --published */
    bool older_than_set;     /* purge --older-than: only rows published before now - older_than */
    unsigned long long older_than_ms;
    bool json;
    bool yes;                /* purge confirmation */
} outbox_options;

/* Parses --state's value (borrowed): pending, unroutable, published or all, or a comma-separated
 * list of them, into OUTBOX_STATE_* bits. Returns 0, or -1 when a word is none of those. */
int cli_outbox_parse_states(const char *text, unsigned *states);

/* Why opts (borrowed) is not a valid outbox command line (a static string, e.g. "outbox retry
 * needs --id N or --unroutable"), or NULL when it is. main.c checks it before loading the
 * config, so bad usage exits 2 without touching the database. */
const char *cli_outbox_usage_problem(const outbox_options *opts);

/* idemq outbox list|retry|purge, on idemq_outbox through the config's mysql connection. */
int cli_outbox(const config *cfg, const outbox_options *opts);

/* ---- idemq health: the container HEALTHCHECK's probe (cli/health.c); needs no config file ---- */

#define HEALTH_DEFAULT_PORT 9464
#define HEALTH_DEFAULT_TIMEOUT_MS 4000

typedef struct health_options {
    const char *url;     /* --url http://HOST[:PORT]/PATH (borrowed); NULL: 127.0.0.1, the port
                            below, /healthz */
    unsigned port;       /* --port 1..65535; 0: IDEMQ_HEALTH_PORT, else HEALTH_DEFAULT_PORT */
    uint64_t timeout_ms; /* --timeout, for connect, request and status line together; 0: the
                            default */
} health_options;

/* Where the probe goes: url split into its parts. */
typedef struct health_target {
    char host[256]; /* an IPv6 address without its brackets */
    char port[12];
    char path[512];
} health_target;

/* Splits url (borrowed) "http://HOST[:PORT][/PATH]" into *out (port 80, path "/" when absent;
 * HOST may be a bracketed IPv6 address). Returns 0, or -1 with the reason in err. */
int cli_health_parse_url(const char *url, health_target *out, char *err, size_t err_len);

/* The status code of the HTTP status line at line (len bytes, borrowed; it need not be
 * NUL-terminated nor complete past the code): "HTTP/1.x NNN ..." gives NNN; anything else -1. */
int cli_health_status_code(const char *line, size_t len);

/* idemq health: GET the target once within the timeout. Prints one line, to stdout when the
 * answer is 200 (returns 0), else to stderr saying why (refused, timed out, closed, another
 * status; returns 1); a bad --url or IDEMQ_HEALTH_PORT returns EXIT_USAGE. */
int cli_health(const health_options *opts);

#endif
