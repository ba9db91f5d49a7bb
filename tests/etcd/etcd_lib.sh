# etcd_lib.sh - what the etcd tests share on top of tests/cli/lib.sh:
# throw-away etcd members (scripts/etcd-server.sh) on free loopback ports,
# in the test's own temp dir ($T, made with mktemp -d), stopped by the exit
# trap before the dir is removed.
#
#   . "$(dirname "$0")/etcd_lib.sh" PATH_TO_LEASE_BINARY [...]
#
# Every wait is a bounded loop; nothing here asserts a duration.

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/../cli/lib.sh" "$@"

ETCD_SH=$HERE/../../scripts/etcd-server.sh
for tool in etcd etcdctl ss curl shuf; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by the etcd tests but was not found in PATH" >&2
        exit 1
    fi
done
export ETCDCTL_API=3

ED=$T/etcd          # the members' dirs: $ED/e1, $ED/e2 ...
mkdir -p "$ED"
NAMES=()            # member names, e1 ... eN
declare -A CPORT=() PPORT=()
CLUSTER=""          # etcd's --initial-cluster
URL=""              # etcd://127.0.0.1:P1,127.0.0.1:P2,...
EP=""               # etcdctl --endpoints: 127.0.0.1:P1,127.0.0.1:P2,...

etcd_cleanup() {
    # Stop every member. SIGKILL: their data goes with the dir, and a member
    # whose peers are gone takes seconds to stop on SIGTERM. Bounded waits
    # in etcd-server.sh.
    local m pid
    for m in "$ED"/*/; do   # all at once first: each then waits for its own
        pid=$(cat "$m/pid" 2>/dev/null) && [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    done
    for m in "$ED"/*/; do
        [ -f "$m/pid" ] && "$ETCD_SH" kill "$ED" "$(basename "$m")" >/dev/null 2>&1
    done
    return 0
}
trap 'etcd_cleanup; cleanup' EXIT

# The exit trap cannot run when this script is killed outright (SIGKILL from
# ctest's TIMEOUT), and the members, started with nohup, would outlive it.
# So a detached watchdog (double fork: not a child of this script) waits
# for this script's process to end, then kills what is left of the members
# and removes $T. It checks once a second; it ends with this script.
_etcd_watchdog() {
    local start
    start=$(cut -d' ' -f22 "/proc/$$/stat" 2>/dev/null) || return 0
    (
        setsid bash -c '
            me=$1 start=$2 ed=$3 t=$4 keep=$5
            while [ "$(cut -d" " -f22 "/proc/$me/stat" 2>/dev/null)" = "$start" ]; do
                sleep 1
            done
            for m in "$ed"/*/; do
                pid=$(cat "$m/pid" 2>/dev/null) || continue
                # Only a process that is one of these members (pids get reused).
                tr "\0" " " <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$ed/" &&
                    kill -KILL "$pid" 2>/dev/null
            done
            [ -n "$keep" ] || rm -rf "$t"
        ' etcd-watchdog "$$" "$start" "$ED" "$T" "${LEASE_TEST_KEEP:-}" \
            </dev/null >/dev/null 2>&1 &
    )
}
_etcd_watchdog

# ectl ARGS...: etcdctl against every member, bounded.
ectl() {
    timeout -k 2 15 etcdctl --endpoints="$EP" --dial-timeout=2s --command-timeout=5s "$@"
}

# ectl_at PORT ARGS...: etcdctl against one member, bounded.
ectl_at() {
    local port=$1
    shift
    timeout -k 2 15 etcdctl --endpoints="127.0.0.1:$port" --dial-timeout=2s --command-timeout=5s "$@"
}

# member_pid NAME: the pid of a running member (fails if none).
member_pid() {
    local pid
    pid=$(cat "$ED/$1/pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# member_ours NAME: the member answering on NAME's client port is ours: the
# cluster it belongs to lists NAME with our peer and client URLs (a foreign
# process that took the port between free_port and the bind would not).
member_ours() {
    ectl_at "${CPORT[$1]}" member list 2>/dev/null |
        grep -q ", $1, http://127.0.0.1:${PPORT[$1]}, http://127.0.0.1:${CPORT[$1]}"
}

# members_up NAME...: bounded wait until every named member runs and answers
# /health with true. Fails at once when one of them has died (e.g. its port
# was taken), otherwise after about 20 s.
members_up() {
    local i name ok
    for ((i = 0; i < 100; i++)); do
        ok=1
        for name in "$@"; do
            member_pid "$name" >/dev/null || return 1
            curl -fs -m 1 "http://127.0.0.1:${CPORT[$name]}/health" 2>/dev/null |
                grep -q '"health":"true"' || { ok=0; break; }
        done
        [ "$ok" = 1 ] && return 0
        sleep 0.1
    done
    return 1
}

# etcd_cluster N: start members e1..eN as one new cluster on free ports.
# Sets NAMES, CPORT, PPORT, CLUSTER, URL, EP. Up to 3 sets of ports are
# tried (another process may take a port between free_port and the bind).
etcd_cluster() {
    local n=$1 try i name ok
    for ((try = 0; try < 3; try++)); do
        NAMES=()
        CLUSTER=""
        for ((i = 1; i <= n; i++)); do
            name=e$i
            NAMES+=("$name")
            pick_port || return 1
            CPORT[$name]=$PORT
            pick_port || return 1
            PPORT[$name]=$PORT
            CLUSTER="${CLUSTER:+$CLUSTER,}$name=http://127.0.0.1:${PPORT[$name]}"
        done
        for name in "${NAMES[@]}"; do
            # A member of a cluster is not healthy before a quorum is up, so
            # the script does not wait for it; members_up does, for all.
            # (A lone member is waited for by the script: bounded too.)
            "$ETCD_SH" start "$ED" "$name" "${CPORT[$name]}" "${PPORT[$name]}" \
                "$CLUSTER" new >"$T/etcd-start.out" 2>&1
        done
        ok=0
        if members_up "${NAMES[@]}"; then
            ok=1
            for name in "${NAMES[@]}"; do
                member_ours "$name" || { ok=0; break; }
            done
        fi
        if [ "$ok" = 1 ]; then
            URL=etcd://$(for name in "${NAMES[@]}"; do echo "127.0.0.1:${CPORT[$name]}"; done | paste -sd, -)
            EP=${URL#etcd://}
            echo "etcd cluster of $n: $URL"
            return 0
        fi
        echo "etcd_cluster: try $((try + 1)) failed; the members' last log lines:" >&2
        for name in "${NAMES[@]}"; do tail -n 3 "$ED/$name/log" >&2 2>/dev/null; done
        etcd_cleanup
        rm -rf "${ED:?}"/*
    done
    echo "etcd_cluster: could not start a cluster of $n" >&2
    return 1
}

# member_kill9 NAME: kill -9 the member (bounded wait until it is gone).
member_kill9() {
    "$ETCD_SH" kill "$ED" "$1" >/dev/null 2>&1
}

# member_restart NAME: start NAME again on its data dir and ports, joining
# the existing cluster.
member_restart() {
    "$ETCD_SH" start "$ED" "$1" "${CPORT[$1]}" "${PPORT[$1]}" "$CLUSTER" existing \
        >"$T/etcd-start.out" 2>&1
}

# cluster_healthy: every member answers /health and etcdctl endpoint
# health (a proposal committed through each of them). One check, no wait.
cluster_healthy() {
    local name
    for name in "${NAMES[@]}"; do
        curl -fs -m 1 "http://127.0.0.1:${CPORT[$name]}/health" 2>/dev/null |
            grep -q '"health":"true"' || return 1
    done
    ectl endpoint health >/dev/null 2>&1
}

# status_json: etcdctl endpoint status -w json, with the 64-bit ids quoted
# (jq 1.6 reads JSON numbers as doubles, which would round them).
status_json() {
    ectl endpoint status -w json 2>/dev/null |
        sed -E 's/"(member_id|leader|cluster_id)":([0-9]+)/"\1":"\2"/g'
}

# leader_name: the name of the member whose member_id equals the leader
# all members agree on (fails when there is no such single leader).
leader_name() {
    local js lead port name
    js=$(status_json) || return 1
    lead=$(printf '%s' "$js" | jq -r '[.[].Status.leader] | unique | if length == 1 then .[0] else empty end' 2>/dev/null)
    [ -n "$lead" ] && [ "$lead" != 0 ] || return 1
    port=$(printf '%s' "$js" | jq -r --arg l "$lead" \
        '.[] | select(.Status.header.member_id == $l) | .Endpoint' 2>/dev/null)
    port=${port##*:}
    [ -n "$port" ] || return 1
    for name in "${NAMES[@]}"; do
        if [ "${CPORT[$name]}" = "$port" ]; then
            echo "$name"
            return 0
        fi
    done
    return 1
}

# url_of NAME...: etcd://127.0.0.1:P,... of those members, in that order.
url_of() {
    local name out=""
    for name in "$@"; do out="${out:+$out,}127.0.0.1:${CPORT[$name]}"; done
    echo "etcd://$out"
}

# Boot time in ms (CLOCK_BOOTTIME, the clock of lease's deadlines, with
# /proc/uptime's 10 ms resolution). Used to wait, never to assert.
boot_ms() {
    local up
    read -r up _ </proc/uptime
    echo "${up/./}0"
}

# max_of N...: the largest of some integers.
max_of() {
    local m=0 v
    for v in "$@"; do [[ $v =~ ^[0-9]+$ ]] && [ "$v" -gt "$m" ] && m=$v; done
    echo "$m"
}

# assert_token VALUE DESCRIPTION: VALUE is a decimal number >= 1.
assert_token() {
    if [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ]; then pass; else
        fail "$2: '$1' is not a token (an integer >= 1)"
    fi
}
