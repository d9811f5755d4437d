/*
 * retry — the retry schedule as pure functions.
 *
 * Retry n (1-based) waits min(base * 2^(n-1), max_delay) plus a jitter drawn uniformly from
 * [0, jitter]. The broker holds the message in queue `Q.retry.<n>`, whose fixed x-message-ttl is
 * the level's largest possible delay; each copy carries its own `expiration` for the drawn delay.
 * A copy therefore waits at most until the copy ahead of it expires, which is never later than
 * its own delay + jitter: the head-of-line bound DESIGN.md asks for. No I/O, no globals.
 */
#ifndef IDEMQ_RETRY_H
#define IDEMQ_RETRY_H

#include <stdint.h>
#include "config/config.h"

#define RETRY_MAX_LEVELS 32

/* Deterministic part of level n's delay: min(base * 2^(n-1), max_delay); 0 when n == 0. */
uint64_t retry_base_delay_ms(const config_retry *policy, unsigned level);

/* Full delay of level n with the jitter taken from random_bits (uniform over [0, jitter]). */
uint64_t retry_delay_ms(const config_retry *policy, unsigned level, uint64_t random_bits);

/* x-message-ttl of queue Q.retry.<n>: the level's largest delay (base delay + jitter). */
uint64_t retry_queue_ttl_ms(const config_retry *policy, unsigned level);

#endif
