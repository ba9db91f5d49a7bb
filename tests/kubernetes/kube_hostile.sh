#!/usr/bin/env bash
# kube_hostile.sh - the Kubernetes store against answers it cannot trust,
# from fake_kube.py's hostile answers (POST /fake/v1/faults "answer"):
#  1. a 4 MiB [{},{},...] body (some 1.4 million objects, which jansson
#     would hold in 300 MB) on a get, a list and a watch event: refused
#     before it is parsed, the client's peak RSS under 150 MB
#     (/usr/bin/time); a get or a list fails cleanly (ESTORE, exit 6), a
#     wait runs to its end (ETIMEOUT, exit 7: the core retries a failed
#     watch as any store failure);
#  2. a renewTime with signs, spaces or fields out of range where RFC 3339
#     has digits is a malformed answer (ESTORE), a good one with an offset
#     is read;
#  3. a list whose server gives the same continue token again fails
#     (ESTORE, "repeated a continue token") and lists nothing twice;
#  4. a token_file that is a FIFO (no writer: opening it to read would
#     block) is refused at once (EINVALID, "not a regular file"), within
#     --timeout, as is a directory.
#
#   kube_hostile.sh LEASE_BINARY SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"

SRC=${2:?usage: kube_hostile.sh LEASE SOURCE_DIR}
. "$(dirname "$0")/kube_lib.sh"
[ -x /usr/bin/time ] || die "/usr/bin/time (Debian package time) is required"

start_double main
L=$LEASE

# bloated WHAT VERB RC: arm 4 MiB [{},...] answers to the next ten requests
# of VERB (a wait's first watches last its short pauses, which may end
# before 4 MiB arrive); the call that follows (the rest of the arguments)
# exits RC within 150 MB of peak RSS.
bloated() {
    local what=$1 verb=$2 rc=$3
    shift 3
    kapi POST /fake/v1/faults "{\"answer\":\"bloat\",\"verb\":\"$verb\",\"count\":10}" >/dev/null
    call "${PEAK_RSS[@]}" "$L" --store "$URL" "$@"
    expect_rc "$rc" "a 4 MiB [{},...] answer to a $what"
    rss_within 153600 "a 4 MiB [{},...] answer to a $what"
    kapi POST /fake/v1/reset >/dev/null
}

section "a 4 MiB answer of empty objects"
call "$L" --store "$URL" acquire bloat-held --ttl 60s --json
expect_rc 0 "a held key, for the wait"
bloated get get 6 show bloat-held
assert_contains "$ERR" "to hold" "the get's message says the answer costs too much"
bloated list list 6 ls
assert_contains "$ERR" "to hold" "the list's message says the answer costs too much"
# A wait's watch that fails is a store failure the wait retries (the core
# sleeps out its pause and asks again): the wait runs to its end.
w0=$(kapi GET /fake/v1/stats | jq -r .watches)
bloated "watch event" watch 7 acquire bloat-held --ttl 5s --wait 3s
assert_gt "$(kapi GET /fake/v1/stats | jq -r .watches)" "$w0" "the waiter watched"

section "times that are not RFC 3339"
# raw_get NAME RENEWTIME: the next get of NAME answers a Lease whose
# renewTime is RENEWTIME (the double itself refuses such a write).
raw_get() {
    local obj
    obj=$(jq -cn --arg n "$1" --arg t "$2" '{kind: "Lease", apiVersion:
        "coordination.k8s.io/v1", metadata: {name: $n, namespace: "default",
        resourceVersion: "7"}, spec: {holderIdentity: "pod-x",
        leaseDurationSeconds: 10, renewTime: $t, acquireTime: $t}}')
    kapi POST /fake/v1/faults "$(jq -cn --arg p "$LEASES/$1" --arg t "$obj" \
        '{answer: "raw", verb: "get", path_prefix: $p, text: $t, count: 1}')" >/dev/null
}
for t in "2026-12-01T-1:-1:-1Z" "2026-12-01T 1: 2: 3Z" "2026-12-01T24:00:00Z" \
         "2026-13-01T01:02:03Z" "2026-12-01T01:02:03+-1:00" "2026-12-01T01:02:03+01:60" \
         "2026-12-01T01:02:03.Z" "+026-12-01T01:02:03Z"; do
    raw_get badtime "$t"
    call "$L" --store "$URL" show badtime
    expect_error 6 "renewTime '$t' is a malformed answer"
    assert_contains "$ERR" "renewTime" "the message names renewTime ('$t')"
    kapi POST /fake/v1/reset >/dev/null
done
raw_get goodtime "2026-12-01T09:32:03.25+05:30"
call "$L" --store "$URL" show goodtime --json
expect_rc 0 "renewTime with a fraction and an offset is read"
assert_eq "$(jget "$OUT" .owner)" "pod-x" "the object with a good renewTime"

section "a continue token given again"
call "$L" --store "$URL" acquire pages/a --ttl 60s
expect_rc 0 "a key to list"
call "$L" --store "$URL" acquire pages/b --ttl 60s
expect_rc 0 "another key to list"
kapi POST /fake/v1/faults '{"answer":"repeat_continue","verb":"list","count":100000}' >/dev/null
call "$L" --store "$URL" --timeout 5s ls pages/
expect_rc 6 "a list whose continue token comes again"
assert_contains "$ERR" "repeated a continue token" "the message says why"
assert_eq "$(printf '%s\n' "$OUT" | grep -v '^$' | sort | uniq -d)" "" "nothing is listed twice"
kapi POST /fake/v1/reset >/dev/null
call "$L" --store "$URL" ls pages/
expect_rc 0 "the list once the server pages right"

section "a token file that is not a regular file"
mkfifo "$T/fifo.tok"
call "$L" --store "${URL%%\?*}?token_file=$T/fifo.tok" --timeout 2s show k
expect_error 2 "a FIFO as token_file (timeout(1) ends a call that blocks: 124)"
assert_contains "$ERR" "not a regular file" "the FIFO's message"
call "$L" --store "${URL%%\?*}?token_file=$T" --timeout 2s show k
expect_error 2 "a directory as token_file"
assert_contains "$ERR" "not a regular file" "the directory's message"

finish
