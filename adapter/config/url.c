/*
 * url — see url.h.
 */
#include "config/url.h"

#include <stdio.h>
#include <stdlib.h>
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

/* Parts of a URL to hide: [begin, end) byte ranges into it. */
typedef struct mask {
    size_t begin, end;
} mask;

#define MASKS_MAX 16 /* past this many password= parameters, the rest of the URL is hidden */

/* Adds [begin, end) to masks (count of them in use), keeping them sorted and merged. An empty
 * range still prints as "***" (an empty password is hidden like any other). */
static void mask_add(mask *masks, size_t *count, size_t begin, size_t end)
{
    size_t i = 0, n = *count;
    if (begin > end)
        return;
    while (i < n && masks[i].end < begin)
        i++;
    if (i < n && masks[i].begin <= end) {
        /* Overlaps or touches masks[i]: grow it, then swallow the ones it now reaches. */
        if (begin < masks[i].begin)
            masks[i].begin = begin;
        if (end > masks[i].end)
            masks[i].end = end;
        size_t j = i + 1;
        while (j < n && masks[j].begin <= masks[i].end) {
            if (masks[j].end > masks[i].end)
                masks[i].end = masks[j].end;
            j++;
        }
        memmove(&masks[i + 1], &masks[j], (n - j) * sizeof *masks);
        *count = n - (j - i - 1);
        return;
    }
    if (n == MASKS_MAX) { /* out of room: hide everything from the last mask on */
        masks[n - 1].end = (size_t)-1;
        return;
    }
    memmove(&masks[i + 1], &masks[i], (n - i) * sizeof *masks);
    masks[i] = (mask){begin, end};
    *count = n + 1;
}

/*
 * Where the user-info ends. A valid URL has one raw '@' at most (config_check_url and the parsers
 * refuse more), so for it the last '@' is that one. For a broken one, whose password holds a raw
 * '@', '/', '?' or '#', the last '@' is the only choice that never shows a part of the password:
 * an '@' further on can only over-redact (a host, a path), never leak. The value of a password=
 * query parameter (no parser idemq uses takes one, but a URL may carry it) is hidden too, from
 * wherever a '?' or '&' starts it up to the next '&'.
 */
void config_redact_url(const char *url, char *buf, size_t buf_len)
{
    out_buf o = {buf, buf_len, 0};
    mask masks[MASKS_MAX];
    size_t count = 0, len, pos = 0;
    const char *sep, *start, *at;

    if (!buf || buf_len == 0)
        return;
    buf[0] = '\0';
    if (!url)
        return;
    len = strlen(url);
    sep = strstr(url, "://");
    start = sep ? sep + 3 : url;
    at = strrchr(start, '@');
    if (at) {
        size_t info_len = (size_t)(at - start);
        size_t user_len = strcspn(start, ":/?#");
        if (user_len < info_len && start[user_len] == ':') /* "user:***@" */
            mask_add(masks, &count, (size_t)(start + user_len + 1 - url), (size_t)(at - url));
        else if (user_len < info_len) /* a '/', '?' or '#' before any ':': hide all of it */
            mask_add(masks, &count, (size_t)(start - url), (size_t)(at - url));
        /* else a user without a password */
    }
    for (const char *p = url; (p = strpbrk(p, "?&")) != NULL; p++) {
        if (strncasecmp(p + 1, "password=", 9) == 0) {
            size_t value = (size_t)(p + 10 - url);
            mask_add(masks, &count, value, value + strcspn(url + value, "&"));
        }
    }
    for (size_t i = 0; i < count; i++) {
        size_t begin = masks[i].begin < len ? masks[i].begin : len;
        out_put(&o, url + pos, begin - pos);
        out_put(&o, "***", 3);
        pos = masks[i].end < len ? masks[i].end : len;
    }
    out_put(&o, url + pos, len - pos);
}

static bool is_hex(char c)
{
    return config_is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int hex_value(char c)
{
    return config_is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
}

/*
 * The user-info rule both parsers agree on (amqp_parse_url and db_dsn_parse): the user ends at
 * the first ':', the password at the one '@'; inside them ':' '@' '/' '?' '#' '[' ']' and '%'
 * are percent-encoded, and a '%' is followed by two hex digits, not %00. rabbitmq-c also refuses
 * %80..%FF (it decodes into a signed char). Returns 0, or -1 with a reason that names no
 * character of the password.
 */
static int check_userinfo(const char *info, size_t len, bool amqp, char *err, size_t err_len)
{
    const char *colon = memchr(info, ':', len);
    bool encoded_ok = true, high_byte = false;

    if (strcspn(info, "/?#[]") < len ||
        (colon && memchr(colon + 1, ':', len - (size_t)(colon + 1 - info))))
        encoded_ok = false;
    for (size_t i = 0; i < len && encoded_ok; i++) {
        if (info[i] != '%')
            continue;
        if (i + 2 >= len || !is_hex(info[i + 1]) || !is_hex(info[i + 2])) {
            encoded_ok = false;
            break;
        }
        int v = hex_value(info[i + 1]) * 16 + hex_value(info[i + 2]);
        if (v == 0)
            encoded_ok = false;
        if (v > 0x7f)
            high_byte = true;
        i += 2;
    }
    if (!encoded_ok) {
        snprintf(err, err_len,
                 "has a user or password that is not percent-encoded (write : @ / ? # [ ] %% "
                 "in them as %%3A %%40 %%2F %%3F %%23 %%5B %%5D %%25)");
        return -1;
    }
    if (amqp && high_byte) {
        snprintf(err, err_len,
                 "has a user or password with a percent-encoded byte above %%7F, which "
                 "rabbitmq-c cannot decode: write such bytes unencoded, or use "
                 "amqp.password_file");
        return -1;
    }
    return 0;
}

/* Checks "host:port" (host may be "[v6]"); host_required says whether an empty host is wrong. */
static int check_host_port(const char *s, size_t n, bool host_required, bool port_required,
                           bool port_zero_ok, char *err, size_t err_len)
{
    const char *end = s + n, *port = NULL;
    size_t host_len;

    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close) {
            snprintf(err, err_len, "has an unterminated IPv6 address");
            return -1;
        }
        host_len = (size_t)(close + 1 - s);
        if (close + 1 < end) {
            if (close[1] != ':') {
                snprintf(err, err_len, "has text after the IPv6 address");
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
        snprintf(err, err_len, "has no host");
        return -1;
    }
    if (!port && port_required) {
        snprintf(err, err_len, "has no port (expected HOST:PORT)");
        return -1;
    }
    if (port) {
        unsigned long v = 0;
        const char *p = port;
        for (; p < end && config_is_digit(*p) && v <= 65535; p++)
            v = v * 10 + (unsigned long)(*p - '0');
        if (p == port || p != end || (v == 0 && !port_zero_ok) || v > 65535) {
            snprintf(err, err_len, "has an invalid port (expected %s..65535)",
                     port_zero_ok ? "0" : "1");
            return -1;
        }
    }
    return 0;
}

int config_check_url(const char *text, const char *const *schemes, const char *expect,
                     bool socket_ok, char *err, size_t err_len)
{
    char redacted[256], shown[128];
    const char *auth = NULL, *at, *host;
    size_t host_len;
    bool amqp = strncmp(text, "amqp", 4) == 0;
    char sub[256];

    config_redact_url(text, redacted, sizeof redacted);
    config_show(shown, sizeof shown, redacted);
    for (const char *p = text; *p; p++) {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
            snprintf(err, err_len, "'%s' contains spaces or control characters", shown);
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
        snprintf(err, err_len, "'%s' must start with %s", shown, expect);
        return -1;
    }
    /* One raw '@' at most, ending the user-info: that is where redaction and both parsers split
     * (an '@' anywhere else is written %40). */
    at = strchr(auth, '@');
    if (at && strchr(at + 1, '@')) {
        snprintf(err, err_len,
                 "'%s' has more than one '@' (write an '@' in the user, password, path or query "
                 "as %%40)",
                 shown);
        return -1;
    }
    if (at && check_userinfo(auth, (size_t)(at - auth), amqp, sub, sizeof sub) < 0) {
        snprintf(err, err_len, "'%s' %s", shown, sub);
        return -1;
    }
    host = at ? at + 1 : auth;
    host_len = strcspn(host, "/?#");
    if (amqp && host[host_len] != '\0' &&
        (host[host_len] != '/' ||
         strcspn(host + host_len + 1, ":/?#[]") != strlen(host + host_len + 1))) {
        /* amqp_parse_url takes no query and ends the vhost at any of these. */
        snprintf(err, err_len,
                 "'%s' has a vhost that is not percent-encoded, or a query (write : / ? # [ ] "
                 "in the vhost as %%3A %%2F %%3F %%23 %%5B %%5D; the vhost / is %%2f)",
                 shown);
        return -1;
    }
    if (host_len == 0 && socket_ok && (strstr(text, "?socket=") || strstr(text, "&socket=")))
        return 0;
    if (check_host_port(host, host_len, true, false, false, sub, sizeof sub) < 0) {
        snprintf(err, err_len, "'%s' %s", shown, sub);
        return -1;
    }
    return 0;
}

/* Decodes [begin, end) into out (NUL-terminated). Returns -1 when it does not fit or is bad. */
static int percent_decode(const char *begin, const char *end, char *out, size_t out_len)
{
    size_t n = 0;
    for (const char *p = begin; p < end; p++) {
        char c = *p;
        if (c == '%') {
            if (end - p < 3 || !is_hex(p[1]) || !is_hex(p[2]))
                return -1;
            c = (char)(hex_value(p[1]) * 16 + hex_value(p[2]));
            if (c == '\0')
                return -1;
            p += 2;
        }
        if (n + 1 >= out_len)
            return -1;
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

int config_parse_mysql_url(const char *url, config_mysql_url *out, char *err, size_t err_len)
{
    static const char scheme[] = "mysql://";
    memset(out, 0, sizeof *out);
    out->port = 3306;
    if (strncmp(url, scheme, sizeof scheme - 1) != 0) {
        snprintf(err, err_len, "must start with mysql://");
        return -1;
    }
    const char *p = url + sizeof scheme - 1;
    /* The user-info rule of config/url.h, which amqp_parse_url follows too: one raw '@' at most,
     * ending user[:password]; the user ends at the first ':'; reserved characters inside them
     * are percent-encoded. */
    const char *at = strchr(p, '@');
    if (at && strchr(at + 1, '@')) {
        snprintf(err, err_len,
                 "more than one '@' (write an '@' in the user, password or socket path as %%40)");
        return -1;
    }
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *user_end = colon ? colon : at;
        if (strcspn(p, "/?#[]") < (size_t)(at - p) ||
            (colon && memchr(colon + 1, ':', (size_t)(at - colon - 1)))) {
            snprintf(err, err_len, "user or password is not percent-encoded");
            return -1;
        }
        if (percent_decode(p, user_end, out->user, sizeof out->user) < 0 ||
            (colon && percent_decode(colon + 1, at, out->password, sizeof out->password) < 0)) {
            snprintf(err, err_len, "user or password is malformed or too long");
            return -1;
        }
        p = at + 1;
    }
    const char *authority_end = p + strcspn(p, "/?");
    const char *host_begin = p, *host_end = authority_end, *port_colon;
    if (*p == '[') { /* an IPv6 literal: the host is what the brackets hold */
        const char *close = memchr(p, ']', (size_t)(authority_end - p));
        if (!close) {
            snprintf(err, err_len, "has an unterminated IPv6 address");
            return -1;
        }
        host_begin = p + 1;
        host_end = close;
        port_colon = close + 1 < authority_end && close[1] == ':' ? close + 1 : NULL;
        if (!port_colon && close + 1 != authority_end) {
            snprintf(err, err_len, "has text after the IPv6 address");
            return -1;
        }
    } else {
        port_colon = memchr(p, ':', (size_t)(authority_end - p));
    }
    if (port_colon) {
        char *end = NULL;
        long port = strtol(port_colon + 1, &end, 10);
        if (end != authority_end || port < 1 || port > 65535) {
            snprintf(err, err_len, "port must be 1..65535");
            return -1;
        }
        out->port = (unsigned)port;
        if (host_begin == p)
            host_end = port_colon;
    }
    if ((size_t)(host_end - host_begin) >= sizeof out->host) {
        snprintf(err, err_len, "host is too long");
        return -1;
    }
    memcpy(out->host, host_begin, (size_t)(host_end - host_begin));
    if (out->host[0] == '\0')
        strcpy(out->host, "127.0.0.1");
    p = authority_end;
    if (*p == '/') {
        p++;
        size_t len = strcspn(p, "?");
        if (percent_decode(p, p + len, out->database, sizeof out->database) < 0) {
            snprintf(err, err_len, "database name is malformed or too long");
            return -1;
        }
        p += len;
    }
    if (out->database[0] == '\0') {
        snprintf(err, err_len, "a database name is required (mysql://…/DATABASE)");
        return -1;
    }
    while (*p == '?' || *p == '&') {
        p++;
        size_t len = strcspn(p, "&");
        static const char socket_key[] = "socket=";
        if (strncmp(p, socket_key, sizeof socket_key - 1) == 0) {
            if (percent_decode(p + sizeof socket_key - 1, p + len, out->socket,
                               sizeof out->socket) < 0) {
                snprintf(err, err_len, "socket path is malformed or too long");
                return -1;
            }
        } else if (len > 0) {
            snprintf(err, err_len, "unknown parameter '%.*s' (known: socket)",
                     (int)(strcspn(p, "=&") > 64 ? 64 : strcspn(p, "=&")), p);
            return -1;
        }
        p += len;
    }
    return 0;
}


int config_check_listen(const char *text, char *err, size_t err_len)
{
    char sub[128], shown[128];
    /* Port 0 asks the kernel for a free port (logged at start): tests run several daemons. */
    if (check_host_port(text, strlen(text), true, true, true, sub, sizeof sub) < 0 ||
        config_has_control(text)) {
        snprintf(err, err_len, "'%s' is not a listen address: %s",
                 config_show(shown, sizeof shown, text),
                 config_has_control(text) ? "contains control characters" : sub);
        return -1;
    }
    return 0;
}
