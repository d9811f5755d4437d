/*
 * test_secrets — passwords holding @ / ? # : % for RabbitMQ and MySQL, on the shared servers:
 * a user with such a password is made on each (rabbitmqctl add_user; CREATE USER) under a name
 * unique to the test, and dropped in the suite's .fini.
 *
 *   - percent-encoded in amqp.url and mysql.url, they log in (check, topology, run: events
 *     applied once);
 *   - from amqp.password_file / mysql.password_file (the file's password wins over the URL's),
 *     and from IDEMQ_AMQP_PASSWORD_FILE / IDEMQ_MYSQL_PASSWORD_FILE (which win over the keys);
 *   - a wrong password, or a raw one in a URL, fails with a clear line;
 * and in every case neither the raw nor the encoded password, nor a piece of either, appears in
 * idemq's log, `idemq check`'s output or any error.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define DEADLINE_MS 60000
#define READY_LINE "consuming with handler"

#define RAW "Zq@7/Kx?9#Wm:%5"
#define ENCODED "Zq%407%2FKx%3F9%23Wm%3A%255"
#define WRONG_RAW "Yv@3/Lp?8#Qn:%2"

/* What must never be printed: the passwords whole, encoded, and pieces of them. */
static const char *const secrets[] = {RAW,     ENCODED,   "Zq@7", "Kx?9", "#Wm:", "Zq%40", "%2FKx",
                                      "Wm%3A", WRONG_RAW, "Yv@3", "Lp?8", "#Qn:", NULL};

static harness_fixture F;
static char user[64];
static bool amqp_user_made, mysql_user_made;

static void secrets_fini(void)
{
    char cmd[256];
    if (amqp_user_made) {
        snprintf(cmd, sizeof cmd, "rabbitmqctl delete_user '%s'", user);
        harness_services_ok(cmd);
        amqp_user_made = false;
    }
    if (mysql_user_made && F.ready) {
        harness_sql(&F.h, "DROP USER IF EXISTS '%s'@'localhost', '%s'@'%%'", user, user);
        mysql_user_made = false;
    }
    unsetenv("IDEMQ_AMQP_PASSWORD_FILE");
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
    harness_fixture_fini(&F);
}

TestSuite(secrets, .fini = secrets_fini);

static const char *env(const char *name)
{
    const char *v = getenv(name);
    cr_assert(v && *v, "%s is not set: source .state/env (scripts/test does)", name);
    return v;
}

/* The part of a test URL after its '@' (host, port and the rest), or up to the path's '/'. */
static void after_at(const char *url, bool with_path, char *buf, size_t len)
{
    const char *at = strchr(url, '@');
    cr_assert(at, "%s has no user", url);
    size_t n = with_path ? strlen(at + 1) : strcspn(at + 1, "/?");
    snprintf(buf, len, "%.*s", (int)n, at + 1);
}

/* The fixture, and a user on both servers whose password is RAW. */
static void setup(const char *name)
{
    unsetenv("IDEMQ_AMQP_URL");
    unsetenv("IDEMQ_MYSQL_URL");
    unsetenv("IDEMQ_AMQP_PASSWORD_FILE");
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
    harness_fixture_init(&F, name, NULL);
    snprintf(user, sizeof user, "idemq_secret_%d", (int)getpid());
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rabbitmqctl add_user '%s' '%s'", user, RAW);
    harness_services_ok(cmd);
    amqp_user_made = true;
    snprintf(cmd, sizeof cmd, "rabbitmqctl set_permissions -p / '%s' '.*' '.*' '.*'", user);
    harness_services_ok(cmd);
    harness_sql(&F.h, "CREATE USER '%s'@'localhost' IDENTIFIED BY '%s'", user, RAW);
    harness_sql(&F.h, "CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, RAW);
    mysql_user_made = true;
    harness_sql(&F.h, "GRANT ALL ON `%s`.* TO '%s'@'localhost', '%s'@'%%'", F.h.database, user,
                user);
}

/* Rewrites the amqp and mysql lines: userinfo before the '@' of each URL (e.g. "u:pw" or "u"),
 * extra YAML after each url (e.g. ", password_file: /x"). */
static void use_login(const char *amqp_userinfo, const char *amqp_extra, const char *mysql_userinfo,
                      const char *mysql_extra)
{
    char rest[512], line[2048];
    after_at(env("IDEMQ_TEST_AMQP_URL"), true, rest, sizeof rest);
    snprintf(line, sizeof line, "amqp: {url: \"amqp://%s@%s\", prefetch: 64, heartbeat: 10s%s}",
             amqp_userinfo, rest, amqp_extra ? amqp_extra : "");
    harness_config_replace_line(&F.h, "amqp: ", line);
    after_at(env("IDEMQ_TEST_MYSQL_URL"), false, rest, sizeof rest);
    snprintf(line, sizeof line, "mysql: {url: \"mysql://%s@%s/%s\", workers: 4%s}", mysql_userinfo,
             rest, F.h.database, mysql_extra ? mysql_extra : "");
    harness_config_replace_line(&F.h, "mysql: ", line);
}

/* A password file in the test's folder holding text and a newline; returns its path. */
static const char *password_file(const char *name, const char *text)
{
    static char paths[4][400];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "%s/%s", F.h.dir, name);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fprintf(f, "%s\n", text);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static void assert_no_secret(const char *text, const char *what)
{
    for (size_t i = 0; secrets[i]; i++)
        cr_assert(!text || !strstr(text, secrets[i]), "%s shows '%s':\n%s", what, secrets[i], text);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, m);
    fclose(f);
    fclose(m);
    return text;
}

static void assert_log_has_no_secret(void)
{
    char *log = read_all(F.h.log_path);
    assert_no_secret(log, "idemq's log");
    free(log);
}

/* `idemq check`: its exit code, the output checked for secrets, returned owned. */
static int check(char **out)
{
    const char *args[] = {"check", "-c", F.h.config_path, NULL};
    int rc = harness_run_cli(&F.h, out, args);
    assert_no_secret(*out, "idemq check");
    return rc;
}

static void expect_check_ok(const char *what)
{
    char *out = NULL;
    int rc = check(&out);
    cr_assert_eq(rc, 0, "%s: idemq check exited %d:\n%s", what, rc, out);
    char want[160];
    snprintf(want, sizeof want, "amqp    ok   amqp://%s", user);
    cr_assert(strstr(out, want), "%s: no '%s' in:\n%s", what, want, out);
    free(out);
}

/* Runs idemq, applies a few events (each twice) with the test user's logins, stops it. */
static void run_events(void)
{
    enum { ORDERS = 10 };
    harness_insert_orders(&F.h, "s", ORDERS, "PAYING");
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    for (int copy = 0; copy < 2; copy++)
        for (int i = 0; i < ORDERS; i++) {
            char order[16];
            snprintf(order, sizeof order, "s%d", i);
            harness_publish_event(&F.h, order, "PAY_SUCCESS", i + 1);
        }
    cr_assert(harness_wait_scalar(&F.h, ORDERS, DEADLINE_MS, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"deduped\"", ORDERS, DEADLINE_MS));
    harness_stop_idemq(&F.daemon);
    cr_expect_eq(harness_scalar(&F.h, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"), ORDERS);
    assert_log_has_no_secret();
}

Test(secrets, reserved_characters_work_percent_encoded_in_both_urls, .timeout = 120)
{
    setup("secret_url");
    char userinfo[128];
    snprintf(userinfo, sizeof userinfo, "%s:%s", user, ENCODED);
    use_login(userinfo, NULL, userinfo, NULL);
    expect_check_ok("encoded in the URLs");
    run_events();
}

Test(secrets, password_files_override_the_urls_and_the_environment_wins, .timeout = 150)
{
    setup("secret_file");
    char userinfo[128], extra[600];
    const char *right = password_file("right", RAW), *wrong = password_file("wrong", WRONG_RAW);

    /* The key: the file's password is used, not the URL's. */
    snprintf(userinfo, sizeof userinfo, "%s:not-this-one", user);
    snprintf(extra, sizeof extra, ", password_file: \"%s\"", right);
    use_login(userinfo, extra, userinfo, extra);
    expect_check_ok("password_file keys");
    run_events();

    /* The environment (the container convention), over a key naming the wrong file. */
    snprintf(extra, sizeof extra, ", password_file: \"%s\"", wrong);
    use_login(user, extra, user, extra);
    setenv("IDEMQ_AMQP_PASSWORD_FILE", right, 1);
    setenv("IDEMQ_MYSQL_PASSWORD_FILE", right, 1);
    expect_check_ok("IDEMQ_*_PASSWORD_FILE");

    /* Without the environment the key's wrong password is refused, and shown nowhere. */
    unsetenv("IDEMQ_AMQP_PASSWORD_FILE");
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
    char *out = NULL;
    int rc = check(&out);
    cr_assert_eq(rc, 1, "check with the wrong files exited %d:\n%s", rc, out);
    free(out);
}

Test(secrets, wrong_or_raw_passwords_fail_clearly_and_are_never_shown, .timeout = 120)
{
    setup("secret_wrong");
    char userinfo[128], extra[600];

    /* Wrong passwords: both servers refuse, each in one line naming the user. */
    snprintf(extra, sizeof extra, ", password_file: \"%s\"", password_file("wrong", WRONG_RAW));
    use_login(user, extra, user, extra);
    char *out = NULL;
    int rc = check(&out);
    cr_assert_eq(rc, 1, "idemq check exited %d:\n%s", rc, out);
    char want[160];
    snprintf(want, sizeof want, "Access denied for user '%s'", user);
    cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    snprintf(want, sizeof want, "refused login as '%s'", user);
    cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    free(out);

    /* idemq run: the MySQL refusal is logged, the broker's ends the run; neither shows it. */
    pid_t pid = harness_spawn(&F.h);
    F.daemon = pid;
    rc = harness_stop(pid, 0, 30000); /* signal 0: only waits */
    F.daemon = 0;
    cr_assert(rc == 1 || rc == 2, "idemq run exited %d", rc);
    cr_assert_eq(harness_log_count(&F.h, "Access denied for user"), 1);
    cr_assert_eq(harness_log_count(&F.h, "refused login as"), 1);
    assert_log_has_no_secret();

    /* A raw password in a URL is refused at load (exit 2), the URL shown redacted. */
    snprintf(userinfo, sizeof userinfo, "%s:%s", user, RAW);
    use_login(userinfo, NULL, userinfo, NULL);
    rc = check(&out);
    cr_assert_eq(rc, 2, "idemq check exited %d:\n%s", rc, out);
    cr_assert(strstr(out, "has more than one '@' (write an '@' in the user, password"), "%s", out);
    snprintf(want, sizeof want, "amqp://%s:***@", user);
    cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    free(out);
}
