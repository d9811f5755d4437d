/*
 * Unit tests for adapter/config/sql_template: the `:field` placeholder rule of the sql handler
 * (rewritten text, parameter order, what is not a placeholder, every error with its position)
 * and the statement allowlist that keeps idemq's transaction open.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "config/sql_template.h"

typedef struct parse_case {
    const char *in;
    const char *out;    /* NULL: must fail */
    const char *params; /* the field paths joined with ',' ("" for none) */
    const char *error;  /* substring of the error when out is NULL */
} parse_case;

static void join_params(const sql_template *t, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < t->param_count && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", t->params[i]);
}

static void run(const parse_case *cases, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const parse_case *c = &cases[i];
        sql_template t;
        char err[512], params[1024];
        memset(&t, 0xA5, sizeof t); /* must stay untouched on failure */
        int rc = sql_template_parse(c->in, &t, err, sizeof err);
        if (!c->out) {
            cr_expect_eq(rc, -1, "[%zu] '%s' should fail", i, c->in);
            cr_expect(strstr(err, c->error) != NULL, "[%zu] '%s': expected error '%s', got '%s'", i,
                      c->in, c->error, err);
            continue;
        }
        cr_assert_eq(rc, 0, "[%zu] '%s' failed: %s", i, c->in, err);
        cr_expect_str_eq(t.sql, c->out, "[%zu] '%s'", i, c->in);
        join_params(&t, params, sizeof params);
        cr_expect_str_eq(params, c->params, "[%zu] '%s'", i, c->in);
        sql_template_close(&t);
    }
}

Test(sql_template, placeholders_become_question_marks_in_order)
{
    static const parse_case cases[] = {
        {"SELECT 1", "SELECT 1", "", NULL},
        {":a", "?", "a", NULL},
        {"UPDATE accounts SET balance = balance + :amount WHERE id = :account.id",
         "UPDATE accounts SET balance = balance + ? WHERE id = ?", "amount,account.id", NULL},
        {"INSERT INTO t VALUES (:a,:b,:a)", "INSERT INTO t VALUES (?,?,?)", "a,b,a", NULL},
        {"x=:_private_1", "x=?", "_private_1", NULL},
        {"x=:a.b.c.d", "x=?", "a.b.c.d", NULL},
        {"x = :A9_z.Q_1", "x = ?", "A9_z.Q_1", NULL},
        {"(:a)+(:b)", "(?)+(?)", "a,b", NULL},
        {"x=:a\n  AND y=:b\t", "x=?\n  AND y=?\t", "a,b", NULL},
        /* UTF-8 outside placeholders is copied as it is. */
        {"SELECT 'é', `ü` FROM t WHERE n = :name", "SELECT 'é', `ü` FROM t WHERE n = ?", "name",
         NULL},
    };
    run(cases, sizeof cases / sizeof cases[0]);
}

Test(sql_template, quotes_comments_and_colons_are_not_placeholders)
{
    static const parse_case cases[] = {
        {"SELECT ':a'", "SELECT ':a'", "", NULL},
        {"SELECT \":a\"", "SELECT \":a\"", "", NULL},
        {"SELECT `:a` FROM t", "SELECT `:a` FROM t", "", NULL},
        {"SELECT 'it''s :a', :b", "SELECT 'it''s :a', ?", "b", NULL},
        {"SELECT 'it\\'s :a', :b", "SELECT 'it\\'s :a', ?", "b", NULL},
        {"SELECT \"say \\\":a\\\"\", :b", "SELECT \"say \\\":a\\\"\", ?", "b", NULL},
        {"SELECT 'a\\\\', :b", "SELECT 'a\\\\', ?", "b", NULL},
        {"SELECT `x``:a`, :b", "SELECT `x``:a`, ?", "b", NULL},
        {"SELECT '?' , \"?\", `?`", "SELECT '?' , \"?\", `?`", "", NULL},
        {"SELECT 1 -- :a ?\n, :b", "SELECT 1 -- :a ?\n, ?", "b", NULL},
        {"SELECT 1 # :a ?\n, :b", "SELECT 1 # :a ?\n, ?", "b", NULL},
        {"SELECT 1 /* :a ? */ , :b", "SELECT 1 /* :a ? */ , ?", "b", NULL},
        {"SELECT 1 -- :a", "SELECT 1 -- :a", "", NULL},
        {"SELECT 1 --", "SELECT 1 --", "", NULL},
        /* "--" without a blank after it is two minus signs, not a comment. */
        {"SELECT 5--:a", "SELECT 5--?", "a", NULL},
        {"SET @x := :a", "SET @x := ?", "a", NULL},
        {"SELECT a::b, :c", "SELECT a::b, ?", "c", NULL},
        {"SELECT ::name", "SELECT ::name", "", NULL},
        {"SELECT :1, : a, :", "SELECT :1, : a, :", "", NULL},
        {"SELECT '12:30:00' + INTERVAL :n MINUTE", "SELECT '12:30:00' + INTERVAL ? MINUTE", "n",
         NULL},
        /* Injection-looking text in the statement itself stays text; only placeholders bind. */
        {"SELECT '; DROP TABLE orders; --', :x", "SELECT '; DROP TABLE orders; --', ?", "x", NULL},
    };
    run(cases, sizeof cases / sizeof cases[0]);
}

Test(sql_template, errors_name_line_and_column)
{
    static const parse_case cases[] = {
        {"SELECT ?", NULL, NULL,
         "bare '?' parameter: write a :field placeholder instead at line 1, "
         "column 8"},
        {"SELECT 1,\n  ?", NULL, NULL,
         "bare '?' parameter: write a :field placeholder instead at "
         "line 2, column 3"},
        {"SELECT 'abc", NULL, NULL, "unterminated string literal (') at line 1, column 8"},
        {"SELECT \"abc", NULL, NULL, "unterminated string literal (\") at line 1, column 8"},
        {"SELECT 'abc\\'", NULL, NULL, "unterminated string literal"},
        {"SELECT `abc", NULL, NULL, "unterminated backtick identifier (`) at line 1, column 8"},
        {"SELECT 1 /* x", NULL, NULL, "unterminated /* comment at line 1, column 10"},
        {"SELECT :a..b", NULL, NULL,
         "placeholder ':a..b' has an empty path segment at line 1, "
         "column 8"},
        {"SELECT :a.", NULL, NULL, "placeholder ':a.' has an empty path segment"},
        {"SELECT :a. FROM t", NULL, NULL, "placeholder ':a.' has an empty path segment"},
        {"SELECT :näme", NULL, NULL, "placeholder ':n' runs into a non-ASCII character"},
    };
    run(cases, sizeof cases / sizeof cases[0]);
}

Test(sql_template, limits)
{
    /* A name of 255 bytes is fine, 256 is not. */
    char sql[600];
    int n = snprintf(sql, sizeof sql, "SELECT :");
    memset(sql + n, 'a', 255);
    sql[n + 255] = '\0';
    sql_template t;
    char err[256];
    cr_assert_eq(sql_template_parse(sql, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(strlen(t.params[0]), 255);
    sql_template_close(&t);
    strcat(sql, "a");
    cr_assert_eq(sql_template_parse(sql, &t, err, sizeof err), -1);
    cr_assert(strstr(err, "placeholder name is 256 bytes long; at most 255"), "%s", err);

    /* SQL_TEMPLATE_MAX_PARAMS placeholders are fine, one more is not. */
    size_t cap = 4 * (SQL_TEMPLATE_MAX_PARAMS + 1) + 16;
    char *many = malloc(cap);
    cr_assert_not_null(many);
    size_t o = (size_t)snprintf(many, cap, "DO ");
    for (int i = 0; i < SQL_TEMPLATE_MAX_PARAMS; i++)
        o += (size_t)snprintf(many + o, cap - o, ":a,");
    many[o - 1] = '\0';
    cr_assert_eq(sql_template_parse(many, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.param_count, SQL_TEMPLATE_MAX_PARAMS);
    sql_template_close(&t);
    snprintf(many + o - 1, cap - o + 1, ",:a");
    cr_assert_eq(sql_template_parse(many, &t, err, sizeof err), -1);
    cr_assert(strstr(err, "more than 1024 placeholders"), "%s", err);
    free(many);

    /* NULL input and a NULL error buffer are handled. */
    cr_assert_eq(sql_template_parse(NULL, &t, err, sizeof err), -1);
    cr_assert_eq(sql_template_parse("SELECT ?", &t, NULL, 0), -1);
    sql_template_close(NULL);
}

Test(sql_template, statements_that_keep_the_transaction_open)
{
    static const struct {
        const char *sql;
        bool keeps;
        const char *keyword;
    } cases[] = {
        {"SELECT 1", true, ""},
        {"  select 1", true, ""},
        {"INSERT INTO t VALUES (1)", true, ""},
        {"update t set a = 1", true, ""},
        {"DELETE FROM t", true, ""},
        {"REPLACE INTO t VALUES (1)", true, ""},
        {"WITH x AS (SELECT 1) SELECT * FROM x", true, ""},
        {"(SELECT 1) UNION (SELECT 2)", true, ""},
        {"/* hint */ -- note\n# more\n SELECT 1", true, ""},
        {"DO SLEEP(0)", true, ""},
        {"CALL proc(1)", true, ""},
        {"SAVEPOINT s1", true, ""},
        {"RELEASE SAVEPOINT s1", true, ""},
        {"ROLLBACK TO SAVEPOINT s1", true, ""},
        {"rollback work to s1", true, ""},
        /* idemq's own savepoint proves its transaction is intact: no handler may touch it. */
        {"RELEASE SAVEPOINT idemq_txn_guard", false, "idemq_txn_guard"},
        {"rollback to IDEMQ_TXN_GUARD", false, "idemq_txn_guard"},
        {"SAVEPOINT idemq_txn_guard", false, "idemq_txn_guard"},
        {"COMMIT", false, "COMMIT"},
        {"commit work", false, "commit"},
        {"ROLLBACK", false, "ROLLBACK"},
        {"ROLLBACK WORK", false, "ROLLBACK"},
        {"BEGIN", false, "BEGIN"},
        {"START TRANSACTION", false, "START"},
        {"SET autocommit = 1", false, "SET"},
        {"LOCK TABLES t WRITE", false, "LOCK"},
        {"TRUNCATE t", false, "TRUNCATE"},
        {"DROP TABLE orders", false, "DROP"},
        {"CREATE TABLE x (a INT)", false, "CREATE"},
        {"ALTER TABLE x ADD b INT", false, "ALTER"},
        {"XA START 'x'", false, "XA"},
        {"", false, "(none)"},
        {"   ", false, "(none)"},
        {"'SELECT'", false, "(none)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char keyword[32] = "junk";
        bool keeps = sql_keeps_transaction(cases[i].sql, keyword, sizeof keyword);
        cr_expect_eq(keeps, cases[i].keeps, "'%s'", cases[i].sql);
        cr_expect_str_eq(keyword, cases[i].keyword, "'%s'", cases[i].sql);
    }
    cr_assert_not(sql_keeps_transaction(NULL, NULL, 0));
}
