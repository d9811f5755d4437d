/*
 * Unit tests for adapter/ops/sd_notify: the exact datagrams a service manager receives, at a
 * socket path and at an abstract name, nothing without $NOTIFY_SOCKET, and a send that fails
 * being reported without stopping anything. The "manager" is a datagram socket bound here.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ops/sd_notify.h"

typedef struct manager {
    int fd;
    char path[108]; /* empty for an abstract name */
} manager;

/* Binds a datagram socket at name ('@' first: abstract) and sets NOTIFY_SOCKET to it. */
static void manager_bind(manager *m, const char *name)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(name);
    cr_assert(len < sizeof addr.sun_path);
    memcpy(addr.sun_path, name, len);
    socklen_t addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    m->path[0] = '\0';
    if (name[0] == '@')
        addr.sun_path[0] = '\0';
    else {
        snprintf(m->path, sizeof m->path, "%s", name);
        unlink(name);
        addr_len++;
    }
    m->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(m->fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(bind(m->fd, (struct sockaddr *)&addr, addr_len), 0, "bind %s: %s", name,
                 strerror(errno));
    cr_assert_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
}

static void manager_close(manager *m)
{
    close(m->fd);
    if (m->path[0])
        unlink(m->path);
    unsetenv("NOTIFY_SOCKET");
}

/* The next datagram, as a string; fails the test if none is waiting. */
static void manager_expect(manager *m, const char *expected)
{
    char buf[512];
    ssize_t got = recv(m->fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    cr_assert(got >= 0, "no datagram (expected \"%s\"): %s", expected, strerror(errno));
    buf[got] = '\0';
    cr_assert_str_eq(buf, expected);
}

static void manager_expect_nothing(manager *m)
{
    char buf[16];
    cr_assert_lt(recv(m->fd, buf, sizeof buf, MSG_DONTWAIT), 0, "an unexpected datagram came");
}

static void socket_path(char *buf, size_t len, const char *tag)
{
    snprintf(buf, len, "/tmp/idemq-sd-notify-%ld-%s", (long)getpid(), tag);
}

Test(sd_notify, sends_each_state_as_one_datagram_to_a_path)
{
    char path[108];
    socket_path(path, sizeof path, "path");
    manager m;
    manager_bind(&m, path);
    sd_notify n;
    char err[256] = "";
    cr_assert_eq(sd_notify_init(&n, err, sizeof err), 0, "%s", err);
    cr_assert(sd_notify_enabled(&n));
    cr_assert_eq(sd_notify_send(&n, "READY=1\nSTATUS=consuming from 2 queue(s)"), 0);
    cr_assert_eq(sd_notify_send(&n, "STOPPING=1"), 0);
    manager_expect(&m, "READY=1\nSTATUS=consuming from 2 queue(s)");
    manager_expect(&m, "STOPPING=1");
    manager_expect_nothing(&m);
    sd_notify_close(&n);
    sd_notify_close(&n); /* twice is harmless */
    cr_assert_not(sd_notify_enabled(&n));
    manager_close(&m);
}

/* '@' names the abstract namespace: the address is a NUL and the name, without a terminator. */
Test(sd_notify, sends_to_an_abstract_name)
{
    char name[108];
    snprintf(name, sizeof name, "@idemq-sd-notify-%ld", (long)getpid());
    manager m;
    manager_bind(&m, name);
    sd_notify n;
    cr_assert_eq(sd_notify_init(&n, NULL, 0), 0);
    cr_assert_eq(sd_notify_send(&n, "READY=1"), 0);
    manager_expect(&m, "READY=1");
    sd_notify_close(&n);
    manager_close(&m);
}

Test(sd_notify, does_nothing_without_notify_socket)
{
    unsetenv("NOTIFY_SOCKET");
    sd_notify n;
    cr_assert_eq(sd_notify_init(&n, NULL, 0), 0);
    cr_assert_not(sd_notify_enabled(&n));
    cr_assert_eq(sd_notify_send(&n, "READY=1"), 0);
    sd_notify_close(&n);
    cr_assert_eq(setenv("NOTIFY_SOCKET", "", 1), 0); /* set but empty: the same */
    cr_assert_eq(sd_notify_init(&n, NULL, 0), 0);
    cr_assert_not(sd_notify_enabled(&n));
    sd_notify_close(&n);
    unsetenv("NOTIFY_SOCKET");
}

Test(sd_notify, refuses_an_unusable_notify_socket)
{
    static const char *const bad[] = {"relative/path", "vsock:2:1234", NULL};
    char err[256];
    sd_notify n;
    for (size_t i = 0; bad[i]; i++) {
        cr_assert_eq(setenv("NOTIFY_SOCKET", bad[i], 1), 0);
        err[0] = '\0';
        cr_assert_eq(sd_notify_init(&n, err, sizeof err), -1, "%s", bad[i]);
        cr_assert(strstr(err, "NOTIFY_SOCKET"), "%s: %s", bad[i], err);
        cr_assert_not(sd_notify_enabled(&n));
        cr_assert_eq(sd_notify_send(&n, "READY=1"), 0);
        sd_notify_close(&n);
    }
    char too_long[200];
    memset(too_long, 'x', sizeof too_long - 1);
    too_long[0] = '/';
    too_long[sizeof too_long - 1] = '\0';
    cr_assert_eq(setenv("NOTIFY_SOCKET", too_long, 1), 0);
    cr_assert_eq(sd_notify_init(&n, err, sizeof err), -1);
    cr_assert(strstr(err, "long"), "%s", err);
    sd_notify_close(&n);
    unsetenv("NOTIFY_SOCKET");
}

/* Nobody listens: every send reports the error (logged once, see sd_notify.h), none is fatal. */
Test(sd_notify, a_failed_send_returns_the_error)
{
    char path[108];
    socket_path(path, sizeof path, "absent");
    unlink(path);
    cr_assert_eq(setenv("NOTIFY_SOCKET", path, 1), 0);
    sd_notify n;
    cr_assert_eq(sd_notify_init(&n, NULL, 0), 0);
    cr_assert(sd_notify_enabled(&n));
    cr_assert_eq(sd_notify_send(&n, "READY=1"), -ENOENT);
    cr_assert(n.failure_logged);
    cr_assert_eq(sd_notify_send(&n, "STOPPING=1"), -ENOENT);
    sd_notify_close(&n);
    unsetenv("NOTIFY_SOCKET");
}
