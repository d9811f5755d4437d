/*
 * plugin — see handlers/plugin.h.
 */
#include "handlers/plugin.h"

#include <stdio.h>
#include <stdlib.h>

#include "db/error.h"
#include "handlers/plugin_host.h"
#include "handlers/plugin_loader.h"
#include "handlers/plugin_statements.h"
#include "idemq/plugin.h"
#include "ops/log.h"

#define PLUGIN_REASON_MAX 768

/* Written on the main thread before the workers start and after they are joined; read-only in
 * between (thread creation and join order the accesses). */
static struct {
    const config *cfg;
    plugin **by_consumer;
} registry;

int plugin_registry_load(const config *cfg, char *err, size_t err_len)
{
    plugin_registry_unload();
    registry.by_consumer =
        calloc(cfg->consumer_count ? cfg->consumer_count : 1, sizeof *registry.by_consumer);
    if (!registry.by_consumer) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    registry.cfg = cfg;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        const config_consumer *c = &cfg->consumers[i];
        char why[1024];
        if (c->handler.type != CONFIG_HANDLER_PLUGIN)
            continue;
        if (plugin_open(c->handler.plugin.path, c->handler.plugin.config_json,
                        &registry.by_consumer[i], why, sizeof why) != 0) {
            snprintf(err, err_len, "consumer %s: %s", c->queue, why);
            plugin_registry_unload();
            return -1;
        }
        log_context ctx = {.queue = c->queue, .retries = -1};
        log_info(&ctx, "loaded plugin %s from %s (plugin ABI %u)",
                 plugin_name(registry.by_consumer[i]), c->handler.plugin.path,
                 (unsigned)plugin_abi_version(registry.by_consumer[i]));
    }
    return 0;
}

void plugin_registry_unload(void)
{
    if (registry.by_consumer && registry.cfg)
        for (size_t i = 0; i < registry.cfg->consumer_count; i++)
            plugin_close(registry.by_consumer[i]);
    free(registry.by_consumer);
    registry.by_consumer = NULL;
    registry.cfg = NULL;
}

static plugin *registered(const config_consumer *consumer)
{
    if (!registry.cfg || !registry.by_consumer || consumer < registry.cfg->consumers ||
        consumer >= registry.cfg->consumers + registry.cfg->consumer_count)
        return NULL;
    return registry.by_consumer[consumer - registry.cfg->consumers];
}

apply_status plugin_handler_apply(handler_call *call)
{
    plugin *p = registered(call->consumer);
    char reason[PLUGIN_REASON_MAX] = "";
    apply_status status;

    if (!p) {
        snprintf(call->error, call->error_len, "plugin for handler %s is not loaded",
                 call->consumer->handler_name);
        return APPLY_RETRYABLE;
    }
    plugin_statements *statements = *call->state;
    if (!statements) {
        statements = plugin_statements_new();
        if (!statements) {
            snprintf(call->error, call->error_len, "out of memory");
            return APPLY_RETRYABLE;
        }
        *call->state = statements;
    }
    idemq_message msg = {
        .env = call->env,
        .body = call->body,
        .body_len = call->body_len,
        .consumer = call->consumer,
    };
    idemq_tx tx = {.db = call->db,
                   .statements = statements,
                   .outbox = call->outbox,
                   .outbox_item = call->outbox_item};
    idemq_result result = plugin_handle(p, &msg, &tx, reason, sizeof reason);
    reason[sizeof reason - 1] = '\0';
    plugin_host_message_close(&msg);

    if (tx.fatal_errno) {
        /* Whatever the plugin concluded, the transaction is gone: retry it (deadlock) or pause
         * (database unreachable). Committing now would lose the dedup row. */
        call->mysql_errno = tx.fatal_errno;
        snprintf(call->error, call->error_len,
                 "plugin %s: MySQL error %u ended the transaction%s%s", plugin_name(p),
                 tx.fatal_errno, reason[0] ? ": " : "", reason);
        status = db_error_classify(tx.fatal_errno);
        return status == APPLY_UNAVAILABLE ? APPLY_UNAVAILABLE : APPLY_RETRYABLE;
    }
    if (msg.out_of_memory && result == IDEMQ_OK) {
        snprintf(call->error, call->error_len, "plugin %s: out of memory reading a field",
                 plugin_name(p));
        return APPLY_RETRYABLE;
    }
    switch (result) {
    case IDEMQ_OK:
        return APPLY_OK;
    case IDEMQ_RETRYABLE:
        status = APPLY_RETRYABLE;
        break;
    case IDEMQ_NON_RETRYABLE:
        status = APPLY_NON_RETRYABLE;
        break;
    default:
        snprintf(reason, sizeof reason, "handle() returned %d, which is not an idemq_result",
                 (int)result);
        status = APPLY_NON_RETRYABLE;
        break;
    }
    call->mysql_errno = tx.last_errno;
    snprintf(call->error, call->error_len, "plugin %s: %s", plugin_name(p),
             reason[0]
                 ? reason
                 : (status == APPLY_RETRYABLE ? "asked for a retry" : "rejected the message"));
    return status;
}

void plugin_handler_release(const config_consumer *consumer, void *state)
{
    (void)consumer;
    plugin_statements_free(state);
}
