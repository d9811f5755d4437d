/*
 * topology — declares (idempotently) the queues and exchanges of one consumer, or prints them.
 *
 * For work queue Q with R retries: Q (or a passive check), exchange Q.retry, queues Q.retry.1..R
 * with fixed x-message-ttl that dead-letter to exchange "" with routing key Q, exchange Q.dlx and
 * queue Q.dlq. A 406 PRECONDITION_FAILED is turned into a message naming the object, the argument
 * that differs, and the fix.
 *
 * RabbitMQ 4.x gives every quorum queue a default delivery limit of 20: each return of an unacked
 * message (nack/reject with requeue, a channel or connection closed with unacked messages) spends
 * one, and past the limit the message is dropped (or dead-lettered when the queue has a DLX). So
 * on 4.x a quorum Q.dlq is declared with x-delivery-limit = -1 (unlimited); 3.x has no default
 * limit and the argument is left out there. The broker's major version comes from the
 * connection's server properties.
 *
 * Probes that may be refused (a 406 closes the channel it happened on) run on their own channel,
 * TOPOLOGY_PROBE_CHANNEL, opened and closed within the call, so BROKER_CHANNEL keeps its state
 * (confirm mode, basic.qos, publish sequence numbers). Call these before consuming: an RPC on the
 * probe channel queues frames that arrive for other channels inside rabbitmq-c.
 * Thread affinity: the thread owning the connection.
 */
#ifndef IDEMQ_TOPOLOGY_H
#define IDEMQ_TOPOLOGY_H

#include "broker/amqp_api.h"
#include <stdio.h>

#include "config/config.h"
#include "util/errors.h"

#define TOPOLOGY_NAME_MAX 256
/* Opened and closed by topology_declare, topology_check_work_queue and
 * topology_check_dead_letter_queue; callers must not use it. */
#define TOPOLOGY_PROBE_CHANNEL 2
/* Enough for every warning text below. */
#define TOPOLOGY_WARNING_MAX 4096

/*
 * Declares everything for consumer c on BROKER_CHANNEL (and the probe channel, see above).
 * Returns 0, BROKER_E_FAILED or a TOPOLOGY_E_* code (util/errors.h) with the explanation in err
 * (borrowed, err_len bytes). After an error BROKER_CHANNEL has been reopened when possible (it is
 * then no longer in confirm mode).
 * A declaration that runs out of time (rabbitmq-c's RPC timeout, or RabbitMQ's 541 "... due to
 * timeout") is BROKER_E_FAILED, and err adds that a cluster without a majority of its nodes
 * cannot take declarations (RabbitMQ 4.x's Khepri metadata store needs one).
 *
 * On success err holds a warning for the operator, or "" when there is none. Today the one
 * warning: on RabbitMQ 4.x, a quorum Q.dlq that already exists without x-delivery-limit (declared
 * by an older idemq) is kept as it is (declaring it with -1 would fail with 406), and the text
 * explains the risk (RabbitMQ's default limit of 20 drops dead letters that something returns 20
 * times) and the `rabbitmqctl set_policy` command that lifts the limit. Callers should log it.
 */
int topology_declare(amqp_connection_state_t conn, const config_consumer *c, char *err,
                     size_t err_len);

/*
 * For the daemon, after topology_declare succeeded (so Q exists): on RabbitMQ 4.x, checks
 * whether the work queue Q is a quorum queue whose delivery limit is not unlimited, i.e. where a
 * message returned more than 20 times (the default) is dropped. Declares Q on TOPOLOGY_PROBE_CHANNEL with
 * the arguments it has (learnt one by one from the broker's 406 "inequivalent arg" replies, which
 * close only the probe channel) plus x-queue-type quorum, never changing the queue: declare-ok →
 * quorum without x-delivery-limit → warning; 406 on x-queue-type → not quorum → none; 406 on
 * x-delivery-limit → warning unless its value is negative; an argument of a type it cannot
 * repeat → limit unknown → warning. A delivery-limit set by a policy is invisible over AMQP: the
 * warning says so. On 3.x (no default limit), or when Q does not exist, there is nothing to say.
 *
 * warning (borrowed, len bytes) is always set: the advice (names the `rabbitmqctl set_policy`
 * command, with the vhost the broker reports) or "". Returns 1 when a warning was written, 0 when
 * none, BROKER_E_FAILED on a connection failure (the reason in warning).
 */
int topology_check_work_queue(amqp_connection_state_t conn, const config_consumer *c,
                              char *warning, size_t len);

/*
 * For `idemq dlq`: the same detection as topology_declare for an existing Q.dlq, without
 * declaring anything new (a missing Q.dlq is left missing). On RabbitMQ 4.x, when Q.dlq is a
 * quorum queue without an unlimited delivery limit, writes the warning topology_declare would
 * give and returns 1; otherwise sets warning to "" and returns 0; BROKER_E_FAILED on a
 * connection failure (the reason in warning).
 */
int topology_check_dead_letter_queue(amqp_connection_state_t conn, const config_consumer *c,
                                     char *warning, size_t len);

/* The broker's major version from the connection's server properties ("4.0.5" → 4); 0 when
 * the broker did not say. */
int topology_broker_major(amqp_connection_state_t conn);

/* Writes the plan (objects, arguments, bindings) for consumer c to out. There is no connection:
 * what depends on the broker version is written as such ("x-delivery-limit=-1 on RabbitMQ 4.x"). */
void topology_print(FILE *out, const config_consumer *c);

/* Names derived from the work queue, e.g. "Q.retry.3". */
void topology_retry_exchange(const config_consumer *c, char *buf, size_t len);
void topology_retry_queue(const config_consumer *c, unsigned level, char *buf, size_t len);
void topology_dead_letter_exchange(const config_consumer *c, char *buf, size_t len);
void topology_dead_letter_queue(const config_consumer *c, char *buf, size_t len);

#endif
