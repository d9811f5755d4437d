/*
 * backoff — how long to wait before the next attempt at something that keeps failing (the
 * RabbitMQ reconnect, the database probe while consumption is paused): the delay doubles per
 * attempt from initial_ms up to max_ms, plus an optional jitter proportional to it, so a fleet of
 * instances does not retry in lock-step. A pure function: the caller brings the attempt count and
 * the random bits. No I/O, no globals, no config. Thread affinity: none (pure).
 */
#ifndef IDEMQ_BACKOFF_H
#define IDEMQ_BACKOFF_H

#include <stdint.h>

typedef struct backoff_policy {
    uint64_t initial_ms;     /* delay before attempt 1 (attempt index 0) */
    uint64_t max_ms;         /* the doubling stops here */
    unsigned jitter_percent; /* 0..100: extra delay drawn uniformly from
                              * [0, delay * jitter_percent / 100] */
} backoff_policy;

/*
 * The delay before the attempt after `failures` consecutive failures (0: the first retry):
 * min(initial_ms * 2^failures, max_ms) plus the jitter taken from random_bits. Saturates instead
 * of wrapping.
 */
uint64_t backoff_delay_ms(const backoff_policy *policy, unsigned failures, uint64_t random_bits);

#endif
