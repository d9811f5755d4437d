/*
 * bench_throughput — idemq's message rate against the two ceilings it sits between, measured in
 * the same run on the same machine, reported as ratios (these machines are shared and noisy):
 *
 *   db      W threads, one connection each, running idemq's exact transaction shape without
 *           idemq: INSERT the dedup row, guarded state-machine UPDATE, COMMIT — one per message;
 *   broker  a raw rabbitmq-c consumer (prefetch as idemq's) that only acks each message;
 *   idemq   the real daemon on a preloaded queue, from spawn until every dedup row exists.
 *
 * Usage: bench_throughput [messages=5000] [runs=3] [workers=4]. Needs IDEMQ_TEST_AMQP_URL and
 * IDEMQ_TEST_MYSQL_URL (scripts/services start writes them to .state/env); run via scripts/bench.
 */
#include <amqp.h>
#include <mysql.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "broker/connection.h"
#include "db/dsn.h"
#include "store/schema.h"

#define QUEUE_RAW "bench.raw"
#define QUEUE_IDEMQ "bench.idemq"
#define DATABASE "idemq_bench"

static int messages = 5000, runs = 3, workers = 4;
static db_dsn dsn;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "bench: %s: %s\n", what, detail);
    exit(1);
}

static MYSQL *db_connect(const char *database)
{
    MYSQL *db = mysql_init(NULL);
    const char *host = dsn.socket[0] ? "localhost" : dsn.host;
    if (!mysql_real_connect(db, host, dsn.user, dsn.password, database, dsn.port,
                            dsn.socket[0] ? dsn.socket : NULL, CLIENT_FOUND_ROWS))
        die("mysql connect", mysql_error(db));
    return db;
}

static void sql(MYSQL *db, const char *text)
{
    if (mysql_query(db, text) != 0)
        die(text, mysql_error(db));
}

/* Fresh tables: N orders in PAYING, an empty msg_dedup. */
static void reset_tables(void)
{
    MYSQL *db = db_connect(NULL);
    sql(db, "DROP DATABASE IF EXISTS " DATABASE);
    sql(db, "CREATE DATABASE " DATABASE);
    sql(db, "USE " DATABASE);
    sql(db, store_dedup_ddl);
    sql(db, "CREATE TABLE orders (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL, "
            "amount BIGINT NULL) ENGINE=InnoDB");
    size_t cap = (size_t)messages * 32 + 128, n = 0;
    char *text = malloc(cap);
    n += (size_t)snprintf(text, cap, "INSERT INTO orders (order_id, status) VALUES ");
    for (int i = 0; i < messages; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s('b%d','PAYING')", i ? "," : "", i);
    sql(db, text);
    free(text);
    mysql_close(db);
}

typedef struct slice {
    int begin, end;
} slice;

static void db_worker(void *arg)
{
    slice *s = arg;
    mysql_thread_init();
    MYSQL *db = db_connect(DATABASE);
    mysql_autocommit(db, 0);
    MYSQL_STMT *insert = mysql_stmt_init(db), *update = mysql_stmt_init(db);
    static const char ins[] = "INSERT INTO msg_dedup (biz_key, handler_name) VALUES (?, ?)";
    static const char upd[] = "UPDATE `orders` SET `status` = ?, `amount` = IF(?, ?, `amount`) "
                              "WHERE `order_id` = ? AND `status` IN (?)";
    if (mysql_stmt_prepare(insert, ins, sizeof ins - 1) ||
        mysql_stmt_prepare(update, upd, sizeof upd - 1))
        die("prepare", mysql_error(db));
    char handler_name[] = "pay-callback", to_state[] = "PAID", from_state[] = "PAYING";
    for (int i = s->begin; i < s->end; i++) {
        char key[64], order[32];
        unsigned long key_len = (unsigned long)snprintf(key, sizeof key, "order_id:b%d:PAY", i);
        unsigned long order_len = (unsigned long)snprintf(order, sizeof order, "b%d", i);
        unsigned long handler_len = 12, to_len = 4, from_len = 6;
        long long amount = i;
        signed char present = 1;
        MYSQL_BIND p[5];
        memset(p, 0, sizeof p);
        p[0].buffer_type = MYSQL_TYPE_STRING, p[0].buffer = key, p[0].length = &key_len;
        p[1].buffer_type = MYSQL_TYPE_STRING, p[1].buffer = handler_name,
        p[1].length = &handler_len;
        if (mysql_stmt_bind_param(insert, p) || mysql_stmt_execute(insert))
            die("insert", mysql_stmt_error(insert));
        memset(p, 0, sizeof p);
        p[0].buffer_type = MYSQL_TYPE_STRING, p[0].buffer = to_state, p[0].length = &to_len;
        p[1].buffer_type = MYSQL_TYPE_TINY, p[1].buffer = &present;
        p[2].buffer_type = MYSQL_TYPE_LONGLONG, p[2].buffer = &amount;
        p[3].buffer_type = MYSQL_TYPE_STRING, p[3].buffer = order, p[3].length = &order_len;
        p[4].buffer_type = MYSQL_TYPE_STRING, p[4].buffer = from_state, p[4].length = &from_len;
        if (mysql_stmt_bind_param(update, p) || mysql_stmt_execute(update))
            die("update", mysql_stmt_error(update));
        if (mysql_commit(db))
            die("commit", mysql_error(db));
    }
    mysql_stmt_close(insert);
    mysql_stmt_close(update);
    mysql_close(db);
    mysql_thread_end();
}

static double run_db_baseline(void)
{
    reset_tables();
    uv_thread_t threads[64];
    slice slices[64];
    double start = now_s();
    for (int w = 0; w < workers; w++) {
        slices[w].begin = messages * w / workers;
        slices[w].end = messages * (w + 1) / workers;
        uv_thread_create(&threads[w], db_worker, &slices[w]);
    }
    for (int w = 0; w < workers; w++)
        uv_thread_join(&threads[w]);
    return messages / (now_s() - start);
}

static amqp_connection_state_t amqp_open(int confirms, unsigned prefetch)
{
    amqp_connection_state_t conn;
    char err[512];
    broker_open_options o = {.url = getenv("IDEMQ_TEST_AMQP_URL"), .confirms = confirms,
                             .prefetch = prefetch};
    if (broker_open(&o, &conn, err, sizeof err) != 0)
        die("amqp", err);
    return conn;
}

static void fresh_queue(amqp_connection_state_t conn, const char *queue)
{
    amqp_queue_delete(conn, BROKER_CHANNEL, amqp_cstring_bytes(queue), 0, 0);
    amqp_get_rpc_reply(conn);
    amqp_queue_declare(conn, BROKER_CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0,
                       amqp_empty_table);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        die("declare", queue);
}

/* Publishes the workload with confirms, waiting once per 500 messages. */
static void preload(const char *queue)
{
    amqp_connection_state_t conn = amqp_open(1, 0);
    fresh_queue(conn, queue);
    amqp_basic_properties_t props = {._flags = AMQP_BASIC_CONTENT_TYPE_FLAG |
                                               AMQP_BASIC_DELIVERY_MODE_FLAG,
                                     .content_type = amqp_cstring_bytes("application/json"),
                                     .delivery_mode = AMQP_DELIVERY_PERSISTENT};
    uint64_t published = 0;
    for (int i = 0; i < messages; i++) {
        char body[256];
        int n = snprintf(body, sizeof body,
                         "{\"biz_key\":\"order_id:b%d:PAY\",\"order_id\":\"b%d\","
                         "\"event_type\":\"PAY_SUCCESS\",\"amount\":%d}",
                         i, i, i);
        amqp_bytes_t bytes = {.len = (size_t)n, .bytes = body};
        if (amqp_basic_publish(conn, BROKER_CHANNEL, amqp_empty_bytes, amqp_cstring_bytes(queue),
                               0, 0, &props, bytes) != AMQP_STATUS_OK)
            die("publish", queue);
        published++;
        if (published % 500 == 0 || i == messages - 1) {
            for (;;) {
                amqp_frame_t frame;
                if (amqp_simple_wait_frame(conn, &frame) != AMQP_STATUS_OK)
                    die("confirm", queue);
                if (frame.frame_type == AMQP_FRAME_METHOD &&
                    frame.payload.method.id == AMQP_BASIC_ACK_METHOD &&
                    ((amqp_basic_ack_t *)frame.payload.method.decoded)->delivery_tag >= published)
                    break;
            }
            amqp_maybe_release_buffers(conn);
        }
    }
    broker_close(conn);
}

static double run_broker_baseline(void)
{
    preload(QUEUE_RAW);
    amqp_connection_state_t conn = amqp_open(0, 64);
    double start = now_s();
    amqp_basic_consume(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), amqp_empty_bytes, 0,
                       0, 0, amqp_empty_table);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        die("consume", QUEUE_RAW);
    for (int i = 0; i < messages; i++) {
        amqp_envelope_t env;
        amqp_maybe_release_buffers(conn);
        if (amqp_consume_message(conn, &env, NULL, 0).reply_type != AMQP_RESPONSE_NORMAL)
            die("consume_message", QUEUE_RAW);
        amqp_basic_ack(conn, BROKER_CHANNEL, env.delivery_tag, 0);
        amqp_destroy_envelope(&env);
    }
    double rate = messages / (now_s() - start);
    broker_close(conn);
    return rate;
}

static double run_idemq(const char *idemq, const char *config_path)
{
    reset_tables();
    preload(QUEUE_IDEMQ);
    MYSQL *db = db_connect(DATABASE);
    double start = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        execl(idemq, idemq, "run", "-c", config_path, (char *)NULL);
        _exit(127);
    }
    long long done = 0;
    while (done < messages) {
        struct timespec pause = {.tv_nsec = 5 * 1000000};
        nanosleep(&pause, NULL);
        if (mysql_query(db, "SELECT COUNT(*) FROM msg_dedup") != 0)
            die("count", mysql_error(db));
        MYSQL_RES *res = mysql_store_result(db);
        done = atoll(mysql_fetch_row(res)[0]);
        mysql_free_result(res);
        if (now_s() - start > 600)
            die("idemq", "did not finish in 600 s");
    }
    double rate = messages / (now_s() - start);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    mysql_close(db);
    return rate;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        messages = atoi(argv[1]);
    if (argc > 2)
        runs = atoi(argv[2]);
    if (argc > 3)
        workers = atoi(argv[3]);
    if (messages < 1 || runs < 1 || runs > 50 || workers < 1 || workers > 64)
        die("usage", "bench_throughput [messages] [runs 1..50] [workers 1..64]");
    const char *mysql_url = getenv("IDEMQ_TEST_MYSQL_URL");
    const char *amqp_url = getenv("IDEMQ_TEST_AMQP_URL");
    char err[256];
    if (!mysql_url || !amqp_url)
        die("environment", "IDEMQ_TEST_MYSQL_URL / IDEMQ_TEST_AMQP_URL not set (. .state/env)");
    if (db_dsn_parse(mysql_url, &dsn, err, sizeof err) != 0)
        die("mysql url", err);
    mysql_library_init(0, NULL, NULL);

    char config_path[] = "/tmp/idemq-bench-XXXXXX";
    int fd = mkstemp(config_path);
    FILE *f = fdopen(fd, "w");
    char mysql_bench_url[2400];
    snprintf(mysql_bench_url, sizeof mysql_bench_url, "mysql://%s%s%s@%s:%u/" DATABASE "%s%s",
             dsn.user, dsn.password[0] ? ":" : "", dsn.password, dsn.host, dsn.port,
             dsn.socket[0] ? "?socket=" : "", dsn.socket);
    fprintf(f,
            "amqp: {url: \"%s\", prefetch: 64}\nmysql: {url: \"%s\", workers: %d}\n"
            "log: {level: warn}\nhttp: {listen: \"127.0.0.1:0\"}\n"
            "consumers:\n  - queue: " QUEUE_IDEMQ "\n    handler_name: pay-callback\n"
            "    handler:\n      type: state_machine\n      table: orders\n"
            "      key_column: order_id\n      key_field: order_id\n      state_column: status\n"
            "      event_field: event_type\n      transitions:\n"
            "        PAY_SUCCESS: {from: [PAYING], to: PAID}\n      set: {amount: amount}\n",
            amqp_url, mysql_bench_url, workers);
    fclose(f);

    double db_rates[50], broker_rates[50], idemq_rates[50];
    printf("bench_throughput: %d messages, %d runs, %d DB workers; RabbitMQ, MariaDB and the "
           "measured process share this machine's %ld cores\n",
           messages, runs, workers, sysconf(_SC_NPROCESSORS_ONLN));
    for (int r = 0; r < runs; r++) {
        db_rates[r] = run_db_baseline();
        broker_rates[r] = run_broker_baseline();
        idemq_rates[r] = run_idemq(IDEMQ_BENCH_BINARY, config_path);
        printf("run %d: db %.0f msg/s, broker %.0f msg/s, idemq %.0f msg/s\n", r + 1,
               db_rates[r], broker_rates[r], idemq_rates[r]);
        fflush(stdout);
    }
    double db = median(db_rates, runs), broker = median(broker_rates, runs),
           idemq = median(idemq_rates, runs);
    printf("median: db %.0f msg/s, broker %.0f msg/s, idemq %.0f msg/s\n", db, broker, idemq);
    printf("idemq / db-transaction ceiling = %.2f; idemq / raw-broker ceiling = %.2f\n",
           idemq / db, idemq / broker);
    unlink(config_path);
    MYSQL *admin = db_connect(NULL);
    sql(admin, "DROP DATABASE IF EXISTS " DATABASE);
    mysql_close(admin);
    mysql_library_end();
    return 0;
}
