/*
 * swallow_rollback — a test plugin that loses idemq's transaction under it and still returns
 * IDEMQ_OK, the mistake the savepoint guard in adapter/store/pool.c (verify_transaction) must
 * catch. Built with only include/idemq/plugin.h, like any third-party plugin.
 *
 * For each message it sets the order row (field order_id) to PAID and appends one ledger row
 * (biz_key, amount 1): the ledger row is the effect that must happen exactly once. Tables:
 *
 *     orders (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32), ...)   -- harness_init
 *     ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, biz_key VARBINARY(128), amount BIGINT)
 *
 * Config (the handler's `config:`, as JSON):
 *   {mode: lock_wait}
 *       First CALL short_lock_wait(), a procedure the test creates as
 *       `BEGIN SET SESSION innodb_lock_wait_timeout = 1; END`: a short lock wait for this session
 *       only, no GLOBAL variable changed under other tests (plugins may not run SET themselves;
 *       a CALLed procedure may). Then the order UPDATE. When it fails (the test holds the row
 *       lock, the server has innodb_rollback_on_timeout=ON: a lock wait timeout rolls back the
 *       WHOLE transaction, the dedup row with it), the error is logged ("ignoring MySQL error
 *       N") and ignored; the ledger row is then inserted — in the implicit transaction that
 *       follows — and handle() returns IDEMQ_OK.
 *   {mode: call_rollback, first_n: N}
 *       The first N calls of the process first CALL rollback_everything(), a procedure the test
 *       creates as `BEGIN ROLLBACK; END` (plugins may not run ROLLBACK themselves, but a CALLed
 *       procedure may), log "called rollback_everything()", then do the update and the ledger
 *       row as usual and return IDEMQ_OK. Later calls skip the CALL: the retry succeeds.
 *
 * Errors other than the ignored one are reported honestly (host->classify). Thread safety: the
 * only state handle() changes is the first_n counter, an atomic. It links nothing but libc.
 */
#include <idemq/plugin.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum swallow_mode {
    MODE_LOCK_WAIT,
    MODE_CALL_ROLLBACK,
} swallow_mode;

typedef struct swallow_state {
    swallow_mode mode;
    uint64_t first_n;
    atomic_uint_fast64_t calls_rolled_back; /* CALLs of rollback_everything() so far */
} swallow_state;

static const char *skip_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* The value of "key" in the compact JSON idemq hands over: a pointer just past the colon, or
 * NULL when the key is absent. Enough for a test plugin's two keys. */
static const char *json_value_of(const char *json, const char *key)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *p = strstr(json, quoted);
    if (!p)
        return NULL;
    p = skip_space(p + strlen(quoted));
    return *p == ':' ? skip_space(p + 1) : NULL;
}

static int swallow_init(const idemq_host_v1 *host, const char *config_json, void **state, char *err,
                        size_t err_len)
{
    swallow_state *st = calloc(1, sizeof *st);
    const char *v;
    (void)host;
    if (!st) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    v = json_value_of(config_json, "mode");
    if (v && strncmp(v, "\"lock_wait\"", 11) == 0) {
        st->mode = MODE_LOCK_WAIT;
    } else if (v && strncmp(v, "\"call_rollback\"", 15) == 0) {
        st->mode = MODE_CALL_ROLLBACK;
    } else {
        snprintf(err, err_len, "mode must be lock_wait or call_rollback");
        free(st);
        return -1;
    }
    v = json_value_of(config_json, "first_n");
    if (v) {
        char *end = NULL;
        st->first_n = strtoull(v, &end, 10);
        if (*v < '0' || *v > '9' || end == v) {
            snprintf(err, err_len, "first_n must be a non-negative integer");
            free(st);
            return -1;
        }
    }
    atomic_init(&st->calls_rolled_back, 0);
    *state = st;
    return 0;
}

/* True for the first first_n calls of the process, whichever worker makes them. */
static bool take_rollback_turn(swallow_state *st)
{
    uint_fast64_t seen = atomic_load(&st->calls_rolled_back);
    while (seen < st->first_n)
        if (atomic_compare_exchange_weak(&st->calls_rolled_back, &seen, seen + 1))
            return true;
    return false;
}

static idemq_result failed(const idemq_host_v1 *host, const idemq_exec_result *res,
                           const char *what, char *reason, size_t reason_len)
{
    snprintf(reason, reason_len, "%s failed: MySQL error %u (%s): %s", what, res->mysql_errno,
             res->sqlstate, res->error);
    return res->mysql_errno ? host->classify(res->mysql_errno) : IDEMQ_NON_RETRYABLE;
}

static idemq_result swallow_handle(void *state, const idemq_host_v1 *host, const idemq_message *msg,
                                   idemq_tx *tx, char *reason, size_t reason_len)
{
    static const char update_sql[] = "UPDATE orders SET status = 'PAID' WHERE order_id = ?";
    swallow_state *st = state;
    idemq_value order_id, biz_key;
    idemq_exec_result res;
    char line[700];

    if (host->field(msg, "order_id", &order_id) != 0 || order_id.type != IDEMQ_TYPE_STRING) {
        snprintf(reason, reason_len, "field order_id must be a string");
        return IDEMQ_NON_RETRYABLE;
    }
    biz_key = (idemq_value){.type = IDEMQ_TYPE_STRING, .s = host->biz_key(msg)};
    biz_key.len = strlen(biz_key.s);

    if (st->mode == MODE_LOCK_WAIT) {
        if (host->exec(tx, "CALL short_lock_wait()", NULL, 0, &res) != 0)
            return failed(host, &res, "CALL short_lock_wait()", reason, reason_len);
        if (host->exec(tx, update_sql, &order_id, 1, &res) != 0) {
            /* The bug on purpose: whatever the error did to the transaction, carry on. */
            snprintf(line, sizeof line, "ignoring MySQL error %u on the order update: %.500s",
                     res.mysql_errno, res.error);
            host->log(msg, IDEMQ_LOG_WARN, line);
        }
    } else {
        if (take_rollback_turn(st)) {
            if (host->exec(tx, "CALL rollback_everything()", NULL, 0, &res) != 0)
                return failed(host, &res, "CALL rollback_everything()", reason, reason_len);
            host->log(msg, IDEMQ_LOG_INFO, "called rollback_everything()");
        }
        if (host->exec(tx, update_sql, &order_id, 1, &res) != 0)
            return failed(host, &res, "the order update", reason, reason_len);
    }
    if (host->exec(tx, "INSERT INTO ledger (biz_key, amount) VALUES (?, 1)", &biz_key, 1, &res) !=
        0)
        return failed(host, &res, "the ledger insert", reason, reason_len);
    return IDEMQ_OK;
}

static void swallow_free(void *state)
{
    free(state);
}

static const idemq_plugin_v1 swallow_plugin = {
    .abi_version = IDEMQ_PLUGIN_ABI_VERSION,
    .name = "swallow_rollback",
    .init = swallow_init,
    .handle = swallow_handle,
    .free = swallow_free,
};

IDEMQ_PLUGIN_EXPORT const idemq_plugin_v1 *idemq_plugin_entry(void)
{
    return &swallow_plugin;
}
