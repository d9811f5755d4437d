/*
 * session — the long-lived AMQP connection of `idemq run`, driven by the libuv loop.
 *
 * rabbitmq-c is not thread-safe and buffers frames where uv_poll cannot see them, so everything
 * here runs on the loop thread and every readable event, timer tick and library call is followed
 * by a drain with zero-timeout frame reads until the library reports a timeout. Deliveries are
 * assembled from method/header/body frames into owned broker_message copies. Publishes go out
 * with mandatory=1 on a confirm-mode channel; each publish's callback runs once, with true only
 * when the broker confirmed it and did not return it. A lost connection fails pending confirms,
 * bumps the generation (so acks of old delivery tags are dropped: the broker redelivers those and
 * the dedup row settles them) and reconnects with backoff and jitter, redeclaring the topology.
 * Thread affinity: loop thread only.
 */
#ifndef IDEMQ_BROKER_SESSION_H
#define IDEMQ_BROKER_SESSION_H

#include <stdbool.h>
#include <uv.h>

#include "broker/message.h"
#include "config/config.h"

typedef struct broker_session broker_session;

typedef struct broker_session_callbacks {
    void *ctx;
    /* A complete delivery; the callee takes ownership of msg. */
    void (*on_message)(void *ctx, broker_message *msg);
    /* Connected (or reconnected) and topology declared. */
    void (*on_up)(void *ctx);
    /* The connection was lost; reconnecting is already scheduled. reason is borrowed. */
    void (*on_down)(void *ctx, const char *reason);
} broker_session_callbacks;

/* Runs once per accepted publish: confirmed is true only for a broker ack without a return. */
typedef void (*broker_confirm_cb)(void *arg, bool confirmed);

/* cfg and callbacks are borrowed and must outlive the session. */
broker_session *broker_session_new(uv_loop_t *loop, const config *cfg,
                                   const broker_session_callbacks *callbacks);

/*
 * First connection: connects, declares every consumer's topology and starts consuming.
 * Returns 0; -2 when the topology conflicts with existing objects or a passive queue is missing
 * (a configuration problem); -1 for other failures. err explains.
 */
int broker_session_start(broker_session *s, char *err, size_t err_len);

/* Acks / requeues msg's delivery; a no-op when msg came from an earlier connection. */
void broker_ack(broker_session *s, const broker_message *msg);
void broker_requeue(broker_session *s, const broker_message *msg);

/* broker_publish_copy: msg came on a connection that is gone (the broker redelivers it). */
#define BROKER_E_STALE (-2)

/*
 * Publishes a copy of msg (original body and properties plus headers) to exchange/routing_key.
 * Returns 0 and later runs cb(arg, confirmed) exactly once; -1 when it could not be sent (not
 * connected), BROKER_E_STALE when msg's connection is gone (a copy now would duplicate the one
 * its redelivery makes); then cb never runs. headers is borrowed for the call only.
 */
int broker_publish_copy(broker_session *s, const broker_message *msg, const char *exchange,
                        const char *routing_key, copy_headers *headers, broker_confirm_cb cb,
                        void *arg);

/* Starts or stops the consumers (basic.consume / basic.cancel); remembered across reconnects. */
void broker_set_consuming(broker_session *s, bool consuming);

bool broker_is_connected(const broker_session *s);
bool broker_is_consuming(const broker_session *s);
size_t broker_unconfirmed(const broker_session *s);

/* Closes the connection politely, fails pending confirms and releases the session (its handles
 * close on the loop, so keep running the loop). NULL is a no-op. */
void broker_session_free(broker_session *s);

#endif
