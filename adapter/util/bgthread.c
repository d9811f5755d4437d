/*
 * bgthread — see bgthread.h.
 */
#include "util/bgthread.h"

#include <stdio.h>

int bgthread_init(bgthread *t, const char *what, char *err, size_t err_len)
{
    t->ready = 0;
    atomic_init(&t->stopping, false);
    if (uv_mutex_init(&t->lock) != 0) {
        snprintf(err, err_len, "cannot create %s's lock", what);
        return -1;
    }
    t->ready = 1;
    if (uv_cond_init(&t->wake) != 0) {
        snprintf(err, err_len, "cannot create %s's condition variable", what);
        return -1;
    }
    t->ready = 2;
    return 0;
}

int bgthread_start(bgthread *t, void (*entry)(void *arg), void *arg, const char *what, char *err,
                   size_t err_len)
{
    int rc = uv_thread_create(&t->thread, entry, arg);
    if (rc != 0) {
        snprintf(err, err_len, "cannot start %s: %s", what, uv_strerror(rc));
        return -1;
    }
    t->ready = 3;
    return 0;
}

bool bgthread_wait_until(bgthread *t, uint64_t deadline_ns)
{
    for (uint64_t now = uv_hrtime(); !atomic_load(&t->stopping) && now < deadline_ns;
         now = uv_hrtime())
        uv_cond_timedwait(&t->wake, &t->lock, deadline_ns - now);
    return !atomic_load(&t->stopping);
}

bool bgthread_stopping(bgthread *t)
{
    return atomic_load(&t->stopping);
}

void bgthread_stop_join(bgthread *t, void (*under_lock)(void *arg), void *arg)
{
    if (t->ready < 3)
        return;
    uv_mutex_lock(&t->lock);
    atomic_store(&t->stopping, true);
    if (under_lock)
        under_lock(arg);
    uv_cond_signal(&t->wake);
    uv_mutex_unlock(&t->lock);
    uv_thread_join(&t->thread);
    t->ready = 2;
}

void bgthread_close(bgthread *t)
{
    if (t->ready >= 2)
        uv_cond_destroy(&t->wake);
    if (t->ready >= 1)
        uv_mutex_destroy(&t->lock);
    t->ready = 0;
}
