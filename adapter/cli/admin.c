/*
 * admin — the one-shot subcommands: check, migrate, topology. Blocking calls are fine here:
 * there is no event loop, just a connection, a few RPCs and an exit code.
 */
#include "cli/cli.h"

#include <mysql.h>
#include <stdio.h>

#include "broker/connection.h"
#include "broker/topology.h"
#include "store/store.h"

static int check_database(const config *cfg)
{
    char err[1024], redacted[512];
    config_redact_url(cfg->mysql_url, redacted, sizeof redacted);
    MYSQL *db = store_connect(cfg, err, sizeof err);
    if (!db) {
        fprintf(stderr, "mysql   FAIL %s: %s\n", redacted, err);
        return 1;
    }
    int rc = 0;
    if (mysql_query(db, "SELECT 1 FROM msg_dedup LIMIT 0") != 0) {
        fprintf(stderr, "mysql   FAIL %s: table msg_dedup is not usable (%s); run `idemq migrate`\n",
                redacted, mysql_error(db));
        rc = 1;
    } else {
        mysql_free_result(mysql_store_result(db));
        for (size_t i = 0; i < cfg->consumer_count && rc == 0; i++) {
            const config_state_machine *sm = &cfg->consumers[i].handler.state_machine;
            char sql[512];
            snprintf(sql, sizeof sql, "SELECT `%s`, `%s` FROM `%s` LIMIT 0", sm->key_column,
                     sm->state_column, sm->table);
            if (mysql_query(db, sql) != 0) {
                fprintf(stderr, "mysql   FAIL consumer %s: %s\n", cfg->consumers[i].queue,
                        mysql_error(db));
                rc = 1;
            } else {
                mysql_free_result(mysql_store_result(db));
            }
        }
        if (rc == 0)
            printf("mysql   ok   %s (server %s)\n", redacted, mysql_get_server_info(db));
    }
    mysql_close(db);
    return rc;
}

static int check_broker(const config *cfg)
{
    char err[1024], redacted[512];
    config_redact_url(cfg->amqp_url, redacted, sizeof redacted);
    amqp_connection_state_t conn;
    broker_open_options opts = {.url = cfg->amqp_url, .heartbeat_ms = 0};
    if (broker_open(&opts, &conn, err, sizeof err) != 0) {
        fprintf(stderr, "amqp    FAIL %s: %s\n", redacted, err);
        return 1;
    }
    printf("amqp    ok   %s\n", redacted);
    broker_close(conn);
    return 0;
}

int cli_check(const config *cfg)
{
    printf("config  ok   %s (%zu consumer(s))\n", cfg->path, cfg->consumer_count);
    int rc = check_database(cfg);
    rc |= check_broker(cfg);
    printf("\ntopology plan:\n");
    for (size_t i = 0; i < cfg->consumer_count; i++)
        topology_print(stdout, &cfg->consumers[i]);
    return rc ? 1 : 0;
}

int cli_migrate(const config *cfg)
{
    char err[1024];
    MYSQL *db = store_connect(cfg, err, sizeof err);
    if (!db) {
        fprintf(stderr, "idemq migrate: %s\n", err);
        return 1;
    }
    int rc = store_migrate(db, err, sizeof err);
    mysql_close(db);
    if (rc != 0) {
        fprintf(stderr, "idemq migrate: %s\n", err);
        return 1;
    }
    printf("msg_dedup is in place\n");
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
    broker_open_options opts = {.url = cfg->amqp_url};
    if (broker_open(&opts, &conn, err, sizeof err) != 0) {
        fprintf(stderr, "idemq topology: %s\n", err);
        return 1;
    }
    int exit_code = 0;
    for (size_t i = 0; i < cfg->consumer_count && exit_code == 0; i++) {
        int rc = topology_declare(conn, &cfg->consumers[i], err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "idemq topology: %s\n", err);
            exit_code = rc == TOPOLOGY_E_BROKER ? 1 : EXIT_USAGE;
        }
    }
    broker_close(conn);
    if (exit_code == 0)
        printf("declared\n");
    return exit_code;
}
