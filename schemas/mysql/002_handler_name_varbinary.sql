-- 002_handler_name_varbinary.sql — upgrade for msg_dedup tables created before handler_name
-- became VARBINARY(64) (001_msg_dedup.sql). `idemq migrate` runs it when it finds the old column.
--
-- Why: as VARCHAR utf8mb4, handler names compared case-insensitively and without trailing
-- spaces, so the handlers "Orders" and "orders " shared one dedup namespace and one of them would
-- drop the other's events as duplicates. In place and safe: names equal byte for byte were equal
-- under the collation too, so the unique key gains no conflict.
ALTER TABLE msg_dedup MODIFY handler_name VARBINARY(64) NOT NULL;
