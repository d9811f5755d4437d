-- example_orders.sql — the demo business table: the seed's order whose status a payment
-- callback moves along PAYING → PAID → REFUNDING → REFUNDED (state_machine handler).
-- Not part of idemq itself; idempotent so a demo or a test can run it every time.
CREATE TABLE IF NOT EXISTS orders (
  order_id   VARCHAR(64) NOT NULL PRIMARY KEY,
  status     VARCHAR(32) NOT NULL,
  amount     BIGINT      NULL COMMENT 'minor units (cents / fen)',
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The seed's order, waiting for its payment callback:
--   INSERT INTO orders (order_id, status, amount) VALUES ('20250101_0001', 'PAYING', 10000);
