#!/usr/bin/env bash
# sqlite_fence.sh LEASE_BINARY EXTENSION - the SQLite fencing kit from the
# sqlite3 shell: `.load` by path and by name (the way an installed
# liblease_sqlite_fence is loaded), the messages, and the stale holder
# played by real processes with `lease` and sqlite3 on an application's
# database file: refused with the kit, let in by the control run without.
. "$(dirname "$0")/../cli/lib.sh" "$@"
. "$(dirname "$0")/fence_scenario.sh"

EXT=${2:?usage: $0 LEASE_BINARY EXTENSION}
[ -f "$EXT" ] || { echo "FATAL: no extension at '$EXT'" >&2; exit 1; }
EXT_DIR=$(dirname "$EXT")
EXT_NOSUFFIX=${EXT%.so}
APP=$T/app.db

# lite SQL...: the statements through sqlite3 -bail on the app database,
# with the extension loaded; stdout in $OUT, stderr in $ERR, status in $RC.
lite() {
    local script
    script=$(printf '%s\n' ".timeout 10000" ".load $EXT_NOSUFFIX" "$@")
    OUT=$(printf '%s\n' "$script" | "${BOUND[@]}" sqlite3 -bail "$APP" 2>"$T/err")
    RC=$? ERR=$(cat "$T/err") LAST_CMD="sqlite3: $*"
}
mark() { sqlite3 "$APP" ".parameter set @r '$1'" "SELECT mark FROM lease_fence WHERE resource = @r"; }

section ".load by path and by name"
lite "SELECT lease_fence('res/a', 5);"
expect_rc 0 ".load PATH (no suffix: SQLite adds .so)"
assert_eq "$OUT" 5 "the first token is the mark"
OUT=$(LD_LIBRARY_PATH=$EXT_DIR "${BOUND[@]}" sqlite3 -bail "$APP" ".load liblease_sqlite_fence" \
    "SELECT lease_fence('res/a', 7);" 2>"$T/err")
RC=$? ERR=$(cat "$T/err") LAST_CMD=".load liblease_sqlite_fence"
expect_rc 0 ".load liblease_sqlite_fence, found on the library path"
assert_eq "$OUT" 7 "advances the mark"
lite "SELECT lease_fence('res/a', 6);"
expect_rc 1 "an older token fails the statement"
assert_contains "$ERR" "stale fencing token: token 6 < mark 7" "the message"
assert_eq "$(mark res/a)" 7 "the mark stays"
assert_eq "$(sqlite3 "$APP" "SELECT sql FROM sqlite_schema WHERE name = 'lease_fence'")" \
    "CREATE TABLE lease_fence ( resource TEXT PRIMARY KEY, mark INTEGER NOT NULL CHECK (mark > 0))" \
    "the table was made on first use"

section "bad input"
for args in "'r', NULL" "NULL, 1" "'r', '5'" "'r', 5.0" "'r', 0" "'r', -1" "'', 1" \
    "printf('%.*c', 10240, 'x'), 1"; do
    lite "SELECT lease_fence($args);"
    expect_rc 1 "lease_fence($args)"
    assert_contains "$ERR" "lease_fence: " "lease_fence($args): a message"
done

section "BEGIN IMMEDIATE ... ROLLBACK leaves the mark"
lite "BEGIN IMMEDIATE;" "SELECT lease_fence('res/a', 50);" "ROLLBACK;"
expect_rc 0 "check in a rolled-back transaction"
assert_eq "$(mark res/a)" 7 "the mark is still 7"

section "the stale holder, real processes: the kit refuses A's write"
sqlite3 "$APP" "CREATE TABLE orders (name TEXT PRIMARY KEY, v TEXT NOT NULL)"
export LEASE_STORE="sqlite://$T/leases.db"
init_row() { sqlite3 "$APP" ".parameter set @name '$1'" "INSERT INTO orders VALUES (@name, 'init')"; }
read_row() { sqlite3 "$APP" ".parameter set @name '$1'" "SELECT v FROM orders WHERE name = @name"; }
write_row() {
    local who=$1 token=$2 mode=$3 name=$4 check=""
    # Values reach the SQL as bound parameters; these checks keep the
    # shell's .parameter lines themselves well-formed.
    [[ "$token" =~ ^[0-9]+$ && "$who" =~ ^[AB]$ && "$name" =~ ^[a-z/]+$ ]] ||
        { echo "bad arguments '$*'" >&2; return 1; }
    [ "$mode" = kit ] && check="SELECT lease_fence(@name, @token);"
    printf '%s\n' ".timeout 10000" ".load $EXT_NOSUFFIX" ".parameter set @token $token" \
        ".parameter set @who '$who'" ".parameter set @name '$name'" \
        "BEGIN IMMEDIATE;" "$check" "UPDATE orders SET v = @who WHERE name = @name;" "COMMIT;" |
        "${BOUND[@]}" sqlite3 -bail "$APP"
}
scenario orders/kit kit
assert_ne "$A_RC" 0 "A's write with the stale token fails"
assert_contains "$(cat "$T/a-orders_kit.err" 2>/dev/null)" "stale fencing token: token $A_TOKEN < mark $B_TOKEN" \
    "refused by lease_fence"
assert_eq "$(read_row orders/kit)" B "the row keeps B's write"
assert_eq "$(mark orders/kit)" "$B_TOKEN" "the resource's mark is B's token"

section "control: the same without the kit lets A's stale write in"
scenario orders/plain plain
assert_eq "$A_RC" 0 "A's plain write succeeds"
assert_eq "$(read_row orders/plain)" A "the row holds A's stale write: B's is lost"

finish
