/*
 * writer — the rows one transaction adds to idemq_outbox (schemas/mysql/003_outbox.sql).
 *
 * A handler that applies a message adds the rows of its emits while it decides (a state-machine
 * transition's `emit:`, a sql handler's `emit:`, a plugin's host->emit), each tagged with the
 * message's index in the batch; the store inserts them in the same transaction, before the
 * COMMIT, for the messages that are applied, and drops the others'. A message that rolls back,
 * retries or is dead-lettered therefore leaves no row, and nothing is published for it. The
 * relay (outbox/relay.h) publishes rows after their COMMIT.
 *
 * The outgoing message: a map of the emit's fields (taken from the incoming message by dotted
 * path, or constants) plus "biz_key", encoded as JSON or MessagePack. Its biz_key, which is also
 * its AMQP message_id, is deterministic: "emit-" followed by the lowercase hex SHA-256 of the
 * incoming biz_key, the handler name and the emit name, each preceded by its length as 8 bytes
 * little-endian (outbox_derive_key). A re-publish of one row, or of the row a redelivered copy of
 * the incoming message writes again, carries the same key, so a downstream idemq (or any consumer
 * keyed on message_id) applies it once.
 *
 * Errors: outbox_writer_add* return 0, -1 for the message's own fault (a field it lacks, a body
 * too large: the caller dead-letters that message with the reason in err), or -ENOMEM;
 * outbox_writer_flush returns 0, -ENOMEM, OUTBOX_E_TOO_LARGE (the text in error->message), or
 * -1 with the MySQL error in *error.
 * Thread affinity: the DB worker that owns the writer (one per store session).
 */
#ifndef IDEMQ_OUTBOX_WRITER_H
#define IDEMQ_OUTBOX_WRITER_H

#include <jansson.h>
#include <mysql.h>
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "db/error.h"
#include "envelope/envelope.h"
#include "util/errors.h"

#define OUTBOX_KEY_PREFIX "emit-"
#define OUTBOX_KEY_LEN (sizeof OUTBOX_KEY_PREFIX - 1 + 64)
/* The largest outgoing body: MEDIUMBLOB holds 16 MiB - 1; idemq's own max_body is far below. */
#define OUTBOX_BODY_MAX ((size_t)16 * 1024 * 1024 - 1)
/* Emit names, exchanges and routing keys are at most this long (the table's columns). */
#define OUTBOX_NAME_MAX 64
#define OUTBOX_EXCHANGE_MAX 255
#define OUTBOX_ROUTING_KEY_MAX 255

/* Content types of the two formats. */
#define OUTBOX_CONTENT_TYPE_JSON "application/json"
#define OUTBOX_CONTENT_TYPE_MSGPACK "application/msgpack"

typedef struct outbox_writer outbox_writer;

/* The outgoing biz_key of emit_name for source_biz_key under handler_name (all borrowed), into
 * out (OUTBOX_KEY_LEN + 1 bytes, NUL-terminated). */
void outbox_derive_key(const char *source_biz_key, const char *handler_name, const char *emit_name,
                       char *out);

/* An empty writer, owned by the caller, or NULL when out of memory. */
outbox_writer *outbox_writer_new(void);

/* Closes the statement prepared on the connection (before it closes). */
void outbox_writer_disconnect(outbox_writer *w);

/* Prepares the one-row INSERT afresh on db (closing what w had prepared), running nothing: the
 * outage probe's proof that idemq_outbox has every column this idemq writes. 0, -ENOMEM, or -1
 * with the server's error in *error (and what fixes it: `idemq migrate`). */
int outbox_writer_prepare(outbox_writer *w, MYSQL *db, db_error *error);

/* Frees w; NULL is a no-op. */
void outbox_writer_free(outbox_writer *w);

/*
 * Adds the row of emit e (borrowed) for the message env (borrowed) of consumer c (borrowed),
 * tagged item. -1 when env lacks one of e's fields, or the body would exceed OUTBOX_BODY_MAX:
 * err says which, as "emit NAME: ...".
 */
int outbox_writer_add(outbox_writer *w, size_t item, const config_consumer *c, const config_emit *e,
                      const envelope *env, char *err, size_t err_len);

/*
 * The plugin's emit: a row named name to exchange/routing_key (borrowed, checked here: -1 with
 * err for an empty or overlong name, an overlong exchange or routing key) whose body is the map
 * fields (borrowed, a JSON object; its "biz_key", if any, is replaced) in format.
 */
/* (A second row of one name for one item is refused too: one name, one outgoing biz_key.) */
int outbox_writer_add_fields(outbox_writer *w, size_t item, const config_consumer *c,
                             const envelope *env, const char *name, const char *exchange,
                             const char *routing_key, config_emit_format format,
                             const json_t *fields, char *err, size_t err_len);

/* Rows added since the last flush or clear. */
size_t outbox_writer_pending(const outbox_writer *w);

/* Drops the rows tagged item (the message failed). */
void outbox_writer_drop_item(outbox_writer *w, size_t item);

/*
 * Inserts every added row on db, inside its open transaction, then forgets them (the buffers are
 * kept for the next transaction). *inserted (may be NULL) gets the number of rows inserted. On
 * failure the rows are forgotten too: the caller rolls back.
 */
int outbox_writer_flush(outbox_writer *w, MYSQL *db, size_t *inserted, db_error *error);

/* Forgets every added row (the transaction rolled back). */
void outbox_writer_clear(outbox_writer *w);

#endif
