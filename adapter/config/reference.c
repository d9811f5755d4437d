/*
 * reference — see reference.h.
 */
#include "config/reference.h"

#include <string.h>

#include "config/options.h"
#include "config/table.h"
#include "config/units.h"

/* A duration as the reference writes it: like a message, but 0 is "0" (the file may say so). */
static void format_ms(uint64_t ms, char *buf, size_t len)
{
    if (ms == 0)
        snprintf(buf, len, "0");
    else
        config_format_duration(buf, len, ms);
}

static void describe_range(const opt *o, char *buf, size_t len)
{
    char lo[32], hi[32];
    buf[0] = '\0';
    switch (o->type) {
    case OPT_UINT:
        snprintf(buf, len, "%llu..%llu", (unsigned long long)o->min, (unsigned long long)o->max);
        break;
    case OPT_DURATION:
        format_ms(o->min, lo, sizeof lo);
        format_ms(o->max, hi, sizeof hi);
        snprintf(buf, len, "%s..%s", lo, hi);
        break;
    case OPT_SIZE:
        config_format_size(lo, sizeof lo, o->min);
        config_format_size(hi, sizeof hi, o->max);
        snprintf(buf, len, "%s..%s", lo, hi);
        break;
    case OPT_ENUM: {
        size_t n = 0;
        for (size_t i = 0; o->names[i] && n < len; i++)
            n += (size_t)snprintf(buf + n, len - n, "%s`%s`", i ? ", " : "", o->names[i]);
        break;
    }
    default:
        break;
    }
}

static const char *reference_type(const opt *o)
{
    switch (o->type) {
    case OPT_UINT:
        return "integer";
    case OPT_DURATION:
        return "duration";
    case OPT_SIZE:
        return "size";
    case OPT_ENUM:
        return "enum";
    case OPT_STRING:
        return "string";
    case OPT_SECTION:
        return "map";
    default:
        return "see help";
    }
}

static void write_rows(FILE *out, const opt *table, const char *prefix);

static void write_row(FILE *out, const opt *o, const char *path)
{
    char range[256];
    describe_range(o, range, sizeof range);
    const char *def = o->flags & OPT_REQUIRED ? "required" : o->def ? o->def : "";
    fprintf(out, "| `%s` | %s | %s%s%s | %s | %s%s%s |\n", path, reference_type(o),
            *def && !(o->flags & OPT_REQUIRED) ? "`" : "", def,
            *def && !(o->flags & OPT_REQUIRED) ? "`" : "", range, o->help ? o->help : "",
            o->env ? "; env " : "", o->env ? o->env : "");
}

static void write_rows(FILE *out, const opt *table, const char *prefix)
{
    char path[200];
    for (const opt *o = table; o->name; o++) {
        snprintf(path, sizeof path, "%s%s", prefix, o->name);
        if (o->type == OPT_SECTION) {
            char nested[300];
            snprintf(nested, sizeof nested, "%s.", path);
            write_rows(out, o->section, nested);
            continue;
        }
        write_row(out, o, path);
        char nested[300];
        if (o->items) {
            snprintf(nested, sizeof nested, "%s%s", path, o->items_path);
            write_rows(out, o->items, nested);
        } else if (o->variants) {
            for (size_t k = 0; o->names[k]; k++) {
                snprintf(nested, sizeof nested, "%s.", path);
                fprintf(out, "| *`type: %s`* | | | | |\n", o->names[k]);
                for (const opt *h = o->variants[k].table; h->name; h++)
                    if (strcmp(h->name, "type") != 0) {
                        const opt one[2] = {*h, {0}};
                        write_rows(out, one, nested);
                    }
            }
        }
    }
}

void config_write_reference(FILE *out)
{
    fprintf(out, "| key | type | default | range | meaning |\n|---|---|---|---|---|\n");
    write_rows(out, config_top_table, "");
}
