#!/usr/bin/env bash
# etcd_h2_reuse, against a real member: the gRPC transport's connection
# goes away between calls (a forwarder, h2_forwarder.py, cuts every
# connection 0.5 s after it opened). A call on the connection the store
# believed cached then meets etcd's HTTP/1.1 gateway (libcurl 7.88 must not
# reuse a prior-knowledge HTTP/2 connection as such: docs/stores.md), which
# answers 404 and applies nothing; the store sends the call again over a
# new HTTP/2 connection. `lease run` renews every second for 4 s through
# it: every renewal and the release succeed, and the forwarder saw the
# HTTP/1.1 connections that prove the path was taken.
. "$(dirname "$0")/etcd_lib.sh" "$1"
command -v python3 >/dev/null || die "python3 is required"

etcd_cluster 1 || die "no etcd member"
pf=$T/fwd.port
python3 "$HERE/h2_forwarder.py" "$pf" "${CPORT[e1]}" 0.5 &
bg_register $!
wait_for "the forwarder listens" test -s "$pf" || die "no forwarder"
FWD="etcd://127.0.0.1:$(cat "$pf")"

section "lease run renewing through connections that go away"
call "$LEASE" --store "$FWD" run reuse/k --ttl 3s -- sleep 4
expect_rc 0 "the child ran to its end under the lease"
assert_not_contains "$ERR" "renewal_failed" "no renewal failed"
call "$LEASE" --store "$URL" history reuse/k --json
expect_rc 0 "history"
assert_eq "$(jget "$OUT" '.[0].ended')" "released" "the grant ended released, not lost"
h1=$(cat "$pf.h1")
assert_gt "$h1" 2 "calls met the gateway over HTTP/1.1 and were sent again ($h1 times)"

finish
