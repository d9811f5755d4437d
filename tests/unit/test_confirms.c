/*
 * Unit tests for adapter/broker/confirms: every publish gets exactly one callback — confirmed,
 * nacked, returned or unknown (a lost channel) — in publish order, with "multiple" acks, and each
 * basic.return is matched to its own publish by the one rule of confirms.h.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker/confirms.h"
#include "broker/connection.h"

#define SLOTS 8

/* ---- the publisher core: outcomes and the one return-matching rule ---- */

static int calls[SLOTS];
static broker_publish_outcome outcomes[SLOTS];
static unsigned return_codes[SLOTS];
static int unmatched_calls;

static void on_outcome(void *arg, broker_publish_outcome outcome, const broker_return *ret)
{
    int slot = (int)(intptr_t)arg;
    calls[slot]++;
    outcomes[slot] = outcome;
    return_codes[slot] = ret ? ret->reply_code : 0;
}

static void on_unmatched(void *ctx, const broker_return *ret)
{
    (void)ctx;
    (void)ret;
    unmatched_calls++;
}

/* A connection whose socket reaches a local listener that never reads: the few small publishes
 * of a test sit in the kernel's buffers, and the answers are fed in by hand. */
static amqp_connection_state_t sink(void)
{
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(listener >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    cr_assert_eq(bind(listener, (struct sockaddr *)&addr, sizeof addr), 0);
    cr_assert_eq(listen(listener, 1), 0);
    cr_assert_eq(getsockname(listener, (struct sockaddr *)&addr, &len), 0);
    amqp_connection_state_t conn = amqp_new_connection();
    cr_assert_not_null(conn);
    amqp_socket_t *sock = amqp_tcp_socket_new(conn);
    cr_assert_not_null(sock);
    cr_assert_eq(amqp_socket_open(sock, "127.0.0.1", ntohs(addr.sin_port)), AMQP_STATUS_OK);
    return conn; /* the listener is left to the test process's exit */
}

static uint64_t publish(broker_confirms *c, amqp_connection_state_t conn, int slot,
                        const char *routing_key, int64_t key)
{
    amqp_basic_properties_t props = {0};
    broker_publish m = {.exchange = amqp_cstring_bytes(""),
                        .routing_key = amqp_cstring_bytes(routing_key),
                        .props = &props,
                        .body = amqp_empty_bytes,
                        .key = key};
    uint64_t seq = 0;
    cr_assert_eq(broker_confirms_publish(c, conn, &m, on_outcome, (void *)(intptr_t)slot, &seq), 0);
    return seq;
}

static void feed(broker_confirms *c, amqp_frame_t *f)
{
    char err[128];
    cr_assert_eq(broker_confirms_frame(c, f, err, sizeof err), 1, "%s", err);
}

static void ack(broker_confirms *c, uint64_t tag, bool multiple, bool acked)
{
    amqp_basic_ack_t a = {.delivery_tag = tag, .multiple = multiple};
    amqp_basic_nack_t n = {.delivery_tag = tag, .multiple = multiple};
    amqp_frame_t f = {.frame_type = AMQP_FRAME_METHOD};
    f.payload.method.id = acked ? AMQP_BASIC_ACK_METHOD : AMQP_BASIC_NACK_METHOD;
    f.payload.method.decoded = acked ? (void *)&a : (void *)&n;
    feed(c, &f);
}

/* basic.return, then its content header (no body); key_header: a header with key, or NULL. */
static void give_back(broker_confirms *c, const char *routing_key, const char *key_header,
                      int64_t key)
{
    amqp_basic_return_t r = {.reply_code = 312,
                             .reply_text = amqp_cstring_bytes("NO_ROUTE"),
                             .exchange = amqp_cstring_bytes(""),
                             .routing_key = amqp_cstring_bytes(routing_key)};
    amqp_frame_t f = {.frame_type = AMQP_FRAME_METHOD};
    f.payload.method.id = AMQP_BASIC_RETURN_METHOD;
    f.payload.method.decoded = &r;
    feed(c, &f);
    amqp_table_entry_t entry = {.key = amqp_cstring_bytes(key_header ? key_header : "x"),
                                .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = key}};
    amqp_basic_properties_t props = {0};
    if (key_header) {
        props._flags = AMQP_BASIC_HEADERS_FLAG;
        props.headers = (amqp_table_t){.num_entries = 1, .entries = &entry};
    }
    amqp_frame_t h = {.frame_type = AMQP_FRAME_HEADER};
    h.payload.properties.class_id = AMQP_BASIC_CLASS;
    h.payload.properties.body_size = 0;
    h.payload.properties.decoded = &props;
    feed(c, &h);
}

Test(publisher, a_return_is_its_publish_even_when_the_acks_are_coalesced)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    publish(&c, conn, 1, "q", 0);
    publish(&c, conn, 2, "gone", 0);
    publish(&c, conn, 3, "gone", 0);
    /* RabbitMQ returns 2 and 3 while handling them, then acks 1..3 in one multiple ack: the ack
     * after a return is not the returned publish's alone. */
    give_back(&c, "gone", NULL, 0);
    give_back(&c, "gone", NULL, 0);
    ack(&c, 3, true, true);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_RETURNED);
    cr_expect_eq(return_codes[2], 312);
    cr_expect_eq(outcomes[3], BROKER_PUBLISH_RETURNED);
    cr_expect_eq(c.pending, 0);
    amqp_destroy_connection(conn);
}

Test(publisher, the_ack_right_after_a_return_may_be_an_earlier_publishs)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    publish(&c, conn, 1, "q.dlq", 0); /* routed: its queue confirms it later */
    publish(&c, conn, 2, "q", 0);     /* unroutable: returned, confirmed at once */
    give_back(&c, "q", NULL, 0);
    ack(&c, 1, false, true); /* sorted: 1 before 2 */
    ack(&c, 2, false, true);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_RETURNED);
    amqp_destroy_connection(conn);
}

Test(publisher, a_return_key_names_the_publish_among_ones_with_the_same_route)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    broker_confirms_set_return_key(&c, "idemq-outbox-id");
    broker_confirms_on_unmatched_return(&c, on_unmatched, NULL);
    publish(&c, conn, 1, "r", 41);
    publish(&c, conn, 2, "r", 42);
    give_back(&c, "r", "idemq-outbox-id", 42);
    give_back(&c, "r", "idemq-outbox-id", 7); /* not one of ours */
    give_back(&c, "r", NULL, 0);              /* no key at all */
    cr_expect_eq(unmatched_calls, 2);
    ack(&c, 2, true, true);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_RETURNED);
    amqp_destroy_connection(conn);
}

Test(publisher, nacks_and_a_lost_channel_have_their_own_outcomes)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    broker_confirms_set_return_key(&c, "k");
    publish(&c, conn, 1, "q", 1);
    publish(&c, conn, 2, "q", 2);
    publish(&c, conn, 3, "q", 3);
    ack(&c, 1, false, false);
    give_back(&c, "q", "k", 3);
    broker_confirms_fail_all(&c);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_NACKED);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_UNKNOWN);
    cr_expect_eq(outcomes[3], BROKER_PUBLISH_UNKNOWN, "returned but never confirmed: unknown");
    for (int i = 1; i <= 3; i++)
        cr_expect_eq(calls[i], 1);
    cr_expect_str_eq(c.return_key, "k", "the return key outlives the channel");
    cr_expect_eq(publish(&c, conn, 4, "q", 4), 1, "numbering restarts");
    broker_confirms_fail_all(&c);
    amqp_destroy_connection(conn);
}

Test(publisher, acks_nacks_and_multiple_resolve_in_publish_order)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    for (int i = 1; i <= 4; i++)
        cr_expect_eq(publish(&c, conn, i, "q", 0), (uint64_t)i);
    ack(&c, 2, false, false); /* nack of 2 alone */
    cr_expect_eq(calls[1], 0);
    cr_expect_eq(calls[2], 1);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_NACKED);
    ack(&c, 3, true, true); /* ack of everything up to 3 */
    cr_expect_eq(calls[1], 1);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(calls[3], 1);
    cr_expect_eq(outcomes[3], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(calls[2], 1, "2 was already resolved");
    cr_expect_eq(c.pending, 1);
    ack(&c, 9, false, true); /* unknown: ignored */
    ack(&c, 4, false, true);
    cr_expect_eq(calls[4], 1);
    cr_expect_eq(c.pending, 0);
    cr_expect_null(c.head);
    cr_expect_null(c.tail);
    amqp_destroy_connection(conn);
}

Test(publisher, a_returned_publish_is_confirmed_as_failed)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    publish(&c, conn, 1, "q", 0);
    publish(&c, conn, 2, "gone", 0);
    give_back(&c, "gone", NULL, 0);
    ack(&c, 2, true, true);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_RETURNED);
    amqp_destroy_connection(conn);
}

Test(publisher, a_lost_channel_fails_every_pending_publish_once_and_restarts_numbering)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    publish(&c, conn, 1, "q", 0);
    publish(&c, conn, 2, "q", 0);
    publish(&c, conn, 3, "q", 0);
    ack(&c, 1, false, true);
    broker_confirms_fail_all(&c);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_CONFIRMED);
    cr_expect_eq(calls[2], 1);
    cr_expect_eq(outcomes[2], BROKER_PUBLISH_UNKNOWN);
    cr_expect_eq(calls[3], 1);
    cr_expect_eq(outcomes[3], BROKER_PUBLISH_UNKNOWN);
    cr_expect_eq(c.pending, 0);
    cr_expect_eq(publish(&c, conn, 4, "q", 0), 1);
    broker_confirms_fail_all(&c);
    cr_expect_eq(calls[4], 1);
    amqp_destroy_connection(conn);
}

Test(publisher, a_returned_publish_that_is_then_nacked_is_returned)
{
    amqp_connection_state_t conn = sink();
    broker_confirms c;
    broker_confirms_init(&c);
    publish(&c, conn, 1, "gone", 0);
    give_back(&c, "gone", NULL, 0);
    ack(&c, 1, false, false);
    cr_expect_eq(calls[1], 1);
    cr_expect_eq(outcomes[1], BROKER_PUBLISH_RETURNED, "the return says why: unroutable");
    cr_expect_eq(return_codes[1], 312);
    amqp_destroy_connection(conn);
}

Test(publisher, a_publish_whose_send_fails_never_calls_back)
{
    /* The peer resets the connection: a send fails once the reset has arrived. */
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(listener >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    cr_assert_eq(bind(listener, (struct sockaddr *)&addr, sizeof addr), 0);
    cr_assert_eq(listen(listener, 1), 0);
    cr_assert_eq(getsockname(listener, (struct sockaddr *)&addr, &len), 0);
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *sock = amqp_tcp_socket_new(conn);
    cr_assert_eq(amqp_socket_open(sock, "127.0.0.1", ntohs(addr.sin_port)), AMQP_STATUS_OK);
    int peer = accept(listener, NULL, NULL);
    cr_assert(peer >= 0);
    struct linger reset = {.l_onoff = 1, .l_linger = 0};
    cr_assert_eq(setsockopt(peer, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
    close(peer);

    broker_confirms c;
    broker_confirms_init(&c);
    amqp_basic_properties_t props = {0};
    broker_publish m = {.exchange = amqp_cstring_bytes(""),
                        .routing_key = amqp_cstring_bytes("q"),
                        .props = &props,
                        .body = amqp_empty_bytes};
    int rc = 0, attempts = 0;
    uint64_t seq = 0;
    /* The first send may still reach the kernel's buffer before the reset is seen. */
    while (rc == 0 && attempts < SLOTS - 1) {
        attempts++;
        rc = broker_confirms_publish(&c, conn, &m, on_outcome, (void *)(intptr_t)attempts, &seq);
    }
    cr_assert_neq(rc, 0, "%d sends to a reset connection all succeeded", attempts);
    cr_assert_neq(seq, 0, "the publish was registered before its send failed");
    cr_expect_eq(c.pending, (size_t)(attempts - 1), "the failed publish is no longer owed");
    broker_confirms_fail_all(&c);
    cr_expect_eq(calls[attempts], 0, "a failed publish's callback ran");
    for (int i = 1; i < attempts; i++)
        cr_expect_eq(calls[i], 1, "publish %d (sent) got %d callbacks", i, calls[i]);
    amqp_destroy_connection(conn);
    close(listener);
}
