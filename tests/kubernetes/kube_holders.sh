#!/usr/bin/env bash
# kube_holders.sh - what may and may not end a Kubernetes lease, with short
# ttls (2-3 s, where the API server's clock cannot vouch for a renewal):
#  1. a write that leaves the holder, its token and its renewTime alone (a
#     stale holder's failed renew marking its own grant lost in the shared
#     history) never costs the holder its lease: `lease run --ttl 3s` keeps
#     renewing, its child is not stopped;
#  2. a renew from a second process with the right owner and token, which
#     cannot prove the lease alive, is ESTORE (uncertain, exit 6), writes
#     nothing, and never costs the holder (`lease run --ttl 3s`) its lease.
#
#   kube_holders.sh LEASE_BINARY SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"

SRC=${2:?usage: kube_holders.sh LEASE SOURCE_DIR}
KS=$SRC/scripts/kube-server.sh
for tool in curl jq; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required"
done
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

assert_not_contains "$(cat "$DIR/kube.log" "$T"/*.err)" "$TOKEN" "no token in any log"
finish
