/*
 * retry — see retry.h. Saturating arithmetic: a 32-level ladder with a large base must not wrap.
 */
#include "policy/retry.h"

uint64_t retry_base_delay_ms(const retry_policy *policy, unsigned level)
{
    if (level == 0)
        return 0;
    uint64_t delay = policy->base_ms;
    for (unsigned i = 1; i < level && delay < policy->max_delay_ms; i++)
        delay = delay > UINT64_MAX / 2 ? UINT64_MAX : delay * 2;
    return delay < policy->max_delay_ms ? delay : policy->max_delay_ms;
}

uint64_t retry_delay_ms(const retry_policy *policy, unsigned level, uint64_t random_bits)
{
    uint64_t jitter = 0;
    if (policy->jitter_ms > 0)
        jitter = policy->jitter_ms == UINT64_MAX ? random_bits
                                                 : random_bits % (policy->jitter_ms + 1);
    uint64_t base = retry_base_delay_ms(policy, level);
    return base > UINT64_MAX - jitter ? UINT64_MAX : base + jitter;
}

uint64_t retry_queue_ttl_ms(const retry_policy *policy, unsigned level)
{
    uint64_t base = retry_base_delay_ms(policy, level);
    return base > UINT64_MAX - policy->jitter_ms ? UINT64_MAX : base + policy->jitter_ms;
}
