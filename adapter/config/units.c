/*
 * units — see units.h.
 */
#include "config/units.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config/text.h"

int config_parse_count(const char **text, uint64_t *out)
{
    const char *p = *text;
    uint64_t n = 0;

    if (!config_is_digit(*p))
        return -1;
    for (; config_is_digit(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (n > (UINT64_MAX - d) / 10)
            return -1;
        n = n * 10 + d;
    }
    *text = p;
    *out = n;
    return 0;
}

int config_parse_duration(const char *text, uint64_t *out_ms)
{
    static const struct {
        const char *unit;
        uint64_t ms;
    } units[] = {
        {"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000},
    };
    const char *p = text;
    uint64_t n;

    if (!text || !out_ms || config_parse_count(&p, &n) < 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].unit) != 0)
            continue;
        if (n > UINT64_MAX / units[i].ms)
            return -1;
        *out_ms = n * units[i].ms;
        return 0;
    }
    return -1;
}

int config_parse_size(const char *text, size_t *out_bytes)
{
    static const struct {
        const char *unit;
        uint64_t bytes;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"KB", 1000},
        {"MB", 1000 * 1000},
        {"GB", 1000 * 1000 * 1000},
        {"KiB", 1024},
        {"MiB", 1024 * 1024},
        {"GiB", 1024 * 1024 * 1024},
    };
    const char *p = text;
    uint64_t n;

    if (!text || !out_bytes || config_parse_count(&p, &n) < 0)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].unit) != 0)
            continue;
        if (n > UINT64_MAX / units[i].bytes || n * units[i].bytes > SIZE_MAX)
            return -1;
        *out_bytes = (size_t)(n * units[i].bytes);
        return 0;
    }
    return -1;
}

const char *config_format_duration(char *buf, size_t len, uint64_t ms)
{
    static const struct {
        const char *unit;
        uint64_t ms;
    } units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (ms && ms % units[i].ms == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(ms / units[i].ms), units[i].unit);
            return buf;
        }
    }
    snprintf(buf, len, "%llums", (unsigned long long)ms);
    return buf;
}

const char *config_format_size(char *buf, size_t len, uint64_t bytes)
{
    static const struct {
        const char *unit;
        uint64_t bytes;
    } units[] = {{"GiB", 1u << 30}, {"MiB", 1u << 20}, {"KiB", 1u << 10}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (bytes && bytes % units[i].bytes == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(bytes / units[i].bytes),
                     units[i].unit);
            return buf;
        }
    }
    snprintf(buf, len, "%llu", (unsigned long long)bytes);
    return buf;
}
