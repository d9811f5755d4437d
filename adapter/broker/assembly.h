/*
 * assembly — turns the frames of one delivery (basic.deliver) or one returned publish
 * (basic.return) into an owned broker_message: the method, then a content header, then body
 * frames until the announced size has arrived. The body kept is bounded before anything is
 * allocated (broker_message_new, broker_message_add_body): a delivery keeps at most keep_max bytes
 * whatever its header claims, a returned copy none (only its headers are read). A frame that does
 * not fit what came before is a protocol error: the caller drops the connection.
 *
 * Errors: 0 or BROKER_E_FAILED (util/errors.h), with the reason in the caller's err buffer.
 * Thread affinity: the thread that owns the connection (the session's broker thread, the relay
 * thread, `idemq dlq`'s).
 */
#ifndef IDEMQ_BROKER_ASSEMBLY_H
#define IDEMQ_BROKER_ASSEMBLY_H

#include "broker/amqp_api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/message.h"

typedef enum broker_assembly_state {
    BROKER_ASSEMBLY_IDLE = 0, /* between messages */
    BROKER_ASSEMBLY_HEADER,   /* got basic.deliver / basic.return, waiting for the header frame */
    BROKER_ASSEMBLY_BODY,     /* waiting for body frames */
} broker_assembly_state;

typedef struct broker_assembly {
    broker_assembly_state state;
    bool is_return;        /* a basic.return, not a delivery */
    uint64_t delivery_tag; /* of the basic.deliver */
    size_t consumer_index; /* of the basic.deliver's consumer tag */
    bool redelivered;
    broker_message *msg; /* owned; the message being filled */
} broker_assembly;

/* An idle assembly (caller-owned storage); release what it holds with broker_assembly_reset. */
void broker_assembly_init(broker_assembly *a);

/* Drops a message half assembled (the connection is gone) and goes idle. */
void broker_assembly_reset(broker_assembly *a);

/* A basic.deliver arrived: its content frames follow. */
void broker_assembly_begin_delivery(broker_assembly *a, uint64_t delivery_tag,
                                    size_t consumer_index, bool redelivered);

/* A basic.return arrived: its content frames follow. */
void broker_assembly_begin_return(broker_assembly *a);

/*
 * Takes a content header or body frame (borrowed). Returns 0 and sets *done to the complete
 * message (returned owned; delivery_tag, consumer_index and redelivered filled in, generation
 * left to the caller) and *returned (true for a basic.return), or *done to NULL while more frames
 * are due. Returns BROKER_E_FAILED with *done NULL when the frame does not belong there (no
 * method before it, a body longer than announced) or memory ran out; err says which.
 */
int broker_assembly_add_frame(broker_assembly *a, const amqp_frame_t *frame, size_t keep_max,
                              broker_message **done, bool *returned, char *err, size_t err_len);

#endif
