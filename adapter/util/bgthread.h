/*
 * bgthread — the one lifecycle of a background thread: init (its lock and wake-up condition,
 * every init checked), start, stop (stopping set and the thread woken), join, close. The owner
 * may guard its own state with the same lock. Used by the periodic jobs that sleep between rounds
 * (dedup retention, the database health probe). The threads that wait on sockets rather than a
 * condition (the broker session and the outbox relay poll their fds and an eventfd; the DB pool's
 * workers share one queue) keep their own wait but follow the same order: every init checked,
 * start last, stop then join, then destroy what init made.
 *
 * Errors: 0 or -1 with a reason in err. Thread affinity: init, start, stop, join and close on the
 * owner's thread; wait_until and stopping on the background thread (stopping on any).
 */
#ifndef IDEMQ_BGTHREAD_H
#define IDEMQ_BGTHREAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct bgthread {
    uv_thread_t thread;
    uv_mutex_t lock;
    uv_cond_t wake;
    atomic_bool stopping; /* set under lock; may be read without it (between a job's batches) */
    int ready;            /* what exists: 0 nothing, 1 the lock, 2 and the condition, 3 started */
} bgthread;

/* Creates t's lock and condition. what names the thread in err ("the retention thread"). */
int bgthread_init(bgthread *t, const char *what, char *err, size_t err_len);

/* Runs entry(arg) on a new thread. */
int bgthread_start(bgthread *t, void (*entry)(void *arg), void *arg, const char *what, char *err,
                   size_t err_len);

/* With t->lock held: sleeps until uv_hrtime() reaches deadline_ns or a stop. Returns false once
 * stopping. */
bool bgthread_wait_until(bgthread *t, uint64_t deadline_ns);

bool bgthread_stopping(bgthread *t);

/* Sets stopping, runs under_lock(arg) (NULL: nothing) with the lock held, e.g. to shut a socket
 * the thread is blocked on, wakes the thread and joins it. A thread never started is not joined. */
void bgthread_stop_join(bgthread *t, void (*under_lock)(void *arg), void *arg);

/* Destroys what bgthread_init made; after bgthread_stop_join (or a failed start). */
void bgthread_close(bgthread *t);

#endif
