/*
 * session — the long-lived AMQP connection of `idemq run`, driven by the libuv loop.
 *
 * rabbitmq-c is not thread-safe and buffers frames where uv_poll cannot see them, so everything
 * here runs on the loop thread and every readable event, timer tick and library call is followed
 * by a drain with zero-timeout frame reads until the library reports a timeout. Deliveries are
 * assembled from method/header/body frames into owned broker_message copies (assembly.h).
 * Publishes go out with mandatory=1 on a confirm-mode channel; each publish's callback runs once,
 * with true only when the broker confirmed it and did not return it (confirms.h). Each
 * basic.consume round subscribes under consumer tags of its own (see consumer_tag in session.c).
 * A lost connection fails pending confirms, bumps the generation (so acks of old delivery tags
 * are dropped: the broker redelivers those and the dedup row settles them) and reconnects with
 * backoff and jitter (policy/backoff.h, a generator of the session's own), redeclaring the
 * topology. With several broker nodes (amqp.urls) the session connects to the first that answers
 * in an order shuffled per process and fails over to the next on loss, backing off only after a
 * round over every node failed (nodes.h); each connect logs the node (its URL redacted).
 *
 * Errors: 0 or a negative BROKER_E_* code (connection.h), with the detail in the caller's err
 * buffer when the function takes one.
 *
 * Thread affinity: loop thread only.
 */
#ifndef IDEMQ_BROKER_SESSION_H
#define IDEMQ_BROKER_SESSION_H

#include <stdbool.h>
#include <uv.h>

#include "broker/confirms.h"
#include "broker/connection.h"
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

/* cfg and callbacks are borrowed and must outlive the session. */
broker_session *broker_session_new(uv_loop_t *loop, const config *cfg,
                                   const broker_session_callbacks *callbacks);

/*
 * First connection: connects to the first node that answers (every node once, in the session's
 * shuffled order), declares every consumer's topology and starts consuming.
 * Returns 0; BROKER_E_REFUSED when the topology conflicts with existing objects or a passive
 * queue is missing (a configuration problem); BROKER_E_FAILED for other failures. err explains.
 */
int broker_session_start(broker_session *s, char *err, size_t err_len);

/* Acks msg's delivery (basic.ack); a no-op when msg came from an earlier connection. */
void broker_ack(broker_session *s, const broker_message *msg);

/* Gives msg's delivery back to its queue (basic.nack with requeue: on a quorum queue this spends
 * one delivery attempt); a no-op when msg came from an earlier connection, whose deliveries the
 * broker requeued already. */
void broker_nack_requeue(broker_session *s, const broker_message *msg);

/*
 * Publishes a copy of msg (original body and properties plus headers) to exchange/routing_key.
 * Returns 0 and later runs cb(arg, confirmed) exactly once; BROKER_E_FAILED when it could not be
 * sent (not connected, out of memory), BROKER_E_STALE when msg's connection is gone (a copy now
 * would duplicate the one its redelivery makes); then cb never runs. headers is borrowed for the
 * call only (its publish_seq is filled in).
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
