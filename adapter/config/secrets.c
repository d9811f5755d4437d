/*
 * secrets — see secrets.h.
 */
#include "config/secrets.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config.h"
#include "config/document.h"
#include "config/text.h"

int config_check_secret_path(const char *text, char *err, size_t err_len)
{
    char shown[128];
    if (!*text) {
        snprintf(err, err_len, "must name a file");
        return -1;
    }
    if (config_has_control(text)) {
        snprintf(err, err_len, "'%s' contains control characters",
                 config_show(shown, sizeof shown, text));
        return -1;
    }
    return 0;
}

void config_free_secret(char *secret)
{
    if (!secret)
        return;
    explicit_bzero(secret, strlen(secret));
    free(secret);
}

int config_read_secret(const char *path, char **out, char *err, size_t err_len)
{
    /* One byte more than allowed, plus room for "\r\n", tells "too long" from "just fits". */
    char buf[CONFIG_SECRET_MAX + 3];
    char shown[128];
    struct stat st;
    size_t len;
    int rc = -1;

    *out = NULL;
    config_show(shown, sizeof shown, path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "cannot read the password file '%s': %s", shown, strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "the password file '%s' is a directory", shown);
        goto out;
    }
    len = fread(buf, 1, sizeof buf, f);
    if (ferror(f)) {
        snprintf(err, err_len, "cannot read the password file '%s': %s", shown, strerror(errno));
        goto out;
    }
    if (len > 0 && buf[len - 1] == '\n') {
        len--;
        if (len > 0 && buf[len - 1] == '\r')
            len--;
    }
    if (len > CONFIG_SECRET_MAX) {
        snprintf(err, err_len, "the password file '%s' is longer than %d bytes", shown,
                 CONFIG_SECRET_MAX);
        goto out;
    }
    if (len == 0) {
        snprintf(err, err_len, "the password file '%s' is empty", shown);
        goto out;
    }
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f) {
            snprintf(err, err_len,
                     "the password file '%s' holds control characters or more than one line "
                     "(only one trailing newline is stripped)",
                     shown);
            goto out;
        }
    }
    *out = malloc(len + 1);
    if (!*out) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    memcpy(*out, buf, len);
    (*out)[len] = '\0';
    rc = 0;
out:
    explicit_bzero(buf, sizeof buf);
    fclose(f);
    return rc;
}

/* Reads one password file, reporting at the key's line or at the variable that named it. */
static void load_one(load_ctx *ctx, yaml_node_t *root, const char *section, const char *env,
                     const char *path, char **out)
{
    char why[512];
    const char *names[] = {section, "password_file", NULL};
    const char *from_env = getenv(env);

    if (!path)
        return;
    if (config_read_secret(path, out, why, sizeof why) == 0)
        return;
    if (from_env && *from_env)
        config_report(ctx, 0, "%s (overrides %s.password_file): %s", env, section, why);
    else
        config_report(ctx, config_path_line(ctx, root, names), "%s.password_file: %s", section,
                      why);
}

void config_load_secrets(load_ctx *ctx, yaml_node_t *root, config *cfg)
{
    load_one(ctx, root, "amqp", "IDEMQ_AMQP_PASSWORD_FILE", cfg->amqp_password_file,
             &cfg->amqp_password);
    load_one(ctx, root, "mysql", "IDEMQ_MYSQL_PASSWORD_FILE", cfg->mysql_password_file,
             &cfg->mysql_password);
}
