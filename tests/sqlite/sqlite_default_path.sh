#!/usr/bin/env bash
# sqlite_default_path: with no --store and no LEASE_STORE, the store is
# $XDG_STATE_HOME/lease/lease.db or ~/.local/state/lease/lease.db, and the
# CLI makes its directory. That must work when HOME or XDG_STATE_HOME holds
# a space or non-ASCII bytes (the default URL is percent-encoded: the
# directory made must be the decoded one, the one the store then opens).
. "$(dirname "$0")/../cli/lib.sh" "$@"

unset LEASE_STORE

# works_under VAR DIR DBFILE: with VAR=DIR (and the other one unset), acquire
# and show work and the store is DBFILE; no percent-encoded directory is made.
works_under() {
    local var=$1 dir=$2 db=$3
    mkdir -p "$dir"
    if [ "$var" = HOME ]; then
        call env -u XDG_STATE_HOME HOME="$dir" "$LEASE" acquire "k" --json
    else
        call env XDG_STATE_HOME="$dir" HOME="$T/nohome" "$LEASE" acquire "k" --json
    fi
    expect_rc 0 "acquire with $var='$dir'"
    assert_file "$db" "the default store is $db"
    if [ "$var" = HOME ]; then
        call env -u XDG_STATE_HOME HOME="$dir" "$LEASE" show k --json
    else
        call env XDG_STATE_HOME="$dir" HOME="$T/nohome" "$LEASE" show k --json
    fi
    expect_rc 0 "show with $var='$dir'"
    assert_eq "$(jget "$OUT" .state)" held "the lease is in that store"
    assert_eq "$(find "$T" -name '*%[0-9A-F][0-9A-F]*' | head -3)" "" "no percent-encoded directory was made"
}

section "HOME with a space"
works_under HOME "$T/with space" "$T/with space/.local/state/lease/lease.db"

section "HOME with é"
works_under HOME "$T/caf$(printf '\xc3\xa9')" "$T/caf$(printf '\xc3\xa9')/.local/state/lease/lease.db"

section "HOME with a percent sign and a question mark"
works_under HOME "$T/100% sure?" "$T/100% sure?/.local/state/lease/lease.db"

section "XDG_STATE_HOME with a space and é"
works_under XDG_STATE_HOME "$T/state d$(printf '\xc3\xa9')j$(printf '\xc3\xa0')" \
    "$T/state d$(printf '\xc3\xa9')j$(printf '\xc3\xa0')/lease/lease.db"

section "the directory made is private"
assert_eq "$(stat -c %a "$T/with space/.local/state/lease")" 700 "lease/ is 0700"
assert_eq "$(stat -c %a "$T/with space/.local/state/lease/lease.db")" 600 "lease.db is 0600"

finish
