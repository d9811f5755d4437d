/*
 * connection — opens and closes one AMQP connection with one channel (rabbitmq-c).
 *
 * Blocking calls bounded by timeouts (socket open, handshake, RPCs), used at startup, on
 * reconnect and by the one-shot CLI commands. Thread affinity: the thread that owns the
 * connection (the loop thread in `idemq run`).
 */
#ifndef IDEMQ_BROKER_CONNECTION_H
#define IDEMQ_BROKER_CONNECTION_H

#include <amqp.h>
#include <stddef.h>
#include <stdint.h>

#define BROKER_CHANNEL 1

typedef struct broker_open_options {
    const char *url;            /* amqp[s]://user:pass@host:port/vhost; borrowed */
    uint64_t heartbeat_ms;      /* 0 disables heartbeats */
    unsigned prefetch;          /* 0: no basic.qos */
    int confirms;               /* non-zero: confirm.select on the channel */
} broker_open_options;

/* Opens a connection and channel BROKER_CHANNEL. Returns 0 and sets *out, or -1 with a reason in
 * err (never the password); -2 when the broker refused the credentials or vhost. */
int broker_open(const broker_open_options *opts, amqp_connection_state_t *out, char *err,
                size_t err_len);

/* Closes the channel and connection politely when possible, then frees it. NULL is a no-op. */
void broker_close(amqp_connection_state_t conn);

/* Describes an RPC reply (library error, connection.close or channel.close) into buf. */
const char *broker_describe_reply(amqp_rpc_reply_t reply, char *buf, size_t len);

/* After a server channel.close: acknowledges it and reopens BROKER_CHANNEL. Returns 0 or -1. */
int broker_reopen_channel(amqp_connection_state_t conn);

#endif
