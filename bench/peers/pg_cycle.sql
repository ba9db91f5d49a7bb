-- One pgbench "transaction" of this script is one lease cycle: the
-- chapter's acquire upsert and its conditional release, each its own
-- autocommit transaction (two commits, two WAL flushes, like a lease
-- cycle). Run with -n -M prepared -D ttl=30s.
--
-- The owner is a random uuid made by the server (pgbench has no uuid
-- function) and read back with the token, so the release passes both
-- as parameters, as a client would. Keys are random in 0..999.
\set k random(0, 999)
\set fencing_token 0
INSERT INTO coordination_lease
  (resource_key, owner_id, lease_until, fencing_token)
VALUES
  (:k, gen_random_uuid(), clock_timestamp() + :ttl::interval, 1)
ON CONFLICT (resource_key) DO UPDATE
SET owner_id = EXCLUDED.owner_id,
    lease_until = clock_timestamp() + :ttl::interval,
    fencing_token = coordination_lease.fencing_token + 1
WHERE coordination_lease.lease_until <= clock_timestamp()
RETURNING fencing_token, lease_until, owner_id
\aset
-- No row: another client holds the key (rare with 1,000 keys); nothing
-- to release. pgbench still counts the run, so such a run counts as a
-- cycle here (under 1 % of them at 8 clients: at most 7 of the 1,000
-- keys are held by others at any moment).
\if :fencing_token > 0
UPDATE coordination_lease
SET owner_id = NULL,
    lease_until = '-infinity'::timestamptz
WHERE resource_key = :k
  AND owner_id = :owner_id
  AND fencing_token = :fencing_token;
\endif
