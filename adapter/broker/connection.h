/*
 * connection — opens and closes one AMQP connection with one channel (rabbitmq-c).
 *
 * Blocking calls bounded by timeouts (socket open, handshake, RPCs), used at startup, on
 * reconnect and by the one-shot CLI commands. Also the text of the broker's close replies, for
 * every error message that quotes one. Thread affinity: the thread that owns the connection
 * (the session's broker thread in `idemq run`).
 *
 * Errors, for every broker/ header: a function returns 0 or one of the negative BROKER_E_*,
 * MESSAGE_E_* or TOPOLOGY_E_* codes (util/errors.h), with the detail (never a password) in the
 * caller's err buffer when it takes one.
 */
#ifndef IDEMQ_BROKER_CONNECTION_H
#define IDEMQ_BROKER_CONNECTION_H

#include "broker/amqp_api.h"
#include <stddef.h>
#include <stdint.h>

#include "util/errors.h"

#define BROKER_CHANNEL 1

struct config_amqp_tls;

typedef struct broker_open_options {
    const char *url;            /* amqp[s]://user:pass@host:port/vhost; borrowed */
    uint64_t heartbeat_ms;      /* 0 disables heartbeats */
    unsigned prefetch;          /* 0: no basic.qos */
    int confirms;               /* non-zero: confirm.select on the channel */
    /* amqps:// only (broker/tls.h): borrowed; NULL: the system trust store, verification on */
    const struct config_amqp_tls *tls;
    char *tls_info;             /* optional out: the negotiated version, cipher and certificates
                                   (broker_tls_describe); "" for amqp:// */
    size_t tls_info_len;
    const char *password;       /* amqp.password_file's content, in place of the URL's password;
                                   NULL: the URL's. Borrowed. */
    /* Non-zero: advertise the connection.blocked capability (the broker then announces resource
     * alarms with connection.blocked / connection.unblocked) and consumer_cancel_notify (it
     * cancels a consumer with basic.cancel, e.g. at a consumer timeout, instead of closing the
     * channel), and name the connection "idemq run" for the management UI. For the long-lived
     * session only: it handles both. */
    int session_capabilities;
} broker_open_options;

/* Opens a connection and channel BROKER_CHANNEL. Returns 0 and sets *out (returned owned), or
 * BROKER_E_FAILED with a reason in err; BROKER_E_REFUSED only when the broker answered the login
 * with a refusal (credentials, vhost): a timeout or a closed socket during the handshake is
 * BROKER_E_FAILED and says so. A TLS failure broker_tls_explain names (a certificate not trusted, a
 * name that does not match, a client certificate refused) is BROKER_E_REFUSED too: the
 * configuration has to change. An amqps:// URL connects with TLS (broker/tls.h): a certificate problem is one line
 * in err naming the file or name at fault. With a client certificate (tls->cert_file) and no
 * password in the URL, the login is EXTERNAL: the broker takes the user from the certificate. */
int broker_open(const broker_open_options *opts, amqp_connection_state_t *out, char *err,
                size_t err_len);

/* Closes the channel and connection politely when possible (waiting at most about 2 s for the
 * broker's answers), then frees it. NULL is a no-op. */
void broker_close(amqp_connection_state_t conn);

/* Describes a rabbitmq-c status in words an operator reads: "connection closed by the broker"
 * rather than "a socket error occurred" or "bad file descriptor". */
const char *broker_describe_status(int status);

/* Describes an RPC reply (library error, connection.close or channel.close) into buf. Returns
 * buf. */
const char *broker_describe_reply(amqp_rpc_reply_t reply, char *buf, size_t len);

/* Describes a method the broker sent instead of a reply: "connection closed by broker: 320 …",
 * "channel closed by broker: 404 …", or its id for anything else. method is borrowed. Returns
 * buf. */
const char *broker_describe_method(const amqp_method_t *method, char *buf, size_t len);

/* After a server channel.close: acknowledges it and reopens BROKER_CHANNEL. Returns 0 or
 * BROKER_E_FAILED. */
int broker_reopen_channel(amqp_connection_state_t conn);

#endif
