/*
 * rng — a small pseudo-random generator (xorshift64*) whose state lives in its owner, so there is
 * no global state (no rand()/srand()) and each user draws from its own sequence. Jitter needs
 * spread, not cryptographic strength. Thread affinity: one generator per thread at a time.
 */
#ifndef IDEMQ_RNG_H
#define IDEMQ_RNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t state; /* never 0 */
} rng;

/* Seeds g (caller-owned storage) from the monotonic clock, the process id and salt (e.g. the
 * owner's address), so generators of different processes and different owners differ. */
void rng_init(rng *g, uint64_t salt);

/* Seeds g with seed exactly: reproducible sequences for tests. */
void rng_init_seeded(rng *g, uint64_t seed);

/* The next 64 random bits. */
uint64_t rng_next(rng *g);

#endif
