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
#
# The grant history (lease history KEY --json) survives the failover: read
# through the surviving members, every key's history is exactly what it was
# before the kill (tokens, owners, labels, ttls, grant times, endings, end
# times); grants after the election are recorded above with greater tokens;
# a lease held at the kill that then ran out reads expired (no time: etcd
# keeps no record of when), and one whose holder came back to a refused
# renew reads lost, dated by that renew; lease run's grant ends released
# (outcome A) or as its events say (outcome B). The restarted old leader,
# alone, serves the same histories.
. "$(dirname "$0")/etcd_lib.sh" "$@"

TTL_S=6
HELD=leader-kill/held
HIST=leader-kill/hist
SHORT=leader-kill/short
LATE=leader-kill/late
OWNER_AFTER=0f3e7c1a-5b2d-4e8f-9a6b-1c2d3e4f5a6b

# history_of URL KEY: `lease history KEY --json` through URL into $OUT;
# exit 0 is a check.
history_of() {
    call "$LEASE" --store "$1" history "$2" --json
    expect_rc 0 "history $2 through $1"
}

# hsum: the history in $OUT, newest first, one "token owner ended label"
# per entry, joined by "|".
hsum() {
    jget "$OUT" '[.[] | "\(.token) \(.owner) \(.ended) \(.label)"] | join("|")'
}

# Wall-clock milliseconds: etcd's history is dated by its clients' clocks.
wall_ms() {
    date +%s%3N
}

declare -A HB=()   # the history of each key, read before the kill

section "a three-member cluster"
etcd_cluster 3 || die "start a three-member cluster"

TOKENS=()
for k in leader-kill/before/1 leader-kill/before/2; do
    call "$LEASE" --store "$URL" acquire "$k" --ttl 60s --label "$k" --json
    expect_rc 0 "acquire $k before the election"
    t=$(jget "$OUT" .token)
    assert_token "$t" "token of $k"
    TOKENS+=("$t")
done

# A released grant and a held one on one key.
call "$LEASE" --store "$URL" acquire "$HIST" --ttl 60s --label first --json
expect_rc 0 "acquire $HIST (first)"
H1_TOKEN=$(jget "$OUT" .token)
H1_OWNER=$(jget "$OUT" .owner)
call "$LEASE" --store "$URL" release "$HIST" --owner "$H1_OWNER" --token "$H1_TOKEN"
expect_rc 0 "release $HIST (first)"
call "$LEASE" --store "$URL" acquire "$HIST" --ttl 60s --label second --json
expect_rc 0 "acquire $HIST (second)"
H2_TOKEN=$(jget "$OUT" .token)
H2_OWNER=$(jget "$OUT" .owner)
TOKENS+=("$H1_TOKEN" "$H2_TOKEN")

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

section "the histories before the kill"
# Two short leases (etcd's minimum ttl: 2 s granted), held at the kill:
# they run out after the election. Each one's history is read right after
# its acquire, as it reads held only while that etcd lease lasts: read
# after the other keys' histories, it came 1.5-5 s after the acquire on a
# busy machine (ctest -j, two of these tests at once) and read expired, on
# either transport.
call "$LEASE" --store "$URL" acquire "$SHORT" --ttl 1s --label short --json
expect_rc 0 "acquire $SHORT --ttl 1s"
S_ACQ=$OUT
history_of "$URL" "$SHORT"
HB[$SHORT]=$OUT
call "$LEASE" --store "$URL" acquire "$LATE" --ttl 1s --label late --json
expect_rc 0 "acquire $LATE --ttl 1s"
L_ACQ=$OUT
history_of "$URL" "$LATE"
HB[$LATE]=$OUT
S_TOKEN=$(jget "$S_ACQ" .token)
S_OWNER=$(jget "$S_ACQ" .owner)
S_TTL=$(jget "$S_ACQ" .ttl_ms)
L_TOKEN=$(jget "$L_ACQ" .token)
L_OWNER=$(jget "$L_ACQ" .owner)
TOKENS+=("$S_TOKEN" "$L_TOKEN")
MAX_BEFORE=$(max_of "${TOKENS[@]}")
for k in leader-kill/before/1 leader-kill/before/2 "$HIST" "$HELD"; do
    history_of "$URL" "$k"
    HB[$k]=$OUT
done
for i in 1 2; do
    OUT=${HB[leader-kill/before/$i]}
    assert_eq "$(jget "$OUT" '[.[] | "\(.token) \(.ended) \(.label) \(.ttl_ms)"] | join("|")')" \
        "${TOKENS[$((i - 1))]} held leader-kill/before/$i 60000" "history of before/$i"
done
OUT=${HB[$HIST]}
assert_eq "$(hsum)" "$H2_TOKEN $H2_OWNER held second|$H1_TOKEN $H1_OWNER released first" \
    "history of $HIST before the kill"
assert_eq "$(jget "$OUT" '.[1] | .ended_ms >= .acquired_ms')" true "$HIST: released after granted"
OUT=${HB[$HELD]}
assert_eq "$(hsum)" "$RUN_TOKEN $RUN_OWNER held holder" "history of $HELD before the kill"
assert_eq "$(jget "$OUT" '.[0].ttl_ms')" "$RUN_TTL" "history of $HELD: the granted ttl"
OUT=${HB[$SHORT]}
assert_eq "$(hsum)" "$S_TOKEN $S_OWNER held short" "history of $SHORT before the kill"
assert_eq "$(jget "$OUT" '.[0].ttl_ms')" "$S_TTL" "history of $SHORT: the granted ttl"
OUT=${HB[$LATE]}
assert_eq "$(hsum)" "$L_TOKEN $L_OWNER held late" "history of $LATE before the kill"

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
        --owner "$OWNER_AFTER" --ttl 60s --label "after 1" --json
    [ "$RC" = 6 ] || break
    sleep 0.2
done
expect_rc 0 "acquire another key after the election"
AFTER1=$(jget "$OUT" .token)
assert_gt "$AFTER1" "$MAX_BEFORE" "the first token after the election is greater than every token before"
ELECTED_MS=$(wall_ms)

section "the histories after the election, through the survivors"
for k in leader-kill/before/1 leader-kill/before/2 "$HIST"; do
    history_of "$SURV_URL" "$k"
    assert_eq "$OUT" "${HB[$k]}" "history of $k after the election: exactly what it was"
done
history_of "$SURV_URL" leader-kill/after/1
assert_eq "$(hsum)" "$AFTER1 $OWNER_AFTER held after 1" "the grant after the election is recorded"

# The holder of $HIST's second grant renews and releases through the
# survivors; the next grant goes above, the first entry unchanged.
call "$LEASE" --store "$SURV_URL" renew "$HIST" --owner "$H2_OWNER" --token "$H2_TOKEN" --ttl 60s
expect_rc 0 "renew $HIST (second) after the election"
call "$LEASE" --store "$SURV_URL" release "$HIST" --owner "$H2_OWNER" --token "$H2_TOKEN"
expect_rc 0 "release $HIST (second) after the election"
call "$LEASE" --store "$SURV_URL" acquire "$HIST" --ttl 60s --label third --json
expect_rc 0 "acquire $HIST (third) after the election"
H3_TOKEN=$(jget "$OUT" .token)
H3_OWNER=$(jget "$OUT" .owner)
assert_gt "$H3_TOKEN" "$AFTER1" "$HIST: the grant after the election has a greater token"
history_of "$SURV_URL" "$HIST"
assert_eq "$(hsum)" \
    "$H3_TOKEN $H3_OWNER held third|$H2_TOKEN $H2_OWNER released second|$H1_TOKEN $H1_OWNER released first" \
    "history of $HIST after a release and a grant after the election"
assert_eq "$(jget "$OUT" '.[1:] | map(del(.ended, .ended_at, .ended_ms)) | tojson')" \
    "$(jget "${HB[$HIST]}" 'map(del(.ended, .ended_at, .ended_ms)) | tojson')" "$HIST: the grants from before, unchanged"
assert_eq "$(jget "$OUT" '.[2] | tojson')" "$(jget "${HB[$HIST]}" '.[1] | tojson')" "$HIST: the first release, unchanged"
assert_eq "$(jget "$OUT" ".[1].ended_ms >= $ELECTED_MS and .[0].acquired_ms >= .[1].ended_ms")" true \
    "$HIST: released after the election, granted again after that"
HIST_AFTER=$OUT

# Held at the kill, never renewed: it runs out after the election (etcd's
# new leader gives every lease its ttl again). Bounded wait.
WAIT_TRIES=400 wait_for "$SHORT ran out" key_state_is "$SHORT" expired "$SURV_URL"
history_of "$SURV_URL" "$SHORT"
assert_eq "$(hsum)" "$S_TOKEN $S_OWNER expired short" "history of $SHORT: expired"
assert_eq "$(jget "$OUT" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" \
    "$(jget "${HB[$SHORT]}" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" "$SHORT: the same grant"
assert_eq "$(jget "$OUT" '.[0] | "\(.ended_at) \(.ended_ms)"')" "null null" \
    "$SHORT: no end time (etcd keeps no record of an expiry)"
call "$LEASE" --store "$SURV_URL" acquire "$SHORT" --ttl 30s --label "short again" --json
expect_rc 0 "acquire $SHORT after it ran out"
S2_TOKEN=$(jget "$OUT" .token)
S2_OWNER=$(jget "$OUT" .owner)
assert_gt "$S2_TOKEN" "$H3_TOKEN" "$SHORT: a greater token"
history_of "$SURV_URL" "$SHORT"
assert_eq "$(hsum)" "$S2_TOKEN $S2_OWNER held short again|$S_TOKEN $S_OWNER expired short" \
    "history of $SHORT after the next grant"
assert_eq "$(jget "$OUT" '.[1].ended_ms')" null "$SHORT: still no end time"

# Held at the kill; its holder comes back after it ran out: refused, lost,
# dated by the refused renew.
WAIT_TRIES=400 wait_for "$LATE ran out" key_state_is "$LATE" expired "$SURV_URL"
t_renew=$(wall_ms)
call "$LEASE" --store "$SURV_URL" renew "$LATE" --owner "$L_OWNER" --token "$L_TOKEN"
expect_error 4 "renew $LATE after it ran out"
t_refused=$(wall_ms)
history_of "$SURV_URL" "$LATE"
assert_eq "$(hsum)" "$L_TOKEN $L_OWNER lost late" "history of $LATE: lost"
assert_eq "$(jget "$OUT" ".[0].ended_ms >= $t_renew and .[0].ended_ms <= $t_refused")" true \
    "$LATE: lost at the refused renew"
assert_eq "$(jget "$OUT" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" \
    "$(jget "${HB[$LATE]}" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" "$LATE: the same grant"

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
    history_of "$SURV_URL" "$HELD"
    assert_eq "$OUT" "${HB[$HELD]}" "history of $HELD through the survivors: exactly what it was"
    RUN_ENDED=released
    t_term=$(wall_ms)
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
    history_of "$SURV_URL" "$HELD"
    assert_eq "$(hsum)" "$RUN_TOKEN $RUN_OWNER released holder" "history of $HELD: released by lease run"
    assert_eq "$(jget "$OUT" ".[0].ended_ms >= $t_term and .[0].ended_ms <= $(wall_ms)")" true \
        "$HELD: released after the SIGTERM"
else
    OUTCOME=B
    WAIT_TRIES=600 wait_exit "$RUN" RUN_RC "lease run after losing the lease"
    echo "OUTCOME B: the lease was lost cleanly (lease run stopped its child and exited $RUN_RC)"
    assert_eq "$RUN_RC" 4 "lease run exits 4 when it had to stop its child"
    EXITED=$(grep '"event":"exited"' "$T/run.err" | tail -n 1)
    assert_eq "$(jget "$EXITED" .before_deadline)" true "the child was stopped before the local deadline"
    assert_match "$(grep -c '"event":"stopping"' "$T/run.err")" '^[1-9]' "lease run stopped its child itself"
    # Its grant ended as its events say: released if it could release;
    # lost if the store refused a renewal (the keeper marks it); released
    # or expired if its release failed (the outcome of a failed call is
    # unknown); otherwise nothing was written and it reads expired once the
    # key is granted again.
    if grep -q '"event":"released"' "$T/run.err"; then
        RUN_ENDED=released
    elif grep -q '"reason":"ELOST"' "$T/run.err"; then
        RUN_ENDED=lost
    elif grep -q '"event":"release_failed"' "$T/run.err"; then
        RUN_ENDED="released expired"
    else
        RUN_ENDED=expired
    fi
    echo "outcome B: lease run's grant should read: $RUN_ENDED"
fi
echo "--- lease run's events:"
cat "$T/run.err"

section "tokens never go backwards"
# The same key again (in outcome B the old etcd lease may still run out).
call "$LEASE" --store "$SURV_URL" acquire "$HELD" --ttl 60s --wait 15s --label again --json
expect_rc 0 "acquire the held key again"
assert_gt "$(jget "$OUT" .token)" "$S2_TOKEN" "its new token is greater than every one before"
LAST=$(jget "$OUT" .token)
LAST_OWNER=$(jget "$OUT" .owner)
history_of "$SURV_URL" "$HELD"
assert_eq "$(jget "$OUT" '[.[] | "\(.token) \(.owner) \(.label)"] | join("|")')" \
    "$LAST $LAST_OWNER again|$RUN_TOKEN $RUN_OWNER holder" "history of $HELD: the new grant above lease run's"
assert_eq "$(jget "$OUT" '.[0].ended')" held "$HELD: the new grant is held"
case " $RUN_ENDED " in
*" $(jget "$OUT" '.[1].ended') "*) pass ;;
*) fail "$HELD: lease run's grant reads '$(jget "$OUT" '.[1].ended')', expected: $RUN_ENDED" ;;
esac
assert_eq "$(jget "$OUT" '.[1] | del(.ended, .ended_at, .ended_ms) | tojson')" \
    "$(jget "${HB[$HELD]}" '.[0] | del(.ended, .ended_at, .ended_ms) | tojson')" "$HELD: lease run's grant, unchanged"
HELD_AFTER=$OUT
call "$LEASE" --store "$SURV_URL" show leader-kill/before/1 --json
expect_rc 0 "show a key acquired before the election"
assert_eq "$(jget "$OUT" .state)" held "a lease granted before the election is still held"
assert_eq "$(jget "$OUT" .token)" "${TOKENS[0]}" "... with its token"

section "the old leader comes back"
member_restart "$LEADER" || fail "restart $LEADER: $(cat "$T/etcd-start.out")"
WAIT_TRIES=300 wait_for "the cluster is healthy again" cluster_healthy
call "$LEASE" --store "$(url_of "$LEADER")" acquire leader-kill/after/2 --ttl 30s --label "after 2" --json
expect_rc 0 "acquire through the restarted old leader alone"
assert_gt "$(jget "$OUT" .token)" "$LAST" "its token is greater than every one before"
A2_TOKEN=$(jget "$OUT" .token)
A2_OWNER=$(jget "$OUT" .owner)
# The old leader, alone, serves the histories the survivors recorded.
history_of "$(url_of "$LEADER")" leader-kill/after/2
assert_eq "$(hsum)" "$A2_TOKEN $A2_OWNER held after 2" "history of after/2 through the old leader"
history_of "$(url_of "$LEADER")" "$HIST"
assert_eq "$OUT" "$HIST_AFTER" "history of $HIST through the old leader: what the survivors recorded"
history_of "$(url_of "$LEADER")" "$HELD"
assert_eq "$OUT" "$HELD_AFTER" "history of $HELD through the old leader: what the survivors recorded"
history_of "$(url_of "$LEADER")" leader-kill/before/1
assert_eq "$OUT" "${HB[leader-kill/before/1]}" "history of before/1 through the old leader: what it was before the kill"

echo "leader kill: outcome $OUTCOME"
finish
