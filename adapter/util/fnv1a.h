/*
 * fnv1a — the 64-bit FNV-1a hash of a byte range: spread for hash tables and a fingerprint for
 * listings, never a defence against crafted input. Thread affinity: any.
 */
#ifndef IDEMQ_FNV1A_H
#define IDEMQ_FNV1A_H

#include <stddef.h>
#include <stdint.h>

uint64_t fnv1a64(const void *data, size_t len);

#endif
