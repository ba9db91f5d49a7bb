#!/usr/bin/env bash
# cli_agent_frozen: `lease agent` whose link to its store freezes.
#
# Agent A leads, talking to a real network store (Redis, then PostgreSQL)
# through a relay (relay.py); agent B campaigns for the same name talking
# to the store directly. The relay is stopped (SIGSTOP): A's connections
# stay open and nothing moves on them, so A's keeper steps down, and B
# takes over once A's lease has run out in the store. While the link is
# frozen A must:
#  - never say this_agent_leads:true once its keeper logged stepped_down;
#  - report its leader view as unknown ("known":false, leader null, HTTP
#    503), and, once B leads, never show a holder at all (its last view
#    named A with the old epoch);
#  - say on /healthz that it cannot reach its store (store_reachable and
#    ok false, HTTP 503).
# Once the relay moves again (SIGCONT) A reports the true leader, B, with
# B's epoch, and /healthz is 200 again.
#
# Needs LEASE_TEST_REDIS_URL and LEASE_TEST_PG_URL for the stores this build
# has (fails without them, never skips), curl and python3. Every wait is a
# bounded poll; the durations printed are for the log, never asserted.
. "$(dirname "$0")/lib.sh" "$@"
. "$(dirname "$0")/agent_lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)

for tool in curl python3 ss shuf; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required by $TEST_NAME"
done

declare -A URLS=()
server_urls URLS REDIS:redis PG:postgres
[ ${#URLS[@]} -gt 0 ] || die "this build has neither the redis nor the postgres store"

# fetch PORT PATH: GET it (bounded); the body in BODY, the status in CODE
# (000 when nothing answered).
fetch() {
    local out
    out=$(curl -s --noproxy "*" --max-time 2 -w '\n%{http_code}' "http://127.0.0.1:$1$2")
    CODE=${out##*$'\n'}
    BODY=${out%$'\n'*}
}

now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

# answers PORT NAME: the agent at PORT answers /leader for election NAME.
answers() {
    fetch "$1" /leader
    [ "$(jget "$BODY" .name)" = "$2" ]
}

# leads PORT: the agent at PORT says it leads (status 200).
leads() {
    fetch "$1" /leader
    [ "$CODE" = 200 ] && [ "$(jget "$BODY" .this_agent_leads)" = true ]
}

# follows PORT LABEL EPOCH: the agent at PORT knows the leader is LABEL with
# EPOCH, and does not lead itself.
follows() {
    fetch "$1" /leader
    [ "$CODE" = 200 ] && [ "$(jget "$BODY" '[.known, .leader, .label, .epoch,
        .this_agent_leads] | map(tostring) | join(" ")')" = "true true $2 $3 false" ]
}

# reachable PORT: /healthz says the store is reachable, with status 200.
reachable() {
    fetch "$1" /healthz
    [ "$CODE" = 200 ] && [ "$(jget "$BODY" '[.ok, .store_reachable] | map(tostring) |
        join(" ")')" = "true true" ]
}

# start_agent LABEL URL NAME: `lease agent NAME` on a free port with store
# URL (in the environment: it may hold a password); sets PID_<LABEL> and
# P<LABEL>.
start_agent() {
    local lc
    lc=$(echo "$1" | tr 'A-Z' 'a-z')
    AGENT_NAME=$3
    agent_on_free_port "PID_$1" "P$1" "$1" "$T/$lc.err" answers_up launch_agent "$@" "$lc"
}

# launch_agent LABEL URL NAME FILE: exec the agent on $PORT, its output in
# $T/FILE.out and $T/FILE.err.
launch_agent() {
    LEASE_STORE=$2 exec "$LEASE" agent "$3" --listen "127.0.0.1:$PORT" --ttl 4s \
        --label "$1" --json >"$T/$4.out" 2>"$T/$4.err"
}

answers_up() {
    answers "$1" "$AGENT_NAME"
}

stop_pid() {
    if is_my_child "$1"; then
        kill -CONT "$1" 2>/dev/null
        kill_tree "$1"
    fi
    wait "$1" 2>/dev/null
    return 0
}

show_agents() {
    local f
    for f in a.out a.err b.out b.err; do
        echo "    $f: $(tail -c 1500 "$T/$f" 2>/dev/null)"
    done
}

# frozen STORE DIRECT_URL: the scenario above on one store.
frozen() {
    local store=$1 direct=$2 relayed hostport name rpf relay ea eb
    local t0 now stepped sd_ms="" last_true_ms="" leads_after=0 took_ms="" after=0
    local wrong_after=0 unknown=0 unhealthy=0 silent=0 first_unknown_ms="" i

    [[ $direct =~ ^([a-z+]+://)([^@/]*@)?([^/?]+)(.*)$ ]] ||
        die "$store: cannot find host:port in the store URL"
    local scheme=${BASH_REMATCH[1]} auth=${BASH_REMATCH[2]} rest=${BASH_REMATCH[4]}
    hostport=${BASH_REMATCH[3]}
    name=frozen-$store-$$-$RANDOM

    section "$store: A leads through a relay, B campaigns on the store directly"
    rpf=$T/relay.$store.port
    python3 "$HERE/relay.py" "$rpf" "$hostport" 2>"$T/relay.$store.err" &
    relay=$!
    bg_register "$relay"
    wait_for "the relay to $store listens" test -s "$rpf" || die "no relay"
    relayed=$scheme${auth}127.0.0.1:$(cat "$rpf")$rest

    start_agent A "$relayed" "$name"
    WAIT_TRIES=400 wait_for "$store: A leads" leads "$PA" || { show_agents; return; }
    ea=$(jget "$BODY" .epoch)
    start_agent B "$direct" "$name"
    WAIT_TRIES=400 wait_for "$store: B follows A (epoch $ea)" follows "$PB" A "$ea" ||
        show_agents
    WAIT_TRIES=400 wait_for "$store: A's /healthz: the store is reachable, 200" reachable "$PA"

    section "$store: the relay stops moving bytes; B takes over"
    kill -STOP "$relay"
    t0=$(now_ms)
    # Each round: stepped_down is looked for before A is asked, and B is
    # asked before A, so that A's answer comes after what the round saw.
    # Bounded: 60 s, or 20 answers of A once B leads.
    for ((i = 0; i < 1500; i++)); do
        now=$(now_ms)
        [ $((now - t0)) -lt 60000 ] || break
        stepped=$(grep -c '"event":"stepped_down"' "$T/a.err")
        if [ "$stepped" -gt 0 ] && [ -z "$sd_ms" ]; then
            sd_ms=$((now - t0))
        fi
        if [ -z "$took_ms" ] && leads "$PB" && [ "$(jget "$BODY" .epoch)" -gt "$ea" ]; then
            took_ms=$(($(now_ms) - t0))
            eb=$(jget "$BODY" .epoch)
        fi
        fetch "$PA" /leader
        if [ "$CODE" = 000 ]; then
            silent=$((silent + 1))
        fi
        if [ "$(jget "$BODY" .this_agent_leads)" = true ]; then
            last_true_ms=$(($(now_ms) - t0))
            if [ "$stepped" -gt 0 ]; then
                leads_after=$((leads_after + 1))
                [ "$leads_after" -gt 1 ] || echo "    A after stepped_down: $CODE $BODY"
            fi
        fi
        if [ "$CODE" = 503 ] && [ "$(jget "$BODY" '[.known, .leader, .epoch, .owner,
            .label, .remaining_ms, .this_agent_leads] | map(tostring) | join(" ")')" = \
            "false null null null null null false" ]; then
            unknown=$((unknown + 1))
            [ -n "$first_unknown_ms" ] || first_unknown_ms=$(($(now_ms) - t0))
        fi
        if [ -n "$took_ms" ]; then
            after=$((after + 1))
            if [ "$CODE" != 503 ] || [ "$(jget "$BODY" .known)" != false ] ||
                [ "$(jget "$BODY" .leader)" != null ]; then
                wrong_after=$((wrong_after + 1))
                [ "$wrong_after" -gt 1 ] || echo "    A after B took over: $CODE $BODY"
            fi
        fi
        fetch "$PA" /healthz
        if [ "$CODE" = 503 ] && [ "$(jget "$BODY" '[.ok, .store_reachable] | map(tostring) |
            join(" ")')" = "false false" ]; then
            unhealthy=$((unhealthy + 1))
        fi
        [ "$after" -lt 20 ] || break
        sleep 0.05
    done
    echo "    ms after the freeze: stepped_down seen ${sd_ms:-never}, last" \
        "this_agent_leads:true ${last_true_ms:-never}, first unknown ${first_unknown_ms:-never}," \
        "B leads ${took_ms:-never} (epoch ${eb:-?})"
    if [ -n "$sd_ms" ]; then pass; else
        fail "$store: A's keeper never logged stepped_down while its store was frozen"
    fi
    assert_eq "$leads_after" 0 "$store: answers of A saying this_agent_leads:true after its keeper stepped down"
    assert_eq "$silent" 0 "$store: /leader requests A did not answer while frozen"
    assert_gt "$unknown" 0 "$store: A reported its leader view unknown (known:false, nulls, 503)"
    assert_gt "$unhealthy" 0 "$store: A's /healthz said the store is unreachable (503)"
    if [ -n "$took_ms" ]; then pass; else
        fail "$store: B never took over while A's link was frozen"
        show_agents
    fi
    assert_eq "$after" 20 "$store: answers of A checked after B took over"
    assert_eq "$wrong_after" 0 "$store: answers of A after B took over that were not 'unknown'"

    section "$store: the relay moves again; A reports B"
    kill -CONT "$relay"
    WAIT_TRIES=400 wait_for "$store: A reports B (epoch ${eb:-?}) as the leader" \
        follows "$PA" B "${eb:-?}" || echo "    A: $CODE $BODY"
    WAIT_TRIES=400 wait_for "$store: A's /healthz is 200 again" reachable "$PA" ||
        echo "    A: $CODE $BODY"
    stop_pid "$PID_A"
    stop_pid "$PID_B"
    stop_pid "$relay"
}

for store in redis postgres; do
    [ -n "${URLS[$store]:-}" ] || continue
    frozen "$store" "${URLS[$store]}"
done

finish
