-- lease_columns.sql - which optional columns the lease table has: a label
-- and a ttl, each usable only with holder_token (which grant they describe),
-- waiting_until (waiters announced: a release notifies only then), and
-- acquired_at (when the grant in holder_token began: the history can then
-- be written when grants end, src/stores/pg.c DEFERRED).
-- $1: the lease table's quoted name.
-- Answers one row: has_label, has_ttl, has_waiting, has_acquired.
SELECT coalesce(bool_or(attname = 'holder_label'), false)
    AND coalesce(bool_or(attname = 'holder_token'), false),
    coalesce(bool_or(attname = 'lease_ttl_ms'), false)
    AND coalesce(bool_or(attname = 'holder_token'), false),
    coalesce(bool_or(attname = 'waiting_until'
        AND atttypid = 'timestamptz'::regtype), false),
    coalesce(bool_or(attname = 'acquired_at'
        AND atttypid = 'timestamptz'::regtype), false)
    AND coalesce(bool_or(attname = 'holder_token'), false)
FROM pg_attribute WHERE attrelid = $1::regclass
    AND NOT attisdropped
