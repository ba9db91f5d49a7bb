#!/usr/bin/env bash
# etcd_leader_kill: the leader of a three-member etcd cluster is killed
# (kill -9) while `lease run KEY --ttl 6s -- sleep 1000` holds a lease and
# keeps renewing it.
#
# Either outcome is correct, and the test says which one it saw:
#   (A) the lease stays valid: the renewals go to the other members (the
#       holder's URL names the leader first, so its requests went there
#       until it died) and succeed within the holder's deadline; `lease run`
#       keeps its child past the deadline of every grant made before the
#       kill, and the store still shows the same owner and token;
#   (B) the lease is lost cleanly: `lease run` exits 4 after stopping its
#       child, and its "exited" event has before_deadline true.
# In both cases tokens never go backwards: acquisitions after the election
# (another key; the same key again; through the restarted old leader) get
# tokens greater than every token issued before.
. "$(dirname "$0")/etcd_lib.sh" "$@"

TTL_S=6
HELD=leader-kill/held
OWNER_AFTER=0f3e7c1a-5b2d-4e8f-9a6b-1c2d3e4f5a6b

section "a three-member cluster"
etcd_cluster 3 || die "start a three-member cluster"

TOKENS=()
for k in leader-kill/before/1 leader-kill/before/2; do
    call "$LEASE" --store "$URL" acquire "$k" --ttl 60s --json
    expect_rc 0 "acquire $k before the election"
    t=$(jget "$OUT" .token)
    assert_token "$t" "token of $k"
    TOKENS+=("$t")
done

LEADER=""
for ((i = 0; i < 100; i++)); do   # bounded: 100 x 0.1 s
    LEADER=$(leader_name) && break
    sleep 0.1
done
[ -n "$LEADER" ] || die "no member is the leader: $(status_json)"
echo "leader before the kill: $LEADER (client port ${CPORT[$LEADER]})"
OTHERS=()
for n in "${NAMES[@]}"; do [ "$n" = "$LEADER" ] || OTHERS+=("$n"); done
# The holder asks the leader first: every request goes there until it dies.
RUN_URL=$(url_of "$LEADER" "${OTHERS[@]}")

section "a holder that keeps renewing: lease run --ttl ${TTL_S}s -- sleep 1000"
"$LEASE" --store "$RUN_URL" run "$HELD" --ttl "${TTL_S}s" --label holder --json \
    -- sleep 1000 >"$T/run.out" 2>"$T/run.err" &
RUN=$!
bg_register "$RUN"
WAIT_TRIES=200 wait_for "lease run started its child" grep -q '"event":"started"' "$T/run.err" ||
    die "lease run did not start: $(cat "$T/run.err")"
ACQ=$(grep '"event":"acquired"' "$T/run.err" | head -n 1)
RUN_TOKEN=$(jget "$ACQ" .token)
RUN_OWNER=$(jget "$ACQ" .owner)
RUN_TTL=$(jget "$ACQ" .ttl_ms)
RUN_DEADLINE_NS=$(jget "$ACQ" .deadline_ns)
CHILD=$(jget "$(grep '"event":"started"' "$T/run.err" | head -n 1)" .pid)
assert_token "$RUN_TOKEN" "lease run's token"
assert_eq "$RUN_TTL" $((TTL_S * 1000)) "lease run's granted ttl (whole seconds already)"
assert_match "$CHILD" '^[0-9]+$' "lease run's child pid"
TOKENS+=("$RUN_TOKEN")
MAX_BEFORE=$(max_of "${TOKENS[@]}")
echo "tokens before the election: ${TOKENS[*]} (max $MAX_BEFORE)"

section "kill -9 the leader"
L2=$(leader_name) || L2=""
if [ -n "$L2" ] && [ "$L2" != "$LEADER" ]; then
    # The leader moved on its own since we looked: kill the one leading now
    # (the holder's URL still names the old one first; it is a follower).
    echo "the leader moved from $LEADER to $L2 before the kill"
    LEADER=$L2
fi
member_kill9 "$LEADER"
KILL_MS=$(($(boot_ms) + 10))   # + /proc/uptime's resolution: not earlier than the death
if member_pid "$LEADER" >/dev/null; then fail "the leader $LEADER still runs after kill -9"; else pass; fi
SURVIVORS=()
for n in "${NAMES[@]}"; do [ "$n" = "$LEADER" ] || SURVIVORS+=("$n"); done
SURV_URL=$(url_of "${SURVIVORS[@]}")

NEW_LEADER=""
for ((i = 0; i < 150; i++)); do   # bounded: 150 x 0.1 s
    NEW_LEADER=$(EP=${SURV_URL#etcd://} leader_name) && [ "$NEW_LEADER" != "$LEADER" ] && break
    NEW_LEADER=""
    sleep 0.1
done
if [ -n "$NEW_LEADER" ]; then pass; else fail "no new leader among ${SURVIVORS[*]}: $(EP=${SURV_URL#etcd://} status_json)"; fi
echo "new leader: ${NEW_LEADER:-none}"

section "an acquisition after the election gets a greater token"
# Through the full URL, the dead member first: its requests must go on to
# the others. During the election a request may time out (ESTORE, exit 6:
# outcome unknown); retrying with the same owner is safe. Bounded.
for ((i = 0; i < 10; i++)); do
    call "$LEASE" --store "$RUN_URL" --timeout 3s acquire leader-kill/after/1 \
        --owner "$OWNER_AFTER" --ttl 60s --json
    [ "$RC" = 6 ] || break
    sleep 0.2
done
expect_rc 0 "acquire another key after the election"
AFTER1=$(jget "$OUT" .token)
assert_gt "$AFTER1" "$MAX_BEFORE" "the first token after the election is greater than every token before"

section "the holder: still valid, or lost cleanly"
# Wait until every grant made before the kill has passed its local deadline
# (the acquire's, and any renewal's sent before the kill: kill + ttl), then
# one more second; or until lease run's child is gone. Bounded (20 s).
WAIT_UNTIL=$(max_of $((RUN_DEADLINE_NS / 1000000)) $((KILL_MS + RUN_TTL)))
WAIT_UNTIL=$((WAIT_UNTIL + 1000))
# The child tells the outcome, not lease run itself: once it has stopped
# its child, lease run may still take a while to finish its last renewal
# attempt and release before it exits.
child_alive() {
    kill -0 "$CHILD" 2>/dev/null && ! process_exited "$CHILD"
}
for ((i = 0; i < 400; i++)); do   # bounded: 400 x 0.05 s
    child_alive || break
    [ "$(boot_ms)" -gt "$WAIT_UNTIL" ] && break
    sleep 0.05
done

if child_alive; then
    OUTCOME=A
    echo "OUTCOME A: the lease stayed valid through the leader's death (lease run still holds its child)"
    if process_exited "$RUN"; then fail "outcome A: lease run exited but its child $CHILD lives"; else pass; fi
    call "$LEASE" --store "$SURV_URL" show "$HELD" --json
    expect_rc 0 "show the held key through the survivors"
    assert_eq "$(jget "$OUT" .state)" held "the key is still held"
    assert_eq "$(jget "$OUT" .token)" "$RUN_TOKEN" "... with the same token"
    assert_eq "$(jget "$OUT" .owner)" "$RUN_OWNER" "... by the same owner"
    assert_not_contains "$(cat "$T/run.err")" '"event":"lost"' "no lost event while the lease stayed valid"
    # Stop the holder: SIGTERM goes to the child (sleep: 128+15), then it releases.
    kill -TERM "$RUN"
    wait_exit "$RUN" RUN_RC "lease run after SIGTERM"
    assert_eq "$RUN_RC" 143 "lease run ends with its child's status after SIGTERM"
    EXITED=$(grep '"event":"exited"' "$T/run.err" | tail -n 1)
    assert_eq "$(jget "$EXITED" .before_deadline)" true "the child exited before the local deadline"
    # A local deadline this late comes only from a renewal sent after the
    # leader had died, i.e. one that went through the other members.
    EXIT_DEADLINE_MS=$(($(jget "$EXITED" .deadline_ns) / 1000000))
    if [ "$EXIT_DEADLINE_MS" -gt $((KILL_MS + RUN_TTL * 98 / 100)) ]; then pass; else
        fail "outcome A: the last deadline ($EXIT_DEADLINE_MS ms) is not past kill + ttl*0.98 ($((KILL_MS + RUN_TTL * 98 / 100)) ms): no renewal after the kill?"
    fi
    assert_contains "$(cat "$T/run.err")" '"event":"released"' "lease run released the key"
else
    OUTCOME=B
    WAIT_TRIES=600 wait_exit "$RUN" RUN_RC "lease run after losing the lease"
    echo "OUTCOME B: the lease was lost cleanly (lease run stopped its child and exited $RUN_RC)"
    assert_eq "$RUN_RC" 4 "lease run exits 4 when it had to stop its child"
    EXITED=$(grep '"event":"exited"' "$T/run.err" | tail -n 1)
    assert_eq "$(jget "$EXITED" .before_deadline)" true "the child was stopped before the local deadline"
    assert_match "$(grep -c '"event":"stopping"' "$T/run.err")" '^[1-9]' "lease run stopped its child itself"
fi
echo "--- lease run's events:"
cat "$T/run.err"

section "tokens never go backwards"
# The same key again (in outcome B the old etcd lease may still run out).
call "$LEASE" --store "$SURV_URL" acquire "$HELD" --ttl 30s --wait 15s --json
expect_rc 0 "acquire the held key again"
assert_gt "$(jget "$OUT" .token)" "$AFTER1" "its new token is greater than every one before"
LAST=$(jget "$OUT" .token)
call "$LEASE" --store "$SURV_URL" show leader-kill/before/1 --json
expect_rc 0 "show a key acquired before the election"
assert_eq "$(jget "$OUT" .state)" held "a lease granted before the election is still held"
assert_eq "$(jget "$OUT" .token)" "${TOKENS[0]}" "... with its token"

section "the old leader comes back"
member_restart "$LEADER" || fail "restart $LEADER: $(cat "$T/etcd-start.out")"
WAIT_TRIES=300 wait_for "the cluster is healthy again" cluster_healthy
call "$LEASE" --store "$(url_of "$LEADER")" acquire leader-kill/after/2 --ttl 30s --json
expect_rc 0 "acquire through the restarted old leader alone"
assert_gt "$(jget "$OUT" .token)" "$LAST" "its token is greater than every one before"

echo "leader kill: outcome $OUTCOME"
finish
