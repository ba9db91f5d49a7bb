#!/usr/bin/env bash
# etcd_ttl: etcd leases are whole seconds with a server-side minimum, so a
# short ttl is rounded up; the grant reports the ttl etcd granted, and the
# holder's local deadline and renewals use it, never the one asked for.
#
#   lease acquire k --ttl 200ms --json   ttl_ms >= 1000 (whole seconds), and
#                                        valid_ms comes from it, not from 200
#   lease show / etcdctl lease timetolive agree with ttl_ms
#   lease renew --ttl 200ms              rounded up the same way
#   lease run --ttl 200ms -- sleep 3     holds the lease for 3 s, renewing on
#                                        the granted ttl's schedule
#   etcd_client ttl URL                  the same through the API, with the
#                                        deadline bounded by the clock
#                                        readings around the call
. "$(dirname "$0")/etcd_lib.sh" "$@"
CLIENT=${2:?usage: $0 LEASE_BINARY ETCD_CLIENT_BINARY}

section "one member"
etcd_cluster 1 || die "start a member"

section "lease acquire k --ttl 200ms --json"
# etcd grants its minimum, 2 s. The commands that need the key held run
# one after the other and their answers are read afterwards: the jq and
# etcdctl runs in between took over 2 s when the machine was busy (on
# either transport), and the renew found the key expired. The renew keeps
# the etcd lease alive for the etcdctl reads that follow it.
call "$LEASE" --store "$URL" acquire ttl/k --ttl 200ms --json
expect_rc 0 "acquire with a 200 ms ttl"
ACQ_OUT=$OUT
read -r TOKEN OWNER <<<"$(jget "$OUT" '"\(.token) \(.owner)"')"
call "$LEASE" --store "$URL" show ttl/k --json
expect_rc 0 "show"
SHOW_OUT=$OUT

section "lease renew --ttl 200ms"
call "$LEASE" --store "$URL" renew ttl/k --owner "$OWNER" --token "$TOKEN" --ttl 200ms --json
expect_rc 0 "renew with a 200 ms ttl"
RENEW_OUT=$OUT
LID=$(ectl get /lease/lease/ttl/k -w json | sed -E 's/"lease":([0-9]+)/"lease":"\1"/' | jq -r '.kvs[0].lease')
LTTL=""
[[ $LID =~ ^[1-9][0-9]*$ ]] && LTTL=$(ectl lease timetolive "$(printf '%x' "$LID")")
call "$LEASE" --store "$URL" release ttl/k --owner "$OWNER" --token "$TOKEN"
expect_rc 0 "release"

GRANTED=$(jget "$ACQ_OUT" .ttl_ms)
VALID=$(jget "$ACQ_OUT" .valid_ms)
echo "asked 200 ms: granted $GRANTED ms, valid_ms $VALID"
assert_match "$GRANTED" '^[0-9]+$' "ttl_ms is a number"
if [ "$GRANTED" -ge 1000 ] 2>/dev/null; then pass; else fail "ttl_ms $GRANTED: expected >= 1000 (etcd rounds up to whole seconds)"; fi
assert_eq "$((GRANTED % 1000))" 0 "ttl_ms is whole seconds"
# valid_ms = the local deadline (send time + granted ttl - a margin) minus
# the time until it was printed. From a 200 ms ttl it could never exceed
# 200; from the granted ttl it does unless printing took over a second.
assert_gt "$VALID" 200 "valid_ms comes from the granted ttl, not from 200 ms"
if [ "$VALID" -le "$GRANTED" ] 2>/dev/null; then pass; else fail "valid_ms $VALID exceeds the granted ttl $GRANTED"; fi
assert_eq "$(jget "$SHOW_OUT" .ttl_ms)" "$GRANTED" "show reports the granted ttl"
assert_eq "$(jget "$SHOW_OUT" .token)" "$TOKEN" "show: the token"
assert_match "$LID" '^[1-9][0-9]*$' "the key has an etcd lease"
assert_contains "$LTTL" "granted with TTL($((GRANTED / 1000))s)" \
    "etcd granted what lease reported"
R=$(jget "$RENEW_OUT" .ttl_ms)
if [ "$R" -ge 1000 ] 2>/dev/null; then pass; else fail "renew: ttl_ms $R, expected >= 1000"; fi
assert_eq "$((R % 1000))" 0 "renew: whole seconds"
assert_gt "$(jget "$RENEW_OUT" .valid_ms)" 200 "renew: valid_ms from the granted ttl"

section "other short ttls round up, never down"
for asked in 1ms 999ms 1001ms 2500ms; do
    call "$LEASE" --store "$URL" acquire "ttl/$asked" --ttl "$asked" --json
    expect_rc 0 "acquire --ttl $asked"
    g=$(jget "$OUT" .ttl_ms)
    ms=${asked%ms}
    if [ "$g" -ge "$ms" ] 2>/dev/null && [ "$g" -ge 1000 ] && [ $((g % 1000)) = 0 ]; then pass; else
        fail "--ttl $asked granted '$g': expected whole seconds, >= $ms and >= 1000"
    fi
done

section "lease run --ttl 200ms -- sleep 3: renewed on the granted schedule"
call "$LEASE" --store "$URL" run ttl/run --ttl 200ms --json -- sleep 3
expect_rc 0 "the child ran to its end under the lease"
ACQ=$(printf '%s\n' "$ERR" | grep '"event":"acquired"' | head -n 1)
G=$(jget "$ACQ" .ttl_ms)
if [ "$G" -ge 1000 ] 2>/dev/null; then pass; else fail "run: ttl_ms $G, expected >= 1000"; fi
assert_not_contains "$ERR" '"event":"lost"' "no lost event"
assert_not_contains "$ERR" '"event":"stopping"' "the child was never stopped"
assert_contains "$ERR" '"event":"released"' "released at the end"

section "the API: etcd_client ttl"
call "$CLIENT" ttl "$URL"
echo "$OUT"
[ -z "$ERR" ] || echo "$ERR" >&2
expect_rc 0 "etcd_client ttl"

finish
