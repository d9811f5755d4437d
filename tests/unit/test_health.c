/*
 * test_health — the pure parts of `idemq health` (cli/health.c): splitting --url and reading
 * the status code of a status line. The probe itself runs against sockets in
 * tests/integration/test_health.c.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "cli/cli.h"

typedef struct url_case {
    const char *url;
    const char *host, *port, *path; /* NULL host: refused */
} url_case;

Test(health, parse_url_table)
{
    static const url_case cases[] = {
        {"http://127.0.0.1:9464/healthz", "127.0.0.1", "9464", "/healthz"},
        {"HTTP://localhost/healthz", "localhost", "80", "/healthz"},
        {"http://idemq:9464", "idemq", "9464", "/"},
        {"http://idemq", "idemq", "80", "/"},
        {"http://[::1]:9464/readyz", "::1", "9464", "/readyz"},
        {"http://[::1]/x?y=1", "::1", "80", "/x?y=1"},
        {"http://127.0.0.1:09464/healthz", "127.0.0.1", "9464", "/healthz"},
        {"https://127.0.0.1/healthz", NULL, NULL, NULL},
        {"127.0.0.1:9464", NULL, NULL, NULL},
        {"http://", NULL, NULL, NULL},
        {"http://:9464/", NULL, NULL, NULL},
        {"http://[::1:9464/", NULL, NULL, NULL},
        {"http://h:0/", NULL, NULL, NULL},
        {"http://h:65536/", NULL, NULL, NULL},
        {"http://h:123456/", NULL, NULL, NULL},
        {"http://h:/", NULL, NULL, NULL},
        {"http://h:12x/", NULL, NULL, NULL},
        {"http://h?x", NULL, NULL, NULL},
        {"http://h/a b", NULL, NULL, NULL},
        {"http://h/a\r\nX: y", NULL, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const url_case *c = &cases[i];
        health_target t;
        char err[256] = "";
        int rc = cli_health_parse_url(c->url, &t, err, sizeof err);
        if (!c->host) {
            cr_expect_eq(rc, -1, "%s: accepted", c->url);
            cr_expect(err[0], "%s: refused without a reason", c->url);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: refused: %s", c->url, err);
        cr_expect_str_eq(t.host, c->host, "%s: host", c->url);
        cr_expect_str_eq(t.port, c->port, "%s: port", c->url);
        cr_expect_str_eq(t.path, c->path, "%s: path", c->url);
    }
}

typedef struct status_case {
    const char *line;
    int code;
} status_case;

Test(health, status_code_table)
{
    static const status_case cases[] = {
        {"HTTP/1.1 200 OK\r\n", 200},
        {"HTTP/1.0 200 OK\r\n", 200},
        {"HTTP/1.1 200\r\n", 200},
        {"HTTP/1.1 200", 200},
        {"HTTP/1.1 503 Service Unavailable\r\n", 503},
        {"HTTP/1.1 404 Not Found\n", 404},
        {"HTTP/1.1 2000 OK\r\n", -1},
        {"HTTP/1.1 20 OK\r\n", -1},
        {"HTTP/1.1 099 x\r\n", -1},
        {"HTTP/2 200\r\n", -1},
        {"HTTP/1.1  200 OK\r\n", -1},
        {"http/1.1 200 OK\r\n", -1},
        {"SSH-2.0-OpenSSH_9.2\r\n", -1},
        {"", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(cli_health_status_code(cases[i].line, strlen(cases[i].line)), cases[i].code,
                     "\"%s\"", cases[i].line);
}
