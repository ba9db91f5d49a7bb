# agent_lib.sh - starting `lease agent` on a free loopback port, for the
# agent's tests. Source it after lib.sh.

# agent_on_free_port PIDVAR PORTVAR WHO ERRFILE UP LAUNCH [ARG...]: run
# `LAUNCH ARG...` in the background with PORT set to a free loopback port,
# until `UP PORT` holds (bounded: 10 s); then PIDVAR and PORTVAR are set.
# LAUNCH sends the agent's stderr to ERRFILE (shown if it does not come up;
# WHO names it in messages) and must exec it, so that the pid registered with bg_register (killed by
# lib.sh's exit trap) and set in PIDVAR is the agent's. Another program may
# take the port between the check and the bind: an agent that cannot
# listen exits, and the next port is tried (at most 5).
agent_on_free_port() {
    local pidvar=$1 portvar=$2 who=$3 err=$4 up=$5 attempt pid i
    shift 5
    for attempt in 1 2 3 4 5; do
        pick_port || die "no free loopback port"
        "$@" &
        pid=$!
        bg_register "$pid"
        for ((i = 0; i < 200; i++)); do
            if process_exited "$pid" || "$up" "$PORT"; then
                break
            fi
            sleep 0.05
        done
        if ! process_exited "$pid" && "$up" "$PORT"; then
            printf -v "$pidvar" '%s' "$pid"
            printf -v "$portvar" '%s' "$PORT"
            echo "    agent $who: pid $pid, port $PORT"
            pass
            return 0
        fi
        echo "    agent $who on port $PORT did not come up: $(head -c 400 "$err")"
        if is_my_child "$pid"; then
            kill_tree "$pid"
        fi
        wait "$pid" 2>/dev/null
    done
    die "agent $who never came up"
}
