/*
 * fnv1a — see fnv1a.h.
 */
#include "util/fnv1a.h"

uint64_t fnv1a64(const void *data, size_t len)
{
    const unsigned char *bytes = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ bytes[i]) * 0x100000001b3ull;
    return h;
}
