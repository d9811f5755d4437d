/*
 * errors — the one code space for idemq's error codes, like libuv's UV_E*: no two modules return
 * the same number for different things, so a code means one thing wherever it travels.
 *
 * The convention, for every function in adapter/ that can fail:
 *   - It returns int: 0 on success, or a negative code. (A few return a positive value on a
 *     success they need to tell apart, e.g. HTTP_REQUEST_COMPLETE; config_load returns minus the
 *     number of problems, a count and not a code; a function that answers a question returns
 *     bool, a constructor NULL.)
 *   - -1 is the plain failure in every module: it failed and the buffer says why, with nothing
 *     more for the caller to tell apart. broker/ names it BROKER_E_FAILED because its callers do
 *     tell it apart from the other BROKER_E_* codes.
 *   - -ENOMEM (errno's number) is out of memory, in every module that reports it on its own.
 *   - Every other code is named below, in its module's range, far from errno's numbers and from
 *     rabbitmq-c's AMQP_STATUS_* (down to -0x0205): a module that needs one adds it to its range
 *     here and nowhere else. Callers compare codes by name, never by number.
 *   - The text for the operator goes into an optional caller-supplied buffer, named
 *     `char *err, size_t err_len` in prototypes and definitions (struct fields that carry it,
 *     such as handler_call's error, keep their names). The code says what the caller does next;
 *     the buffer says what happened, and it is what logs and replies show. Two other buffers
 *     are not failure text and keep their names: `reason` of a yes/no question (db_health_ok,
 *     outbox_relay_stuck, broker_is_blocked, the /readyz callback: why not; and plugin_handle,
 *     after the plugin ABI's handle()), and `report` of store/schema.h (what it did, or why it
 *     could not).
 *   - apply_status (policy/outcome.h) is not an error code: it is what applying a message found,
 *     and a step that succeeded returns APPLY_OK.
 *
 * Header only; no I/O. Thread affinity: none.
 */
#ifndef IDEMQ_UTIL_ERRORS_H
#define IDEMQ_UTIL_ERRORS_H

enum {
    /* broker/ (connection, session, message, topology, and their callers in outbox/ and cli/):
     * -1 and -1001 .. -1099. */

    /* A network, protocol or resource failure: trying again may help. The plain failure. */
    BROKER_E_FAILED = -1,
    /* The broker refused what the configuration asks (credentials, vhost, topology): a person has
     * to act. */
    BROKER_E_REFUSED = -1001,
    /* The delivery came on a connection that is gone. */
    BROKER_E_STALE = -1002,
    /* broker/session.h: the copy cannot be encoded within the connection's frame_max, even
     * without the producer's headers (message_copy_properties): a per-message failure, the
     * connection is fine. */
    BROKER_E_TOO_LARGE = -1003,
    /* broker/message.h: the copy does not fit a content-header frame even without any producer
     * header (a tiny frame_max, or huge other properties). */
    MESSAGE_E_TOO_LARGE = -1004,
    /* broker/topology.h: 406, an object exists with different arguments. */
    TOPOLOGY_E_MISMATCH = -1005,
    /* broker/topology.h: 404, the passive work queue does not exist. */
    TOPOLOGY_E_MISSING = -1006,

    /* envelope/: -1101 .. -1199. Every decode failure is deterministic (see envelope.h);
     * envelope_error_name gives the stable name of each. */
    ENVELOPE_E_TOO_LARGE = -1101,   /* body larger than limits.max_body */
    ENVELOPE_E_EMPTY = -1102,       /* zero-length body */
    ENVELOPE_E_SYNTAX = -1103,      /* not valid JSON / MessagePack, or trailing bytes */
    ENVELOPE_E_NOT_MAP = -1104,     /* top level is not an object/map */
    ENVELOPE_E_TOO_DEEP = -1105,    /* nesting deeper than limits.max_depth */
    ENVELOPE_E_UNSUPPORTED = -1106, /* msgpack bin/ext, non-string map key, int out of range,
                                       unknown content type */
    ENVELOPE_E_BIZ_KEY_MISSING = -1107,
    ENVELOPE_E_BIZ_KEY_TYPE = -1108, /* biz_key present but not a string */
    ENVELOPE_E_BIZ_KEY_EMPTY = -1109,
    ENVELOPE_E_BIZ_KEY_TOO_LONG = -1110, /* more than ENVELOPE_BIZ_KEY_MAX bytes */
    ENVELOPE_E_BIZ_KEY_UTF8 = -1111,     /* not valid UTF-8, or contains NUL */
    ENVELOPE_E_DUPLICATE_KEY = -1112,    /* the same map key twice: ambiguous, reject */

    /* outbox/: -1201 .. -1299. */

    /* outbox_writer_flush: a row is larger than the server's max_allowed_packet (the message's
     * own fault: dead-letter it, with *error's message as the reason). */
    OUTBOX_E_TOO_LARGE = -1201,

    /* ops/: -1301 .. -1399. */

    /* http_request_feed: the bytes are not a valid request; status and why say how to answer. */
    HTTP_REQUEST_E_INVALID = -1301,

    /* config/: -1401 .. -1499 (inside the loader; what it reports is text). */

    /* config/table.c's integer parser: not an integer. */
    CONFIG_E_NOT_INTEGER = -1401,
    /* config/table.c's integer parser: digits, but too many. */
    CONFIG_E_OUT_OF_RANGE = -1402,
};

#endif
