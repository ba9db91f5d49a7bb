#!/usr/bin/env bash
# cli_timeout: the global --timeout bounds every store call, the opening of
# the store included ("--timeout DUR  bound on each store call"; store.h: a
# call that cannot finish in time fails with ESTORE or ETIMEOUT, never
# blocks longer). Another process holds the SQLite write lock for 3 s; a
# command given --timeout 200ms must come back while the lock is still held.
# Only ordering is asserted (the command returned before the locker's
# "unlocked" marker appeared), never a duration.
. "$(dirname "$0")/lib.sh" "$@"

S=sqlite://$T/basic.db
export LEASE_STORE=$S

call "$LEASE" acquire k
expect_rc 0 "setup: acquire k"

section "acquire"
start_locker "$T/basic.db" 3
call "$LEASE" --timeout 200ms acquire tmo
# store.h: a call that cannot finish in time fails with ESTORE or ETIMEOUT.
expect_rc_in "6 7" "acquire --timeout 200ms while another process holds the write lock"
expect_stderr "acquire --timeout 200ms while another process holds the write lock"
assert_no_file "$T/unlocked" "acquire --timeout 200ms came back before the lock was dropped"
stop_locker
call "$LEASE" show tmo
expect_rc 1 "the acquire refused for the lock changed nothing"

section "show"
start_locker "$T/basic.db" 3
call "$LEASE" --timeout 200ms show k --json
expect_rc_in "0 6 7" "show --timeout 200ms while the write lock is held: done or store failure"
assert_no_file "$T/unlocked" "show --timeout 200ms came back before the lock was dropped"
stop_locker

section "ls, --timeout after the command"
start_locker "$T/basic.db" 3
call "$LEASE" ls --json --timeout=200ms
expect_rc_in "0 6 7" "ls --timeout=200ms (after the command) while the write lock is held"
assert_no_file "$T/unlocked" "ls --timeout=200ms came back before the lock was dropped"
stop_locker

section "fence"
start_locker "$T/basic.db" 3
call "$LEASE" --timeout 200ms fence res 1
expect_rc_in "6 7" "fence --timeout 200ms while another process holds the write lock"
assert_no_file "$T/unlocked" "fence --timeout 200ms came back before the lock was dropped"
stop_locker
call "$LEASE" fence res 1 --json
expect_rc 0 "fence res 1 once the lock is dropped"

finish
