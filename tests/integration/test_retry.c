/*
 * test_retry — the retry ladder and the dead-letter queue against real RabbitMQ and MariaDB,
 * driving the real idemq binary: recovery within the schedule, exhausted retries and
 * non-retryable failures in the DLQ with the original body and headers (a producer's user_id
 * moved to a header), the jitter bound, retry counts across kill -9, retries that reach only the
 * consumer's queue, a clear 406 on a changed TTL, and the dlq list/replay/purge commands.
 *
 * Failure injection without mocks: a BEFORE UPDATE trigger on `orders` SIGNALs a deadlock
 * (SQLSTATE 40001, errno 1213: retryable) while the order's counter in `fail_budget` is above
 * zero. `fail_budget` and `attempts` are MyISAM tables, so the counter decrement and the attempt
 * record survive the rollback of the failing transaction. A missing `orders` row (state machine:
 * row missing → retryable) is the other retryable failure used here.
 *
 * Retry delays are measured between the "ts" of consecutive outcome log lines of one message
 * (attempt n-1 logs before its retry copy is published, attempt n after it was applied), against
 * the schedule's bounds plus a stated tolerance (DELAY_TOLERANCE_MS).
 *
 * Waiting is always on an observable condition with a deadline (harness_wait_*), never a bare
 * sleep. Each test has its own queue names and database, so Criterion may run them in parallel.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "harness.h"

/* Scheduling tolerance on top of a retry's largest delay: publish + confirm of the copy, the
 * broker's expiry of the queue head, dead-lettering, delivery and one DB transaction, on a
 * loaded 2-core machine (possibly an ASan build, possibly with other suites running). */
#define DELAY_TOLERANCE_MS 400

/* ------------------------------------------------------------------------------ fixture */

static harness H;
static bool h_ready;
static pid_t daemon_pid;
static char extra_exchange[200]; /* deleted at teardown when set */
static char extra_queue[200];
static char extra_user[64]; /* a RabbitMQ user, deleted at teardown when set */

static void teardown(void)
{
    harness_kill_idemq(&daemon_pid);
    if (extra_user[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rabbitmqctl delete_user %s", extra_user);
        harness_services_ok(cmd);
        extra_user[0] = '\0';
    }
    if (!h_ready)
        return;
    if (extra_queue[0])
        amqp_queue_delete(H.amqp, 1, amqp_cstring_bytes(extra_queue), 0, 0);
    if (extra_exchange[0])
        amqp_exchange_delete(H.amqp, 1, amqp_cstring_bytes(extra_exchange), 0);
    harness_fini(&H);
    h_ready = false;
}

static void setup(const char *name, const harness_options *o)
{
    harness_init(&H, name, o);
    h_ready = true;
}

/* ------------------------------------------------------------------------------ helpers */

static int64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void install_failure_injection(harness *h)
{
    harness_sql(h, "CREATE TABLE fail_budget (order_id VARCHAR(64) PRIMARY KEY, "
                   "remaining INT NOT NULL) ENGINE=MyISAM");
    harness_sql(h, "CREATE TABLE attempts (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                   "order_id VARCHAR(64) NOT NULL, at DATETIME(3) NOT NULL) ENGINE=MyISAM");
    harness_sql(h,
                "CREATE TRIGGER orders_fail BEFORE UPDATE ON orders FOR EACH ROW BEGIN "
                "  INSERT INTO attempts (order_id, at) VALUES (OLD.order_id, NOW(3)); "
                "  IF (SELECT COALESCE(MAX(remaining), 0) FROM fail_budget "
                "      WHERE order_id = OLD.order_id) > 0 THEN "
                "    UPDATE fail_budget SET remaining = remaining - 1 "
                "      WHERE order_id = OLD.order_id; "
                "    SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, "
                "      MESSAGE_TEXT = 'injected deadlock'; "
                "  END IF; "
                "END");
}

static void queue_name(char *buf, size_t len, const char *suffix)
{
    snprintf(buf, len, "%s%s", H.queue, suffix);
}

/* One transaction per message (mysql.batch: 1) for a test that counts attempts with a
 * non-transactional trigger: a batch whose multi-row UPDATE hits an injected failure is
 * rolled back and its messages run again alone, so the batch's attempt would fire the MyISAM
 * counters once more than a lone message does (the failure is still charged once). */
static void one_transaction_per_message(void)
{
    FILE *f = fopen(H.config_path, "r");
    cr_assert(f);
    char line[2048] = "", *found = NULL;
    while (!found && fgets(line, sizeof line, f))
        if (strncmp(line, "mysql: ", 7) == 0)
            found = line;
    fclose(f);
    cr_assert(found, "no mysql line in %s", H.config_path);
    char *end = strrchr(found, '}');
    cr_assert(end);
    snprintf(end, sizeof line - (size_t)(end - found), ", batch: 1}");
    harness_config_replace_line(&H, "mysql: ", found);
}

static long long jint(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* The log lines that carry an outcome for biz_key (NULL: any message), in order. */
static json_t *outcome_lines(json_t *all, const char *biz_key)
{
    json_t *out = json_array();
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line) {
        if (!json_object_get(line, "outcome"))
            continue;
        if (biz_key && strcmp(harness_json_str(line, "biz_key"), biz_key) != 0)
            continue;
        json_array_append(out, line);
    }
    return out;
}

static long count_outcome(json_t *lines, const char *outcome)
{
    long n = 0;
    size_t i;
    json_t *line;
    json_array_foreach(lines, i, line) if (strcmp(harness_json_str(line, "outcome"), outcome) == 0)
        n++;
    return n;
}

static bool header_text(const amqp_message_t *m, const char *name, char *buf, size_t len)
{
    amqp_bytes_t v;
    if (!message_header_bytes(&m->properties, name, &v)) {
        buf[0] = '\0';
        return false;
    }
    snprintf(buf, len, "%.*s", (int)v.len, (const char *)v.bytes);
    return true;
}

static void event_body(char *buf, size_t len, const char *order_id, const char *event)
{
    snprintf(buf, len,
             "{\"message_id\":\"m-%s-%s\",\"biz_key\":\"order_id:%s:%s\",\"order_id\":\"%s\","
             "\"event_type\":\"%s\",\"amount\":500}",
             order_id, event, order_id, event, order_id, event);
}

static bool body_contains(const amqp_message_t *m, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= m->body.len; i++)
        if (memcmp((const char *)m->body.bytes + i, needle, n) == 0)
            return true;
    return false;
}

/* GET /metrics from the running idemq (its address: the last "http listening on HOST:PORT"
 * log line). Returns the malloc'd response (head and body) or NULL. */
static char *scrape_metrics(void)
{
    json_t *all = harness_log_load(&H);
    char host[64] = "";
    int port = 0;
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line) {
        const char *msg = harness_json_str(line, "msg");
        if (strncmp(msg, "http listening on ", 18) == 0)
            sscanf(msg + 18, "%63[^:]:%d", host, &port);
    }
    json_decref(all);
    if (!port)
        return NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct timeval timeout = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return NULL;
    }
    static const char request[] = "GET /metrics HTTP/1.1\r\nHost: idemq\r\n\r\n";
    if (write(fd, request, sizeof request - 1) != (ssize_t)(sizeof request - 1)) {
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 65536;
    char *text = malloc(cap);
    for (ssize_t n; text && (n = read(fd, text + len, cap - len - 1)) > 0;) {
        len += (size_t)n;
        if (len + 1 == cap) {
            char *bigger = realloc(text, cap *= 2);
            if (!bigger) {
                free(text);
                text = NULL;
            }
            text = bigger;
        }
    }
    close(fd);
    if (text)
        text[len] = '\0';
    return text;
}

/* Value of the sample `name{labels}` in a scrape; -1 when absent. */
static long long metric_value(const char *scrape, const char *name, const char *labels)
{
    char prefix[512];
    int n = snprintf(prefix, sizeof prefix, "\n%s{%s} ", name, labels);
    const char *at = scrape ? strstr(scrape, prefix) : NULL;
    return at ? atoll(at + n) : -1;
}

typedef struct metric_wait {
    const char *name;
    char labels[256];
    long long expected;
    long long last;
} metric_wait;

static bool metric_reached(harness *h, void *arg)
{
    (void)h;
    metric_wait *w = arg;
    char *scrape = scrape_metrics();
    w->last = metric_value(scrape, w->name, w->labels);
    free(scrape);
    return w->last == w->expected;
}

/* Waits until the running idemq reports `name{queue="Q"<extra>} expected`. */
static bool wait_metric(const char *name, const char *extra_labels, long long expected,
                        int timeout_ms)
{
    metric_wait w = {.name = name, .expected = expected, .last = -2};
    snprintf(w.labels, sizeof w.labels, "queue=\"%s\"%s", H.queue,
             extra_labels ? extra_labels : "");
    bool ok = harness_wait_for(metric_reached, &H, &w, timeout_ms);
    if (!ok)
        cr_log_error("waited %d ms for %s{%s} = %lld on /metrics; last %lld", timeout_ms, name,
                     w.labels, expected, w.last);
    return ok;
}

/* ------------------------------------------------------------------------------ recovery */

Test(retry, fails_three_times_then_succeeds_within_schedule, .fini = teardown, .timeout = 60)
{
    const int64_t base = 200, jitter = 100;
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "200ms", .jitter = "100ms"};
    setup("retry_recovers", &o);
    install_failure_injection(&H);
    harness_insert_orders(&H, "r", 1, "PAYING");
    harness_sql(&H, "INSERT INTO fail_budget VALUES ('r0', 3)");
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);

    harness_publish_event(&H, "r0", "PAY_SUCCESS", 4200);
    cr_assert(harness_wait_scalar(&H, 1, 20000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_log(&H, "processed after 3 retries", 1, 5000));
    /* The recovery is counted as such, and the three retries as retried. */
    cr_assert(wait_metric("idemq_retry_recovered_total", NULL, 1, 5000));
    cr_assert(wait_metric("idemq_messages_total", ",outcome=\"retried\"", 3, 5000));
    cr_assert(wait_metric("idemq_messages_total", ",outcome=\"processed\"", 1, 5000));
    harness_stop_idemq(&daemon_pid);

    /* Applied once. */
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup "
                                    "WHERE biz_key = 'order_id:r0:PAY_SUCCESS'"), 1);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE order_id = 'r0' AND "
                                    "status = 'PAID' AND amount = 4200"), 1);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM attempts"), 4,
                 "three failed attempts and one successful one");
    cr_assert_eq(harness_scalar(&H, "SELECT remaining FROM fail_budget"), 0);

    /* The log: retries 0, 1, 2 retried, then retries 3 processed. */
    json_t *all = harness_log_load(&H);
    json_t *lines = outcome_lines(all, "order_id:r0:PAY_SUCCESS");
    cr_assert_eq(json_array_size(lines), 4, "expected 4 outcome lines, got %zu",
                 json_array_size(lines));
    for (int n = 0; n < 4; n++) {
        json_t *line = json_array_get(lines, (size_t)n);
        cr_assert_eq(jint(line, "retries"), n, "attempt %d logged retries %lld", n,
                     jint(line, "retries"));
        cr_assert_str_eq(harness_json_str(line, "outcome"), n < 3 ? "retried" : "processed");
        if (n < 3)
            cr_assert(strstr(harness_json_str(line, "msg"),
                             "MySQL error 1213 (40001): injected deadlock"),
                      "the SIGNALed deadlock should reach idemq as errno 1213: %s",
                      harness_json_str(line, "msg"));
    }
    cr_assert_str_eq(harness_json_str(json_array_get(lines, 3), "msg"),
                     "processed after 3 retries");

    /* Delays: attempt n comes back after [base*2^(n-1), base*2^(n-1) + jitter + tolerance]. */
    for (int n = 1; n <= 3; n++) {
        json_t *prev = json_array_get(lines, (size_t)n - 1), *cur = json_array_get(lines, (size_t)n);
        int64_t lower = base << (n - 1), upper = lower + jitter + DELAY_TOLERANCE_MS;
        int64_t measured = jint(cur, "_ts_ms") - jint(prev, "_ts_ms");
        unsigned level = 0, of = 0;
        unsigned long long drawn = 0;
        cr_assert_eq(
            sscanf(harness_json_str(prev, "msg"), "retry %u of %u in %llu ms", &level, &of, &drawn),
            3, "unexpected retry log text: %s", harness_json_str(prev, "msg"));
        fprintf(stderr,
                "[measure] retry %d: drawn delay %llu ms (schedule %" PRId64 "..%" PRId64
                "), measured %" PRId64 " ms (bound %" PRId64 "..%" PRId64 ")\n",
                n, drawn, lower, lower + jitter, measured, lower, upper);
        cr_assert_eq(level, (unsigned)n);
        cr_assert_eq(of, 3u);
        cr_assert((int64_t)drawn >= lower && (int64_t)drawn <= lower + jitter,
                  "retry %d drew %llu ms, outside [%" PRId64 ", %" PRId64 "]", n, drawn, lower,
                  lower + jitter);
        cr_assert(measured >= (int64_t)drawn,
                  "retry %d came back after %" PRId64 " ms, before its %llu ms delay", n,
                  measured, drawn);
        cr_assert(measured <= upper,
                  "retry %d came back after %" PRId64 " ms; bound is %" PRId64 " ms (%" PRId64
                  " + jitter %" PRId64 " + tolerance %d)",
                  n, measured, upper, lower, jitter, DELAY_TOLERANCE_MS);
    }
    json_decref(lines);
    json_decref(all);

    /* Nothing left anywhere. */
    cr_assert_eq(harness_queue_depth_of(&H, ""), 0);
    cr_assert_eq(harness_queue_depth_of(&H, ".retry.1") + harness_queue_depth_of(&H, ".retry.2") +
                     harness_queue_depth_of(&H, ".retry.3"),
                 0);
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 0);
}

/* ------------------------------------------------------------------------------ exhausted */

Test(retry, always_failing_ends_in_dlq_with_original_body_and_headers, .fini = teardown,
     .timeout = 60)
{
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "100ms", .jitter = "50ms"};
    setup("retry_exhausted", &o);
    install_failure_injection(&H);
    harness_insert_orders(&H, "a", 1, "PAYING");
    harness_sql(&H, "INSERT INTO fail_budget VALUES ('a0', 1000000)");
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);

    /* Unusual but valid bytes: spacing, key order, non-ASCII text: any re-encoding shows. */
    static const char body[] =
        "{ \"amount\" : 990,\n  \"biz_key\":\"order_id:a0:PAY_SUCCESS\", \"order_id\":\"a0\","
        "\"event_type\":\"PAY_SUCCESS\", \"note\":\"h\\u00e9llo \xe2\x80\x93 \xc3\xbc\","
        "\"message_id\":\"m-a0\" }";
    amqp_table_entry_t hdr[2];
    hdr[0].key = amqp_cstring_bytes("trace-id");
    hdr[0].value.kind = AMQP_FIELD_KIND_UTF8;
    hdr[0].value.value.bytes = amqp_cstring_bytes("trace-7f3a");
    hdr[1].key = amqp_cstring_bytes("tenant-shard");
    hdr[1].value.kind = AMQP_FIELD_KIND_I32;
    hdr[1].value.value.i32 = 17;
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
                   AMQP_BASIC_APP_ID_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    props.correlation_id = amqp_cstring_bytes("corr-a0");
    props.app_id = amqp_cstring_bytes("payments-gateway");
    props.headers = (amqp_table_t){.num_entries = 2, .entries = hdr};
    int64_t published_at = wall_ms();
    harness_publish_props(&H, NULL, H.queue, &props, body, sizeof body - 1);

    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 1, 20000),
              "the message never reached the DLQ");
    cr_assert(harness_wait_log(&H, "\"outcome\":\"dead_lettered\"", 1, 5000));
    cr_assert(wait_metric("idemq_messages_total", ",outcome=\"dead_lettered\"", 1, 5000));
    cr_assert(wait_metric("idemq_messages_total", ",outcome=\"retried\"", 3, 5000));
    cr_assert(wait_metric("idemq_retry_recovered_total", NULL, 0, 5000));
    harness_stop_idemq(&daemon_pid);

    /* Exactly max_retries retries, then the dead letter. */
    json_t *all = harness_log_load(&H);
    json_t *lines = outcome_lines(all, "order_id:a0:PAY_SUCCESS");
    cr_assert_eq(json_array_size(lines), 4, "expected 4 outcome lines, got %zu",
                 json_array_size(lines));
    cr_assert_eq(count_outcome(lines, "retried"), 3);
    for (int n = 0; n < 4; n++)
        cr_assert_eq(jint(json_array_get(lines, (size_t)n), "retries"), n);
    json_t *last = json_array_get(lines, 3);
    cr_assert_str_eq(harness_json_str(last, "outcome"), "dead_lettered");
    const char *prefix = "dead-lettered (retries_exhausted): ";
    cr_assert(strncmp(harness_json_str(last, "msg"), prefix, strlen(prefix)) == 0, "%s",
              harness_json_str(last, "msg"));
    char last_error[1100];
    snprintf(last_error, sizeof last_error, "%s", harness_json_str(last, "msg") + strlen(prefix));
    int64_t first_failure_logged = jint(json_array_get(lines, 0), "_ts_ms");
    int64_t last_failure_logged = jint(last, "_ts_ms");
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM attempts"), 4);

    /* Nothing left in the work queue or the ladder; one copy in the DLQ. */
    cr_assert_eq(harness_queue_depth_of(&H, ""), 0);
    for (int level = 1; level <= 3; level++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, ".retry.%d", level);
        cr_assert_eq(harness_queue_depth_of(&H, suffix), 0, "%s%s is not empty", H.queue, suffix);
    }
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 1);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 0,
                 "a failed message must leave no dedup row");
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAYING'"), 1);

    char dlq[200], text[1200];
    queue_name(dlq, sizeof dlq, ".dlq");
    amqp_message_t m;
    cr_assert(harness_get(&H, dlq, &m));
    cr_assert_eq(m.body.len, sizeof body - 1, "DLQ body has %zu bytes, original %zu", m.body.len,
                 sizeof body - 1);
    cr_assert(memcmp(m.body.bytes, body, sizeof body - 1) == 0, "DLQ body differs from original");
    cr_assert(m.properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG);
    cr_assert(harness_bytes_eq(m.properties.content_type, amqp_cstring_bytes("application/json")));
    cr_assert(m.properties._flags & AMQP_BASIC_CORRELATION_ID_FLAG);
    cr_assert(harness_bytes_eq(m.properties.correlation_id, amqp_cstring_bytes("corr-a0")));
    cr_assert(m.properties._flags & AMQP_BASIC_APP_ID_FLAG);
    cr_assert(harness_bytes_eq(m.properties.app_id, amqp_cstring_bytes("payments-gateway")));
    cr_assert_eq(m.properties.delivery_mode, AMQP_DELIVERY_PERSISTENT);
    cr_assert(!(m.properties._flags & AMQP_BASIC_EXPIRATION_FLAG),
              "a dead letter must not carry an expiration");
    cr_assert(header_text(&m, "trace-id", text, sizeof text) && strcmp(text, "trace-7f3a") == 0,
              "custom header trace-id lost or changed: '%s'", text);
    int64_t value = 0;
    cr_assert(message_header_int(&m.properties, "tenant-shard", &value) && value == 17);

    cr_assert(message_header_int(&m.properties, HEADER_RETRIES, &value));
    cr_assert_eq(value, 3);
    cr_assert(header_text(&m, HEADER_ERROR_CLASS, text, sizeof text));
    cr_assert_str_eq(text, "retries_exhausted");
    cr_assert(header_text(&m, HEADER_ERROR, text, sizeof text));
    cr_assert_str_eq(text, last_error, "idemq-error should be the last error");
    cr_assert(strstr(text, "1213"), "%s", text);
    cr_assert(header_text(&m, HEADER_HANDLER, text, sizeof text));
    cr_assert_str_eq(text, "pay-callback");
    cr_assert(header_text(&m, HEADER_QUEUE, text, sizeof text));
    cr_assert_str_eq(text, H.queue);
    int64_t first_failed_at = 0;
    cr_assert(message_header_int(&m.properties, HEADER_FIRST_FAILED_AT, &first_failed_at));
    fprintf(stderr,
            "[measure] first-failed-at %" PRId64 ": %" PRId64 " ms after the publish, first "
            "failure logged at +%" PRId64 " ms, last at +%" PRId64 " ms\n",
            first_failed_at, first_failed_at - published_at, first_failure_logged - published_at,
            last_failure_logged - published_at);
    /* A ms timestamp of the first failure: not before the publish, not the last failure. */
    cr_assert(first_failed_at >= published_at - 5,
              "first-failed-at %" PRId64 " is before the publish (%" PRId64 ")", first_failed_at,
              published_at);
    cr_assert(first_failed_at <= first_failure_logged + 1000,
              "first-failed-at %" PRId64 " is not the first failure (logged at %" PRId64 ")",
              first_failed_at, first_failure_logged);
    cr_assert(first_failed_at < last_failure_logged - 100 - 200 - 400,
              "first-failed-at should be the first failure, not a later one");
    amqp_destroy_message(&m);
    cr_assert(!harness_get(&H, dlq, &m), "exactly one copy in the DLQ");
    json_decref(lines);
    json_decref(all);
}

/* ------------------------------------------------------------------------------ user_id */

/* A producer may stamp user_id (RabbitMQ checks it against the producer's own login). idemq,
 * logged in as itself, must not copy it onto the dead-letter copy (the broker would close its
 * channel) and keeps it in idemq-original-user-id instead. */
static bool dlq_has(harness *h, void *arg)
{
    return harness_queue_depth(h, arg) >= 1;
}

Test(retry, a_producers_user_id_moves_to_a_header_and_does_not_break_the_dead_letter_copy,
     .fini = teardown, .timeout = 90)
{
    setup("userid", NULL);
    snprintf(extra_user, sizeof extra_user, "producer_%d", (int)getpid());
    const char *user = extra_user;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rabbitmqctl add_user %s secret", user);
    harness_services_ok(cmd);
    snprintf(cmd, sizeof cmd, "rabbitmqctl set_permissions -p / %s '.*' '.*' '.*'", user);
    harness_services_ok(cmd);
    harness_declare_topology(&H);

    /* The producer logs in as itself and stamps user_id, as RabbitMQ allows. */
    char url[256];
    const char *base = getenv("IDEMQ_TEST_AMQP_URL");
    const char *host = strchr(base, '@');
    cr_assert(host);
    snprintf(url, sizeof url, "amqp://%s:secret%s", user, host);
    amqp_connection_state_t producer;
    char err[256];
    broker_open_options bo = {.url = url};
    cr_assert(broker_open(&bo, &producer, err, sizeof err) == 0, "%s", err);
    amqp_basic_properties_t props = {._flags =
                                         AMQP_BASIC_USER_ID_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG,
                                     .user_id = amqp_cstring_bytes(user),
                                     .content_type = amqp_cstring_bytes("application/json")};
    const char body[] = "{\"biz_key\":\"order_id:u1:REFUND_SUCCESS\",\"order_id\":\"u1\","
                        "\"event_type\":\"REFUND_SUCCESS\"}";
    amqp_bytes_t bytes = {.len = sizeof body - 1, .bytes = (void *)body};
    cr_assert(amqp_basic_publish(producer, BROKER_CHANNEL, amqp_empty_bytes,
                                 amqp_cstring_bytes(H.queue), 0, 0, &props,
                                 bytes) == AMQP_STATUS_OK);
    broker_close(producer);
    harness_insert_orders(&H, "u", 2, "PAID"); /* u1 PAID: REFUND_SUCCESS is illegal → DLQ */

    daemon_pid = harness_spawn(&H);
    char dlq[160];
    snprintf(dlq, sizeof dlq, "%s.dlq", H.queue);
    cr_assert(harness_wait_for(dlq_has, &H, dlq, 30000),
              "the dead-letter copy never arrived (log: %s)", H.log_path);
    cr_assert_eq(harness_stop(daemon_pid, SIGTERM, 25000), 0);
    daemon_pid = 0;
    cr_expect_eq(harness_log_count(&H, "RabbitMQ connection lost"), 0,
                 "copying the message broke the connection");
    amqp_message_t m;
    cr_assert(harness_get(&H, dlq, &m));
    cr_expect(!(m.properties._flags & AMQP_BASIC_USER_ID_FLAG));
    char original[64];
    cr_expect(header_text(&m, "idemq-original-user-id", original, sizeof original) &&
                  strcmp(original, user) == 0,
              "the producer's user_id is not kept in idemq-original-user-id");
    amqp_destroy_message(&m);
}

/* ------------------------------------------------------------------------------ non-retryable */

Test(retry, non_retryable_goes_straight_to_dlq, .fini = teardown, .timeout = 60)
{
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "100ms", .jitter = "50ms"};
    setup("retry_non_retryable", &o);
    harness_insert_orders(&H, "n", 1, "PAYING");
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);

    static const char malformed[] = "{\"biz_key\":\"order_id:bad:PAY_SUCCESS\",\"order_id\":";
    harness_publish(&H, NULL, "application/json", malformed, sizeof malformed - 1, NULL);
    /* REFUND_SUCCESS needs REFUNDING; the row is PAYING: an illegal transition. */
    harness_publish_event(&H, "n0", "REFUND_SUCCESS", 1);

    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 2, 15000));
    cr_assert(harness_wait_log(&H, "\"outcome\":\"dead_lettered\"", 2, 5000));
    harness_stop_idemq(&daemon_pid);

    cr_assert_eq(harness_log_count(&H, "\"outcome\":\"retried\""), 0, "nothing may be retried");
    json_t *all = harness_log_load(&H);
    json_t *lines = outcome_lines(all, NULL);
    cr_assert_eq(json_array_size(lines), 2);
    cr_assert_eq(count_outcome(lines, "dead_lettered"), 2);
    size_t i;
    json_t *line;
    json_array_foreach(lines, i, line)
        cr_assert_eq(jint(line, "retries"), 0);
    json_decref(lines);
    json_decref(all);

    cr_assert_eq(harness_queue_depth_of(&H, ".retry.1") + harness_queue_depth_of(&H, ".retry.2") +
                     harness_queue_depth_of(&H, ".retry.3"),
                 0);
    cr_assert_eq(harness_queue_depth_of(&H, ""), 0);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM msg_dedup"), 0);
    cr_assert_eq(harness_scalar(&H, "SELECT COUNT(*) FROM orders WHERE status = 'PAYING'"), 1);

    char dlq[200], text[1200];
    queue_name(dlq, sizeof dlq, ".dlq");
    bool saw_malformed = false, saw_illegal = false;
    for (int n = 0; n < 2; n++) {
        amqp_message_t m;
        cr_assert(harness_get(&H, dlq, &m));
        int64_t retries = -1;
        cr_assert(message_header_int(&m.properties, HEADER_RETRIES, &retries));
        cr_assert_eq(retries, 0);
        cr_assert(header_text(&m, HEADER_ERROR_CLASS, text, sizeof text));
        cr_assert_str_eq(text, "non_retryable");
        cr_assert(header_text(&m, HEADER_ERROR, text, sizeof text));
        if (m.body.len == sizeof malformed - 1 &&
            memcmp(m.body.bytes, malformed, sizeof malformed - 1) == 0) {
            saw_malformed = true;
            cr_assert(strstr(text, "invalid envelope"), "%s", text);
        } else {
            saw_illegal = true;
            cr_assert(strstr(text, "illegal transition"), "%s", text);
            cr_assert(strstr(text, "PAYING"), "%s", text);
        }
        amqp_destroy_message(&m);
    }
    cr_assert(saw_malformed && saw_illegal);
}

/* A dead-letter copy the broker returns as unroutable (its DLQ deleted under a running idemq)
 * fails its own publish's confirm, matched by the publish-sequence header (broker/confirms.h):
 * the original is requeued, never acked, and no return is taken for a stranger's. */
Test(retry, an_unroutable_dead_letter_copy_keeps_its_original, .fini = teardown, .timeout = 60)
{
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "100ms", .jitter = "50ms"};
    setup("retry_unroutable_copy", &o);
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    amqp_queue_delete(H.amqp, 1, amqp_cstring_bytes(dlq), 0, 0);
    cr_assert_eq(amqp_get_rpc_reply(H.amqp).reply_type, AMQP_RESPONSE_NORMAL);

    static const char malformed[] = "{\"biz_key\":\"order_id:bad:PAY_SUCCESS\",\"order_id\":";
    harness_publish(&H, NULL, "application/json", malformed, sizeof malformed - 1, NULL);

    cr_assert(harness_wait_log(&H, "returned a retry/DLQ copy as unroutable", 2, 15000));
    cr_assert(harness_wait_log(&H, "the broker did not confirm the dead-letter copy", 2, 5000));
    harness_stop_idemq(&daemon_pid);

    cr_assert_eq(harness_log_count(&H, "\"outcome\":\"dead_lettered\""), 0,
                 "a returned copy is not a dead letter");
    cr_assert_eq(harness_log_count(&H, "did not publish"), 0,
                 "every return named its own publish");
    cr_assert(harness_wait_queue_depth(&H, H.queue, 1, 5000),
              "the original is back in the work queue");
}

/* ------------------------------------------------------------------------------ head of line */

Test(retry, level_three_copy_behind_largest_jitter_is_back_within_bound, .fini = teardown,
     .timeout = 60)
{
    /* Level 3: base 200 ms * 4 = 800 ms, jitter 100 ms: queue TTL 900 ms. */
    const int64_t own_delay = 800, jitter = 100;
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "200ms", .jitter = "100ms"};
    setup("retry_head_of_line", &o);
    char *out = NULL;
    int rc = harness_run_cli_command(&H, "topology", &out);
    cr_assert_eq(rc, 0, "idemq topology failed: %s", out);
    free(out);

    /* idemq is not running: what happens is the broker-side topology idemq declared. */
    char exchange[200], level3[200];
    queue_name(exchange, sizeof exchange, ".retry");
    queue_name(level3, sizeof level3, ".retry.3");
    /* Ahead: copies with the largest jitter (900 ms), and copies whose own expiration is absent
     * or far too long: the queue's fixed x-message-ttl must cap them at 900 ms. */
    const char *ahead[] = {"900", "900", "900", NULL, "60000", "900", "900", NULL};
    const size_t ahead_count = sizeof ahead / sizeof ahead[0];
    char body[256];
    amqp_basic_properties_t props;
    for (size_t i = 0; i <= ahead_count; i++) {
        bool is_last = i == ahead_count;
        memset(&props, 0, sizeof props);
        props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
        props.content_type = amqp_cstring_bytes("application/json");
        props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
        const char *expiration = is_last ? "800" : ahead[i];
        if (expiration) {
            props._flags |= AMQP_BASIC_EXPIRATION_FLAG;
            props.expiration = amqp_cstring_bytes(expiration);
        }
        char id[32];
        snprintf(id, sizeof id, is_last ? "last" : "ahead%zu", i);
        event_body(body, sizeof body, id, "PAY_SUCCESS");
        harness_publish_props(&H, exchange, level3, &props, body, strlen(body));
    }
    int64_t last_published = harness_now_ms();

    size_t got_ahead = 0;
    int64_t last_back = -1;
    int64_t deadline = last_published + own_delay + jitter + 1000 + 3000;
    while (harness_now_ms() < deadline && last_back < 0) {
        amqp_message_t m;
        if (harness_get(&H, H.queue, &m)) {
            if (body_contains(&m, "order_id:last:"))
                last_back = harness_now_ms() - last_published;
            else
                got_ahead++;
            amqp_destroy_message(&m);
            continue;
        }
        struct timespec pause = {.tv_nsec = 5 * 1000000};
        nanosleep(&pause, NULL);
    }
    fprintf(stderr,
            "[measure] head-of-line: level-3 copy with %" PRId64 " ms delay behind %zu copies "
            "(largest jitter / capped) back on Q after %" PRId64 " ms (bound %" PRId64 ")\n",
            own_delay, ahead_count, last_back, own_delay + jitter + 1000);
    cr_assert(last_back >= 0, "the level-3 copy never came back to %s", H.queue);
    cr_assert(last_back >= own_delay - 5, "came back after %" PRId64 " ms, before its delay",
              last_back);
    cr_assert(last_back <= own_delay + jitter + 1000,
              "came back after %" PRId64 " ms; the bound is delay + jitter + 1 s = %" PRId64 " ms",
              last_back, own_delay + jitter + 1000);
    cr_assert_eq(got_ahead, ahead_count, "all copies ahead came back first (%zu of %zu)",
                 got_ahead, ahead_count);
    cr_assert_eq(harness_queue_depth(&H, level3), 0);
}

/* ------------------------------------------------------------------------------ kill -9 */

#define KILL_ORDERS 20

Test(retry, kill_9_with_messages_in_the_ladder_keeps_retry_counts, .fini = teardown,
     .timeout = 90)
{
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "300ms", .jitter = "100ms"};
    setup("retry_kill9", &o);
    one_transaction_per_message();
    install_failure_injection(&H);
    harness_insert_orders(&H, "k", KILL_ORDERS, "PAYING");
    harness_sql(&H, "INSERT INTO fail_budget SELECT order_id, 2 FROM orders");
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    for (int i = 0; i < KILL_ORDERS; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        harness_publish_event(&H, id, "PAY_SUCCESS", 100 + i);
    }
    /* Kill once a few messages failed for the second time: they sit in Q.retry.2 (600..700
     * ms), the slower ones in Q.retry.1. */
    cr_assert(harness_wait_log(&H, "\"retries\":1,\"outcome\":\"retried\"", 5, 15000));
    cr_assert_eq(harness_stop(daemon_pid, SIGKILL, 5000), 128 + SIGKILL);
    daemon_pid = 0;
    long in_ladder =
        harness_queue_depth_of(&H, ".retry.1") + harness_queue_depth_of(&H, ".retry.2");
    fprintf(stderr, "[measure] kill -9: %ld message(s) in Q.retry.1/2 right after the kill\n",
            in_ladder);
    cr_assert(in_ladder > 0, "the kill should find messages in the ladder");

    /* Which keys were in flight through the ladder (last outcome before the kill: retried). */
    json_t *before = harness_log_load(&H);
    size_t lines_before = json_array_size(before);
    char laddered[KILL_ORDERS][64];
    size_t laddered_count = 0;
    for (int i = 0; i < KILL_ORDERS; i++) {
        char key[64];
        snprintf(key, sizeof key, "order_id:k%d:PAY_SUCCESS", i);
        json_t *lines = outcome_lines(before, key);
        size_t n = json_array_size(lines);
        if (n > 0 &&
            strcmp(harness_json_str(json_array_get(lines, n - 1), "outcome"), "retried") == 0)
            snprintf(laddered[laddered_count++], sizeof laddered[0], "%s", key);
        json_decref(lines);
    }
    json_decref(before);
    cr_assert(laddered_count > 0);

    /* With idemq gone, the ladder still returns everything to the work queue. */
    cr_assert(harness_wait_queue_depth_of(&H, ".retry.1", 0, 10000));
    cr_assert(harness_wait_queue_depth_of(&H, ".retry.2", 0, 10000));

    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    cr_assert(harness_wait_scalar(&H, KILL_ORDERS, 20000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_scalar(&H, KILL_ORDERS, 5000,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'PAID'"));
    cr_assert(harness_wait_log(&H, "\"outcome\":\"processed\"", KILL_ORDERS, 5000));
    /* A chain forked by the kill (see below) may still have a copy on its way: let it land. */
    cr_assert(harness_wait_queue_depth_of(&H, ".retry.1", 0, 5000) &&
              harness_wait_queue_depth_of(&H, ".retry.2", 0, 5000) &&
              harness_wait_queue_depth_of(&H, ".retry.3", 0, 5000) &&
              harness_wait_queue_depth_of(&H, "", 0, 5000));
    harness_stop_idemq(&daemon_pid);

    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 0);
    cr_assert_eq(harness_queue_depth_of(&H, ""), 0);
    cr_assert_eq(harness_queue_depth_of(&H, ".retry.1") + harness_queue_depth_of(&H, ".retry.2") +
                     harness_queue_depth_of(&H, ".retry.3"),
                 0);

    json_t *all = harness_log_load(&H);
    size_t recovered_after_restart = 0, disturbed = 0;
    for (int i = 0; i < KILL_ORDERS; i++) {
        char key[64], id[16];
        snprintf(key, sizeof key, "order_id:k%d:PAY_SUCCESS", i);
        snprintf(id, sizeof id, "k%d", i);
        /* Two failures and one success, whatever the kill did: the budget is in the database
         * and a deduplicated delivery never reaches the UPDATE. */
        long long attempts =
            harness_scalar(&H, "SELECT COUNT(*) FROM attempts WHERE order_id = '%s'", id);
        cr_assert_eq(attempts, 3, "%s: %lld attempts; expected two failures and one success",
                     key, attempts);
        json_t *lines = outcome_lines(all, key);
        long processed = count_outcome(lines, "processed");
        long deduped = count_outcome(lines, "deduped");
        long reached_update = count_outcome(lines, "retried") + processed;
        cr_assert(processed <= 1, "%s processed %ld times", key, processed);
        cr_assert(processed + deduped >= 1, "%s never finished", key);
        /* The kill can disturb a chain in two legitimate ways. A fork: idemq logs a retry
         * before publishing the copy; killed between the copy's confirm and the original's
         * ack, the original comes back with the same retries value (logged twice) and the
         * dedup row settles whichever copy comes second. A lost attempt: killed while the
         * transaction ran, its outcome is never logged, but the injected failure already
         * spent the (non-transactional) budget, so the redelivery, carrying the same header,
         * gets further with a lower count. */
        int seen[4] = {0};
        bool fork = false;
        size_t j;
        json_t *line;
        json_array_foreach(lines, j, line) {
            long long retries = jint(line, "retries");
            cr_assert(retries >= 0 && retries <= 2,
                      "%s logged retries %lld: more than its 2 failures allow", key, retries);
            if (seen[retries]++)
                fork = true;
            if (strcmp(harness_json_str(line, "outcome"), "processed") == 0 &&
                (size_t)jint(line, "_line") >= lines_before && retries == 2)
                for (size_t k = 0; k < laddered_count; k++)
                    if (strcmp(laddered[k], key) == 0)
                        recovered_after_restart++;
        }
        bool lost_attempt = attempts > reached_update || processed == 0;
        if (fork || lost_attempt) {
            disturbed++;
        } else {
            /* Undisturbed: 0 retried, 1 retried, 2 processed, across the restart. */
            cr_assert_eq(json_array_size(lines), 3, "%s: %zu outcome lines", key,
                         json_array_size(lines));
            for (int n = 0; n < 3; n++) {
                json_t *l = json_array_get(lines, (size_t)n);
                cr_assert_eq(jint(l, "retries"), n, "%s: line %d has retries %lld", key, n,
                             jint(l, "retries"));
                cr_assert_str_eq(harness_json_str(l, "outcome"), n < 2 ? "retried" : "processed",
                                 "%s", key);
            }
        }
        json_decref(lines);
    }
    json_decref(all);
    fprintf(stderr,
            "[measure] kill -9: %zu key(s) in the ladder at kill time, %zu of them processed "
            "after restart with \"retries\":2; %zu chain(s) disturbed by the kill (fork or lost "
            "attempt)\n",
            laddered_count, recovered_after_restart, disturbed);
    cr_assert(disturbed < KILL_ORDERS, "every chain was disturbed: nothing checked exactly");
    cr_assert(recovered_after_restart > 0,
              "after the restart some messages from the ladder must finish with retries 2 "
              "(the count travels in the header)");
}

/* ------------------------------------------------------------------------------ topic */

Test(retry, retries_reach_only_the_consumer_queue_not_topic_siblings, .fini = teardown,
     .timeout = 60)
{
    harness_options o = {.retry_set = true, .max_retries = 2, .base = "100ms", .jitter = "50ms"};
    setup("retry_topic", &o);
    queue_name(extra_exchange, sizeof extra_exchange, ".topic");
    queue_name(extra_queue, sizeof extra_queue, ".other");
    amqp_exchange_declare(H.amqp, 1, amqp_cstring_bytes(extra_exchange),
                          amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
    cr_assert_eq(amqp_get_rpc_reply(H.amqp).reply_type, AMQP_RESPONSE_NORMAL);
    const char *queues[] = {H.queue, extra_queue};
    for (int i = 0; i < 2; i++) {
        amqp_queue_declare(H.amqp, 1, amqp_cstring_bytes(queues[i]), 0, 1, 0, 0,
                           amqp_empty_table);
        cr_assert_eq(amqp_get_rpc_reply(H.amqp).reply_type, AMQP_RESPONSE_NORMAL);
        amqp_queue_bind(H.amqp, 1, amqp_cstring_bytes(queues[i]),
                        amqp_cstring_bytes(extra_exchange), amqp_cstring_bytes("orders.#"),
                        amqp_empty_table);
        cr_assert_eq(amqp_get_rpc_reply(H.amqp).reply_type, AMQP_RESPONSE_NORMAL);
    }
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);

    /* No row for t0: the state machine says retryable every time. */
    char body[256];
    event_body(body, sizeof body, "t0", "PAY_SUCCESS");
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    harness_publish_props(&H, extra_exchange, "orders.eu.paid", &props, body, strlen(body));

    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 1, 15000));
    cr_assert(harness_wait_log(&H, "\"outcome\":\"dead_lettered\"", 1, 5000));
    harness_stop_idemq(&daemon_pid);

    /* Q saw the original and both retries... */
    json_t *all = harness_log_load(&H);
    json_t *lines = outcome_lines(all, "order_id:t0:PAY_SUCCESS");
    cr_assert_eq(json_array_size(lines), 3);
    for (int n = 0; n < 3; n++)
        cr_assert_eq(jint(json_array_get(lines, (size_t)n), "retries"), n);
    cr_assert(strstr(harness_json_str(json_array_get(lines, 0), "msg"), "not found"), "%s",
              harness_json_str(json_array_get(lines, 0), "msg"));
    json_decref(lines);
    json_decref(all);

    /* ...while the sibling queue got the original publish only. */
    cr_assert_eq(harness_queue_depth(&H, extra_queue), 1,
                 "%s holds %ld messages, expected only the original", extra_queue,
                 harness_queue_depth(&H, extra_queue));
    amqp_message_t m;
    cr_assert(harness_get(&H, extra_queue, &m));
    int64_t retries;
    cr_assert(!message_header_int(&m.properties, HEADER_RETRIES, &retries),
              "the sibling queue received a retry copy");
    cr_assert_eq(m.body.len, strlen(body));
    amqp_destroy_message(&m);
}

/* ------------------------------------------------------------------------------ topology */

Test(retry, redeclaring_with_another_ttl_is_a_clear_406, .fini = teardown, .timeout = 60)
{
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "100ms", .jitter = "50ms"};
    setup("retry_redeclare", &o);
    int rc;
    char *out;

    /* --dry-run prints the plan without connecting: an unreachable broker does not matter. */
    setenv("IDEMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f", 1);
    const char *dry[] = {"topology", "--dry-run", "-c", H.config_path, NULL};
    rc = harness_run_cli(&H, &out, dry);
    unsetenv("IDEMQ_AMQP_URL");
    cr_assert_eq(rc, 0, "topology --dry-run exited %d: %s", rc, out);
    char expect[300];
    const int ttl[] = {150, 250, 450};
    for (int level = 1; level <= 3; level++) {
        snprintf(expect, sizeof expect, "%s.retry.%d", H.queue, level);
        cr_assert(strstr(out, expect), "plan lacks %s:\n%s", expect, out);
        snprintf(expect, sizeof expect, "x-message-ttl=%d", ttl[level - 1]);
        cr_assert(strstr(out, expect), "plan lacks %s:\n%s", expect, out);
    }
    snprintf(expect, sizeof expect, "%s.dlq", H.queue);
    cr_assert(strstr(out, expect), "plan lacks %s:\n%s", expect, out);
    snprintf(expect, sizeof expect, "%s.dlx", H.queue);
    cr_assert(strstr(out, expect), "plan lacks %s:\n%s", expect, out);
    free(out);
    cr_assert_eq(harness_queue_depth_of(&H, ""), -1, "--dry-run must not declare anything");

    const char *declare[] = {"topology", "-c", H.config_path, NULL};
    rc = harness_run_cli(&H, &out, declare);
    cr_assert_eq(rc, 0, "first declare failed: %s", out);
    free(out);
    cr_assert_eq(harness_queue_depth_of(&H, ".retry.1"), 0);

    /* Same names, another base delay: Q.retry.1's x-message-ttl differs. */
    o.base = "120ms";
    harness_write_config(&H, &o);
    rc = harness_run_cli(&H, &out, declare);
    fprintf(stderr, "[measure] idemq topology on a changed TTL said:\n%s", out);
    cr_assert_eq(rc, 2, "topology on a TTL mismatch should exit 2, got %d: %s", rc, out);
    snprintf(expect, sizeof expect, "%s.retry.1", H.queue);
    cr_assert(strstr(out, expect), "the message should name the queue %s:\n%s", expect, out);
    cr_assert(strstr(out, "x-message-ttl"), "the message should name the argument:\n%s", out);
    cr_assert(strstr(out, "policy") || strstr(out, "delete"),
              "the message should say how to fix it:\n%s", out);
    free(out);

    /* `idemq run` refuses the same way. */
    long before = harness_log_count(&H, "x-message-ttl");
    daemon_pid = harness_spawn(&H);
    rc = harness_stop(daemon_pid, 0, 15000); /* signal 0: only wait for it to exit */
    daemon_pid = 0;
    cr_assert_eq(rc, 2, "idemq run on a TTL mismatch should exit 2, got %d", rc);
    cr_assert(harness_log_count(&H, "x-message-ttl") > before);
    snprintf(expect, sizeof expect, "%s.retry.1", H.queue);
    cr_assert(harness_log_count(&H, expect) > 0);
}

/* ------------------------------------------------------------------------------ DLQ tools */

static bool key_in_listing(json_t *doc, const char *key, json_t **found)
{
    size_t i;
    json_t *msg;
    json_array_foreach(json_object_get(doc, "messages"), i, msg) {
        if (strcmp(harness_json_str(msg, "biz_key"), key) == 0) {
            if (found)
                *found = msg;
            return true;
        }
    }
    return false;
}

Test(retry, dlq_list_keeps_replay_applies_once_and_purge_needs_yes, .fini = teardown, .timeout = 60)
{
    harness_options o = {.retry_set = true, .max_retries = 3, .base = "100ms", .jitter = "50ms"};
    setup("retry_dlq_tools", &o);
    harness_insert_orders(&H, "d", 3, "PAYING");
    harness_start_idemq(&H, "started consuming", 15000, &daemon_pid);
    /* REFUND_START needs PAID: three illegal transitions. */
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "d%d", i);
        harness_publish_event(&H, id, "REFUND_START", 0);
    }
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 3, 15000));
    int rc;
    char *out;

    /* list: key and reason, nothing removed. */
    const char *list[] = {"dlq", "list", "-c", H.config_path, NULL};
    rc = harness_run_cli(&H, &out, list);
    cr_assert_eq(rc, 0, "dlq list: %s", out);
    cr_assert(strstr(out, "order_id:d0:REFUND_START"), "%s", out);
    cr_assert(strstr(out, "non_retryable"), "%s", out);
    cr_assert(strstr(out, "illegal transition"), "%s", out);
    free(out);
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 3, 5000),
              "dlq list must not remove anything");

    const char *list_json[] = {"dlq", "list", "-c", H.config_path, "--json", NULL};
    rc = harness_run_cli(&H, &out, list_json);
    cr_assert_eq(rc, 0, "dlq list --json: %s", out);
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    cr_assert(doc, "dlq list --json is not JSON (%s): %s", jerr.text, out);
    free(out);
    char dlq[200];
    queue_name(dlq, sizeof dlq, ".dlq");
    cr_assert_str_eq(harness_json_str(doc, "queue"), dlq);
    cr_assert_eq(json_array_size(json_object_get(doc, "messages")), 3);
    json_t *entry = NULL;
    cr_assert(key_in_listing(doc, "order_id:d1:REFUND_START", &entry));
    cr_assert_str_eq(harness_json_str(entry, "error_class"), "non_retryable");
    cr_assert(strstr(harness_json_str(entry, "error"), "illegal transition"));
    cr_assert_eq(jint(entry, "retries"), 0);
    cr_assert(json_is_string(json_object_get(entry, "first_failed_at")) &&
              strcmp(harness_json_str(entry, "first_failed_at"), "-") != 0);
    cr_assert(json_is_integer(json_object_get(entry, "age_seconds")));
    json_decref(doc);
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 3, 5000),
              "dlq list --json must not remove anything");

    /* Fix d0's cause, replay only d0: applied once, leaves the DLQ, the others stay. */
    harness_sql(&H, "UPDATE orders SET status = 'PAID' WHERE order_id = 'd0'");
    const char *replay_one[] = {"dlq", "replay", "-c", H.config_path, "--biz-key",
                                "order_id:d0:REFUND_START", NULL};
    rc = harness_run_cli(&H, &out, replay_one);
    cr_assert_eq(rc, 0, "dlq replay --biz-key: %s", out);
    free(out);
    cr_assert(harness_wait_scalar(&H, 1, 10000,
                                  "SELECT COUNT(*) FROM orders WHERE order_id = 'd0' AND "
                                  "status = 'REFUNDING'"));
    cr_assert(harness_wait_scalar(&H, 1, 5000, "SELECT COUNT(*) FROM msg_dedup WHERE "
                                               "biz_key = 'order_id:d0:REFUND_START'"));
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 2, 5000),
              "the replayed message must leave the DLQ");
    cr_assert(harness_wait_log(&H, "\"biz_key\":\"order_id:d0:REFUND_START\"", 2, 5000));
    cr_assert_eq(harness_log_count(&H, "\"biz_key\":\"order_id:d0:REFUND_START\",\"message_id\":"
                                       "\"m-d0-REFUND_START\",\"retries\":0,\"outcome\":"
                                       "\"processed\""),
                 1, "the replay starts again at retries 0 and is processed once");

    /* Fix the others, replay --all. */
    harness_sql(&H, "UPDATE orders SET status = 'PAID' WHERE order_id IN ('d1', 'd2')");
    const char *replay_all[] = {"dlq", "replay", "-c", H.config_path, "--all", NULL};
    rc = harness_run_cli(&H, &out, replay_all);
    cr_assert_eq(rc, 0, "dlq replay --all: %s", out);
    free(out);
    cr_assert(harness_wait_scalar(&H, 3, 10000,
                                  "SELECT COUNT(*) FROM orders WHERE status = 'REFUNDING'"));
    cr_assert(harness_wait_scalar(&H, 3, 5000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 0, 5000));

    /* purge: refuses without --yes, empties with it. */
    static const char junk[] = "not json at all";
    harness_publish(&H, NULL, "application/json", junk, sizeof junk - 1, NULL);
    harness_publish(&H, NULL, "application/json", junk, sizeof junk - 1, NULL);
    cr_assert(harness_wait_queue_depth_of(&H, ".dlq", 2, 10000));
    harness_stop_idemq(&daemon_pid);
    const char *purge_no[] = {"dlq", "purge", "-c", H.config_path, NULL};
    rc = harness_run_cli(&H, &out, purge_no);
    cr_assert_eq(rc, 2, "dlq purge without --yes should exit 2, got %d: %s", rc, out);
    free(out);
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 2,
                 "purge without --yes must not delete anything");
    const char *purge_yes[] = {"dlq", "purge", "-c", H.config_path, "--yes", NULL};
    rc = harness_run_cli(&H, &out, purge_yes);
    cr_assert_eq(rc, 0, "dlq purge --yes: %s", out);
    free(out);
    cr_assert_eq(harness_queue_depth_of(&H, ".dlq"), 0);
}
