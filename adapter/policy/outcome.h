/*
 * outcome — what to do with a message once the store (or the decoder) has classified it.
 *
 * I/O classifies, policy decides: the store reports an apply_status; outcome_decide turns it and
 * the retry count carried in the message's header into ack / retry(level, delay) / dead-letter /
 * hold (keep it unacked while the database is unusable). A pure function, tested as a table. No
 * I/O, no globals. Thread affinity: none (pure).
 */
#ifndef IDEMQ_OUTCOME_H
#define IDEMQ_OUTCOME_H

#include <stdint.h>
#include "policy/retry.h"

/* What applying one message found. */
typedef enum apply_status {
    APPLY_COMMITTED = 0,    /* dedup row and business update committed (a PING or PROBE job:
                               the database passed) */
    APPLY_DUPLICATE,        /* the unique index said this (biz_key, handler) is done */
    APPLY_STATE_NOOP,       /* state already at the target: committed as an idempotent success */
    APPLY_RETRYABLE,        /* rolled back; the same message may succeed later */
    APPLY_NON_RETRYABLE,    /* rolled back, or never started: it will fail the same way again */
    APPLY_UNAVAILABLE,      /* the database could not be reached or refused writes */
    /* "Go on": a step inside the store or a handler succeeded (a handler whose business update
     * is done, a statement prepared, the dedup row inserted, a check passed). Nothing is
     * committed yet: only the store's COMMIT turns it into APPLY_COMMITTED, so it never leaves
     * the store as a job's status and never reaches outcome_decide. Last, so that every status
     * above keeps its value. */
    APPLY_OK,
} apply_status;

typedef enum outcome_action {
    OUTCOME_ACK = 0,
    OUTCOME_RETRY,          /* publish to Q.retry for `level`, wait for the confirm, then ack */
    OUTCOME_DEAD_LETTER,    /* publish to Q.dlx, wait for the confirm, then ack */
    OUTCOME_HOLD,           /* keep it unacked and pause consuming: not the message's fault */
} outcome_action;

/* The label counted in metrics and written in logs. */
typedef enum outcome_label {
    OUTCOME_PROCESSED = 0,
    OUTCOME_DEDUPED,
    OUTCOME_STATE_NOOP,
    OUTCOME_RETRIED,
    OUTCOME_DEAD_LETTERED,
    OUTCOME_REQUEUED,
    OUTCOME_LABEL_COUNT,
} outcome_label;

typedef enum error_class {
    ERROR_CLASS_NONE = 0,
    ERROR_CLASS_RETRYABLE,
    ERROR_CLASS_NON_RETRYABLE,
    ERROR_CLASS_RETRIES_EXHAUSTED,
} error_class;

typedef struct outcome {
    outcome_action action;
    outcome_label label;
    error_class error_class;   /* for RETRY and DEAD_LETTER: the idemq-error-class header */
    unsigned retries;          /* idemq-retries on the copy: retries scheduled so far */
    unsigned level;            /* RETRY: ladder level to publish to (== retries) */
    uint64_t delay_ms;         /* RETRY: this copy's expiration */
} outcome;

/*
 * Decides what happens to a message.
 *   status: what applying it found.
 *   retries_so_far: the idemq-retries header of the delivery (0 for a first delivery).
 *   policy: borrowed retry settings of the consumer.
 *   random_bits: entropy for the jitter (the caller's RNG; tests pass fixed values).
 */
outcome outcome_decide(apply_status status, unsigned retries_so_far, const retry_policy *policy,
                       uint64_t random_bits);

const char *outcome_label_name(outcome_label label);
const char *error_class_name(error_class cls);
const char *apply_status_name(apply_status status);

#endif
