/*
 * harness — see harness.h, whose sections this file follows. Test-only code, on the test's own
 * thread: failures abort the test through cr_assert.
 */
/* nftw needs the X/Open extensions. */
#define _XOPEN_SOURCE 700
#include "harness.h"

#include "broker/amqp_api.h"
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker/connection.h"
#include "freeze_proxy.h"
#include "db/dsn.h"
#include "store/schema.h"
#include "store/store.h"

/* ---------------------------------------------------------------------------------- connections */

static const char *required_env(const char *name)
{
    const char *value = getenv(name);
    cr_assert(value && *value, "%s is not set: run the integration tests through scripts/test "
                               "(it starts RabbitMQ and MariaDB and exports the URLs)", name);
    return value;
}

/* The harness's own pace between two looks at a condition (never a wait for an event). */
static void pause_ms(int ms)
{
    struct timespec pause = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&pause, NULL);
}

/* Connects to database (NULL: none) with IDEMQ_TEST_MYSQL_URL's server and login;
 * connect_timeout_s 0 keeps the client's default. Returns the connection (owned), or NULL with
 * the reason in err. */
static MYSQL *try_connect_database(const char *database, unsigned int connect_timeout_s,
                                   char *err, size_t err_len)
{
    db_dsn dsn;
    cr_assert(db_dsn_parse(required_env("IDEMQ_TEST_MYSQL_URL"), &dsn, err, err_len) == 0,
              "%s", err);
    MYSQL *db = mysql_init(NULL);
    cr_assert(db);
    if (connect_timeout_s)
        mysql_options(db, MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout_s);
    const char *host = dsn.socket[0] ? "localhost" : dsn.host;
    if (mysql_real_connect(db, host, dsn.user, dsn.password, database, dsn.port,
                           dsn.socket[0] ? dsn.socket : NULL, 0))
        return db;
    snprintf(err, err_len, "%s", mysql_error(db));
    mysql_close(db);
    return NULL;
}

static MYSQL *connect_database(const char *database)
{
    char err[256];
    MYSQL *db = try_connect_database(database, 0, err, sizeof err);
    cr_assert(db, "cannot connect to MariaDB: %s", err);
    return db;
}

/* After a channel error: reopens the channel in confirm mode, so publishes keep confirming (a
 * reopened channel numbers its publishes from 1 again). Returns whether confirm.select worked. */
static bool reopen_channel(harness *h)
{
    broker_reopen_channel(h->amqp);
    amqp_confirm_select(h->amqp, BROKER_CHANNEL);
    h->publish_seq = 0;
    return amqp_get_rpc_reply(h->amqp).reply_type == AMQP_RESPONSE_NORMAL;
}

/* -------------------------------------------------------------------------------------- fixture */

static void mysql_url_for(const harness *h, char *buf, size_t len)
{
    const char *base = required_env("IDEMQ_TEST_MYSQL_URL");
    const char *query = strchr(base, '?');
    const char *path = strchr(base + strlen("mysql://"), '/');
    cr_assert(path, "IDEMQ_TEST_MYSQL_URL has no database part");
    snprintf(buf, len, "%.*s/%s%s", (int)(path - base), base, h->database, query ? query : "");
}

void harness_write_config(harness *h, const harness_options *o)
{
    static const harness_options defaults = {0};
    if (!o)
        o = &defaults;
    char mysql_url[512];
    mysql_url_for(h, mysql_url, sizeof mysql_url);
    FILE *f = fopen(h->config_path, "w");
    cr_assert(f, "cannot write %s", h->config_path);
    fprintf(f,
            "amqp: {url: \"%s\", prefetch: %u, heartbeat: 10s}\n"
            "mysql: {url: \"%s\", workers: %u}\n"
            "log: {level: info}\n"
            "http: {listen: \"127.0.0.1:0\"}\n"
            "shutdown_timeout: %s\n"
            "consumers:\n"
            "  - queue: %s\n"
            "    handler_name: pay-callback\n"
            "    declare: %s\n"
            "    queue_type: %s\n"
            "    retry: {max_retries: %u, base: %s, jitter: %s, max_delay: %s}\n"
            "    handler:\n",
            required_env("IDEMQ_TEST_AMQP_URL"), o->prefetch ? o->prefetch : 64, mysql_url,
            o->workers ? o->workers : 4, o->shutdown_timeout ? o->shutdown_timeout : "25s",
            h->queue, o->declare ? o->declare : "create",
            o->queue_type ? o->queue_type : "quorum", o->retry_set ? o->max_retries : 3,
            o->base ? o->base : "100ms", o->jitter ? o->jitter : "50ms",
            o->max_delay ? o->max_delay : "1h");
    if (o->handler_yaml)
        fputs(o->handler_yaml, f);
    else
        fprintf(f,
                "      type: state_machine\n"
                "      table: orders\n"
                "      key_column: order_id\n"
                "      key_field: order_id\n"
                "      state_column: status\n"
                "      event_field: event_type\n"
                "      on_illegal: %s\n"
                "      transitions:\n"
                "        PAY_SUCCESS:    {from: [PAYING], to: PAID}\n"
                "        REFUND_START:   {from: [PAID], to: REFUNDING}\n"
                "        REFUND_SUCCESS: {from: [REFUNDING], to: REFUNDED}\n"
                "      set: {amount: amount}\n",
                o->on_illegal ? o->on_illegal : "dead_letter");
    fputs(o->extra_consumer_yaml ? o->extra_consumer_yaml : "", f);
    fputs(o->top_yaml ? o->top_yaml : "", f);
    fclose(f);
}

bool harness_bytes_eq(amqp_bytes_t a, amqp_bytes_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.bytes, b.bytes, a.len) == 0);
}

void harness_init(harness *h, const char *test_name, const harness_options *opts)
{
    memset(h, 0, sizeof *h);
    size_t n = 0;
    for (const char *p = test_name; *p && n < 40; p++)
        h->name[n++] = isalnum((unsigned char)*p) ? (char)tolower((unsigned char)*p) : '_';
    snprintf(h->queue, sizeof h->queue, "t.%s.%d", h->name, (int)getpid());
    snprintf(h->database, sizeof h->database, "idemq_t_%s_%d", h->name, (int)getpid());
    snprintf(h->dir, sizeof h->dir, "/tmp/idemq-test-XXXXXX");
    cr_assert(mkdtemp(h->dir), "mkdtemp: %s", strerror(errno));
    snprintf(h->config_path, sizeof h->config_path, "%s/idemq.yaml", h->dir);
    snprintf(h->log_path, sizeof h->log_path, "%s/idemq.log", h->dir);

    mysql_library_init(0, NULL, NULL);
    MYSQL *admin = connect_database(NULL);
    char sql[512];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS `%s`", h->database);
    cr_assert(mysql_query(admin, sql) == 0, "%s", mysql_error(admin));
    snprintf(sql, sizeof sql, "CREATE DATABASE `%s` CHARACTER SET utf8mb4", h->database);
    cr_assert(mysql_query(admin, sql) == 0, "%s", mysql_error(admin));
    mysql_close(admin);
    h->db = connect_database(h->database);
    harness_sql(h, "%s", store_dedup_ddl);
    harness_sql(h, "%s", store_outbox_ddl);
    harness_sql(h, "%s", store_outbox_lease_ddl);
    harness_sql(h, "CREATE TABLE orders (order_id VARCHAR(64) PRIMARY KEY, "
                   "status VARCHAR(32) NOT NULL, amount BIGINT NULL) ENGINE=InnoDB");

    char err[512];
    broker_open_options bo = {.url = required_env("IDEMQ_TEST_AMQP_URL"), .confirms = 1};
    cr_assert(broker_open(&bo, &h->amqp, err, sizeof err) == 0, "RabbitMQ: %s", err);
    harness_write_config(h, opts);
}

static void delete_queue(harness *h, const char *queue)
{
    amqp_queue_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(queue), 0, 0);
    if (amqp_get_rpc_reply(h->amqp).reply_type != AMQP_RESPONSE_NORMAL)
        reopen_channel(h);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

void harness_delete_topology(harness *h, const char *queue)
{
    char name[300];
    if (!h->amqp)
        return;
    delete_queue(h, queue);
    for (int level = 1; level <= 32; level++) {
        snprintf(name, sizeof name, "%s.retry.%d", queue, level);
        delete_queue(h, name);
    }
    snprintf(name, sizeof name, "%s.dlq", queue);
    delete_queue(h, name);
    const char *suffixes[] = {".retry", ".dlx"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s", queue, suffixes[i]);
        amqp_exchange_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0);
        if (amqp_get_rpc_reply(h->amqp).reply_type != AMQP_RESPONSE_NORMAL)
            reopen_channel(h);
    }
}

void harness_fini(harness *h)
{
    if (h->amqp) {
        harness_delete_topology(h, h->queue);
        broker_close(h->amqp);
        h->amqp = NULL;
    }
    if (h->db) {
        char sql[256];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS `%s`", h->database);
        mysql_query(h->db, sql);
        mysql_close(h->db);
        h->db = NULL;
    }
    mysql_library_end();
    /* A failed cr_assert never gets here and keeps its files; IDEMQ_TEST_KEEP keeps them all
     * (a failed cr_expect does get here). */
    if (h->dir[0] && !getenv("IDEMQ_TEST_KEEP"))
        nftw(h->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

void harness_fixture_init(harness_fixture *f, const char *test_name, const harness_options *opts)
{
    harness_init(&f->h, test_name, opts);
    f->ready = true;
}

void harness_fixture_start(harness_fixture *f, const char *ready_line, int timeout_ms)
{
    harness_start_declared(&f->h, ready_line, timeout_ms, &f->daemon);
}

void harness_fixture_fini(harness_fixture *f)
{
    harness_kill_idemq(&f->daemon);
    if (f->ready)
        harness_fini(&f->h);
    f->ready = false;
}

/* -------------------------------------------------------------------------------------- waiting */

int64_t harness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool harness_wait_for(bool (*cond)(harness *h, void *arg), harness *h, void *arg, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        if (cond(h, arg))
            return true;
        if (harness_now_ms() >= deadline)
            return false;
        pause_ms(20);
    }
}

typedef struct scalar_wait {
    const char *sql;
    long long expected;
    bool at_least; /* expected is a minimum, not the value */
    long long last;
} scalar_wait;

static bool scalar_reached(harness *h, void *arg)
{
    scalar_wait *w = arg;
    w->last = harness_scalar(h, "%s", w->sql);
    return w->at_least ? w->last >= w->expected : w->last == w->expected;
}

bool harness_wait_scalar(harness *h, long long expected, int timeout_ms, const char *sql)
{
    scalar_wait w = {.sql = sql, .expected = expected};
    bool ok = harness_wait_for(scalar_reached, h, &w, timeout_ms);
    if (!ok)
        cr_log_error("waited %d ms for `%s` = %lld; last value %lld", timeout_ms, sql, expected,
                     w.last);
    return ok;
}

long long harness_wait_scalar_at_least(harness *h, long long min, int timeout_ms, const char *sql)
{
    scalar_wait w = {.sql = sql, .expected = min, .at_least = true};
    if (!harness_wait_for(scalar_reached, h, &w, timeout_ms))
        cr_log_error("waited %d ms for `%s` >= %lld; last value %lld", timeout_ms, sql, min,
                     w.last);
    return w.last;
}

/* ---------------------------------------------------------------------------- the test database */

static void vsql(harness *h, const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int len = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    char *sql = malloc((size_t)len + 1);
    cr_assert(sql);
    vsnprintf(sql, (size_t)len + 1, fmt, ap);
    int rc = mysql_query(h->db, sql);
    if (rc != 0)
        cr_log_error("SQL failed: %s\n  %.300s", mysql_error(h->db), sql);
    free(sql);
    cr_assert(rc == 0, "SQL failed: %s", mysql_error(h->db));
}

void harness_sql(harness *h, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsql(h, fmt, ap);
    va_end(ap);
    MYSQL_RES *res = mysql_store_result(h->db);
    if (res)
        mysql_free_result(res);
}

long long harness_scalar(harness *h, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsql(h, fmt, ap);
    va_end(ap);
    MYSQL_RES *res = mysql_store_result(h->db);
    cr_assert(res, "query returned no result set");
    MYSQL_ROW row = mysql_fetch_row(res);
    long long value = row && row[0] ? atoll(row[0]) : -1;
    mysql_free_result(res);
    return value;
}

void harness_insert_orders(harness *h, const char *prefix, int count, const char *state)
{
    /* Batches of 500 rows keep the statement far below max_allowed_packet. */
    for (int start = 0; start < count; start += 500) {
        char *sql = malloc(64 * 520 + 256);
        cr_assert(sql);
        int n = sprintf(sql, "INSERT INTO orders (order_id, status) VALUES ");
        for (int i = start; i < count && i < start + 500; i++)
            n += sprintf(sql + n, "%s('%s%d','%s')", i == start ? "" : ",", prefix, i, state);
        harness_sql(h, "%s", sql);
        free(sql);
    }
}

void harness_config_set_mysql_login(harness *h, const char *user, const char *password)
{
    FILE *f = fopen(h->config_path, "r");
    cr_assert(f, "%s: %s", h->config_path, strerror(errno));
    static char text[16384], out[16400];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *url = strstr(text, "mysql://");
    cr_assert(url, "no mysql:// URL in %s", h->config_path);
    char *at = strchr(url, '@');
    cr_assert(at);
    snprintf(out, sizeof out, "%.*smysql://%s:%s%s", (int)(url - text), text, user, password, at);
    f = fopen(h->config_path, "w");
    cr_assert(f);
    fputs(out, f);
    fclose(f);
}

bool harness_db_is_mysql(harness *h)
{
    const char *info = mysql_get_server_info(h->db);
    return info && !strstr(info, "MariaDB");
}

MYSQL *harness_db_open(harness *h)
{
    return connect_database(h->database);
}

void harness_db_reconnect(harness *h, int timeout_ms)
{
    if (h->db)
        mysql_close(h->db);
    h->db = NULL;
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        char reason[256];
        h->db = try_connect_database(h->database, 2, reason, sizeof reason);
        if (h->db)
            return;
        cr_assert(harness_now_ms() < deadline, "cannot reconnect to MariaDB within %d ms: %s",
                  timeout_ms, reason);
        pause_ms(100);
    }
}

/* ----------------------------------------------------------------------------------- the broker */

/* Waits for the publisher confirm of publish number seq. *returned (unless NULL) is set when the
 * broker returned the message as unroutable before confirming it. */
static void wait_confirm(harness *h, uint64_t seq, bool *returned)
{
    if (returned)
        *returned = false;
    for (;;) {
        amqp_frame_t frame;
        struct timeval timeout = {.tv_sec = 10};
        int rc = amqp_simple_wait_frame_noblock(h->amqp, &frame, &timeout);
        cr_assert(rc == AMQP_STATUS_OK, "waiting for a publisher confirm: %s",
                  amqp_error_string2(rc));
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue; /* e.g. the content of a basic.return */
        if (frame.payload.method.id == AMQP_BASIC_RETURN_METHOD && returned)
            *returned = true;
        cr_assert(frame.payload.method.id != AMQP_BASIC_NACK_METHOD, "publish was nacked");
        cr_assert(frame.payload.method.id != AMQP_CHANNEL_CLOSE_METHOD, "channel closed");
        if (frame.payload.method.id == AMQP_BASIC_ACK_METHOD) {
            const amqp_basic_ack_t *ack = frame.payload.method.decoded;
            if (ack->delivery_tag >= seq)
                return;
        }
    }
}

/* Properties of a persistent message with content_type (borrowed; NULL: none). */
static amqp_basic_properties_t persistent_props(const char *content_type)
{
    amqp_basic_properties_t props;
    memset(&props, 0, sizeof props);
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    if (content_type) {
        props._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
        props.content_type = amqp_cstring_bytes(content_type);
    }
    return props;
}

void harness_publish(harness *h, const char *routing_key, const char *content_type,
                     const void *body, size_t len, const amqp_table_t *headers)
{
    amqp_basic_properties_t props = persistent_props(content_type);
    if (headers) {
        props._flags |= AMQP_BASIC_HEADERS_FLAG;
        props.headers = *headers;
    }
    amqp_bytes_t bytes = {.len = len, .bytes = (void *)body};
    int rc = amqp_basic_publish(h->amqp, BROKER_CHANNEL, amqp_empty_bytes,
                                amqp_cstring_bytes(routing_key ? routing_key : h->queue), 0, 0,
                                &props, bytes);
    cr_assert(rc == AMQP_STATUS_OK, "publish: %s", amqp_error_string2(rc));
    wait_confirm(h, ++h->publish_seq, NULL);
    amqp_maybe_release_buffers(h->amqp);
}

void harness_publish_event(harness *h, const char *order_id, const char *event, long amount)
{
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"message_id\":\"m-%s-%s\",\"biz_key\":\"order_id:%s:%s\",\"order_id\":"
                     "\"%s\",\"event_type\":\"%s\",\"amount\":%ld}",
                     order_id, event, order_id, event, order_id, event, amount);
    harness_publish(h, NULL, "application/json", body, (size_t)n, NULL);
}

void harness_publish_props(harness *h, const char *exchange, const char *routing_key,
                           const amqp_basic_properties_t *props, const void *body, size_t len)
{
    amqp_bytes_t bytes = {.len = len, .bytes = (void *)body};
    int rc = amqp_basic_publish(h->amqp, BROKER_CHANNEL,
                                exchange && *exchange ? amqp_cstring_bytes(exchange)
                                                      : amqp_empty_bytes,
                                amqp_cstring_bytes(routing_key), 1, 0, props, bytes);
    cr_assert(rc == AMQP_STATUS_OK, "publish: %s", amqp_error_string2(rc));
    bool returned;
    wait_confirm(h, ++h->publish_seq, &returned);
    amqp_maybe_release_buffers(h->amqp);
    cr_assert(!returned, "the broker returned the message published to '%s' with key '%s' as "
                         "unroutable", exchange ? exchange : "", routing_key);
}

#define PUBLISH_CHUNK 256

void harness_publish_batch(harness *h, const char *routing_key, const char *content_type,
                           const void *const *bodies, const size_t *lens, size_t count)
{
    amqp_basic_properties_t props = persistent_props(content_type);
    for (size_t start = 0; start < count; start += PUBLISH_CHUNK) {
        size_t n = count - start < PUBLISH_CHUNK ? count - start : PUBLISH_CHUNK;
        uint64_t first = h->publish_seq + 1;
        for (size_t i = 0; i < n; i++) {
            amqp_bytes_t bytes = {.len = lens[start + i], .bytes = (void *)bodies[start + i]};
            int rc = amqp_basic_publish(h->amqp, BROKER_CHANNEL, amqp_empty_bytes,
                                        amqp_cstring_bytes(routing_key ? routing_key : h->queue), 0,
                                        0, &props, bytes);
            cr_assert(rc == AMQP_STATUS_OK, "publish: %s", amqp_error_string2(rc));
            h->publish_seq++;
        }
        /* Confirms may be single or cumulative (multiple) and, in principle, out of order:
         * mark each one until the whole chunk is confirmed. */
        bool confirmed[PUBLISH_CHUNK] = {false};
        size_t missing = n;
        while (missing > 0) {
            amqp_frame_t frame;
            struct timeval timeout = {.tv_sec = 30};
            int rc = amqp_simple_wait_frame_noblock(h->amqp, &frame, &timeout);
            cr_assert(rc == AMQP_STATUS_OK,
                      "waiting for publisher confirms (%zu of %zu missing): %s", missing, n,
                      amqp_error_string2(rc));
            if (frame.frame_type != AMQP_FRAME_METHOD)
                continue;
            cr_assert(frame.payload.method.id != AMQP_BASIC_NACK_METHOD, "publish was nacked");
            cr_assert(frame.payload.method.id != AMQP_CHANNEL_CLOSE_METHOD, "channel closed");
            if (frame.payload.method.id != AMQP_BASIC_ACK_METHOD)
                continue;
            const amqp_basic_ack_t *ack = frame.payload.method.decoded;
            uint64_t lo = ack->multiple ? first : ack->delivery_tag;
            for (uint64_t tag = lo; tag <= ack->delivery_tag; tag++)
                if (tag >= first && tag < first + n && !confirmed[tag - first]) {
                    confirmed[tag - first] = true;
                    missing--;
                }
        }
        amqp_maybe_release_buffers(h->amqp);
    }
}

long harness_queue_depth_of(harness *h, const char *suffix)
{
    char name[200];
    snprintf(name, sizeof name, "%s%s", h->queue, suffix);
    return harness_queue_depth(h, name);
}

bool harness_wait_queue_depth_of(harness *h, const char *suffix, long expected, int timeout_ms)
{
    char name[200];
    snprintf(name, sizeof name, "%s%s", h->queue, suffix);
    return harness_wait_queue_depth(h, name, expected, timeout_ms);
}

bool harness_queue_info(harness *h, const char *queue, long *messages, long *consumers)
{
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(queue), 1, 0, 0, 0, amqp_empty_table);
    if (!ok) {
        /* The 404 closed the channel. */
        cr_assert(reopen_channel(h), "confirm.select after reopening the channel failed");
        return false;
    }
    if (messages)
        *messages = (long)ok->message_count;
    if (consumers)
        *consumers = (long)ok->consumer_count;
    return true;
}

long harness_queue_depth(harness *h, const char *queue)
{
    long messages = -1;
    if (!harness_queue_info(h, queue, &messages, NULL))
        return -1;
    return messages;
}

typedef struct depth_wait {
    const char *queue;
    long expected, last;
} depth_wait;

static bool depth_reached(harness *h, void *arg)
{
    depth_wait *w = arg;
    w->last = harness_queue_depth(h, w->queue);
    return w->last == w->expected;
}

bool harness_wait_queue_depth(harness *h, const char *queue, long expected, int timeout_ms)
{
    depth_wait w = {.queue = queue, .expected = expected, .last = -2};
    bool ok = harness_wait_for(depth_reached, h, &w, timeout_ms);
    if (!ok)
        cr_log_error("waited %d ms for %s to hold %ld messages; it holds %ld", timeout_ms, queue,
                     expected, w.last);
    return ok;
}

bool harness_get(harness *h, const char *queue, amqp_message_t *out)
{
    amqp_rpc_reply_t reply = amqp_basic_get(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(queue), 1);
    cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL, "basic.get on %s failed", queue);
    if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
        return false;
    reply = amqp_read_message(h->amqp, BROKER_CHANNEL, out, 0);
    cr_assert(reply.reply_type == AMQP_RESPONSE_NORMAL, "reading a message from %s failed", queue);
    return true;
}

void harness_reconnect_amqp(harness *h, int timeout_ms)
{
    if (h->amqp)
        amqp_destroy_connection(h->amqp);
    h->amqp = NULL;
    h->publish_seq = 0;
    int64_t deadline = harness_now_ms() + timeout_ms;
    char err[512] = "";
    broker_open_options bo = {.url = getenv("IDEMQ_TEST_AMQP_URL"), .confirms = 1};
    while (harness_now_ms() < deadline) {
        if (broker_open(&bo, &h->amqp, err, sizeof err) == 0)
            return;
        pause_ms(200);
    }
    cr_assert_fail("RabbitMQ did not come back within %d ms: %s", timeout_ms, err);
}

void harness_wait_quorum_ready(harness *h, int timeout_ms)
{
    /* After a broker restart, RabbitMQ accepts connections before its quorum-queue system can
     * create queues (declarations fail with 541 for a while): wait for a real declaration. */
    char name[96];
    snprintf(name, sizeof name, "idemq.quorum-probe.%d", (int)getpid());
    amqp_table_entry_t entry = {.key = amqp_cstring_bytes("x-queue-type"),
                                .value = {.kind = AMQP_FIELD_KIND_UTF8,
                                          .value.bytes = amqp_cstring_bytes("quorum")}};
    amqp_table_t args = {.num_entries = 1, .entries = &entry};
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        amqp_queue_declare(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0, 1, 0, 0, args);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(h->amqp);
        if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
            amqp_queue_delete(h->amqp, BROKER_CHANNEL, amqp_cstring_bytes(name), 0, 0);
            amqp_get_rpc_reply(h->amqp);
            return;
        }
        cr_assert(harness_now_ms() < deadline, "quorum queues still cannot be declared after %d ms",
                  timeout_ms);
        harness_reconnect_amqp(h, deadline - harness_now_ms());
        pause_ms(250);
    }
}

int harness_broker_version(harness *h)
{
    const amqp_table_t *props = amqp_get_server_properties(h->amqp);
    for (int i = 0; props && i < props->num_entries; i++) {
        const amqp_table_entry_t *e = &props->entries[i];
        if (e->key.len == 7 && memcmp(e->key.bytes, "version", 7) == 0 &&
            e->value.kind == AMQP_FIELD_KIND_UTF8) {
            char text[32];
            int major = 0, minor = 0;
            snprintf(text, sizeof text, "%.*s", (int)e->value.value.bytes.len,
                     (const char *)e->value.value.bytes.bytes);
            if (sscanf(text, "%d.%d", &major, &minor) >= 1)
                return major * 100 + minor;
        }
    }
    return 0;
}

int harness_broker_major(harness *h)
{
    int major = harness_broker_version(h) / 100;
    const char *want = getenv("IDEMQ_TEST_BROKER");
    if (want && *want)
        cr_assert(major >= atoi(want),
                  "IDEMQ_TEST_BROKER=%s but the broker at IDEMQ_TEST_AMQP_URL is major version %d",
                  want, major);
    return major;
}

/* ---------------------------------------------------------------------------- the idemq process */

static pid_t spawn(harness *h, const char *const *argv, int out_fd)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(out_fd, STDOUT_FILENO);
        dup2(out_fd, STDERR_FILENO);
        setpgid(0, 0);
        /* A failed assertion ends the test process; its idemq must not outlive it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(IDEMQ_BINARY, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", IDEMQ_BINARY, strerror(errno));
        _exit(127);
    }
    (void)h;
    return pid;
}

pid_t harness_spawn_logged(harness *h, const char *log_path)
{
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    cr_assert(fd >= 0, "open %s: %s", log_path, strerror(errno));
    const char *argv[] = {IDEMQ_BINARY, "run", "-c", h->config_path, NULL};
    pid_t pid = spawn(h, argv, fd);
    close(fd);
    return pid;
}

pid_t harness_spawn(harness *h)
{
    return harness_spawn_logged(h, h->log_path);
}

int harness_wait_exit(pid_t pid, int timeout_ms)
{
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        if (harness_now_ms() >= deadline)
            return -1;
        pause_ms(10);
    }
}

int harness_stop(pid_t pid, int sig, int timeout_ms)
{
    kill(pid, sig);
    int status = harness_wait_exit(pid, timeout_ms);
    if (status != -1)
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

void harness_start_idemq(harness *h, const char *ready_line, int timeout_ms, pid_t *pid)
{
    long before = harness_log_count(h, ready_line);
    *pid = harness_spawn(h);
    cr_assert(harness_wait_log(h, ready_line, before + 1, timeout_ms),
              "idemq did not start consuming");
}

void harness_start_declared(harness *h, const char *ready_line, int timeout_ms, pid_t *pid)
{
    harness_declare_topology(h);
    harness_start_idemq(h, ready_line, timeout_ms, pid);
}

void harness_stop_idemq(pid_t *pid)
{
    int rc = harness_stop(*pid, SIGTERM, 30000);
    *pid = 0;
    cr_expect_eq(rc, 0, "idemq run should exit 0 on SIGTERM, got %d", rc);
}

void harness_kill_idemq(pid_t *pid)
{
    if (*pid > 0) {
        harness_stop(*pid, SIGKILL, 5000);
        *pid = 0;
    }
}

int harness_run_cli(harness *h, char **output, const char *const *args)
{
    char out_path[400];
    snprintf(out_path, sizeof out_path, "%s/cli.out", h->dir);
    int fd = open(out_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    const char *argv[32] = {IDEMQ_BINARY};
    size_t n = 1;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = spawn(h, argv, fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (output) {
        off_t size = lseek(fd, 0, SEEK_END);
        *output = calloc(1, (size_t)size + 1);
        cr_assert(*output);
        cr_assert(pread(fd, *output, (size_t)size, 0) == size);
    }
    close(fd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int harness_run_cli_command(harness *h, const char *command, char **output)
{
    const char *args[] = {command, "-c", h->config_path, NULL};
    return harness_run_cli(h, output, args);
}

void harness_declare_topology(harness *h)
{
    char *output = NULL;
    const char *args[] = {"topology", "-c", h->config_path, NULL};
    int rc = harness_run_cli(h, &output, args);
    cr_assert(rc == 0, "idemq topology exited %d:\n%s", rc, output ? output : "");
    free(output);
}

json_t *harness_output_json(const char *output)
{
    const char *start = output && output[0] == '{' ? output : NULL;
    if (!start && output) {
        start = strstr(output, "\n{");
        if (start)
            start++;
    }
    cr_assert(start, "no JSON document in the output:\n%s", output ? output : "(none)");
    json_error_t jerr;
    json_t *doc = json_loads(start, 0, &jerr);
    cr_assert(doc, "the output is not JSON (%s):\n%s", jerr.text, output);
    return doc;
}

/* -------------------------------------------------------------------------------------- its log */

long harness_log_count_both(const char *log_path, const char *needle, const char *also)
{
    FILE *f = fopen(log_path, "r");
    if (!f)
        return 0;
    long count = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0)
        if (strstr(line, needle) && (!also || strstr(line, also)))
            count++;
    free(line);
    fclose(f);
    return count;
}

long harness_log_count(harness *h, const char *needle)
{
    return harness_log_count_both(h->log_path, needle, NULL);
}

long harness_log_count_in(const char *log_path, const char *needle)
{
    return harness_log_count_both(log_path, needle, NULL);
}

typedef struct log_wait {
    const char *log_path, *needle;
    long at_least;
} log_wait;

static bool log_reached(harness *h, void *arg)
{
    (void)h;
    log_wait *w = arg;
    return harness_log_count_in(w->log_path, w->needle) >= w->at_least;
}

/* The last lines of log_path in the test's output: the suite's teardown deletes the log of a
 * failed wait, and a failure seen only in a full run is otherwise gone with it. */
static void log_tail_to_test_output(const char *log_path, size_t lines)
{
    FILE *f = fopen(log_path, "r");
    if (!f)
        return;
    char *ring[32] = {NULL};
    size_t n = 0, keep = lines < 32 ? lines : 32;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        free(ring[n % keep]);
        ring[n % keep] = strndup(line, 400);
        n++;
    }
    free(line);
    fclose(f);
    size_t first = n > keep ? n - keep : 0;
    for (size_t i = first; i < n; i++) {
        char *text = ring[i % keep];
        text[strcspn(text, "\n")] = '\0';
        cr_log_error("  log: %s", text);
    }
    for (size_t i = 0; i < keep; i++)
        free(ring[i]);
}

bool harness_wait_log_in(const char *log_path, const char *needle, long at_least, int timeout_ms)
{
    log_wait w = {.log_path = log_path, .needle = needle, .at_least = at_least};
    bool ok = harness_wait_for(log_reached, NULL, &w, timeout_ms);
    if (!ok) {
        cr_log_error("waited %d ms for %ld line(s) of %s containing %s; found %ld", timeout_ms,
                     at_least, log_path, needle, harness_log_count_in(log_path, needle));
        log_tail_to_test_output(log_path, 20);
    }
    return ok;
}

bool harness_wait_log(harness *h, const char *needle, long at_least, int timeout_ms)
{
    return harness_wait_log_in(h->log_path, needle, at_least, timeout_ms);
}

/* "2026-01-02T03:04:05.678Z" → ms since the Unix epoch; -1 when it does not parse. */
static int64_t parse_log_ts(const char *text)
{
    struct tm tm;
    int ms = 0;
    memset(&tm, 0, sizeof tm);
    if (!text || sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon,
                        &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm) * 1000 + ms;
}

static void log_add_object(json_t *all, const char *text)
{
    json_t *obj = json_loads(text, 0, NULL);
    if (!json_is_object(obj)) {
        json_decref(obj);
        return;
    }
    json_object_set_new(obj, "_line", json_integer((json_int_t)json_array_size(all)));
    json_object_set_new(obj, "_ts_ms",
                        json_integer(parse_log_ts(json_string_value(json_object_get(obj, "ts")))));
    json_array_append_new(all, obj);
}

json_t *harness_log_load(harness *h)
{
    json_t *all = json_array();
    cr_assert(all);
    FILE *f = fopen(h->log_path, "r");
    if (!f)
        return all;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        /* A kill -9 between the two writes of a log line glues it to the next one. */
        char *start = line;
        for (char *glue; (glue = strstr(start + 1, "}{\"ts\":")) != NULL; start = glue + 1) {
            glue[1] = '\0';
            log_add_object(all, start);
            glue[1] = '{';
        }
        log_add_object(all, start);
    }
    free(line);
    fclose(f);
    return all;
}

/* ----------------------------------------------------------------------------- its ops endpoint */

int harness_http_port(harness *h, int timeout_ms)
{
    static const char needle[] = "http listening on 127.0.0.1:";
    int64_t deadline = harness_now_ms() + timeout_ms;
    for (;;) {
        int port = 0;
        FILE *f = fopen(h->log_path, "r");
        if (f) {
            char *line = NULL;
            size_t cap = 0;
            while (getline(&line, &cap, f) >= 0) {
                const char *at = strstr(line, needle);
                if (at)
                    port = atoi(at + sizeof needle - 1); /* the last line wins */
            }
            free(line);
            fclose(f);
        }
        if (port > 0)
            return port;
        cr_assert(harness_now_ms() < deadline, "no \"%s\" line in %s within %d ms", needle,
                  h->log_path, timeout_ms);
        pause_ms(20);
    }
}

int harness_http_get(int port, const char *path, char **body)
{
    if (body)
        *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    char request[512];
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (send(fd, request, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    size_t len = 0, cap = 16384;
    char *raw = malloc(cap);
    cr_assert(raw);
    int64_t deadline = harness_now_ms() + 5000;
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
            break; /* the server closes after each answer (Connection: close) */
        len += (size_t)got;
    }
    close(fd);
    raw[len] = '\0';
    int status = -1;
    if (len >= 12 && memcmp(raw, "HTTP/1.1 ", 9) == 0)
        status = atoi(raw + 9);
    const char *end = strstr(raw, "\r\n\r\n");
    if (body)
        *body = strdup(end ? end + 4 : "");
    free(raw);
    return status;
}

void harness_endpoint_watch_init(harness_endpoint_watch *w, int port, int healthz_budget_ms)
{
    *w = (harness_endpoint_watch){
        .port = port, .healthz_budget_ms = healthz_budget_ms, .readyz_status = -1};
}

int harness_endpoint_watch_poll(harness_endpoint_watch *w)
{
    int64_t t0 = harness_now_ms();
    int status = harness_http_get(w->port, "/healthz", NULL);
    int64_t took = harness_now_ms() - t0;
    w->healthz_requests++;
    if (took > w->healthz_worst_ms)
        w->healthz_worst_ms = took;
    if (status != 200 || took > w->healthz_budget_ms)
        w->healthz_bad++;

    char *body = NULL;
    status = harness_http_get(w->port, "/readyz", &body);
    w->readyz_at_ms = harness_now_ms();
    w->readyz_requests++;
    w->readyz_status = status;
    snprintf(w->readyz_body, sizeof w->readyz_body, "%s", body ? body : "");
    free(body);
    if (status == 200) {
        w->readyz_ready++;
    } else if (status != 503) {
        w->readyz_other++;
    } else {
        if (!w->readyz_first_unready[0])
            memcpy(w->readyz_first_unready, w->readyz_body, sizeof w->readyz_body);
        memcpy(w->readyz_last_unready, w->readyz_body, sizeof w->readyz_body);
    }
    return status;
}

long long harness_metric_value(const char *scrape, const char *sample)
{
    if (!scrape)
        return -1;
    size_t n = strlen(sample);
    for (const char *line = scrape; *line;) {
        if (strncmp(line, sample, n) == 0 && line[n] == ' ')
            return atoll(line + n + 1);
        const char *next = strchr(line, '\n');
        if (!next)
            break;
        line = next + 1;
    }
    return -1;
}

/* --------------------------------------------------------------------------- the shared servers */

static const char *services_script(void)
{
    const char *s = getenv("IDEMQ_SERVICES");
    cr_assert(s && *s, "IDEMQ_SERVICES is not set: source .state/env (scripts/test does)");
    return s;
}

void harness_services_ok(const char *args)
{
    const char *script = services_script();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "\"%s\" %s >/dev/null 2>&1", script, args);
    cr_assert(system(cmd) == 0, "`services %s` failed", args);
}

int harness_services(harness *h, const char *cmd)
{
    char path[400];
    snprintf(path, sizeof path, "%s/services.log", h->dir);
    const char *script = services_script();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(script, script, cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void harness_db_guard_arm(harness *h, harness_db_guard *g)
{
    int p[2];
    cr_assert(pipe(p) == 0);
    const char *script = services_script();
    char path[400];
    snprintf(path, sizeof path, "%s/guard.log", h->dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* not hit by signals sent to the test's process group */
        close(p[1]);
        int log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != p[0] && fd != log_fd)
                close(fd); /* do not keep the test's broker or database sockets open */
        char c;
        for (;;) {
            ssize_t n = read(p[0], &c, 1);
            if (n == 0 || (n < 0 && errno != EINTR))
                break;
        }
        if (log_fd >= 0) {
            dup2(log_fd, STDOUT_FILENO);
            dup2(log_fd, STDERR_FILENO);
        }
        execl(script, script, "start-mariadb", (char *)NULL);
        _exit(127);
    }
    close(p[0]);
    fcntl(p[1], F_SETFD, FD_CLOEXEC); /* idemq and CLI children must not hold it */
    g->fd = p[1];
    g->pid = pid;
}

void harness_db_guard_disarm(harness_db_guard *g)
{
    if (g->fd < 0)
        return;
    close(g->fd);
    g->fd = -1;
    int status;
    while (waitpid(g->pid, &status, 0) < 0 && errno == EINTR)
        ;
}

void harness_db_guard_recover(harness *h, harness_db_guard *g)
{
    if (g->db_stopped) {
        harness_services(h, "start-mariadb");
        g->db_stopped = false;
        harness_db_reconnect(h, 60000);
    }
    harness_db_guard_disarm(g);
}

/* Port of IDEMQ_TEST_AMQP_URL (amqp://user:pass@host:port/vhost); 5672 when it names none. */
static int amqp_url_port(void)
{
    const char *url = required_env("IDEMQ_TEST_AMQP_URL");
    const char *host = strchr(url, '@');
    host = host ? host + 1 : url + strlen("amqp://");
    const char *colon = strchr(host, ':');
    const char *slash = strchr(host, '/');
    if (colon && (!slash || colon < slash))
        return atoi(colon + 1);
    return 5672;
}

/* Socket inodes that pid holds open, into inodes[] (at most max); returns how many. */
static size_t socket_inodes_of(pid_t pid, unsigned long *inodes, size_t max)
{
    char dir_path[64];
    snprintf(dir_path, sizeof dir_path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(dir_path);
    cr_assert(dir, "opendir %s: %s", dir_path, strerror(errno));
    size_t n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL && n < max;) {
        char link_path[320], target[128];
        snprintf(link_path, sizeof link_path, "%s/%s", dir_path, e->d_name);
        ssize_t len = readlink(link_path, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        unsigned long inode;
        if (sscanf(target, "socket:[%lu]", &inode) == 1)
            inodes[n++] = inode;
    }
    closedir(dir);
    return n;
}

int harness_amqp_local_port(pid_t pid)
{
    unsigned long inodes[256];
    size_t count = socket_inodes_of(pid, inodes, 256);
    int broker_port = amqp_url_port();
    const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        if (!f)
            continue;
        char line[512];
        int found = 0;
        while (!found && fgets(line, sizeof line, f)) {
            char local[64], remote[64];
            unsigned st;
            unsigned long inode;
            /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
            if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*u %*u %lu", local, remote, &st,
                       &inode) != 4)
                continue;
            const char *lp = strrchr(local, ':'), *rp = strrchr(remote, ':');
            if (!lp || !rp || st != 0x01 /* ESTABLISHED */ ||
                (int)strtol(rp + 1, NULL, 16) != broker_port)
                continue;
            for (size_t i = 0; i < count; i++)
                if (inodes[i] == inode)
                    found = (int)strtol(lp + 1, NULL, 16);
        }
        fclose(f);
        if (found)
            return found;
    }
    return 0;
}

long harness_tcp_unread(unsigned port, bool listening)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    cr_assert(f, "cannot read /proc/net/tcp");
    long total = -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char local[64];
        unsigned st;
        unsigned long tx, rx;
        /* sl local rem st tx_queue:rx_queue ... */
        if (sscanf(line, " %*d: %63s %*s %x %lx:%lx", local, &st, &tx, &rx) != 4)
            continue;
        const char *lp = strrchr(local, ':');
        if (!lp || strtoul(lp + 1, NULL, 16) != port ||
            st != (listening ? 0x0Au /* LISTEN */ : 0x01u /* ESTABLISHED */))
            continue;
        total = (total < 0 ? 0 : total) + (long)rx;
    }
    fclose(f);
    return total;
}

bool harness_close_amqp_connection_of(pid_t pid, const char *reason)
{
    int port = harness_amqp_local_port(pid);
    if (!port)
        return false;
    const char *script = services_script();
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "\"%s\" rabbitmqctl -q list_connections --no-table-headers pid name 2>/dev/null",
             script);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen: %s", strerror(errno));
    /* Lines "<rabbit@host.1.2.3>\t127.0.0.1:PORT -> 127.0.0.1:5672": close_connection takes the
     * connection's pid, not its name. */
    char line[512], conn_pid[512] = "", suffix[64];
    snprintf(suffix, sizeof suffix, ":%d -> ", port);
    while (fgets(line, sizeof line, p)) {
        char *tab = strchr(line, '\t');
        if (line[0] != '<' || !tab || !strstr(tab, suffix) || strchr(line, '\''))
            continue;
        *tab = '\0';
        snprintf(conn_pid, sizeof conn_pid, "%s", line);
    }
    pclose(p);
    if (!conn_pid[0])
        return false;
    snprintf(cmd, sizeof cmd, "rabbitmqctl close_connection '%s' '%s'", conn_pid,
             reason ? reason : "closed by an idemq test");
    harness_services_ok(cmd);
    return true;
}

bool harness_broker_queue_stats(const char *queue, long *messages, long *unacked)
{
    const char *script = services_script();
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "\"%s\" rabbitmqctl -q list_queues --no-table-headers name messages "
             "messages_unacknowledged 2>/dev/null",
             script);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen: %s", strerror(errno));
    char line[1024];
    bool found = false;
    size_t qlen = strlen(queue);
    while (fgets(line, sizeof line, p)) {
        long m, u;
        if (strncmp(line, queue, qlen) == 0 && (line[qlen] == '\t' || line[qlen] == ' ') &&
            sscanf(line + qlen, " %ld %ld", &m, &u) == 2) {
            found = true;
            if (messages)
                *messages = m;
            if (unacked)
                *unacked = u;
        }
    }
    pclose(p);
    return found;
}

typedef struct settled_wait {
    const char *queue;
    long messages, unacked;
} settled_wait;

static bool queue_settled(harness *h, void *arg)
{
    (void)h;
    settled_wait *w = arg;
    w->messages = w->unacked = -1;
    return harness_broker_queue_stats(w->queue, &w->messages, &w->unacked) && w->messages == 0 &&
           w->unacked == 0;
}

bool harness_wait_queue_settled(harness *h, const char *queue, int timeout_ms)
{
    settled_wait w = {.queue = queue};
    bool ok = harness_wait_for(queue_settled, h, &w, timeout_ms);
    if (!ok)
        cr_log_error("waited %d ms for %s to settle; it holds %ld message(s), %ld unacked",
                     timeout_ms, queue, w.messages, w.unacked);
    return ok;
}

long harness_broker_messages_under(const char *prefix, int *queues)
{
    const char *script = services_script();
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "\"%s\" rabbitmqctl -q list_queues --no-table-headers name messages 2>/dev/null",
             script);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen: %s", strerror(errno));
    char line[1024];
    long total = 0;
    int n = 0;
    size_t plen = strlen(prefix);
    while (fgets(line, sizeof line, p)) {
        char name[512];
        long m;
        if (strncmp(line, prefix, plen) == 0 && sscanf(line, "%511s %ld", name, &m) == 2) {
            total += m;
            n++;
        }
    }
    int rc = pclose(p);
    cr_assert(rc == 0, "`services rabbitmqctl list_queues` failed (status %d)", rc);
    if (queues)
        *queues = n;
    return total;
}

/* -------------------------------------------------- the config file, line by line (issue 9) */

void harness_config_replace_line(harness *h, const char *prefix, const char *line)
{
    FILE *f = fopen(h->config_path, "r");
    cr_assert(f, "cannot read %s", h->config_path);
    char *text = NULL, *buf = NULL;
    size_t text_len = 0, cap = 0;
    FILE *out = open_memstream(&text, &text_len);
    cr_assert(out);
    bool found = false;
    while (getline(&buf, &cap, f) >= 0) {
        if (!found && strncmp(buf, prefix, strlen(prefix)) == 0) {
            fprintf(out, "%s\n", line);
            found = true;
        } else {
            fputs(buf, out);
        }
    }
    free(buf);
    fclose(f);
    fclose(out);
    cr_assert(found, "no line of %s starts with '%s'", h->config_path, prefix);
    f = fopen(h->config_path, "w");
    cr_assert(f, "cannot write %s", h->config_path);
    cr_assert_eq(fwrite(text, 1, text_len, f), text_len);
    fclose(f);
    free(text);
}

void harness_publish_payments(harness *h, const char *prefix, int count)
{
    char **bodies = calloc((size_t)count, sizeof *bodies);
    size_t *lens = calloc((size_t)count, sizeof *lens);
    cr_assert(bodies && lens);
    for (int i = 0; i < count; i++) {
        bodies[i] = malloc(256);
        cr_assert(bodies[i]);
        lens[i] = (size_t)snprintf(bodies[i], 256,
                                   "{\"biz_key\":\"order_id:%s%d:PAY_SUCCESS\",\"order_id\":\"%s%d\","
                                   "\"event_type\":\"PAY_SUCCESS\",\"amount\":%d}",
                                   prefix, i, prefix, i, i);
    }
    harness_publish_batch(h, NULL, "application/json", (const void *const *)bodies, lens,
                          (size_t)count);
    for (int i = 0; i < count; i++)
        free(bodies[i]);
    free(bodies);
    free(lens);
}

const char *harness_json_str(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

long harness_summary_total(const char *log_path, const char *counter)
{
    FILE *f = fopen(log_path, "r");
    if (!f)
        return 0;
    char needle[64];
    snprintf(needle, sizeof needle, " %s=", counter);
    long total = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        if (!strstr(line, "\"msg\":\"summary "))
            continue;
        const char *p = strstr(line, needle);
        if (p)
            total += atol(p + strlen(needle));
    }
    free(line);
    fclose(f);
    return total;
}

amqp_table_entry_t harness_field_text(const char *key, const char *value)
{
    amqp_table_entry_t e = {.key = amqp_cstring_bytes(key)};
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(value);
    return e;
}

amqp_table_entry_t harness_field_int(const char *key, int64_t value)
{
    amqp_table_entry_t e = {.key = amqp_cstring_bytes(key)};
    e.value.kind = AMQP_FIELD_KIND_I64;
    e.value.value.i64 = value;
    return e;
}

/* ------------------------------------------------------------------ the broker behind a proxy */

void harness_start_broker_proxy(struct freeze_proxy **out, char *url, size_t url_len)
{
    const char *direct = required_env("IDEMQ_TEST_AMQP_URL");
    char copy[512], err[256];
    struct amqp_connection_info info;
    snprintf(copy, sizeof copy, "%s", direct);
    cr_assert(amqp_parse_url(copy, &info) == AMQP_STATUS_OK, "cannot parse %s", direct);
    cr_assert(freeze_proxy_start(info.host, (unsigned)info.port, out, err, sizeof err) == 0, "%s",
              err);
    /* amqp://user:pass@HOST:PORT/vhost → the same through the proxy on 127.0.0.1. */
    const char *auth = strstr(direct, "://") + 3;
    const char *at = strchr(auth, '@');
    const char *host = at ? at + 1 : auth;
    const char *rest = strchr(host, '/');
    snprintf(url, url_len, "%.*s127.0.0.1:%u%s", (int)(host - direct), direct,
             freeze_proxy_port(*out), rest ? rest : "");
}
