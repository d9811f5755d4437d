/*
 * topology — see topology.h.
 *
 * Retry queues default to quorum queues with at-least-once dead-lettering and reject-publish
 * overflow, because classic-queue dead-lettering is at-most-once and can lose a retry. Each level
 * has a fixed TTL equal to its largest delay; copies carry their own shorter expiration (retry.h).
 */
#include "broker/topology.h"

#include <inttypes.h>
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

/* Arguments of a ladder or DLQ queue; ttl_ms == 0 means "no TTL, no dead-lettering" (the DLQ). */
static amqp_table_t queue_arguments(const config_consumer *c, uint64_t ttl_ms,
                                    amqp_table_entry_t entries[6])
{
    int n = 0;
    set_text(&entries[n++], "x-queue-type", queue_type_name(c));
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

/* Turns a failed RPC into the caller's message; reopens the channel after a channel.close. */
static int explain_failure(amqp_connection_state_t conn, const char *kind, const char *name,
                           char *err, size_t err_len)
{
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
    char reason[512];
    broker_describe_reply(reply, reason, sizeof reason);
    if (reply.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION ||
        reply.reply.id != AMQP_CHANNEL_CLOSE_METHOD) {
        snprintf(err, err_len, "declaring %s '%s' failed: %s", kind, name, reason);
        return TOPOLOGY_E_BROKER;
    }
    const amqp_channel_close_t *close = reply.reply.decoded;
    uint16_t code = close->reply_code;
    char text[400];
    snprintf(text, sizeof text, "%.*s", (int)close->reply_text.len,
             (const char *)close->reply_text.bytes);
    broker_reopen_channel(conn);
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
    return TOPOLOGY_E_BROKER;
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

int topology_declare(amqp_connection_state_t conn, const config_consumer *c, char *err,
                     size_t err_len)
{
    char exchange[TOPOLOGY_NAME_MAX], queue[TOPOLOGY_NAME_MAX];
    amqp_table_entry_t entries[6];
    int rc = declare_queue(conn, c->queue, c->declare == CONFIG_DECLARE_PASSIVE, amqp_empty_table,
                           err, err_len);
    if (rc)
        return rc;
    topology_retry_exchange(c, exchange, sizeof exchange);
    if ((rc = declare_exchange(conn, exchange, err, err_len)))
        return rc;
    for (unsigned level = 1; level <= c->retry.max_retries; level++) {
        topology_retry_queue(c, level, queue, sizeof queue);
        amqp_table_t args = queue_arguments(c, retry_queue_ttl_ms(&c->retry, level), entries);
        if ((rc = declare_queue(conn, queue, 0, args, err, err_len)) ||
            (rc = bind_queue(conn, queue, exchange, queue, err, err_len)))
            return rc;
    }
    topology_dead_letter_exchange(c, exchange, sizeof exchange);
    topology_dead_letter_queue(c, queue, sizeof queue);
    if ((rc = declare_exchange(conn, exchange, err, err_len)) ||
        (rc = declare_queue(conn, queue, 0, queue_arguments(c, 0, entries), err, err_len)) ||
        (rc = bind_queue(conn, queue, exchange, c->queue, err, err_len)))
        return rc;
    return 0;
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
    fprintf(out, "  queue     %-32s %s; bound to %s with key %s\n", queue, queue_type_name(c),
            exchange, c->queue);
}
