/*
 * node_urls — see node_urls.h.
 */
#include "config/node_urls.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/document.h"
#include "config/text.h"
#include "config/url.h"

/* One cluster's URLs in the config: where they live and how they are named in messages. */
typedef struct node_list {
    const char *section;  /* "amqp" */
    const char *env;      /* its override */
    const char *kind;     /* "broker": "a broker URL", "missing ... broker URL" */
    size_t max;
    size_t urls_offset;   /* char *[max] in config */
    size_t count_offset;  /* size_t in config */
    int (*check)(const char *text, char *err, size_t err_len);
} node_list;

static const node_list amqp_nodes = {
    .section = "amqp",
    .env = AMQP_URLS_ENV,
    .kind = "broker",
    .max = CONFIG_MAX_AMQP_URLS,
    .urls_offset = offsetof(config, amqp_urls),
    .count_offset = offsetof(config, amqp_url_count),
    .check = config_check_amqp_url,
};

static const node_list mysql_nodes = {
    .section = "mysql",
    .env = MYSQL_URLS_ENV,
    .kind = "database",
    .max = CONFIG_MAX_MYSQL_URLS,
    .urls_offset = offsetof(config, mysql_urls),
    .count_offset = offsetof(config, mysql_url_count),
    .check = config_check_mysql_url,
};

static char **urls_of(const node_list *list, config *cfg)
{
    return (char **)((char *)cfg + list->urls_offset);
}

int config_check_amqp_url(const char *text, char *err, size_t err_len)
{
    static const char *const schemes[] = {"amqp", "amqps", NULL};
    return config_check_url(text, schemes, "amqp:// or amqps://", false, err, err_len);
}

int config_check_mysql_url(const char *text, char *err, size_t err_len)
{
    static const char *const schemes[] = {"mysql", NULL};
    if (config_check_url(text, schemes, "mysql://", true, err, err_len) != 0)
        return -1;
    /* What only the MySQL grammar knows (a database, known parameters, lengths) fails here,
     * with its line, rather than at the first connect. */
    config_mysql_url parts;
    char sub[160], redacted[256], shown[128];
    int rc = config_parse_mysql_url(text, &parts, sub, sizeof sub);
    explicit_bzero(&parts, sizeof parts);
    if (rc != 0) {
        config_redact_url(text, redacted, sizeof redacted);
        snprintf(err, err_len, "'%s': %s", config_show(shown, sizeof shown, redacted), sub);
        return -1;
    }
    return 0;
}

static void clear_urls(const node_list *list, config *cfg)
{
    char **urls = urls_of(list, cfg);
    for (size_t i = 0; i < list->max; i++) {
        free(urls[i]);
        urls[i] = NULL;
    }
}

static void parse_urls(const node_list *list, load_ctx *ctx, yaml_node_t *node, config *cfg,
                       const char *path)
{
    char ipath[KEY_PATH_MAX], what[32];
    size_t n;

    if (node->type != YAML_SEQUENCE_NODE) {
        config_report(ctx, config_node_line(node),
                      "%s: expected a list of %s URLs, got %s (for one node, use %s.url)", path,
                      list->kind, config_node_kind(node), list->section);
        return;
    }
    n = (size_t)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n == 0) {
        config_report(ctx, config_node_line(node), "%s: the list is empty; give at least one %s URL",
                      path, list->kind);
        return;
    }
    if (n > list->max) {
        config_report(ctx, config_node_line(node), "%s: %zu URLs; at most %zu are supported", path,
                      n, list->max);
        return;
    }
    clear_urls(list, cfg);
    snprintf(what, sizeof what, "a %s URL", list->kind);
    char **urls = urls_of(list, cfg);
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = config_get_node(ctx, node->data.sequence.items.start[i]);
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (item)
            urls[i] = config_take_string(ctx, item, ipath, what, list->check);
    }
}

void config_parse_amqp_urls(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                            const char *path)
{
    (void)o;
    parse_urls(&amqp_nodes, ctx, node, base, path);
}

void config_parse_mysql_urls(load_ctx *ctx, const opt *o, yaml_node_t *node, void *base,
                             const char *path)
{
    (void)o;
    parse_urls(&mysql_nodes, ctx, node, base, path);
}

/* "IDEMQ_AMQP_URL (overrides amqp.url and amqp.urls)", the name of the environment in
 * messages. */
static const char *env_overrides(const node_list *list, char *buf, size_t len)
{
    snprintf(buf, len, "%s (overrides %s.url and %s.urls)", list->env, list->section,
             list->section);
    return buf;
}

/* Replaces the file's URLs with the comma-separated list in env (borrowed), each entry trimmed of
 * blanks. Reports (without a line: the environment has none) every bad entry. */
static void apply_environment(const node_list *list, load_ctx *ctx, config *cfg, const char *env)
{
    char *urls[CONFIG_MAX_NODE_URLS] = {NULL};
    size_t n = 0, entries = 1, problems = ctx->total;
    char why[512], name[96];

    env_overrides(list, name, sizeof name);
    for (const char *p = env; *p; p++)
        entries += *p == ',';
    if (entries > list->max) {
        config_report(ctx, 0, "%s: %zu URLs; at most %zu are supported", name, entries, list->max);
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
            config_report(ctx, 0, "%s: out of memory", name);
        } else if (!*url) {
            config_report(ctx, 0, "%s: URL %zu of %zu is empty", name, n + 1, entries);
            free(url);
        } else if (list->check(url, why, sizeof why) < 0) {
            if (entries == 1)
                config_report(ctx, 0, "%s: %s", name, why);
            else
                config_report(ctx, 0, "%s: URL %zu of %zu: %s", name, n + 1, entries, why);
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
    clear_urls(list, cfg);
    memcpy(urls_of(list, cfg), urls, list->max * sizeof urls[0]);
}

/* Where URL j came from, for a message: "mysql.urls[2]" (line of the item) or "URL 3 of
 * IDEMQ_MYSQL_URL" (no line). */
static unsigned long describe_entry(const node_list *list, load_ctx *ctx, yaml_node_t *file_list,
                                    bool from_env, size_t j, char *buf, size_t len)
{
    if (from_env) {
        snprintf(buf, len, "%s: URL %zu", list->env, j + 1);
        return 0;
    }
    snprintf(buf, len, "%s.urls[%zu]", list->section, j);
    yaml_node_t *item =
        file_list ? config_get_node(ctx, file_list->data.sequence.items.start[j]) : NULL;
    return config_node_line(item ? item : file_list);
}

/* Reports URLs given twice: the same node tried twice per round would only slow a failover. The
 * line is the list item's when the URLs came from the file (file_list may be NULL). */
static void report_duplicates(const node_list *list, load_ctx *ctx, config *cfg,
                              yaml_node_t *file_list, bool from_env)
{
    char shown[256], where[96], name[96];
    char **urls = urls_of(list, cfg);
    for (size_t j = 1; j < list->max; j++) {
        if (!urls[j])
            continue; /* a bad entry, already reported */
        for (size_t i = 0; i < j; i++) {
            if (!urls[i] || strcmp(urls[i], urls[j]) != 0)
                continue;
            config_redact_url(urls[j], shown, sizeof shown);
            if (from_env) {
                config_report(ctx, 0, "%s: URL %zu repeats URL %zu ('%s')",
                              env_overrides(list, name, sizeof name), j + 1, i + 1, shown);
            } else {
                unsigned long line =
                    describe_entry(list, ctx, file_list, false, j, where, sizeof where);
                config_report(ctx, line, "%s: '%s' is already %s.urls[%zu]", where, shown,
                              list->section, i);
            }
            break;
        }
    }
}

/* The database's nodes share one account and database (node_urls.h): a URL that names another
 * user, password or database is a mistake that would show only after a failover. */
static void report_other_accounts(load_ctx *ctx, config *cfg, yaml_node_t *file_list,
                                  bool from_env)
{
    char **urls = urls_of(&mysql_nodes, cfg);
    config_mysql_url first, other;
    char why[160], where[96];
    if (!urls[0] || config_parse_mysql_url(urls[0], &first, why, sizeof why) != 0)
        return;
    for (size_t j = 1; j < mysql_nodes.max; j++) {
        if (!urls[j] || config_parse_mysql_url(urls[j], &other, why, sizeof why) != 0)
            continue;
        const char *differs = strcmp(first.user, other.user) != 0           ? "user"
                              : strcmp(first.password, other.password) != 0 ? "password"
                              : strcmp(first.database, other.database) != 0 ? "database"
                                                                            : NULL;
        explicit_bzero(&other, sizeof other);
        if (!differs)
            continue;
        unsigned long line = describe_entry(&mysql_nodes, ctx, file_list, from_env, j, where,
                                            sizeof where);
        config_report(ctx, line,
                      "%s: its %s differs from the first URL's; the nodes of one database "
                      "cluster take the same user, password and database (only host, port or "
                      "socket differ), since any connection may land on any node",
                      where, differs);
    }
    explicit_bzero(&first, sizeof first);
}

static void finish_list(const node_list *list, load_ctx *ctx, yaml_node_t *root, config *cfg)
{
    yaml_node_t *section = config_mapping_get(ctx, root, list->section);
    yaml_node_t *url = config_mapping_get(ctx, section, "url");
    yaml_node_t *file_list = config_mapping_get(ctx, section, "urls");
    const char *env = getenv(list->env);

    if (env && !*env)
        env = NULL; /* an empty variable means "not set", as for every override */
    if (url && file_list)
        config_report(ctx, config_node_line(file_list),
                      "%s.urls: give either %s.url (line %lu) or %s.urls, not both", list->section,
                      list->section, config_node_line(url), list->section);
    if (!url && !file_list && !env)
        config_report(ctx, config_node_line(section ? section : root),
                      "missing required key '%s.url' (one %s URL, or %s.urls for several "
                      "nodes; or set %s)",
                      list->section, list->kind, list->section, list->env);
    if (!env && file_list && file_list->type != YAML_SEQUENCE_NODE)
        file_list = NULL; /* its shape was reported */
    if (env)
        apply_environment(list, ctx, cfg, env);
    report_duplicates(list, ctx, cfg, env ? NULL : file_list, env != NULL);
    if (list == &mysql_nodes)
        report_other_accounts(ctx, cfg, env ? NULL : file_list, env != NULL);
    size_t *count = (size_t *)((char *)cfg + list->count_offset);
    char **urls = urls_of(list, cfg);
    *count = 0;
    while (*count < list->max && urls[*count])
        (*count)++;
}

void config_finish_node_urls(load_ctx *ctx, yaml_node_t *root, void *base)
{
    finish_list(&amqp_nodes, ctx, root, base);
    finish_list(&mysql_nodes, ctx, root, base);
}
