#!/usr/bin/env bash
# resource_http: the stale holder against an HTTP service that fences its
# own writes (examples/fence_http_service.c, lease_fence_local), played by
# scripts/demo.sh --http-only on loopback with a SQLite lease store:
# A writes under `lease run` (200), is stopped (SIGSTOP) past its ttl, B
# takes the lease and writes (200), A resumes and writes with its old
# token: the service answers 409 Conflict naming the mark, and keeps B's
# value. Needs bash, curl and jq.
#
#   resource_http.sh LEASE_BINARY SERVICE_BINARY
# The scenario is one call: bound it as a whole (lib.sh reads this).
export LEASE_CALL_TIMEOUT=${LEASE_CALL_TIMEOUT:-90}
. "$(dirname "$0")/../cli/lib.sh" "$1"

SERVICE=${2:?usage: resource_http.sh LEASE_BINARY SERVICE_BINARY}
DEMO=$(cd "$(dirname "$0")/../.." && pwd)/scripts/demo.sh
command -v curl >/dev/null || die "curl is required"
export TMPDIR=$T

call bash "$DEMO" --http-only "$LEASE" "$SERVICE"
expect_rc 0 "the HTTP scenario ends with the stale write refused"
line() { printf '%s\n' "$OUT" | grep -E "$1" | head -n 1; }
A1=$(line '^A +token [0-9]+: PUT')
B=$(line '^B +token [0-9]+: PUT')
A2=$(line '^A +resumed; late write')
assert_match "$A1" '-> 200 stored report at token [0-9]+$' "A's first write accepted"
assert_match "$B" '-> 200 stored report at token [0-9]+$' "B's write accepted"
TA=$(printf '%s' "$A1" | sed -E 's/^A +token ([0-9]+):.*/\1/')
TB=$(printf '%s' "$B" | sed -E 's/^B +token ([0-9]+):.*/\1/')
assert_gt "$TB" "$TA" "B's token is greater than A's"
assert_eq "$A2" "A         resumed; late write with token $TA -> 409 stale token $TA: the mark is $TB" \
    "A's late write refused with 409 naming the mark"
assert_eq "$(line '^service +/data/report holds:')" "service   /data/report holds: written by B" \
    "the service keeps B's value"

# A NAME belongs to the lease key that first wrote it: a write under another
# key (whose mark is still empty) must not get in.
"$SERVICE" >"$T/svc.out" 2>"$T/svc.err" &
SVC=$!
bg_register "$SVC"
wait_for "the service listens" grep -q '^listening on 127.0.0.1:' "$T/svc.out"
PORT=$(sed -nE 's/^listening on 127\.0\.0\.1:([0-9]+)$/\1/p' "$T/svc.out")
put() {
    curl -sS -o "$T/put.body" -w '%{http_code}' --max-time 10 -X PUT -H "Lease-Key: $1" \
        -H "Lease-Token: $2" --data-binary "$3" "http://127.0.0.1:$PORT/data/owned"
}
assert_eq "$(put keys/one 5 first)" 200 "written under keys/one"
assert_eq "$(put keys/two 1 intruder)" 409 "a write under another key refused"
assert_contains "$(cat "$T/put.body")" "fenced by another lease key" "the 409 says why"
assert_eq "$(curl -sS --max-time 10 "http://127.0.0.1:$PORT/data/owned")" first \
    "the value written under keys/one stands"
assert_eq "$(put keys/one 3 stale)" 409 "an older token refused"
kill "$SVC" 2>/dev/null; wait "$SVC" 2>/dev/null

# The control: the same service without its check lets the older token's
# write overwrite the newer one's, which is what the fence is for.
: >"$T/svc.out"
"$SERVICE" --unfenced >"$T/svc.out" 2>"$T/svc.err" &
SVC=$!
bg_register "$SVC"
wait_for "the unfenced service listens" grep -q '^listening on 127.0.0.1:' "$T/svc.out"
PORT=$(sed -nE 's/^listening on 127\.0\.0\.1:([0-9]+)$/\1/p' "$T/svc.out")
assert_eq "$(put keys/one 5 newer)" 200 "control: the newer token's write"
assert_eq "$(put keys/one 3 stale)" 200 "control: the older token's write gets in"
assert_eq "$(curl -sS --max-time 10 "http://127.0.0.1:$PORT/data/owned")" stale \
    "control: the stale write overwrote the newer value"
kill "$SVC" 2>/dev/null; wait "$SVC" 2>/dev/null
finish
