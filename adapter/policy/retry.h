/*
 * retry — the retry schedule as pure functions.
 *
 * Retry n (1-based) waits min(base * 2^(n-1), max_delay) plus a jitter drawn uniformly from
 * [0, jitter]. The broker holds the message in queue `Q.retry.<n>`, whose fixed x-message-ttl is
 * the level's largest possible delay; each copy carries its own `expiration` for the drawn delay.
 * A copy therefore waits at most until the copy ahead of it expires, which is never later than
 * its own delay + jitter: jitter adds no head-of-line blocking beyond its own span (a message
 * whose delay is d is back on Q by d + jitter + 1 s). No I/O, no globals. Thread affinity:
 * none (pure).
 */
#ifndef IDEMQ_RETRY_H
#define IDEMQ_RETRY_H

#include <stdint.h>

#define RETRY_MAX_LEVELS 32

/* The retry settings of one consumer. config/ fills it from `consumers[].retry` (ranges and
 * defaults are in its option table, config/consumers.c); policy/ only reads it. */
typedef struct retry_policy {
    unsigned max_retries;   /* retries before dead-lettering, at most RETRY_MAX_LEVELS */
    uint64_t base_ms;       /* delay of the first retry, > 0; doubles with each level */
    uint64_t jitter_ms;     /* random extra delay, uniform over [0, jitter_ms] */
    uint64_t max_delay_ms;  /* cap on the doubling delay, > 0 */
} retry_policy;

/* Deterministic part of level n's delay: min(base * 2^(n-1), max_delay); 0 when n == 0. */
uint64_t retry_base_delay_ms(const retry_policy *policy, unsigned level);

/* Full delay of level n with the jitter taken from random_bits (uniform over [0, jitter]). */
uint64_t retry_delay_ms(const retry_policy *policy, unsigned level, uint64_t random_bits);

/* x-message-ttl of queue Q.retry.<n>: the level's largest delay (base delay + jitter). */
uint64_t retry_queue_ttl_ms(const retry_policy *policy, unsigned level);

#endif
