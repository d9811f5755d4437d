/*
 * test_seen_keys — run/seen_keys.h: what dedup.cache remembers, for how long, and what it forgets
 * first. Pure memory, no servers.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "run/seen_keys.h"

Test(seen_keys, a_remembered_key_is_known_to_its_handler_only)
{
    seen_keys *k = seen_keys_new(8, 1000);
    cr_assert_not_null(k);
    cr_assert_not(seen_keys_contains(k, "pay", "order:1", 0));
    seen_keys_remember(k, "pay", "order:1", 0);
    cr_assert(seen_keys_contains(k, "pay", "order:1", 10));
    cr_assert_not(seen_keys_contains(k, "refund", "order:1", 10), "another handler's key");
    cr_assert_not(seen_keys_contains(k, "pay", "order:2", 10));
    /* The handler and the key are kept apart: "pa" + "yorder:1" is not "pay" + "order:1". */
    cr_assert_not(seen_keys_contains(k, "pa", "yorder:1", 10));
    seen_keys_free(k);
}

Test(seen_keys, a_key_is_trusted_for_max_age_and_not_after)
{
    seen_keys *k = seen_keys_new(8, 1000);
    seen_keys_remember(k, "pay", "order:1", 5000);
    cr_assert(seen_keys_contains(k, "pay", "order:1", 5999));
    cr_assert_not(seen_keys_contains(k, "pay", "order:1", 6000), "expired at max_age");
    /* Remembering it again keeps the first time: the age limit counts from the first commit. */
    seen_keys_remember(k, "pay", "order:2", 5000);
    seen_keys_remember(k, "pay", "order:2", 5900);
    cr_assert_not(seen_keys_contains(k, "pay", "order:2", 6000));
    /* Once expired, the database's next answer makes it trusted again. */
    seen_keys_remember(k, "pay", "order:2", 6100);
    cr_assert(seen_keys_contains(k, "pay", "order:2", 7000));
    cr_assert_eq(seen_keys_count(k), 1, "the expired entries went");
    seen_keys_free(k);
}

Test(seen_keys, a_full_memory_forgets_its_oldest_key_first)
{
    seen_keys *k = seen_keys_new(3, 60000);
    seen_keys_remember(k, "h", "a", 1);
    seen_keys_remember(k, "h", "b", 2);
    seen_keys_remember(k, "h", "c", 3);
    cr_assert_eq(seen_keys_count(k), 3);
    seen_keys_remember(k, "h", "d", 4);
    cr_assert_eq(seen_keys_count(k), 3);
    cr_assert_not(seen_keys_contains(k, "h", "a", 5), "the oldest made room");
    cr_assert(seen_keys_contains(k, "h", "b", 5));
    cr_assert(seen_keys_contains(k, "h", "c", 5));
    cr_assert(seen_keys_contains(k, "h", "d", 5));
    seen_keys_free(k);
}

Test(seen_keys, expired_keys_make_room_before_the_memory_is_full)
{
    seen_keys *k = seen_keys_new(100, 1000);
    for (int i = 0; i < 50; i++) {
        char key[32];
        snprintf(key, sizeof key, "old:%d", i);
        seen_keys_remember(k, "h", key, 0);
    }
    seen_keys_remember(k, "h", "new", 2000);
    cr_assert_eq(seen_keys_count(k), 1, "the 50 expired keys went at the next remember");
    cr_assert(seen_keys_contains(k, "h", "new", 2000));
    seen_keys_free(k);
}

Test(seen_keys, many_keys_through_a_small_memory_keep_the_newest_exactly)
{
    /* Colliding buckets and a ring that wraps many times: the newest `capacity` keys are known,
     * every older one is not. */
    const size_t capacity = 64;
    seen_keys *k = seen_keys_new(capacity, 1000000);
    char key[64];
    for (int i = 0; i < 10000; i++) {
        snprintf(key, sizeof key, "order_id:%d:PAY_SUCCESS", i);
        seen_keys_remember(k, "pay-callback", key, (uint64_t)i);
    }
    cr_assert_eq(seen_keys_count(k), capacity);
    for (int i = 0; i < 10000; i++) {
        snprintf(key, sizeof key, "order_id:%d:PAY_SUCCESS", i);
        cr_assert_eq(seen_keys_contains(k, "pay-callback", key, 10000), i >= 10000 - (int)capacity,
                     "key %d", i);
    }
    seen_keys_free(k);
}

Test(seen_keys, the_longest_keys_fit_and_off_means_nothing_is_known)
{
    char biz_key[129], handler[65];
    memset(biz_key, 'k', 128);
    biz_key[128] = '\0';
    memset(handler, 'h', 64);
    handler[64] = '\0';
    seen_keys *k = seen_keys_new(2, 1000);
    seen_keys_remember(k, handler, biz_key, 0);
    cr_assert(seen_keys_contains(k, handler, biz_key, 1));
    seen_keys_free(k);

    cr_assert_null(seen_keys_new(0, 1000), "capacity 0 is off");
    seen_keys_remember(NULL, "h", "a", 0);
    cr_assert_not(seen_keys_contains(NULL, "h", "a", 0));
    cr_assert_eq(seen_keys_count(NULL), 0);
    seen_keys_free(NULL);
}
