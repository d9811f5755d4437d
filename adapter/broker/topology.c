/*
 * topology — see topology.h.
 *
 * Retry queues default to quorum queues with at-least-once dead-lettering and reject-publish
 * overflow, because classic-queue dead-lettering is at-most-once and can lose a retry. Each level
 * has a fixed TTL equal to its largest delay; copies carry their own shorter expiration (retry.h).
 *
 * What a queue's delivery limit is cannot be asked over AMQP; a declaration can: RabbitMQ checks
 * x-queue-type first, then each argument, and its 406 names the first one that differs with the
 * current value and type ("inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/':
 * received none but current is the value '5' of type 'signedint'"). The probes below declare on
 * a channel of their own and repeat every argument the broker reports, until the declaration
 * matches (declare-ok: no x-delivery-limit) or the broker names x-delivery-limit.
 */
#include "broker/topology.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "broker/connection.h"
#include "policy/retry.h"

void topology_retry_exchange(const config_consumer *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s.retry", c->queue);
}

void topology_retry_queue(const config_consumer *c, unsigned level, char *buf, size_t len)
{
    snprintf(buf, len, "%s.retry.%u", c->queue, level);
}

void topology_dead_letter_exchange(const config_consumer *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s.dlx", c->queue);
}

void topology_dead_letter_queue(const config_consumer *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s.dlq", c->queue);
}

static const char *queue_type_name(const config_consumer *c)
{
    return c->queue_type == CONFIG_QUEUE_QUORUM ? "quorum" : "classic";
}

static void set_text(amqp_table_entry_t *e, const char *key, const char *value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_UTF8;
    e->value.value.bytes = amqp_cstring_bytes(value);
}

static void set_unlimited_delivery(amqp_table_entry_t *e)
{
    e->key = amqp_cstring_bytes("x-delivery-limit");
    e->value.kind = AMQP_FIELD_KIND_I32; /* RabbitMQ compares the value, not the integer type */
    e->value.value.i32 = -1;
}

/* Arguments of a ladder or DLQ queue; ttl_ms == 0 means "no TTL, no dead-lettering" (the DLQ).
 * unlimited: add x-delivery-limit -1 (only for quorum queues on RabbitMQ 4.x). */
static amqp_table_t queue_arguments(const config_consumer *c, uint64_t ttl_ms, bool unlimited,
                                    amqp_table_entry_t entries[6])
{
    int n = 0;
    set_text(&entries[n++], "x-queue-type", queue_type_name(c));
    if (unlimited)
        set_unlimited_delivery(&entries[n++]);
    if (ttl_ms) {
        entries[n].key = amqp_cstring_bytes("x-message-ttl");
        entries[n].value.kind = AMQP_FIELD_KIND_I64;
        entries[n].value.value.i64 = ttl_ms > INT64_MAX ? INT64_MAX : (int64_t)ttl_ms;
        n++;
        set_text(&entries[n++], "x-dead-letter-exchange", "");
        set_text(&entries[n++], "x-dead-letter-routing-key", c->queue);
        if (c->queue_type == CONFIG_QUEUE_QUORUM) {
            set_text(&entries[n++], "x-dead-letter-strategy", "at-least-once");
            set_text(&entries[n++], "x-overflow", "reject-publish");
        }
    }
    return (amqp_table_t){.num_entries = n, .entries = entries};
}

/* Whether a failed declaration ran out of time rather than being refused: rabbitmq-c's RPC
 * timeout, or RabbitMQ's own 541 ("Could not add binding due to timeout"), with which it closes
 * the connection when its metadata store cannot commit a change in time. */
static bool declaration_timed_out(amqp_rpc_reply_t reply)
{
    if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
        return reply.library_error == AMQP_STATUS_TIMEOUT;
    if (reply.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION ||
        reply.reply.id != AMQP_CONNECTION_CLOSE_METHOD)
        return false;
    const amqp_connection_close_t *close = reply.reply.decoded;
    char text[400];
    snprintf(text, sizeof text, "%.*s", (int)close->reply_text.len,
             (const char *)close->reply_text.bytes);
    return close->reply_code == AMQP_INTERNAL_ERROR && strstr(text, "timeout") != NULL;
}

/* Turns a failed RPC into the caller's message; reopens the channel after a channel.close. */
static int explain_failure(amqp_connection_state_t conn, const char *kind, const char *name,
                           char *err, size_t err_len)
{
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
    char reason[512];
    broker_describe_reply(reply, reason, sizeof reason);
    if (declaration_timed_out(reply)) {
        /* Seen on RabbitMQ 4.3 with two nodes of three down: the survivor takes connections and
         * answers lookups, but every binding (idemq declares them at each connect) waits 30 s
         * for a majority that is not there. */
        snprintf(err, err_len,
                 "declaring %s '%s' failed: %s. RabbitMQ could not commit the declaration in "
                 "time: a cluster with fewer than a majority of its nodes running cannot take "
                 "declarations (RabbitMQ 4.x keeps them in its Khepri metadata store, which needs "
                 "a majority), nor can an overloaded broker",
                 kind, name, reason);
        return BROKER_E_FAILED;
    }
    if (reply.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION ||
        reply.reply.id != AMQP_CHANNEL_CLOSE_METHOD) {
        snprintf(err, err_len, "declaring %s '%s' failed: %s", kind, name, reason);
        return BROKER_E_FAILED;
    }
    const amqp_channel_close_t *close = reply.reply.decoded;
    uint16_t code = close->reply_code;
    char text[400];
    snprintf(text, sizeof text, "%.*s", (int)close->reply_text.len,
             (const char *)close->reply_text.bytes);
    broker_reopen_channel(conn);
    if (code == AMQP_NOT_FOUND && strstr(text, "is down or inaccessible")) {
        /* In a cluster: a classic queue lives on one node, and that node is gone. Transient
         * (another node, or this one later, may do), not a configuration problem. */
        snprintf(err, err_len,
                 "%s '%s' is out of reach: it lives on one cluster node, and that node is down. "
                 "A quorum queue survives the loss of a node: declare it with x-queue-type "
                 "quorum (and declare: passive). Broker said: %s",
                 kind, name, text);
        return BROKER_E_FAILED;
    }
    if (code == AMQP_NOT_FOUND) {
        snprintf(err, err_len,
                 "%s '%s' does not exist (declare: passive only checks it). Create it, or set "
                 "declare: create. Broker said: %s",
                 kind, name, text);
        return TOPOLOGY_E_MISSING;
    }
    if (code == AMQP_PRECONDITION_FAILED) {
        char argument[64] = "an argument";
        const char *arg = strstr(text, "inequivalent arg '");
        if (arg)
            sscanf(arg + strlen("inequivalent arg '"), "%63[^']", argument);
        snprintf(err, err_len,
                 "%s '%s' already exists with a different %s than idemq declares (%s). RabbitMQ "
                 "cannot change arguments of an existing object. Fix: make the config match the "
                 "existing object (retry settings and queue_type decide the ladder's "
                 "arguments); or drain and delete it (rabbitmqctl delete_queue '%s') so idemq "
                 "redeclares it; or, for TTL and length limits, manage them with a policy "
                 "instead of queue arguments.",
                 kind, name, argument, text, name);
        return TOPOLOGY_E_MISMATCH;
    }
    snprintf(err, err_len, "declaring %s '%s' failed: %s", kind, name, reason);
    return BROKER_E_FAILED;
}

static int declare_exchange(amqp_connection_state_t conn, const char *name, char *err,
                            size_t err_len)
{
    amqp_exchange_declare(conn, BROKER_CHANNEL, amqp_cstring_bytes(name),
                          amqp_cstring_bytes("direct"), 0, 1, 0, 0, amqp_empty_table);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        return explain_failure(conn, "exchange", name, err, err_len);
    return 0;
}

static int declare_queue(amqp_connection_state_t conn, const char *name, int passive,
                         amqp_table_t args, char *err, size_t err_len)
{
    amqp_queue_declare(conn, BROKER_CHANNEL, amqp_cstring_bytes(name), passive, 1, 0, 0, args);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        return explain_failure(conn, "queue", name, err, err_len);
    return 0;
}

static int bind_queue(amqp_connection_state_t conn, const char *queue, const char *exchange,
                      const char *routing_key, char *err, size_t err_len)
{
    amqp_queue_bind(conn, BROKER_CHANNEL, amqp_cstring_bytes(queue), amqp_cstring_bytes(exchange),
                    amqp_cstring_bytes(routing_key), amqp_empty_table);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        return explain_failure(conn, "binding of queue", queue, err, err_len);
    return 0;
}

/* ------------------------------------------------------------------ broker version and probes */

int topology_broker_major(amqp_connection_state_t conn)
{
    const amqp_table_t *props = amqp_get_server_properties(conn);
    for (int i = 0; props && i < props->num_entries; i++) {
        const amqp_table_entry_t *e = &props->entries[i];
        if (e->key.len != strlen("version") || memcmp(e->key.bytes, "version", e->key.len) != 0 ||
            (e->value.kind != AMQP_FIELD_KIND_UTF8 && e->value.kind != AMQP_FIELD_KIND_BYTES))
            continue;
        char text[32];
        snprintf(text, sizeof text, "%.*s", (int)e->value.value.bytes.len,
                 (const char *)e->value.value.bytes.bytes);
        return atoi(text);
    }
    return 0;
}

/* What the broker answered to one declaration on the probe channel. */
typedef enum probe_status {
    PROBE_OK,      /* declare-ok */
    PROBE_REFUSED, /* channel.close: code and text */
    PROBE_FAILED,  /* connection trouble: reason in text */
} probe_status;

typedef struct probe_reply {
    probe_status status;
    uint16_t code;
    char text[512];
} probe_reply;

/* Opens TOPOLOGY_PROBE_CHANNEL, declares queue with args and closes the channel again (or
 * acknowledges the broker's channel.close): BROKER_CHANNEL is not touched. */
static void probe_declare(amqp_connection_state_t conn, const char *queue, int passive,
                          amqp_table_t args, probe_reply *out)
{
    char reason[512];
    out->code = 0;
    out->text[0] = '\0';
    amqp_channel_open(conn, TOPOLOGY_PROBE_CHANNEL);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        out->status = PROBE_FAILED;
        snprintf(out->text, sizeof out->text, "opening channel %d: %s", TOPOLOGY_PROBE_CHANNEL,
                 broker_describe_reply(reply, reason, sizeof reason));
        return;
    }
    amqp_queue_declare(conn, TOPOLOGY_PROBE_CHANNEL, amqp_cstring_bytes(queue), passive, 1, 0, 0,
                       args);
    reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
        out->status = PROBE_OK;
        amqp_channel_close(conn, TOPOLOGY_PROBE_CHANNEL, AMQP_REPLY_SUCCESS);
        reply = amqp_get_rpc_reply(conn);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            out->status = PROBE_FAILED;
            snprintf(out->text, sizeof out->text, "closing channel %d: %s",
                     TOPOLOGY_PROBE_CHANNEL, broker_describe_reply(reply, reason, sizeof reason));
        }
        return;
    }
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const amqp_channel_close_t *close = reply.reply.decoded;
        out->status = PROBE_REFUSED;
        out->code = close->reply_code;
        snprintf(out->text, sizeof out->text, "%.*s", (int)close->reply_text.len,
                 (const char *)close->reply_text.bytes);
        amqp_channel_close_ok_t close_ok;
        if (amqp_send_method(conn, TOPOLOGY_PROBE_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &close_ok) != AMQP_STATUS_OK) {
            out->status = PROBE_FAILED;
            snprintf(out->text, sizeof out->text, "acknowledging the close of channel %d",
                     TOPOLOGY_PROBE_CHANNEL);
        }
        return;
    }
    out->status = PROBE_FAILED;
    snprintf(out->text, sizeof out->text, "declaring queue '%s': %s", queue,
             broker_describe_reply(reply, reason, sizeof reason));
}

/* The argument a 406 "inequivalent arg 'NAME' ..." names, or "" when the text is another one. */
static void refused_argument(const char *text, char *buf, size_t len)
{
    buf[0] = '\0';
    const char *arg = strstr(text, "inequivalent arg '");
    if (arg)
        snprintf(buf, len, "%.*s", (int)strcspn(arg + strlen("inequivalent arg '"), "'"),
                 arg + strlen("inequivalent arg '"));
}

/* From "... current is the value 'V' of type 'T'": V and T. false for "current is none". */
static bool refused_current(const char *text, char *value, size_t value_len, char *type,
                            size_t type_len)
{
    static const char value_mark[] = "current is the value '", type_mark[] = "' of type '";
    const char *v = strstr(text, value_mark);
    if (!v)
        return false;
    v += strlen(value_mark);
    const char *t = NULL;
    for (const char *p = strstr(v, type_mark); p; p = strstr(p + 1, type_mark))
        t = p; /* the last one: a string value may itself hold the mark */
    if (!t)
        return false;
    snprintf(value, value_len, "%.*s", (int)(t - v), v);
    t += strlen(type_mark);
    snprintf(type, type_len, "%.*s", (int)strcspn(t, "'"), t);
    return true;
}

/* The vhost a broker reply text names ("... in vhost '/' ..."), when it names one. */
static bool vhost_in_text(const char *text, char *buf, size_t len)
{
    const char *v = strstr(text, "in vhost '");
    if (!v)
        return false;
    v += strlen("in vhost '");
    const char *end = strstr(v, "'");
    if (!end)
        return false;
    snprintf(buf, len, "%.*s", (int)(end - v), v);
    return true;
}

/* The connection's vhost, as the broker spells it: from the 404 of a passive declaration of a
 * queue that does not exist (rabbitmq-c does not keep the vhost it logged in to). "/" when the
 * broker does not say. */
static void learn_vhost(amqp_connection_state_t conn, char *buf, size_t len)
{
    probe_reply r;
    probe_declare(conn, "idemq.vhost-probe.no-such-queue", 1, amqp_empty_table, &r);
    if (r.status != PROBE_REFUSED || !vhost_in_text(r.text, buf, len))
        snprintf(buf, len, "/");
}

/* Sets e to the value a 406 reported, in a field type the broker compares equal; false for a
 * type this probe does not repeat (tables, arrays, floats, timestamps, decimals). */
static bool set_reported_value(amqp_table_entry_t *e, const char *key, const char *value,
                               const char *type)
{
    e->key = amqp_cstring_bytes(key);
    if (strcmp(type, "longstr") == 0 || strcmp(type, "binary") == 0) {
        e->value.kind = strcmp(type, "binary") == 0 ? AMQP_FIELD_KIND_BYTES : AMQP_FIELD_KIND_UTF8;
        e->value.value.bytes = amqp_cstring_bytes(value);
        return true;
    }
    if (strcmp(type, "bool") == 0) {
        e->value.kind = AMQP_FIELD_KIND_BOOLEAN;
        e->value.value.boolean = strcmp(value, "true") == 0;
        return strcmp(value, "true") == 0 || strcmp(value, "false") == 0;
    }
    static const char *const integers[] = {"long",         "signedint",     "short",
                                           "byte",         "unsignedbyte", "unsignedshort",
                                           "unsignedint"};
    for (size_t i = 0; i < sizeof integers / sizeof integers[0]; i++) {
        if (strcmp(type, integers[i]) != 0)
            continue;
        char *end = NULL;
        e->value.kind = AMQP_FIELD_KIND_I64;
        e->value.value.i64 = strtoll(value, &end, 10);
        return end && end != value && *end == '\0';
    }
    return false;
}

/* What a queue's declaration reveals about its delivery limit. */
typedef enum limit_state {
    LIMIT_MISSING,    /* the queue does not exist */
    LIMIT_NOT_QUORUM, /* not a quorum queue: no delivery limit */
    LIMIT_DEFAULT,    /* quorum, no x-delivery-limit argument: RabbitMQ 4's default (20) */
    LIMIT_VALUE,      /* quorum with x-delivery-limit = value */
    LIMIT_UNKNOWN,    /* could not tell (detail says why) */
    LIMIT_FAILED,     /* connection trouble (detail) */
} limit_state;

#define PROBE_MAX_ARGS 16

typedef struct limit_probe {
    limit_state state;
    long long value;            /* LIMIT_VALUE */
    bool has_dead_letter_exchange;
    char dead_letter_exchange[TOPOLOGY_NAME_MAX];
    bool vhost_known;              /* a broker text named it */
    char vhost[TOPOLOGY_NAME_MAX]; /* from the broker's texts; "/" until one does */
    char detail[512];
} limit_probe;

/*
 * Finds out the delivery limit of an existing queue without changing it: a passive declaration
 * (404 → LIMIT_MISSING), then declarations with x-queue-type quorum (plus x-delivery-limit -1
 * when with_unlimited), repeating each argument the broker reports as different.
 */
static void probe_delivery_limit(amqp_connection_state_t conn, const char *queue,
                                 bool with_unlimited, limit_probe *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->vhost, sizeof out->vhost, "/");
    probe_reply r;
    probe_declare(conn, queue, 1, amqp_empty_table, &r);
    if (r.status == PROBE_FAILED) {
        out->state = LIMIT_FAILED;
        snprintf(out->detail, sizeof out->detail, "%s", r.text);
        return;
    }
    if (r.status == PROBE_REFUSED) {
        out->vhost_known = vhost_in_text(r.text, out->vhost, sizeof out->vhost);
        /* 405: exclusive to another connection, which a quorum queue cannot be. */
        out->state = r.code == AMQP_NOT_FOUND        ? LIMIT_MISSING
                     : r.code == AMQP_RESOURCE_LOCKED ? LIMIT_NOT_QUORUM
                                                      : LIMIT_UNKNOWN;
        snprintf(out->detail, sizeof out->detail, "%s", r.text);
        return;
    }
    amqp_table_entry_t entries[PROBE_MAX_ARGS + 2];
    char keys[PROBE_MAX_ARGS][128], values[PROBE_MAX_ARGS][256];
    int n = 0, learnt = 0;
    set_text(&entries[n++], "x-queue-type", "quorum");
    if (with_unlimited)
        set_unlimited_delivery(&entries[n++]);
    for (;;) {
        probe_declare(conn, queue, 0, (amqp_table_t){.num_entries = n, .entries = entries}, &r);
        if (r.status == PROBE_OK) {
            out->state = with_unlimited ? LIMIT_VALUE : LIMIT_DEFAULT;
            out->value = -1;
            break;
        }
        if (r.status == PROBE_FAILED) {
            out->state = LIMIT_FAILED;
            snprintf(out->detail, sizeof out->detail, "%s", r.text);
            return;
        }
        out->vhost_known = vhost_in_text(r.text, out->vhost, sizeof out->vhost) ||
                           out->vhost_known;
        snprintf(out->detail, sizeof out->detail, "%s", r.text);
        char arg[128], value[256], type[32];
        refused_argument(r.text, arg, sizeof arg);
        if (r.code != AMQP_PRECONDITION_FAILED || !arg[0]) {
            out->state = LIMIT_UNKNOWN;
            break;
        }
        /* Quorum queues are always durable and never auto-delete: a queue that differs in
         * those is a classic one. */
        if (strcmp(arg, "x-queue-type") == 0 || strcmp(arg, "durable") == 0 ||
            strcmp(arg, "auto_delete") == 0) {
            out->state = LIMIT_NOT_QUORUM;
            break;
        }
        bool current = refused_current(r.text, value, sizeof value, type, sizeof type);
        if (strcmp(arg, "x-delivery-limit") == 0) {
            char *end = NULL;
            out->state = LIMIT_DEFAULT;
            if (current) {
                out->value = strtoll(value, &end, 10);
                out->state = end && end != value && *end == '\0' ? LIMIT_VALUE : LIMIT_UNKNOWN;
            }
            break;
        }
        if (!current || learnt == PROBE_MAX_ARGS) {
            out->state = LIMIT_UNKNOWN;
            break;
        }
        snprintf(keys[learnt], sizeof keys[learnt], "%s", arg);
        snprintf(values[learnt], sizeof values[learnt], "%s", value);
        if (!set_reported_value(&entries[n], keys[learnt], values[learnt], type)) {
            out->state = LIMIT_UNKNOWN;
            break;
        }
        if (strcmp(arg, "x-dead-letter-exchange") == 0) {
            out->has_dead_letter_exchange = true;
            snprintf(out->dead_letter_exchange, sizeof out->dead_letter_exchange, "%s", value);
        }
        n++;
        learnt++;
    }
}

/* ------------------------------------------------------------------------------ warnings */

/* Appends s to buf (size len, holding *used bytes) single-quoted for a POSIX shell. */
static void append_shell_quoted(char *buf, size_t len, size_t *used, const char *s)
{
    if (*used + 1 < len)
        buf[(*used)++] = '\'';
    for (; *s && *used + 5 < len; s++) {
        if (*s == '\'') {
            memcpy(buf + *used, "'\\''", 4);
            *used += 4;
        } else {
            buf[(*used)++] = *s;
        }
    }
    if (*used + 1 < len)
        buf[(*used)++] = '\'';
    buf[*used < len ? *used : len - 1] = '\0';
}

/* Writes s with every regular-expression metacharacter escaped (RabbitMQ policy patterns are
 * PCRE). */
static void regex_escape(const char *s, char *buf, size_t len)
{
    size_t n = 0;
    for (; *s && n + 3 < len; s++) {
        if (strchr(".^$*+?()[]{}|\\/", *s))
            buf[n++] = '\\';
        buf[n++] = *s;
    }
    buf[n] = '\0';
}

/* Writes s as the inside of a JSON string (quotes and backslashes escaped). */
static void json_escape(const char *s, char *buf, size_t len)
{
    size_t n = 0;
    for (; *s && n + 3 < len; s++) {
        if (*s == '"' || *s == '\\')
            buf[n++] = '\\';
        buf[n++] = *s;
    }
    buf[n] = '\0';
}

/*
 * Writes `rabbitmqctl set_policy --vhost V --apply-to quorum_queues [--priority P] NAME PATTERN
 * DEFINITION`, each value shell-quoted. pattern_queue is anchored and regex-escaped here.
 */
static void format_set_policy(char *buf, size_t len, const char *vhost, int priority,
                              const char *name, const char *pattern_queue, const char *definition)
{
    char escaped[TOPOLOGY_NAME_MAX * 2 + 8], pattern[TOPOLOGY_NAME_MAX * 2 + 16];
    regex_escape(pattern_queue, escaped, sizeof escaped);
    snprintf(pattern, sizeof pattern, "^%s$", escaped);
    size_t used = (size_t)snprintf(buf, len, "rabbitmqctl set_policy --vhost ");
    if (used >= len)
        return;
    append_shell_quoted(buf, len, &used, vhost);
    used += (size_t)snprintf(buf + used, len - used, " --apply-to quorum_queues");
    if (priority && used < len)
        used += (size_t)snprintf(buf + used, len - used, " --priority %d", priority);
    const char *words[] = {name, pattern, definition};
    for (size_t i = 0; i < 3 && used + 1 < len; i++) {
        buf[used++] = ' ';
        append_shell_quoted(buf, len, &used, words[i]);
    }
}

static const char one_policy_note[] =
    "A queue gets only one policy (the one with the highest priority): if a policy already "
    "applies to it, merge these keys into that policy instead.";

static void dead_letter_queue_warning(const config_consumer *c, const limit_probe *p,
                                      char *warning, size_t len)
{
    char dlq[TOPOLOGY_NAME_MAX], name[TOPOLOGY_NAME_MAX + 16], command[1024], why[256];
    topology_dead_letter_queue(c, dlq, sizeof dlq);
    snprintf(name, sizeof name, "idemq-dlq-%s", c->queue);
    format_set_policy(command, sizeof command, p->vhost, 10, name, dlq, "{\"delivery-limit\":-1}");
    if (p->state == LIMIT_DEFAULT)
        snprintf(why, sizeof why,
                 "was declared by an older idemq without x-delivery-limit, so it keeps RabbitMQ "
                 "4's default delivery limit of 20");
    else if (p->state == LIMIT_VALUE)
        snprintf(why, sizeof why, "has x-delivery-limit=%lld (RabbitMQ 4.x)", p->value);
    else
        snprintf(why, sizeof why, "may have a delivery limit (could not tell: %.150s)", p->detail);
    snprintf(warning, len,
             "dead-letter queue '%s' %s: anything that returns its messages unacked (the "
             "management UI's 'Get messages' with requeue, a consumer that crashes or closes "
             "with unacked messages) spends a delivery attempt, and past the limit the dead "
             "letter is dropped. idemq dlq list/replay return nothing and spend nothing. Fix: %s "
             "%s Policies are not visible over AMQP: once this one applies, ignore this "
             "warning.",
             dlq, why, command, one_policy_note);
}

static void work_queue_warning(const config_consumer *c, const limit_probe *p, char *warning,
                               size_t len)
{
    char name[TOPOLOGY_NAME_MAX + 16], limit_cmd[1024], dlx_cmd[1024], q[TOPOLOGY_NAME_MAX * 2];
    char definition[TOPOLOGY_NAME_MAX * 4 + 96], fate[TOPOLOGY_NAME_MAX + 96], what[2048];
    snprintf(name, sizeof name, "idemq-%s", c->queue);
    format_set_policy(limit_cmd, sizeof limit_cmd, p->vhost, 0, name, c->queue,
                      "{\"delivery-limit\":-1}");
    json_escape(c->queue, q, sizeof q);
    snprintf(definition, sizeof definition,
             "{\"dead-letter-exchange\":\"%s.dlx\",\"dead-letter-routing-key\":\"%s\"}", q, q);
    size_t used = 0;
    dlx_cmd[0] = '\0';
    append_shell_quoted(dlx_cmd, sizeof dlx_cmd, &used, definition);
    if (p->has_dead_letter_exchange)
        snprintf(fate, sizeof fate, "dead-letters it to exchange '%s' instead of processing it",
                 p->dead_letter_exchange);
    else
        snprintf(fate, sizeof fate, "drops it (does not dead-letter it)");
    if (p->state == LIMIT_VALUE)
        snprintf(what, sizeof what,
                 "work queue '%s' is a quorum queue with x-delivery-limit=%lld: a message "
                 "returned more than %lld times (requeued, or unacked when a channel closes; on "
                 "RabbitMQ 4.3 a nack with requeue does not count) is no longer delivered; "
                 "RabbitMQ %s. A queue argument cannot be changed in place: a policy "
                 "only helps where it takes precedence, else redeclare the queue",
                 c->queue, p->value, p->value, fate);
    else if (p->state == LIMIT_DEFAULT)
        snprintf(what, sizeof what,
                 "work queue '%s' is a quorum queue on RabbitMQ 4.x, whose default delivery "
                 "limit (20) %s when the message was returned (requeued, or unacked when a "
                 "channel closes; on RabbitMQ 4.3 a nack with requeue does not count) more than "
                 "20 times, unless a policy says otherwise (policies are not "
                 "visible over AMQP: ignore this if one sets delivery-limit for it)",
                 c->queue, fate);
    else
        snprintf(what, sizeof what,
                 "could not tell whether work queue '%s' has a delivery limit (%.200s); on "
                 "RabbitMQ 4.x a quorum queue's default limit (20) %s when the message was "
                 "returned more than 20 times",
                 c->queue, p->detail, fate);
    snprintf(warning, len, "%s. Fix: %s; or route such messages to idemq's DLQ with the "
             "definition %s. %s",
             what, limit_cmd, dlx_cmd, one_policy_note);
}

/* ------------------------------------------------------------------------------ declaring */

/* Q.dlq on RabbitMQ 4.x as a quorum queue: with x-delivery-limit -1, or, when it exists without
 * that argument (an older idemq), as it is, with a warning in err. The declaration with -1 runs
 * on the probe channel: its 406 must not reset BROKER_CHANNEL, whose confirm mode the daemon
 * relies on. */
static int declare_unlimited_dead_letter_queue(amqp_connection_state_t conn,
                                               const config_consumer *c, const char *queue,
                                               char *err, size_t err_len)
{
    amqp_table_entry_t entries[6];
    probe_reply r;
    probe_declare(conn, queue, 0, queue_arguments(c, 0, true, entries), &r);
    if (r.status == PROBE_OK)
        return 0;
    if (r.status == PROBE_FAILED) {
        snprintf(err, err_len, "declaring queue '%s' failed: %s", queue, r.text);
        return BROKER_E_FAILED;
    }
    char arg[128], value[64], type[32];
    refused_argument(r.text, arg, sizeof arg);
    if (r.code == AMQP_PRECONDITION_FAILED && strcmp(arg, "x-delivery-limit") == 0 &&
        !refused_current(r.text, value, sizeof value, type, sizeof type)) {
        int rc = declare_queue(conn, queue, 0, queue_arguments(c, 0, false, entries), err,
                               err_len);
        if (rc)
            return rc;
        limit_probe p = {.state = LIMIT_DEFAULT};
        if (!vhost_in_text(r.text, p.vhost, sizeof p.vhost))
            snprintf(p.vhost, sizeof p.vhost, "/");
        dead_letter_queue_warning(c, &p, err, err_len);
        return 0;
    }
    /* Any other difference: the same declaration on BROKER_CHANNEL explains it as usual. */
    return declare_queue(conn, queue, 0, queue_arguments(c, 0, true, entries), err, err_len);
}

int topology_declare(amqp_connection_state_t conn, const config_consumer *c, char *err,
                     size_t err_len)
{
    char exchange[TOPOLOGY_NAME_MAX], queue[TOPOLOGY_NAME_MAX];
    amqp_table_entry_t entries[6];
    err[0] = '\0';
    int rc = declare_queue(conn, c->queue, c->declare == CONFIG_DECLARE_PASSIVE, amqp_empty_table,
                           err, err_len);
    if (rc)
        return rc;
    topology_retry_exchange(c, exchange, sizeof exchange);
    if ((rc = declare_exchange(conn, exchange, err, err_len)))
        return rc;
    for (unsigned level = 1; level <= c->retry.max_retries; level++) {
        topology_retry_queue(c, level, queue, sizeof queue);
        amqp_table_t args =
            queue_arguments(c, retry_queue_ttl_ms(&c->retry, level), false, entries);
        if ((rc = declare_queue(conn, queue, 0, args, err, err_len)) ||
            (rc = bind_queue(conn, queue, exchange, queue, err, err_len)))
            return rc;
    }
    topology_dead_letter_exchange(c, exchange, sizeof exchange);
    topology_dead_letter_queue(c, queue, sizeof queue);
    if ((rc = declare_exchange(conn, exchange, err, err_len)))
        return rc;
    /* The warning, if any, stays in err while the binding succeeds. */
    char warning[TOPOLOGY_WARNING_MAX] = "";
    if (c->queue_type == CONFIG_QUEUE_QUORUM && topology_broker_major(conn) >= 4)
        rc = declare_unlimited_dead_letter_queue(conn, c, queue, warning, sizeof warning);
    else
        rc = declare_queue(conn, queue, 0, queue_arguments(c, 0, false, entries), warning,
                           sizeof warning);
    if (rc) {
        snprintf(err, err_len, "%s", warning);
        return rc;
    }
    if ((rc = bind_queue(conn, queue, exchange, c->queue, err, err_len)))
        return rc;
    snprintf(err, err_len, "%s", warning);
    return 0;
}

/* Probes queue's delivery limit on RabbitMQ 4.x and, when a message returned often enough would
 * be dropped, writes the advice for it (the work queue's or the DLQ's). Returns 1 with a
 * warning, 0 without, BROKER_E_FAILED with the reason in warning. */
static int check_delivery_limit(amqp_connection_state_t conn, const config_consumer *c,
                                const char *queue, bool is_dead_letter_queue, char *warning,
                                size_t len)
{
    warning[0] = '\0';
    if (topology_broker_major(conn) < 4)
        return 0;
    limit_probe p;
    probe_delivery_limit(conn, queue, is_dead_letter_queue, &p);
    switch (p.state) {
    case LIMIT_FAILED:
        snprintf(warning, len, "checking %s '%s': %s",
                 is_dead_letter_queue ? "dead-letter queue" : "work queue", queue, p.detail);
        return BROKER_E_FAILED;
    case LIMIT_MISSING:
    case LIMIT_NOT_QUORUM:
        return 0;
    case LIMIT_VALUE:
        if (p.value < 0)
            return 0;
        break;
    case LIMIT_DEFAULT:
    case LIMIT_UNKNOWN:
        break;
    }
    if (!p.vhost_known)
        learn_vhost(conn, p.vhost, sizeof p.vhost); /* for the advice */
    if (is_dead_letter_queue)
        dead_letter_queue_warning(c, &p, warning, len);
    else
        work_queue_warning(c, &p, warning, len);
    return 1;
}

int topology_check_work_queue(amqp_connection_state_t conn, const config_consumer *c,
                              char *warning, size_t len)
{
    return check_delivery_limit(conn, c, c->queue, false, warning, len);
}

int topology_check_dead_letter_queue(amqp_connection_state_t conn, const config_consumer *c,
                                     char *warning, size_t len)
{
    char dlq[TOPOLOGY_NAME_MAX];
    topology_dead_letter_queue(c, dlq, sizeof dlq);
    return check_delivery_limit(conn, c, dlq, true, warning, len);
}

void topology_print(FILE *out, const config_consumer *c)
{
    char exchange[TOPOLOGY_NAME_MAX], queue[TOPOLOGY_NAME_MAX];
    fprintf(out, "consumer %s (handler %s)\n", c->queue, c->handler_name);
    fprintf(out, "  queue     %-32s durable%s\n", c->queue,
            c->declare == CONFIG_DECLARE_PASSIVE ? ", passive (must exist)" : "");
    topology_retry_exchange(c, exchange, sizeof exchange);
    fprintf(out, "  exchange  %-32s direct, durable\n", exchange);
    for (unsigned level = 1; level <= c->retry.max_retries; level++) {
        topology_retry_queue(c, level, queue, sizeof queue);
        fprintf(out,
                "  queue     %-32s %s, x-message-ttl=%" PRIu64 " (delay %" PRIu64 "..%" PRIu64
                " ms), dead-letters to \"\" with key %s%s; bound to %s with key %s\n",
                queue, queue_type_name(c), retry_queue_ttl_ms(&c->retry, level),
                retry_base_delay_ms(&c->retry, level), retry_queue_ttl_ms(&c->retry, level),
                c->queue,
                c->queue_type == CONFIG_QUEUE_QUORUM
                    ? ", x-dead-letter-strategy=at-least-once, x-overflow=reject-publish"
                    : "",
                exchange, queue);
    }
    topology_dead_letter_exchange(c, exchange, sizeof exchange);
    topology_dead_letter_queue(c, queue, sizeof queue);
    fprintf(out, "  exchange  %-32s direct, durable\n", exchange);
    fprintf(out, "  queue     %-32s %s%s; bound to %s with key %s\n", queue, queue_type_name(c),
            c->queue_type == CONFIG_QUEUE_QUORUM ? ", x-delivery-limit=-1 on RabbitMQ 4.x" : "",
            exchange, c->queue);
}
