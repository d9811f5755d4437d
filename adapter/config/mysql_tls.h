/*
 * mysql_tls — the mysql.tls section: mode, ca_file, cert_file, key_file.
 *
 * mode is one of MySQL's ssl-mode words: disabled, preferred (the default), required,
 * verify_ca, verify_identity (db/connect.h says what each does). "preferred" is the default
 * because it is what the MySQL and MariaDB clients do: traffic is encrypted whenever the server
 * offers TLS, and a server without TLS still works, as it did before this section existed; it
 * does not authenticate the server, so production should say verify_identity. The files must be
 * readable at load. After the walk the combinations are checked, each at its key's line: no
 * file with disabled; a ca_file only with verify_ca or verify_identity (the other modes would
 * ignore it, which reads like protection it is not); cert_file and key_file together. A verify_*
 * mode without ca_file uses the system trust store. Internal to config/. Thread affinity: the
 * loading thread.
 */
#ifndef IDEMQ_CONFIG_MYSQL_TLS_H
#define IDEMQ_CONFIG_MYSQL_TLS_H

#include <stddef.h>
#include <yaml.h>

#include "config/problems.h"
#include "config/table.h"

struct config;

/* The keys of mysql.tls; the base struct is config. */
extern const opt config_mysql_tls_table[];

/* A file the process must be able to read at start (a CA, a certificate, a key). Returns 0, or
 * -1 with the reason (naming the file) in err. */
int config_check_readable_file(const char *text, char *err, size_t err_len);

/* After the walk: the rules above, reported into ctx at the keys' lines (root: the document's
 * top mapping). */
void config_validate_mysql_tls(load_ctx *ctx, yaml_node_t *root, const struct config *cfg);

#endif
