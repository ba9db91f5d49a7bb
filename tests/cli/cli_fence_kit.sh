#!/usr/bin/env bash
# cli_fence_kit: the resource-side fencing kits from the command line.
#   cli_fence_kit.sh LEASE_BINARY FENCE_SQL LEASE_FENCE_LUA SQLITE_EXTENSION
#
# fence-sql postgres prints resource/postgres/fence.sql byte for byte, and
# piped into psql (a fresh schema of LEASE_TEST_PG_URL) it makes a working
# lease_fence_check; fence-sql sqlite loads in sqlite3 and makes the table
# lease_fence() itself would; a bad kind is a usage error. fence-install
# loads lease_fence into the Redis server of LEASE_TEST_REDIS_URL (from
# the URL, --store, $LEASE_STORE, --from FILE), after which FCALL
# lease_fence_set accepts a token and refuses an older one; a wrong
# password exits 6 and is printed nowhere, nor left in /proc/PID/cmdline;
# a bad URL exits 2, among them one with more than one '@' or an '@' after
# a '/' or '?' (no piece of its password printed) and one with a user but
# no password. In a build without the Redis store, fence-install
# exits 1 and says so.
#
# A server URL that is not set skips its part, except under CI=true, where
# it fails when the build has that store: CI starts the servers of the
# stores it builds.
. "$(dirname "$0")/lib.sh" "$1"
export T

FENCE_SQL=${2:?usage: $0 LEASE_BINARY FENCE_SQL LEASE_FENCE_LUA SQLITE_EXTENSION}
LUA=${3:?usage: $0 LEASE_BINARY FENCE_SQL LEASE_FENCE_LUA SQLITE_EXTENSION}
EXT=${4:?usage: $0 LEASE_BINARY FENCE_SQL LEASE_FENCE_LUA SQLITE_EXTENSION}
[ -r "$FENCE_SQL" ] || die "cannot read $FENCE_SQL"
[ -r "$LUA" ] || die "cannot read $LUA"
[ -f "$EXT" ] || die "no SQLite extension at $EXT"
PGURL=${LEASE_TEST_PG_URL:-}
REDIS=${LEASE_TEST_REDIS_URL:-}
unset LEASE_TEST_PG_URL LEASE_TEST_REDIS_URL LEASE_TEST_ETCD_URL

# server_part NAME URL: 0 to run the part that needs the server at URL, 1
# to skip it (not under CI=true: there a missing URL is a failure).
server_part() {
    [ -n "$2" ] && return 0
    if [ "${CI:-}" = true ]; then
        fail "$1 is not set (CI=true): the server part cannot be skipped"
    else
        echo "--- skipped: $1 is not set" >&2
    fi
    return 1
}

section "fence-sql postgres: fence.sql, byte for byte"
"${BOUND[@]}" "$LEASE" fence-sql postgres >"$T/pg.sql" 2>"$T/err"
RC=$? OUT="" ERR=$(cat "$T/err") LAST_CMD="lease fence-sql postgres"
expect_rc 0 "fence-sql postgres"
assert_eq "$ERR" "" "fence-sql postgres: nothing on stderr"
if cmp -s "$T/pg.sql" "$FENCE_SQL"; then pass; else
    fail "fence-sql postgres differs from $FENCE_SQL: $(cmp "$T/pg.sql" "$FENCE_SQL" 2>&1)"
fi

section "fence-sql sqlite: loads in sqlite3, the table lease_fence() makes"
call "$LEASE" fence-sql sqlite
expect_rc 0 "fence-sql sqlite"
printf '%s\n' "$OUT" >"$T/lite.sql"
assert_contains "$OUT" "--     .bail on" "the how-to stops the script at a stale token"
assert_contains "$OUT" "--     .load $(cd "$(dirname "$EXT")" && pwd -P)/liblease_sqlite_fence"$'\n' \
    "the how-to loads the extension by its path, beside liblease"
assert_contains "$OUT" "BEGIN IMMEDIATE;" "the how-to takes the write lock first"
assert_contains "$OUT" "SELECT lease_fence('resource', 42);" "the how-to calls lease_fence"
"${BOUND[@]}" sqlite3 -bail "$T/kit.db" <"$T/lite.sql" >"$T/lite.out" 2>&1
RC=$? OUT=$(cat "$T/lite.out") ERR="" LAST_CMD="sqlite3 kit.db < fence-sql sqlite"
expect_rc 0 "the text loads in sqlite3"
"${BOUND[@]}" sqlite3 -bail "$T/kit.db" <"$T/lite.sql" >"$T/lite.out" 2>&1
RC=$? OUT=$(cat "$T/lite.out") LAST_CMD="sqlite3 kit.db < fence-sql sqlite (again)"
expect_rc 0 "the text loads again (IF NOT EXISTS)"
columns() { sqlite3 "$1" "SELECT name, type, \"notnull\", pk FROM pragma_table_info('lease_fence')"; }
EXT_NOSUFFIX=${EXT%.so}
"${BOUND[@]}" sqlite3 -bail "$T/ext.db" ".load $EXT_NOSUFFIX" "SELECT lease_fence('r', 1);" \
    >/dev/null 2>"$T/err" || fail "the extension made no table: $(cat "$T/err")"
COLS=$(columns "$T/kit.db")
assert_ne "$COLS" "" "fence-sql sqlite made the table lease_fence"
assert_eq "$COLS" "$(columns "$T/ext.db")" "the same columns as the extension's own table"
OUT=$("${BOUND[@]}" sqlite3 -bail "$T/kit.db" ".load $EXT_NOSUFFIX" \
    "SELECT lease_fence('res/a', 5);" 2>&1)
assert_eq "$OUT" 5 "lease_fence() works on the table made ahead"
OUT=$("${BOUND[@]}" sqlite3 -bail "$T/kit.db" ".load $EXT_NOSUFFIX" \
    "SELECT lease_fence('res/a', 4);" 2>&1)
assert_contains "$OUT" "stale fencing token" "an older token is refused"
assert_eq "$(sqlite3 "$T/kit.db" "INSERT INTO lease_fence VALUES ('x', 0)" 2>&1 >/dev/null |
    grep -c CHECK)" 1 "the table refuses a mark of 0"

section "fence-sql: usage errors"
for args in "" "mysql" "Postgres" "postgres sqlite" "--ttl 5s postgres" "--bogus"; do
    # shellcheck disable=SC2086
    call "$LEASE" fence-sql $args
    expect_error 2 "fence-sql $args"
done
call "$LEASE" fence-sql ""
expect_error 2 "fence-sql ''"
call "$LEASE" fence-sql --help
expect_rc 0 "fence-sql --help"
assert_contains "$OUT" "usage: lease fence-sql" "fence-sql --help"

section "fence-sql postgres | psql: a working lease_fence_check"
# CI starts a PostgreSQL server when the build has the PostgreSQL store.
if ! command -v psql >/dev/null 2>&1; then
    if [ "${CI:-}" = true ]; then fail "psql is required (CI=true)"; else echo "--- skipped: no psql" >&2; fi
elif { [ -n "$PGURL" ] || has_store postgres; } && server_part LEASE_TEST_PG_URL "$PGURL"; then
    S="cli_fence_kit_$$_$RANDOM"
    export PGCONNECT_TIMEOUT=10
    trap 'psql "$PGURL" -X -q -c "DROP SCHEMA IF EXISTS $S CASCADE" >/dev/null 2>&1; cleanup' EXIT
    psql_() { PGOPTIONS="-c search_path=$S" "${BOUND[@]}" psql "$PGURL" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
    "${BOUND[@]}" psql "$PGURL" -X -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $S" >/dev/null 2>"$T/err" ||
        fail "CREATE SCHEMA: $(cat "$T/err")"
    "${BOUND[@]}" "$LEASE" fence-sql postgres | psql_ >"$T/psql.out" 2>"$T/err"
    st=("${PIPESTATUS[@]}")
    assert_eq "${st[*]}" "0 0" "lease fence-sql postgres | psql: both succeed ($(cat "$T/err"))"
    assert_eq "$(psql_ -c "SELECT lease_fence_check('orders/eu', 7)" 2>&1)" 7 \
        "lease_fence_check accepts the first token"
    OUT=$(psql_ -c "SELECT lease_fence_check('orders/eu', 6)" 2>&1)
    RC=$?
    assert_ne "$RC" 0 "lease_fence_check refuses an older token"
    assert_contains "$OUT" "stale fencing token" "the refusal says why"
    assert_eq "$(psql_ -c "SELECT mark FROM lease_fence_mark WHERE resource = 'orders/eu'" 2>&1)" 7 \
        "the mark is the accepted token"
fi

section "fence-install: bad URLs are usage errors"
unset LEASE_STORE
call "$LEASE" fence-install
expect_error 2 "fence-install with no URL and no store"
assert_contains "$ERR" "no redis URL" "says what is missing"
call "$LEASE" --store "sqlite://$T/x.db" fence-install
expect_error 2 "fence-install with a sqlite store and no URL"
LEASE_STORE="sqlite://$T/x.db" call "$LEASE" fence-install
expect_error 2 "fence-install with LEASE_STORE=sqlite and no URL"
if has_store redis; then
    for url in "http://127.0.0.1:1" "postgres://127.0.0.1:1/db" "redis://" "redis://127.0.0.1:0" \
        "redis://127.0.0.1:99999" "redis://127.0.0.1:1/x" "redis://h1:1,h2:2" \
        "redis://127.0.0.1:1?bogus=1" "redis://%zz@127.0.0.1:1"; do
        call "$LEASE" fence-install "$url"
        expect_error 2 "fence-install $url"
    done
    call "$LEASE" fence-install "rediss://127.0.0.1:1"
    expect_error 2 "fence-install rediss://"
    assert_contains "$ERR" "rediss:// (TLS) is not supported" "rediss:// gets a clear message"
    call "$LEASE" fence-install "redis://127.0.0.1:1" --from "$T/nonexistent.lua"
    expect_error 2 "fence-install --from a missing file"
    call "$LEASE" fence-install "redis://127.0.0.1:1" "redis://u:second-secret@127.0.0.1:2"
    expect_error 2 "fence-install with two URLs"
    assert_not_contains "$ERR" "second-secret" "the second URL's password is not quoted"
    # A URL whose '@' readers would split in different places: refused,
    # and no piece of its password in any message (split at a '/' or '?',
    # the password's tail would look like a path or a parameter).
    PW1="kit-pw-$$-$RANDOM" PW2="kit-tail-$$-$RANDOM"
    for url in "redis://u:4321?$PW2@127.0.0.1:1" "redis://u:$PW1?$PW2@127.0.0.1:1" "redis://u:$PW1/$PW2@127.0.0.1:1" \
        "redis://u:$PW1@$PW2@127.0.0.1:1" "redis://u:$PW1@127.0.0.1:1/0?prefix=$PW2@x"; do
        call "$LEASE" fence-install "$url"
        expect_error 2 "fence-install with an '@' that readers split differently"
        assert_contains "$ERR" "'@'" "the message says what is wrong with the '@'"
        assert_not_contains "$OUT$ERR" "$PW1" "the password in stdout or stderr"
        assert_not_contains "$OUT$ERR" "$PW2" "a piece of the password in stdout or stderr"
    done
    call "$LEASE" fence-install "redis://app@127.0.0.1:1"
    expect_error 2 "fence-install with a user and no password"
    assert_contains "$ERR" "a user needs a password" "says why, rather than skipping AUTH"
    call "$LEASE" fence-install "redis://:$PW1%40x@127.0.0.1:1/0?bogus=1"
    expect_error 2 "fence-install with a password (an escaped '@' in it) and a bad parameter"
    assert_not_contains "$OUT$ERR" "$PW1" "the escaped password in stdout or stderr"
    call "$LEASE" fence-install --from
    expect_error 2 "fence-install --from without a value"
    call "$LEASE" fence-install --help
    expect_rc 0 "fence-install --help"
    assert_contains "$OUT" "usage: lease fence-install" "fence-install --help"
else
    section "fence-install without the Redis store: exit 1"
    call "$LEASE" fence-install "redis://127.0.0.1:1"
    expect_error 1 "fence-install in a build without Redis"
    assert_contains "$ERR" "built without Redis support" "says why"
    finish
fi

section "fence-install: a server that is not there, or never answers"
pick_port || die "no free port"
call "$LEASE" fence-install "redis://127.0.0.1:$PORT"
expect_error 6 "fence-install to a closed port"
start_mute_server
SECRET="kit-secret-$$-$RANDOM"
"$LEASE" fence-install "redis://app:$SECRET@127.0.0.1:$MPORT/0" >"$T/mute.out" 2>"$T/mute.err" &
pid=$!
bg_register "$pid"
wait_for "fence-install connected to the silent server" test -e "$T/mute.accepted"
cl=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
assert_contains "$cl" "fence-install redis://app:***@127.0.0.1:$MPORT/0" \
    "/proc/PID/cmdline was read, the password hidden ($cl)"
assert_not_contains "$cl" "$SECRET" "the password in /proc/PID/cmdline"
WAIT_TRIES=600 wait_exit "$pid" rc "fence-install to the silent server"
assert_eq "$rc" 6 "a server that never answers: exit 6"
assert_not_contains "$(cat "$T/mute.out" "$T/mute.err")" "$SECRET" "the password in the output"

if ! server_part LEASE_TEST_REDIS_URL "$REDIS"; then
    finish
fi
command -v redis-cli >/dev/null 2>&1 || die "redis-cli is required"
P="lease-test:cli_fence_kit:$$:$RANDOM"
MARK="$P:{r}:mark" DATA="$P:{r}:data"
rcli() { "${BOUND[@]}" redis-cli -u "$REDIS" --raw "$@" 2>>"$T/redis-cli.err"; }
trap 'rcli DEL "$MARK" "$DATA" >/dev/null; cleanup' EXIT

section "fence-install URL: the library loads, FCALL works"
rcli FUNCTION DELETE lease_fence >/dev/null
call "$LEASE" fence-install "$REDIS"
expect_rc 0 "fence-install $REDIS"
assert_match "$OUT" "^installed lease_fence into redis://([^@]*@)?127\.0\.0\.1:[0-9]+(/[0-9]+)?$" \
    "says where it installed"
assert_eq "$(rcli FUNCTION LIST LIBRARYNAME lease_fence | grep -cx lease_fence_set)" 1 \
    "the server has lease_fence_set"
assert_eq "$(rcli FCALL lease_fence_set 2 "$MARK" "$DATA" 5 v5)" OK "a token is accepted"
assert_eq "$(rcli GET "$DATA")" v5 "and its write made"
assert_match "$(rcli FCALL lease_fence_set 2 "$MARK" "$DATA" 4 v4)" "^STALE" \
    "an older token is refused"
assert_eq "$(rcli GET "$DATA")" v5 "the refused write is not made"

section "fence-install: --json, --from, --store and \$LEASE_STORE"
call "$LEASE" fence-install "$REDIS" --json
expect_rc 0 "fence-install --json"
assert_eq "$(printf '%s' "$OUT" | jq -cS . 2>&1)" '{"installed":true,"library":"lease_fence"}' "the JSON"
rcli FUNCTION DELETE lease_fence >/dev/null
call "$LEASE" fence-install --from "$LUA" "$REDIS"
expect_rc 0 "fence-install --from FILE"
assert_eq "$(rcli FCALL lease_fence_check 1 "$MARK" 6)" 6 "the library from the file works"
call "$LEASE" --store "$REDIS" fence-install
expect_rc 0 "fence-install with the URL of --store"
LEASE_STORE=$REDIS call "$LEASE" fence-install --json
expect_rc 0 "fence-install with the URL of \$LEASE_STORE"

section "fence-install: a wrong password is exit 6, and never printed"
HOSTPORT=${REDIS#redis://}
HOSTPORT=${HOSTPORT##*@}
HOSTPORT=${HOSTPORT%%[/?]*}
WRONG="wrong-pw-$$-$RANDOM"
call "$LEASE" fence-install "redis://nobody:$WRONG@$HOSTPORT/0"
expect_error 6 "fence-install with a wrong password"
assert_not_contains "$OUT$ERR" "$WRONG" "the password in stdout or stderr"
assert_contains "$ERR" "redis://nobody:***@" "the message names the server, redacted"

finish
