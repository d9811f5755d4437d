/*
 * Unit tests for adapter/broker/assembly: frames after a basic.deliver or basic.return become one
 * owned message carrying the delivery's tag, consumer and redelivered flag; the body is kept to
 * the limit; frames out of order or longer than announced are protocol errors. No broker: the
 * frames are built here as rabbitmq-c would decode them.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "broker/assembly.h"
#include "broker/connection.h"

static amqp_basic_properties_t props;

static amqp_frame_t header_frame(uint64_t body_size)
{
    amqp_frame_t f = {.frame_type = AMQP_FRAME_HEADER, .channel = 1};
    f.payload.properties.body_size = body_size;
    f.payload.properties.decoded = &props;
    return f;
}

static amqp_frame_t body_frame(const char *text)
{
    amqp_frame_t f = {.frame_type = AMQP_FRAME_BODY, .channel = 1};
    f.payload.body_fragment = (amqp_bytes_t){.len = strlen(text), .bytes = (void *)text};
    return f;
}

Test(assembly, a_delivery_is_complete_when_its_announced_body_arrived)
{
    broker_assembly a;
    broker_message *msg = NULL;
    bool returned = true;
    char err[128];
    broker_assembly_init(&a);
    broker_assembly_begin_delivery(&a, 42, 1, true);
    amqp_frame_t f = header_frame(10);
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    cr_expect_null(msg);
    f = body_frame("hello");
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    cr_expect_null(msg);
    f = body_frame("world");
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    cr_assert_not_null(msg);
    cr_expect(!returned);
    cr_expect_eq(msg->delivery_tag, 42);
    cr_expect_eq(msg->consumer_index, 1);
    cr_expect(msg->redelivered);
    cr_expect(memcmp(msg->body, "helloworld", 10) == 0);
    cr_expect_eq(a.state, BROKER_ASSEMBLY_IDLE);
    broker_message_free(msg);
}

Test(assembly, an_empty_body_completes_at_the_header_and_a_return_keeps_no_body)
{
    broker_assembly a;
    broker_message *msg = NULL;
    bool returned = false;
    char err[128];
    broker_assembly_init(&a);
    broker_assembly_begin_delivery(&a, 7, 0, false);
    amqp_frame_t f = header_frame(0);
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    cr_assert_not_null(msg);
    broker_message_free(msg);

    broker_assembly_begin_return(&a);
    f = header_frame(5);
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    f = body_frame("12345");
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    cr_assert_not_null(msg);
    cr_expect(returned);
    cr_expect_eq(msg->body_len, 0, "a returned copy is matched by its headers only");
    broker_message_free(msg);
}

Test(assembly, frames_out_of_place_are_protocol_errors)
{
    broker_assembly a;
    broker_message *msg = NULL;
    bool returned;
    char err[128];
    broker_assembly_init(&a);
    amqp_frame_t f = header_frame(3);
    cr_expect_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err),
                 BROKER_E_FAILED);
    cr_expect_str_eq(err, "unexpected content header frame");
    f = body_frame("abc");
    cr_expect_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err),
                 BROKER_E_FAILED);
    cr_expect_str_eq(err, "unexpected body frame");

    broker_assembly_begin_delivery(&a, 1, 0, false);
    f = header_frame(3);
    cr_assert_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err), 0);
    f = body_frame("abcd");
    cr_expect_eq(broker_assembly_add_frame(&a, &f, 64, &msg, &returned, err, sizeof err),
                 BROKER_E_FAILED);
    cr_expect_str_eq(err, "a body frame longer than its content header announced");
    cr_expect_null(msg);
    cr_expect_eq(a.state, BROKER_ASSEMBLY_IDLE);
    cr_expect_null(a.msg, "the partial message is dropped");
}
