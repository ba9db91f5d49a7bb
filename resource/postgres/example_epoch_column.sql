-- example_epoch_column.sql - fencing without the kit's table (fence.sql's
-- lease_fence_mark): a table that carries its own epoch column.
--
-- When every protected write touches one row, the row itself can keep the
-- high-water mark: the write and the check are then one statement, and no
-- extra table or lock is needed. The epoch is the fencing token of the
-- lease holder that last wrote the row.
--
--     psql "$APP_DATABASE_URL" -v ON_ERROR_STOP=1 -f example_epoch_column.sql
--
-- runs the example on a temporary table (nothing is left behind).

CREATE TEMP TABLE account (
    id      bigint PRIMARY KEY,
    balance bigint NOT NULL,
    epoch   bigint NOT NULL DEFAULT 1 CHECK (epoch > 0)
);
INSERT INTO account (id, balance) VALUES (1, 100);

-- The write of a lease holder: $1 the row, $2 the new balance, $3 the
-- holder's fencing token. Equal epochs are accepted (several writes of one
-- lease generation). RETURNING tells the application whether it happened:
-- no row back means the row is missing or a newer holder has written it,
-- and the application must treat its lease as lost.
PREPARE fenced_write(bigint, bigint, bigint) AS
    UPDATE account SET balance = $2, epoch = $3
    WHERE id = $1 AND epoch <= $3
    RETURNING id, balance, epoch;

-- Holder B (token 42) writes: one row back.
EXECUTE fenced_write(1, 150, 42);
-- Holder A wakes up with its old token 41: no row back, nothing changed.
EXECUTE fenced_write(1, 90, 41);
-- B writes again with the same token: accepted.
EXECUTE fenced_write(1, 160, 42);

SELECT id, balance, epoch FROM account;

DEALLOCATE fenced_write;
DROP TABLE account;
