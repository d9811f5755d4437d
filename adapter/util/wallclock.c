/*
 * wallclock — see wallclock.h. Thread affinity: any.
 */
#include "util/wallclock.h"

#include <stddef.h>
#include <sys/time.h>

int64_t wallclock_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}
