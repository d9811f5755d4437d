/*
 * The DDL idemq migrate runs must be the one producers and DBAs read in schemas/mysql.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/rotation.h"
#include "store/schema.h"

/* Drops SQL comments, the trailing semicolon and folds white space. */
static void normalise(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    bool space = false;
    for (const char *p = in; *p && n + 2 < cap; p++) {
        if (p[0] == '-' && p[1] == '-') {
            while (*p && *p != '\n')
                p++;
            if (!*p)
                break;
        }
        if (isspace((unsigned char)*p)) {
            space = n > 0;
            continue;
        }
        if (*p == ';')
            continue;
        if (space)
            out[n++] = ' ';
        space = false;
        out[n++] = *p;
    }
    out[n] = '\0';
}

Test(schema, migrate_ddl_matches_the_published_file)
{
    FILE *f = fopen(IDEMQ_SOURCE_DIR "/schemas/mysql/001_msg_dedup.sql", "r");
    cr_assert(f, "schemas/mysql/001_msg_dedup.sql is missing");
    static char text[16384], a[16384], b[16384];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    normalise(text, a, sizeof a);
    normalise(store_dedup_ddl, b, sizeof b);
    cr_expect_str_eq(a, b);
    cr_expect(strstr(b, "VARBINARY(128)"), "biz_key must compare bytes exactly");
    cr_expect(strstr(b, "UNIQUE KEY uk_biz_handler (biz_key, handler_name)"));
}

/* The SQL of 003_outbox.sql without its comment lines, its two statements concatenated. */
Test(schema, outbox_ddl_matches_the_published_file)
{
    FILE *f = fopen(IDEMQ_SOURCE_DIR "/schemas/mysql/003_outbox.sql", "r");
    cr_assert(f, "schemas/mysql/003_outbox.sql is missing");
    static char line[1024], text[16384], a[16384], b[16384], both[16384];
    size_t len = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "--", 2))
            continue;
        size_t n = strlen(line);
        cr_assert(len + n < sizeof text);
        memcpy(text + len, line, n);
        len += n;
    }
    fclose(f);
    text[len] = '\0';
    normalise(text, a, sizeof a);
    snprintf(both, sizeof both, "%s;\n%s;\n", store_outbox_ddl, store_outbox_lease_ddl);
    normalise(both, b, sizeof b);
    cr_expect_str_eq(a, b);
    cr_expect(strstr(b, "KEY idx_outbox_state_id (state, id)"), "the relay scans by (state, id)");
}

/* The upgrade `idemq migrate` runs on an outbox created before the trace context columns is the
 * published 004 file, and adds exactly the columns 003's CREATE TABLE has. */
Test(schema, outbox_trace_upgrade_matches_the_published_file)
{
    FILE *f = fopen(IDEMQ_SOURCE_DIR "/schemas/mysql/004_outbox_trace_context.sql", "r");
    cr_assert(f, "schemas/mysql/004_outbox_trace_context.sql is missing");
    static char text[8192], a[8192], b[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    normalise(text, a, sizeof a);
    normalise(store_outbox_trace_upgrade_sql, b, sizeof b);
    cr_expect_str_eq(a, b);
    static char ddl[16384];
    normalise(store_outbox_ddl, ddl, sizeof ddl);
    cr_expect(strstr(ddl, "traceparent VARBINARY(55) NULL"), "a new outbox lacks traceparent");
    cr_expect(strstr(ddl, "tracestate VARBINARY(512) NULL"), "a new outbox lacks tracestate");
    cr_expect(strstr(b, "ADD COLUMN traceparent VARBINARY(55) NULL"));
    cr_expect(strstr(b, "ADD COLUMN tracestate VARBINARY(512) NULL"));
}

/* The rotating layout's three statements, in the published file's order. */
Test(schema, rotation_ddl_matches_the_published_file)
{
    FILE *f = fopen(IDEMQ_SOURCE_DIR "/schemas/mysql/005_dedup_rotation.sql", "r");
    cr_assert(f, "schemas/mysql/005_dedup_rotation.sql is missing");
    static char text[8192], a[8192], b[8192], all[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    normalise(text, a, sizeof a);
    snprintf(all, sizeof all, "%s;\n%s;\n%s;\n", rotation_previous_ddl, rotation_state_ddl,
             rotation_state_row_sql);
    normalise(all, b, sizeof b);
    cr_expect_str_eq(a, b);
    cr_expect(strstr(b, "msg_dedup_previous LIKE msg_dedup"),
              "the previous table must have msg_dedup's unique key");
}
