/*
 * http_request — the strict, incremental parser of one HTTP/1.x request head (RFC 9112) for the
 * ops endpoint (http_server.h). Pure: no I/O, no allocation, no libuv, so it is tested byte by
 * byte without a socket.
 *
 * The caller keeps the received bytes in one buffer and calls http_request_feed with the whole
 * buffer after each read; the parser remembers how far it got, so each byte is examined once
 * (apart from a trailing CR whose LF has not arrived yet). It accepts a request line
 * `METHOD SP origin-form|absolute-form SP HTTP/1.x`, CRLF or bare LF line ends, token field names
 * with no space before the colon; it rejects control bytes (NUL included) anywhere, obsolete line
 * folding, anything but exactly one Host for HTTP/1.1, a bad or conflicting Content-Length,
 * Content-Length together with Transfer-Encoding, and a head larger than HTTP_HEAD_MAX. Bytes that
 * cannot start a valid request are rejected as soon as they arrive. Bodies are not parsed.
 *
 * Errors: 0 or a negative code (HTTP_REQUEST_E_*); a function that can also succeed in more than
 * one way says so (http_request_feed's HTTP_REQUEST_COMPLETE). The detail of a rejection is in
 * the request itself (status to answer, reason for the debug log).
 *
 * Thread affinity: none (one request is used by one thread at a time).
 */
#ifndef IDEMQ_HTTP_REQUEST_H
#define IDEMQ_HTTP_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/errors.h"

/* The request head (request line + header fields + blank line) must fit in this many bytes. */
#define HTTP_HEAD_MAX 8192

/* http_request_feed: the head is complete (a success, like 0). */
#define HTTP_REQUEST_COMPLETE 1

typedef enum http_method {
    HTTP_METHOD_OTHER, /* any other token: the routes answer 405 */
    HTTP_METHOD_GET,
    HTTP_METHOD_HEAD,
} http_method;

typedef struct http_request {
    /* parser position, in bytes of the caller's buffer */
    size_t line_start; /* start of the line being received */
    size_t scanned;    /* bytes already checked byte by byte */
    unsigned blank_lines;
    unsigned header_fields;
    /* what was parsed */
    bool have_request_line;
    http_method method;
    int minor;          /* HTTP/1.minor */
    size_t path_offset; /* the path (no query) is buf[path_offset, path_offset + path_len) */
    size_t path_len;    /* 0 for "http://host" (meaning "/") */
    unsigned hosts;
    bool has_content_length;
    uint64_t content_length;
    bool has_transfer_encoding;
    /* after HTTP_REQUEST_E_INVALID */
    int status;      /* the HTTP status to answer: 400, 414, 431 or 505 */
    const char *why; /* static text, for the debug log */
} http_request;

/* Starts a new request (caller-owned storage; nothing to release). */
void http_request_init(http_request *req);

/*
 * Parses what arrived since the last call. buf holds every byte of the head received so far
 * (borrowed, the same buffer with the same first bytes on each call) and len counts them.
 * Returns 0 when more bytes are needed, HTTP_REQUEST_COMPLETE when the blank line ending the head
 * arrived (bytes after it are not examined), or HTTP_REQUEST_E_INVALID with req->status and
 * req->why set; after a non-zero return, feeding more is not meaningful.
 */
int http_request_feed(http_request *req, const char *buf, size_t len);

#endif
