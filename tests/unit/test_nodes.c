/*
 * Unit tests for adapter/broker/nodes: the shuffled order of the broker nodes, rounds that hand
 * out every node once, failover starting after the lost node, and the one-shot commands' "first
 * node that answers" (against closed loopback ports: no server needed).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "broker/nodes.h"

/* The config holds char * (owned strings): so do these. */
static char node_a[] = "amqp://a", node_b[] = "amqp://b", node_c[] = "amqp://c";
static char *three[] = {node_a, node_b, node_c, NULL};

static size_t index_of(const char *url)
{
    for (size_t i = 0; three[i]; i++)
        if (url == three[i])
            return i;
    cr_assert_fail("%s is not one of the nodes", url);
    return 0;
}

/* Hands out one round into seen[] (indexes); returns how many came. */
static size_t one_round(broker_nodes *n, size_t seen[CONFIG_MAX_AMQP_URLS])
{
    size_t got = 0;
    const char *url;
    broker_nodes_new_round(n);
    while ((url = broker_nodes_next(n)) != NULL) {
        cr_assert(got < CONFIG_MAX_AMQP_URLS);
        seen[got++] = index_of(url);
        cr_assert_eq(broker_nodes_last(n), seen[got - 1]);
    }
    cr_assert(broker_nodes_round_over(n));
    return got;
}

Test(nodes, a_single_url_is_every_round)
{
    rng g;
    rng_init_seeded(&g, 7);
    broker_nodes n;
    broker_nodes_init(&n, three, 1, &g);
    for (int round = 0; round < 3; round++) {
        size_t seen[CONFIG_MAX_AMQP_URLS];
        cr_assert_eq(one_round(&n, seen), 1);
        cr_assert_eq(seen[0], 0);
    }
}

/* Every round is the same cycle: each node once, the one after the last handed out first. */
Test(nodes, each_round_hands_out_every_node_once)
{
    for (uint64_t seed = 1; seed <= 50; seed++) {
        rng g;
        rng_init_seeded(&g, seed);
        broker_nodes n;
        broker_nodes_init(&n, three, 3, &g);
        size_t first[CONFIG_MAX_AMQP_URLS], again[CONFIG_MAX_AMQP_URLS];
        cr_assert_eq(one_round(&n, first), 3);
        bool hit[3] = {false};
        for (size_t i = 0; i < 3; i++)
            hit[first[i]] = true;
        cr_assert(hit[0] && hit[1] && hit[2], "seed %llu: a node was left out",
                  (unsigned long long)seed);
        cr_assert_eq(one_round(&n, again), 3);
        cr_assert_arr_eq(first, again, 3 * sizeof first[0], "seed %llu: the order changed",
                         (unsigned long long)seed);
    }
}

/* Connected to the second node of the order; the connection is lost: the next round tries the
 * two others first and the lost node last. */
Test(nodes, failover_starts_after_the_lost_node_and_tries_it_last)
{
    rng g;
    rng_init_seeded(&g, 42);
    broker_nodes n;
    broker_nodes_init(&n, three, 3, &g);
    size_t order[CONFIG_MAX_AMQP_URLS];
    cr_assert_eq(one_round(&n, order), 3);

    broker_nodes_new_round(&n);
    broker_nodes_next(&n);
    const char *connected = broker_nodes_next(&n); /* the first did not answer, this one did */
    cr_assert_eq(index_of(connected), order[1]);

    size_t after[CONFIG_MAX_AMQP_URLS];
    cr_assert_eq(one_round(&n, after), 3);
    cr_assert_eq(after[0], order[2]);
    cr_assert_eq(after[1], order[0]);
    cr_assert_eq(after[2], order[1], "the lost node must come last");
}

/* Processes (seeds) start on different nodes, roughly evenly: replicas spread over a cluster. */
Test(nodes, the_first_node_spreads_over_processes)
{
    size_t firsts[3] = {0};
    const int processes = 3000;
    for (int p = 0; p < processes; p++) {
        rng g;
        rng_init(&g, (uint64_t)p); /* as the daemon seeds it: clock, pid and a salt */
        broker_nodes n;
        broker_nodes_init(&n, three, 3, &g);
        firsts[index_of(broker_nodes_next(&n))]++;
    }
    for (int i = 0; i < 3; i++)
        cr_expect(firsts[i] > processes / 3 - 200 && firsts[i] < processes / 3 + 200,
                  "node %d came first %zu times of %d", i, firsts[i], processes);
}

/* Nothing listens on loopback port 1: each node is refused at once. */
Test(nodes, open_first_names_every_node_it_tried_without_passwords)
{
    char first[] = "amqp://u:hunter2@127.0.0.1:1/vh", second[] = "amqp://u:hunter2@127.0.0.1:2/vh";
    char *urls[] = {first, second};
    broker_open_options opts = {0};
    amqp_connection_state_t conn = NULL;
    size_t index = 99;
    char err[2048];
    int rc = broker_open_first(urls, 2, &opts, &conn, &index, err, sizeof err);
    cr_assert_eq(rc, BROKER_E_FAILED, "rc %d: %s", rc, err);
    cr_assert_null(conn);
    cr_assert_eq(index, 99);
    cr_assert(
        strstr(err, "no RabbitMQ node answered (2 tried): node amqp://u:***@127.0.0.1:1/vh: "),
        "%s", err);
    cr_assert(strstr(err, "; node amqp://u:***@127.0.0.1:2/vh: "), "%s", err);
    cr_assert_null(strstr(err, "hunter2"), "password leaked: %s", err);

    /* One URL: broker_open's own message. */
    rc = broker_open_first(urls, 1, &opts, &conn, &index, err, sizeof err);
    cr_assert_eq(rc, BROKER_E_FAILED);
    cr_assert(strstr(err, "cannot connect to RabbitMQ at 127.0.0.1:1"), "%s", err);
    cr_assert_null(strstr(err, "no RabbitMQ node answered"), "%s", err);
}
