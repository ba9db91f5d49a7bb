-- fence.sql - the fencing check inside a PostgreSQL resource.
--
-- Run it in the database that holds the protected data (any database, not
-- only the lease store's), as the owner of the schema it should live in:
--
--     psql "$APP_DATABASE_URL" -v ON_ERROR_STOP=1 -f /usr/share/lease/fence.sql
--
-- It may be run again: every statement is CREATE ... IF NOT EXISTS or
-- CREATE OR REPLACE, in one transaction. The objects go into the first
-- schema of the session's search_path (current_schema()), and the function
-- runs with that schema alone, then pg_temp: neither a caller's
-- search_path nor a temporary table named lease_fence (pg_temp comes
-- first unless named) can stand in for its table. Call it qualified,
-- SCHEMA.lease_fence_check(...), when other roles may create functions in
-- a schema on your search_path.
--
-- Use: the first statement of the application's own write transaction,
--
--     BEGIN;
--     SELECT lease_fence_check('orders/eu', $token);
--     UPDATE orders SET ... WHERE ...;
--     COMMIT;
--
-- The check locks the resource's mark row until the transaction ends, so
-- the check and the write commit together, a transaction that rolls back
-- leaves the mark where it was, and a holder with an older token waits for
-- the newer one's transaction and is then refused. Under REPEATABLE READ or
-- SERIALIZABLE the waiting transaction is refused with a serialization
-- failure (SQLSTATE 40001) instead of LF001: either way it does not commit.
--
-- Errors:
--   LF001  stale fencing token: token < the resource's mark (DETAIL says both)
--   LF002  bad argument: NULL, token <= 0, resource empty or over 1024 bytes

BEGIN;

-- One row per protected resource: the greatest token it has accepted.
CREATE TABLE IF NOT EXISTS lease_fence (
    resource   text PRIMARY KEY,
    mark       bigint NOT NULL CHECK (mark > 0),
    updated_at timestamptz
);

CREATE OR REPLACE FUNCTION lease_fence_check(resource text, token bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
-- Not STRICT: a NULL argument must raise LF002, not return NULL (a caller
-- testing nothing would write unfenced).
CALLED ON NULL INPUT
AS $fn$
#variable_conflict use_column
DECLARE
    accepted bigint;
    current_mark bigint;
BEGIN
    IF lease_fence_check.resource IS NULL OR lease_fence_check.token IS NULL THEN
        RAISE EXCEPTION 'lease_fence_check: resource and token must not be NULL'
            USING ERRCODE = 'LF002';
    END IF;
    IF lease_fence_check.token <= 0 THEN
        RAISE EXCEPTION 'lease_fence_check: token must be a positive integer'
            USING ERRCODE = 'LF002',
                  DETAIL = format('token %s', lease_fence_check.token);
    END IF;
    IF lease_fence_check.resource = ''
       OR octet_length(lease_fence_check.resource) > 1024 THEN
        RAISE EXCEPTION 'lease_fence_check: resource must be 1 to 1024 bytes long'
            USING ERRCODE = 'LF002',
                  DETAIL = format('%s bytes', octet_length(lease_fence_check.resource));
    END IF;

    -- One statement inserts the first mark or raises an older one, and in
    -- either case (even when the WHERE leaves the row as it is) locks the
    -- row until the transaction ends: a concurrent check of the same
    -- resource waits here, then sees what this transaction committed.
    INSERT INTO lease_fence AS f (resource, mark, updated_at)
    VALUES (lease_fence_check.resource, lease_fence_check.token, now())
    ON CONFLICT (resource) DO UPDATE
        SET mark = EXCLUDED.mark, updated_at = EXCLUDED.updated_at
        WHERE f.mark <= EXCLUDED.mark
    RETURNING f.mark INTO accepted;
    IF FOUND THEN
        RETURN accepted;
    END IF;

    -- The row is locked by the statement above: its mark cannot move now.
    SELECT f.mark INTO current_mark FROM lease_fence AS f
        WHERE f.resource = lease_fence_check.resource;
    RAISE EXCEPTION 'stale fencing token'
        USING ERRCODE = 'LF001',
              DETAIL = format('token %s < mark %s', lease_fence_check.token, current_mark),
              HINT = 'a newer lease holder has written to this resource; roll back';
END
$fn$;

-- The schema the table was created in, then pg_temp (named, so that it is
-- searched last): the function's table is always this one.
DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION %I.lease_fence_check(text, bigint) '
                   'SET search_path = %I, pg_temp', current_schema(), current_schema());
END
$pin$;

COMMIT;
