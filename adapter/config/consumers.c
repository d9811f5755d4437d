/*
 * consumers — see consumers.h.
 */
#include "config/consumers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/document.h"
#include "config/handler.h"
#include "config/text.h"
#include "config/units.h"

#define CONFIG_MAX_CONSUMERS 256
#define QUEUE_MAX 200       /* leaves room for ".retry.N" / ".dlq" within AMQP's 255 */
#define HANDLER_NAME_MAX 64 /* width of msg_dedup.handler_name */

_Static_assert(sizeof(config_declare_mode) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(config_queue_type) == sizeof(int), "enums are stored as int");

static int check_queue(const char *text, char *err, size_t err_len)
{
    size_t n = strlen(text);
    if (n > QUEUE_MAX) {
        snprintf(err, err_len,
                 "queue name is %zu bytes long; at most %d are allowed (the retry and dead-letter "
                 "queues append suffixes to it)",
                 n, QUEUE_MAX);
        return -1;
    }
    if (config_check_bounded(text, QUEUE_MAX, "queue name", err, err_len) < 0)
        return -1;
    if (strncmp(text, "amq.", 4) == 0) {
        snprintf(err, err_len, "queue names starting with 'amq.' are reserved by RabbitMQ");
        return -1;
    }
    return 0;
}

static int check_handler_name(const char *text, char *err, size_t err_len)
{
    size_t n = strlen(text);
    if (n > HANDLER_NAME_MAX) {
        snprintf(err, err_len,
                 "handler_name is %zu bytes long; at most %d are allowed (it is stored in "
                 "msg_dedup.handler_name)",
                 n, HANDLER_NAME_MAX);
        return -1;
    }
    return config_check_bounded(text, HANDLER_NAME_MAX, "handler_name", err, err_len);
}

/* clang-format off */
static const char *const declare_names[] = {"create", "passive", NULL};
static const char *const queue_type_names[] = {"quorum", "classic", NULL};

static const opt retry_table[] = {
    {.name = "max_retries", .type = OPT_UINT, .offset = offsetof(config_consumer, retry.max_retries),
     .min = 0, .max = 32, .def = "6", .help = "retries before dead-lettering"},
    {.name = "base", .type = OPT_DURATION, .offset = offsetof(config_consumer, retry.base_ms),
     .min = 1, .max = DAYS(7), .def = "1s", .help = "delay of the first retry; doubles each time"},
    {.name = "jitter", .type = OPT_DURATION, .offset = offsetof(config_consumer, retry.jitter_ms),
     .min = 0, .max = DAYS(1), .def = "1s", .help = "random extra delay, 0 to jitter"},
    {.name = "max_delay", .type = OPT_DURATION,
     .offset = offsetof(config_consumer, retry.max_delay_ms), .min = 1, .max = DAYS(7),
     .def = "1h", .help = "cap on the doubling delay"},
    {0},
};

const opt config_consumer_table[] = {
    {.name = "queue", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_consumer, queue), .check = check_queue,
     .help = "the work queue to consume"},
    {.name = "handler_name", .type = OPT_STRING, .flags = OPT_REQUIRED,
     .offset = offsetof(config_consumer, handler_name), .check = check_handler_name,
     .help = "dedup namespace, stored with every processed biz_key"},
    {.name = "declare", .type = OPT_ENUM, .offset = offsetof(config_consumer, declare),
     .names = declare_names, .def = "create", .help = "declare the work queue or only check it"},
    {.name = "queue_type", .type = OPT_ENUM, .offset = offsetof(config_consumer, queue_type),
     .names = queue_type_names, .def = "quorum", .help = "type of the retry and dead-letter queues"},
    {.name = "retry", .type = OPT_SECTION, .section = retry_table, .help = "retry schedule"},
    {.name = "handler", .type = OPT_CUSTOM, .flags = OPT_REQUIRED, .parse = config_parse_handler,
     .names = config_handler_type_names, .variants = config_handler_variants,
     .help = "what to do with each message: type state_machine, sql or plugin"},
    {0},
};
/* clang-format on */

/* A retry schedule as a whole: with base above max_delay, every retry would wait max_delay. */
static void validate_retry(load_ctx *ctx, const config_consumer *c, yaml_node_t *item,
                           const char *cpath)
{
    if (c->retry.base_ms > c->retry.max_delay_ms) {
        yaml_node_t *retry = config_mapping_get(ctx, item, "retry");
        char b[32], m[32];
        config_report(ctx, config_node_line(retry ? retry : item),
                      "%s.retry: base (%s) is larger than max_delay (%s); every retry would wait "
                      "max_delay",
                      cpath, config_format_duration(b, sizeof b, c->retry.base_ms),
                      config_format_duration(m, sizeof m, c->retry.max_delay_ms));
    }
}

/* Cross-consumer checks: a queue consumed twice, or a queue that is another consumer's retry or
 * dead-letter queue, would make the topology fight itself. list is the `consumers` node. */
static void validate_queues(load_ctx *ctx, const config *cfg, yaml_node_t *list, const char *path)
{
    size_t n = cfg->consumer_count;

    for (size_t j = 0; j < n; j++) {
        const char *qj = cfg->consumers[j].queue;
        yaml_node_t *item = config_get_node(ctx, list->data.sequence.items.start[j]);
        yaml_node_t *qnode = config_mapping_get(ctx, item, "queue");
        char shown[128];

        if (!qj)
            continue;
        for (size_t i = 0; i < n; i++) {
            const char *qi = cfg->consumers[i].queue, *suffix;
            size_t li;
            if (i == j || !qi)
                continue;
            if (i < j && !strcmp(qi, qj)) {
                config_report(ctx, config_node_line(qnode ? qnode : item),
                              "%s[%zu].queue: queue '%s' is already consumed by %s[%zu]", path, j,
                              config_show(shown, sizeof shown, qj), path, i);
                break;
            }
            li = strlen(qi);
            if (strncmp(qj, qi, li) != 0 || qj[li] != '.')
                continue;
            suffix = qj + li + 1;
            if (!strcmp(suffix, "dlq")) {
                config_report(ctx, config_node_line(qnode ? qnode : item),
                              "%s[%zu].queue: '%s' is the dead-letter queue of %s[%zu]", path, j,
                              config_show(shown, sizeof shown, qj), path, i);
                break;
            }
            if (!strncmp(suffix, "retry.", 6)) {
                const char *p = suffix + 6;
                uint64_t level;
                if (config_parse_count(&p, &level) == 0 && !*p && level >= 1 &&
                    level <= cfg->consumers[i].retry.max_retries) {
                    config_report(ctx, config_node_line(qnode ? qnode : item),
                                  "%s[%zu].queue: '%s' is a retry queue of %s[%zu]", path, j,
                                  config_show(shown, sizeof shown, qj), path, i);
                    break;
                }
            }
        }
    }
}

void config_parse_consumers(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path)
{
    config *cfg = base;
    size_t n;
    char cpath[KEY_PATH_MAX];

    if (node->type != YAML_SEQUENCE_NODE) {
        config_report(ctx, config_node_line(node), "%s: expected a list of consumers, got %s", path,
                      config_node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0) {
        config_report(ctx, config_node_line(node),
                      "%s: the list is empty; configure at least one consumer", path);
        return;
    }
    if (n > CONFIG_MAX_CONSUMERS) {
        config_report(ctx, config_node_line(node), "%s: %zu consumers; at most %d are supported",
                      path, n, CONFIG_MAX_CONSUMERS);
        return;
    }
    cfg->consumers = calloc(n, sizeof *cfg->consumers);
    if (!cfg->consumers) {
        config_report(ctx, config_node_line(node), "%s: out of memory", path);
        return;
    }
    cfg->consumer_count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = config_get_node(ctx, node->data.sequence.items.start[i]);
        config_consumer *c = &cfg->consumers[i];

        snprintf(cpath, sizeof cpath, "%s[%zu]", path, i);
        config_apply_defaults(ctx, o->items, c);
        if (!item)
            continue;
        config_walk_table(ctx, o->items, item, c, cpath, config_node_line(item));
        validate_retry(ctx, c, item, cpath);
    }
    validate_queues(ctx, cfg, node, path);
}
