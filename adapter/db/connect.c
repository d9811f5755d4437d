/*
 * connect — see db/connect.h.
 */
#include "db/connect.h"

#include <stdio.h>
#include <uv.h>

/* A plain static flag here was a data race: two threads could both see it unset and run
 * mysql_library_init concurrently (it is not thread-safe), or one could see it set before the
 * other's initialisation was visible. uv_once runs it exactly once and makes its effects visible
 * to every caller that returns from uv_once. */
static uv_once_t library_once = UV_ONCE_INIT;

static void library_init_once(void)
{
    mysql_library_init(0, NULL, NULL);
}

void db_library_init(void)
{
    uv_once(&library_once, library_init_once);
}

MYSQL *db_connect(const db_dsn *dsn, char *err, size_t err_len)
{
    db_library_init();
    MYSQL *db = mysql_init(NULL);
    if (!db) {
        snprintf(err, err_len, "mysql_init: out of memory");
        return NULL;
    }
    unsigned int connect_timeout = 5, io_timeout = 30;
    mysql_options(db, MYSQL_OPT_CONNECT_TIMEOUT, &connect_timeout);
    mysql_options(db, MYSQL_OPT_READ_TIMEOUT, &io_timeout);
    mysql_options(db, MYSQL_OPT_WRITE_TIMEOUT, &io_timeout);
    mysql_options(db, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    const char *host = dsn->socket[0] ? "localhost" : dsn->host;
    if (!mysql_real_connect(db, host, dsn->user[0] ? dsn->user : NULL, dsn->password,
                            dsn->database, dsn->port, dsn->socket[0] ? dsn->socket : NULL,
                            CLIENT_FOUND_ROWS)) {
        snprintf(err, err_len, "cannot connect to MySQL at %s:%u/%s: %s (error %u)",
                 dsn->socket[0] ? dsn->socket : dsn->host, dsn->port, dsn->database,
                 mysql_error(db), mysql_errno(db));
        mysql_close(db);
        return NULL;
    }
    if (mysql_autocommit(db, 0) != 0) {
        snprintf(err, err_len, "cannot disable autocommit: %s", mysql_error(db));
        mysql_close(db);
        return NULL;
    }
    /* A row-lock wait must end as a retryable 1205 before the client's 30 s read timeout turns
     * it into "connection lost" (an outage that pauses every consumer). */
    if (mysql_query(db, "SET SESSION innodb_lock_wait_timeout = "
                        "LEAST(@@innodb_lock_wait_timeout, 20)") != 0) {
        snprintf(err, err_len, "cannot set innodb_lock_wait_timeout: %s", mysql_error(db));
        mysql_close(db);
        return NULL;
    }
    return db;
}

MYSQL *db_connect_url(const char *url, char *err, size_t err_len)
{
    db_dsn dsn;
    if (db_dsn_parse(url, &dsn, err, err_len) != 0)
        return NULL;
    return db_connect(&dsn, err, err_len);
}
