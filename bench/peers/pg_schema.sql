-- The chapter's reference table (docs: the spec chapter, section 4),
-- which bench/peers/pg_cycle.sql acquires and releases rows of.
CREATE TABLE IF NOT EXISTS coordination_lease (
  resource_key text PRIMARY KEY,
  owner_id uuid,
  lease_until timestamptz NOT NULL DEFAULT '-infinity'::timestamptz,
  fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0)
);
