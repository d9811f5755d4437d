/*
 * ledger — an example idemq handler plugin (include/idemq/plugin.h), built as ledger.so.
 *
 * For each message it appends one row to a ledger table, in idemq's transaction:
 *
 *     CREATE TABLE ledger (
 *       id       BIGINT AUTO_INCREMENT PRIMARY KEY,
 *       biz_key  VARBINARY(128) NOT NULL,
 *       account  VARCHAR(64) NULL,
 *       amount   BIGINT NOT NULL
 *     );
 *
 * Message fields: amount (integer, required), account (string, optional). Config (JSON from the
 * handler's `config:`): {"fail_first_n": N} makes the first N calls of this process fail with a
 * retryable result, so a test or a demo can watch the retry ladder.
 *
 * Results, one per class, so each is easy to provoke:
 *   - amount missing or not an integer        → IDEMQ_NON_RETRYABLE (nothing written)
 *   - the INSERT fails                        → whatever idemq classifies the MySQL error as
 *   - amount < 0                              → IDEMQ_NON_RETRYABLE, checked AFTER the insert on
 *                                               purpose: the host must roll the row back
 *   - one of the first fail_first_n calls     → IDEMQ_RETRYABLE, also after the insert
 *   - otherwise                               → IDEMQ_OK
 *
 * Thread safety: handle() runs on several idemq workers at once with the same state; the only
 * thing it changes is the failure counter, an atomic. It links nothing but libc.
 */
#include <idemq/plugin.h>

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ledger_state {
    uint64_t fail_first_n;
    atomic_uint_fast64_t failures; /* calls failed on purpose so far */
} ledger_state;

/* A deliberately small reader for {"fail_first_n": N}: enough for an example (a real plugin
 * would use its own JSON library — it may link any library but libmysqlclient is not needed). */
static int read_fail_first_n(const char *json, uint64_t *out, char *err, size_t err_len)
{
    const char *p = strstr(json, "\"fail_first_n\"");
    char *end = NULL;
    *out = 0;
    if (!p)
        return 0;
    p += strlen("\"fail_first_n\"");
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p++ != ':')
        goto bad;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p < '0' || *p > '9')
        goto bad;
    *out = strtoull(p, &end, 10);
    if (end == p)
        goto bad;
    return 0;
bad:
    snprintf(err, err_len, "fail_first_n must be a non-negative integer");
    return -1;
}

static int ledger_init(const idemq_host_v1 *host, const char *config_json, void **state, char *err,
                       size_t err_len)
{
    ledger_state *st = calloc(1, sizeof *st);
    (void)host;
    if (!st) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (read_fail_first_n(config_json, &st->fail_first_n, err, err_len) != 0) {
        free(st);
        return -1;
    }
    atomic_init(&st->failures, 0);
    *state = st;
    return 0;
}

/* True for the first fail_first_n calls of the process, whichever worker makes them. */
static bool should_fail(ledger_state *st, uint64_t *nth)
{
    uint_fast64_t seen = atomic_load(&st->failures);
    while (seen < st->fail_first_n) {
        if (atomic_compare_exchange_weak(&st->failures, &seen, seen + 1)) {
            *nth = (uint64_t)seen + 1;
            return true;
        }
    }
    return false;
}

static idemq_result ledger_handle(void *state, const idemq_host_v1 *host, const idemq_message *msg,
                                  idemq_tx *tx, char *reason, size_t reason_len)
{
    ledger_state *st = state;
    idemq_value params[3];
    idemq_exec_result res;
    uint64_t nth;

    if (host->field(msg, "amount", &params[2]) != 0 || params[2].type != IDEMQ_TYPE_INT) {
        snprintf(reason, reason_len, "field amount is %s; it must be an integer",
                 params[2].type == IDEMQ_TYPE_MISSING ? "missing" : "not an integer");
        return IDEMQ_NON_RETRYABLE;
    }
    params[0] = (idemq_value){.type = IDEMQ_TYPE_STRING, .s = host->biz_key(msg)};
    params[0].len = strlen(params[0].s);
    if (host->field(msg, "account", &params[1]) != 0)
        params[1].type = IDEMQ_TYPE_NULL;

    if (host->exec(tx, "INSERT INTO ledger (biz_key, account, amount) VALUES (?, ?, ?)", params, 3,
                   &res) != 0) {
        snprintf(reason, reason_len, "insert into ledger failed: MySQL error %u (%s): %s",
                 res.mysql_errno, res.sqlstate, res.error);
        return host->classify(res.mysql_errno);
    }
    if (params[2].i < 0) {
        snprintf(reason, reason_len, "negative amount %" PRId64 " is not allowed", params[2].i);
        return IDEMQ_NON_RETRYABLE;
    }
    if (should_fail(st, &nth)) {
        snprintf(reason, reason_len, "failing on purpose (%" PRIu64 " of fail_first_n=%" PRIu64 ")",
                 nth, st->fail_first_n);
        return IDEMQ_RETRYABLE;
    }
    return IDEMQ_OK;
}

static void ledger_free(void *state)
{
    free(state);
}

static const idemq_plugin_v1 ledger_plugin = {
    .abi_version = IDEMQ_PLUGIN_ABI_VERSION,
    .name = "ledger",
    .init = ledger_init,
    .handle = ledger_handle,
    .free = ledger_free,
};

IDEMQ_PLUGIN_EXPORT const idemq_plugin_v1 *idemq_plugin_entry(void)
{
    return &ledger_plugin;
}
