#!/usr/bin/env bash
# etcd_quorum_loss: two of three members killed (kill -9).
#
#   1. The C client (etcd_client quorum) opens handles while the cluster is
#      healthy and kills the two members itself; then every operation on
#      its open handles fails with ESTORE, and a keeper loses with ESTORE.
#   2. Every CLI operation (acquire, renew, release, show, ls, fence, run)
#      with --timeout 2s exits 6 (ESTORE) with a message: the test's own
#      `timeout 30` around each call never fires. Durations are printed,
#      not asserted.
#   3. The two members are started again on their data dirs (state
#      "existing"); once the cluster is healthy, service resumes: acquire,
#      renew and release work, tokens are greater than any issued before,
#      and an owner whose acquire failed with ESTORE may safely retry it.
. "$(dirname "$0")/etcd_lib.sh" "$@"
CLIENT=${2:?usage: $0 LEASE_BINARY ETCD_CLIENT_BINARY}

section "a three-member cluster"
etcd_cluster 3 || die "start a three-member cluster"
VICTIMS=(e1 e2)   # the first two of the URL: their requests go on to e3

TOKENS=()
call "$LEASE" --store "$URL" acquire quorum/held --ttl 10m --json
expect_rc 0 "acquire before the outage"
HELD_TOKEN=$(jget "$OUT" .token)
HELD_OWNER=$(jget "$OUT" .owner)
assert_token "$HELD_TOKEN" "token before the outage"
TOKENS+=("$HELD_TOKEN")
call "$LEASE" --store "$URL" fence quorum/res "$HELD_TOKEN" --json
expect_rc 0 "fence before the outage"

section "the C client: open handles, then two members die"
KILL_CMD="'$ETCD_SH' kill '$ED' ${VICTIMS[0]} && '$ETCD_SH' kill '$ED' ${VICTIMS[1]}"
call "$CLIENT" quorum "$URL" "$KILL_CMD" "$T/client-tokens"
echo "$OUT"
[ -z "$ERR" ] || echo "$ERR" >&2
expect_rc 0 "etcd_client quorum: every operation on open handles fails with ESTORE"
for v in "${VICTIMS[@]}"; do
    if member_pid "$v" >/dev/null; then fail "$v still runs after kill -9"; else pass; fi
done
member_pid e3 >/dev/null || die "e3 must still run"
TOKENS+=("$(cat "$T/client-tokens" 2>/dev/null)")

section "the CLI: every operation exits 6 within its timeout"
U=1b4e28ba-2fa1-11d2-883f-0016d3cca427
# store_failed DESCRIPTION: exit 6 (not 124 from the test's timeout), an
# ESTORE message, nothing on stdout.
store_failed() {
    expect_error 6 "$1"
    assert_contains "$ERR" ESTORE "$1: the message names ESTORE"
    echo "  $1: exit $RC after $(($(boot_ms) - t0)) ms"
}
S=(--store "$URL" --timeout 2s)
t0=$(boot_ms); call "$LEASE" "${S[@]}" acquire quorum/new --owner "$U" --ttl 30s --json
store_failed "acquire a free key"
t0=$(boot_ms); call "$LEASE" "${S[@]}" acquire quorum/held --ttl 30s --json
store_failed "acquire a held key (never EBUSY)"
t0=$(boot_ms); call "$LEASE" "${S[@]}" acquire quorum/new --owner "$U" --ttl 30s --wait 1s
store_failed "acquire --wait 1s (never ETIMEOUT)"
t0=$(boot_ms); call "$LEASE" "${S[@]}" renew quorum/held --owner "$HELD_OWNER" --token "$HELD_TOKEN" --ttl 10m --json
store_failed "renew"
t0=$(boot_ms); call "$LEASE" "${S[@]}" release quorum/held --owner "$HELD_OWNER" --token "$HELD_TOKEN"
store_failed "release"
t0=$(boot_ms); call "$LEASE" "${S[@]}" show quorum/held --json
store_failed "show"
t0=$(boot_ms); call "$LEASE" "${S[@]}" ls quorum/ --json
store_failed "ls"
t0=$(boot_ms); call "$LEASE" "${S[@]}" fence quorum/res "$HELD_TOKEN" --json
store_failed "fence"
t0=$(boot_ms); call "$LEASE" "${S[@]}" run quorum/run --ttl 5s -- touch "$T/ran"
store_failed "run"
assert_no_file "$T/ran" "run does not start its command without the lease"

section "the two members come back"
for v in "${VICTIMS[@]}"; do
    member_restart "$v" || fail "restart $v: $(cat "$T/etcd-start.out")"
done
WAIT_TRIES=400 wait_for "the cluster is healthy again" cluster_healthy ||
    die "the cluster did not recover: $(status_json)"
MAX_BEFORE=$(max_of "${TOKENS[@]}")
echo "greatest token before the outage: $MAX_BEFORE"

section "service resumes"
call "$LEASE" --store "$URL" acquire quorum/after --ttl 30s --json
expect_rc 0 "acquire after the restart"
A_TOKEN=$(jget "$OUT" .token)
A_OWNER=$(jget "$OUT" .owner)
assert_gt "$A_TOKEN" "$MAX_BEFORE" "the token after the restart is greater than every one before"
call "$LEASE" --store "$URL" renew quorum/after --owner "$A_OWNER" --token "$A_TOKEN" --ttl 30s --json
expect_rc 0 "renew after the restart"
assert_eq "$(jget "$OUT" .token)" "$A_TOKEN" "renew keeps the token"
call "$LEASE" --store "$URL" release quorum/after --owner "$A_OWNER" --token "$A_TOKEN"
expect_rc 0 "release after the restart"
call "$LEASE" --store "$URL" acquire quorum/after --ttl 30s --json
expect_rc 0 "acquire the released key again"
assert_gt "$(jget "$OUT" .token)" "$A_TOKEN" "its token is greater still"
# The acquire that failed with ESTORE may or may not have been applied
# once a quorum was back: retrying it with the same owner is safe.
call "$LEASE" --store "$URL" acquire quorum/new --owner "$U" --ttl 30s --json
expect_rc 0 "the owner whose acquire failed with ESTORE retries it"
assert_gt "$(jget "$OUT" .token)" "$MAX_BEFORE" "... and its token is greater than every one before"
# The fence mark survived, and an older token is still refused.
call "$LEASE" --store "$URL" fence quorum/res $((HELD_TOKEN - 1)) --json
expect_rc 5 "a token below the mark set before the outage is stale"
# Every member serves again, each one alone.
for n in "${NAMES[@]}"; do
    call "$LEASE" --store "$(url_of "$n")" show quorum/after --json
    expect_rc 0 "show through $n alone"
done

finish
