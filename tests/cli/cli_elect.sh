#!/usr/bin/env bash
# cli_elect: `lease elect` and `lease leader` - the leader's command and its
# environment, a second candidate, the step-down when renewals fail (the
# SQLite write lock held by another process), the next leader's greater
# epoch, the watch that follows both transitions, and bad input.
#
# No assertion here is about durations: waits are bounded loops, and the
# only timing checked is the ordering that the tool itself reports
# (before_deadline, exited_ns < deadline_ns).
. "$(dirname "$0")/lib.sh" "$@"

DB=$T/elect.db
S=sqlite://$DB
export LEASE_STORE=$S
export T
file_has() {
    grep -q "$2" "$1" 2>/dev/null
}

# lines_at_least FILE N: FILE has N lines or more.
lines_at_least() {
    [ "$(wc -l <"$1" 2>/dev/null || echo 0)" -ge "$2" ]
}

# group_gone PGID: no process is left in the process group.
group_gone() {
    ! pgrep -g "$1" >/dev/null 2>&1
}

section "(a) the leader runs CMD with LEASE_TOKEN == LEASE_EPOCH"
# A ttl of 4 s: a leader steps down on the first renewal that does not
# answer within a third of the ttl, and the leader must outlast sections
# (a) and (b) on a loaded machine (with 1 s, one stall of a third of a
# second on a shared CI host ended it in (b)).
"$LEASE" elect svc --ttl 4s --json -- sh -c \
    'echo "$LEASE_TOKEN $LEASE_EPOCH $LEASE_KEY $LEASE_OWNER" > "$T/f.tmp"; mv "$T/f.tmp" "$T/f"; sleep 30' \
    >"$T/a.out" 2>"$T/a.err" &
ELECT_PID=$!
bg_register "$ELECT_PID"
wait_for "the leader's command started" test -s "$T/f"
wait_for "the started event" file_has "$T/a.err" '"event":"started"'
read -r a_token a_epoch a_key a_owner <"$T/f" 2>/dev/null
assert_match "${a_token:-}" '^[1-9][0-9]*$' "LEASE_TOKEN is a number >= 1"
assert_eq "${a_epoch:-}" "${a_token:-}" "LEASE_EPOCH == LEASE_TOKEN"
assert_eq "${a_key:-}" election/svc "LEASE_KEY is election/NAME"
assert_match "${a_owner:-}" "$UUID_RE" "LEASE_OWNER is a UUID"
A_CHILD=$(ev "$T/a.err" '.[] | select(.event=="started") | .pid')
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="started") | .token')" "${a_epoch:-}" \
    "the started event carries the epoch"
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="acquired") | .key')" election/svc \
    "the acquired event names election/NAME"

call "$LEASE" leader svc --json
expect_rc 0 "leader svc --json"
assert_eq "$(jget "$OUT" .name)" svc "leader: name"
assert_eq "$(jget "$OUT" .leader)" true "leader: there is a leader"
assert_eq "$(jget "$OUT" .epoch)" "${a_epoch:-}" "leader: epoch == the command's LEASE_EPOCH"
assert_eq "$(jget "$OUT" .owner)" "${a_owner:-}" "leader: owner == the command's LEASE_OWNER"
assert_match "$(jget "$OUT" .label)" '.+:[0-9]+$' "leader: the default label is host:pid"
assert_match "$(jget "$OUT" .remaining_ms)" '^[1-9][0-9]*$' "leader: time left while leading"
A_EPOCH=${a_epoch:-0}
call "$LEASE" leader svc
expect_rc 0 "leader svc (text)"
assert_contains "$OUT" "epoch $A_EPOCH" "leader (text): the epoch"
call "$LEASE" show election/svc --json
assert_eq "$(jget "$OUT" '[.state, .token] | @tsv')" "$(printf 'held\t%s' "$A_EPOCH")" \
    "the leader holds the lease election/NAME"

section "(b) a second candidate"
call "$LEASE" elect svc -- touch "$T/ran-second"
expect_error 3 "a second elect while another leads"
call "$LEASE" elect svc --wait 300ms -- touch "$T/ran-second"
expect_error 7 "a second elect --wait 300ms while another leads"
assert_no_file "$T/ran-second" "the second candidate's command never ran"

section "(c) leadership ends: renewals fail while the write lock is held"
"$LEASE" leader svc --watch --json --count 2 >"$T/watch.out" 2>"$T/watch.err" &
WATCH_PID=$!
bg_register "$WATCH_PID"
wait_for "the watch printed the current leader" lines_at_least "$T/watch.out" 1
start_locker "$DB" 3
wait_exit "$ELECT_PID" elect_rc "lease elect whose renewals fail"
assert_eq "$elect_rc" 4 "lease elect exits 4 when leadership ended under its command"
if [[ "$A_CHILD" =~ ^[0-9]+$ ]]; then
    wait_for "the leader's command ($A_CHILD) is gone" pid_gone "$A_CHILD"
    wait_for "the leader's command's process group ($A_CHILD) is empty" group_gone "$A_CHILD"
else
    fail "no child pid in the started event: $A_CHILD"
fi
assert_eq "$(ev "$T/a.err" '[.[] | select(.event=="stopping") | .signal] | .[0]')" SIGTERM \
    "the command was stopped with SIGTERM first"
assert_eq "$(ev "$T/a.err" '[.[] | select(.event=="stopping") | .t_ns < .deadline_ns] | all')" true \
    "stopping signals were sent before the deadline"
assert_eq "$(ev "$T/a.err" '[.[] | select(.event=="exited")] | length')" 1 "one exited event"
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="exited") | .before_deadline')" true \
    "exited event: before_deadline"
assert_eq "$(ev "$T/a.err" '.[] | select(.event=="exited") | .exited_ns < .deadline_ns')" true \
    "exited event: exited_ns < deadline_ns"
assert_eq "$(ev "$T/a.err" '[.[].event | select(. == "acquired" or . == "started" or . == "exited")] | join(" ")')" \
    "acquired started exited" "the events in order"
assert_eq "$(ev "$T/a.err" '[.[] | select(.event=="exited")][0].t_ns > ([.[] | select(.event=="stopping")][0].t_ns)')" true \
    "exited after stopping"
wait_exit "$LOCKER" locker_rc "the sqlite3 locker"
assert_eq "$locker_rc" 0 "the sqlite3 locker ran cleanly ($(cat "$T/locker.out" 2>/dev/null))"

section "(d) the next leader has a greater epoch; the watch saw both transitions"
# The old leadership runs out in the store: the watch prints "no leader".
WAIT_TRIES=400 wait_for "the watch printed the end of the leadership" lines_at_least "$T/watch.out" 2
rm -f "$T/stop2" "$T/f2"
"$LEASE" elect svc --ttl 4s --wait 10s --json -- sh -c \
    'echo "$LEASE_EPOCH" > "$T/f2.tmp"; mv "$T/f2.tmp" "$T/f2"; i=0; while [ $i -lt 400 ] && [ ! -e "$T/stop2" ]; do sleep 0.05; i=$((i+1)); done' \
    >"$T/d.out" 2>"$T/d.err" &
ELECT2_PID=$!
bg_register "$ELECT2_PID"
wait_for "the next leader's command started" test -s "$T/f2"
B_EPOCH=$(cat "$T/f2" 2>/dev/null)
assert_gt "$B_EPOCH" "$A_EPOCH" "the next leader's epoch is greater"
call "$LEASE" leader svc --json
assert_eq "$(jget "$OUT" '[.leader, .epoch] | @tsv')" "$(printf 'true\t%s' "$B_EPOCH")" \
    "leader: the next leader and its epoch"
WAIT_TRIES=400 wait_exit "$WATCH_PID" watch_rc "lease leader --watch --count 2"
assert_eq "$watch_rc" 0 "the watch exits 0 after --count 2 transitions"
touch "$T/stop2"
wait_exit "$ELECT2_PID" elect2_rc "the next leader"
assert_eq "$elect2_rc" 0 "the next leader's command exited 0"
W=$(jq -s -c . "$T/watch.out" 2>/dev/null || echo '<bad json>')
echo "    watch: $W"
# The current leader, then two transitions: the end of the old leadership
# and the new leader.
assert_eq "$(jget "$W" 'length')" 3 "--count 2: the leader, then 2 transitions"
assert_eq "$(jget "$W" '[.[] | [.leader, .epoch] | map(tostring) | join(":")] | join(" ")')" \
    "true:$A_EPOCH false:$A_EPOCH true:$B_EPOCH" \
    "watch: leader (old epoch), no leader, leader (new epoch)"
assert_eq "$(jget "$W" '[.[].name] | unique | join(" ")')" svc "watch: the name on every line"
assert_eq "$(jget "$W" '.[1] | [.label, .owner] | map(tostring) | join(" ")')" "null null" \
    "watch: no label or owner without a leader"
call "$LEASE" leader svc --json
expect_rc 0 "leader svc after the next leader exited"
assert_eq "$(jget "$OUT" '[.leader, .epoch] | @tsv')" "$(printf 'false\t%s' "$B_EPOCH")" \
    "the next leader resigned when its command exited; the last epoch is kept"
assert_eq "$(ev "$T/d.err" '[.[].event] | join(" ")')" "acquired started exited released" \
    "the next leader: the events in order"

section "(e) leader: bounded watches, a name never led"
call "$LEASE" leader svc --watch --for 300ms --json
expect_rc 0 "leader --watch --for 300ms"
assert_eq "$(printf '%s\n' "$OUT" | jq -s -c 'map([.leader, .epoch])' 2>/dev/null)" "[[false,$B_EPOCH]]" \
    "--for without a transition: one line"
call "$LEASE" leader never-led --json
expect_error 1 "leader of a name never led"
call "$LEASE" leader never-led --watch --for 200ms --json
expect_rc 0 "leader --watch --for 200ms of a name never led"
assert_eq "$(jget "$OUT" '[.leader, .epoch] | @tsv')" "$(printf 'false\t0')" \
    "a name never led: no leader, epoch 0"

section "(f) bad input"
LONG=$(printf 'n%.0s' $(seq 247))
MAX=$(printf 'm%.0s' $(seq 246))
call "$LEASE" elect
expect_error 2 "elect without NAME"
call "$LEASE" elect -- touch "$T/ran-bad"
expect_error 2 "elect without NAME, with a command"
call "$LEASE" elect bad
expect_error 2 "elect without --"
call "$LEASE" elect bad --
expect_error 2 "elect with nothing after --"
call "$LEASE" elect bad touch "$T/ran-bad"
expect_error 2 "elect with the command not after --"
call "$LEASE" elect "" -- touch "$T/ran-bad"
expect_error 2 "elect with an empty NAME"
call "$LEASE" elect "$LONG" -- touch "$T/ran-bad"
expect_error 2 "elect with a 247-byte NAME"
call "$LEASE" elect bad --ttl 0 -- touch "$T/ran-bad"
expect_error 2 "elect --ttl 0"
call "$LEASE" elect bad --nope -- touch "$T/ran-bad"
expect_error 2 "elect with an unknown option"
assert_no_file "$T/ran-bad" "no command ran on bad input"
call "$LEASE" elect "$MAX" -- sh -c 'echo "$LEASE_KEY"'
expect_rc 0 "elect with a 246-byte NAME (the longest)"
assert_eq "$OUT" "election/$MAX" "the longest NAME: LEASE_KEY"
call "$LEASE" leader
expect_error 2 "leader without NAME"
call "$LEASE" leader ""
expect_error 2 "leader with an empty NAME"
call "$LEASE" leader "$LONG"
expect_error 2 "leader with a 247-byte NAME"
call "$LEASE" leader svc --count 2
expect_error 2 "leader --count without --watch"
call "$LEASE" leader svc --watch --count 0
expect_error 2 "leader --watch --count 0"
call "$LEASE" leader svc --watch --for soon
expect_error 2 "leader --watch --for garbage"
call "$LEASE" leader svc extra
expect_error 2 "leader with an extra argument"

finish
