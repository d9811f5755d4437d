/*
 * backoff — see backoff.h. Saturating arithmetic. No I/O, no globals.
 */
#include "policy/backoff.h"

uint64_t backoff_delay_ms(const backoff_policy *policy, unsigned failures, uint64_t random_bits)
{
    uint64_t delay = policy->initial_ms;
    for (unsigned i = 0; i < failures && delay < policy->max_ms; i++)
        delay = delay > UINT64_MAX / 2 ? UINT64_MAX : delay * 2;
    if (delay > policy->max_ms)
        delay = policy->max_ms;
    unsigned percent = policy->jitter_percent < 100 ? policy->jitter_percent : 100;
    if (percent == 0)
        return delay;
    /* delay * percent / 100 without overflowing: split delay into hundreds and the rest. */
    uint64_t span = delay / 100 * percent + delay % 100 * percent / 100;
    uint64_t jitter = span == UINT64_MAX ? random_bits : random_bits % (span + 1);
    return delay > UINT64_MAX - jitter ? UINT64_MAX : delay + jitter;
}
