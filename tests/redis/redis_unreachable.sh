#!/usr/bin/env bash
# redis_unreachable: a Redis server that cannot be reached is a store
# failure (ESTORE, exit 6: ownership uncertain), never "busy" (3), never a
# timeout of the wait (7), never success.
#
# (a) nothing listens on the port: every command exits 6, says ESTORE, and
#     never prints the URL's password.
# (b) a server that accepts connections but never answers (SIGSTOP): 6
#     within the --timeout bound; once it answers again, the same owner can
#     acquire (retrying an uncertain acquire with the same owner is safe).
# (c) the server is killed (kill -9) while `lease run --ttl 2s -- sleep 30`
#     holds a lease: the renewals fail, run stops its child before the local
#     deadline and exits 4; then `lease acquire` exits 6.
. "$(dirname "$0")/redis_lib.sh" "$@"

PW=hunter2-Secret-pw

# no_secret: the last call's output never shows the password.
no_secret() {
    assert_not_contains "$OUT$ERR" "$PW" "$1: no password in the output"
}

# store_failed DESCRIPTION: exit 6 with an ESTORE message, nothing on stdout.
store_failed() {
    expect_error 6 "$1"
    assert_contains "$ERR" ESTORE "$1: the message names ESTORE"
    assert_not_contains "$ERR" EBUSY "$1: not EBUSY"
}

section "(a) nothing listens on the port"
CLOSED=$(free_port) || die "no free port"
# free_port checked that nothing listens; make sure it stays so for the
# checks below (a racing process could take it).
for url in "redis://127.0.0.1:$CLOSED" "redis://user:$PW@127.0.0.1:$CLOSED/3?prefix=x:"; do
    what="closed port ($url)"
    what=${what//$PW/***}
    OWNER=1b4e28ba-2fa1-11d2-883f-0016d3cca427
    call "$LEASE" --store "$url" acquire k --ttl 10s
    store_failed "$what: acquire"
    no_secret "$what: acquire"
    call "$LEASE" --store "$url" acquire k --ttl 10s --json
    store_failed "$what: acquire --json"
    call "$LEASE" --store "$url" acquire k --ttl 10s --owner "$OWNER" --wait 1s
    store_failed "$what: acquire --wait 1s"
    no_secret "$what: acquire --wait"
    call "$LEASE" --store "$url" renew k --owner "$OWNER" --token 1 --ttl 10s
    store_failed "$what: renew"
    call "$LEASE" --store "$url" release k --owner "$OWNER" --token 1
    store_failed "$what: release"
    call "$LEASE" --store "$url" show k --json
    store_failed "$what: show"
    no_secret "$what: show"
    call "$LEASE" --store "$url" ls --json
    store_failed "$what: ls"
    call "$LEASE" --store "$url" fence res 5 --json
    store_failed "$what: fence"
    no_secret "$what: fence"
    call "$LEASE" --store "$url" run k --ttl 5s -- touch "$T/ran"
    store_failed "$what: run"
    no_secret "$what: run"
    assert_no_file "$T/ran" "$what: run does not start the command without the lease"
done

section "(b) a server that accepts but does not answer"
redis_start frozen || die "start the server for (b)"
F=$(redis_url frozen)
OWNER=6f1c2b7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f
kill -STOP "$(redis_pid frozen)"
t0=$(now_ms)
call "$LEASE" --store "$F" --timeout 500ms acquire k --ttl 30s --owner "$OWNER"
store_failed "acquire from a stopped server (--timeout 500ms)"
echo "acquire from a stopped server failed after $(($(now_ms) - t0)) ms"
call "$LEASE" --store "$F" --timeout 500ms show k
store_failed "show on a stopped server"
kill -CONT "$(redis_pid frozen)"
call "$LEASE" --store "$F" acquire k --ttl 30s --owner "$OWNER" --json
expect_rc 0 "the same owner acquires once the server answers"
tok=$(jget "$OUT" .token)
call "$LEASE" --store "$F" acquire k --ttl 30s --owner "$OWNER" --json
expect_rc 0 "acquire again by the same owner"
assert_eq "$(jget "$OUT" .token)" "$tok" "a retried acquire by the same owner gets the same token"

section "(c) the server dies under lease run"
redis_start victim || die "start the server for (c)"
V=$(redis_url victim)
"$LEASE" --store "$V" run job --ttl 2s --json -- sleep 30 >"$T/c.out" 2>"$T/c.err" &
RUN_PID=$!
bg_register "$RUN_PID"
wait_for "job is held" key_state_is job held "$V"
CHILD=$(grep '^{' "$T/c.err" | jq -r 'select(.event=="started") | .pid' 2>/dev/null | head -1)
assert_match "${CHILD:-}" '^[0-9]+$' "the started event names the child's pid"
t0=$(now_ms)
redis_kill9 victim
wait_exit "$RUN_PID" run_rc "lease run after its store died"
echo "lease run ended $(($(now_ms) - t0)) ms after the server was killed (ttl 2 s)"
assert_eq "$run_rc" 4 "lease run exits 4: the lease was lost (renewals failed)"
if [[ "${CHILD:-}" =~ ^[0-9]+$ ]]; then
    if process_exited "$CHILD"; then pass; else
        fail "the child (sleep 30, pid $CHILD) is still running"
        kill -KILL "$CHILD" 2>/dev/null
    fi
fi
events=$(grep '^{' "$T/c.err" | jq -s 'map(select(has("level") | not))' 2>/dev/null)
assert_contains "$(jget "$events" '[.[].event] | join(" ")')" "stopping" \
    "run logged that it stopped the child"
assert_eq "$(jget "$events" '.[] | select(.event=="exited") | .before_deadline')" true \
    "the child was gone before the local deadline"
assert_not_contains "$(jget "$events" '[.[].event] | join(" ")')" "released" \
    "run does not claim to have released a lease it could not reach"
call "$LEASE" --store "$V" acquire job --ttl 10s
store_failed "acquire after the server was killed"
call "$LEASE" --store "$V" acquire job --ttl 10s --wait 500ms
store_failed "acquire --wait after the server was killed"

finish
