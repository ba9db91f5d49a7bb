#!/usr/bin/env bash
# sqlite_corrupt: what is read back from the SQLite file is range-checked
# (issue 10 item 7): another process may have written anything there. A
# token that is negative, 0, text, real, NULL or at the maximum, an expiry
# that is text or beyond its ttl, an owner that is not a UUID, a label or
# key too long or NULL, an `ended` out of range, a fencing mark that is not
# an integer: each is exit 6 with a message naming what was wrong, never a
# crash, never exit 0 with a guessed value, never a token issued again.
# The SQLite CHECK and NOT NULL constraints are what a careful writer meets;
# a hostile one drops them, so the tables are rebuilt without them first.
. "$(dirname "$0")/../cli/lib.sh" "$@"

DB=$T/corrupt.db
export LEASE_STORE=sqlite://$DB

call "$LEASE" acquire good --ttl 1h --json
expect_rc 0 "setup: a store with one lease"
OWNER=$(jget "$OUT" .owner)
call "$LEASE" fence res 3
expect_rc 0 "setup: a fencing mark"

# The same columns, no constraints: what a hostile writer can leave.
sqlite3 "$DB" <<'SQL' || die "could not rebuild the tables without constraints"
BEGIN;
CREATE TABLE lease_loose (key, owner, label, token, boot_id, expires_ms, ttl_ms,
                          acquired_ms, PRIMARY KEY (key)) WITHOUT ROWID;
INSERT INTO lease_loose SELECT * FROM lease;
DROP TABLE lease;
ALTER TABLE lease_loose RENAME TO lease;
CREATE TABLE hist_loose (key, token, owner, label, ttl_ms, acquired_ms, ended,
                         ended_ms, PRIMARY KEY (key, token)) WITHOUT ROWID;
INSERT INTO hist_loose SELECT * FROM lease_history;
DROP TABLE lease_history;
ALTER TABLE hist_loose RENAME TO lease_history;
CREATE TABLE fence_loose (resource PRIMARY KEY, mark) WITHOUT ROWID;
INSERT INTO fence_loose SELECT * FROM lease_fence;
DROP TABLE lease_fence;
ALTER TABLE fence_loose RENAME TO lease_fence;
COMMIT;
SQL
call "$LEASE" show good --json
expect_rc 0 "the rebuilt tables still work"
assert_eq "$(jget "$OUT" .state)" held "the lease is still held"

# A fresh, sound row for key K, held by $OWNER for 1 h (copied from 'good').
reset_row() {
    sqlite3 "$DB" "DELETE FROM lease WHERE key = '$1';
        INSERT INTO lease SELECT '$1', owner, label, token, boot_id, expires_ms,
            ttl_ms, acquired_ms FROM lease WHERE key = 'good';" ||
        die "could not reset the row of $1"
}

# malformed DESCRIPTION WORD CMD...: exit 6, WORD in the message, stdout empty.
malformed() {
    local what=$1 word=$2
    shift 2
    call "$LEASE" "$@"
    expect_error 6 "$what ($*)"
    assert_contains "$ERR" "$word" "$what ($*): the message names it"
    assert_contains "$ERR" "malformed" "$what ($*): the message says malformed"
}

# corrupt DESCRIPTION WORD SET-CLAUSE: one row of key 'bad' gets SET-CLAUSE;
# show, ls, acquire (by another owner and by the holder) and renew are all
# refused, and the row is left as it was (nothing was granted over it).
corrupt() {
    local what=$1 word=$2 set=$3 before after
    section "$what"
    reset_row bad
    sqlite3 "$DB" "UPDATE lease SET $set WHERE key = 'bad'" || die "UPDATE $set"
    before=$(sqlite3 "$DB" "SELECT quote(token), quote(owner), quote(expires_ms) FROM lease WHERE key = 'bad'")
    malformed "$what" "$word" show bad
    malformed "$what" "$word" show bad --json
    malformed "$what" "$word" ls
    malformed "$what" "$word" ls --json
    malformed "$what" "$word" acquire bad
    malformed "$what" "$word" acquire bad --owner "$OWNER"
    malformed "$what" "$word" acquire bad --wait 300ms
    after=$(sqlite3 "$DB" "SELECT quote(token), quote(owner), quote(expires_ms) FROM lease WHERE key = 'bad'")
    assert_eq "$after" "$before" "$what: the row was left as it was"
}

corrupt "token negative" token "token = -5"
corrupt "token 0" token "token = 0"
corrupt "token text" token "token = 'abc'"
corrupt "token a number in text" token "token = '7'"
corrupt "token real" token "token = 2.5"
corrupt "token NULL" token "token = NULL"
corrupt "token a blob" token "token = x'01'"
corrupt "token above 2^63-1 (stored as a real)" token "token = 18446744073709551615"
corrupt "owner not a UUID" owner "owner = 'not-a-uuid'"
corrupt "owner empty text" owner "owner = ''"
corrupt "owner an integer" owner "owner = 42"
corrupt "label NULL" label "label = NULL"
corrupt "label too long" label "label = printf('%.300c', 'x')"
corrupt "expiry text (would compare as never ending)" expires_ms "expires_ms = 'abc'"
corrupt "expiry NULL" expires_ms "expires_ms = NULL"
corrupt "expiry beyond its ttl" ttl "expires_ms = expires_ms + 100000000000"
corrupt "expiry at the largest integer" ttl "expires_ms = 9223372036854775807"
corrupt "ttl negative" ttl_ms "ttl_ms = -1"
corrupt "ttl text" ttl_ms "ttl_ms = '1h'"
corrupt "boot_id an integer" boot_id "boot_id = 7"

section "a key too long or empty in the table"
sqlite3 "$DB" "DELETE FROM lease WHERE key = 'bad'"
sqlite3 "$DB" "INSERT INTO lease SELECT printf('%.300c', 'k'), owner, label, token, boot_id,
    expires_ms, ttl_ms, acquired_ms FROM lease WHERE key = 'good'"
malformed "a 300-byte key" key ls
sqlite3 "$DB" "DELETE FROM lease WHERE length(key) = 300;
    INSERT INTO lease SELECT x'6b00', owner, label, token, boot_id, expires_ms, ttl_ms,
        acquired_ms FROM lease WHERE key = 'good'"
malformed "a key that is a blob with a NUL" key ls
sqlite3 "$DB" "DELETE FROM lease WHERE typeof(key) = 'blob'"
call "$LEASE" ls --json
expect_rc 0 "ls works again once the bad rows are gone"

section "the token counter at its maximum is exhausted, not wrapped"
reset_row max
sqlite3 "$DB" "UPDATE lease SET token = 9223372036854775807, owner = NULL WHERE key = 'max'"
call "$LEASE" acquire max
expect_error 6 "acquire over token 2^63-1"
assert_contains "$ERR" "exhausted" "the message says the counter is exhausted"

section "history"
call "$LEASE" history good --json
expect_rc 0 "setup: the history reads"
for set in "ended = 9" "ended = 'x'" "owner = NULL" "token = -1" "token = 'abc'" \
    "label = NULL" "acquired_ms = 'then'" "ttl_ms = -5"; do
    sqlite3 "$DB" "DROP TABLE IF EXISTS hist_save; CREATE TABLE hist_save AS SELECT * FROM lease_history;
        UPDATE lease_history SET $set WHERE key = 'good'"
    word=${set%% *}
    malformed "history row with $set" "$word" history good
    malformed "history row with $set" "$word" history good --json
    sqlite3 "$DB" "DELETE FROM lease_history; INSERT INTO lease_history SELECT * FROM hist_save"
done
call "$LEASE" history good --json
expect_rc 0 "history reads again once restored"

section "fencing marks"
# Neither read nor raised over: a token above the bad mark is refused too.
for set in "mark = 'abc'" "mark = -1" "mark = 0" "mark = NULL" "mark = 2.5"; do
    for tok in 1 9; do
        sqlite3 "$DB" "UPDATE lease_fence SET $set WHERE resource = 'res'"
        malformed "fencing mark with $set" mark fence res "$tok"
        after=$(sqlite3 "$DB" "SELECT quote(mark) FROM lease_fence WHERE resource = 'res'")
        assert_ne "$after" "$tok" "fencing mark with $set: not raised to $tok"
    done
    sqlite3 "$DB" "UPDATE lease_fence SET mark = 3 WHERE resource = 'res'"
done
call "$LEASE" fence res 2
expect_rc 5 "a sound mark still fences an older token"

section "the sound lease was never disturbed"
call "$LEASE" show good --json
expect_rc 0 "show good"
assert_eq "$(jget "$OUT" .state)" held "still held"
assert_eq "$(jget "$OUT" .owner)" "$OWNER" "by its owner"

finish
