/*
 * outbox — `idemq outbox list|retry|purge`: the operator's view of idemq_outbox
 * (schemas/mysql/003_outbox.sql), the rows handlers write in their transaction and the relay
 * publishes after the COMMIT. This file checks the arguments and prints; the statements, and
 * how retry and purge walk the table in chunks, are outbox/table.c's.
 *
 * list reads the rows oldest first (by id: the order they were written, and the relay's) and
 * ends with the count of every state from one GROUP BY. Both reads run in one transaction
 * (db_connect turns autocommit off), so under InnoDB's default REPEATABLE READ the summary
 * counts the same snapshot the listing shows.
 *
 * retry and purge change rows the relay may be working on at the same time, so each works in
 * chunks of OUTBOX_TABLE_CHUNK_ROWS rows, one transaction each, and walks only the rows that
 * existed when it started (ids up to the largest one it saw first): a row the relay marks
 * unroutable again while retry runs, or that becomes unroutable during a purge, is left for the
 * next run instead of being chased.
 *
 * Only unroutable rows are retried (set back to pending, last_error cleared, attempts kept): a
 * pending row is still to be sent and a published one was confirmed by the broker, so neither
 * is touched. Pending rows are never purged either: they are messages not yet sent.
 *
 * Errors: the subcommand's exit code (cli.h); a missing table says to run `idemq migrate`.
 * Blocking, single-threaded: a one-shot tool on the main thread.
 */
#include "cli/cli.h"

#include <errno.h>
#include <jansson.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db/connect.h"
#include "outbox/table.h"

/* ------------------------------------------------------------------------------------ options */

int cli_outbox_parse_states(const char *text, unsigned *states)
{
    static const struct {
        const char *word;
        unsigned bits;
    } words[] = {{"pending", OUTBOX_STATE_PENDING},
                 {"published", OUTBOX_STATE_PUBLISHED},
                 {"unroutable", OUTBOX_STATE_UNROUTABLE},
                 {"all", OUTBOX_STATE_ALL}};
    unsigned bits = 0;
    const char *p = text;
    for (;;) {
        size_t len = strcspn(p, ",");
        unsigned found = 0;
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
            if (strlen(words[i].word) == len && strncmp(words[i].word, p, len) == 0)
                found = words[i].bits;
        if (!found)
            return -1;
        bits |= found;
        if (!p[len])
            break;
        p += len + 1;
    }
    *states |= bits;
    return 0;
}

const char *cli_outbox_usage_problem(const outbox_options *o)
{
    bool ids = o->id_count > 0;
    switch (o->action) {
    case OUTBOX_LIST:
        if (ids || o->unroutable || o->published || o->older_than_set)
            return "outbox list selects rows with --state (and --limit); --id, --unroutable, "
                   "--published and --older-than are for retry and purge";
        if (o->yes)
            return "outbox list changes nothing: --yes is for purge";
        return NULL;
    case OUTBOX_RETRY:
        if (o->states || o->limit || o->published || o->older_than_set || o->yes)
            return "outbox retry takes --id N (repeatable) or --unroutable, and --json";
        if (ids == o->unroutable)
            return "outbox retry needs either --id N (repeatable) or --unroutable";
        return NULL;
    case OUTBOX_PURGE:
        if (o->states || o->limit)
            return "outbox purge selects rows with --published, --unroutable or --id, not "
                   "--state or --limit";
        if ((int)ids + (int)o->unroutable + (int)o->published != 1)
            return "outbox purge needs exactly one of --published, --unroutable or --id N";
        if (o->older_than_set && !o->published)
            return "--older-than goes with --published (it compares published_at)";
        return NULL;
    }
    return "outbox needs list, retry or purge";
}

/* ----------------------------------------------------------------------------- the database */

static const char table_missing[] = "idemq_outbox does not exist; run `idemq migrate`";

/* Reports the failure of the last statement on db and returns exit code 1. */
static int fail(MYSQL *db, const char *cmd, const char *doing)
{
    unsigned number = mysql_errno(db);
    if (number == ER_NO_SUCH_TABLE)
        fprintf(stderr, "%s: %s\n", cmd, table_missing);
    else if (number == ER_BAD_FIELD_ERROR) /* a table from before a column this idemq reads */
        fprintf(stderr, "%s: %s failed: %s (error %u); run `idemq migrate`\n", cmd, doing,
                mysql_error(db), number);
    else
        fprintf(stderr, "%s: %s failed: %s (error %u)\n", cmd, doing, mysql_error(db), number);
    return 1;
}

/* The word `outbox list` shows for a state (an unknown number as itself, in buf). */
static const char *state_word(int state, char *buf, size_t len)
{
    switch (state) {
    case OUTBOX_ROW_PENDING:
        return "pending";
    case OUTBOX_ROW_PUBLISHED:
        return "published";
    case OUTBOX_ROW_UNROUTABLE:
        return "unroutable";
    default:
        snprintf(buf, len, "state %d", state);
        return buf;
    }
}

/* ----------------------------------------------------------------------------------- display */

/* Length of the valid UTF-8 sequence at s (n > 0 bytes left) of a printable character, or 0
 * when it is not one (an invalid byte, a control character). */
static size_t printable_sequence(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return c >= 0x20 && c < 0x7f ? 1 : 0;
    size_t len;
    uint32_t min;
    if ((c & 0xe0) == 0xc0) {
        len = 2;
        min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3;
        min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
        len = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    uint32_t cp = c & (0x7fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp < 0xa0)
        return 0;
    return len;
}

/* Writes the field bytes[0..len) to out for the table: printable UTF-8 as it is, other bytes as
 * \xNN, at most width columns (counting a character as one), cut with "..." when longer; "-"
 * when empty or NULL. Pads with spaces to width unless last. */
static void print_field(FILE *out, const char *bytes, size_t len, size_t width, bool last)
{
    if (!bytes || len == 0) {
        bytes = "-";
        len = 1;
    }
    const unsigned char *s = (const unsigned char *)bytes;
    /* First pass: does it fit? */
    size_t columns = 0;
    for (size_t i = 0; i < len;) {
        size_t n = printable_sequence(s + i, len - i);
        columns += n ? 1 : 4;
        i += n ? n : 1;
    }
    size_t room = columns <= width ? width : width - 3;
    size_t used = 0;
    for (size_t i = 0; i < len;) {
        size_t n = printable_sequence(s + i, len - i);
        size_t cols = n ? 1 : 4;
        if (used + cols > room)
            break;
        if (n)
            fwrite(s + i, 1, n, out);
        else
            fprintf(out, "\\x%02x", s[i]);
        used += cols;
        i += n ? n : 1;
    }
    if (columns > width) {
        fputs("...", out);
        used += 3;
    }
    if (!last)
        for (; used < width + 2; used++)
            fputc(' ', out);
}

/* "45s", "12m5s", "3h20m", "2d4h": the two largest units. */
static void format_age(long long seconds, char *buf, size_t len)
{
    if (seconds < 0)
        seconds = 0;
    if (seconds < 60)
        snprintf(buf, len, "%llds", seconds);
    else if (seconds < 3600)
        snprintf(buf, len, "%lldm%llds", seconds / 60, seconds % 60);
    else if (seconds < 86400)
        snprintf(buf, len, "%lldh%lldm", seconds / 3600, seconds % 3600 / 60);
    else
        snprintf(buf, len, "%lldd%lldh", seconds / 86400, seconds % 86400 / 3600);
}

/* Milliseconds since the epoch as "2024-05-01T10:00:00.123Z". */
static void format_time_ms(long long ms, char *buf, size_t len)
{
    time_t seconds = (time_t)(ms / 1000);
    struct tm utc;
    gmtime_r(&seconds, &utc);
    char whole[32];
    strftime(whole, sizeof whole, "%Y-%m-%dT%H:%M:%S", &utc);
    snprintf(buf, len, "%s.%03lldZ", whole, ms % 1000);
}

/* Standard base64 (RFC 4648, padded) of bytes[0..len); returned owned, NULL when out of memory. */
static char *base64_encode(const unsigned char *bytes, size_t len)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)bytes[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)bytes[i + 1] << 8;
        if (i + 2 < len)
            v |= bytes[i + 2];
        out[o++] = alphabet[v >> 18 & 63];
        out[o++] = alphabet[v >> 12 & 63];
        out[o++] = i + 1 < len ? alphabet[v >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

/* Sets obj[key] to the bytes as a JSON string when they are valid UTF-8 (jansson checks), else
 * to their base64 with obj["<key>_encoding"] = "base64"; always_say_encoding also writes "text"
 * in the first case (the body). NULL bytes: JSON null. Returns 0 or -1 (out of memory). */
static int set_bytes(json_t *obj, const char *key, const char *bytes, size_t len,
                     bool always_say_encoding)
{
    char encoding_key[64];
    snprintf(encoding_key, sizeof encoding_key, "%s_encoding", key);
    if (!bytes)
        return json_object_set_new(obj, key, json_null());
    json_t *text = json_stringn(bytes, len);
    if (text) {
        if (json_object_set_new(obj, key, text) != 0)
            return -1;
        return always_say_encoding ? json_object_set_new(obj, encoding_key, json_string("text"))
                                   : 0;
    }
    char *encoded = base64_encode((const unsigned char *)bytes, len);
    if (!encoded)
        return -1;
    int rc = json_object_set_new(obj, key, json_string(encoded));
    free(encoded);
    if (rc == 0)
        rc = json_object_set_new(obj, encoding_key, json_string("base64"));
    return rc;
}

/* Prints obj (taken) on one line. Returns 0 or -1 (out of memory). */
static int print_json_line(json_t *obj)
{
    if (!obj)
        return -1;
    char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    if (!text)
        return -1;
    puts(text);
    free(text);
    return 0;
}

/* -------------------------------------------------------------------------------------- list */

/* The fields of the text listing. */
typedef enum text_field {
    FIELD_ID,
    FIELD_STATE,
    FIELD_AGE,
    FIELD_ATTEMPTS,
    FIELD_HANDLER,
    FIELD_EMIT,
    FIELD_EXCHANGE,
    FIELD_ROUTING_KEY,
    FIELD_BIZ_KEY,
    FIELD_SOURCE,
    FIELD_LAST_ERROR,
} text_field;

/* Text-mode widths, in columns, of the truncated fields. */
typedef struct text_column {
    const char *title;
    text_field field;
    size_t width;
} text_column;

static const text_column text_columns[] = {
    {"id", FIELD_ID, 8},
    {"state", FIELD_STATE, 10},
    {"age", FIELD_AGE, 7},
    {"attempts", FIELD_ATTEMPTS, 8},
    {"handler", FIELD_HANDLER, 16},
    {"emit", FIELD_EMIT, 14},
    {"exchange", FIELD_EXCHANGE, 18},
    {"routing key", FIELD_ROUTING_KEY, 20},
    {"biz_key", FIELD_BIZ_KEY, 24},
    {"source biz_key", FIELD_SOURCE, 30},
    {"last_error", FIELD_LAST_ERROR, 60},
};
#define TEXT_COLUMNS (sizeof text_columns / sizeof text_columns[0])

static void print_text_row(const outbox_listed_row *row)
{
    char text[32];
    for (size_t i = 0; i < TEXT_COLUMNS; i++) {
        const text_column *c = &text_columns[i];
        outbox_bytes value = {text, 0};
        switch (c->field) {
        case FIELD_ID:
            snprintf(text, sizeof text, "%lld", row->id);
            break;
        case FIELD_STATE:
            value.data = state_word(row->state, text, sizeof text);
            break;
        case FIELD_AGE:
            format_age(row->age_s, text, sizeof text);
            break;
        case FIELD_ATTEMPTS:
            snprintf(text, sizeof text, "%lld", row->attempts);
            break;
        case FIELD_HANDLER:
            value = row->handler_name;
            break;
        case FIELD_EMIT:
            value = row->emit_name;
            break;
        case FIELD_EXCHANGE:
            value = row->exchange;
            break;
        case FIELD_ROUTING_KEY:
            value = row->routing_key;
            break;
        case FIELD_BIZ_KEY:
            value = row->biz_key;
            break;
        case FIELD_SOURCE:
            value = row->source_biz_key;
            break;
        case FIELD_LAST_ERROR:
            value = row->last_error;
            break;
        }
        if (value.data == text || c->field == FIELD_STATE)
            value.len = strlen(value.data); /* formatted here, not the server's bytes */
        print_field(stdout, value.data, value.len, c->width, i + 1 == TEXT_COLUMNS);
    }
    putchar('\n');
}

static json_t *row_json(const outbox_listed_row *row)
{
    char state[32], created[40], published[40];
    format_time_ms(row->created_ms, created, sizeof created);
    if (row->published)
        format_time_ms(row->published_ms, published, sizeof published);
    json_t *obj =
        json_pack("{s:I, s:s, s:I, s:I, s:s, s:s?}", "id", (json_int_t)row->id, "state",
                  state_word(row->state, state, sizeof state), "attempts",
                  (json_int_t)row->attempts, "age_seconds", (json_int_t)row->age_s, "created_at",
                  created, "published_at", row->published ? published : NULL);
    if (!obj)
        return NULL;
    const struct {
        const char *key;
        const outbox_bytes *bytes;
    } binary[] = {{"handler_name", &row->handler_name},
                  {"emit_name", &row->emit_name},
                  {"exchange", &row->exchange},
                  {"routing_key", &row->routing_key},
                  {"biz_key", &row->biz_key},
                  {"source_biz_key", &row->source_biz_key},
                  {"content_type", &row->content_type},
                  {"last_error", &row->last_error},
                  {"traceparent", &row->traceparent},
                  {"tracestate", &row->tracestate},
                  {"body", &row->body}};
    for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++) {
        const outbox_bytes *b = binary[i].bytes;
        if (set_bytes(obj, binary[i].key, b->data, b->len, b == &row->body) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

/* "pending and unroutable", for the summary line. */
static void states_words(unsigned states, char *buf, size_t len)
{
    if (!states)
        states = OUTBOX_STATE_PENDING | OUTBOX_STATE_UNROUTABLE;
    if (states == OUTBOX_STATE_ALL) {
        snprintf(buf, len, "any state");
        return;
    }
    const char *words[3];
    size_t count = 0;
    if (states & OUTBOX_STATE_PENDING)
        words[count++] = "pending";
    if (states & OUTBOX_STATE_UNROUTABLE)
        words[count++] = "unroutable";
    if (states & OUTBOX_STATE_PUBLISHED)
        words[count++] = "published";
    if (count == 1)
        snprintf(buf, len, "state %s", words[0]);
    else if (count == 2)
        snprintf(buf, len, "state %s or %s", words[0], words[1]);
}

/* The summary: rows per state over the whole table, from one GROUP BY. */
static int print_summary(MYSQL *db, const outbox_options *opts, size_t shown)
{
    outbox_state_counts rows;
    if (outbox_table_count_states(db, &rows) != 0)
        return fail(db, "idemq outbox list", "counting the rows");
    long long pending = rows.pending, published = rows.published, unroutable = rows.unroutable,
              other = rows.other;
    if (opts->json) {
        json_t *counts = json_pack("{s:I, s:I, s:I}", "pending", (json_int_t)pending, "unroutable",
                                   (json_int_t)unroutable, "published", (json_int_t)published);
        if (counts && other)
            json_object_set_new(counts, "other", json_integer((json_int_t)other));
        if (print_json_line(
                json_pack("{s:o?, s:I}", "summary", counts, "shown", (json_int_t)shown)) != 0) {
            fprintf(stderr, "idemq outbox list: out of memory\n");
            return 1;
        }
        return 0;
    }
    char words[64];
    states_words(opts->states, words, sizeof words);
    printf("%zu row(s) shown (%s%s); idemq_outbox: pending %lld, unroutable %lld, published "
           "%lld",
           shown, words,
           opts->limit && shown == opts->limit ? ", oldest first, --limit reached"
                                               : ", oldest first",
           pending, unroutable, published);
    if (other)
        printf(", other states %lld", other);
    putchar('\n');
    return 0;
}

/* What the listing's callback keeps between rows. */
typedef struct list_state {
    const outbox_options *opts;
    size_t printed; /* rows seen so far */
    bool oom;
} list_state;

static void list_row(const outbox_listed_row *row, void *ctx)
{
    list_state *ls = ctx;
    if (ls->opts->json) {
        if (!ls->oom && print_json_line(row_json(row)) != 0)
            ls->oom = true; /* keep fetching: the result must be read to its end */
    } else {
        if (ls->printed == 0) {
            for (size_t i = 0; i < TEXT_COLUMNS; i++)
                print_field(stdout, text_columns[i].title, strlen(text_columns[i].title),
                            text_columns[i].width, i + 1 == TEXT_COLUMNS);
            putchar('\n');
        }
        print_text_row(row);
    }
    ls->printed++;
}

static int list(MYSQL *db, const outbox_options *opts)
{
    const char *cmd = "idemq outbox list";
    /* The body only for --json: it may be megabytes, and the table has no room for it. */
    outbox_list_query q = {
        .states = opts->states ? opts->states : OUTBOX_STATE_PENDING | OUTBOX_STATE_UNROUTABLE,
        .limit = opts->limit,
        .with_body = opts->json,
    };
    list_state ls = {.opts = opts};
    size_t shown = 0;
    if (outbox_table_list(db, &q, list_row, &ls, &shown) != 0)
        return fail(db, cmd, "reading idemq_outbox");
    if (ls.oom) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return 1;
    }
    return print_summary(db, opts, shown);
}

/* ------------------------------------------------------------------------ rows named by --id */

static int compare_ids(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* opts->ids sorted, without repeats; returned owned in *out (NULL when out of memory). */
static size_t unique_ids(const outbox_options *opts, unsigned long long **out)
{
    *out = malloc((opts->id_count ? opts->id_count : 1) * sizeof **out);
    if (!*out)
        return 0;
    memcpy(*out, opts->ids, opts->id_count * sizeof **out);
    qsort(*out, opts->id_count, sizeof **out, compare_ids);
    size_t n = 0;
    for (size_t i = 0; i < opts->id_count; i++)
        if (n == 0 || (*out)[n - 1] != (*out)[i])
            (*out)[n++] = (*out)[i];
    return n;
}

/* Reports a failure of an outbox_table_* call that changes rows (errno ENOMEM: out of memory),
 * and rolls the open chunk back. Returns 1. */
static int fail_ids(MYSQL *db, const char *cmd, const char *doing)
{
    if (errno == ENOMEM) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        mysql_rollback(db);
        return 1;
    }
    fail(db, cmd, doing);
    mysql_rollback(db);
    return 1;
}

/* Adds {"id": id, "state": word} to array (NULL: nothing). */
static void note_left_alone(json_t *array, unsigned long long id, int state)
{
    char buf[32];
    if (array)
        json_array_append_new(
            array, json_pack("{s:I, s:s}", "id", (json_int_t)id, "state",
                             state < 0 ? "missing" : state_word(state, buf, sizeof buf)));
}

/* ------------------------------------------------------------------------------------- retry */

/* Prints retry's result line. Returns exit code base (1 when out of memory). */
static int print_retry_result(const outbox_options *opts, unsigned long long requeued,
                              json_t *left_alone, int base)
{
    size_t others = left_alone ? json_array_size(left_alone) : 0;
    if (opts->json) {
        if (print_json_line(json_pack("{s:I, s:o}", "requeued", (json_int_t)requeued, "left_alone",
                                      left_alone ? left_alone : json_array())) != 0) {
            fprintf(stderr, "idemq outbox retry: out of memory\n");
            return 1;
        }
        return base;
    }
    json_decref(left_alone);
    printf("requeued %llu unroutable row(s): pending again, the relay publishes them%s\n", requeued,
           others ? "; the other --id rows were left alone (only unroutable rows are retried)"
                  : "");
    return base;
}

/* What retry --id and purge --id report about the rows they leave alone. */
typedef struct ids_report {
    const char *cmd;
    json_t *left_alone;           /* {"id", "state"} of each */
    int exit_code;                /* 1 once a named row was left alone */
    unsigned long long deletable; /* purge: the published and unroutable rows */
} ids_report;

static void retry_id_seen(unsigned long long id, int state, void *ctx)
{
    ids_report *r = ctx;
    const char *cmd = r->cmd;
    char buf[32];
    if (state == OUTBOX_ROW_UNROUTABLE)
        return;
    r->exit_code = 1; /* the caller asked for a row that was not requeued */
    note_left_alone(r->left_alone, id, state);
    if (state < 0)
        fprintf(stderr, "%s: id %llu: no such row\n", cmd, id);
    else if (state == OUTBOX_ROW_PENDING)
        fprintf(stderr,
                "%s: id %llu is pending (not yet published): left alone; only "
                "unroutable rows are retried\n",
                cmd, id);
    else if (state == OUTBOX_ROW_PUBLISHED)
        fprintf(stderr,
                "%s: id %llu was published: left alone, it is not sent again; only "
                "unroutable rows are retried\n",
                cmd, id);
    else
        fprintf(stderr,
                "%s: id %llu has %s: left alone; only unroutable rows are "
                "retried\n",
                cmd, id, state_word(state, buf, sizeof buf));
}

/* retry --id: each chunk's rows locked, the unroutable ones set back to pending, committed. */
static int retry_ids(MYSQL *db, const outbox_options *opts)
{
    ids_report r = {.cmd = "idemq outbox retry", .left_alone = json_array()};
    unsigned long long *ids;
    size_t count = unique_ids(opts, &ids);
    if (!ids || !r.left_alone) {
        free(ids);
        json_decref(r.left_alone);
        fprintf(stderr, "%s: out of memory\n", r.cmd);
        return 1;
    }
    unsigned long long requeued = 0;
    const char *doing = "";
    int rc = outbox_table_retry_ids(db, ids, count, retry_id_seen, &r, &requeued, &doing);
    free(ids);
    if (rc != 0) {
        fail_ids(db, r.cmd, doing);
        json_decref(r.left_alone); /* reported */
        if (requeued)
            fprintf(stderr, "%s: %llu row(s) were requeued before the failure\n", r.cmd, requeued);
        return 1;
    }
    return print_retry_result(opts, requeued, r.left_alone, r.exit_code);
}

/* retry --unroutable: every unroutable row up to the largest id at the start. */
static int retry_unroutable(MYSQL *db, const outbox_options *opts)
{
    const char *cmd = "idemq outbox retry";
    long long max_id;
    if (outbox_table_max_id(db, &max_id) != 0)
        return fail(db, cmd, "reading idemq_outbox");
    mysql_rollback(db);
    unsigned long long requeued = 0;
    if (outbox_table_requeue_unroutable(db, max_id, &requeued) != 0) {
        fail_ids(db, cmd, "requeueing the unroutable rows");
        if (requeued)
            fprintf(stderr, "%s: %llu row(s) were requeued before the failure\n", cmd, requeued);
        return 1;
    }
    return print_retry_result(opts, requeued, NULL, 0);
}

/* ------------------------------------------------------------------------------------- purge */

static const char never_pending[] = "pending rows are never purged: they are messages not yet sent";

/* "published row(s) published more than 7d ago", for the messages. */
static void purge_what(const outbox_options *opts, char *buf, size_t len)
{
    if (opts->published && opts->older_than_set) {
        char ago[32];
        unsigned long long ms = opts->older_than_ms;
        if (ms % 86400000 == 0)
            snprintf(ago, sizeof ago, "%llud", ms / 86400000);
        else if (ms % 3600000 == 0)
            snprintf(ago, sizeof ago, "%lluh", ms / 3600000);
        else if (ms % 60000 == 0)
            snprintf(ago, sizeof ago, "%llum", ms / 60000);
        else if (ms % 1000 == 0)
            snprintf(ago, sizeof ago, "%llus", ms / 1000);
        else
            snprintf(ago, sizeof ago, "%llums", ms);
        snprintf(buf, len, "published row(s) published more than %s ago", ago);
    } else {
        snprintf(buf, len, "%s row(s)", opts->published ? "published" : "unroutable");
    }
}

static int print_purge_result(const outbox_options *opts, const char *what,
                              unsigned long long deleted, json_t *left_alone, int base)
{
    if (opts->json) {
        json_t *doc = json_pack("{s:I}", "deleted", (json_int_t)deleted);
        if (doc && left_alone)
            json_object_set_new(doc, "left_alone", left_alone);
        else
            json_decref(left_alone);
        if (print_json_line(doc) != 0) {
            fprintf(stderr, "idemq outbox purge: out of memory\n");
            return 1;
        }
        return base;
    }
    json_decref(left_alone);
    printf("deleted %llu %s from idemq_outbox\n", deleted, what);
    return base;
}

/* The refusal without --yes. Returns EXIT_USAGE, as dlq purge does. */
static int refuse_purge(const outbox_options *opts, const char *what, unsigned long long count)
{
    if (opts->json)
        print_json_line(json_pack("{s:I, s:I}", "would_delete", (json_int_t)count, "deleted", 0));
    fprintf(stderr, "idemq outbox purge: this would delete %llu %s; pass --yes (%s)\n", count, what,
            never_pending);
    return EXIT_USAGE;
}

/* purge --published / --unroutable. */
static int purge_rows(MYSQL *db, const outbox_options *opts)
{
    const char *cmd = "idemq outbox purge";
    char what[96];
    purge_what(opts, what, sizeof what);
    outbox_purge_query q = {
        .state = opts->published ? OUTBOX_ROW_PUBLISHED : OUTBOX_ROW_UNROUTABLE,
        .older_than_set = opts->older_than_set,
    };
    /* Fixed at the start, so the chunks delete what the count counted (give or take the rows
     * the relay changes meanwhile), and a purge never chases rows that arrive while it runs. */
    if (outbox_table_max_id(db, &q.max_id) != 0)
        return fail(db, cmd, "reading idemq_outbox");
    if (opts->older_than_set && outbox_table_purge_cutoff(db, opts->older_than_ms) != 0)
        return fail(db, cmd, "computing the cutoff");
    if (!opts->yes) {
        long long count;
        if (outbox_table_purge_count(db, &q, &count) != 0)
            return fail(db, cmd, "counting the rows");
        mysql_rollback(db);
        return refuse_purge(opts, what, (unsigned long long)count);
    }
    mysql_rollback(db);
    unsigned long long deleted = 0;
    if (outbox_table_purge(db, &q, &deleted) != 0) {
        fail_ids(db, cmd, "deleting");
        if (deleted)
            fprintf(stderr, "%s: %llu row(s) were deleted before the failure\n", cmd, deleted);
        return 1;
    }
    return print_purge_result(opts, what, deleted, NULL, 0);
}

static void purge_id_seen(unsigned long long id, int state, void *ctx)
{
    ids_report *r = ctx;
    const char *cmd = r->cmd;
    if (state == OUTBOX_ROW_PUBLISHED || state == OUTBOX_ROW_UNROUTABLE) {
        r->deletable++;
        return;
    }
    r->exit_code = 1;
    note_left_alone(r->left_alone, id, state);
    if (state < 0)
        fprintf(stderr, "%s: id %llu: no such row\n", cmd, id);
    else if (state == OUTBOX_ROW_PENDING)
        fprintf(stderr, "%s: id %llu is pending: not purged (%s)\n", cmd, id, never_pending);
    else
        fprintf(stderr, "%s: id %llu has state %d: not purged\n", cmd, id, state);
}

/* purge --id: the named rows that are published or unroutable. */
static int purge_ids(MYSQL *db, const outbox_options *opts)
{
    ids_report r = {.cmd = "idemq outbox purge", .left_alone = json_array()};
    unsigned long long *ids;
    size_t count = unique_ids(opts, &ids);
    if (!ids || !r.left_alone) {
        free(ids);
        json_decref(r.left_alone);
        fprintf(stderr, "%s: out of memory\n", r.cmd);
        return 1;
    }
    unsigned long long deleted = 0;
    const char *doing = "";
    int rc = outbox_table_purge_ids(db, ids, count, opts->yes, purge_id_seen, &r, &deleted, &doing);
    free(ids);
    if (rc != 0) {
        fail_ids(db, r.cmd, doing);
        json_decref(r.left_alone);
        if (deleted)
            fprintf(stderr, "%s: %llu row(s) were deleted before the failure\n", r.cmd, deleted);
        return 1;
    }
    if (!opts->yes) {
        json_decref(r.left_alone);
        return refuse_purge(opts, "of the named row(s), published or unroutable", r.deletable);
    }
    return print_purge_result(opts, "row(s) named by --id", deleted, r.left_alone, r.exit_code);
}

/* ------------------------------------------------------------------------------------ command */

int cli_outbox(const config *cfg, const outbox_options *opts)
{
    static const char *const names[] = {"idemq outbox list", "idemq outbox retry",
                                        "idemq outbox purge"};
    const char *cmd = names[opts->action];
    const char *problem = cli_outbox_usage_problem(opts);
    if (problem) {
        fprintf(stderr, "%s: %s\n", cmd, problem);
        return EXIT_USAGE;
    }
    char err[1024];
    MYSQL *db = db_connect_config(cfg, err, sizeof err);
    if (!db) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return 1;
    }
    int rc;
    /* First, so that a missing table is one clear line before anything else is printed. */
    if (outbox_table_probe(db) != 0) {
        rc = fail(db, cmd, "reading idemq_outbox");
        goto out;
    }
    switch (opts->action) {
    case OUTBOX_LIST:
        rc = list(db, opts);
        break;
    case OUTBOX_RETRY:
        rc = opts->unroutable ? retry_unroutable(db, opts) : retry_ids(db, opts);
        break;
    case OUTBOX_PURGE:
        rc = opts->id_count ? purge_ids(db, opts) : purge_rows(db, opts);
        break;
    default:
        rc = EXIT_USAGE;
        break;
    }
out:
    mysql_rollback(db);
    mysql_close(db);
    return rc;
}