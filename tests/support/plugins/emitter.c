/*
 * emitter — a test plugin that emits one downstream message per message it handles, through
 * host->emit (plugin ABI 2), and can be told to fail after emitting: the outbox row of a message
 * whose handle() does not return IDEMQ_OK must not exist (tests/integration/test_outbox.c).
 * Built with only include/idemq/plugin.h, like any third-party plugin.
 *
 * For each message (fields order_id: string, amount: integer) it appends one ledger row
 * (biz_key, order_id, amount), then emits "plugin.paid" to the default exchange with the routing
 * key of its config, fields {"biz_key": "set-by-the-plugin", "order_id", "amount", "via":
 * "emitter"} (idemq replaces the plugin's biz_key with the derived one). Flags in the message:
 *
 *     mp: true         the emit is MessagePack instead of JSON
 *     bad_emit: true   the emit has an empty name: host->emit refuses it, and handle() returns
 *                      IDEMQ_NON_RETRYABLE with host->emit's reason
 *     fail: true       emit, then return IDEMQ_NON_RETRYABLE ("asked to fail after emitting")
 *     retry: true      emit, then return IDEMQ_RETRYABLE ("asked to retry after emitting")
 *
 * Table (the test creates it):
 *     ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key VARBINARY(128), order_id
 *             VARCHAR(64), amount BIGINT)
 * Config: {routing_key: NAME}. init fails unless the host has emit. No mutable state: nothing
 * shared between the worker threads changes. It links nothing but libc.
 */
#include <idemq/plugin.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct emitter_state {
    char routing_key[256];
} emitter_state;

/* The string value of "key" in the compact JSON config, copied into out; false when absent or
 * not a plain string (enough for a test plugin's one key). */
static bool json_string_of(const char *json, const char *key, char *out, size_t out_len)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\":\"", key);
    const char *p = strstr(json, quoted);
    if (!p)
        return false;
    p += strlen(quoted);
    const char *end = strchr(p, '"');
    if (!end || (size_t)(end - p) >= out_len)
        return false;
    memcpy(out, p, (size_t)(end - p));
    out[end - p] = '\0';
    return true;
}

static int emitter_init(const idemq_host_v1 *host, const char *config_json, void **state, char *err,
                        size_t err_len)
{
    if (!IDEMQ_HOST_HAS(host, emit)) {
        snprintf(err, err_len, "the host has no emit (ABI %u)", (unsigned)host->abi_version);
        return -1;
    }
    emitter_state *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (!json_string_of(config_json, "routing_key", st->routing_key, sizeof st->routing_key)) {
        snprintf(err, err_len, "config: routing_key (a string) is required");
        free(st);
        return -1;
    }
    *state = st;
    return 0;
}

static bool flag(const idemq_host_v1 *host, const idemq_message *msg, const char *name)
{
    idemq_value v;
    return host->field(msg, name, &v) == 0 && v.type == IDEMQ_TYPE_BOOL && v.i;
}

static idemq_result emitter_handle(void *state, const idemq_host_v1 *host, const idemq_message *msg,
                                   idemq_tx *tx, char *reason, size_t reason_len)
{
    const emitter_state *st = state;
    idemq_value params[3];
    idemq_exec_result res;

    if (host->field(msg, "order_id", &params[1]) != 0 || params[1].type != IDEMQ_TYPE_STRING ||
        params[1].len > 64) {
        snprintf(reason, reason_len, "field order_id must be a string of at most 64 bytes");
        return IDEMQ_NON_RETRYABLE;
    }
    if (host->field(msg, "amount", &params[2]) != 0 || params[2].type != IDEMQ_TYPE_INT) {
        snprintf(reason, reason_len, "field amount must be an integer");
        return IDEMQ_NON_RETRYABLE;
    }
    params[0] = (idemq_value){.type = IDEMQ_TYPE_STRING, .s = host->biz_key(msg)};
    params[0].len = strlen(params[0].s);
    if (host->exec(tx, "INSERT INTO ledger (biz_key, order_id, amount) VALUES (?, ?, ?)", params, 3,
                   &res) != 0) {
        snprintf(reason, reason_len, "the ledger insert failed: %s", res.error);
        return res.mysql_errno ? host->classify(res.mysql_errno) : IDEMQ_NON_RETRYABLE;
    }

    /* order_id is the test's own (letters and digits): no JSON escaping needed. */
    char fields[256];
    snprintf(fields, sizeof fields,
             "{\"biz_key\":\"set-by-the-plugin\",\"order_id\":\"%.*s\",\"amount\":%lld,"
             "\"via\":\"emitter\"}",
             (int)params[1].len, params[1].s, (long long)params[2].i);
    idemq_emit e = {
        .name = flag(host, msg, "bad_emit") ? "" : "plugin.paid",
        .exchange = NULL,
        .routing_key = st->routing_key,
        .msgpack = flag(host, msg, "mp"),
        .fields_json = fields,
    };
    char err[512];
    if (host->emit(tx, msg, &e, err, sizeof err) != 0) {
        snprintf(reason, reason_len, "%s", err);
        return IDEMQ_NON_RETRYABLE;
    }
    if (flag(host, msg, "fail")) {
        snprintf(reason, reason_len, "asked to fail after emitting");
        return IDEMQ_NON_RETRYABLE;
    }
    if (flag(host, msg, "retry")) {
        snprintf(reason, reason_len, "asked to retry after emitting");
        return IDEMQ_RETRYABLE;
    }
    return IDEMQ_OK;
}

static void emitter_free(void *state)
{
    free(state);
}

static const idemq_plugin_v1 emitter_plugin = {
    .abi_version = IDEMQ_PLUGIN_ABI_VERSION,
    .name = "emitter",
    .init = emitter_init,
    .handle = emitter_handle,
    .free = emitter_free,
};

IDEMQ_PLUGIN_EXPORT const idemq_plugin_v1 *idemq_plugin_entry(void)
{
    return &emitter_plugin;
}
