/*
 * main — argv, config loading and dispatch to a subcommand. No logic lives here.
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
          "pending ones (messages not yet sent); without --yes it says what it would delete.\n",
          out);
}

static int usage_error(const char *message)
{
    fprintf(stderr, "idemq: %s\n\n", message);
    usage(stderr);
    return EXIT_USAGE;
}

int main(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"config", required_argument, NULL, 'c'}, {"dry-run", no_argument, NULL, 'd'},
        {"queue", required_argument, NULL, 'q'},  {"limit", required_argument, NULL, 'l'},
        {"biz-key", required_argument, NULL, 'k'}, {"all", no_argument, NULL, 'a'},
        {"json", no_argument, NULL, 'j'},         {"yes", no_argument, NULL, 'y'},
        {"help", no_argument, NULL, 'h'},         {"state", required_argument, NULL, 's'},
        {"id", required_argument, NULL, 'i'},     {"unroutable", no_argument, NULL, 'u'},
        {"published", no_argument, NULL, 'p'},    {"older-than", required_argument, NULL, 'o'},
        {NULL, 0, NULL, 0},
    };
    if (argc < 2)
        return usage_error("missing command");
    const char *command = argv[1];
    if (strcmp(command, "help") == 0 && argc == 3 && strcmp(argv[2], "config") == 0) {
        config_write_reference(stdout);
        return 0;
    }
    if (strcmp(command, "help") == 0 || strcmp(command, "--help") == 0 ||
        strcmp(command, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(command, "version") == 0 || strcmp(command, "--version") == 0) {
        printf("idemq %s\n", IDEMQ_VERSION);
        return 0;
    }

    int first_option = 2;
    dlq_options dlq = {0};
    outbox_options outbox = {0};
    bool is_outbox = strcmp(command, "outbox") == 0;
    if (strcmp(command, "dlq") == 0) {
        if (argc < 3)
            return usage_error("dlq needs list, replay or purge");
        if (strcmp(argv[2], "list") == 0)
            dlq.action = DLQ_LIST;
        else if (strcmp(argv[2], "replay") == 0)
            dlq.action = DLQ_REPLAY;
        else if (strcmp(argv[2], "purge") == 0)
            dlq.action = DLQ_PURGE;
        else
            return usage_error("dlq needs list, replay or purge");
        first_option = 3;
    } else if (is_outbox) {
        if (argc < 3)
            return usage_error("outbox needs list, retry or purge");
        if (strcmp(argv[2], "list") == 0)
            outbox.action = OUTBOX_LIST;
        else if (strcmp(argv[2], "retry") == 0)
            outbox.action = OUTBOX_RETRY;
        else if (strcmp(argv[2], "purge") == 0)
            outbox.action = OUTBOX_PURGE;
        else
            return usage_error("outbox needs list, retry or purge");
        first_option = 3;
    } else if (strcmp(command, "run") != 0 && strcmp(command, "check") != 0 &&
               strcmp(command, "migrate") != 0 && strcmp(command, "topology") != 0) {
        fprintf(stderr, "idemq: unknown command '%s'\n\n", command);
        usage(stderr);
        return EXIT_USAGE;
    }

    /* --id may repeat: never more of them than arguments. Freed on every path below (a leak
     * would fail the ASan runs of the usage-error tests). */
    unsigned long long *ids = calloc((size_t)argc, sizeof *ids);
    if (!ids) {
        fprintf(stderr, "idemq: out of memory\n");
        return 1;
    }
    outbox.ids = ids;
    const char *problem = NULL;
    const char *config_path = getenv("IDEMQ_CONFIG");
    bool dry_run = false;
    bool not_outbox = false, outbox_only = false; /* options of other commands, of outbox */
    optind = first_option;
    int opt;
    while (!problem && (opt = getopt_long(argc, argv, "c:h", long_options, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case 'd': dry_run = true; not_outbox = true; break;
        case 'q': dlq.queue = optarg; not_outbox = true; break;
        case 'k': dlq.biz_key = optarg; not_outbox = true; break;
        case 'a': dlq.all = true; not_outbox = true; break;
        case 'j': dlq.json = outbox.json = true; break;
        case 'y': dlq.yes = outbox.yes = true; break;
        case 'l': {
            char *end = NULL;
            long long limit = strtoll(optarg, &end, 10);
            if (!end || *end || limit < 1) {
                problem = "--limit takes a positive number";
                break;
            }
            dlq.limit = outbox.limit = (size_t)limit;
            break;
        }
        case 's':
            outbox_only = true;
            if (cli_outbox_parse_states(optarg, &outbox.states) != 0)
                problem = "--state takes pending, unroutable, published or all (or a "
                          "comma-separated list)";
            break;
        case 'i': {
            outbox_only = true;
            char *end = NULL;
            errno = 0;
            unsigned long long id = strtoull(optarg, &end, 10);
            if (optarg[0] < '0' || optarg[0] > '9' || !end || *end || errno || id < 1 ||
                id > (unsigned long long)INT64_MAX)
                problem = "--id takes a row id (a positive number)";
            else
                ids[outbox.id_count++] = id;
            break;
        }
        case 'u': outbox.unroutable = true; outbox_only = true; break;
        case 'p': outbox.published = true; outbox_only = true; break;
        case 'o': {
            outbox_only = true;
            uint64_t ms = 0;
            if (config_parse_duration(optarg, &ms) != 0)
                problem = "--older-than takes a duration such as 30s, 12h or 7d";
            outbox.older_than_set = true;
            outbox.older_than_ms = ms;
            break;
        }
        case 'h': free(ids); usage(stdout); return 0;
        default: problem = "bad option"; break;
        }
    }
    if (!problem && optind < argc)
        problem = "unexpected argument";
    if (!problem && is_outbox && not_outbox)
        problem = "--queue, --biz-key, --all and --dry-run are not options of outbox";
    if (!problem && !is_outbox && outbox_only)
        problem = "--state, --id, --unroutable, --published and --older-than are options of "
                  "outbox only";
    if (!problem && is_outbox)
        problem = cli_outbox_usage_problem(&outbox);
    if (!problem && !config_path)
        problem = "no config file: pass -c FILE or set IDEMQ_CONFIG";
    if (problem) {
        free(ids);
        return usage_error(problem);
    }

    config *cfg = NULL;
    if (config_load(config_path, stderr, &cfg) != 0) {
        fprintf(stderr, "idemq: %s is not valid; nothing was started\n", config_path);
        free(ids);
        return EXIT_USAGE;
    }
    log_set_level((log_level)cfg->log_level); /* same order: config.h, ops/log.h */

    int rc;
    if (strcmp(command, "run") == 0)
        rc = cli_run(cfg);
    else if (strcmp(command, "check") == 0)
        rc = cli_check(cfg);
    else if (strcmp(command, "migrate") == 0)
        rc = cli_migrate(cfg);
    else if (strcmp(command, "topology") == 0)
        rc = cli_topology(cfg, dry_run);
    else if (is_outbox)
        rc = cli_outbox(cfg, &outbox);
    else
        rc = cli_dlq(cfg, &dlq);
    config_free(cfg);
    free(ids);
    return rc;
}
