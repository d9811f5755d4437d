/*
 * assembly — see assembly.h. Thread affinity: the thread that owns the connection.
 */
#include "broker/assembly.h"

#include <stdio.h>

#include "broker/connection.h"

void broker_assembly_init(broker_assembly *a)
{
    *a = (broker_assembly){.state = BROKER_ASSEMBLY_IDLE};
}

void broker_assembly_reset(broker_assembly *a)
{
    broker_message_free(a->msg);
    broker_assembly_init(a);
}

void broker_assembly_begin_delivery(broker_assembly *a, uint64_t delivery_tag,
                                    size_t consumer_index, bool redelivered)
{
    broker_assembly_reset(a);
    a->delivery_tag = delivery_tag;
    a->consumer_index = consumer_index;
    a->redelivered = redelivered;
    a->state = BROKER_ASSEMBLY_HEADER;
}

void broker_assembly_begin_return(broker_assembly *a)
{
    broker_assembly_reset(a);
    a->is_return = true;
    a->state = BROKER_ASSEMBLY_HEADER;
}

/* Hands the finished message over and goes idle. */
static void complete(broker_assembly *a, broker_message **done, bool *returned)
{
    broker_message *msg = a->msg;
    a->msg = NULL;
    msg->delivery_tag = a->delivery_tag;
    msg->consumer_index = a->consumer_index;
    msg->redelivered = a->redelivered;
    *returned = a->is_return;
    *done = msg;
    broker_assembly_init(a);
}

static int fail(broker_assembly *a, const char *why, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s", why);
    broker_assembly_reset(a);
    return BROKER_E_FAILED;
}

int broker_assembly_add_frame(broker_assembly *a, const amqp_frame_t *frame, size_t keep_max,
                              broker_message **done, bool *returned, char *err, size_t err_len)
{
    *done = NULL;
    *returned = false;
    if (frame->frame_type == AMQP_FRAME_HEADER) {
        if (a->state != BROKER_ASSEMBLY_HEADER)
            return fail(a, "unexpected content header frame", err, err_len);
        uint64_t body_size = frame->payload.properties.body_size;
        /* A returned copy is only matched by its headers; a delivery keeps at most keep_max
         * bytes, so prefetch × max_body bounds what deliveries can hold. */
        a->msg = broker_message_new(frame->payload.properties.decoded, body_size,
                                    a->is_return ? 0 : keep_max);
        if (!a->msg)
            return fail(a, "out of memory copying a delivery", err, err_len);
        if (body_size == 0)
            complete(a, done, returned);
        else
            a->state = BROKER_ASSEMBLY_BODY;
        return 0;
    }
    if (frame->frame_type == AMQP_FRAME_BODY) {
        bool overrun = false;
        if (a->state != BROKER_ASSEMBLY_BODY)
            return fail(a, "unexpected body frame", err, err_len);
        bool finished = broker_message_add_body(a->msg, frame->payload.body_fragment, &overrun);
        if (overrun)
            return fail(a, "a body frame longer than its content header announced", err, err_len);
        if (finished)
            complete(a, done, returned);
        return 0;
    }
    return 0;
}
