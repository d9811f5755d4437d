/*
 * Unit tests for adapter/broker/confirms: every registered publish gets exactly one callback —
 * true for an ack, false for a nack, a return or a lost channel — in publish order, with
 * "multiple" acks and numbering that a cancelled publish does not consume.
 */
#include <criterion/criterion.h>
#include <stdint.h>

#include "broker/confirms.h"

#define SLOTS 8

static int calls[SLOTS];
static bool results[SLOTS];

static void on_confirm(void *arg, bool confirmed)
{
    int slot = (int)(intptr_t)arg;
    calls[slot]++;
    results[slot] = confirmed;
}

static uint64_t push(broker_confirms *c, int slot)
{
    uint64_t seq = 0;
    cr_assert_eq(broker_confirms_push(c, on_confirm, (void *)(intptr_t)slot, &seq), 0);
    return seq;
}

Test(confirms, acks_nacks_and_multiple_resolve_in_publish_order)
{
    broker_confirms c;
    broker_confirms_init(&c);
    for (int i = 1; i <= 4; i++)
        cr_expect_eq(push(&c, i), (uint64_t)i);
    broker_confirms_resolve(&c, 2, false, false); /* nack of 2 alone */
    cr_expect_eq(calls[1], 0);
    cr_expect_eq(calls[2], 1);
    cr_expect(!results[2]);
    broker_confirms_resolve(&c, 3, true, true); /* ack of everything up to 3 */
    cr_expect_eq(calls[1], 1);
    cr_expect(results[1]);
    cr_expect_eq(calls[3], 1);
    cr_expect(results[3]);
    cr_expect_eq(calls[2], 1, "2 was already resolved");
    cr_expect_eq(c.pending, 1);
    broker_confirms_resolve(&c, 9, false, true); /* unknown: ignored */
    broker_confirms_resolve(&c, 4, false, true);
    cr_expect_eq(calls[4], 1);
    cr_expect_eq(c.pending, 0);
    cr_expect_null(c.head);
    cr_expect_null(c.tail);
}

Test(confirms, a_returned_publish_is_confirmed_as_failed)
{
    broker_confirms c;
    broker_confirms_init(&c);
    push(&c, 1);
    push(&c, 2);
    broker_confirms_mark_returned(&c, 2);
    broker_confirms_resolve(&c, 2, true, true);
    cr_expect(results[1]);
    cr_expect(!results[2]);
}

Test(confirms, a_cancelled_push_gives_its_number_back_and_never_calls)
{
    broker_confirms c;
    broker_confirms_init(&c);
    push(&c, 1);
    cr_expect_eq(push(&c, 2), 2);
    broker_confirms_cancel_last(&c);
    cr_expect_eq(push(&c, 3), 2, "the next publish reuses the number");
    broker_confirms_cancel_last(&c);
    broker_confirms_cancel_last(&c);
    cr_expect_eq(c.pending, 0);
    cr_expect_eq(push(&c, 4), 1);
    broker_confirms_resolve(&c, 1, false, true);
    cr_expect_eq(calls[1] + calls[2] + calls[3], 0);
    cr_expect_eq(calls[4], 1);
}

Test(confirms, a_lost_channel_fails_every_pending_publish_once_and_restarts_numbering)
{
    broker_confirms c;
    broker_confirms_init(&c);
    push(&c, 1);
    push(&c, 2);
    push(&c, 3);
    broker_confirms_resolve(&c, 1, false, true);
    broker_confirms_fail_all(&c);
    cr_expect(results[1]);
    cr_expect_eq(calls[2], 1);
    cr_expect(!results[2]);
    cr_expect_eq(calls[3], 1);
    cr_expect(!results[3]);
    cr_expect_eq(c.pending, 0);
    cr_expect_eq(push(&c, 4), 1);
    broker_confirms_fail_all(&c);
    cr_expect_eq(calls[4], 1);
}
