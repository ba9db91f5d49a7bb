#!/usr/bin/env bash
# cli_badinput: every kind of bad input gets its documented exit code and a
# message on stderr, and changes nothing in the store.
. "$(dirname "$0")/lib.sh" "$@"

S=sqlite://$T/bad.db
export LEASE_STORE=$S
OWNER=1b4e28ba-2fa1-11d2-883f-0016d3cca427
K255=$(printf 'k%.0s' $(seq 255))
K256=$(printf 'k%.0s' $(seq 256))

# Some state that bad input must leave alone: a held lease, a released one
# (token counter 1), and a fenced resource (mark 7).
call "$LEASE" acquire held --owner "$OWNER" --label keeper --ttl 10m
expect_rc 0 "setup: acquire held"
call "$LEASE" acquire freed --json
expect_rc 0 "setup: acquire freed"
call "$LEASE" release freed --owner "$(jget "$OUT" .owner)" --token 1
expect_rc 0 "setup: release freed"
call "$LEASE" fence res 7
expect_rc 0 "setup: fence res 7"
[ "$FAILURES" -eq 0 ] || die "setup failed"

# The store's state, as ls --json and the fence mark (read without change:
# token 1 is below the mark, so it is rejected and the mark reported).
state() {
    snapshot "$S"
    "$LEASE" --store "$S" fence res 1 --json 2>/dev/null
}
BASELINE=$(state)
assert_contains "$BASELINE" '"mark":7' "baseline fence mark"
assert_eq "$(printf '%s' "$BASELINE" | jq -s '.[0] | length' 2>&1)" 2 "baseline has two keys"

# bad CODE DESCRIPTION ARG...: lease ARG... exits CODE, says why on stderr,
# prints nothing on stdout, and the store is as before.
bad() {
    local code=$1 what=$2
    shift 2
    call "$LEASE" "$@"
    expect_error "$code" "$what"
    local now
    now=$(state)
    if [ "$now" = "$BASELINE" ]; then pass; else
        fail "$what: the store changed:
--- before
$BASELINE
--- after
$now"
    fi
}

section "unknown command"
bad 2 "unknown command" frobnicate
bad 2 "unknown command after --store" --store "$S" frobnicate k
bad 2 "unknown global option" --frobnicate ls
bad 2 "no command at all"

section "unknown flag for each command"
bad 2 "acquire --bogus" acquire k --bogus
bad 2 "acquire --bogus=1" acquire k --bogus=1
bad 2 "acquire -x" acquire k -x
bad 2 "renew --bogus" renew held --owner "$OWNER" --token 1 --bogus
bad 2 "release --bogus" release held --owner "$OWNER" --token 1 --bogus
bad 2 "show --bogus" show held --bogus
bad 2 "ls --bogus" ls --bogus
bad 2 "run --bogus" run k --bogus -- true
bad 2 "fence --bogus" fence res 8 --bogus
bad 2 "show --ttl (not a show flag)" show held --ttl 5s
bad 2 "release --ttl (not a release flag)" release held --owner "$OWNER" --token 1 --ttl 5s
bad 2 "fence --owner (not a fence flag)" fence res 8 --owner "$OWNER"

section "--help"
for cmd in acquire renew release show ls run fence; do
    call "$LEASE" "$cmd" --help
    expect_rc 0 "$cmd --help"
    assert_contains "$OUT" "usage: lease $cmd" "$cmd --help prints its usage on stdout"
    call "$LEASE" "$cmd" -h
    expect_rc 0 "$cmd -h"
    assert_contains "$OUT" "usage: lease $cmd" "$cmd -h prints its usage on stdout"
done
call "$LEASE" --help
expect_rc 0 "lease --help"
assert_contains "$OUT" "usage: lease" "lease --help prints the usage on stdout"
for cmd in acquire renew release show ls run fence; do
    assert_contains "$OUT" "$cmd" "lease --help mentions $cmd"
done
assert_eq "$(state)" "$BASELINE" "--help changed nothing"

section "missing arguments"
bad 2 "acquire without KEY" acquire
bad 2 "acquire with only flags" acquire --ttl 5s
bad 2 "renew without KEY" renew --owner "$OWNER" --token 1
bad 2 "release without KEY" release --owner "$OWNER" --token 1
bad 2 "show without KEY" show
bad 2 "run without KEY" run -- true
bad 2 "fence without arguments" fence
bad 2 "fence without TOKEN" fence res
bad 2 "acquire with two keys" acquire k1 k2
bad 2 "fence with three arguments" fence res 8 9
bad 2 "--ttl without its value" acquire k --ttl
bad 2 "--store without its value" ls --store

section "keys"
bad 2 "empty key" acquire ""
bad 2 "empty key for show" show ""
bad 2 "empty key for run" run "" -- true
bad 2 "empty resource for fence" fence "" 8
bad 2 "256-byte key" acquire "$K256"
bad 2 "256-byte key for renew" renew "$K256" --owner "$OWNER" --token 1
bad 2 "256-byte key for show" show "$K256"
bad 2 "256-byte resource for fence" fence "$K256" 8

section "labels"
bad 2 "256-byte label" acquire k --label "$K256"
bad 2 "256-byte label for run" run k --label "$K256" -- true

section "durations"
bad 2 "--ttl 0" acquire k --ttl 0
bad 2 "--ttl 0s" acquire k --ttl 0s
bad 2 "--ttl -5s" acquire k --ttl -5s
bad 2 "--ttl=-5s" acquire k --ttl=-5s
bad 2 "--ttl 10 (no unit)" acquire k --ttl 10
bad 2 "--ttl 1.5s (fraction)" acquire k --ttl 1.5s
bad 2 "--ttl 5x (bad unit)" acquire k --ttl 5x
bad 2 "--ttl '' (empty)" acquire k --ttl ""
bad 2 "--ttl overflowing 64 bits" acquire k --ttl 99999999999999999999h
bad 2 "--ttl 25h (above the 24h cap)" acquire k --ttl 25h
bad 2 "--wait abc" acquire k --wait abc
bad 2 "renew --ttl 0s" renew held --owner "$OWNER" --token 1 --ttl 0s
bad 2 "renew --ttl 25h" renew held --owner "$OWNER" --token 1 --ttl 25h
bad 2 "run --ttl 0s" run k --ttl 0s -- true
bad 2 "run --ttl 25h" run k --ttl 25h -- true
bad 2 "run --wait abc" run k --wait abc -- true
bad 2 "run --grace abc" run k --grace abc -- true
bad 2 "--timeout 0s" --timeout 0s ls
bad 2 "--timeout abc" ls --timeout abc

section "owner and token"
bad 2 "renew without --owner" renew held --token 1
bad 2 "renew without --token" renew held --owner "$OWNER"
bad 2 "release without --owner" release held --token 1
bad 2 "release without --token" release held --owner "$OWNER"
for tok in abc 0 -1 99999999999999999999 1x " 1" 9223372036854775808; do
    bad 2 "renew --token '$tok'" renew held --owner "$OWNER" --token "$tok"
    bad 2 "release --token '$tok'" release held --owner "$OWNER" --token "$tok"
done
bad 2 "acquire --owner not-a-uuid" acquire k --owner not-a-uuid
bad 2 "renew --owner not-a-uuid" renew held --owner not-a-uuid --token 1
bad 2 "release --owner not-a-uuid" release held --owner not-a-uuid --token 1
bad 2 "acquire --owner with a trailing character" acquire k --owner "${OWNER}0"
for tok in abc 0 -1 99999999999999999999; do
    bad 2 "fence res '$tok'" fence res "$tok"
done

section "store URLs"
bad 2 "unknown URL scheme" --store nosuch://x ls
bad 2 "unknown URL scheme, after the command" ls --store nosuch://x
bad 2 "URL without a scheme" --store /no/scheme.db ls
bad 2 "empty --store" --store "" ls
bad 2 "sqlite URL with a host" --store sqlite://host/x.db ls
bad 2 "sqlite URL with a host, acquire" --store sqlite://host/x.db acquire k
assert_no_file "$T/x.db" "no file made for a refused URL"
: >"$T/afile"
for cmd in "ls" "show k" "acquire k" "fence res 8"; do
    # shellcheck disable=SC2086
    bad 6 "unwritable store path ($cmd)" --store "sqlite://$T/afile/x.db" $cmd
done
assert_eq "$(stat -c %s "$T/afile")" 0 "the regular file in the way is untouched"

section "?tokens= on a store that takes none"
# Refused before any connection, with the same list of the stores that take
# it, all three of them (nothing listens on port 1).
tok_urls=("sqlite://$T/tok.db?tokens=clock")
has_store etcd && tok_urls+=("etcd://127.0.0.1:1?tokens=counter")
for url in "${tok_urls[@]}"; do
    bad 2 "$url" --store "$url" ls
    assert_contains "$ERR" "(redis, postgres, kubernetes)" "$url: the stores that take tokens= are named"
done
assert_no_file "$T/tok.db" "no file made for a refused tokens="

section "passwords never printed"
# Without a redis store (an SQLite-only build) the URL is refused (2)
# before any connection; with it, nothing listens on port 1 (6).
redis_rc=2
has_store redis && redis_rc=6
for args in "ls" "acquire k" "show k" "fence res 8" "run k -- true" "renew k --owner $OWNER --token 1"; do
    # shellcheck disable=SC2086
    call "$LEASE" --store redis://user:hunter2@127.0.0.1:1/0 $args
    expect_rc "$redis_rc" "redis URL ($args): nothing listens on port 1"
    expect_stderr "redis URL ($args)"
    assert_not_contains "$OUT$ERR" hunter2 "redis URL ($args): the password"
done
for url in "postgres://user:hunter2@127.0.0.1:1/db" "sqlite://user:hunter2@host/x.db" \
    "redis://:hunter2@127.0.0.1:1" "redis://user:hunter2%40x@127.0.0.1:1/0"; do
    call "$LEASE" --store "$url" ls
    assert_ne "$RC" 0 "store URL $url is refused"
    expect_stderr "store URL $url"
    assert_not_contains "$OUT$ERR" hunter2 "store URL $url: the password"
done
call env LEASE_STORE=redis://user:hunter2@127.0.0.1:1/0 "$LEASE" ls
expect_rc "$redis_rc" "LEASE_STORE with a password"
assert_not_contains "$OUT$ERR" hunter2 "LEASE_STORE with a password: the password"

section "run"
bad 2 "run without --" run k
bad 2 "run without --, with a command" run k true
bad 2 "run with -- but no command" run k --
bad 2 "run --grace larger than the ttl" run k --ttl 1s --grace 5s -- true
bad 2 "run --grace equal to the ttl" run k --ttl 1s --grace 1s -- true
bad 2 "run --grace larger than the default ttl" run k --grace 40s -- true

section "bad input gives 2 before any connection (nothing listens on port 1)"
# Each of these would be refused by the library, but only once the store
# was opened: with an unreachable store that was exit 6. Checked first now.
# (The SQLite store of `bad` is not involved: only the exit and messages.)
offline() {
    local what=$1
    shift
    call "$LEASE" "$@"
    expect_error 2 "$what"
}
for url in redis://127.0.0.1:1 postgres://127.0.0.1:1/db etcd://127.0.0.1:1; do
    offline "$url: acquire --label of 256 bytes" --store "$url" acquire k --label "$K256"
    offline "$url: acquire --wait 25h" --store "$url" acquire k --wait 25h
    offline "$url: acquire --ttl 25h" --store "$url" acquire k --ttl 25h
    offline "$url: run --label of 256 bytes" --store "$url" run k --label "$K256" -- touch "$T/ran"
    offline "$url: run --wait 25h" --store "$url" run k --wait 25h -- touch "$T/ran"
    offline "$url: run --grace 25h" --store "$url" run k --grace 25h -- touch "$T/ran"
    offline "$url: elect --label of 256 bytes" --store "$url" elect n --label "$K256" -- touch "$T/ran"
    offline "$url: elect --wait 25h" --store "$url" elect n --wait 25h -- touch "$T/ran"
    offline "$url: --timeout 25h" --store "$url" --timeout 25h ls
done
# The other flags, against one unreachable store (each was already checked
# before connecting; this keeps it so).
for url in postgres://127.0.0.1:1/db; do
    offline "$url: show with a 256-byte key" --store "$url" show "$K256"
    offline "$url: ls with a 256-byte prefix" --store "$url" ls "$K256"
    offline "$url: history --limit 201" --store "$url" history k --limit 201
    offline "$url: history --limit 0" --store "$url" history k --limit 0
    offline "$url: renew --token 0" --store "$url" renew k --owner "$OWNER" --token 0
    offline "$url: release --owner bad" --store "$url" release k --owner bad --token 1
    offline "$url: fence TOKEN 0" --store "$url" fence res 0
    offline "$url: leader --count 0" --store "$url" leader n --watch --count 0
    offline "$url: agent --label of 256 bytes" --store "$url" agent n --listen 127.0.0.1:9 --label "$K256"
done
assert_no_file "$T/ran" "no command ran"
# A bad URL parameter is the store's open to refuse, before it connects.
for url in "postgres://127.0.0.1:1/db?lease_table=" "postgres://127.0.0.1:1/db?lease_table=a;b" \
    "postgres://127.0.0.1:1/db?lease_table=$K256"; do
    offline "$url: a bad lease_table" --store "$url" show k
done

section "limits that must work"
call "$LEASE" acquire "$K255" --json
expect_rc 0 "a 255-byte key"
assert_eq "$(jget "$OUT" .key)" "$K255" "255-byte key echoed back"
call "$LEASE" show "$K255" --json
expect_rc 0 "show of a 255-byte key"
call "$LEASE" acquire longlabel --label "$K255" --json
expect_rc 0 "a 255-byte label"
assert_eq "$(jget "$OUT" .label)" "$K255" "255-byte label echoed back"
call "$LEASE" acquire cap --ttl 24h --json
expect_rc 0 "--ttl 24h (the cap itself)"
assert_eq "$(jget "$OUT" .ttl_ms)" 86400000 "--ttl 24h: ttl_ms"
call "$LEASE" acquire mixed --ttl 1m30s --json
expect_rc 0 "--ttl 1m30s"
assert_eq "$(jget "$OUT" .ttl_ms)" 90000 "--ttl 1m30s: ttl_ms"
call "$LEASE" acquire upper --owner "${OWNER^^}" --json
expect_rc 0 "--owner in upper case"
assert_eq "$(jget "$OUT" .owner)" "$OWNER" "owner is kept in canonical lower case"
call "$LEASE" fence big 9223372036854775807 --json
expect_rc 0 "fence with the largest token"

finish
