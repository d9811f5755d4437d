/*
 * seen_keys — see seen_keys.h. Entries live in a ring in the order they were remembered (the
 * oldest goes first, whether it is full or expired), and a chained hash table finds them; each
 * entry keeps its key as "handler_name\0biz_key" so that no two handlers share a key.
 */
#include "run/seen_keys.h"

#include <stdlib.h>
#include <string.h>

#include "util/fnv1a.h"

#define NO_ENTRY ((size_t)-1)

typedef struct entry {
    uint64_t hash;
    uint64_t at_ms;
    char *key; /* owned: handler_name, '\0', biz_key */
    size_t key_len;
    size_t next; /* the next entry of its bucket, or NO_ENTRY */
} entry;

struct seen_keys {
    entry *ring; /* capacity entries; [oldest, oldest + count) mod capacity are live */
    size_t capacity, oldest, count;
    size_t *buckets; /* bucket_count heads, NO_ENTRY when empty */
    size_t bucket_count;
    uint64_t max_age_ms;
};

seen_keys *seen_keys_new(size_t capacity, uint64_t max_age_ms)
{
    if (capacity == 0)
        return NULL;
    seen_keys *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->capacity = capacity;
    k->max_age_ms = max_age_ms;
    k->bucket_count = 1;
    while (k->bucket_count < capacity * 2)
        k->bucket_count *= 2;
    k->ring = calloc(capacity, sizeof *k->ring);
    k->buckets = malloc(k->bucket_count * sizeof *k->buckets);
    if (!k->ring || !k->buckets) {
        seen_keys_free(k);
        return NULL;
    }
    for (size_t b = 0; b < k->bucket_count; b++)
        k->buckets[b] = NO_ENTRY;
    return k;
}

void seen_keys_free(seen_keys *k)
{
    if (!k)
        return;
    for (size_t i = 0; k->ring && i < k->count; i++)
        free(k->ring[(k->oldest + i) % k->capacity].key);
    free(k->ring);
    free(k->buckets);
    free(k);
}

/* "handler_name\0biz_key" in buf (len bytes); false when it does not fit. */
static bool compose(const char *handler_name, const char *biz_key, char *buf, size_t cap,
                    size_t *len)
{
    size_t h = strlen(handler_name), b = strlen(biz_key);
    if (h + 1 + b > cap)
        return false;
    memcpy(buf, handler_name, h);
    buf[h] = '\0';
    memcpy(buf + h + 1, biz_key, b);
    *len = h + 1 + b;
    return true;
}

static entry *find(seen_keys *k, const char *key, size_t len, uint64_t hash)
{
    for (size_t i = k->buckets[hash & (k->bucket_count - 1)]; i != NO_ENTRY; i = k->ring[i].next)
        if (k->ring[i].hash == hash && k->ring[i].key_len == len &&
            memcmp(k->ring[i].key, key, len) == 0)
            return &k->ring[i];
    return NULL;
}

static void drop_oldest(seen_keys *k)
{
    size_t victim = k->oldest;
    size_t *link = &k->buckets[k->ring[victim].hash & (k->bucket_count - 1)];
    while (*link != victim)
        link = &k->ring[*link].next;
    *link = k->ring[victim].next;
    free(k->ring[victim].key);
    k->ring[victim].key = NULL;
    k->oldest = (k->oldest + 1) % k->capacity;
    k->count--;
}

/* Keys are at most 128 (biz_key) + 1 + 64 (handler_name) bytes; anything longer is not held. */
#define KEY_MAX 256

void seen_keys_remember(seen_keys *k, const char *handler_name, const char *biz_key,
                        uint64_t now_ms)
{
    char key[KEY_MAX];
    size_t len;
    if (!k || !compose(handler_name, biz_key, key, sizeof key, &len))
        return;
    uint64_t hash = fnv1a64(key, len);
    /* Expired keys are the oldest ones: once they are gone, a key found is a live one. */
    while (k->count > 0 && now_ms - k->ring[k->oldest].at_ms >= k->max_age_ms)
        drop_oldest(k);
    if (find(k, key, len, hash))
        return;
    if (k->count == k->capacity)
        drop_oldest(k);
    char *copy = malloc(len);
    if (!copy)
        return;
    memcpy(copy, key, len);
    size_t slot = (k->oldest + k->count) % k->capacity;
    size_t *head = &k->buckets[hash & (k->bucket_count - 1)];
    k->ring[slot] =
        (entry){.hash = hash, .at_ms = now_ms, .key = copy, .key_len = len, .next = *head};
    *head = slot;
    k->count++;
}

bool seen_keys_contains(seen_keys *k, const char *handler_name, const char *biz_key,
                        uint64_t now_ms)
{
    char key[KEY_MAX];
    size_t len;
    if (!k || !compose(handler_name, biz_key, key, sizeof key, &len))
        return false;
    const entry *e = find(k, key, len, fnv1a64(key, len));
    return e && now_ms - e->at_ms < k->max_age_ms;
}

size_t seen_keys_count(const seen_keys *k)
{
    return k ? k->count : 0;
}
