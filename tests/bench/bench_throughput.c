/*
 * bench_throughput — idemq against the ceilings it sits between, all measured in one run on the
 * same machine and reported as ratios (these machines are shared and noisy):
 *
 *   broker   a raw rabbitmq-c consumer (idemq's prefetch) that only acks each message;
 *   db       idemq's exact statements run by plain threads without idemq (bench_db.h): one
 *            transaction per message (idemq at mysql.batch 1), and batched the way idemq
 *            batches (--shapes: every shape considered, for the README's comparison);
 *   idemq    the real daemon draining a preloaded queue, from spawn until every dedup row
 *            exists, at mysql.batch 1 and at the default batch, with its peak RSS (VmHWM);
 *   emit     idemq with one emit per message until every emit is confirmed and marked, and
 *            again with outbox.retention 0 (rows deleted at their confirm); its
 *            bound from the broker alone: publishing with confirms in the relay's rounds, with
 *            rounds overlapped, and in rounds while the workload is consumed at the same time;
 *   live     the rate idemq sustains while one publisher sends it the workload as fast as it
 *            can (the broker and the cores then carry the publishing too);
 *   latency  publish to commit while idemq consumes live: a paced publisher at light load and
 *            at 90% of the live rate, and a poller that sees each sampled
 *            message's dedup row appear (the commit made it visible). The poller looks every
 *            millisecond, so a figure can read up to ~1 ms late.
 *
 * The workload: `messages` PAY_SUCCESS events, 10% of them duplicates of an earlier one (the
 * same biz_key) arriving up to ~200 messages later (bench_db.h).
 *
 * Usage: bench_throughput [messages=20000] [runs=1] [workers=4] [--batch N] [--prefetch N]
 *        [--linger MS] [--shapes] [--no-emit] [--dedup-rows N] [--flood P] [--instances N,…]
 *        [--cache N] [--retention]
 * --dedup-rows N: msg_dedup holds N rows of earlier traffic through every run (a retention
 * window; bench_db_preload_window), and the runs count only their own rows. A list (0,10000000,
 * 50000000) measures instead the batched database ceiling and idemq at each size in turn, the
 * window growing between them, as ratios to the first.
 * --flood P: instead, idemq on all-distinct messages and on P% duplicates, and the raw broker
 * acking each delivery and acking as idemq does (the bound of a flood no copy of which reaches
 * the database).
 * --instances 1,2,4: instead, idemq with that many processes on the one queue.
 * --cache N: idemq runs with dedup.cache N (0, the default: off).
 * --retention: instead, idemq at the batch with dedup retention off, with the single table's
 * sweeper deleting rows all through the run, and with the rotating tables rotating every 3 s,
 * round-robin, as medians and ratios to off; the deletes and rotations each run saw, from
 * idemq's log (run_retention). Defaults there: 200000 messages, 5 runs.
 * Needs IDEMQ_TEST_AMQP_URL and IDEMQ_TEST_MYSQL_URL (scripts/services start writes them to
 * .state/env); run via scripts/bench. Not a test: it measures, it asserts only correctness.
 */
#include "broker/amqp_api.h"
#include <mysql.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "bench_db.h"
#include "broker/connection.h"
#include "config/config.h"
#include "db/dsn.h"

#define QUEUE_RAW "bench.raw"
#define QUEUE_IDEMQ "bench.idemq"
#define QUEUE_EMITTED "bench.emitted" /* where the emit run's downstream messages go */
#define LIGHT_RATE 200
#define LIGHT_MESSAGES 600
#define HEAVY_SECONDS 5

static int messages = 20000, runs = 1, workers = 4, batch = CONFIG_DEFAULT_BATCH, prefetch = 1000,
           linger_ms = -1;
static bool with_emit = true; /* --no-emit leaves out the run with one emit per message */
static long long dedup_rows;  /* --dedup-rows: the dedup window preloaded before the runs */
#define MAX_WINDOWS 8
static long long windows[MAX_WINDOWS]; /* --dedup-rows A,B,…: the window mode's sizes */
static int window_count;
static int flood_percent; /* --flood P: the duplicate flood's share of duplicates */
static int dedup_cache;   /* --cache N: idemq's dedup.cache */
static bool retention;    /* --retention: idemq with the dedup window expiring, and without */
static int instance_counts[MAX_WINDOWS]; /* --instances A,B,…: idemq processes on one queue */
static int instance_rows;
static int shapes;
static db_dsn dsn;
static bench_workload workload;

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

static long long scalar(MYSQL *db, const char *sql)
{
    bench_sql(db, sql);
    MYSQL_RES *res = mysql_store_result(db);
    long long v = atoll(mysql_fetch_row(res)[0]);
    mysql_free_result(res);
    return v;
}

/* --------------------------------------------------------------------------------------- cpu */

/* Where the cores went during a measured run: CPU seconds of the broker, the database server
 * (their pids from scripts/bench: IDEMQ_BENCH_BROKER_PID, IDEMQ_BENCH_DB_PID; 0 unknown) and
 * idemq, and the run's wall time. */
typedef struct cpu_use {
    double broker, db, idemq, wall;
} cpu_use;
static pid_t broker_pid, db_pid;
static cpu_use cpu_batched, cpu_emit, cpu_emit_deleting; /* the last run of each */
/* The shared ceiling's last run; its "idemq" is the bench itself, the consumer there. */
static cpu_use cpu_shared;

/* User + system CPU seconds of pid so far, every thread included (0 when unreadable). */
static double cpu_seconds(pid_t pid)
{
    char path[64], line[1024];
    if (pid <= 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    char *after = got ? strrchr(line, ')') : NULL; /* the command may hold spaces */
    unsigned long utime = 0, stime = 0;
    if (!after || sscanf(after + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                         &stime) != 2)
        return 0;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static cpu_use cpu_now(pid_t idemq)
{
    return (cpu_use){.broker = cpu_seconds(broker_pid),
                     .db = cpu_seconds(db_pid),
                     .idemq = cpu_seconds(idemq),
                     .wall = now_s()};
}

static cpu_use cpu_since(cpu_use before, pid_t idemq)
{
    cpu_use after = cpu_now(idemq);
    return (cpu_use){.broker = after.broker - before.broker,
                     .db = after.db - before.db,
                     .idemq = after.idemq - before.idemq,
                     .wall = after.wall - before.wall};
}

/* ------------------------------------------------------------------------------------ broker */

static amqp_connection_state_t amqp_open(int confirms, unsigned qos)
{
    amqp_connection_state_t conn;
    char err[512];
    broker_open_options o = {
        .url = getenv("IDEMQ_TEST_AMQP_URL"), .confirms = confirms, .prefetch = qos};
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

static void publish(amqp_connection_state_t conn, const char *queue, const bench_event *e,
                    char prefix)
{
    amqp_basic_properties_t persistent_json = {
        ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
    };
    char body[256];
    int n = bench_event_body(e, prefix, body, sizeof body);
    amqp_bytes_t bytes = {.len = (size_t)n, .bytes = body};
    if (amqp_basic_publish(conn, BROKER_CHANNEL, amqp_empty_bytes, amqp_cstring_bytes(queue), 0, 0,
                           &persistent_json, bytes) != AMQP_STATUS_OK)
        die("publish", queue);
}

/* Waits until the broker confirmed every publish up to `published` (one queue: its confirms come
 * in order, often several in one multiple ack). */
static void await_confirms(amqp_connection_state_t conn, uint64_t published, const char *queue)
{
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

/* Publishes the workload with confirms, waiting once per 500 messages. */
static void preload(const char *queue)
{
    amqp_connection_state_t conn = amqp_open(1, 0);
    fresh_queue(conn, queue);
    uint64_t published = 0;
    for (int i = 0; i < workload.count; i++) {
        publish(conn, queue, &workload.events[i], 'b');
        published++;
        if (published % 500 == 0 || i == workload.count - 1)
            await_confirms(conn, published, queue);
    }
    broker_close(conn);
}

static double run_broker_baseline(void)
{
    preload(QUEUE_RAW);
    amqp_connection_state_t conn = amqp_open(0, (unsigned)prefetch);
    double start = now_s();
    amqp_basic_consume(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), amqp_empty_bytes, 0, 0,
                       0, amqp_empty_table);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        die("consume", QUEUE_RAW);
    for (int i = 0; i < workload.count; i++) {
        amqp_envelope_t env;
        amqp_maybe_release_buffers(conn);
        if (amqp_consume_message(conn, &env, NULL, 0).reply_type != AMQP_RESPONSE_NORMAL)
            die("consume_message", QUEUE_RAW);
        amqp_basic_ack(conn, BROKER_CHANNEL, env.delivery_tag, 0);
        amqp_destroy_envelope(&env);
    }
    double rate = workload.count / (now_s() - start);
    amqp_queue_delete(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), 0, 0);
    amqp_get_rpc_reply(conn);
    broker_close(conn);
    return rate;
}

/* The broker's half of the shared ceiling: consumes and acks the preloaded QUEUE_RAW with
 * multiple-acks every `batch` deliveries, as idemq does, on its own thread. */
typedef struct broker_load {
    amqp_connection_state_t conn;
    uv_thread_t thread;
    double seconds;
} broker_load;

static void broker_load_main(void *arg)
{
    broker_load *l = arg;
    double start = now_s();
    amqp_basic_consume(l->conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), amqp_empty_bytes,
                       0, 0, 0, amqp_empty_table);
    if (amqp_get_rpc_reply(l->conn).reply_type != AMQP_RESPONSE_NORMAL)
        die("consume", QUEUE_RAW);
    for (int i = 0; i < workload.count; i++) {
        amqp_envelope_t env;
        amqp_maybe_release_buffers(l->conn);
        if (amqp_consume_message(l->conn, &env, NULL, 0).reply_type != AMQP_RESPONSE_NORMAL)
            die("consume_message", QUEUE_RAW);
        if ((i + 1) % batch == 0 || i == workload.count - 1)
            amqp_basic_ack(l->conn, BROKER_CHANNEL, env.delivery_tag, 1);
        amqp_destroy_envelope(&env);
    }
    l->seconds = now_s() - start;
}

static void start_broker_load(void *arg)
{
    broker_load *l = arg;
    uv_thread_create(&l->thread, broker_load_main, l);
}

static cpu_use cpu_broker_batched; /* the last run_broker_batched_acks */

/* The broker alone with acks as idemq sends them (multiple, every `batch` deliveries): the
 * bound for a flood whose copies never reach the database. */
static double run_broker_batched_acks(void)
{
    preload(QUEUE_RAW);
    broker_load load = {.conn = amqp_open(0, (unsigned)prefetch)};
    cpu_use before = cpu_now(getpid());
    broker_load_main(&load);
    cpu_broker_batched = cpu_since(before, getpid());
    amqp_queue_delete(load.conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), 0, 0);
    amqp_get_rpc_reply(load.conn);
    broker_close(load.conn);
    return workload.count / load.seconds;
}

/* The broker's half of "one emit each", without idemq or a database: the workload published
 * persistent with confirms to QUEUE_EMITTED in rounds of OUTBOX_ROUND (the relay's default
 * outbox.batch), while, with `consuming`, a second connection consumes and acks the preloaded
 * workload as idemq does. `overlap` 0: each round's confirms are awaited before the next round
 * is published (as the relay does); 1: the next round is published first, so one round's
 * confirms are always outstanding (what a relay that overlaps its rounds could reach). */
static double run_broker_confirms(bool consuming, bool overlap)
{
    enum { OUTBOX_ROUND = 2048 };
    broker_load load = {0};
    if (consuming) {
        preload(QUEUE_RAW);
        load.conn = amqp_open(0, (unsigned)prefetch);
    }
    amqp_connection_state_t conn = amqp_open(1, 0);
    fresh_queue(conn, QUEUE_EMITTED);
    double start = now_s();
    if (consuming)
        start_broker_load(&load);
    uint64_t published = 0;
    for (int i = 0; i < workload.count; i++) {
        publish(conn, QUEUE_EMITTED, &workload.events[i], 'e');
        published++;
        if (published % OUTBOX_ROUND != 0 || i == workload.count - 1)
            continue;
        if (!overlap)
            await_confirms(conn, published, QUEUE_EMITTED);
        else if (published > OUTBOX_ROUND)
            await_confirms(conn, published - OUTBOX_ROUND, QUEUE_EMITTED);
    }
    await_confirms(conn, published, QUEUE_EMITTED);
    if (consuming)
        uv_thread_join(&load.thread);
    double elapsed = now_s() - start;
    amqp_queue_delete(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_EMITTED), 0, 0);
    amqp_get_rpc_reply(conn);
    broker_close(conn);
    if (consuming) {
        amqp_queue_delete(load.conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), 0, 0);
        amqp_get_rpc_reply(load.conn);
        broker_close(load.conn);
    }
    return workload.count / elapsed;
}

/* What any consumer of this workload could reach here without idemq's own work: idemq's exact
 * batched statements while the broker delivers and takes acks for as many messages at the same
 * time, on the same cores. The database ceiling alone leaves the broker out, yet at these rates
 * the broker's share of the two cores is the size of the database's. */
static double run_shared_ceiling(bench_shape shape)
{
    bench_db_reset(&dsn, &workload);
    preload(QUEUE_RAW);
    broker_load load = {.conn = amqp_open(0, (unsigned)prefetch)};
    cpu_use before = cpu_now(getpid());
    double start = now_s();
    double db_rate = bench_db_run_reset(&dsn, &workload, shape, workers, batch,
                                        start_broker_load, &load);
    uv_thread_join(&load.thread);
    (void)db_rate; /* both halves must finish: the slower one sets the rate */
    double elapsed = now_s() - start;
    cpu_shared = cpu_since(before, getpid());
    amqp_queue_delete(load.conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), 0, 0);
    amqp_get_rpc_reply(load.conn);
    broker_close(load.conn);
    return workload.count / elapsed;
}

/* The coupled ceiling: the shared ceiling's statements and consumer, but coupled as any
 * consumer that acks after its commits is: a database thread takes a batch only once its
 * messages were delivered, and the consumer acks (multiple, the contiguous prefix) only what
 * was committed. What is left between it and idemq is idemq's own cost, not the coupling's. */
typedef struct coupled_load {
    amqp_connection_state_t conn; /* the consumer thread's */
    uv_mutex_t lock;
    uv_cond_t delivered_cond;
    int delivered;          /* events received, in order (one queue, one consumer) */
    uint64_t *tags;         /* per event: its delivery tag */
    unsigned char *applied; /* per event: committed */
    int committed_upto;     /* events [0, committed_upto) committed */
    int commit_fd;          /* eventfd: committed_upto moved */
} coupled_load;

static void coupled_wait_delivered(void *arg, int end)
{
    coupled_load *l = arg;
    uv_mutex_lock(&l->lock);
    while (l->delivered < end)
        uv_cond_wait(&l->delivered_cond, &l->lock);
    uv_mutex_unlock(&l->lock);
}

static void coupled_committed(void *arg, int begin, int count)
{
    coupled_load *l = arg;
    uv_mutex_lock(&l->lock);
    memset(l->applied + begin, 1, (size_t)count);
    int before = l->committed_upto;
    while (l->committed_upto < workload.count && l->applied[l->committed_upto])
        l->committed_upto++;
    bool moved = l->committed_upto > before;
    uv_mutex_unlock(&l->lock);
    uint64_t one = 1;
    if (moved && write(l->commit_fd, &one, sizeof one) != sizeof one)
        die("coupled ceiling", "cannot wake the consumer");
}

/* The consumer: receives the workload and acks what the database threads committed, until
 * every event is acked. It sleeps in poll(2) on the socket and on the threads' eventfd, so a
 * commit is acked at once while the prefetch window is full and nothing arrives
 * (amqp_consume_message's own timeout returned at once here, spinning). */
static void coupled_consumer_main(void *arg)
{
    coupled_load *l = arg;
    amqp_basic_consume(l->conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), amqp_empty_bytes, 0,
                       0, 0, amqp_empty_table);
    if (amqp_get_rpc_reply(l->conn).reply_type != AMQP_RESPONSE_NORMAL)
        die("consume", QUEUE_RAW);
    int received = 0, acked = 0;
    while (acked < workload.count) {
        bool buffered = amqp_frames_enqueued(l->conn) || amqp_data_in_buffer(l->conn);
        struct pollfd fds[2] = {{.fd = amqp_get_sockfd(l->conn), .events = POLLIN},
                                {.fd = l->commit_fd, .events = POLLIN}};
        /* Once everything is received only commits matter. */
        bool receiving = received < workload.count;
        if (!buffered && poll(receiving ? fds : fds + 1, receiving ? 2 : 1, -1) < 0 &&
            errno != EINTR)
            die("poll", strerror(errno));
        if (fds[1].revents & POLLIN) {
            uint64_t count;
            ssize_t ignored = read(l->commit_fd, &count, sizeof count);
            (void)ignored;
        }
        if (receiving && (buffered || (fds[0].revents & POLLIN))) {
            amqp_envelope_t env;
            amqp_maybe_release_buffers(l->conn);
            if (amqp_consume_message(l->conn, &env, NULL, 0).reply_type != AMQP_RESPONSE_NORMAL)
                die("consume_message", QUEUE_RAW);
            l->tags[received++] = env.delivery_tag;
            amqp_destroy_envelope(&env);
            /* The threads wait for whole batches (the cursor moves by batch): a wake-up per
             * delivery would only make them check again. */
            if (received % batch == 0 || received == workload.count) {
                uv_mutex_lock(&l->lock);
                l->delivered = received;
                uv_cond_broadcast(&l->delivered_cond);
                uv_mutex_unlock(&l->lock);
            }
        }
        uv_mutex_lock(&l->lock);
        int upto = l->committed_upto;
        uv_mutex_unlock(&l->lock);
        if (upto > acked) {
            amqp_basic_ack(l->conn, BROKER_CHANNEL, l->tags[upto - 1], 1);
            acked = upto;
        }
    }
}

static cpu_use cpu_coupled;

static double run_coupled_ceiling(bench_shape shape)
{
    bench_db_reset(&dsn, &workload);
    preload(QUEUE_RAW);
    coupled_load load = {.conn = amqp_open(0, (unsigned)prefetch)};
    load.tags = calloc((size_t)workload.count, sizeof *load.tags);
    load.applied = calloc((size_t)workload.count, 1);
    if (!load.tags || !load.applied)
        die("coupled ceiling", "out of memory");
    load.commit_fd = eventfd(0, EFD_CLOEXEC);
    if (load.commit_fd < 0)
        die("coupled ceiling", "eventfd failed");
    uv_mutex_init(&load.lock);
    uv_cond_init(&load.delivered_cond);
    bench_db_follow follow = {coupled_wait_delivered, coupled_committed, &load};
    cpu_use before = cpu_now(getpid());
    double start = now_s();
    uv_thread_t consumer;
    uv_thread_create(&consumer, coupled_consumer_main, &load);
    bench_db_run_following(&dsn, &workload, shape, workers, batch, &follow);
    uv_thread_join(&consumer);
    double elapsed = now_s() - start;
    cpu_coupled = cpu_since(before, getpid());
    amqp_queue_delete(load.conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RAW), 0, 0);
    amqp_get_rpc_reply(load.conn);
    broker_close(load.conn);
    uv_cond_destroy(&load.delivered_cond);
    uv_mutex_destroy(&load.lock);
    close(load.commit_fd);
    free(load.tags);
    free(load.applied);
    return workload.count / elapsed;
}

/* ------------------------------------------------------------------------------------- idemq */

static char config_path[64];
static int http_port; /* the /metrics port of the idemq that write_config writes for */

/* How many idemq processes run_idemq starts on the one queue (--instances), and each one's
 * /metrics port and config file. */
#define MAX_INSTANCES 8
static int instance_count = 1;
static int instance_ports[MAX_INSTANCES];
static char instance_configs[MAX_INSTANCES][64];

/* A port free now on 127.0.0.1 (the kernel's pick; a bench, not a test, can take the race). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        die("port", "no free port");
    close(fd);
    return ntohs(a.sin_port);
}

/* The /metrics text of the idemq listening on port (owned, NUL-terminated); NULL while it does
 * not answer. */
static char *scrape(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    static const char request[] = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, request, sizeof request - 1) != (ssize_t)(sizeof request - 1)) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, used = 0;
    char *body = malloc(cap);
    ssize_t n;
    while (body && (n = read(fd, body + used, cap - used - 1)) > 0) {
        used += (size_t)n;
        if (used + 1 == cap)
            body = realloc(body, cap *= 2);
    }
    close(fd);
    if (!body)
        die("metrics", "out of memory");
    body[used] = '\0';
    return body;
}

/* The messages the idemq on port has settled for good (idemq_messages_total over its final
 * outcomes: a retried or requeued message is counted again when it comes back), and the outbox
 * rows it published (each marked or deleted once its confirm came); -1 while it does not
 * answer. */
typedef struct settled_counts {
    long long messages, published;
} settled_counts;

static settled_counts settled_of(int port)
{
    settled_counts c = {-1, -1};
    char *body = scrape(port);
    if (!body)
        return c;
    c.messages = c.published = 0;
    static const char sample[] = "\nidemq_messages_total{";
    for (char *p = strstr(body, sample); p; p = strstr(p + 1, sample)) {
        char *value = strchr(p, '}');
        char *outcome = strstr(p, "outcome=\"");
        if (!value || (outcome && outcome < value &&
                       (strncmp(outcome + 9, "retried\"", 8) == 0 ||
                        strncmp(outcome + 9, "requeued\"", 9) == 0)))
            continue;
        c.messages += strtoll(value + 1, NULL, 10);
    }
    static const char published[] = "\nidemq_outbox_published_total ";
    char *p = strstr(body, published);
    if (p)
        c.published = strtoll(p + sizeof published - 1, NULL, 10);
    free(body);
    return c;
}

/* The sum of settled_of over the instances of the run; -1s while one does not answer. */
static settled_counts settled_count(void)
{
    settled_counts total = {0, 0};
    for (int k = 0; k < instance_count; k++) {
        settled_counts c = settled_of(instance_ports[k]);
        if (c.messages < 0)
            return c;
        total.messages += c.messages;
        total.published += c.published;
    }
    return total;
}

/* Waits until the run's idemq processes have settled `settled` messages and published
 * `published` outbox rows. Read from their /metrics every 5 ms rather than from the database:
 * a COUNT(*) over the rows a run wrote, every 5 ms, was the database's work during idemq's runs
 * and not during the ceilings'. */
static void wait_settled(long long settled, long long published, double deadline_s)
{
    double start = now_s();
    for (;;) {
        settled_counts c = settled_count();
        if (c.messages >= settled && c.published >= published)
            return;
        struct timespec pause = {.tv_nsec = 5 * 1000000};
        nanosleep(&pause, NULL);
        if (now_s() - start > deadline_s)
            die("idemq", "did not settle every message in time");
    }
}

/* emit: one downstream message per applied event, relayed to QUEUE_EMITTED. */
static const char emit_yaml[] =
    "        PAY_SUCCESS:\n          from: [PAYING]\n          to: PAID\n"
    "          emit: {name: order-paid, routing_key: " QUEUE_EMITTED ", fields: {order_id: "
    "order_id, amount: amount, event_type: {value: ORDER_PAID}}}\n";

/* --retention: what the run's config adds to its dedup section, the file its idemq logs to at
 * info (the retention and rotation report there), and the database and queue of its own; "",
 * NULL and the bench's otherwise. */
static const char *dedup_options = "";
static const char *run_log;
static const char *idemq_database = BENCH_DATABASE, *idemq_queue = QUEUE_IDEMQ;

/* The emit run's outbox section: "" (the default retention, published rows kept an hour), or
 * OUTBOX_DELETING. */
#define OUTBOX_DELETING "outbox: {retention: 0}\n"
static const char *outbox_options = "";

static void write_config(int run_batch, bool emit)
{
    snprintf(config_path, sizeof config_path, "/tmp/idemq-bench-XXXXXX");
    int fd = mkstemp(config_path);
    FILE *f = fdopen(fd, "w");
    char url[2400], linger[64] = "";
    snprintf(url, sizeof url, "mysql://%s%s%s@%s:%u/%s%s%s", dsn.user, dsn.password[0] ? ":" : "",
             dsn.password, dsn.host, dsn.port, idemq_database, dsn.socket[0] ? "?socket=" : "",
             dsn.socket);
    if (linger_ms >= 0)
        snprintf(linger, sizeof linger, ", batch_linger_ms: %d", linger_ms);
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", http_port);
    fprintf(f,
            "amqp: {url: \"%s\", prefetch: %d}\nmysql: {url: \"%s\", workers: %d, batch: %d%s}\n"
            "log: {level: %s}\nhttp: {listen: \"%s\"}\ndedup: {cache: %d%s}\n"
            "consumers:\n  - queue: %s\n    handler_name: pay-callback\n"
            "    handler:\n      type: state_machine\n      table: orders\n"
            "      key_column: order_id\n      key_field: order_id\n      state_column: status\n"
            "      event_field: event_type\n      transitions:\n%s"
            "      set: {amount: amount}\n",
            getenv("IDEMQ_TEST_AMQP_URL"), prefetch, url, workers, run_batch, linger,
            run_log                     ? "info"
            : getenv("IDEMQ_BENCH_LOG") ? "debug"
                                        : "warn",
            listen, dedup_cache, dedup_options, idemq_queue,
            emit ? emit_yaml : "        PAY_SUCCESS: {from: [PAYING], to: PAID}\n");
    if (emit)
        fputs(outbox_options, f);
    fclose(f);
}

/* `idemq <command> -c config_path` (run, migrate), its output to the log. */
static pid_t spawn_idemq_command(const char *command)
{
    pid_t pid = fork();
    if (pid == 0) {
        /* IDEMQ_BENCH_LOG=FILE: idemq's debug log (each batch's size, …) appended to FILE. */
        const char *log = run_log ? run_log : getenv("IDEMQ_BENCH_LOG");
        if (!freopen(log ? log : "/dev/null", log ? "a" : "w", stderr) ||
            (run_log && !freopen(run_log, "a", stdout)))
            _exit(126);
        execl(IDEMQ_BENCH_BINARY, IDEMQ_BENCH_BINARY, command, "-c", config_path, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static pid_t spawn_idemq(void)
{
    return spawn_idemq_command("run");
}

/* Writes a config for each of the run's instance_count idemq processes: the same but for its
 * /metrics port. */
static void write_instance_configs(int run_batch, bool emit)
{
    for (int k = 0; k < instance_count; k++) {
        instance_ports[k] = http_port = free_port();
        write_config(run_batch, emit);
        snprintf(instance_configs[k], sizeof instance_configs[k], "%s", config_path);
    }
}

static void spawn_instances(pid_t *pids)
{
    for (int k = 0; k < instance_count; k++) {
        snprintf(config_path, sizeof config_path, "%s", instance_configs[k]);
        pids[k] = spawn_idemq();
    }
}

static void stop_instances(const pid_t *pids)
{
    for (int k = 0; k < instance_count; k++) {
        kill(pids[k], SIGTERM);
        waitpid(pids[k], NULL, 0);
        unlink(instance_configs[k]);
    }
}

/* Peak resident set of pid (VmHWM), in MiB. */
static double peak_rss_mib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0)
            kib = atof(line + 6);
    if (f)
        fclose(f);
    return kib / 1024;
}

/* consumer: what u.idemq measured (idemq, or the bench's own client for a ceiling). */
static void print_cpu(const char *what, const char *consumer, cpu_use u)
{
    double per = 1e6 / workload.count; /* seconds of the run → µs per message */
    printf("         %-26s broker %5.1f, database %5.1f, %s %5.1f µs; together %5.1f of the "
           "%5.1f the cores had (%ld × wall)\n",
           what, u.broker * per, u.db * per, consumer, u.idemq * per,
           (u.broker + u.db + u.idemq) * per, u.wall * per * (double)sysconf(_SC_NPROCESSORS_ONLN),
           sysconf(_SC_NPROCESSORS_ONLN));
}

static void wait_rows(MYSQL *db, const char *sql, long long expected, double deadline_s)
{
    double start = now_s();
    while (scalar(db, sql) < expected) {
        struct timespec pause = {.tv_nsec = 5 * 1000000};
        nanosleep(&pause, NULL);
        if (now_s() - start > deadline_s)
            die("idemq", "did not finish in time");
    }
}

/* What the run left in the tables is what its /metrics said: sql on db gives expected. */
static void expect_rows(MYSQL *db, const char *sql, long long expected, const char *what)
{
    long long got = scalar(db, sql);
    if (got != expected) {
        fprintf(stderr, "bench: %s: %lld, expected %lld (%s)\n", what, got, expected, sql);
        exit(1);
    }
}

/* ----------------------------------------------------------------------------------- latency */

typedef struct latency_run {
    char prefix;
    int count;
    double rate;
    int sample_every;
    double *published;  /* per event: when it was published (0: not yet / not sampled) */
    double *latency_ms; /* per sampled event: publish to visible commit */
    atomic_int published_count;
    int samples;
} latency_run;

static void publisher_main(void *arg)
{
    latency_run *lr = arg;
    amqp_connection_state_t conn = amqp_open(0, 0);
    double start = now_s();
    for (int i = 0; i < lr->count; i++) {
        double due = start + i / lr->rate, ahead = due - now_s();
        if (ahead > 0.0002) {
            struct timespec pause = {.tv_sec = (time_t)ahead,
                                     .tv_nsec = (long)((ahead - (time_t)ahead) * 1e9)};
            nanosleep(&pause, NULL);
        }
        const bench_event *e = &workload.events[i % workload.count];
        bool sampled = e->copy == 0 && e->order % lr->sample_every == 0;
        if (sampled)
            lr->published[e->order] = now_s();
        publish(conn, QUEUE_IDEMQ, e, lr->prefix);
        atomic_store(&lr->published_count, i + 1);
        if (i % 256 == 0)
            amqp_maybe_release_buffers(conn);
    }
    /* Without confirms the broker may still hold unread publishes in its socket when the close
     * gives up (broker_close waits 2 s a step, and a flow-controlled broker on a slow day takes
     * longer), and those are lost: 139 of a live run were once. A passive declare's reply comes
     * only after the channel took every publish sent before it. */
    amqp_queue_declare(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_IDEMQ), 1, 0, 0, 0,
                       amqp_empty_table);
    if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL)
        die("publish", QUEUE_IDEMQ);
    broker_close(conn);
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Publishes lr->count events at lr->rate while polling their dedup rows; fills latency_ms. */
static void measure_latency(latency_run *lr)
{
    int orders = 0;
    for (int i = 0; i < lr->count; i++)
        if (workload.events[i % workload.count].order >= orders)
            orders = workload.events[i % workload.count].order + 1;
    lr->published = calloc((size_t)orders, sizeof *lr->published);
    lr->latency_ms = calloc((size_t)orders, sizeof *lr->latency_ms);
    unsigned char *seen = calloc((size_t)orders, 1);
    MYSQL *db = bench_db_connect(&dsn, BENCH_DATABASE);
    mysql_autocommit(db, 1);
    atomic_init(&lr->published_count, 0);
    uv_thread_t publisher;
    uv_thread_create(&publisher, publisher_main, lr);
    int expected = 0, pending[256], pending_count = 0, next = 0;
    for (int o = 0; o < orders; o += lr->sample_every)
        expected++;
    size_t cap = 256 * 48 + 128;
    char *sql = malloc(cap);
    double deadline = now_s() + lr->count / lr->rate + 120;
    while (lr->samples < expected) {
        if (now_s() > deadline)
            die("latency", "sampled messages were not committed within 120 s");
        /* Sampled orders whose event was published and not yet seen, oldest first. */
        while (pending_count < 256 && next < orders && lr->published[next] > 0) {
            pending[pending_count++] = next;
            next += lr->sample_every;
        }
        if (pending_count > 0) {
            size_t n =
                (size_t)snprintf(sql, cap, "SELECT biz_key FROM msg_dedup WHERE biz_key IN (");
            for (int i = 0; i < pending_count; i++)
                n += (size_t)snprintf(sql + n, cap - n, "%s'order_id:%c%d:PAY_SUCCESS'",
                                      i ? "," : "", lr->prefix, pending[i]);
            snprintf(sql + n, cap - n, ")");
            bench_sql(db, sql);
            double at = now_s();
            MYSQL_RES *res = mysql_store_result(db);
            MYSQL_ROW row;
            while ((row = mysql_fetch_row(res))) {
                int order = atoi(row[0] + strlen("order_id:") + 1);
                if (order >= 0 && order < orders && !seen[order]) {
                    seen[order] = 1;
                    lr->latency_ms[lr->samples++] = (at - lr->published[order]) * 1000;
                }
            }
            mysql_free_result(res);
            int kept = 0;
            for (int i = 0; i < pending_count; i++)
                if (!seen[pending[i]])
                    pending[kept++] = pending[i];
            pending_count = kept;
        }
        struct timespec pause = {.tv_nsec = 1000000};
        nanosleep(&pause, NULL);
    }
    uv_thread_join(&publisher);
    qsort(lr->latency_ms, (size_t)lr->samples, sizeof *lr->latency_ms, compare);
    free(sql);
    free(seen);
    mysql_close(db);
}

static double percentile(const latency_run *lr, double p)
{
    int i = (int)(p * (lr->samples - 1) + 0.5);
    return lr->samples ? lr->latency_ms[i] : 0;
}

typedef struct idemq_result {
    double rate, rss_mib;
    double live_rate; /* committed while a publisher sends as fast as it can */
    latency_run light, heavy;
} idemq_result;

/* The rate idemq sustains while the workload (prefix 'm') is published to it as fast as the
 * publisher can: what "the maximum rate" means for a live queue, with the publisher's load on
 * the broker and the cores included. */
static double live_rate(MYSQL *db)
{
    latency_run lr = {.prefix = 'm', .count = workload.count, .rate = 1e9, .sample_every = 1};
    lr.published = calloc((size_t)workload.orders, sizeof *lr.published);
    atomic_init(&lr.published_count, 0);
    settled_counts before = settled_count();
    uv_thread_t publisher;
    double start = now_s();
    uv_thread_create(&publisher, publisher_main, &lr);
    wait_settled(before.messages + workload.count, 0, 600);
    double rate = workload.count / (now_s() - start);
    expect_rows(db, "SELECT COUNT(*) FROM orders WHERE order_id LIKE 'm%' AND status = 'PAID'",
                workload.orders, "live orders paid once settled");
    uv_thread_join(&publisher);
    free(lr.published);
    return rate;
}

/* idemq at run_batch: drains the preloaded workload; with latency, then the two paced runs. */
/* The rate of idemq with one emit per applied event, until every downstream message is
 * confirmed by the broker and marked published (the relay's whole path); with deleting,
 * outbox.retention 0: until every row is deleted at its confirm instead. */
static double emit_committed_rate; /* of the last run_idemq_emitting: every event committed */

static double run_idemq_emitting(int run_batch, bool deleting)
{
    bench_db_reset(&dsn, &workload);
    MYSQL *db = bench_db_connect(&dsn, BENCH_DATABASE);
    mysql_autocommit(db, 1);
    amqp_connection_state_t conn = amqp_open(0, 0);
    fresh_queue(conn, QUEUE_EMITTED);
    preload(QUEUE_IDEMQ);
    outbox_options = deleting ? OUTBOX_DELETING : "";
    write_instance_configs(run_batch, true);
    outbox_options = "";
    cpu_use before = cpu_now(0);
    double start = now_s();
    pid_t pid[MAX_INSTANCES];
    spawn_instances(pid);
    wait_settled(workload.count, 0, 600);
    if (!deleting)
        emit_committed_rate = workload.count / (now_s() - start);
    wait_settled(workload.count, workload.orders, 600);
    double rate = workload.count / (now_s() - start);
    *(deleting ? &cpu_emit_deleting : &cpu_emit) = cpu_since(before, pid[0]);
    stop_instances(pid);
    /* What /metrics counted is in the tables: every row relayed (deleted at its confirm, or
     * marked published). */
    expect_rows(db,
                deleting ? "SELECT COUNT(*) FROM idemq_outbox"
                         : "SELECT COUNT(*) FROM idemq_outbox WHERE state <> 1",
                0, "outbox rows not relayed once /metrics counted them all");
    expect_rows(db, bench_dedup_count_sql(), workload.orders, "dedup rows once settled");
    amqp_queue_delete(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_EMITTED), 0, 0);
    amqp_get_rpc_reply(conn);
    broker_close(conn);
    mysql_close(db);
    return rate;
}

static idemq_result run_idemq(int run_batch, bool latency)
{
    idemq_result r = {0};
    bench_db_reset(&dsn, &workload);
    MYSQL *db = bench_db_connect(&dsn, BENCH_DATABASE);
    mysql_autocommit(db, 1);
    int heavy_count = 0;
    if (latency) {
        bench_insert_orders(db, 'l', LIGHT_MESSAGES);
        bench_insert_orders(db, 'm', workload.orders);
        bench_insert_orders(db, 'h', workload.orders);
    }
    preload(QUEUE_IDEMQ);
    write_instance_configs(run_batch, false);
    cpu_use before = cpu_now(0);
    double start = now_s();
    pid_t pids[MAX_INSTANCES];
    spawn_instances(pids);
    wait_settled(workload.count, 0, 600);
    r.rate = workload.count / (now_s() - start);
    pid_t pid = pids[0];
    if (run_batch == batch && instance_count == 1)
        cpu_batched = cpu_since(before, pid);
    r.rss_mib = peak_rss_mib(pid);
    /* Every message settled: its dedup row is committed (idemq acks after the COMMIT). */
    expect_rows(db, bench_dedup_count_sql(), workload.orders, "dedup rows once settled");
    for (int k = 1; k < instance_count; k++) {
        kill(pids[k], SIGTERM);
        waitpid(pids[k], NULL, 0);
        unlink(instance_configs[k]);
    }
    if (latency) {
        r.light = (latency_run){
            .prefix = 'l', .count = LIGHT_MESSAGES, .rate = LIGHT_RATE, .sample_every = 1};
        measure_latency(&r.light);
        r.live_rate = live_rate(db);
        double rate = 0.9 * r.live_rate;
        heavy_count = (int)(rate * HEAVY_SECONDS);
        if (heavy_count > workload.count)
            heavy_count = workload.count;
        r.heavy =
            (latency_run){.prefix = 'h', .count = heavy_count, .rate = rate, .sample_every = 10};
        measure_latency(&r.heavy);
        double peak = peak_rss_mib(pid);
        if (peak > r.rss_mib)
            r.rss_mib = peak;
    }
    long long paid = scalar(db, "SELECT COUNT(*) FROM orders WHERE status = 'PAID'");
    long long expected = latency ? 2 * workload.orders : workload.orders;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(instance_configs[0]);
    if (paid < expected)
        die("idemq", "fewer orders paid than events sent");
    mysql_close(db);
    return r;
}

/* ------------------------------------------------------------------------------------- main */


static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static char server_name[128]; /* "MySQL 9.7.4" or "MariaDB 10.11.19-MariaDB-0+deb12u1" */

static int server_has_returning(void)
{
    MYSQL *db = bench_db_connect(&dsn, NULL);
    const char *info = mysql_get_server_info(db);
    snprintf(server_name, sizeof server_name, "%s %s",
             info && strstr(info, "MariaDB") ? "MariaDB" : "MySQL", info ? info : "?");
    int yes = mysql_get_server_version(db) >= 100500 && info && strstr(info, "MariaDB") &&
              !getenv("IDEMQ_TEST_NO_RETURNING");
    mysql_close(db);
    return yes;
}

/* --dedup-rows A,B,…: the batched database ceiling and idemq at the batch, each `runs` times,
 * at every window size in turn (the window grows between them), as ratios to the first size. */
static int run_windows(bench_shape batched)
{
    printf("bench_throughput: %d payment events (%d orders, %d duplicates), %d DB workers, "
           "prefetch %d, mysql.batch %d, %s, %ld cores; msg_dedup grows between the rows\n",
           workload.count, workload.orders, workload.count - workload.orders, workers, prefetch,
           batch, server_name, sysconf(_SC_NPROCESSORS_ONLN));
    printf("window   %12s   %-28s %-28s\n", "msg_dedup", "db batched ceiling",
           "idemq mysql.batch");
    fflush(stdout);
    double first_db = 0, first_idemq = 0;
    for (int w = 0; w < window_count; w++) {
        bench_db_preload_window(&dsn, windows[w]);
        double db[50], idemq[50];
        for (int r = 0; r < runs; r++) {
            db[r] = bench_db_run(&dsn, &workload, batched, workers, batch);
            idemq[r] = run_idemq(batch, false).rate;
        }
        double d = median(db, runs), i = median(idemq, runs);
        if (w == 0)
            first_db = d, first_idemq = i;
        /* What decides it: whether the unique index's pages stay in the buffer pool. */
        MYSQL *admin = bench_db_connect(&dsn, BENCH_DATABASE);
        /* Fresh statistics: MySQL caches information_schema's sizes for a day by default. */
        if (mysql_query(admin, "SET SESSION information_schema_stats_expiry = 0") != 0)
            mysql_errno(admin); /* MariaDB has no such variable and keeps no such cache */
        bench_sql(admin, "ANALYZE TABLE msg_dedup");
        mysql_free_result(mysql_store_result(admin));
        double pool_mib = scalar(admin, "SELECT @@innodb_buffer_pool_size") / 1048576.0;
        double table_mib = scalar(admin, "SELECT DATA_LENGTH + INDEX_LENGTH FROM "
                                         "information_schema.TABLES WHERE TABLE_SCHEMA = "
                                         "DATABASE() AND TABLE_NAME = 'msg_dedup'") /
                           1048576.0;
        mysql_close(admin);
        printf("window   %12lld   %7.0f msg/s  %.2f × first   %7.0f msg/s  %.2f × first%s   "
               "msg_dedup ~%.0f MiB, buffer pool %.0f MiB\n",
               windows[w], d, d / first_db, i, i / first_idemq, runs > 1 ? "  (medians)" : "",
               table_mib, pool_mib);
        fflush(stdout);
    }
    fprintf(stderr, "bench: %s keeps its %lld-row dedup window (DROP DATABASE %s frees it)\n",
            BENCH_DATABASE, windows[window_count - 1], BENCH_DATABASE);
    bench_workload_free(&workload);
    mysql_library_end();
    return 0;
}

/* --flood P: idemq at the batch on the same number of messages, all distinct, then with P%
 * duplicates twice: a storm (each copy within ~200 messages of its original, so copies of one
 * key are in flight together) and a resend (copies spread over the whole stream, as a producer
 * resending after an incident sends them: most arrive after their original committed); and the
 * raw broker, acking each delivery and acking as idemq does (the flood's bound). `runs` times
 * each, interleaved. */
static int run_flood(void)
{
    bench_workload distinct, storm, resend;
    bench_workload_free(&workload);
    bench_workload_init_duplicates(&distinct, messages, 0, 200);
    bench_workload_init_duplicates(&storm, messages, flood_percent, 200);
    bench_workload_init_duplicates(&resend, messages, flood_percent, messages);
    printf("bench_throughput: %d messages, all distinct and %d%% duplicates (%d orders), %d DB "
           "workers, prefetch %d, mysql.batch %d, dedup.cache %d, %s, %ld cores\n",
           messages, flood_percent, storm.orders, workers, prefetch, batch, dedup_cache,
           server_name, sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    double broker[50], broker_batched[50], all_distinct[50], stormed[50], resent[50];
    cpu_use cpu_distinct = {0}, cpu_storm = {0}, cpu_resend = {0}; /* the last run of each */
    for (int r = 0; r < runs; r++) {
        workload = distinct;
        broker[r] = run_broker_baseline();
        broker_batched[r] = run_broker_batched_acks();
        all_distinct[r] = run_idemq(batch, false).rate;
        cpu_distinct = cpu_batched;
        workload = storm;
        stormed[r] = run_idemq(batch, false).rate;
        cpu_storm = cpu_batched;
        workload = resend;
        resent[r] = run_idemq(batch, false).rate;
        cpu_resend = cpu_batched;
    }
    double b = median(broker, runs), bb = median(broker_batched, runs),
           d = median(all_distinct, runs), st = median(stormed, runs), re = median(resent, runs);
    const char *m = runs > 1 ? "median " : "";
    printf("broker   raw consume + ack (prefetch %d)            %s%7.0f msg/s\n", prefetch, m, b);
    printf("broker   raw consume + ack every %-4d               %s%7.0f msg/s   (the bound when "
           "no copy reaches the database: %.2f × all distinct)\n",
           batch, m, bb, bb / d);
    printf("idemq    mysql.batch %-4d, all distinct            %s%7.0f msg/s\n", batch, m, d);
    printf("idemq    mysql.batch %-4d, %2d%% duplicates, storm   %s%7.0f msg/s   = %.2f × all "
           "distinct, %.2f × raw broker (copies within ~200 messages)\n",
           batch, flood_percent, m, st, st / d, st / b);
    printf("idemq    mysql.batch %-4d, %2d%% duplicates, resend  %s%7.0f msg/s   = %.2f × all "
           "distinct, %.2f × raw broker, %.2f × its bound (copies over the whole stream)\n",
           batch, flood_percent, m, re, re / d, re / b, re / bb);
    if (broker_pid && db_pid) {
        /* Where a flood's time goes: what a copy costs each process, beside the bound's. */
        printf(
            "cpu      per message, last run (user + system CPU of each process while it ran):\n");
        char what[64];
        snprintf(what, sizeof what, "broker, ack every %d:", batch);
        print_cpu(what, "bench", cpu_broker_batched);
        print_cpu("all distinct:", "idemq", cpu_distinct);
        print_cpu("storm:", "idemq", cpu_storm);
        print_cpu("resend:", "idemq", cpu_resend);
    }
    workload = distinct;
    bench_workload_free(&storm);
    bench_workload_free(&resend);
    bench_workload_free(&distinct);
    mysql_library_end();
    return 0;
}

/* --instances A,B,…: A, then B, … idemq processes draining one queue, `runs` times each
 * (interleaved), as ratios to the first count. */
static int run_instances(void)
{
    printf("bench_throughput: %d payment events (%d orders, %d duplicates), each instance %d DB "
           "workers, prefetch %d, mysql.batch %d, %s, %ld cores\n",
           workload.count, workload.orders, workload.count - workload.orders, workers, prefetch,
           batch, server_name, sysconf(_SC_NPROCESSORS_ONLN));
    double rates[MAX_WINDOWS][50];
    for (int r = 0; r < runs; r++)
        for (int k = 0; k < instance_rows; k++) {
            instance_count = instance_counts[k];
            rates[k][r] = run_idemq(batch, false).rate;
        }
    double first = 0;
    for (int k = 0; k < instance_rows; k++) {
        double rate = median(rates[k], runs);
        if (k == 0)
            first = rate;
        printf("idemq    %d instance%s on one queue                %s%7.0f msg/s   %.2f × %d\n",
               instance_counts[k], instance_counts[k] > 1 ? "s" : " ", runs > 1 ? "median " : "",
               rate, rate / first, instance_counts[0]);
    }
    instance_count = 1;
    bench_workload_free(&workload);
    mysql_library_end();
    return 0;
}

/* --retention: idemq at the batch while its dedup window expires, against the same run with
 * retention off (the target: >= 0.9 of off). Three configurations, `runs` times each,
 * round-robin (the order turning each repetition, so the machine's noise hits all three):
 *   off       layout single, retention 0: nothing expires (the baseline);
 *   single    rows older than RETENTION_S deleted every second in batches of 1000: from
 *             RETENTION_S into the run on, the sweeper deletes as many rows a second as the run
 *             inserts;
 *   rotating  the two tables rotated every RETENTION_S (checked every second): a rotation every
 *             RETENTION_S..RETENTION_S + 1 s, and from the first one on every key is also looked
 *             up in a non-empty msg_dedup_previous.
 * Each run starts from a fresh database that `idemq migrate` sets up in its layout right before
 * idemq starts, so the first period starts with the measured part. The mode has a database and a
 * queue of its own: another bench run on this machine (they share the others) cannot drop them
 * or consume from them mid-run. The rate is run_idemq's, from
 * spawn until /metrics counts every message settled (the dedup rows cannot tell: they expire).
 * idemq logs at info to a file per run, in all three configurations alike (a line per message
 * too); the retention's "deleted N msg_dedup rows" and the rotation's "rotated the dedup tables"
 * lines are counted from it, with each rotation's rename and drop milliseconds. */
#define RETENTION_S 3
#define RETENTION_DATABASE "idemq_bench_retention"
#define QUEUE_RETENTION "bench.retention"
enum { RETENTION_OFF, RETENTION_SINGLE, RETENTION_ROTATING, RETENTION_CASES };
static const struct {
    const char *name, *dedup, *what;
} retention_cases[RETENTION_CASES] = {
    {"off", ", layout: single, retention: 0", "layout single, retention 0"},
    {"single", ", layout: single, retention: 3s, interval: 1s, batch: 1000",
     "layout single, rows older than 3 s deleted every 1 s, 1000 per batch"},
    {"rotating", ", layout: rotating, retention: 3s, interval: 1s",
     "layout rotating, period 3 s, checked every 1 s"},
};
_Static_assert(RETENTION_S == 3, "retention_cases spells out RETENTION_S");

typedef struct retention_run {
    double rate;
    unsigned long long deleted; /* rows the sweeps logged deleting */
    int sweeps;                 /* sweeps that deleted rows */
    int rotations;
    double rename_ms_max, drop_ms_max;
    long long left, left_previous; /* rows in msg_dedup, msg_dedup_previous at the end */
    int warnings;                  /* warn and error lines but the startup's "under 1h" */
    int deadlocks; /* lines naming a deadlock: a batch run again alone, or a message retried */
} retention_run;

static void read_retention_log(const char *path, retention_run *r)
{
    static const char deleted[] = "dedup retention: deleted ", renamed[] = "took its place (",
                      dropped[] = "the period before was ";
    FILE *f = fopen(path, "r");
    char line[8192], *p;
    while (f && fgets(line, sizeof line, f)) {
        if ((p = strstr(line, deleted))) {
            unsigned long long n = strtoull(p + strlen(deleted), NULL, 10);
            r->deleted += n;
            r->sweeps += n > 0;
        } else if (strstr(line, "dedup rotation: rotated the dedup tables")) {
            r->rotations++;
            double ms;
            if ((p = strstr(line, renamed)) && (ms = atof(p + strlen(renamed))) > r->rename_ms_max)
                r->rename_ms_max = ms;
            if ((p = strstr(line, dropped)) && (p = strchr(p, '(')) &&
                (ms = atof(p + 1)) > r->drop_ms_max)
                r->drop_ms_max = ms;
        }
        r->deadlocks += strstr(line, "Deadlock found") != NULL;
        if ((strstr(line, "\"level\":\"warn\"") || strstr(line, "\"level\":\"error\"")) &&
            !strstr(line, "under 1h"))
            r->warnings++;
    }
    if (f)
        fclose(f);
}

/* A fresh RETENTION_DATABASE with the workload's orders in PAYING (bench_db_reset's orders;
 * `idemq migrate` creates idemq's own tables in the run's layout). */
static void retention_reset_db(void)
{
    MYSQL *db = bench_db_connect(&dsn, NULL);
    bench_sql(db, "DROP DATABASE IF EXISTS " RETENTION_DATABASE);
    bench_sql(db, "CREATE DATABASE " RETENTION_DATABASE);
    bench_sql(db, "USE " RETENTION_DATABASE);
    bench_sql(db, "CREATE TABLE orders (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT "
                  "NULL, amount BIGINT NULL) ENGINE=InnoDB");
    bench_insert_orders(db, 'b', workload.orders);
    mysql_close(db);
}

static retention_run run_retention_case(int c)
{
    retention_run r = {0};
    char log_path[] = "/tmp/idemq-bench-log-XXXXXX";
    int fd = mkstemp(log_path), status;
    if (fd < 0)
        die("log", "mkstemp failed");
    close(fd);
    retention_reset_db();
    preload(QUEUE_RETENTION);
    dedup_options = retention_cases[c].dedup;
    run_log = log_path;
    write_instance_configs(batch, false);
    pid_t pid = spawn_idemq_command("migrate");
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("idemq migrate failed, see", log_path);
    MYSQL *db = bench_db_connect(&dsn, RETENTION_DATABASE);
    mysql_autocommit(db, 1);
    static const char paid_sql[] = "SELECT COUNT(*) FROM orders WHERE status = 'PAID'";
    double start = now_s();
    pid = spawn_idemq();
    wait_settled(workload.count, 0, 600);
    double end = now_s();
    /* /metrics counts a retried message (a deadlock with a rotation's rename) when it is
     * retried as well as when it is applied: the run ends when every order is paid. */
    if (scalar(db, paid_sql) < workload.orders) {
        wait_rows(db, paid_sql, workload.orders, 600);
        end = now_s();
    }
    r.rate = workload.count / (end - start);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(config_path);
    r.left = scalar(db, "SELECT COUNT(*) FROM msg_dedup");
    if (c == RETENTION_ROTATING)
        r.left_previous = scalar(db, "SELECT COUNT(*) FROM msg_dedup_previous");
    mysql_close(db);
    read_retention_log(log_path, &r);
    if (r.warnings)
        fprintf(stderr, "bench: %s: %d warning(s) in %s (kept)\n", retention_cases[c].name,
                r.warnings, log_path);
    else
        unlink(log_path);
    run_log = NULL;
    dedup_options = "";
    return r;
}

static int run_retention(void)
{
    printf("bench_throughput: %d payment events (%d orders, %d duplicates), %d DB workers, "
           "prefetch %d, mysql.batch %d, %s, %ld cores; dedup retention off, single and "
           "rotating, %d s, round-robin; idemq logs at info in all three\n",
           workload.count, workload.orders, workload.count - workload.orders, workers, prefetch,
           batch, server_name, sysconf(_SC_NPROCESSORS_ONLN), RETENTION_S);
    fflush(stdout);
    idemq_database = RETENTION_DATABASE;
    idemq_queue = QUEUE_RETENTION;
    retention_run all[RETENTION_CASES][50];
    for (int r = 0; r < runs; r++) {
        for (int k = 0; k < RETENTION_CASES; k++) {
            int c = (r + k) % RETENTION_CASES;
            all[c][r] = run_retention_case(c);
        }
        retention_run *off = &all[RETENTION_OFF][r], *single = &all[RETENTION_SINGLE][r],
                      *rot = &all[RETENTION_ROTATING][r];
        printf(
            "run %d: off %.0f msg/s, %lld rows left | single %.0f msg/s = %.2f × off, "
            "%llu rows deleted in %d sweeps, %lld left of %d | rotating %.0f msg/s = %.2f × off, "
            "%d rotations (rename <= %.1f ms, drop <= %.1f ms), %lld + %lld previous left; "
            "deadlocks logged: off %d, single %d, rotating %d\n",
            r + 1, off->rate, off->left, single->rate, single->rate / off->rate, single->deleted,
            single->sweeps, single->left, workload.orders, rot->rate, rot->rate / off->rate,
            rot->rotations, rot->rename_ms_max, rot->drop_ms_max, rot->left, rot->left_previous,
            off->deadlocks, single->deadlocks, rot->deadlocks);
        fflush(stdout);
    }
    double rates[RETENTION_CASES][50], base = 0;
    const char *m = runs > 1 ? "median " : "";
    for (int c = 0; c < RETENTION_CASES; c++) {
        for (int r = 0; r < runs; r++)
            rates[c][r] = all[c][r].rate;
        double rate = median(rates[c], runs);
        if (c == RETENTION_OFF)
            base = rate;
        printf("idemq    retention %-8s %s%7.0f msg/s   %.2f × off%s   (%s)\n",
               retention_cases[c].name, m, rate, rate / base,
               c == RETENTION_OFF ? "" : " (target >= 0.9)", retention_cases[c].what);
    }
    MYSQL *admin = bench_db_connect(&dsn, NULL);
    bench_sql(admin, "DROP DATABASE IF EXISTS " RETENTION_DATABASE);
    mysql_close(admin);
    amqp_connection_state_t conn = amqp_open(0, 0);
    amqp_queue_delete(conn, BROKER_CHANNEL, amqp_cstring_bytes(QUEUE_RETENTION), 0, 0);
    amqp_get_rpc_reply(conn);
    broker_close(conn);
    bench_workload_free(&workload);
    mysql_library_end();
    return 0;
}

static void usage(void)
{
    die("usage", "bench_throughput [messages] [runs 1..50] [workers 1..64] [--batch N] "
                 "[--prefetch N] [--linger MS] [--shapes] [--no-emit] [--dedup-rows N[,N…]] "
                 "[--flood PERCENT] [--instances N[,N…]] [--cache N] [--retention]");
}

int main(int argc, char **argv)
{
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-emit"))
            with_emit = false;
        else if (!strcmp(argv[i], "--shapes"))
            shapes = 1;
        else if (!strcmp(argv[i], "--retention"))
            retention = true;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefetch") && i + 1 < argc)
            prefetch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--linger") && i + 1 < argc)
            linger_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--instances") && i + 1 < argc) {
            for (char *p = argv[++i], *end; *p && instance_rows < MAX_WINDOWS; p = end) {
                long k = strtol(p, &end, 10);
                if (end == p || (*end && *end != ',') || k < 1 || k > MAX_INSTANCES)
                    usage();
                instance_counts[instance_rows++] = (int)k;
                end += *end == ',';
            }
        } else if (!strcmp(argv[i], "--cache") && i + 1 < argc)
            dedup_cache = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--flood") && i + 1 < argc)
            flood_percent = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dedup-rows") && i + 1 < argc) {
            for (char *p = argv[++i], *end; *p && window_count < MAX_WINDOWS; p = end) {
                windows[window_count] = strtoll(p, &end, 10);
                if (end == p || (*end && *end != ',') ||
                    (window_count && windows[window_count] < windows[window_count - 1]))
                    usage();
                window_count++;
                end += *end == ',';
            }
            dedup_rows = windows[0];
        }
        else if (argv[i][0] == '-')
            usage();
        else if (positional == 0)
            messages = atoi(argv[i]), positional++;
        else if (positional == 1)
            runs = atoi(argv[i]), positional++;
        else if (positional == 2)
            workers = atoi(argv[i]), positional++;
        else
            usage();
    }
    if (retention) {
        /* Long enough that expiry overlaps most of the measured part (~200k take 8-12 s at
         * batch 32 on 2 cores), and the medians of enough repetitions. */
        if (positional < 1)
            messages = 200000;
        if (positional < 2)
            runs = 5;
    }
    if (messages < 100 || runs < 1 || runs > 50 || workers < 1 || workers > 64 || batch < 1 ||
        batch > CONFIG_MAX_BATCH || prefetch < 1 || prefetch > 65535 ||
        linger_ms > CONFIG_MAX_BATCH_LINGER_MS || dedup_rows < 0 || dedup_rows > 2000000000 ||
        flood_percent < 0 || flood_percent > 95 || dedup_cache < 0 || dedup_cache > 10000000)
        usage();
    if ((long)workers * batch > prefetch)
        die("usage", "workers × batch must not exceed the prefetch (as idemq's config requires)");
    const char *mysql_url = getenv("IDEMQ_TEST_MYSQL_URL");
    if (getenv("IDEMQ_BENCH_BROKER_PID"))
        broker_pid = (pid_t)atoi(getenv("IDEMQ_BENCH_BROKER_PID"));
    if (getenv("IDEMQ_BENCH_DB_PID"))
        db_pid = (pid_t)atoi(getenv("IDEMQ_BENCH_DB_PID"));
    char err[256];
    if (!mysql_url || !getenv("IDEMQ_TEST_AMQP_URL"))
        die("environment", "IDEMQ_TEST_MYSQL_URL / IDEMQ_TEST_AMQP_URL not set (. .state/env)");
    if (db_dsn_parse(mysql_url, &dsn, err, sizeof err) != 0)
        die("mysql url", err);
    mysql_library_init(0, NULL, NULL);
    bench_workload_init(&workload, messages);
    bench_shape batched = server_has_returning() ? BENCH_SHAPE_RETURNING : BENCH_SHAPE_SET_BASED;
    if (window_count > 1)
        return run_windows(batched);
    if (flood_percent > 0)
        return run_flood();
    if (instance_rows > 0)
        return run_instances();
    if (retention)
        return run_retention();
    if (dedup_rows > 0)
        bench_db_preload_window(&dsn, dedup_rows);

    printf("bench_throughput: %d payment events (%d orders, %d duplicates), %d DB workers, "
           "prefetch %d, mysql.batch %d; RabbitMQ, %s and the measured process share this "
           "machine's %ld cores; msg_dedup holds %lld rows of earlier traffic\n",
           workload.count, workload.orders, workload.count - workload.orders, workers, prefetch,
           batch, server_name, sysconf(_SC_NPROCESSORS_ONLN), dedup_rows);
    double broker[50], db_one[50], db_batched[50], idemq_one[50], idemq_batched[50], idemq_emit[50],
        idemq_emit_deleting[50], shared[50], coupled[50], confirms_rounds[50], confirms_overlap[50],
        emit_bound[50];
    idemq_result last = {0};
    double rss_one = 0;
    for (int r = 0; r < runs; r++) {
        broker[r] = run_broker_baseline();
        db_one[r] = bench_db_run(&dsn, &workload, BENCH_SHAPE_PER_MESSAGE, workers, 1);
        db_batched[r] = bench_db_run(&dsn, &workload, batched, workers, batch);
        shared[r] = run_shared_ceiling(batched);
        /* Below one batch of prefetch, its threads would wait for deliveries the unacked window
         * holds back. */
        coupled[r] = prefetch == 0 || prefetch >= batch ? run_coupled_ceiling(batched) : 0;
        idemq_result one = run_idemq(1, false);
        idemq_one[r] = one.rate;
        rss_one = one.rss_mib;
        last = run_idemq(batch, r == runs - 1);
        idemq_batched[r] = last.rate;
        idemq_emit[r] = with_emit ? run_idemq_emitting(batch, false) : 0;
        idemq_emit_deleting[r] = with_emit ? run_idemq_emitting(batch, true) : 0;
        if (with_emit) {
            confirms_rounds[r] = run_broker_confirms(false, false);
            confirms_overlap[r] = run_broker_confirms(false, true);
            emit_bound[r] = run_broker_confirms(true, false);
        }
        if (runs > 1)
            printf("run %d: broker %.0f, db %.0f / %.0f, idemq %.0f / %.0f, one emit each %.0f, "
                   "deleted %.0f msg/s\n",
                   r + 1, broker[r], db_one[r], db_batched[r], idemq_one[r], idemq_batched[r],
                   idemq_emit[r], idemq_emit_deleting[r]);
        fflush(stdout);
    }
    double b = median(broker, runs), d1 = median(db_one, runs), db = median(db_batched, runs),
           i1 = median(idemq_one, runs), ib = median(idemq_batched, runs),
           ie = median(idemq_emit, runs), sh = median(shared, runs), co = median(coupled, runs);
    const char *m = runs > 1 ? "median " : "";
    printf("broker   raw consume + ack (prefetch %d)            %s%7.0f msg/s\n", prefetch, m, b);
    printf("db       one transaction per message               %s%7.0f msg/s   idemq's statements "
           "at mysql.batch 1\n",
           m, d1);
    printf("db       batched, %4d per transaction             %s%7.0f msg/s   idemq's statements "
           "(%s)\n",
           batch, m, db,
           batched == BENCH_SHAPE_RETURNING ? "set-based, INSERT … RETURNING"
                                            : "set-based, one INSERT each");
    printf("shared   batched db + broker consume/ack at once   %s%7.0f msg/s   idemq's batched "
           "statements while the broker carries the same messages: no idemq\n",
           m, sh);
    printf("coupled  the same, acks after the commits          %s%7.0f msg/s   a batch taken once "
           "delivered, acked once committed, as by a consumer that costs nothing\n",
           m, co);
    printf("idemq    mysql.batch 1                             %s%7.0f msg/s   peak RSS %.1f MiB\n",
           m, i1, rss_one);
    printf("idemq    mysql.batch %-4d                          %s%7.0f msg/s   peak RSS %.1f MiB "
           "(prefetch %d)\n",
           batch, m, ib, last.rss_mib, prefetch);
    if (with_emit) {
        double cr = median(confirms_rounds, runs), cov = median(confirms_overlap, runs),
               eb = median(emit_bound, runs);
        printf(
            "idemq    mysql.batch %-4d, one emit each           %s%7.0f msg/s   = %.2f × without; "
            "until every emitted message is confirmed and marked published (committed: "
            "%.0f msg/s, last run)\n",
            batch, m, ie, ie / ib, emit_committed_rate);
        double ied = median(idemq_emit_deleting, runs);
        printf(
            "idemq    mysql.batch %-4d, one emit each, deleted %s%7.0f msg/s   = %.2f × without; "
            "outbox.retention 0: each row deleted at its confirm, not marked and kept\n",
            batch, m, ied, ied / ib);
        printf("broker   publish + confirm, rounds of 2048         %s%7.0f msg/s   each round's "
               "confirms awaited before the next, as the outbox relay publishes\n",
               m, cr);
        printf(
            "broker   publish + confirm, rounds overlapped      %s%7.0f msg/s   = %.2f × rounds; "
            "the next round published before the last one's confirms\n",
            m, cov, cov / cr);
        printf("broker   consume/ack + publish/confirm at once     %s%7.0f msg/s   the emit run's "
               "broker work, no idemq, no database: one emit each / this = %.2f\n",
               m, eb, ie / eb);
    }
    printf("latency  light load, %d msg/s                     p50 %6.1f ms  p99 %6.1f ms   "
           "publish to commit, %d samples\n",
           LIGHT_RATE, percentile(&last.light, 0.5), percentile(&last.light, 0.99),
           last.light.samples);
    printf("idemq    mysql.batch %-4d, live                    %7.0f msg/s   while the workload "
           "is published as fast as one publisher can\n",
           batch, last.live_rate);
    printf("latency  90%% of the live rate, %5.0f msg/s        p50 %6.1f ms  p99 %6.1f ms   "
           "%d samples over %d messages\n",
           last.heavy.rate, percentile(&last.heavy, 0.5), percentile(&last.heavy, 0.99),
           last.heavy.samples, last.heavy.count);
    printf("ratios   batch %d / batch 1 = %.2f (target >= 2.5); batch %d / batched db ceiling = "
           "%.2f (target >= 0.6);\n         batch %d / shared ceiling = %.2f; batch 1 / "
           "per-message db ceiling = %.2f; batch %d / raw broker = %.2f\n"
           "         batch %d / coupled ceiling = %.2f; coupled / shared ceiling = %.2f\n",
           batch, ib / i1, batch, ib / db, batch, ib / sh, i1 / d1, batch, ib / b, batch,
           co ? ib / co : 0, co / sh);
    if (broker_pid && db_pid) {
        printf("cpu      per message, last run (user + system CPU of each process while it ran):\n");
        char what[64];
        snprintf(what, sizeof what, "mysql.batch %d:", batch);
        print_cpu("shared ceiling:", "bench", cpu_shared);
        print_cpu("coupled ceiling:", "bench", cpu_coupled);
        print_cpu(what, "idemq", cpu_batched);
        if (with_emit) {
            print_cpu("one emit each:", "idemq", cpu_emit);
            print_cpu("one emit each, deleted:", "idemq", cpu_emit_deleting);
        }
    }
    if (shapes) {
        printf("shapes   the database alone, %d workers, %d per transaction (bench_db.c):\n",
               workers, batch);
        for (int s = 0; s < BENCH_SHAPE_COUNT; s++) {
            if (s == BENCH_SHAPE_RETURNING && batched != BENCH_SHAPE_RETURNING)
                continue;
            int shape_batch = s == BENCH_SHAPE_PER_MESSAGE ? 1 : batch;
            double rate = bench_db_run(&dsn, &workload, (bench_shape)s, workers, shape_batch);
            printf("         %-18s %7.0f msg/s  %.2f × per_message%s\n", bench_shape_name(s),
                   rate < 0 ? -rate : rate, (rate < 0 ? -rate : rate) / d1,
                   rate < 0 ? "  WRONG RESULT (dedup rows lost)" : "");
            fflush(stdout);
        }
    }
    if (dedup_rows > 0) {
        fprintf(stderr, "bench: %s keeps its %lld-row dedup window for the next run with "
                        "--dedup-rows %lld (DROP DATABASE %s frees it)\n",
                BENCH_DATABASE, dedup_rows, dedup_rows, BENCH_DATABASE);
    } else {
        MYSQL *admin = bench_db_connect(&dsn, NULL);
        bench_sql(admin, "DROP DATABASE IF EXISTS " BENCH_DATABASE);
        mysql_close(admin);
    }
    bench_workload_free(&workload);
    mysql_library_end();
    return 0;
}
