/*
 * wallclock — the wall-clock time in milliseconds since the Unix epoch, as idemq writes it into
 * the idemq-first-failed-at header and reads it back (DLQ ages). Not for measuring intervals:
 * use a monotonic clock (uv_now, uv_hrtime) for those. Thread affinity: any.
 */
#ifndef IDEMQ_WALLCLOCK_H
#define IDEMQ_WALLCLOCK_H

#include <stdint.h>

/* Milliseconds since 1970-01-01T00:00:00Z. */
int64_t wallclock_ms(void);

#endif
