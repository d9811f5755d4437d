/*
 * relay_publish — the relay's AMQP side (outbox/relay.h): its confirm-mode connection over the
 * nodes of amqp.urls, and one round's publishes and confirms. Internal to the relay.
 *
 * A round: every exchange the rows name that this connection has not seen yet is checked with a
 * passive exchange.declare (the rows of a missing one become RELAY_ROW_UNROUTABLE without being
 * published); the other rows are published in order, mandatory; then the frames are read until
 * every publish is confirmed. Publishes, confirms and returns go through broker/confirms.h, the
 * channel's return key being the idemq-outbox-id header: a basic.return (which RabbitMQ sends
 * before the ack of the same publish) names its row by it, and the row's ack counts as unroutable.
 * A channel.close 404 during the round (an exchange deleted after its check) names the exchange:
 * the first unconfirmed row that publishes to it is the one that caused it; the channel is reopened
 * (with confirm.select again) and the rows whose confirms the close swallowed stay
 * RELAY_ROW_UNKNOWN.
 *
 * Errors: 0, or BROKER_E_FAILED (util/errors.h) when the connection is lost or a confirm
 * does not come in time: the connection is then already dropped, err says why.
 * Thread affinity: the relay thread (it owns the connection).
 */
#ifndef IDEMQ_OUTBOX_RELAY_PUBLISH_H
#define IDEMQ_OUTBOX_RELAY_PUBLISH_H

#include "broker/amqp_api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/confirms.h"
#include "broker/nodes.h"
#include "config/config.h"
#include "outbox/relay_db.h"
#include "util/rng.h"

typedef struct relay_broker {
    const config *cfg;            /* borrowed */
    amqp_connection_state_t conn; /* owned; NULL: not connected */
    broker_nodes nodes;
    rng random;
    broker_confirms confirms; /* also reads basic.returns */
    char **known;             /* exchanges seen to exist on this connection (owned) */
    size_t known_count, known_cap;
    /* the round in progress */
    relay_row *rows; /* borrowed from relay_broker_send's caller until the round ends */
    size_t row_count;
    struct publish_ref *refs; /* owned: what each row's confirm callback is given */
    bool channel_reopened;    /* a channel.close came during this round */
    /* Optional: runs just before the connection's socket closes (whatever closes it), so that an
     * owner that may shut the socket down from another thread forgets it first. */
    void (*socket_closing)(void *ctx);
    void *socket_ctx;
} relay_broker;

/* cfg is borrowed and must outlive b. Not connected. */
void relay_broker_init(relay_broker *b, const config *cfg);

/* Closes the connection (relay_broker_close) and frees what b holds. */
void relay_broker_fini(relay_broker *b);

/* Tries each node of a new round of amqp.urls once, in the shuffled order (broker/nodes.h), until
 * one opens; *node (unless NULL) gets its index. Returns 0, or the last node's BROKER_E_* code
 * with every node's failure in err. */
int relay_broker_connect(relay_broker *b, size_t *node, char *err, size_t err_len);

/* Closes the connection politely (at most about 2 s per step, broker_close); no-op when not
 * connected. */
void relay_broker_close(relay_broker *b);

/* The connection's socket, or -1 when not connected (to poll on, or to shut down from another
 * thread). */
int relay_broker_socket(const relay_broker *b);

/* Reads what arrived without waiting (rabbitmq-c sends due heartbeats here). Returns 0, or
 * BROKER_E_FAILED when the connection was lost (dropped, err says why). */
int relay_broker_service(relay_broker *b, char *err, size_t err_len);

/* Runs about every 250 ms while confirms are awaited; returns false to give up the round now
 * (the connection is dropped; rows without a confirm stay UNKNOWN). */
typedef bool (*relay_tick_fn)(void *ctx);

/*
 * A round in two calls, so that the caller can use the database while the broker works:
 * relay_broker_send publishes rows[0..count) (borrowed, in id order, until the round ends) as
 * described above, reading the confirms that arrive meanwhile; relay_broker_await then waits up
 * to confirm_timeout_ms for the others, filling in each row's outcome (and error). The round
 * ends when relay_broker_await returns, or when send fails. Both return 0 or BROKER_E_FAILED as
 * above; await returns 0 when every row published has its answer (rows whose confirm a channel
 * close swallowed, or that were not sent after it, stay UNKNOWN).
 */
int relay_broker_send(relay_broker *b, relay_row *rows, size_t count, char *err, size_t err_len);
int relay_broker_await(relay_broker *b, uint64_t confirm_timeout_ms, relay_tick_fn tick, void *ctx,
                       char *err, size_t err_len);

#endif
