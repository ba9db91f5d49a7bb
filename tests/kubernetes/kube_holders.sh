#!/usr/bin/env bash
# kube_holders.sh - what may and may not end a Kubernetes lease, with short
# ttls (2-3 s, where the API server's clock cannot vouch for a renewal):
#  1. a write that leaves the holder, its token and its renewTime alone (a
#     stale holder's failed renew marking its own grant lost in the shared
#     history) never costs the holder its lease: `lease run --ttl 3s` keeps
#     renewing, its child is not stopped;
#  2. a renew from a second process with the right owner and token, which
#     cannot prove the lease alive, is ESTORE (uncertain, exit 6), writes
#     nothing, and never costs the holder (`lease run --ttl 3s`) its lease;
#  3. a client-go-style holder (clientgo_leader.py) renewing with a clock an
#     hour behind, and one an hour ahead, is never taken over while it
#     renews (`lease acquire --wait` ends ETIMEOUT), and is taken over once
#     it stops;
#  4. a holder that the candidate has seen renew with a renewTime already
#     past the server-clock rule (its clock is behind) is then taken over by
#     client-go's rule only: renewals further apart than half the duration
#     but within it keep it;
#  5. `lease run` on a host whose clock is an hour behind the API server's
#     (the double's Date moved ahead) keeps its lease, and a candidate on
#     that host does not take it.
#
#   kube_holders.sh LEASE_BINARY SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"

SRC=${2:?usage: kube_holders.sh LEASE SOURCE_DIR}
KS=$SRC/scripts/kube-server.sh
PY=/usr/bin/python3
LEADER=$SRC/tests/kubernetes/clientgo_leader.py
for tool in curl jq; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required"
done
"$PY" -c 'import kubernetes.client' 2>/dev/null ||
    die "python3-kubernetes is required (apt-get install python3-kubernetes)"
has_store kubernetes || die "this lease has no kubernetes store (stores: $(lease_stores))"

DIR=$T/kube
trap '"$KS" stop "$DIR" >/dev/null 2>&1; cleanup' EXIT
pick_port || die "no free port"
"$KS" start "$DIR" "$PORT" >/dev/null || die "the double did not start"
URL=$("$KS" url "$DIR")
BASE=http://127.0.0.1:$PORT
TOKEN=$(cat "$DIR/token")
LEASES=/apis/coordination.k8s.io/v1/namespaces/default/leases
export LEASE_STORE=$URL T

kapi() {
    local ct=application/json
    [ "$1" = PATCH ] && ct=application/merge-patch+json
    curl -sS --max-time 10 -X "$1" -H "Authorization: Bearer $TOKEN" \
        -H "Content-Type: $ct" ${3:+--data "$3"} "$BASE$2"
}

# wait_file FILE: a child's loop until FILE exists (60 s at most).
wait_file() {
    printf 'i=0; while [ ! -e "%s" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done' "$1"
}

# run_start N KEY SLEEP [FLAGS...]: `lease run KEY --ttl 3s` in the
# background ($RUN), its child writing its owner and token to $T/N.grant,
# then waiting for $T/N.go and SLEEP more seconds; returns once it holds,
# with RUN_OWNER and RUN_TOKEN.
run_start() {
    local n=$1 key=$2 nap=$3
    shift 3
    "$LEASE" run "$key" --ttl 3s --json "$@" -- sh -c \
        "echo \"\$LEASE_OWNER \$LEASE_TOKEN\" > \"\$T/$n.grant\"; $(wait_file "$T/$n.go"); sleep $nap" \
        >"$T/$n.out" 2>"$T/$n.err" &
    RUN=$!
    bg_register "$RUN"
    WAIT_TRIES=400 wait_for "lease run holds $key" test -s "$T/$n.grant"
    read -r RUN_OWNER RUN_TOKEN <"$T/$n.grant"
}

# run_kept N WHAT: let run N's child finish: it kept its lease throughout.
run_kept() {
    touch "$T/$1.go"
    wait_exit "$RUN" run_rc "lease run ($2)"
    assert_eq "$run_rc" 0 "lease run kept its lease ($2)"
    assert_eq "$(ev "$T/$1.err" '[.[].event] | join(" ")')" "acquired started exited released" \
        "no stopping or lost event ($2)"
}

# history_of KEY TOKEN: how the grant of TOKEN ended, as `lease history` says.
history_of() {
    "$LEASE" history "$1" --json 2>/dev/null | jq -r --argjson t "$2" '.[] | select(.token == $t) | .ended'
}

section "1. a stale holder's history mark does not cost the new holder"
call "$LEASE" acquire hold/stale --ttl 1s --json
expect_rc 0 "the first holder acquires (ttl 1 s) and goes silent"
A_OWNER=$(jget "$OUT" .owner); A_TOKEN=$(jget "$OUT" .token)
run_start 1 hold/stale 4 --wait 20s
assert_gt "$RUN_TOKEN" "$A_TOKEN" "the new holder's token"
call "$LEASE" renew hold/stale --owner "$A_OWNER" --token "$A_TOKEN" --ttl 2s
expect_error 4 "the stale holder's renew is ELOST"
assert_eq "$(history_of hold/stale "$A_TOKEN")" lost \
    "the stale holder marked its grant lost (a write to the holder's object)"
run_kept 1 "4 s of renewals after the mark"
assert_eq "$(history_of hold/stale "$RUN_TOKEN")" released "the new holder's grant was released"

section "2. a second process's renew cannot cost the holder its lease"
run_start 2 hold/second 4
# A ttl of 3 s: the server's clock (whole seconds, max_skew 2) cannot vouch
# for the renewal, and this process wrote none: it cannot tell.
call "$LEASE" renew hold/second --owner "$RUN_OWNER" --token "$RUN_TOKEN" --ttl 3s
expect_error 6 "a renew that cannot prove the lease alive is ESTORE (uncertain)"
assert_contains "$ERR" "cannot tell" "the message says why"
assert_eq "$(history_of hold/second "$RUN_TOKEN")" held "nothing was marked lost"
call "$LEASE" show hold/second --json
assert_eq "$(jget "$OUT" '[.state, .owner] | @tsv')" "$(printf 'held\t%s' "$RUN_OWNER")" \
    "still held by the run's owner"
run_kept 2 "after the second process's renew"

# py_start NAME OFFSET: a client-go-style leader of Lease NAME (duration
# 3 s, renewing every 0.5 s) with its clock OFFSET seconds off; its output
# in $T/py-NAME, its pid in PYPID.
py_start() {
    "$PY" "$LEADER" --url "$BASE" --namespace default --name "$1" --identity "py-$1" \
        --duration 3 --retry 0.5 --token-file "$DIR/token" --clock-offset "$2" \
        --run-seconds 120 >"$T/py-$1" 2>"$T/py-$1.err" &
    PYPID=$!
    bg_register "$PYPID"
    WAIT_TRIES=400 wait_for "py-$1 leads" grep -q "^leader py-$1\$" "$T/py-$1"
}

for skew in behind:-3600 ahead:3600; do
    name=skew-${skew%%:*}
    section "3. a renewing holder whose clock is an hour ${skew%%:*} is not taken over"
    py_start "$name" "${skew#*:}"
    call "$LEASE" acquire "$name" --ttl 2s --wait 8s --json
    expect_error 7 "$name: still held after 8 s of renewals"
    assert_eq "$(kapi GET "$LEASES/$name" | jq -r .spec.holderIdentity)" "py-$name" \
        "$name: the holder is the python leader"
    if grep -q '^lost$' "$T/py-$name"; then fail "$name: the leader lost while renewing"; else pass; fi
    kill -TERM "$PYPID"
    wait_exit "$PYPID" py_rc "$name: the python leader stops"
    call "$LEASE" acquire "$name" --ttl 2s --wait 20s --json
    expect_rc 0 "$name: taken over once it stopped renewing"
done

section "4. a holder seen renewing with a clock behind is kept by client-go's rule"
# Duration 6 s; renewals 4.5 s apart, by a clock an hour behind. The first
# comes once the candidate has read the object: the candidate sees it as a
# renewal whose renewTime is already past the server-clock rule, and from
# then on waits for 6 s without change, not for 3 s.
renew_at() {
    local t
    t=$(date -u -d "-1 hour" +%Y-%m-%dT%H:%M:%S.%6NZ)
    kapi PATCH "$LEASES/slow" "{\"spec\":{\"renewTime\":\"$t\"}}" >/dev/null
}
t0=$(date -u -d "-1 hour" +%Y-%m-%dT%H:%M:%S.%6NZ)
kapi POST "$LEASES" "{\"metadata\":{\"name\":\"slow\"},\"spec\":{\"holderIdentity\":\"pod-slow\",\"leaseDurationSeconds\":6,\"renewTime\":\"$t0\",\"acquireTime\":\"$t0\"}}" >/dev/null
"$LEASE" acquire slow --ttl 2s --wait 16s --json >"$T/4.out" 2>"$T/4.err" &
CAND=$!
bg_register "$CAND"
WAIT_TRIES=400 wait_for "the candidate read the object" grep -q "GET $LEASES/slow " "$DIR/kube.log"
for i in 1 2 3 4; do
    renew_at
    [ "$i" = 4 ] || sleep 4.5
done
wait_exit "$CAND" cand_rc "the candidate's acquire --wait 16s"
assert_eq "$cand_rc" 7 "never taken over while it renewed within the duration ($(cat "$T/4.err"))"
assert_eq "$(kapi GET "$LEASES/slow" | jq -r .spec.holderIdentity)" pod-slow "the holder is kept"

section "5. lease run with a clock an hour behind the API server's keeps its lease"
# The double's Date runs an hour ahead: to it, every renewTime this host
# writes is an hour old. The holder's own renewals prove its lease alive;
# a candidate sees them and waits.
kapi POST /fake/v1/clock '{"offset_s":3600}' >/dev/null
run_start 5 hold/behind 0
call "$LEASE" acquire hold/behind --ttl 3s --wait 8s --json
expect_error 7 "a candidate does not take the renewing holder's lease"
run_kept 5 "8 s of renewals behind the server's clock"
kapi POST /fake/v1/clock '{"offset_s":0}' >/dev/null

assert_not_contains "$(cat "$DIR/kube.log" "$T"/*.err)" "$TOKEN" "no token in any log"
finish
