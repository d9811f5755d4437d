/*
 * http_server — the ops endpoint: GET/HEAD /metrics, /healthz and /readyz over HTTP/1.1 on the
 * libuv loop.
 *
 * Why not a library: the endpoint serves three fixed read-only routes to Prometheus and health
 * checkers. Debian 12's candidates either run their own threads or event loop (libmicrohttpd:
 * the page would have to be rendered off the loop thread, which owns the metrics) or are only a
 * parser (http-parser is archived upstream, llhttp is not in Debian 12), and the parser is the
 * easy part here: what matters is the connection policy, which no parser gives us. So this is a
 * small uv_tcp server with hard limits:
 *   - the request head (request line + header fields + blank line) must fit in 8 KiB
 *     (HTTP_HEAD_MAX), else 431 (414 when even the request line does not fit);
 *   - the whole head must arrive within head_timeout_ms of the accept (default 5 s), counted
 *     from the accept, not per read, so a slowloris trickle is closed on time;
 *   - at most max_connections (default 64) live connections; further ones are accepted, told
 *     503 with a best-effort non-blocking write, and closed at once;
 *   - every response carries `Connection: close`; after it is written the server half-closes
 *     and discards what the client still sends for up to linger_ms (so the kernel does not turn
 *     unread bytes into a reset that would destroy the response), then closes; writing the
 *     response and lingering are bounded by write_timeout_ms.
 * The request head is parsed by http_request.h (incremental and strict, following RFC 9112);
 * bytes that cannot start a valid request get 400 as soon as they arrive. Request bodies are
 * never read (the routes take none; the connection closes after the response, so there is no
 * framing to get wrong). Status codes: 200, 404 (unknown path), 405 (known path, method other
 * than GET/HEAD; with Allow), 400, 408 is never sent (a timed-out head is just closed), 414, 431,
 * 500 (rendering ran out of memory), 503 (/readyz not ready, or too many connections), 505
 * (HTTP/2+ on this socket).
 *
 * Errors: 0 or a negative libuv error code (UV_E*), with the detail in the caller's err buffer.
 *
 * Thread affinity: loop thread only — creation, every callback (including ready and the
 * metrics rendering) and http_server_free. The caller must ignore SIGPIPE (libuv writes to
 * sockets with write(2), and a client that resets mid-response would otherwise kill the
 * process).
 */
#ifndef IDEMQ_HTTP_SERVER_H
#define IDEMQ_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "ops/http_request.h" /* HTTP_HEAD_MAX */
#include "ops/metrics.h"

typedef struct http_server http_server;

/*
 * Readiness of the process for /readyz, asked on the loop thread for each request. Returns true
 * when ready, with reason empty or saying what it is ready with (e.g. "MySQL node
 * 10.0.0.2:3306", answered as "ready: MySQL node 10.0.0.2:3306"); otherwise writes a short
 * human-readable reason (no newline, e.g. "database unavailable (consumption paused)") into
 * reason[0..reason_len) and returns false.
 */
typedef bool (*http_ready_cb)(void *ctx, char *reason, size_t reason_len);

typedef struct http_server_options {
    /* "HOST:PORT" or "[IPV6]:PORT"; HOST may be a name (resolved once, synchronously, at
     * creation). Port 0 binds an ephemeral port (see http_server_port). Borrowed for the call. */
    const char *listen;
    /* Rendered for /metrics; borrowed, must outlive the server. NULL: /metrics answers 404. */
    const metrics *metrics;
    /* Readiness; NULL means always ready. ready_ctx is passed through untouched. */
    http_ready_cb ready;
    void *ready_ctx;
    /* Limits; 0 picks the default. */
    unsigned max_connections;  /* default 64 */
    uint64_t head_timeout_ms;  /* default 5000: accept → complete request head */
    uint64_t write_timeout_ms; /* default 10000: head complete → response written and lingered */
    uint64_t linger_ms;        /* default 1000: half-closed, draining the client's extra bytes */
} http_server_options;

/*
 * Binds and listens. On success returns 0 and *out (returned owned; release with
 * http_server_free). On failure returns a negative libuv error code (UV_EADDRINUSE, UV_EACCES,
 * UV_EINVAL for an unparsable address, UV_ENOMEM, …), leaves *out NULL and explains in err.
 * opts is borrowed for the call; the pointers inside it are kept as documented above.
 */
int http_server_new(uv_loop_t *loop, const http_server_options *opts, http_server **out, char *err,
                    size_t err_len);

/* The bound port (useful after binding port 0), or -1. */
int http_server_port(const http_server *s);

/* Writes the bound address as "HOST:PORT" ("[V6]:PORT" for IPv6) into buf. Returns 0 or a
 * negative libuv error code. */
int http_server_address(const http_server *s, char *buf, size_t buf_len);

/*
 * Stops listening and closes every live connection (a response being written is abandoned).
 * The handles close on the loop, so keep running it: the memory is released in their close
 * callbacks, and uv_run returns once they are all gone. The ready callback and metrics are not
 * used after this returns. NULL is a no-op.
 */
void http_server_free(http_server *s);

#endif
