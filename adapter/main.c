/*
 * main — argv, config loading and dispatch to a subcommand. No logic lives here: each command
 * declares its verbs and options in `commands`, so an option it does not take is refused by
 * name rather than silently ignored.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration problem.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "config/config.h"
#include "config/units.h"
#include "ops/log.h"

static void usage(FILE *out)
{
    fputs("usage: idemq COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  run -c FILE                 consume and apply messages until SIGTERM\n"
          "  check -c FILE               validate config, connect to both servers, print the plan\n"
          "  migrate -c FILE             create or upgrade idemq's tables (re-runnable)\n"
          "  topology -c FILE [--dry-run]  declare (or only print) queues and exchanges\n"
          "  dlq list -c FILE [--queue Q] [--limit N] [--json]\n"
          "  dlq replay -c FILE [--queue Q] (--biz-key K | --all) [--limit N] [--json]\n"
          "  dlq purge -c FILE [--queue Q] --yes\n"
          "  outbox list -c FILE [--state S] [--limit N] [--json]\n"
          "  outbox retry -c FILE (--id N [--id N ...] | --unroutable) [--json]\n"
          "  outbox purge -c FILE (--published [--older-than DURATION] | --unroutable |\n"
          "               --id N [--id N ...]) [--json] --yes\n"
          "  health [--port N | --url URL] [--timeout DURATION]\n"
          "                              GET /healthz of a running idemq; exit 0 on a 200\n"
          "  version                     print the version\n"
          "  help                        this text\n"
          "  help config                 every configuration key (Markdown)\n"
          "\n"
          "The config file may also come from IDEMQ_CONFIG. IDEMQ_AMQP_URL and IDEMQ_MYSQL_URL\n"
          "override the URLs in the file.\n"
          "\n"
          "dlq list and replay walk the whole DLQ once, putting back (republish, confirm, ack)\n"
          "what they do not replay, so reading spends no broker delivery attempt and keeps the\n"
          "order; --limit caps only what is printed or replayed.\n"
          "\n"
          "outbox list shows idemq_outbox rows, oldest first; --state is pending, unroutable,\n"
          "published or all, or a comma-separated list (default: pending,unroutable). outbox\n"
          "retry sets unroutable rows back to pending so the relay publishes them again; only\n"
          "unroutable rows are retried. outbox purge deletes published or unroutable rows, never\n"
          "pending ones (messages not yet sent); without --yes it says what it would delete.\n"
          "\n"
          "health needs no config file (the container HEALTHCHECK runs it): it asks\n"
          "http://127.0.0.1:PORT/healthz, PORT from --port, else IDEMQ_HEALTH_PORT, else 9464,\n"
          "and waits --timeout (default 4s) for the status line; exit 1 with one line saying\n"
          "why on anything but a 200.\n",
          out);
}

static int usage_error(const char *message)
{
    fprintf(stderr, "idemq: %s\n\n", message);
    usage(stderr);
    return EXIT_USAGE;
}

/* ---- options: every one idemq knows, and which command declares which ---------------------- */

typedef enum option_bit {
    OPT_DRY_RUN = 1u << 0,
    OPT_QUEUE = 1u << 1,
    OPT_LIMIT = 1u << 2,
    OPT_BIZ_KEY = 1u << 3,
    OPT_ALL = 1u << 4,
    OPT_JSON = 1u << 5,
    OPT_YES = 1u << 6,
    OPT_STATE = 1u << 7,
    OPT_ID = 1u << 8,
    OPT_UNROUTABLE = 1u << 9,
    OPT_PUBLISHED = 1u << 10,
    OPT_OLDER_THAN = 1u << 11,
    OPT_PORT = 1u << 12,
    OPT_URL = 1u << 13,
    OPT_TIMEOUT = 1u << 14,
} option_bit;
#define OPTION_BIT_COUNT 15

/* getopt_long's table; .val indexes option_bits (-c and -h, every command's, are 'c' and 'h'). */
static const struct option long_options[] = {
    {"config", required_argument, NULL, 'c'},
    {"help", no_argument, NULL, 'h'},
    {"dry-run", no_argument, NULL, 0},
    {"queue", required_argument, NULL, 1},
    {"limit", required_argument, NULL, 2},
    {"biz-key", required_argument, NULL, 3},
    {"all", no_argument, NULL, 4},
    {"json", no_argument, NULL, 5},
    {"yes", no_argument, NULL, 6},
    {"state", required_argument, NULL, 7},
    {"id", required_argument, NULL, 8},
    {"unroutable", no_argument, NULL, 9},
    {"published", no_argument, NULL, 10},
    {"older-than", required_argument, NULL, 11},
    {"port", required_argument, NULL, 12},
    {"url", required_argument, NULL, 13},
    {"timeout", required_argument, NULL, 14},
    {NULL, 0, NULL, 0},
};

/* What the command line said, for whichever command runs. */
typedef struct command_line {
    const char *config_path;
    bool dry_run;
    dlq_options dlq;
    outbox_options outbox;
    health_options health;
    unsigned long long *ids; /* --id values (owned); outbox.ids points here */
} command_line;

typedef struct command_spec {
    const char *name;
    const char *const *actions; /* its verbs (dlq list ...), NULL-terminated; NULL: none */
    const char *actions_problem;
    unsigned options; /* option_bit: what it accepts besides -c and -h */
    bool no_config;   /* reads no config file (and refuses -c); run gets cfg NULL */
    /* Sets the verb's action (index into actions); NULL when the command has none. */
    void (*set_action)(command_line *line, int action);
    /* Why the options together are wrong (a static string), or NULL; NULL: no such check. */
    const char *(*options_problem)(const command_line *line);
    int (*run)(const config *cfg, const command_line *line);
} command_spec;

static int run_run(const config *cfg, const command_line *line)
{
    (void)line;
    return cli_run(cfg);
}

static int run_check(const config *cfg, const command_line *line)
{
    (void)line;
    return cli_check(cfg);
}

static int run_migrate(const config *cfg, const command_line *line)
{
    (void)line;
    return cli_migrate(cfg);
}

static int run_topology(const config *cfg, const command_line *line)
{
    return cli_topology(cfg, line->dry_run);
}

static int run_dlq(const config *cfg, const command_line *line)
{
    return cli_dlq(cfg, &line->dlq);
}

static int run_outbox(const config *cfg, const command_line *line)
{
    return cli_outbox(cfg, &line->outbox);
}

static int run_health(const config *cfg, const command_line *line)
{
    (void)cfg;
    return cli_health(&line->health);
}

static void set_dlq_action(command_line *line, int action)
{
    static const dlq_action actions[] = {DLQ_LIST, DLQ_REPLAY, DLQ_PURGE};
    line->dlq.action = actions[action];
}

static void set_outbox_action(command_line *line, int action)
{
    static const outbox_action actions[] = {OUTBOX_LIST, OUTBOX_RETRY, OUTBOX_PURGE};
    line->outbox.action = actions[action];
}

static const char *outbox_options_problem(const command_line *line)
{
    return cli_outbox_usage_problem(&line->outbox);
}

static const char *health_options_problem(const command_line *line)
{
    return line->health.url && line->health.port ? "--url and --port do not go together" : NULL;
}

static const char *const list_replay_purge[] = {"list", "replay", "purge", NULL};
static const char *const list_retry_purge[] = {"list", "retry", "purge", NULL};

static const command_spec commands[] = {
    {.name = "run", .run = run_run},
    {.name = "check", .run = run_check},
    {.name = "migrate", .run = run_migrate},
    {.name = "topology", .options = OPT_DRY_RUN, .run = run_topology},
    {.name = "dlq",
     .actions = list_replay_purge,
     .actions_problem = "dlq needs list, replay or purge",
     .options = OPT_QUEUE | OPT_LIMIT | OPT_BIZ_KEY | OPT_ALL | OPT_JSON | OPT_YES,
     .set_action = set_dlq_action,
     .run = run_dlq},
    {.name = "outbox",
     .actions = list_retry_purge,
     .actions_problem = "outbox needs list, retry or purge",
     .options = OPT_LIMIT | OPT_JSON | OPT_YES | OPT_STATE | OPT_ID | OPT_UNROUTABLE |
                OPT_PUBLISHED | OPT_OLDER_THAN,
     .set_action = set_outbox_action,
     .options_problem = outbox_options_problem,
     .run = run_outbox},
    {.name = "health",
     .options = OPT_PORT | OPT_URL | OPT_TIMEOUT,
     .no_config = true,
     .options_problem = health_options_problem,
     .run = run_health},
};

/* Applies option `index` (long_options' .val) with arg. Returns NULL, or why arg is wrong. */
static const char *apply_option(command_line *line, int index, const char *arg)
{
    switch ((option_bit)(1u << index)) {
    case OPT_DRY_RUN:
        line->dry_run = true;
        break;
    case OPT_QUEUE:
        line->dlq.queue = arg;
        break;
    case OPT_BIZ_KEY:
        line->dlq.biz_key = arg;
        break;
    case OPT_ALL:
        line->dlq.all = true;
        break;
    case OPT_JSON:
        line->dlq.json = line->outbox.json = true;
        break;
    case OPT_YES:
        line->dlq.yes = line->outbox.yes = true;
        break;
    case OPT_LIMIT: {
        char *end = NULL;
        long long limit = strtoll(arg, &end, 10);
        if (!end || *end || limit < 1)
            return "--limit takes a positive number";
        line->dlq.limit = line->outbox.limit = (size_t)limit;
        break;
    }
    case OPT_STATE:
        if (cli_outbox_parse_states(arg, &line->outbox.states) != 0)
            return "--state takes pending, unroutable, published or all (or a comma-separated "
                   "list)";
        break;
    case OPT_ID: {
        char *end = NULL;
        errno = 0;
        unsigned long long id = strtoull(arg, &end, 10);
        if (arg[0] < '0' || arg[0] > '9' || !end || *end || errno || id < 1 ||
            id > (unsigned long long)INT64_MAX)
            return "--id takes a row id (a positive number)";
        line->ids[line->outbox.id_count++] = id;
        break;
    }
    case OPT_UNROUTABLE:
        line->outbox.unroutable = true;
        break;
    case OPT_PUBLISHED:
        line->outbox.published = true;
        break;
    case OPT_OLDER_THAN: {
        uint64_t ms = 0;
        if (config_parse_duration(arg, &ms) != 0)
            return "--older-than takes a duration such as 30s, 12h or 7d";
        line->outbox.older_than_set = true;
        line->outbox.older_than_ms = ms;
        break;
    }
    case OPT_PORT: {
        char *end = NULL;
        long port = strtol(arg, &end, 10);
        if (arg[0] < '0' || arg[0] > '9' || !end || *end || port < 1 || port > 65535)
            return "--port takes a TCP port (1..65535)";
        line->health.port = (unsigned)port;
        break;
    }
    case OPT_URL:
        line->health.url = arg;
        break;
    case OPT_TIMEOUT: {
        uint64_t ms = 0;
        if (config_parse_duration(arg, &ms) != 0 || ms == 0)
            return "--timeout takes a positive duration such as 4s or 500ms";
        line->health.timeout_ms = ms;
        break;
    }
    }
    return NULL;
}

/* Parses argv[first..] for command c into line. Returns NULL, or the usage problem (in buf
 * when it names an option). *help is set by -h/--help. */
static const char *parse_options(const command_spec *c, int argc, char **argv, int first,
                                 command_line *line, bool *help, char *buf, size_t buf_len)
{
    optind = first;
    int opt, long_index = -1;
    while ((opt = getopt_long(argc, argv, "c:h", long_options, &long_index)) != -1) {
        if (opt == 'c') {
            if (c->no_config) {
                snprintf(buf, buf_len, "%s reads no config file: -c is not an option of it",
                         c->name);
                return buf;
            }
            line->config_path = optarg;
        } else if (opt == 'h') {
            *help = true;
            return NULL;
        } else if (opt >= 0 && opt < OPTION_BIT_COUNT) {
            if (!(c->options & (1u << opt))) {
                snprintf(buf, buf_len, "--%s is not an option of %s", long_options[long_index].name,
                         c->name);
                return buf;
            }
            const char *problem = apply_option(line, opt, optarg);
            if (problem)
                return problem;
        } else {
            return "bad option";
        }
        long_index = -1;
    }
    if (optind < argc)
        return "unexpected argument";
    if (c->options_problem) {
        const char *problem = c->options_problem(line);
        if (problem)
            return problem;
    }
    if (!line->config_path && !c->no_config)
        return "no config file: pass -c FILE or set IDEMQ_CONFIG";
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage_error("missing command");
    const char *name = argv[1];
    if (strcmp(name, "help") == 0 && argc == 3 && strcmp(argv[2], "config") == 0) {
        config_write_reference(stdout);
        return 0;
    }
    if (strcmp(name, "help") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(name, "version") == 0 || strcmp(name, "--version") == 0) {
        printf("idemq %s\n", IDEMQ_VERSION);
        return 0;
    }
    const command_spec *c = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0)
            c = &commands[i];
    if (!c) {
        fprintf(stderr, "idemq: unknown command '%s'\n\n", name);
        usage(stderr);
        return EXIT_USAGE;
    }

    /* --id may repeat: never more of them than arguments. Freed on every path below (a leak
     * would fail the ASan runs of the usage-error tests). */
    command_line line = {.config_path = getenv("IDEMQ_CONFIG")};
    line.ids = calloc((size_t)argc, sizeof *line.ids);
    if (!line.ids) {
        fprintf(stderr, "idemq: out of memory\n");
        return 1;
    }
    line.outbox.ids = line.ids;
    int first_option = 2;
    const char *problem = NULL;
    if (c->actions) {
        problem = c->actions_problem;
        for (int i = 0; argc > 2 && c->actions[i]; i++)
            if (strcmp(argv[2], c->actions[i]) == 0) {
                c->set_action(&line, i);
                problem = NULL;
                first_option = 3;
            }
    }
    char problem_buf[128];
    bool help = false;
    if (!problem)
        problem = parse_options(c, argc, argv, first_option, &line, &help, problem_buf,
                                sizeof problem_buf);
    if (help) {
        free(line.ids);
        usage(stdout);
        return 0;
    }
    if (problem) {
        free(line.ids);
        return usage_error(problem);
    }

    if (c->no_config) {
        int rc = c->run(NULL, &line);
        free(line.ids);
        return rc;
    }
    config *cfg = NULL;
    if (config_load(line.config_path, stderr, &cfg) != 0) {
        fprintf(stderr, "idemq: %s is not valid; nothing was started\n", line.config_path);
        free(line.ids);
        return EXIT_USAGE;
    }
    log_set_level((log_level)cfg->log_level); /* same order: config.h, ops/log.h */
    int rc = c->run(cfg, &line);
    config_free(cfg);
    free(line.ids);
    return rc;
}
