/*
 * plugin_host — the host side of include/idemq/plugin.h: the idemq_host_v1 table every plugin
 * gets, and the message and transaction it gets them for.
 *
 * field() hands out the decoded message read-only (jansson stays inside idemq: values become
 * idemq_value); exec() runs the plugin's SQL inside idemq's open transaction, under the
 * transaction rule: a statement that would end the transaction is refused before it runs
 * (sql_keeps_transaction), and once an error has ended it (a deadlock, a lost connection) every
 * further exec() is refused. Parameters are bound as typed values (db/bind.h); statements come
 * from the worker's cache (plugin_statements.h). classify() and log() lend idemq's error classes
 * and JSON log.
 * Errors: the host functions follow the plugin ABI (0 or -1, the MySQL error in
 * idemq_exec_result). Thread affinity: the table is immutable; its functions run on the DB
 * worker that received msg and tx.
 */
#ifndef IDEMQ_HANDLERS_PLUGIN_HOST_H
#define IDEMQ_HANDLERS_PLUGIN_HOST_H

#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "envelope/envelope.h"
#include "handlers/plugin_statements.h"
#include "idemq/plugin.h"

struct outbox_writer;

/* The message as plugins see it, filled by the caller for one handle() call. Strings handed out
 * for maps and arrays live in texts until plugin_host_message_close. */
struct idemq_message {
    const envelope *env;              /* borrowed */
    const void *body;                 /* borrowed; may be NULL */
    size_t body_len;
    const config_consumer *consumer;  /* borrowed */
    char **texts;                     /* owned, filled by field() */
    size_t text_count, text_cap;
    bool out_of_memory;               /* field() could not allocate a map's or array's text */
};

/* idemq's open transaction as plugins see it, for one handle() call. */
struct idemq_tx {
    MYSQL *db;                        /* borrowed; the transaction is open */
    plugin_statements *statements;    /* borrowed: this worker's cache */
    unsigned int fatal_errno;         /* an error that ended the transaction; exec refuses to go on */
    unsigned int last_errno;          /* the last failed exec, reported with a non-OK result */
    struct outbox_writer *outbox;     /* borrowed: where emit() adds rows */
    size_t outbox_item;               /* their tag (handlers/handler.h) */
};

/* The functions idemq provides to plugins (passed to init and handle). */
extern const idemq_host_v1 plugin_host_table;

/* Frees what field() handed out for msg (borrowed; its storage stays the caller's). */
void plugin_host_message_close(idemq_message *msg);

#endif
