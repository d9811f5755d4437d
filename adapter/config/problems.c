/*
 * problems — see problems.h.
 */
#include "config/problems.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void config_report(load_ctx *ctx, unsigned long line, const char *fmt, ...)
{
    char text[768];
    va_list ap;

    ctx->total++;
    if (ctx->stored >= CONFIG_MAX_PROBLEMS_SHOWN)
        return;
    if (!ctx->problems) {
        ctx->problems = calloc(CONFIG_MAX_PROBLEMS_SHOWN, sizeof *ctx->problems);
        if (!ctx->problems)
            return; /* still counted; config_flush_problems says how many were lost */
    }
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ctx->problems[ctx->stored].line = line;
    ctx->problems[ctx->stored].seq = ctx->stored;
    ctx->problems[ctx->stored].text = strdup(text);
    if (ctx->problems[ctx->stored].text)
        ctx->stored++;
}

static int problem_cmp(const void *a, const void *b)
{
    const load_problem *x = a, *y = b;
    if (x->line != y->line)
        return x->line < y->line ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void config_flush_problems(load_ctx *ctx, FILE *out)
{
    if (ctx->stored > 1)
        qsort(ctx->problems, ctx->stored, sizeof *ctx->problems, problem_cmp);
    for (size_t i = 0; i < ctx->stored; i++) {
        if (out && ctx->problems[i].line)
            fprintf(out, "%s:%lu: %s\n", ctx->path, ctx->problems[i].line, ctx->problems[i].text);
        else if (out)
            fprintf(out, "%s: %s\n", ctx->path, ctx->problems[i].text);
        free(ctx->problems[i].text);
    }
    if (out && ctx->total > ctx->stored)
        fprintf(out, "%s: %zu more problems not shown\n", ctx->path, ctx->total - ctx->stored);
    if (out)
        fflush(out);
    free(ctx->problems);
    ctx->problems = NULL;
    ctx->stored = 0;
}
