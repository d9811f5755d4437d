/*
 * metrics — see metrics.h. Fixed-size arrays per consumer; rendering builds the whole page in
 * one growing buffer because a scrape is rare and small next to message traffic.
 */
#include "ops/metrics.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "db/nodes.h"

static const double bucket_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
#define BUCKETS (sizeof bucket_bounds / sizeof bucket_bounds[0])

typedef struct consumer_metrics {
    uint64_t counts[OUTCOME_LABEL_COUNT];
    uint64_t recovered;
    uint64_t retry_dead_lettered;
    uint64_t dead_lettered[2]; /* by class: non_retryable, retries_exhausted */
    uint64_t buckets[BUCKETS];   /* non-cumulative; cumulated when rendered */
    uint64_t observations;
    double seconds_sum;
    int64_t inflight;
    int64_t held;
    uint64_t unpublishable;
    uint64_t cancelled_by_broker;
    uint64_t seen_key_hits;
} consumer_metrics;

struct metrics {
    const config *cfg;
    consumer_metrics *consumers;
    bool up[2];
    metrics_pause pause;
    uint64_t schema_errors;
    bool broker_blocked;
    uint64_t broker_blocked_total;
    metrics_ready_fn ready;
    void *ready_ctx;
    metrics_outbox_fn outbox;
    void *outbox_ctx;
};

static const char *const dead_letter_classes[2] = {"non_retryable", "retries_exhausted"};

metrics *metrics_new(const config *cfg)
{
    metrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->cfg = cfg;
    m->consumers = calloc(cfg->consumer_count ? cfg->consumer_count : 1, sizeof *m->consumers);
    if (!m->consumers) {
        free(m);
        return NULL;
    }
    return m;
}

void metrics_free(metrics *m)
{
    if (!m)
        return;
    free(m->consumers);
    free(m);
}

void metrics_count(metrics *m, size_t consumer, outcome_label label)
{
    if (consumer < m->cfg->consumer_count && (unsigned)label < OUTCOME_LABEL_COUNT)
        m->consumers[consumer].counts[label]++;
}

void metrics_retry_recovered(metrics *m, size_t consumer)
{
    if (consumer < m->cfg->consumer_count)
        m->consumers[consumer].recovered++;
}

void metrics_dead_lettered(metrics *m, size_t consumer, error_class cls, bool after_retry)
{
    if (consumer >= m->cfg->consumer_count)
        return;
    consumer_metrics *c = &m->consumers[consumer];
    if (cls == ERROR_CLASS_NON_RETRYABLE)
        c->dead_lettered[0]++;
    else if (cls == ERROR_CLASS_RETRIES_EXHAUSTED)
        c->dead_lettered[1]++;
    if (after_retry)
        c->retry_dead_lettered++;
}

void metrics_observe_handler(metrics *m, size_t consumer, uint64_t duration_ns)
{
    if (consumer >= m->cfg->consumer_count)
        return;
    consumer_metrics *c = &m->consumers[consumer];
    double seconds = (double)duration_ns / 1e9;
    c->observations++;
    c->seconds_sum += seconds;
    for (size_t i = 0; i < BUCKETS; i++) {
        if (seconds <= bucket_bounds[i]) {
            c->buckets[i]++;
            break;
        }
    }
}

void metrics_inflight_add(metrics *m, size_t consumer, int delta)
{
    if (consumer < m->cfg->consumer_count)
        m->consumers[consumer].inflight += delta;
}

void metrics_set_up(metrics *m, metrics_dependency dependency, bool up)
{
    if ((unsigned)dependency < 2)
        m->up[dependency] = up;
}

void metrics_held_add(metrics *m, size_t consumer, int delta)
{
    if (consumer < m->cfg->consumer_count)
        m->consumers[consumer].held += delta;
}

void metrics_set_broker_blocked(metrics *m, bool blocked)
{
    if (blocked && !m->broker_blocked)
        m->broker_blocked_total++;
    m->broker_blocked = blocked;
}

void metrics_copy_unpublishable(metrics *m, size_t consumer)
{
    if (consumer < m->cfg->consumer_count)
        m->consumers[consumer].unpublishable++;
}

void metrics_seen_key_hit(metrics *m, size_t consumer)
{
    if (consumer < m->cfg->consumer_count)
        m->consumers[consumer].seen_key_hits++;
}

void metrics_consumer_cancelled(metrics *m, size_t consumer)
{
    if (consumer < m->cfg->consumer_count)
        m->consumers[consumer].cancelled_by_broker++;
}

void metrics_set_pause(metrics *m, metrics_pause pause)
{
    if (pause == METRICS_PAUSE_SCHEMA && m->pause != METRICS_PAUSE_SCHEMA)
        m->schema_errors++;
    m->pause = pause;
}

metrics_pause metrics_get_pause(const metrics *m)
{
    return m->pause;
}

void metrics_set_ready_probe(metrics *m, metrics_ready_fn ready, void *ctx)
{
    m->ready = ready;
    m->ready_ctx = ctx;
}

void metrics_set_outbox_probe(metrics *m, metrics_outbox_fn read, void *ctx)
{
    m->outbox = read;
    m->outbox_ctx = ctx;
}

uint64_t metrics_get_count(const metrics *m, size_t consumer, outcome_label label)
{
    if (consumer >= m->cfg->consumer_count || (unsigned)label >= OUTCOME_LABEL_COUNT)
        return 0;
    return m->consumers[consumer].counts[label];
}

bool metrics_get_up(const metrics *m, metrics_dependency dependency)
{
    return (unsigned)dependency < 2 && m->up[dependency];
}

typedef struct text_buffer {
    char *data;
    size_t len, cap;
    bool failed;
} text_buffer;

__attribute__((format(printf, 2, 3))) static void emit(text_buffer *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
}

/* Label values escape backslash, double quote and newline (exposition format rules). */
static void escape_label(const char *value, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = value; *p && n + 3 < cap; p++) {
        if (*p == '\\' || *p == '"') {
            out[n++] = '\\';
            out[n++] = *p;
        } else if (*p == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
        } else {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
}

/* A counter with one sample per consumer's queue; field is the uint64_t's offset in
 * consumer_metrics. */
static void emit_queue_counter(text_buffer *b, const metrics *m, const char *name, const char *help,
                               size_t field)
{
    char queue[512];
    emit(b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (size_t i = 0; i < m->cfg->consumer_count; i++) {
        uint64_t value;
        memcpy(&value, (const char *)&m->consumers[i] + field, sizeof value);
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        emit(b, "%s{queue=\"%s\"} %" PRIu64 "\n", name, queue, value);
    }
}

/* What /proc says about this process; false when it cannot be read (not Linux, no /proc). */
typedef struct process_sample {
    double cpu_seconds, start_time_seconds;
    uint64_t resident_bytes, virtual_bytes;
    long open_fds;     /* -1: unknown */
    long long max_fds; /* -1: unknown or unlimited */
} process_sample;

/* Boot time (btime of /proc/stat), seconds since the epoch; 0 when unknown. */
static long long boot_time_seconds(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    char line[256];
    long long btime = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %lld", &btime) == 1)
            break;
    fclose(f);
    return btime;
}

static bool process_read(process_sample *p)
{
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return false;
    char line[1024];
    bool got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
     * from the last ')'. After it: field 3 (state) ... 14 utime, 15 stime, 22 starttime (clock
     * ticks), 23 vsize (bytes), 24 rss (pages). */
    const char *rest = got ? strrchr(line, ')') : NULL;
    if (!rest)
        return false;
    unsigned long long utime, stime, starttime, vsize;
    long long rss;
    if (sscanf(rest + 1,
               " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
               "%llu %llu %lld",
               &utime, &stime, &starttime, &vsize, &rss) != 5)
        return false;
    long ticks = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    if (ticks <= 0 || page <= 0)
        return false;
    p->cpu_seconds = (double)(utime + stime) / (double)ticks;
    long long btime = boot_time_seconds();
    p->start_time_seconds = btime > 0 ? (double)btime + (double)starttime / (double)ticks : 0;
    p->virtual_bytes = vsize;
    p->resident_bytes = rss > 0 ? (uint64_t)rss * (uint64_t)page : 0;
    p->open_fds = -1;
    DIR *dir = opendir("/proc/self/fd");
    if (dir) {
        long n = 0;
        for (struct dirent *e; (e = readdir(dir)) != NULL;)
            if (e->d_name[0] != '.')
                n++;
        closedir(dir);
        p->open_fds = n - 1; /* not the descriptor opendir itself holds */
    }
    struct rlimit limit;
    p->max_fds = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                     ? (long long)limit.rlim_cur
                     : -1;
    return true;
}

static void render_process(text_buffer *b)
{
    process_sample p;
    if (!process_read(&p))
        return;
    emit(b, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\n"
            "process_cpu_seconds_total %.2f\n"
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\n"
            "process_resident_memory_bytes %" PRIu64 "\n"
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\n"
            "process_virtual_memory_bytes %" PRIu64 "\n",
         p.cpu_seconds, p.resident_bytes, p.virtual_bytes);
    if (p.start_time_seconds > 0)
        emit(b, "# HELP process_start_time_seconds Start time of the process since unix epoch in "
                "seconds.\n"
                "# TYPE process_start_time_seconds gauge\n"
                "process_start_time_seconds %.2f\n",
             p.start_time_seconds);
    if (p.open_fds >= 0)
        emit(b, "# HELP process_open_fds Number of open file descriptors.\n"
                "# TYPE process_open_fds gauge\n"
                "process_open_fds %ld\n",
             p.open_fds);
    if (p.max_fds >= 0)
        emit(b, "# HELP process_max_fds Maximum number of open file descriptors.\n"
                "# TYPE process_max_fds gauge\n"
                "process_max_fds %lld\n",
             p.max_fds);
}

int metrics_render(const metrics *m, char **out, size_t *len)
{
    text_buffer b = {.cap = 4096};
    b.data = malloc(b.cap);
    if (!b.data)
        return -1;
    b.data[0] = '\0';
    size_t n = m->cfg->consumer_count;
    char queue[512];

    emit(&b, "# HELP idemq_build_info The version of this idemq binary.\n"
             "# TYPE idemq_build_info gauge\n"
             "idemq_build_info{version=\"%s\"} 1\n",
         IDEMQ_VERSION);
    emit(&b, "# HELP idemq_messages_total Messages settled, by outcome.\n"
             "# TYPE idemq_messages_total counter\n");
    for (size_t i = 0; i < n; i++) {
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        for (int label = 0; label < OUTCOME_LABEL_COUNT; label++)
            emit(&b, "idemq_messages_total{queue=\"%s\",outcome=\"%s\"} %" PRIu64 "\n", queue,
                 outcome_label_name((outcome_label)label), m->consumers[i].counts[label]);
    }
    emit(&b, "# HELP idemq_retry_recovered_total Messages processed after at least one retry.\n"
             "# TYPE idemq_retry_recovered_total counter\n");
    for (size_t i = 0; i < n; i++) {
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        emit(&b, "idemq_retry_recovered_total{queue=\"%s\"} %" PRIu64 "\n", queue,
             m->consumers[i].recovered);
    }
    emit(&b, "# HELP idemq_dead_lettered_total Dead letters confirmed by the broker, by class: "
             "non_retryable (failed at once: bad body, illegal transition, ...) or "
             "retries_exhausted.\n"
             "# TYPE idemq_dead_lettered_total counter\n");
    for (size_t i = 0; i < n; i++) {
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        for (size_t k = 0; k < 2; k++)
            emit(&b, "idemq_dead_lettered_total{queue=\"%s\",class=\"%s\"} %" PRIu64 "\n", queue,
                 dead_letter_classes[k], m->consumers[i].dead_lettered[k]);
    }
    emit(&b, "# HELP idemq_retry_dead_lettered_total Messages dead-lettered after at least one "
             "retry.\n"
             "# TYPE idemq_retry_dead_lettered_total counter\n");
    for (size_t i = 0; i < n; i++) {
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        emit(&b, "idemq_retry_dead_lettered_total{queue=\"%s\"} %" PRIu64 "\n", queue,
             m->consumers[i].retry_dead_lettered);
    }
    emit(&b, "# HELP idemq_handler_duration_seconds Time of one dedup + handler transaction.\n"
             "# TYPE idemq_handler_duration_seconds histogram\n");
    for (size_t i = 0; i < n; i++) {
        const consumer_metrics *c = &m->consumers[i];
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        uint64_t cumulative = 0;
        for (size_t k = 0; k < BUCKETS; k++) {
            cumulative += c->buckets[k];
            emit(&b, "idemq_handler_duration_seconds_bucket{queue=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                 queue, bucket_bounds[k], cumulative);
        }
        emit(&b, "idemq_handler_duration_seconds_bucket{queue=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
             queue, c->observations);
        emit(&b, "idemq_handler_duration_seconds_sum{queue=\"%s\"} %.9f\n", queue, c->seconds_sum);
        emit(&b, "idemq_handler_duration_seconds_count{queue=\"%s\"} %" PRIu64 "\n", queue,
             c->observations);
    }
    emit(&b, "# HELP idemq_inflight Deliveries received and not yet settled.\n"
             "# TYPE idemq_inflight gauge\n");
    for (size_t i = 0; i < n; i++) {
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        emit(&b, "idemq_inflight{queue=\"%s\"} %" PRId64 "\n", queue, m->consumers[i].inflight);
    }
    emit(&b, "# HELP idemq_held Deliveries held unacked while consumption is paused (not "
             "requeued: a requeue would spend a broker delivery attempt).\n"
             "# TYPE idemq_held gauge\n");
    for (size_t i = 0; i < n; i++) {
        escape_label(m->cfg->consumers[i].queue, queue, sizeof queue);
        emit(&b, "idemq_held{queue=\"%s\"} %" PRId64 "\n", queue, m->consumers[i].held);
    }
    emit(&b, "# HELP idemq_paused Whether consumption is paused, by reason: database "
             "(unreachable or read-only), schema (a table, column or grant is missing) or tls "
             "(TLS to MySQL fails: a certificate, or TLS required on one side only).\n"
             "# TYPE idemq_paused gauge\n"
             "idemq_paused{reason=\"database\"} %d\n"
             "idemq_paused{reason=\"schema\"} %d\n"
             "idemq_paused{reason=\"tls\"} %d\n",
         m->pause == METRICS_PAUSE_DATABASE ? 1 : 0, m->pause == METRICS_PAUSE_SCHEMA ? 1 : 0,
         m->pause == METRICS_PAUSE_TLS ? 1 : 0);
    emit(&b, "# HELP idemq_schema_errors_total Pauses caused by a schema error.\n"
             "# TYPE idemq_schema_errors_total counter\n"
             "idemq_schema_errors_total %" PRIu64 "\n",
         m->schema_errors);
    emit(&b, "# HELP idemq_up Whether a dependency answers (1) or not (0).\n"
             "# TYPE idemq_up gauge\n"
             "idemq_up{dependency=\"rabbitmq\"} %d\n"
             "idemq_up{dependency=\"mysql\"} %d\n",
         m->up[METRICS_DEP_RABBITMQ] ? 1 : 0, m->up[METRICS_DEP_MYSQL] ? 1 : 0);
    char node[520], node_label[1100];
    db_nodes_current(node, sizeof node);
    escape_label(node, node_label, sizeof node_label);
    emit(&b, "# HELP idemq_mysql_node The MySQL node idemq works on (mysql.url or one of "
             "mysql.urls), by host:port or socket.\n"
             "# TYPE idemq_mysql_node gauge\n");
    if (node[0])
        emit(&b, "idemq_mysql_node{node=\"%s\"} 1\n", node_label);
    emit(&b, "# HELP idemq_mysql_failovers_total Times the MySQL node in use changed.\n"
             "# TYPE idemq_mysql_failovers_total counter\n"
             "idemq_mysql_failovers_total %" PRIu64 "\n"
             "# HELP idemq_mysql_commit_conflicts_total COMMITs a database cluster refused for a "
             "conflict with another node's write (Galera certification, Group Replication), "
             "each run again in place.\n"
             "# TYPE idemq_mysql_commit_conflicts_total counter\n"
             "idemq_mysql_commit_conflicts_total %" PRIu64 "\n",
         db_nodes_failovers(), db_nodes_conflicts());
    emit(&b, "# HELP idemq_broker_blocked Whether RabbitMQ blocks the connection (a resource "
             "alarm).\n"
             "# TYPE idemq_broker_blocked gauge\n"
             "idemq_broker_blocked %d\n"
             "# HELP idemq_broker_blocked_total connection.blocked notifications received.\n"
             "# TYPE idemq_broker_blocked_total counter\n"
             "idemq_broker_blocked_total %" PRIu64 "\n",
         m->broker_blocked ? 1 : 0, m->broker_blocked_total);
    emit_queue_counter(&b, m, "idemq_copies_unpublishable_total",
                       "Retry or dead-letter copies that could not be encoded within frame_max; "
                       "the original was rejected to the work queue's own dead-letter route.",
                       offsetof(consumer_metrics, unpublishable));
    emit_queue_counter(&b, m, "idemq_consumer_cancels_total",
                       "Consumers RabbitMQ cancelled (basic.cancel: a consumer timeout, the queue "
                       "deleted, its quorum member removed); idemq subscribed again.",
                       offsetof(consumer_metrics, cancelled_by_broker));
    emit_queue_counter(&b, m, "idemq_dedup_cache_hits_total",
                       "Deliveries settled as deduped from dedup.cache, without a transaction: "
                       "their key was committed through this instance within dedup.cache_ttl "
                       "(counted in idemq_messages_total{outcome=\"deduped\"} too).",
                       offsetof(consumer_metrics, seen_key_hits));
    if (m->ready) {
        char reason[256];
        emit(&b, "# HELP idemq_ready Whether /readyz answers 200: connected to RabbitMQ and "
                 "MySQL, consuming, not paused, not shutting down.\n"
                 "# TYPE idemq_ready gauge\n"
                 "idemq_ready %d\n",
             m->ready(m->ready_ctx, reason, sizeof reason) ? 1 : 0);
    }
    if (m->outbox) {
        metrics_outbox_sample o = {0};
        m->outbox(m->outbox_ctx, &o);
        emit(&b, "# HELP idemq_outbox_pending Outbox rows not yet published.\n"
                 "# TYPE idemq_outbox_pending gauge\n"
                 "idemq_outbox_pending %" PRIu64 "\n"
                 "# HELP idemq_outbox_oldest_pending_seconds Age of the oldest outbox row not yet "
                 "published (0 when there is none).\n"
                 "# TYPE idemq_outbox_oldest_pending_seconds gauge\n"
                 "idemq_outbox_oldest_pending_seconds %.3f\n"
                 "# HELP idemq_outbox_published_total Outbox rows this process published "
                 "(confirmed by the broker).\n"
                 "# TYPE idemq_outbox_published_total counter\n"
                 "idemq_outbox_published_total %" PRIu64 "\n"
                 "# HELP idemq_outbox_unroutable_total Outbox rows this process marked "
                 "unroutable (returned by the broker, or their exchange does not exist).\n"
                 "# TYPE idemq_outbox_unroutable_total counter\n"
                 "idemq_outbox_unroutable_total %" PRIu64 "\n"
                 "# HELP idemq_outbox_relay_leader Whether this instance's outbox relay holds "
                 "the lease (publishes).\n"
                 "# TYPE idemq_outbox_relay_leader gauge\n"
                 "idemq_outbox_relay_leader %d\n",
             o.pending, o.oldest_pending_s, o.published_total, o.unroutable_total,
             o.leader ? 1 : 0);
    }
    render_process(&b);
    if (b.failed) {
        free(b.data);
        return -1;
    }
    *out = b.data;
    *len = b.len;
    return 0;
}
