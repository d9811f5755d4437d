/*
 * session — the long-lived AMQP connection of `idemq run`, owned by a broker thread so that no
 * network call ever runs on the libuv loop.
 *
 * Why a thread and not non-blocking I/O on the loop: rabbitmq-c's connect, TLS handshake, login
 * and every RPC (declare, consume, cancel, close) are blocking calls with their own timeouts, and
 * a publish blocks in send() for as long as the broker does not read (a resource alarm blocks a
 * publishing connection until it clears). Rewriting those on non-blocking sockets would mean
 * re-implementing rabbitmq-c's framing; a second publishing connection would still leave connect
 * and the consumer's RPCs on the loop. So one thread owns the connection and everything that
 * touches it, and talks to the loop through two queues: commands (ack, nack, reject, publish,
 * consume on/off, stop) go in under a mutex and wake the thread through an eventfd; events
 * (delivery, confirm, up, down, blocked, unblocked, consuming, fatal) come out under the same
 * mutex and wake the loop through a uv_async. The loop keeps a mirror of the state the thread
 * reports, so every function below is a queue operation or a read: none of them waits.
 *
 * On the broker thread: frames are assembled into owned broker_message copies (assembly.h) and
 * handed to the loop; acks are coalesced per wake-up ("multiple" over the run of settled delivery
 * tags at the head, single acks for settled tags behind an unsettled one); publishes go out with
 * mandatory=1 on a confirm-mode channel and each publish's callback runs once, on the loop, with
 * true only when the broker confirmed it and did not return it (confirms.h). connection.blocked is
 * advertised at login: while the broker is blocked (a resource alarm), copies wait in the thread
 * unsent (so the connection never turns "blocked" and acks still flow), the consumers are
 * cancelled, and both resume at connection.unblocked. A liveness probe (basic.qos, answered even
 * by an idle broker) goes out whenever nothing arrived for a second, so a broker that stops
 * answering (SIGSTOP, a hung node) shows in broker_describe_unready within about 3 s, long before
 * the heartbeat timeout drops the connection. A lost connection fails pending confirms, bumps the
 * generation (acks of old delivery tags are dropped: the broker redelivers those and the dedup
 * row settles them) and reconnects with backoff and jitter, over every node of amqp.urls in an
 * order shuffled per process (nodes.h), redeclaring the topology. The first connection is made
 * the same way: a broker that is down at start-up is waited for. Only a refusal before the first
 * connection worked (credentials, vhost, a topology conflict) ends the run, through on_fatal.
 *
 * Errors: 0 or a negative BROKER_E_* code (util/errors.h).
 * Thread affinity: every function below on the loop thread; callbacks run there too.
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
    /* The connection was lost; reconnecting is already under way. reason is borrowed. */
    void (*on_down)(void *ctx, const char *reason);
    /* The broker blocked (reason, borrowed) or unblocked (NULL) this connection. Optional. */
    void (*on_blocked)(void *ctx, const char *reason);
    /* The broker cancelled consumer consumer_index (a consumer timeout, its queue deleted, …);
     * the session subscribes it again by itself. Optional. */
    void (*on_consumer_cancelled)(void *ctx, size_t consumer_index);
    /* Every consumer is subscribed (true: each basic.consume was answered), or every one was
     * cancelled as asked (false; a lost connection is on_down). Optional. */
    void (*on_consuming)(void *ctx, bool consuming);
    /* Before any connection worked, the broker refused what the configuration asks
     * (BROKER_E_REFUSED: credentials, vhost, topology). The session stops trying; the run should
     * end. reason is borrowed. */
    void (*on_fatal)(void *ctx, int code, const char *reason);
} broker_session_callbacks;

/* cfg and callbacks are borrowed and must outlive the session. NULL when out of memory. */
broker_session *broker_session_new(uv_loop_t *loop, const config *cfg,
                                   const broker_session_callbacks *callbacks);

/* Starts the broker thread, which connects (waiting for the broker as long as it takes) and
 * starts consuming. Returns 0, or BROKER_E_FAILED when the thread cannot be started (err says
 * why). */
int broker_session_start(broker_session *s, char *err, size_t err_len);

/* Acks msg's delivery (coalesced with its neighbours); dropped when msg came from an earlier
 * connection. */
void broker_ack(broker_session *s, const broker_message *msg);

/* Gives msg's delivery back to its queue at once (basic.nack with requeue: before RabbitMQ 4.3
 * a quorum queue counts it toward its delivery limit, 4.3 does not); dropped when msg came from
 * an earlier connection, whose deliveries the broker requeued already. */
void broker_nack_requeue(broker_session *s, const broker_message *msg);

/* Gives msg's delivery back like broker_nack_requeue, coalesced with its neighbours: one
 * basic.nack(multiple) once every earlier delivery is settled, or at the latest with every
 * unsettled delivery when the session closes. For shutting down, where many deliveries go back
 * at once and the channel closes right after (see flush_acks in session.c). */
void broker_release(broker_session *s, const broker_message *msg);

/* Rejects msg's delivery without requeue: the work queue's own dead-letter route (if it has one)
 * takes it, else the broker drops it. For a message no copy of which can be published. */
void broker_reject(broker_session *s, const broker_message *msg);

/*
 * Publishes a copy of msg (original body and properties plus headers) to exchange/routing_key.
 * Returns 0 and later runs cb(arg, confirmed) exactly once; BROKER_E_FAILED when it could not be
 * queued (not connected, out of memory), BROKER_E_STALE when msg's connection is gone (a copy now
 * would duplicate the one its redelivery makes), BROKER_E_TOO_LARGE when the copy cannot fit the
 * connection's frame_max; then cb never runs. msg is borrowed until cb runs (the broker thread
 * reads its body); headers only for the call.
 */
int broker_publish_copy(broker_session *s, const broker_message *msg, const char *exchange,
                        const char *routing_key, copy_headers *headers, broker_confirm_cb cb,
                        void *arg);

/* Starts or stops the consumers (basic.consume / basic.cancel); remembered across reconnects. */
void broker_set_consuming(broker_session *s, bool consuming);

/* Copies held unsent while the broker blocks the connection are failed now (their callbacks run
 * with false: nothing was published, the originals go back to the queue): for a shutdown that
 * must not wait for an alarm to end. Copies already sent still wait for their confirms. */
void broker_abandon_held_publishes(broker_session *s);

bool broker_is_connected(const broker_session *s);
bool broker_is_consuming(const broker_session *s);
size_t broker_unconfirmed(const broker_session *s);

/* Whether the broker currently blocks the connection (a resource alarm); its reason into buf. */
bool broker_is_blocked(const broker_session *s, char *reason, size_t reason_len);

/* When the session cannot take and settle deliveries right now — not connected (with the last
 * connect error), blocked, silent (no answer to the liveness probe for 3 s) — writes why into buf
 * and returns true. (Whether it consumes is broker_is_consuming.) */
bool broker_describe_unready(const broker_session *s, char *buf, size_t len);

/* Stops the broker thread (it gives back every delivery not yet acked with one
 * basic.nack(multiple, requeue), closes the connection politely, fails pending confirms) and
 * releases the session once the thread is gone; keep running the loop until then. A delivery
 * given back at shutdown is therefore left unsettled rather than nacked on its own. NULL is a
 * no-op. */
void broker_session_free(broker_session *s);

#endif
