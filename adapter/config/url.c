/*
 * url — see url.h.
 */
#include "config/url.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config/text.h"

typedef struct out_buf {
    char *buf;
    size_t len, pos;
} out_buf;

static void out_put(out_buf *o, const char *s, size_t n)
{
    while (n-- && o->pos + 1 < o->len)
        o->buf[o->pos++] = *s++;
    o->buf[o->pos] = '\0';
}

/* Copies a query string, replacing the value of any password parameter. */
static void put_query_redacted(out_buf *o, const char *q)
{
    while (*q && *q != '#') {
        size_t n = strcspn(q, "&#");
        size_t name = strcspn(q, "=&#");
        if (name < n && (name == 8 && strncasecmp(q, "password", 8) == 0)) {
            out_put(o, q, name + 1);
            out_put(o, "***", 3);
        } else {
            out_put(o, q, n);
        }
        q += n;
        if (*q == '&')
            out_put(o, q++, 1);
    }
    out_put(o, q, strlen(q));
}

void config_redact_url(const char *url, char *buf, size_t buf_len)
{
    out_buf o = {buf, buf_len, 0};
    const char *sep, *start, *at = NULL, *colon, *rest, *query;
    size_t auth_len;

    if (!buf || buf_len == 0)
        return;
    buf[0] = '\0';
    if (!url)
        return;
    sep = strstr(url, "://");
    start = sep ? sep + 3 : url;
    auth_len = strcspn(start, "/?#");
    for (size_t i = 0; i < auth_len; i++)
        if (start[i] == '@')
            at = start + i;
    /* A password holding an unencoded '/', '?' or '#' ends the authority early and hides the
     * real '@' further on. Such URLs do not work anyway, but they must not leak: take the last
     * '@' and redact everything between the first ':' and it. */
    colon = NULL;
    if (at) {
        colon = memchr(start, ':', (size_t)(at - start));
    } else if ((at = strrchr(start, '@')) != NULL) {
        colon = memchr(start, ':', (size_t)(at - start));
        if (!colon)
            at = NULL; /* an '@' in a path or query, not a user:password */
    }
    rest = start;
    if (colon) {
        out_put(&o, url, (size_t)(colon + 1 - url));
        out_put(&o, "***", 3);
        rest = at;
    } else if (at) {
        out_put(&o, url, (size_t)(at - url));
        rest = at;
    } else {
        out_put(&o, url, (size_t)(start - url));
    }
    query = strchr(rest, '?');
    if (!query) {
        out_put(&o, rest, strlen(rest));
        return;
    }
    out_put(&o, rest, (size_t)(query + 1 - rest));
    put_query_redacted(&o, query + 1);
}

/* Checks "host:port" (host may be "[v6]"); host_required says whether an empty host is wrong. */
static int check_host_port(const char *s, size_t n, bool host_required, bool port_required,
                           bool port_zero_ok, char *why, size_t why_len)
{
    const char *end = s + n, *port = NULL;
    size_t host_len;

    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close) {
            snprintf(why, why_len, "has an unterminated IPv6 address");
            return -1;
        }
        host_len = (size_t)(close + 1 - s);
        if (close + 1 < end) {
            if (close[1] != ':') {
                snprintf(why, why_len, "has text after the IPv6 address");
                return -1;
            }
            port = close + 2;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        host_len = colon ? (size_t)(colon - s) : n;
        port = colon ? colon + 1 : NULL;
    }
    if (host_required && host_len == 0) {
        snprintf(why, why_len, "has no host");
        return -1;
    }
    if (!port && port_required) {
        snprintf(why, why_len, "has no port (expected HOST:PORT)");
        return -1;
    }
    if (port) {
        unsigned long v = 0;
        const char *p = port;
        for (; p < end && config_is_digit(*p) && v <= 65535; p++)
            v = v * 10 + (unsigned long)(*p - '0');
        if (p == port || p != end || (v == 0 && !port_zero_ok) || v > 65535) {
            snprintf(why, why_len, "has an invalid port (expected %s..65535)",
                     port_zero_ok ? "0" : "1");
            return -1;
        }
    }
    return 0;
}

int config_check_url(const char *text, const char *const *schemes, const char *expect,
                     bool socket_ok, char *why, size_t why_len)
{
    char redacted[256], shown[128];
    const char *auth = NULL, *at;
    size_t auth_len, host_off = 0;
    char sub[160];

    config_redact_url(text, redacted, sizeof redacted);
    config_show(shown, sizeof shown, redacted);
    for (const char *p = text; *p; p++) {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
            snprintf(why, why_len, "'%s' contains spaces or control characters", shown);
            return -1;
        }
    }
    for (size_t i = 0; schemes[i]; i++) {
        size_t n = strlen(schemes[i]);
        if (strncmp(text, schemes[i], n) == 0 && strncmp(text + n, "://", 3) == 0) {
            auth = text + n + 3;
            break;
        }
    }
    if (!auth) {
        snprintf(why, why_len, "'%s' must start with %s", shown, expect);
        return -1;
    }
    auth_len = strcspn(auth, "/?#");
    at = NULL;
    for (size_t i = 0; i < auth_len; i++)
        if (auth[i] == '@')
            at = auth + i;
    if (at)
        host_off = (size_t)(at + 1 - auth);
    if (auth_len == host_off && socket_ok && (strstr(text, "?socket=") || strstr(text, "&socket=")))
        return 0;
    if (check_host_port(auth + host_off, auth_len - host_off, true, false, false, sub, sizeof sub) <
        0) {
        snprintf(why, why_len, "'%s' %s", shown, sub);
        return -1;
    }
    return 0;
}

int config_check_listen(const char *text, char *why, size_t why_len)
{
    char sub[128], shown[128];
    /* Port 0 asks the kernel for a free port (logged at start): tests run several daemons. */
    if (check_host_port(text, strlen(text), true, true, true, sub, sizeof sub) < 0 ||
        config_has_control(text)) {
        snprintf(why, why_len, "'%s' is not a listen address: %s",
                 config_show(shown, sizeof shown, text),
                 config_has_control(text) ? "contains control characters" : sub);
        return -1;
    }
    return 0;
}
