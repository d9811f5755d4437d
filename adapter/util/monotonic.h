/*
 * monotonic — milliseconds on a clock that never jumps (CLOCK_MONOTONIC), for deadlines and
 * intervals on threads that have no libuv loop of their own (the broker and relay threads;
 * a loop thread uses uv_now). The wall clock is wallclock.h. Thread affinity: any.
 */
#ifndef IDEMQ_MONOTONIC_H
#define IDEMQ_MONOTONIC_H

#include <stdint.h>

/* Milliseconds since an arbitrary fixed point (the boot); only differences mean anything. */
int64_t monotonic_ms(void);

#endif
