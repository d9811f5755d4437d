/*
 * admin — the one-shot subcommands: check, migrate, topology. Blocking calls are fine here:
 * there is no event loop, just a connection, a few RPCs and an exit code. Thread affinity: the
 * main thread.
 */
#include "cli/cli.h"

#include <errno.h>
#include <mysql.h>
#include <stdio.h>
#include <string.h>

#include "broker/connection.h"
#include "broker/nodes.h"
#include "broker/tls.h"
#include "broker/topology.h"
#include "db/connect.h"
#include "db/nodes.h"
#include "db/prepare.h"
#include "handlers/plugin_loader.h"
#include "store/rotation.h"
#include "store/schema.h"

/* Prepares (never executes) each statement of a sql handler: the server resolves every table and
 * column then, so a typo shows up here rather than on the first message. */
static int check_sql_handler(MYSQL *db, const config_consumer *c)
{
    const config_sql *sql = &c->handler.sql;
    for (size_t i = 0; i < sql->statement_count; i++) {
        const config_sql_statement *st = &sql->statements[i];
        MYSQL_STMT *stmt;
        db_error error;
        int rc = db_prepare(db, st->prepared, &stmt, &error);
        if (rc == -ENOMEM) {
            fprintf(stderr, "mysql   FAIL consumer %s: out of memory\n", c->queue);
            return 1;
        }
        if (rc != 0) {
            fprintf(stderr, "mysql   FAIL consumer %s statement %zu: %s (error %u)\n", c->queue,
                    i + 1, error.message, error.number);
            return 1;
        }
        if (mysql_stmt_param_count(stmt) != st->param_count) {
            fprintf(stderr,
                    "mysql   FAIL consumer %s statement %zu: the server sees %lu parameters, the "
                    "config %zu placeholders\n",
                    c->queue, i + 1, (unsigned long)mysql_stmt_param_count(stmt), st->param_count);
            rc = 1;
        }
        mysql_stmt_close(stmt);
        if (rc)
            return rc;
    }
    printf("mysql   ok   consumer %s: %zu sql statement(s) prepared\n", c->queue,
           sql->statement_count);
    return 0;
}

static int check_handler_schema(MYSQL *db, const config_consumer *c)
{
    const config_state_machine *sm = &c->handler.state_machine;
    char sql[512];
    switch (c->handler.type) {
    case CONFIG_HANDLER_SQL:
        return check_sql_handler(db, c);
    case CONFIG_HANDLER_PLUGIN:
        return 0; /* its SQL is its own; check_plugins loads it */
    case CONFIG_HANDLER_STATE_MACHINE:
        break;
    }
    snprintf(sql, sizeof sql, "SELECT `%s`, `%s` FROM `%s` LIMIT 0", sm->key_column,
             sm->state_column, sm->table);
    if (mysql_query(db, sql) != 0) {
        fprintf(stderr, "mysql   FAIL consumer %s: %s\n", c->queue, mysql_error(db));
        return 1;
    }
    mysql_free_result(mysql_store_result(db));
    return 0;
}

/* Loads each plugin (ABI check and init with its config), reports it and unloads it again. */
static int check_plugins(const config *cfg)
{
    int rc = 0;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        const config_consumer *c = &cfg->consumers[i];
        char err[1024];
        plugin *p;
        if (c->handler.type != CONFIG_HANDLER_PLUGIN)
            continue;
        if (plugin_open(c->handler.plugin.path, c->handler.plugin.config_json, &p, err,
                        sizeof err) != 0) {
            fprintf(stderr, "plugin  FAIL consumer %s: %s\n", c->queue, err);
            rc = 1;
            continue;
        }
        printf("plugin  ok   consumer %s: plugin %s (ABI %u) from %s\n", c->queue, plugin_name(p),
               (unsigned)plugin_abi_version(p), c->handler.plugin.path);
        plugin_close(p);
    }
    return rc;
}

/* With mysql.urls: one line per node, whether it answers and takes writes, so that an operator
 * sees a wrong port or a node that stays read-only before a failover needs it. The checks below
 * then run on the node idemq would use. */
static void report_database_nodes(const config *cfg)
{
    db_dsn dsn, one;
    char err[1024], name[520];
    if (cfg->mysql_url_count < 2 || db_dsn_from_config(cfg, &dsn, err, sizeof err) != 0)
        return;
    for (size_t i = 0; i < db_dsn_node_count(&dsn); i++) {
        db_dsn_for_node(&dsn, i, &one);
        db_dsn_node_name(&dsn, i, name, sizeof name);
        MYSQL *db = db_connect(&one, NULL, err, sizeof err);
        unsigned refused = db ? db_node_check_writable(db, err, sizeof err) : 0;
        if (db && !refused)
            printf("mysql   node %s: writable\n", name);
        else
            printf("mysql   node %s: not usable now: %s\n", name, err);
        if (db)
            mysql_close(db);
    }
    explicit_bzero(one.password, sizeof one.password);
    explicit_bzero(dsn.password, sizeof dsn.password);
}

static int check_database(const config *cfg)
{
    char err[1024], redacted[560], tls[160], node[520];
    config_redact_url(cfg->mysql_urls[0], redacted, sizeof redacted);
    report_database_nodes(cfg);
    MYSQL *db = db_connect_config(cfg, err, sizeof err);
    if (!db) {
        fprintf(stderr, "mysql   FAIL %s: %s\n",
                cfg->mysql_url_count > 1 ? "mysql.urls" : redacted, err);
        return 1;
    }
    if (cfg->mysql_url_count > 1) {
        db_nodes_current(node, sizeof node);
        snprintf(redacted, sizeof redacted, "node %s", node);
        printf("mysql   using node %s\n", node);
    }
    printf("mysql   tls  %s (mysql.tls.mode %s)%s\n", db_describe_tls(db, tls, sizeof tls),
           db_tls_mode_name((db_tls_mode)cfg->mysql_tls.mode),
           cfg->mysql_password ? "; password from mysql.password_file" : "");
    int rc = 0;
    if (mysql_query(db, "SELECT 1 FROM msg_dedup LIMIT 0") != 0) {
        fprintf(stderr, "mysql   FAIL %s: table msg_dedup is not usable (%s); run `idemq migrate`\n",
                redacted, mysql_error(db));
        rc = 1;
    } else {
        mysql_free_result(mysql_store_result(db));
        char schema[512];
        int schema_rc = store_dedup_schema_check(db, schema, sizeof schema);
        if (schema_rc != 0) {
            fprintf(stderr, "mysql   %s %s\n", schema_rc > 0 ? "WARN" : "FAIL", schema);
            if (schema_rc < 0)
                rc = 1;
        }
        if (rotation_layout_check(db, cfg->dedup.layout, cfg->dedup.retention_ms / 1000,
                                  schema, sizeof schema) != 0) { /* wrong or unreadable */
            fprintf(stderr, "mysql   FAIL %s\n", schema);
            rc = 1;
        } else {
            printf("dedup   %s\n", schema);
        }
        if (cfg->outbox_needed && store_outbox_schema_check(db, schema, sizeof schema) != 0) {
            /* A configured emit: would fail every message that takes it; a plugin only may call
             * host->emit, so its consumers are told, not stopped. */
            bool configured = false;
            for (size_t i = 0; i < cfg->consumer_count; i++)
                configured |= cfg->consumers[i].may_emit &&
                              cfg->consumers[i].handler.type != CONFIG_HANDLER_PLUGIN;
            fprintf(stderr, "mysql   %s %s%s\n", configured ? "FAIL" : "WARN", schema,
                    configured ? "" : " (a plugin consumer that calls host->emit needs them)");
            if (configured)
                rc = 1;
        }
        for (size_t i = 0; i < cfg->consumer_count && rc == 0; i++)
            rc = check_handler_schema(db, &cfg->consumers[i]);
        if (rc == 0)
            printf("mysql   ok   %s (server %s)\n", redacted, mysql_get_server_info(db));
    }
    mysql_close(db);
    return rc;
}

/* Every node in turn: one that does not answer fails the check only when no node answers (idemq
 * runs on any one of them), and is a WARN line otherwise; a refusal (credentials, vhost) always
 * fails it. */
static int check_broker(const config *cfg)
{
    char err[CONFIG_MAX_AMQP_URLS][1024], tls_info[CONFIG_MAX_AMQP_URLS][1024], redacted[512];
    int rc[CONFIG_MAX_AMQP_URLS];
    size_t answered = 0;
    bool refused = false;
    const char *tls_warning = broker_tls_warning(cfg->amqp_urls[0], &cfg->amqp_tls);
    if (tls_warning)
        printf("amqp    WARN %s\n", tls_warning);
    for (size_t i = 0; i < cfg->amqp_url_count; i++) {
        amqp_connection_state_t conn;
        tls_info[i][0] = '\0';
        broker_open_options opts = {.url = cfg->amqp_urls[i],
                                    .heartbeat_ms = 0,
                                    .tls = &cfg->amqp_tls,
                                    .tls_info = tls_info[i],
                                    .tls_info_len = sizeof tls_info[i],
                                    .password = cfg->amqp_password};
        rc[i] = broker_open(&opts, &conn, err[i], sizeof err[i]);
        if (rc[i] == 0) {
            answered++;
            broker_close(conn);
        } else if (rc[i] == BROKER_E_REFUSED) {
            refused = true;
        }
    }
    for (size_t i = 0; i < cfg->amqp_url_count; i++) {
        config_redact_url(cfg->amqp_urls[i], redacted, sizeof redacted);
        if (rc[i] == 0) {
            printf("amqp    ok   %s%s\n", redacted,
                   cfg->amqp_password ? " (password from amqp.password_file)" : "");
            /* The handshake rabbitmq-c just made, as recorded by broker/tls.c's callbacks. */
            if (tls_info[i][0])
                printf("amqp    tls  %s\n", tls_info[i]);
        } else if (rc[i] == BROKER_E_REFUSED || answered == 0)
            fprintf(stderr, "amqp    FAIL %s: %s\n", redacted, err[i]);
        else
            fprintf(stderr, "amqp    WARN %s: %s (%zu of %zu nodes answered)\n", redacted, err[i],
                    answered, cfg->amqp_url_count);
    }
    return answered == 0 || refused ? 1 : 0;
}

int cli_check(const config *cfg)
{
    printf("config  ok   %s (%zu consumer(s))\n", cfg->path, cfg->consumer_count);
    int rc = check_database(cfg);
    rc |= check_plugins(cfg);
    rc |= check_broker(cfg);
    if (cfg->dedup.retention_ms && cfg->dedup.layout == CONFIG_DEDUP_ROTATING)
        printf("dedup   retention %llus: the tables rotate every %llus (checked every %llums)\n",
               (unsigned long long)(cfg->dedup.retention_ms / 1000),
               (unsigned long long)(cfg->dedup.retention_ms / 1000),
               (unsigned long long)cfg->dedup.interval_ms);
    else if (cfg->dedup.retention_ms)
        printf("dedup   retention %llus, swept every %llums, %u rows per batch\n",
               (unsigned long long)(cfg->dedup.retention_ms / 1000),
               (unsigned long long)cfg->dedup.interval_ms, cfg->dedup.batch);
    else
        printf("dedup   retention off (msg_dedup rows are kept)\n");
    printf("\ntopology plan:\n");
    for (size_t i = 0; i < cfg->consumer_count; i++)
        topology_print(stdout, &cfg->consumers[i]);
    return rc ? 1 : 0;
}

int cli_migrate(const config *cfg)
{
    char err[1024];
    MYSQL *db = db_connect_config(cfg, err, sizeof err);
    if (!db) {
        fprintf(stderr, "idemq migrate: %s\n", err);
        return 1;
    }
    int rc = store_migrate(db, cfg->dedup.layout, err, sizeof err);
    mysql_close(db);
    if (rc != 0) {
        fprintf(stderr, "idemq migrate: %s\n", err);
        return 1;
    }
    printf("%s\n", err);
    return 0;
}

int cli_topology(const config *cfg, bool dry_run)
{
    for (size_t i = 0; i < cfg->consumer_count; i++)
        topology_print(stdout, &cfg->consumers[i]);
    if (dry_run)
        return 0;
    char err[2048];
    amqp_connection_state_t conn;
    broker_open_options opts = {.tls = &cfg->amqp_tls, .password = cfg->amqp_password};
    if (broker_open_first(cfg->amqp_urls, cfg->amqp_url_count, &opts, &conn, NULL, err,
                          sizeof err) != 0) {
        fprintf(stderr, "idemq topology: %s\n", err);
        return 1;
    }
    if (err[0])
        fprintf(stderr, "idemq topology: warning: %s\n", err);
    int exit_code = 0;
    for (size_t i = 0; i < cfg->consumer_count && exit_code == 0; i++) {
        int rc = topology_declare(conn, &cfg->consumers[i], err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "idemq topology: %s\n", err);
            exit_code = rc == BROKER_E_FAILED ? 1 : EXIT_USAGE;
        }
    }
    broker_close(conn);
    if (exit_code == 0)
        printf("declared\n");
    return exit_code;
}
