/*
 * connection — see connection.h.
 */
#include "broker/connection.h"

#include "broker/amqp_api.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "broker/tls.h"

const char *broker_describe_method(const amqp_method_t *method, char *buf, size_t len)
{
    if (method->id == AMQP_CONNECTION_CLOSE_METHOD) {
        const amqp_connection_close_t *m = method->decoded;
        snprintf(buf, len, "connection closed by broker: %u %.*s", m->reply_code,
                 (int)m->reply_text.len, (const char *)m->reply_text.bytes);
    } else if (method->id == AMQP_CHANNEL_CLOSE_METHOD) {
        const amqp_channel_close_t *m = method->decoded;
        snprintf(buf, len, "channel closed by broker: %u %.*s", m->reply_code,
                 (int)m->reply_text.len, (const char *)m->reply_text.bytes);
    } else {
        snprintf(buf, len, "unexpected broker method 0x%08X", method->id);
    }
    return buf;
}

const char *broker_describe_status(int status)
{
    switch (status) {
    case AMQP_STATUS_CONNECTION_CLOSED:
    case AMQP_STATUS_SOCKET_CLOSED:
        return "connection closed by the broker";
    case AMQP_STATUS_SOCKET_ERROR:
        return "connection closed by the broker or the network (socket error)";
    case AMQP_STATUS_HEARTBEAT_TIMEOUT:
        return "the broker sent nothing for two heartbeat intervals (heartbeat timeout)";
    case AMQP_STATUS_TIMEOUT:
        return "the broker did not answer in time (timeout)";
    default:
        return amqp_error_string2(status);
    }
}

const char *broker_describe_reply(amqp_rpc_reply_t reply, char *buf, size_t len)
{
    switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        snprintf(buf, len, "ok");
        break;
    case AMQP_RESPONSE_NONE:
        snprintf(buf, len, "missing RPC reply");
        break;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(buf, len, "%s", broker_describe_status(reply.library_error));
        break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        broker_describe_method(&reply.reply, buf, len);
        break;
    }
    return buf;
}

/* Whether the URL's user-info holds a password ("user:pass@"). amqp_parse_url cannot say: it
 * fills in "guest" for a missing one. */
static bool url_has_password(const char *url)
{
    const char *start = strstr(url, "://");
    start = start ? start + 3 : url;
    size_t auth_len = strcspn(start, "/?#");
    const char *at = NULL;
    for (size_t i = 0; i < auth_len; i++)
        if (start[i] == '@')
            at = start + i;
    return at && memchr(start, ':', (size_t)(at - start)) != NULL;
}

int broker_open(const broker_open_options *opts, amqp_connection_state_t *out, char *err,
                size_t err_len)
{
    struct amqp_connection_info info;
    char reason[512];
    int rc = BROKER_E_FAILED;
    char *url = strdup(opts->url);
    amqp_connection_state_t conn = NULL;
    if (!url) {
        snprintf(err, err_len, "out of memory");
        return BROKER_E_FAILED;
    }
    if (amqp_parse_url(url, &info) != AMQP_STATUS_OK) {
        snprintf(err, err_len, "amqp url is malformed (expected amqp://user:pass@host:port/vhost)");
        goto out;
    }
    conn = amqp_new_connection();
    if (!conn) {
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    amqp_socket_t *socket;
    if (info.ssl) {
        socket = broker_tls_socket_new(conn, opts->tls, info.host, err, err_len);
        if (!socket)
            goto out;
    } else {
        socket = amqp_tcp_socket_new(conn);
        if (!socket) {
            snprintf(err, err_len, "cannot create a TCP socket");
            goto out;
        }
    }
    /* EXTERNAL: the broker (rabbitmq_auth_mechanism_ssl) takes the user name from the client
     * certificate; the identity sent along is the URL's user, which it ignores. */
    bool external = info.ssl && opts->tls && opts->tls->cert_file && !opts->password &&
                    !url_has_password(opts->url);
    /* amqp.password_file's content replaces the URL's password (config/options.c). */
    const char *password = opts->password ? opts->password : info.password;
    struct timeval open_timeout = {.tv_sec = 5};
    int status = amqp_socket_open_noblock(socket, info.host, info.port, &open_timeout);
    if (status != AMQP_STATUS_OK) {
        /* A certificate or name that does not match is the configuration's to fix: a refusal. */
        if (info.ssl && broker_tls_explain(socket, opts->tls, info.host, info.port, err, err_len))
            rc = BROKER_E_REFUSED;
        else
            snprintf(err, err_len, "cannot connect to RabbitMQ at %s:%d: %s", info.host,
                     info.port,
                     status == AMQP_STATUS_SOCKET_ERROR
                         ? "nothing accepts connections there, or it is unreachable"
                         : broker_describe_status(status));
        goto out;
    }
    struct timeval handshake_timeout = {.tv_sec = 10};
    struct timeval rpc_timeout = {.tv_sec = 30};
    amqp_set_handshake_timeout(conn, &handshake_timeout);
    amqp_set_rpc_timeout(conn, &rpc_timeout);
    int heartbeat_s = (int)((opts->heartbeat_ms + 999) / 1000);
    /* rabbitmq-c merges these with its own client properties (and its capabilities table with
     * ours), so authentication_failure_close stays advertised. */
    amqp_table_entry_t capabilities[2] = {
        {.key = amqp_cstring_bytes("connection.blocked"),
         .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1}},
        {.key = amqp_cstring_bytes("consumer_cancel_notify"),
         .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1}},
    };
    amqp_table_entry_t client_entries[2] = {
        {.key = amqp_cstring_bytes("capabilities"),
         .value = {.kind = AMQP_FIELD_KIND_TABLE,
                   .value.table = {.num_entries = 2, .entries = capabilities}}},
        {.key = amqp_cstring_bytes("connection_name"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("idemq run")}},
    };
    amqp_table_t client_properties = {.num_entries = opts->session_capabilities ? 2 : 0,
                                      .entries = client_entries};
    amqp_rpc_reply_t reply =
        external ? amqp_login_with_properties(conn, info.vhost, 0, 131072, heartbeat_s,
                                              &client_properties, AMQP_SASL_METHOD_EXTERNAL,
                                              info.user)
                 : amqp_login_with_properties(conn, info.vhost, 0, 131072, heartbeat_s,
                                              &client_properties, AMQP_SASL_METHOD_PLAIN,
                                              info.user, password);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        /* TLS 1.3 finishes the client's side of the handshake before the broker has checked the
         * client certificate: its refusal arrives here, as an alert on the first read or as a
         * reset of the first write (broker_tls_explain then asks again). */
        if (info.ssl && reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error != AMQP_STATUS_TIMEOUT &&
            broker_tls_explain(socket, opts->tls, info.host, info.port, err, err_len)) {
            rc = BROKER_E_REFUSED;
            goto out;
        }
        if (external && reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error == AMQP_STATUS_BROKER_UNSUPPORTED_SASL_METHOD) {
            snprintf(err, err_len,
                     "RabbitMQ at %s:%d does not offer the EXTERNAL login that a client "
                     "certificate without a password in the URL asks for: enable the "
                     "rabbitmq_auth_mechanism_ssl plugin and add EXTERNAL to auth_mechanisms, or "
                     "put a password in the URL",
                     info.host, info.port);
            rc = BROKER_E_REFUSED;
            goto out;
        }
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
            /* No answer to judge: a broker that stopped answering mid-handshake, or closed the
             * socket, has not refused anything. (A refusal is a connection.close.) */
            snprintf(err, err_len, "login to RabbitMQ at %s:%d failed: %s", info.host, info.port,
                     broker_describe_status(reply.library_error));
            goto out;
        }
        broker_describe_reply(reply, reason, sizeof reason);
        if (external) {
            snprintf(err, err_len,
                     "RabbitMQ at %s:%d refused the EXTERNAL login (client certificate %s) to "
                     "vhost '%s': %s",
                     info.host, info.port, opts->tls->cert_file, info.vhost, reason);
            rc = BROKER_E_REFUSED;
            goto out;
        }
        snprintf(err, err_len, "RabbitMQ at %s:%d refused login as '%s' to vhost '%s': %s",
                 info.host, info.port, info.user, info.vhost, reason);
        rc = BROKER_E_REFUSED;
        goto out;
    }
    amqp_channel_open(conn, BROKER_CHANNEL);
    reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        snprintf(err, err_len, "cannot open channel: %s",
                 broker_describe_reply(reply, reason, sizeof reason));
        goto out;
    }
    if (opts->prefetch) {
        amqp_basic_qos(conn, BROKER_CHANNEL, 0, (uint16_t)opts->prefetch, 0);
        reply = amqp_get_rpc_reply(conn);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            snprintf(err, err_len, "basic.qos failed: %s",
                     broker_describe_reply(reply, reason, sizeof reason));
            goto out;
        }
    }
    if (opts->confirms) {
        amqp_confirm_select(conn, BROKER_CHANNEL);
        reply = amqp_get_rpc_reply(conn);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            snprintf(err, err_len, "confirm.select failed: %s",
                     broker_describe_reply(reply, reason, sizeof reason));
            goto out;
        }
    }
    if (opts->tls_info && opts->tls_info_len) {
        opts->tls_info[0] = '\0';
        if (info.ssl) {
            broker_tls_describe(socket, opts->tls_info, opts->tls_info_len);
            if (external) {
                size_t n = strlen(opts->tls_info);
                snprintf(opts->tls_info + n, opts->tls_info_len - n, ", EXTERNAL login");
            }
        }
    }
    *out = conn;
    conn = NULL;
    rc = 0;
out:
    if (conn)
        amqp_destroy_connection(conn);
    explicit_bzero(url, strlen(opts->url)); /* amqp_parse_url decoded the password in place */
    free(url);
    return rc;
}

int broker_reopen_channel(amqp_connection_state_t conn)
{
    amqp_channel_close_ok_t close_ok;
    if (amqp_send_method(conn, BROKER_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) !=
        AMQP_STATUS_OK)
        return BROKER_E_FAILED;
    amqp_channel_open(conn, BROKER_CHANNEL);
    return amqp_get_rpc_reply(conn).reply_type == AMQP_RESPONSE_NORMAL ? 0 : BROKER_E_FAILED;
}

void broker_close(amqp_connection_state_t conn)
{
    if (!conn)
        return;
    /* A broker that stopped answering must not hold a shutdown for the full RPC timeout. */
    struct timeval close_timeout = {.tv_sec = 2};
    amqp_set_rpc_timeout(conn, &close_timeout);
    amqp_channel_close(conn, BROKER_CHANNEL, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
}
