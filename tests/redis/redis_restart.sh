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
#     the restart, and the next token is still greater; its grant reads
#     expired, or lost once its holder comes back and is refused.
# (d) a handle opened before the restart works again after it (after one
#     ESTORE on the dead connection at most).
# (e) the grant history (lease history KEY --json) survives a kill -9 with
#     every ending: released, expired, lost, held.
#
# The history is checked around every restart: what `lease history --json`
# printed before is printed again, byte for byte, after (tokens, owners,
# labels, ttls, grant times, endings and end times); grants after the
# restart are recorded above it with greater tokens; an entry still held
# when the server went down reads "expired" once its ttl ran out during the
# downtime, dated by its recorded expiry (acquired_ms + ttl_ms: the lease
# hash leaves no trace when it expires, the entry keeps the expiry it was
# last extended to), and "lost", with the same date, after its holder's
# renew is refused.
. "$(dirname "$0")/redis_lib.sh" "$@"

redis_start srv || die "start the redis server"
S=$(redis_url srv)
section "server on $S (dir $T/srv)"

# history_of KEY: `lease history KEY --json` into $OUT; exit 0 is a check.
history_of() {
    call "$LEASE" --store "$S" history "$1" --json
    expect_rc 0 "history $1"
}

# hsum: the history in $OUT, newest first, one "token owner ended label"
# per entry, joined by "|".
hsum() {
    jget "$OUT" '[.[] | "\(.token) \(.owner) \(.ended) \(.label)"] | join("|")'
}

# max2 A B: the larger of two integers.
max2() {
    if [ "$1" -gt "$2" ]; then echo "$1"; else echo "$2"; fi
}

# Wall-clock milliseconds: the clock of the server's TIME (same host).
wall_ms() {
    date +%s%3N
}

# wait_wall_past MS: bounded wait (at most 5 s) until this host's wall clock
# is past MS. Used while the server is down, where nothing can be polled.
wait_wall_past() {
    local i
    for ((i = 0; i < 100; i++)); do
        [ "$(wall_ms)" -gt "$1" ] && return 0
        sleep 0.05
    done
    fail "the wall clock did not pass $1 within 5 s (now $(wall_ms))"
    return 1
}

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
    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --label "held $how" --json
    expect_rc 0 "acquire $key"
    owner=$(jget "$OUT" .owner)
    tok=$(jget "$OUT" .token)
    assert_match "$owner" "$UUID_RE" "acquire $key: owner is a UUID"
    assert_gt "$tok" 0 "acquire $key: token >= 1"
    history_of "$key"
    hist_before=$OUT
    assert_eq "$(hsum)" "$tok $owner held held $how" "history of $key before the restart"
    assert_eq "$(jget "$OUT" '.[0].ttl_ms')" 60000 "history of $key: ttl_ms"
    acq=$(jget "$OUT" '.[0].acquired_ms')

    restart_by "$how"
    up_ms=$(wall_ms)

    call "$LEASE" --store "$S" show "$key" --json
    expect_rc 0 "show $key after restart by $how"
    assert_eq "$(jget "$OUT" .state)" held "restart by $how: $key is still held"
    assert_eq "$(jget "$OUT" .owner)" "$owner" "restart by $how: same owner"
    assert_eq "$(jget "$OUT" .token)" "$tok" "restart by $how: same token"
    rem=$(jget "$OUT" .remaining_ms)
    if [[ "$rem" =~ ^[0-9]+$ ]] && [ "$rem" -gt 0 ] && [ "$rem" -le 60000 ]; then pass; else
        fail "restart by $how: remaining_ms should be in (0, 60000], got '$rem'"
    fi
    history_of "$key"
    assert_eq "$OUT" "$hist_before" "restart by $how: the history is exactly what it was"
    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --json
    expect_error 3 "restart by $how: another owner still gets busy"

    call "$LEASE" --store "$S" renew "$key" --owner "$owner" --token "$tok" --ttl 60s --json
    expect_rc 0 "restart by $how: renew by the old owner"
    assert_eq "$(jget "$OUT" .token)" "$tok" "restart by $how: renew keeps the token"
    call "$LEASE" --store "$S" release "$key" --owner "$owner" --token "$tok"
    expect_rc 0 "restart by $how: release by the old owner"
    call "$LEASE" --store "$S" show "$key" --json
    assert_eq "$(jget "$OUT" .state)" free "restart by $how: free after release"

    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --label "after $how" --json
    expect_rc 0 "restart by $how: acquire after release"
    tok2=$(jget "$OUT" .token)
    owner2=$(jget "$OUT" .owner)
    assert_gt "$tok2" "$tok" "restart by $how: the next token is greater"
    history_of "$key"
    assert_eq "$(hsum)" "$tok2 $owner2 held after $how|$tok $owner released held $how" \
        "restart by $how: the grant after the restart is recorded above the released one"
    assert_eq "$(jget "$OUT" '.[1].acquired_ms')" "$acq" \
        "restart by $how: the old grant keeps its grant time"
    assert_eq "$(jget "$OUT" "(.[1].ended_ms >= $up_ms) and (.[0].acquired_ms >= .[1].ended_ms)")" \
        true "restart by $how: released after the restart, granted again after that"
    assert_eq "$(jget "$OUT" '.[0].ended_at')" null "restart by $how: the new grant has no end"
done

section "(b) tokens keep increasing over acquire/release/restart cycles"
key=cycles
last=0
seen=""
toks=""
owners=""
i=0
for how in sigterm kill9 shutdown kill9 sigterm kill9; do
    i=$((i + 1))
    call "$LEASE" --store "$S" acquire "$key" --ttl 60s --label "cycle $i" --json
    expect_rc 0 "cycle $i: acquire"
    tok=$(jget "$OUT" .token)
    owner=$(jget "$OUT" .owner)
    assert_gt "$tok" "$last" "cycle $i: token greater than every earlier one"
    seen="$seen $tok"
    toks="$tok${toks:+ $toks}"          # newest first, as the history lists them
    owners="$owner${owners:+ $owners}"
    last=$tok
    # Every other cycle restarts while the lease is held, the others after
    # it was released: the counter must survive both.
    if [ $((i % 2)) = 0 ]; then
        call "$LEASE" --store "$S" release "$key" --owner "$owner" --token "$tok"
        expect_rc 0 "cycle $i: release before the restart"
        history_of "$key"
        hist_before=$OUT
        assert_eq "$(jget "$OUT" '.[0] | "\(.token) \(.ended)"')" "$tok released" \
            "cycle $i: released before the restart"
        restart_by "$how"
        history_of "$key"
        assert_eq "$OUT" "$hist_before" "cycle $i: the history after the restart by $how is exactly what it was"
    else
        history_of "$key"
        hist_before=$OUT
        assert_eq "$(jget "$OUT" '.[0] | "\(.token) \(.ended)"')" "$tok held" \
            "cycle $i: held before the restart"
        restart_by "$how"
        history_of "$key"
        assert_eq "$OUT" "$hist_before" "cycle $i: the history after the restart by $how is exactly what it was"
        call "$LEASE" --store "$S" release "$key" --owner "$owner" --token "$tok"
        expect_rc 0 "cycle $i: release after the restart by $how"
    fi
    call "$LEASE" --store "$S" show "$key" --json
    assert_eq "$(jget "$OUT" .token)" "$tok" "cycle $i: the counter after the restart by $how"
done
echo "tokens over the cycles:$seen"
history_of "$key"
assert_eq "$(jget "$OUT" 'length')" "$i" "cycles: one entry per grant"
assert_eq "$(jget "$OUT" '[.[].token] | join(" ")')" "$toks" \
    "cycles: every token, newest first"
assert_eq "$(jget "$OUT" '[.[].owner] | join(" ")')" "$owners" "cycles: every owner, newest first"
assert_eq "$(jget "$OUT" '[.[].label] | join(",")')" "cycle 6,cycle 5,cycle 4,cycle 3,cycle 2,cycle 1" \
    "cycles: every label, newest first"
assert_eq "$(jget "$OUT" '[.[] | select(.ended == "released" and .ended_ms >= .acquired_ms)] | length')" "$i" \
    "cycles: every grant released, after it was granted"

section "(c) leases that expired while the server was down"
# Short leases, but long enough to stay held across the few calls below
# on a loaded machine (300 ms was not).
SHORT=1500
call "$LEASE" --store "$S" acquire short --ttl ${SHORT}ms --label short --json
expect_rc 0 "acquire short --ttl ${SHORT}ms"
tok=$(jget "$OUT" .token)
sowner=$(jget "$OUT" .owner)
call "$LEASE" --store "$S" acquire late --ttl ${SHORT}ms --label late --json
expect_rc 0 "acquire late --ttl ${SHORT}ms"
ltok=$(jget "$OUT" .token)
lowner=$(jget "$OUT" .owner)
history_of short
assert_eq "$(hsum)" "$tok $sowner held short" "history of short before the stop"
sacq=$(jget "$OUT" '.[0].acquired_ms')
history_of late
assert_eq "$(hsum)" "$ltok $lowner held late" "history of late before the stop"
lacq=$(jget "$OUT" '.[0].acquired_ms')
redis_stop srv
# Longer than the ttls, on the server's clock (this host's): with the
# server down, the leases can only have expired.
wait_wall_past $(($(max2 "$sacq" "$lacq") + SHORT + 50))
redis_restart srv || die "restart for (c)"
call "$LEASE" --store "$S" show short --json
expect_rc 0 "show short after the restart"
assert_ne "$(jget "$OUT" .state)" held "a lease whose ttl ran out during the downtime is not held"
assert_eq "$(jget "$OUT" .token)" "$tok" "the expired lease's token is still the counter"
history_of short
assert_eq "$(hsum)" "$tok $sowner expired short" "history of short after the restart: expired"
assert_eq "$(jget "$OUT" '.[0] | "\(.acquired_ms) \(.ttl_ms) \(.ended_ms)"')" "$sacq $SHORT $((sacq + SHORT))" \
    "short: same grant time and ttl, ended at its recorded expiry (acquired + ttl)"
call "$LEASE" --store "$S" acquire short --ttl 60s --label "short again" --json
expect_rc 0 "acquire short after its expiry"
tok2=$(jget "$OUT" .token)
owner2=$(jget "$OUT" .owner)
assert_gt "$tok2" "$tok" "the next token is greater"
history_of short
assert_eq "$(hsum)" "$tok2 $owner2 held short again|$tok $sowner expired short" \
    "history of short after the next grant"
assert_eq "$(jget "$OUT" '.[1].ended_ms')" "$((sacq + SHORT))" \
    "short: the next grant recorded the same expiry"

# The holder of late comes back after the restart: its renew is refused,
# and its grant reads lost, still dated by the expiry (not by the renew).
history_of late
assert_eq "$(hsum)" "$ltok $lowner expired late" "history of late after the restart: expired"
call "$LEASE" --store "$S" renew late --owner "$lowner" --token "$ltok" --ttl 60s
expect_error 4 "late: renew after the restart, past the ttl"
history_of late
assert_eq "$(hsum)" "$ltok $lowner lost late" "history of late after the refused renew: lost"
assert_eq "$(jget "$OUT" '.[0] | "\(.acquired_ms) \(.ttl_ms) \(.ended_ms)"')" "$lacq $SHORT $((lacq + SHORT))" \
    "late: lost at its recorded expiry (acquired + ttl)"
call "$LEASE" --store "$S" release late --owner "$lowner" --token "$ltok"
expect_error 4 "late: release by the stale holder"
call "$LEASE" --store "$S" acquire late --ttl 60s --label "late again" --json
expect_rc 0 "acquire late after the loss"
ltok2=$(jget "$OUT" .token)
lowner2=$(jget "$OUT" .owner)
assert_gt "$ltok2" "$ltok" "late: the next token is greater"
history_of late
assert_eq "$(hsum)" "$ltok2 $lowner2 held late again|$ltok $lowner lost late" \
    "history of late after the next grant: the loss stays"
assert_eq "$(jget "$OUT" '.[1].ended_ms')" "$((lacq + SHORT))" "late: the loss keeps its time"

section "(d) a running holder across a restart"
# lease run keeps its connection open and renews every ttl/3: a restart
# shorter than the ttl must not cost it the lease.
rm -f "$T/go"
"$LEASE" --store "$S" run runner --ttl 6s --label runner --json -- \
    sh -c 'i=0; while [ ! -e "$0/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done' "$T" \
    >"$T/d.out" 2>"$T/d.err" &
RUN_PID=$!
bg_register "$RUN_PID"
WAIT_TRIES=200 wait_for "runner is held" key_state_is runner held "$S"
call "$LEASE" --store "$S" show runner --json
run_tok=$(jget "$OUT" .token)
run_owner=$(jget "$OUT" .owner)
history_of runner
hist_before=$OUT
assert_eq "$(hsum)" "$run_tok $run_owner held runner" "history of runner before the restart"
t0=$(now_ms)
redis_stop srv
redis_restart srv || die "restart for (d)"
echo "server down and up again in $(($(now_ms) - t0)) ms"
# Let the keeper renew at least once over a new connection (every 2 s).
sleep 2.5
call "$LEASE" --store "$S" show runner --json
assert_eq "$(jget "$OUT" .state)" held "runner is still held after the restart"
assert_eq "$(jget "$OUT" .token)" "$run_tok" "runner keeps its token"
history_of runner
assert_eq "$OUT" "$hist_before" "runner: the history after the restart and a renewal is exactly what it was"
touch "$T/go"
wait_exit "$RUN_PID" run_rc "lease run across a restart"
assert_eq "$run_rc" 0 "lease run exits with its child's code (not 4: the lease was never lost)"
call "$LEASE" --store "$S" show runner --json
assert_eq "$(jget "$OUT" .state)" free "runner released at the end"
history_of runner
assert_eq "$(hsum)" "$run_tok $run_owner released runner" "history of runner: one grant, released"
assert_eq "$(jget "$OUT" '.[0].acquired_ms')" "$(jget "$hist_before" '.[0].acquired_ms')" \
    "runner: the grant keeps its grant time"

section "(e) every ending survives kill -9"
# On one key: released, expired (found by the next grant), lost (a renew
# after the expiry), held; on another, a lease held when the server is
# killed, whose ttl runs out while it is down.
# A label with quotes, a backslash, braces and UTF-8: kept byte for byte.
LABEL_ODD=$'current "q" caf\xc3\xa9 \\ {x} <y>'
t_a=$(wall_ms)
call "$LEASE" --store "$S" acquire ends --ttl 60s --label first --json
expect_rc 0 "ends: acquire first"
t_b=$(wall_ms)
e1_tok=$(jget "$OUT" .token)
e1_owner=$(jget "$OUT" .owner)
call "$LEASE" --store "$S" release ends --owner "$e1_owner" --token "$e1_tok"
expect_rc 0 "ends: release first"
call "$LEASE" --store "$S" acquire ends --ttl 300ms --label doomed --json
expect_rc 0 "ends: acquire doomed"
e2_tok=$(jget "$OUT" .token)
e2_owner=$(jget "$OUT" .owner)
WAIT_TRIES=100 wait_for "doomed ran out" key_state_is ends expired "$S"
call "$LEASE" --store "$S" acquire ends --ttl 300ms --label late --json
expect_rc 0 "ends: acquire late"
e3_tok=$(jget "$OUT" .token)
e3_owner=$(jget "$OUT" .owner)
WAIT_TRIES=100 wait_for "late ran out" key_state_is ends expired "$S"
call "$LEASE" --store "$S" renew ends --owner "$e3_owner" --token "$e3_tok"
expect_error 4 "ends: renew by late after its expiry"
call "$LEASE" --store "$S" acquire ends --ttl 60s --label "$LABEL_ODD" --json
expect_rc 0 "ends: acquire current"
e4_tok=$(jget "$OUT" .token)
e4_owner=$(jget "$OUT" .owner)
call "$LEASE" --store "$S" acquire down --ttl ${SHORT}ms --label down --json
expect_rc 0 "down: acquire --ttl ${SHORT}ms"
d_tok=$(jget "$OUT" .token)
d_owner=$(jget "$OUT" .owner)

history_of ends
hist_before=$OUT
assert_eq "$(hsum)" \
    "$e4_tok $e4_owner held $LABEL_ODD|$e3_tok $e3_owner lost late|$e2_tok $e2_owner expired doomed|$e1_tok $e1_owner released first" \
    "ends: four grants, newest first, before the kill"
assert_eq "$(jget "$OUT" '[.[].ttl_ms] | join(",")')" "60000,300,300,60000" "ends: ttls"
assert_eq "$(jget "$OUT" '[.[1], .[2]] | map(.ended_ms == .acquired_ms + 300) | all')" true \
    "ends: the expired and the lost grant are dated by their expiry"
assert_eq "$(jget "$OUT" ".[3] | .acquired_ms >= $t_a and .acquired_ms <= $t_b and .ended_ms >= .acquired_ms")" \
    true "ends: the first grant's times"
history_of down
d_before=$OUT
assert_eq "$(hsum)" "$d_tok $d_owner held down" "down: held before the kill"
d_acq=$(jget "$OUT" '.[0].acquired_ms')

redis_kill9 srv
if rcli srv ping >/dev/null 2>&1; then
    fail "(e): the server still answers after kill -9"
fi
wait_wall_past $((d_acq + SHORT + 50))
redis_restart srv || die "restart for (e)"
up_ms=$(wall_ms)

history_of ends
assert_eq "$OUT" "$hist_before" "ends: the history after kill -9 is exactly what it was"
history_of down
assert_eq "$(hsum)" "$d_tok $d_owner expired down" "down: held at the kill, expired during the downtime"
assert_eq "$(jget "$OUT" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" \
    "$(jget "$d_before" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" "down: the same grant"
assert_eq "$(jget "$OUT" '.[0].ended_ms')" "$((d_acq + SHORT))" "down: ended at its recorded expiry"

# The current holder still holds; its release and the next grant are
# recorded above what was there.
call "$LEASE" --store "$S" renew ends --owner "$e4_owner" --token "$e4_tok" --ttl 60s
expect_rc 0 "ends: the current holder renews after the restart"
call "$LEASE" --store "$S" release ends --owner "$e4_owner" --token "$e4_tok"
expect_rc 0 "ends: the current holder releases after the restart"
call "$LEASE" --store "$S" acquire ends --ttl 60s --label fifth --json
expect_rc 0 "ends: acquire after the restart"
e5_tok=$(jget "$OUT" .token)
e5_owner=$(jget "$OUT" .owner)
assert_gt "$e5_tok" "$e4_tok" "ends: the token after the restart is greater than every one before"
history_of ends
assert_eq "$(hsum)" \
    "$e5_tok $e5_owner held fifth|$e4_tok $e4_owner released $LABEL_ODD|$e3_tok $e3_owner lost late|$e2_tok $e2_owner expired doomed|$e1_tok $e1_owner released first" \
    "ends: five grants after the restart"
assert_eq "$(jget "$OUT" '.[2:] | tojson')" "$(jget "$hist_before" '.[1:] | tojson')" \
    "ends: the three ended grants unchanged"
assert_eq "$(jget "$OUT" '.[1] | del(.ended, .ended_at, .ended_ms) | tojson')" \
    "$(jget "$hist_before" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" "ends: the released grant is the one held before"
assert_eq "$(jget "$OUT" ".[1].ended_ms >= $up_ms and .[0].acquired_ms >= .[1].ended_ms")" true \
    "ends: released after the restart, granted again after that"

finish
