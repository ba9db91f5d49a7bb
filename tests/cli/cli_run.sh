#!/usr/bin/env bash
# cli_run: `lease run` - the child's environment, exit codes, busy keys,
# signal forwarding, and stopping the child when the lease is lost.
#
# No assertion here is about durations: waits are bounded loops, and the
# only timing checked is the ordering that the tool itself reports
# (exited_ns < deadline_ns).
. "$(dirname "$0")/lib.sh" "$@"

DB=$T/run.db
S=sqlite://$DB
export LEASE_STORE=$S
export T
OWNER_B=6f1c2b7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f
key_not_held() {
    key_state_is "$1" free || key_state_is "$1" expired
}

file_has() {
    grep -q "$2" "$1" 2>/dev/null
}

section "(a) environment of the child, release at exit"
call "$LEASE" run envk --json -- sh -c \
    'echo "$LEASE_KEY $LEASE_TOKEN $LEASE_OWNER $LEASE_TTL_MS" > "$T/env.out"'
expect_rc 0 "run envk"
read -r e_key e_token e_owner e_ttl <"$T/env.out" 2>/dev/null
assert_eq "${e_key:-}" envk "LEASE_KEY"
assert_match "${e_token:-}" '^[1-9][0-9]*$' "LEASE_TOKEN is a number >= 1"
assert_match "${e_owner:-}" "$UUID_RE" "LEASE_OWNER is a UUID"
assert_eq "${e_ttl:-}" 30000 "LEASE_TTL_MS by default"
printf '%s\n' "$ERR" >"$T/a.err"
assert_eq "$(ev "$T/a.err" '[.[].event] | join(" ")')" "acquired started exited released" \
    "run --json: the events in order"
assert_eq "$(ev "$T/a.err" '[.[] | has("event","key","token","t_ns")] | all')" true \
    "every event carries event, key, token, t_ns"
assert_eq "$(ev "$T/a.err" '[.[].key] | unique | join(" ")')" envk "events: key"
assert_eq "$(ev "$T/a.err" '[.[].token] | unique | map(tostring) | join(" ")')" "${e_token:-}" \
    "events: the token the child was given"
assert_eq "$(ev "$T/a.err" '[.[].t_ns] | . == sort')" true "events: t_ns in order"
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="acquired") | .owner')" "${e_owner:-}" \
    "acquired event: the owner the child was given"
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="exited") | [.code, .before_deadline] | @tsv')" \
    "$(printf '0\ttrue')" "exited event: code 0, before the deadline"
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="exited") | .exited_ns < .deadline_ns')" true \
    "exited event: exited_ns < deadline_ns"
call "$LEASE" show envk --json
expect_rc 0 "show envk after run"
assert_eq "$(jget "$OUT" .state)" free "the lease is released when the child exits"
assert_eq "$(jget "$OUT" .token)" "${e_token:-}" "show: the token run had"

call "$LEASE" run envk --ttl 5s -- sh -c 'echo "$LEASE_TTL_MS $LEASE_TOKEN"'
expect_rc 0 "run envk --ttl 5s"
assert_eq "$OUT" "5000 $(( ${e_token:-0} + 1 ))" "LEASE_TTL_MS with --ttl, and the next token; child's stdout passed through"
# The child reaches the store only when asked to (--pass-store): LEASE_STORE
# may hold a password (cli_secrets checks that it is dropped otherwise).
call "$LEASE" run envk --label my-label --pass-store -- sh -c '"$0" show envk --json' "$LEASE"
expect_rc 0 "run with --label"
assert_eq "$(jget "$OUT" .state)" held "the key is held while the child runs"
assert_eq "$(jget "$OUT" .label)" my-label "--label is the holder label"

section "(b) exit codes"
call "$LEASE" run codes -- sh -c 'exit 42'
expect_rc 42 "child exit 42"
call "$LEASE" run codes -- true
expect_rc 0 "child true"
call "$LEASE" run codes -- false
expect_rc 1 "child false"
call "$LEASE" run codes -- sh -c 'kill -9 $$'
expect_rc 137 "child killed by SIGKILL"
call "$LEASE" run codes --json -- sh -c 'kill -9 $$'
expect_rc 137 "child killed by SIGKILL (--json)"
printf '%s\n' "$ERR" >"$T/b.err"
assert_eq "$(ev "$T/b.err" '.[] | select(.event=="exited") | .code')" 137 "exited event: code 137"
call "$LEASE" show codes --json
assert_eq "$(jget "$OUT" .state)" free "released after the child was killed"
call "$LEASE" run codes -- "$T/no/such/command"
expect_rc 127 "nonexistent command"
expect_stderr "nonexistent command"
call "$LEASE" run codes -- no-such-command-in-path-xyzzy
expect_rc 127 "nonexistent command in PATH"
call "$LEASE" show codes --json
assert_eq "$(jget "$OUT" .state)" free "released after a command that could not start"
: >"$T/afile"
call "$LEASE" run codes --store "sqlite://$T/afile/x.db" -- touch "$T/ran-unreachable"
expect_error 6 "run with an unreachable store"
assert_no_file "$T/ran-unreachable" "the command does not run without the lease"

section "(c) busy key"
rm -f "$T/go"
"$LEASE" run busy --json -- sh -c 'while [ ! -e "$T/go" ]; do sleep 0.05; done' \
    >"$T/c.out" 2>"$T/c.err" &
BUSY_PID=$!
bg_register "$BUSY_PID"
wait_for "busy is held" key_state_is busy held
call "$LEASE" run busy -- touch "$T/ran-busy"
expect_error 3 "run of a key held by another run"
call "$LEASE" run busy --wait 300ms -- touch "$T/ran-busy"
expect_error 7 "run --wait 300ms of a key held by another run"
assert_no_file "$T/ran-busy" "the command does not run without the lease"
call "$LEASE" acquire busy
expect_error 3 "acquire of a key held by run"
touch "$T/go"
wait_exit "$BUSY_PID" busy_rc "the first run of busy"
assert_eq "$busy_rc" 0 "the first run of busy exits with its child's code"
wait_for "busy is free after its run" key_state_is busy free
call "$LEASE" run busy -- true
expect_rc 0 "run of busy once it is free"

call "$LEASE" acquire waited --ttl 500ms --json
W_TOKEN=$(jget "$OUT" .token)
call "$LEASE" run waited --wait 5s -- sh -c 'echo "$LEASE_TOKEN"'
expect_rc 0 "run --wait 5s of a key held for 500ms"
assert_gt "$OUT" "$W_TOKEN" "run --wait: the token is greater than the previous holder's"

section "(d) signal forwarding"
# A non-interactive bash starts background jobs with SIGINT and SIGQUIT
# ignored (and so may whoever started this script), and a shell cannot trap
# a signal that was ignored when it started. env --default-signal (coreutils
# >= 8.31; it execs, so $! stays the pid of lease) puts them back to their
# defaults for `lease run` and so for its child; without it, job control
# (set -m) helps unless they were ignored already when this script started.
# coreutils 9 (Debian 12) has it; without it the test fails, never skips.
if ! env --default-signal=INT,QUIT true 2>/dev/null; then
    echo "FAIL: env --default-signal is missing (coreutils >= 8.31 needed)"
    exit 1
fi
DEFSIG=(env --default-signal=INT,QUIT)
SIGNALS="TERM HUP USR1 USR2 INT QUIT"
for sig in $SIGNALS; do
    key=sig-$sig
    rm -f "$T/ready-$sig" "$T/sig-$sig"
    set -m
    ${DEFSIG[@]+"${DEFSIG[@]}"} "$LEASE" run "$key" --json -- sh -c \
        "trap 'echo got-$sig > \"\$T/sig-$sig\"; exit 9' $sig; : > \"\$T/ready-$sig\"; $LOOP_60S" \
        >"$T/d-$sig.out" 2>"$T/d-$sig.err" &
    RUN_PID=$!
    set +m
    bg_register "$RUN_PID"
    wait_for "$key: child ready" test -e "$T/ready-$sig"
    wait_for "$key: held" key_state_is "$key" held
    kill -s "$sig" "$RUN_PID"
    wait_exit "$RUN_PID" run_rc "lease run after SIG$sig"
    assert_eq "$run_rc" 9 "SIG$sig to lease run: it exits with the child's code"
    assert_eq "$(cat "$T/sig-$sig" 2>/dev/null)" "got-$sig" "SIG$sig was forwarded to the child"
    assert_eq "$(ev "$T/d-$sig.err" '[.[].event] | join(" ")')" "acquired started forwarded exited released" \
        "SIG$sig: the events in order"
    assert_eq "$(ev "$T/d-$sig.err" '.[] | select(.event=="forwarded") | .signal')" \
        "$(kill -l "$sig")" "SIG$sig: forwarded event names the signal"
    assert_eq "$(ev "$T/d-$sig.err" '.[] | select(.event=="exited") | .code')" 9 "SIG$sig: exited event code"
    call "$LEASE" show "$key" --json
    assert_eq "$(jget "$OUT" .state)" free "SIG$sig: the lease is released"
done

section "(e) lease lost: renewals fail, child ignores SIGTERM"
rm -f "$T/ready-e"
"$LEASE" run lost --ttl 1s --json -- sh -c \
    "trap '' TERM; : > \"\$T/ready-e\"; $LOOP_60S" \
    >"$T/e.out" 2>"$T/e.err" &
RUN_PID=$!
bg_register "$RUN_PID"
wait_for "lost: child ready" test -e "$T/ready-e"
wait_for "lost: held" key_state_is lost held
wait_for "lost: started event" file_has "$T/e.err" '"event":"started"'
E_CHILD=$(ev "$T/e.err" '.[] | select(.event=="started") | .pid')
start_locker "$DB" 4
wait_exit "$RUN_PID" run_rc "lease run whose renewals fail"
assert_eq "$run_rc" 4 "lease run exits 4 when it had to stop the child for a lost lease"
assert_eq "$(ev "$T/e.err" '[.[] | select(.event=="stopping") | .signal] | join(" ")')" "SIGTERM SIGKILL" \
    "stopping events: SIGTERM, then SIGKILL"
assert_eq "$(ev "$T/e.err" '[.[] | select(.event=="stopping" and .signal=="SIGKILL")] | length')" 1 \
    "a stopping event with SIGKILL"
assert_eq "$(ev "$T/e.err" '[.[] | select(.event=="stopping") | .t_ns < .deadline_ns] | all')" true \
    "stopping signals were sent before the deadline"
assert_eq "$(ev "$T/e.err" '.[] | select(.event=="exited") | .code')" 137 "exited event: the child died of SIGKILL"
assert_eq "$(ev "$T/e.err" '.[] | select(.event=="exited") | .before_deadline')" true \
    "exited event: before_deadline"
assert_eq "$(ev "$T/e.err" '.[] | select(.event=="exited") | .exited_ns < .deadline_ns')" true \
    "exited event: exited_ns < deadline_ns"
assert_eq "$(ev "$T/e.err" '[.[].event | select(. != "lost")] | .[0:5] | join(" ")')" \
    "acquired started stopping stopping exited" "lost: the events in order"
if [[ "$E_CHILD" =~ ^[0-9]+$ ]]; then
    wait_for "lost: the child ($E_CHILD) is gone" pid_gone "$E_CHILD"
else
    fail "lost: no child pid in the started event: $E_CHILD"
fi
wait_exit "$LOCKER" locker_rc "the sqlite3 locker"
assert_eq "$locker_rc" 0 "the sqlite3 locker ran cleanly ($(cat "$T/locker.out" 2>/dev/null))"
# The lease ran out in the store, or `lease run` released it (it may
# still have been its own when the child was gone): either way not held.
wait_for "lost: the key is no longer held" key_not_held lost

section "(f) lease lost: taken by another owner while renewals failed"
"$LEASE" run taken --ttl 1s --json -- sleep 30 >"$T/f.out" 2>"$T/f.err" &
RUN_PID=$!
bg_register "$RUN_PID"
wait_for "taken: held" key_state_is taken held
wait_for "taken: started event" file_has "$T/f.err" '"event":"started"'
F_CHILD=$(ev "$T/f.err" '.[] | select(.event=="started") | .pid')
F_TOKEN=$(ev "$T/f.err" '.[] | select(.event=="started") | .token')
start_locker "$DB" 3
wait_exit "$LOCKER" locker_rc "the sqlite3 locker"
assert_eq "$locker_rc" 0 "the sqlite3 locker ran cleanly ($(cat "$T/locker.out" 2>/dev/null))"
call "$LEASE" acquire taken --owner "$OWNER_B" --wait 5s --json
expect_rc 0 "another owner acquires taken"
assert_gt "$(jget "$OUT" .token)" "$F_TOKEN" "the new owner's token is greater"
wait_exit "$RUN_PID" run_rc "lease run whose lease was taken"
assert_eq "$run_rc" 4 "lease run exits 4 when its lease was lost"
if [[ "$F_CHILD" =~ ^[0-9]+$ ]]; then
    wait_for "taken: the sleep child ($F_CHILD) is gone" pid_gone "$F_CHILD"
else
    fail "taken: no child pid in the started event: $F_CHILD"
fi
assert_eq "$(ev "$T/f.err" '[.[] | select(.event=="stopping")] | length > 0')" true \
    "taken: a stopping event"
assert_eq "$(ev "$T/f.err" '.[] | select(.event=="exited") | .before_deadline')" true \
    "taken: the child exited before the deadline"
call "$LEASE" show taken --json
assert_eq "$(jget "$OUT" '[.state, .owner] | @tsv')" "$(printf 'held\t%s' "$OWNER_B")" \
    "taken: the new owner still holds the key (the lost run released nothing)"

section "(g) renewal keeps the lease held longer than its ttl"
# A 3 s ttl: a renewal is due every second and the child is stopped 900 ms
# before the deadline, so one store call may stall for a second on a loaded
# host without the run stepping down (at 1 s a 370 ms stall did, in CI).
call "$LEASE" run renewed --ttl 3s --json --pass-store -- sh -c \
    'sleep 7; "$0" show renewed --json > "$T/g.json"; echo "$LEASE_TOKEN" > "$T/g.token"' "$LEASE"
expect_rc 0 "run --ttl 3s of a child that runs for 7 s"
G=$(cat "$T/g.json" 2>/dev/null)
assert_eq "$(jget "$G" .state)" held "after 2.3 ttls the lease is still held (renewed)"
assert_eq "$(jget "$G" .token)" "$(cat "$T/g.token" 2>/dev/null)" "renewal keeps the token"
printf '%s\n' "$ERR" >"$T/g.err"
assert_eq "$(ev "$T/g.err" '[.[].event] | join(" ")')" "acquired started exited released" \
    "renewed: no stopping or lost event"
call "$LEASE" show renewed --json
assert_eq "$(jget "$OUT" .state)" free "renewed: released at exit"

finish
