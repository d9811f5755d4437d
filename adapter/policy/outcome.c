/*
 * outcome — see outcome.h.
 */
#include "policy/outcome.h"
#include "policy/retry.h"

outcome outcome_decide(apply_status status, unsigned retries_so_far, const retry_policy *policy,
                       uint64_t random_bits)
{
    outcome out = {.action = OUTCOME_ACK, .retries = retries_so_far};
    switch (status) {
    case APPLY_COMMITTED:
        out.label = OUTCOME_PROCESSED;
        break;
    case APPLY_DUPLICATE:
        out.label = OUTCOME_DEDUPED;
        break;
    case APPLY_STATE_NOOP:
        out.label = OUTCOME_STATE_NOOP;
        break;
    case APPLY_UNAVAILABLE:
        /* Not the message's fault: the retry budget is left untouched. */
        out.action = OUTCOME_HOLD;
        out.label = OUTCOME_REQUEUED;
        break;
    case APPLY_RETRYABLE:
        if (retries_so_far < policy->max_retries) {
            out.action = OUTCOME_RETRY;
            out.label = OUTCOME_RETRIED;
            out.error_class = ERROR_CLASS_RETRYABLE;
            out.retries = retries_so_far + 1;
            out.level = out.retries;
            out.delay_ms = retry_delay_ms(policy, out.level, random_bits);
        } else {
            out.action = OUTCOME_DEAD_LETTER;
            out.label = OUTCOME_DEAD_LETTERED;
            out.error_class = ERROR_CLASS_RETRIES_EXHAUSTED;
        }
        break;
    case APPLY_NON_RETRYABLE:
    default:
        out.action = OUTCOME_DEAD_LETTER;
        out.label = OUTCOME_DEAD_LETTERED;
        out.error_class = ERROR_CLASS_NON_RETRYABLE;
        break;
    }
    return out;
}

const char *outcome_label_name(outcome_label label)
{
    static const char *const names[] = {"processed", "deduped", "state_noop",
                                        "retried", "dead_lettered", "requeued"};
    return (unsigned)label < OUTCOME_LABEL_COUNT ? names[label] : "unknown";
}

const char *error_class_name(error_class cls)
{
    static const char *const names[] = {"none", "retryable", "non_retryable", "retries_exhausted"};
    return (unsigned)cls <= ERROR_CLASS_RETRIES_EXHAUSTED ? names[cls] : "unknown";
}

const char *apply_status_name(apply_status status)
{
    static const char *const names[] = {"committed", "duplicate",     "state_noop", "retryable",
                                        "non_retryable", "unavailable", "ok"};
    return (unsigned)status <= APPLY_OK ? names[status] : "unknown";
}
