#!/usr/bin/env bash
# kube_checks.sh - the Kubernetes store's own checks, against throw-away
# Lease API doubles (scripts/kube-server.sh, tests/kubernetes/fake_kube.py):
#  1. bad input and errors (issue 17 point 8): a namespace that is not a DNS
#     label, a missing token file, a wrong token (401), the forbidden token
#     (403, with the RBAC hint), a server that is not Kubernetes (404 on the
#     API group: python's http.server), a 429 with Retry-After (waited out
#     within the timeout, or ETIMEOUT past it) - each with its exit code, and
#     no token text in any message;
#  2. key names: two keys that sanitise alike get two objects; an object
#     whose liblease/key names another key is refused (ESTORE); a hashed
#     name (a key, a fencing mark) ends in 24 hex digits of its SHA-256;
#  3. expiry: a lease whose renewTime is an hour old by its holder's clock
#     but whose holder keeps renewing is not taken over; once it stops it
#     is; annotation writes keep no silent holder; one whose renewTime is far
#     in the future (a holder's clock ahead) is taken over after the duration
#     all the same; an expired lease is not renewed by another process
#     (ELOST, or ESTORE when nothing can tell);
#  4. tokens stay newer after the object was deleted (tokens=clock), and
#     tokens=counter counts from 1;
#  5. a waiter is woken by a watch (the double counts the watches);
#  6. every descriptor of the store is close-on-exec (kube_checks cloexec).
#
#   kube_checks.sh LEASE_BINARY KUBE_CHECKS_BINARY SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"

CHECKER=${2:?usage: kube_checks.sh LEASE KUBE_CHECKS SOURCE_DIR}
SRC=${3:?usage: kube_checks.sh LEASE KUBE_CHECKS SOURCE_DIR}
. "$(dirname "$0")/kube_lib.sh"

# no_secret WHAT: neither token appears in the last call's output.
no_secret() {
    assert_not_contains "$OUT$ERR" "$TOKEN" "$1: the token is not shown"
    assert_not_contains "$OUT$ERR" "$(cat "$DIR/forbidden-token")" \
        "$1: the forbidden token is not shown"
}

start_double main
L=$LEASE

section "bad input and errors"
call "$L" --store "kubernetes+http://127.0.0.1:$PORT/Not_A_Label?token_file=$DIR/token" show k
expect_error 2 "a namespace that is not a DNS label"
assert_contains "$ERR" "DNS label" "the namespace message"
call "$L" --store "kubernetes+http://127.example.com:$PORT/default?token_file=$DIR/token" show k
expect_error 2 "plain HTTP to a host that is not this one"
assert_contains "$ERR" "in clear" "the refusal says why"
call "$L" --store "kubernetes+http://127.0.0.1:$PORT/?token_file=$DIR/token" show k
expect_error 2 "no namespace"
call "$L" --store "kubernetes+http://127.0.0.1:$PORT/default?token_file=$T/no-such-token" show k
expect_error 2 "a missing token file"
assert_contains "$ERR" "no-such-token" "the missing file is named"

(umask 077 && printf "wrong-%s\n" "$TOKEN" > "$T/bad.tok")
call "$L" --store "kubernetes+http://127.0.0.1:$PORT/default?token_file=$T/bad.tok" show k
expect_error 6 "a token the server refuses (401)"
assert_contains "$ERR" "unauthorized" "401 says unauthorized"
assert_not_contains "$ERR" "wrong-" "the wrong token is not shown"
no_secret "401"

call "$L" --store "kubernetes+http://127.0.0.1:$PORT/default?token_file=$DIR/forbidden-token" \
    acquire k --ttl 5s
expect_error 6 "a token RBAC forbids (403)"
assert_contains "$ERR" "forbidden" "403 says forbidden"
assert_contains "$ERR" "RBAC" "403 names RBAC"
no_secret "403"

# A web server that is not Kubernetes: 404 on the API group.
pick_port || die "no free port"
mkdir -p "$T/www"
python3 -m http.server --bind 127.0.0.1 --directory "$T/www" "$PORT" >/dev/null 2>&1 &
bg_register $!
wait_for "http.server listens" curl -s -o /dev/null "http://127.0.0.1:$PORT/"
call "$L" --store "kubernetes+http://127.0.0.1:$PORT/default?token_file=$DIR/token" show k
expect_error 6 "a server that is not Kubernetes"
assert_contains "$ERR" "not a Kubernetes API server" "the 404 message"
no_secret "404"

# 429 with Retry-After: waited out within the call's timeout ...
kapi POST /fake/v1/faults '{"status":429,"retry_after":1,"count":1,"path_prefix":"/apis/coordination.k8s.io/v1/namespaces/"}' >/dev/null
call "$L" --store "$URL" --timeout 8s acquire throttled --ttl 5s --json
expect_rc 0 "a 429 with Retry-After 1 s is waited out"
# ... and past it, ETIMEOUT with the server's request in the message.
kapi POST /fake/v1/faults '{"status":429,"retry_after":30,"count":1,"path_prefix":"/apis/coordination.k8s.io/v1/namespaces/"}' >/dev/null
call "$L" --store "$URL" --timeout 2s show throttled
expect_error 7 "a 429 asking for more than the timeout"
assert_contains "$ERR" "429" "the 429 message"
no_secret "429"
kapi POST /fake/v1/reset >/dev/null

section "key names"
# "a/b" and "a_b" both become "liblease-k-a-b-<hash>": two objects.
call "$L" --store "$URL" acquire "x/A/b" --ttl 30s --json
expect_rc 0 "acquire x/A/b"
call "$L" --store "$URL" acquire "x/a_b" --ttl 30s --json
expect_rc 0 "acquire x/a_b (another object, not busy)"
names=$(kapi GET "$LEASES" | jq -r '.items[].metadata.name' | grep -c '^liblease-k-x-a-b-')
assert_eq "$names" 2 "two objects for two keys that sanitise alike"
# A hashed name ends in the first 96 bits of the key's SHA-256 (24 hex
# digits): no key can be crafted to take another's object.
for k in x/A/b x/a_b; do
    h=$(printf '%s' "$k" | sha256sum | cut -c1-24)
    assert_eq "$(kapi GET "$LEASES/liblease-k-x-a-b-$h" | jq -r '.metadata.annotations["liblease/key"]')" \
        "$k" "'$k' is the object liblease-k-x-a-b-<SHA-256 of the key>"
done
call "$L" --store "$URL" fence "res/Fenced" 5
expect_rc 0 "a fencing mark"
h=$(printf '%s' "res/Fenced" | sha256sum | cut -c1-24)
assert_eq "$(kapi GET "$LEASES/liblease-f-res-fenced-$h" | jq -r '.metadata.annotations["liblease/resource"]')" \
    "res/Fenced" "a fencing mark is the object liblease-f-<part>-<SHA-256 of the resource>"
call "$L" --store "$URL" acquire "plain-name.ok" --ttl 30s --json
expect_rc 0 "acquire a key that is a valid name"
assert_eq "$(kapi GET "$LEASES/plain-name.ok" | jq -r '.metadata.annotations["liblease/key"]')" \
    "plain-name.ok" "a valid name is the object's name"
# An object that holds another key is refused, never taken as this one.
kapi PATCH "$LEASES/plain-name.ok" '{"metadata":{"annotations":{"liblease/key":"other-key"}}}' >/dev/null
call "$L" --store "$URL" show plain-name.ok
expect_error 6 "an object holding another key"
assert_contains "$ERR" "holds key 'other-key'" "the mismatch is named"

section "expiry"
# A foreign holder (client-go style) whose clock is an hour behind: its
# renewTime is old, but it renews (the record changes), so it is never
# taken over: not by rule (a), and not by the server's clock either (with
# the default max_skew), which must see the record unchanged for half the
# duration first and learns from the renewals it sees that the clock is
# behind.
old=$(date -u -d '-1 hour' +%Y-%m-%dT%H:%M:%S.000000Z)
kapi POST "$LEASES" "{\"metadata\":{\"name\":\"renewing\"},\"spec\":{\"holderIdentity\":\"pod-a\",\"leaseDurationSeconds\":2,\"renewTime\":\"$old\",\"acquireTime\":\"$old\"}}" >/dev/null
(
    for i in $(seq 100); do
        [ -e "$T/stop-beat" ] && break
        t=$(date -u -d '-1 hour' +%Y-%m-%dT%H:%M:%S.%6NZ)
        kapi PATCH "$LEASES/renewing" "{\"spec\":{\"renewTime\":\"$t\"}}" >/dev/null
        sleep 0.3
    done
) &
bg_register $!
call "$L" --store "$URL" acquire renewing --ttl 2s --wait 5s
expect_error 7 "a renewing holder with an old renewTime is not taken over"
touch "$T/stop-beat"
call "$L" --store "$URL&tokens=counter" acquire renewing --ttl 2s --wait 15s --json
expect_rc 0 "taken over once its record stops changing"
assert_eq "$(jget "$OUT" .token)" 1 "the first token of a foreign Lease (tokens=counter)"
# Writes that leave the holder's record alone (annotations: a label, a
# history mark) are no renewal: they keep no dead holder alive. max_skew=0
# leaves client-go's rule alone to decide.
now=$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)
kapi POST "$LEASES" "{\"metadata\":{\"name\":\"annotated\"},\"spec\":{\"holderIdentity\":\"pod-c\",\"leaseDurationSeconds\":2,\"renewTime\":\"$now\",\"acquireTime\":\"$now\"}}" >/dev/null
(
    for i in $(seq 100); do
        [ -e "$T/stop-note" ] && break
        kapi PATCH "$LEASES/annotated" "{\"metadata\":{\"annotations\":{\"note\":\"$i\"}}}" >/dev/null
        sleep 0.3
    done
) &
bg_register $!
call "$L" --store "$URL&max_skew=0" acquire annotated --ttl 2s --wait 10s --json
expect_rc 0 "annotation writes do not keep a silent holder"
touch "$T/stop-note"
# A holder whose clock is an hour ahead: renewTime in the future does not
# keep the lease: it ends after the duration unchanged.
new=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%S.000000Z)
kapi POST "$LEASES" "{\"metadata\":{\"name\":\"ahead\"},\"spec\":{\"holderIdentity\":\"pod-b\",\"leaseDurationSeconds\":1,\"renewTime\":\"$new\",\"acquireTime\":\"$new\"}}" >/dev/null
call "$L" --store "$URL" acquire ahead --ttl 2s --wait 15s --json
expect_rc 0 "a silent holder is taken over whatever its renewTime says"

section "an expired lease is never revived"
# Another process of the same owner (a fresh handle) must prove the lease
# alive before it renews or keeps the token: within the ttl the server's
# clock does; after it, the server's clock says it ran out (ELOST) once it
# is past renewTime + ttl + max_skew + 1 s; with max_skew=0 nothing can
# tell (ESTORE, uncertain). Either way nothing is renewed.
call "$L" --store "$URL" acquire revive/long --ttl 30s --json
expect_rc 0 "acquire with a long ttl"
o=$(jget "$OUT" .owner); t=$(jget "$OUT" .token)
call "$L" --store "$URL" renew revive/long --owner "$o" --token "$t" --ttl 30s
expect_rc 0 "another process renews within the ttl"
call "$L" --store "$URL" acquire revive/short --ttl 1s --json
expect_rc 0 "acquire with a 1 s ttl"
o=$(jget "$OUT" .owner); t=$(jget "$OUT" .token)
# renewTime rounded up + 1 + 2 + 1 s against the Date rounded down.
sleep 5.5
call "$L" --store "$URL&max_skew=2" renew revive/short --owner "$o" --token "$t" --ttl 30s
expect_error 4 "no renew after the ttl (max_skew=2: the server's clock says it ran out)"
call "$L" --store "$URL&max_skew=0" renew revive/short --owner "$o" --token "$t" --ttl 30s
expect_error 6 "no renew after the ttl (max_skew=0: uncertain)"
call "$L" --store "$URL" show revive/short --json
assert_eq "$(jget "$OUT" '[.state, .token] | @tsv')" "$(printf 'expired\t%s' "$t")" \
    "still expired, same token"
call "$L" --store "$URL&max_skew=0" acquire revive/short --owner "$o" --ttl 30s --json
expect_rc 0 "the same owner acquires again"
assert_gt "$(jget "$OUT" .token)" "$t" "a new generation, not the old token"

section "tokens after the object was deleted"
# The counter lives in the object: `kubectl delete lease` takes it along.
# With tokens=clock (the default) the next holder's token is at least the
# server's clock in µs, past every token the deleted object gave out once
# the server's second has moved on (the sleep lets it; within the same
# second a token may repeat: docs/stores.md).
call "$L" --store "$URL" acquire tok/deleted --ttl 30s --json
expect_rc 0 "acquire before the deletion"
t1=$(jget "$OUT" .token)
call "$L" --store "$URL" release tok/deleted --owner "$(jget "$OUT" .owner)" --token "$t1"
expect_rc 0 "release before the deletion"
name=$(kapi GET "$LEASES" | jq -r '.items[] | select(.metadata.annotations["liblease/key"] == "tok/deleted") | .metadata.name')
kapi DELETE "$LEASES/$name" >/dev/null
assert_eq "$(kapi GET "$LEASES/$name" | jq -r .code)" 404 "the object is gone"
sleep 1.1
call "$L" --store "$URL" acquire tok/deleted --ttl 30s --json
expect_rc 0 "acquire after the deletion"
assert_gt "$(jget "$OUT" .token)" "$t1" "the new token is newer than the deleted object's"
call "$L" --store "$URL&tokens=counter" acquire tok/counter --ttl 1s --json
expect_rc 0 "acquire with tokens=counter"
assert_eq "$(jget "$OUT" .token)" 1 "tokens=counter starts at 1"
call "$L" --store "$URL&tokens=sometimes" show tok/counter
expect_error 2 "an unknown tokens= mode"

section "a watch wakes the waiter"
w0=$(kapi GET /fake/v1/stats | jq -r .watches)
call "$CHECKER" wake "$URL" wake/one
expect_rc 0 "the waiter gets the released key"
w1=$(kapi GET /fake/v1/stats | jq -r .watches)
assert_gt "$w1" "$w0" "the waiter waited on a watch"

section "a waiter watches from the server's latest version"
# A lease renewed rarely keeps an old resourceVersion; once other writes
# have pushed it out of the server's window of events (5 here), a watch
# from it would be answered 410 Gone at once, again and again. The waiter
# watches from its list read's version instead: one watch for the wait.
start_double window --watch-window 5
call "$L" --store "$URL" acquire old/rv --ttl 60s
expect_rc 0 "a holder that will not renew for a while"
for i in $(seq 12); do
    kapi POST "$LEASES" "{\"metadata\":{\"name\":\"other-$i\"},\"spec\":{}}" >/dev/null
done
g0=$(kapi GET /fake/v1/stats | jq -r .gone)
call "$L" --store "$URL" acquire old/rv --ttl 60s --wait 3s
expect_error 7 "still held after the wait"
stats=$(kapi GET /fake/v1/stats)
assert_gt "$(jq -r .watches <<<"$stats")" 0 "the waiter watched"
assert_eq "$(jq -r .gone <<<"$stats")" "$g0" "no watch was answered 410 Gone"

section "close-on-exec"
call "$CHECKER" cloexec "$URL" cloexec/one
expect_rc 0 "every descriptor of the store is close-on-exec"

finish
