#!/usr/bin/env bash
# pg_fence_store.sh LEASE_BINARY KIT_DIR OLD_KIT - the PostgreSQL fencing
# kit (KIT_DIR/fence.sql) in the database and schema of the PostgreSQL
# lease store, and its upgrade from the kit as shipped when its table was
# named lease_fence (OLD_KIT: tests/resource/fence_kit_v0.sql), on the
# shared test server (LEASE_TEST_PG_URL; fails without it).
#
# The store keeps the marks of `lease fence` in its own lease_fence
# (resource, mark); the kit keeps its marks in lease_fence_mark. In either
# order (the store's `lease fence` first, or the kit first) both install
# and work in one schema, each with its own marks. The upgrade: the older
# kit's lease_fence, with marks (one set by a store that took that table as
# its own), becomes lease_fence_mark by fence.sql run again; a stale token
# stays refused, the marks and their updated_at are kept, the store keeps
# its marks too (in a copy of the store's definition), grants go with
# them, and a mark an older kit's writer commits while the install waits
# for it is in both, whatever the session's default isolation. What is
# not exactly the older kit's table, or an older table beside a
# lease_fence_mark, is refused (LF003) and nothing changes.
. "$(dirname "$0")/../cli/lib.sh" "$@"

KIT=${2:?usage: $0 LEASE_BINARY KIT_DIR OLD_KIT}
OLD_KIT=${3:?usage: $0 LEASE_BINARY KIT_DIR OLD_KIT}
PGURL=${LEASE_TEST_PG_URL:-}
if [ -z "$PGURL" ]; then
    echo "FATAL: LEASE_TEST_PG_URL is not set: scripts/test.sh starts a PostgreSQL server and exports it" >&2
    exit 1
fi
command -v psql >/dev/null 2>&1 || { echo "FATAL: psql is required" >&2; exit 1; }
[ -r "$OLD_KIT" ] || { echo "FATAL: no older kit at $OLD_KIT" >&2; exit 1; }

# The store is the shared server; its tables go where the kit's do, into
# the first schema of the search_path that PGOPTIONS gives libpq (psql's
# and lease's alike).
export LEASE_STORE=$PGURL
export PGCONNECT_TIMEOUT=10
SCHEMAS=()
drop_schemas() {
    local s
    for s in ${SCHEMAS[@]+"${SCHEMAS[@]}"}; do
        PGOPTIONS='' psql "$PGURL" -X -q -c "DROP SCHEMA IF EXISTS $s CASCADE" >/dev/null 2>&1
    done
}
trap 'drop_schemas; cleanup' EXIT

# new_schema TAG: a fresh schema $S, first on every session's search_path.
new_schema() {
    S="fence_store_$$_${RANDOM}_$1"
    SCHEMAS+=("$S")
    export PGOPTIONS="-c search_path=$S"
    PGOPTIONS='' sql -c "CREATE SCHEMA $S"
}
psql_() { "${BOUND[@]}" psql "$PGURL" -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose "$@"; }
sql() { psql_ "$@" 2>"$T/psql.err" || { fail "psql failed: $(cat "$T/psql.err")"; return 1; }; }
# install FILE: psql -f FILE, with $OUT, $ERR and $RC.
install() {
    OUT=$(psql_ -f "$1" 2>"$T/err")
    RC=$? ERR=$(cat "$T/err") LAST_CMD="psql -f $1 (schema $S)"
}
# check RESOURCE TOKEN: lease_fence_check in its own transaction (the
# test's own names and numbers: no quote in them).
check() {
    OUT=$(psql_ -c "SELECT lease_fence_check('$1', $2::bigint)" 2>"$T/err")
    RC=$? ERR=$(cat "$T/err") LAST_CMD="lease_fence_check('$1', $2)"
}
# store_fence RESOURCE TOKEN: the store's `lease fence` (0 accepted, 5 stale).
store_fence() { call "$LEASE" fence "$1" "$2"; }
kit_mark() { sql -v r="$1" <<<"SELECT mark FROM lease_fence_mark WHERE resource = :'r';"; }
# store_mark RESOURCE: the mark in lease_fence (the store's, or an older
# kit's table).
store_mark() { sql -v r="$1" <<<"SELECT mark FROM lease_fence WHERE resource = :'r';"; }
# columns TABLE: its columns, in order ("" when there is no such table).
columns() {
    sql -v t="$1" <<<"SELECT coalesce(string_agg(attname, ',' ORDER BY attnum), '') FROM pg_attribute
        WHERE attrelid = to_regclass(:'t') AND attnum > 0 AND NOT attisdropped;"
}
# problem: lease_fence_problem(), "" when the kit is as installed.
problem() { sql -c "SELECT lease_fence_problem()"; }
# privileges TABLE: what PUBLIC is granted on it.
privileges() {
    sql -v t="$1" <<<"SELECT coalesce(string_agg(a.privilege_type, ',' ORDER BY a.privilege_type), '')
        FROM pg_class AS c, aclexplode(c.relacl) AS a WHERE c.oid = to_regclass(:'t') AND a.grantee = 0;"
}

section "the store first: lease fence, then lease fence-sql postgres | psql in its schema"
new_schema a
store_fence orders/eu 50; expect_rc 0 "lease fence orders/eu 50 makes the store's tables"
assert_eq "$(columns lease_fence)" "resource,mark" "the store's lease_fence"
"${BOUND[@]}" "$LEASE" fence-sql postgres | psql_ >"$T/psql.out" 2>"$T/err"
st=("${PIPESTATUS[@]}")
assert_eq "${st[*]}" "0 0" "lease fence-sql postgres | psql: both succeed ($(cat "$T/err"))"
assert_eq "$(columns lease_fence_mark)" "resource,mark,updated_at" "the kit's table is lease_fence_mark"
assert_eq "$(columns lease_fence)" "resource,mark" "the store's lease_fence is left as it was"
assert_eq "$(problem)" "" "lease_fence_problem(): nothing"
check orders/eu 10; expect_rc 0 "the kit accepts token 10: the store's mark 50 is not its own"
check orders/eu 20; expect_rc 0 "token 20"; assert_eq "$OUT" 20 "returns the mark"
check orders/eu 15; expect_rc 1 "token 15 after 20"
assert_contains "$ERR" "LF001: stale fencing token" "refused as stale"
assert_contains "$ERR" "token 15 < mark 20" "against the kit's mark"
store_fence orders/eu 40; expect_rc 5 "the store still refuses token 40 after its 50"
store_fence orders/eu 60; expect_rc 0 "the store accepts 60"
assert_eq "$(kit_mark orders/eu)" 20 "the kit's mark is its own"
assert_eq "$(store_mark orders/eu)" 60 "the store's mark is its own"
install "$KIT/fence.sql"; expect_rc 0 "fence.sql again"
assert_not_contains "$ERR" "renamed" "the store's table is not taken for an older kit's"
assert_eq "$(kit_mark orders/eu) $(store_mark orders/eu)" "20 60" "the marks are as they were"

section "the kit first, then the store's lease fence in its schema"
new_schema b
install "$KIT/fence.sql"; expect_rc 0 "fence.sql"
check r 100; expect_rc 0 "token 100"
store_fence r 5; expect_rc 0 "the store accepts 5: the kit's mark 100 is not its own"
assert_eq "$(columns lease_fence)" "resource,mark" "the store made its own lease_fence"
check r 50; expect_rc 1 "token 50 after 100"
assert_contains "$ERR" "LF001: stale fencing token" "refused as stale"
check r 101; expect_rc 0 "token 101"
store_fence r 4; expect_rc 5 "the store refuses 4 after its 5"
assert_eq "$(kit_mark r) $(store_mark r)" "101 5" "each keeps its own mark"
assert_eq "$(problem)" "" "lease_fence_problem(): nothing"
install "$KIT/fence.sql"; expect_rc 0 "fence.sql again, beside the store's tables"

section "upgrade: the older kit's lease_fence becomes lease_fence_mark, marks and grants kept"
new_schema c
install "$OLD_KIT"; expect_rc 0 "the older kit"
check m/a 100; expect_rc 0 "older kit: token 100"
check m/b 7; expect_rc 0 "older kit: token 7"
# A store in the schema took the older kit's table as its own.
store_fence s/x 500; expect_rc 0 "the store's mark in the older kit's table"
assert_eq "$(store_mark s/x)" 500 "the store wrote into the older kit's lease_fence"
sql -c "GRANT SELECT, INSERT, UPDATE ON lease_fence TO PUBLIC"
OLD_OID=$(sql -c "SELECT 'lease_fence'::regclass::oid")
UPDATED=$(sql -c "SELECT updated_at FROM lease_fence WHERE resource = 'm/a'")
install "$KIT/fence.sql"; expect_rc 0 "fence.sql over the older kit"
assert_contains "$ERR" "renamed $S.lease_fence, an older kit's table, to lease_fence_mark" "it says so"
assert_eq "$(sql -c "SELECT 'lease_fence_mark'::regclass::oid")" "$OLD_OID" "lease_fence_mark is the older table"
assert_eq "$(columns lease_fence)" "resource,mark" "lease_fence is no longer the older kit's"
check m/a 99; expect_rc 1 "a stale token 99 after 100"
assert_contains "$ERR" "LF001: stale fencing token" "refused as stale"
assert_contains "$ERR" "token 99 < mark 100" "by the mark the older kit kept"
assert_eq "$(sql -c "SELECT updated_at FROM lease_fence_mark WHERE resource = 'm/a'")" "$UPDATED" \
    "updated_at kept"
check m/b 8; expect_rc 0 "token 8 after 7"
assert_eq "$(sql -c "SELECT string_agg(resource || '=' || mark, ' ' ORDER BY resource) FROM lease_fence_mark")" \
    "m/a=100 m/b=8 s/x=500" "every mark kept"
store_fence s/x 400; expect_rc 5 "the store still refuses 400 after its 500"
store_fence s/x 600; expect_rc 0 "the store accepts 600"
assert_eq "$(kit_mark s/x) $(store_mark s/x)" "500 600" "from here each keeps its own mark"
assert_eq "$(privileges lease_fence_mark)" "INSERT,SELECT,UPDATE" "the grants went with the table"
assert_eq "$(privileges lease_fence)" "INSERT,SELECT,UPDATE" "the store's copy has them too"
assert_eq "$(problem)" "" "lease_fence_problem(): nothing"
install "$KIT/fence.sql"; expect_rc 0 "fence.sql again"
assert_not_contains "$ERR" "renamed" "nothing more to rename"
check m/a 99; expect_rc 1 "token 99 still refused"

section "upgrade: an older kit's writer commits while the install waits; the marks have it"
new_schema d
install "$OLD_KIT"; expect_rc 0 "the older kit"
check w/1 10; expect_rc 0 "older kit: token 10"
mkfifo "$T/w.in"
PGAPPNAME="fence_w_$$" psql "$PGURL" -X -q -At -v VERBOSITY=verbose <"$T/w.in" >"$T/w.out" 2>"$T/w.err" &
W=$!; bg_register "$W"
exec 7>"$T/w.in"
printf '%s\n' "BEGIN;" "SELECT lease_fence_check('w/1', 30);" "\\! touch $T/w.checked" >&7
wait_for "the older kit's writer has checked token 30" test -e "$T/w.checked"
# The session's default is REPEATABLE READ: the install must still copy
# the mark committed after its first statement.
{
    PGAPPNAME="fence_up_$$" psql "$PGURL" -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose \
        -c "SET default_transaction_isolation = 'repeatable read'" -f "$KIT/fence.sql" \
        >"$T/up.out" 2>"$T/up.err"
    echo $? >"$T/up.rc"
} &
U=$!; bg_register "$U"
up_waits() {
    [ "$(PGOPTIONS='' psql "$PGURL" -X -At -c "SELECT count(*) FROM pg_stat_activity
        WHERE application_name = 'fence_up_$$' AND wait_event_type = 'Lock'")" = 1 ]
}
wait_for "the install waits on the writer's lock" up_waits
assert_no_file "$T/up.rc" "the install has not finished while the writer is open"
printf '%s\n' "COMMIT;" "\\q" >&7
exec 7>&-
wait_exit "$W" wrc "the older kit's writer"
wait_exit "$U" urc "the install"
assert_eq "$(cat "$T/up.rc" 2>/dev/null)" 0 "the install succeeds ($(cat "$T/up.err"))"
assert_eq "$(kit_mark w/1)" 30 "the kit's mark is the writer's 30"
assert_eq "$(store_mark w/1)" 30 "so is the store's copy"
check w/1 20; expect_rc 1 "token 20 after 30"
assert_contains "$ERR" "token 20 < mark 30" "refused by the writer's mark"

section "upgrade refused by what the kit refuses (a trigger): one transaction, nothing changed"
new_schema e
install "$OLD_KIT"; expect_rc 0 "the older kit"
check t/1 100; expect_rc 0 "older kit: token 100"
sql >/dev/null <<'SQL'
CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
CREATE TRIGGER keep BEFORE UPDATE ON lease_fence FOR EACH ROW EXECUTE FUNCTION keep();
SQL
install "$KIT/fence.sql"; expect_rc 3 "fence.sql refuses"
assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema $S" "LF003"
assert_contains "$ERR" "lease_fence_mark has triggers: keep" "names the trigger"
assert_contains "$ERR" "the older kit's lease_fence, which this install renamed; rolled back" "says it rolled back"
assert_eq "$(columns lease_fence)" "resource,mark,updated_at" "the older table is still lease_fence"
assert_eq "$(columns lease_fence_mark)" "" "there is no lease_fence_mark"
assert_eq "$(store_mark t/1)" 100 "its mark is there"
assert_eq "$(sql -c "SELECT count(*) FROM pg_proc WHERE pronamespace = '$S'::regnamespace
    AND prosrc LIKE '%lease_fence_mark%'")" 0 "the functions are the older kit's"
sql -c "DROP TRIGGER keep ON lease_fence"
check t/1 50; expect_rc 1 "the older kit still refuses token 50"
assert_contains "$ERR" "LF001: stale fencing token" "as stale"
install "$KIT/fence.sql"; expect_rc 0 "fence.sql, the trigger gone"
check t/1 50; expect_rc 1 "token 50 after the upgrade"
assert_contains "$ERR" "token 50 < mark 100" "refused by the kept mark"

section "an older kit's table that differs: refused, nothing changed"
new_schema f
install "$OLD_KIT"; expect_rc 0 "the older kit"
check i/1 100; expect_rc 0 "older kit: token 100"
sql -c "CREATE INDEX by_time ON lease_fence (updated_at)"
install "$KIT/fence.sql"; expect_rc 3 "fence.sql refuses"
assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema $S: lease_fence, with the column updated_at of an older kit's table, is not as the older kits made it: lease_fence has indexes the kit does not make: $S.by_time" \
    "says what differs"
assert_eq "$(columns lease_fence_mark)" "" "no empty lease_fence_mark left beside it"
assert_eq "$(store_mark i/1)" 100 "its mark is there"

section "both an older kit's lease_fence and a lease_fence_mark: refused, both kept"
new_schema g
install "$OLD_KIT"; expect_rc 0 "the older kit"
check b/1 100; expect_rc 0 "older kit: token 100"
sql >/dev/null <<'SQL'
CREATE TABLE lease_fence_mark (resource text PRIMARY KEY, mark bigint NOT NULL CHECK (mark > 0),
                               updated_at timestamptz);
INSERT INTO lease_fence_mark VALUES ('b/1', 5, now());
SQL
install "$KIT/fence.sql"; expect_rc 3 "fence.sql refuses"
assert_contains "$ERR" "LF003: fence.sql: refusing to install in schema $S: schema $S has both lease_fence, an older kit's table, and lease_fence_mark, this kit's" \
    "names both"
assert_eq "$(store_mark b/1) $(kit_mark b/1)" "100 5" "both tables keep their marks"
check b/1 50; expect_rc 1 "the older kit still refuses token 50"
assert_contains "$ERR" "LF001: stale fencing token" "as stale"

finish
