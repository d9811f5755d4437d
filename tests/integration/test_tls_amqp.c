/*
 * test_tls_amqp — the real idemq over TLS to RabbitMQ (amqps://, amqp.tls): the broker's TLS
 * listener from scripts/services (IDEMQ_TEST_AMQPS_URL; its test CA and certificates in
 * IDEMQ_TEST_TLS_DIR, see "RabbitMQ TLS" there), which asks for a client certificate, trusts only
 * the test CA and offers EXTERNAL login for user idemq-client.
 *
 *   - verify: true with the CA: an effective-once workload runs over TLS; `idemq check` prints
 *     the negotiated version and cipher;
 *   - without the CA (system trust store only) and with a wrong server_name: `check`, `run`,
 *     `topology` and `dlq` fail with one line naming what did not match;
 *   - server_name is both the SNI and the name verified: a small TLS server in the test picks
 *     its certificate by SNI and records it;
 *   - mutual TLS: a client certificate with a password (PLAIN) and without one (EXTERNAL login,
 *     the broker names the user from the certificate); one from an unknown CA is refused with a
 *     clear line;
 *   - verify: false connects, and warns at start.
 *
 * Publishing and the broker's view go through the harness's plain connection to the same broker
 * (IDEMQ_TEST_AMQP_URL) and `rabbitmqctl list_connections`. Each wait is on a log line, a row
 * count or a process exit; no sleep stands in for an event.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define READY_LINE "consuming with handler"
#define DEADLINE_MS 60000
#define CLIENT_CN "idemq-client"
#define UNTRUSTED_ATTEMPTS 20

/* ------------------------------------------------------------------------------ fixture */

static harness_fixture F;

static void teardown(void)
{
    harness_fixture_fini(&F);
}

TestSuite(tls_amqp, .fini = teardown, .timeout = 120);

static const char *need_env(const char *name)
{
    const char *v = getenv(name);
    cr_assert(v && *v,
              "%s is not set: source .state/env of a scripts/services that has the RabbitMQ TLS "
              "listener (scripts/services restart-rabbitmq adds it to an older broker)",
              name);
    return v;
}

/* IDEMQ_TEST_TLS_DIR/name into buf. */
static const char *tls_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", need_env("IDEMQ_TEST_TLS_DIR"), name);
    cr_assert(access(buf, R_OK) == 0, "%s is missing (scripts/services start makes it)", buf);
    return buf;
}

/* host:port of IDEMQ_TEST_AMQPS_URL ("127.0.0.1:5671"). */
static void amqps_host_port(char *buf, size_t len)
{
    const char *url = need_env("IDEMQ_TEST_AMQPS_URL");
    const char *at = strrchr(url, '@');
    const char *start = at ? at + 1 : url + strlen("amqps://");
    size_t n = strcspn(start, "/");
    snprintf(buf, len, "%.*s", (int)n, start);
}

/* An amqps:// URL for the TLS listener with the given user-info ("guest:guest", "idemq-client"). */
static void amqps_url(char *buf, size_t len, const char *userinfo)
{
    char hp[128];
    amqps_host_port(hp, sizeof hp);
    snprintf(buf, len, "amqps://%s@%s/%%2f", userinfo, hp);
}

/* Replaces the amqp line of F's config (the harness writes it as line 1) with url and the tls
 * block tls_flow (a YAML flow mapping). */
static void set_amqp(const char *url, const char *tls_flow)
{
    FILE *f = fopen(F.h.config_path, "r");
    cr_assert(f);
    static char rest[64 * 1024];
    char first[2048];
    cr_assert(fgets(first, sizeof first, f), "empty config");
    cr_assert(strncmp(first, "amqp:", 5) == 0, "the harness config no longer starts with amqp: %s",
              first);
    size_t n = fread(rest, 1, sizeof rest - 1, f);
    rest[n] = '\0';
    fclose(f);
    f = fopen(F.h.config_path, "w");
    cr_assert(f);
    fprintf(f, "amqp: {url: \"%s\", prefetch: 64, heartbeat: 10s, tls: %s}\n%s", url, tls_flow,
            rest);
    cr_assert_eq(fclose(f), 0);
}

/* The usual TLS config: guest:guest, the broker verified by name and chain with the test CA,
 * and extra_tls (NULL: nothing) in the block. */
static void set_verified(const char *extra_tls)
{
    char url[256], ca[512], tls[2048];
    amqps_url(url, sizeof url, "guest:guest");
    snprintf(tls, sizeof tls, "{ca_file: \"%s\"%s%s}", tls_path(ca, sizeof ca, "ca.pem"),
             extra_tls ? ", " : "", extra_tls ? extra_tls : "");
    set_amqp(url, tls);
}

static void init_tls(const char *name)
{
    unsetenv("IDEMQ_AMQP_URL"); /* the file's URL, whatever the developer's shell says */
    harness_fixture_init(&F, name, NULL);
    signal(SIGPIPE, SIG_IGN); /* the test's own TLS server writes to clients that may be gone */
}

static void init_verified(const char *name, const char *extra_tls)
{
    init_tls(name);
    set_verified(extra_tls);
}

/* Lines of text containing needle. */
static int count_lines(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *line = strndup(p, len);
        n += strstr(line, needle) != NULL;
        free(line);
        p += len + (end != NULL);
    }
    return n;
}

/* Expects out to hold expected on exactly one line, and nothing of rabbitmq-c's generic text. */
static void expect_one_clear_line(const char *what, const char *out, const char *expected)
{
    cr_expect(count_lines(out, expected) == 1, "%s: expected one line with \"%s\"; got:\n%s", what,
              expected, out);
    cr_expect(count_lines(out, "TLS:") == 1, "%s: more than one TLS line:\n%s", what, out);
    cr_expect(!strstr(out, "SSL peer cert verification failed") && !strstr(out, "a SSL error"),
              "%s: rabbitmq-c's generic error leaked through:\n%s", what, out);
}

/* `rabbitmqctl list_connections user auth_mechanism ssl peer_cert_subject` rows (tab-separated)
 * whose user is `user`, into buf; returns how many. */
static int broker_connections_of(const char *user, char *buf, size_t len)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "\"$IDEMQ_SERVICES\" rabbitmqctl -q list_connections user auth_mechanism ssl "
             "peer_cert_subject 2>&1");
    need_env("IDEMQ_SERVICES");
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen rabbitmqctl");
    char line[1024];
    int n = 0;
    size_t used = 0;
    buf[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        size_t ul = strlen(user);
        if (strncmp(line, user, ul) == 0 && line[ul] == '\t') {
            n++;
            used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s", line);
        }
    }
    cr_assert_eq(pclose(p), 0, "rabbitmqctl list_connections failed");
    return n;
}

/* Publishes `orders` PAY_SUCCESS events twice each, for orders PREFIX0.. in state PAYING, and
 * waits until every order is PAID; then stops idemq and checks its summary: each applied once. */
static void run_effective_once_workload(const char *prefix, int orders)
{
    harness_insert_orders(&F.h, prefix, orders, "PAYING");
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < orders; i++) {
            char id[64];
            snprintf(id, sizeof id, "%s%d", prefix, i);
            harness_publish_event(&F.h, id, "PAY_SUCCESS", 100 + i);
        }
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'");
    cr_assert(harness_wait_scalar(&F.h, orders, DEADLINE_MS, sql), "not every order got PAID");
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"deduped\"", orders, DEADLINE_MS),
              "the duplicates were not all deduped");
    harness_stop_idemq(&F.daemon);
    char summary[128];
    snprintf(summary, sizeof summary, "summary processed=%d deduped=%d ", orders, orders);
    cr_expect_eq(harness_log_count(&F.h, summary), 1, "expected \"%s\" in %s", summary,
                 F.h.log_path);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), orders);
}

/* ------------------------------------------------------------------------------ verified TLS */

Test(tls_amqp, effective_once_workload_over_verified_tls)
{
    init_verified("tls_workload", NULL);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    cr_assert_eq(harness_log_count_both(F.h.log_path, "RabbitMQ connection uses TLS: TLSv1.",
                                        "verified for '127.0.0.1' by ca_file"),
                 1, "idemq did not log its verified TLS connection:\n(see %s)", F.h.log_path);
    run_effective_once_workload("tw", 10);
}

Test(tls_amqp, check_prints_the_tls_version_and_cipher)
{
    init_verified("tls_check", NULL);
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    char hp[128], line[256];
    amqps_host_port(hp, sizeof hp);
    snprintf(line, sizeof line, "amqp    ok   amqps://guest:***@%s/%%2f", hp);
    cr_expect(strstr(out, line), "no \"%s\" in:\n%s", line, out);
    const char *tls = strstr(out, "amqp    tls  TLSv1.");
    cr_assert(tls, "check did not print the TLS version:\n%s", out);
    char version[16] = "", cipher[96] = "";
    cr_assert_eq(sscanf(tls, "amqp    tls  %15[^,], cipher %95[^,]", version, cipher), 2,
                 "cannot read version and cipher from: %s", tls);
    cr_expect(!strcmp(version, "TLSv1.3") || !strcmp(version, "TLSv1.2"), "version %s", version);
    cr_expect(strlen(cipher) > 4 && strcmp(cipher, "(none)") != 0, "cipher '%s'", cipher);
    cr_expect(strstr(tls, "server certificate 'CN=localhost"), "%s", tls);
    cr_expect(!strstr(out, "guest:guest"), "check printed the password:\n%s", out);
    free(out);
}

/* ------------------------------------------------------------------------------ clear failures */

Test(tls_amqp, without_the_ca_every_command_fails_with_one_clear_line)
{
    char url[256], hp[128], expected[512];
    init_tls("tls_no_ca");
    amqps_url(url, sizeof url, "guest:guest");
    set_amqp(url, "{verify: true}"); /* no ca_file: the system trust store only */
    amqps_host_port(hp, sizeof hp);
    snprintf(expected, sizeof expected,
             "TLS: the server certificate 'CN=localhost,O=idemq tests' of %s is not trusted by "
             "the system trust store (",
             hp);

    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 1, "idemq check exited %d:\n%s", rc, out);
    expect_one_clear_line("check", out, expected);
    cr_expect(strstr(out, "its chain ends in the CA 'CN=idemq test CA,O=idemq tests'") &&
                  strstr(out, "set amqp.tls.ca_file"),
              "the line does not say which CA is missing and what to do:\n%s", out);
    free(out);

    rc = harness_run_cli_command(&F.h, "topology", &out);
    cr_expect_eq(rc, 1, "idemq topology exited %d:\n%s", rc, out);
    expect_one_clear_line("topology", out, expected);
    free(out);
    const char *dlq_args[] = {"dlq", "list", "-c", F.h.config_path, "--queue", F.h.queue, NULL};
    rc = harness_run_cli(&F.h, &out, dlq_args);
    cr_expect_eq(rc, 1, "idemq dlq list exited %d:\n%s", rc, out);
    expect_one_clear_line("dlq list", out, expected);
    free(out);

    /* run: the same line in its log, and it exits instead of consuming. */
    pid_t pid = harness_spawn(&F.h);
    F.daemon = pid;
    int status = harness_stop(pid, 0, 30000); /* signal 0: only wait for its exit */
    F.daemon = 0;
    cr_expect_eq(status, 2, "idemq run exited %d (a TLS configuration problem: exit 2)", status);
    cr_expect_eq(harness_log_count(&F.h, expected), 1, "run did not log the line (see %s)",
                 F.h.log_path);
    cr_expect_eq(harness_log_count(&F.h, READY_LINE), 0);
}

Test(tls_amqp, a_wrong_server_name_fails_with_one_clear_line)
{
    init_verified("tls_wrong_name", "server_name: rmq.internal");
    char hp[128], expected[512];
    amqps_host_port(hp, sizeof hp);
    snprintf(expected, sizeof expected,
             "TLS: certificate names 'localhost', '127.0.0.1' of %s do not match server_name "
             "'rmq.internal'",
             hp);
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 1, "idemq check exited %d:\n%s", rc, out);
    expect_one_clear_line("check", out, expected);
    free(out);

    /* A name the certificate holds works, though the URL's host is an address. */
    set_verified("server_name: localhost");
    rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "verified for 'localhost'"), "%s", out);
    free(out);
}

/* ------------------------------------------------------------------------------ SNI */

/* A TLS server on 127.0.0.1 that is not a broker: for each connection it presents server.pem,
 * or other.pem (for rmq.internal) when the client asks for rmq.internal by SNI, records the SNI
 * of the first connection, finishes the handshake and closes. rabbitmq-c then fails the AMQP
 * login (and broker/tls.c's diagnostic connection, which comes next, hears no TLS alert): only
 * the TLS part is tested. */
typedef struct sni_server {
    int listener;
    int port;
    SSL_CTX *ctx, *other;
    pthread_t thread;
    int connections;
    char sni[256];     /* of the first connection; "" when the client sent none */
    bool handshake_ok; /* of the first connection */
} sni_server;

static int on_servername(SSL *ssl, int *alert, void *arg)
{
    sni_server *s = arg;
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    (void)alert;
    if (s->connections == 1)
        snprintf(s->sni, sizeof s->sni, "%s", name ? name : "");
    if (name && !strcmp(name, "rmq.internal"))
        SSL_set_SSL_CTX(ssl, s->other);
    return SSL_TLSEXT_ERR_OK;
}

static SSL_CTX *server_ctx(const char *cert, const char *key)
{
    char c[512], k[512];
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    cr_assert(ctx);
    cr_assert_eq(SSL_CTX_use_certificate_chain_file(ctx, tls_path(c, sizeof c, cert)), 1);
    cr_assert_eq(SSL_CTX_use_PrivateKey_file(ctx, tls_path(k, sizeof k, key), SSL_FILETYPE_PEM), 1);
    return ctx;
}

/* Serves until sni_server_join shuts the listener down. */
static void *sni_serve(void *arg)
{
    sni_server *s = arg;
    int fd;
    while ((fd = accept(s->listener, NULL, NULL)) >= 0) {
        SSL *ssl = SSL_new(s->ctx);
        SSL_set_fd(ssl, fd);
        s->connections++;
        bool ok = SSL_accept(ssl) == 1;
        if (s->connections == 1)
            s->handshake_ok = ok;
        if (ok)
            SSL_shutdown(ssl);
        SSL_free(ssl);
        close(fd);
    }
    return NULL;
}

static void sni_server_start(sni_server *s)
{
    memset(s, 0, sizeof *s);
    s->ctx = server_ctx("server.pem", "server.key");
    s->other = server_ctx("other.pem", "other.key");
    SSL_CTX_set_tlsext_servername_callback(s->ctx, on_servername);
    SSL_CTX_set_tlsext_servername_arg(s->ctx, s);
    s->listener = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(s->listener >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    cr_assert_eq(bind(s->listener, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s->listener, 1), 0);
    cr_assert_eq(getsockname(s->listener, (struct sockaddr *)&a, &alen), 0);
    s->port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&s->thread, NULL, sni_serve, s), 0);
}

static void sni_server_join(sni_server *s)
{
    shutdown(s->listener, SHUT_RDWR); /* wakes the accept */
    pthread_join(s->thread, NULL);
    close(s->listener);
    SSL_CTX_free(s->ctx);
    SSL_CTX_free(s->other);
}

/* `idemq check` against the SNI server with tls_extra in the block; returns its output. */
static char *check_against_sni_server(sni_server *s, const char *tls_extra)
{
    char url[256], ca[512], tls[1024];
    sni_server_start(s);
    snprintf(url, sizeof url, "amqps://guest:guest@127.0.0.1:%d/%%2f", s->port);
    snprintf(tls, sizeof tls, "{ca_file: \"%s\"%s%s}", tls_path(ca, sizeof ca, "ca.pem"),
             tls_extra ? ", " : "", tls_extra ? tls_extra : "");
    set_amqp(url, tls);
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    sni_server_join(s);
    cr_expect_eq(rc, 1, "check against a server that is not a broker exited %d:\n%s", rc, out);
    return out;
}

Test(tls_amqp, server_name_is_sent_as_sni_and_is_the_name_verified)
{
    init_tls("tls_sni");
    sni_server s;

    /* server_name: the server hears rmq.internal and answers with rmq.internal's certificate,
     * which idemq accepts: the handshake completes, then the AMQP login fails. */
    char *out = check_against_sni_server(&s, "server_name: rmq.internal");
    cr_expect_str_eq(s.sni, "rmq.internal", "SNI sent: '%s'", s.sni);
    cr_expect(s.handshake_ok, "the handshake failed:\n%s", out);
    cr_expect(!strstr(out, "TLS:"), "a TLS error although the certificate is rmq.internal's:\n%s",
              out);
    free(out);

    /* Without it the URL's host is an IP address: no SNI (RFC 6066), the default certificate,
     * verified against 127.0.0.1. */
    out = check_against_sni_server(&s, NULL);
    cr_expect_str_eq(s.sni, "", "SNI sent for an IP address: '%s'", s.sni);
    cr_expect(s.handshake_ok, "the handshake failed:\n%s", out);
    cr_expect(!strstr(out, "TLS:"), "%s", out);
    free(out);

    /* server_name localhost: SNI localhost, the default certificate, which holds localhost. */
    out = check_against_sni_server(&s, "server_name: localhost");
    cr_expect_str_eq(s.sni, "localhost");
    cr_expect(s.handshake_ok, "the handshake failed:\n%s", out);
    free(out);
}

/* ------------------------------------------------------------------------------ mutual TLS */

Test(tls_amqp, mutual_tls_with_external_login_and_no_password)
{
    char url[256], ca[512], cert[512], key[512], tls[2048];
    init_tls("tls_external");
    amqps_url(url, sizeof url, CLIENT_CN); /* no password */
    snprintf(tls, sizeof tls, "{ca_file: \"%s\", cert_file: \"%s\", key_file: \"%s\"}",
             tls_path(ca, sizeof ca, "ca.pem"), tls_path(cert, sizeof cert, "client.pem"),
             tls_path(key, sizeof key, "client.key"));
    set_amqp(url, tls);

    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "client certificate 'CN=" CLIENT_CN) && strstr(out, "EXTERNAL login"),
              "%s", out);
    free(out);

    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    char rows[2048];
    int n = broker_connections_of(CLIENT_CN, rows, sizeof rows);
    cr_expect_eq(n, 1, "the broker lists %d connection(s) of %s:\n%s", n, CLIENT_CN, rows);
    cr_expect(strstr(rows, "\tEXTERNAL\ttrue\t") && strstr(rows, "CN=" CLIENT_CN),
              "not an EXTERNAL login over TLS with the certificate: %s", rows);
    run_effective_once_workload("te", 5);
}

Test(tls_amqp, mutual_tls_with_a_password_logs_in_with_plain)
{
    char cert[512], key[512], extra[1200];
    snprintf(extra, sizeof extra, "cert_file: \"%s\", key_file: \"%s\"",
             tls_path(cert, sizeof cert, "client.pem"), tls_path(key, sizeof key, "client.key"));
    init_verified("tls_mutual_plain", extra);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    char rows[8192];
    broker_connections_of("guest", rows, sizeof rows);
    /* guest's other connections (the harness's) are plain; idemq's carries the certificate. */
    cr_expect(strstr(rows, "\tPLAIN\ttrue\tCN=" CLIENT_CN),
              "no PLAIN TLS connection of guest "
              "with the client certificate:\n%s",
              rows);
    harness_stop_idemq(&F.daemon);
}

/* Under TLS 1.3 the broker refuses the certificate after idemq's side of the handshake is done;
 * its alert races rabbitmq-c's first write, and a reset can swallow it (about one connect in six
 * here). broker/tls.c then asks again on a diagnostic connection: every attempt must give the
 * same clear line, so the check runs several times. */
Test(tls_amqp, a_client_certificate_of_an_unknown_ca_is_refused_clearly)
{
    char cert[512], key[512], extra[1200], hp[128], expected[1024];
    snprintf(extra, sizeof extra, "cert_file: \"%s\", key_file: \"%s\"",
             tls_path(cert, sizeof cert, "untrusted-client.pem"),
             tls_path(key, sizeof key, "untrusted-client.key"));
    init_verified("tls_untrusted_client", extra);
    amqps_host_port(hp, sizeof hp);
    snprintf(expected, sizeof expected,
             "TLS: RabbitMQ at %s refused the client certificate cert_file %s (", hp, cert);
    for (int attempt = 0; attempt < UNTRUSTED_ATTEMPTS; attempt++) {
        char *out = NULL;
        int rc = harness_run_cli_command(&F.h, "check", &out);
        cr_assert_eq(rc, 1, "attempt %d: idemq check exited %d:\n%s", attempt, rc, out);
        cr_assert(count_lines(out, expected) == 1 && strstr(out, "unknown ca"),
                  "attempt %d: expected one line with \"%s\" naming the broker's alert; got:\n%s",
                  attempt, expected, out);
        expect_one_clear_line("check", out, expected);
        free(out);
    }
}

/* ------------------------------------------------------------------------------ verify: false */

Test(tls_amqp, verify_false_connects_and_warns_at_start)
{
    char url[256];
    init_tls("tls_no_verify");
    amqps_url(url, sizeof url, "guest:guest");
    set_amqp(url, "{verify: false, server_name: rmq.internal}"); /* neither CA nor right name */
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    cr_expect_eq(
        harness_log_count_both(F.h.log_path, "\"level\":\"warn\"", "amqp.tls.verify is false"), 1,
        "no warning at start (see %s)", F.h.log_path);
    cr_expect_eq(harness_log_count(&F.h, "NOT verified (amqp.tls.verify: false)"), 1);
    harness_stop_idemq(&F.daemon);

    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_expect_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    cr_expect(strstr(out, "amqp    WARN amqp.tls.verify is false"), "%s", out);
    free(out);
}
