#!/usr/bin/env bash
# pg_fence.sh LEASE_BINARY KIT_DIR - the PostgreSQL fencing kit
# (resource/postgres: fence.sql, example_epoch_column.sql) in a fresh schema
# of the shared test server (LEASE_TEST_PG_URL; fails without it).
#
# fence.sql loads twice; lease_fence_check accepts, advances, refuses an
# older token with LF001 and bad input with LF002; a rolled-back transaction
# leaves the mark; a stale session waits on the newer one's row lock and is
# refused when it commits; and the stale holder, played by real processes
# with `lease` (SQLite lease store) and psql, has its write refused by the
# application's database, while the control run without the kit lets it in.
. "$(dirname "$0")/../cli/lib.sh" "$@"
. "$(dirname "$0")/fence_scenario.sh"

KIT=${2:?usage: $0 LEASE_BINARY KIT_DIR}
PGURL=${LEASE_TEST_PG_URL:-}
if [ -z "$PGURL" ]; then
    echo "FATAL: LEASE_TEST_PG_URL is not set: scripts/test.sh starts a PostgreSQL server and exports it" >&2
    exit 1
fi
command -v psql >/dev/null 2>&1 || { echo "FATAL: psql is required" >&2; exit 1; }

S="fence_kit_$$_$RANDOM"
# Every session below works in the schema S: fence.sql creates its objects
# in the first schema of the search_path, as it would in an application's.
export PGOPTIONS="-c search_path=$S"
export PGCONNECT_TIMEOUT=10
psql_() { "${BOUND[@]}" psql "$PGURL" -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose "$@"; }
sql() { psql_ "$@" 2>"$T/psql.err" || { fail "psql failed: $(cat "$T/psql.err")"; return 1; }; }
drop_schema() { PGOPTIONS= psql "$PGURL" -X -q -c "DROP SCHEMA IF EXISTS $S CASCADE" >/dev/null 2>&1; }
trap 'drop_schema; cleanup' EXIT

# check RESOURCE_SQL TOKEN_SQL: SELECT lease_fence_check(...) in its own
# transaction; output in $OUT, errors in $ERR, exit status in $RC.
check() {
    OUT=$(psql_ -c "SELECT lease_fence_check($1, $2)" 2>"$T/err")
    RC=$? ERR=$(cat "$T/err") LAST_CMD="lease_fence_check($1, $2)"
}
mark() { sql -v r="$1" <<<"SELECT mark FROM lease_fence_mark WHERE resource = :'r';"; }

section "fence.sql with psql -f, twice"
PGOPTIONS= sql -c "CREATE SCHEMA $S"
sql -f "$KIT/fence.sql" && pass
sql -f "$KIT/fence.sql" && pass
assert_eq "$(sql -c "SELECT count(*) FROM pg_tables WHERE schemaname = '$S' AND tablename = 'lease_fence_mark'")" 1 \
    "the table is in the schema"
assert_eq "$(sql -c "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = '$S' AND p.proname = 'lease_fence_check'")" 1 "one function, in the schema"

section "accept, advance, refuse"
check "'res/a'" 5;  expect_rc 0 "first token";  assert_eq "$OUT" 5 "returns the mark"
check "'res/a'" 5;  expect_rc 0 "equal token";  assert_eq "$OUT" 5 "equal is accepted"
check "'res/a'" 1700000000000001; expect_rc 0 "a clock-sized token"
check "'res/a'" 6;  expect_rc 1 "older token"
assert_contains "$ERR" "LF001: stale fencing token" "SQLSTATE LF001 and the message"
assert_contains "$ERR" "token 6 < mark 1700000000000001" "the DETAIL gives token and mark"
assert_eq "$(mark res/a)" 1700000000000001 "the refused token left the mark"
check "'res/b'" 1;  expect_rc 0 "resources are apart"

section "neither a temporary table nor the caller's search_path stands in for the marks"
OUT=$(psql_ -c "CREATE TEMP TABLE lease_fence_mark (resource text PRIMARY KEY, mark bigint, updated_at timestamptz)" \
    -c "SELECT lease_fence_check('res/a', 6)" 2>"$T/err")
RC=$? ERR=$(cat "$T/err") LAST_CMD="a temp table lease_fence_mark, then a stale token"
expect_rc 1 "a temporary lease_fence_mark table does not hide the marks"
assert_contains "$ERR" "LF001: stale fencing token" "the stale token is still refused"
OUT=$(PGOPTIONS= psql_ -c "SET search_path = public" -c "SELECT $S.lease_fence_check('res/a', 6)" 2>"$T/err")
RC=$? ERR=$(cat "$T/err") LAST_CMD="another search_path, then a stale token"
expect_rc 1 "another search_path does not change the function's table"
assert_contains "$ERR" "LF001: stale fencing token" "refused under another search_path"

section "bad input: LF002"
for args in "'r', NULL" "NULL, 1" "NULL, NULL" "'r', 0" "'r', -1" "'r', -9223372036854775808" \
    "'', 1" "repeat('x', 10240), 1" "repeat('x', 1025), 1" "repeat('é', 513), 1"; do
    check "${args%, *}" "${args##*, }"
    expect_rc 1 "lease_fence_check($args)"
    assert_contains "$ERR" "LF002: lease_fence_check:" "lease_fence_check($args): LF002"
done
check "repeat('x', 1024)" 1; expect_rc 0 "a 1024-byte resource is accepted"
assert_eq "$(sql -c "SELECT count(*) FROM lease_fence_mark WHERE resource = '' OR mark <= 0")" 0 \
    "no bad row was written"

section "a rolled-back transaction does not advance the mark"
check "'res/t'" 10; expect_rc 0 "mark 10"
sql -c "BEGIN" -c "SELECT lease_fence_check('res/t', 20)" -c "ROLLBACK" >/dev/null && pass
assert_eq "$(mark res/t)" 10 "the mark is still 10"

section "two sessions: the stale one waits on the row lock, then LF001"
check "'res/2'" 5; expect_rc 0 "mark 5"
mkfifo "$T/s1.in" "$T/s2.in"
PGAPPNAME="fence_s1_$$" psql "$PGURL" -X -q -At -v VERBOSITY=verbose <"$T/s1.in" >"$T/s1.out" 2>"$T/s1.err" &
S1=$!; bg_register "$S1"
PGAPPNAME="fence_s2_$$" psql "$PGURL" -X -q -At -v VERBOSITY=verbose <"$T/s2.in" >"$T/s2.out" 2>"$T/s2.err" &
S2=$!; bg_register "$S2"
exec 7>"$T/s1.in" 8>"$T/s2.in"
printf '%s\n' "BEGIN;" "SELECT lease_fence_check('res/2', 20);" "\\! touch $T/s1.checked" >&7
wait_for "session 1 (token 20) has checked" test -e "$T/s1.checked"
printf '%s\n' "BEGIN;" "SELECT lease_fence_check('res/2', 10);" "\\! touch $T/s2.done" >&8
s2_waits() {
    [ "$(psql "$PGURL" -X -At -c "SELECT count(*) FROM pg_stat_activity
        WHERE application_name = 'fence_s2_$$' AND wait_event_type = 'Lock'")" = 1 ]
}
wait_for "session 2 (token 10) waits on a lock" s2_waits
assert_no_file "$T/s2.done" "session 2 has not finished while session 1 is open"
printf '%s\n' "COMMIT;" >&7
wait_for "session 2 finishes once session 1 commits" test -e "$T/s2.done"
assert_contains "$(cat "$T/s2.err")" "LF001: stale fencing token" "session 2 is refused"
assert_contains "$(cat "$T/s2.err")" "token 10 < mark 20" "with the committed mark"
printf '%s\n' "ROLLBACK;" "\\q" >&8
printf '%s\n' "\\q" >&7
exec 7>&- 8>&-
wait_exit "$S1" rc1 "session 1"
wait_exit "$S2" rc2 "session 2"
assert_eq "$(mark res/2)" 20 "the mark is session 1's"

section "example_epoch_column.sql"
sql -f "$KIT/example_epoch_column.sql" >"$T/epoch.out" && pass
assert_eq "$(grep -c '^1|' "$T/epoch.out")" 3 "B's two writes and the final row come back, A's does not"
assert_eq "$(tail -n 1 "$T/epoch.out")" "1|160|42" "the row keeps B's last write"

section "the stale holder, real processes: the kit refuses A's write"
sql -c "CREATE TABLE orders (name text PRIMARY KEY, v text NOT NULL, token bigint)"
export LEASE_STORE="sqlite://$T/leases.db"
init_row() { sql -v name="$1" <<<"INSERT INTO orders (name, v) VALUES (:'name', 'init');"; }
read_row() { sql -v name="$1" <<<"SELECT v FROM orders WHERE name = :'name';"; }
write_row() {
    local who=$1 token=$2 mode=$3 name=$4 check=""
    [[ "$token" =~ ^[0-9]+$ ]] || { echo "bad token '$token'" >&2; return 1; }
    # The kit: the check is the transaction's first statement.
    [ "$mode" = kit ] && check="SELECT lease_fence_check(:'name', :'token'::bigint);"
    psql_ -v who="$who" -v token="$token" -v name="$name" <<SQL
BEGIN;
$check
UPDATE orders SET v = :'who', token = :'token'::bigint WHERE name = :'name';
COMMIT;
SQL
}
scenario orders/kit kit
assert_ne "$A_RC" 0 "A's write with the stale token fails"
assert_contains "$(cat "$T/a-orders_kit.err" 2>/dev/null)" "LF001: stale fencing token" \
    "refused by lease_fence_check"
assert_eq "$(read_row orders/kit)" B "the row keeps B's write"
assert_eq "$(mark orders/kit)" "$B_TOKEN" "the resource's mark is B's token"

section "control: the same without the kit lets A's stale write in"
scenario orders/plain plain
assert_eq "$A_RC" 0 "A's plain write succeeds"
assert_eq "$(read_row orders/plain)" A "the row holds A's stale write: B's is lost"

finish
