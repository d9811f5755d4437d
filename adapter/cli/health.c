/*
 * health — `idemq health`: one GET of a running idemq's /healthz, so that a container
 * HEALTHCHECK works in an image that has no shell and no HTTP client. Plain POSIX sockets, one
 * deadline for connect, request and status line (poll on a non-blocking socket), one status
 * line read: nothing here is worth a library.
 *
 * Exit codes follow Docker's HEALTHCHECK rather than only idemq's: 0 healthy, 1 unhealthy, and
 * 2 (which Docker reserves) only for a command line that cannot probe anything. Each failure
 * prints one line that says what happened, since that line is what `docker inspect` shows the
 * operator. Thread affinity: the main thread.
 */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config/units.h"
#include "util/monotonic.h"

/* The status line and a little more: the probe never needs the headers or the body. */
#define STATUS_LINE_MAX 256

int cli_health_parse_url(const char *url, health_target *out, char *err, size_t err_len)
{
    static const char scheme[] = "http://";
    if (strncasecmp(url, scheme, sizeof scheme - 1) != 0) {
        /* The ops endpoint speaks plain HTTP only (ops/http_server.c). */
        snprintf(err, err_len, "--url must start with http:// (got \"%s\")", url);
        return -1;
    }
    const char *host = url + sizeof scheme - 1, *host_end, *rest;
    if (*host == '[') {
        host++;
        host_end = strchr(host, ']');
        if (!host_end) {
            snprintf(err, err_len, "--url: no ']' after the IPv6 address in \"%s\"", url);
            return -1;
        }
        rest = host_end + 1;
    } else {
        host_end = host + strcspn(host, ":/?#");
        rest = host_end;
    }
    size_t host_len = (size_t)(host_end - host);
    if (host_len == 0 || host_len >= sizeof out->host) {
        snprintf(err, err_len, "--url: no host (or one too long) in \"%s\"", url);
        return -1;
    }
    memcpy(out->host, host, host_len);
    out->host[host_len] = '\0';

    snprintf(out->port, sizeof out->port, "80");
    if (*rest == ':') {
        const char *digits = rest + 1;
        size_t n = strspn(digits, "0123456789");
        long port = n > 0 && n <= 5 ? strtol(digits, NULL, 10) : 0;
        if (port < 1 || port > 65535 || (digits[n] != '\0' && digits[n] != '/')) {
            snprintf(err, err_len, "--url: the port must be 1..65535 in \"%s\"", url);
            return -1;
        }
        snprintf(out->port, sizeof out->port, "%ld", port);
        rest = digits + n;
    } else if (*rest != '\0' && *rest != '/') {
        snprintf(err, err_len, "--url: unexpected '%c' after the host in \"%s\"", *rest, url);
        return -1;
    }

    const char *path = *rest ? rest : "/";
    /* The path goes into the request line as it is: a space or a line break would make it
     * another request. */
    if (strlen(path) >= sizeof out->path || strpbrk(path, " \t\r\n")) {
        snprintf(err, err_len, "--url: the path is too long or holds white space in \"%s\"", url);
        return -1;
    }
    snprintf(out->path, sizeof out->path, "%s", path);
    return 0;
}

int cli_health_status_code(const char *line, size_t len)
{
    /* "HTTP/1.x NNN": the reason phrase is optional and the code is exactly three digits. */
    if (len < 12 || memcmp(line, "HTTP/1.", 7) != 0 || line[7] < '0' || line[7] > '9' ||
        line[8] != ' ')
        return -1;
    int code = 0;
    for (size_t i = 9; i < 12; i++) {
        if (line[i] < '0' || line[i] > '9')
            return -1;
        code = code * 10 + (line[i] - '0');
    }
    if (len > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n')
        return -1;
    return code < 100 ? -1 : code;
}

/* Waits until fd is ready for events or the deadline (monotonic ms) passes. Returns 1 ready, 0
 * timed out, -1 on a poll error (errno set). */
static int wait_ready(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - monotonic_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* Connects to one address before the deadline. Returns the socket, or -1 with what happened
 * in err ("connection refused", "timed out"). */
static int connect_one(const struct addrinfo *ai, int64_t deadline, char *err, size_t err_len)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    int e = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        e = errno;
        if (e == EINPROGRESS || e == EINTR) { /* EINTR: the connect goes on anyway */
            int ready = wait_ready(fd, POLLOUT, deadline);
            socklen_t len = sizeof e;
            if (ready == 0) {
                snprintf(err, err_len, "timed out while connecting");
                close(fd);
                return -1;
            }
            if (ready < 0)
                e = errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
                e = errno;
        }
    }
    if (e != 0) {
        snprintf(err, err_len, "%s",
                 e == ECONNREFUSED ? "connection refused (nothing listens there: is idemq "
                                     "running, with http.listen on that port?)"
                                   : strerror(e));
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends all of buf before the deadline. Returns 0, or -1 with err set. */
static int send_all(int fd, const char *buf, size_t len, int64_t deadline, char *err,
                    size_t err_len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            snprintf(err, err_len, "sending the request: %s", strerror(errno));
            return -1;
        }
        if (wait_ready(fd, POLLOUT, deadline) <= 0) {
            snprintf(err, err_len, "timed out while sending the request");
            return -1;
        }
    }
    return 0;
}

/* Reads until the first line break, EOF or a full buffer, before the deadline. Returns the
 * bytes read (buf NUL-terminated), or -1 with err set. */
static ssize_t read_status_line(int fd, char *buf, size_t cap, int64_t deadline, char *err,
                                size_t err_len)
{
    size_t len = 0;
    while (len + 1 < cap && !memchr(buf, '\n', len)) {
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n > 0) {
            len += (size_t)n;
            continue;
        }
        if (n == 0)
            break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            snprintf(err, err_len, "reading the answer: %s", strerror(errno));
            return -1;
        }
        int ready = wait_ready(fd, POLLIN, deadline);
        if (ready <= 0) {
            snprintf(err, err_len, "%s",
                     len ? "timed out in the middle of the status line"
                         : "connected, but no answer came (timed out waiting for the status "
                           "line)");
            return -1;
        }
    }
    buf[len] = '\0';
    return (ssize_t)len;
}

/* Copies the first line of text into out, printable ASCII only: it goes into one log line. */
static void first_line(const char *text, char *out, size_t out_len)
{
    size_t n = 0;
    for (; text[n] && text[n] != '\r' && text[n] != '\n' && n + 1 < out_len; n++)
        out[n] = text[n] >= 0x20 && text[n] < 0x7f ? text[n] : '?';
    out[n] = '\0';
}

/* The probe's port without --url: --port, else IDEMQ_HEALTH_PORT, else the default. Returns 0,
 * or -1 with err set when IDEMQ_HEALTH_PORT is not a port. */
static int probe_port(const health_options *opts, char *port, size_t port_len, char *err,
                      size_t err_len)
{
    unsigned value = opts->port ? opts->port : HEALTH_DEFAULT_PORT;
    const char *env = opts->port ? NULL : getenv("IDEMQ_HEALTH_PORT");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (*end || v < 1 || v > 65535 || env[0] < '0' || env[0] > '9') {
            snprintf(err, err_len, "IDEMQ_HEALTH_PORT=%s is not a port (1..65535)", env);
            return -1;
        }
        value = (unsigned)v;
    }
    snprintf(port, port_len, "%u", value);
    return 0;
}

int cli_health(const health_options *opts)
{
    health_target target = {.host = "127.0.0.1", .path = "/healthz"};
    char err[256] = "";
    if (opts->url ? cli_health_parse_url(opts->url, &target, err, sizeof err)
                  : probe_port(opts, target.port, sizeof target.port, err, sizeof err)) {
        fprintf(stderr, "idemq health: %s\n", err);
        return EXIT_USAGE;
    }
    bool v6 = strchr(target.host, ':') != NULL;
    char authority[300];
    snprintf(authority, sizeof authority, "%s%s%s:%s", v6 ? "[" : "", target.host, v6 ? "]" : "",
             target.port);

    uint64_t timeout_ms = opts->timeout_ms ? opts->timeout_ms : HEALTH_DEFAULT_TIMEOUT_MS;
    int64_t t0 = monotonic_ms(), deadline = t0 + (int64_t)timeout_ms;
    char timeout_text[32];
    config_format_duration(timeout_text, sizeof timeout_text, timeout_ms);

    int fd = -1, rc = 1;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *addrs = NULL;
    int gai = getaddrinfo(target.host, target.port, &hints, &addrs);
    if (gai != 0) {
        snprintf(err, sizeof err, "cannot resolve %s: %s", target.host, gai_strerror(gai));
        goto out;
    }
    for (const struct addrinfo *ai = addrs; ai && fd < 0; ai = ai->ai_next)
        fd = connect_one(ai, deadline, err, sizeof err);
    if (fd < 0)
        goto out;

    char request[1024];
    int n = snprintf(request, sizeof request,
                     "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: idemq-health\r\n"
                     "Connection: close\r\n\r\n",
                     target.path, authority);
    if (send_all(fd, request, (size_t)n, deadline, err, sizeof err) != 0)
        goto out;

    char answer[STATUS_LINE_MAX];
    ssize_t len = read_status_line(fd, answer, sizeof answer, deadline, err, sizeof err);
    if (len < 0)
        goto out;
    if (len == 0) {
        snprintf(err, sizeof err, "the server closed the connection without an answer");
        goto out;
    }
    char line[STATUS_LINE_MAX];
    first_line(answer, line, sizeof line);
    int code = cli_health_status_code(answer, (size_t)len);
    if (code < 0) {
        snprintf(err, sizeof err, "not an HTTP status line: \"%.80s\"", line);
        goto out;
    }
    if (code != 200) {
        snprintf(err, sizeof err, "answered \"%.80s\", not 200", line);
        goto out;
    }
    printf("idemq health: GET http://%s%s: \"%s\" in %lld ms\n", authority, target.path, line,
           (long long)(monotonic_ms() - t0));
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "idemq health: GET http://%s%s (timeout %s): %s\n", authority, target.path,
                timeout_text, err);
    if (fd >= 0)
        close(fd);
    if (addrs)
        freeaddrinfo(addrs);
    return rc;
}
