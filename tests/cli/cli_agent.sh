#!/usr/bin/env bash
# cli_agent: `lease agent` - two agents on loopback campaign for one name;
# each says on stderr where it listens; exactly one leads, both serve the
# same leader on /leader (known, 200), /healthz is ok (200),
# /metrics passes `promtool check metrics`; kill -9 of the leading agent and
# the other takes over with a greater epoch; SIGTERM resigns; bad input.
#
# No assertion here is about durations: every wait is a bounded loop.
. "$(dirname "$0")/lib.sh" "$@"
. "$(dirname "$0")/agent_lib.sh"

for tool in curl promtool ss shuf; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by cli_agent but was not found in PATH" >&2
        exit 1
    fi
done

DB=$T/agent.db
export LEASE_STORE=sqlite://$DB


# get PORT PATH: the body of GET http://127.0.0.1:PORT/PATH (bounded).
get() {
    curl -s --noproxy "*" --max-time 2 "http://127.0.0.1:$1$2"
}

healthy() {
    [ "$(get "$1" /healthz | jq -r .ok 2>/dev/null)" = true ]
}

# exactly_one_leads: one agent says this_agent_leads, the other does not,
# and both show the same leader (epoch and label); their answers are left
# in LA and LB.
exactly_one_leads() {
    local a b
    LA=$(get "$PA" /leader) && LB=$(get "$PB" /leader) || return 1
    a=$(jget "$LA" '[.this_agent_leads, .epoch, .label] | map(tostring) | join(" ")')
    b=$(jget "$LB" '[.this_agent_leads, .epoch, .label] | map(tostring) | join(" ")')
    case "${a%% *} ${b%% *}" in "true false" | "false true") ;; *) return 1 ;; esac
    [ "${a#* }" = "${b#* }" ]
}

# leads_with PORT LABEL MIN_EPOCH: the agent at PORT leads with a greater
# epoch than MIN_EPOCH, under its own label.
leads_with() {
    get "$1" /leader | jq -e --arg l "$2" --argjson e "$3" \
        '.this_agent_leads == true and .leader == true and .label == $l and .epoch > $e' \
        >/dev/null 2>&1
}

# metric FILE SERIES: the value of one series in a scraped text.
metric() {
    awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print "missing" }' "$1"
}

# start_agent LABEL: start `lease agent svc --label LABEL` on a free port;
# sets PID_<LABEL> and P<LABEL>. A ttl of 4 s: a leader steps down on the
# first renewal that takes a third of its ttl, and the checks below count
# one leadership only until (c) kills the leader; a stall of a third of a
# second on a loaded host would hand over a 1 s leadership.
start_agent() {
    local lc
    lc=$(echo "$1" | tr 'A-Z' 'a-z')
    agent_on_free_port "PID_$1" "P$1" "$1" "$T/$lc.err" our_agent_up launch_agent "$1" "$lc"
}

# launch_agent LABEL FILE: exec the agent on $PORT, output in $T/FILE.out/.err.
launch_agent() {
    exec "$LEASE" agent svc --listen "127.0.0.1:$PORT" --ttl 4s --label "$1" --json \
        >"$T/$2.out" 2>"$T/$2.err"
}

# our_agent_up PORT: the agent on PORT is healthy and answers for "svc".
our_agent_up() {
    healthy "$1" && [ "$(get "$1" /leader | jq -r .name 2>/dev/null)" = svc ]
}

# On a failed check, show what the agents said.
show_agents() {
    local f
    for f in a.out a.err b.out b.err; do
        echo "    $f: $(head -c 1000 "$T/$f" 2>/dev/null)"
    done
}

section "(a) two agents: exactly one leads, both agree"
start_agent A
start_agent B
WAIT_TRIES=400 wait_for "exactly one agent leads and both agree" exactly_one_leads || show_agents
echo "    A: $LA"
echo "    B: $LB"
assert_eq "$(jget "$LA" '.this_agent_leads') $(jget "$LB" '.this_agent_leads')" \
    "$(if [ "$(jget "$LA" .this_agent_leads)" = true ]; then echo 'true false'; else echo 'false true'; fi)" \
    "one agent leads, the other does not"
assert_eq "$(jget "$LA" .epoch)" "$(jget "$LB" .epoch)" "both agents show the same epoch"
assert_eq "$(jget "$LA" .label)" "$(jget "$LB" .label)" "both agents show the same label"
assert_eq "$(jget "$LA" .owner)" "$(jget "$LB" .owner)" "both agents show the same owner"
assert_eq "$(jget "$LA" '[.name, .leader, .known] | map(tostring) | join(" ")')" "svc true true" \
    "A: name, leader, known"
assert_eq "$(jget "$LB" '[.name, .leader, .known] | map(tostring) | join(" ")')" "svc true true" \
    "B: name, leader, known"
for l in A B; do
    p=P$l
    assert_contains "$(cat "$T/$(echo "$l" | tr AB ab).err")" \
        "lease agent: listening on http://127.0.0.1:${!p}/ (GET /leader, /healthz, /metrics) for the leadership of svc on the sqlite store" \
        "agent $l says on stderr where it listens"
done
assert_match "$(jget "$LA" .epoch)" '^[1-9][0-9]*$' "the epoch is a number >= 1"
assert_match "$(jget "$LA" .owner)" "$UUID_RE" "the owner is a UUID"
if [ "$(jget "$LA" .this_agent_leads)" = true ]; then
    LEADER=A; L_PID=$PID_A; L_PORT=$PA; FOLLOWER=B; F_PID=$PID_B; F_PORT=$PB
else
    LEADER=B; L_PID=$PID_B; L_PORT=$PB; FOLLOWER=A; F_PID=$PID_A; F_PORT=$PA
fi
EPOCH=$(jget "$LA" .epoch)
assert_eq "$(jget "$LA" .label)" "$LEADER" "the label is the leading agent's --label"
call "$LEASE" leader svc --json
assert_eq "$(jget "$OUT" '[.leader, .epoch, .label] | map(tostring) | join(" ")')" "true $EPOCH $LEADER" \
    "lease leader agrees with the agents"
assert_eq "$(grep -c '"event":"leading"' "$T/$(echo "$LEADER" | tr AB ab).out")" 1 \
    "the leading agent logged one leading event"
assert_eq "$(grep -c '"event":"leading"' "$T/$(echo "$FOLLOWER" | tr AB ab).out")" 0 \
    "the other agent logged none"

section "(b) /healthz, /metrics, other paths"
for p in "$PA" "$PB"; do
    H=$(get "$p" /healthz)
    assert_eq "$(jget "$H" '[.ok, .store, .store_reachable] | map(tostring) | join(" ")')" \
        "true sqlite true" "/healthz on $p: ok, store, store_reachable"
    assert_eq "$(curl -s --noproxy "*" --max-time 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/healthz")" 200 \
        "/healthz on $p: 200"
    ctype=$(curl -s --noproxy "*" --max-time 2 -o "$T/metrics.$p" -w '%{http_code} %{content_type}' \
        "http://127.0.0.1:$p/metrics")
    assert_eq "$ctype" "200 text/plain; version=0.0.4" "/metrics on $p: 200, Prometheus text"
    if promtool check metrics <"$T/metrics.$p" >"$T/promtool.$p" 2>&1; then pass; else
        fail "/metrics on $p: promtool check metrics failed: $(head -c 800 "$T/promtool.$p")"
    fi
    assert_eq "$(curl -s --noproxy "*" --max-time 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/nope")" 404 \
        "an unknown path on $p: 404"
    assert_eq "$(curl -s --noproxy "*" --max-time 2 -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$p/leader")" 405 \
        "POST /leader on $p: 405"
done
assert_gt "$(metric "$T/metrics.$L_PORT" 'lease_leader_transitions_total{store="sqlite"}')" 0 \
    "the leading agent counted its election"
assert_gt "$(metric "$T/metrics.$L_PORT" 'lease_acquisitions_total{store="sqlite",outcome="granted"}')" 0 \
    "the leading agent counted a granted acquisition"
assert_gt "$(metric "$T/metrics.$F_PORT" 'lease_acquisitions_total{store="sqlite",outcome="busy"}')" 0 \
    "the other agent counted busy campaigns"
assert_eq "$(metric "$T/metrics.$F_PORT" 'lease_acquisitions_total{store="sqlite",outcome="granted"}')" 0 \
    "the other agent never won"

section "(c) kill -9 of the leading agent ($LEADER): $FOLLOWER takes over"
kill -KILL "$L_PID"
wait "$L_PID" 2>/dev/null
WAIT_TRIES=400 wait_for "$FOLLOWER leads with an epoch greater than $EPOCH" \
    leads_with "$F_PORT" "$FOLLOWER" "$EPOCH" || show_agents
LF=$(get "$F_PORT" /leader)
echo "    $FOLLOWER: $LF"
assert_gt "$(jget "$LF" .epoch)" "$EPOCH" "the new leader's epoch is greater"
assert_eq "$(jget "$LF" '[.this_agent_leads, .leader, .label] | map(tostring) | join(" ")')" \
    "true true $FOLLOWER" "the surviving agent leads, under its label"
NEW_EPOCH=$(jget "$LF" .epoch)
call "$LEASE" leader svc --json
assert_eq "$(jget "$OUT" '[.leader, .epoch, .label] | map(tostring) | join(" ")')" \
    "true $NEW_EPOCH $FOLLOWER" "lease leader agrees with the surviving agent"
curl -s --noproxy "*" --max-time 2 -o "$T/metrics.after" "http://127.0.0.1:$F_PORT/metrics"
if promtool check metrics <"$T/metrics.after" >"$T/promtool.after" 2>&1; then pass; else
    fail "/metrics after the takeover: promtool check metrics failed: $(head -c 800 "$T/promtool.after")"
fi
assert_gt "$(metric "$T/metrics.after" 'lease_leader_transitions_total{store="sqlite"}')" 0 \
    "the new leader counted its election"

section "(d) SIGTERM: the agent resigns and exits 0"
kill -TERM "$F_PID"
wait_exit "$F_PID" agent_rc "the surviving agent after SIGTERM"
assert_eq "$agent_rc" 0 "the agent exits 0 after SIGTERM"
call "$LEASE" leader svc --json
assert_eq "$(jget "$OUT" '[.leader, .epoch] | map(tostring) | join(" ")')" "false $NEW_EPOCH" \
    "after SIGTERM nobody leads: the agent resigned"

section "(e) bad input"
call "$LEASE" agent svc
expect_error 2 "agent without --listen"
call "$LEASE" agent svc --listen garbage
expect_error 2 "agent --listen garbage"
call "$LEASE" agent svc --listen 127.0.0.1
expect_error 2 "agent --listen without a port"
call "$LEASE" agent svc --listen 127.0.0.1:0
expect_error 2 "agent --listen port 0"
call "$LEASE" agent svc --listen 127.0.0.1:65536
expect_error 2 "agent --listen port 65536"
call "$LEASE" agent svc --listen 127.0.0.1:http
expect_error 2 "agent --listen with a port name"
call "$LEASE" agent svc --listen
expect_error 2 "agent --listen without a value"
call "$LEASE" agent --listen "127.0.0.1:$PA"
expect_error 2 "agent without NAME"
call "$LEASE" agent "" --listen "127.0.0.1:$PA"
expect_error 2 "agent with an empty NAME"
call "$LEASE" agent "$(printf 'n%.0s' $(seq 247))" --listen "127.0.0.1:$PA"
expect_error 2 "agent with a 247-byte NAME"
call "$LEASE" agent svc --listen "127.0.0.1:$PA" --ttl 0
expect_error 2 "agent --ttl 0"
call "$LEASE" agent svc --listen "127.0.0.1:$PA" --nope
expect_error 2 "agent with an unknown option"

finish
