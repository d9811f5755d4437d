/*
 * http_request — see http_request.h. Lines are parsed as they complete: the request line first,
 * then one field line at a time, then the checks that need the whole head. Thread affinity: none.
 */
#include "ops/http_request.h"

#include <string.h>
#include <strings.h>

#define MAX_METHOD 32
#define MAX_HEADER_FIELDS 100
#define MAX_BLANK_LINES 4 /* ignored before the request line (RFC 9112 §2.2) */

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

static int reject(http_request *req, int status, const char *why)
{
    req->status = status;
    req->why = why;
    return HTTP_REQUEST_E_INVALID;
}

/* `METHOD SP request-target SP HTTP-version`, already free of control and non-ASCII bytes; line
 * starts at buf + offset. */
static int parse_request_line(http_request *req, const char *buf, size_t offset, size_t n)
{
    const char *line = buf + offset;
    const char *sp1 = memchr(line, ' ', n);
    if (!sp1)
        return reject(req, 400, "request line has no spaces");
    const char *target = sp1 + 1;
    const char *sp2 = memchr(target, ' ', (size_t)(line + n - target));
    if (!sp2)
        return reject(req, 400, "request line has no HTTP version");
    const char *version = sp2 + 1;
    size_t method_len = (size_t)(sp1 - line), target_len = (size_t)(sp2 - target);
    size_t version_len = (size_t)(line + n - version);

    if (method_len == 0 || method_len > MAX_METHOD)
        return reject(req, 400, "bad method");
    for (size_t i = 0; i < method_len; i++)
        if (!is_tchar((unsigned char)line[i]))
            return reject(req, 400, "bad method");
    if (target_len == 0)
        return reject(req, 400, "empty request target");
    for (size_t i = 0; i < target_len; i++)
        if ((unsigned char)target[i] <= 0x20 || (unsigned char)target[i] >= 0x7f)
            return reject(req, 400, "bad request target");
    if (version_len != 8 || memcmp(version, "HTTP/", 5) != 0 || version[5] < '0' ||
        version[5] > '9' || version[6] != '.' || version[7] < '0' || version[7] > '9')
        return reject(req, 400, "bad HTTP version");
    if (version[5] != '1')
        return reject(req, 505, "HTTP version not supported");
    req->minor = version[7] - '0';

    if (method_len == 3 && memcmp(line, "GET", 3) == 0)
        req->method = HTTP_METHOD_GET;
    else if (method_len == 4 && memcmp(line, "HEAD", 4) == 0)
        req->method = HTTP_METHOD_HEAD;
    else
        req->method = HTTP_METHOD_OTHER;

    /* origin-form "/path?query", or absolute-form "http://authority/path?query" */
    const char *path = target, *end = target + target_len;
    if (target_len >= 7 && strncasecmp(target, "http://", 7) == 0)
        path = target + 7;
    else if (target_len >= 8 && strncasecmp(target, "https://", 8) == 0)
        path = target + 8;
    if (path != target) {
        const char *slash = memchr(path, '/', (size_t)(end - path));
        if (slash == path)
            return reject(req, 400, "absolute URI without authority");
        path = slash ? slash : end; /* "http://host" means "/" */
    } else if (target[0] != '/') {
        return reject(req, 400, "request target is not a path");
    }
    const char *path_end = path;
    while (path_end < end && *path_end != '?')
        path_end++;
    req->path_offset = (size_t)(path - buf);
    req->path_len = (size_t)(path_end - path);
    req->have_request_line = true;
    return 0;
}

/* `field-name ":" OWS field-value OWS`, already free of control bytes other than HTAB. */
static int parse_field_line(http_request *req, const char *line, size_t n)
{
    if (line[0] == ' ' || line[0] == '\t')
        return reject(req, 400, "obsolete line folding");
    if (++req->header_fields > MAX_HEADER_FIELDS)
        return reject(req, 431, "too many header fields");
    const char *colon = memchr(line, ':', n);
    if (!colon || colon == line)
        return reject(req, 400, "header field without a name");
    size_t name_len = (size_t)(colon - line);
    for (size_t i = 0; i < name_len; i++)
        if (!is_tchar((unsigned char)line[i]))
            return reject(req, 400, "bad header field name");
    const char *value = colon + 1, *end = line + n;
    while (value < end && (*value == ' ' || *value == '\t'))
        value++;
    while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t value_len = (size_t)(end - value);

    if (tokens_equal(line, name_len, "host")) {
        req->hosts++;
    } else if (tokens_equal(line, name_len, "content-length")) {
        uint64_t v = 0;
        if (value_len == 0 || value_len > 18)
            return reject(req, 400, "bad Content-Length");
        for (size_t i = 0; i < value_len; i++) {
            if (value[i] < '0' || value[i] > '9')
                return reject(req, 400, "bad Content-Length");
            v = v * 10 + (uint64_t)(value[i] - '0');
        }
        if (req->has_content_length && v != req->content_length)
            return reject(req, 400, "conflicting Content-Length");
        req->has_content_length = true;
        req->content_length = v;
    } else if (tokens_equal(line, name_len, "transfer-encoding")) {
        req->has_transfer_encoding = true;
    }
    return 0;
}

/* One complete line (without its line end) at buf + offset. */
static int parse_line(http_request *req, const char *buf, size_t offset, size_t n)
{
    if (!req->have_request_line) {
        if (n == 0)
            return ++req->blank_lines > MAX_BLANK_LINES
                       ? reject(req, 400, "blank lines instead of a request")
                       : 0;
        return parse_request_line(req, buf, offset, n);
    }
    if (n > 0)
        return parse_field_line(req, buf + offset, n);
    /* The blank line: the head is complete. */
    if (req->hosts > 1 || (req->minor >= 1 && req->hosts == 0))
        return reject(req, 400, req->hosts ? "more than one Host" : "HTTP/1.1 without Host");
    if (req->has_transfer_encoding && req->has_content_length)
        return reject(req, 400, "both Transfer-Encoding and Content-Length");
    if (req->has_transfer_encoding && req->minor == 0)
        return reject(req, 400, "Transfer-Encoding in an HTTP/1.0 request");
    return HTTP_REQUEST_COMPLETE;
}

void http_request_init(http_request *req)
{
    memset(req, 0, sizeof *req);
}

int http_request_feed(http_request *req, const char *buf, size_t len)
{
    while (req->scanned < len) {
        const char *nl = memchr(buf + req->scanned, '\n', len - req->scanned);
        size_t end = nl ? (size_t)(nl - buf) : len;
        for (size_t i = req->scanned; i < end; i++) {
            unsigned char ch = (unsigned char)buf[i];
            if (ch == '\r') {
                if (i + 1 < len && buf[i + 1] != '\n')
                    return reject(req, 400, "CR not followed by LF");
            } else if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
                return reject(req, 400, "control byte in the request head");
            } else if (!req->have_request_line && (ch >= 0x80 || ch == '\t')) {
                return reject(req, 400, "non-ASCII byte in the request line");
            }
        }
        if (!nl) {
            req->scanned = buf[len - 1] == '\r' ? len - 1 : len;
            if (!req->have_request_line) {
                /* Reject garbage early: the method must be a short token. */
                size_t i = req->line_start;
                while (i < len && i - req->line_start <= MAX_METHOD &&
                       is_tchar((unsigned char)buf[i]))
                    i++;
                if (i - req->line_start > MAX_METHOD ||
                    (i < len && buf[i] != ' ' && !(buf[i] == '\r' && i == req->line_start)))
                    return reject(req, 400, "bad method");
            }
            break;
        }
        size_t line_end = end;
        if (line_end > req->line_start && buf[line_end - 1] == '\r')
            line_end--;
        req->scanned = end + 1;
        size_t line_start = req->line_start;
        req->line_start = end + 1;
        int rc = parse_line(req, buf, line_start, line_end - line_start);
        if (rc != 0)
            return rc;
    }
    if (len >= HTTP_HEAD_MAX)
        return reject(req, req->have_request_line ? 431 : 414,
                      "request head larger than HTTP_HEAD_MAX bytes");
    return 0;
}
