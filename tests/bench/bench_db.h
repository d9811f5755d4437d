/*
 * bench_db — the benchmark's workload and its database ceilings: idemq's statements run by plain
 * threads on plain connections, without idemq, in each transaction shape idemq could use.
 *
 * The workload is the one every figure of scripts/bench uses: `messages` payment events
 * (PAY_SUCCESS, PAYING → PAID with the amount), 10% of them duplicates of an earlier event
 * arriving up to ~200 messages after it, so some duplicates share a batch with their original,
 * some run concurrently in another worker's batch and some come later.
 *
 * Benchmark code: failures print and exit(1). Thread affinity: bench_db_run starts and joins its
 * own threads; the rest runs on the caller's thread.
 */
#ifndef IDEMQ_BENCH_DB_H
#define IDEMQ_BENCH_DB_H

#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "db/dsn.h"

#define BENCH_DATABASE "idemq_bench"

typedef struct bench_event {
    int order; /* orders.order_id is "b<order>" */
    int copy;  /* 0: the original; 1: a duplicate of it */
} bench_event;

typedef struct bench_workload {
    bench_event *events;
    int count;  /* events, duplicates included */
    int orders; /* distinct orders (= distinct biz_keys) */
} bench_workload;

/* The transaction shapes bench_db_run can measure (see bench_db.c for each one's statements). */
typedef enum bench_shape {
    BENCH_SHAPE_PER_MESSAGE = 0,   /* one transaction per message: idemq at mysql.batch 1 */
    BENCH_SHAPE_SAVEPOINT_GUARDED, /* batch; per message SAVEPOINT, INSERT, UPDATE, RELEASE */
    BENCH_SHAPE_SAVEPOINT,         /* batch; per message SAVEPOINT, INSERT, UPDATE */
    BENCH_SHAPE_SET_BASED,         /* batch; per message INSERT; one locked read, one UPDATE */
    BENCH_SHAPE_RETURNING,         /* batch; one INSERT IGNORE … RETURNING (MariaDB), set-based */
    BENCH_SHAPE_BULK,              /* batch; array-bound INSERT IGNORE and UPDATE (Connector/C) */
    BENCH_SHAPE_COUNT,
} bench_shape;

const char *bench_shape_name(bench_shape shape);

/* Builds the workload of `messages` events (deterministic). */
void bench_workload_init(bench_workload *w, int messages);

/* The same with percent% duplicates instead of 10% (0..95), each arriving up to ~max_lag
 * messages after its original instead of ~200 (a resend after an incident: the whole stream). */
void bench_workload_init_duplicates(bench_workload *w, int messages, int percent, int max_lag);
void bench_workload_free(bench_workload *w);

/* The JSON body of event e for order "<prefix><order>" (what the broker benchmarks publish);
 * returns its length. The database ceilings use prefix 'b'. */
int bench_event_body(const bench_event *e, char prefix, char *buf, size_t len);

/* Inserts orders "<prefix>0" .. "<prefix><count-1>" in PAYING (db connected to the bench's
 * database). */
void bench_insert_orders(MYSQL *db, char prefix, int count);

/* A connection to database (NULL: none) with CLIENT_FOUND_ROWS, as idemq connects. */
MYSQL *bench_db_connect(const db_dsn *dsn, const char *database);

/* Runs text on db; exits on failure. */
void bench_sql(MYSQL *db, const char *text);

/* Fresh BENCH_DATABASE: msg_dedup, and the workload's orders in PAYING. With a dedup window
 * (bench_db_preload_window) msg_dedup keeps the window's rows and loses only the runs' own. */
void bench_db_reset(const db_dsn *dsn, const bench_workload *w);

/* The dedup window of scripts/bench --dedup-rows: BENCH_DATABASE made fresh with `rows` dedup
 * rows in msg_dedup before any run, as a deployment that keeps days of keys has them — four
 * handlers' keys (pay-callback's "order_id:b<n>x:PAY_SUCCESS": the workload's own
 * "order_id:b<n>:PAY_SUCCESS" sort among them, so its inserts land all over that index, as random
 * keys do),
 * created_at spread over the last six days. Loaded with INSERT … SELECT in chunks of a million;
 * a database that already holds a window of that size is reused (loading 50 million rows takes
 * minutes), a smaller one grows, and size 0 parks a kept window under another name (an empty
 * msg_dedup for the same run's baseline; the next size restores it). Rows with an id up to
 * bench_window_max_id are the window's. */
void bench_db_preload_window(const db_dsn *dsn, long long rows);
extern unsigned long long bench_window_max_id;
extern bool bench_window_on; /* a window (of any size, 0 too) is in place */

/* "SELECT COUNT(*) FROM msg_dedup" over the runs' own rows (the window's are left out, and
 * counting them would take seconds at these sizes): a static string. */
const char *bench_dedup_count_sql(void);

/* Applies the whole workload with `workers` connections, each taking `batch` events at a time
 * from a shared cursor, in the given shape; returns events per second. Checks the result: every
 * order PAID once, exactly w->orders dedup rows; a wrong result exits, except for the bulk
 * shape, which then returns minus its rate (see bench_db.c). */
double bench_db_run(const db_dsn *dsn, const bench_workload *w, bench_shape shape, int workers,
                    int batch);

/* bench_db_run on a database bench_db_reset has just prepared: at_start(arg) (may be NULL) runs
 * right before the workers start (to start load that shares the machine with them). */
double bench_db_run_reset(const db_dsn *dsn, const bench_workload *w, bench_shape shape,
                          int workers, int batch, void (*at_start)(void *), void *arg);

/* A consumer that the database threads follow, as a consumer that acks after its commits is
 * followed: before a batch of events [begin, end) a thread waits until wait_delivered(arg, end)
 * returns (the consumer has received them), and after its COMMIT it calls committed(arg, begin,
 * count) (the consumer may ack them now). Called on the database threads. */
typedef struct bench_db_follow {
    void (*wait_delivered)(void *arg, int end);
    void (*committed)(void *arg, int begin, int count);
    void *arg;
} bench_db_follow;

/* bench_db_run_reset whose threads follow follow (borrowed, NULL: none). */
double bench_db_run_following(const db_dsn *dsn, const bench_workload *w, bench_shape shape,
                              int workers, int batch, const bench_db_follow *follow);
#endif
