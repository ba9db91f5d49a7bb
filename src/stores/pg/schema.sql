-- schema.sql - the PostgreSQL store's tables: leases, fencing marks and
-- guarded values. Made when missing (IF NOT EXISTS); existing tables are
-- used as they are. The store runs it with its table names; a DBA may run
-- it by hand the same way:
--   psql -v lease_table=coordination_lease -v fence_table=lease_fence \
--        -v data_table=lease_data -f schema.sql
-- Variables: :lease_table, :fence_table, :data_table (table names,
-- optionally schema.table).
-- holder_label, lease_ttl_ms and holder_token are optional: a lease table
-- made by the reference SQL without them works, without labels and ttls.
-- waiting_until is optional too: until when a waiter wants to hear of a
-- release (waiters set it, acquire clears it); a release notifies only
-- then. Without it waiters announce themselves by an advisory lock only
-- (src/stores/pg.c, WAIT_CLASS), which releases of older versions do not
-- look at:
--   ALTER TABLE coordination_lease ADD COLUMN waiting_until timestamptz;
-- acquired_at too: when the grant in holder_token began. With it (and the
-- label and ttl) the grant history is written when a grant ends, not when
-- it begins, which costs an acquire and release far less (src/stores/pg.c,
-- DEFERRED; docs/stores.md says what to do before adding it by hand):
--   ALTER TABLE coordination_lease ADD COLUMN acquired_at timestamptz;
CREATE TABLE IF NOT EXISTS :lease_table (
    resource_key text PRIMARY KEY,
    owner_id uuid,
    lease_until timestamptz NOT NULL DEFAULT '-infinity'::timestamptz,
    fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
    holder_label text,
    lease_ttl_ms bigint,
    holder_token bigint,
    waiting_until timestamptz,
    acquired_at timestamptz);
CREATE TABLE IF NOT EXISTS :fence_table (
    resource text PRIMARY KEY,
    mark bigint NOT NULL CHECK (mark >= 0));
CREATE TABLE IF NOT EXISTS :data_table (
    name text PRIMARY KEY,
    value bytea NOT NULL,
    token bigint NOT NULL,
    resource_key text NOT NULL);
