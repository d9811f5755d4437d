/*
 * dsn — parses mysql://user[:password]@host[:port]/database[?socket=/path] URLs.
 * Thread affinity: none (pure).
 */
#ifndef IDEMQ_DSN_H
#define IDEMQ_DSN_H

#include <stddef.h>

typedef struct store_dsn {
    char user[128];
    char password[256];
    char host[256];
    unsigned port;          /* 3306 when absent */
    char database[65];
    char socket[512];       /* empty when TCP */
} store_dsn;

/* Fills dsn from url (borrowed). Returns 0, or -1 with a reason in err (never the password). */
int store_dsn_parse(const char *url, store_dsn *dsn, char *err, size_t err_len);

#endif
