/*
 * rng — see rng.h. Thread affinity: one generator per thread at a time.
 */
#include "util/rng.h"

#include <time.h>
#include <unistd.h>

#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ULL

void rng_init_seeded(rng *g, uint64_t seed)
{
    g->state = seed ? seed : GOLDEN_GAMMA; /* xorshift never leaves 0 */
}

void rng_init(rng *g, uint64_t salt)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now_ns = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    rng_init_seeded(g, now_ns ^ ((uint64_t)getpid() << 32) ^ (salt * GOLDEN_GAMMA) ^ GOLDEN_GAMMA);
}

uint64_t rng_next(rng *g)
{
    g->state ^= g->state >> 12;
    g->state ^= g->state << 25;
    g->state ^= g->state >> 27;
    return g->state * 2685821657736338717ULL;
}
