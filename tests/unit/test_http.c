/*
 * Unit tests for adapter/ops/http: the ops endpoint on a private libuv loop driven by its own
 * thread (the server's affinity is that loop; the test thread is only a client), a real metrics
 * registry and a readiness callback the test flips. Clients are raw sockets, so the tests can send
 * what no HTTP library would: garbage, NUL bytes, a 1 MB header, a request trickled byte by byte,
 * resets in the middle.
 *
 * /metrics is checked with a strict Prometheus text-format (0.0.4) checker written here: every
 * line is `# HELP name text`, `# TYPE name type` or a sample `name{label="value",...} value`;
 * every sample's family has HELP and TYPE before it and its samples are contiguous; label names
 * and values are well-formed and escaped; no series repeats; histogram buckets are cumulative,
 * end in le="+Inf" and that bucket equals _count. The checker itself is tested on broken pages.
 *
 * Criterion forks per test, so each test gets a fresh server.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "config/config.h"
#include "ops/http_server.h"
#include "ops/metrics.h"

/* ------------------------------------------------------------------------------------ clock */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The client's own pace (a slow client's next byte, the next try of a deadline poll): never a
 * wait for the server, which the tests await through what it sends or closes. */
static void pause_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ----------------------------------------------------------------------- server under test */

#define HEAD_TIMEOUT_MS 1500

static config cfg;
static config_consumer consumers[3];
static metrics *reg;
static atomic_bool ready_flag;
static char ready_reason[128]; /* written before ready_flag is cleared, read after */

static uv_loop_t loop;
static uv_async_t stop_async;
static http_server *server;
static pthread_t loop_thread;
static bool running;
static int port;

static bool fake_ready(void *ctx, char *reason, size_t reason_len)
{
    (void)ctx;
    if (atomic_load(&ready_flag))
        return true;
    snprintf(reason, reason_len, "%s", ready_reason);
    return false;
}

static void set_ready(bool ready, const char *reason)
{
    if (!ready)
        snprintf(ready_reason, sizeof ready_reason, "%s", reason);
    atomic_store(&ready_flag, ready);
}

static void on_stop(uv_async_t *async)
{
    http_server_free(server);
    server = NULL;
    uv_close((uv_handle_t *)async, NULL);
}

static void *run_loop(void *arg)
{
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* The registry: three queues, one with characters the label escaping must handle. */
static void make_metrics(void)
{
    consumers[0].queue = (char *)"orders";
    consumers[1].queue = (char *)"we\"ird\\queue";
    consumers[2].queue = (char *)"two\nlines";
    cfg.consumers = consumers;
    cfg.consumer_count = 3;
    reg = metrics_new(&cfg);
    cr_assert_not_null(reg);
    for (int i = 0; i < 5; i++)
        metrics_count(reg, 0, OUTCOME_PROCESSED);
    metrics_count(reg, 0, OUTCOME_DEDUPED);
    metrics_count(reg, 0, OUTCOME_DEDUPED);
    metrics_count(reg, 0, OUTCOME_DEAD_LETTERED);
    metrics_count(reg, 1, OUTCOME_RETRIED);
    metrics_retry_recovered(reg, 0);
    metrics_observe_handler(reg, 0, 500000);         /* 0.5 ms */
    metrics_observe_handler(reg, 0, 3000000);        /* 3 ms */
    metrics_observe_handler(reg, 0, 2000000000);     /* 2 s */
    metrics_observe_handler(reg, 0, 20000000000ULL); /* 20 s: only +Inf */
    metrics_observe_handler(reg, 1, 7000000);
    metrics_inflight_add(reg, 0, 3);
    metrics_set_up(reg, METRICS_DEP_RABBITMQ, true);
}

static void start_server(const http_server_options *extra)
{
    signal(SIGPIPE, SIG_IGN); /* http.h: the embedding process ignores SIGPIPE */
    make_metrics();
    set_ready(true, "");
    cr_assert_eq(uv_loop_init(&loop), 0);
    http_server_options o = {.listen = "127.0.0.1:0",
                             .metrics = reg,
                             .ready = fake_ready,
                             .head_timeout_ms = HEAD_TIMEOUT_MS};
    if (extra) {
        o.max_connections = extra->max_connections;
        if (extra->head_timeout_ms)
            o.head_timeout_ms = extra->head_timeout_ms;
        o.write_timeout_ms = extra->write_timeout_ms;
        o.linger_ms = extra->linger_ms;
    }
    char err[256] = "";
    int rc = http_server_new(&loop, &o, &server, err, sizeof err);
    cr_assert_eq(rc, 0, "http_server_new: %s", err);
    port = http_server_port(server);
    cr_assert(port > 0 && port < 65536, "port %d", port);
    char address[64];
    cr_assert_eq(http_server_address(server, address, sizeof address), 0);
    char expected[64];
    snprintf(expected, sizeof expected, "127.0.0.1:%d", port);
    cr_assert_str_eq(address, expected);
    cr_assert_eq(uv_async_init(&loop, &stop_async, on_stop), 0);
    cr_assert_eq(pthread_create(&loop_thread, NULL, run_loop, NULL), 0);
    running = true;
}

static void setup(void)
{
    start_server(NULL);
}

/* Frees the server on its loop and checks that every handle closed (uv_run returned and
 * uv_loop_close succeeds): no connection is left behind. */
static void stop_server(void)
{
    if (!running)
        return;
    running = false;
    uv_async_send(&stop_async);
    pthread_join(loop_thread, NULL);
    cr_assert_eq(uv_loop_close(&loop), 0, "handles still open after http_server_free");
    metrics_free(reg);
    reg = NULL;
}

TestSuite(http, .init = setup, .fini = stop_server, .timeout = 60);

/* ------------------------------------------------------------------------------- client */

typedef struct reply {
    char *raw; /* everything received, NUL-terminated */
    size_t len;
    int status;       /* -1 when nothing parsable arrived */
    bool reset;       /* the connection was reset */
    bool timed_out;   /* nothing ended the connection in time */
    const char *body; /* into raw */
    size_t body_len;
} reply;

static void reply_free(reply *r)
{
    free(r->raw);
    memset(r, 0, sizeof *r);
}

static int connect_server(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "connect: %s", strerror(errno));
    return fd;
}

/* Sends everything unless the peer closes or resets; returns bytes sent. */
static size_t send_some(int fd, const void *data, size_t len, int timeout_ms)
{
    size_t sent = 0;
    int64_t deadline = now_ms() + timeout_ms;
    while (sent < len) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int left = (int)(deadline - now_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t n = send(fd, (const char *)data + sent, len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            break; /* EPIPE, ECONNRESET: the server gave up on us, which may be the point */
        }
        sent += (size_t)n;
    }
    return sent;
}

static void send_str(int fd, const char *text)
{
    size_t n = strlen(text);
    cr_assert_eq(send_some(fd, text, n, 5000), n, "could not send the request");
}

static void parse_reply(reply *r)
{
    r->status = -1;
    if (r->len >= 12 && memcmp(r->raw, "HTTP/1.1 ", 9) == 0 && r->raw[9] >= '1' && r->raw[9] <= '5')
        r->status = atoi(r->raw + 9);
    const char *end = strstr(r->raw, "\r\n\r\n");
    if (end) {
        r->body = end + 4;
        r->body_len = r->len - (size_t)(r->body - r->raw);
    }
}

/* Reads until the server closes (EOF or reset) or timeout_ms pass. */
static reply read_reply(int fd, int timeout_ms)
{
    reply r = {0};
    size_t cap = 4096;
    r.raw = malloc(cap);
    cr_assert_not_null(r.raw);
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(deadline - now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            r.timed_out = true;
            break;
        }
        if (cap - r.len < 2048) {
            cap *= 2;
            r.raw = realloc(r.raw, cap);
            cr_assert_not_null(r.raw);
        }
        ssize_t n = recv(fd, r.raw + r.len, cap - r.len - 1, 0);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            r.reset = true;
            break;
        }
        r.len += (size_t)n;
    }
    r.raw[r.len] = '\0';
    parse_reply(&r);
    return r;
}

/* One request on a fresh connection; the server must close it within 5 s. */
static reply exchange(const void *request, size_t len)
{
    int fd = connect_server();
    send_some(fd, request, len, 5000);
    reply r = read_reply(fd, 5000);
    close(fd);
    cr_assert(!r.timed_out, "the server did not close the connection (got %zu bytes)", r.len);
    return r;
}

/* Like exchange, then half-closes: a server waiting for more bytes sees EOF instead of waiting
 * for its deadline. */
static reply exchange_eof(const void *request, size_t len)
{
    int fd = connect_server();
    send_some(fd, request, len, 5000);
    shutdown(fd, SHUT_WR);
    reply r = read_reply(fd, 5000);
    close(fd);
    cr_assert(!r.timed_out, "the server did not close the connection (got %zu bytes)", r.len);
    return r;
}

static reply get(const char *request)
{
    return exchange(request, strlen(request));
}

/* Case-insensitive header lookup in a reply; copies the trimmed value. */
static bool header(const reply *r, const char *name, char *value, size_t value_len)
{
    const char *end = r->body ? r->body : r->raw + r->len;
    const char *line = strstr(r->raw, "\r\n");
    size_t name_len = strlen(name);
    while (line && line + 2 < end) {
        line += 2;
        const char *eol = strstr(line, "\r\n");
        if (!eol || eol == line)
            break;
        if ((size_t)(eol - line) > name_len && strncasecmp(line, name, name_len) == 0 &&
            line[name_len] == ':') {
            const char *v = line + name_len + 1;
            while (*v == ' ')
                v++;
            snprintf(value, value_len, "%.*s", (int)(eol - v), v);
            return true;
        }
        line = eol;
    }
    return false;
}

static void expect_status(const char *request, int status)
{
    reply r = get(request);
    cr_expect_eq(r.status, status, "request %s\n-> %d, expected %d:\n%s", request, r.status, status,
                 r.raw);
    reply_free(&r);
}

/* The server answers /healthz again within 3 s: connections a test just abandoned may still
 * count against the connection limit until the loop thread has seen them go (then 503). */
static void assert_healthy(void)
{
    int64_t deadline = now_ms() + 3000;
    for (;;) {
        reply r = get("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
        if (r.status == 200) {
            reply_free(&r);
            return;
        }
        cr_assert(r.status == 503 && now_ms() < deadline, "server no longer answers: %s", r.raw);
        reply_free(&r);
        pause_ms(20);
    }
}

/* Returns once the loop thread has taken every connection made before the call (accepted it, or
 * turned it away over the limit): the kernel hands connections to accept(2) in the order they
 * were made, so a request on a newer connection is answered only after the older ones were
 * taken. Returns that request's status: 200, or 503 (or -1, closed) when the server was full. */
static int await_accepted(void)
{
    reply r = get("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    int status = r.status;
    reply_free(&r);
    return status;
}

/* -------------------------------------------------------- strict Prometheus text checker */

#define PROM_MAX_SAMPLES 1024
#define PROM_MAX_FAMILIES 64

typedef struct prom_sample {
    char name[128];
    char labels[512]; /* canonical: sorted name="escaped value" pairs, comma-separated */
    char le[32];      /* the raw le value of a bucket, else "" */
    double value;
    int family;
} prom_sample;

typedef struct prom_family {
    char name[128];
    char type[16];
    bool help, typed, closed;
} prom_family;

typedef struct prom_page {
    prom_sample samples[PROM_MAX_SAMPLES];
    size_t sample_count;
    prom_family families[PROM_MAX_FAMILIES];
    size_t family_count;
} prom_page;

static bool is_name_start(char c, bool colon_ok)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
}

static bool is_name_char(char c, bool colon_ok)
{
    return is_name_start(c, colon_ok) || (c >= '0' && c <= '9');
}

/* Reads a metric (colon_ok) or label name at *p; returns its length, 0 when there is none. */
static size_t read_name(const char **p, bool colon_ok, char *out, size_t out_len)
{
    const char *s = *p;
    if (!is_name_start(*s, colon_ok))
        return 0;
    size_t n = 1;
    while (is_name_char(s[n], colon_ok))
        n++;
    if (n >= out_len)
        return 0;
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
    return n;
}

static bool parse_value(const char *text, double *out)
{
    if (strcmp(text, "+Inf") == 0) {
        *out = INFINITY;
        return true;
    }
    if (strcmp(text, "-Inf") == 0) {
        *out = -INFINITY;
        return true;
    }
    if (strcmp(text, "NaN") == 0) {
        *out = NAN;
        return true;
    }
    /* strtod also takes "inf", "nan", hex and leading spaces: the format does not. */
    for (const char *q = text; *q; q++)
        if (!strchr("0123456789.eE+-", *q))
            return false;
    char *end;
    errno = 0;
    *out = strtod(text, &end);
    return *text && *end == '\0' && errno == 0;
}

static int find_family(prom_page *pg, const char *name)
{
    for (size_t i = 0; i < pg->family_count; i++)
        if (strcmp(pg->families[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int add_family(prom_page *pg, const char *name)
{
    int f = find_family(pg, name);
    if (f >= 0)
        return f;
    if (pg->family_count == PROM_MAX_FAMILIES)
        return -1;
    snprintf(pg->families[pg->family_count].name, sizeof pg->families[0].name, "%s", name);
    return (int)pg->family_count++;
}

/* The family a sample name belongs to, or -1. */
static int family_of_sample(prom_page *pg, const char *name, bool *is_bucket, bool *is_count)
{
    *is_bucket = *is_count = false;
    int f = find_family(pg, name);
    if (f >= 0 && pg->families[f].typed && strcmp(pg->families[f].type, "histogram") != 0 &&
        strcmp(pg->families[f].type, "summary") != 0)
        return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(name), s = strlen(suffixes[i]);
        if (n <= s || strcmp(name + n - s, suffixes[i]) != 0)
            continue;
        char base[128];
        snprintf(base, sizeof base, "%.*s", (int)(n - s), name);
        f = find_family(pg, base);
        if (f < 0 || !pg->families[f].typed)
            return -1;
        const char *t = pg->families[f].type;
        if (strcmp(t, "histogram") == 0 || (i > 0 && strcmp(t, "summary") == 0)) {
            *is_bucket = i == 0;
            *is_count = i == 2;
            return f;
        }
        return -1;
    }
    return -1;
}

typedef struct label_pair {
    char name[64];
    char value[256]; /* escaped, as written */
} label_pair;

static int compare_labels(const void *a, const void *b)
{
    return strcmp(((const label_pair *)a)->name, ((const label_pair *)b)->name);
}

/* Parses `{name="value",...}` at *p. Returns NULL or an error text. */
static const char *parse_labels(const char **p, label_pair *pairs, size_t *count)
{
    const char *s = *p;
    *count = 0;
    if (*s != '{')
        return NULL;
    s++;
    while (*s != '}') {
        if (*count == 16)
            return "too many labels";
        label_pair *lp = &pairs[*count];
        if (!read_name(&s, false, lp->name, sizeof lp->name))
            return "bad label name";
        if (strncmp(lp->name, "__", 2) == 0)
            return "reserved label name";
        for (size_t i = 0; i < *count; i++)
            if (strcmp(pairs[i].name, lp->name) == 0)
                return "duplicate label name";
        if (s[0] != '=' || s[1] != '"')
            return "label name not followed by =\"";
        s += 2;
        size_t n = 0;
        while (*s != '"') {
            if (*s == '\0')
                return "unterminated label value";
            if (*s == '\\') {
                if (s[1] != '\\' && s[1] != '"' && s[1] != 'n')
                    return "bad escape in label value";
                if (n + 2 >= sizeof lp->value)
                    return "label value too long";
                lp->value[n++] = *s++;
            }
            if (n + 1 >= sizeof lp->value)
                return "label value too long";
            lp->value[n++] = *s++;
        }
        lp->value[n] = '\0';
        s++;
        (*count)++;
        if (*s == ',')
            s++; /* a trailing comma is allowed */
        else if (*s != '}')
            return "labels not separated by a comma";
    }
    *p = s + 1;
    return NULL;
}

static char prom_error[1024];

__attribute__((format(printf, 1, 2))) static const char *prom_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prom_error, sizeof prom_error, fmt, ap);
    va_end(ap);
    return prom_error;
}

/* Checks a whole page; fills pg. Returns NULL when valid, else an error text (static). */
static const char *prom_check(const char *page, size_t len, prom_page *pg)
{
    memset(pg, 0, sizeof *pg);
    if (len == 0 || page[len - 1] != '\n')
        return prom_fail("the page does not end with a newline");
    if (memchr(page, '\0', len))
        return prom_fail("NUL byte in the page");
    int current = -1;
    size_t line_no = 0;
    for (const char *line = page; line < page + len; line_no++) {
        const char *nl = memchr(line, '\n', (size_t)(page + len - line));
        char text[2048];
        if ((size_t)(nl - line) >= sizeof text)
            return prom_fail("line %zu too long", line_no + 1);
        snprintf(text, sizeof text, "%.*s", (int)(nl - line), line);
        line = nl + 1;
        const char *why = NULL;
        if (text[0] == '\0') {
            why = "empty line";
            goto bad;
        } else if (text[0] == '#') {
            char name[128];
            const char *p = text;
            bool is_help = strncmp(text, "# HELP ", 7) == 0;
            bool is_type = strncmp(text, "# TYPE ", 7) == 0;
            if (!is_help && !is_type) {
                why = "comment that is neither HELP nor TYPE";
                goto bad;
            }
            p += 7;
            if (!read_name(&p, true, name, sizeof name) || *p != ' ') {
                why = "bad metric name in HELP/TYPE";
                goto bad;
            }
            p++;
            int f = add_family(pg, name);
            if (f < 0) {
                why = "too many families";
                goto bad;
            }
            prom_family *fam = &pg->families[f];
            if (fam->closed) {
                why = "HELP/TYPE of a family after its samples";
                goto bad;
            }
            for (size_t i = 0; i < pg->sample_count; i++)
                if (pg->samples[i].family == f) {
                    why = "HELP/TYPE after the family's samples";
                    goto bad;
                }
            if (current >= 0 && current != f)
                pg->families[current].closed = true;
            current = f;
            if (is_help) {
                if (fam->help) {
                    why = "second HELP";
                    goto bad;
                }
                fam->help = true;
                for (const char *q = p; *q; q++)
                    if (*q == '\\' && q[1] != '\\' && q[1] != 'n') {
                        why = "bad escape in HELP";
                        goto bad;
                    } else if (*q == '\\') {
                        q++;
                    }
            } else {
                if (fam->typed) {
                    why = "second TYPE";
                    goto bad;
                }
                if (strcmp(p, "counter") && strcmp(p, "gauge") && strcmp(p, "histogram") &&
                    strcmp(p, "summary") && strcmp(p, "untyped")) {
                    why = "unknown TYPE";
                    goto bad;
                }
                fam->typed = true;
                snprintf(fam->type, sizeof fam->type, "%s", p);
            }
        } else {
            if (pg->sample_count == PROM_MAX_SAMPLES) {
                why = "too many samples";
                goto bad;
            }
            prom_sample *smp = &pg->samples[pg->sample_count];
            const char *p = text;
            if (!read_name(&p, true, smp->name, sizeof smp->name)) {
                why = "bad metric name";
                goto bad;
            }
            label_pair pairs[16];
            size_t count = 0;
            why = parse_labels(&p, pairs, &count);
            if (why)
                goto bad;
            if (*p != ' ') {
                why = "no space before the value";
                goto bad;
            }
            p++;
            char value[64];
            const char *sp = strchr(p, ' ');
            snprintf(value, sizeof value, "%.*s", (int)(sp ? sp - p : (long)strlen(p)), p);
            if (!parse_value(value, &smp->value)) {
                why = "bad sample value";
                goto bad;
            }
            if (sp) { /* optional integer timestamp */
                const char *t = sp + 1;
                if (*t == '-')
                    t++;
                if (!*t || strspn(t, "0123456789") != strlen(t)) {
                    why = "bad timestamp";
                    goto bad;
                }
            }
            bool is_bucket, is_count;
            int f = family_of_sample(pg, smp->name, &is_bucket, &is_count);
            if (f < 0 || !pg->families[f].help || !pg->families[f].typed) {
                why = "sample without HELP and TYPE for its family";
                goto bad;
            }
            if (f != current) {
                why = "samples of a family are not contiguous";
                goto bad;
            }
            smp->family = f;
            const char *type = pg->families[f].type;
            qsort(pairs, count, sizeof pairs[0], compare_labels);
            size_t off = 0;
            bool has_le = false;
            for (size_t i = 0; i < count; i++) {
                if (strcmp(pairs[i].name, "le") == 0 && strcmp(type, "histogram") == 0) {
                    has_le = true;
                    if (strlen(pairs[i].value) >= sizeof smp->le) {
                        why = "le value too long";
                        goto bad;
                    }
                    memcpy(smp->le, pairs[i].value, strlen(pairs[i].value) + 1);
                    continue; /* grouped without le */
                }
                off += (size_t)snprintf(smp->labels + off, sizeof smp->labels - off, "%s%s=\"%s\"",
                                        off ? "," : "", pairs[i].name, pairs[i].value);
                if (off >= sizeof smp->labels) {
                    why = "labels too long";
                    goto bad;
                }
            }
            if (is_bucket != has_le) {
                why = is_bucket ? "bucket without le" : "le label outside a bucket";
                goto bad;
            }
            if (is_bucket) {
                double le;
                if (!parse_value(smp->le, &le) || isnan(le)) {
                    why = "bad le value";
                    goto bad;
                }
            }
            if ((strcmp(type, "counter") == 0 || strcmp(type, "histogram") == 0) &&
                !(smp->value >= 0)) {
                why = "negative or NaN counter";
                goto bad;
            }
            for (size_t i = 0; i < pg->sample_count; i++)
                if (strcmp(pg->samples[i].name, smp->name) == 0 &&
                    strcmp(pg->samples[i].labels, smp->labels) == 0 &&
                    strcmp(pg->samples[i].le, smp->le) == 0) {
                    why = "duplicate series";
                    goto bad;
                }
            pg->sample_count++;
        }
        continue;
    bad:
        return prom_fail("line %zu: %s: %s", line_no + 1, why, text);
    }
    for (size_t f = 0; f < pg->family_count; f++) {
        const prom_family *fam = &pg->families[f];
        if (!fam->help || !fam->typed)
            return prom_fail("family %s lacks %s", fam->name, fam->help ? "TYPE" : "HELP");
        if (strcmp(fam->type, "histogram") != 0)
            continue;
        /* For each label set: buckets ascending and cumulative, last +Inf == _count, _sum. */
        char bucket[160], count_name[160], sum_name[160];
        snprintf(bucket, sizeof bucket, "%s_bucket", fam->name);
        snprintf(count_name, sizeof count_name, "%s_count", fam->name);
        snprintf(sum_name, sizeof sum_name, "%s_sum", fam->name);
        for (size_t i = 0; i < pg->sample_count; i++) {
            const prom_sample *first = &pg->samples[i];
            if (strcmp(first->name, bucket) != 0)
                continue;
            bool seen_before = false;
            for (size_t k = 0; k < i; k++)
                if (strcmp(pg->samples[k].name, bucket) == 0 &&
                    strcmp(pg->samples[k].labels, first->labels) == 0)
                    seen_before = true;
            if (seen_before)
                continue;
            double last_le = -INFINITY, last_value = 0, count = -1;
            bool has_sum = false;
            const char *why = NULL;
            for (size_t k = i; k < pg->sample_count && !why; k++) {
                const prom_sample *s = &pg->samples[k];
                if (strcmp(s->labels, first->labels) != 0)
                    continue;
                if (strcmp(s->name, bucket) == 0) {
                    double le;
                    parse_value(s->le, &le);
                    if (le <= last_le)
                        why = "buckets not in ascending le order";
                    else if (s->value < last_value)
                        why = "buckets not cumulative";
                    last_le = le;
                    last_value = s->value;
                } else if (strcmp(s->name, count_name) == 0) {
                    count = s->value;
                } else if (strcmp(s->name, sum_name) == 0) {
                    has_sum = true;
                }
            }
            if (!why && !isinf(last_le))
                why = "buckets do not end with le=\"+Inf\"";
            if (!why && count < 0)
                why = "histogram without _count";
            if (!why && count != last_value)
                why = "+Inf bucket differs from _count";
            if (!why && !has_sum)
                why = "histogram without _sum";
            if (why)
                return prom_fail("%s{%s}: %s", fam->name, first->labels, why);
        }
    }
    return NULL;
}

/* The value of series name{labels} (labels canonical: sorted, without le), or NAN. */
static double prom_get(const prom_page *pg, const char *name, const char *labels, const char *le)
{
    for (size_t i = 0; i < pg->sample_count; i++)
        if (strcmp(pg->samples[i].name, name) == 0 && strcmp(pg->samples[i].labels, labels) == 0 &&
            strcmp(pg->samples[i].le, le ? le : "") == 0)
            return pg->samples[i].value;
    return NAN;
}

static const char *checked(const char *page)
{
    static prom_page pg;
    const char *err = prom_check(page, strlen(page), &pg);
    return err ? err : "ok";
}

Test(prom_checker, accepts_a_valid_page_and_rejects_broken_ones)
{
    const char *head = "# HELP h_seconds x\n# TYPE h_seconds histogram\n";
    cr_assert_str_eq(checked("# HELP a_total A.\n# TYPE a_total counter\n"
                             "a_total{q=\"x\\\"y\\\\z\\n\"} 3\n"
                             "# HELP h_seconds H.\n# TYPE h_seconds histogram\n"
                             "h_seconds_bucket{le=\"0.1\"} 1\nh_seconds_bucket{le=\"+Inf\"} 2\n"
                             "h_seconds_sum 0.3\nh_seconds_count 2\n"),
                     "ok");
    static const char *const broken[] = {
        "a_total 1\n",                                                        /* no HELP/TYPE */
        "# HELP a x\na 1\n",                                                  /* no TYPE */
        "# HELP a x\n# TYPE a gauge\na 1",                                    /* no final newline */
        "# HELP a x\n# TYPE a gauge\na{q=\"\\t\"} 1\n",                       /* bad escape */
        "# HELP a x\n# TYPE a gauge\na{q=\"v\" } 1\n",                        /* junk in labels */
        "# HELP a x\n# TYPE a gauge\na{q=\"v\",q=\"w\"} 1\n",                 /* duplicate label */
        "# HELP a x\n# TYPE a gauge\na 1\na 2\n",                             /* duplicate series */
        "# HELP a x\n# TYPE a gauge\na one\n",                                /* bad value */
        "# HELP a x\n# TYPE a blah\na 1\n",                                   /* bad type */
        "# HELP a x\n# TYPE a counter\na -1\n",                               /* negative counter */
        "# HELP a x\n# TYPE a gauge\n# HELP b x\n# TYPE b gauge\nb 1\na 1\n", /* interleaved */
        "# HELP a x\n# TYPE a gauge\n\na 1\n",                                /* empty line */
        "# HELP a x\n# TYPE a gauge\n# note\na 1\n",                          /* stray comment */
        "# HELP a x\n# TYPE a gauge\na 1\n# HELP a y\n", /* HELP after samples */
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++)
        cr_expect_str_neq(checked(broken[i]), "ok", "accepted broken page %zu:\n%s", i, broken[i]);
    char page[1024];
    static const char *const histograms[] = {
        /* not cumulative */
        "h_seconds_bucket{le=\"1\"} 2\nh_seconds_bucket{le=\"+Inf\"} 1\n"
        "h_seconds_sum 1\nh_seconds_count 1\n",
        /* no +Inf */
        "h_seconds_bucket{le=\"1\"} 1\nh_seconds_sum 1\nh_seconds_count 1\n",
        /* +Inf != count */
        "h_seconds_bucket{le=\"+Inf\"} 2\nh_seconds_sum 1\nh_seconds_count 3\n",
        /* no sum */
        "h_seconds_bucket{le=\"+Inf\"} 2\nh_seconds_count 2\n",
        /* le order */
        "h_seconds_bucket{le=\"2\"} 1\nh_seconds_bucket{le=\"1\"} 1\n"
        "h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 1\nh_seconds_count 1\n",
        /* bucket without le */
        "h_seconds_bucket 1\nh_seconds_sum 1\nh_seconds_count 1\n",
    };
    for (size_t i = 0; i < sizeof histograms / sizeof histograms[0]; i++) {
        snprintf(page, sizeof page, "%s%s", head, histograms[i]);
        cr_expect_str_neq(checked(page), "ok", "accepted broken histogram %zu:\n%s", i, page);
    }
}

/* ---------------------------------------------------------------------------- routes */

Test(http, healthz_answers_get_and_head_alike_without_a_body_for_head)
{
    reply r = get("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    cr_assert_eq(r.status, 200, "%s", r.raw);
    cr_assert_eq(r.body_len, 3);
    cr_assert_str_eq(r.body, "ok\n");
    char v[128];
    cr_assert(header(&r, "Connection", v, sizeof v));
    cr_assert_str_eq(v, "close");
    cr_assert(header(&r, "Content-Length", v, sizeof v));
    cr_assert_str_eq(v, "3");
    cr_assert(header(&r, "Date", v, sizeof v));
    reply_free(&r);

    r = get("HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    cr_assert_eq(r.status, 200, "%s", r.raw);
    cr_assert_eq(r.body_len, 0, "HEAD got a body: %s", r.raw);
    cr_assert(header(&r, "Content-Length", v, sizeof v));
    cr_assert_str_eq(v, "3");
    reply_free(&r);
}

Test(http, metrics_page_is_strict_prometheus_text)
{
    reply r = get("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n");
    cr_assert_eq(r.status, 200, "%s", r.raw);
    char v[128];
    cr_assert(header(&r, "Content-Type", v, sizeof v));
    cr_assert_str_eq(v, "text/plain; version=0.0.4; charset=utf-8");
    cr_assert(header(&r, "Content-Length", v, sizeof v));
    cr_assert_eq((size_t)atol(v), r.body_len);

    static prom_page pg;
    const char *err = prom_check(r.body, r.body_len, &pg);
    cr_assert_null(err, "%s\n--- page ---\n%s", err, r.body);

    cr_assert_eq(
        prom_get(&pg, "idemq_messages_total", "outcome=\"processed\",queue=\"orders\"", NULL), 5);
    cr_assert_eq(
        prom_get(&pg, "idemq_messages_total", "outcome=\"deduped\",queue=\"orders\"", NULL), 2);
    cr_assert_eq(
        prom_get(&pg, "idemq_messages_total", "outcome=\"dead_lettered\",queue=\"orders\"", NULL),
        1);
    cr_assert_eq(prom_get(&pg, "idemq_messages_total",
                          "outcome=\"retried\",queue=\"we\\\"ird\\\\queue\"", NULL),
                 1, "escaped queue label missing:\n%s", r.body);
    cr_assert_eq(
        prom_get(&pg, "idemq_messages_total", "outcome=\"processed\",queue=\"two\\nlines\"", NULL),
        0);
    cr_assert_eq(prom_get(&pg, "idemq_retry_recovered_total", "queue=\"orders\"", NULL), 1);
    cr_assert_eq(prom_get(&pg, "idemq_inflight", "queue=\"orders\"", NULL), 3);
    cr_assert_eq(prom_get(&pg, "idemq_up", "dependency=\"rabbitmq\"", NULL), 1);
    cr_assert_eq(prom_get(&pg, "idemq_up", "dependency=\"mysql\"", NULL), 0);
    cr_assert_eq(prom_get(&pg, "idemq_handler_duration_seconds_count", "queue=\"orders\"", NULL),
                 4);
    cr_assert_eq(prom_get(&pg, "idemq_handler_duration_seconds_bucket", "queue=\"orders\"", "+Inf"),
                 4);
    cr_assert_eq(
        prom_get(&pg, "idemq_handler_duration_seconds_bucket", "queue=\"orders\"", "0.001"), 1);
    cr_assert_eq(
        prom_get(&pg, "idemq_handler_duration_seconds_bucket", "queue=\"orders\"", "0.005"), 2);
    cr_assert_eq(prom_get(&pg, "idemq_handler_duration_seconds_bucket", "queue=\"orders\"", "10"),
                 3);
    const char *families[] = {"idemq_messages_total", "idemq_retry_recovered_total",
                              "idemq_handler_duration_seconds", "idemq_inflight", "idemq_up"};
    for (size_t i = 0; i < 5; i++)
        cr_assert(find_family(&pg, families[i]) >= 0, "family %s missing", families[i]);
    reply_free(&r);

    r = get("HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 0);
    cr_assert(header(&r, "Content-Length", v, sizeof v));
    cr_assert(atol(v) > 100);
    reply_free(&r);

    /* A query string and the absolute form reach the same route. */
    expect_status("GET /metrics?name[]=idemq_up HTTP/1.1\r\nHost: x\r\n\r\n", 200);
    expect_status("GET http://127.0.0.1:9464/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 200);
}

Test(http, readyz_follows_the_callback)
{
    reply r = get("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(r.status, 200, "%s", r.raw);
    cr_assert_str_eq(r.body, "ready\n");
    reply_free(&r);

    set_ready(false, "database unavailable (consumption paused)");
    r = get("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(r.status, 503, "%s", r.raw);
    cr_assert_str_eq(r.body, "not ready: database unavailable (consumption paused)\n");
    reply_free(&r);
    r = get("HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(r.status, 503);
    cr_assert_eq(r.body_len, 0);
    reply_free(&r);
    /* Liveness is not readiness. */
    expect_status("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200);

    set_ready(true, "");
    r = get("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(r.status, 200, "%s", r.raw);
    reply_free(&r);
}

Test(http, unknown_paths_404_other_methods_405)
{
    expect_status("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404);
    expect_status("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404);
    expect_status("GET /metrics/ HTTP/1.1\r\nHost: x\r\n\r\n", 404);
    expect_status("GET /METRICS HTTP/1.1\r\nHost: x\r\n\r\n", 404);
    expect_status("GET /%6detrics HTTP/1.1\r\nHost: x\r\n\r\n", 404);
    expect_status("HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404);

    reply r = get("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    cr_assert_eq(r.status, 405, "%s", r.raw);
    char v[64];
    cr_assert(header(&r, "Allow", v, sizeof v));
    cr_assert_str_eq(v, "GET, HEAD");
    reply_free(&r);
    expect_status("DELETE /readyz HTTP/1.1\r\nHost: x\r\n\r\n", 405);
    expect_status("OPTIONS /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 405);
    expect_status("get /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 405); /* methods are case-sensitive */
}

Test(http, valid_request_variants_get_exactly_one_answer)
{
    expect_status("GET /healthz HTTP/1.0\r\n\r\n", 200);                /* 1.0 needs no Host */
    expect_status("GET /healthz HTTP/1.1\nHost: x\n\n", 200);           /* bare LF */
    expect_status("\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200); /* leading CRLF */
    expect_status("GET /healthz HTTP/1.1\r\nhOsT:x\r\nX-Empty:\r\nX-Tab:\ta\t\r\n\r\n", 200);
    expect_status("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Utf8: caf\xc3\xa9\r\n\r\n", 200);
    expect_status("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 200);

    /* Pipelined requests: one response, then the connection closes. */
    reply r =
        get("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(r.status, 200);
    cr_assert_null(strstr(r.raw + 1, "HTTP/1.1"), "answered more than one request:\n%s", r.raw);
    reply_free(&r);

    /* A client that half-closes after its request still gets the answer. */
    int fd = connect_server();
    send_str(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    shutdown(fd, SHUT_WR);
    r = read_reply(fd, 5000);
    close(fd);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    reply_free(&r);
}

Test(http, malformed_requests_get_400)
{
    static const char *const bad[] = {
        "GET /healthz\r\n\r\n",                                /* HTTP/0.9 */
        "GET /healthz HTTP/1.1\r\n\r\n",                       /* 1.1 without Host */
        "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", /* two Hosts */
        "GET  /healthz HTTP/1.1\r\nHost: x\r\n\r\n",           /* double space */
        "GET /healthz  HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /healthz HTTP/1.1 \r\nHost: x\r\n\r\n",
        "GET healthz HTTP/1.1\r\nHost: x\r\n\r\n", /* not a path */
        "GET /healthz HTTP/1.x\r\nHost: x\r\n\r\n",
        "GET /healthz HTTPS/1.1\r\nHost: x\r\n\r\n",
        "GET /healthz http/1.1\r\nHost: x\r\n\r\n",
        "GET /health\x01z HTTP/1.1\r\nHost: x\r\n\r\n",        /* control byte */
        "GET /h\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n",          /* non-ASCII target */
        "GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n",           /* space before colon */
        "GET /healthz HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", /* obs-fold */
        "GET /healthz HTTP/1.1\r\n Host: x\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost x\r\n\r\n",              /* no colon */
        "GET /healthz HTTP/1.1\r\n: x\r\nHost: x\r\n\r\n",      /* empty name */
        "GET /healthz HTTP/1.1\r\nHo(st: x\r\n\r\n",            /* not a token */
        "GET /healthz HTTP/1.1\r\nHost: x\ry\r\n\r\n",          /* bare CR */
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x7f\r\n\r\n", /* DEL */
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "Content-Length: 5\r\n\r\n", /* smuggling shape */
        "GET /healthz HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET http:///healthz HTTP/1.1\r\nHost: x\r\n\r\n", /* no authority */
        "\r\n\r\n\r\n\r\n\r\n\r\n",                        /* only blank lines */
        "/healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        "G\xc3\x89T /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        "AVERYVERYVERYVERYVERYVERYVERYLONGMETHOD /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_status(bad[i], 400);
    /* NUL bytes (strlen cannot carry them). */
    static const char nul_in_header[] = "GET /healthz HTTP/1.1\r\nHost: x\0y\r\n\r\n";
    reply r = exchange(nul_in_header, sizeof nul_in_header - 1);
    cr_expect_eq(r.status, 400, "%s", r.raw);
    reply_free(&r);
    static const char nul_in_path[] = "GET /healthz\0 HTTP/1.1\r\nHost: x\r\n\r\n";
    r = exchange(nul_in_path, sizeof nul_in_path - 1);
    cr_expect_eq(r.status, 400, "%s", r.raw);
    reply_free(&r);

    expect_status("GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505);
    expect_status("GET /healthz HTTP/0.9\r\nHost: x\r\n\r\n", 505);
    assert_healthy();
}

Test(http, garbage_is_rejected_at_once_and_the_server_survives)
{
    /* A TLS ClientHello on the plain port and an HTTP/2 preface: answered without waiting. */
    static const unsigned char tls[] = {0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00,
                                        0x00, 0xa1, 0x03, 0x03, 0x00, 0x00};
    int64_t t0 = now_ms();
    reply r = exchange(tls, sizeof tls);
    cr_expect_eq(r.status, 400, "%s", r.raw);
    cr_expect(now_ms() - t0 < HEAD_TIMEOUT_MS, "garbage waited for the deadline");
    reply_free(&r);
    const char h2[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    r = exchange(h2, sizeof h2 - 1);
    cr_expect(r.status == 400 || r.status == 505, "%s", r.raw);
    reply_free(&r);

    /* Random bytes of many lengths, NULs included: a 4xx or a closed connection, never a hang
     * past the deadline or a crash. */
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    unsigned char junk[20000];
    size_t sizes[] = {1, 2, 7, 64, 500, 4096, 8191, 8192, 8193, 20000};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (int round = 0; round < 3; round++) {
            for (size_t i = 0; i < sizes[k]; i++) {
                x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
                junk[i] = (unsigned char)((x * 2685821657736338717ULL) >> 56);
            }
            if (round == 1)
                memcpy(junk, "GET ", sizes[k] < 4 ? sizes[k] : 4); /* gets past the method */
            if (round == 2)
                for (size_t i = 0; i < sizes[k]; i++)
                    junk[i] = (unsigned char)('A' + junk[i] % 26); /* a never-ending token */
            r = exchange_eof(junk, sizes[k]);
            cr_expect(r.status == -1 || (r.status >= 400 && r.status < 600),
                      "size %zu round %d: status %d", sizes[k], round, r.status);
            reply_free(&r);
        }
    }
    assert_healthy();
}

Test(http, one_megabyte_header_gets_431)
{
    size_t big = 1 << 20;
    char *request = malloc(big + 128);
    cr_assert_not_null(request);
    int n = sprintf(request, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(request + n, 'a', big);
    memcpy(request + n + big, "\r\n\r\n", 4);
    reply r = exchange(request, (size_t)n + big + 4);
    /* Exactly 431, not a reset: after answering, the server drains what the client still sends
     * (lingering) so the kernel does not discard the response with an RST. */
    cr_expect_eq(r.status, 431, "status %d reset %d: %.200s", r.status, r.reset, r.raw);
    reply_free(&r);

    /* A 1 MB request line: 414. */
    memcpy(request, "GET /", 5);
    memset(request + 5, 'a', big);
    r = exchange(request, big);
    cr_expect_eq(r.status, 414, "status %d: %.200s", r.status, r.raw);
    reply_free(&r);

    /* Many small headers that add up past 8 KiB. */
    size_t off = (size_t)sprintf(request, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 2000; i++)
        off += (size_t)sprintf(request + off, "X-%d: y\r\n", i);
    off += (size_t)sprintf(request + off, "\r\n");
    r = exchange(request, off);
    cr_expect_eq(r.status, 431, "status %d", r.status);
    reply_free(&r);
    free(request);
    assert_healthy();
}

Test(http, slowloris_is_closed_at_the_deadline_while_others_are_served)
{
    int64_t t0 = now_ms();
    int partial = connect_server();
    send_str(partial, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    int trickle = connect_server();
    send_str(trickle, "G");

    /* Meanwhile: prompt answers, and the trickling client keeps sending 1 byte / 100 ms. */
    const char *drip =
        "ET /metrics HTTP/1.1\r\nHost: x\r\nX-A: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    size_t dripped = 0;
    int64_t worst = 0;
    while (now_ms() - t0 < HEAD_TIMEOUT_MS - 300) {
        int64_t a = now_ms();
        reply r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        int64_t took = now_ms() - a;
        worst = took > worst ? took : worst;
        cr_assert_eq(r.status, 200);
        reply_free(&r);
        if (dripped < strlen(drip))
            send_some(trickle, drip + dripped++, 1, 100);
        pause_ms(100);
    }
    cr_expect(worst < 500, "a request took %lld ms while slow clients were connected",
              (long long)worst);

    /* Both are closed at the head deadline (counted from the accept, not from the last byte). */
    reply slow = read_reply(partial, 5000);
    int64_t closed_after = now_ms() - t0;
    cr_assert(!slow.timed_out, "the partial request was never closed");
    cr_expect(closed_after >= HEAD_TIMEOUT_MS - 100 && closed_after < HEAD_TIMEOUT_MS + 1500,
              "closed after %lld ms; deadline %d ms", (long long)closed_after, HEAD_TIMEOUT_MS);
    cr_expect_eq(slow.len, 0, "a timed-out head got a response: %s", slow.raw);
    reply drip_reply = read_reply(trickle, 5000);
    int64_t trickle_closed = now_ms() - t0;
    cr_assert(!drip_reply.timed_out, "the trickling client was never closed");
    cr_expect(trickle_closed < HEAD_TIMEOUT_MS + 1500, "trickle closed after %lld ms",
              (long long)trickle_closed);
    reply_free(&slow);
    reply_free(&drip_reply);
    close(partial);
    close(trickle);
    assert_healthy();
}

Test(http, connections_over_the_limit_are_turned_away_at_once_never_hung)
{
    enum { N = 100 };
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = connect_server();
    int ok = 0, rejected = 0, other = 0;
    for (int i = 0; i < N; i++)
        send_some(fds[i], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 35, 2000);
    for (int i = 0; i < N; i++) {
        reply r = read_reply(fds[i], 5000);
        cr_assert(!r.timed_out, "connection %d hung", i);
        if (r.status == 200)
            ok++;
        else if (r.status == 503 || r.status == -1)
            rejected++; /* over the limit: 503 or closed */
        else
            other++;
        reply_free(&r);
        close(fds[i]);
    }
    cr_expect_eq(other, 0);
    cr_expect(ok >= 64, "only %d of %d connections were served (limit 64)", ok, N);
    cr_expect_eq(ok + rejected, N);
    assert_healthy();

    /* Held open and idle: the limit is reached, further clients are turned away at once, and
     * answered again once the idle ones are gone. */
    for (int i = 0; i < 64; i++)
        fds[i] = connect_server();
    /* Connections of the first round may still be closing on the loop thread and count against
     * the limit, so some of these may have been turned away: replace those until all 64 stay. */
    for (int round = 0;; round++) {
        cr_assert(round < 50, "could not hold 64 idle connections");
        await_accepted(); /* a turned-away one has its 503 or its close by now */
        int replaced = 0;
        for (int i = 0; i < 64; i++) {
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            if (poll(&p, 1, 0) > 0) { /* a 503 or a close: rejected */
                close(fds[i]);
                fds[i] = connect_server();
                replaced++;
            }
        }
        if (replaced == 0)
            break;
    }
    int64_t t0 = now_ms();
    reply r = get("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_expect(r.status == 503 || r.status == -1, "status %d over the limit", r.status);
    cr_expect(now_ms() - t0 < 1000, "an excess connection was not turned away at once");
    reply_free(&r);
    for (int i = 0; i < 64; i++)
        close(fds[i]);
    int64_t deadline = now_ms() + 3000;
    int status = 0;
    while (now_ms() < deadline && status != 200) {
        r = get("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        status = r.status;
        reply_free(&r);
    }
    cr_assert_eq(status, 200, "not serving after the idle clients left");
}

static void close_with_reset(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

Test(http, clients_that_disconnect_or_reset_mid_request)
{
    for (int i = 0; i < 200; i++) {
        int fd = connect_server();
        switch (i % 5) {
        case 0: /* partial head, then FIN */
            send_str(fd, "GET /metrics HTTP/1.1\r\nHo");
            close(fd);
            break;
        case 1: /* partial head, then RST */
            send_str(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
            close_with_reset(fd);
            break;
        case 2: /* full request, RST before reading the response */
            send_str(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            close_with_reset(fd);
            break;
        case 3: /* nothing at all */
            close_with_reset(fd);
            break;
        case 4: /* full request, FIN without reading */
            send_str(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            close(fd);
            break;
        }
    }
    assert_healthy();
    reply r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(r.status, 200);
    reply_free(&r);
}

Test(http, free_closes_live_connections)
{
    int idle = connect_server();
    int partial = connect_server();
    send_str(partial, "GET /metrics HTTP/1.1\r\n");
    /* Both are live connections of the server, not connections still waiting in the kernel's
     * queue (closing the listener would reset those, which would pass below for the wrong
     * reason). */
    cr_assert_eq(await_accepted(), 200);
    int64_t t0 = now_ms();
    stop_server(); /* asserts uv_loop_close succeeds: every handle was closed */
    reply a = read_reply(idle, 2000), b = read_reply(partial, 2000);
    cr_expect(!a.timed_out && !b.timed_out, "connections survived http_server_free");
    cr_expect(now_ms() - t0 < 1000);
    reply_free(&a);
    reply_free(&b);
    close(idle);
    close(partial);
}

/* ------------------------------------------------------------------- setup and addresses */

static void run_until_closed(uv_loop_t *l)
{
    uv_run(l, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(l), 0);
}

Test(http_setup, bad_addresses_and_a_taken_port)
{
    signal(SIGPIPE, SIG_IGN);
    uv_loop_t l;
    cr_assert_eq(uv_loop_init(&l), 0);
    static const char *const bad[] = {"",
                                      "127.0.0.1",
                                      "127.0.0.1:",
                                      ":80",
                                      "127.0.0.1:x",
                                      "127.0.0.1:65536",
                                      "::1:80",
                                      "[::1]80",
                                      "[::1",
                                      "127.0.0.1:123456"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        http_server *s = (http_server *)1;
        char err[256] = "";
        http_server_options o = {.listen = bad[i]};
        cr_expect_eq(http_server_new(&l, &o, &s, err, sizeof err), UV_EINVAL, "'%s'", bad[i]);
        cr_expect_null(s);
        cr_expect(strlen(err) > 0);
    }

    http_server *first = NULL, *second = NULL;
    char err[256] = "";
    http_server_options o = {.listen = "127.0.0.1:0"};
    cr_assert_eq(http_server_new(&l, &o, &first, err, sizeof err), 0, "%s", err);
    char taken[64];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", http_server_port(first));
    o.listen = taken;
    int rc = http_server_new(&l, &o, &second, err, sizeof err);
    cr_expect_eq(rc, UV_EADDRINUSE, "second bind: %d %s", rc, err);
    cr_expect_null(second);
    cr_expect(strstr(err, taken), "error does not name the address: %s", err);

    /* A name resolves; IPv6 loopback is formatted with brackets (when the host has it). */
    http_server *named = NULL, *v6 = NULL;
    o.listen = "localhost:0";
    cr_expect_eq(http_server_new(&l, &o, &named, err, sizeof err), 0, "%s", err);
    o.listen = "[::1]:0";
    if (http_server_new(&l, &o, &v6, err, sizeof err) == 0) {
        char address[64], expected[64];
        cr_expect_eq(http_server_address(v6, address, sizeof address), 0);
        snprintf(expected, sizeof expected, "[::1]:%d", http_server_port(v6));
        cr_expect_str_eq(address, expected);
    }
    http_server_free(first);
    http_server_free(named);
    http_server_free(v6);
    http_server_free(NULL);
    run_until_closed(&l);
}

Test(http_setup, no_metrics_means_404_and_no_ready_means_ready)
{
    signal(SIGPIPE, SIG_IGN);
    cr_assert_eq(uv_loop_init(&loop), 0);
    char err[256];
    http_server_options o = {.listen = "127.0.0.1:0"};
    cr_assert_eq(http_server_new(&loop, &o, &server, err, sizeof err), 0, "%s", err);
    port = http_server_port(server);
    cr_assert_eq(uv_async_init(&loop, &stop_async, on_stop), 0);
    cr_assert_eq(pthread_create(&loop_thread, NULL, run_loop, NULL), 0);
    running = true;
    expect_status("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 404);
    expect_status("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", 200);
    stop_server();
}

Test(http_setup, max_connections_and_head_timeout_options_are_honoured)
{
    http_server_options o = {.max_connections = 2, .head_timeout_ms = 300, .linger_ms = 50};
    start_server(&o);
    int64_t t0 = now_ms();
    int a = connect_server(), b = connect_server();
    /* The third connection is taken after a and b (accept order is connect order), so it finds
     * both slots taken: it is told 503 and closed at once. It sends nothing, so that close is a
     * plain FIN that cannot destroy the 503 with a reset: anything else means the limit broke. */
    int c = connect_server();
    reply r = read_reply(c, 2000);
    close(c);
    cr_expect_eq(r.status, 503, "third connection: status %d (reset %d, timed out %d): %s",
                 r.status, r.reset, r.timed_out, r.raw);
    cr_expect_str_eq(r.body ? r.body : "", "too many connections\n");
    reply_free(&r);
    /* The idle ones time out after 300 ms (not the suite's 1500 ms), unanswered, freeing the
     * slots. */
    reply ra = read_reply(a, 2000), rb = read_reply(b, 2000);
    int64_t closed_after = now_ms() - t0;
    cr_expect(!ra.timed_out && !rb.timed_out);
    cr_expect(ra.len == 0 && rb.len == 0, "an idle connection got a response: %s%s", ra.raw,
              rb.raw);
    cr_expect(closed_after >= 300 - 100 && closed_after < 1000,
              "idle connections closed after %lld ms; head_timeout_ms 300",
              (long long)closed_after);
    reply_free(&ra);
    reply_free(&rb);
    close(a);
    close(b);
    assert_healthy();
    stop_server();
}
