/*
 * test_health — `idemq health`, the container HEALTHCHECK's probe, run as a process:
 *   - against a real `idemq run` with http.listen (the harness config's 127.0.0.1:0): exit 0 on
 *     its /healthz, by --port, by IDEMQ_HEALTH_PORT and by --url; exit 1 on a path it answers 404;
 *   - nothing listening: exit 1 and "connection refused";
 *   - a socket that accepts (the kernel's backlog does) but never answers: exit 1 and "timed out"
 *     after --timeout, not later;
 *   - usage problems exit 2 before probing anything.
 * Only the first test needs the servers; the others stand in for idemq with a bare socket.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static harness_fixture fixture;
#define H (fixture.h)

/* A harness with only a scratch folder: enough for harness_run_cli, no server touched. */
static harness bare;
static bool bare_ready;

static void bare_init(void)
{
    snprintf(bare.dir, sizeof bare.dir, "/tmp/idemq-health-XXXXXX");
    cr_assert(mkdtemp(bare.dir), "mkdtemp: %s", strerror(errno));
    bare_ready = true;
}

static void teardown(void)
{
    harness_fixture_fini(&fixture);
    if (bare_ready) {
        char path[400];
        snprintf(path, sizeof path, "%s/cli.out", bare.dir);
        unlink(path);
        rmdir(bare.dir);
        bare_ready = false;
    }
}

static void setup(void)
{
    /* The probe reads it when there is no --port: the tests decide what it holds. */
    unsetenv("IDEMQ_HEALTH_PORT");
}

TestSuite(health, .init = setup, .fini = teardown);

/* A loopback TCP socket on an ephemeral port; listening (backlog 8) when listening is set. */
static int loopback_socket(bool listening, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s", strerror(errno));
    socklen_t len = sizeof sa;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    if (listening)
        cr_assert_eq(listen(fd, 8), 0, "listen: %s", strerror(errno));
    *port = ntohs(sa.sin_port);
    return fd;
}

static int health(harness *h, char **output, const char *const *args)
{
    const char *argv[8] = {"health"};
    for (size_t i = 0; args[i] && i + 2 < sizeof argv / sizeof argv[0]; i++)
        argv[i + 1] = args[i];
    return harness_run_cli(h, output, argv);
}

Test(health, exit_0_on_a_running_idemq_and_1_on_another_status, .timeout = 120)
{
    harness_fixture_init(&fixture, "health_daemon", &(harness_options){0});
    harness_fixture_start(&fixture, "started consuming", 20000);
    int port = harness_http_port(&H, 10000);
    char port_text[16], url[96], url_404[96];
    snprintf(port_text, sizeof port_text, "%d", port);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", port);
    snprintf(url_404, sizeof url_404, "http://127.0.0.1:%d/no-such-path", port);

    char *out = NULL;
    int rc = health(&H, &out, (const char *[]){"--port", port_text, NULL});
    cr_expect_eq(rc, 0, "idemq health --port %d exited %d:\n%s", port, rc, out);
    cr_expect(strstr(out, "200"), "no 200 in the success line:\n%s", out);
    free(out);

    setenv("IDEMQ_HEALTH_PORT", port_text, 1);
    rc = health(&H, &out, (const char *[]){NULL});
    unsetenv("IDEMQ_HEALTH_PORT");
    cr_expect_eq(rc, 0, "IDEMQ_HEALTH_PORT=%d idemq health exited %d:\n%s", port, rc, out);
    free(out);

    rc = health(&H, &out, (const char *[]){"--url", url, NULL});
    cr_expect_eq(rc, 0, "idemq health --url %s exited %d:\n%s", url, rc, out);
    free(out);

    rc = health(&H, &out, (const char *[]){"--url", url_404, NULL});
    cr_expect_eq(rc, 1, "a 404 must be unhealthy (exit 1), got %d:\n%s", rc, out);
    cr_expect(strstr(out, "404") && strstr(out, "not 200"), "the line does not say 404:\n%s", out);
    cr_expect_eq(strchr(out, '\n'), out + strlen(out) - 1, "more than one line:\n%s", out);
    free(out);

    harness_stop_idemq(&fixture.daemon);
}

Test(health, exit_1_when_nothing_listens)
{
    bare_init();
    int port;
    close(loopback_socket(false, &port)); /* a port the kernel just gave out, now closed */
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    char *out = NULL;
    int rc = health(&bare, &out, (const char *[]){"--port", port_text, NULL});
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "connection refused"), "the line does not say refused:\n%s", out);
    cr_expect(strstr(out, port_text), "the line does not name the port:\n%s", out);
    free(out);
}

Test(health, exit_1_on_a_server_that_never_answers, .timeout = 30)
{
    bare_init();
    int port;
    int fd = loopback_socket(true, &port); /* accepts in the backlog, never reads or writes */
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    setenv("IDEMQ_HEALTH_PORT", port_text, 1);
    char *out = NULL;
    int64_t t0 = harness_now_ms();
    int rc = health(&bare, &out, (const char *[]){"--timeout", "700ms", NULL});
    int64_t took = harness_now_ms() - t0;
    unsetenv("IDEMQ_HEALTH_PORT");
    close(fd);
    cr_expect_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "timed out"), "the line does not say timed out:\n%s", out);
    cr_expect(took >= 650 && took < 5000, "gave up after %lld ms, --timeout was 700ms",
              (long long)took);
    free(out);
}

Test(health, usage_problems_exit_2)
{
    bare_init();
    const char *const *cases[] = {
        (const char *[]){"--port", "0", NULL},
        (const char *[]){"--port", "65536", NULL},
        (const char *[]){"--timeout", "0", NULL},
        (const char *[]){"--url", "https://127.0.0.1/healthz", NULL},
        (const char *[]){"--url", "http://127.0.0.1:1", "--port", "2", NULL},
        (const char *[]){"--queue", "q", NULL},
        (const char *[]){"-c", "/etc/idemq/idemq.yaml", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = health(&bare, &out, cases[i]);
        cr_expect_eq(rc, 2, "idemq health %s %s: exit %d:\n%s", cases[i][0],
                     cases[i][1] ? cases[i][1] : "", rc, out);
        free(out);
    }
    setenv("IDEMQ_HEALTH_PORT", "nine", 1);
    char *out = NULL;
    int rc = health(&bare, &out, (const char *[]){NULL});
    unsetenv("IDEMQ_HEALTH_PORT");
    cr_expect_eq(rc, 2, "IDEMQ_HEALTH_PORT=nine: exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "IDEMQ_HEALTH_PORT"), "the line does not name the variable:\n%s", out);
    free(out);
}
