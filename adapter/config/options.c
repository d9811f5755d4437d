/*
 * options — see options.h.
 */
#include "config/options.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/node_urls.h"
#include "config/config.h"
#include "config/consumers.h"
#include "config/document.h"
#include "config/text.h"
#include "config/mysql_tls.h"
#include "config/secrets.h"
#include "config/url.h"

_Static_assert(sizeof(config_log_level) == sizeof(int), "enums are stored as int");

/* A number as the text of a default, so the table and config.h cannot disagree. */
#define DECIMAL_TEXT(n) #n
#define DECIMAL(n) DECIMAL_TEXT(n)

/* amqp.tls files are read at every connect: a typo or a permission problem must fail at load,
 * with its line, not at the first connect. */
static int check_readable_file(const char *text, char *err, size_t err_len)
{
    char shown[128];
    struct stat st;
    FILE *f;

    if (!*text) {
        snprintf(err, err_len, "the file name must not be empty");
        return -1;
    }
    config_show(shown, sizeof shown, text);
    if (stat(text, &st) != 0) {
        snprintf(err, err_len, "cannot read '%s': %s", shown, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "'%s' is not a regular file", shown);
        return -1;
    }
    f = fopen(text, "r");
    if (!f) {
        snprintf(err, err_len, "cannot read '%s': %s", shown, strerror(errno));
        return -1;
    }
    fclose(f);
    return 0;
}

/* A DNS name or an IP address, as a certificate holds them (no wildcard, no port). */
static int check_server_name(const char *text, char *err, size_t err_len)
{
    char shown[128];
    unsigned char v6[16];
    size_t n = strlen(text);
    if (n == 0 || n > 253) {
        snprintf(err, err_len, "must be a host name of 1 to 253 bytes");
        return -1;
    }
    for (const char *p = text; *p; p++) {
        char c = *p;
        if (!(config_is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '.' || c == ':')) {
            snprintf(err, err_len, "'%s' is not a host name or IP address (no port, no wildcard)",
                     config_show(shown, sizeof shown, text));
            return -1;
        }
    }
    if (strchr(text, ':') && inet_pton(AF_INET6, text, v6) != 1) {
        snprintf(err, err_len,
                 "'%s' is not a host name or IP address (no port: the URL gives the port)",
                 config_show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

/* The tables are laid out by hand, one entry per paragraph, to read like a reference. */
/* clang-format off */
static const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};

static const char *const bool_names[] = {"false", "true", NULL};
/* In config_dedup_layout's order. */
static const char *const dedup_layout_names[] = {"single", "rotating", NULL};

/* amqp.tls: offsets into config, like every section. */
static const opt amqp_tls_table[] = {
    {.name = "ca_file", .type = OPT_STRING, .offset = offsetof(config, amqp_tls.ca_file),
     .check = check_readable_file,
     .help = "CA certificates (PEM) that must sign the broker's certificate; default: the "
             "system trust store"},
    {.name = "cert_file", .type = OPT_STRING, .offset = offsetof(config, amqp_tls.cert_file),
     .check = check_readable_file,
     .help = "client certificate (PEM) for mutual TLS, with key_file; without a password in "
             "the URL idemq logs in with it (EXTERNAL)"},
    {.name = "key_file", .type = OPT_STRING, .offset = offsetof(config, amqp_tls.key_file),
     .check = check_readable_file, .help = "private key of cert_file (PEM, unencrypted)"},
    {.name = "verify", .type = OPT_ENUM, .offset = offsetof(config, amqp_tls.verify),
     .names = bool_names, .def = "true",
     .help = "check the broker's certificate chain and name; false is logged as a warning"},
    {.name = "server_name", .type = OPT_STRING, .offset = offsetof(config, amqp_tls.server_name),
     .check = check_server_name,
     .help = "name sent as SNI and required in the broker's certificate; default: the URL's "
             "host"},
    {0},
};

static const opt amqp_table[] = {
    /* url is the first slot of amqp_urls; both keys, and the environment, are settled by
     * config_finish_node_urls (node_urls.h), which also reports a missing URL. */
    {.name = "url", .type = OPT_STRING, .offset = offsetof(config, amqp_urls),
     .check = config_check_amqp_url,
     .help = "broker URL, amqp[s]://user:password@host:port/vhost; this or urls is required; "
             "env IDEMQ_AMQP_URL (one URL or a comma-separated list) overrides url and urls"},
    {.name = "urls", .type = OPT_CUSTOM, .parse = config_parse_amqp_urls,
     .help = "instead of url: a list of 1 to 16 nodes of one cluster, tried in an order shuffled "
             "per process; on connection loss idemq fails over to the next"},
    {.name = "prefetch", .type = OPT_UINT, .offset = offsetof(config, prefetch), .min = 1,
     .max = 65535, .def = "64", .help = "deliveries in flight before an ack (basic.qos)"},
    {.name = "heartbeat", .type = OPT_DURATION, .flags = OPT_WHOLE_SECONDS,
     .offset = offsetof(config, heartbeat_ms), .min = 0, .max = SECONDS(3600), .def = "30s",
     .help = "AMQP heartbeat interval; 0 turns heartbeats off"},
    {.name = "max_body", .type = OPT_SIZE, .offset = offsetof(config, max_body), .min = 1024,
     .max = 64u << 20, .def = "1MiB", .help = "largest message body accepted"},
    {.name = "tls", .type = OPT_SECTION, .section = amqp_tls_table,
     .help = "TLS settings of amqps:// URLs"},
    {.name = "password_file", .type = OPT_STRING, .offset = offsetof(config, amqp_password_file),
     .env = "IDEMQ_AMQP_PASSWORD_FILE", .check = config_check_secret_path,
     .help = "file holding the broker password (as is, one trailing newline stripped); "
             "overrides the URL's"},
    {0},
};

static const opt mysql_table[] = {
    /* url is the first slot of mysql_urls; both keys, and the environment, are settled by
     * config_finish_node_urls (node_urls.h), which also reports a missing URL. */
    {.name = "url", .type = OPT_STRING, .offset = offsetof(config, mysql_urls),
     .check = config_check_mysql_url,
     .help = "database URL, mysql://user:password@host:port/db[?socket=/path]; this or urls is "
             "required; env IDEMQ_MYSQL_URL (one URL or a comma-separated list) overrides url "
             "and urls"},
    {.name = "urls", .type = OPT_CUSTOM, .parse = config_parse_mysql_urls,
     .help = "instead of url: a list of 1 to 16 nodes of one database cluster (same user, "
             "password and database), tried in order from the one last used; idemq works only "
             "on a writable node (read_only and super_read_only off; for Galera, a node of the "
             "primary component that is ready) and moves on when its node is lost or turns "
             "read-only"},
    {.name = "read_timeout", .type = OPT_DURATION, .flags = OPT_WHOLE_SECONDS,
     .offset = offsetof(config, mysql_read_timeout_ms), .min = SECONDS(3), .max = SECONDS(3600),
     .def = "30s",
     .help = "how long idemq waits for the database to answer before it takes the connection "
             "for lost (and, with mysql.urls, moves to the next node): the pause a frozen node "
             "causes. Row-lock waits are capped 2 s below it (and at 20 s)"},
    {.name = "workers", .type = OPT_UINT, .offset = offsetof(config, workers), .min = 1,
     .max = 256, .def = "4", .help = "database worker threads, one connection each"},
    {.name = "batch", .type = OPT_UINT, .offset = offsetof(config, batch), .min = 1,
     .max = CONFIG_MAX_BATCH, .def = DECIMAL(CONFIG_DEFAULT_BATCH),
     .help = "messages a worker applies in one transaction, each keeping its own outcome; "
             "workers × batch must not exceed amqp.prefetch (the default is lowered to "
             "prefetch / workers when it would); 1 is one transaction per message"},
    {.name = "batch_linger_ms", .type = OPT_UINT, .offset = offsetof(config, batch_linger_ms),
     .min = 0, .max = CONFIG_MAX_BATCH_LINGER_MS, .def = "1",
     .help = "milliseconds a worker with a partial batch waits for more messages while every "
             "other worker is busy; 0 never waits"},
    {.name = "password_file", .type = OPT_STRING, .offset = offsetof(config, mysql_password_file),
     .env = "IDEMQ_MYSQL_PASSWORD_FILE", .check = config_check_secret_path,
     .help = "file holding the database password (as is, one trailing newline stripped); "
             "overrides the URL's"},
    {.name = "tls", .type = OPT_SECTION, .section = config_mysql_tls_table,
     .help = "TLS to MySQL"},
    {0},
};

static const opt log_table[] = {
    {.name = "level", .type = OPT_ENUM, .offset = offsetof(config, log_level),
     .names = log_level_names, .def = "info", .help = "lowest level written"},
    {0},
};

static const opt http_table[] = {
    {.name = "listen", .type = OPT_STRING, .offset = offsetof(config, http_listen),
     .check = config_check_listen, .def = "127.0.0.1:9464",
     .help = "HOST:PORT of /metrics, /healthz and /readyz"},
    {0},
};

/* Retention below 1h is accepted (tests use seconds) but logged as a warning at startup: a row
 * must outlive any redelivery or replay of its message, or that copy is applied again. */
static const opt dedup_table[] = {
    {.name = "retention", .type = OPT_DURATION, .flags = OPT_WHOLE_SECONDS,
     .offset = offsetof(config, dedup.retention_ms), .min = 0, .max = DAYS(3650), .def = "0",
     .help = "age after which msg_dedup rows are deleted; 0 keeps them forever"},
    {.name = "layout", .type = OPT_ENUM, .offset = offsetof(config, dedup.layout),
     .names = dedup_layout_names, .def = "single",
     .help = "single: one table, expired rows deleted in batches; rotating: two tables, the "
             "older one dropped whole each dedup.retention (store/rotation.h)"},
    {.name = "interval", .type = OPT_DURATION, .offset = offsetof(config, dedup.interval_ms),
     .min = SECONDS(1), .max = DAYS(1), .def = "1m",
     .help = "time between retention sweeps (rotating: between checks for a rotation due)"},
    {.name = "batch", .type = OPT_UINT, .offset = offsetof(config, dedup.batch), .min = 1,
     .max = 100000, .def = "1000", .help = "rows deleted per statement (one commit each)"},
    {.name = "cache", .type = OPT_UINT, .offset = offsetof(config, dedup.cache), .min = 0,
     .max = 10000000, .def = "0",
     .help = "keys this instance saw committed, remembered to settle their copies as deduped "
             "without a transaction (0: off)"},
    {.name = "cache_ttl", .type = OPT_DURATION, .offset = offsetof(config, dedup.cache_ttl_ms),
     .min = SECONDS(1), .max = DAYS(1), .def = "10m",
     .help = "how long a remembered key is trusted (below dedup.retention)"},
    {0},
};

/* The relay (outbox/relay.h). A lease far longer than the poll keeps a standby from taking over
 * from a relay that is only between rounds. */
static const opt outbox_table[] = {
    {.name = "relay", .type = OPT_ENUM, .offset = offsetof(config, outbox.relay),
     .names = bool_names, .def = "true",
     .help = "whether this instance publishes outbox rows (false: it only writes them)"},
    {.name = "batch", .type = OPT_UINT, .offset = offsetof(config, outbox.batch), .min = 1,
     .max = 10000, .def = "2048",
     .help = "rows published per round (one confirm wait each; at most 16 MiB of bodies)"},
    {.name = "poll_interval", .type = OPT_DURATION,
     .offset = offsetof(config, outbox.poll_interval_ms), .min = 10, .max = SECONDS(60),
     .def = "1s",
     .help = "how often rows this process was not told of (a crash, another instance) are "
             "looked for"},
    {.name = "lease", .type = OPT_DURATION, .offset = offsetof(config, outbox.lease_ms),
     .min = SECONDS(1), .max = SECONDS(600), .def = "10s",
     .help = "how long the publishing relay's lease lasts unrenewed; a standby takes over after "
             "it"},
    {.name = "retention", .type = OPT_DURATION, .offset = offsetof(config, outbox.retention_ms),
     .min = 0, .max = DAYS(3650), .def = "1h",
     .help = "how long published rows are kept (idemq outbox list); 0 deletes them at the "
             "confirm"},
    {.name = "stuck_after", .type = OPT_DURATION,
     .offset = offsetof(config, outbox.stuck_after_ms), .min = SECONDS(1), .max = DAYS(1),
     .def = "60s", .help = "/readyz fails while a pending row is older than this"},
    {0},
};

const opt config_top_table[] = {
    {.name = "amqp", .type = OPT_SECTION, .section = amqp_table, .help = "RabbitMQ connection"},
    {.name = "mysql", .type = OPT_SECTION, .section = mysql_table, .help = "MySQL connection"},
    {.name = "log", .type = OPT_SECTION, .section = log_table, .help = "logging"},
    {.name = "http", .type = OPT_SECTION, .section = http_table, .help = "ops endpoint"},
    {.name = "shutdown_timeout", .type = OPT_DURATION,
     .offset = offsetof(config, shutdown_timeout_ms), .min = 0, .max = SECONDS(3600),
     .def = "25s", .help = "time to finish in-flight work after SIGTERM"},
    {.name = "consumers", .type = OPT_CUSTOM, .flags = OPT_REQUIRED,
     .parse = config_parse_consumers, .items = config_consumer_table, .items_path = "[].",
     .help = "a list of queues to consume, each with its handler"},
    {.name = "dedup", .type = OPT_SECTION, .section = dedup_table,
     .help = "retention of msg_dedup rows, and the memory of keys seen committed"},
    {.name = "outbox", .type = OPT_SECTION, .section = outbox_table,
     .help = "the relay that publishes emitted messages after their commit"},
    {0},
};
/* clang-format on */

/* The line of the key `name` in map (0 when absent), for messages about the key itself. */
static unsigned long key_line(load_ctx *ctx, const yaml_node_t *map, const char *name)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *key = config_get_node(ctx, p->key);
        if (key && key->type == YAML_SCALAR_NODE && !strcmp(config_scalar_text(key), name))
            return config_node_line(key);
    }
    return 0;
}

void config_validate_batch(load_ctx *ctx, yaml_node_t *root, config *cfg)
{
    yaml_node_t *mysql = config_mapping_get(ctx, root, "mysql");
    unsigned long long in_flight = (unsigned long long)cfg->workers * cfg->batch;

    if (cfg->workers == 0 || cfg->batch == 0 || cfg->prefetch == 0)
        return; /* out of range: already reported */
    if (in_flight <= cfg->prefetch)
        return;
    if (!config_mapping_get(ctx, mysql, "batch")) {
        /* The default: a batch larger than a worker's share of the prefetch could never fill,
         * and a worker would only linger for messages the broker will not send. */
        cfg->batch = cfg->prefetch / cfg->workers ? cfg->prefetch / cfg->workers : 1;
        return;
    }
    config_report(ctx, key_line(ctx, mysql, "batch"),
                  "mysql.batch: %u workers × batch %u = %llu messages exceed amqp.prefetch %u: the "
                  "broker never has that many in flight, so batches could not fill; raise "
                  "amqp.prefetch to at least %llu or lower mysql.batch to %u",
                  cfg->workers, cfg->batch, in_flight, cfg->prefetch, in_flight,
                  cfg->prefetch / cfg->workers ? cfg->prefetch / cfg->workers : 1);
}

void config_validate_dedup_cache(load_ctx *ctx, yaml_node_t *root, const struct config *cfg)
{
    if (cfg->dedup.layout == CONFIG_DEDUP_ROTATING && cfg->dedup.retention_ms == 0) {
        /* The retention is the rotating tables' period: without one nothing would rotate. */
        yaml_node_t *dedup = config_mapping_get(ctx, root, "dedup");
        config_report(ctx, key_line(ctx, dedup, "layout"),
                      "dedup.layout: rotating needs dedup.retention (each table's period); set "
                      "one, or use layout single to keep rows forever");
    }
    /* A key remembered past its row's deletion would drop a copy the window no longer covers. */
    if (cfg->dedup.cache == 0 || cfg->dedup.retention_ms == 0 ||
        cfg->dedup.cache_ttl_ms < cfg->dedup.retention_ms)
        return;
    yaml_node_t *dedup = config_mapping_get(ctx, root, "dedup");
    config_report(ctx, key_line(ctx, dedup, "cache_ttl"),
                  "dedup.cache_ttl: %llu s is not below dedup.retention (%llu s): a key would be "
                  "remembered after its msg_dedup row was deleted, and a copy arriving then "
                  "dropped; lower dedup.cache_ttl",
                  (unsigned long long)(cfg->dedup.cache_ttl_ms / 1000),
                  (unsigned long long)(cfg->dedup.retention_ms / 1000));
}

void config_validate_amqp_tls(load_ctx *ctx, const config *cfg, yaml_node_t *root)
{
    yaml_node_t *amqp = config_mapping_get(ctx, root, "amqp");
    yaml_node_t *tls = config_mapping_get(ctx, amqp, "tls");
    bool has_cert, has_key;

    if (!tls || tls->type != YAML_MAPPING_NODE)
        return; /* absent, or its shape was already reported */
    /* By key, not by value: a file that failed its own check must not count as missing too. */
    has_cert = config_mapping_get(ctx, tls, "cert_file") != NULL;
    has_key = config_mapping_get(ctx, tls, "key_file") != NULL;
    if (has_cert != has_key)
        config_report(ctx, key_line(ctx, tls, has_cert ? "cert_file" : "key_file"),
                      "amqp.tls: %s is given without %s (a client certificate needs its private "
                      "key, and a key its certificate)",
                      has_cert ? "cert_file" : "key_file", has_cert ? "key_file" : "cert_file");
    for (size_t i = 0; i < cfg->amqp_url_count; i++) {
        const char *url = cfg->amqp_urls[i];
        if (!url || strncmp(url, "amqps://", 8) == 0)
            continue;
        const char *env = getenv("IDEMQ_AMQP_URL");
        char redacted[256], shown[128], which[64] = "amqp.url";
        if (cfg->amqp_url_count > 1)
            snprintf(which, sizeof which, "broker URL %zu of %zu", i + 1, cfg->amqp_url_count);
        config_redact_url(url, redacted, sizeof redacted);
        config_report(ctx, key_line(ctx, amqp, "tls"),
                      "amqp.tls is given but %s%s '%s' is plain AMQP, which would ignore it: use "
                      "an amqps:// URL (TLS, port 5671 by default) or remove amqp.tls",
                      which, env && *env ? " (from IDEMQ_AMQP_URL)" : "",
                      config_show(shown, sizeof shown, redacted));
    }
}

void config_finish_outbox(load_ctx *ctx, yaml_node_t *root, config *cfg)
{
    (void)ctx;
    (void)root;
    cfg->outbox_needed = false;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        config_consumer *c = &cfg->consumers[i];
        const config_handler *h = &c->handler;
        c->may_emit = h->type == CONFIG_HANDLER_PLUGIN ||
                      (h->type == CONFIG_HANDLER_SQL && h->sql.emit_count > 0);
        for (size_t t = 0; h->type == CONFIG_HANDLER_STATE_MACHINE &&
                           t < h->state_machine.transition_count && !c->may_emit;
             t++)
            c->may_emit = h->state_machine.transitions[t].emit_count > 0;
        cfg->outbox_needed = cfg->outbox_needed || c->may_emit;
    }
}
