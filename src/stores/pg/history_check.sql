-- history_check.sql - is the history table, made by us or someone else,
-- one the statements can use?
-- $1: the history table's quoted name.
-- Answers one row:
--   the columns the statements use, and the primary key
--     (resource_key, fencing_token) (a unique index on exactly those two);
--   this role may select, insert, update and delete in it.
SELECT (SELECT count(*) FROM pg_attribute
        WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
        AND attname IN ('resource_key', 'fencing_token', 'owner_id',
        'holder_label', 'lease_ttl_ms', 'acquired_at', 'ended',
        'ended_at')) = 8
    AND EXISTS (SELECT 1 FROM pg_index i
        WHERE i.indrelid = $1::regclass AND i.indisunique
        AND i.indnatts = 2 AND i.indpred IS NULL AND i.indexprs IS NULL
        AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
            FROM pg_attribute a WHERE a.attrelid = i.indrelid
            AND a.attnum = ANY (i.indkey)) =
        ARRAY['fencing_token', 'resource_key']),
    has_table_privilege($1, 'SELECT')
    AND has_table_privilege($1, 'INSERT')
    AND has_table_privilege($1, 'UPDATE')
    AND has_table_privilege($1, 'DELETE')
