#!/usr/bin/env bash
# The SQLite store's clock: a lease written during another boot is expired
# (a reboot ends every lease) and the token counter survives it; a step of
# the wall clock cannot move expiry (the store never reads it).
. "$(dirname "$0")/lib.sh" "$@"

DB=$T/clock.db
export LEASE_STORE=sqlite://$DB

section "a lease from another boot is expired, its token kept"
call "$LEASE" acquire boot/k --ttl 1h --json
expect_rc 0 "acquire with a 1 h ttl"
tok=$(jget "$OUT" .token)
call "$LEASE" show boot/k --json
assert_eq "$(jget "$OUT" .state)" held "held before the 'reboot'"
# What a reboot changes: the kernel's boot id (and CLOCK_BOOTTIME restarts).
sqlite3 "$DB" "UPDATE lease SET boot_id = 'an-earlier-boot' WHERE key = 'boot/k'"
call "$LEASE" show boot/k --json
expect_rc 0 "show after the 'reboot'"
assert_ne "$(jget "$OUT" .state)" held "not held any more"
call "$LEASE" acquire boot/k --ttl 1h --json
expect_rc 0 "another owner acquires at once"
assert_gt "$(jget "$OUT" .token)" "$tok" "with a greater token"

section "expiry is not read from the wall clock"
# The row's expiry is on CLOCK_BOOTTIME of this boot; the schema has no
# wall-clock column the store could compare against.
call sqlite3 "$DB" "SELECT name FROM pragma_table_info('lease')"
assert_not_contains "$OUT" "until" "no wall-clock expiry column"
assert_contains "$OUT" "expires_ms" "expiry on the boot clock"
assert_contains "$OUT" "boot_id" "with the boot it belongs to"

finish
