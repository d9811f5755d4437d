/*
 * confirms — the publisher confirms a confirm-mode channel still owes, in publish order. The
 * broker numbers every publish on such a channel from 1 and later acks or nacks each number (or
 * every number up to one, "multiple"); each registered callback runs exactly once: with true for
 * an ack of a publish that was not returned as unroutable (mandatory), with false for a nack, a
 * return, or a channel that went away first.
 *
 * Errors: 0 or BROKER_E_FAILED (util/errors.h). Thread affinity: the thread that owns the
 * connection (the loop thread); callbacks run on it, from inside these calls.
 */
#ifndef IDEMQ_BROKER_CONFIRMS_H
#define IDEMQ_BROKER_CONFIRMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Runs once per accepted publish: confirmed is true only for a broker ack without a return. */
typedef void (*broker_confirm_cb)(void *arg, bool confirmed);

typedef struct broker_pending_confirm broker_pending_confirm;

typedef struct broker_confirms {
    broker_pending_confirm *head, *tail; /* owned */
    size_t pending;                      /* entries between head and tail */
    uint64_t next_seq;                   /* the number the next publish gets */
} broker_confirms;

/* Empty, the next publish numbered 1 (caller-owned storage; release with
 * broker_confirms_fail_all). */
void broker_confirms_init(broker_confirms *c);

/* Registers cb(arg) for the next publish and returns its number in *seq; send the publish next.
 * Returns 0, or BROKER_E_FAILED when out of memory (nothing registered, cb never runs). */
int broker_confirms_push(broker_confirms *c, broker_confirm_cb cb, void *arg, uint64_t *seq);

/* Takes back the last push, whose publish could not be sent: its number is reused and its
 * callback never runs. */
void broker_confirms_cancel_last(broker_confirms *c);

/* The broker acked (acked) or nacked publish tag, or every publish up to it (multiple): runs
 * their callbacks. Unknown numbers are ignored. */
void broker_confirms_resolve(broker_confirms *c, uint64_t tag, bool multiple, bool acked);

/* The broker returned publish seq as unroutable: its confirm, when it comes, counts as failed. */
void broker_confirms_mark_returned(broker_confirms *c, uint64_t seq);

/* The channel is gone: runs every pending callback with false; numbering restarts at 1. */
void broker_confirms_fail_all(broker_confirms *c);

#endif
