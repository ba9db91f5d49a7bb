-- lease_columns.sql - which optional columns the lease table has: a label
-- and a ttl, each usable only with holder_token (which grant they describe),
-- and waiting_until (waiters announced: a release notifies only then).
-- $1: the lease table's quoted name.
-- Answers one row: has_label, has_ttl, has_waiting.
SELECT coalesce(bool_or(attname = 'holder_label'), false)
    AND coalesce(bool_or(attname = 'holder_token'), false),
    coalesce(bool_or(attname = 'lease_ttl_ms'), false)
    AND coalesce(bool_or(attname = 'holder_token'), false),
    coalesce(bool_or(attname = 'waiting_until'
        AND atttypid = 'timestamptz'::regtype), false)
FROM pg_attribute WHERE attrelid = $1::regclass
    AND NOT attisdropped
