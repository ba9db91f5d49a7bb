#!/usr/bin/env bash
# redis_restart: a lease and its token counter survive a restart of a Redis
# server that runs with the append-only file (appendonly yes, appendfsync
# always: the setting scripts/redis-server.sh uses and the store asks for).
#
# (a) held across a restart: same owner, same token; the old owner can renew
#     and release; the next acquire gets a greater token. Once per way of
#     stopping: SIGTERM, SHUTDOWN, and kill -9 (with appendfsync always,
#     an acknowledged grant is on disk before the answer).
# (b) several acquire/release/restart cycles: tokens only ever increase.
# (c) a lease whose ttl ran out while the server was down is not held after
#     the restart, and the next token is still greater.
# (d) a handle opened before the restart works again after it (after one
#     ESTORE on the dead connection at most).
. "$(dirname "$0")/redis_lib.sh" "$@"

redis_start srv || die "start the redis server"
S=$(redis_url srv)
section "server on $S (dir $T/srv)"

# restart_by HOW: stop the server one way, start it again on the same dir
# and port. Prints nothing; records a failure if the server does not return.
restart_by() {
    case $1 in
    sigterm) redis_stop srv ;;
    shutdown)
        rcli srv shutdown >/dev/null 2>&1
        local i pid
        pid=$(redis_pid srv)
        for ((i = 0; i < 200; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        ;;
    kill9) redis_kill9 srv ;;
    esac
    if rcli srv ping >/dev/null 2>&1; then
        fail "restart by $1: the server still answers after it was stopped"
    fi
    redis_restart srv || die "restart by $1: the server did not come back"
}

section "(a) a held lease survives a restart"
for how in sigterm shutdown kill9; do
    key=held-$how
    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --json
    expect_rc 0 "acquire $key"
    owner=$(jget "$OUT" .owner)
    tok=$(jget "$OUT" .token)
    assert_match "$owner" "$UUID_RE" "acquire $key: owner is a UUID"
    assert_gt "$tok" 0 "acquire $key: token >= 1"

    restart_by "$how"

    call "$LEASE" --store "$S" show "$key" --json
    expect_rc 0 "show $key after restart by $how"
    assert_eq "$(jget "$OUT" .state)" held "restart by $how: $key is still held"
    assert_eq "$(jget "$OUT" .owner)" "$owner" "restart by $how: same owner"
    assert_eq "$(jget "$OUT" .token)" "$tok" "restart by $how: same token"
    rem=$(jget "$OUT" .remaining_ms)
    if [[ "$rem" =~ ^[0-9]+$ ]] && [ "$rem" -gt 0 ] && [ "$rem" -le 60000 ]; then pass; else
        fail "restart by $how: remaining_ms should be in (0, 60000], got '$rem'"
    fi
    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --json
    expect_error 3 "restart by $how: another owner still gets busy"

    call "$LEASE" --store "$S" renew "$key" --owner "$owner" --token "$tok" --ttl 60s --json
    expect_rc 0 "restart by $how: renew by the old owner"
    assert_eq "$(jget "$OUT" .token)" "$tok" "restart by $how: renew keeps the token"
    call "$LEASE" --store "$S" release "$key" --owner "$owner" --token "$tok"
    expect_rc 0 "restart by $how: release by the old owner"
    call "$LEASE" --store "$S" show "$key" --json
    assert_eq "$(jget "$OUT" .state)" free "restart by $how: free after release"

    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --json
    expect_rc 0 "restart by $how: acquire after release"
    assert_gt "$(jget "$OUT" .token)" "$tok" "restart by $how: the next token is greater"
done

section "(b) tokens keep increasing over acquire/release/restart cycles"
key=cycles
last=0
seen=""
i=0
for how in sigterm kill9 shutdown kill9 sigterm kill9; do
    i=$((i + 1))
    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --json
    expect_rc 0 "cycle $i: acquire"
    tok=$(jget "$OUT" .token)
    owner=$(jget "$OUT" .owner)
    assert_gt "$tok" "$last" "cycle $i: token greater than every earlier one"
    seen="$seen $tok"
    last=$tok
    # Every other cycle restarts while the lease is held, the others after
    # it was released: the counter must survive both.
    if [ $((i % 2)) = 0 ]; then
        call "$LEASE" --store "$S" release "$key" --owner "$owner" --token "$tok"
        expect_rc 0 "cycle $i: release before the restart"
        restart_by "$how"
    else
        restart_by "$how"
        call "$LEASE" --store "$S" release "$key" --owner "$owner" --token "$tok"
        expect_rc 0 "cycle $i: release after the restart by $how"
    fi
    call "$LEASE" --store "$S" show "$key" --json
    assert_eq "$(jget "$OUT" .token)" "$tok" "cycle $i: the counter after the restart by $how"
done
echo "tokens over the cycles:$seen"

section "(c) a lease that expired while the server was down"
call "$LEASE" --store "$S" acquire short --ttl 300ms --json
expect_rc 0 "acquire short --ttl 300ms"
tok=$(jget "$OUT" .token)
redis_stop srv
sleep 0.6 # longer than the ttl: the lease can only have expired
redis_restart srv || die "restart for (c)"
call "$LEASE" --store "$S" show short --json
expect_rc 0 "show short after the restart"
assert_ne "$(jget "$OUT" .state)" held "a lease whose ttl ran out during the downtime is not held"
assert_eq "$(jget "$OUT" .token)" "$tok" "the expired lease's token is still the counter"
call "$LEASE" --store "$S" acquire short --ttl 60s --json
expect_rc 0 "acquire short after its expiry"
assert_gt "$(jget "$OUT" .token)" "$tok" "the next token is greater"

section "(d) a running holder across a restart"
# lease run keeps its connection open and renews every ttl/3: a restart
# shorter than the ttl must not cost it the lease.
rm -f "$T/go"
"$LEASE" --store "$S" run runner --ttl 6s --json -- \
    sh -c 'i=0; while [ ! -e "$0/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done' "$T" \
    >"$T/d.out" 2>"$T/d.err" &
RUN_PID=$!
bg_register "$RUN_PID"
WAIT_TRIES=200 wait_for "runner is held" key_state_is runner held "$S"
call "$LEASE" --store "$S" show runner --json
run_tok=$(jget "$OUT" .token)
t0=$(now_ms)
redis_stop srv
redis_restart srv || die "restart for (d)"
echo "server down and up again in $(($(now_ms) - t0)) ms"
# Let the keeper renew at least once over a new connection (every 2 s).
sleep 2.5
call "$LEASE" --store "$S" show runner --json
assert_eq "$(jget "$OUT" .state)" held "runner is still held after the restart"
assert_eq "$(jget "$OUT" .token)" "$run_tok" "runner keeps its token"
touch "$T/go"
wait_exit "$RUN_PID" run_rc "lease run across a restart"
assert_eq "$run_rc" 0 "lease run exits with its child's code (not 4: the lease was never lost)"
call "$LEASE" --store "$S" show runner --json
assert_eq "$(jget "$OUT" .state)" free "runner released at the end"

finish
