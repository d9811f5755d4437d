/*
 * secrets — passwords from files: amqp.password_file and mysql.password_file, or the
 * environment's IDEMQ_AMQP_PASSWORD_FILE and IDEMQ_MYSQL_PASSWORD_FILE (the container convention:
 * a mounted secret instead of a password in a URL or a variable).
 *
 * The walker stores the path (an environment variable wins over the file, as IDEMQ_*_URL do);
 * after the walk config_load_secrets reads each named file into the config. A file holds the
 * password as it is, not percent-encoded, with at most one trailing newline (stripped: `echo`
 * and most editors add one). An unreadable, empty or oversized file, or one holding control
 * characters (a second line, say), is a configuration error at the key's line, or at the
 * variable's name when it came from the environment. No message ever shows the content. Internal
 * to config/. Thread affinity: the loading thread (getenv).
 */
#ifndef IDEMQ_CONFIG_SECRETS_H
#define IDEMQ_CONFIG_SECRETS_H

#include <stddef.h>
#include <yaml.h>

#include "config/problems.h"

#define CONFIG_SECRET_MAX 1024 /* bytes of a password, after the newline is stripped */

struct config;

/* The check of a password_file value at the walk: a non-empty path without control characters
 * (the file itself is read after the walk). Returns 0, or -1 with the reason in err. */
int config_check_secret_path(const char *text, char *err, size_t err_len);

/* Reads the file at path (borrowed) into *out (returned owned, NUL-terminated, the trailing
 * newline stripped). Returns 0, or -1 with the reason in err (naming the file, never the
 * content). */
int config_read_secret(const char *path, char **out, char *err, size_t err_len);

/* After the walk: reads cfg->amqp_password_file and cfg->mysql_password_file (when set) into
 * cfg->amqp_password and cfg->mysql_password, reporting into ctx at the key's line (root is the
 * document's top mapping, for the lines). */
void config_load_secrets(load_ctx *ctx, yaml_node_t *root, struct config *cfg);

/* Overwrites and frees a secret; NULL is a no-op. */
void config_free_secret(char *secret);

#endif
