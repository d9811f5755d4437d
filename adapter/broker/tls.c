/*
 * tls — see tls.h.
 */
#include "broker/tls.h"

#include "broker/amqp_api.h"
#include <arpa/inet.h>
#include <limits.h>
#include <netdb.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NAME_MAX_LEN 256
#define DIAGNOSE_TIMEOUT_S 3     /* connect, write and read of the diagnostic connection */
#define DIAGNOSE_VERDICT_MS 1000 /* how long the broker gets to refuse a client certificate */

/* What one connection's callbacks record; owned by its SSL_CTX (ex_data). */
typedef struct tls_state {
    bool verify;                /* tls->verify */
    char name[NAME_MAX_LEN];    /* the name the certificate must hold */
    bool name_is_server_name;   /* it came from tls->server_name, not the URL */
    char sni[NAME_MAX_LEN];     /* sent as SNI; "" for an IP address (RFC 6066: none) */
    char trust[PATH_MAX + 128]; /* "ca_file /x/ca.pem" or "the system trust store (…)" */
    /* The first certificate problem of the handshake (verify callback). */
    bool failed;
    long error;
    int depth;
    char subject[NAME_MAX_LEN]; /* the certificate at fault */
    char issuer[NAME_MAX_LEN];  /* its issuer */
    char leaf[NAME_MAX_LEN];    /* the server's certificate */
    char names[512];            /* the names the server's certificate is for */
    int name_count;
    char not_before[64], not_after[64];
    /* The handshake's outcome (info callback). */
    bool done;
    char version[32], cipher[96], peer[NAME_MAX_LEN], own[NAME_MAX_LEN];
} tls_state;

static const config_amqp_tls default_tls = {.verify = 1};

static int state_index = -1;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

static void free_state(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    (void)parent, (void)ad, (void)idx, (void)argl, (void)argp;
    free(ptr);
}

static void init_state_index(void)
{
    state_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, free_state);
}

static tls_state *state_of(const SSL_CTX *ctx)
{
    return ctx && state_index >= 0 ? SSL_CTX_get_ex_data(ctx, state_index) : NULL;
}

static bool is_ip_address(const char *name)
{
    unsigned char addr[16];
    return inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
}

/* "CN=localhost,O=idemq" (RFC 2253 order) into buf. */
static void format_name(const X509_NAME *name, char *buf, size_t len)
{
    BIO *bio = BIO_new(BIO_s_mem());
    int n = 0;
    buf[0] = '\0';
    if (!bio)
        return;
    if (X509_NAME_print_ex(bio, name, 0, XN_FLAG_RFC2253 & ~ASN1_STRFLGS_ESC_MSB) >= 0)
        n = BIO_read(bio, buf, (int)len - 1);
    buf[n > 0 ? n : 0] = '\0';
    BIO_free(bio);
}

static void format_time(const ASN1_TIME *t, char *buf, size_t len)
{
    BIO *bio = BIO_new(BIO_s_mem());
    int n = 0;
    buf[0] = '\0';
    if (!bio)
        return;
    if (t && ASN1_TIME_print(bio, t))
        n = BIO_read(bio, buf, (int)len - 1);
    buf[n > 0 ? n : 0] = '\0';
    BIO_free(bio);
}

static void append(char *buf, size_t len, const char *text, size_t text_len, int *count)
{
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s'%.*s'", n ? ", " : "", (int)text_len, text);
    (*count)++;
}

/* The names a certificate is for, as a host-name check sees them: its DNS and IP subject
 * alternative names, or its common name when it has none. "'localhost', '127.0.0.1'"; *count
 * gets how many. */
static void format_cert_names(X509 *cert, char *buf, size_t len, int *count)
{
    *count = 0;
    GENERAL_NAMES *sans = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    buf[0] = '\0';
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type == GEN_DNS) {
            append(buf, len, (const char *)ASN1_STRING_get0_data(g->d.dNSName),
                   (size_t)ASN1_STRING_length(g->d.dNSName), count);
        } else if (g->type == GEN_IPADD) {
            char ip[INET6_ADDRSTRLEN] = "?";
            int n = ASN1_STRING_length(g->d.iPAddress);
            const unsigned char *bytes = ASN1_STRING_get0_data(g->d.iPAddress);
            if (n == 4 || n == 16)
                inet_ntop(n == 4 ? AF_INET : AF_INET6, bytes, ip, sizeof ip);
            append(buf, len, ip, strlen(ip), count);
        }
    }
    GENERAL_NAMES_free(sans);
    if (!buf[0]) {
        char cn[NAME_MAX_LEN];
        int n =
            X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
        if (n > 0)
            append(buf, len, cn, (size_t)n, count);
        else
            snprintf(buf, len, "(no names)");
    }
}

/* Records the first problem; returning ok unchanged keeps OpenSSL's decision (with
 * SSL_VERIFY_PEER a problem ends the handshake with an alert to the broker). */
static int on_verify(int ok, X509_STORE_CTX *store)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx());
    tls_state *st = ssl ? state_of(SSL_get_SSL_CTX(ssl)) : NULL;
    if (ok || !st || st->failed)
        return ok;
    X509 *cert = X509_STORE_CTX_get_current_cert(store);
    X509 *leaf = X509_STORE_CTX_get0_cert(store);
    st->failed = true;
    st->error = X509_STORE_CTX_get_error(store);
    st->depth = X509_STORE_CTX_get_error_depth(store);
    if (cert) {
        format_name(X509_get_subject_name(cert), st->subject, sizeof st->subject);
        format_name(X509_get_issuer_name(cert), st->issuer, sizeof st->issuer);
        format_time(X509_get0_notBefore(cert), st->not_before, sizeof st->not_before);
        format_time(X509_get0_notAfter(cert), st->not_after, sizeof st->not_after);
    }
    if (leaf) {
        format_name(X509_get_subject_name(leaf), st->leaf, sizeof st->leaf);
        format_cert_names(leaf, st->names, sizeof st->names, &st->name_count);
    }
    return ok;
}

/* OpenSSL hands the info callback a const SSL *, but it is the connection's own (non-const)
 * SSL, which rabbitmq-c does not expose otherwise: setting its SNI here, before the ClientHello
 * is built, is the one way to send server_name instead of the host rabbitmq-c connects to. */
static void on_info(const SSL *cssl, int where, int ret)
{
    SSL *ssl = (SSL *)cssl;
    tls_state *st = state_of(SSL_get_SSL_CTX(cssl));
    (void)ret;
    if (!st)
        return;
    if (where & SSL_CB_HANDSHAKE_START) {
        SSL_set_tlsext_host_name(ssl, st->sni[0] ? st->sni : NULL);
    } else if (where & SSL_CB_HANDSHAKE_DONE) {
        const SSL_CIPHER *cipher = SSL_get_current_cipher(cssl);
        X509 *peer = SSL_get0_peer_certificate(cssl);
        X509 *own = SSL_get_certificate(cssl);
        snprintf(st->version, sizeof st->version, "%s", SSL_get_version(cssl));
        snprintf(st->cipher, sizeof st->cipher, "%s",
                 cipher ? SSL_CIPHER_get_name(cipher) : "(none)");
        st->peer[0] = st->own[0] = '\0';
        if (peer)
            format_name(X509_get_subject_name(peer), st->peer, sizeof st->peer);
        if (own)
            format_name(X509_get_subject_name(own), st->own, sizeof st->own);
        st->done = true;
    }
}

/* The key file is read by a daemon: an encrypted key must fail, never prompt on a terminal. */
static int refuse_password(char *buf, int size, int rwflag, void *userdata)
{
    (void)buf, (void)size, (void)rwflag, (void)userdata;
    return -1;
}

/* The reason of the thread's last OpenSSL error ("no start line"), then clears the queue.
 * Returns the packed error (0: none). */
static unsigned long take_ssl_error(char *buf, size_t len)
{
    unsigned long e = ERR_peek_last_error();
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    if (reason)
        snprintf(buf, len, "%s", reason);
    else if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "unknown OpenSSL error");
    ERR_clear_error();
    return e;
}

static void describe_trust(const config_amqp_tls *tls, char *buf, size_t len)
{
    if (tls->ca_file) {
        snprintf(buf, len, "ca_file %s", tls->ca_file);
        return;
    }
    const char *file = getenv(X509_get_default_cert_file_env());
    char real[PATH_MAX];
    struct stat st;
    if (!file || !*file)
        file = X509_get_default_cert_file();
    if (realpath(file, real))
        file = real;
    snprintf(buf, len, "the system trust store (%s%s)", file,
             stat(file, &st) == 0 ? "" : ", which does not exist: install ca-certificates");
}

amqp_socket_t *broker_tls_socket_new(amqp_connection_state_t conn, const config_amqp_tls *tls,
                                     const char *host, char *err, size_t err_len)
{
    char reason[256];
    if (!tls)
        tls = &default_tls;
    pthread_once(&state_once, init_state_index);
    if (state_index < 0) {
        snprintf(err, err_len, "TLS: OpenSSL has no room for the connection's state");
        return NULL;
    }
    ERR_clear_error();
    /* From here on the socket belongs to conn: destroying conn frees it, its SSL_CTX and the
     * state attached to that. */
    amqp_socket_t *socket = amqp_ssl_socket_new(conn);
    if (!socket) {
        take_ssl_error(reason, sizeof reason);
        snprintf(err, err_len, "TLS: cannot create a TLS socket: %s", reason);
        return NULL;
    }
    SSL_CTX *ctx = amqp_ssl_socket_get_context(socket);
    tls_state *st = calloc(1, sizeof *st);
    if (!st || !SSL_CTX_set_ex_data(ctx, state_index, st)) {
        free(st);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    const char *name = tls->server_name ? tls->server_name : host;
    st->verify = tls->verify != 0;
    st->name_is_server_name = tls->server_name != NULL;
    snprintf(st->name, sizeof st->name, "%s", name);
    if (!is_ip_address(name))
        snprintf(st->sni, sizeof st->sni, "%s", name);
    describe_trust(tls, st->trust, sizeof st->trust);

    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_default_passwd_cb(ctx, refuse_password);
    SSL_CTX_set_info_callback(ctx, on_info);

    if (tls->ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL) != 1) {
            take_ssl_error(reason, sizeof reason);
            snprintf(err, err_len, "TLS: cannot use ca_file %s: %s (expected PEM certificates)",
                     tls->ca_file, reason);
            return NULL;
        }
    } else if (st->verify && SSL_CTX_set_default_verify_paths(ctx) != 1) {
        take_ssl_error(reason, sizeof reason);
        snprintf(err, err_len, "TLS: cannot load %s: %s", st->trust, reason);
        return NULL;
    }
    if (tls->cert_file && tls->key_file) {
        if (SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file) != 1) {
            take_ssl_error(reason, sizeof reason);
            snprintf(err, err_len, "TLS: cannot use cert_file %s: %s (expected a PEM certificate)",
                     tls->cert_file, reason);
            return NULL;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, tls->key_file, SSL_FILETYPE_PEM) != 1) {
            unsigned long e = take_ssl_error(reason, sizeof reason);
            if (ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH)
                snprintf(err, err_len, "TLS: key_file %s is not the private key of cert_file %s",
                         tls->key_file, tls->cert_file);
            else
                snprintf(err, err_len,
                         "TLS: cannot use key_file %s: %s (expected an unencrypted PEM key)",
                         tls->key_file, reason);
            return NULL;
        }
    }
    if (st->verify) {
        X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        int ok = is_ip_address(name) ? X509_VERIFY_PARAM_set1_ip_asc(param, name)
                                     : X509_VERIFY_PARAM_set1_host(param, name, 0);
        if (ok != 1) {
            take_ssl_error(reason, sizeof reason);
            snprintf(err, err_len, "TLS: cannot verify the name '%s': %s", name, reason);
            return NULL;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, on_verify);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    /* rabbitmq-c re-checks the chain's verdict after the handshake (harmless); its own name
     * check knows only the connect host and DNS names, so OpenSSL's (above) replaces it. */
    amqp_ssl_socket_set_verify_peer(socket, st->verify);
    amqp_ssl_socket_set_verify_hostname(socket, 0);
    return socket;
}

static bool is_untrusted(long error)
{
    switch (error) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_UNTRUSTED:
        return true;
    default:
        return false;
    }
}

static void explain_certificate(const tls_state *st, const char *host, int port, char *err,
                                size_t err_len)
{
    const char *what = X509_verify_cert_error_string(st->error);
    const char *which = st->depth == 0 ? "server certificate" : "CA certificate";
    if (is_untrusted(st->error)) {
        /* The CA the chain needs: the self-signed one it ends in, or the missing issuer. */
        bool self_signed = strcmp(st->subject, st->issuer) == 0;
        bool ca_file = strncmp(st->trust, "ca_file", 7) == 0;
        snprintf(err, err_len,
                 "TLS: the server certificate '%s' of %s:%d is not trusted by %s: its chain ends "
                 "in the CA '%s', which %s (%s)",
                 st->leaf, host, port, st->trust, self_signed ? st->subject : st->issuer,
                 ca_file ? "that file does not hold"
                         : "the store does not hold; set amqp.tls.ca_file to that CA's certificate",
                 what);
    } else if (st->error == X509_V_ERR_HOSTNAME_MISMATCH ||
               st->error == X509_V_ERR_IP_ADDRESS_MISMATCH) {
        const char *names = st->name_count == 1 ? "name" : "names";
        const char *match = st->name_count == 1 ? "does" : "do";
        if (st->name_is_server_name)
            snprintf(err, err_len, "TLS: certificate %s %s of %s:%d %s not match server_name '%s'",
                     names, st->names, host, port, match, st->name);
        else
            snprintf(err, err_len,
                     "TLS: certificate %s %s of %s:%d %s not match the URL's host '%s' (if that "
                     "is the right server, set amqp.tls.server_name to a name it holds)",
                     names, st->names, host, port, match, st->name);
    } else if (st->error == X509_V_ERR_CERT_HAS_EXPIRED) {
        snprintf(err, err_len, "TLS: the %s '%s' of %s:%d expired on %s", which, st->subject, host,
                 port, st->not_after);
    } else if (st->error == X509_V_ERR_CERT_NOT_YET_VALID) {
        snprintf(err, err_len,
                 "TLS: the %s '%s' of %s:%d is not valid before %s (is this machine's clock "
                 "right?)",
                 which, st->subject, host, port, st->not_before);
    } else {
        snprintf(err, err_len, "TLS: the %s '%s' of %s:%d failed verification against %s: %s",
                 which, st->subject, host, port, st->trust, what);
    }
}

/* An alert the broker sent because of the client certificate (or its absence). */
static bool is_client_certificate_alert(int reason)
{
    switch (reason) {
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
        return true;
    default:
        return false;
    }
}

/*
 * rabbitmq-c failed after a completed handshake with no alert to show. With TLS 1.3 the broker
 * checks the client certificate after the client's side of the handshake is done, and its alert
 * is lost when rabbitmq-c's first write meets the reset of the connection the broker closed.
 * So a second, diagnostic connection with the same SSL_CTX (same trust, certificate, SNI) asks
 * again: after the handshake it gives the broker DIAGNOSE_VERDICT_MS to refuse, reading before
 * it writes, then sends the AMQP protocol header and reads the answer (connection.start, or an
 * alert). Leaves what went wrong in the thread's OpenSSL error queue; returns its packed error,
 * 0 when the broker accepted this time or could not be reached.
 */
static unsigned long diagnose(SSL_CTX *ctx, const char *host, int port)
{
    static const char header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    char service[16], byte;
    unsigned long e = 0;
    sigset_t pipe_set, old_mask, pending;

    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return 0;
    /* OpenSSL writes to this socket with write(2): a broker that has closed it would raise
     * SIGPIPE, which `idemq check` does not ignore. Blocked here, and a pending one taken. */
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        struct timeval tv = {.tv_sec = DIAGNOSE_TIMEOUT_S};
        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            close(fd);
            continue;
        }
        SSL *ssl = SSL_new(ctx);
        ERR_clear_error();
        if (ssl && SSL_set_fd(ssl, fd) == 1 && SSL_connect(ssl) == 1) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            bool go_on = true;
            if (poll(&p, 1, DIAGNOSE_VERDICT_MS) == 1) {
                /* The verdict (an alert), a session ticket (SSL_ERROR_WANT_READ: rabbitmq-c
                 * turned SSL_MODE_AUTO_RETRY off on this context), or the end. */
                int n = SSL_read(ssl, &byte, 1);
                go_on = n > 0 || SSL_get_error(ssl, n) == SSL_ERROR_WANT_READ;
            }
            if (go_on && !ERR_peek_last_error() && SSL_write(ssl, header, sizeof header) > 0)
                (void)SSL_read(ssl, &byte, 1); /* connection.start, or the alert */
        }
        e = ERR_peek_last_error();
        SSL_free(ssl);
        close(fd);
        break; /* the first address that connects gives the verdict */
    }
    freeaddrinfo(res);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) &&
        !sigismember(&old_mask, SIGPIPE)) {
        struct timespec zero = {0};
        sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    return e;
}

bool broker_tls_explain(amqp_socket_t *socket, const config_amqp_tls *tls, const char *host,
                        int port, char *err, size_t err_len)
{
    char reason[256];
    if (!tls)
        tls = &default_tls;
    SSL_CTX *ctx = amqp_ssl_socket_get_context(socket);
    const tls_state *st = state_of(ctx);
    unsigned long e = ERR_peek_last_error();
    if (!e && st && st->done && !st->failed)
        e = diagnose(ctx, host, port);
    if (st && st->failed) {
        ERR_clear_error();
        explain_certificate(st, host, port, err, err_len);
        return true;
    }
    if (!e)
        return false;
    take_ssl_error(reason, sizeof reason);
    int code = ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
    if (is_client_certificate_alert(code) && tls->cert_file)
        snprintf(err, err_len,
                 "TLS: RabbitMQ at %s:%d refused the client certificate cert_file %s (%s): is "
                 "it signed by a CA the broker trusts (ssl_options.cacertfile)?",
                 host, port, tls->cert_file, reason);
    else if (is_client_certificate_alert(code))
        snprintf(err, err_len,
                 "TLS: RabbitMQ at %s:%d requires a client certificate (%s): set "
                 "amqp.tls.cert_file and amqp.tls.key_file",
                 host, port, reason);
    else if (code == SSL_R_WRONG_VERSION_NUMBER || code == SSL_R_UNEXPECTED_EOF_WHILE_READING ||
             code == SSL_R_PACKET_LENGTH_TOO_LONG || code == SSL_R_RECORD_LENGTH_MISMATCH)
        snprintf(err, err_len,
                 "TLS: the handshake with %s:%d failed (%s): is that port a TLS listener? "
                 "amqps:// URLs default to port 5671",
                 host, port, reason);
    else
        snprintf(err, err_len, "TLS: the handshake with %s:%d failed: %s", host, port, reason);
    return true;
}

void broker_tls_describe(amqp_socket_t *socket, char *buf, size_t len)
{
    const tls_state *st = state_of(amqp_ssl_socket_get_context(socket));
    if (!len)
        return;
    buf[0] = '\0';
    if (!st || !st->done)
        return;
    int n;
    if (st->verify)
        n = snprintf(buf, len, "%s, cipher %s, server certificate '%s' verified for '%s' by %s",
                     st->version, st->cipher, st->peer, st->name, st->trust);
    else
        n = snprintf(buf, len,
                     "%s, cipher %s, server certificate '%s' NOT verified (amqp.tls.verify: false)",
                     st->version, st->cipher, st->peer);
    if (st->own[0] && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ", client certificate '%s'", st->own);
}

const char *broker_tls_warning(const char *url, const config_amqp_tls *tls)
{
    if (!url || strncmp(url, "amqps://", 8) != 0 || !tls || tls->verify)
        return NULL;
    return "amqp.tls.verify is false: idemq checks neither the broker's certificate nor its "
           "name, so anyone on the network path can pose as the broker and read every message "
           "and the login; use it only for tests";
}
