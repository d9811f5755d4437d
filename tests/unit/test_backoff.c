/*
 * Unit tests for adapter/policy/backoff: the doubling, the cap, the jitter bounds and saturation,
 * as tables (a pure function).
 */
#include <criterion/criterion.h>

#include <stdint.h>

#include "policy/backoff.h"

Test(backoff, doubles_from_initial_up_to_the_cap_without_jitter)
{
    const backoff_policy probe = {.initial_ms = 500, .max_ms = 5000};
    const uint64_t expected[] = {500, 1000, 2000, 4000, 5000, 5000, 5000};
    for (unsigned failures = 0; failures < sizeof expected / sizeof expected[0]; failures++)
        cr_expect_eq(backoff_delay_ms(&probe, failures, UINT64_MAX), expected[failures],
                     "after %u failures", failures);
    cr_expect_eq(backoff_delay_ms(&probe, 1000000, 0), 5000);
}

Test(backoff, jitter_stays_within_its_share_of_the_delay)
{
    const backoff_policy reconnect = {.initial_ms = 500, .max_ms = 30000, .jitter_percent = 50};
    const struct {
        unsigned failures;
        uint64_t random_bits;
        uint64_t expected;
    } cases[] = {
        {0, 0, 500},        /* no jitter drawn */
        {0, 250, 750},      /* the largest jitter: delay / 2 */
        {0, 251, 500},      /* wraps: uniform over [0, 250] */
        {3, 2000, 6000},    /* 4000 + 4000 / 2 */
        {10, 15000, 45000}, /* capped at 30000, then jittered */
        {10, 15001, 30000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(backoff_delay_ms(&reconnect, cases[i].failures, cases[i].random_bits),
                     cases[i].expected, "case %zu", i);
    for (uint64_t bits = 0; bits < 5000; bits += 7) {
        uint64_t d = backoff_delay_ms(&reconnect, 2, bits * 2654435761u);
        cr_expect(d >= 2000 && d <= 3000, "%llu", (unsigned long long)d);
    }
}

Test(backoff, saturates_instead_of_wrapping)
{
    const backoff_policy huge = {
        .initial_ms = UINT64_MAX / 3, .max_ms = UINT64_MAX, .jitter_percent = 100};
    cr_expect_eq(backoff_delay_ms(&huge, 5, 0), UINT64_MAX);
    const backoff_policy big = {
        .initial_ms = UINT64_MAX / 3 * 2, .max_ms = UINT64_MAX, .jitter_percent = 100};
    cr_expect_eq(backoff_delay_ms(&big, 0, UINT64_MAX / 3 * 2), UINT64_MAX); /* delay + delay */
    const backoff_policy odd = {.initial_ms = 199, .max_ms = 1000, .jitter_percent = 50};
    cr_expect_eq(backoff_delay_ms(&odd, 0, 99), 199 + 99); /* floor(199 / 2) */
    cr_expect_eq(backoff_delay_ms(&odd, 0, 100), 199);
}
