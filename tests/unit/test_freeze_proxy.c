/*
 * Unit tests for tests/support/freeze_proxy: the proxy other suites use to freeze, reset and
 * refuse real servers. The "server" here is a listening socket of the test's own, so every fault
 * is checked from both ends: what the client sees and what the server sees.
 *
 * A freeze is proved by silence: nothing arrives within a short deadline (300 ms) while the
 * connection stays open, then everything arrives after the thaw. Everything else waits for an
 * event with a deadline.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "freeze_proxy.h"

#define SILENCE_MS 300
#define DEADLINE_MS 5000

static int listen_loopback(unsigned *port)
{
    struct sockaddr_in addr = {.sin_family = AF_INET};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    cr_assert(bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
    cr_assert(listen(fd, 16) == 0);
    cr_assert(getsockname(fd, (struct sockaddr *)&addr, &len) == 0);
    *port = ntohs(addr.sin_port);
    return fd;
}

/* A loopback port nothing listens on (bound, then closed). */
static unsigned closed_port(void)
{
    unsigned port;
    close(listen_loopback(&port));
    return port;
}

/* A blocking connect to 127.0.0.1:port; -1 with errno when it fails. */
static int connect_loopback(unsigned port)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static bool readable_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

static int accept_within(int listener, int ms)
{
    cr_assert(readable_within(listener, ms), "the server got no connection within %d ms", ms);
    int fd = accept(listener, NULL, NULL);
    cr_assert(fd >= 0);
    return fd;
}

/* Reads exactly len bytes within DEADLINE_MS. */
static void read_exactly(int fd, char *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        cr_assert(readable_within(fd, DEADLINE_MS), "only %zu of %zu bytes arrived", got, len);
        ssize_t n = recv(fd, buf + got, len - got, 0);
        cr_assert(n > 0, "connection ended after %zu of %zu bytes (%s)", got, len,
                  n < 0 ? strerror(errno) : "EOF");
        got += (size_t)n;
    }
}

static void send_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        cr_assert(n > 0, "send: %s", strerror(errno));
        buf += n;
        len -= (size_t)n;
    }
}

static void expect_text(int fd, const char *text)
{
    char buf[256] = "";
    size_t len = strlen(text);
    cr_assert(len < sizeof buf);
    read_exactly(fd, buf, len);
    cr_assert_str_eq(buf, text);
}

/* Waits until recv on fd reports the end of the connection: 0 (EOF) or an error. Returns the
 * errno (0 for an EOF). */
static int wait_closed(int fd)
{
    char buf[64];
    for (;;) {
        cr_assert(readable_within(fd, DEADLINE_MS), "the connection did not end");
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0)
            return 0;
        if (n < 0)
            return errno;
    }
}

static bool wait_connections(freeze_proxy *p, size_t expected)
{
    for (int waited = 0; waited < DEADLINE_MS; waited += 10) {
        if (freeze_proxy_connections(p) == expected)
            return true;
        poll(NULL, 0, 10);
    }
    return false;
}

typedef struct setup {
    unsigned server_port;
    int listener;
    freeze_proxy *proxy;
} setup;

/* Whether the proxy holds text from a client within DEADLINE_MS (a send reaches the proxy's
 * socket asynchronously). */
static bool held_within(freeze_proxy *p, const char *text)
{
    for (int waited = 0; waited < DEADLINE_MS; waited += 2) {
        if (freeze_proxy_held_requests_contain(p, text, strlen(text)))
            return true;
        poll(NULL, 0, 2);
    }
    return false;
}

static void start(setup *s)
{
    char err[256];
    s->listener = listen_loopback(&s->server_port);
    cr_assert(freeze_proxy_start("127.0.0.1", s->server_port, &s->proxy, err, sizeof err) == 0,
              "%s", err);
    cr_assert(freeze_proxy_port(s->proxy) != 0);
    cr_assert(freeze_proxy_port(s->proxy) != s->server_port);
}

static void stop(setup *s)
{
    freeze_proxy_free(s->proxy);
    close(s->listener);
}

Test(freeze_proxy, forwards_both_ways_and_passes_half_close_on)
{
    setup s;
    start(&s);
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int server = accept_within(s.listener, DEADLINE_MS);
    send_all(client, "ping", 4);
    expect_text(server, "ping");
    send_all(server, "pong", 4);
    expect_text(client, "pong");

    /* 4 MiB each way at once: more than any buffer on the path, so the proxy must flow-control
     * rather than drop or block. */
    size_t big = 4u << 20;
    char *out = malloc(big), *in = malloc(big);
    cr_assert(out && in);
    for (size_t i = 0; i < big; i++)
        out[i] = (char)(i * 31 + 7);
    size_t sent_c = 0, sent_s = 0, got_c = 0, got_s = 0;
    char *back = malloc(big);
    cr_assert(back);
    while (got_c < big || got_s < big) {
        struct pollfd fds[2] = {
            {.fd = client, .events = (short)(POLLIN | (sent_c < big ? POLLOUT : 0))},
            {.fd = server, .events = (short)(POLLIN | (sent_s < big ? POLLOUT : 0))},
        };
        cr_assert(poll(fds, 2, DEADLINE_MS) > 0, "transfer stalled: client got %zu, server %zu",
                  got_c, got_s);
        if ((fds[0].revents & POLLOUT) && sent_c < big) {
            ssize_t n = send(client, out + sent_c, big - sent_c > 65536 ? 65536 : big - sent_c,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0)
                sent_c += (size_t)n;
        }
        if ((fds[1].revents & POLLOUT) && sent_s < big) {
            ssize_t n = send(server, out + sent_s, big - sent_s > 65536 ? 65536 : big - sent_s,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0)
                sent_s += (size_t)n;
        }
        if (fds[0].revents & POLLIN) {
            ssize_t n = recv(client, back + got_c, big - got_c, MSG_DONTWAIT);
            cr_assert(n != 0, "client saw EOF after %zu bytes", got_c);
            if (n > 0)
                got_c += (size_t)n;
        }
        if (fds[1].revents & POLLIN) {
            ssize_t n = recv(server, in + got_s, big - got_s, MSG_DONTWAIT);
            cr_assert(n != 0, "server saw EOF after %zu bytes", got_s);
            if (n > 0)
                got_s += (size_t)n;
        }
    }
    cr_assert(memcmp(in, out, big) == 0, "client → server bytes differ");
    cr_assert(memcmp(back, out, big) == 0, "server → client bytes differ");
    free(out);
    free(in);
    free(back);

    /* The client stops sending: the server sees EOF but can still answer. */
    cr_assert(shutdown(client, SHUT_WR) == 0);
    cr_assert_eq(wait_closed(server), 0, "the server should see an orderly EOF");
    send_all(server, "bye", 3);
    expect_text(client, "bye");
    close(server);
    cr_assert_eq(wait_closed(client), 0);
    cr_assert(wait_connections(s.proxy, 0), "the finished pair is still open");
    close(client);
    cr_assert_eq(freeze_proxy_accepted(s.proxy), 1);
    stop(&s);
}

Test(freeze_proxy, freeze_holds_every_byte_and_every_connect_until_the_thaw)
{
    setup s;
    start(&s);
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int server = accept_within(s.listener, DEADLINE_MS);
    send_all(client, "a", 1);
    expect_text(server, "a");

    freeze_proxy_freeze(s.proxy);
    freeze_proxy_freeze(s.proxy); /* idempotent */
    send_all(client, "to-server", 9);
    send_all(server, "to-client", 9);
    cr_assert(!readable_within(server, SILENCE_MS), "a byte reached the server while frozen");
    cr_assert(!readable_within(client, SILENCE_MS), "a byte reached the client while frozen");
    /* As with a stopped server, a connect completes in the kernel's backlog, and nothing more. */
    int late = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(late >= 0, "a connect to a frozen proxy should complete: %s", strerror(errno));
    cr_assert(!readable_within(s.listener, SILENCE_MS), "a frozen proxy connected upstream");
    cr_assert_eq(freeze_proxy_accepted(s.proxy), 1);
    cr_assert_eq(freeze_proxy_connections(s.proxy), 1, "the frozen connection must stay open");

    freeze_proxy_thaw(s.proxy);
    expect_text(server, "to-server");
    expect_text(client, "to-client");
    int late_server = accept_within(s.listener, DEADLINE_MS);
    send_all(late, "late", 4);
    expect_text(late_server, "late");
    cr_assert(wait_connections(s.proxy, 2));
    cr_assert_eq(freeze_proxy_accepted(s.proxy), 2);
    close(late);
    close(late_server);
    close(client);
    close(server);
    stop(&s);
}

Test(freeze_proxy, holding_requests_stops_only_what_the_client_sends)
{
    setup s;
    start(&s);
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int server = accept_within(s.listener, DEADLINE_MS);

    freeze_proxy_hold_requests(s.proxy, true);
    freeze_proxy_hold_requests(s.proxy, true); /* idempotent */
    send_all(client, "ack-1", 5);
    /* The server's side still reaches the client while the client's writes are held: what a
     * broker that keeps delivering, but never hears an ack, looks like. */
    send_all(server, "delivery", 8);
    expect_text(client, "delivery");
    cr_assert(!readable_within(server, SILENCE_MS), "a held byte reached the server");
    send_all(client, "ack-2", 5);
    cr_assert_eq(freeze_proxy_connections(s.proxy), 1, "the held connection must stay open");
    /* The test can see what is held: both writes, in order, and nothing else. */
    cr_assert(held_within(s.proxy, "ack-1ack-2"), "the held writes are not reported");
    cr_assert(!freeze_proxy_held_requests_contain(s.proxy, "delivery", 8),
              "the server's bytes are reported as held");

    freeze_proxy_hold_requests(s.proxy, false);
    expect_text(server, "ack-1ack-2");
    cr_assert(!freeze_proxy_held_requests_contain(s.proxy, "ack-1", 5),
              "bytes already forwarded are still reported as held");

    /* Held bytes a drop finds are never delivered: the server sees a reset instead. */
    freeze_proxy_hold_requests(s.proxy, true);
    send_all(client, "lost", 4);
    freeze_proxy_drop(s.proxy);
    cr_assert_eq(wait_closed(server), ECONNRESET, "the server should see a reset, not \"lost\"");
    cr_assert_eq(wait_closed(client), ECONNRESET);
    close(client);
    close(server);
    stop(&s);
}

Test(freeze_proxy, drop_resets_both_ends_and_accepts_again)
{
    setup s;
    start(&s);
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int server = accept_within(s.listener, DEADLINE_MS);
    freeze_proxy_freeze(s.proxy); /* a drop also resets frozen connections */
    freeze_proxy_drop(s.proxy);
    cr_assert_eq(wait_closed(client), ECONNRESET);
    cr_assert_eq(wait_closed(server), ECONNRESET);
    cr_assert_eq(freeze_proxy_connections(s.proxy), 0);
    close(client);
    close(server);

    freeze_proxy_thaw(s.proxy);
    client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    server = accept_within(s.listener, DEADLINE_MS);
    send_all(client, "again", 5);
    expect_text(server, "again");
    close(client);
    close(server);
    stop(&s);
}

Test(freeze_proxy, a_target_that_refuses_resets_the_client_at_once)
{
    setup s;
    start(&s);
    freeze_proxy_set_target(s.proxy, "127.0.0.1", closed_port());
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int error = wait_closed(client);
    cr_assert(error == ECONNRESET || error == 0, "got %s", strerror(error));
    close(client);
    cr_assert(wait_connections(s.proxy, 0));

    freeze_proxy_set_target(s.proxy, "localhost", s.server_port);
    client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int server = accept_within(s.listener, DEADLINE_MS);
    send_all(client, "back", 4);
    expect_text(server, "back");
    close(client);
    close(server);
    stop(&s);
}

Test(freeze_proxy, refuse_closes_the_port_and_listens_again_on_it)
{
    char err[256];
    setup s;
    start(&s);
    int open_client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(open_client >= 0);
    int open_server = accept_within(s.listener, DEADLINE_MS);

    cr_assert(freeze_proxy_refuse(s.proxy, true, err, sizeof err) == 0);
    cr_assert(connect_loopback(freeze_proxy_port(s.proxy)) < 0);
    cr_assert_eq(errno, ECONNREFUSED, "got %s", strerror(errno));
    /* What was accepted before goes on. */
    send_all(open_client, "still", 5);
    expect_text(open_server, "still");

    cr_assert(freeze_proxy_refuse(s.proxy, false, err, sizeof err) == 0, "%s", err);
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0, "no listener after refuse(false): %s", strerror(errno));
    int server = accept_within(s.listener, DEADLINE_MS);
    send_all(client, "open", 4);
    expect_text(server, "open");
    close(client);
    close(server);
    close(open_client);
    close(open_server);
    stop(&s);
}

Test(freeze_proxy, free_while_frozen_with_connections_returns)
{
    setup s;
    start(&s);
    int client = connect_loopback(freeze_proxy_port(s.proxy));
    cr_assert(client >= 0);
    int server = accept_within(s.listener, DEADLINE_MS);
    freeze_proxy_freeze(s.proxy);
    send_all(client, "x", 1);
    stop(&s);
    /* Both ends learn the proxy is gone (the client by a reset: its byte was never read). */
    wait_closed(client);
    cr_assert_eq(wait_closed(server), 0, "the server should see an orderly close");
    close(client);
    close(server);
    freeze_proxy_free(NULL);
}
