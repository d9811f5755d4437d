/*
 * Policy table tests: outcome_decide and the retry schedule are pure functions.
 */
#include <criterion/criterion.h>
#include <stdint.h>

#include "policy/outcome.h"
#include "policy/retry.h"

static const retry_policy seed = {.max_retries = 6, .base_ms = 1000, .jitter_ms = 1000,
                                  .max_delay_ms = 3600000};

Test(outcome, table)
{
    static const struct {
        apply_status status;
        unsigned retries;
        outcome_action action;
        outcome_label label;
        error_class cls;
        unsigned next_retries;
    } rows[] = {
        {APPLY_COMMITTED, 0, OUTCOME_ACK, OUTCOME_PROCESSED, ERROR_CLASS_NONE, 0},
        {APPLY_COMMITTED, 3, OUTCOME_ACK, OUTCOME_PROCESSED, ERROR_CLASS_NONE, 3},
        {APPLY_DUPLICATE, 0, OUTCOME_ACK, OUTCOME_DEDUPED, ERROR_CLASS_NONE, 0},
        {APPLY_STATE_NOOP, 0, OUTCOME_ACK, OUTCOME_STATE_NOOP, ERROR_CLASS_NONE, 0},
        {APPLY_RETRYABLE, 0, OUTCOME_RETRY, OUTCOME_RETRIED, ERROR_CLASS_RETRYABLE, 1},
        {APPLY_RETRYABLE, 5, OUTCOME_RETRY, OUTCOME_RETRIED, ERROR_CLASS_RETRYABLE, 6},
        {APPLY_RETRYABLE, 6, OUTCOME_DEAD_LETTER, OUTCOME_DEAD_LETTERED,
         ERROR_CLASS_RETRIES_EXHAUSTED, 6},
        {APPLY_RETRYABLE, 40, OUTCOME_DEAD_LETTER, OUTCOME_DEAD_LETTERED,
         ERROR_CLASS_RETRIES_EXHAUSTED, 40},
        {APPLY_NON_RETRYABLE, 0, OUTCOME_DEAD_LETTER, OUTCOME_DEAD_LETTERED,
         ERROR_CLASS_NON_RETRYABLE, 0},
        {APPLY_NON_RETRYABLE, 2, OUTCOME_DEAD_LETTER, OUTCOME_DEAD_LETTERED,
         ERROR_CLASS_NON_RETRYABLE, 2},
        /* An outage never moves a message down the ladder. */
        {APPLY_UNAVAILABLE, 0, OUTCOME_HOLD, OUTCOME_REQUEUED, ERROR_CLASS_NONE, 0},
        {APPLY_UNAVAILABLE, 6, OUTCOME_HOLD, OUTCOME_REQUEUED, ERROR_CLASS_NONE, 6},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        outcome o = outcome_decide(rows[i].status, rows[i].retries, &seed, 12345);
        cr_expect_eq(o.action, rows[i].action, "row %zu: action", i);
        cr_expect_eq(o.label, rows[i].label, "row %zu: label", i);
        cr_expect_eq(o.error_class, rows[i].cls, "row %zu: class", i);
        cr_expect_eq(o.retries, rows[i].next_retries, "row %zu: retries", i);
        if (o.action == OUTCOME_RETRY)
            cr_expect_eq(o.level, o.retries, "row %zu: level", i);
    }
}

Test(outcome, zero_retries_dead_letters_at_once)
{
    retry_policy none = seed;
    none.max_retries = 0;
    outcome o = outcome_decide(APPLY_RETRYABLE, 0, &none, 1);
    cr_expect_eq(o.action, OUTCOME_DEAD_LETTER);
    cr_expect_eq(o.error_class, ERROR_CLASS_RETRIES_EXHAUSTED);
}

Test(retry, seed_schedule_bounds)
{
    /* The seed's schedule: 1–2, 2–3, 4–5, 8–9, 16–17, 32–33 s. */
    static const uint64_t lo[] = {1000, 2000, 4000, 8000, 16000, 32000};
    for (unsigned level = 1; level <= 6; level++) {
        cr_expect_eq(retry_base_delay_ms(&seed, level), lo[level - 1], "level %u", level);
        cr_expect_eq(retry_queue_ttl_ms(&seed, level), lo[level - 1] + 1000, "level %u", level);
        cr_expect_eq(retry_delay_ms(&seed, level, 0), lo[level - 1]);
        cr_expect_eq(retry_delay_ms(&seed, level, 1000), lo[level - 1] + 1000);
        cr_expect_eq(retry_delay_ms(&seed, level, 1001), lo[level - 1]);
        for (uint64_t r = 0; r < 5000; r += 37) {
            uint64_t d = retry_delay_ms(&seed, level, r * 2654435761u);
            cr_expect(d >= lo[level - 1] && d <= lo[level - 1] + 1000, "level %u: %lu", level,
                      (unsigned long)d);
        }
    }
}

Test(retry, jitter_spreads_over_the_whole_span)
{
    unsigned seen_low = 0, seen_high = 0;
    for (uint64_t r = 0; r < 10000; r++) {
        uint64_t j = retry_delay_ms(&seed, 1, r * 0x9E3779B97F4A7C15ULL) - 1000;
        seen_low += j < 100;
        seen_high += j > 900;
    }
    /* Uniform over 1001 values: about 10% in each tail; lock-step retries would show 0. */
    cr_expect(seen_low > 500 && seen_high > 500, "low %u high %u", seen_low, seen_high);
}

Test(retry, capped_by_max_delay_and_never_overflows)
{
    retry_policy capped = {.max_retries = 32, .base_ms = 1000, .jitter_ms = 500,
                           .max_delay_ms = 10000};
    cr_expect_eq(retry_base_delay_ms(&capped, 4), 8000);
    cr_expect_eq(retry_base_delay_ms(&capped, 5), 10000);
    cr_expect_eq(retry_base_delay_ms(&capped, 32), 10000);
    cr_expect_eq(retry_queue_ttl_ms(&capped, 32), 10500);
    retry_policy huge = {.max_retries = 32, .base_ms = UINT64_MAX / 4, .jitter_ms = UINT64_MAX,
                         .max_delay_ms = UINT64_MAX};
    cr_expect_eq(retry_base_delay_ms(&huge, 32), UINT64_MAX);
    cr_expect_eq(retry_delay_ms(&huge, 32, 77), UINT64_MAX);
    cr_expect_eq(retry_queue_ttl_ms(&huge, 3), UINT64_MAX);
    cr_expect_eq(retry_base_delay_ms(&huge, 0), 0);
}

Test(outcome, names)
{
    cr_expect_str_eq(outcome_label_name(OUTCOME_DEDUPED), "deduped");
    cr_expect_str_eq(error_class_name(ERROR_CLASS_RETRIES_EXHAUSTED), "retries_exhausted");
    cr_expect_str_eq(apply_status_name(APPLY_UNAVAILABLE), "unavailable");
    cr_expect_str_eq(outcome_label_name((outcome_label)99), "unknown");
}
