/*
 * Observability and deployment examples, checked with the real tools: examples/prometheus (alert
 * rules, their promtool unit tests, the scrape config), examples/grafana (the dashboard) and
 * examples/kubernetes (the manifests).
 *
 * The main test runs a real Prometheus (Debian's package, the binary started directly on a free
 * loopback port with a temporary storage folder) that scrapes a live idemq every second with the
 * shipped prometheus.yml and evaluates the shipped rules, while a workload runs: new messages,
 * duplicates, a message that recovers after a retry, one that exhausts its retries and a body
 * that cannot be read. Then every expression of the dashboard is queried through Prometheus's
 * HTTP API and must return data (finite numbers, with a few values checked exactly); every rule
 * must evaluate without error, the dead-letter alert must fire for both classes, and every alert
 * expression without its threshold must return data (an alert that is not firing has an empty
 * expression: its signal is what shows it would work).
 *
 * Tools missing at test time fail the test with the package to install (scripts/setup installs
 * them all): prometheus (promtool too), /usr/bin/python3 with python3-yaml.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DEADLINE_MS 30000
#define READY_LINE "started consuming"
#define PYTHON "/usr/bin/python3" /* Debian's, with python3-yaml (not a python3 on PATH) */

static harness_fixture F;
static pid_t prometheus_pid;

/* Stops the Prometheus this suite started (SIGTERM, then SIGKILL after 10 s). */
static void stop_prometheus(void)
{
    if (prometheus_pid <= 0)
        return;
    harness_stop(prometheus_pid, SIGTERM, 10000);
    prometheus_pid = 0;
}

static void teardown(void)
{
    stop_prometheus();
    harness_fixture_fini(&F);
}

TestSuite(observability, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------------------------------ tools */

/* The absolute path of program in PATH, or fails the test naming the package to install. */
static void require_tool(const char *program, const char *package, char *out, size_t cap)
{
    if (program[0] == '/') {
        cr_assert(access(program, X_OK) == 0, "%s is missing: install %s (scripts/setup does)",
                  program, package);
        snprintf(out, cap, "%s", program);
        return;
    }
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/bin:/usr/sbin", path ? path : "");
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/%s", dir, program);
        if (access(out, X_OK) == 0)
            return;
    }
    cr_assert_fail("%s not found: install Debian's %s package (scripts/setup does)", program,
                   package);
}

/* Runs argv (argv[0] an absolute path) to completion with stdin from stdin_path (NULL:
 * /dev/null), stdout and stderr captured into *output (malloc'd). Returns the exit status, or
 * 128 + signal. */
static int run_command(const char *const *argv, const char *stdin_path, char **output)
{
    int pipefd[2];
    cr_assert(pipe(pipefd) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int in = open(stdin_path ? stdin_path : "/dev/null", O_RDONLY);
        if (in < 0)
            _exit(126);
        dup2(in, 0);
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t len = 0, cap = 8192;
    char *buf = malloc(cap);
    cr_assert(buf);
    for (;;) {
        if (cap - len < 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert(buf);
        }
        ssize_t n = read(pipefd[0], buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(pipefd[0]);
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    *output = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    cr_assert(text);
    cr_assert_eq(fread(text, 1, (size_t)size, f), (size_t)size);
    text[size] = '\0';
    fclose(f);
    return text;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/* Replaces the one occurrence of from in *text by to (the text is reallocated); fails the test
 * when from does not occur exactly once (the example changed: this test must follow). */
static void replace_once(char **text, const char *from, const char *to)
{
    char *at = strstr(*text, from);
    cr_assert(at, "expected \"%s\" in the shipped file", from);
    cr_assert_null(strstr(at + 1, from), "\"%s\" occurs more than once", from);
    size_t head = (size_t)(at - *text), from_len = strlen(from), to_len = strlen(to);
    size_t tail = strlen(at + from_len);
    char *out = malloc(head + to_len + tail + 1);
    cr_assert(out);
    memcpy(out, *text, head);
    memcpy(out + head, to, to_len);
    memcpy(out + head + to_len, at + from_len, tail + 1);
    free(*text);
    *text = out;
}

/* ------------------------------------------------------------------ promtool and the rules */

Test(observability, alert_rules_and_scrape_config_pass_promtool, .timeout = 60)
{
    char promtool[512], *out;
    require_tool("promtool", "prometheus", promtool, sizeof promtool);
    const char *dir = IDEMQ_SOURCE_DIR "/examples/prometheus";

    const char *check_rules[] = {promtool, "check", "rules",
                                 IDEMQ_SOURCE_DIR "/examples/prometheus/idemq-alerts.yml", NULL};
    int rc = run_command(check_rules, NULL, &out);
    cr_assert_eq(rc, 0, "promtool check rules failed (%d):\n%s", rc, out);
    free(out);

    /* promtool test rules resolves rule_files relative to the test file. */
    const char *test_rules[] = {promtool, "test", "rules",
                                IDEMQ_SOURCE_DIR "/examples/prometheus/idemq-alerts_test.yml",
                                NULL};
    rc = run_command(test_rules, NULL, &out);
    cr_assert_eq(rc, 0, "promtool test rules failed (%d):\n%s", rc, out);
    cr_assert(strstr(out, "SUCCESS"), "%s", out);
    free(out);

    const char *check_config[] = {promtool, "check", "config",
                                  IDEMQ_SOURCE_DIR "/examples/prometheus/prometheus.yml", NULL};
    rc = run_command(check_config, NULL, &out);
    cr_assert_eq(rc, 0, "promtool check config failed (%d):\n%s", rc, out);
    free(out);

    /* Every alert of the rule file has a unit test. */
    char *rules = read_file(IDEMQ_SOURCE_DIR "/examples/prometheus/idemq-alerts.yml");
    char *tests = read_file(IDEMQ_SOURCE_DIR "/examples/prometheus/idemq-alerts_test.yml");
    int alerts = 0;
    for (const char *p = rules; (p = strstr(p, "- alert: ")) != NULL; p++) {
        char name[128], needle[160];
        cr_assert_eq(sscanf(p, "- alert: %127s", name), 1);
        snprintf(needle, sizeof needle, "alertname: %s\n", name);
        cr_expect(strstr(tests, needle), "alert %s has no test in %s/idemq-alerts_test.yml", name,
                  dir);
        alerts++;
    }
    cr_assert(alerts >= 10, "only %d alerts found", alerts);
    free(rules);
    free(tests);
}

/* ------------------------------------------------------------------------------ kubernetes */

Test(observability, kubernetes_manifests_parse_and_agree_with_idemq, .timeout = 60)
{
    char python[512], idemq_config[400], *out;
    require_tool(PYTHON, "python3", python, sizeof python);
    harness_options opts = {0};
    harness_fixture_init(&F, "k8s_manifests", &opts);
    snprintf(idemq_config, sizeof idemq_config, "%s/k8s-idemq.yaml", F.h.dir);

    const char *check[] = {python, IDEMQ_SOURCE_DIR "/tests/support/check_kubernetes.py",
                           IDEMQ_SOURCE_DIR "/examples/kubernetes", idemq_config, NULL};
    int rc = run_command(check, NULL, &out);
    cr_assert_eq(rc, 0, "examples/kubernetes (check_kubernetes.py, exit %d):\n%s", rc, out);
    cr_assert(strstr(out, "documents ok"), "%s", out);
    free(out);

    /* The ConfigMap's idemq.yaml is a valid configuration for this idemq (loading it checks
     * every key; --dry-run connects to nothing). */
    const char *topology[] = {IDEMQ_BINARY, "topology", "--dry-run", "-c", idemq_config, NULL};
    rc = run_command(topology, NULL, &out);
    cr_assert_eq(rc, 0, "idemq rejects the ConfigMap's idemq.yaml (exit %d):\n%s", rc, out);
    cr_assert(strstr(out, "payments.dlq"), "%s", out);
    free(out);
}

/* ------------------------------------------------------------------ the Grafana dashboard */

static json_t *load_dashboard(void)
{
    json_error_t err;
    json_t *dash =
        json_load_file(IDEMQ_SOURCE_DIR "/examples/grafana/idemq-dashboard.json", 0, &err);
    cr_assert(dash, "idemq-dashboard.json: line %d: %s", err.line, err.text);
    return dash;
}

/* Calls fn(panel, ctx) for every panel that is not a row, nested panels of rows included. */
static void each_panel(json_t *panels, void (*fn)(json_t *panel, void *ctx), void *ctx)
{
    size_t i;
    json_t *panel;
    json_array_foreach(panels, i, panel)
    {
        const char *type = json_string_value(json_object_get(panel, "type"));
        if (type && strcmp(type, "row") == 0)
            each_panel(json_object_get(panel, "panels"), fn, ctx);
        else
            fn(panel, ctx);
    }
}

typedef struct shape_check {
    int panels, targets;
    int ids[256];
} shape_check;

static void check_panel_shape(json_t *panel, void *ctx)
{
    shape_check *c = ctx;
    const char *title = json_string_value(json_object_get(panel, "title"));
    cr_assert(title && title[0], "a panel without a title: %s", json_dumps(panel, 0));
    json_t *id = json_object_get(panel, "id");
    cr_assert(json_is_integer(id), "panel %s: no integer id", title);
    for (int k = 0; k < c->panels; k++)
        cr_assert_neq(c->ids[k], (int)json_integer_value(id), "panel %s: id repeats", title);
    cr_assert_lt(c->panels, 256);
    c->ids[c->panels++] = (int)json_integer_value(id);
    json_t *grid = json_object_get(panel, "gridPos");
    cr_assert(json_is_integer(json_object_get(grid, "w")) &&
                  json_is_integer(json_object_get(grid, "h")),
              "panel %s: gridPos needs w and h", title);
    cr_assert_str_eq(
        json_string_value(json_object_get(json_object_get(panel, "datasource"), "uid")),
        "${datasource}", "panel %s: not on the dashboard's data source", title);
    json_t *targets = json_object_get(panel, "targets");
    cr_assert(json_array_size(targets) > 0, "panel %s: no query", title);
    size_t i;
    json_t *t;
    json_array_foreach(targets, i, t)
    {
        cr_assert(json_string_value(json_object_get(t, "refId")), "panel %s: target %zu: refId",
                  title, i);
        const char *expr = json_string_value(json_object_get(t, "expr"));
        cr_assert(expr && expr[0], "panel %s: target %zu has no expr", title, i);
        c->targets++;
    }
}

Test(observability, grafana_dashboard_is_well_formed, .timeout = 30)
{
    json_t *dash = load_dashboard();
    cr_assert(json_string_value(json_object_get(dash, "uid")), "the dashboard needs a uid");
    cr_assert(json_is_integer(json_object_get(dash, "schemaVersion")));
    json_t *vars = json_object_get(json_object_get(dash, "templating"), "list");
    bool has_datasource = false;
    size_t i;
    json_t *v;
    json_array_foreach(vars, i, v)
    {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (type && strcmp(type, "datasource") == 0) {
            cr_assert_str_eq(json_string_value(json_object_get(v, "name")), "datasource");
            cr_assert_str_eq(json_string_value(json_object_get(v, "query")), "prometheus");
            has_datasource = true;
        }
    }
    cr_assert(has_datasource, "no datasource variable: the panels name ${datasource}");
    shape_check c = {0};
    each_panel(json_object_get(dash, "panels"), check_panel_shape, &c);
    cr_assert(c.panels >= 10 && c.targets >= c.panels, "%d panels, %d queries", c.panels,
              c.targets);
    json_decref(dash);
}

/* ------------------------------------------------------------------- Prometheus over HTTP */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind: %s", strerror(errno));
    socklen_t len = sizeof sa;
    cr_assert(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* One HTTP/1.0 request (so the answer is neither chunked nor kept alive) to 127.0.0.1:port;
 * form (may be NULL) is sent as an application/x-www-form-urlencoded POST body. Returns the
 * status (-1: no answer) and the body in *body (malloc'd, or NULL). 10 s deadline. */
static int http_request(int port, const char *path, const char *form, char **body)
{
    *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    size_t form_len = form ? strlen(form) : 0;
    size_t cap = strlen(path) + form_len + 256;
    char *request = malloc(cap);
    cr_assert(request);
    int n = form ? snprintf(request, cap,
                            "POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: "
                            "application/x-www-form-urlencoded\r\nContent-Length: %zu\r\n\r\n%s",
                            path, form_len, form)
                 : snprintf(request, cap, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    bool sent = send(fd, request, (size_t)n, MSG_NOSIGNAL) == n;
    free(request);
    if (!sent) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    cap = 65536;
    char *raw = malloc(cap);
    cr_assert(raw);
    int64_t deadline = harness_now_ms() + 10000;
    for (;;) {
        int left = (int)(deadline - harness_now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        if (cap - len < 4096) {
            cap *= 2;
            raw = realloc(raw, cap);
            cr_assert(raw);
        }
        ssize_t got = recv(fd, raw + len, cap - len - 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    raw[len] = '\0';
    int status = -1;
    if (len >= 12 && strncmp(raw, "HTTP/1.", 7) == 0)
        status = atoi(raw + 9);
    const char *end = strstr(raw, "\r\n\r\n");
    *body = strdup(end ? end + 4 : "");
    free(raw);
    return status;
}

static char *url_encode(const char *text)
{
    char *out = malloc(strlen(text) * 3 + 1), *o = out;
    cr_assert(out);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (isalnum(*p) || strchr("-_.~", *p))
            *o++ = (char)*p;
        else
            o += sprintf(o, "%%%02X", *p);
    }
    *o = '\0';
    return out;
}

static int prometheus_port;

/* GET or POST to Prometheus's API; returns the parsed answer (a new reference) when its status
 * is "success", else NULL with the reason in why. */
static json_t *prometheus_api(const char *path, const char *form, char *why, size_t why_len)
{
    char *body;
    int status = http_request(prometheus_port, path, form, &body);
    json_t *answer = body ? json_loads(body, 0, NULL) : NULL;
    const char *s = json_string_value(json_object_get(answer, "status"));
    if (status != 200 || !s || strcmp(s, "success") != 0) {
        snprintf(why, why_len, "HTTP %d: %.600s", status, body ? body : "(no answer)");
        json_decref(answer);
        answer = NULL;
    }
    free(body);
    return answer;
}

/* The result vector of an instant query (a new reference), or NULL with the reason. */
static json_t *prometheus_query(const char *expr, char *why, size_t why_len)
{
    char *encoded = url_encode(expr);
    char *form = malloc(strlen(encoded) + 8);
    cr_assert(form);
    sprintf(form, "query=%s", encoded);
    free(encoded);
    json_t *answer = prometheus_api("/api/v1/query", form, why, why_len);
    free(form);
    if (!answer)
        return NULL;
    json_t *data = json_object_get(answer, "data");
    const char *type = json_string_value(json_object_get(data, "resultType"));
    json_t *result = NULL;
    if (type && strcmp(type, "vector") == 0)
        result = json_incref(json_object_get(data, "result"));
    else
        snprintf(why, why_len, "result type %s, not a vector", type ? type : "(none)");
    json_decref(answer);
    return result;
}

/* The value of sample i of a result vector (Prometheus sends values as strings: "NaN",
 * "+Inf", "1.5"). */
static double sample_value(json_t *result, size_t i)
{
    const char *text =
        json_string_value(json_array_get(json_object_get(json_array_get(result, i), "value"), 1));
    return text ? strtod(text, NULL) : NAN;
}

/* The value of a query that returns one sample; NAN when it returns no data or fails. */
static double query_scalar(const char *expr)
{
    char why[1024];
    json_t *result = prometheus_query(expr, why, sizeof why);
    double v = json_array_size(result) == 1 ? sample_value(result, 0) : NAN;
    json_decref(result);
    return v;
}

typedef struct scalar_wait {
    const char *expr;
    double at_least;
} scalar_wait;

static bool scalar_reached(harness *h, void *arg)
{
    (void)h;
    scalar_wait *w = arg;
    double v = query_scalar(w->expr);
    return !isnan(v) && v >= w->at_least;
}

/* Waits until Prometheus answers expr with one sample >= at_least. */
static void wait_prometheus(const char *expr, double at_least, int timeout_ms)
{
    scalar_wait w = {expr, at_least};
    cr_assert(harness_wait_for(scalar_reached, &F.h, &w, timeout_ms),
              "Prometheus: %s stayed below %g for %d ms (last %g)", expr, at_least, timeout_ms,
              query_scalar(expr));
}

static bool prometheus_ready(harness *h, void *arg)
{
    (void)h;
    (void)arg;
    char *body;
    int status = http_request(prometheus_port, "/-/ready", NULL, &body);
    free(body);
    return status == 200;
}

/* Starts Prometheus on a free loopback port with config_path, its storage and log in F.h.dir;
 * returns when /-/ready answers 200. It dies with the test process (PR_SET_PDEATHSIG), and the
 * suite's .fini stops it otherwise. */
static void start_prometheus(const char *config_path)
{
    char binary[512], storage[400], log_path[400], config_flag[512], storage_flag[512],
        listen_flag[128];
    require_tool("prometheus", "prometheus", binary, sizeof binary);
    snprintf(storage, sizeof storage, "%s/prometheus-data", F.h.dir);
    snprintf(log_path, sizeof log_path, "%s/prometheus.log", F.h.dir);
    prometheus_port = free_port();
    snprintf(config_flag, sizeof config_flag, "--config.file=%s", config_path);
    snprintf(storage_flag, sizeof storage_flag, "--storage.tsdb.path=%s", storage);
    snprintf(listen_flag, sizeof listen_flag, "--web.listen-address=127.0.0.1:%d", prometheus_port);
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        int in = open("/dev/null", O_RDONLY);
        if (fd < 0 || in < 0)
            _exit(126);
        dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(binary, binary, config_flag, storage_flag, listen_flag, "--log.level=info",
              "--storage.tsdb.retention.time=1h", (char *)NULL);
        _exit(127);
    }
    prometheus_pid = pid;
    if (!harness_wait_for(prometheus_ready, &F.h, NULL, 30000)) {
        char *log = read_file(log_path);
        cr_assert_fail("Prometheus did not become ready on port %d; its log:\n%s", prometheus_port,
                       log);
    }
}

/* ------------------------------------------------------------- expressions to query */

/* The dashboard's expr with Grafana's variables replaced as Grafana would with "All" selected
 * and a range covering the whole test: $__rate_interval and $__range by 5m/10m windows,
 * $__interval by 15s, template variables ($job, ${queue}, ...: all have allValue ".*") by .*.
 * Fails the test on a variable it does not know. Returns a malloc'd string. */
static char *grafana_expand(const char *expr, json_t *vars)
{
    char *out = malloc(strlen(expr) * 2 + 64), *o = out;
    cr_assert(out);
    for (const char *p = expr; *p;) {
        if (*p != '$') {
            *o++ = *p++;
            continue;
        }
        const char *name = p + 1;
        bool braced = *name == '{';
        if (braced)
            name++;
        size_t n = 0;
        while (isalnum((unsigned char)name[n]) || name[n] == '_')
            n++;
        const char *after = name + n + (braced ? 1 : 0);
        const char *value = NULL;
        if (n == strlen("__rate_interval") && strncmp(name, "__rate_interval", n) == 0)
            value = "5m";
        else if (n == strlen("__range") && strncmp(name, "__range", n) == 0)
            value = "10m";
        else if (n == strlen("__interval") && strncmp(name, "__interval", n) == 0)
            value = "15s";
        else {
            size_t i;
            json_t *v;
            json_array_foreach(vars, i, v)
            {
                const char *var = json_string_value(json_object_get(v, "name"));
                const char *all = json_string_value(json_object_get(v, "allValue"));
                if (var && strlen(var) == n && strncmp(var, name, n) == 0 && all)
                    value = all;
            }
        }
        cr_assert(value, "unknown Grafana variable in: %s", expr);
        o += sprintf(o, "%s", value);
        p = after;
    }
    *o = '\0';
    return out;
}

/* Of an alert's expression (as Prometheus prints it in /api/v1/rules), the signal it compares:
 * absent(X) → X; the left operand of a top-level and/or/unless; then the left side of a
 * top-level comparison. "sum(rate(a[5m])) / sum(rate(b[5m])) > 0.5 and c > 1" → the ratio. */
static void alert_signal(const char *query, char *out, size_t cap)
{
    snprintf(out, cap, "%s", query);
    size_t len = strlen(out);
    while (len && isspace((unsigned char)out[len - 1]))
        out[--len] = '\0';
    if (strncmp(out, "absent(", 7) == 0 && out[len - 1] == ')') {
        memmove(out, out + 7, len - 7);
        out[len - 8] = '\0';
    }
    static const char *const set_ops[] = {" and ", " or ", " unless "};
    static const char *const comparisons[] = {" == ", " != ", " >= ", " <= ", " > ", " < "};
    for (int pass = 0; pass < 2; pass++) {
        const char *const *ops = pass == 0 ? set_ops : comparisons;
        size_t nops = pass == 0 ? 3 : 6;
        int depth = 0;
        bool quoted = false;
        for (size_t i = 0; out[i]; i++) {
            char c = out[i];
            if (quoted) {
                if (c == '\\' && out[i + 1])
                    i++;
                else if (c == '"')
                    quoted = false;
                continue;
            }
            if (c == '"')
                quoted = true;
            else if (c == '(' || c == '{' || c == '[')
                depth++;
            else if (c == ')' || c == '}' || c == ']')
                depth--;
            else if (depth == 0) {
                bool cut = false;
                for (size_t k = 0; k < nops && !cut; k++)
                    cut = strncmp(out + i, ops[k], strlen(ops[k])) == 0;
                if (cut) {
                    out[i] = '\0';
                    break;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- the live Prometheus test */

typedef struct dashboard_run {
    json_t *vars;
    int queried;
    double retry_success, duplicates, dead_letters; /* from the overview's stat panels */
} dashboard_run;

/* Every target of panel returns data through the live Prometheus, every value finite. */
static void query_panel(json_t *panel, void *ctx)
{
    dashboard_run *run = ctx;
    const char *title = json_string_value(json_object_get(panel, "title"));
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(panel, "targets"), i, t)
    {
        char *expr = grafana_expand(json_string_value(json_object_get(t, "expr")), run->vars);
        char why[1024];
        json_t *result = prometheus_query(expr, why, sizeof why);
        cr_assert(result, "panel \"%s\": %s: %s", title, expr, why);
        cr_assert(json_array_size(result) > 0, "panel \"%s\" has no data: %s", title, expr);
        for (size_t k = 0; k < json_array_size(result); k++) {
            double v = sample_value(result, k);
            cr_assert(isfinite(v), "panel \"%s\": %s gives %s", title, expr,
                      json_dumps(json_array_get(result, k), 0));
        }
        if (strcmp(title, "Retry success (1h)") == 0)
            run->retry_success = sample_value(result, 0);
        else if (strcmp(title, "Duplicates (5m)") == 0)
            run->duplicates = sample_value(result, 0);
        else if (strcmp(title, "Dead letters in range") == 0)
            run->dead_letters = sample_value(result, 0);
        json_decref(result);
        free(expr);
        run->queried++;
    }
}

/* label_values(SELECTOR, LABEL) of a template variable has values: count by (LABEL) (SELECTOR)
 * returns data. */
static void query_variables(json_t *vars)
{
    size_t i;
    json_t *v;
    json_array_foreach(vars, i, v)
    {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (!type || strcmp(type, "query") != 0)
            continue;
        const char *q = json_string_value(json_object_get(json_object_get(v, "query"), "query"));
        cr_assert(q && strncmp(q, "label_values(", 13) == 0, "variable query %s", q ? q : "?");
        const char *comma = strrchr(q, ',');
        cr_assert(comma);
        char selector[512], label[64], expr[700];
        snprintf(selector, sizeof selector, "%.*s", (int)(comma - q - 13), q + 13);
        cr_assert_eq(sscanf(comma + 1, " %63[a-z_]", label), 1);
        char *expanded = grafana_expand(selector, vars);
        snprintf(expr, sizeof expr, "count by (%s) (%s)", label, expanded);
        free(expanded);
        char why[1024];
        json_t *result = prometheus_query(expr, why, sizeof why);
        cr_assert(result, "variable %s: %s: %s", json_string_value(json_object_get(v, "name")),
                  expr, why);
        cr_assert(json_array_size(result) > 0, "variable %s has no values: %s",
                  json_string_value(json_object_get(v, "name")), expr);
        json_decref(result);
    }
}

static bool log_has_both(harness *h, void *arg)
{
    const char *const *pair = arg;
    return harness_log_count_both(h->log_path, pair[0], pair[1]) > 0;
}

/* IdemqDeadLetters is firing for queue and class. */
static bool dead_letter_alert_firing(json_t *alerts, const char *queue, const char *class_name)
{
    size_t i;
    json_t *a;
    json_array_foreach(alerts, i, a)
    {
        json_t *labels = json_object_get(a, "labels");
        const char *name = json_string_value(json_object_get(labels, "alertname"));
        const char *q = json_string_value(json_object_get(labels, "queue"));
        const char *c = json_string_value(json_object_get(labels, "class"));
        const char *state = json_string_value(json_object_get(a, "state"));
        if (name && q && c && state && strcmp(name, "IdemqDeadLetters") == 0 &&
            strcmp(q, queue) == 0 && strcmp(c, class_name) == 0 && strcmp(state, "firing") == 0)
            return true;
    }
    return false;
}

static bool both_dead_letter_alerts_fire(harness *h, void *arg)
{
    (void)arg;
    char why[1024];
    json_t *answer = prometheus_api("/api/v1/alerts", NULL, why, sizeof why);
    json_t *alerts = json_object_get(json_object_get(answer, "data"), "alerts");
    bool firing = dead_letter_alert_firing(alerts, h->queue, "non_retryable") &&
                  dead_letter_alert_firing(alerts, h->queue, "retries_exhausted");
    json_decref(answer);
    return firing;
}

Test(observability, prometheus_scrapes_a_live_idemq_and_every_expression_has_data, .timeout = 110)
{
    /* Retries fast enough for a test: 200 ms, 400 ms, 800 ms, then the DLQ. */
    harness_options opts = {
        .workers = 2, .retry_set = true, .max_retries = 3, .base = "200ms", .jitter = "50ms"};
    harness_fixture_init(&F, "observability", &opts);
    harness_fixture_start(&F, READY_LINE, DEADLINE_MS);
    int idemq_port = harness_http_port(&F.h, 10000);

    /* The shipped prometheus.yml, pointed at this idemq, at the shipped rules by absolute path,
     * with 1 s scrapes and evaluations. */
    char *config = read_file(IDEMQ_SOURCE_DIR "/examples/prometheus/prometheus.yml");
    char target[64], config_path[400];
    snprintf(target, sizeof target, "\"127.0.0.1:%d\"", idemq_port);
    replace_once(&config, "scrape_interval: 15s", "scrape_interval: 1s");
    replace_once(&config, "evaluation_interval: 15s", "evaluation_interval: 1s");
    replace_once(&config, "\"127.0.0.1:9464\"", target);
    replace_once(&config, "- idemq-alerts.yml",
                 "- " IDEMQ_SOURCE_DIR "/examples/prometheus/idemq-alerts.yml");
    snprintf(config_path, sizeof config_path, "%s/prometheus.yml", F.h.dir);
    write_file(config_path, config);
    free(config);
    start_prometheus(config_path);

    /* A first scrape before any message: rate() and increase() then see the whole workload. */
    wait_prometheus("sum(up{job=\"idemq\"})", 1, 20000);
    wait_prometheus("count(idemq_build_info{job=\"idemq\"})", 1, 20000);

    /* idemq's page passes promtool's linter as well. */
    char promtool[512], *page, *out, page_path[400];
    require_tool("promtool", "prometheus", promtool, sizeof promtool);
    cr_assert_eq(harness_http_get(idemq_port, "/metrics", &page), 200);
    snprintf(page_path, sizeof page_path, "%s/metrics.txt", F.h.dir);
    write_file(page_path, page);
    free(page);
    const char *lint[] = {promtool, "check", "metrics", NULL};
    int rc = run_command(lint, page_path, &out);
    cr_assert_eq(rc, 0, "promtool check metrics on idemq's /metrics (exit %d):\n%s", rc, out);
    free(out);

    /* The workload: "late" fails (no row) until its row appears after the first retry; "ghost"
     * never gets one and exhausts its retries; a body that is not JSON is dead-lettered at once;
     * five orders are paid and three of them paid again (duplicates). */
    harness_insert_orders(&F.h, "o", 5, "PAYING");
    harness_publish_event(&F.h, "late", "PAY_SUCCESS", 100);
    harness_publish_event(&F.h, "ghost", "PAY_SUCCESS", 100);
    harness_publish(&F.h, NULL, "application/json", "not json", 8, NULL);
    for (int i = 0; i < 5; i++) {
        char order[16];
        snprintf(order, sizeof order, "o%d", i);
        harness_publish_event(&F.h, order, "PAY_SUCCESS", 1000 + i);
    }
    const char *late_retry[] = {"retry 1 of 3", "order_id:late:"};
    cr_assert(harness_wait_for(log_has_both, &F.h, (void *)late_retry, DEADLINE_MS),
              "no first retry of \"late\"");
    harness_sql(&F.h, "INSERT INTO orders VALUES ('late', 'PAYING', NULL)");
    for (int i = 0; i < 3; i++) {
        char order[16];
        snprintf(order, sizeof order, "o%d", i);
        harness_publish_event(&F.h, order, "PAY_SUCCESS", 1000 + i);
    }
    cr_assert(harness_wait_scalar(&F.h, 6, DEADLINE_MS,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"));
    cr_assert(harness_wait_log(&F.h, "dead-lettered (", 2, DEADLINE_MS),
              "expected two dead letters (the bad body and ghost)");
    cr_assert(harness_wait_log(&F.h, "\"outcome\":\"deduped\"", 3, DEADLINE_MS));

    /* Prometheus has scraped the end of the workload. */
    char expr[512];
    snprintf(expr, sizeof expr, "sum(idemq_messages_total{outcome=\"processed\",queue=\"%s\"})",
             F.h.queue);
    wait_prometheus(expr, 6, 20000);
    snprintf(expr, sizeof expr, "sum(idemq_messages_total{outcome=\"deduped\",queue=\"%s\"})",
             F.h.queue);
    wait_prometheus(expr, 3, 20000);
    wait_prometheus("sum(idemq_dead_lettered_total)", 2, 20000);
    wait_prometheus("sum(idemq_retry_recovered_total)", 1, 20000);
    wait_prometheus("sum(idemq_retry_dead_lettered_total)", 1, 20000);
    /* The start time is the same at every scrape (IdemqRestarting counts its changes). */
    cr_assert_eq(query_scalar("changes(process_start_time_seconds{job=\"idemq\"}[10m])"), 0.0,
                 "process_start_time_seconds changed between scrapes of one process");
    /* The rules evaluated on it: the dead-letter alert fires, once per class. */
    cr_assert(harness_wait_for(both_dead_letter_alerts_fire, &F.h, NULL, 20000),
              "IdemqDeadLetters did not fire for both classes on %s", F.h.queue);

    /* Every rule of the shipped file loaded and evaluates without error; every alert's signal
     * has data. */
    char why[1024];
    json_t *rules = prometheus_api("/api/v1/rules", NULL, why, sizeof why);
    cr_assert(rules, "/api/v1/rules: %s", why);
    char *rule_file = read_file(IDEMQ_SOURCE_DIR "/examples/prometheus/idemq-alerts.yml");
    int shipped = 0, seen = 0;
    for (const char *p = rule_file; (p = strstr(p, "- alert: ")) != NULL; p++)
        shipped++;
    free(rule_file);
    size_t gi, ri;
    json_t *group, *rule;
    json_array_foreach(json_object_get(json_object_get(rules, "data"), "groups"), gi, group)
    {
        json_array_foreach(json_object_get(group, "rules"), ri, rule)
        {
            const char *name = json_string_value(json_object_get(rule, "name"));
            const char *health = json_string_value(json_object_get(rule, "health"));
            const char *query = json_string_value(json_object_get(rule, "query"));
            cr_assert(name && query, "a rule without name or query");
            cr_assert_str_eq(health ? health : "(none)", "ok", "rule %s: health %s, error %s", name,
                             health ? health : "(none)",
                             json_string_value(json_object_get(rule, "lastError")));
            char signal[2048];
            alert_signal(query, signal, sizeof signal);
            json_t *result = prometheus_query(signal, why, sizeof why);
            cr_assert(result, "alert %s: signal %s: %s", name, signal, why);
            cr_assert(json_array_size(result) > 0, "alert %s: its signal has no data: %s", name,
                      signal);
            cr_log_info("alert %s: signal %s: %zu series", name, signal, json_array_size(result));
            json_decref(result);
            seen++;
        }
    }
    json_decref(rules);
    cr_assert_eq(seen, shipped, "Prometheus loaded %d of the %d shipped alerts", seen, shipped);

    /* Every dashboard query, and every template variable's values. */
    json_t *dash = load_dashboard();
    dashboard_run run = {.vars = json_object_get(json_object_get(dash, "templating"), "list"),
                         .retry_success = NAN,
                         .duplicates = NAN,
                         .dead_letters = NAN};
    query_variables(run.vars);
    each_panel(json_object_get(dash, "panels"), query_panel, &run);
    cr_assert(run.queried >= 20, "only %d dashboard queries", run.queried);
    /* Each series starts at 0 in the window and is scraped at the same instants, so increase()
     * extrapolates numerator and denominator alike: the ratios are exact. Retry success: late
     * recovered, ghost did not; duplicates: 3 of 9 settled messages. */
    cr_assert(fabs(run.retry_success - 0.5) < 1e-9, "retry success %g, expected 0.5",
              run.retry_success);
    cr_assert(fabs(run.duplicates - 1.0 / 3.0) < 1e-9, "duplicates %g, expected 1/3",
              run.duplicates);
    /* increase() extrapolates to the query's instant: by at most 1.1 scrape intervals over
     * the several seconds sampled since the first scrape. */
    cr_assert(run.dead_letters >= 2 && run.dead_letters < 3.5, "dead letters in range %g",
              run.dead_letters);
    json_decref(dash);

    stop_prometheus();
    harness_stop_idemq(&F.daemon);
}
