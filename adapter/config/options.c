/*
 * options — see options.h.
 */
#include "config/options.h"

#include <stddef.h>

#include "config/config.h"
#include "config/consumers.h"
#include "config/mysql_tls.h"
#include "config/secrets.h"
#include "config/url.h"

_Static_assert(sizeof(config_log_level) == sizeof(int), "enums are stored as int");

static int check_amqp_url(const char *text, char *why, size_t why_len)
{
    static const char *const schemes[] = {"amqp", "amqps", NULL};
    return config_check_url(text, schemes, "amqp:// or amqps://", false, why, why_len);
}

static int check_mysql_url(const char *text, char *why, size_t why_len)
{
    static const char *const schemes[] = {"mysql", NULL};
    return config_check_url(text, schemes, "mysql://", true, why, why_len);
}

/* The tables are laid out by hand, one entry per paragraph, to read like a reference. */
/* clang-format off */
static const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};

static const opt amqp_table[] = {
    {.name = "url", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config, amqp_url), .env = "IDEMQ_AMQP_URL", .check = check_amqp_url,
     .help = "broker URL, amqp[s]://user:password@host:port/vhost"},
    {.name = "prefetch", .type = OPT_UINT, .offset = offsetof(config, prefetch), .min = 1,
     .max = 65535, .def = "64", .help = "deliveries in flight before an ack (basic.qos)"},
    {.name = "heartbeat", .type = OPT_DURATION, .flags = OPT_WHOLE_SECONDS,
     .offset = offsetof(config, heartbeat_ms), .min = 0, .max = SECONDS(3600), .def = "30s",
     .help = "AMQP heartbeat interval; 0 turns heartbeats off"},
    {.name = "max_body", .type = OPT_SIZE, .offset = offsetof(config, max_body), .min = 1024,
     .max = 64u << 20, .def = "1MiB", .help = "largest message body accepted"},
    {.name = "password_file", .type = OPT_STRING, .offset = offsetof(config, amqp_password_file),
     .env = "IDEMQ_AMQP_PASSWORD_FILE", .check = config_check_secret_path,
     .help = "file holding the broker password (as is, one trailing newline stripped); "
             "overrides the URL's"},
    {0},
};

static const opt mysql_table[] = {
    {.name = "url", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config, mysql_url), .env = "IDEMQ_MYSQL_URL", .check = check_mysql_url,
     .help = "database URL, mysql://user:password@host:port/db[?socket=/path]"},
    {.name = "workers", .type = OPT_UINT, .offset = offsetof(config, workers), .min = 1,
     .max = 256, .def = "4", .help = "database worker threads, one connection each"},
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
    {.name = "interval", .type = OPT_DURATION, .offset = offsetof(config, dedup.interval_ms),
     .min = SECONDS(1), .max = DAYS(1), .def = "1m", .help = "time between retention sweeps"},
    {.name = "batch", .type = OPT_UINT, .offset = offsetof(config, dedup.batch), .min = 1,
     .max = 100000, .def = "1000", .help = "rows deleted per statement (one commit each)"},
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
     .help = "retention of msg_dedup rows"},
    {0},
};
/* clang-format on */
