/*
 * handler — dispatch on the configured handler type. One small switch so adding a handler touches
 * only this file and its own.
 */
#include "handlers/handler.h"

#include <stdio.h>

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

apply_status handler_prepare_all(handler_call *call)
{
    switch (call->consumer->handler.type) {
    case CONFIG_HANDLER_STATE_MACHINE:
        return state_machine_prepare_all(call);
    case CONFIG_HANDLER_SQL:
        return sql_handler_prepare_all(call);
    case CONFIG_HANDLER_PLUGIN:
        return APPLY_COMMITTED;
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
