/*
 * tls — the TLS socket of an amqps:// connection: trust store, client certificate, peer and name
 * verification, SNI, and one line that says what went wrong when a handshake fails.
 *
 * rabbitmq-c 0.11 loads no trust store by itself, checks the host name only against the host it
 * connects to (DNS names only, never an IP address), always sends that host as SNI, and reports
 * every certificate problem as "SSL peer cert verification failed". It does hand out the SSL_CTX
 * each of its SSL sockets owns (amqp_ssl_socket_get_context), and the SSL it creates at open
 * inherits everything from it. So this module configures that context with OpenSSL directly:
 *   - the CA file, or the system trust store (SSL_CTX_set_default_verify_paths);
 *   - the client certificate and key, each failure named with its file;
 *   - SSL_VERIFY_PEER plus X509_VERIFY_PARAM's host or IP check against server_name (or the URL's
 *     host); rabbitmq-c's own host-name check is turned off, OpenSSL's replaces it;
 *   - a verify callback that records the first certificate problem (which certificate, which
 *     error, the names it holds), for broker_tls_explain;
 *   - an info callback that, when the handshake starts, replaces rabbitmq-c's SNI with
 *     server_name, and when it is done records the negotiated version and cipher: `idemq check`
 *     reads them from there, without a second handshake (rabbitmq-c does not expose its SSL *).
 * What the callbacks record is owned by the SSL_CTX (ex_data, freed with it), so it lives exactly
 * as long as the connection. One failure leaves nothing to read: under TLS 1.3 a broker refuses a
 * client certificate after the client's handshake is done, and its alert can be lost to the reset
 * that meets rabbitmq-c's first write; broker_tls_explain then makes one diagnostic connection of
 * its own with the same SSL_CTX to hear the verdict. Thread affinity: the thread that owns the
 * connection.
 *
 * Errors: broker_tls_socket_new returns NULL with the reason in err; the others cannot fail.
 */
#ifndef IDEMQ_BROKER_TLS_H
#define IDEMQ_BROKER_TLS_H

#include "broker/amqp_api.h"
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

/* Creates the TLS socket of conn (owned by conn, like every rabbitmq-c socket) and sets it up
 * from tls (borrowed; NULL: the defaults, system trust store and verification on) for a
 * connection to host (borrowed, the URL's host: the name verified unless tls->server_name).
 * Returns the socket, or NULL with one line in err naming the file or setting at fault. */
amqp_socket_t *broker_tls_socket_new(amqp_connection_state_t conn, const config_amqp_tls *tls,
                                     const char *host, char *err, size_t err_len);

/* After a failure on socket (from broker_tls_socket_new) — amqp_socket_open_noblock, or the
 * first reads and writes of the login, where TLS 1.3 delivers the broker's verdict on a client
 * certificate — writes one line into err: which certificate, which file or name, what did not
 * match, or the TLS alert and what it likely means. When the handshake had completed and nothing
 * was recorded (the broker's alert lost to a connection reset), it asks again on one diagnostic
 * connection with the same settings (at most a few seconds; rabbitmq-c gives no access to its own
 * SSL). host and port are the URL's. Returns true when it found a TLS cause, false when it left
 * err untouched (not a TLS failure: a refused connection, a timeout). Consumes the thread's
 * OpenSSL error queue. */
bool broker_tls_explain(amqp_socket_t *socket, const config_amqp_tls *tls, const char *host,
                        int port, char *err, size_t err_len);

/* After a completed handshake: "TLSv1.3, cipher TLS_AES_256_GCM_SHA384, server certificate
 * 'CN=…' verified for name 'localhost'" (or "NOT verified"), plus the client certificate when
 * one was presented. "" before a handshake completed. */
void broker_tls_describe(amqp_socket_t *socket, char *buf, size_t len);

/* The warning idemq logs at start when url is amqps:// and tls (borrowed; NULL: defaults) turns
 * verification off; NULL when there is nothing to warn about. A static string. */
const char *broker_tls_warning(const char *url, const config_amqp_tls *tls);

#endif
