/*
 * url — connection URLs and listen addresses: their shape, and redacting their passwords.
 *
 * Only what the loader needs is checked: the scheme, a host (or, for MySQL, a ?socket=), a port
 * in range, no spaces or control bytes, and the user-info rule the parsers share (rabbitmq-c's
 * amqp_parse_url and db_dsn_parse): one raw '@' at most, ending user[:password]; in the user and
 * the password ':' '@' '/' '?' '#' '[' ']' and '%' are percent-encoded (an AMQP vhost likewise;
 * an '@' in a MySQL socket path is %40). A raw one is ambiguous (where does the password end?),
 * so it is refused at load rather than guessed at. Redaction replaces the password of the
 * user-info part and of any password= query parameter with "***"; every URL that reaches a log
 * line or a message goes through it, including the loader's own messages about a bad URL, and it
 * takes the user-info to end at the last '@', so even a URL with a raw '@', '/', '?' or '#' in its
 * password shows no part of it. config_redact_url is part of config.h's API. Pure; thread
 * affinity: none.
 *
 * Errors: the checks return 0, or -1 with a reason (never a password) in the caller's err buffer.
 */
#ifndef IDEMQ_CONFIG_URL_H
#define IDEMQ_CONFIG_URL_H

#include <stdbool.h>
#include <stddef.h>

/* Copies url into buf with any password replaced by "***", for logs and `idemq check`. NULL url
 * gives ""; buf_len 0 writes nothing. */
void config_redact_url(const char *url, char *buf, size_t buf_len);

/* Checks text against SCHEME://[user[:password]@]host[:port][/...]. schemes: NULL-terminated
 * list of accepted schemes, named by expect in the message ("amqp:// or amqps://"); socket_ok
 * accepts an empty host when a socket= parameter is given. */
int config_check_url(const char *text, const char *const *schemes, const char *expect,
                     bool socket_ok, char *err, size_t err_len);

#define CONFIG_MYSQL_PASSWORD_MAX 1024 /* bytes; config/secrets.h reads a password file up to this */

/* The parts of mysql://user[:password]@host[:port]/database[?socket=/path], percent-decoded
 * (user, password, database, socket), as mysql_real_connect takes them. */
typedef struct config_mysql_url {
    char user[128];
    char password[CONFIG_MYSQL_PASSWORD_MAX + 1];
    char host[256]; /* "127.0.0.1" when the URL names none */
    unsigned port;  /* 3306 when absent */
    char database[65];
    char socket[512]; /* empty when TCP */
} config_mysql_url;

/* The MySQL URL grammar, the one place it is written: the config loader checks mysql.url with
 * it and db/dsn builds every connection from it. Fills out from url (borrowed). Returns 0, or
 * -1 with a reason in err (never the password; without the URL, which the caller shows
 * redacted). */
int config_parse_mysql_url(const char *url, config_mysql_url *out, char *err, size_t err_len);

/* Checks a listen address HOST:PORT (host may be "[v6]"; port 0 asks the kernel for one). */
int config_check_listen(const char *text, char *err, size_t err_len);

#endif
