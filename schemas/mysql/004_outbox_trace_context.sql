-- 004_outbox_trace_context.sql — upgrade for idemq_outbox tables created before the trace context
-- columns (003_outbox.sql has them). `idemq migrate` runs it when it finds them missing; `idemq
-- check` fails until then, and `idemq run` pauses consumption at the first emit with the same
-- advice.
--
-- Why: an emitted message carries the W3C trace context of the message that caused it
-- (traceparent: same trace id, idemq's span as parent; tracestate unchanged), and the relay
-- publishes rows after the COMMIT, so the headers must be stored with the row. Nullable: a row of
-- a message without a valid traceparent has none, and rows written before the upgrade stay
-- valid. Adding nullable columns at the end is an in-place (INSTANT) change on MySQL 8.0+ and
-- MariaDB 10.3+: no table copy, whatever the outbox holds.
ALTER TABLE idemq_outbox ADD COLUMN traceparent VARBINARY(55) NULL,
  ADD COLUMN tracestate VARBINARY(512) NULL;
