/*
 * handler — dispatch on the configured handler type. One small switch so adding a handler touches
 * only this file and its own.
 */
#include "handlers/handler.h"

#include <stdio.h>

#include "handlers/plugin.h"
#include "handlers/sql.h"
#include "handlers/state_machine.h"

apply_status handler_apply(handler_call *call)
{
    switch (call->consumer->handler.type) {
    case CONFIG_HANDLER_STATE_MACHINE:
        return state_machine_apply(call);
    case CONFIG_HANDLER_SQL:
        return sql_handler_apply(call);
    case CONFIG_HANDLER_PLUGIN:
        return plugin_handler_apply(call);
    }
    snprintf(call->error, call->error_len, "unknown handler type");
    return APPLY_NON_RETRYABLE;
}

bool handler_has_batch_path(const config_consumer *consumer)
{
    return consumer->handler.type == CONFIG_HANDLER_STATE_MACHINE;
}

apply_status handler_apply_batch(handler_call *call, handler_batch_item *items, size_t n)
{
    if (call->consumer->handler.type == CONFIG_HANDLER_STATE_MACHINE)
        return state_machine_apply_batch(call, items, n);
    snprintf(call->error, call->error_len, "handler type has no batch path");
    return APPLY_RETRYABLE;
}

apply_status handler_prepare_all(handler_call *call)
{
    switch (call->consumer->handler.type) {
    case CONFIG_HANDLER_STATE_MACHINE:
        return state_machine_prepare_all(call);
    case CONFIG_HANDLER_SQL:
        return sql_handler_prepare_all(call);
    case CONFIG_HANDLER_PLUGIN:
        return APPLY_OK;
    }
    snprintf(call->error, call->error_len, "unknown handler type");
    return APPLY_NON_RETRYABLE;
}

void handler_release(const config_consumer *consumer, void *state)
{
    if (!state)
        return;
    switch (consumer->handler.type) {
    case CONFIG_HANDLER_STATE_MACHINE:
        state_machine_release(consumer, state);
        break;
    case CONFIG_HANDLER_SQL:
        sql_handler_release(consumer, state);
        break;
    case CONFIG_HANDLER_PLUGIN:
        plugin_handler_release(consumer, state);
        break;
    }
}

apply_status handler_fail(handler_call *call, const char *what, const db_error *error)
{
    call->mysql_errno = db_error_format(call->error, call->error_len, what, error);
    return db_error_classify(call->mysql_errno);
}

apply_status handler_fail_statement(handler_call *call, const char *what, MYSQL_STMT *stmt)
{
    db_error error;
    db_error_of_statement(stmt, &error);
    return handler_fail(call, what, &error);
}
