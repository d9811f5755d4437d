-- 003_outbox.sql — the transactional outbox: downstream messages written in the transaction that
-- applies the incoming one, and published by idemq's relay after the COMMIT.
-- Idempotent: safe to run on every start (`idemq migrate` runs both statements).
--
-- Why each part:
--   * One row per emitted message, inserted by the handler's transaction (state machine
--     transition or sql `emit:`, or a plugin's host->emit): a rolled-back message leaves no row,
--     so nothing is published for it.
--   * biz_key is the outgoing message's deterministic key (and its AMQP message_id), derived from
--     source_biz_key, handler_name and emit_name: a row published twice (a relay that died
--     between the broker's confirm and marking the row) is deduplicated by a downstream idemq.
--     It is not unique here: dedup retention may let a message apply twice, and its second
--     emit must not fail the transaction.
--   * state: 0 pending, 1 published (confirmed by the broker), 2 unroutable (returned by a
--     mandatory publish, or its exchange does not exist): kept for `idemq outbox list|retry`.
--     (state, id) is the relay's scan in commit-compatible order; published_at drives retention.
--   * VARBINARY for keys and names, as in msg_dedup: opaque bytes, compared byte for byte.
--   * traceparent, tracestate: the W3C trace context headers of the outgoing message (a child
--     of idemq's span for the incoming one), NULL when the incoming message had no valid one.
--     Tables created before them get them from 004_outbox_trace_context.sql.
CREATE TABLE IF NOT EXISTS idemq_outbox (
  id             BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
  source_biz_key VARBINARY(128) NOT NULL,
  handler_name   VARBINARY(64)  NOT NULL,
  emit_name      VARBINARY(64)  NOT NULL,
  biz_key        VARBINARY(128) NOT NULL,
  exchange       VARBINARY(255) NOT NULL,
  routing_key    VARBINARY(255) NOT NULL,
  content_type   VARBINARY(64)  NOT NULL,
  body           MEDIUMBLOB     NOT NULL,
  state          TINYINT        NOT NULL DEFAULT 0,
  attempts       INT UNSIGNED   NOT NULL DEFAULT 0,
  created_at     DATETIME(3)    NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  published_at   DATETIME(3)    NULL,
  last_error     VARCHAR(512)   NULL,
  traceparent    VARBINARY(55)  NULL,
  tracestate     VARBINARY(512) NULL,
  KEY idx_outbox_state_id (state, id),
  KEY idx_outbox_published_at (published_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- One row per relay group ('default'): the instance whose lease is current publishes; the
-- others stand by and take over when it lapses (outbox.lease). Times are the server's clock.
CREATE TABLE IF NOT EXISTS idemq_outbox_lease (
  name       VARBINARY(64)  NOT NULL PRIMARY KEY,
  owner      VARBINARY(128) NOT NULL,
  expires_at DATETIME(6)    NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
