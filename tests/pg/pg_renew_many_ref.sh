#!/usr/bin/env bash
# pg_renew_many_ref.sh STORE_RENEW_MANY - renew_many on a lease table made
# by the reference DDL alone (no holder_label, no lease_ttl_ms: the
# statement's other variant), with the program of tests/sqlite.
#
# Needs LEASE_TEST_PG_URL and psql; the table (and the history table the
# store adds next to it) is dropped on exit.
set -u
PROG=$1
PGURL=${LEASE_TEST_PG_URL:-}
if [ -z "$PGURL" ]; then
    echo "FATAL: LEASE_TEST_PG_URL is not set: scripts/test.sh starts a PostgreSQL server and exports it" >&2
    exit 1
fi
command -v psql >/dev/null 2>&1 || { echo "FATAL: psql is required" >&2; exit 1; }
case $PGURL in *\?*) SEP='&' ;; *) SEP='?' ;; esac
# psql takes the URL without the store's own parameters.
PLAIN=$(printf '%s' "$PGURL" | sed -E 's/[?&]tokens=[a-z]+//')
TABLE="rmref_$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"

sql() { psql "$PLAIN" -X -q -At -v ON_ERROR_STOP=1 -c "$1"; }
cleanup() { sql "DROP TABLE IF EXISTS ${TABLE}_history, $TABLE" >/dev/null 2>&1; }
trap cleanup EXIT

sql "CREATE TABLE $TABLE (
resource_key text PRIMARY KEY,
owner_id uuid,
lease_until timestamptz NOT NULL DEFAULT '-infinity'::timestamptz,
fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0)
);" || { echo "FATAL: cannot create $TABLE" >&2; exit 1; }
"$PROG" "$PGURL${SEP}lease_table=$TABLE" || exit 1
# Still the reference columns only: the store added none.
cols=$(sql "SELECT count(*) FROM information_schema.columns WHERE table_name = '$TABLE'")
[ "$cols" = 4 ] || { echo "FAIL: $TABLE has $cols columns, expected 4" >&2; exit 1; }
echo "renew_many on a reference table: ok"
