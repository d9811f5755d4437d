/*
 * config — loads and validates the YAML configuration file: the public face of config/.
 *
 * The loader reads the whole file into a libyaml document (which keeps a line for every node),
 * walks it against declarative per-section tables (name, type, range, default, help) and reports
 * every problem it finds — unknown keys, wrong types, out-of-range values, missing required keys —
 * each with file:line, before the daemon touches the network. Environment variables
 * IDEMQ_AMQP_URL (one URL or a comma-separated list of nodes) and IDEMQ_MYSQL_URL override the
 * URLs, IDEMQ_AMQP_PASSWORD_FILE and IDEMQ_MYSQL_PASSWORD_FILE the password files (whose content
 * is read at load). Thread affinity: load on the main thread;
 * the resulting config is read-only afterwards and may be shared by every thread.
 *
 * This header is the config struct and config_load / config_free; it includes the three other
 * public parts: url.h (config_redact_url), units.h (config_parse_duration, config_parse_size) and
 * reference.h (config_write_reference, behind `idemq help config`). The rest of config/ is
 * internal to the loader, one job per file:
 *   config.c                read the file, YAML pre-pass, load the document, walk, print problems
 *   problems.c, text.c      collect problems with their line; echo user values safely
 *   document.c, table.c     read the libyaml document; the option tables and their walker
 *   options.c, consumers.c  the top-level sections; the consumers list and its cross-checks
 *   handler.c, handler_*.c  a handler's type, then one table and validation per type
 *   sql_template.c          the `:field` placeholder parser of sql statements (pure)
 *   yaml_json.c             a plugin's `config:` YAML as JSON text
 *   url.c, units.c          URL checks and redaction; durations and sizes
 *   node_urls.c             amqp.url(s) and mysql.url(s), the nodes of each cluster, and their
 *                           environment overrides (IDEMQ_AMQP_URL, IDEMQ_MYSQL_URL)
 *   secrets.c, mysql_tls.c  password files (read after the walk); the mysql.tls table and rules
 *   reference.c             the Markdown reference generated from the tables
 * config/ includes policy/ (retry_policy) and nothing else of idemq: handlers/, store/ and ops/
 * read the config, never the reverse.
 *
 * Errors, the convention of every header in config/:
 *   - A function that can fail follows util/errors.h (0 on success, a negative value on
 *     failure); each function says which negative values it returns (none returns an errno code).
 *   - The detail goes where the caller asks: config_load prints every problem to its `errors`
 *     stream, a check writes its reason into a caller-supplied buffer (err, util/errors.h) —
 *     nothing in config/ writes to stderr or exits on its own.
 *   - config_load returns minus the number of problems it found, so the caller can say how many.
 *   - Inside the loader, parse and validate functions return nothing: they report into the load
 *     context and carry on, so one run shows every mistake (table.h).
 */
#ifndef IDEMQ_CONFIG_H
#define IDEMQ_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "config/reference.h"
#include "config/units.h"
#include "config/url.h"
#include "policy/retry.h"

/* The `log.level` key. ops/log.h has the logger's own log_level in the same order (config/ does
 * not include ops/); main passes this one to log_set_level. */
typedef enum config_log_level {
    CONFIG_LOG_DEBUG = 0,
    CONFIG_LOG_INFO = 1,
    CONFIG_LOG_WARN = 2,
    CONFIG_LOG_ERROR = 3,
} config_log_level;

typedef enum config_declare_mode {
    CONFIG_DECLARE_CREATE = 0,  /* declare the work queue (durable) */
    CONFIG_DECLARE_PASSIVE = 1, /* only check that it exists */
} config_declare_mode;

typedef enum config_queue_type {
    CONFIG_QUEUE_QUORUM = 0,
    CONFIG_QUEUE_CLASSIC = 1,
} config_queue_type;

typedef enum config_handler_type {
    CONFIG_HANDLER_STATE_MACHINE = 0,
    CONFIG_HANDLER_SQL = 1,
    CONFIG_HANDLER_PLUGIN = 2,
} config_handler_type;

typedef enum config_on_illegal {
    CONFIG_ON_ILLEGAL_DEAD_LETTER = 0,
    CONFIG_ON_ILLEGAL_RETRY = 1,
} config_on_illegal;

/* emit: a downstream message written to the outbox (idemq_outbox, outbox/writer.h) in the
 * transaction that applies the incoming one, and published by the relay after the COMMIT
 * (outbox/relay.h). The outgoing envelope is a map of the listed fields plus a biz_key idemq
 * derives from the incoming biz_key, the handler name and the emit's name (outbox/writer.h). */
typedef enum config_emit_format {
    CONFIG_EMIT_JSON = 0,      /* application/json (the default) */
    CONFIG_EMIT_MSGPACK = 1,   /* application/msgpack */
} config_emit_format;

typedef struct config_emit_field {
    char *name;        /* key in the outgoing envelope (not "biz_key": idemq sets that) */
    char *from;        /* dotted path into the incoming message; NULL when value is set */
    json_t *value;     /* owned: a constant (a scalar, list or map), read-only once loaded (so
                        * the workers share it); NULL when from is set */
} config_emit_field;

typedef struct config_emit {
    char *name;                 /* unique within the consumer; part of the outgoing biz_key */
    char *exchange;             /* NULL or "": the default exchange (routing_key names the queue) */
    char *routing_key;
    config_emit_format format;
    config_emit_field *fields;  /* at least one */
    size_t field_count;
} config_emit;

typedef struct config_transition {
    char *event;      /* value of the event field, e.g. "PAY_SUCCESS" */
    char **from;      /* allowed predecessor states */
    size_t from_count;
    char *to;         /* target state */
    config_emit *emits; /* written when this transition applies (not on a state_noop) */
    size_t emit_count;
} config_transition;

typedef struct config_set_column {
    char *column;     /* column written with the transition */
    char *field;      /* message field (dotted path) its value comes from */
} config_set_column;

typedef struct config_state_machine {
    char *table;
    char *key_column;
    char *key_field;
    char *state_column;
    char *event_field;
    config_on_illegal on_illegal;
    config_transition *transitions;
    size_t transition_count;
    config_set_column *set;
    size_t set_count;
} config_state_machine;

typedef enum config_on_mismatch {
    CONFIG_ON_MISMATCH_DEAD_LETTER = 0,
    CONFIG_ON_MISMATCH_RETRY = 1,
} config_on_mismatch;

/* One statement of a sql handler. The placeholders of `sql` were parsed at load (see
 * config/sql_template.h for the rule): `prepared` is the text with each one replaced by '?',
 * params[i] is the message field (dotted path) bound to the i-th '?'. */
typedef struct config_sql_statement {
    char *sql;              /* as written in the file, at most 64 KiB */
    char *prepared;         /* what the worker prepares */
    char **params;
    size_t param_count;
    bool expect_rows_set;   /* expect_rows was given */
    unsigned expect_rows;   /* rows the statement must match (or return, for a SELECT) */
} config_sql_statement;

typedef struct config_sql {
    config_sql_statement *statements;   /* at least one */
    size_t statement_count;
    config_on_mismatch on_mismatch;     /* when a statement's row count differs from expect_rows */
    config_emit *emits;                 /* written when every statement succeeded */
    size_t emit_count;
} config_sql;

typedef struct config_plugin {
    char *path;             /* absolute path of the shared object */
    char *config_json;      /* the handler's `config:` subtree as compact JSON; "{}" when absent */
} config_plugin;

typedef struct config_handler {
    config_handler_type type;
    config_state_machine state_machine; /* type == CONFIG_HANDLER_STATE_MACHINE */
    config_sql sql;                     /* type == CONFIG_HANDLER_SQL */
    config_plugin plugin;               /* type == CONFIG_HANDLER_PLUGIN */
} config_handler;

typedef struct config_consumer {
    char *queue;
    char *handler_name;     /* the dedup column; at most 64 bytes */
    config_declare_mode declare;
    config_queue_type queue_type;
    retry_policy retry;     /* max_retries 0..32 (6), base (1s), jitter (1s), max_delay (1h) */
    config_handler handler;
    bool may_emit;          /* an emit is configured, or the handler is a plugin (which may call
                             * host->emit): the outbox table must exist and the relay runs */
} config_consumer;

/* dedup: the retention job that deletes old msg_dedup rows (store/retention.h), and the memory
 * of keys this instance saw committed (run/seen_keys.h). */
typedef enum config_dedup_layout {
    CONFIG_DEDUP_SINGLE,   /* one msg_dedup, expired rows deleted in batches (store/retention.h) */
    CONFIG_DEDUP_ROTATING, /* msg_dedup and msg_dedup_previous, rotated (store/rotation.h) */
} config_dedup_layout;

typedef struct config_dedup {
    int layout;             /* config_dedup_layout; default single */
    uint64_t retention_ms;  /* 0 (default): rows are kept forever; else whole seconds, >= 1s */
    uint64_t interval_ms;   /* time between sweeps, 1s..1d, default 1m */
    unsigned batch;         /* rows per DELETE (one commit each), 1..100000, default 1000 */
    unsigned cache;         /* keys remembered by run/seen_keys.h, 0 (default: off)..10^7 */
    uint64_t cache_ttl_ms;  /* how long one is trusted, 1s..1d, default 10m, below retention */
} config_dedup;

/* outbox: the relay that publishes idemq_outbox rows after their COMMIT (outbox/relay.h). */
typedef struct config_outbox {
    int relay;                  /* outbox.relay: 1 (default) this instance relays; 0 it only
                                 * writes rows (another instance, or a dedicated one, relays) */
    unsigned batch;             /* rows published per round, 1..10000, default 2048 */
    uint64_t poll_interval_ms;  /* rows not announced by this process (another instance, a
                                 * crash) are looked for this often; 10ms..1m, default 1s */
    uint64_t lease_ms;          /* how long a relay's lease lasts unrenewed; a standby takes
                                 * over after it; 1s..10m, default 10s */
    uint64_t retention_ms;      /* published rows are kept this long; 0 deletes them at the
                                 * confirm; default 1h */
    uint64_t stuck_after_ms;    /* /readyz: a pending row older than this; default 60s */
} config_outbox;

/* mysql.batch: the largest and the default number of messages in one transaction, and the
 * longest linger (store.h says how a worker fills a batch). */
#define CONFIG_MAX_BATCH 1024
#define CONFIG_DEFAULT_BATCH 32
#define CONFIG_MAX_BATCH_LINGER_MS 50

/* Broker nodes of one cluster in amqp.urls. */
#define CONFIG_MAX_AMQP_URLS 16
#define CONFIG_MAX_MYSQL_URLS 16
#define CONFIG_MAX_NODE_URLS 16 /* the larger of the two */
/* amqp.tls: how an amqps:// connection checks the broker and which client certificate it shows
 * (broker/tls.h). An amqps:// URL without a tls block gets the defaults: the system trust store,
 * verification on. The loader checks that each file can be read, that cert_file and key_file
 * come together, and that the URL is amqps:// when the block is there. */
typedef struct config_amqp_tls {
    char *ca_file;      /* CA certificates (PEM) the broker's chain must end in; NULL: the
                           system trust store */
    char *cert_file;    /* client certificate chain (PEM), for mutual TLS; NULL: none */
    char *key_file;     /* its private key (PEM, unencrypted); set exactly when cert_file is */
    int verify;         /* 1 (default): the chain and the name are checked; 0: neither (the
                           daemon warns at start) */
    char *server_name;  /* SNI and the name the certificate must hold; NULL: the URL's host */
} config_amqp_tls;
/* mysql.tls.mode; the order is db_tls_mode's (db/dsn.h). What each does: db/connect.h. */
typedef enum config_mysql_tls_mode {
    CONFIG_MYSQL_TLS_DISABLED = 0,
    CONFIG_MYSQL_TLS_PREFERRED = 1, /* the default */
    CONFIG_MYSQL_TLS_REQUIRED = 2,
    CONFIG_MYSQL_TLS_VERIFY_CA = 3,
    CONFIG_MYSQL_TLS_VERIFY_IDENTITY = 4,
} config_mysql_tls_mode;

/* mysql.tls (config/mysql_tls.h). The files were readable at load. */
typedef struct config_mysql_tls {
    config_mysql_tls_mode mode;
    char *ca_file;          /* verify_ca / verify_identity only; NULL: the system trust store */
    char *cert_file;        /* client certificate and its key: both or neither; not with disabled */
    char *key_file;
} config_mysql_tls;

typedef struct config {
    char *path;             /* the file it came from, for messages */
    /* amqp: the broker nodes, from amqp.url (one), amqp.urls (a list) or IDEMQ_AMQP_URL, in the
     * order given; amqp_urls[0..amqp_url_count) are set, the rest NULL. They may hold
     * passwords: never log one, use config_redact_url. */
    char *amqp_urls[CONFIG_MAX_AMQP_URLS];
    size_t amqp_url_count;  /* 1..CONFIG_MAX_AMQP_URLS */
    unsigned prefetch;      /* 1..65535, default 64 */
    uint64_t heartbeat_ms;  /* 0 disables; default 30000 */
    size_t max_body;        /* bytes, default 1 MiB */
    config_amqp_tls amqp_tls; /* amqp.tls; used for amqps:// URLs */
    /* mysql: the database nodes, from mysql.url (one), mysql.urls (a list) or IDEMQ_MYSQL_URL,
     * in the order given; mysql_urls[0..mysql_url_count) are set, the rest NULL. They share
     * one user, password and database (config/node_urls.h); they may hold passwords. */
    char *mysql_urls[CONFIG_MAX_MYSQL_URLS];
    size_t mysql_url_count; /* 1..CONFIG_MAX_MYSQL_URLS */
    uint64_t mysql_read_timeout_ms; /* mysql.read_timeout, whole seconds, default 30 s */
    unsigned workers;       /* 1..256, default 4 */
    unsigned batch;         /* mysql.batch: messages per transaction, 1..CONFIG_MAX_BATCH. The
                             * default (CONFIG_DEFAULT_BATCH) is lowered to prefetch / workers
                             * (at least 1) when that is smaller; a value given in the file
                             * must fit: workers × batch <= prefetch (config_load refuses it) */
    unsigned batch_linger_ms; /* mysql.batch_linger_ms: how long a worker holding a partial
                               * batch waits for more, 0..CONFIG_MAX_BATCH_LINGER_MS, default 1 */
    /* log */
    config_log_level log_level;
    /* http (used by the ops endpoint) */
    char *http_listen;      /* default "127.0.0.1:9464" */
    uint64_t shutdown_timeout_ms; /* default 25000 */
    config_consumer *consumers;
    size_t consumer_count;  /* at least 1 */
    config_dedup dedup;
    config_outbox outbox;
    bool outbox_needed;     /* some consumer may_emit: migrate's table is required, relay runs */
    /* Secrets from files and MySQL TLS (config/secrets.h, config/mysql_tls.h). A *_password is
     * the file's content (one trailing newline stripped), read at load, and overrides the URL's
     * password; NULL when no file is given. Never log one: it is zeroed by config_free. */
    char *amqp_password_file;   /* amqp.password_file, or IDEMQ_AMQP_PASSWORD_FILE (wins) */
    char *amqp_password;
    char *mysql_password_file;  /* mysql.password_file, or IDEMQ_MYSQL_PASSWORD_FILE (wins) */
    char *mysql_password;
    config_mysql_tls mysql_tls;
} config;

/*
 * Loads path into a newly allocated config (returned owned through out).
 * Every problem is written to errors (borrowed; may be NULL) as "file:line: message", one per
 * line. Returns 0 on success, or the negative number of problems found (out is then NULL).
 */
int config_load(const char *path, FILE *errors, config **out);

/* Frees a config from config_load; config_free(NULL) is a no-op. */
void config_free(config *cfg);

#endif
