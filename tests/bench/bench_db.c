/*
 * bench_db — see bench_db.h. The shapes, per batch of n messages (RT = a round trip):
 *
 *   per_message         per message: INSERT dedup, SAVEPOINT, guarded UPDATE, RELEASE, COMMIT
 *                       (5 RT and one durable commit per message: idemq at mysql.batch 1)
 *   savepoint_guarded   per message: SAVEPOINT, INSERT dedup, guarded UPDATE, RELEASE;
 *                       one COMMIT (4n + 1 RT)
 *   savepoint           per message: SAVEPOINT idemq_txn_guard_<i>, INSERT dedup, guarded
 *                       UPDATE; one RELEASE of the first savepoint and one COMMIT (3n + 2 RT):
 *                       idemq's per-message path inside a batch (sql and plugin handlers)
 *   set_based           SAVEPOINT; per message INSERT dedup; one SELECT … FOR UPDATE of the
 *                       batch's rows, decisions in C, one multi-row UPDATE (CASE); RELEASE;
 *                       COMMIT (n + 5 RT): idemq's state machine path
 *   returning           set_based with one multi-row INSERT IGNORE … RETURNING instead of n
 *                       inserts (5 RT; MariaDB ≥ 10.5 only, MySQL 8 has no RETURNING)
 *   bulk                Connector/C array binding (STMT_ATTR_ARRAY_SIZE, MariaDB only): one
 *                       INSERT IGNORE and one guarded UPDATE executed for n parameter sets
 *                       (4 RT). An upper bound only: the server reports one row count for the
 *                       whole array, so neither which message was a duplicate nor which update
 *                       matched can be told, and idemq cannot use it as is. With several
 *                       workers, batches run again after a deadlock also came out with dedup
 *                       rows missing (Connector/C 3.3, MariaDB 10.11; not investigated further):
 *                       bench_db_run then returns minus the rate.
 * Multi-row statements are prepared once per power-of-two size and padded by repeating the last
 * row, as idemq does, so a connection holds a handful of them.
 */
#include "bench_db.h"

#include <mysqld_error.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "db/client.h"
#include "store/schema.h"

#define MAX_BATCH 1024
#define SIZE_CLASSES 11 /* 1, 2, 4, … 1024 */
#define KEY_MAX 64

static const char *const shape_names[BENCH_SHAPE_COUNT] = {
    "per_message", "savepoint_guarded", "savepoint", "set_based", "returning", "bulk",
};

const char *bench_shape_name(bench_shape shape)
{
    return (unsigned)shape < BENCH_SHAPE_COUNT ? shape_names[shape] : "?";
}

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "bench: %s: %s\n", what, detail);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------------------ workload */

typedef struct timed_event {
    long when;
    bench_event e;
} timed_event;

static int by_time(const void *a, const void *b)
{
    const timed_event *x = a, *y = b;
    return (x->when > y->when) - (x->when < y->when);
}

void bench_workload_init(bench_workload *w, int messages)
{
    bench_workload_init_duplicates(w, messages, 10, 200);
}

void bench_workload_init_duplicates(bench_workload *w, int messages, int percent, int max_lag)
{
    int duplicates = (int)((long long)messages * percent / 100);
    w->count = messages;
    w->orders = messages - duplicates;
    timed_event *t = malloc((size_t)messages * sizeof *t);
    w->events = malloc((size_t)messages * sizeof *w->events);
    if (!t || !w->events)
        die("workload", "out of memory");
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < w->orders; i++)
        t[i] = (timed_event){.when = (long)i * 10, .e = {.order = i}};
    for (int d = 0; d < duplicates; d++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int order = (int)(x % (uint64_t)w->orders);
        long lag = 1 + (long)((x >> 32) % ((uint64_t)max_lag * 10)); /* up to ~max_lag later */
        t[w->orders + d] = (timed_event){.when = (long)order * 10 + lag, .e = {order, 1}};
    }
    qsort(t, (size_t)messages, sizeof *t, by_time);
    for (int i = 0; i < messages; i++)
        w->events[i] = t[i].e;
    free(t);
}

void bench_workload_free(bench_workload *w)
{
    free(w->events);
    w->events = NULL;
}

static int biz_key(const bench_event *e, char *buf, size_t len)
{
    return snprintf(buf, len, "order_id:b%d:PAY_SUCCESS", e->order);
}

int bench_event_body(const bench_event *e, char prefix, char *buf, size_t len)
{
    return snprintf(buf, len,
                    "{\"biz_key\":\"order_id:%c%d:PAY_SUCCESS\",\"order_id\":\"%c%d\","
                    "\"event_type\":\"PAY_SUCCESS\",\"amount\":%d%s}",
                    prefix, e->order, prefix, e->order, e->order, e->copy ? ",\"copy\":1" : "");
}

void bench_insert_orders(MYSQL *db, char prefix, int count)
{
    size_t cap = (size_t)count * 32 + 128, n = 0;
    char *text = malloc(cap);
    if (!text)
        die("orders", "out of memory");
    n += (size_t)snprintf(text, cap, "INSERT INTO orders (order_id, status) VALUES ");
    for (int i = 0; i < count; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s('%c%d','PAYING')", i ? "," : "", prefix, i);
    bench_sql(db, text);
    free(text);
}

/* -------------------------------------------------------------------------------- connections */

MYSQL *bench_db_connect(const db_dsn *dsn, const char *database)
{
    MYSQL *db = mysql_init(NULL);
    const char *host = dsn->socket[0] ? "localhost" : dsn->host;
    if (!mysql_real_connect(db, host, dsn->user, dsn->password, database, dsn->port,
                            dsn->socket[0] ? dsn->socket : NULL, CLIENT_FOUND_ROWS))
        die("mysql connect", mysql_error(db));
    return db;
}

void bench_sql(MYSQL *db, const char *text)
{
    if (mysql_query(db, text) != 0)
        die(text, mysql_error(db));
}

unsigned long long bench_window_max_id;
bool bench_window_on;

const char *bench_dedup_count_sql(void)
{
    static char sql[96];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM msg_dedup WHERE id > %llu",
             bench_window_max_id);
    return sql;
}

static long long scalar_of(MYSQL *db, const char *sql)
{
    bench_sql(db, sql);
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    long long v = row && row[0] ? atoll(row[0]) : -1;
    if (res)
        mysql_free_result(res);
    return v;
}

/* The window BENCH_DATABASE holds (bench_window: its row count and last id), or -1. */
static long long window_in_place(MYSQL *db, unsigned long long *max_id)
{
    if (mysql_query(db, "SELECT rows_loaded, max_id FROM " BENCH_DATABASE
                        ".bench_window WHERE layout = 2") != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(db);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    long long rows = row ? atoll(row[0]) : -1;
    if (row)
        *max_id = strtoull(row[1], NULL, 10);
    if (res)
        mysql_free_result(res);
    return rows;
}

void bench_db_preload_window(const db_dsn *dsn, long long rows)
{
    MYSQL *db = bench_db_connect(dsn, NULL);
    unsigned long long max_id = 0;
    long long have = window_in_place(db, &max_id);
    /* Size 0 before a kept window (the same run's empty baseline): the window is parked under
     * another name, which takes no time either way, and msg_dedup starts empty. */
    bool parked = mysql_query(db, "SELECT 1 FROM " BENCH_DATABASE ".bench_parked_dedup LIMIT 1") ==
                  0;
    if (parked)
        mysql_free_result(mysql_store_result(db));
    if (parked) {
        bench_sql(db, "DROP TABLE " BENCH_DATABASE ".msg_dedup");
        bench_sql(db, "RENAME TABLE " BENCH_DATABASE ".bench_parked_dedup TO " BENCH_DATABASE
                      ".msg_dedup");
    }
    if (rows == 0 && have > 0) {
        bench_sql(db, "USE " BENCH_DATABASE);
        char sql[128];
        snprintf(sql, sizeof sql, "DELETE FROM msg_dedup WHERE id > %llu", max_id);
        bench_sql(db, sql);
        bench_sql(db, "RENAME TABLE msg_dedup TO bench_parked_dedup");
        bench_sql(db, store_dedup_ddl);
        bench_window_max_id = 0;
        bench_window_on = true;
        fprintf(stderr, "bench: the %lld-row dedup window parked for an empty msg_dedup\n", have);
        mysql_close(db);
        return;
    }
    if (have == rows) {
        bench_window_max_id = max_id;
        bench_window_on = true;
        fprintf(stderr, "bench: reusing the %lld-row dedup window in %s\n", rows, BENCH_DATABASE);
        mysql_close(db);
        return;
    }
    char sql[8192];
    if (have < 0 || have > rows) {
        have = 0;
        bench_sql(db, "DROP DATABASE IF EXISTS " BENCH_DATABASE);
        bench_sql(db, "CREATE DATABASE " BENCH_DATABASE);
        bench_sql(db, "USE " BENCH_DATABASE);
        bench_sql(db, store_dedup_ddl);
        /* layout: the key shape below (2: the number unpadded, then "x"). */
        bench_sql(db, "CREATE TABLE bench_window (rows_loaded BIGINT NOT NULL, max_id BIGINT NOT "
                      "NULL, layout INT NOT NULL) ENGINE=InnoDB");
        bench_sql(db, "INSERT INTO bench_window VALUES (0, 0, 2)");
        bench_sql(db, "CREATE TABLE digits (d INT PRIMARY KEY) ENGINE=InnoDB");
        size_t n = (size_t)snprintf(sql, sizeof sql, "INSERT INTO digits VALUES (0)");
        for (int d = 1; d < 1000; d++)
            n += (size_t)snprintf(sql + n, sizeof sql - n, ",(%d)", d);
        bench_sql(db, sql);
    } else {
        /* A smaller window grows: the runs' rows go first, so that the window's ids stay one
         * range. */
        bench_sql(db, "USE " BENCH_DATABASE);
        snprintf(sql, sizeof sql, "DELETE FROM msg_dedup WHERE id > %llu", max_id);
        bench_sql(db, sql);
    }
    double start = now_s();
    const long long chunk = 1000000, window_s = 6 * 86400;
    for (long long base = have; base < rows; base += chunk) {
        long long count = rows - base < chunk ? rows - base : chunk;
        /* Kind n % 4 picks the handler and its key's shape. The number is unpadded and followed
         * by "x", so no key is the workload's ("order_id:b<n>:PAY_SUCCESS") while the workload's
         * keys sort among the window's all over the index, as random keys would: each of its
         * inserts lands on a leaf page of its own. A chunk's keys are mostly one range ("b1…"
         * for the millions from 1 million), which keeps loading fast. */
        snprintf(sql, sizeof sql,
                 "INSERT INTO msg_dedup (biz_key, handler_name, created_at) "
                 "SELECT CONCAT(ELT(1 + n %% 4, 'order_id:b', 'refund_id:r', 'shipment_id:s', "
                 "'customer_id:c'), n, ELT(1 + n %% 4, 'x:PAY_SUCCESS', 'x:REFUNDED', "
                 "'x:SHIPPED', 'x:SIGNED_UP')), ELT(1 + n %% 4, 'pay-callback', 'refunds', "
                 "'shipping', 'signup'), NOW(3) - INTERVAL ((%lld - n) * %lld DIV %lld) SECOND "
                 "FROM (SELECT %lld + a.d * 1000 + b.d AS n FROM digits a, digits b "
                 "WHERE a.d * 1000 + b.d < %lld) s ORDER BY n",
                 rows, window_s, rows, base, count);
        bench_sql(db, sql);
        fprintf(stderr, "\rbench: dedup window %lld / %lld rows (%.0f s)", base + count, rows,
                now_s() - start);
    }
    fprintf(stderr, "\n");
    bench_window_max_id =
        (unsigned long long)scalar_of(db, "SELECT COALESCE(MAX(id), 0) FROM msg_dedup");
    bench_window_on = true;
    snprintf(sql, sizeof sql, "UPDATE bench_window SET rows_loaded = %lld, max_id = %llu", rows,
             bench_window_max_id);
    bench_sql(db, sql);
    mysql_close(db);
}

void bench_db_reset(const db_dsn *dsn, const bench_workload *w)
{
    MYSQL *db = bench_db_connect(dsn, NULL);
    if (bench_window_on) {
        /* The window stays; the runs' own rows (ids past it) and every other table go. */
        bench_sql(db, "USE " BENCH_DATABASE);
        char sql[128];
        snprintf(sql, sizeof sql, "DELETE FROM msg_dedup WHERE id > %llu", bench_window_max_id);
        bench_sql(db, sql);
        bench_sql(db, "DROP TABLE IF EXISTS idemq_outbox, idemq_outbox_lease, orders");
    } else {
        bench_sql(db, "DROP DATABASE IF EXISTS " BENCH_DATABASE);
        bench_sql(db, "CREATE DATABASE " BENCH_DATABASE);
        bench_sql(db, "USE " BENCH_DATABASE);
        bench_sql(db, store_dedup_ddl);
    }
    bench_sql(db, store_outbox_ddl);
    bench_sql(db, store_outbox_lease_ddl);
    bench_sql(db, "CREATE TABLE orders (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT "
                  "NULL, amount BIGINT NULL) ENGINE=InnoDB");
    bench_insert_orders(db, 'b', w->orders);
    mysql_close(db);
}

/* ------------------------------------------------------------------------------------- worker */

typedef struct msg {
    char key[KEY_MAX], order[KEY_MAX];
    unsigned long key_len, order_len;
    long long amount;
    bool duplicate, applies;
} msg;

typedef struct run_state {
    const db_dsn *dsn;
    const bench_workload *w;
    bench_shape shape;
    int batch;
    atomic_int cursor;
    const bench_db_follow *follow; /* NULL: the threads take events as fast as they go */
} run_state;

typedef struct worker {
    run_state *run;
    jmp_buf restart; /* a deadlock victim rolls back and runs its batch again */
    int deadlocks;
    MYSQL *db;
    MYSQL_STMT *insert, *update, *insert_ignore_bulk, *update_bulk;
    MYSQL_STMT *select_locked[SIZE_CLASSES], *update_case[SIZE_CLASSES],
        *insert_returning[SIZE_CLASSES];
    msg msgs[MAX_BATCH];
    msg *sorted[MAX_BATCH], *live[MAX_BATCH];
    MYSQL_BIND binds[MAX_BATCH * 6];
    char row_key[MAX_BATCH][KEY_MAX];
    unsigned long row_key_len[MAX_BATCH];
    int row_item[MAX_BATCH];
    char state_buf[MAX_BATCH][33], order_buf[MAX_BATCH][KEY_MAX];
    unsigned long state_len[MAX_BATCH], order_out_len[MAX_BATCH];
} worker;

static const char handler_name[] = "pay-callback";
static unsigned long handler_len = sizeof handler_name - 1;
static char to_state[] = "PAID", from_state[] = "PAYING";
static unsigned long to_len = 4, from_len = 6;
static signed char present = 1;

/* A statement failed: a deadlock (or lock wait) victim runs its batch again, as idemq would;
 * anything else ends the benchmark. */
static void fail(worker *wk, const char *what, unsigned int number, const char *text)
{
    if (number == ER_LOCK_DEADLOCK || number == ER_LOCK_WAIT_TIMEOUT) {
        mysql_rollback(wk->db);
        wk->deadlocks++;
        longjmp(wk->restart, 1);
    }
    die(what, text);
}

#define FAIL_STMT(wk, what, stmt) fail(wk, what, mysql_stmt_errno(stmt), mysql_stmt_error(stmt))

static MYSQL_STMT *prepare(MYSQL *db, const char *sql)
{
    MYSQL_STMT *stmt = mysql_stmt_init(db);
    if (mysql_stmt_prepare(stmt, sql, (unsigned long)strlen(sql)) != 0)
        die("prepare", mysql_stmt_error(stmt));
    return stmt;
}

static void query(worker *wk, const char *sql)
{
    if (mysql_query(wk->db, sql) != 0)
        fail(wk, sql, mysql_errno(wk->db), mysql_error(wk->db));
}

static void bind_string(MYSQL_BIND *b, char *text, unsigned long *len)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_STRING;
    b->buffer = text;
    b->buffer_length = *len;
    b->length = len;
}

static void bind_other(MYSQL_BIND *b, enum enum_field_types type, void *value)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = type;
    b->buffer = value;
}

/* INSERT the dedup row: true when inserted, false on a duplicate. */
static bool insert_dedup(worker *wk, msg *m)
{
    MYSQL_BIND p[2];
    bind_string(&p[0], m->key, &m->key_len);
    bind_string(&p[1], (char *)handler_name, &handler_len);
    if (mysql_stmt_bind_param(wk->insert, p) || mysql_stmt_execute(wk->insert)) {
        if (mysql_stmt_errno(wk->insert) == ER_DUP_ENTRY)
            return false;
        FAIL_STMT(wk, "insert", wk->insert);
    }
    return true;
}

static void guarded_update(worker *wk, msg *m)
{
    MYSQL_BIND p[5];
    bind_string(&p[0], to_state, &to_len);
    bind_other(&p[1], MYSQL_TYPE_TINY, &present);
    bind_other(&p[2], MYSQL_TYPE_LONGLONG, &m->amount);
    bind_string(&p[3], m->order, &m->order_len);
    bind_string(&p[4], from_state, &from_len);
    if (mysql_stmt_bind_param(wk->update, p) || mysql_stmt_execute(wk->update))
        FAIL_STMT(wk, "update", wk->update);
    if (mysql_stmt_affected_rows(wk->update) != 1)
        die("update", "matched no row");
}

static int size_class(int n, int *padded)
{
    int c = 0, size = 1;
    while (size < n)
        size <<= 1, c++;
    *padded = size;
    return c;
}

/* The statements below are idemq's, as handlers/state_machine.c and store/batch.c build them
 * for this handler (table orders, key order_id, state status, set amount). */
static MYSQL_STMT *select_locked_stmt(worker *wk, int c, int size)
{
    if (!wk->select_locked[c]) {
        char *sql = malloc((size_t)size * 48 + 256);
        int n = sprintf(sql, "SELECT CASE");
        for (int i = 0; i < size; i++)
            n += sprintf(sql + n, " WHEN `order_id` = ? THEN %d", i);
        n += sprintf(sql + n, " END, `order_id`, `status` FROM `orders` WHERE `order_id` IN (");
        for (int i = 0; i < size; i++)
            n += sprintf(sql + n, i ? ", ?" : "?");
        sprintf(sql + n, ") FOR UPDATE");
        wk->select_locked[c] = prepare(wk->db, sql);
        free(sql);
    }
    return wk->select_locked[c];
}

static MYSQL_STMT *update_case_stmt(worker *wk, int c, int size)
{
    if (!wk->update_case[c]) {
        char *sql = malloc((size_t)size * 96 + 256);
        int n = sprintf(sql, "UPDATE `orders` SET `status` = CASE");
        for (int i = 0; i < size; i++)
            n += sprintf(sql + n, " WHEN `order_id` = ? THEN ?");
        n += sprintf(sql + n, " ELSE `status` END, `amount` = CASE");
        for (int i = 0; i < size; i++)
            n += sprintf(sql + n, " WHEN `order_id` = ? THEN IF(?, ?, `amount`)");
        n += sprintf(sql + n, " ELSE `amount` END WHERE `order_id` IN (");
        for (int i = 0; i < size; i++)
            n += sprintf(sql + n, i ? ", ?" : "?");
        sprintf(sql + n, ")");
        wk->update_case[c] = prepare(wk->db, sql);
        free(sql);
    }
    return wk->update_case[c];
}

static MYSQL_STMT *insert_returning_stmt(worker *wk, int c, int size)
{
    if (!wk->insert_returning[c]) {
        char *sql = malloc((size_t)size * 8 + 128);
        int n = sprintf(sql, "INSERT IGNORE INTO msg_dedup (biz_key, handler_name) VALUES ");
        for (int i = 0; i < size; i++)
            n += sprintf(sql + n, i ? ", (?, ?)" : "(?, ?)");
        sprintf(sql + n, " RETURNING biz_key");
        wk->insert_returning[c] = prepare(wk->db, sql);
        free(sql);
    }
    return wk->insert_returning[c];
}

static int by_key(const void *a, const void *b)
{
    const msg *x = *(msg *const *)a, *y = *(msg *const *)b;
    return strcmp(x->key, y->key);
}

/* The locked read, the decisions and the multi-row UPDATE of the set-based shapes, over the
 * messages whose dedup row was inserted. */
static void set_based_rest(worker *wk, int n)
{
    int live = 0;
    for (int i = 0; i < n; i++)
        if (!wk->sorted[i]->duplicate)
            wk->live[live++] = wk->sorted[i];
    if (live == 0)
        return;
    int size, c = size_class(live, &size);
    MYSQL_STMT *sel = select_locked_stmt(wk, c, size);
    for (int i = 0; i < 2 * size; i++) {
        msg *m = wk->live[i % size < live ? i % size : live - 1];
        bind_string(&wk->binds[i], m->order, &m->order_len);
    }
    if (mysql_stmt_bind_param(sel, wk->binds) || mysql_stmt_execute(sel))
        FAIL_STMT(wk, "select for update", sel);
    MYSQL_BIND out[3];
    char order[KEY_MAX], state[33];
    unsigned long order_len, state_len;
    long long index;
    memset(out, 0, sizeof out);
    out[0].buffer_type = MYSQL_TYPE_LONGLONG, out[0].buffer = &index;
    out[1].buffer_type = out[2].buffer_type = MYSQL_TYPE_STRING;
    out[1].buffer = order, out[1].buffer_length = sizeof order - 1, out[1].length = &order_len;
    out[2].buffer = state, out[2].buffer_length = sizeof state - 1, out[2].length = &state_len;
    if (mysql_stmt_bind_result(sel, out) || mysql_stmt_store_result(sel))
        FAIL_STMT(wk, "select for update", sel);
    int rows = 0;
    while (mysql_stmt_fetch(sel) == 0) {
        state[state_len] = '\0';
        if (strcmp(state, "PAYING") != 0 || index < 0 || index >= live)
            die("select for update", "a row is not PAYING");
        /* idemq binds the key as read back from the row */
        memcpy(wk->row_key[rows], order, order_len);
        wk->row_key_len[rows] = order_len;
        wk->row_item[rows] = (int)index;
        rows++;
    }
    mysql_stmt_free_result(sel);
    if (rows != live)
        die("select for update", "rows missing");
    MYSQL_STMT *upd = update_case_stmt(wk, c, size);
    MYSQL_BIND *b = wk->binds;
    for (int i = 0; i < size; i++) {
        int r = i < live ? i : live - 1;
        bind_string(b++, wk->row_key[r], &wk->row_key_len[r]);
        bind_string(b++, to_state, &to_len);
    }
    for (int i = 0; i < size; i++) {
        int r = i < live ? i : live - 1;
        msg *m = wk->live[wk->row_item[r]];
        bind_string(b++, wk->row_key[r], &wk->row_key_len[r]);
        bind_other(b++, MYSQL_TYPE_TINY, &present);
        bind_other(b++, MYSQL_TYPE_LONGLONG, &m->amount);
    }
    for (int i = 0; i < size; i++) {
        int r = i < live ? i : live - 1;
        bind_string(b++, wk->row_key[r], &wk->row_key_len[r]);
    }
    if (mysql_stmt_bind_param(upd, wk->binds) || mysql_stmt_execute(upd))
        FAIL_STMT(wk, "update case", upd);
    if ((int)mysql_stmt_affected_rows(upd) != live)
        die("update case", "wrong row count");
}

static void returning_insert(worker *wk, int n)
{
    int size, c = size_class(n, &size);
    MYSQL_STMT *ins = insert_returning_stmt(wk, c, size);
    for (int i = 0; i < size; i++) {
        msg *m = wk->sorted[i < n ? i : n - 1];
        bind_string(&wk->binds[2 * i], m->key, &m->key_len);
        bind_string(&wk->binds[2 * i + 1], (char *)handler_name, &handler_len);
        m->duplicate = true;
    }
    if (mysql_stmt_bind_param(ins, wk->binds) || mysql_stmt_execute(ins))
        FAIL_STMT(wk, "insert returning", ins);
    MYSQL_BIND out;
    char key[KEY_MAX];
    unsigned long key_len;
    memset(&out, 0, sizeof out);
    out.buffer_type = MYSQL_TYPE_STRING;
    out.buffer = key, out.buffer_length = sizeof key - 1, out.length = &key_len;
    if (mysql_stmt_bind_result(ins, &out) || mysql_stmt_store_result(ins))
        FAIL_STMT(wk, "insert returning", ins);
    while (mysql_stmt_fetch(ins) == 0) {
        key[key_len] = '\0';
        /* Sorted by key, so copies are adjacent: the first one still marked is the inserted one. */
        for (int i = 0; i < n; i++)
            if (wk->sorted[i]->duplicate && strcmp(wk->sorted[i]->key, key) == 0) {
                wk->sorted[i]->duplicate = false;
                break;
            }
    }
    mysql_stmt_free_result(ins);
}

static void bulk(worker *wk, int n)
{
#if IDEMQ_DB_CLIENT_IS_MARIADB
    /* Column-wise arrays, one per parameter; a string column is an array of pointers. */
    static __thread char *keys[MAX_BATCH], *orders[MAX_BATCH], *handlers[MAX_BATCH],
        *tos[MAX_BATCH], *froms[MAX_BATCH];
    static __thread unsigned long key_lens[MAX_BATCH], order_lens[MAX_BATCH],
        handler_lens[MAX_BATCH], to_lens[MAX_BATCH], from_lens[MAX_BATCH];
    static __thread long long amounts[MAX_BATCH];
    static __thread signed char presents[MAX_BATCH];
    unsigned int rows = (unsigned)n;
    for (int i = 0; i < n; i++) {
        msg *m = wk->sorted[i];
        keys[i] = m->key, key_lens[i] = m->key_len;
        orders[i] = m->order, order_lens[i] = m->order_len;
        handlers[i] = (char *)handler_name, handler_lens[i] = handler_len;
        tos[i] = to_state, to_lens[i] = to_len;
        froms[i] = from_state, from_lens[i] = from_len;
        amounts[i] = m->amount, presents[i] = 1;
    }
    MYSQL_BIND p[5];
    memset(p, 0, sizeof p);
    p[0].buffer_type = MYSQL_TYPE_STRING, p[0].buffer = keys, p[0].length = key_lens;
    p[1].buffer_type = MYSQL_TYPE_STRING, p[1].buffer = handlers, p[1].length = handler_lens;
    mysql_stmt_attr_set(wk->insert_ignore_bulk, STMT_ATTR_ARRAY_SIZE, &rows);
    if (mysql_stmt_bind_param(wk->insert_ignore_bulk, p) ||
        mysql_stmt_execute(wk->insert_ignore_bulk))
        FAIL_STMT(wk, "bulk insert", wk->insert_ignore_bulk);
    memset(p, 0, sizeof p);
    p[0].buffer_type = MYSQL_TYPE_STRING, p[0].buffer = tos, p[0].length = to_lens;
    p[1].buffer_type = MYSQL_TYPE_TINY, p[1].buffer = presents;
    p[2].buffer_type = MYSQL_TYPE_LONGLONG, p[2].buffer = amounts;
    p[3].buffer_type = MYSQL_TYPE_STRING, p[3].buffer = orders, p[3].length = order_lens;
    p[4].buffer_type = MYSQL_TYPE_STRING, p[4].buffer = froms, p[4].length = from_lens;
    mysql_stmt_attr_set(wk->update_bulk, STMT_ATTR_ARRAY_SIZE, &rows);
    if (mysql_stmt_bind_param(wk->update_bulk, p) || mysql_stmt_execute(wk->update_bulk))
        FAIL_STMT(wk, "bulk update", wk->update_bulk);
#else
    (void)wk, (void)n;
    die("bulk", "array binding (STMT_ATTR_ARRAY_SIZE) is MariaDB Connector/C's");
#endif
}

static void apply_batch(worker *wk, int n)
{
    run_state *r = wk->run;
    switch (r->shape) {
    case BENCH_SHAPE_PER_MESSAGE:
        for (int i = 0; i < n; i++) {
            msg *m = &wk->msgs[i];
            if (!insert_dedup(wk, m)) {
                mysql_rollback(wk->db);
                continue;
            }
            query(wk, "SAVEPOINT idemq_txn_guard");
            guarded_update(wk, m);
            query(wk, "RELEASE SAVEPOINT idemq_txn_guard");
            if (mysql_commit(wk->db))
                fail(wk, "commit", mysql_errno(wk->db), mysql_error(wk->db));
        }
        return;
    case BENCH_SHAPE_SAVEPOINT_GUARDED:
        for (int i = 0; i < n; i++) {
            msg *m = wk->sorted[i];
            query(wk, "SAVEPOINT idemq_txn_guard");
            if (insert_dedup(wk, m))
                guarded_update(wk, m);
            query(wk, "RELEASE SAVEPOINT idemq_txn_guard");
        }
        break;
    case BENCH_SHAPE_SAVEPOINT:
        for (int i = 0; i < n; i++) {
            char sp[64];
            msg *m = wk->sorted[i];
            snprintf(sp, sizeof sp, "SAVEPOINT idemq_txn_guard_%d", i);
            query(wk, sp);
            if (insert_dedup(wk, m))
                guarded_update(wk, m);
        }
        query(wk, "RELEASE SAVEPOINT idemq_txn_guard_0");
        break;
    case BENCH_SHAPE_SET_BASED:
        query(wk, "SAVEPOINT idemq_txn_guard");
        for (int i = 0; i < n; i++)
            wk->sorted[i]->duplicate = !insert_dedup(wk, wk->sorted[i]);
        set_based_rest(wk, n);
        query(wk, "RELEASE SAVEPOINT idemq_txn_guard");
        break;
    case BENCH_SHAPE_RETURNING:
        query(wk, "SAVEPOINT idemq_txn_guard");
        returning_insert(wk, n);
        set_based_rest(wk, n);
        query(wk, "RELEASE SAVEPOINT idemq_txn_guard");
        break;
    case BENCH_SHAPE_BULK:
        query(wk, "SAVEPOINT idemq_txn_guard");
        bulk(wk, n);
        query(wk, "RELEASE SAVEPOINT idemq_txn_guard");
        break;
    case BENCH_SHAPE_COUNT:
        break;
    }
    if (mysql_commit(wk->db))
        fail(wk, "commit", mysql_errno(wk->db), mysql_error(wk->db));
}

static void worker_main(void *arg)
{
    worker *wk = arg;
    run_state *r = wk->run;
    mysql_thread_init();
    wk->db = bench_db_connect(r->dsn, BENCH_DATABASE);
    mysql_autocommit(wk->db, 0);
    wk->insert = prepare(wk->db, "INSERT INTO msg_dedup (biz_key, handler_name) VALUES (?, ?)");
    wk->update = prepare(wk->db, "UPDATE `orders` SET `status` = ?, `amount` = IF(?, ?, "
                                 "`amount`) WHERE `order_id` = ? AND `status` IN (?)");
    if (r->shape == BENCH_SHAPE_BULK) {
        wk->insert_ignore_bulk =
            prepare(wk->db, "INSERT IGNORE INTO msg_dedup (biz_key, handler_name) VALUES (?, ?)");
        wk->update_bulk = prepare(wk->db, "UPDATE `orders` SET `status` = ?, `amount` = IF(?, ?, "
                                          "`amount`) WHERE `order_id` = ? AND `status` IN (?)");
    }
    for (;;) {
        int begin = atomic_fetch_add(&r->cursor, r->batch);
        if (begin >= r->w->count)
            break;
        volatile int n = begin + r->batch > r->w->count ? r->w->count - begin : r->batch;
        if (r->follow)
            r->follow->wait_delivered(r->follow->arg, begin + n);
        for (int i = 0; i < n; i++) {
            msg *m = &wk->msgs[i];
            const bench_event *e = &r->w->events[begin + i];
            m->key_len = (unsigned long)biz_key(e, m->key, sizeof m->key);
            m->order_len = (unsigned long)snprintf(m->order, sizeof m->order, "b%d", e->order);
            m->amount = e->order;
            m->duplicate = false;
            wk->sorted[i] = m;
        }
        /* One lock order for every worker (dedup keys, then rows, each sorted): concurrent
         * batches then wait for each other instead of deadlocking. */
        qsort(wk->sorted, (size_t)n, sizeof *wk->sorted, by_key);
        setjmp(wk->restart);
        apply_batch(wk, n);
        if (r->follow)
            r->follow->committed(r->follow->arg, begin, n);
    }
    mysql_stmt_close(wk->insert);
    mysql_stmt_close(wk->update);
    if (wk->insert_ignore_bulk)
        mysql_stmt_close(wk->insert_ignore_bulk);
    if (wk->update_bulk)
        mysql_stmt_close(wk->update_bulk);
    for (int c = 0; c < SIZE_CLASSES; c++) {
        if (wk->select_locked[c])
            mysql_stmt_close(wk->select_locked[c]);
        if (wk->update_case[c])
            mysql_stmt_close(wk->update_case[c]);
        if (wk->insert_returning[c])
            mysql_stmt_close(wk->insert_returning[c]);
    }
    mysql_close(wk->db);
    mysql_thread_end();
}

static long long scalar(MYSQL *db, const char *sql)
{
    bench_sql(db, sql);
    MYSQL_RES *res = mysql_store_result(db);
    long long v = atoll(mysql_fetch_row(res)[0]);
    mysql_free_result(res);
    return v;
}

double bench_db_run(const db_dsn *dsn, const bench_workload *w, bench_shape shape, int workers,
                    int batch)
{
    bench_db_reset(dsn, w);
    return bench_db_run_reset(dsn, w, shape, workers, batch, NULL, NULL);
}

double bench_db_run_reset(const db_dsn *dsn, const bench_workload *w, bench_shape shape,
                          int workers, int batch, void (*at_start)(void *), void *arg)
{
    if (at_start)
        at_start(arg);
    return bench_db_run_following(dsn, w, shape, workers, batch, NULL);
}

double bench_db_run_following(const db_dsn *dsn, const bench_workload *w, bench_shape shape,
                              int workers, int batch, const bench_db_follow *follow)
{
    if (batch < 1 || batch > MAX_BATCH || workers < 1 || workers > 64)
        die("bench_db_run", "batch 1..1024, workers 1..64");
    run_state r = {.dsn = dsn, .w = w, .shape = shape, .batch = batch, .follow = follow};
    atomic_init(&r.cursor, 0);
    worker *wk = calloc((size_t)workers, sizeof *wk);
    uv_thread_t threads[64];
    double start = now_s();
    for (int i = 0; i < workers; i++) {
        wk[i].run = &r;
        uv_thread_create(&threads[i], worker_main, &wk[i]);
    }
    for (int i = 0; i < workers; i++)
        uv_thread_join(&threads[i]);
    double rate = w->count / (now_s() - start);
    int deadlocks = 0;
    for (int i = 0; i < workers; i++)
        deadlocks += wk[i].deadlocks;
    if (deadlocks)
        fprintf(stderr, "bench: shape %s: %d batches ran again after a deadlock\n",
                bench_shape_name(shape), deadlocks);
    free(wk);
    MYSQL *db = bench_db_connect(dsn, BENCH_DATABASE);
    long long rows = scalar(db, bench_dedup_count_sql());
    long long paid = scalar(db, "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND amount = "
                                "CAST(SUBSTRING(order_id, 2) AS SIGNED)");
    mysql_close(db);
    if (rows != w->orders || paid != w->orders) {
        fprintf(stderr, "bench: shape %s: %lld dedup rows and %lld paid orders, expected %d\n",
                bench_shape_name(shape), rows, paid, w->orders);
        if (shape != BENCH_SHAPE_BULK)
            exit(1);
        return -rate; /* bulk's known defect (bench_db.h): report it, do not stop */
    }
    return rate;
}
