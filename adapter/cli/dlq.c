/*
 * dlq — `idemq dlq list|replay|purge`: inspect and re-deliver dead letters.
 *
 * Messages are fetched with basic.get without auto-ack. Whatever is not explicitly acked stays
 * unacked on our channel and returns to the DLQ when the channel closes, so `list` never removes
 * anything and a crash at any point loses nothing. `replay` publishes the original body and
 * properties (idemq and dead-lettering headers removed, so the retry count starts again) to the
 * default exchange with routing key Q — reaching only the work queue — waits for the publisher
 * confirm and only then acks the dead letter. Blocking, single-threaded: a one-shot tool.
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "broker/connection.h"
#include "broker/message.h"
#include "broker/topology.h"
#include "envelope/envelope.h"

#define CONFIRM_TIMEOUT_S 30

typedef struct dead_letter {
    char biz_key[ENVELOPE_BIZ_KEY_MAX * 2 + 64];
    char error_class[64];
    char error[HEADER_ERROR_MAX + 1];
    int64_t retries;
    int64_t first_failed_at_ms;
} dead_letter;

static const config_consumer *find_consumer(const config *cfg, const char *queue)
{
    if (!queue)
        return cfg->consumer_count == 1 ? &cfg->consumers[0] : NULL;
    for (size_t i = 0; i < cfg->consumer_count; i++)
        if (strcmp(cfg->consumers[i].queue, queue) == 0)
            return &cfg->consumers[i];
    return NULL;
}

static void header_text(const amqp_basic_properties_t *props, const char *name, char *buf,
                        size_t len)
{
    amqp_bytes_t value;
    if (message_header_bytes(props, name, &value))
        snprintf(buf, len, "%.*s", (int)value.len, (const char *)value.bytes);
    else
        snprintf(buf, len, "-");
}

static void describe(const amqp_message_t *m, const config *cfg, dead_letter *out)
{
    memset(out, 0, sizeof *out);
    char content_type[128] = "";
    if (m->properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
        snprintf(content_type, sizeof content_type, "%.*s", (int)m->properties.content_type.len,
                 (const char *)m->properties.content_type.bytes);
    envelope env;
    char reason[256];
    envelope_limits limits = {.max_body = cfg->max_body};
    int rc = envelope_decode(m->body.bytes, m->body.len, content_type, &limits, &env, reason,
                             sizeof reason);
    if (rc == ENVELOPE_OK) {
        snprintf(out->biz_key, sizeof out->biz_key, "%s", env.biz_key);
        envelope_close(&env);
    } else {
        snprintf(out->biz_key, sizeof out->biz_key, "(no key: %s)", envelope_error_name(rc));
    }
    header_text(&m->properties, HEADER_ERROR_CLASS, out->error_class, sizeof out->error_class);
    header_text(&m->properties, HEADER_ERROR, out->error, sizeof out->error);
    if (!message_header_int(&m->properties, HEADER_RETRIES, &out->retries))
        out->retries = 0;
    if (!message_header_int(&m->properties, HEADER_FIRST_FAILED_AT, &out->first_failed_at_ms))
        out->first_failed_at_ms = 0;
}

static int64_t now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void format_time(int64_t ms, char *buf, size_t len)
{
    if (ms <= 0) {
        snprintf(buf, len, "-");
        return;
    }
    time_t seconds = (time_t)(ms / 1000);
    struct tm utc;
    gmtime_r(&seconds, &utc);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

static json_t *dead_letter_json(const dead_letter *d)
{
    char when[40];
    format_time(d->first_failed_at_ms, when, sizeof when);
    return json_pack("{s:s, s:s, s:s, s:I, s:s, s:I}", "biz_key", d->biz_key, "error_class",
                     d->error_class, "error", d->error, "retries", (json_int_t)d->retries,
                     "first_failed_at", when, "age_seconds",
                     (json_int_t)(d->first_failed_at_ms ? (now_ms() - d->first_failed_at_ms) / 1000
                                                        : 0));
}

static void print_dead_letter(const dead_letter *d)
{
    char when[40];
    format_time(d->first_failed_at_ms, when, sizeof when);
    long long age = d->first_failed_at_ms ? (now_ms() - d->first_failed_at_ms) / 1000 : 0;
    printf("%-40s %-18s retries=%-3" PRId64 " first_failed=%s age=%llds\n    reason: %s\n",
           d->biz_key, d->error_class, d->retries, when, age, d->error);
}

/* Waits for the confirm of publish seq. Returns 0 when acked and not returned. */
static int wait_for_confirm(amqp_connection_state_t conn, uint64_t seq, char *err, size_t len)
{
    bool returned = false;
    for (;;) {
        amqp_frame_t frame;
        struct timeval timeout = {.tv_sec = CONFIRM_TIMEOUT_S};
        int rc = amqp_simple_wait_frame_noblock(conn, &frame, &timeout);
        if (rc != AMQP_STATUS_OK) {
            snprintf(err, len, "waiting for the publisher confirm: %s", amqp_error_string2(rc));
            return -1;
        }
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue; /* header/body of a basic.return */
        switch (frame.payload.method.id) {
        case AMQP_BASIC_RETURN_METHOD:
            returned = true;
            break;
        case AMQP_BASIC_ACK_METHOD: {
            const amqp_basic_ack_t *ack = frame.payload.method.decoded;
            if (ack->delivery_tag >= seq || ack->multiple) {
                if (returned)
                    snprintf(err, len, "the work queue did not accept the message (unroutable)");
                return returned ? -1 : 0;
            }
            break;
        }
        case AMQP_BASIC_NACK_METHOD:
            snprintf(err, len, "the broker refused the message (nack)");
            return -1;
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
            snprintf(err, len, "the broker closed the channel");
            return -1;
        default:
            break;
        }
    }
}

static int replay_one(amqp_connection_state_t conn, const config_consumer *c,
                      const amqp_message_t *m, uint64_t seq, char *err, size_t len)
{
    amqp_pool_t pool;
    amqp_basic_properties_t props;
    init_amqp_pool(&pool, 1024);
    int rc = message_strip_properties(&m->properties, &pool, &props);
    if (rc == 0)
        rc = amqp_basic_publish(conn, BROKER_CHANNEL, amqp_empty_bytes,
                                amqp_cstring_bytes(c->queue), 1, 0, &props, m->body);
    empty_amqp_pool(&pool);
    if (rc != 0) {
        snprintf(err, len, "publish failed: %s", amqp_error_string2(rc));
        return -1;
    }
    return wait_for_confirm(conn, seq, err, len);
}

static int purge(amqp_connection_state_t conn, const char *dlq, const dlq_options *opts)
{
    char reason[512];
    amqp_queue_purge_ok_t *ok = amqp_queue_purge(conn, BROKER_CHANNEL, amqp_cstring_bytes(dlq));
    if (!ok) {
        fprintf(stderr, "idemq dlq purge: %s\n",
                broker_describe_reply(amqp_get_rpc_reply(conn), reason, sizeof reason));
        return 1;
    }
    if (opts->json)
        printf("{\"queue\":\"%s\",\"purged\":%u}\n", dlq, ok->message_count);
    else
        printf("purged %u message(s) from %s\n", ok->message_count, dlq);
    return 0;
}

int cli_dlq(const config *cfg, const dlq_options *opts)
{
    const config_consumer *c = find_consumer(cfg, opts->queue);
    if (!c) {
        fprintf(stderr, "idemq dlq: %s\n",
                opts->queue ? "no consumer has that queue in the config"
                            : "the config has several consumers: pass --queue Q");
        return EXIT_USAGE;
    }
    if (opts->action == DLQ_REPLAY && !opts->all && !opts->biz_key) {
        fprintf(stderr, "idemq dlq replay: pass --biz-key K or --all\n");
        return EXIT_USAGE;
    }
    if (opts->action == DLQ_PURGE && !opts->yes) {
        fprintf(stderr, "idemq dlq purge: this deletes every dead letter of %s; pass --yes\n",
                c->queue);
        return EXIT_USAGE;
    }
    char dlq[TOPOLOGY_NAME_MAX], err[1024], reason[512];
    topology_dead_letter_queue(c, dlq, sizeof dlq);
    amqp_connection_state_t conn;
    broker_open_options open_opts = {.url = cfg->amqp_url, .confirms = opts->action == DLQ_REPLAY};
    if (broker_open(&open_opts, &conn, err, sizeof err) != 0) {
        fprintf(stderr, "idemq dlq: %s\n", err);
        return 1;
    }
    if (opts->action == DLQ_PURGE) {
        int rc = purge(conn, dlq, opts);
        broker_close(conn);
        return rc;
    }

    int exit_code = 0;
    size_t seen = 0, replayed = 0, failed = 0;
    uint64_t publish_seq = 0;
    json_t *listing = json_array();
    size_t snapshot = 1; /* messages in the DLQ at the first basic.get-ok */
    while ((!opts->limit || (opts->action == DLQ_LIST ? seen : replayed) < opts->limit) &&
           seen < snapshot) {
        amqp_rpc_reply_t reply = amqp_basic_get(conn, BROKER_CHANNEL, amqp_cstring_bytes(dlq), 0);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            fprintf(stderr, "idemq dlq: reading %s failed: %s\n", dlq,
                    broker_describe_reply(reply, reason, sizeof reason));
            exit_code = 1;
            break;
        }
        if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
            break;
        const amqp_basic_get_ok_t *got = reply.reply.decoded;
        uint64_t tag = got->delivery_tag;
        /* Visit only what was there when we started: a replayed message that fails again is
         * dead-lettered behind us, and chasing it would never end. */
        if (seen == 0)
            snapshot = (size_t)got->message_count + 1;
        amqp_message_t m;
        reply = amqp_read_message(conn, BROKER_CHANNEL, &m, 0);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            fprintf(stderr, "idemq dlq: reading a message failed: %s\n",
                    broker_describe_reply(reply, reason, sizeof reason));
            exit_code = 1;
            break;
        }
        seen++;
        dead_letter d;
        describe(&m, cfg, &d);
        bool selected = opts->action == DLQ_LIST || opts->all ||
                        (opts->biz_key && strcmp(opts->biz_key, d.biz_key) == 0);
        if (selected && opts->action == DLQ_REPLAY) {
            if (replay_one(conn, c, &m, ++publish_seq, err, sizeof err) == 0 &&
                amqp_basic_ack(conn, BROKER_CHANNEL, tag, 0) == AMQP_STATUS_OK) {
                replayed++;
            } else {
                fprintf(stderr, "idemq dlq replay: %s kept in %s: %s\n", d.biz_key, dlq, err);
                failed++;
                exit_code = 1;
            }
        }
        if (selected) {
            if (opts->json)
                json_array_append_new(listing, dead_letter_json(&d));
            else
                print_dead_letter(&d);
        }
        amqp_destroy_message(&m);
        amqp_maybe_release_buffers(conn);
        if (exit_code)
            break;
    }
    if (opts->json) {
        json_t *doc = opts->action == DLQ_LIST
                          ? json_pack("{s:s, s:O}", "queue", dlq, "messages", listing)
                          : json_pack("{s:s, s:I, s:I, s:O}", "queue", dlq, "replayed",
                                      (json_int_t)replayed, "failed", (json_int_t)failed,
                                      "messages", listing);
        json_dumpf(doc, stdout, JSON_INDENT(2));
        putchar('\n');
        json_decref(doc);
    } else if (opts->action == DLQ_REPLAY) {
        printf("replayed %zu message(s) from %s to %s%s\n", replayed, dlq, c->queue,
               failed ? " (some failed, see above)" : "");
    } else {
        printf("%zu message(s) in %s (listed without removing)\n", seen, dlq);
    }
    json_decref(listing);
    /* Closing the channel returns every message we did not ack to the DLQ. */
    broker_close(conn);
    return exit_code;
}
