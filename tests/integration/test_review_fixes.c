/*
 * Regressions for failure modes found in review: a producer's user_id on a message that idemq
 * must copy (the broker checks it against idemq's own login), and a database that answers but
 * is read-only (after a failover) — consumption must stay paused instead of flapping.
 */
#include <amqp.h>
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "broker/connection.h"
#include "harness.h"

/* Rewrites the mysql URL's credentials in the generated config. */
static void use_mysql_login(harness *h, const char *user, const char *password)
{
    FILE *f = fopen(h->config_path, "r");
    cr_assert(f);
    static char text[16384], out[16400];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *url = strstr(text, "mysql://");
    cr_assert(url);
    char *at = strchr(url, '@');
    cr_assert(at);
    snprintf(out, sizeof out, "%.*smysql://%s:%s%s", (int)(url - text), text, user, password, at);
    f = fopen(h->config_path, "w");
    cr_assert(f);
    fputs(out, f);
    fclose(f);
}

static bool dlq_has(harness *h, void *arg)
{
    return harness_queue_depth(h, arg) >= 1;
}

Test(review_fixes, producer_user_id_does_not_break_the_copy, .timeout = 90)
{
    harness h;
    harness_init(&h, "userid", NULL);
    char user[64];
    snprintf(user, sizeof user, "producer_%d", (int)getpid());
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rabbitmqctl add_user %s secret", user);
    harness_services_ok(cmd);
    snprintf(cmd, sizeof cmd, "rabbitmqctl set_permissions -p / %s '.*' '.*' '.*'", user);
    harness_services_ok(cmd);
    harness_declare_topology(&h);

    /* The producer logs in as itself and stamps user_id, as RabbitMQ allows. */
    char url[256];
    const char *base = getenv("IDEMQ_TEST_AMQP_URL");
    const char *host = strchr(base, '@');
    cr_assert(host);
    snprintf(url, sizeof url, "amqp://%s:secret%s", user, host);
    amqp_connection_state_t producer;
    char err[256];
    broker_open_options bo = {.url = url};
    cr_assert(broker_open(&bo, &producer, err, sizeof err) == 0, "%s", err);
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_USER_ID_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG,
        .user_id = amqp_cstring_bytes(user),
        .content_type = amqp_cstring_bytes("application/json")};
    const char body[] = "{\"biz_key\":\"order_id:u1:REFUND_SUCCESS\",\"order_id\":\"u1\","
                        "\"event_type\":\"REFUND_SUCCESS\"}";
    amqp_bytes_t bytes = {.len = sizeof body - 1, .bytes = (void *)body};
    cr_assert(amqp_basic_publish(producer, BROKER_CHANNEL, amqp_empty_bytes,
                                 amqp_cstring_bytes(h.queue), 0, 0, &props,
                                 bytes) == AMQP_STATUS_OK);
    broker_close(producer);
    harness_insert_orders(&h, "u", 2, "PAID"); /* u1 PAID: REFUND_SUCCESS is illegal → DLQ */

    pid_t pid = harness_spawn(&h);
    char dlq[160];
    snprintf(dlq, sizeof dlq, "%s.dlq", h.queue);
    cr_assert(harness_wait_for(dlq_has, &h, dlq, 30000),
              "the dead-letter copy never arrived (log: %s)", h.log_path);
    cr_assert_eq(harness_stop(pid, SIGTERM, 25000), 0);
    cr_expect_eq(harness_log_count(&h, "RabbitMQ connection lost"), 0,
                 "copying the message broke the connection");
    amqp_message_t m;
    cr_assert(harness_get(&h, dlq, &m));
    cr_expect(!(m.properties._flags & AMQP_BASIC_USER_ID_FLAG));
    amqp_bytes_t original = {0};
    const amqp_table_t *t = &m.properties.headers;
    for (int i = 0; i < t->num_entries; i++)
        if (t->entries[i].key.len == strlen("idemq-original-user-id") &&
            memcmp(t->entries[i].key.bytes, "idemq-original-user-id", t->entries[i].key.len) == 0)
            original = t->entries[i].value.value.bytes;
    cr_expect(original.len == strlen(user) && memcmp(original.bytes, user, original.len) == 0,
              "the producer's user_id is not kept in idemq-original-user-id");
    amqp_destroy_message(&m);
    snprintf(cmd, sizeof cmd, "rabbitmqctl delete_user %s", user);
    harness_services_ok(cmd);
    harness_fini(&h);
}

static bool paused(harness *h, void *arg)
{
    (void)arg;
    return harness_log_count(h, "pausing consumption") >= 1;
}

Test(review_fixes, read_only_database_keeps_consumption_paused, .timeout = 120)
{
    harness h;
    harness_init(&h, "readonly", NULL);
    /* read_only binds only accounts without SUPER / READ ONLY ADMIN: use a plain one. */
    char user[64];
    snprintf(user, sizeof user, "app_%d", (int)getpid());
    harness_sql(&h, "CREATE USER '%s'@'%%' IDENTIFIED BY 'pw'", user);
    harness_sql(&h, "GRANT SELECT, INSERT, UPDATE, DELETE ON `%s`.* TO '%s'@'%%'", h.database,
                user);
    use_mysql_login(&h, user, "pw");
    harness_insert_orders(&h, "r", 50, "PAYING");
    harness_declare_topology(&h);

    harness_sql(&h, "SET GLOBAL read_only = 1");
    for (int i = 0; i < 50; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        harness_publish_event(&h, id, "PAY_SUCCESS", i);
    }
    pid_t pid = harness_spawn(&h);
    bool was_paused = harness_wait_for(paused, &h, NULL, 30000);
    /* Stay read-only long enough for several probes (0.5 s, 1 s, 2 s, ...). */
    struct timespec hold = {.tv_sec = 6};
    nanosleep(&hold, NULL);
    long pauses = harness_log_count(&h, "pausing consumption");
    harness_sql(&h, "SET GLOBAL read_only = 0");
    cr_assert(was_paused, "a read-only database did not pause consumption (log: %s)", h.log_path);
    cr_expect_eq(pauses, 1, "consumption paused %ld times in 6 s: the probe resumed on a "
                            "read-only server", pauses);
    cr_assert(harness_wait_scalar(&h, 50, 60000, "SELECT COUNT(*) FROM msg_dedup"));
    cr_assert_eq(harness_stop(pid, SIGTERM, 25000), 0);
    cr_expect_eq(harness_log_count(&h, "\"outcome\":\"dead_lettered\""), 0);
    cr_expect_eq(harness_log_count(&h, "\"outcome\":\"retried\""), 0);
    harness_sql(&h, "DROP USER '%s'@'%%'", user);
    harness_fini(&h);
}
