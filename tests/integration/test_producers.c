/*
 * test_producers — the example producers of examples/producers/ (Python pika, Go amqp091-go,
 * Java's RabbitMQ client with Gson, Node amqplib) built the way their README says, checked
 * against the shared vectors, and run against a live idemq: every language's events, duplicates
 * included, applied exactly once, and one event published by all four (the same biz_key) applied
 * once and deduplicated three times.
 *
 * Builds use only Debian's packages and the npm registry (scripts/setup installs them): Go in
 * GOPATH mode against /usr/share/gocode, javac through the example's Makefile against
 * /usr/share/java, `npm ci` from the example's package.json and package-lock.json in a copy of
 * the example, Python with /usr/bin/python3 and python3-pika / python3-msgpack. A missing tool
 * fails the test naming the package, it never skips.
 *
 * Builds and producer runs are child processes with a deadline; every wait is on an observable
 * condition (a process exit, a log line count), never a sleep.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define PRODUCERS IDEMQ_SOURCE_DIR "/examples/producers"
#define VECTORS IDEMQ_SOURCE_DIR "/schemas/vectors/vectors.json"
#define JAVA_CLASSPATH                                                                             \
    "/usr/share/java/amqp-client.jar:/usr/share/java/gson.jar:/usr/share/java/slf4j-api.jar:"      \
    "/usr/share/java/slf4j-nop.jar"
#define BUILD_MS 90000
#define RUN_MS 60000
#define DEADLINE_MS 60000
#define READY_LINE "started consuming"

#define ORDERS 20    /* each language's own orders */
#define DUPLICATED 5 /* of which the first DUPLICATED are published twice */
#define SHARED_ORDER "shared-订单-😀"
#define SHARED_AMOUNT "9007199254740993" /* 2^53 + 1: a double would make it ...992 */

static harness_fixture F;

static void teardown(void)
{
    harness_fixture_fini(&F);
}

TestSuite(producers, .fini = teardown, .timeout = 300);

/* ---- child processes -------------------------------------------------------------------- */

/* Runs argv in dir with extra NAME=VALUE environment entries (env, NULL-terminated, may be
 * NULL), stdin from in (NULL: /dev/null), stdout and stderr appended to out. Returns the pid. */
static pid_t spawn(const char *dir, const char *const *argv, const char *const *env, const char *in,
                   const char *out)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int fd_in = open(in ? in : "/dev/null", O_RDONLY);
        int fd_out = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd_in < 0 || fd_out < 0 || chdir(dir) != 0)
            _exit(126);
        for (const char *const *e = env; e && *e; e++)
            putenv((char *)*e);
        dup2(fd_in, 0);
        dup2(fd_out, 1);
        dup2(fd_out, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Waits for pid until deadline_ms (harness_now_ms); returns its exit status, 128 + signal when
 * a signal ended it, -1 when the deadline passed (the process is then killed). */
static int wait_exit(pid_t pid, int64_t deadline_ms)
{
    int64_t left = deadline_ms - harness_now_ms();
    int status = harness_wait_exit(pid, left > 0 ? (int)left : 0);
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The whole file, malloc'd ("" when it does not exist). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *text = calloc(1, 1);
    size_t len = 0, n;
    char buf[4096];
    cr_assert(text);
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        text = realloc(text, len + n + 1);
        cr_assert(text);
        memcpy(text + len, buf, n);
        text[len += n] = '\0';
    }
    if (f)
        fclose(f);
    return text;
}

/* Runs a command to completion within timeout_ms; fails the test with its output unless it
 * exits 0. Returns its output (malloc'd). */
static char *run_ok(const char *what, const char *dir, const char *const *argv,
                    const char *const *env, const char *out, int timeout_ms)
{
    int64_t t0 = harness_now_ms();
    int rc = wait_exit(spawn(dir, argv, env, NULL, out), t0 + timeout_ms);
    char *text = slurp(out);
    cr_assert_eq(rc, 0, "%s: exit status %d (-1: no exit within %d ms):\n%s", what, rc, timeout_ms,
                 text);
    cr_log_info("%s: %lld ms", what, (long long)(harness_now_ms() - t0));
    return text;
}

/* ---- the tools, the builds -------------------------------------------------------------- */

static bool on_path(const char *tool)
{
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        char file[4200];
        snprintf(file, sizeof file, "%s/%s", dir, tool);
        if (access(file, X_OK) == 0)
            return true;
    }
    return false;
}

/* Fails the test, naming what to install, when a tool the producers need is missing. */
static void require_tools(harness *h)
{
    static const struct {
        const char *tool, *package;
    } tools[] = {
        {"go", "golang-go"},
        {"javac", "default-jdk-headless"},
        {"java", "default-jdk-headless"},
        {"make", "make"},
        {"node", "nodejs"},
        {"npm", "npm"},
    };
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++)
        cr_assert(on_path(tools[i].tool), "%s is not installed: run scripts/setup (package %s)",
                  tools[i].tool, tools[i].package);
    static const struct {
        const char *file, *package;
    } files[] = {
        {"/usr/share/gocode/src/github.com/rabbitmq/amqp091-go/channel.go",
         "golang-github-rabbitmq-amqp091-go-dev"},
        {"/usr/share/java/amqp-client.jar", "librabbitmq-client-java"},
        {"/usr/share/java/gson.jar", "libgoogle-gson-java"},
        {"/usr/share/java/slf4j-nop.jar", "libslf4j-java"},
        {"/usr/bin/python3", "python3"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        cr_assert(access(files[i].file, R_OK) == 0, "%s is missing: run scripts/setup (package %s)",
                  files[i].file, files[i].package);
    char out[400];
    snprintf(out, sizeof out, "%s/python-import.log", h->dir);
    const char *argv[] = {"/usr/bin/python3", "-c", "import pika, msgpack", NULL};
    int rc = wait_exit(spawn(h->dir, argv, NULL, NULL, out), harness_now_ms() + RUN_MS);
    char *text = slurp(out);
    cr_assert_eq(rc, 0,
                 "/usr/bin/python3 cannot import pika and msgpack: run scripts/setup "
                 "(packages python3-pika, python3-msgpack):\n%s",
                 text);
    free(text);
}

/* Where the built producers live under h->dir, and how each is run (argv prefixes). */
typedef struct producers {
    char go[400], java_out[400], java_cp[800], node_dir[400];
    const char *python[3], *go_argv[2], *java[5], *node[3];
} producers;

/* Builds the Go, Java and Node producers into h->dir (Python needs no build) and fills p. */
static void build_producers(harness *h, producers *p)
{
    require_tools(h);
    char out[400], cmd[2048];
    int64_t t0 = harness_now_ms();

    /* Go: GOPATH mode against Debian's packaged sources; the output goes to h->dir. */
    snprintf(p->go, sizeof p->go, "%s/producer-go", h->dir);
    snprintf(out, sizeof out, "%s/build-go.log", h->dir);
    /* Go's build cache and npm's cache live under HOME: give them one if the caller has none. */
    char home[450];
    snprintf(home, sizeof home, "HOME=%s", h->dir);
    const char *home_env = getenv("HOME") ? NULL : home;
    const char *go_env[] = {
        "GO111MODULE=off", "GOPATH=/usr/share/gocode", "GOFLAGS=", "CGO_ENABLED=0", home_env, NULL};
    const char *npm_env[] = {home_env, NULL};
    const char *go_build[] = {"go", "build", "-o", p->go, ".", NULL};
    free(run_ok("go build", PRODUCERS "/go", go_build, go_env, out, BUILD_MS));

    /* Java: the example's Makefile (plain javac), classes into h->dir. */
    snprintf(p->java_out, sizeof p->java_out, "%s/java-classes", h->dir);
    snprintf(out, sizeof out, "%s/build-java.log", h->dir);
    char out_var[450];
    snprintf(out_var, sizeof out_var, "OUT=%s", p->java_out);
    const char *make[] = {"make", "--no-print-directory", out_var, NULL};
    free(run_ok("make (javac)", PRODUCERS "/java", make, NULL, out, BUILD_MS));

    /* Node: a copy of the example with its package.json and lock file, then `npm ci` there. */
    snprintf(p->node_dir, sizeof p->node_dir, "%s/node", h->dir);
    cr_assert_eq(mkdir(p->node_dir, 0755), 0, "mkdir %s: %s", p->node_dir, strerror(errno));
    snprintf(cmd, sizeof cmd,
             "cp '%s/node/package.json' '%s/node/package-lock.json' "
             "'%s/node/producer.js' '%s/'",
             PRODUCERS, PRODUCERS, PRODUCERS, p->node_dir);
    const char *cp[] = {"/bin/sh", "-c", cmd, NULL};
    snprintf(out, sizeof out, "%s/build-node.log", h->dir);
    free(run_ok("copy the node example", h->dir, cp, NULL, out, RUN_MS));
    const char *npm[] = {"npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", NULL};
    free(run_ok("npm ci", p->node_dir, npm, npm_env, out, BUILD_MS));
    cr_log_info("builds: %lld ms", (long long)(harness_now_ms() - t0));

    p->python[0] = "/usr/bin/python3";
    p->python[1] = PRODUCERS "/python/producer.py";
    p->go_argv[0] = p->go;
    p->java[0] = "java";
    p->java[1] = "-cp";
    snprintf(p->java_cp, sizeof p->java_cp, "%s:%s", p->java_out, JAVA_CLASSPATH);
    p->java[2] = p->java_cp;
    p->java[3] = "Producer";
    p->node[0] = "node";
    p->node[1] = "producer.js";
}

/* argv = prefix (n entries) + the rest (NULL-terminated) into buf (room for 16). */
static const char **command(const char **buf, const char *const *prefix, size_t n,
                            const char *const *rest)
{
    size_t i = 0;
    for (; i < n; i++)
        buf[i] = prefix[i];
    for (; *rest && i < 15; rest++)
        buf[i++] = *rest;
    buf[i] = NULL;
    return buf;
}

enum { PY, GO, JAVA, NODE, LANGS };
static const char *const LANG[LANGS] = {"python", "go", "java", "node"};
/* Each language's own orders: non-ASCII in every key. */
static const char *const PREFIX[LANGS] = {"py-café-", "go-zürich-", "java-ñandú-", "node-東京-"};

static const char **lang_argv(const producers *p, int lang, const char **buf,
                              const char *const *rest)
{
    switch (lang) {
    case PY:
        return command(buf, p->python, 2, rest);
    case GO:
        return command(buf, p->go_argv, 1, rest);
    case JAVA:
        return command(buf, p->java, 4, rest);
    default:
        return command(buf, p->node, 2, rest);
    }
}

static const char *lang_dir(const producers *p, int lang)
{
    return lang == NODE ? p->node_dir : PRODUCERS;
}

/* ---- the vector self-checks ------------------------------------------------------------- */

/* vectors.json with two expectations turned wrong, as a producer with those bugs would see them
 * right: the seed's key built camelCase, and the 129-byte multibyte key accepted (a limit
 * counted in characters). Written to path. */
static void write_doctored_vectors(const char *path)
{
    json_error_t err;
    json_t *cases = json_load_file(VECTORS, JSON_ALLOW_NUL, &err);
    cr_assert(cases, "%s: %s", VECTORS, err.text);
    int changed = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        if (strcmp(name, "seed_payment_callback/json") == 0) {
            json_object_set_new(json_object_get(c, "expect"), "biz_key",
                                json_string("orderId:20250101_0001:PAY_SUCCESS"));
            changed++;
        } else if (strcmp(name, "biz_key_129_bytes_multibyte/json") == 0) {
            json_t *key = json_object_get(json_object_get(c, "body_json"), "biz_key");
            json_object_set_new(c, "expect", json_pack("{sO}", "biz_key", key));
            changed++;
        }
    }
    cr_assert_eq(changed, 2, "the vectors no longer have the two cases this test changes");
    cr_assert_eq(json_dump_file(cases, path, 0), 0, "cannot write %s", path);
    json_decref(cases);
}

Test(producers, each_builds_and_passes_its_vector_self_check_which_catches_a_wrong_key)
{
    harness_fixture_init(&F, "producers_vectors", NULL);
    producers p = {0};
    build_producers(&F.h, &p);
    char doctored[400], out[400], want[80];
    snprintf(doctored, sizeof doctored, "%s/doctored-vectors.json", F.h.dir);
    write_doctored_vectors(doctored);

    for (int lang = 0; lang < LANGS; lang++) {
        const char *argv[16];
        const char *rest[] = {"--check-vectors", VECTORS, NULL};
        snprintf(out, sizeof out, "%s/check-%s.log", F.h.dir, LANG[lang]);
        char *text = run_ok(LANG[lang], lang_dir(&p, lang), lang_argv(&p, lang, argv, rest), NULL,
                            out, RUN_MS);
        snprintf(want, sizeof want, "%s check-vectors: ", LANG[lang]);
        char *line = strstr(text, want);
        cr_assert(line && strstr(line, " passed, 0 failed"), "%s:\n%s", LANG[lang], text);
        /* The 32 body_json cases, the seed's key, the seed encoded and one round trip. */
        cr_expect_geq(atoi(line + strlen(want)), 35, "%s checked too little:\n%s", LANG[lang],
                      text);
        free(text);

        const char *bad[] = {"--check-vectors", doctored, NULL};
        snprintf(out, sizeof out, "%s/check-doctored-%s.log", F.h.dir, LANG[lang]);
        int rc =
            wait_exit(spawn(lang_dir(&p, lang), lang_argv(&p, lang, argv, bad), NULL, NULL, out),
                      harness_now_ms() + RUN_MS);
        text = slurp(out);
        cr_expect_eq(rc, 1, "%s passed a vector file with two wrong expectations (exit %d):\n%s",
                     LANG[lang], rc, text);
        cr_expect(strstr(text, "seed_payment_callback/json") &&
                      strstr(text, "biz_key_129_bytes_multibyte/json"),
                  "%s did not name both doctored cases:\n%s", LANG[lang], text);
        free(text);
    }
}

/* ---- against a live idemq --------------------------------------------------------------- */

/* The amount of lang's order i: 2^63 - 1 for order 0 of every language. */
static long long amount_of(int lang, int i)
{
    return i == 0 ? INT64_MAX : (lang + 1) * 1000000LL + i;
}

/* Writes one events file for lang: lines [from, to) of its orders, then the first `dups` again,
 * and the shared event when `shared`. */
static void write_events(const char *path, int lang, int from, int to, int dups, bool shared)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s: %s", path, strerror(errno));
    for (int i = from; i < to; i++)
        fprintf(f, "%s%d PAY_SUCCESS %lld\n", PREFIX[lang], i, amount_of(lang, i));
    for (int i = 0; i < dups; i++)
        fprintf(f, "%s%d PAY_SUCCESS %lld\n", PREFIX[lang], i, amount_of(lang, i));
    if (shared)
        fprintf(f, "%s PAY_SUCCESS %s\n", SHARED_ORDER, SHARED_AMOUNT);
    fclose(f);
}

/* Processed and deduped log lines of one biz_key (borrowed), from the loaded log. */
static void outcomes_of(json_t *lines, const char *key, int *processed, int *deduped)
{
    *processed = *deduped = 0;
    for (size_t i = 0; i < json_array_size(lines); i++) {
        json_t *line = json_array_get(lines, i);
        const char *k = json_string_value(json_object_get(line, "biz_key"));
        const char *o = json_string_value(json_object_get(line, "outcome"));
        if (k && o && strcmp(k, key) == 0) {
            *processed += strcmp(o, "processed") == 0;
            *deduped += strcmp(o, "deduped") == 0;
        }
    }
}

Test(producers, four_languages_apply_exactly_once_with_one_event_shared_by_all)
{
    harness_options opts = {.workers = 4};
    harness_fixture_init(&F, "producers_live", &opts);
    harness *h = &F.h;
    producers p = {0};
    build_producers(h, &p);

    harness_sql(h, "SET NAMES utf8mb4");
    for (int lang = 0; lang < LANGS; lang++)
        harness_insert_orders(h, PREFIX[lang], ORDERS, "PAYING");
    harness_sql(h, "INSERT INTO orders (order_id, status) VALUES ('%s', 'PAYING')", SHARED_ORDER);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);

    /* Five runs at once: Python twice (JSON for its orders, MessagePack for its duplicates and
     * the shared event), the others once each with everything. */
    char amqp_url[600], routing_key[200];
    const char *url = getenv("IDEMQ_TEST_AMQP_URL");
    cr_assert(url && *url, "IDEMQ_TEST_AMQP_URL is not set: run through scripts/test");
    snprintf(amqp_url, sizeof amqp_url, "AMQP_URL=%s", url);
    snprintf(routing_key, sizeof routing_key, "AMQP_ROUTING_KEY=%s", h->queue);
    const char *env[] = {amqp_url, routing_key, NULL};
    struct run {
        int lang;
        bool msgpack;
        int from, to, dups; /* orders [from, to), then the first dups again */
        bool shared;
        pid_t pid;
        char in[400], out[400];
    } runs[] = {
        {.lang = PY, .to = ORDERS},
        {.lang = PY, .msgpack = true, .dups = DUPLICATED, .shared = true},
        {.lang = GO, .to = ORDERS, .dups = DUPLICATED, .shared = true},
        {.lang = JAVA, .to = ORDERS, .dups = DUPLICATED, .shared = true},
        {.lang = NODE, .to = ORDERS, .dups = DUPLICATED, .shared = true},
    };
    const size_t nruns = sizeof runs / sizeof runs[0];
    for (size_t r = 0; r < nruns; r++) {
        struct run *run = &runs[r];
        snprintf(run->in, sizeof run->in, "%s/events-%zu.txt", h->dir, r);
        snprintf(run->out, sizeof run->out, "%s/publish-%zu-%s.log", h->dir, r, LANG[run->lang]);
        write_events(run->in, run->lang, run->from, run->to, run->dups, run->shared);
        const char *argv[16], *json[] = {NULL}, *msgpack[] = {"--msgpack", NULL};
        run->pid = spawn(lang_dir(&p, run->lang),
                         lang_argv(&p, run->lang, argv, run->msgpack ? msgpack : json), env,
                         run->in, run->out);
    }
    int64_t deadline = harness_now_ms() + RUN_MS;
    for (size_t r = 0; r < nruns; r++) {
        int rc = wait_exit(runs[r].pid, deadline);
        char *text = slurp(runs[r].out), want[64];
        cr_assert_eq(rc, 0, "the %s producer failed (exit %d):\n%s", LANG[runs[r].lang], rc, text);
        int sent = runs[r].to - runs[r].from + runs[r].dups + runs[r].shared;
        snprintf(want, sizeof want, "%s: %d messages confirmed", LANG[runs[r].lang], sent);
        cr_assert(strstr(text, want), "expected \"%s\" from the %s producer:\n%s", want,
                  LANG[runs[r].lang], text);
        free(text);
    }

    /* Every message was confirmed by the broker: wait until idemq settled as many as were sent
     * (whatever the outcomes: the checks below tell them apart), then stop it, so that no line
     * can come after the counting. */
    const int keys = LANGS * ORDERS + 1, duplicates = LANGS * DUPLICATED + (LANGS - 1);
    cr_assert(harness_wait_log(h, "\"outcome\":", keys + duplicates, DEADLINE_MS),
              "idemq did not settle the %d messages sent", keys + duplicates);
    harness_stop_idemq(&F.daemon);
    cr_expect_eq(harness_queue_depth(h, h->queue), 0, "messages left in the work queue");

    /* Exactly once, per key: one processed line, as many deduped lines as copies beyond the
     * first; nothing else happened to any message. */
    json_t *lines = harness_log_load(h);
    char key[256];
    int processed, deduped;
    for (int lang = 0; lang < LANGS; lang++) {
        for (int i = 0; i < ORDERS; i++) {
            snprintf(key, sizeof key, "order_id:%s%d:PAY_SUCCESS", PREFIX[lang], i);
            outcomes_of(lines, key, &processed, &deduped);
            cr_expect(processed == 1 && deduped == (i < DUPLICATED),
                      "%s: %s processed %d times, deduped %d times", LANG[lang], key, processed,
                      deduped);
            cr_expect_eq(harness_scalar(h,
                                        "SELECT COUNT(*) FROM orders WHERE order_id = '%s%d' "
                                        "AND status = 'PAID' AND amount = %lld",
                                        PREFIX[lang], i, amount_of(lang, i)),
                         1, "%s: order %s%d is not PAID with amount %lld", LANG[lang], PREFIX[lang],
                         i, amount_of(lang, i));
        }
        cr_expect_eq(harness_scalar(h,
                                    "SELECT COUNT(*) FROM msg_dedup WHERE biz_key LIKE "
                                    "'order_id:%s%%'",
                                    PREFIX[lang]),
                     ORDERS, "%s: wrong number of dedup rows", LANG[lang]);
    }
    snprintf(key, sizeof key, "order_id:%s:PAY_SUCCESS", SHARED_ORDER);
    outcomes_of(lines, key, &processed, &deduped);
    cr_expect(processed == 1 && deduped == LANGS - 1,
              "the shared event was processed %d times and deduped %d times (want 1 and %d)",
              processed, deduped, LANGS - 1);
    /* The four encoders wrote the same bytes for the non-ASCII key: one row, this one. */
    cr_expect_eq(harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup WHERE biz_key = '%s'", key), 1);
    cr_expect_eq(harness_scalar(h, "SELECT COUNT(*) FROM msg_dedup"), keys,
                 "a variant of some key got a dedup row of its own");
    cr_expect_eq(harness_scalar(h,
                                "SELECT COUNT(*) FROM orders WHERE order_id = '%s' AND "
                                "status = 'PAID' AND amount = %s",
                                SHARED_ORDER, SHARED_AMOUNT),
                 1, "the shared order is not PAID with amount " SHARED_AMOUNT);

    /* Every message had its own message_id, the same in the body and the AMQP property. */
    json_t *ids = json_object();
    size_t settled = 0;
    for (size_t i = 0; i < json_array_size(lines); i++) {
        json_t *line = json_array_get(lines, i);
        const char *o = json_string_value(json_object_get(line, "outcome"));
        if (!o)
            continue;
        cr_expect(strcmp(o, "processed") == 0 || strcmp(o, "deduped") == 0,
                  "unexpected outcome %s for %s", o,
                  json_string_value(json_object_get(line, "biz_key")));
        const char *id = json_string_value(json_object_get(line, "message_id"));
        cr_expect(id && *id, "a log line without message_id");
        cr_expect(!json_object_get(line, "amqp_message_id"),
                  "body and property message_id differ for %s", id);
        if (id)
            json_object_set_new(ids, id, json_true());
        settled++;
    }
    cr_expect_eq(settled, (size_t)(keys + duplicates), "settled %zu messages, published %d",
                 settled, keys + duplicates);
    cr_expect_eq(json_object_size(ids), settled, "message_ids were reused across messages");
    json_decref(ids);
    json_decref(lines);
}
