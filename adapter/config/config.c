/*
 * config — loads a config file into a config (contract in config.h), and frees it.
 *
 * The file (at most 1 MiB) is read whole, checked once with libyaml's event parser (syntax
 * errors, nesting depth, aliases, explicit tags, a single document) and then loaded with
 * yaml_parser_load, so every node keeps its line. The document is walked from the top-level
 * table (options.h) by the table walker (table.h), each section checking its own keys; every
 * problem is collected with its line (problems.h) and printed at the end, and the caller gets
 * their negative count.
 *
 * Thread affinity: main thread only (getenv, strerror); the loaded config is read-only afterwards.
 */
#include "config/config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "config/node_urls.h"
#include "config/document.h"
#include "config/emit.h"
#include "config/mysql_tls.h"
#include "config/options.h"
#include "config/problems.h"
#include "config/secrets.h"
#include "config/table.h"
#include "config/text.h"

/* Limits that keep a hostile or broken file from costing much memory or time. */
#define CONFIG_MAX_FILE_BYTES (1024 * 1024)
#define CONFIG_MAX_DEPTH 32

/* Reads path whole into *out (returned owned) and *out_len, bounded by CONFIG_MAX_FILE_BYTES so
 * pipes and /dev/stdin work too. Returns 0, or -1 after reporting why. */
static int read_file(load_ctx *ctx, const char *path, unsigned char **out, size_t *out_len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    struct stat st;
    int rc = -1;

    if (!f) {
        config_report(ctx, 0, "cannot open the config file: %s", strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        config_report(ctx, 0, "cannot read the config file: it is a directory");
        goto out;
    }
    /* Read at most one byte more than allowed, so pipes and /dev/stdin work and are bounded. */
    for (;;) {
        size_t got;
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 16384;
            unsigned char *nbuf;
            if (ncap > CONFIG_MAX_FILE_BYTES + 1)
                ncap = CONFIG_MAX_FILE_BYTES + 1;
            if (ncap == cap) {
                config_report(ctx, 0, "the config file is larger than %d bytes (1 MiB)",
                              CONFIG_MAX_FILE_BYTES);
                goto out;
            }
            nbuf = realloc(buf, ncap);
            if (!nbuf) {
                config_report(ctx, 0, "out of memory reading the config file");
                goto out;
            }
            buf = nbuf, cap = ncap;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                config_report(ctx, 0, "cannot read the config file: %s", strerror(errno));
                goto out;
            }
            break;
        }
    }
    if (len > CONFIG_MAX_FILE_BYTES) {
        config_report(ctx, 0, "the config file is larger than %d bytes (1 MiB)",
                      CONFIG_MAX_FILE_BYTES);
        goto out;
    }
    *out = buf;
    *out_len = len;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

static void report_syntax(load_ctx *ctx, const yaml_parser_t *p, const unsigned char *text,
                          size_t len)
{
    unsigned long line = (unsigned long)p->problem_mark.line + 1;

    if (p->error == YAML_MEMORY_ERROR) {
        config_report(ctx, 0, "out of memory while parsing YAML");
        return;
    }
    if (p->error == YAML_READER_ERROR) {
        /* Reader errors (bad UTF-8, control characters) only carry a byte offset. */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++)
            line += text[i] == '\n';
    }
    if (p->context)
        config_report(ctx, line, "YAML syntax error: %s (%s at line %lu)",
                      p->problem ? p->problem : "unknown problem", p->context,
                      (unsigned long)p->context_mark.line + 1);
    else
        config_report(ctx, line, "YAML syntax error: %s",
                      p->problem ? p->problem : "unknown problem");
}

/*
 * A first pass over the event stream: syntax errors (with the line), nesting depth, aliases,
 * explicit tags and extra documents are all refused here, before the loader builds a tree.
 * Aliases are refused because a few of them can make a small file expand into a huge config
 * ("billion laughs"); nothing in this format needs them. Returns 0 or -1.
 */
static int check_events(load_ctx *ctx, const unsigned char *text, size_t len)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int depth = 0, docs = 0, rc = 0;
    bool done = false;

    if (!yaml_parser_initialize(&parser)) {
        config_report(ctx, 0, "out of memory while parsing YAML");
        return -1;
    }
    yaml_parser_set_input_string(&parser, text, len);
    while (!done) {
        unsigned long line;
        const yaml_char_t *tag = NULL;

        if (!yaml_parser_parse(&parser, &ev)) {
            report_syntax(ctx, &parser, text, len);
            rc = -1;
            break;
        }
        line = (unsigned long)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                config_report(ctx, line, "only one YAML document is allowed in the config file");
                rc = -1;
                done = true;
            }
            break;
        case YAML_ALIAS_EVENT:
            config_report(ctx, line, "YAML aliases (*%s) are not supported; write the value out",
                          (const char *)ev.data.alias.anchor);
            rc = -1;
            break;
        case YAML_SCALAR_EVENT:
            tag = ev.data.scalar.tag;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            tag = ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.tag
                                                       : ev.data.mapping_start.tag;
            if (++depth > CONFIG_MAX_DEPTH) {
                config_report(ctx, line, "nesting deeper than %d levels", CONFIG_MAX_DEPTH);
                rc = -1;
                done = true;
            }
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        default:
            break;
        }
        if (tag) {
            char shown[128];
            config_report(ctx, line, "explicit YAML tags (%s) are not supported",
                          config_show(shown, sizeof shown, (const char *)tag));
            rc = -1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return rc;
}

int config_load(const char *path, FILE *errors, config **out)
{
    load_ctx ctx = {.path = path ? path : "(no path)"};
    unsigned char *text = NULL;
    size_t len = 0;
    yaml_parser_t parser;
    yaml_document_t doc;
    bool parser_ready = false, doc_ready = false;
    yaml_node_t *root;
    config *cfg = NULL;
    int rc;

    if (out)
        *out = NULL;
    if (!path || !out) {
        config_report(&ctx, 0, "config_load: path and out are required");
        goto out;
    }
    if (read_file(&ctx, path, &text, &len) < 0 || check_events(&ctx, text, len) < 0)
        goto out;
    if (!yaml_parser_initialize(&parser)) {
        config_report(&ctx, 0, "out of memory while parsing YAML");
        goto out;
    }
    parser_ready = true;
    yaml_parser_set_input_string(&parser, text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        report_syntax(&ctx, &parser, text, len);
        goto out;
    }
    doc_ready = true;
    ctx.doc = &doc;
    root = yaml_document_get_root_node(&doc);
    if (!root || config_is_null(root)) {
        config_report(&ctx, 0,
                      "the config file is empty (expected a mapping with amqp, mysql and "
                      "consumers)");
        goto out;
    }
    if (root->type != YAML_MAPPING_NODE) {
        config_report(&ctx, config_node_line(root), "expected a mapping at the top level, got %s",
                      config_node_kind(root));
        goto out;
    }
    cfg = calloc(1, sizeof *cfg);
    if (!cfg || !(cfg->path = strdup(path))) {
        config_report(&ctx, 0, "out of memory");
        goto out;
    }
    config_apply_defaults(&ctx, config_top_table, cfg);
    config_walk_table(&ctx, config_top_table, root, cfg, "", config_node_line(root));
    config_finish_node_urls(&ctx, root, cfg);
    config_validate_amqp_tls(&ctx, cfg, root);
    config_validate_batch(&ctx, root, cfg);
    config_validate_dedup_cache(&ctx, root, cfg);
    config_finish_outbox(&ctx, root, cfg);
    config_load_secrets(&ctx, root, cfg);
    config_validate_mysql_tls(&ctx, root, cfg);
out:
    rc = ctx.total > (size_t)INT32_MAX ? -INT32_MAX : -(int)ctx.total;
    config_flush_problems(&ctx, errors);
    if (rc == 0)
        *out = cfg;
    else
        config_free(cfg);
    if (doc_ready)
        yaml_document_delete(&doc);
    if (parser_ready)
        yaml_parser_delete(&parser);
    free(text);
    return rc;
}

static void free_state_machine(config_state_machine *sm)
{
    free(sm->table);
    free(sm->key_column);
    free(sm->key_field);
    free(sm->state_column);
    free(sm->event_field);
    for (size_t i = 0; i < sm->transition_count; i++) {
        config_transition *t = &sm->transitions[i];
        free(t->event);
        free(t->to);
        for (size_t j = 0; j < t->from_count; j++)
            free(t->from[j]);
        free(t->from);
        config_free_emits(t->emits, t->emit_count);
    }
    free(sm->transitions);
    for (size_t i = 0; i < sm->set_count; i++) {
        free(sm->set[i].column);
        free(sm->set[i].field);
    }
    free(sm->set);
}

static void free_sql(config_sql *sql)
{
    for (size_t i = 0; i < sql->statement_count; i++) {
        config_sql_statement *st = &sql->statements[i];
        free(st->sql);
        free(st->prepared);
        for (size_t j = 0; j < st->param_count; j++)
            free(st->params[j]);
        free(st->params);
    }
    free(sql->statements);
    config_free_emits(sql->emits, sql->emit_count);
}

void config_free(config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        free(cfg->consumers[i].queue);
        free(cfg->consumers[i].handler_name);
        free_state_machine(&cfg->consumers[i].handler.state_machine);
        free_sql(&cfg->consumers[i].handler.sql);
        free(cfg->consumers[i].handler.plugin.path);
        free(cfg->consumers[i].handler.plugin.config_json);
    }
    free(cfg->consumers);
    free(cfg->path);
    for (size_t i = 0; i < CONFIG_MAX_AMQP_URLS; i++)
        free(cfg->amqp_urls[i]);
    free(cfg->amqp_tls.ca_file);
    free(cfg->amqp_tls.cert_file);
    free(cfg->amqp_tls.key_file);
    free(cfg->amqp_tls.server_name);
    for (size_t i = 0; i < CONFIG_MAX_MYSQL_URLS; i++)
        free(cfg->mysql_urls[i]);
    free(cfg->http_listen);
    free(cfg->amqp_password_file);
    config_free_secret(cfg->amqp_password);
    free(cfg->mysql_password_file);
    config_free_secret(cfg->mysql_password);
    free(cfg->mysql_tls.ca_file);
    free(cfg->mysql_tls.cert_file);
    free(cfg->mysql_tls.key_file);
    free(cfg);
}
