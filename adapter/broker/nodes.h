/*
 * nodes — which broker node to try next, when the configuration lists several (amqp.urls).
 *
 * `idemq run` tries the nodes in an order shuffled once per process, from a generator of its
 * own, so the replicas of a fleet spread over the cluster instead of all landing on the first
 * node; it takes the first node that answers. A round is one try of every node, starting with the
 * node after the one last handed out: after a connection loss the next round begins with the
 * node after the lost one, which comes last. The reconnect backoff applies between rounds, never
 * between two nodes of a round: a dead node must not cost a backoff while another node is up.
 * The one-shot commands (check, topology, dlq) instead open the first node that answers in the
 * configured order (broker_open_first). With a single URL every round is that URL.
 *
 * Thread affinity: the thread that owns the connection.
 */
#ifndef IDEMQ_BROKER_NODES_H
#define IDEMQ_BROKER_NODES_H

#include <stdbool.h>
#include <stddef.h>

#include "broker/connection.h"
#include "config/config.h"
#include "util/rng.h"

typedef struct broker_nodes {
    char *const *urls;                  /* borrowed: the config's amqp_urls */
    size_t count;                       /* 1..CONFIG_MAX_AMQP_URLS */
    size_t order[CONFIG_MAX_AMQP_URLS]; /* a permutation of 0..count-1 */
    size_t next;                        /* position in order of the node to hand out next */
    size_t tried;                       /* nodes handed out in this round */
    size_t last;                        /* index into urls of the node handed out last */
} broker_nodes;

/* Shuffles the order of urls[0..count) with random (borrowed, advanced) and begins a round at
 * the first node of that order. urls is borrowed and must outlive n; count is 1..
 * CONFIG_MAX_AMQP_URLS. */
void broker_nodes_init(broker_nodes *n, char *const *urls, size_t count, rng *random);

/* Begins a round: every node once, from the one after the node handed out last. */
void broker_nodes_new_round(broker_nodes *n);

/* The URL (borrowed) of the next node of the round, or NULL when every node of the round has
 * been handed out. */
const char *broker_nodes_next(broker_nodes *n);

/* Whether every node of the round has been handed out. */
bool broker_nodes_round_over(const broker_nodes *n);

/* The index into urls of the node broker_nodes_next handed out last (0 before the first). */
size_t broker_nodes_last(const broker_nodes *n);

/*
 * For the one-shot commands: broker_open on urls[0], urls[1], ... in the configured order until
 * one answers. opts->url is ignored (each node's URL is used in turn); the rest of opts is
 * borrowed for the call. Returns 0 with *out (returned owned) and *index (unless NULL: the index
 * of the node that answered) and, in err, "" or what the nodes before it said (for a warning);
 * else the last node's BROKER_E_* code with err naming every node tried (its URL redacted) and
 * what it said. With one URL, err is broker_open's own.
 */
int broker_open_first(char *const *urls, size_t count, const broker_open_options *opts,
                      amqp_connection_state_t *out, size_t *index, char *err, size_t err_len);

#endif
