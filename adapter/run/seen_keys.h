/*
 * seen_keys — the dedup keys this instance saw committed (dedup.cache): a bounded, first-in
 * first-out memory of (handler_name, biz_key) with an age limit, so that a flood of copies of
 * messages already applied is settled as deduped without a database transaction each.
 *
 * Only what the database said goes in: a key whose transaction this instance committed
 * (processed, state_noop) or whose dedup row the database reported committed (deduped). A key not
 * remembered goes to the database as before, whose unique index stays the guard for everything
 * else — another instance's commits, keys older than the age limit or pushed out by newer ones.
 * What the memory cannot see: a dedup row deleted by hand within the age limit (to apply a
 * message again); a copy of that key arriving before the limit is settled as deduped.
 *
 * Errors: seen_keys_new returns NULL out of memory; a remember that cannot allocate is skipped
 * (the key then goes to the database). Thread affinity: one thread (idemq run's loop).
 */
#ifndef IDEMQ_RUN_SEEN_KEYS_H
#define IDEMQ_RUN_SEEN_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct seen_keys seen_keys;

/* A memory of at most capacity keys (>= 1), each trusted for max_age_ms after it was remembered. */
seen_keys *seen_keys_new(size_t capacity, uint64_t max_age_ms);
void seen_keys_free(seen_keys *k);

/* Remembers (handler_name, biz_key), both borrowed, at now_ms; the oldest key makes room when the
 * memory is full. A key still trusted keeps its first time; an expired one is remembered anew. */
void seen_keys_remember(seen_keys *k, const char *handler_name, const char *biz_key,
                        uint64_t now_ms);

/* Whether (handler_name, biz_key) was remembered less than max_age_ms before now_ms. */
bool seen_keys_contains(seen_keys *k, const char *handler_name, const char *biz_key,
                        uint64_t now_ms);

/* Keys held now (expired ones included until they are pushed out). */
size_t seen_keys_count(const seen_keys *k);

#endif
