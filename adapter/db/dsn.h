/*
 * dsn — parses mysql://user[:password]@host[:port]/database[?socket=/path] URLs into the parts
 * mysql_real_connect takes. User, password, database and socket are percent-decoded.
 * Errors: 0 or -1 with a reason in the caller's err buffer (never the password).
 * Thread affinity: none (pure).
 */
#ifndef IDEMQ_DB_DSN_H
#define IDEMQ_DB_DSN_H

#include <stddef.h>

typedef struct db_dsn {
    char user[128];
    char password[256];
    char host[256];
    unsigned port;          /* 3306 when absent */
    char database[65];
    char socket[512];       /* empty when TCP */
} db_dsn;

/* Fills dsn from url (borrowed). Returns 0, or -1 with a reason in err (never the password). */
int db_dsn_parse(const char *url, db_dsn *dsn, char *err, size_t err_len);

#endif
