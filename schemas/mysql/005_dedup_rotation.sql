-- 005_dedup_rotation.sql — the rotating layout of the dedup window (dedup.layout: rotating).
--
-- msg_dedup takes every new dedup row; msg_dedup_previous holds the period before and is only
-- read. Every dedup.retention one idemq instance rotates them: msg_dedup_previous is dropped
-- whole, msg_dedup becomes msg_dedup_previous and an empty copy becomes msg_dedup, in one
-- RENAME TABLE. idemq_dedup_rotation records when msg_dedup became current, so only one instance
-- rotates per period. Why, and why a duplicate is still caught in the same transaction as the
-- effect: adapter/store/rotation.h.
--
-- `idemq migrate` with dedup.layout: rotating runs these and records the time (in place: no rows
-- are copied, the existing ones stay in msg_dedup and expire two rotations later).
CREATE TABLE IF NOT EXISTS msg_dedup_previous LIKE msg_dedup;
CREATE TABLE IF NOT EXISTS idemq_dedup_rotation (
  table_name VARBINARY(64) NOT NULL PRIMARY KEY,
  rotated_at DATETIME(3)   NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT IGNORE INTO idemq_dedup_rotation (table_name, rotated_at) VALUES ('msg_dedup', NOW(3));
