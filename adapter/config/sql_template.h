/*
 * sql_template — parses the `:field` placeholders of a configured SQL statement.
 *
 * A statement such as
 *   UPDATE accounts SET balance = balance + :amount WHERE id = :account.id
 * becomes the text MySQL prepares, with each placeholder replaced by `?` and the rest of the
 * text untouched,
 *   UPDATE accounts SET balance = balance + ? WHERE id = ?
 * and the list of message fields bound to those `?`, in order: ["amount", "account.id"]. Values
 * are always bound as prepared-statement parameters, never pasted into the text.
 *
 * The placeholder rule (the contract the config documents):
 *   - A placeholder is `:` followed by a name of [A-Za-z0-9_.] that starts with a letter or `_`.
 *     Dots separate the segments of a path into nested maps; an empty segment (`:a..b`, `:a.`)
 *     is an error. The same name may appear several times; each occurrence is one `?`.
 *   - Nothing inside a quoted string ('...' or "..."), a backtick-quoted identifier (`...`) or a
 *     comment (-- to the end of the line, # to the end of the line, slash-star to star-slash) is
 *     a placeholder. Strings follow MySQL's default rules: a doubled quote or a backslash escapes
 *     the next character (under sql_mode NO_BACKSLASH_ESCAPES a literal ending in a backslash
 *     would be misread: bind such values as placeholders instead). Backticks are doubled to
 *     escape, without backslash escapes.
 *   - `::` is copied as it is and starts no placeholder; a `:` not followed by a letter or `_`
 *     (as in the assignment operator `:=`) is copied as it is.
 *   - A bare `?` outside quotes and comments is an error: positional parameters would not line up
 *     with the named ones.
 *   - An unterminated string, identifier or comment is an error.
 *
 * It lives in config/ because it is the loader's parser of sql handler statements: the config
 * stores the rewritten text and the parameter list, and handlers/ only read them (handlers/ may
 * include config/, never the reverse). The plugin host reuses sql_keeps_transaction.
 *
 * Errors: sql_template_parse returns 0, or -1 with the reason in the caller's err buffer (the
 * convention of config/, see config.h).
 *
 * Pure: no I/O, no mysql.h. Thread affinity: none.
 */
#ifndef IDEMQ_SQL_TEMPLATE_H
#define IDEMQ_SQL_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#define SQL_TEMPLATE_MAX_PARAMS 1024 /* placeholders per statement */
#define SQL_TEMPLATE_NAME_MAX 255    /* bytes of one placeholder name */

typedef struct sql_template {
    char *sql;     /* owned: the text with each placeholder replaced by '?' */
    char **params; /* owned: the field path of each '?', in order */
    size_t param_count;
} sql_template;

/*
 * Parses text (borrowed, NUL-terminated) into out (caller-owned storage, filled only on success;
 * release with sql_template_close). On failure returns -1 and writes a reason naming the line and
 * column within the statement into err (optional). Returns 0 on success.
 */
int sql_template_parse(const char *text, sql_template *out, char *err, size_t err_len);

/* Frees what sql_template_parse filled in; safe on a zeroed template. */
void sql_template_close(sql_template *t);

/*
 * Whether sql (borrowed) is a statement that can run inside idemq's transaction without ending
 * it: its first keyword (after blanks, comments and opening parentheses) is one of SELECT,
 * INSERT, UPDATE, DELETE, REPLACE, WITH, VALUES, TABLE, DO, CALL, SAVEPOINT, RELEASE, or
 * ROLLBACK [WORK] TO. COMMIT, BEGIN, DDL (implicit commit), SET, LOCK and the rest are refused:
 * they would commit the dedup row early or leave the connection in an unknown state. When it
 * returns false, the first keyword (at most keyword_len - 1 bytes) is copied into keyword.
 */
bool sql_keeps_transaction(const char *sql, char *keyword, size_t keyword_len);

#endif
