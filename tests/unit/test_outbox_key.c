/*
 * test_outbox_key — the outbox's derived biz_key (outbox_derive_key, adapter/outbox/writer.c),
 * checked against vectors computed outside C (printf of the length-prefixed parts piped into
 * sha256sum, see the comment above the vectors), so the test does not trust the code's own idea of the
 * format. Server-free; the writer's rows, which need MariaDB, are tested by
 * tests/integration/test_outbox_writer.c.
 *
 * Thread affinity: Criterion runs each test in its own process; nothing here is shared.
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "outbox/writer.h"

/* ------------------------------------------------------------------------- derived keys */

/*
 * Vectors: sha256 of each part preceded by its length as 8 bytes little-endian, e.g.
 *   le() { printf "$(printf '\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00\\x00' $1)"; }
 *   { le 23; printf 'order_id:o1:PAY_SUCCESS'; le 12; printf 'pay-callback';
 *     le 4; printf 'paid'; } | sha256sum
 * (the 300-byte part's length is written by hand: \x2c\x01\0\0\0\0\0\0).
 */
typedef struct key_vector {
    const char *source, *handler, *emit, *hex;
} key_vector;

static char k300[301];

static const char *long_source(void)
{
    memset(k300, 'k', 300);
    k300[300] = '\0';
    return k300;
}

Test(outbox_key, matches_the_length_prefixed_sha256_vectors)
{
    const key_vector vectors[] = {
        {"order_id:o1:PAY_SUCCESS", "pay-callback", "paid",
         "5af2b4d4b22eb820ff519cb5fd3988d3a4d74f3ca1989e3be2bc6d1d4b15c58d"},
        {"a", "bc", "x", "f174d556a612193b5922f434d17bb43283eac77794df2a7d0a0b2cfb359753d9"},
        {"ab", "c", "x", "32d0a24710cb12840c723d7057c734f89779c8e3994b5df958b6e7ddcb37c17e"},
        {"", "", "", "9d908ecfb6b256def8b49a7c504e6c889c4b0e41fe6ce3e01863dd7b61a20aa0"},
        {long_source(), "h", "e",
         "6b451ae2398387e8213d232923d1501e9a8f03fa3beba5ff27ac33ee5f21f163"},
    };
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        char key[OUTBOX_KEY_LEN + 1];
        char want[OUTBOX_KEY_LEN + 1];
        memset(key, 'Z', sizeof key);
        outbox_derive_key(vectors[i].source, vectors[i].handler, vectors[i].emit, key);
        snprintf(want, sizeof want, "emit-%s", vectors[i].hex);
        cr_expect_str_eq(key, want, "vector %zu", i);
        cr_expect_eq(strlen(key), OUTBOX_KEY_LEN, "vector %zu: NUL right after the hex", i);
    }
}

Test(outbox_key, is_deterministic_and_separates_every_part)
{
    char a[OUTBOX_KEY_LEN + 1], b[OUTBOX_KEY_LEN + 1];
    outbox_derive_key("order_id:o1:PAY_SUCCESS", "pay-callback", "paid", a);
    outbox_derive_key("order_id:o1:PAY_SUCCESS", "pay-callback", "paid", b);
    cr_assert_str_eq(a, b, "one input, one key");
    cr_assert_eq(strncmp(a, OUTBOX_KEY_PREFIX, strlen(OUTBOX_KEY_PREFIX)), 0);
    for (const char *p = a + strlen(OUTBOX_KEY_PREFIX); *p; p++)
        cr_assert(isxdigit((unsigned char)*p) && !isupper((unsigned char)*p), "lowercase hex: %s",
                  a);

    /* Each part matters, and a byte moved from one part to the next gives another key. */
    const char *const triples[][3] = {
        {"order_id:o1:PAY_SUCCESS", "pay-callback", "paid"},
        {"order_id:o2:PAY_SUCCESS", "pay-callback", "paid"},
        {"order_id:o1:PAY_SUCCESS", "pay-callbacK", "paid"},
        {"order_id:o1:PAY_SUCCESS", "pay-callback", "paid2"},
        {"a", "bc", "x"},
        {"ab", "c", "x"},
        {"a", "b", "cx"},
        {"abcx", "", ""},
        {"", "", "abcx"},
    };
    size_t n = sizeof triples / sizeof triples[0];
    char keys[sizeof triples / sizeof triples[0]][OUTBOX_KEY_LEN + 1];
    for (size_t i = 0; i < n; i++)
        outbox_derive_key(triples[i][0], triples[i][1], triples[i][2], keys[i]);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            cr_expect_str_neq(keys[i], keys[j], "(%s,%s,%s) and (%s,%s,%s) derive one key",
                              triples[i][0], triples[i][1], triples[i][2], triples[j][0],
                              triples[j][1], triples[j][2]);
}
