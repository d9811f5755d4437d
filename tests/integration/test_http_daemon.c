/*
 * test_http_daemon — the ops endpoint of a real `idemq run`:
 *   - /metrics parses (a strict line check here; the full Prometheus checker is in
 *     tests/unit/test_http.c) and its counters match what the test published: N processed,
 *     M deduped, K dead-lettered;
 *   - malformed HTTP (garbage, a 1 MB header, a slowloris partial request) neither crashes nor
 *     blocks the daemon, which keeps serving and consuming;
 *   - /readyz turns 503 while MariaDB is down and 200 after it is back.
 *
 * A separate executable, and one test, because it stops the shared MariaDB server
 * (scripts/services stop-mariadb / start-mariadb): every suite running at the same time sees the
 * outage, so the outage is kept short. MariaDB is started again by the teardown even when an
 * assertion fails, and by a guard process (harness_db_guard_arm) when this process dies (crash,
 * timeout, kill).
 * The daemon listens on 127.0.0.1:0 (the harness config); the port is read from its log line
 * "http listening on 127.0.0.1:PORT".
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define GOOD 200              /* N: distinct payments, processed */
#define DUPLICATES 40         /* M: redeliveries of the first M payments' biz_keys, deduped */
#define BAD 15                /* K: bodies that cannot be decoded, dead-lettered at once */
#define HEAD_DEADLINE_MS 5000 /* the daemon's default request-head deadline */

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static harness_db_guard db_guard = HARNESS_DB_GUARD_INIT;
static int http_port;

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    harness_db_guard_recover(&H, &db_guard);
    if (h_ready) {
        harness_fini(&H);
        h_ready = false;
    }
}

/* ------------------------------------------------------------------------- HTTP client */

typedef struct reply {
    int status; /* -1: no status line */
    char *raw;  /* NUL-terminated */
    size_t len;
    const char *body; /* into raw */
    bool closed;      /* the server closed (EOF or reset) within the timeout */
} reply;

static void reply_free(reply *r)
{
    free(r->raw);
    memset(r, 0, sizeof *r);
}

static int connect_daemon(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "connect to :%d: %s", http_port,
                 strerror(errno));
    return fd;
}

static void send_bytes(int fd, const void *data, size_t len)
{
    size_t sent = 0;
    int64_t deadline = harness_now_ms() + 5000;
    while (sent < len && harness_now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = send(fd, (const char *)data + sent, len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n < 0)
            return; /* the server closed: fine, the reply tells */
        sent += (size_t)n;
    }
}

static reply read_reply(int fd, int timeout_ms)
{
    reply r = {.status = -1};
    size_t cap = 8192;
    r.raw = malloc(cap);
    cr_assert(r.raw);
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(deadline - harness_now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        if (cap - r.len < 4096) {
            cap *= 2;
            r.raw = realloc(r.raw, cap);
            cr_assert(r.raw);
        }
        ssize_t n = recv(fd, r.raw + r.len, cap - r.len - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r.closed = true;
            break;
        }
        r.len += (size_t)n;
    }
    r.raw[r.len] = '\0';
    if (r.len >= 12 && memcmp(r.raw, "HTTP/1.1 ", 9) == 0)
        r.status = atoi(r.raw + 9);
    const char *end = strstr(r.raw, "\r\n\r\n");
    r.body = end ? end + 4 : r.raw + r.len;
    return r;
}

static reply http_get(const char *path)
{
    char request[256];
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    int fd = connect_daemon();
    send_bytes(fd, request, (size_t)n);
    reply r = read_reply(fd, 5000);
    close(fd);
    cr_assert(r.closed, "GET %s: the daemon did not answer and close within 5 s", path);
    return r;
}

/* ------------------------------------------------------------------------- /metrics */

/* Every line is `# HELP name text`, `# TYPE name type` or `name{labels} value`, and the page ends
 * with a newline; names are idemq's own or the standard process_* family. Returns NULL or what is
 * wrong. */
static bool known_metric_prefix(const char *name)
{
    return strncmp(name, "idemq_", 6) == 0 || strncmp(name, "process_", 8) == 0;
}

static const char *check_exposition(const char *page)
{
    static char why[512];
    size_t len = strlen(page);
    if (len == 0 || page[len - 1] != '\n')
        return "page does not end with a newline";
    for (const char *line = page; *line;) {
        const char *nl = strchr(line, '\n');
        char text[1024];
        snprintf(text, sizeof text, "%.*s", (int)(nl - line), line);
        line = nl + 1;
        if (strncmp(text, "# HELP ", 7) == 0 && known_metric_prefix(text + 7))
            continue;
        if (strncmp(text, "# TYPE ", 7) == 0 && known_metric_prefix(text + 7)) {
            const char *type = strrchr(text, ' ') + 1;
            if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram"))
                goto bad;
            continue;
        }
        const char *p = text;
        if (!known_metric_prefix(p))
            goto bad;
        while ((*p >= 'a' && *p <= 'z') || *p == '_')
            p++;
        if (*p == '{') {
            const char *close = strstr(p, "} ");
            if (!close)
                goto bad;
            p = close + 1;
        }
        if (*p != ' ')
            goto bad;
        char *end;
        double v = strtod(p + 1, &end);
        if (*end != '\0' && strcmp(p + 1, "+Inf") != 0)
            goto bad;
        (void)v;
        continue;
    bad:
        snprintf(why, sizeof why, "malformed line: %.400s", text);
        return why;
    }
    return NULL;
}

/* The value of the sample whose text before the value is exactly `series`; NAN when absent. */
static double sample(const char *page, const char *series)
{
    size_t n = strlen(series);
    for (const char *line = page; line && *line;
         line = strchr(line, '\n'), line = line ? line + 1 : NULL)
        if (strncmp(line, series, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    return NAN;
}

static double outcome(const char *page, const char *name)
{
    char series[256];
    snprintf(series, sizeof series, "idemq_messages_total{queue=\"%s\",outcome=\"%s\"}", H.queue,
             name);
    return sample(page, series);
}

typedef struct counts_wait {
    double processed, deduped, dead_lettered;
    char *last_page;
} counts_wait;

static bool counts_reached(harness *h, void *arg)
{
    (void)h;
    counts_wait *w = arg;
    reply r = http_get("/metrics");
    free(w->last_page);
    w->last_page = strdup(r.body);
    bool ok = r.status == 200 && outcome(r.body, "processed") == w->processed &&
              outcome(r.body, "deduped") == w->deduped &&
              outcome(r.body, "dead_lettered") == w->dead_lettered;
    reply_free(&r);
    return ok;
}

/* ------------------------------------------------------------------------- /readyz */

typedef struct ready_wait {
    int status;
    const char *body_prefix; /* NULL: any */
    char last[256];
} ready_wait;

static bool readyz_is(harness *h, void *arg)
{
    (void)h;
    ready_wait *w = arg;
    reply r = http_get("/readyz");
    snprintf(w->last, sizeof w->last, "%d %s", r.status, r.body);
    bool ok = r.status == w->status &&
              (!w->body_prefix || strncmp(r.body, w->body_prefix, strlen(w->body_prefix)) == 0);
    reply_free(&r);
    return ok;
}

static void wait_readyz(int status, const char *body_prefix, int timeout_ms)
{
    ready_wait w = {.status = status, .body_prefix = body_prefix};
    bool ok = harness_wait_for(readyz_is, &H, &w, timeout_ms);
    cr_assert(ok, "/readyz did not become %d %s within %d ms; last: %s", status,
              body_prefix ? body_prefix : "", timeout_ms, w.last);
}

/* ------------------------------------------------------------------------- helpers */

static bool port_logged(harness *h, void *arg)
{
    (void)arg;
    FILE *f = fopen(h->log_path, "r");
    if (!f)
        return false;
    char *line = NULL;
    size_t cap = 0;
    const char *needle = "http listening on 127.0.0.1:";
    while (getline(&line, &cap, f) >= 0) {
        const char *p = strstr(line, needle);
        if (p)
            http_port = atoi(p + strlen(needle));
    }
    free(line);
    fclose(f);
    return http_port > 0;
}

static void publish_payment(const char *order_id)
{
    char body[256];
    int n = snprintf(body, sizeof body,
                     "{\"message_id\":\"m-%s\",\"biz_key\":\"order_id:%s:PAY_SUCCESS\","
                     "\"order_id\":\"%s\",\"event_type\":\"PAY_SUCCESS\",\"amount\":1}",
                     order_id, order_id, order_id);
    harness_publish(&H, NULL, "application/json", body, (size_t)n, NULL);
}

static void publish_workload(void)
{
    enum { TOTAL = GOOD + DUPLICATES + BAD };
    char **bodies = calloc(TOTAL, sizeof *bodies);
    size_t *lens = calloc(TOTAL, sizeof *lens);
    cr_assert(bodies && lens);
    size_t k = 0;
    for (int i = 0; i < GOOD + DUPLICATES; i++) {
        int order = i < GOOD ? i : i - GOOD; /* the duplicates repeat the first M biz_keys */
        bodies[k] = malloc(256);
        cr_assert(bodies[k]);
        lens[k] =
            (size_t)snprintf(bodies[k], 256,
                             "{\"message_id\":\"m-%d\",\"biz_key\":\"order_id:h%d:PAY_SUCCESS\","
                             "\"order_id\":\"h%d\",\"event_type\":\"PAY_SUCCESS\","
                             "\"amount\":%d}",
                             i, order, order, order);
        k++;
    }
    for (int i = 0; i < BAD; i++) {
        bodies[k] = malloc(64);
        cr_assert(bodies[k]);
        /* alternately: not JSON, and JSON without a biz_key */
        lens[k] =
            (size_t)snprintf(bodies[k], 64, i % 2 ? "{\"order_id\":\"h%d\"}" : "{not json %d", i);
        k++;
    }
    harness_publish_batch(&H, NULL, "application/json", (const void *const *)bodies, lens, k);
    for (size_t i = 0; i < k; i++)
        free(bodies[i]);
    free(bodies);
    free(lens);
}

/* ------------------------------------------------------------------------- the test */

Test(http_daemon, metrics_match_the_workload_and_readyz_follows_mariadb, .fini = teardown,
     .timeout = 240)
{
    harness_init(&H, "http_daemon", NULL);
    h_ready = true;
    harness_insert_orders(&H, "h", GOOD, "PAYING");
    harness_insert_orders(&H, "late", 1, "PAYING");
    daemon_pid = harness_spawn(&H);
    cr_assert(harness_wait_for(port_logged, &H, NULL, 20000), "no \"http listening on\" line in %s",
              H.log_path);
    wait_readyz(200, "ready\n", 20000);

    reply r = http_get("/healthz");
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "ok\n");
    reply_free(&r);
    r = http_get("/metrics");
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.raw, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "%s",
              r.raw);
    const char *why = check_exposition(r.body);
    cr_assert_null(why, "%s\n%s", why, r.body);
    cr_assert_eq(outcome(r.body, "processed"), 0, "%s", r.body);
    reply_free(&r);

    /* N good, M duplicates, K bad → the counters say exactly that. */
    publish_workload();
    counts_wait cw = {.processed = GOOD, .deduped = DUPLICATES, .dead_lettered = BAD};
    bool reached = harness_wait_for(counts_reached, &H, &cw, 60000);
    cr_assert(reached, "counters never reached processed=%d deduped=%d dead_lettered=%d:\n%s", GOOD,
              DUPLICATES, BAD, cw.last_page ? cw.last_page : "");
    why = check_exposition(cw.last_page);
    cr_assert_null(why, "%s\n%s", why, cw.last_page);
    cr_expect_eq(outcome(cw.last_page, "retried"), 0);
    cr_expect_eq(outcome(cw.last_page, "state_noop"), 0);
    char series[256];
    snprintf(series, sizeof series, "idemq_handler_duration_seconds_count{queue=\"%s\"}", H.queue);
    cr_expect_eq(sample(cw.last_page, series), GOOD + DUPLICATES, "%s", cw.last_page);
    cr_expect_eq(sample(cw.last_page, "idemq_up{dependency=\"rabbitmq\"}"), 1);
    cr_expect_eq(sample(cw.last_page, "idemq_up{dependency=\"mysql\"}"), 1);
    free(cw.last_page);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), GOOD);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), GOOD);

    /* Malformed HTTP against the daemon: garbage, a 1 MB header, a slowloris partial request. */
    int fd = connect_daemon();
    static const unsigned char garbage[] = {0x16, 0x03, 0x01, 0x00, 0x00, 0xff, 'G', '\0', '\r'};
    send_bytes(fd, garbage, sizeof garbage);
    r = read_reply(fd, 5000);
    cr_expect(r.closed && r.status == 400, "garbage: %d %s", r.status, r.raw);
    reply_free(&r);
    close(fd);

    size_t big = 1 << 20;
    char *request = malloc(big + 64);
    cr_assert(request);
    int n = sprintf(request, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(request + n, 'a', big);
    memcpy(request + n + big, "\r\n\r\n", 4);
    fd = connect_daemon();
    send_bytes(fd, request, (size_t)n + big + 4);
    r = read_reply(fd, 5000);
    cr_expect(r.closed && r.status == 431, "1 MB header: %d %.100s", r.status, r.raw);
    reply_free(&r);
    close(fd);
    free(request);

    int64_t slow_start = harness_now_ms();
    int slow = connect_daemon();
    send_bytes(slow, "GET /metrics HTTP/1.1\r\nHost: x\r\n", 32);
    int64_t worst = 0;
    for (int i = 0; i < 10; i++) {
        int64_t t0 = harness_now_ms();
        r = http_get("/healthz");
        int64_t took = harness_now_ms() - t0;
        worst = took > worst ? took : worst;
        cr_assert_eq(r.status, 200);
        reply_free(&r);
    }
    cr_expect(worst < 1000, "/healthz took %lld ms while a slowloris client was connected",
              (long long)worst);
    publish_payment("late0"); /* consuming is not blocked either */
    cw = (counts_wait){.processed = GOOD + 1, .deduped = DUPLICATES, .dead_lettered = BAD};
    cr_assert(harness_wait_for(counts_reached, &H, &cw, 20000),
              "a message published while a slowloris client was connected was not processed");
    free(cw.last_page);
    r = read_reply(slow, HEAD_DEADLINE_MS + 5000);
    int64_t slow_closed = harness_now_ms() - slow_start;
    cr_expect(r.closed && r.len == 0, "slowloris connection not closed without a response");
    cr_expect(slow_closed < HEAD_DEADLINE_MS + 2000, "slowloris closed after %lld ms",
              (long long)slow_closed);
    reply_free(&r);
    close(slow);

    /* MariaDB down: /readyz 503 with the reason; liveness stays 200. */
    harness_db_guard_arm(&H, &db_guard);
    db_guard.db_stopped = true;
    cr_assert_eq(harness_services(&H, "stop-mariadb"), 0,
                 "stop-mariadb failed (see %s/services.log)", H.dir);
    mysql_close(H.db);
    H.db = NULL;
    wait_readyz(503, "not ready: database unavailable", 20000);
    r = http_get("/healthz");
    cr_expect_eq(r.status, 200);
    reply_free(&r);
    r = http_get("/metrics");
    cr_expect_eq(sample(r.body, "idemq_up{dependency=\"mysql\"}"), 0, "%s", r.body);
    reply_free(&r);

    cr_assert_eq(harness_services(&H, "start-mariadb"), 0,
                 "start-mariadb failed (see %s/services.log)", H.dir);
    db_guard.db_stopped = false;
    harness_db_reconnect(&H, 30000);
    harness_db_guard_disarm(&db_guard);
    wait_readyz(200, "ready\n", 30000);
    r = http_get("/metrics");
    cr_expect_eq(sample(r.body, "idemq_up{dependency=\"mysql\"}"), 1, "%s", r.body);
    reply_free(&r);

    harness_stop_idemq(&daemon_pid);
}
