/*
 * Delivery assembly limits: a body is kept to the receiver's limit from its content header on,
 * whatever size the header announces, and body frames are checked against the announced size.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "broker/message.h"

static amqp_bytes_t text(const char *s)
{
    return (amqp_bytes_t){.len = strlen(s), .bytes = (void *)s};
}

Test(message, a_body_within_the_limit_is_kept_whole)
{
    amqp_basic_properties_t props = {0};
    broker_message *msg = broker_message_new(&props, 10, 16);
    cr_assert(msg);
    bool overrun = true;
    cr_expect(!broker_message_add_body(msg, text("hello"), &overrun));
    cr_expect(!overrun);
    cr_expect(broker_message_add_body(msg, text("world"), &overrun));
    cr_expect(!broker_message_truncated(msg));
    cr_expect_eq(msg->body_len, 10);
    cr_expect(memcmp(msg->body, "helloworld", 10) == 0);
    broker_message_free(msg);
}

Test(message, an_announced_size_far_over_the_limit_allocates_only_the_limit)
{
    amqp_basic_properties_t props = {0};
    /* A hostile header: 16 EiB. Allocating it would fail (or worse); only 8 bytes are kept. */
    broker_message *msg = broker_message_new(&props, UINT64_MAX / 2, 8);
    cr_assert(msg, "the announced size must not decide the allocation");
    cr_expect_eq(msg->body_len, 8);
    cr_expect(broker_message_truncated(msg));
    broker_message_free(msg);
}

Test(message, a_body_over_the_limit_keeps_its_first_bytes_and_completes_on_the_last_frame)
{
    amqp_basic_properties_t props = {0};
    broker_message *msg = broker_message_new(&props, 12, 5);
    cr_assert(msg);
    bool overrun = true;
    cr_expect(!broker_message_add_body(msg, text("abc"), &overrun));
    cr_expect(!broker_message_add_body(msg, text("defg"), &overrun));
    cr_expect(broker_message_add_body(msg, text("hijkl"), &overrun), "12 of 12 bytes arrived");
    cr_expect(!overrun);
    cr_expect_eq(msg->body_received, 5);
    cr_expect(memcmp(msg->body, "abcde", 5) == 0);
    cr_expect(broker_message_truncated(msg));
    cr_expect_eq(msg->announced_len, 12);
    broker_message_free(msg);
}

Test(message, a_frame_longer_than_announced_is_an_overrun)
{
    amqp_basic_properties_t props = {0};
    broker_message *msg = broker_message_new(&props, 4, 64);
    cr_assert(msg);
    bool overrun = false;
    cr_expect(!broker_message_add_body(msg, text("toolong"), &overrun));
    cr_expect(overrun);
    cr_expect_eq(msg->body_received, 0, "nothing of an overrunning frame is copied");
    broker_message_free(msg);
}
