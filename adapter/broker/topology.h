/*
 * topology — declares (idempotently) the queues and exchanges of one consumer, or prints them.
 *
 * For work queue Q with R retries: Q (or a passive check), exchange Q.retry, queues Q.retry.1..R
 * with fixed x-message-ttl that dead-letter to exchange "" with routing key Q, exchange Q.dlx and
 * queue Q.dlq. A 406 PRECONDITION_FAILED is turned into a message naming the object, the argument
 * that differs, and the fix. Thread affinity: the thread owning the connection.
 */
#ifndef IDEMQ_TOPOLOGY_H
#define IDEMQ_TOPOLOGY_H

#include <amqp.h>
#include <stdio.h>

#include "config/config.h"

#define TOPOLOGY_NAME_MAX 256

enum {
    TOPOLOGY_E_BROKER = -1,    /* connection or other broker failure */
    TOPOLOGY_E_MISMATCH = -2,  /* 406: an object exists with different arguments */
    TOPOLOGY_E_MISSING = -3,   /* 404: passive work queue does not exist */
};

/* Declares everything for consumer c on BROKER_CHANNEL. Returns 0 or a TOPOLOGY_E_* code with
 * the explanation in err. After an error the channel has been reopened when possible. */
int topology_declare(amqp_connection_state_t conn, const config_consumer *c, char *err,
                     size_t err_len);

/* Writes the plan (objects, arguments, bindings) for consumer c to out. */
void topology_print(FILE *out, const config_consumer *c);

/* Names derived from the work queue, e.g. "Q.retry.3". */
void topology_retry_exchange(const config_consumer *c, char *buf, size_t len);
void topology_retry_queue(const config_consumer *c, unsigned level, char *buf, size_t len);
void topology_dead_letter_exchange(const config_consumer *c, char *buf, size_t len);
void topology_dead_letter_queue(const config_consumer *c, char *buf, size_t len);

#endif
