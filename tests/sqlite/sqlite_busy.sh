#!/usr/bin/env bash
# sqlite_busy: while another process holds the SQLite database's lock, a
# command given --timeout 1s ends within a generous bound (10 s: the open
# and the call are each bounded by 1 s) with exit 6 or 7, never 0; and a
# --wait ends within its own bound. The lock holder is the sqlite3 CLI,
# which keeps the lock for 60 s (far longer than any bound here), so a
# command that did not give up by itself would show as too slow.
. "$(dirname "$0")/../cli/lib.sh" "$@"

DB=$T/busy.db
export LEASE_STORE=sqlite://$DB
BOUND_MS=10000

call "$LEASE" acquire held --json
expect_rc 0 "setup: the store exists (WAL mode, schema made)"

# bounded DESCRIPTION MAX_MS: the last timed call ended within MAX_MS.
bounded() {
    if [ "$MS" -le "$2" ]; then pass; else
        fail "$1: took $MS ms, more than $2 ms$(_ctx)"
    fi
}

section "write lock held (BEGIN EXCLUSIVE in WAL mode)"
start_locker "$DB" 60
timed "$LEASE" --timeout 1s acquire k
expect_rc_in "6 7" "acquire --timeout 1s under a held write lock"
expect_stderr "acquire --timeout 1s under a held write lock"
bounded "acquire --timeout 1s under a held write lock" "$BOUND_MS"
timed "$LEASE" --timeout 1s acquire k --wait 2s
expect_rc_in "6 7" "acquire --timeout 1s --wait 2s under a held write lock"
bounded "acquire --timeout 1s --wait 2s under a held write lock" $((BOUND_MS + 2000))
timed "$LEASE" --timeout 1s fence res 1
expect_rc_in "6 7" "fence --timeout 1s under a held write lock"
bounded "fence --timeout 1s under a held write lock" "$BOUND_MS"
assert_no_file "$T/unlocked" "all of it while the lock was still held"
stop_locker
call "$LEASE" show k
expect_rc 1 "nothing was granted while the lock was held"

section "a database in rollback-journal mode, locked exclusively"
# The open itself must switch the file to WAL: it needs the exclusive lock
# that the other process holds, then the schema; all of it in one bound.
RB=$T/rollback.db
sqlite3 "$RB" "PRAGMA journal_mode=DELETE; CREATE TABLE other (x); INSERT INTO other VALUES (1);" >/dev/null
start_locker "$RB" 60
timed "$LEASE" --store "sqlite://$RB" --timeout 1s acquire k
expect_rc_in "6 7" "acquire --timeout 1s on an exclusively locked rollback-mode file"
expect_stderr "acquire --timeout 1s on an exclusively locked rollback-mode file"
bounded "acquire --timeout 1s on an exclusively locked rollback-mode file" "$BOUND_MS"
assert_no_file "$T/unlocked" "while the lock was still held"
stop_locker
call "$LEASE" --store "sqlite://$RB" acquire k --json
expect_rc 0 "the same file works once the lock is gone"

section "a lock that comes and goes"
# A writer that holds the lock for 0.8 s, lets go for 20 ms, and takes it
# again: each statement of a call could get through before its own 1 s,
# but the call as a whole must still end within the bound.
cat >"$T/cycle.py" <<'PY'
import sqlite3, sys, time, os
db = sqlite3.connect(sys.argv[1], timeout=5, isolation_level=None)
open(sys.argv[2], "w").close()
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    db.execute("BEGIN IMMEDIATE")
    time.sleep(0.8)
    db.execute("COMMIT")
    time.sleep(0.02)
PY
rm -f "$T/cycling"
python3 "$T/cycle.py" "$DB" "$T/cycling" 30 &
CYCLER=$!
bg_register "$CYCLER"
wait_for "the cycling writer started" test -e "$T/cycling"
for i in 1 2 3; do
    timed "$LEASE" --timeout 1s acquire "cycle$i"
    expect_rc_in "0 6 7" "acquire --timeout 1s against a cycling writer ($i)"
    bounded "acquire --timeout 1s against a cycling writer ($i)" "$BOUND_MS"
done
kill "$CYCLER" 2>/dev/null
wait "$CYCLER" 2>/dev/null

finish
