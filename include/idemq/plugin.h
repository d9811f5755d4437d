/*
 * idemq/plugin.h — the C ABI of idemq handler plugins (the only installed header).
 *
 * A plugin is a shared object named in the config:
 *
 *     handler:
 *       type: plugin
 *       path: /usr/lib/idemq/plugins/ledger.so
 *       config: {fail_first_n: 0}        # any YAML; handed to init as JSON text
 *
 * It exports one function, idemq_plugin_entry, returning a static idemq_plugin_v1. For every
 * message, inside the transaction that also inserts the dedup row, idemq calls handle(); the
 * plugin reads the message through the host table and runs SQL in that transaction with
 * host->exec. idemq commits when handle() returns IDEMQ_OK and rolls everything back (the
 * plugin's statements and the dedup row) otherwise:
 *
 *     IDEMQ_OK             commit, ack                          (outcome "processed")
 *     IDEMQ_RETRYABLE      roll back, retry with backoff; dead-letter once retries are spent
 *     IDEMQ_NON_RETRYABLE  roll back, dead-letter now, with `reason` in the idemq-error header
 *
 * The plugin needs no other library: it does not link libmysqlclient or jansson, and calls back
 * into idemq only through the idemq_host_v1 table it is given. Build it with only this header:
 *
 *     cc -shared -fPIC -fvisibility=hidden -I/usr/include ledger.c -o ledger.so
 *
 * Versioning. IDEMQ_PLUGIN_ABI_VERSION changes whenever the ABI changes; idemq refuses, at
 * startup (exit 2), a plugin whose abi_version is outside IDEMQ_PLUGIN_ABI_OLDEST ..
 * IDEMQ_PLUGIN_ABI_VERSION, or that lacks the entry symbol. Versions only append to the host
 * table, which carries its own size: a plugin may rely on a host function only when host->size
 * covers it (IDEMQ_HOST_HAS(host, member)); version 2 appended emit.
 *
 * Emitting (version 2). host->emit adds a downstream message to idemq's outbox: a row written in
 * the same transaction, published by idemq's relay after the COMMIT, with publisher confirms. It
 * is published only if handle() returns IDEMQ_OK and the transaction commits; its biz_key (and
 * AMQP message_id) is derived from the incoming biz_key, the handler name and the emit's name, so
 * a re-publish is deduplicated downstream. A second emit of one name for one message fails.
 * When the incoming message has a valid W3C traceparent, the emitted message carries the trace
 * on (traceparent with idemq's span for this message as parent, tracestate unchanged), as
 * configured emits do; the plugin needs to do nothing for it, and the ABI is unchanged.
 *
 * Threads. idemq calls init() once per consumer, on the main thread, before any message, and
 * free() once, after the last handle() has returned. handle() runs on the DB worker threads —
 * several at once, with the SAME state pointer — so anything in state that handle() changes must
 * be protected (atomics or a mutex); read-only state needs nothing. The msg and tx pointers, and
 * every string the host returns for them, are valid only until handle() returns, and only on the
 * thread that received them: do not keep them or hand them to other threads. Do not start threads
 * that outlive free(), and do not call exit() or change process-wide state (signals, locale, cwd).
 *
 * Transactions. exec() runs one statement on the worker's connection, inside the open
 * transaction. Statements that would end it are refused (COMMIT, ROLLBACK other than ROLLBACK TO
 * SAVEPOINT, BEGIN/START, SET, LOCK, DDL …): only SELECT, INSERT, UPDATE, DELETE, REPLACE, WITH,
 * VALUES, TABLE, DO, CALL, SAVEPOINT, RELEASE SAVEPOINT and ROLLBACK TO SAVEPOINT run; savepoint
 * names beginning with idemq_ are idemq's, and a CALLed procedure must not COMMIT, ROLLBACK or run
 * DDL either. idemq checks this rather than trusting it: it sets the savepoint idemq_txn_guard
 * after the dedup insert and releases it before COMMIT; when the savepoint is gone, the message is
 * not acked as processed — dead-lettered when the dedup row was committed behind idemq's back,
 * retried when the transaction was rolled back under a handle() that returned IDEMQ_OK. A failed
 * statement is undone by the server but the transaction stays open, so a plugin may handle e.g.
 * a duplicate key and go on. Errors that end the transaction (deadlock, lost connection) are
 * remembered by the host: after one, handle()'s IDEMQ_OK is not believed — idemq retries, or
 * pauses consumption when the database is unreachable — and further exec() calls fail.
 */
#ifndef IDEMQ_PLUGIN_H
#define IDEMQ_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2 added host->emit (the outbox). idemq loads plugins built for 1 and 2: version 1 plugins
 * simply never emit. */
#define IDEMQ_PLUGIN_ABI_VERSION 2
#define IDEMQ_PLUGIN_ABI_OLDEST 1

/* Name of the symbol idemq looks up with dlsym. */
#define IDEMQ_PLUGIN_ENTRY_SYMBOL "idemq_plugin_entry"

#if defined(__GNUC__)
#define IDEMQ_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define IDEMQ_PLUGIN_EXPORT
#endif

/* What handle() decided. */
typedef enum idemq_result {
    IDEMQ_OK = 0,
    IDEMQ_RETRYABLE = 1,
    IDEMQ_NON_RETRYABLE = 2,
} idemq_result;

/* The type of a message field or of an exec() parameter. */
typedef enum idemq_type {
    IDEMQ_TYPE_MISSING = 0, /* no such field (field() only) */
    IDEMQ_TYPE_NULL = 1,
    IDEMQ_TYPE_BOOL = 2,   /* value in i: 0 or 1 */
    IDEMQ_TYPE_INT = 3,    /* value in i */
    IDEMQ_TYPE_DOUBLE = 4, /* value in d */
    IDEMQ_TYPE_STRING = 5, /* s, len bytes (UTF-8, NUL-terminated, may hold NUL bytes) */
    IDEMQ_TYPE_OBJECT = 6, /* s, len: the map as compact JSON text */
    IDEMQ_TYPE_ARRAY = 7,  /* s, len: the array as compact JSON text */
} idemq_type;

/*
 * A value: what field() returns, and what exec() binds. As a parameter, STRING, OBJECT and ARRAY
 * bind s/len as a string, INT as BIGINT, DOUBLE as DOUBLE, BOOL as TINYINT, NULL as NULL; a
 * field() result can be passed to exec() as it is.
 */
typedef struct idemq_value {
    idemq_type type;
    int64_t i;
    double d;
    const char *s;
    size_t len;
} idemq_value;

/* What exec() reports. */
typedef struct idemq_exec_result {
    uint64_t rows;            /* matched rows of an UPDATE (CLIENT_FOUND_ROWS), affected rows of
                                 INSERT/DELETE/REPLACE, returned rows of a SELECT */
    uint64_t insert_id;       /* LAST_INSERT_ID() of an INSERT into an AUTO_INCREMENT table */
    unsigned int mysql_errno; /* 0 on success; the server or client error number otherwise */
    char sqlstate[6];         /* "00000" on success */
    char error[512];          /* the error text, "" on success */
} idemq_exec_result;

/* Opaque to plugins; valid during one handle() call. */
typedef struct idemq_message idemq_message;
typedef struct idemq_tx idemq_tx;

/* Levels for host->log. */
typedef enum idemq_log_level {
    IDEMQ_LOG_DEBUG = 0,
    IDEMQ_LOG_INFO = 1,
    IDEMQ_LOG_WARN = 2,
    IDEMQ_LOG_ERROR = 3,
} idemq_log_level;

/* A downstream message for host->emit (version 2). Every pointer is borrowed for the call. */
typedef struct idemq_emit {
    const char *name;        /* 1..64 bytes; part of the outgoing biz_key */
    const char *exchange;    /* NULL or "": the default exchange (routing_key names the queue) */
    const char *routing_key; /* at most 255 bytes */
    int msgpack;             /* 0: JSON (application/json), 1: MessagePack */
    const char *fields_json; /* a JSON object: the outgoing envelope's fields; idemq adds (or
                                replaces) "biz_key" */
} idemq_emit;

/* The functions idemq provides to a plugin. Every function is safe to call from any worker
 * thread for the msg/tx that thread received. */
typedef struct idemq_host_v1 {
    uint32_t abi_version; /* IDEMQ_PLUGIN_ABI_VERSION of the host */
    uint32_t size;        /* sizeof(idemq_host_v1) as the host was built */

    /* Looks up a field by dotted path ("customer.address.city") and fills *out (type
     * IDEMQ_TYPE_MISSING when any step is absent or not a map). Returns 0 when found, -1 when
     * missing. */
    int (*field)(const idemq_message *msg, const char *dotted_path, idemq_value *out);

    /* The message's biz_key (never NULL) and message_id (NULL when absent). */
    const char *(*biz_key)(const idemq_message *msg);
    const char *(*message_id)(const idemq_message *msg);

    /* The body exactly as received (JSON or MessagePack bytes); *len gets its length. NULL (and
     * *len 0) when not available. */
    const void *(*body)(const idemq_message *msg, size_t *len);

    /*
     * Runs sql with `?` parameters bound from params[0..param_count) inside the open transaction.
     * out (may be NULL) receives the row count, insert id and, on failure, the MySQL error.
     * Returns 0 on success, -1 on failure. A statement refused by the transaction rule above
     * fails with mysql_errno 0 and a reason in out->error.
     */
    int (*exec)(idemq_tx *tx, const char *sql, const idemq_value *params, size_t param_count,
                idemq_exec_result *out);

    /* idemq's own judgement of a MySQL error number (it knows the client library's symbolic
     * names; MySQL and MariaDB numbers differ): IDEMQ_RETRYABLE for deadlocks, lock waits and
     * infrastructure errors, IDEMQ_NON_RETRYABLE for bad values, NULL into NOT NULL, missing
     * foreign rows, duplicate keys. */
    idemq_result (*classify)(unsigned int mysql_errno);

    /* Writes one line to idemq's JSON log; msg (may be NULL) adds the message's context. */
    void (*log)(const idemq_message *msg, idemq_log_level level, const char *text);

    /* ---- version 2 ---- */

    /*
     * Adds the downstream message e describes to the outbox, in the open transaction (see
     * "Emitting" above). Returns 0, or -1 with the reason in err (a bad name, exchange or routing
     * key, fields_json not a JSON object, out of memory): then nothing was added, and the plugin
     * decides (returning IDEMQ_NON_RETRYABLE with that reason is usual).
     */
    int (*emit)(idemq_tx *tx, const idemq_message *msg, const struct idemq_emit *e, char *err,
                size_t err_len);
} idemq_host_v1;

/* True when the host table has member (for functions appended by later minor versions). */
#define IDEMQ_HOST_HAS(host, member)                                                               \
    ((host)->size >= offsetof(idemq_host_v1, member) + sizeof((host)->member))

/* What idemq_plugin_entry returns. abi_version must stay the first member in every version. */
typedef struct idemq_plugin_v1 {
    uint32_t abi_version; /* IDEMQ_PLUGIN_ABI_VERSION the plugin was built with */
    const char *name;     /* shown by `idemq check` and in logs */

    /*
     * Called once per consumer before any message. config_json is the handler's `config:`
     * subtree as JSON text ("{}" when absent). host stays valid until free(). Store what handle()
     * needs in *state. Returns 0, or non-zero with a reason in err: idemq then does not start
     * (exit 2).
     */
    int (*init)(const idemq_host_v1 *host, const char *config_json, void **state, char *err,
                size_t err_len);

    /*
     * Handles one message inside the open transaction (see the thread rules above). On anything
     * but IDEMQ_OK, write a reason into reason (reason_len bytes, NUL-terminated); it ends up in
     * the idemq-error header of the retry or dead-letter copy.
     */
    idemq_result (*handle)(void *state, const idemq_host_v1 *host, const idemq_message *msg,
                           idemq_tx *tx, char *reason, size_t reason_len);

    /* Releases state; called once, after the last handle(). May be NULL. */
    void (*free)(void *state);
} idemq_plugin_v1;

/* The entry point every plugin defines (with IDEMQ_PLUGIN_EXPORT). */
IDEMQ_PLUGIN_EXPORT const idemq_plugin_v1 *idemq_plugin_entry(void);

#ifdef __cplusplus
}
#endif

#endif
