/*
 * http_server — see http_server.h for the design and the limits.
 *
 * One http_conn per accepted socket, holding its uv_tcp_t and its deadline timer (both closed
 * together; the conn is freed when the second close callback runs, after libuv has cancelled any
 * write or shutdown still pending), the 8 KiB head buffer, its parser (http_request.h) and the
 * response. A connection moves
 * READING → WRITING → LINGERING → CLOSING; any error, reset, EOF before a full head, or deadline
 * jumps to CLOSING. The server is freed once its listener, its retry timer and every conn are
 * closed. Thread affinity: loop thread only.
 */
#include "ops/http_server.h"

#include <inttypes.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/log.h"

#define DEFAULT_MAX_CONNECTIONS 64
#define DEFAULT_HEAD_TIMEOUT_MS 5000
#define DEFAULT_WRITE_TIMEOUT_MS 10000
#define DEFAULT_LINGER_MS 1000
#define LISTEN_BACKLOG 128
#define ACCEPT_RETRY_MS 100 /* after running out of memory while accepting */
#define LOGGED_PATH_MAX 63  /* bytes of the path in a debug line */

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
    /* request */
    size_t len; /* bytes of head received into buf */
    http_request request;
    http_route route;
    /* response */
    bool rejected; /* answering an invalid request: with a body whatever the method */
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

/* ------------------------------------------------------------------------------ routes */

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

/* "http: GET /readyz -> 503", with the reason of a rejection. Needs the head still in c->buf. */
static void log_response(const http_conn *c, int status)
{
    const http_request *req = &c->request;
    const char *method = c->rejected                       ? "?"
                         : req->method == HTTP_METHOD_GET  ? "GET"
                         : req->method == HTTP_METHOD_HEAD ? "HEAD"
                                                           : "?";
    const char *path = "-";
    size_t path_len = 1;
    if (req->have_request_line && req->path_len > 0) {
        path = c->buf + req->path_offset;
        path_len = req->path_len < LOGGED_PATH_MAX ? req->path_len : LOGGED_PATH_MAX;
    } else if (req->have_request_line) {
        path = "/";
    }
    log_debug(LOG_NO_CONTEXT, "http: %s %.*s -> %d%s%s", method, (int)path_len, path, status,
              req->why ? ": " : "", req->why ? req->why : "");
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
    if (log_enabled(LOG_LEVEL_DEBUG))
        log_response(c, status);
    c->state = CONN_WRITING;
    uv_timer_start(&c->timer, on_deadline, c->server->write_timeout_ms, 0);
    uv_buf_t bufs[2] = {uv_buf_init(c->response_head, (unsigned)n),
                        uv_buf_init(body, (unsigned)body_len)};
    bool head_only = !c->rejected && c->request.method == HTTP_METHOD_HEAD;
    unsigned nbufs = head_only || body_len == 0 ? 1 : 2;
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
    c->rejected = true;
    respond_text(c, status, text, NULL);
}

static void dispatch(http_conn *c)
{
    http_server *s = c->server;
    if (c->route == ROUTE_NONE || (c->route == ROUTE_METRICS && !s->metrics)) {
        respond_text(c, 404, "not found\n", NULL);
        return;
    }
    if (c->request.method == HTTP_METHOD_OTHER) {
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
            /* A ready probe may say what it is ready with (the database node in use). */
            snprintf(c->small_body, sizeof c->small_body, "ready%s%s\n", reason[0] ? ": " : "",
                     reason);
            respond_text(c, 200, c->small_body, NULL);
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
    int rc = http_request_feed(&c->request, c->buf, c->len);
    if (rc == HTTP_REQUEST_COMPLETE) {
        c->route = route_of(c->buf + c->request.path_offset, c->request.path_len);
        dispatch(c);
    } else if (rc == HTTP_REQUEST_E_INVALID) {
        respond_error(c, c->request.status);
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
    http_request_init(&c->request);
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
