#!/usr/bin/env bash
# cli_run_lost: `lease run` and `lease elect` whose command ran on past the
# lease. The supervisor alone is stopped (SIGSTOP: its renewing thread too,
# not the command, which runs in a group of its own); the command finishes
# with 0 while it is stopped, the lease runs out in the store and another
# owner takes it; resumed, the supervisor must not pass the command's 0 on:
# it says "lost while running" (a lost_while_running event with --json)
# and exits 4. A command that finishes under its lease still exits 0.
#
# No fixed sleeps: every wait is a bounded loop on what the store says.
. "$(dirname "$0")/lib.sh" "$@"

DB=$T/lost.db
export LEASE_STORE=sqlite://$DB
export T
OWNER_B=6f1c2b7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f
# The command: say it started, wait (bounded) for the test's go, finish.
CHILD=': > "$T/ready-$0"; i=0; while [ ! -e "$T/go-$0" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; : > "$T/done-$0"; exit 0'

# stopped_past_lease CMD KEY TAG [--json]: run `lease CMD` on KEY, stop it
# once its command runs, let the command finish, wait until the store says
# the lease expired and another owner holds it, resume; the exit status is
# in $RC, stderr in $T/TAG.err.
stopped_past_lease() {
    local cmd=$1 key=$2 tag=$3 pid skey=$2
    shift 3
    [ "$cmd" = elect ] && skey=election/$key
    "$LEASE" "$cmd" "$key" --ttl 1s "$@" -- sh -c "$CHILD" "$tag" 2>"$T/$tag.err" &
    pid=$!
    bg_register "$pid"
    wait_for "$tag: the command runs" test -e "$T/ready-$tag"
    wait_for "$tag: held" key_state_is "$skey" held
    kill -STOP "$pid"
    : > "$T/go-$tag"
    wait_for "$tag: the command finished while lease $cmd was stopped" test -e "$T/done-$tag"
    wait_for "$tag: the lease expired in the store" key_state_is "$skey" expired
    call "$LEASE" acquire "$skey" --owner "$OWNER_B" --ttl 30s --json
    expect_rc 0 "$tag: another owner takes the key"
    kill -CONT "$pid"
    wait_exit "$pid" RC "$tag: lease $cmd resumed"
}

section "(a) lease run stopped past its lease, text output"
stopped_past_lease run job-a a
assert_eq "$RC" 4 "run: exit 4, not the command's 0"
assert_contains "$(cat "$T/a.err")" "lost while running" "run: stderr says lost while running"
assert_contains "$(cat "$T/a.err")" "the command exited 0" "run: stderr gives the command's code"

section "(b) lease run stopped past its lease, --json"
stopped_past_lease run job-b b --json
assert_eq "$RC" 4 "run --json: exit 4"
assert_eq "$(ev "$T/b.err" '[.[] | select(.event=="lost_while_running")] | length')" 1 \
    "run --json: one lost_while_running event"
assert_eq "$(ev "$T/b.err" '.[] | select(.event=="lost_while_running") | .code')" 0 \
    "run --json: the event carries the command's code"
assert_eq "$(ev "$T/b.err" '.[] | select(.event=="exited") | .before_deadline')" false \
    "run --json: the exit was seen after the deadline"

section "(c) lease elect stopped past its leadership"
stopped_past_lease elect job-c c --json
assert_eq "$RC" 4 "elect: exit 4, not the command's 0"
assert_eq "$(ev "$T/c.err" '[.[] | select(.event=="lost_while_running")] | length')" 1 \
    "elect --json: one lost_while_running event"

section "(d) control: a command that finishes under its lease exits 0"
call "$LEASE" run job-d --ttl 1s --json -- true
expect_rc 0 "run of a command that finishes in time: exit 0"
assert_not_contains "$ERR" "lost_while_running" "no lost_while_running event"
call "$LEASE" show job-d --json
assert_eq "$(jget "$OUT" .state)" free "the lease was released"

finish
