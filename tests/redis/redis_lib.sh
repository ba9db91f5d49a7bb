# redis_lib.sh - what the Redis tests share on top of tests/cli/lib.sh:
# throw-away redis-server and redis-sentinel processes on free loopback
# ports, in the test's temp dir, stopped by the exit trap.
#
#   . "$(dirname "$0")/redis_lib.sh" PATH_TO_LEASE_BINARY
#
# Servers are started with scripts/redis-server.sh (durable by default:
# appendonly yes, appendfsync always). Every wait is a bounded loop.

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/../cli/lib.sh" "$@"

REDIS_SH=$HERE/../../scripts/redis-server.sh
for tool in redis-server redis-cli ss; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by the Redis tests but was not found in PATH" >&2
        exit 1
    fi
done

REDIS_DIRS=()     # every server dir we started (stopped on exit)
SENTINEL_DIRS=()  # every sentinel dir we started

# Is the server that answers on PORT the one whose dir is DIR? (A port taken
# by someone else between free_port and the bind would answer PING too.)
_redis_is_ours() {
    local got
    got=$(redis-cli -h 127.0.0.1 -p "$1" config get dir 2>/dev/null | sed -n 2p)
    [ "$got" = "$(cd "$2" 2>/dev/null && pwd -P)" ]
}

# redis_start NAME [redis-server options...]: start a server in $T/NAME on
# a free port (up to 3 ports are tried), register it for the exit trap.
# Sets the port in the variable PORT_<NAME>.
redis_start() {
    local name=$1 dir=$T/$1 port try
    shift
    for ((try = 0; try < 3; try++)); do
        port=$(free_port) || return 1
        REDIS_DIRS+=("$dir")
        if "$REDIS_SH" start "$dir" "$port" "$@" >"$T/redis-start.out" 2>&1 &&
            _redis_is_ours "$port" "$dir"; then
            printf -v "PORT_$name" '%s' "$port"
            return 0
        fi
        "$REDIS_SH" stop "$dir" >/dev/null 2>&1
        rm -f "$dir/redis.pid"
    done
    echo "redis_start $name: could not start a server: $(cat "$T/redis-start.out")" >&2
    return 1
}

# redis_restart NAME [options...]: start NAME again on the same dir and port.
redis_restart() {
    local name=$1 dir=$T/$1 port
    shift
    port=$(cat "$dir/port")
    "$REDIS_SH" start "$dir" "$port" "$@" >"$T/redis-start.out" 2>&1 &&
        _redis_is_ours "$port" "$dir" || {
        echo "redis_restart $name: $(cat "$T/redis-start.out")" >&2
        return 1
    }
}

# redis_stop NAME: SIGTERM (the server writes and syncs its files), bounded.
redis_stop() {
    "$REDIS_SH" stop "$T/$1" >/dev/null 2>&1
}

redis_pid() {
    cat "$T/$1/redis.pid" 2>/dev/null
}

# redis_kill9 NAME: kill -9 the server and wait (bounded) until it is gone.
redis_kill9() {
    local pid i
    pid=$(redis_pid "$1") || return 1
    kill -KILL "$pid" 2>/dev/null
    # Gone, or a zombie (dead; its reaper, pid 1, may take a while).
    for ((i = 0; i < 200; i++)); do
        process_exited "$pid" && break
        sleep 0.01
    done
    rm -f "$T/$1/redis.pid"
}

# rcli NAME ARGS...: redis-cli against server NAME (bounded by timeout).
rcli() {
    local name=$1
    shift
    timeout -k 2 10 redis-cli -h 127.0.0.1 -p "$(cat "$T/$name/port")" "$@"
}

redis_url() {
    echo "redis://127.0.0.1:$(cat "$T/$1/port")"
}

# replica_synced NAME: the replica's link to its primary is up.
replica_synced() {
    rcli "$1" info replication 2>/dev/null | tr -d '\r' | grep -qx 'master_link_status:up'
}

# sentinel_start NAME MASTER_NAME MASTER_PORT QUORUM [extra config lines]:
# a redis-sentinel with its own config file in $T/NAME.
sentinel_start() {
    local name=$1 mname=$2 mport=$3 quorum=$4 dir=$T/$1 port try
    shift 4
    mkdir -p "$dir"
    for ((try = 0; try < 3; try++)); do
        port=$(free_port) || return 1
        {
            echo "port $port"
            echo "bind 127.0.0.1"
            echo "daemonize yes"
            echo "pidfile $dir/sentinel.pid"
            echo "logfile $dir/sentinel.log"
            echo "dir $dir"
            echo "sentinel resolve-hostnames no"
            echo "sentinel monitor $mname 127.0.0.1 $mport $quorum"
            for line in "$@"; do echo "$line"; done
        } >"$dir/sentinel.conf"
        echo "$port" >"$dir/port"
        SENTINEL_DIRS+=("$dir")
        if redis-sentinel "$dir/sentinel.conf" >"$T/sentinel-start.out" 2>&1; then
            local i
            for ((i = 0; i < 100; i++)); do
                if [ "$(timeout 5 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ] &&
                    timeout 5 redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null |
                    tr -d '\r' | grep -qx "config_file:$dir/sentinel.conf"; then
                    printf -v "PORT_$name" '%s' "$port"
                    return 0
                fi
                sleep 0.05
            done
        fi
        _stop_pidfile "$dir/sentinel.pid"
    done
    echo "sentinel_start $name: could not start: $(cat "$T/sentinel-start.out" 2>/dev/null)" >&2
    return 1
}

# Stop the process of a pid file: SIGTERM, then SIGKILL after 5 s.
_stop_pidfile() {
    local pid i
    pid=$(cat "$1" 2>/dev/null) || return 0
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null
}

redis_cleanup() {
    local d pid pids=() i
    # SIGTERM to all at once (each takes a while to shut down), then wait
    # for them together, bounded; SIGKILL what is left.
    for d in ${SENTINEL_DIRS[@]+"${SENTINEL_DIRS[@]}"}; do
        pid=$(cat "$d/sentinel.pid" 2>/dev/null) && [ -n "$pid" ] && pids+=("$pid")
    done
    for d in ${REDIS_DIRS[@]+"${REDIS_DIRS[@]}"}; do
        pid=$(cat "$d/redis.pid" 2>/dev/null) && [ -n "$pid" ] && pids+=("$pid")
    done
    for pid in ${pids[@]+"${pids[@]}"}; do
        kill -CONT "$pid" 2>/dev/null # a stopped server cannot act on SIGTERM
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in ${pids[@]+"${pids[@]}"}; do
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null
        fi
    done
}
trap 'redis_cleanup; touch "$T/.cleaned" 2>/dev/null; cleanup' EXIT

# The servers are daemons, not children of this script: if it is killed
# outright (SIGKILL, e.g. by ctest's timeout) the trap above never runs. A
# detached watchdog waits for this shell to end and then kills, by the pids
# in their pid files, the redis processes of $T that the trap did not stop.
if command -v setsid >/dev/null 2>&1; then
    _self_start=$(sed 's/.*) //' "/proc/$$/stat" | awk '{ print $20 }')
    setsid -f bash -c '
        pid=$1 start=$2 dir=$3
        while [ "$(sed "s/.*) //" "/proc/$pid/stat" 2>/dev/null | awk "{ print \$20 }")" = "$start" ]; do
            sleep 1
        done
        [ -d "$dir" ] && [ ! -e "$dir/.cleaned" ] || exit 0
        for f in "$dir"/*/redis.pid "$dir"/*/sentinel.pid; do
            p=$(cat "$f" 2>/dev/null) || continue
            case $(cat "/proc/$p/comm" 2>/dev/null) in redis-*) kill -KILL "$p" ;; esac
        done
        rm -rf "$dir"' _ "$$" "$_self_start" "$T" </dev/null >/dev/null 2>&1
fi

# Milliseconds on the monotonic clock (for printed durations only).
now_ms() {
    local up
    read -r up _ </proc/uptime
    echo "${up/./}0"
}
