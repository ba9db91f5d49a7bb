-- history.sql - the grant history (lease/history.h): one row per grant,
-- ended NULL while it is held. Optional: the store makes it when missing
-- and goes on without a history when it may not. By hand:
--   psql -v history_table=lease_history -f history.sql
-- Variable: :history_table (a table name, optionally schema.table).
CREATE TABLE IF NOT EXISTS :history_table (
    resource_key text NOT NULL,
    fencing_token bigint NOT NULL,
    owner_id uuid NOT NULL,
    holder_label text,
    lease_ttl_ms bigint NOT NULL,
    acquired_at timestamptz NOT NULL,
    ended text CHECK (ended IN ('released', 'expired', 'lost')),
    ended_at timestamptz,
    PRIMARY KEY (resource_key, fencing_token))
