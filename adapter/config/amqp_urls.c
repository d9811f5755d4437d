/*
 * amqp_urls — see amqp_urls.h.
 */
#include "config/amqp_urls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/document.h"
#include "config/text.h"

#define ENV_OVERRIDES AMQP_URLS_ENV " (overrides amqp.url and amqp.urls)"

int config_check_amqp_url(const char *text, char *err, size_t err_len)
{
    static const char *const schemes[] = {"amqp", "amqps", NULL};
    return config_check_url(text, schemes, "amqp:// or amqps://", false, err, err_len);
}

static void clear_urls(config *cfg)
{
    for (size_t i = 0; i < CONFIG_MAX_AMQP_URLS; i++) {
        free(cfg->amqp_urls[i]);
        cfg->amqp_urls[i] = NULL;
    }
}

void config_parse_amqp_urls(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path)
{
    config *cfg = base;
    char ipath[KEY_PATH_MAX];
    size_t n;
    (void)o;

    if (node->type != YAML_SEQUENCE_NODE) {
        config_report(ctx, config_node_line(node),
                      "%s: expected a list of broker URLs, got %s (for one node, use amqp.url)",
                      path, config_node_kind(node));
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0) {
        config_report(ctx, config_node_line(node),
                      "%s: the list is empty; give at least one broker URL", path);
        return;
    }
    if (n > CONFIG_MAX_AMQP_URLS) {
        config_report(ctx, config_node_line(node), "%s: %zu URLs; at most %d are supported", path,
                      n, CONFIG_MAX_AMQP_URLS);
        return;
    }
    clear_urls(cfg);
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = config_get_node(ctx, node->data.sequence.items.start[i]);
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (item)
            cfg->amqp_urls[i] =
                config_take_string(ctx, item, ipath, "a broker URL", config_check_amqp_url);
    }
}

/* Replaces the file's URLs with the comma-separated list in env (borrowed), each entry trimmed of
 * blanks. Reports (without a line: the environment has none) every bad entry. */
static void apply_environment(load_ctx *ctx, config *cfg, const char *env)
{
    char *urls[CONFIG_MAX_AMQP_URLS] = {NULL};
    size_t n = 0, entries = 1, problems = ctx->total;
    char why[512];

    for (const char *p = env; *p; p++)
        entries += *p == ',';
    if (entries > CONFIG_MAX_AMQP_URLS) {
        config_report(ctx, 0, "%s: %zu URLs; at most %d are supported", ENV_OVERRIDES, entries,
                      CONFIG_MAX_AMQP_URLS);
        return;
    }
    for (const char *p = env;; p++) {
        size_t len = strcspn(p, ",");
        const char *start = p, *end = p + len;
        while (start < end && (*start == ' ' || *start == '\t'))
            start++;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        char *url = strndup(start, (size_t)(end - start));
        if (!url) {
            config_report(ctx, 0, "%s: out of memory", ENV_OVERRIDES);
        } else if (!*url) {
            config_report(ctx, 0, "%s: URL %zu of %zu is empty", ENV_OVERRIDES, n + 1, entries);
            free(url);
        } else if (config_check_amqp_url(url, why, sizeof why) < 0) {
            if (entries == 1)
                config_report(ctx, 0, "%s: %s", ENV_OVERRIDES, why);
            else
                config_report(ctx, 0, "%s: URL %zu of %zu: %s", ENV_OVERRIDES, n + 1, entries, why);
            free(url);
        } else {
            urls[n] = url;
        }
        n++;
        p += len;
        if (!*p)
            break;
    }
    if (ctx->total != problems) {
        for (size_t i = 0; i < n; i++)
            free(urls[i]);
        return;
    }
    clear_urls(cfg);
    memcpy(cfg->amqp_urls, urls, sizeof urls);
}

/* Reports URLs given twice: the same node tried twice per round would only slow a failover. The
 * line is the list item's when the URLs came from the file (list may be NULL). */
static void report_duplicates(load_ctx *ctx, const config *cfg, yaml_node_t *list, bool from_env)
{
    char shown[256];
    for (size_t j = 1; j < CONFIG_MAX_AMQP_URLS; j++) {
        if (!cfg->amqp_urls[j])
            continue; /* a bad entry, already reported */
        for (size_t i = 0; i < j; i++) {
            if (!cfg->amqp_urls[i] || strcmp(cfg->amqp_urls[i], cfg->amqp_urls[j]) != 0)
                continue;
            config_redact_url(cfg->amqp_urls[j], shown, sizeof shown);
            if (from_env) {
                config_report(ctx, 0, "%s: URL %zu repeats URL %zu ('%s')", ENV_OVERRIDES, j + 1,
                              i + 1, shown);
            } else {
                yaml_node_t *item =
                    list ? config_get_node(ctx, list->data.sequence.items.start[j]) : NULL;
                config_report(ctx, config_node_line(item ? item : list),
                              "amqp.urls[%zu]: '%s' is already amqp.urls[%zu]", j, shown, i);
            }
            break;
        }
    }
}

void config_finish_amqp_urls(load_ctx *ctx, yaml_node_t *root, void *base)
{
    config *cfg = base;
    yaml_node_t *amqp = config_mapping_get(ctx, root, "amqp");
    yaml_node_t *url = config_mapping_get(ctx, amqp, "url");
    yaml_node_t *urls = config_mapping_get(ctx, amqp, "urls");
    const char *env = getenv(AMQP_URLS_ENV);

    if (env && !*env)
        env = NULL; /* an empty variable means "not set", as for every override */
    if (url && urls)
        config_report(ctx, config_node_line(urls),
                      "amqp.urls: give either amqp.url (line %lu) or amqp.urls, not both",
                      config_node_line(url));
    if (!url && !urls && !env)
        config_report(ctx, config_node_line(amqp ? amqp : root),
                      "missing required key 'amqp.url' (one broker URL, or amqp.urls for several "
                      "nodes; or set %s)",
                      AMQP_URLS_ENV);
    if (env)
        apply_environment(ctx, cfg, env);
    else if (urls && urls->type == YAML_SEQUENCE_NODE)
        report_duplicates(ctx, cfg, urls, false);
    if (env)
        report_duplicates(ctx, cfg, NULL, true);
    cfg->amqp_url_count = 0;
    while (cfg->amqp_url_count < CONFIG_MAX_AMQP_URLS && cfg->amqp_urls[cfg->amqp_url_count])
        cfg->amqp_url_count++;
}
