/*
 * test_tls_mysql — TLS to MySQL (mysql.tls) against the TLS-only MariaDB of scripts/services:
 * require_secure_transport=ON, a certificate for localhost and 127.0.0.1 from a test CA, and the
 * same server on 127.0.0.2, a name its certificate does not hold (IDEMQ_TEST_MYSQL_TLS_URL,
 * IDEMQ_TEST_MYSQL_TLS_DIR, IDEMQ_TEST_MYSQL_TLS_SOCKET in .state/env).
 *
 *   - the effective-once workload over verify_identity TLS: 200 events plus duplicates, each
 *     applied once; the DB workers, the retention thread, migrate and check all connect (the
 *     server takes nothing else over TCP);
 *   - `idemq check` prints the TLS version and cipher; the default mode (preferred) encrypts
 *     against this server and still works against the plaintext one;
 *   - one clear line, and `idemq run` exiting 2 before it takes a message, for: a certificate
 *     for another name (verify_identity), a CA that did not sign it (verify_ca), mode disabled
 *     against require_secure_transport, mode required against a server without TLS;
 *   - a client certificate (cert_file, key_file) for an account that REQUIRE X509;
 *   - a TLS failure while running pauses as a TLS error (error log, /readyz, idemq_paused
 *     {reason="tls"}) and resumes by itself once the CA is right again.
 *
 * The harness's own connection reaches the TLS server through its unix socket (a secure
 * transport for require_secure_transport); idemq goes over TCP with the tls: block of each test.
 * Each test has its own database and queue; every wait is on an observable condition.
 */
#include <criterion/criterion.h>
#include <mysql.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db/dsn.h"
#include "harness.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"
#define OUT_PROCESSED "\"outcome\":\"processed\""
#define OUT_DEDUPED "\"outcome\":\"deduped\""

static harness_fixture F;
static char plain_url[512]; /* IDEMQ_TEST_MYSQL_URL: the plaintext server */
static char x509_user[64];  /* an account this test created on the TLS server, or "" */

static void tls_fini(void)
{
    if (x509_user[0] && F.ready) {
        harness_sql(&F.h, "DROP USER IF EXISTS '%s'@'localhost', '%s'@'%%'", x509_user, x509_user);
        x509_user[0] = '\0';
    }
    harness_fixture_fini(&F);
}

TestSuite(tls_mysql, .fini = tls_fini);

static const char *env(const char *name)
{
    const char *v = getenv(name);
    cr_assert(v && *v,
              "%s is not set: scripts/services start (the TLS MariaDB) writes it to "
              ".state/env",
              name);
    return v;
}

/* The path of one of the test CA's files (ca.pem, other-ca.pem, client.pem, client.key). */
static const char *tls_file(const char *name)
{
    static char paths[4][512];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s", env("IDEMQ_TEST_MYSQL_TLS_DIR"), name);
    cr_assert(access(p, R_OK) == 0, "%s is not readable", p);
    return p;
}

static unsigned tls_port(void)
{
    db_dsn dsn;
    char err[256];
    cr_assert(db_dsn_parse(env("IDEMQ_TEST_MYSQL_TLS_URL"), &dsn, err, sizeof err) == 0, "%s", err);
    return dsn.port;
}

/* The fixture with its database on the TLS server: the harness connects through the socket. */
static void setup(const char *name, const harness_options *opts)
{
    char url[1024];
    snprintf(plain_url, sizeof plain_url, "%s", env("IDEMQ_TEST_MYSQL_URL"));
    snprintf(url, sizeof url, "mysql://idemq:idemq@127.0.0.1:%u/idemq?socket=%s", tls_port(),
             env("IDEMQ_TEST_MYSQL_TLS_SOCKET"));
    setenv("IDEMQ_TEST_MYSQL_URL", url, 1);
    unsetenv("IDEMQ_MYSQL_URL");
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
    harness_fixture_init(&F, name, opts);
}

/* Points idemq's mysql section at the TLS server over TCP: host 127.0.0.1 (in the certificate)
 * or 127.0.0.2 (not in it); tls is a YAML flow mapping, or NULL for no tls: block. */
static void use_server(const char *userinfo, const char *host, const char *tls)
{
    char line[4096];
    snprintf(line, sizeof line, "mysql: {url: \"mysql://%s@%s:%u/%s\", workers: 4%s%s}", userinfo,
             host, tls_port(), F.h.database, tls ? ", tls: " : "", tls ? tls : "");
    harness_config_replace_line(&F.h, "mysql: ", line);
}

static void use_tls(const char *host, const char *tls)
{
    use_server("idemq:idemq", host, tls);
}

/* "{mode: MODE, ca_file: "the test CA"}" */
static const char *with_ca(const char *mode, const char *ca_name)
{
    static char buf[2][1024];
    static int next;
    char *b = buf[next++ % 2];
    snprintf(b, sizeof buf[0], "{mode: %s, ca_file: \"%s\"}", mode, tls_file(ca_name));
    return b;
}

/* The first line of text containing needle, as its own string (static); NULL when none. */
static const char *line_with(const char *text, const char *needle)
{
    static char line[2048];
    const char *hit = text ? strstr(text, needle) : NULL;
    if (!hit)
        return NULL;
    const char *start = hit;
    while (start > text && start[-1] != '\n')
        start--;
    size_t n = strcspn(start, "\n");
    snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), start);
    return line;
}

/* `idemq check` fails with one line holding every needle (NULL-terminated). */
static void expect_check_fails_with(const char *const *needles)
{
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 1, "idemq check exited %d:\n%s", rc, out);
    const char *line = line_with(out, needles[0]);
    cr_assert(line, "no line with '%s' in:\n%s", needles[0], out);
    cr_assert(strncmp(line, "mysql   FAIL ", 13) == 0, "not the mysql FAIL line: %s", line);
    for (size_t i = 1; needles[i]; i++)
        cr_assert(strstr(line, needles[i]), "the line lacks '%s': %s", needles[i], line);
    free(out);
}

/* `idemq run` exits 2 before consuming, its log holding needle; the one message published
 * before stays in the queue and no dedup row exists. */
static void expect_run_exits_2_with(const char *needle)
{
    harness_declare_topology(&F.h);
    harness_insert_orders(&F.h, "r", 1, "PAYING");
    harness_publish_event(&F.h, "r0", "PAY_SUCCESS", 5);
    pid_t pid = harness_spawn(&F.h);
    F.daemon = pid;
    int rc = harness_stop(pid, 0, 30000); /* signal 0: only waits */
    F.daemon = 0;
    cr_assert_eq(rc, 2, "idemq run exited %d, not 2 (a configuration problem)", rc);
    cr_assert(harness_log_count(&F.h, needle) == 1, "the log lacks '%s'", needle);
    cr_assert_eq(harness_log_count(&F.h, READY_LINE), 0, "idemq started consuming");
    cr_assert_eq(harness_queue_depth(&F.h, F.h.queue), 1, "the message was taken");
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 0);
}

/* ---- the workload over TLS ---------------------------------------------------------------- */

Test(tls_mysql, effective_once_workload_over_verify_identity_tls, .timeout = 240)
{
    enum { ORDERS = 200, EXTRA = 40, MESSAGES = 2 * ORDERS + EXTRA };
    harness_options o = {.top_yaml = "dedup: {retention: 1h, interval: 1s}\n"};
    setup("tls_workload", &o);
    use_tls("127.0.0.1", with_ca("verify_identity", "ca.pem"));
    harness_insert_orders(&F.h, "o", ORDERS, "PAYING");

    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "migrate", &out);
    cr_assert_eq(rc, 0, "idemq migrate over TLS exited %d:\n%s", rc, out);
    free(out);

    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    cr_assert_eq(harness_log_count_both(F.h.log_path, "MySQL connection: TLSv1",
                                        "(mysql.tls.mode verify_identity)"),
                 1, "no TLS line at start");

    /* Every event twice (another message_id: a gateway's second callback), every fifth a
     * third time, the copies after the originals have started to be applied. */
    static char bodies[MESSAGES][256];
    static const void *ptrs[MESSAGES];
    static size_t lens[MESSAGES];
    for (int i = 0; i < MESSAGES; i++) {
        int order = i < 2 * ORDERS ? i % ORDERS : (i - 2 * ORDERS) * 5;
        int n = snprintf(bodies[i], sizeof bodies[i],
                         "{\"biz_key\":\"order_id:o%d:PAY_SUCCESS\",\"message_id\":\"m-%d\","
                         "\"order_id\":\"o%d\",\"event_type\":\"PAY_SUCCESS\",\"amount\":%d}",
                         order, i, order, order * 10 + 7);
        ptrs[i] = bodies[i];
        lens[i] = (size_t)n;
    }
    harness_publish_batch(&F.h, NULL, "application/json", ptrs, lens, MESSAGES);

    cr_assert(harness_wait_scalar(&F.h, ORDERS, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_log(&F.h, OUT_DEDUPED, MESSAGES - ORDERS, DEADLINE_MS));
    cr_assert(harness_wait_log(&F.h, "dedup retention: deleted", 1, DEADLINE_MS),
              "the retention thread did not sweep over TLS");
    harness_stop_idemq(&F.daemon);

    cr_expect_eq(harness_log_count(&F.h, OUT_PROCESSED), ORDERS);
    cr_expect_eq(harness_log_count(&F.h, OUT_DEDUPED), MESSAGES - ORDERS);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND "
                                      "amount = CAST(SUBSTRING(order_id, 2) AS UNSIGNED) * 10 + 7"),
                 ORDERS, "every order PAID once with its amount");
    cr_expect_eq(harness_queue_depth(&F.h, F.h.queue), 0);
    cr_expect_eq(harness_log_count(&F.h, "sweep failed"), 0);
    cr_expect_eq(harness_log_count(&F.h, "database unavailable"), 0);
    cr_expect_eq(harness_log_count(&F.h, "TLS error"), 0);
}

/* ---- idemq check ---------------------------------------------------------------------------- */

Test(tls_mysql, check_prints_the_tls_version_and_cipher, .timeout = 90)
{
    setup("tls_check", NULL);
    use_tls("127.0.0.1", with_ca("verify_identity", "ca.pem"));
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    const char *line = line_with(out, "mysql   tls  ");
    cr_assert(line, "no tls line:\n%s", out);
    cr_assert(strstr(line, "mysql   tls  TLSv1.") && strstr(line, ", cipher ") &&
                  strstr(line, "(mysql.tls.mode verify_identity)"),
              "%s", line);
    free(out);

    /* The default, preferred, encrypts whenever the server offers TLS... */
    use_tls("127.0.0.1", NULL);
    rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "idemq check exited %d:\n%s", rc, out);
    line = line_with(out, "mysql   tls  ");
    cr_assert(line && strstr(line, ", cipher ") && strstr(line, "(mysql.tls.mode preferred)"), "%s",
              out);
    free(out);

    /* ...and still works with a server that offers none (the plaintext MariaDB). */
    char plain[1024];
    snprintf(plain, sizeof plain, "mysql: {url: \"%s\", workers: 4}", plain_url);
    harness_config_replace_line(&F.h, "mysql: ", plain);
    rc = harness_run_cli_command(&F.h, "check", &out);
    line = line_with(out, "mysql   tls  ");
    cr_assert(line && strstr(line, "mysql   tls  not encrypted (mysql.tls.mode preferred)"),
              "check exited %d:\n%s", rc, out);
    free(out);
}

/* ---- failures: one line, and run stops before taking anything ------------------------------ */

Test(tls_mysql, verify_identity_refuses_a_certificate_for_another_name, .timeout = 120)
{
    setup("tls_name", NULL);
    char where[64];
    snprintf(where, sizeof where, "MySQL at 127.0.0.2:%u: TLS: ", tls_port());
    use_tls("127.0.0.2", with_ca("verify_identity", "ca.pem"));
    const char *needles[] = {"the server's certificate does not name '127.0.0.2'", where,
                             "(mysql.tls.mode verify_identity", tls_file("ca.pem"), NULL};
    expect_check_fails_with(needles);

    /* verify_ca checks the chain, not the name: the same server passes. */
    use_tls("127.0.0.2", with_ca("verify_ca", "ca.pem"));
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "verify_ca to 127.0.0.2: check exited %d:\n%s", rc, out);
    free(out);

    use_tls("127.0.0.2", with_ca("verify_identity", "ca.pem"));
    expect_run_exits_2_with("the server's certificate does not name '127.0.0.2'");
}

Test(tls_mysql, verify_ca_refuses_a_certificate_another_ca_signed, .timeout = 90)
{
    setup("tls_ca", NULL);
    use_tls("127.0.0.1", with_ca("verify_ca", "other-ca.pem"));
    const char *needles[] = {"TLS: the server's certificate is not trusted by mysql.tls.ca_file",
                             tls_file("other-ca.pem"), "(mysql.tls.mode verify_ca)", NULL};
    expect_check_fails_with(needles);
    expect_run_exits_2_with("is not trusted by mysql.tls.ca_file");
}

Test(tls_mysql, mode_disabled_against_require_secure_transport_fails_clearly, .timeout = 90)
{
    setup("tls_disabled", NULL);
    use_tls("127.0.0.1", "{mode: disabled}");
    const char *needles[] = {"TLS: the server requires TLS (require_secure_transport) but "
                             "mysql.tls.mode is disabled",
                             NULL};
    expect_check_fails_with(needles);
    expect_run_exits_2_with("the server requires TLS (require_secure_transport)");
}

Test(tls_mysql, mode_required_against_a_server_without_tls_fails_clearly, .timeout = 90)
{
    setup("tls_required", NULL);
    char line[1024];
    snprintf(line, sizeof line, "mysql: {url: \"%s\", workers: 4, tls: {mode: required}}",
             plain_url);
    harness_config_replace_line(&F.h, "mysql: ", line);
    const char *needles[] = {"TLS: the server does not offer TLS, but mysql.tls.mode is required",
                             NULL};
    expect_check_fails_with(needles);
    /* verify_identity says the same (Connector/C's own check) */
    snprintf(line, sizeof line, "mysql: {url: \"%s\", workers: 4, tls: %s}", plain_url,
             with_ca("verify_identity", "ca.pem"));
    harness_config_replace_line(&F.h, "mysql: ", line);
    const char *again[] = {"TLS: the server does not offer TLS, but mysql.tls.mode is "
                           "verify_identity",
                           NULL};
    expect_check_fails_with(again);
}

/* ---- a client certificate ------------------------------------------------------------------ */

Test(tls_mysql, a_client_certificate_logs_in_an_account_that_requires_x509, .timeout = 90)
{
    setup("tls_x509", NULL);
    snprintf(x509_user, sizeof x509_user, "idemq_x509_%d", (int)getpid());
    harness_sql(&F.h, "CREATE USER '%s'@'localhost' IDENTIFIED BY 'x509pw' REQUIRE X509",
                x509_user);
    harness_sql(&F.h, "CREATE USER '%s'@'%%' IDENTIFIED BY 'x509pw' REQUIRE X509", x509_user);
    harness_sql(&F.h, "GRANT ALL ON `%s`.* TO '%s'@'localhost', '%s'@'%%'", F.h.database, x509_user,
                x509_user);
    char userinfo[128], tls[2048];
    snprintf(userinfo, sizeof userinfo, "%s:x509pw", x509_user);
    snprintf(tls, sizeof tls,
             "{mode: verify_identity, ca_file: \"%s\", cert_file: \"%s\", "
             "key_file: \"%s\"}",
             tls_file("ca.pem"), tls_file("client.pem"), tls_file("client.key"));
    use_server(userinfo, "127.0.0.1", tls);
    char *out = NULL;
    int rc = harness_run_cli_command(&F.h, "check", &out);
    cr_assert_eq(rc, 0, "with the client certificate: check exited %d:\n%s", rc, out);
    free(out);

    use_server(userinfo, "127.0.0.1", with_ca("verify_identity", "ca.pem"));
    const char *needles[] = {"Access denied for user", NULL};
    expect_check_fails_with(needles);
}

/* ---- a TLS failure while running ------------------------------------------------------------ */

typedef struct ready_wait {
    int port;
    int status;           /* of /readyz */
    const char *needle;   /* in its body, unless NULL */
    long long paused_tls; /* idemq_paused{reason="tls"} */
    char body[1024];
} ready_wait;

/* /readyz answers w->status with w->needle, and then /metrics says idemq_paused{reason="tls"}
 * is 1 exactly when the needle is the TLS pause. */
static bool readyz_is(harness *h, void *arg)
{
    (void)h;
    ready_wait *w = arg;
    char *body = NULL, *scrape = NULL;
    int status = harness_http_get(w->port, "/readyz", &body);
    snprintf(w->body, sizeof w->body, "%s", body ? body : "");
    free(body);
    if (status != w->status || (w->needle && !strstr(w->body, w->needle)))
        return false;
    harness_http_get(w->port, "/metrics", &scrape);
    w->paused_tls = harness_metric_value(scrape, "idemq_paused{reason=\"tls\"}");
    free(scrape);
    return w->paused_tls == (w->needle && strstr(w->needle, "TLS error") ? 1 : 0);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    cr_assert(in && out, "copy %s to %s", from, to);
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        cr_assert_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    cr_assert_eq(fclose(out), 0);
}

/* Ends every connection idemq holds to the test's database (not the harness's own). */
static void kill_idemq_connections(void)
{
    MYSQL_RES *res;
    harness_sql(&F.h,
                "CREATE TEMPORARY TABLE victims SELECT ID FROM information_schema.PROCESSLIST "
                "WHERE DB = '%s' AND ID <> CONNECTION_ID()",
                F.h.database);
    cr_assert(mysql_query(F.h.db, "SELECT ID FROM victims") == 0, "%s", mysql_error(F.h.db));
    res = mysql_store_result(F.h.db);
    cr_assert(res);
    MYSQL_ROW row;
    int killed = 0;
    while ((row = mysql_fetch_row(res))) {
        char sql[64];
        snprintf(sql, sizeof sql, "KILL CONNECTION %s", row[0]);
        if (mysql_query(F.h.db, sql) == 0)
            killed++;
    }
    mysql_free_result(res);
    harness_sql(&F.h, "DROP TEMPORARY TABLE victims");
    cr_assert(killed > 0, "idemq holds no connection to kill");
}

Test(tls_mysql, a_tls_failure_while_running_pauses_loudly_then_resumes, .timeout = 180)
{
    setup("tls_pause", NULL);
    char ca[400], tls[600];
    snprintf(ca, sizeof ca, "%s/ca.pem", F.h.dir);
    copy_file(tls_file("ca.pem"), ca);
    snprintf(tls, sizeof tls, "{mode: verify_ca, ca_file: \"%s\"}", ca);
    use_tls("127.0.0.1", tls);
    harness_insert_orders(&F.h, "p", 2, "PAYING");
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    ready_wait w = {.port = harness_http_port(&F.h, 10000), .status = 200};
    harness_publish_event(&F.h, "p0", "PAY_SUCCESS", 1);
    cr_assert(harness_wait_scalar(&F.h, 1, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_for(readyz_is, &F.h, &w, DEADLINE_MS), "not ready: %s", w.body);

    /* The CA file now holds another CA (a bad rotation), and the connections drop: every
     * reconnect fails the chain check. (A killed TLS connection itself reports OpenSSL's
     * "unexpected eof", error 2026: that is an outage, "database unavailable", until its
     * worker reconnects.) */
    copy_file(tls_file("other-ca.pem"), ca);
    kill_idemq_connections();
    harness_publish_event(&F.h, "p1", "PAY_SUCCESS", 2);
    w.status = 503;
    w.needle = "consumption paused: TLS error: ";
    cr_assert(harness_wait_for(readyz_is, &F.h, &w, DEADLINE_MS),
              "/readyz says: %s (idemq_paused{reason=\"tls\"} %lld)", w.body, w.paused_tls);
    cr_assert(strstr(w.body, "is not trusted by mysql.tls.ca_file"), "%s", w.body);
    cr_assert(strstr(w.body, ca), "the reason does not name the CA file: %s", w.body);
    /* It stays paused, loudly: a probe fails on TLS again and says so at error level. */
    cr_assert(harness_wait_log(&F.h, "\"msg\":\"TLS error persists (probe ", 1, DEADLINE_MS));
    cr_assert_geq(harness_log_count_both(F.h.log_path, "\"level\":\"error\"",
                                         "is not trusted by mysql.tls.ca_file"),
                  2);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM msg_dedup"), 1, "p1 was applied");
    cr_assert_eq(harness_log_count(&F.h, "\"outcome\":\"retried\""), 0);

    /* The operator puts the right CA back: the probe passes and p1 goes through. */
    copy_file(tls_file("ca.pem"), ca);
    cr_assert(harness_wait_scalar(&F.h, 2, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    w.status = 200;
    w.needle = NULL;
    cr_assert(harness_wait_for(readyz_is, &F.h, &w, DEADLINE_MS), "/readyz says: %s", w.body);
    cr_assert_eq(w.paused_tls, 0);
    cr_assert_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), 2);
    harness_stop_idemq(&F.daemon);
}
