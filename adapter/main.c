/*
 * main — argv, config loading and dispatch to a subcommand. No logic lives here.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration problem.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "config/config.h"
#include "ops/log.h"

static void usage(FILE *out)
{
    fputs("usage: idemq COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  run -c FILE                 consume and apply messages until SIGTERM\n"
          "  check -c FILE               validate config, connect to both servers, print the plan\n"
          "  migrate -c FILE             create msg_dedup if missing, upgrade it (safe to re-run)\n"
          "  topology -c FILE [--dry-run]  declare (or only print) queues and exchanges\n"
          "  dlq list -c FILE [--queue Q] [--limit N] [--json]\n"
          "  dlq replay -c FILE [--queue Q] (--biz-key K | --all) [--limit N] [--json]\n"
          "  dlq purge -c FILE [--queue Q] --yes\n"
          "  version                     print the version\n"
          "  help                        this text\n"
          "  help config                 every configuration key (Markdown)\n"
          "\n"
          "The config file may also come from IDEMQ_CONFIG. IDEMQ_AMQP_URL and IDEMQ_MYSQL_URL\n"
          "override the URLs in the file.\n"
          "\n"
          "dlq list and replay walk the whole DLQ once, putting back (republish, confirm, ack)\n"
          "what they do not replay, so reading spends no broker delivery attempt and keeps the\n"
          "order; --limit caps only what is printed or replayed.\n",
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
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
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
    } else if (strcmp(command, "run") != 0 && strcmp(command, "check") != 0 &&
               strcmp(command, "migrate") != 0 && strcmp(command, "topology") != 0) {
        fprintf(stderr, "idemq: unknown command '%s'\n\n", command);
        usage(stderr);
        return EXIT_USAGE;
    }

    const char *config_path = getenv("IDEMQ_CONFIG");
    bool dry_run = false;
    optind = first_option;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:h", long_options, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case 'd': dry_run = true; break;
        case 'q': dlq.queue = optarg; break;
        case 'k': dlq.biz_key = optarg; break;
        case 'a': dlq.all = true; break;
        case 'j': dlq.json = true; break;
        case 'y': dlq.yes = true; break;
        case 'l': {
            char *end = NULL;
            long long limit = strtoll(optarg, &end, 10);
            if (!end || *end || limit < 1)
                return usage_error("--limit takes a positive number");
            dlq.limit = (size_t)limit;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: return usage_error("bad option");
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument");
    if (!config_path)
        return usage_error("no config file: pass -c FILE or set IDEMQ_CONFIG");

    config *cfg = NULL;
    if (config_load(config_path, stderr, &cfg) != 0) {
        fprintf(stderr, "idemq: %s is not valid; nothing was started\n", config_path);
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
    else
        rc = cli_dlq(cfg, &dlq);
    config_free(cfg);
    return rc;
}
