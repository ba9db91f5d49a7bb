#!/usr/bin/env bash
# with-eager-table.sh PROGRAM: PROGRAM (a store-agnostic suite) against the
# shared server ($LEASE_TEST_PG_URL), on a lease table made as versions
# before acquired_at made it, so that the store keeps its history eagerly
# (an entry written when a grant begins, ended when it ends: the statements
# of src/stores/pg/pg.c's sql_acquire_history), as it does for every table
# made before this version. Its history table is <lease_table>_history.
set -eu
PROGRAM=${1:?usage: with-eager-table.sh PROGRAM}
URL=${LEASE_TEST_PG_URL:-}
[ -n "$URL" ] || { echo "LEASE_TEST_PG_URL is not set: scripts/test.sh starts a PostgreSQL server and exports it" >&2; exit 1; }
psql "$URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE TABLE IF NOT EXISTS conf_eager_lease (
    resource_key text PRIMARY KEY, owner_id uuid,
    lease_until timestamptz NOT NULL DEFAULT '-infinity'::timestamptz,
    fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
    holder_label text, lease_ttl_ms bigint, holder_token bigint,
    waiting_until timestamptz)"
case $URL in *\?*) sep='&' ;; *) sep='?' ;; esac
exec "$PROGRAM" "$URL${sep}lease_table=conf_eager_lease"
