/*
 * Unit tests for adapter/ops/http_request: the request-head parser alone, without a socket or a
 * loop. Each case is fed whole and then one byte at a time; both must give the same answer (the
 * parser is incremental), and the server-level behaviour stays covered by test_http.c.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "ops/http_request.h"

typedef struct parse_case {
    const char *name;
    const char *head;
    size_t len;       /* 0: strlen(head) */
    int expected;     /* 0 (incomplete), HTTP_REQUEST_COMPLETE or HTTP_REQUEST_E_INVALID */
    int status;       /* for HTTP_REQUEST_E_INVALID */
    const char *path; /* for HTTP_REQUEST_COMPLETE: the path without the query */
    http_method method;
} parse_case;

static const parse_case cases[] = {
    {"get", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 0, HTTP_REQUEST_COMPLETE, 0, "/metrics",
     HTTP_METHOD_GET},
    {"head with query", "HEAD /readyz?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n", 0,
     HTTP_REQUEST_COMPLETE, 0, "/readyz", HTTP_METHOD_HEAD},
    {"bare LF", "GET /healthz HTTP/1.1\nHost: x\n\n", 0, HTTP_REQUEST_COMPLETE, 0, "/healthz",
     HTTP_METHOD_GET},
    {"HTTP/1.0 needs no Host", "GET /healthz HTTP/1.0\r\n\r\n", 0, HTTP_REQUEST_COMPLETE, 0,
     "/healthz", HTTP_METHOD_GET},
    {"absolute form", "GET http://example.com/metrics HTTP/1.1\r\nHost: example.com\r\n\r\n", 0,
     HTTP_REQUEST_COMPLETE, 0, "/metrics", HTTP_METHOD_GET},
    {"absolute form without path", "GET http://example.com HTTP/1.1\r\nHost: e\r\n\r\n", 0,
     HTTP_REQUEST_COMPLETE, 0, "", HTTP_METHOD_GET},
    {"other method", "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 0,
     HTTP_REQUEST_COMPLETE, 0, "/metrics", HTTP_METHOD_OTHER},
    {"blank lines first", "\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, HTTP_REQUEST_COMPLETE, 0,
     "/", HTTP_METHOD_GET},
    {"incomplete", "GET /metrics HTTP/1.1\r\nHost: x\r\n", 0, 0, 0, NULL, HTTP_METHOD_GET},
    {"no Host", "GET / HTTP/1.1\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 400, NULL, 0},
    {"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 400,
     NULL, 0},
    {"HTTP/2", "GET / HTTP/2.0\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 505, NULL, 0},
    {"garbage", "\x16\x03\x01", 0, HTTP_REQUEST_E_INVALID, 400, NULL, 0},
    {"NUL", "GET / HTTP/1.1\r\nHost: x\0\r\n\r\n", sizeof "GET / HTTP/1.1\r\nHost: x\0\r\n\r\n" - 1,
     HTTP_REQUEST_E_INVALID, 400, NULL, 0},
    {"folding", "GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 400,
     NULL, 0},
    {"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 400,
     NULL, 0},
    {"CR without LF", "GET / HTTP/1.1\rHost: x\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 400, NULL, 0},
    {"conflicting Content-Length",
     "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 0,
     HTTP_REQUEST_E_INVALID, 400, NULL, 0},
    {"Content-Length and Transfer-Encoding",
     "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 0,
     HTTP_REQUEST_E_INVALID, 400, NULL, 0},
    {"relative target", "GET metrics HTTP/1.1\r\nHost: x\r\n\r\n", 0, HTTP_REQUEST_E_INVALID, 400,
     NULL, 0},
};

static int feed_whole(const parse_case *c, http_request *req)
{
    size_t len = c->len ? c->len : strlen(c->head);
    http_request_init(req);
    return http_request_feed(req, c->head, len);
}

static int feed_bytewise(const parse_case *c, http_request *req)
{
    size_t len = c->len ? c->len : strlen(c->head);
    int rc = 0;
    http_request_init(req);
    for (size_t n = 1; n <= len && rc == 0; n++)
        rc = http_request_feed(req, c->head, n);
    return rc;
}

static void check(const parse_case *c, const http_request *req, int rc, const char *how)
{
    cr_expect_eq(rc, c->expected, "%s (%s): got %d", c->name, how, rc);
    if (rc == HTTP_REQUEST_E_INVALID && c->expected == HTTP_REQUEST_E_INVALID) {
        cr_expect_eq(req->status, c->status, "%s (%s): status %d", c->name, how, req->status);
        cr_expect(req->why != NULL, "%s (%s): no reason", c->name, how);
    }
    if (rc == HTTP_REQUEST_COMPLETE && c->expected == HTTP_REQUEST_COMPLETE) {
        cr_expect_eq(req->path_len, strlen(c->path), "%s (%s): path length", c->name, how);
        cr_expect(memcmp(c->head + req->path_offset, c->path, req->path_len) == 0, "%s (%s): path",
                  c->name, how);
        cr_expect_eq(req->method, c->method, "%s (%s): method", c->name, how);
    }
}

Test(http_request, table_whole_and_byte_by_byte)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        http_request req;
        check(&cases[i], &req, feed_whole(&cases[i], &req), "whole");
        check(&cases[i], &req, feed_bytewise(&cases[i], &req), "byte by byte");
    }
}

Test(http_request, head_larger_than_the_limit)
{
    static char head[HTTP_HEAD_MAX];
    http_request req;

    /* Only a request line, never ending: 414. */
    memcpy(head, "GET /", 5);
    memset(head + 5, 'a', sizeof head - 5);
    http_request_init(&req);
    cr_expect_eq(http_request_feed(&req, head, sizeof head), HTTP_REQUEST_E_INVALID);
    cr_expect_eq(req.status, 414);

    /* A request line, then header fields that never end: 431. */
    const char *line = "GET / HTTP/1.1\r\nHost: x\r\nX-Long: ";
    memcpy(head, line, strlen(line));
    memset(head + strlen(line), 'a', sizeof head - strlen(line));
    http_request_init(&req);
    cr_expect_eq(http_request_feed(&req, head, sizeof head - 1), 0);
    cr_expect_eq(http_request_feed(&req, head, sizeof head), HTTP_REQUEST_E_INVALID);
    cr_expect_eq(req.status, 431);
}

Test(http_request, bytes_after_the_head_are_not_examined)
{
    const char *head = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\x01\x02garbage";
    http_request req;
    http_request_init(&req);
    cr_expect_eq(http_request_feed(&req, head, strlen(head)), HTTP_REQUEST_COMPLETE);
}
