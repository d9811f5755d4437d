/*
 * Unit tests for adapter/config: the YAML contract, defaults, environment overrides, every class
 * of error with its file:line, the duration/size parsers and URL redaction.
 *
 * Each test writes its config into a fresh mkdtemp directory (Criterion forks per test, so the
 * directory and any setenv stay private to the test) and captures the error stream with
 * open_memstream.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/amqp_api.h"

#include "config/config.h"
#include "db/dsn.h"
#include "ops/log.h"

#ifndef IDEMQ_SOURCE_DIR
#define IDEMQ_SOURCE_DIR "."
#endif

static char tmpdir[64];

static void setup(void)
{
    /* The developer's shell may export these; tests that want them set them explicitly. */
    unsetenv("IDEMQ_AMQP_URL");
    unsetenv("IDEMQ_MYSQL_URL");
    strcpy(tmpdir, "/tmp/idemq-test-config-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp failed");
}

static void teardown(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    char path[512];

    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", tmpdir, e->d_name);
        if (unlink(path) != 0)
            rmdir(path);
    }
    closedir(d);
    rmdir(tmpdir);
}

TestSuite(config, .init = setup, .fini = teardown);

typedef struct result {
    int rc;
    config *cfg;
    char *errs;
    size_t errs_len;
    char path[256];
} result;

static void write_text(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static result load_path(const char *path)
{
    result r = {0};
    FILE *m = open_memstream(&r.errs, &r.errs_len);

    cr_assert_not_null(m);
    snprintf(r.path, sizeof r.path, "%s", path);
    r.rc = config_load(path, m, &r.cfg);
    cr_assert_eq(fclose(m), 0);
    /* The contract: a config on success, NULL on failure, never both or neither. */
    cr_assert_eq(r.rc == 0, r.cfg != NULL, "rc %d but cfg %p; errors:\n%s", r.rc, (void *)r.cfg,
                 r.errs);
    return r;
}

static result load_text(const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/idemq.yaml", tmpdir);
    write_text(path, text, strlen(text));
    return load_path(path);
}

static void result_free(result *r)
{
    config_free(r->cfg);
    free(r->errs);
}

/* True when the errors hold a line "PATH:LINE: ..." (line 0: "PATH: ...") containing needle. */
static bool has_error(const result *r, unsigned line, const char *needle)
{
    char prefix[320];
    size_t plen;

    if (line)
        snprintf(prefix, sizeof prefix, "%s:%u: ", r->path, line);
    else
        snprintf(prefix, sizeof prefix, "%s: ", r->path);
    plen = strlen(prefix);
    for (const char *p = r->errs; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n >= plen && !strncmp(p, prefix, plen)) {
            char *copy = strndup(p, n);
            bool found = strstr(copy, needle) != NULL;
            free(copy);
            if (found)
                return true;
        }
        p += n + (end != NULL);
    }
    return false;
}

#define assert_error(r, line, needle)                                                              \
    cr_assert(has_error(&(r), (line), (needle)),                                                   \
              "expected an error at line %u with '%s'; got:\n%s", (unsigned)(line), (needle),      \
              (r).errs)

/*
 * A valid config with one-line slots, so tests can plant a mistake at a known line:
 * A = line 3 (in amqp), M = line 6 (in mysql), T = line 7 (top level), C = line 11 (in the
 * consumer), H = line 19 (in the handler).
 */
enum { LINE_A = 3, LINE_M = 6, LINE_T = 7, LINE_C = 11, LINE_H = 19 };

static result load_slots(const char *a, const char *m, const char *t, const char *c, const char *h)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    result r;

    cr_assert_not_null(f);
    fputs("amqp:\n"
          "  url: \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n",
          f);
    fprintf(f, "  %s\n", a ? a : "");
    fputs("mysql:\n"
          "  url: \"mysql://root@127.0.0.1:3306/idemq\"\n",
          f);
    fprintf(f, "  %s\n", m ? m : "");
    fprintf(f, "%s\n", t ? t : "");
    fputs("consumers:\n"
          "  - queue: payments\n"
          "    handler_name: pay-callback\n",
          f);
    fprintf(f, "    %s\n", c ? c : "");
    fputs("    handler:\n"
          "      type: state_machine\n"
          "      table: orders\n"
          "      key_column: order_id\n"
          "      key_field: order_id\n"
          "      state_column: status\n"
          "      event_field: event_type\n",
          f);
    fprintf(f, "      %s\n", h ? h : "");
    fputs("      transitions:\n"
          "        PAY_SUCCESS: {from: [PAYING], to: PAID}\n",
          f);
    cr_assert_eq(fclose(f), 0);
    r = load_text(text);
    free(text);
    return r;
}

static const char contract_example[] =
    "amqp:  {url: \"amqp://guest:guest@127.0.0.1:5672/%2f\", prefetch: 64, heartbeat: 30s, "
    "max_body: 1MiB}\n"
    "mysql: {url: \"mysql://root@127.0.0.1:3306/idemq\", workers: 4}   # ?socket=/path\n"
    "log:   {level: info}          # debug | info | warn | error\n"
    "http:  {listen: \"127.0.0.1:9464\"}\n"
    "shutdown_timeout: 25s\n"
    "consumers:\n"
    "  - queue: payments\n"
    "    handler_name: pay-callback\n"
    "    declare: create          # create | passive\n"
    "    queue_type: quorum       # quorum | classic\n"
    "    retry: {max_retries: 6, base: 1s, jitter: 1s, max_delay: 1h}\n"
    "    handler:\n"
    "      type: state_machine\n"
    "      table: orders\n"
    "      key_column: order_id\n"
    "      key_field: order_id\n"
    "      state_column: status\n"
    "      event_field: event_type\n"
    "      on_illegal: dead_letter   # dead_letter | retry\n"
    "      transitions:\n"
    "        PAY_SUCCESS:    {from: [PAYING], to: PAID}\n"
    "        REFUND_START:   {from: [PAID], to: REFUNDING}\n"
    "        REFUND_SUCCESS: {from: [REFUNDING], to: REFUNDED}\n"
    "      set: {amount: amount}     # optional: column: field (dotted path)\n";

static void assert_transition(const config_transition *t, const char *event, const char *from,
                              const char *to)
{
    cr_assert_str_eq(t->event, event);
    cr_assert_eq(t->from_count, 1);
    cr_assert_str_eq(t->from[0], from);
    cr_assert_str_eq(t->to, to);
}

/* ------------------------------------------------------------------------------------------ */
/* Valid files                                                                                 */

Test(config, contract_example_loads_with_every_value)
{
    result r = load_text(contract_example);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.errs_len, 0);

    const config *c = r.cfg;
    cr_assert_str_eq(c->path, r.path);
    cr_assert_str_eq(c->amqp_urls[0], "amqp://guest:guest@127.0.0.1:5672/%2f");
    cr_assert_eq(c->prefetch, 64);
    cr_assert_eq(c->heartbeat_ms, 30000);
    cr_assert_eq(c->max_body, 1024 * 1024);
    cr_assert_str_eq(c->mysql_urls[0], "mysql://root@127.0.0.1:3306/idemq");
    cr_assert_eq(c->workers, 4);
    /* The default batch (32) lowered to a worker's share of the default prefetch: 64 / 4. */
    cr_assert_eq(c->batch, 16);
    cr_assert_eq(c->batch_linger_ms, 1);
    cr_assert_eq(c->log_level, CONFIG_LOG_INFO);
    cr_assert_str_eq(c->http_listen, "127.0.0.1:9464");
    cr_assert_eq(c->shutdown_timeout_ms, 25000);
    cr_assert_eq(c->consumer_count, 1);

    const config_consumer *k = &c->consumers[0];
    cr_assert_str_eq(k->queue, "payments");
    cr_assert_str_eq(k->handler_name, "pay-callback");
    cr_assert_eq(k->declare, CONFIG_DECLARE_CREATE);
    cr_assert_eq(k->queue_type, CONFIG_QUEUE_QUORUM);
    cr_assert_eq(k->retry.max_retries, 6);
    cr_assert_eq(k->retry.base_ms, 1000);
    cr_assert_eq(k->retry.jitter_ms, 1000);
    cr_assert_eq(k->retry.max_delay_ms, 3600000);
    cr_assert_eq(k->handler.type, CONFIG_HANDLER_STATE_MACHINE);

    const config_state_machine *sm = &k->handler.state_machine;
    cr_assert_str_eq(sm->table, "orders");
    cr_assert_str_eq(sm->key_column, "order_id");
    cr_assert_str_eq(sm->key_field, "order_id");
    cr_assert_str_eq(sm->state_column, "status");
    cr_assert_str_eq(sm->event_field, "event_type");
    cr_assert_eq(sm->on_illegal, CONFIG_ON_ILLEGAL_DEAD_LETTER);
    cr_assert_eq(sm->transition_count, 3);
    assert_transition(&sm->transitions[0], "PAY_SUCCESS", "PAYING", "PAID");
    assert_transition(&sm->transitions[1], "REFUND_START", "PAID", "REFUNDING");
    assert_transition(&sm->transitions[2], "REFUND_SUCCESS", "REFUNDING", "REFUNDED");
    cr_assert_eq(sm->set_count, 1);
    cr_assert_str_eq(sm->set[0].column, "amount");
    cr_assert_str_eq(sm->set[0].field, "amount");
    result_free(&r);
}

Test(config, shipped_example_file_loads)
{
    result r = load_path(IDEMQ_SOURCE_DIR "/examples/idemq.yaml");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->mysql_urls[0], "mysql://idemq:idemq@127.0.0.1:3306/idemq");
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://guest:guest@127.0.0.1:5672/%2f");
    cr_assert_eq(r.cfg->consumers[0].handler.state_machine.transition_count, 3);
    result_free(&r);
}

Test(config, minimal_config_gets_the_defaults)
{
    result r = load_text("amqp: {url: 'amqp://h'}\n"
                         "mysql: {url: 'mysql://h/db'}\n"
                         "consumers:\n"
                         "  - queue: q\n"
                         "    handler_name: h\n"
                         "    handler:\n"
                         "      table: t\n"
                         "      key_column: id\n"
                         "      key_field: id\n"
                         "      state_column: s\n"
                         "      event_field: e\n"
                         "      transitions: {GO: {from: A, to: B}}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    const config *c = r.cfg;
    cr_assert_eq(c->prefetch, 64);
    cr_assert_eq(c->heartbeat_ms, 30000);
    cr_assert_eq(c->max_body, 1 << 20);
    cr_assert_eq(c->workers, 4);
    cr_assert_eq(c->log_level, CONFIG_LOG_INFO);
    cr_assert_str_eq(c->http_listen, "127.0.0.1:9464");
    cr_assert_eq(c->shutdown_timeout_ms, 25000);
    const config_consumer *k = &c->consumers[0];
    cr_assert_eq(k->declare, CONFIG_DECLARE_CREATE);
    cr_assert_eq(k->queue_type, CONFIG_QUEUE_QUORUM);
    cr_assert_eq(k->retry.max_retries, 6);
    cr_assert_eq(k->retry.base_ms, 1000);
    cr_assert_eq(k->retry.jitter_ms, 1000);
    cr_assert_eq(k->retry.max_delay_ms, 3600000);
    cr_assert_eq(k->handler.type, CONFIG_HANDLER_STATE_MACHINE);
    cr_assert_eq(k->handler.state_machine.on_illegal, CONFIG_ON_ILLEGAL_DEAD_LETTER);
    cr_assert_eq(k->handler.state_machine.set_count, 0);
    cr_assert_null(k->handler.state_machine.set);
    /* A bare state after from: is a one-element list. */
    assert_transition(&k->handler.state_machine.transitions[0], "GO", "A", "B");
    result_free(&r);
}

Test(config, non_default_values_and_two_consumers)
{
    result r =
        load_text("amqp: {url: 'amqps://u:p@broker:5671/vh', prefetch: 1, heartbeat: 0,"
                  " max_body: 64KiB}\n"
                  "mysql: {url: 'mysql://u@/db?socket=/run/mysqld.sock', workers: 256}\n"
                  "log: {level: debug}\n"
                  "http: {listen: '[::1]:8080'}\n"
                  "shutdown_timeout: 500ms\n"
                  "consumers:\n"
                  "  - queue: a\n"
                  "    handler_name: ha\n"
                  "    declare: passive\n"
                  "    queue_type: classic\n"
                  "    retry: {max_retries: 0, base: 100ms, jitter: 0, max_delay: 2s}\n"
                  "    handler:\n"
                  "      type: state_machine\n"
                  "      table: t$1\n"
                  "      key_column: id\n"
                  "      key_field: payload.id\n"
                  "      state_column: s\n"
                  "      event_field: e\n"
                  "      on_illegal: retry\n"
                  "      transitions: {GO: {from: [A, B], to: C}}\n"
                  "      set: {amount: payload.amount, note: note}\n"
                  "  - queue: b\n"
                  "    handler_name: hb\n"
                  "    retry: {max_retries: 32}\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    const config *c = r.cfg;
    cr_assert_eq(c->prefetch, 1);
    cr_assert_eq(c->heartbeat_ms, 0);
    cr_assert_eq(c->max_body, 65536);
    cr_assert_eq(c->workers, 256);
    cr_assert_eq(c->log_level, CONFIG_LOG_DEBUG);
    cr_assert_str_eq(c->http_listen, "[::1]:8080");
    cr_assert_eq(c->shutdown_timeout_ms, 500);
    cr_assert_eq(c->consumer_count, 2);
    cr_assert_eq(c->consumers[0].declare, CONFIG_DECLARE_PASSIVE);
    cr_assert_eq(c->consumers[0].queue_type, CONFIG_QUEUE_CLASSIC);
    cr_assert_eq(c->consumers[0].retry.max_retries, 0);
    cr_assert_eq(c->consumers[0].retry.base_ms, 100);
    cr_assert_eq(c->consumers[0].retry.jitter_ms, 0);
    cr_assert_eq(c->consumers[0].retry.max_delay_ms, 2000);
    const config_state_machine *sm = &c->consumers[0].handler.state_machine;
    cr_assert_eq(sm->on_illegal, CONFIG_ON_ILLEGAL_RETRY);
    cr_assert_str_eq(sm->key_field, "payload.id");
    cr_assert_eq(sm->transitions[0].from_count, 2);
    cr_assert_str_eq(sm->transitions[0].from[1], "B");
    cr_assert_eq(sm->set_count, 2);
    cr_assert_str_eq(sm->set[0].field, "payload.amount");
    cr_assert_str_eq(sm->set[1].column, "note");
    cr_assert_str_eq(c->consumers[1].queue, "b");
    cr_assert_eq(c->consumers[1].retry.max_retries, 32);
    cr_assert_eq(c->consumers[1].retry.base_ms, 1000);
    result_free(&r);
}

/* ------------------------------------------------------------------------------------------ */
/* Environment                                                                                 */

Test(config, environment_overrides_both_urls)
{
    setenv("IDEMQ_AMQP_URL", "amqp://env:envpw@rabbit:5672/%2f", 1);
    setenv("IDEMQ_MYSQL_URL", "mysql://env:envpw@db:3306/idemq", 1);
    result r = load_text(contract_example);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://env:envpw@rabbit:5672/%2f");
    cr_assert_str_eq(r.cfg->mysql_urls[0], "mysql://env:envpw@db:3306/idemq");
    result_free(&r);
}

Test(config, environment_makes_urls_optional)
{
    setenv("IDEMQ_AMQP_URL", "amqp://rabbit", 1);
    setenv("IDEMQ_MYSQL_URL", "mysql://db/idemq", 1);
    result r =
        load_text("consumers:\n"
                  "  - queue: q\n"
                  "    handler_name: h\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://rabbit");
    cr_assert_str_eq(r.cfg->mysql_urls[0], "mysql://db/idemq");
    result_free(&r);
}

Test(config, missing_urls_mention_the_environment)
{
    setenv("IDEMQ_AMQP_URL", "", 1); /* empty counts as unset */
    result r =
        load_text("consumers:\n"
                  "  - queue: q\n"
                  "    handler_name: h\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n");
    cr_assert_eq(r.rc, -2, "rc %d, errors:\n%s", r.rc, r.errs);
    assert_error(r, 1, "missing required key 'amqp.url'");
    assert_error(r, 1, "IDEMQ_AMQP_URL");
    assert_error(r, 1, "missing required key 'mysql.url'");
    assert_error(r, 1, "IDEMQ_MYSQL_URL");
    result_free(&r);
}

Test(config, bad_environment_url_is_reported_without_password)
{
    setenv("IDEMQ_AMQP_URL", "http://user:hunter2@rabbit", 1);
    result r = load_text(contract_example);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 0, "IDEMQ_AMQP_URL");
    assert_error(r, 0, "must start with amqp:// or amqps://");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);
}

/* ------------------------------------------------------------------------------------------ */
/* Errors: all at once, each with its line                                                     */

Test(config, five_mistakes_are_all_reported_with_their_lines)
{
    result r = load_text("amqp:\n"                                             /* 1 */
                         "  url: \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n"  /* 2 */
                         "  prefech: 64\n"                                     /* 3 */
                         "mysql:\n"                                            /* 4 */
                         "  url: \"mysql://root@127.0.0.1:3306/idemq\"\n"      /* 5 */
                         "  workers: 0\n"                                      /* 6 */
                         "log:\n"                                              /* 7 */
                         "  level: verbose\n"                                  /* 8 */
                         "shutdown_timeout: 25x\n"                             /* 9 */
                         "consumers:\n"                                        /* 10 */
                         "  - queue: payments\n"                               /* 11 */
                         "    handler_name: pay-callback\n"                    /* 12 */
                         "    handler:\n"                                      /* 13 */
                         "      type: state_machine\n"                         /* 14 */
                         "      table: \"orders; DROP TABLE x\"\n"             /* 15 */
                         "      key_column: order_id\n"                        /* 16 */
                         "      key_field: order_id\n"                         /* 17 */
                         "      state_column: status\n"                        /* 18 */
                         "      event_field: event_type\n"                     /* 19 */
                         "      transitions:\n"                                /* 20 */
                         "        PAY_SUCCESS: {from: [PAYING], to: PAID}\n"); /* 21 */
    cr_assert_eq(r.rc, -5, "rc %d, errors:\n%s", r.rc, r.errs);
    assert_error(r, 3, "unknown key 'amqp.prefech' (did you mean 'amqp.prefetch'?)");
    assert_error(r, 6, "mysql.workers: must be between 1 and 256, got 0");
    assert_error(r, 8, "log.level: 'verbose' is not one of: debug, info, warn, error");
    assert_error(r, 9, "shutdown_timeout: '25x' is not a valid duration");
    assert_error(r, 15,
                 "consumers[0].handler.table: 'orders; DROP TABLE x' is not a valid SQL "
                 "identifier");

    /* One line per problem, in file order. */
    size_t lines = 0;
    for (const char *p = r.errs; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 5, "errors:\n%s", r.errs);
    const char *l3 = strstr(r.errs, ":3: "), *l6 = strstr(r.errs, ":6: "),
               *l8 = strstr(r.errs, ":8: "), *l9 = strstr(r.errs, ":9: "),
               *l15 = strstr(r.errs, ":15: ");
    cr_assert(l3 < l6 && l6 < l8 && l8 < l9 && l9 < l15, "not in line order:\n%s", r.errs);
    result_free(&r);
}

Test(config, errors_stream_may_be_null)
{
    config *cfg = (config *)1;
    char path[256];
    snprintf(path, sizeof path, "%s/x.yaml", tmpdir);
    write_text(path, "amqp: {prefetch: 0}\n", 20);
    /* prefetch out of range, amqp.url, mysql.url and consumers missing. */
    cr_assert_eq(config_load(path, NULL, &cfg), -4);
    cr_assert_null(cfg);
}

Test(config, unknown_keys_suggest_or_list)
{
    result r = load_slots("heartbaet: 10s", NULL, "consumer:", "handlr_name: x", "tabel: t");
    assert_error(r, LINE_A, "unknown key 'amqp.heartbaet' (did you mean 'amqp.heartbeat'?)");
    assert_error(r, LINE_T, "unknown key 'consumer' (did you mean 'consumers'?)");
    assert_error(r, LINE_C, "did you mean 'consumers[0].handler_name'?");
    assert_error(r, LINE_H, "did you mean 'consumers[0].handler.table'?");
    cr_assert_eq(r.rc, -4, "errors:\n%s", r.errs);
    result_free(&r);

    r = load_slots("completely_different: 1", NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, LINE_A,
                 "unknown key 'amqp.completely_different' (known keys in amqp: url, urls, "
                 "prefetch, heartbeat, max_body, tls"); /* more may follow */
    result_free(&r);
}

typedef struct slot_case {
    char slot; /* A, M, T, C or H */
    const char *text;
    const char *error; /* NULL: must load */
} slot_case;

static result load_case(const slot_case *c)
{
    return load_slots(c->slot == 'A' ? c->text : NULL, c->slot == 'M' ? c->text : NULL,
                      c->slot == 'T' ? c->text : NULL, c->slot == 'C' ? c->text : NULL,
                      c->slot == 'H' ? c->text : NULL);
}

static unsigned slot_line(char slot)
{
    switch (slot) {
    case 'A':
        return LINE_A;
    case 'M':
        return LINE_M;
    case 'T':
        return LINE_T;
    case 'C':
        return LINE_C;
    default:
        return LINE_H;
    }
}

static void run_cases(const slot_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        result r = load_case(&cases[i]);
        if (!cases[i].error) {
            cr_assert_eq(r.rc, 0, "'%s' should load; errors:\n%s", cases[i].text, r.errs);
        } else {
            cr_assert_eq(r.rc, -1, "'%s': rc %d, errors:\n%s", cases[i].text, r.rc, r.errs);
            cr_assert(has_error(&r, slot_line(cases[i].slot), cases[i].error),
                      "'%s': expected '%s' at line %u; got:\n%s", cases[i].text, cases[i].error,
                      slot_line(cases[i].slot), r.errs);
        }
        result_free(&r);
    }
}

Test(config, bad_enum_values_list_the_allowed_ones)
{
    static const slot_case cases[] = {
        {'T', "log: {level: loud}", "log.level: 'loud' is not one of: debug, info, warn, error"},
        {'T', "log: {level: INFO}", "'INFO' is not one of: debug, info, warn, error"},
        {'C', "declare: maybe", "consumers[0].declare: 'maybe' is not one of: create, passive"},
        {'C', "queue_type: stream",
         "consumers[0].queue_type: 'stream' is not one of: quorum, "
         "classic"},
        {'H', "on_illegal: ignore",
         "consumers[0].handler.on_illegal: 'ignore' is not one of: "
         "dead_letter, retry"},
        {'T', "log: {level: warn}", NULL},
        {'T', "log: {level: error}", NULL},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, unknown_handler_type_stops_at_one_error)
{
    /* The other handler keys cannot be judged without a known type: one error, not seven. */
    result r = load_text("amqp: {url: 'amqp://h'}\n"
                         "mysql: {url: 'mysql://h/db'}\n"
                         "consumers:\n"
                         "  - queue: q\n"
                         "    handler_name: h\n"
                         "    handler:\n"
                         "      type: lua\n"
                         "      statements: []\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 7,
                 "consumers[0].handler.type: 'lua' is not one of: state_machine, sql, plugin");
    result_free(&r);
}

Test(config, numbers_out_of_range)
{
    static const slot_case cases[] = {
        {'A', "prefetch: 0", "amqp.prefetch: must be between 1 and 65535, got 0"},
        {'A', "prefetch: 65536", "amqp.prefetch: must be between 1 and 65535, got 65536"},
        {'A', "prefetch: -1", "amqp.prefetch: must be between 1 and 65535, got -1"},
        {'A', "prefetch: 99999999999999999999999", "must be between 1 and 65535"},
        {'A', "prefetch: 65535", NULL},
        {'M', "workers: 257", "mysql.workers: must be between 1 and 256, got 257"},
        {'A', "max_body: 512", "amqp.max_body: must be between 1KiB and 64MiB, got 512"},
        {'A', "max_body: 65MiB", "amqp.max_body: must be between 1KiB and 64MiB, got 65MiB"},
        {'A', "max_body: 64MiB", NULL},
        {'A', "max_body: 1KB", "amqp.max_body: must be between 1KiB and 64MiB, got 1KB"},
        {'A', "heartbeat: 2h", "amqp.heartbeat: must be between 0ms and 1h, got 2h"},
        {'A', "heartbeat: 1500ms", "amqp.heartbeat: must be whole seconds, got 1500ms"},
        {'A', "heartbeat: 0", NULL},
        {'T', "shutdown_timeout: 2h", "shutdown_timeout: must be between 0ms and 1h, got 2h"},
        {'C', "retry: {max_retries: 33}",
         "consumers[0].retry.max_retries: must be between 0 and "
         "32, got 33"},
        {'C', "retry: {max_retries: 0}", NULL},
        {'C', "retry: {base: 0s}", "consumers[0].retry.base: must be between 1ms and 7d, got 0s"},
        {'C', "retry: {max_delay: 0}", "consumers[0].retry.max_delay: must be between 1ms and 7d"},
        {'C', "retry: {jitter: 2d}", "consumers[0].retry.jitter: must be between 0ms and 1d"},
        {'C', "retry: {jitter: 0}", NULL},
        {'C', "retry: {base: 2h}", "consumers[0].retry: base (2h) is larger than max_delay (1h)"},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, wrong_types)
{
    static const slot_case cases[] = {
        {'A', "prefetch: \"64\"", "amqp.prefetch: expected an integer, got a quoted string"},
        {'A', "prefetch: 1.5", "amqp.prefetch: expected an integer, got '1.5'"},
        {'A', "prefetch: 0x40", "amqp.prefetch: expected an integer, got '0x40'"},
        {'A', "prefetch: [64]", "amqp.prefetch: expected an integer, got a list"},
        {'A', "prefetch:", "amqp.prefetch: no value given"},
        {'M', "workers: {n: 4}", "mysql.workers: expected an integer, got a mapping"},
        {'T', "log: info", "log: expected a mapping, got a string"},
        {'T', "log:", "log: expected a mapping, got no value"},
        {'T', "http: {listen: 9464}", "http.listen: '9464' is not a listen address: has no port"},
        {'C', "retry: 5", "consumers[0].retry: expected a mapping, got a number"},
        {'C', "declare: [create]",
         "consumers[0].declare: expected one of: create, passive, "
         "got a list"},
        {'H', "set: [amount]",
         "consumers[0].handler.set: expected a mapping of column: field, "
         "got a list"},
        {'H', "set: {amount: [a]}",
         "consumers[0].handler.set.amount: expected a message field, "
         "got a list"},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, listen_addresses)
{
    static const slot_case cases[] = {
        {'T', "http: {listen: '0.0.0.0:9464'}", NULL},
        {'T', "http: {listen: 'localhost:1'}", NULL},
        {'T', "http: {listen: ':9464'}",
         "http.listen: ':9464' is not a listen address: has no host"},
        {'T', "http: {listen: 'h:0'}", NULL}, /* 0: the kernel picks a free port */
        {'T', "http: {listen: 'h:65536'}", "has an invalid port (expected 0..65535)"},
        {'T', "http: {listen: '[::1'}", "unterminated IPv6 address"},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, urls_are_checked_without_leaking_passwords)
{
    result r =
        load_text("amqp: {url: 'http://guest:hunter2@h:5672/'}\n"
                  "mysql: {url: 'mysql://root:hunter3@db:99999/x'}\n"
                  "consumers:\n"
                  "  - queue: q\n"
                  "    handler_name: h\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n");
    cr_assert_eq(r.rc, -2, "errors:\n%s", r.errs);
    assert_error(r, 1, "amqp.url: 'http://guest:***@h:5672/' must start with amqp:// or amqps://");
    assert_error(r, 2, "mysql.url: 'mysql://root:***@db:99999/x' has an invalid port");
    cr_assert_null(strstr(r.errs, "hunter"), "password leaked:\n%s", r.errs);
    result_free(&r);

    /* The slot template already has amqp.url, so these replace it through a second file. */
    static const struct {
        const char *url, *error;
    } cases[] = {
        {"amqp://", "amqp.url: 'amqp://' has no host"},
        {"amqp://u:p@/vh", "amqp.url: 'amqp://u:***@/vh' has no host"},
        {"amqp://h /", "contains spaces or control characters"},
        {"amqp://h:x", "has an invalid port"},
        {"amqp://[::1]:5672/vh", NULL},
        {"amqps://u:p@h:5671", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "amqp: {url: '%s'}\n"
                 "mysql: {url: 'mysql://h/db'}\n"
                 "consumers:\n"
                 "  - {queue: q, handler_name: h, handler: {table: t, key_column: id, "
                 "key_field: id, state_column: s, event_field: e, "
                 "transitions: {X: {from: [A], to: B}}}}\n",
                 cases[i].url);
        r = load_text(text);
        if (cases[i].error) {
            cr_assert_eq(r.rc, -1, "'%s': errors:\n%s", cases[i].url, r.errs);
            assert_error(r, 1, cases[i].error);
        } else {
            cr_assert_eq(r.rc, 0, "'%s': errors:\n%s", cases[i].url, r.errs);
        }
        result_free(&r);
    }
    /* A unix socket needs no host. */
    r = load_text("amqp: {url: 'amqp://h'}\n"
                  "mysql: {url: 'mysql://u@/db?socket=/tmp/m.sock'}\n"
                  "consumers:\n"
                  "  - queue: q\n"
                  "    handler_name: h\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    result_free(&r);

    /* The MySQL grammar's own rules (db/dsn builds connections with the same parser) fail at
     * load, with the line, not at the first connect. */
    static const struct {
        const char *url, *error;
    } mysql_cases[] = {
        {"mysql://u:hunter4@h:3306", "mysql.url: 'mysql://u:***@h:3306': a database name is "
                                     "required"},
        {"mysql://u:hunter4@h/db?sockt=/x", "mysql.url: 'mysql://u:***@h/db?sockt=/x': unknown "
                                            "parameter 'sockt' (known: socket)"},
        {"mysql://u:hunter4@h/db%00", "database name is malformed or too long"},
        {"mysql://u:hunter4@h/db?socket=/run/m.sock", NULL},
        {"mysql://u:hunter4@[::1]:3306/db", NULL},
        {"mysql://u:hunter4@[::1]/db", NULL},
    };
    for (size_t i = 0; i < sizeof mysql_cases / sizeof mysql_cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "amqp: {url: 'amqp://h'}\n"
                 "mysql: {url: '%s'}\n"
                 "consumers:\n"
                 "  - {queue: q, handler_name: h, handler: {table: t, key_column: id, "
                 "key_field: id, state_column: s, event_field: e, "
                 "transitions: {X: {from: [A], to: B}}}}\n",
                 mysql_cases[i].url);
        r = load_text(text);
        if (mysql_cases[i].error) {
            cr_assert_eq(r.rc, -1, "'%s': errors:\n%s", mysql_cases[i].url, r.errs);
            assert_error(r, 2, mysql_cases[i].error);
            cr_assert_null(strstr(r.errs, "hunter"), "password leaked:\n%s", r.errs);
        } else {
            cr_assert_eq(r.rc, 0, "'%s': errors:\n%s", mysql_cases[i].url, r.errs);
        }
        result_free(&r);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Structure                                                                                   */

Test(config, missing_required_keys)
{
    result r = load_text("amqp: {url: 'amqp://h'}\n"
                         "mysql: {url: 'mysql://h/db'}\n"
                         "consumers:\n"
                         "  - queue: q\n" /* 4: handler_name missing */
                         "    handler:\n"
                         "      table: t\n" /* 6: the handler mapping */
                         "      key_field: id\n"
                         "      transitions: {X: {from: [A]}}\n" /* 8: to missing */
                         "  - handler_name: h2\n");              /* 9: queue and handler missing */
    cr_assert_eq(r.rc, -7, "rc %d, errors:\n%s", r.rc, r.errs);
    assert_error(r, 4, "missing required key 'consumers[0].handler_name'");
    assert_error(r, 6, "missing required key 'consumers[0].handler.key_column'");
    assert_error(r, 6, "missing required key 'consumers[0].handler.state_column'");
    assert_error(r, 6, "missing required key 'consumers[0].handler.event_field'");
    assert_error(r, 8, "missing required key 'consumers[0].handler.transitions.X.to'");
    assert_error(r, 9, "missing required key 'consumers[1].queue'");
    assert_error(r, 9, "missing required key 'consumers[1].handler'");
    result_free(&r);
}

Test(config, consumers_must_be_a_non_empty_list)
{
    result r = load_text("amqp: {url: 'amqp://h'}\nmysql: {url: 'mysql://h/db'}\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 1, "missing required key 'consumers'");
    result_free(&r);

    r = load_text("amqp: {url: 'amqp://h'}\nmysql: {url: 'mysql://h/db'}\nconsumers: []\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "consumers: the list is empty");
    result_free(&r);

    r = load_text("amqp: {url: 'amqp://h'}\nmysql: {url: 'mysql://h/db'}\nconsumers: {q: 1}\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "consumers: expected a list of consumers, got a mapping");
    result_free(&r);

    r = load_text("amqp: {url: 'amqp://h'}\nmysql: {url: 'mysql://h/db'}\nconsumers: [q]\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "consumers[0]: expected a mapping, got a string");
    result_free(&r);
}

Test(config, duplicate_keys_are_reported_at_the_second_one)
{
    result r = load_slots("prefetch: 10", "url: 'mysql://other/db'", NULL, NULL, "table: t2");
    cr_assert_eq(r.rc, -2, "errors:\n%s", r.errs);
    assert_error(r, LINE_M, "mysql.url: duplicate key (first given at line 5)");
    assert_error(r, LINE_H, "consumers[0].handler.table: duplicate key (first given at line 14)");
    result_free(&r);
}

Test(config, duplicate_queue_names)
{
    result r =
        load_text("amqp: {url: 'amqp://h'}\n"
                  "mysql: {url: 'mysql://h/db'}\n"
                  "consumers:\n"
                  "  - queue: payments\n"
                  "    handler_name: a\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n"
                  "  - queue: payments\n"
                  "    handler_name: b\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n"
                  "  - queue: payments.retry.3\n"
                  "    handler_name: c\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n"
                  "  - queue: payments.dlq\n"
                  "    handler_name: d\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n"
                  "  - queue: payments.retry.7\n" /* beyond max_retries 6: a plain name */
                  "    handler_name: e\n"
                  "    handler: {table: t, key_column: id, key_field: id, "
                  "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n");
    cr_assert_eq(r.rc, -3, "errors:\n%s", r.errs);
    assert_error(r, 7, "consumers[1].queue: queue 'payments' is already consumed by consumers[0]");
    assert_error(r, 10, "consumers[2].queue: 'payments.retry.3' is a retry queue of consumers[0]");
    assert_error(r, 13,
                 "consumers[3].queue: 'payments.dlq' is the dead-letter queue of "
                 "consumers[0]");
    result_free(&r);
}

Test(config, names_and_identifiers)
{
    char long_handler[128], max_handler[128], long_queue[256], long_ident[128];
    snprintf(long_handler, sizeof long_handler, "handler_name: %065d", 0);
    snprintf(max_handler, sizeof max_handler, "handler_name: %064d", 0);
    snprintf(long_queue, sizeof long_queue, "queue: %0201d", 0);
    snprintf(long_ident, sizeof long_ident, "key_column: a%064d", 0);
    const slot_case cases[] = {
        {'C', long_handler, "handler_name is 65 bytes long; at most 64 are allowed"},
        {'C', max_handler, NULL}, /* exactly 64 bytes is fine */
        {'C', long_queue, "queue name is 201 bytes long; at most 200 are allowed"},
        {'C', "queue: amq.payments", "queue names starting with 'amq.' are reserved"},
        {'C', "queue: \"\"", "consumers[0].queue: queue name must not be empty"},
        {'H', "table: \"orders; DROP TABLE x\"",
         "'orders; DROP TABLE x' is not a valid SQL identifier: use 1 to 64 characters from"},
        {'H', "table: `orders`", "YAML syntax error"},
        {'H', "table: \"orders`\"", "'orders`' is not a valid SQL identifier"},
        {'H', long_ident, "is not a valid SQL identifier"},
        {'H', "state_column: \"st\\0x\"", "contains a NUL byte"},
        {'H', "event_field: a..b", "field path 'a..b' has an empty segment"},
        {'H', "key_field: \"a\\nb\"", "field path 'a\\x0ab' contains control characters"},
        {'H', "set: {s: amount}", "column 's' is the key or state column"},
        {'H', "set: {id: amount}", "column 'id' is the key or state column"},
        {'H', "set: {x: amount, x: other}", "column 'x' is listed twice"},
        {'H', "set: {\"a b\": amount}", "'a b' is not a valid SQL identifier"},
    };
    /* handler_name and queue slots repeat the template's keys, so use dedicated files. */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[2048];
        const slot_case *c = &cases[i];
        const char *handler_name = "handler_name: h", *queue = "queue: q";
        const char *table = "table: t", *extra = "", *key_column = "key_column: id";
        const char *state_column = "state_column: s", *event_field = "event_field: e";
        const char *key_field = "key_field: id";

        if (c->slot == 'C' && !strncmp(c->text, "handler_name:", 13))
            handler_name = c->text;
        else if (c->slot == 'C')
            queue = c->text;
        else if (!strncmp(c->text, "table:", 6))
            table = c->text;
        else if (!strncmp(c->text, "key_column:", 11))
            key_column = c->text;
        else if (!strncmp(c->text, "state_column:", 13))
            state_column = c->text;
        else if (!strncmp(c->text, "event_field:", 12))
            event_field = c->text;
        else if (!strncmp(c->text, "key_field:", 10))
            key_field = c->text;
        else
            extra = c->text;
        snprintf(text, sizeof text,
                 "amqp: {url: 'amqp://h'}\n"
                 "mysql: {url: 'mysql://h/db'}\n"
                 "consumers:\n"
                 "  - %s\n"       /* 4 */
                 "    %s\n"       /* 5 */
                 "    handler:\n" /* 6 */
                 "      %s\n"     /* 7 */
                 "      %s\n"     /* 8 */
                 "      %s\n"     /* 9 */
                 "      %s\n"     /* 10 */
                 "      %s\n"     /* 11 */
                 "      %s\n"     /* 12 */
                 "      transitions: {X: {from: [A], to: B}}\n",
                 queue, handler_name, table, key_column, key_field, state_column, event_field,
                 extra);
        result r = load_text(text);
        if (!c->error) {
            cr_assert_eq(r.rc, 0, "case %zu '%s' must load:\n%s", i, c->text, r.errs);
        } else {
            cr_assert_eq(r.rc, -1, "case %zu '%s': rc %d, errors:\n%s", i, c->text, r.rc, r.errs);
            cr_assert_not_null(strstr(r.errs, c->error), "case %zu: expected '%s'; got:\n%s", i,
                               c->error, r.errs);
        }
        result_free(&r);
    }
}

Test(config, transitions_are_validated)
{
    static const struct {
        const char *transitions;
        int rc;
        unsigned line;
        const char *error;
    } cases[] = {
        {"transitions: {}", -1, 9, "transitions: no transitions; list at least one"},
        {"transitions:", -1, 9, "transitions: expected a mapping of EVENT"},
        {"transitions: [PAY]", -1, 9, "transitions: expected a mapping of EVENT"},
        {"transitions: {PAY: {from: [A], to: B}, PAY: {from: [B], to: C}}", -1, 9,
         "transitions: event 'PAY' is listed twice (first at line 9)"},
        {"transitions: {PAY: {from: [], to: B}}", -1, 9,
         "transitions.PAY.from: list 1 to 256 "
         "states, got 0"},
        {"transitions: {PAY: {from: [A, A], to: B}}", -1, 9, "from: state 'A' is listed twice"},
        {"transitions: {PAY: {from: [A], to: B, too: C}}", -1, 9,
         "unknown key 'consumers[0].handler.transitions.PAY.too' (did you mean"},
        {"transitions: {PAY: {from: [A]}}", -1, 9,
         "missing required key "
         "'consumers[0].handler.transitions.PAY.to'"},
        {"transitions: {PAY: {from: [{x: 1}], to: B}}", -1, 9,
         "from[0]: expected a state, got "
         "a mapping"},
        {"transitions: {PAY: B}", -1, 9, "transitions.PAY: expected a mapping, got a string"},
        {"transitions: {\"\": {from: [A], to: B}}", -1, 9, "event name must not be empty"},
        {"transitions: {PAY: {from: [A], to: \"\"}}", -1, 9, "to: state must not be empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "amqp: {url: 'amqp://h'}\n"
                 "mysql: {url: 'mysql://h/db'}\n"
                 "consumers:\n"
                 "  - queue: q\n"
                 "    handler_name: h\n"
                 "    handler:\n"
                 "      table: t\n"
                 "      key_column: id\n"
                 "      %s\n" /* 9 */
                 "      key_field: id\n"
                 "      state_column: s\n"
                 "      event_field: e\n",
                 cases[i].transitions);
        result r = load_text(text);
        cr_assert_eq(r.rc, cases[i].rc, "case %zu: rc %d, errors:\n%s", i, r.rc, r.errs);
        cr_assert(has_error(&r, cases[i].line, cases[i].error),
                  "case %zu: expected '%s' at line %u; got:\n%s", i, cases[i].error, cases[i].line,
                  r.errs);
        result_free(&r);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Files and YAML                                                                              */

Test(config, missing_file)
{
    char path[256];
    snprintf(path, sizeof path, "%s/nope.yaml", tmpdir);
    result r = load_path(path);
    cr_assert_eq(r.rc, -1);
    assert_error(r, 0, "cannot open the config file: No such file or directory");
    result_free(&r);
}

Test(config, directory_instead_of_file)
{
    result r = load_path(tmpdir);
    cr_assert_eq(r.rc, -1);
    assert_error(r, 0, "it is a directory");
    result_free(&r);
}

Test(config, empty_and_non_mapping_files)
{
    static const struct {
        const char *text;
        unsigned line;
        const char *error;
    } cases[] = {
        {"", 0, "the config file is empty"},
        {"# only a comment\n\n", 0, "the config file is empty"},
        {"---\n", 0, "the config file is empty"},
        {"- a\n- b\n", 1, "expected a mapping at the top level, got a list"},
        {"\n\njust text\n", 3, "expected a mapping at the top level, got a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r = load_text(cases[i].text);
        cr_assert_eq(r.rc, -1, "case %zu: rc %d, errors:\n%s", i, r.rc, r.errs);
        cr_assert(has_error(&r, cases[i].line, cases[i].error), "case %zu: got:\n%s", i, r.errs);
        result_free(&r);
    }
}

Test(config, yaml_syntax_error_has_its_line_and_stops)
{
    result r = load_text("amqp:\n"
                         "  url: 'amqp://h'\n"
                         "  prefetch: 0\n" /* would be an error, but parsing stops first */
                         "mysql: {url: 'mysql://h/db'\n"
                         "consumers: []\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    cr_assert(strstr(r.errs, "YAML syntax error"), "got:\n%s", r.errs);
    cr_assert(has_error(&r, 5, "YAML syntax error"), "got:\n%s", r.errs);
    result_free(&r);

    r = load_text("amqp:\n  url: 'amqp://h\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "YAML syntax error: found unexpected end of stream");
    result_free(&r);

    r = load_text("amqp:\n\tprefetch: 1\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 2, "YAML syntax error");
    result_free(&r);

    /* Invalid UTF-8 is a reader error, which carries only an offset: the line is derived. */
    r = load_text("amqp:\n  url: 'amqp://h'\nlog: {level: \xff}\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "YAML syntax error: invalid leading UTF-8 octet");
    result_free(&r);
}

Test(config, aliases_tags_and_documents_are_refused)
{
    result r = load_slots("prefetch: &n 10", "workers: *n", NULL, NULL, NULL);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, LINE_M, "YAML aliases (*n) are not supported");
    result_free(&r);

    r = load_slots("prefetch: !!str 10", NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, LINE_A, "explicit YAML tags (tag:yaml.org,2002:str) are not supported");
    result_free(&r);

    r = load_text("log: {level: info}\n---\nlog: {level: debug}\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 2, "only one YAML document is allowed");
    result_free(&r);
}

Test(config, hostile_sizes_are_bounded)
{
    /* Deep nesting stops at a fixed depth. */
    char *deep = malloc(20000);
    cr_assert_not_null(deep);
    memset(deep, '[', 10000);
    memset(deep + 10000, ']', 9999);
    deep[19999] = '\0';
    result r = load_text(deep);
    free(deep);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 1, "nesting deeper than 32 levels");
    result_free(&r);

    /* Files over 1 MiB are refused before parsing. */
    size_t big = 1024 * 1024 + 1;
    char *text = malloc(big);
    cr_assert_not_null(text);
    memset(text, '#', big);
    char path[256];
    snprintf(path, sizeof path, "%s/big.yaml", tmpdir);
    write_text(path, text, big);
    free(text);
    r = load_path(path);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 0, "the config file is larger than 1048576 bytes");
    result_free(&r);

    /* Thousands of mistakes are all counted, but only the first hundred are printed. */
    size_t n = 5000, len = 0;
    text = malloc(n * 16 + 16);
    cr_assert_not_null(text);
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(text + len, "k%zu: 1\n", i);
    r = load_text(text);
    free(text);
    /* 5000 unknown keys + amqp.url, mysql.url and consumers missing. */
    cr_assert_eq(r.rc, -5003);
    cr_assert(strstr(r.errs, "4903 more problems not shown"), "tail:\n%s",
              r.errs + (r.errs_len > 200 ? r.errs_len - 200 : 0));
    result_free(&r);
}

/* ------------------------------------------------------------------------------------------ */
/* Parsers and redaction                                                                       */

Test(config, duration_parsing)
{
    static const struct {
        const char *text;
        int rc;
        uint64_t ms;
    } cases[] = {
        {"250ms", 0, 250},
        {"30s", 0, 30000},
        {"5m", 0, 300000},
        {"2h", 0, 7200000},
        {"7d", 0, 604800000},
        {"30", 0, 30000},
        {"0", 0, 0},
        {"0ms", 0, 0},
        {"007s", 0, 7000},
        {"18446744073709551615ms", 0, UINT64_MAX},
        {"18446744073709552s", -1, 0},
        {"99999999999999999999s", -1, 0},
        {"18446744073709551616ms", -1, 0},
        {"-1s", -1, 0},
        {"+1s", -1, 0},
        {"1x", -1, 0},
        {"1.5s", -1, 0},
        {"1 s", -1, 0},
        {" 1s", -1, 0},
        {"1S", -1, 0},
        {"1h30m", -1, 0},
        {"s", -1, 0},
        {"", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t ms = 12345;
        int rc = config_parse_duration(cases[i].text, &ms);
        cr_assert_eq(rc, cases[i].rc, "'%s': rc %d", cases[i].text, rc);
        if (rc == 0)
            cr_assert_eq(ms, cases[i].ms, "'%s': %llu ms", cases[i].text, (unsigned long long)ms);
        else
            cr_assert_eq(ms, 12345, "'%s': output written on failure", cases[i].text);
    }
    uint64_t ms;
    cr_assert_eq(config_parse_duration(NULL, &ms), -1);
}

Test(config, size_parsing)
{
    static const struct {
        const char *text;
        int rc;
        uint64_t bytes;
    } cases[] = {
        {"512", 0, 512},
        {"512B", 0, 512},
        {"1KB", 0, 1000},
        {"64KiB", 0, 65536},
        {"1MiB", 0, 1048576},
        {"1MB", 0, 1000000},
        {"1mib", 0, 1048576},
        {"2GiB", 0, 2147483648u},
        {"1GB", 0, 1000000000},
        {"0", 0, 0},
        {"18446744073709551615", 0, UINT64_MAX},
        {"18446744073709551616", -1, 0},
        {"99999999999999999999KiB", -1, 0},
        {"17179869184GiB", -1, 0},
        {"-1", -1, 0},
        {"1x", -1, 0},
        {"1K", -1, 0},
        {"1.5MiB", -1, 0},
        {"KiB", -1, 0},
        {"", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t bytes = 777;
        int rc = config_parse_size(cases[i].text, &bytes);
        cr_assert_eq(rc, cases[i].rc, "'%s': rc %d", cases[i].text, rc);
        if (rc == 0)
            cr_assert_eq(bytes, cases[i].bytes, "'%s': %zu bytes", cases[i].text, bytes);
        else
            cr_assert_eq(bytes, 777, "'%s': output written on failure", cases[i].text);
    }
}

Test(config, redact_url)
{
    static const struct {
        const char *url, *want;
    } cases[] = {
        {"amqp://guest:guest@127.0.0.1:5672/%2f", "amqp://guest:***@127.0.0.1:5672/%2f"},
        {"mysql://root@127.0.0.1:3306/idemq", "mysql://root@127.0.0.1:3306/idemq"},
        {"mysql://127.0.0.1:3306/idemq", "mysql://127.0.0.1:3306/idemq"},
        {"amqps://user:p%40ss%3Aw@host/vh", "amqps://user:***@host/vh"},
        {"amqp://user:@host", "amqp://user:***@host"},
        {"amqp://:secret@host", "amqp://:***@host"},
        /* An '@' after the user-info is written %40: a raw one is taken as the end of it. */
        {"mysql://u:pw@/db?socket=/tmp/a%40b.sock", "mysql://u:***@/db?socket=/tmp/a%40b.sock"},
        {"mysql://u:pw@/db?socket=/tmp/a@b.sock", "mysql://u:***@b.sock"},
        {"mysql://h/db?socket=/tmp/a@b", "mysql://***@b"},
        /* A raw '/' or '@' inside the password: redact up to the last '@', never leak. */
        {"amqp://user:pa/ss@host/vh", "amqp://user:***@host/vh"},
        {"amqp://user:p@ss@host", "amqp://user:***@host"},
        {"mysql://h/db?user=x&password=secret&ssl=1", "mysql://h/db?user=x&password=***&ssl=1"},
        {"user:secret@host", "user:***@host"},
        {"", ""},
    };
    char buf[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        config_redact_url(cases[i].url, buf, sizeof buf);
        cr_assert_str_eq(buf, cases[i].want, "'%s' -> '%s'", cases[i].url, buf);
    }
    /* Truncation keeps the buffer terminated and shows no secret. */
    char small[16];
    config_redact_url("amqp://guest:topsecret@host", small, sizeof small);
    cr_assert_str_eq(small, "amqp://guest:**");
    config_redact_url(NULL, buf, sizeof buf);
    cr_assert_str_eq(buf, "");
    config_redact_url("amqp://a:b@c", buf, 0); /* must not write */
}

Test(config, a_failed_load_leaves_out_null_which_config_free_takes)
{
    /* A caller's cleanup path frees whatever config_load gave it: on failure that must be NULL,
     * whatever *out held before, and config_free(NULL) a no-op. */
    char path[256];
    snprintf(path, sizeof path, "%s/nope.yaml", tmpdir);
    config *cfg = (config *)&path; /* not a config: must be overwritten */
    cr_assert_eq(config_load(path, NULL, &cfg), -1);
    cr_assert_null(cfg, "a failed config_load left *out set");
    config_free(cfg);
    config_free(NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* sql and plugin handlers, dedup retention                                                    */

/* A valid file whose handler body (starting at line 7, indented 6 spaces) is `handler`. */
static result load_handler(const char *handler)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    result r;

    cr_assert_not_null(f);
    fprintf(f,
            "amqp: {url: 'amqp://h'}\n" /* 1 */
            "mysql: {url: 'mysql://h/db'}\n"
            "consumers:\n"
            "  - queue: q\n"
            "    handler_name: h\n"
            "    handler:\n" /* 6 */
            "%s",
            handler);
    cr_assert_eq(fclose(f), 0);
    r = load_text(text);
    free(text);
    return r;
}

static void assert_params(const config_sql_statement *st, size_t n, const char *const *names)
{
    cr_assert_eq(st->param_count, n, "statement '%s' has %zu params", st->sql, st->param_count);
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(st->params[i], names[i]);
}

Test(config, sql_handler_loads_statements_and_placeholders)
{
    result r = load_handler(
        "      type: sql\n"
        "      statements:\n"
        "        - sql: \"UPDATE accounts SET balance = balance + :amount WHERE id = :account.id\"\n"
        "          expect_rows: 1\n"
        "        - sql: \"INSERT INTO ledger (biz_key, amount, note) VALUES (:biz_key, :amount, "
        "':not_a_field')\"\n"
        "        - \"SELECT 1 FROM orders WHERE order_id = :order_id FOR UPDATE\"\n"
        "        - sql: |\n"
        "            UPDATE t   -- :not_a_field either\n"
        "               SET `a:b` = :a\n"
        "             WHERE c = :c.d_e.f1\n"
        "          expect_rows: 0\n"
        "      on_mismatch: retry\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    const config_handler *h = &r.cfg->consumers[0].handler;
    cr_assert_eq(h->type, CONFIG_HANDLER_SQL);
    cr_assert_eq(h->sql.on_mismatch, CONFIG_ON_MISMATCH_RETRY);
    cr_assert_eq(h->sql.statement_count, 4);

    const config_sql_statement *st = h->sql.statements;
    cr_assert_str_eq(st[0].sql,
                     "UPDATE accounts SET balance = balance + :amount WHERE id = :account.id");
    cr_assert_str_eq(st[0].prepared, "UPDATE accounts SET balance = balance + ? WHERE id = ?");
    assert_params(&st[0], 2, (const char *const[]){"amount", "account.id"});
    cr_assert(st[0].expect_rows_set);
    cr_assert_eq(st[0].expect_rows, 1);

    cr_assert_str_eq(st[1].prepared,
                     "INSERT INTO ledger (biz_key, amount, note) VALUES (?, ?, ':not_a_field')");
    assert_params(&st[1], 2, (const char *const[]){"biz_key", "amount"});
    cr_assert_not(st[1].expect_rows_set);

    cr_assert_str_eq(st[2].prepared, "SELECT 1 FROM orders WHERE order_id = ? FOR UPDATE");
    assert_params(&st[2], 1, (const char *const[]){"order_id"});
    cr_assert_not(st[2].expect_rows_set);

    cr_assert_str_eq(st[3].prepared, "UPDATE t   -- :not_a_field either\n"
                                     "   SET `a:b` = ?\n"
                                     " WHERE c = ?\n");
    assert_params(&st[3], 2, (const char *const[]){"a", "c.d_e.f1"});
    cr_assert(st[3].expect_rows_set);
    cr_assert_eq(st[3].expect_rows, 0);
    result_free(&r);

    r = load_handler("      type: sql\n"
                     "      statements: [\"DELETE FROM t WHERE id = :id\"]\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->consumers[0].handler.sql.on_mismatch, CONFIG_ON_MISMATCH_DEAD_LETTER);
    result_free(&r);
}

typedef struct handler_case {
    const char *handler; /* body from line 7 */
    unsigned line;
    const char *error;
} handler_case;

static void run_handler_cases(const handler_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        result r = load_handler(cases[i].handler);
        cr_assert_eq(r.rc, -1, "case %zu: rc %d, errors:\n%s", i, r.rc, r.errs);
        cr_assert(has_error(&r, cases[i].line, cases[i].error),
                  "case %zu: expected '%s' at line %u; got:\n%s", i, cases[i].error,
                  cases[i].line, r.errs);
        result_free(&r);
    }
}

#define SQL_HEAD "      type: sql\n      statements:\n"

Test(config, sql_handler_errors_have_lines)
{
    static const handler_case cases[] = {
        {"      type: sql\n      statements: []\n", 8,
         "consumers[0].handler.statements: the list is empty; give at least one statement"},
        {"      type: sql\n      statements: \"UPDATE t SET a = 1\"\n", 8,
         "consumers[0].handler.statements: expected a list of {sql: ..., expect_rows: N}"},
        {"      type: sql\n", 7, "missing required key 'consumers[0].handler.statements'"},
        {SQL_HEAD "        - sql: \"\"\n", 9,
         "consumers[0].handler.statements[0].sql: the statement is empty"},
        {SQL_HEAD "        - \"   \"\n", 9,
         "consumers[0].handler.statements[0].sql: the statement is empty"},
        {SQL_HEAD "        - sql: \"UPDATE t SET a = :a..b\"\n", 9,
         "consumers[0].handler.statements[0].sql: placeholder ':a..b' has an empty path segment "
         "at line 1, column 18 of the statement"},
        {SQL_HEAD "        - sql: \"UPDATE t SET a = :a. WHERE 1\"\n", 9,
         "placeholder ':a.' has an empty path segment"},
        {SQL_HEAD "        - sql: \"UPDATE t SET a = ?\"\n", 9,
         "bare '?' parameter: write a :field placeholder instead at line 1, column 18"},
        {SQL_HEAD "        - sql: \"UPDATE t SET a = 'x\"\n", 9,
         "unterminated string literal (') at line 1, column 18"},
        {SQL_HEAD "        - sql: \"UPDATE t SET a = 1 /* :x\"\n", 9, "unterminated /* comment"},
        {SQL_HEAD "        - sql: \"UPDATE `t SET a = 1\"\n", 9,
         "unterminated backtick identifier (`) at line 1, column 8"},
        {SQL_HEAD "        - sql: COMMIT\n", 9,
         "consumers[0].handler.statements[0].sql: a COMMIT statement cannot run inside idemq's "
         "transaction"},
        {SQL_HEAD "        - {sql: \"DROP TABLE orders\"}\n", 9, "a DROP statement cannot run"},
        {SQL_HEAD "        - {sql: \"SET autocommit = 1\"}\n", 9, "a SET statement cannot run"},
        {SQL_HEAD "        - {sql: \"UPDATE t SET a = 1\", expect_rows: -1}\n", 9,
         "consumers[0].handler.statements[0].expect_rows: must be between 0 and 4294967295, got "
         "-1"},
        {SQL_HEAD "        - {sql: \"UPDATE t SET a = 1\", expect_rows: many}\n", 9,
         "consumers[0].handler.statements[0].expect_rows: expected an integer, got 'many'"},
        {SQL_HEAD "        - {sql: \"UPDATE t SET a = 1\", expect_row: 1}\n", 9,
         "unknown key 'consumers[0].handler.statements[0].expect_row' (did you mean "
         "'consumers[0].handler.statements[0].expect_rows'?)"},
        {SQL_HEAD "        - {expect_rows: 1}\n", 9,
         "missing required key 'consumers[0].handler.statements[0].sql'"},
        {SQL_HEAD "        - [UPDATE]\n", 9,
         "consumers[0].handler.statements[0]: expected a mapping, got a list"},
        {SQL_HEAD "        - UPDATE t SET a = 1\n      on_mismatch: ignore\n", 10,
         "consumers[0].handler.on_mismatch: 'ignore' is not one of: dead_letter, retry"},
        {SQL_HEAD "        - UPDATE t SET a = 1\n      table: orders\n", 10,
         "unknown key 'consumers[0].handler.table'"},
    };
    run_handler_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, sql_handler_reports_every_bad_statement)
{
    result r = load_handler(SQL_HEAD                                          /* 7, 8 */
                            "        - UPDATE t SET a = :ok\n"                /* 9 */
                            "        - UPDATE t SET a = ?\n"                  /* 10 */
                            "        - {sql: \"UPDATE t SET a = 1\", expect_rows: -2}\n" /* 11 */
                            "        - sql: \"INSERT INTO t VALUES (:a.)\"\n" /* 12 */
                            "          expect_rows: 1\n");
    cr_assert_eq(r.rc, -3, "errors:\n%s", r.errs);
    assert_error(r, 10, "statements[1].sql: bare '?'");
    assert_error(r, 11, "statements[2].expect_rows: must be between 0");
    assert_error(r, 12, "statements[3].sql: placeholder ':a.' has an empty path segment");
    result_free(&r);
}

Test(config, sql_statement_size_and_count_limits)
{
    size_t n = 65536 + 1;
    char *big = malloc(n + 1);
    cr_assert_not_null(big);
    memcpy(big, "SELECT 1", 8);
    memset(big + 8, ' ', n - 8);
    big[n] = '\0';
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fprintf(f, SQL_HEAD "        - \"%s\"\n", big);
    fclose(f);
    result r = load_handler(text);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 9, "the statement is 65537 bytes long; at most 65536 are allowed");
    result_free(&r);
    free(text);

    /* Exactly 64 KiB is fine. */
    big[n - 1] = '\0';
    text = NULL;
    f = open_memstream(&text, &len);
    fprintf(f, SQL_HEAD "        - \"%s\"\n", big);
    fclose(f);
    r = load_handler(text);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    result_free(&r);
    free(text);
    free(big);

    text = NULL;
    f = open_memstream(&text, &len);
    fputs(SQL_HEAD, f);
    for (int i = 0; i < 65; i++)
        fputs("        - SELECT 1\n", f);
    fclose(f);
    r = load_handler(text);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 9, "consumers[0].handler.statements: 65 statements; at most 64 are supported");
    result_free(&r);
    free(text);
}

Test(config, plugin_handler_loads_with_its_config_as_json)
{
    result r = load_handler("      type: plugin\n"
                            "      path: /usr/lib/idemq/plugins/example.so\n"
                            "      config:\n"
                            "        fail_first_n: 2\n"
                            "        name: x\n"
                            "        nested: {list: [1, -2, 2.5, true, null, '007', 0x1F], "
                            "empty: {}}\n"
                            "        text: |\n"
                            "          two\n"
                            "          lines\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    const config_handler *h = &r.cfg->consumers[0].handler;
    cr_assert_eq(h->type, CONFIG_HANDLER_PLUGIN);
    cr_assert_str_eq(h->plugin.path, "/usr/lib/idemq/plugins/example.so");
    cr_assert_str_eq(h->plugin.config_json,
                     "{\"fail_first_n\":2,\"name\":\"x\",\"nested\":{\"empty\":{},\"list\":[1,-2,"
                     "2.5,true,null,\"007\",\"0x1F\"]},\"text\":\"two\\nlines\\n\"}");
    result_free(&r);

    r = load_handler("      type: plugin\n"
                     "      path: /opt/x.so\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->consumers[0].handler.plugin.config_json, "{}");
    result_free(&r);

    r = load_handler("      type: plugin\n"
                     "      path: /opt/x.so\n"
                     "      config: [a, b]\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->consumers[0].handler.plugin.config_json, "[\"a\",\"b\"]");
    result_free(&r);
}

Test(config, plugin_handler_errors_have_lines)
{
    static const handler_case cases[] = {
        {"      type: plugin\n      path: plugins/x.so\n", 8,
         "consumers[0].handler.path: plugin path 'plugins/x.so' must be absolute (start with /)"},
        {"      type: plugin\n      path: \"\"\n", 8, "plugin path must not be empty"},
        {"      type: plugin\n      config: {a: 1}\n", 7,
         "missing required key 'consumers[0].handler.path'"},
        {"      type: plugin\n      path: /x.so\n      config: {a: 1, a: 2}\n", 9,
         "consumers[0].handler.config: key 'a' is given twice"},
        {"      type: plugin\n      path: /x.so\n      statements: [SELECT 1]\n", 9,
         "unknown key 'consumers[0].handler.statements'"},
    };
    run_handler_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, dedup_retention_defaults_values_and_errors)
{
    result r = load_slots(NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.retention_ms, 0);
    cr_assert_eq(r.cfg->dedup.interval_ms, 60000);
    cr_assert_eq(r.cfg->dedup.batch, 1000);
    result_free(&r);

    r = load_slots(NULL, NULL, "dedup: {retention: 30d, interval: 5m, batch: 100000}", NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.retention_ms, 30ULL * 86400000);
    cr_assert_eq(r.cfg->dedup.interval_ms, 300000);
    cr_assert_eq(r.cfg->dedup.batch, 100000);
    result_free(&r);

    /* Seconds are allowed (tests use them; idemq warns below 1h at startup). */
    r = load_slots(NULL, NULL, "dedup: {retention: 2s, interval: 1s, batch: 1}", NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.retention_ms, 2000);
    cr_assert_eq(r.cfg->dedup.interval_ms, 1000);
    result_free(&r);

    static const slot_case cases[] = {
        {'T', "dedup: {retention: 1500ms}", "dedup.retention: must be whole seconds, got 1500ms"},
        {'T', "dedup: {retention: forever}", "dedup.retention: 'forever' is not a valid duration"},
        {'T', "dedup: {retention: 3651d}", "dedup.retention: must be between 0ms and 3650d"},
        {'T', "dedup: {interval: 0}", "dedup.interval: must be between 1s and 1d, got 0"},
        {'T', "dedup: {interval: 500ms}", "dedup.interval: must be between 1s and 1d"},
        {'T', "dedup: {batch: 0}", "dedup.batch: must be between 1 and 100000, got 0"},
        {'T', "dedup: {batch: 100001}", "dedup.batch: must be between 1 and 100000, got 100001"},
        {'T', "dedup: {retain: 1d}",
         "unknown key 'dedup.retain' (known keys in dedup: retention, layout, interval, batch, "
         "cache, cache_ttl)"},
        {'T', "dedup: {bach: 10}", "unknown key 'dedup.bach' (did you mean 'dedup.batch'?)"},
        {'T', "dedup: 30d", "dedup: expected a mapping, got a string"},
        {'T', "dedup: {retention: 0}", NULL},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, dedup_layout_defaults_values_and_errors)
{
    result r = load_slots(NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.layout, CONFIG_DEDUP_SINGLE, "one table unless asked for");
    result_free(&r);
    r = load_slots(NULL, NULL, "dedup: {layout: rotating, retention: 7d}", NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.layout, CONFIG_DEDUP_ROTATING);
    result_free(&r);

    static const slot_case cases[] = {
        {'T', "dedup: {layout: partitioned, retention: 1d}",
         "dedup.layout: 'partitioned' is not one of: single, rotating"},
        /* The retention is the period of each table: without it nothing would ever rotate. */
        {'T', "dedup: {layout: rotating}", "dedup.layout: rotating needs dedup.retention"},
        {'T', "dedup: {layout: rotating, retention: 0}",
         "dedup.layout: rotating needs dedup.retention"},
        {'T', "dedup: {layout: single}", NULL},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, dedup_cache_defaults_values_and_errors)
{
    result r = load_slots(NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.cache, 0, "off unless asked for");
    cr_assert_eq(r.cfg->dedup.cache_ttl_ms, 600000);
    result_free(&r);

    r = load_slots(NULL, NULL, "dedup: {cache: 100000, cache_ttl: 1h, retention: 7d}", NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->dedup.cache, 100000);
    cr_assert_eq(r.cfg->dedup.cache_ttl_ms, 3600000);
    result_free(&r);

    static const slot_case cases[] = {
        {'T', "dedup: {cache: 10000001}", "dedup.cache: must be between 0 and 10000000"},
        {'T', "dedup: {cache: many}", "dedup.cache:"},
        {'T', "dedup: {cache_ttl: 0}", "dedup.cache_ttl: must be between 1s and 1d, got 0"},
        {'T', "dedup: {cache_ttl: 2d}", "dedup.cache_ttl: must be between 1s and 1d"},
        /* A key remembered past its row's deletion would drop a copy the window lets through. */
        {'T', "dedup: {cache: 10, cache_ttl: 1h, retention: 1h}",
         "dedup.cache_ttl: 3600 s is not below dedup.retention (3600 s)"},
        {'T', "dedup: {cache: 10, cache_ttl: 10m, retention: 60s}",
         "dedup.cache_ttl: 600 s is not below dedup.retention (60 s)"},
        /* The limit binds only while both are on. */
        {'T', "dedup: {cache: 0, cache_ttl: 1h, retention: 60s}", NULL},
        {'T', "dedup: {cache: 10, cache_ttl: 1d, retention: 0}", NULL},
        {'T', "dedup: {cache: 10, cache_ttl: 59s, retention: 60s}", NULL},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

Test(config, shipped_handlers_example_loads)
{
    result r = load_path(IDEMQ_SOURCE_DIR "/examples/handlers.yaml");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->consumer_count, 2);
    cr_assert_eq(r.cfg->dedup.retention_ms, 30ULL * 86400000);
    const config_handler *sql = &r.cfg->consumers[0].handler, *plugin = &r.cfg->consumers[1].handler;
    cr_assert_eq(sql->type, CONFIG_HANDLER_SQL);
    cr_assert_eq(sql->sql.statement_count, 2);
    cr_assert_str_eq(sql->sql.statements[1].prepared,
                     "INSERT INTO ledger (biz_key, account, amount) VALUES (?, ?, ?)");
    cr_assert_eq(plugin->type, CONFIG_HANDLER_PLUGIN);
    cr_assert_str_eq(plugin->plugin.config_json, "{\"fail_first_n\":0}");
    cr_assert_eq(sql->sql.emit_count, 1);
    cr_assert_str_eq(sql->sql.emits[0].routing_key, "ledger");
    cr_assert_eq(sql->sql.emits[0].field_count, 3);
    result_free(&r);
}

/* main passes cfg->log_level to log_set_level as it is: config/ may not include ops/, so the two
 * enums are kept in the same order, and this test fails when they drift apart. */
Test(config, log_levels_line_up_with_the_logger)
{
    cr_assert_eq((int)CONFIG_LOG_DEBUG, (int)LOG_LEVEL_DEBUG);
    cr_assert_eq((int)CONFIG_LOG_INFO, (int)LOG_LEVEL_INFO);
    cr_assert_eq((int)CONFIG_LOG_WARN, (int)LOG_LEVEL_WARN);
    cr_assert_eq((int)CONFIG_LOG_ERROR, (int)LOG_LEVEL_ERROR);
}

/* ------------------------------------------------------------------------------------------ */
/* Several broker nodes: amqp.urls, amqp.url, IDEMQ_AMQP_URL (issue 9)                        */

#define NODES_REST                                                                                 \
    "mysql: {url: 'mysql://h/db'}\n"                                                               \
    "consumers:\n"                                                                                 \
    "  - queue: q\n"                                                                               \
    "    handler_name: h\n"                                                                        \
    "    handler: {table: t, key_column: id, key_field: id, "                                      \
    "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n"

Test(config, amqp_urls_lists_every_node_in_order)
{
    result r = load_text("amqp:\n"
                         "  urls:\n"
                         "    - \"amqp://u:p@rmq-1:5672/vh\"\n"
                         "    - \"amqps://u:p@rmq-2:5671/vh\"\n"
                         "    - \"amqp://u:p@[::1]:5673/vh\"\n"
                         "  prefetch: 8\n" NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->amqp_url_count, 3);
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://u:p@rmq-1:5672/vh");
    cr_assert_str_eq(r.cfg->amqp_urls[1], "amqps://u:p@rmq-2:5671/vh");
    cr_assert_str_eq(r.cfg->amqp_urls[2], "amqp://u:p@[::1]:5673/vh");
    cr_assert_null(r.cfg->amqp_urls[3]);
    cr_assert_eq(r.cfg->prefetch, 8);
    result_free(&r);
}

Test(config, amqp_url_alone_is_a_list_of_one)
{
    result r = load_text("amqp: {url: 'amqp://u:p@rmq-1/vh'}\n" NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->amqp_url_count, 1);
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://u:p@rmq-1/vh");
    result_free(&r);
}

Test(config, amqp_url_and_urls_together_are_refused)
{
    result r = load_text("amqp:\n"                          /* 1 */
                         "  url: 'amqp://rmq-1'\n"          /* 2 */
                         "  urls: ['amqp://rmq-2']\n"       /* 3 */
                         NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "amqp.urls: give either amqp.url (line 2) or amqp.urls, not both");
    result_free(&r);
}

Test(config, missing_amqp_url_names_both_keys_and_the_environment)
{
    result r = load_text("amqp: {prefetch: 8}\n" NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 1, "missing required key 'amqp.url'");
    assert_error(r, 1, "amqp.urls");
    assert_error(r, 1, "IDEMQ_AMQP_URL");
    result_free(&r);
}

/* Every bad entry is reported at its own line, with its password redacted. */
Test(config, amqp_urls_reports_each_bad_entry_at_its_line)
{
    result r = load_text("amqp:\n"                                   /* 1 */
                         "  urls:\n"                                 /* 2 */
                         "    - 'amqp://u:hunter2@rmq-1:5672/vh'\n"  /* 3 */
                         "    - 'http://u:hunter2@rmq-2/vh'\n"       /* 4 */
                         "    - 'amqp://u:hunter2@rmq-3:99999/vh'\n" /* 5 */
                         "    - [nested]\n"                          /* 6 */
                         "    - 'amqp://u:hunter2@rmq-1:5672/vh'\n"  /* 7 */
                         NODES_REST);
    cr_assert_eq(r.rc, -4, "errors:\n%s", r.errs);
    assert_error(r, 4, "amqp.urls[1]: 'http://u:***@rmq-2/vh' must start with amqp:// or amqps://");
    assert_error(r, 5, "amqp.urls[2]: 'amqp://u:***@rmq-3:99999/vh' has an invalid port");
    assert_error(r, 6, "amqp.urls[3]: expected a broker URL, got a list");
    assert_error(r, 7, "amqp.urls[4]: 'amqp://u:***@rmq-1:5672/vh' is already amqp.urls[0]");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);
}

Test(config, amqp_urls_must_be_a_non_empty_bounded_list)
{
    result r = load_text("amqp: {urls: 'amqp://rmq-1'}\n" NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 1, "amqp.urls: expected a list of broker URLs, got a quoted string (for one "
                       "node, use amqp.url)");
    result_free(&r);

    r = load_text("amqp: {urls: []}\n" NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 1, "amqp.urls: the list is empty; give at least one broker URL");
    result_free(&r);

    char text[2048];
    int n = snprintf(text, sizeof text, "amqp:\n  urls:\n");
    for (int i = 0; i < CONFIG_MAX_AMQP_URLS + 1; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "    - 'amqp://rmq-%d'\n", i);
    snprintf(text + n, sizeof text - (size_t)n, "%s", NODES_REST);
    r = load_text(text);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3, "amqp.urls: 17 URLs; at most 16 are supported");
    result_free(&r);
}

/* The variable holds one URL or a comma-separated list (blanks around the commas are dropped),
 * and replaces whichever key the file gave. */
Test(config, environment_list_overrides_url_and_urls)
{
    setenv("IDEMQ_AMQP_URL", "amqp://u:p@env-1:5672/vh, amqp://u:p%2Cq@env-2:5672/vh ,amqps://env-3",
           1);
    result r = load_text("amqp: {urls: ['amqp://rmq-1', 'amqp://rmq-2']}\n" NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->amqp_url_count, 3);
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://u:p@env-1:5672/vh");
    cr_assert_str_eq(r.cfg->amqp_urls[1], "amqp://u:p%2Cq@env-2:5672/vh");
    cr_assert_str_eq(r.cfg->amqp_urls[2], "amqps://env-3");
    cr_assert_null(r.cfg->amqp_urls[3]);
    result_free(&r);

    setenv("IDEMQ_AMQP_URL", "amqp://env-1", 1);
    r = load_text("amqp: {urls: ['amqp://rmq-1', 'amqp://rmq-2']}\n" NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->amqp_url_count, 1);
    cr_assert_str_eq(r.cfg->amqp_urls[0], "amqp://env-1");
    cr_assert_null(r.cfg->amqp_urls[1]);
    result_free(&r);
}

Test(config, environment_list_reports_each_bad_entry_without_passwords)
{
    setenv("IDEMQ_AMQP_URL",
           "amqp://u:hunter2@env-1,,http://u:hunter2@env-3,amqp://u:hunter2@env-4:0,"
           "amqp://u:hunter2@env-1",
           1);
    result r = load_text("amqp: {url: 'amqp://rmq-1'}\n" NODES_REST);
    cr_assert_eq(r.rc, -3, "errors:\n%s", r.errs);
    assert_error(r, 0, "IDEMQ_AMQP_URL (overrides amqp.url and amqp.urls): URL 2 of 5 is empty");
    assert_error(r, 0, "IDEMQ_AMQP_URL (overrides amqp.url and amqp.urls): URL 3 of 5: "
                       "'http://u:***@env-3' must start with amqp:// or amqps://");
    assert_error(r, 0, "URL 4 of 5: 'amqp://u:***@env-4:0' has an invalid port");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);

    /* Valid entries, but one node twice. */
    setenv("IDEMQ_AMQP_URL", "amqp://u:hunter2@env-1,amqp://u:hunter2@env-1", 1);
    r = load_text("amqp: {url: 'amqp://rmq-1'}\n" NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 0, "URL 2 repeats URL 1 ('amqp://u:***@env-1')");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);
}

/* ------------------------------------------------------------------------------------------ */
/* Several database nodes: mysql.urls, mysql.url, IDEMQ_MYSQL_URL (issue 21)                   */

#define DB_NODES_REST                                                                              \
    "consumers:\n"                                                                                 \
    "  - queue: q\n"                                                                               \
    "    handler_name: h\n"                                                                        \
    "    handler: {table: t, key_column: id, key_field: id, "                                      \
    "state_column: s, event_field: e, transitions: {X: {from: [A], to: B}}}\n"

Test(config, mysql_urls_lists_every_node_in_order_and_the_dsn_holds_them)
{
    result r = load_text("amqp: {url: 'amqp://rmq'}\n"
                         "mysql:\n"
                         "  urls:\n"
                         "    - 'mysql://u:p@db-1:3306/app'\n"
                         "    - 'mysql://u:p@db-2:3307/app'\n"
                         "    - 'mysql://u:p@[::1]:3308/app'\n" DB_NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->mysql_url_count, 3);
    cr_assert_str_eq(r.cfg->mysql_urls[0], "mysql://u:p@db-1:3306/app");
    cr_assert_str_eq(r.cfg->mysql_urls[2], "mysql://u:p@[::1]:3308/app");
    cr_assert_null(r.cfg->mysql_urls[3]);

    db_dsn dsn, one;
    char err[256], name[520];
    cr_assert_eq(db_dsn_from_config(r.cfg, &dsn, err, sizeof err), 0, "%s", err);
    cr_assert_eq(db_dsn_node_count(&dsn), 3);
    const char *names[] = {"db-1:3306", "db-2:3307", "[::1]:3308"};
    for (size_t i = 0; i < 3; i++) {
        db_dsn_node_name(&dsn, i, name, sizeof name);
        cr_assert_str_eq(name, names[i]);
        db_dsn_for_node(&dsn, i, &one);
        cr_assert_eq(db_dsn_node_count(&one), 1, "a node's dsn names that node only");
        cr_assert_str_eq(one.user, "u");
        cr_assert_str_eq(one.password, "p");
        cr_assert_str_eq(one.database, "app");
    }
    db_dsn_for_node(&dsn, 1, &one);
    cr_assert_str_eq(one.host, "db-2");
    cr_assert_eq(one.port, 3307);
    result_free(&r);
}

Test(config, mysql_url_alone_is_one_node)
{
    result r = load_text("amqp: {url: 'amqp://rmq'}\nmysql: {url: 'mysql://u:p@db-1/app'}\n"
                         DB_NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->mysql_url_count, 1);
    db_dsn dsn;
    char err[256];
    cr_assert_eq(db_dsn_from_config(r.cfg, &dsn, err, sizeof err), 0, "%s", err);
    cr_assert_eq(db_dsn_node_count(&dsn), 1);
    result_free(&r);
}

Test(config, mysql_urls_refuses_both_keys_a_missing_url_and_duplicates)
{
    result r = load_text("amqp: {url: 'amqp://rmq'}\n"           /* 1 */
                         "mysql:\n"                              /* 2 */
                         "  url: 'mysql://db-1/app'\n"           /* 3 */
                         "  urls: ['mysql://db-2/app']\n"        /* 4 */
                         DB_NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 4, "mysql.urls: give either mysql.url (line 3) or mysql.urls, not both");
    result_free(&r);

    r = load_text("amqp: {url: 'amqp://rmq'}\nmysql: {workers: 2}\n" DB_NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 2, "missing required key 'mysql.url' (one database URL, or mysql.urls for "
                       "several nodes; or set IDEMQ_MYSQL_URL)");
    result_free(&r);

    r = load_text("amqp: {url: 'amqp://rmq'}\n"                 /* 1 */
                  "mysql:\n"                                    /* 2 */
                  "  urls:\n"                                   /* 3 */
                  "    - 'mysql://u:hunter2@db-1/app'\n"        /* 4 */
                  "    - 'postgres://u:hunter2@db-2/app'\n"     /* 5 */
                  "    - 'mysql://u:hunter2@db-1/app'\n"        /* 6 */
                  DB_NODES_REST);
    cr_assert_eq(r.rc, -2, "errors:\n%s", r.errs);
    assert_error(r, 5, "mysql.urls[1]: 'postgres://u:***@db-2/app' must start with mysql://");
    assert_error(r, 6, "mysql.urls[2]: 'mysql://u:***@db-1/app' is already mysql.urls[0]");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);
}

/* Any connection may land on any node: a node with another account or database is refused at
 * load, not discovered at the first failover. */
Test(config, mysql_urls_must_share_the_account_and_database)
{
    result r = load_text("amqp: {url: 'amqp://rmq'}\n"                 /* 1 */
                         "mysql:\n"                                    /* 2 */
                         "  urls:\n"                                   /* 3 */
                         "    - 'mysql://u:hunter2@db-1/app'\n"        /* 4 */
                         "    - 'mysql://v:hunter2@db-2/app'\n"        /* 5 */
                         "    - 'mysql://u:other@db-3/app'\n"          /* 6 */
                         "    - 'mysql://u:hunter2@db-4/other'\n"      /* 7 */
                         "    - 'mysql://u:hunter2@db-5:3307/app'\n"   /* 8 */
                         DB_NODES_REST);
    cr_assert_eq(r.rc, -3, "errors:\n%s", r.errs);
    assert_error(r, 5, "mysql.urls[1]: its user differs from the first URL's");
    assert_error(r, 6, "mysql.urls[2]: its password differs from the first URL's");
    assert_error(r, 7, "mysql.urls[3]: its database differs from the first URL's");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);
}

Test(config, mysql_environment_list_overrides_url_and_urls)
{
    setenv("IDEMQ_MYSQL_URL", "mysql://u:p@env-1:3306/app, mysql://u:p@env-2:3306/app", 1);
    result r = load_text("amqp: {url: 'amqp://rmq'}\nmysql: {url: 'mysql://u:p@db-1/app'}\n"
                         DB_NODES_REST);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->mysql_url_count, 2);
    cr_assert_str_eq(r.cfg->mysql_urls[0], "mysql://u:p@env-1:3306/app");
    cr_assert_str_eq(r.cfg->mysql_urls[1], "mysql://u:p@env-2:3306/app");
    result_free(&r);

    setenv("IDEMQ_MYSQL_URL", "mysql://u:hunter2@env-1/app,mysql://w:hunter2@env-2/app", 1);
    r = load_text("amqp: {url: 'amqp://rmq'}\nmysql: {url: 'mysql://u:p@db-1/app'}\n"
                  DB_NODES_REST);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 0, "IDEMQ_MYSQL_URL: URL 2: its user differs from the first URL's");
    cr_assert_null(strstr(r.errs, "hunter2"), "password leaked:\n%s", r.errs);
    result_free(&r);
    unsetenv("IDEMQ_MYSQL_URL");
}

/* ---- amqp.tls ------------------------------------------------------------------------------ */

/* A config whose amqp section is url (line 2) and then the lines of tls_lines (from line 3,
 * each already indented under amqp:); NULL: no tls block. */
static result load_amqp_tls(const char *url, const char *tls_lines)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    fprintf(f, "amqp:\n  url: \"%s\"\n%s", url, tls_lines ? tls_lines : "");
    fputs("mysql: {url: \"mysql://root@127.0.0.1:3306/idemq\"}\n"
          "consumers:\n"
          "  - queue: payments\n"
          "    handler_name: pay-callback\n"
          "    handler: {type: sql, statements: [{sql: \"SELECT 1\"}]}\n",
          f);
    cr_assert_eq(fclose(f), 0);
    result r = load_text(text);
    free(text);
    return r;
}

/* tmpdir/name, created with some bytes: the loader only checks that it can be read. */
static const char *tls_file(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
    write_text(buf, "-----BEGIN CERTIFICATE-----\n", 28);
    return buf;
}

Test(config, amqp_tls_defaults_and_values)
{
    /* amqps:// without a block: the system trust store, verification on. */
    result r = load_amqp_tls("amqps://guest:guest@rmq-1:5671/%2f", NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_null(r.cfg->amqp_tls.ca_file);
    cr_assert_null(r.cfg->amqp_tls.cert_file);
    cr_assert_null(r.cfg->amqp_tls.key_file);
    cr_assert_null(r.cfg->amqp_tls.server_name);
    cr_assert_eq(r.cfg->amqp_tls.verify, 1);
    result_free(&r);

    char ca[256], cert[256], key[256], lines[1024];
    tls_file(ca, sizeof ca, "ca.pem");
    tls_file(cert, sizeof cert, "client.pem");
    tls_file(key, sizeof key, "client.key");
    snprintf(lines, sizeof lines,
             "  tls:\n    ca_file: %s\n    cert_file: %s\n    key_file: %s\n"
             "    verify: false\n    server_name: rmq.internal\n",
             ca, cert, key);
    r = load_amqp_tls("amqps://idemq@rmq-1:5671/payments", lines);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->amqp_tls.ca_file, ca);
    cr_assert_str_eq(r.cfg->amqp_tls.cert_file, cert);
    cr_assert_str_eq(r.cfg->amqp_tls.key_file, key);
    cr_assert_str_eq(r.cfg->amqp_tls.server_name, "rmq.internal");
    cr_assert_eq(r.cfg->amqp_tls.verify, 0);
    result_free(&r);

    /* An empty block is the defaults too, and an IP address is a valid server_name. */
    r = load_amqp_tls("amqps://guest:guest@rmq-1/%2f", "  tls: {server_name: 10.0.0.7}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->amqp_tls.verify, 1);
    cr_assert_str_eq(r.cfg->amqp_tls.server_name, "10.0.0.7");
    result_free(&r);
}

Test(config, amqp_tls_errors_have_lines)
{
    char cert[256], key[256], lines[1024];
    tls_file(cert, sizeof cert, "client.pem");
    tls_file(key, sizeof key, "client.key");
    const char *url = "amqps://guest:guest@rmq-1:5671/%2f";

    result r = load_amqp_tls(url, "  tls:\n    ca_file: /nonexistent/ca.pem\n");
    assert_error(r, 4, "amqp.tls.ca_file: cannot read '/nonexistent/ca.pem': No such file or "
                       "directory");
    result_free(&r);

    snprintf(lines, sizeof lines, "  tls:\n    ca_file: %s\n", tmpdir);
    r = load_amqp_tls(url, lines);
    assert_error(r, 4, "amqp.tls.ca_file: '");
    assert_error(r, 4, "' is not a regular file");
    result_free(&r);

    /* A certificate without its key and a key without its certificate, at their own line. */
    snprintf(lines, sizeof lines, "  tls:\n    verify: true\n    cert_file: %s\n", cert);
    r = load_amqp_tls(url, lines);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 5, "amqp.tls: cert_file is given without key_file");
    result_free(&r);
    snprintf(lines, sizeof lines, "  tls:\n    key_file: %s\n", key);
    r = load_amqp_tls(url, lines);
    assert_error(r, 4, "amqp.tls: key_file is given without cert_file");
    result_free(&r);

    /* A key whose file is missing is reported as such, not also as "without key_file". */
    snprintf(lines, sizeof lines, "  tls:\n    cert_file: %s\n    key_file: %s/nope.key\n", cert,
             tmpdir);
    r = load_amqp_tls(url, lines);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 5, "amqp.tls.key_file: cannot read '");
    result_free(&r);

    r = load_amqp_tls(url, "  tls: {verify: yes}\n");
    assert_error(r, 3, "amqp.tls.verify: 'yes' is not one of: false, true");
    result_free(&r);
    r = load_amqp_tls(url, "  tls: {server_name: \"*.rmq.internal\"}\n");
    assert_error(r, 3, "amqp.tls.server_name: '*.rmq.internal' is not a host name or IP address");
    result_free(&r);
    r = load_amqp_tls(url, "  tls: {cafile: x}\n");
    assert_error(r, 3, "unknown key 'amqp.tls.cafile' (did you mean 'amqp.tls.ca_file'?)");
    result_free(&r);
    r = load_amqp_tls(url, "  tls: {server_name: \"rmq:5671\"}\n");
    assert_error(r, 3, "amqp.tls.server_name: 'rmq:5671' is not a host name");
    result_free(&r);
    r = load_amqp_tls(url, "  tls: {server_name: \"fe80::1\"}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    result_free(&r);
    r = load_amqp_tls(url, "  tls: /etc/idemq/ca.pem\n");
    assert_error(r, 3, "amqp.tls: expected a mapping, got a string");
    result_free(&r);
}

/* A tls block with a plain amqp:// URL would be ignored without a word: refused, at the tls
 * key's line, whether the URL is in the file or comes from IDEMQ_AMQP_URL — and never with the
 * URL's password in the message. */
Test(config, amqp_tls_needs_an_amqps_url)
{
    result r = load_amqp_tls("amqp://idemq:s3cret@rmq-1:5672/%2f", "  tls:\n    verify: true\n");
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 3,
                 "amqp.tls is given but amqp.url 'amqp://idemq:***@rmq-1:5672/%2f' is plain AMQP, "
                 "which would ignore it: use an amqps:// URL");
    cr_assert_null(strstr(r.errs, "s3cret"), "%s", r.errs);
    result_free(&r);

    cr_assert_eq(setenv("IDEMQ_AMQP_URL", "amqp://idemq:s3cret@rmq-2:5672/%2f", 1), 0);
    r = load_amqp_tls("amqps://idemq:s3cret@rmq-1:5671/%2f", "  tls: {}\n");
    assert_error(r, 3, "amqp.url (from IDEMQ_AMQP_URL) 'amqp://idemq:***@rmq-2:5672/%2f' is plain");
    cr_assert_null(strstr(r.errs, "s3cret"), "%s", r.errs);
    result_free(&r);

    /* The other way round is fine: the environment's amqps:// URL with the file's block. */
    cr_assert_eq(setenv("IDEMQ_AMQP_URL", "amqps://idemq:s3cret@rmq-2/%2f", 1), 0);
    r = load_amqp_tls("amqp://guest:guest@rmq-1/%2f", "  tls: {server_name: rmq.internal}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    result_free(&r);
}

/* ------------------------------------------------------------------------------------------ */
/* Issue 9: URL user-info, passwords from files, mysql.tls                                      */

/* The two-letter chunks of PASSWORD below: none may appear in a redacted URL or a message. */
static const char *const secret_chunks[] = {"Sx", "Ky", "Qv", "Zw", "Jm", "Pq", "Rt", "Lb", NULL};
#define RAW_PASSWORD "Sx@Ky/Qv?Zw#Jm:Pq%Rt[Lb]"
#define ENCODED_PASSWORD "Sx%40Ky%2FQv%3FZw%23Jm%3APq%25Rt%5BLb%5D"

static void assert_no_secret(const char *text, const char *what)
{
    /* mkdtemp's six random letters in the test's file paths can spell a chunk by chance ("Pq"
     * in idemq-test-config-vPqlDq): blank them before looking. */
    static const char dir_prefix[] = "idemq-test-config-";
    char *copy = strdup(text);
    cr_assert(copy);
    for (char *at = strstr(copy, dir_prefix); at; at = strstr(at, dir_prefix)) {
        at += sizeof dir_prefix - 1;
        for (int i = 0; i < 6 && at[i]; i++)
            at[i] = '_';
    }
    for (size_t i = 0; secret_chunks[i]; i++)
        cr_assert(!strstr(copy, secret_chunks[i]), "%s shows part of the password: %s", what,
                  text);
    free(copy);
}

static const char *const amqp_schemes[] = {"amqp", "amqps", NULL};
static const char *const mysql_schemes[] = {"mysql", NULL};

/* The loader, rabbitmq-c's amqp_parse_url, db_dsn_parse and the redaction agree on every URL: the
 * loader accepts a URL exactly when the parser does, the parser then decodes the password the
 * test meant, and neither the redaction nor any message shows a part of it. */
Test(config, url_userinfo_rule_matches_both_parsers_and_redaction)
{
    static const struct {
        const char *password; /* as written in the URL */
        bool valid;
        bool amqp_parses;     /* what amqp_parse_url says, when it differs from valid */
    } cases[] = {
        {ENCODED_PASSWORD, true, true},
        {"Sx%40Ky", true, true},
        {"Sx@Ky", false, false},     /* a second '@' */
        {"Sx/Ky", false, false},     /* ends the authority for an RFC parser */
        {"Sx?Ky", false, false},
        {"Sx#Ky", false, false},
        {"Sx:Ky", false, false},     /* rabbitmq-c takes "Ky@host" for a port */
        {"Sx%Ky", false, false},     /* '%' without two hex digits */
        {"Sx%00Ky", false, true},    /* rabbitmq-c would cut the password short at the NUL */
        {"Sx[Ky]", false, false},
        {RAW_PASSWORD, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char url[256], copy[256], why[512], redacted[256], err[256];
        struct amqp_connection_info info;
        db_dsn dsn;

        snprintf(url, sizeof url, "amqp://idemq:%s@127.0.0.1:5672/%%2f", cases[i].password);
        int loader = config_check_url(url, amqp_schemes, "amqp://", false, why, sizeof why);
        snprintf(copy, sizeof copy, "%s", url);
        int parser = amqp_parse_url(copy, &info);
        cr_assert_eq(loader == 0, cases[i].valid, "%s: loader %d (%s)", url, loader, why);
        cr_assert_eq(parser == AMQP_STATUS_OK, cases[i].amqp_parses, "%s: amqp_parse_url %d", url,
                     parser);
        if (loader != 0)
            assert_no_secret(why, "the loader's message");
        config_redact_url(url, redacted, sizeof redacted);
        cr_assert_str_eq(redacted, "amqp://idemq:***@127.0.0.1:5672/%2f", "%s", url);

        snprintf(url, sizeof url, "mysql://idemq:%s@127.0.0.1:3306/idemq", cases[i].password);
        loader = config_check_url(url, mysql_schemes, "mysql://", true, why, sizeof why);
        parser = db_dsn_parse(url, &dsn, err, sizeof err);
        cr_assert_eq(loader == 0, cases[i].valid, "%s: loader %d (%s)", url, loader, why);
        cr_assert_eq(parser == 0, cases[i].valid, "%s: db_dsn_parse %d (%s)", url, parser, err);
        if (loader != 0) {
            assert_no_secret(why, "the loader's message");
            assert_no_secret(err, "db_dsn_parse's message");
        } else {
            cr_assert_str_eq(dsn.user, "idemq");
            cr_assert_str_eq(dsn.host, "127.0.0.1");
        }
        config_redact_url(url, redacted, sizeof redacted);
        cr_assert_str_eq(redacted, "mysql://idemq:***@127.0.0.1:3306/idemq", "%s", url);
    }
    /* What the encoded password decodes to, in both parsers. */
    char amqp_url[] = "amqp://idemq:" ENCODED_PASSWORD "@127.0.0.1:5672/%2f";
    struct amqp_connection_info info;
    cr_assert_eq(amqp_parse_url(amqp_url, &info), AMQP_STATUS_OK);
    cr_assert_str_eq(info.password, RAW_PASSWORD);
    db_dsn dsn;
    char err[256];
    cr_assert_eq(db_dsn_parse("mysql://idemq:" ENCODED_PASSWORD "@127.0.0.1:3306/idemq", &dsn, err,
                              sizeof err),
                 0, "%s", err);
    cr_assert_str_eq(dsn.password, RAW_PASSWORD);
    /* An IPv6 literal: the host is what the brackets hold. */
    cr_assert_eq(db_dsn_parse("mysql://idemq@[::1]:3316/idemq", &dsn, err, sizeof err), 0, "%s",
                 err);
    cr_assert_str_eq(dsn.host, "::1");
    cr_assert_eq(dsn.port, 3316);
    cr_assert_neq(db_dsn_parse("mysql://idemq@[::1/idemq", &dsn, err, sizeof err), 0);
    cr_assert(strstr(err, "unterminated IPv6 address"), "%s", err);
}

Test(config, redaction_never_shows_a_raw_password)
{
    /* The issue's example and its relatives: raw '@' with '/', '?' or '#' in the password. */
    static const char *const urls[] = {
        "amqp://idemq:" RAW_PASSWORD "@host/vhost",
        "amqps://idemq:Sx@Ky/Qv?Zw#Jm@host:5671/%2f",
        "mysql://idemq:Sx@Ky/Qv?Zw#Jm@host/db?socket=/x",
        "mysql://idemq:Sx?Ky@host/db",
        "mysql://Sx/Ky@host/db",               /* '/' before any ':': all of it is hidden */
        "mysql://h/db?password=Sx@Ky",         /* an '@' in a query */
        "mysql://h/db?password=SxKy&x=1",
        "amqp://idemq:Sx#Ky@Qv#Zw@host",
    };
    char buf[256];
    for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
        config_redact_url(urls[i], buf, sizeof buf);
        assert_no_secret(buf, urls[i]);
        cr_assert(strstr(buf, "***"), "%s -> %s", urls[i], buf);
    }
    config_redact_url("amqp://idemq:Sx@Ky/Qv?Zw#Jm@host/vhost", buf, sizeof buf);
    cr_assert_str_eq(buf, "amqp://idemq:***@host/vhost");
}

Test(config, url_check_refuses_what_rabbitmq_c_cannot_parse)
{
    static const struct {
        const char *url;
        bool valid;
    } cases[] = {
        {"amqp://h/vh%2Fa", true},
        {"amqp://h/a/b", false},        /* a raw '/' in the vhost */
        {"amqp://h/a:b", false},
        {"amqp://h/vh?heartbeat=5", false}, /* rabbitmq-c takes no query */
        {"amqp://u:%C3%A9@h/", false},  /* rabbitmq-c refuses %80..%FF */
        {"mysql://u:%C3%A9@h/db", true}, /* db_dsn_parse takes them */
        {"mysql://u:pw@h/db?socket=/run/a%40b.sock", true},
        {"mysql://u:pw@h/db?socket=/run/a@b.sock", false},
    };
    char why[512], copy[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool amqp = strncmp(cases[i].url, "amqp", 4) == 0;
        int rc = config_check_url(cases[i].url, amqp ? amqp_schemes : mysql_schemes,
                                  amqp ? "amqp://" : "mysql://", !amqp, why, sizeof why);
        cr_assert_eq(rc == 0, cases[i].valid, "%s: %d (%s)", cases[i].url, rc, why);
        if (amqp) {
            struct amqp_connection_info info;
            snprintf(copy, sizeof copy, "%s", cases[i].url);
            cr_assert_eq(amqp_parse_url(copy, &info) == AMQP_STATUS_OK, cases[i].valid, "%s",
                         cases[i].url);
        } else {
            db_dsn dsn;
            char err[256];
            cr_assert_eq(db_dsn_parse(cases[i].url, &dsn, err, sizeof err) == 0, cases[i].valid,
                         "%s: %s", cases[i].url, err);
        }
    }
}

static void write_secret(const char *name, const char *content, size_t len, char *path,
                         size_t path_len)
{
    snprintf(path, path_len, "%s/%s", tmpdir, name);
    write_text(path, content, len);
}

Test(config, password_files_are_read_at_load)
{
    char amqp_pw[300], mysql_pw[300], yaml[1024];
    unsetenv("IDEMQ_AMQP_PASSWORD_FILE");
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
    write_secret("amqp", RAW_PASSWORD "\n", strlen(RAW_PASSWORD) + 1, amqp_pw, sizeof amqp_pw);
    write_secret("mysql", "  spaced out \r\n", 15, mysql_pw, sizeof mysql_pw);
    snprintf(yaml, sizeof yaml, "password_file: %s", amqp_pw);
    char m[400];
    snprintf(m, sizeof m, "password_file: \"%s\"", mysql_pw);
    result r = load_slots(yaml, m, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->amqp_password, RAW_PASSWORD);
    cr_assert_str_eq(r.cfg->mysql_password, "  spaced out ");
    cr_assert_str_eq(r.cfg->mysql_password_file, mysql_pw);
    result_free(&r);

    /* No file: no password from one, the URL's stays. */
    r = load_slots(NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_null(r.cfg->amqp_password);
    cr_assert_null(r.cfg->mysql_password);
    result_free(&r);
}

Test(config, password_file_environment_wins_like_the_urls)
{
    char file_pw[300], env_pw[300], yaml[400];
    write_secret("file", "from-file", 9, file_pw, sizeof file_pw);
    write_secret("env", "from-env\n", 9, env_pw, sizeof env_pw);
    setenv("IDEMQ_MYSQL_PASSWORD_FILE", env_pw, 1);
    setenv("IDEMQ_AMQP_PASSWORD_FILE", env_pw, 1);
    snprintf(yaml, sizeof yaml, "password_file: %s", file_pw);
    result r = load_slots(yaml, yaml, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->mysql_password, "from-env");
    cr_assert_str_eq(r.cfg->amqp_password, "from-env");
    cr_assert_str_eq(r.cfg->amqp_password_file, env_pw);
    result_free(&r);

    /* A bad file named by the environment is reported under the variable's name. */
    setenv("IDEMQ_MYSQL_PASSWORD_FILE", "/nonexistent/idemq-secret", 1);
    unsetenv("IDEMQ_AMQP_PASSWORD_FILE");
    r = load_slots(NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, -1, "errors:\n%s", r.errs);
    assert_error(r, 0,
                 "IDEMQ_MYSQL_PASSWORD_FILE (overrides mysql.password_file): cannot read the "
                 "password file '/nonexistent/idemq-secret': No such file or directory");
    result_free(&r);
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
}

Test(config, bad_password_files_are_errors_at_their_line)
{
    char empty[300], newline[300], two_lines[300], big[300], text[400];
    unsetenv("IDEMQ_AMQP_PASSWORD_FILE");
    unsetenv("IDEMQ_MYSQL_PASSWORD_FILE");
    write_secret("empty", "", 0, empty, sizeof empty);
    write_secret("newline", "\n", 1, newline, sizeof newline);
    write_secret("two", "Sx\nKy\n", 6, two_lines, sizeof two_lines);
    static char long_password[1100];
    memset(long_password, 'a', 1025);
    write_secret("big", long_password, 1025, big, sizeof big);
    const struct {
        const char *path, *error;
    } cases[] = {
        {empty, "is empty"},
        {newline, "is empty"},
        {two_lines, "holds control characters or more than one line"},
        {big, "is longer than 1024 bytes"},
        {tmpdir, "is a directory"},
        {"/nonexistent/x", "cannot read the password file '/nonexistent/x': No such file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "password_file: %s", cases[i].path);
        result r = load_slots(NULL, text, NULL, NULL, NULL);
        cr_assert_eq(r.rc, -1, "%s: errors:\n%s", cases[i].path, r.errs);
        assert_error(r, LINE_M, "mysql.password_file: ");
        assert_error(r, LINE_M, cases[i].error);
        assert_no_secret(r.errs, "a password file error");
        result_free(&r);
        r = load_slots(text, NULL, NULL, NULL, NULL);
        assert_error(r, LINE_A, "amqp.password_file: ");
        assert_error(r, LINE_A, cases[i].error);
        result_free(&r);
    }
    /* The largest password that fits, with its newline. */
    memset(long_password, 'b', 1024);
    long_password[1024] = '\n';
    write_secret("fits", long_password, 1025, big, sizeof big);
    snprintf(text, sizeof text, "password_file: %s", big);
    result r = load_slots(NULL, text, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(strlen(r.cfg->mysql_password), 1024);
    result_free(&r);
}

Test(config, mysql_tls_defaults_to_preferred_and_takes_every_mode)
{
    result r = load_slots(NULL, NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->mysql_tls.mode, CONFIG_MYSQL_TLS_PREFERRED);
    cr_assert_null(r.cfg->mysql_tls.ca_file);
    result_free(&r);

    static const struct {
        const char *word;
        config_mysql_tls_mode mode;
    } modes[] = {{"disabled", CONFIG_MYSQL_TLS_DISABLED},
                 {"preferred", CONFIG_MYSQL_TLS_PREFERRED},
                 {"required", CONFIG_MYSQL_TLS_REQUIRED},
                 {"verify_ca", CONFIG_MYSQL_TLS_VERIFY_CA},
                 {"verify_identity", CONFIG_MYSQL_TLS_VERIFY_IDENTITY}};
    char text[1200], ca[300], cert[300], key[300];
    write_secret("ca.pem", "x", 1, ca, sizeof ca);
    write_secret("client.pem", "x", 1, cert, sizeof cert);
    write_secret("client.key", "x", 1, key, sizeof key);
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        snprintf(text, sizeof text, "tls: {mode: %s}", modes[i].word);
        r = load_slots(NULL, text, NULL, NULL, NULL);
        cr_assert_eq(r.rc, 0, "%s: errors:\n%s", modes[i].word, r.errs);
        cr_assert_eq(r.cfg->mysql_tls.mode, modes[i].mode);
        result_free(&r);
    }
    snprintf(text, sizeof text, "tls: {mode: verify_identity, ca_file: %s, cert_file: %s, "
                                "key_file: %s}",
             ca, cert, key);
    r = load_slots(NULL, text, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_str_eq(r.cfg->mysql_tls.ca_file, ca);
    cr_assert_str_eq(r.cfg->mysql_tls.cert_file, cert);
    cr_assert_str_eq(r.cfg->mysql_tls.key_file, key);
    result_free(&r);
    /* A client certificate with preferred or required (servers that require X509). */
    snprintf(text, sizeof text, "tls: {mode: required, cert_file: %s, key_file: %s}", cert, key);
    r = load_slots(NULL, text, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    result_free(&r);
}

Test(config, mysql_tls_combinations_are_checked_at_their_line)
{
    char ca[300], cert[300];
    write_secret("ca.pem", "x", 1, ca, sizeof ca);
    write_secret("client.pem", "x", 1, cert, sizeof cert);
    char t[6][600];
    snprintf(t[0], sizeof t[0], "tls: {mode: required, ca_file: %s}", ca);
    snprintf(t[1], sizeof t[1], "tls: {mode: preferred, ca_file: %s}", ca);
    snprintf(t[2], sizeof t[2], "tls: {mode: disabled, ca_file: %s}", ca);
    snprintf(t[3], sizeof t[3], "tls: {mode: verify_ca, cert_file: %s}", cert);
    snprintf(t[4], sizeof t[4], "tls: {mode: disabled, key_file: %s}", cert);
    snprintf(t[5], sizeof t[5], "tls: {mode: verify_ca, ca_file: %s/missing.pem}", tmpdir);
    const slot_case cases[] = {
        {'M', t[0], "mysql.tls.ca_file is only used by mode verify_ca or verify_identity; mode "
                    "required does not check the server's certificate"},
        {'M', t[1], "mode preferred does not check the server's certificate"},
        {'M', t[2], "mysql.tls.ca_file is not used with mode disabled"},
        {'M', t[3], "mysql.tls.cert_file needs mysql.tls.key_file too"},
        {'M', t[4], "mysql.tls.key_file is not used with mode disabled"},
        {'M', t[5], "mysql.tls.ca_file: cannot read '"},
        {'M', "tls: {mode: verify}", "mysql.tls.mode: 'verify' is not one of: disabled, "
                                     "preferred, required, verify_ca, verify_identity"},
        {'M', "tls: {mode: verify_ca, ca_fil: /x}",
         "unknown key 'mysql.tls.ca_fil' (did you mean 'mysql.tls.ca_file'?)"},
        {'M', "tls: verify_identity", "mysql.tls: expected a mapping, got a string"},
        {'M', "tls: {mode: verify_identity}", NULL}, /* the system trust store */
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* ------------------------------------------------------------------ mysql.batch vs prefetch */

Test(config, the_default_batch_is_lowered_to_a_workers_share_of_the_prefetch)
{
    result r = load_slots("prefetch: 1000", NULL, NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->batch, CONFIG_DEFAULT_BATCH, "prefetch 1000 holds 4 full batches");
    result_free(&r);
    r = load_slots("prefetch: 40", "workers: 8", NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->batch, 5, "40 / 8");
    result_free(&r);
    r = load_slots("prefetch: 3", "workers: 8", NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->batch, 1, "never below one message per transaction");
    result_free(&r);
}

Test(config, a_batch_that_workers_times_batch_would_push_past_the_prefetch_is_refused)
{
    result r = load_slots("prefetch: 64", "batch: 32", NULL, NULL, NULL);
    cr_assert_lt(r.rc, 0);
    assert_error(r, LINE_M,
                 "mysql.batch: 4 workers × batch 32 = 128 messages exceed "
                 "amqp.prefetch 64");
    assert_error(r, LINE_M, "raise amqp.prefetch to at least 128 or lower mysql.batch to 16");
    result_free(&r);
    r = load_slots("prefetch: 256", "batch: 64", NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "4 × 64 = 256 fits; errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->batch, 64);
    result_free(&r);
    r = load_slots(NULL, "batch: 1", NULL, NULL, NULL);
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->batch, 1);
    result_free(&r);
}

Test(config, batch_and_linger_ranges)
{
    static const struct {
        const char *slot, *error;
    } cases[] = {
        {"batch: 0", "mysql.batch: must be between 1 and 1024, got 0"},
        {"batch: 1025", "mysql.batch: must be between 1 and 1024, got 1025"},
        {"batch_linger_ms: 51", "mysql.batch_linger_ms: must be between 0 and 50, got 51"},
        {"batch_linger_ms: 0", NULL},
        {"batch_linger_ms: 50", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r = load_slots("prefetch: 1000", cases[i].slot, NULL, NULL, NULL);
        if (cases[i].error) {
            cr_assert_lt(r.rc, 0, "%s", cases[i].slot);
            assert_error(r, LINE_M, cases[i].error);
        } else {
            cr_assert_eq(r.rc, 0, "%s: %s", cases[i].slot, r.errs);
        }
        result_free(&r);
    }
}

/* A state machine whose transitions are `transitions` (the lines under it, at 8 spaces). */
static result load_transitions(const char *top, const char *transitions)
{
    char text[4096];
    snprintf(text, sizeof text,
             "amqp: {url: \"amqp://h\"}\n"
             "mysql: {url: \"mysql://h/db\"}\n"
             "%s\n"
             "consumers:\n"
             "  - queue: payments\n"
             "    handler_name: pay-callback\n"
             "    handler:\n"
             "      type: state_machine\n"
             "      table: orders\n"
             "      key_column: order_id\n"
             "      key_field: order_id\n"
             "      state_column: status\n"
             "      event_field: event_type\n"
             "      transitions:\n"
             "%s",
             top ? top : "", transitions);
    return load_text(text);
}

Test(config, emit_under_a_transition_loads_every_shape)
{
    result r = load_transitions("outbox: {lease: 5s, retention: 0}",
                                "        PAY_SUCCESS:\n"
                                "          from: PAYING\n"
                                "          to: PAID\n"
                                "          emit:\n"
                                "            - name: order-paid\n"
                                "              exchange: orders.events\n"
                                "              routing_key: order.paid\n"
                                "              content_type: msgpack\n"
                                "              fields:\n"
                                "                order_id: order_id\n"
                                "                amount: payment.amount\n"
                                "                kind: {value: ORDER_PAID}\n"
                                "                n: {value: 3}\n"
                                "                tags: {value: [a, 1]}\n"
                                "        REFUND: {from: PAID, to: REFUNDED, emit: {name: r, "
                                "routing_key: q, fields: {o: order_id}}}\n"
                                "        SHIP: {from: PAID, to: SHIPPED}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    const config_consumer *c = &r.cfg->consumers[0];
    const config_transition *pay = &c->handler.state_machine.transitions[0];
    cr_assert_eq(pay->emit_count, 1);
    const config_emit *e = &pay->emits[0];
    cr_expect_str_eq(e->name, "order-paid");
    cr_expect_str_eq(e->exchange, "orders.events");
    cr_expect_str_eq(e->routing_key, "order.paid");
    cr_expect_eq(e->format, CONFIG_EMIT_MSGPACK);
    cr_assert_eq(e->field_count, 5);
    cr_expect_str_eq(e->fields[1].name, "amount");
    cr_expect_str_eq(e->fields[1].from, "payment.amount");
    cr_expect_null(e->fields[1].value);
    cr_expect_null(e->fields[2].from);
    cr_expect(json_is_string(e->fields[2].value) &&
              !strcmp(json_string_value(e->fields[2].value), "ORDER_PAID"));
    cr_expect(json_is_integer(e->fields[3].value) && json_integer_value(e->fields[3].value) == 3);
    cr_expect(json_is_array(e->fields[4].value) && json_array_size(e->fields[4].value) == 2);
    /* One mapping is a list of one; no exchange is the default exchange; json is the default. */
    const config_transition *refund = &c->handler.state_machine.transitions[1];
    cr_assert_eq(refund->emit_count, 1);
    cr_expect_null(refund->emits[0].exchange);
    cr_expect_eq(refund->emits[0].format, CONFIG_EMIT_JSON);
    cr_expect_eq(c->handler.state_machine.transitions[2].emit_count, 0);
    cr_expect(c->may_emit);
    cr_expect(r.cfg->outbox_needed);
    cr_expect_eq(r.cfg->outbox.relay, 1);
    cr_expect_eq(r.cfg->outbox.batch, 2048u);
    cr_expect_eq(r.cfg->outbox.lease_ms, 5000u);
    cr_expect_eq(r.cfg->outbox.retention_ms, 0u);
    cr_expect_eq(r.cfg->outbox.poll_interval_ms, 1000u);
    cr_expect_eq(r.cfg->outbox.stuck_after_ms, 60000u);
    result_free(&r);

    r = load_transitions(NULL, "        PAY_SUCCESS: {from: [PAYING], to: PAID}\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_expect(!r.cfg->consumers[0].may_emit, "no emit: the relay need not run");
    cr_expect(!r.cfg->outbox_needed);
    result_free(&r);
}

Test(config, bad_emits_are_reported_at_their_line)
{
    result r = load_transitions("outbox: {batch: 0}",
                                "        PAY_SUCCESS:\n"
                                "          from: PAYING\n"
                                "          to: PAID\n"
                                "          emit:\n"
                                "            - name: e\n"
                                "              routing_key: q\n"
                                "              fields: {biz_key: order_id}\n"
                                "            - name: e\n"
                                "              routing_key: q\n"
                                "              fields: {a: {value: 1, other: 2}}\n"
                                "            - name: \"bad name\"\n"
                                "              content_type: xml\n"
                                "              fields: {}\n"
                                "            - name: f\n"
                                "              routing_key: q\n"
                                "              fields: {a: x..y}\n");
    const char *path = "consumers[0].handler.transitions.PAY_SUCCESS.emit";
    char want[256];
    cr_assert(r.rc < 0, "errors:\n%s", r.errs);
    assert_error(r, 3, "outbox.batch");
    snprintf(want, sizeof want, "%s[0].fields.biz_key: idemq sets the outgoing biz_key itself",
             path);
    assert_error(r, 21, want);
    assert_error(r, 24, "a constant is written {value: CONSTANT}, with no other key");
    snprintf(want, sizeof want, "%s[1]: emit name 'e' is used twice in this list", path);
    assert_error(r, 22, want);
    assert_error(r, 25, "emit name 'bad name' may only use A-Z a-z 0-9 _ - .");
    assert_error(r, 26, "'xml' is not one of: json, msgpack");
    assert_error(r, 27, "list 1 to 256 fields, got 0");
    assert_error(r, 25, "missing required key");
    assert_error(r, 30, "field path 'x..y' has an empty segment");
    result_free(&r);
}

Test(config, sql_handler_emit_and_plugin_may_emit)
{
    result r = load_text("amqp: {url: \"amqp://h\"}\n"
                         "mysql: {url: \"mysql://h/db\"}\n"
                         "consumers:\n"
                         "  - queue: transfers\n"
                         "    handler_name: transfer\n"
                         "    handler:\n"
                         "      type: sql\n"
                         "      statements: [\"UPDATE a SET b = :b\"]\n"
                         "      emit: [{name: booked, routing_key: booked, fields: {b: b}}]\n");
    cr_assert_eq(r.rc, 0, "errors:\n%s", r.errs);
    cr_assert_eq(r.cfg->consumers[0].handler.sql.emit_count, 1);
    cr_expect_str_eq(r.cfg->consumers[0].handler.sql.emits[0].fields[0].from, "b");
    cr_expect(r.cfg->outbox_needed);
    result_free(&r);
}
