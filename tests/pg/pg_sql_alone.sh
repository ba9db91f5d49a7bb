#!/usr/bin/env bash
# pg_sql_alone.sh LEASE_BINARY SQL_DIR - the store's schema files run alone.
#
# src/stores/pg/schema.sql and history.sql are what the store runs to make
# its tables, written with psql variables so that a DBA can run them by
# hand. This runs them with psql -v ... -f into a fresh schema of the
# shared test server (LEASE_TEST_PG_URL; fails without it), checks the
# tables are there, and that `lease` uses them as they are: its grants
# land in those tables, its history in that history table (written when
# a grant ends: the lease table has acquired_at).
. "$(dirname "$0")/../cli/lib.sh" "$@"

SQL_DIR=${2:?usage: $0 LEASE_BINARY SQL_DIR}
PGURL=${LEASE_TEST_PG_URL:-}
if [ -z "$PGURL" ]; then
    echo "FATAL: LEASE_TEST_PG_URL is not set: scripts/test.sh starts a PostgreSQL server and exports it" >&2
    exit 1
fi
command -v psql >/dev/null 2>&1 || { echo "FATAL: psql is required" >&2; exit 1; }

S="sql_alone_$$_$RANDOM"
sql() {
    psql "$PGURL" -X -q -At -v ON_ERROR_STOP=1 "$@" 2>"$T/psql.err" || {
        fail "psql failed: $(cat "$T/psql.err")"
        return 1
    }
}
drop_schema() { psql "$PGURL" -X -q -c "DROP SCHEMA IF EXISTS $S CASCADE" >/dev/null 2>&1; }
trap 'drop_schema; cleanup' EXIT

section "schema.sql and history.sql with psql -v ... -f"
sql -c "CREATE SCHEMA $S"
sql -v lease_table="$S.lease" -v fence_table="$S.fence" -v data_table="$S.data" \
    -f "$SQL_DIR/schema.sql"
sql -v history_table="$S.history" -f "$SQL_DIR/history.sql"
assert_eq "$(sql -c "SELECT count(*) FROM pg_tables WHERE schemaname = '$S'")" 4 \
    "four tables in the schema"
assert_eq "$(sql -c "SELECT count(*) FROM information_schema.columns
    WHERE table_schema = '$S' AND table_name = 'lease'")" 9 \
    "the lease table's 9 columns (waiting_until and acquired_at among them)"
# Run again: IF NOT EXISTS, nothing changes.
sql -v lease_table="$S.lease" -v fence_table="$S.fence" -v data_table="$S.data" \
    -f "$SQL_DIR/schema.sql"
pass

section "lease uses the tables as they are"
case $PGURL in *\?*) sep='&' ;; *) sep='?' ;; esac
URL="$PGURL${sep}lease_table=$S.lease&fence_table=$S.fence&data_table=$S.data&history_table=$S.history"
call "$LEASE" --store "$URL" acquire alone/k --ttl 30s --label made-by-psql --json
expect_rc 0 "acquire"
TOK=$(jget "$OUT" .token) # a clock token (the default): the server's µs
[[ "$TOK" =~ ^[0-9]+$ && "$TOK" -gt 1000000000000000 ]] && pass || fail "token $TOK is not a clock token"
OWNER=$(jget "$OUT" .owner)
assert_eq "$(sql -c "SELECT fencing_token || ' ' || holder_label || ' ' ||
    (holder_token = fencing_token) || ' ' || (acquired_at IS NOT NULL) FROM $S.lease
    WHERE resource_key = 'alone/k'")" "$TOK made-by-psql true true" \
    "the grant is in the psql-made lease table, which says when it began"
call "$LEASE" --store "$URL" history alone/k --json
expect_rc 0 "lease history reads that table"
assert_eq "$(jget "$OUT" '.[0].token|tostring') $(jget "$OUT" '.[0].ended')" "$TOK held" \
    "the held grant is in the history"
call "$LEASE" --store "$URL" release alone/k --owner "$OWNER" --token "$TOK"
expect_rc 0 "release"
assert_eq "$(sql -c "SELECT fencing_token || ' ' || coalesce(ended, 'held') || ' ' ||
    holder_label FROM $S.history WHERE resource_key = 'alone/k'")" \
    "$TOK released made-by-psql" "the release wrote its entry in that history table"

finish
