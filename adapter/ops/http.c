/*
 * http — see http.h for the design and the limits.
 *
 * One http_conn per accepted socket, holding its uv_tcp_t and its deadline timer (both closed
 * together; the conn is freed when the second close callback runs, after libuv has cancelled any
 * write or shutdown still pending), the 8 KiB head buffer and the response. A connection moves
 * READING → WRITING → LINGERING → CLOSING; any error, reset, EOF before a full head, or deadline
 * jumps to CLOSING. The server is freed once its listener, its retry timer and every conn are
 * closed. Thread affinity: loop thread only.
 */
#include "ops/http.h"

#include <inttypes.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ops/log.h"

#define DEFAULT_MAX_CONNECTIONS 64
#define DEFAULT_HEAD_TIMEOUT_MS 5000
#define DEFAULT_WRITE_TIMEOUT_MS 10000
#define DEFAULT_LINGER_MS 1000
#define LISTEN_BACKLOG 128
#define ACCEPT_RETRY_MS 100 /* after running out of memory while accepting */
#define MAX_METHOD 32
#define MAX_HEADER_FIELDS 100
#define MAX_BLANK_LINES 4 /* ignored before the request line (RFC 9112 §2.2) */

typedef enum conn_state {
    CONN_READING,   /* receiving the request head */
    CONN_WRITING,   /* response queued */
    CONN_LINGERING, /* response written, write side shut down, draining the client */
    CONN_CLOSING,
} conn_state;

typedef enum http_route {
    ROUTE_NONE,
    ROUTE_METRICS,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
} http_route;

typedef enum http_method {
    METHOD_OTHER,
    METHOD_GET,
    METHOD_HEAD,
} http_method;

/* parse_feed's answer: more bytes needed, a complete head, or an HTTP error status (>= 400). */
#define PARSE_MORE 0
#define PARSE_DONE 1

typedef struct http_conn {
    uv_tcp_t tcp;     /* first member: the read callbacks get it back */
    uv_timer_t timer; /* head deadline, then write deadline, then linger */
    uv_write_t write_req;
    uv_shutdown_t shutdown_req;
    http_server *server;
    struct http_conn *prev, *next;
    conn_state state;
    int open_handles; /* tcp + timer until their close callbacks ran */
    bool eof;         /* the client shut down its side */
    /* parser */
    size_t len;        /* bytes of head received */
    size_t line_start; /* start of the line being received */
    size_t scanned;    /* bytes already checked byte by byte */
    unsigned blank_lines;
    bool have_request_line;
    unsigned header_fields;
    const char *why; /* reason of a parse error, for the debug log */
    /* request */
    http_method method;
    http_route route;
    int minor; /* HTTP/1.minor */
    unsigned hosts;
    bool has_content_length;
    uint64_t content_length;
    bool has_transfer_encoding;
    char path[64]; /* for the debug log; truncated */
    /* response */
    char response_head[512];
    char *body; /* body_owned: malloc'd (metrics page), else static or small */
    size_t body_len;
    bool body_owned;
    char small_body[320];
    char buf[HTTP_HEAD_MAX];
} http_conn;

struct http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t retry_timer;
    int open_handles; /* listener + retry_timer */
    const metrics *metrics;
    http_ready_cb ready;
    void *ready_ctx;
    unsigned max_connections;
    uint64_t head_timeout_ms, write_timeout_ms, linger_ms;
    unsigned live; /* conns allocated and not yet freed */
    http_conn *conns;
    bool freeing;
    struct sockaddr_storage bound;
};

static const char rejected_response[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                        "Content-Type: text/plain; charset=utf-8\r\n"
                                        "Content-Length: 21\r\n"
                                        "Connection: close\r\n"
                                        "\r\n"
                                        "too many connections\n";

/* ------------------------------------------------------------------------------ lifetime */

static void server_maybe_release(http_server *s)
{
    if (s->freeing && s->open_handles == 0 && s->live == 0)
        free(s);
}

static void on_server_handle_closed(uv_handle_t *handle)
{
    http_server *s = handle->data;
    s->open_handles--;
    server_maybe_release(s);
}

static void on_conn_handle_closed(uv_handle_t *handle)
{
    http_conn *c = handle->data;
    if (--c->open_handles > 0)
        return;
    http_server *s = c->server;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->body_owned)
        free(c->body);
    free(c);
    s->live--;
    server_maybe_release(s);
}

static void conn_close(http_conn *c)
{
    if (c->state == CONN_CLOSING)
        return;
    c->state = CONN_CLOSING;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_deadline(uv_timer_t *timer)
{
    http_conn *c = timer->data;
    if (c->state == CONN_READING)
        log_debug(LOG_NO_CONTEXT,
                  "http: request head not complete after %" PRIu64 " ms (%zu bytes): closing",
                  c->server->head_timeout_ms, c->len);
    conn_close(c);
}

/* ------------------------------------------------------------------------------ parser */

static bool is_tchar(unsigned char ch)
{
    /* token = 1*tchar (RFC 9110 §5.6.2) */
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
        return true;
    return ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static bool tokens_equal(const char *a, size_t a_len, const char *b)
{
    return a_len == strlen(b) && strncasecmp(a, b, a_len) == 0;
}

static http_route route_of(const char *path, size_t len)
{
    if (len == 8 && memcmp(path, "/metrics", 8) == 0)
        return ROUTE_METRICS;
    if (len == 8 && memcmp(path, "/healthz", 8) == 0)
        return ROUTE_HEALTHZ;
    if (len == 7 && memcmp(path, "/readyz", 7) == 0)
        return ROUTE_READYZ;
    return ROUTE_NONE;
}

static int parse_error(http_conn *c, int status, const char *why)
{
    c->why = why;
    return status;
}

/* `METHOD SP request-target SP HTTP-version`, already free of control and non-ASCII bytes. */
static int parse_request_line(http_conn *c, const char *line, size_t n)
{
    const char *sp1 = memchr(line, ' ', n);
    if (!sp1)
        return parse_error(c, 400, "request line has no spaces");
    const char *target = sp1 + 1;
    const char *sp2 = memchr(target, ' ', (size_t)(line + n - target));
    if (!sp2)
        return parse_error(c, 400, "request line has no HTTP version");
    const char *version = sp2 + 1;
    size_t method_len = (size_t)(sp1 - line), target_len = (size_t)(sp2 - target);
    size_t version_len = (size_t)(line + n - version);

    if (method_len == 0 || method_len > MAX_METHOD)
        return parse_error(c, 400, "bad method");
    for (size_t i = 0; i < method_len; i++)
        if (!is_tchar((unsigned char)line[i]))
            return parse_error(c, 400, "bad method");
    if (target_len == 0)
        return parse_error(c, 400, "empty request target");
    for (size_t i = 0; i < target_len; i++)
        if ((unsigned char)target[i] <= 0x20 || (unsigned char)target[i] >= 0x7f)
            return parse_error(c, 400, "bad request target");
    if (version_len != 8 || memcmp(version, "HTTP/", 5) != 0 || version[5] < '0' ||
        version[5] > '9' || version[6] != '.' || version[7] < '0' || version[7] > '9')
        return parse_error(c, 400, "bad HTTP version");
    if (version[5] != '1')
        return parse_error(c, 505, "HTTP version not supported");
    c->minor = version[7] - '0';

    if (method_len == 3 && memcmp(line, "GET", 3) == 0)
        c->method = METHOD_GET;
    else if (method_len == 4 && memcmp(line, "HEAD", 4) == 0)
        c->method = METHOD_HEAD;
    else
        c->method = METHOD_OTHER;

    /* origin-form "/path?query", or absolute-form "http://authority/path?query" */
    const char *path = target, *end = target + target_len;
    if (target_len >= 7 && strncasecmp(target, "http://", 7) == 0)
        path = target + 7;
    else if (target_len >= 8 && strncasecmp(target, "https://", 8) == 0)
        path = target + 8;
    if (path != target) {
        const char *slash = memchr(path, '/', (size_t)(end - path));
        if (slash == path)
            return parse_error(c, 400, "absolute URI without authority");
        path = slash ? slash : end; /* "http://host" means "/" */
    } else if (target[0] != '/') {
        return parse_error(c, 400, "request target is not a path");
    }
    const char *path_end = path;
    while (path_end < end && *path_end != '?')
        path_end++;
    size_t path_len = (size_t)(path_end - path);
    c->route = path_len ? route_of(path, path_len) : ROUTE_NONE;
    snprintf(c->path, sizeof c->path, "%.*s", (int)(path_len ? path_len : 1),
             path_len ? path : "/");
    c->have_request_line = true;
    return PARSE_MORE;
}

/* `field-name ":" OWS field-value OWS`, already free of control bytes other than HTAB. */
static int parse_field_line(http_conn *c, const char *line, size_t n)
{
    if (line[0] == ' ' || line[0] == '\t')
        return parse_error(c, 400, "obsolete line folding");
    if (++c->header_fields > MAX_HEADER_FIELDS)
        return parse_error(c, 431, "too many header fields");
    const char *colon = memchr(line, ':', n);
    if (!colon || colon == line)
        return parse_error(c, 400, "header field without a name");
    size_t name_len = (size_t)(colon - line);
    for (size_t i = 0; i < name_len; i++)
        if (!is_tchar((unsigned char)line[i]))
            return parse_error(c, 400, "bad header field name");
    const char *value = colon + 1, *end = line + n;
    while (value < end && (*value == ' ' || *value == '\t'))
        value++;
    while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t value_len = (size_t)(end - value);

    if (tokens_equal(line, name_len, "host")) {
        c->hosts++;
    } else if (tokens_equal(line, name_len, "content-length")) {
        uint64_t v = 0;
        if (value_len == 0 || value_len > 18)
            return parse_error(c, 400, "bad Content-Length");
        for (size_t i = 0; i < value_len; i++) {
            if (value[i] < '0' || value[i] > '9')
                return parse_error(c, 400, "bad Content-Length");
            v = v * 10 + (uint64_t)(value[i] - '0');
        }
        if (c->has_content_length && v != c->content_length)
            return parse_error(c, 400, "conflicting Content-Length");
        c->has_content_length = true;
        c->content_length = v;
    } else if (tokens_equal(line, name_len, "transfer-encoding")) {
        c->has_transfer_encoding = true;
    }
    return PARSE_MORE;
}

static int parse_line(http_conn *c, const char *line, size_t n)
{
    if (!c->have_request_line) {
        if (n == 0)
            return ++c->blank_lines > MAX_BLANK_LINES
                       ? parse_error(c, 400, "blank lines instead of a request")
                       : PARSE_MORE;
        return parse_request_line(c, line, n);
    }
    if (n > 0)
        return parse_field_line(c, line, n);
    /* The blank line: the head is complete. */
    if (c->hosts > 1 || (c->minor >= 1 && c->hosts == 0))
        return parse_error(c, 400, c->hosts ? "more than one Host" : "HTTP/1.1 without Host");
    if (c->has_transfer_encoding && c->has_content_length)
        return parse_error(c, 400, "both Transfer-Encoding and Content-Length");
    if (c->has_transfer_encoding && c->minor == 0)
        return parse_error(c, 400, "Transfer-Encoding in an HTTP/1.0 request");
    return PARSE_DONE;
}

/*
 * Examines the bytes received since the last call (each byte once, apart from a trailing CR
 * whose LF has not arrived yet) and every line they complete. Returns PARSE_MORE, PARSE_DONE or
 * an HTTP error status.
 */
static int parse_feed(http_conn *c)
{
    while (c->scanned < c->len) {
        const char *nl = memchr(c->buf + c->scanned, '\n', c->len - c->scanned);
        size_t end = nl ? (size_t)(nl - c->buf) : c->len;
        for (size_t i = c->scanned; i < end; i++) {
            unsigned char ch = (unsigned char)c->buf[i];
            if (ch == '\r') {
                if (i + 1 < c->len && c->buf[i + 1] != '\n')
                    return parse_error(c, 400, "CR not followed by LF");
            } else if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
                return parse_error(c, 400, "control byte in the request head");
            } else if (!c->have_request_line && (ch >= 0x80 || ch == '\t')) {
                return parse_error(c, 400, "non-ASCII byte in the request line");
            }
        }
        if (!nl) {
            c->scanned = c->buf[c->len - 1] == '\r' ? c->len - 1 : c->len;
            if (!c->have_request_line) {
                /* Reject garbage early: the method must be a short token. */
                size_t i = c->line_start;
                while (i < c->len && i - c->line_start <= MAX_METHOD &&
                       is_tchar((unsigned char)c->buf[i]))
                    i++;
                if (i - c->line_start > MAX_METHOD ||
                    (i < c->len && c->buf[i] != ' ' && !(c->buf[i] == '\r' && i == c->line_start)))
                    return parse_error(c, 400, "bad method");
            }
            return PARSE_MORE;
        }
        size_t line_end = end;
        if (line_end > c->line_start && c->buf[line_end - 1] == '\r')
            line_end--;
        c->scanned = end + 1;
        size_t line_len = line_end - c->line_start;
        const char *line = c->buf + c->line_start;
        c->line_start = end + 1;
        int rc = parse_line(c, line, line_len);
        if (rc != PARSE_MORE)
            return rc;
    }
    return PARSE_MORE;
}

/* ------------------------------------------------------------------------------ responses */

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 414:
        return "URI Too Long";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Error";
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    http_conn *c = req->data;
    if (c->state == CONN_CLOSING)
        return; /* cancelled by conn_close */
    if (status < 0 || c->eof) {
        conn_close(c);
        return;
    }
    c->state = CONN_LINGERING;
    uv_timer_start(&c->timer, on_deadline, c->server->linger_ms, 0);
}

static void on_write(uv_write_t *req, int status)
{
    http_conn *c = req->data;
    if (c->state == CONN_CLOSING)
        return; /* cancelled by conn_close */
    if (status < 0) {
        log_debug(LOG_NO_CONTEXT, "http: writing the response failed: %s", uv_strerror(status));
        conn_close(c);
        return;
    }
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        conn_close(c);
}

/*
 * Queues the response and moves to CONN_WRITING. body is borrowed unless body_owned (then taken).
 * extra_headers is NULL or CRLF-terminated header lines.
 */
static void respond(http_conn *c, int status, const char *content_type, char *body, size_t body_len,
                    bool body_owned, const char *extra_headers)
{
    c->body = body;
    c->body_len = body_len;
    c->body_owned = body_owned;
    char date[64];
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &utc);
    int n = snprintf(c->response_head, sizeof c->response_head,
                     "HTTP/1.1 %d %s\r\n"
                     "Date: %s\r\n"
                     "Content-Type: %s\r\n"
                     "Content-Length: %zu\r\n"
                     "Cache-Control: no-store\r\n"
                     "%s"
                     "Connection: close\r\n"
                     "\r\n",
                     status, reason_phrase(status), date, content_type, body_len,
                     extra_headers ? extra_headers : "");
    if (n < 0 || (size_t)n >= sizeof c->response_head) {
        conn_close(c);
        return;
    }
    log_debug(LOG_NO_CONTEXT, "http: %s %s -> %d%s%s",
              c->method == METHOD_GET    ? "GET"
              : c->method == METHOD_HEAD ? "HEAD"
                                         : "?",
              c->path[0] ? c->path : "-", status, c->why ? ": " : "", c->why ? c->why : "");
    c->state = CONN_WRITING;
    uv_timer_start(&c->timer, on_deadline, c->server->write_timeout_ms, 0);
    uv_buf_t bufs[2] = {uv_buf_init(c->response_head, (unsigned)n),
                        uv_buf_init(body, (unsigned)body_len)};
    unsigned nbufs = c->method == METHOD_HEAD || body_len == 0 ? 1 : 2;
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, bufs, nbufs, on_write) != 0)
        conn_close(c);
}

static void respond_text(http_conn *c, int status, const char *text, const char *extra_headers)
{
    respond(c, status, "text/plain; charset=utf-8", (char *)text, strlen(text), false,
            extra_headers);
}

static void respond_error(http_conn *c, int status)
{
    const char *text;
    switch (status) {
    case 414:
        text = "request line too long\n";
        break;
    case 431:
        text = "request header fields too large\n";
        break;
    case 505:
        text = "HTTP version not supported\n";
        break;
    default:
        text = "bad request\n";
        status = 400;
        break;
    }
    /* An error answers every method with a body, HEAD included: the request is not trusted. */
    c->method = METHOD_OTHER;
    respond_text(c, status, text, NULL);
}

static void dispatch(http_conn *c)
{
    http_server *s = c->server;
    if (c->route == ROUTE_NONE || (c->route == ROUTE_METRICS && !s->metrics)) {
        respond_text(c, 404, "not found\n", NULL);
        return;
    }
    if (c->method == METHOD_OTHER) {
        respond_text(c, 405, "method not allowed\n", "Allow: GET, HEAD\r\n");
        return;
    }
    switch (c->route) {
    case ROUTE_HEALTHZ:
        respond_text(c, 200, "ok\n", NULL);
        return;
    case ROUTE_READYZ: {
        char reason[256] = "";
        if (!s->ready || s->ready(s->ready_ctx, reason, sizeof reason)) {
            respond_text(c, 200, "ready\n", NULL);
            return;
        }
        snprintf(c->small_body, sizeof c->small_body, "not ready: %s\n",
                 reason[0] ? reason : "unknown reason");
        respond_text(c, 503, c->small_body, NULL);
        return;
    }
    case ROUTE_METRICS: {
        char *page = NULL;
        size_t len = 0;
        if (metrics_render(s->metrics, &page, &len) != 0) {
            respond_text(c, 500, "out of memory\n", NULL);
            return;
        }
        respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", page, len, true, NULL);
        return;
    }
    case ROUTE_NONE:
        break;
    }
}

/* ------------------------------------------------------------------------------ reading */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    http_conn *c = handle->data;
    (void)suggested;
    if (c->state == CONN_READING)
        *buf = uv_buf_init(c->buf + c->len, (unsigned)(sizeof c->buf - c->len));
    else
        *buf = uv_buf_init(c->buf, sizeof c->buf); /* discarded: the head is no longer needed */
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *c = stream->data;
    (void)buf;
    if (c->state == CONN_CLOSING || nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && c->state == CONN_WRITING) {
            /* Half-closed after sending its request: still write the response. */
            c->eof = true;
            uv_read_stop(stream);
            return;
        }
        if (nread != UV_EOF)
            log_debug(LOG_NO_CONTEXT, "http: connection error: %s", uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    if (c->state != CONN_READING)
        return; /* pipelined requests or a body: ignored, the connection closes after the reply */
    c->len += (size_t)nread;
    int rc = parse_feed(c);
    if (rc == PARSE_DONE) {
        dispatch(c);
    } else if (rc != PARSE_MORE) {
        respond_error(c, rc);
    } else if (c->len == sizeof c->buf) {
        c->why = "request head larger than HTTP_HEAD_MAX bytes";
        respond_error(c, c->have_request_line ? 431 : 414);
    }
}

/* ------------------------------------------------------------------------------ accepting */

static void on_rejected_closed(uv_handle_t *handle)
{
    free(handle);
}

static void accept_pending(http_server *s);

static void on_retry_timer(uv_timer_t *timer)
{
    accept_pending(timer->data);
}

/* Accepts one pending connection and closes it at once (after a best-effort 503). Returns false
 * when out of memory: the connection stays in the kernel's queue and a timer retries. */
static bool reject_one(http_server *s)
{
    uv_tcp_t *tcp = malloc(sizeof *tcp);
    if (!tcp)
        return false;
    uv_tcp_init(s->loop, tcp);
    if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)tcp) == 0) {
        uv_buf_t b = uv_buf_init((char *)rejected_response, sizeof rejected_response - 1);
        (void)uv_try_write((uv_stream_t *)tcp, &b, 1);
    }
    uv_close((uv_handle_t *)tcp, on_rejected_closed);
    return true;
}

/* Accepts the connection libuv is holding for us. */
static void accept_pending(http_server *s)
{
    if (s->freeing)
        return;
    if (s->live >= s->max_connections) {
        log_debug(LOG_NO_CONTEXT, "http: %u connections open, rejecting another", s->live);
        if (!reject_one(s))
            uv_timer_start(&s->retry_timer, on_retry_timer, ACCEPT_RETRY_MS, 0);
        return;
    }
    http_conn *c = malloc(sizeof *c);
    if (!c) {
        if (!reject_one(s))
            uv_timer_start(&s->retry_timer, on_retry_timer, ACCEPT_RETRY_MS, 0);
        return;
    }
    memset(c, 0, offsetof(http_conn, buf)); /* the 8 KiB buffer needs no clearing */
    c->server = s;
    c->state = CONN_READING;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->live++;
    int rc = uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&c->tcp);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc != 0) {
        if (rc != UV_EAGAIN)
            log_debug(LOG_NO_CONTEXT, "http: accept failed: %s", uv_strerror(rc));
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_deadline, s->head_timeout_ms, 0);
}

static void on_connection(uv_stream_t *listener, int status)
{
    http_server *s = listener->data;
    if (status < 0) {
        log_warn(LOG_NO_CONTEXT, "http: accept error: %s", uv_strerror(status));
        return;
    }
    accept_pending(s);
}

/* ------------------------------------------------------------------------------ setup */

/* Splits "HOST:PORT" / "[V6]:PORT" into host (NUL-terminated) and port. Returns 0 or -1. */
static int split_listen(const char *text, char *host, size_t host_len, int *port)
{
    const char *h = text, *h_end, *p;
    if (text[0] == '[') {
        h = text + 1;
        h_end = strchr(h, ']');
        if (!h_end || h_end[1] != ':')
            return -1;
        p = h_end + 2;
    } else {
        h_end = strchr(text, ':');
        if (!h_end || strchr(h_end + 1, ':'))
            return -1; /* an IPv6 address needs brackets */
        p = h_end + 1;
    }
    size_t n = (size_t)(h_end - h);
    if (n == 0 || n >= host_len || *p == '\0' || strlen(p) > 5)
        return -1;
    long v = 0;
    for (const char *q = p; *q; q++) {
        if (*q < '0' || *q > '9')
            return -1;
        v = v * 10 + (*q - '0');
    }
    if (v > 65535)
        return -1;
    memcpy(host, h, n);
    host[n] = '\0';
    *port = (int)v;
    return 0;
}

static int resolve(const char *host, int port, struct sockaddr_storage *out, char *err,
                   size_t err_len)
{
    memset(out, 0, sizeof *out);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)out) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)out) == 0)
        return 0;
    /* A name: resolved once at startup, before the loop serves anything. */
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, err_len, "cannot resolve '%s': %s", host,
                 rc ? gai_strerror(rc) : "no address");
        return UV_EINVAL;
    }
    memcpy(out, res->ai_addr, res->ai_addrlen);
    if (out->ss_family == AF_INET)
        ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

int http_server_new(uv_loop_t *loop, const http_server_options *opts, http_server **out, char *err,
                    size_t err_len)
{
    char host[256];
    int port = 0, rc;
    struct sockaddr_storage addr;
    *out = NULL;
    if (!opts->listen || split_listen(opts->listen, host, sizeof host, &port) != 0) {
        snprintf(err, err_len, "'%s' is not a listen address (expected HOST:PORT or [V6]:PORT)",
                 opts->listen ? opts->listen : "");
        return UV_EINVAL;
    }
    rc = resolve(host, port, &addr, err, err_len);
    if (rc != 0)
        return rc;

    http_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return UV_ENOMEM;
    }
    s->loop = loop;
    s->metrics = opts->metrics;
    s->ready = opts->ready;
    s->ready_ctx = opts->ready_ctx;
    s->max_connections = opts->max_connections ? opts->max_connections : DEFAULT_MAX_CONNECTIONS;
    s->head_timeout_ms = opts->head_timeout_ms ? opts->head_timeout_ms : DEFAULT_HEAD_TIMEOUT_MS;
    s->write_timeout_ms =
        opts->write_timeout_ms ? opts->write_timeout_ms : DEFAULT_WRITE_TIMEOUT_MS;
    s->linger_ms = opts->linger_ms ? opts->linger_ms : DEFAULT_LINGER_MS;
    uv_tcp_init(loop, &s->listener);
    uv_timer_init(loop, &s->retry_timer);
    s->listener.data = s->retry_timer.data = s;
    s->open_handles = 2;

    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, LISTEN_BACKLOG, on_connection);
    if (rc == 0) {
        int len = sizeof s->bound;
        rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&s->bound, &len);
    }
    if (rc != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", opts->listen, uv_strerror(rc));
        http_server_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int http_server_port(const http_server *s)
{
    if (s->bound.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&s->bound)->sin_port);
    if (s->bound.ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)&s->bound)->sin6_port);
    return -1;
}

int http_server_address(const http_server *s, char *buf, size_t buf_len)
{
    char ip[64];
    int rc;
    if (s->bound.ss_family == AF_INET)
        rc = uv_ip4_name((const struct sockaddr_in *)&s->bound, ip, sizeof ip);
    else if (s->bound.ss_family == AF_INET6)
        rc = uv_ip6_name((const struct sockaddr_in6 *)&s->bound, ip, sizeof ip);
    else
        rc = UV_EINVAL;
    if (rc != 0)
        return rc;
    int n = snprintf(buf, buf_len, s->bound.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip,
                     http_server_port(s));
    return n < 0 || (size_t)n >= buf_len ? UV_ENOBUFS : 0;
}

void http_server_free(http_server *s)
{
    if (!s || s->freeing)
        return;
    s->freeing = true;
    uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
    uv_close((uv_handle_t *)&s->retry_timer, on_server_handle_closed);
    for (http_conn *c = s->conns; c; c = c->next)
        conn_close(c);
}
