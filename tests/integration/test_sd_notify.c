/*
 * test_sd_notify — a real `idemq run` under a stand-in for systemd's Type=notify: with
 * NOTIFY_SOCKET set, READY=1 comes only once the consumers are subscribed (after the "started
 * consuming" line, never before), the messages are processed, SIGTERM brings STOPPING=1, and
 * idemq exits 0. The service manager is a datagram socket bound by the test.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DEADLINE_MS 60000
#define PAYMENTS 20

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static int manager_fd = -1;
static char manager_path[108];

static void fini(void)
{
    harness_kill_idemq(&daemon_pid);
    if (h_ready)
        harness_fini(&H);
    h_ready = false;
    if (manager_fd >= 0)
        close(manager_fd);
    manager_fd = -1;
    if (manager_path[0])
        unlink(manager_path);
    unsetenv("NOTIFY_SOCKET");
}

TestSuite(sd_notify, .fini = fini);

/* The datagram socket systemd would listen on; idemq inherits NOTIFY_SOCKET from this process. */
static void bind_manager(void)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(manager_path, sizeof manager_path, "/tmp/idemq-notify-%ld", (long)getpid());
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", manager_path);
    unlink(manager_path);
    manager_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(manager_fd >= 0);
    cr_assert_eq(bind(manager_fd, (struct sockaddr *)&addr, sizeof addr), 0, "bind: %s",
                 strerror(errno));
    cr_assert_eq(setenv("NOTIFY_SOCKET", manager_path, 1), 0);
}

/* The next datagram into buf (NUL-terminated); false when none came within timeout_ms. */
static bool next_datagram(char *buf, size_t len, int timeout_ms)
{
    struct pollfd p = {.fd = manager_fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return false;
    ssize_t got = recv(manager_fd, buf, len - 1, 0);
    cr_assert(got >= 0, "recv: %s", strerror(errno));
    buf[got] = '\0';
    return true;
}

Test(sd_notify, ready_after_consuming_stopping_on_sigterm_then_exit_0, .timeout = 180)
{
    char dgram[512], expected[128];
    bind_manager();
    harness_init(&H, "sd_notify", NULL);
    h_ready = true;
    harness_insert_orders(&H, "n", PAYMENTS, "PAYING");

    daemon_pid = harness_spawn(&H);
    cr_assert(next_datagram(dgram, sizeof dgram, DEADLINE_MS), "no READY=1 within %d ms",
              DEADLINE_MS);
    /* The broker thread logs before it tells the loop, which notifies: the line is there. */
    cr_assert_geq(harness_log_count(&H, "started consuming"), 1,
                  "READY=1 came before idemq consumed: %s", dgram);
    snprintf(expected, sizeof expected, "READY=1\nSTATUS=consuming from 1 queue(s)");
    cr_assert_str_eq(dgram, expected);

    harness_publish_payments(&H, "n", PAYMENTS);
    cr_assert(harness_wait_scalar(&H, PAYMENTS, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"));
    cr_assert_not(next_datagram(dgram, sizeof dgram, 0), "unexpected datagram: %s", dgram);

    kill(daemon_pid, SIGTERM);
    cr_assert(next_datagram(dgram, sizeof dgram, DEADLINE_MS), "no STOPPING=1 after SIGTERM");
    cr_assert(strncmp(dgram, "STOPPING=1\n", 11) == 0, "got: %s", dgram);
    /* Not harness_stop: a second SIGTERM means "exit now" (status 1). */
    int status = harness_wait_exit(daemon_pid, 30000);
    cr_assert_neq(status, -1, "idemq run did not exit within 30 s of SIGTERM");
    daemon_pid = 0;
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "idemq run ended with status 0x%x",
              (unsigned)status);
    cr_expect_not(next_datagram(dgram, sizeof dgram, 0), "unexpected datagram: %s", dgram);
}
