/*
 * mysql_tls — see mysql_tls.h.
 */
#include "config/mysql_tls.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config.h"
#include "config/document.h"
#include "config/text.h"

static const char *const tls_mode_names[] = {"disabled",  "preferred",       "required",
                                             "verify_ca", "verify_identity", NULL};

int config_check_readable_file(const char *text, char *err, size_t err_len)
{
    char shown[128];
    struct stat st;
    config_show(shown, sizeof shown, text);
    if (!*text || config_has_control(text)) {
        snprintf(err, err_len, "'%s' is not a file name", shown);
        return -1;
    }
    FILE *f = fopen(text, "rb");
    if (!f) {
        snprintf(err, err_len, "cannot read '%s': %s", shown, strerror(errno));
        return -1;
    }
    int is_dir = fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode);
    fclose(f);
    if (is_dir) {
        snprintf(err, err_len, "'%s' is a directory, not a file", shown);
        return -1;
    }
    return 0;
}

/* clang-format off */
const opt config_mysql_tls_table[] = {
    {.name = "mode", .type = OPT_ENUM, .offset = offsetof(config, mysql_tls.mode),
     .names = tls_mode_names, .def = "preferred",
     .help = "TLS to MySQL: disabled, preferred (TLS when the server offers it), required (no "
             "certificate check), verify_ca (the CA signed it), verify_identity (and it names "
             "the URL's host)"},
    {.name = "ca_file", .type = OPT_STRING, .offset = offsetof(config, mysql_tls.ca_file),
     .check = config_check_readable_file,
     .help = "PEM CA certificates the server's certificate must chain to (verify_ca, "
             "verify_identity); default: the system trust store"},
    {.name = "cert_file", .type = OPT_STRING, .offset = offsetof(config, mysql_tls.cert_file),
     .check = config_check_readable_file,
     .help = "PEM client certificate for servers that require one (with key_file)"},
    {.name = "key_file", .type = OPT_STRING, .offset = offsetof(config, mysql_tls.key_file),
     .check = config_check_readable_file, .help = "PEM private key of cert_file"},
    {0},
};
/* clang-format on */

static unsigned long key_line(load_ctx *ctx, yaml_node_t *root, const char *key)
{
    const char *names[] = {"mysql", "tls", key, NULL};
    return config_path_line(ctx, root, names);
}

void config_validate_mysql_tls(load_ctx *ctx, yaml_node_t *root, const config *cfg)
{
    const config_mysql_tls *t = &cfg->mysql_tls;
    const char *mode = tls_mode_names[t->mode];
    const struct {
        const char *key, *value;
    } files[] = {{"ca_file", t->ca_file}, {"cert_file", t->cert_file}, {"key_file", t->key_file}};

    if (t->mode == CONFIG_MYSQL_TLS_DISABLED) {
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
            if (files[i].value)
                config_report(ctx, key_line(ctx, root, files[i].key),
                              "mysql.tls.%s is not used with mode disabled (no TLS at all): "
                              "remove it, or choose a mode that uses TLS",
                              files[i].key);
        return;
    }
    if (t->ca_file && t->mode != CONFIG_MYSQL_TLS_VERIFY_CA &&
        t->mode != CONFIG_MYSQL_TLS_VERIFY_IDENTITY)
        config_report(ctx, key_line(ctx, root, "ca_file"),
                      "mysql.tls.ca_file is only used by mode verify_ca or verify_identity; mode "
                      "%s does not check the server's certificate at all: set mode: "
                      "verify_identity (or verify_ca), or remove ca_file",
                      mode);
    if (!t->cert_file != !t->key_file)
        config_report(ctx, key_line(ctx, root, t->cert_file ? "cert_file" : "key_file"),
                      "mysql.tls.%s needs mysql.tls.%s too (a client certificate and its key)",
                      t->cert_file ? "cert_file" : "key_file",
                      t->cert_file ? "key_file" : "cert_file");
}
