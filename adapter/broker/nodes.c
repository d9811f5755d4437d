/*
 * nodes — see nodes.h. Thread affinity: the thread that owns the connection.
 */
#include "broker/nodes.h"

#include <stdio.h>
#include <string.h>

void broker_nodes_init(broker_nodes *n, char *const *urls, size_t count, rng *random)
{
    memset(n, 0, sizeof *n);
    n->urls = urls;
    n->count = count < 1 ? 1 : count > CONFIG_MAX_AMQP_URLS ? CONFIG_MAX_AMQP_URLS : count;
    for (size_t i = 0; i < n->count; i++)
        n->order[i] = i;
    /* Fisher-Yates; the modulo bias of 64 random bits over at most 16 slots is negligible. */
    for (size_t i = n->count - 1; i > 0; i--) {
        size_t j = (size_t)(rng_next(random) % (i + 1));
        size_t t = n->order[i];
        n->order[i] = n->order[j];
        n->order[j] = t;
    }
    n->last = n->order[0];
}

void broker_nodes_new_round(broker_nodes *n)
{
    n->tried = 0;
}

const char *broker_nodes_next(broker_nodes *n)
{
    if (n->tried >= n->count)
        return NULL;
    n->last = n->order[n->next];
    n->next = (n->next + 1) % n->count;
    n->tried++;
    return n->urls[n->last];
}

bool broker_nodes_round_over(const broker_nodes *n)
{
    return n->tried >= n->count;
}

size_t broker_nodes_last(const broker_nodes *n)
{
    return n->last;
}

int broker_open_first(char *const *urls, size_t count, const broker_open_options *opts,
                      amqp_connection_state_t *out, size_t *index, char *err, size_t err_len)
{
    char reason[1024], shown[512], failed[2048] = "";
    size_t used = 0;
    int rc = BROKER_E_FAILED;

    for (size_t i = 0; i < count; i++) {
        broker_open_options one = *opts;
        one.url = urls[i];
        rc = broker_open(&one, out, reason, sizeof reason);
        if (rc == 0) {
            if (index)
                *index = i;
            snprintf(err, err_len, "%s", failed);
            return 0;
        }
        if (count == 1)
            break;
        config_redact_url(urls[i], shown, sizeof shown);
        if (used < sizeof failed) {
            int w = snprintf(failed + used, sizeof failed - used, "%snode %s: %s", used ? "; " : "",
                             shown, reason);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    if (count == 1)
        snprintf(err, err_len, "%s", reason);
    else
        snprintf(err, err_len, "no RabbitMQ node answered (%zu tried): %s", count, failed);
    return rc;
}
