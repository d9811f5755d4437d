/*
 * Unit tests for adapter/ops/metrics: what the dashboards and alert rules of examples/grafana and
 * examples/prometheus read — idemq_build_info, dead letters by class, failed retries,
 * idemq_ready from the readiness probe, the process_* family — rendered without a server. The
 * page's syntax is checked strictly by test_http (and by promtool in test_observability); here
 * the values.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "ops/metrics.h"

static config_consumer consumers[2] = {{.queue = (char *)"payments"}, {.queue = (char *)"refunds"}};
static config cfg = {.consumers = consumers, .consumer_count = 2};

/* The page's value of `sample` (name and labels exactly as rendered); NAN when absent. */
static double value_of(const char *page, const char *sample)
{
    size_t n = strlen(sample);
    for (const char *line = page; *line;) {
        if (strncmp(line, sample, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
        const char *next = strchr(line, '\n');
        if (!next)
            break;
        line = next + 1;
    }
    return NAN;
}

static char *render(const metrics *m)
{
    char *page = NULL;
    size_t len = 0;
    cr_assert_eq(metrics_render(m, &page, &len), 0);
    cr_assert_eq(strlen(page), len);
    return page;
}

Test(metrics, build_info_names_this_version)
{
    metrics *m = metrics_new(&cfg);
    char *page = render(m);
    char sample[128];
    snprintf(sample, sizeof sample, "idemq_build_info{version=\"%s\"}", IDEMQ_VERSION);
    cr_assert_eq(value_of(page, sample), 1.0, "%s missing:\n%s", sample, page);
    cr_assert(strstr(page, "# TYPE idemq_build_info gauge\n"));
    free(page);
    metrics_free(m);
}

Test(metrics, every_dead_letter_series_exists_at_zero_from_the_start)
{
    /* increase() and rate() see the first dead letter only if the series existed before it. */
    metrics *m = metrics_new(&cfg);
    char *page = render(m);
    const char *samples[] = {
        "idemq_dead_lettered_total{queue=\"payments\",class=\"non_retryable\"}",
        "idemq_dead_lettered_total{queue=\"payments\",class=\"retries_exhausted\"}",
        "idemq_dead_lettered_total{queue=\"refunds\",class=\"non_retryable\"}",
        "idemq_dead_lettered_total{queue=\"refunds\",class=\"retries_exhausted\"}",
        "idemq_retry_dead_lettered_total{queue=\"payments\"}",
        "idemq_retry_dead_lettered_total{queue=\"refunds\"}",
    };
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
        cr_assert_eq(value_of(page, samples[i]), 0.0, "%s not 0:\n%s", samples[i], page);
    free(page);
    metrics_free(m);
}

Test(metrics, dead_letters_count_by_class_and_after_retries_as_failed_retries)
{
    metrics *m = metrics_new(&cfg);
    metrics_dead_lettered(m, 0, ERROR_CLASS_NON_RETRYABLE, false); /* a bad body */
    metrics_dead_lettered(m, 0, ERROR_CLASS_NON_RETRYABLE, true);  /* ladder, then illegal */
    metrics_dead_lettered(m, 0, ERROR_CLASS_RETRIES_EXHAUSTED, true);
    metrics_dead_lettered(m, 1, ERROR_CLASS_RETRIES_EXHAUSTED, false); /* max_retries 0 */
    metrics_dead_lettered(m, 2, ERROR_CLASS_NON_RETRYABLE, true);      /* no such consumer */
    metrics_retry_recovered(m, 0);
    char *page = render(m);
    cr_assert_eq(
        value_of(page, "idemq_dead_lettered_total{queue=\"payments\",class=\"non_retryable\"}"), 2);
    cr_assert_eq(
        value_of(page, "idemq_dead_lettered_total{queue=\"payments\",class=\"retries_exhausted\"}"),
        1);
    cr_assert_eq(
        value_of(page, "idemq_dead_lettered_total{queue=\"refunds\",class=\"retries_exhausted\"}"),
        1);
    cr_assert_eq(
        value_of(page, "idemq_dead_lettered_total{queue=\"refunds\",class=\"non_retryable\"}"), 0);
    /* Retry success = recovered / (recovered + retry_dead_lettered) = 1 / 3 for payments. */
    cr_assert_eq(value_of(page, "idemq_retry_dead_lettered_total{queue=\"payments\"}"), 2);
    cr_assert_eq(value_of(page, "idemq_retry_recovered_total{queue=\"payments\"}"), 1);
    cr_assert_eq(value_of(page, "idemq_retry_dead_lettered_total{queue=\"refunds\"}"), 0);
    free(page);
    metrics_free(m);
}

static bool ready_answer;
static int ready_calls;

static bool fake_ready(void *ctx, char *reason, size_t reason_len)
{
    cr_assert_eq(ctx, &ready_answer);
    snprintf(reason, reason_len, "%s", ready_answer ? "" : "database unavailable");
    ready_calls++;
    return ready_answer;
}

Test(metrics, idemq_ready_is_the_probes_answer_at_each_render)
{
    metrics *m = metrics_new(&cfg);
    char *page = render(m);
    cr_assert_null(strstr(page, "idemq_ready"), "no probe, no idemq_ready:\n%s", page);
    free(page);

    metrics_set_ready_probe(m, fake_ready, &ready_answer);
    ready_answer = true;
    page = render(m);
    cr_assert_eq(value_of(page, "idemq_ready"), 1.0, "%s", page);
    free(page);
    ready_answer = false;
    page = render(m);
    cr_assert_eq(value_of(page, "idemq_ready"), 0.0, "%s", page);
    cr_assert_eq(ready_calls, 2);
    free(page);
    metrics_free(m);
}

static metrics_outbox_sample outbox_sample;
static int outbox_calls;

static void fake_outbox(void *ctx, metrics_outbox_sample *out)
{
    cr_assert_eq(ctx, &outbox_sample);
    *out = outbox_sample;
    outbox_calls++;
}

Test(metrics, outbox_series_are_the_relays_values_at_each_render_and_absent_without_a_relay)
{
    metrics *m = metrics_new(&cfg);
    char *page = render(m);
    cr_assert_null(strstr(page, "idemq_outbox_"), "outbox series without a probe:\n%s", page);
    free(page);

    metrics_set_outbox_probe(m, fake_outbox, &outbox_sample);
    outbox_sample = (metrics_outbox_sample){.pending = 7, .oldest_pending_s = 12.5,
                                            .published_total = 40, .unroutable_total = 2,
                                            .leader = true};
    page = render(m);
    cr_assert_eq(value_of(page, "idemq_outbox_pending"), 7, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_oldest_pending_seconds"), 12.5, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_published_total"), 40, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_unroutable_total"), 2, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_relay_leader"), 1, "%s", page);
    cr_assert(strstr(page, "# TYPE idemq_outbox_pending gauge\n"));
    cr_assert(strstr(page, "# TYPE idemq_outbox_oldest_pending_seconds gauge\n"));
    cr_assert(strstr(page, "# TYPE idemq_outbox_published_total counter\n"));
    cr_assert(strstr(page, "# TYPE idemq_outbox_unroutable_total counter\n"));
    cr_assert(strstr(page, "# TYPE idemq_outbox_relay_leader gauge\n"));
    free(page);

    /* Read again at the next render: a standby now, the backlog drained. */
    outbox_sample = (metrics_outbox_sample){.published_total = 47, .unroutable_total = 2};
    page = render(m);
    cr_assert_eq(value_of(page, "idemq_outbox_pending"), 0, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_oldest_pending_seconds"), 0, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_published_total"), 47, "%s", page);
    cr_assert_eq(value_of(page, "idemq_outbox_relay_leader"), 0, "%s", page);
    cr_assert_eq(outbox_calls, 2);
    free(page);

    metrics_set_outbox_probe(m, NULL, NULL);
    page = render(m);
    cr_assert_null(strstr(page, "idemq_outbox_"), "%s", page);
    free(page);
    metrics_free(m);
}

Test(metrics, process_metrics_describe_this_process)
{
    metrics *m = metrics_new(&cfg);
    char *page = render(m);
    double rss = value_of(page, "process_resident_memory_bytes");
    double vsize = value_of(page, "process_virtual_memory_bytes");
    double start = value_of(page, "process_start_time_seconds");
    double cpu = value_of(page, "process_cpu_seconds_total");
    double fds = value_of(page, "process_open_fds");
    double max_fds = value_of(page, "process_max_fds");
    cr_assert(rss > 1e5 && rss < 1e10, "resident %g:\n%s", rss, page);
    cr_assert(vsize >= rss, "virtual %g < resident %g", vsize, rss);
    /* Started (forked by Criterion) within the last few minutes, not in the future. */
    double now = (double)time(NULL);
    cr_assert(start > now - 600 && start <= now + 2, "start %f, now %f", start, now);
    cr_assert(cpu >= 0 && cpu < 600, "cpu %g", cpu);
    cr_assert(fds >= 3 && fds <= max_fds, "open fds %g, max %g", fds, max_fds);
    cr_assert(strstr(page, "# TYPE process_cpu_seconds_total counter\n"));
    cr_assert(strstr(page, "# TYPE process_resident_memory_bytes gauge\n"));

    /* Burning CPU shows: the counter is read at each render, not once. */
    volatile double sink = 0;
    clock_t until = clock() + CLOCKS_PER_SEC / 5;
    while (clock() < until)
        sink += 1.0;
    (void)sink; /* GCC 16 warns that a volatile only ever written is unused */
    char *later = render(m);
    cr_assert(value_of(later, "process_cpu_seconds_total") >= cpu + 0.1, "cpu %g then %g", cpu,
              value_of(later, "process_cpu_seconds_total"));
    /* The start time does not move between renders (an alert counts its changes as restarts). */
    cr_assert_eq(value_of(later, "process_start_time_seconds"), start);
    free(later);
    free(page);
    metrics_free(m);
}
