-- lease_columns.sql - which optional columns the lease table has: a label
-- and a ttl, each usable only with holder_token (which grant they describe).
-- $1: the lease table's quoted name.
-- Answers one row: has_label, has_ttl.
SELECT coalesce(bool_or(attname = 'holder_label'), false)
    AND coalesce(bool_or(attname = 'holder_token'), false),
    coalesce(bool_or(attname = 'lease_ttl_ms'), false)
    AND coalesce(bool_or(attname = 'holder_token'), false)
FROM pg_attribute WHERE attrelid = $1::regclass
    AND NOT attisdropped
