-- 001_msg_dedup.sql — the deduplication table (seed, section 2).
--
-- idemq inserts (biz_key, handler_name) in the same transaction as the business update; the
-- unique key decides atomically which delivery may apply the message (error 1062 = duplicate).
-- Idempotent: safe to run on every start (`idemq migrate`).
--
-- Changes from the seed's DDL, and why:
--   * biz_key is VARBINARY(128), not VARCHAR(128): the default utf8mb4 collations are case- and
--     accent-insensitive and (like utf8mb4_bin) ignore trailing spaces, so "order:A1:PAY" and
--     "order:a1:PAY" would collide and one business event would be silently dropped as a
--     duplicate. idemq treats biz_key as opaque bytes and limits it to 128 bytes (not
--     characters), which VARBINARY(128) matches exactly on MySQL and MariaDB alike.
--   * handler_name is VARBINARY(64) for the same reason: "Orders" and "orders " are two handlers.
--     Tables made before this change are upgraded by `idemq migrate`
--     (002_handler_name_varbinary.sql holds the same statement, for DBAs who run DDL themselves).
--   * created_at has millisecond precision and an index, so a retention job can delete old rows
--     in created_at order without a table scan.
CREATE TABLE IF NOT EXISTS msg_dedup (
  id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  biz_key      VARBINARY(128) NOT NULL,
  handler_name VARBINARY(64) NOT NULL,
  created_at   DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  UNIQUE KEY uk_biz_handler (biz_key, handler_name),
  KEY idx_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
