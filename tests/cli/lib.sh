# lib.sh - shared helpers for the `lease` CLI tests. Source it from a test
# script as:   . "$(dirname "$0")/lib.sh" "$@"
#
# It takes the path of the lease binary as $1, checks the tools the tests
# need, makes the temp dir $T (removed, with every background process the
# script registered, on exit), points LEASE_STORE, XDG_STATE_HOME and HOME
# into it, and provides the assertions below. Every failed assertion prints
# what failed and counts; `finish` exits non-zero if any did.

set -u

LEASE=${1:?usage: $0 PATH_TO_LEASE_BINARY}
case $LEASE in /*) ;; *) LEASE=$PWD/$LEASE ;; esac
if [ ! -x "$LEASE" ]; then
    echo "FATAL: lease binary '$LEASE' is not executable" >&2
    exit 1
fi
for tool in jq sqlite3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by the CLI tests but was not found in PATH" >&2
        exit 1
    fi
done

FAILURES=0
CHECKS=0
BG_PIDS=()
TEST_NAME=$(basename "$0" .sh)

T=$(mktemp -d "${TMPDIR:-/tmp}/lease-$TEST_NAME.XXXXXX") || {
    echo "FATAL: mktemp -d failed" >&2
    exit 1
}

# Kill a process and everything below it, by pid (children first, so that
# none is re-parented out of reach).
# lease_stores: the stores this build of lease has, "sqlite, redis" (the
# "stores:" line of `lease --version`).
lease_stores() {
    "$LEASE" --version | sed -n 's/^stores: //p'
}

# has_store NAME: this build of lease has the store NAME: tests of a store
# it lacks expect exit 2.
has_store() {
    case ", $(lease_stores)," in
    *", $1,"*) return 0 ;;
    *) return 1 ;;
    esac
}

# server_urls ARRAY VAR:STORE...: for each STORE this build has, sets
# ARRAY[STORE] (an associative array of the caller) to $LEASE_TEST_VAR_URL;
# a variable not set is a failed check (scripts/test.sh starts the servers
# and sets them), never a skip.
server_urls() {
    local -n urls_=$1
    local v var
    shift
    for v in "$@"; do
        has_store "${v#*:}" || continue
        var=LEASE_TEST_${v%%:*}_URL
        if [ -z "${!var:-}" ]; then
            fail "$var is not set: start a server (scripts/test.sh does)"
            continue
        fi
        urls_[${v#*:}]=${!var}
    done
}

kill_tree() {
    local pid=$1 child
    for child in $(cat /proc/"$pid"/task/*/children 2>/dev/null || pgrep -P "$pid" 2>/dev/null); do
        kill_tree "$child"
    done
    kill -KILL "$pid" 2>/dev/null
}

# Is pid still a (live) child of this shell? Guards against killing a
# recycled pid.
is_my_child() {
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    set -- $st
    [ "$2" = "$$" ] && [ "$1" != Z ]
}

cleanup() {
    local pid
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do
        if is_my_child "$pid"; then
            kill_tree "$pid"
        fi
    done
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do
        wait "$pid" 2>/dev/null
    done
    if [ -n "${LEASE_TEST_KEEP:-}" ]; then
        echo "kept $T" >&2
    else
        rm -rf "$T"
    fi
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM HUP

# Never touch the real home or a store from the caller's environment.
export HOME=$T/home
export XDG_STATE_HOME=$T/xdg-state
export LEASE_STORE=sqlite://$T/default.db
mkdir -p "$HOME"

# A peak-RSS check measures what the command itself holds: run it as
# `call "${PEAK_RSS[@]}" CMD...` (or timed), then read $T/rss (kB, GNU
# time). AddressSanitizer's quarantine keeps up to 256 MB of freed blocks
# mapped, which would count too: a measured command gets a small one
# (ASAN_OPTIONS is read by sanitizer builds only).
PEAK_RSS=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=1"
          /usr/bin/time -f %M -o "$T/rss")

# rss_within KB WHAT: the peak RSS that PEAK_RSS wrote is below KB, or
# twice KB for a lease built with AddressSanitizer (its redzones, shadow
# and allocator metadata double what small allocations take: a bound that
# holds in the release build then holds there too, and a failure to bound
# memory, gigabytes, shows in both).
rss_within() {
    local rss bound=$1
    rss=$(tail -n 1 "$T/rss" 2>/dev/null)
    if ldd "$LEASE" 2>/dev/null | grep -q libasan; then
        bound=$((bound * 2))
    fi
    if [[ $rss =~ ^[0-9]+$ ]] && [ "$rss" -lt "$bound" ]; then pass; else
        fail "$2: peak RSS of lease '$rss' kB (bound: $bound kB)"
    fi
}

# Register a background process so that the exit trap kills it.
bg_register() {
    BG_PIDS+=("$1")
}

# The line of the test script that made the failing check.
_script_line() {
    local i
    for ((i = 1; i < ${#BASH_SOURCE[@]}; i++)); do
        if [ "${BASH_SOURCE[$i]}" = "$0" ]; then
            echo "${BASH_LINENO[$((i - 1))]}"
            return
        fi
    done
    echo "?"
}

fail() {
    FAILURES=$((FAILURES + 1))
    echo "FAIL [$TEST_NAME.sh:$(_script_line)]: $*" >&2
}

die() {
    fail "$@"
    echo "FATAL: cannot go on after the failure above" >&2
    exit 1
}

pass() {
    CHECKS=$((CHECKS + 1))
}

section() {
    echo "--- $*"
}

# Every foreground command is bounded, so that a hang fails one check
# instead of the whole test run (exit 124 from timeout(1)).
CALL_TIMEOUT=${LEASE_CALL_TIMEOUT:-30}
if command -v timeout >/dev/null 2>&1; then
    BOUND=(timeout -k 5 "$CALL_TIMEOUT")
else
    BOUND=()
fi

# call CMD [ARG...]: run it, keeping stdout in $OUT, stderr in $ERR and the
# exit status in $RC (files $T/out and $T/err too). Never fails by itself.
call() {
    ${BOUND[@]+"${BOUND[@]}"} "$@" >"$T/out" 2>"$T/err"
    RC=$?
    OUT=$(cat "$T/out")
    ERR=$(cat "$T/err")
    LAST_CMD="$*"
    return 0
}

# pick_port and free_port: loopback ports (scripts/ports.sh).
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/ports.sh"

# stopwatch CMD...: run CMD (a command or a function of the script), with
# how long it took in $MS (milliseconds). For generous bounds only ("a
# --timeout 1s call ends within 10 s").
stopwatch() {
    local t0
    t0=$(date +%s%N)
    "$@"
    MS=$((($(date +%s%N) - t0) / 1000000))
}

# timed CMD...: call, timed by stopwatch.
timed() {
    stopwatch call "$@"
}

_ctx() {
    local note=""
    if [ "${RC:-}" = 124 ] && [ ${#BOUND[@]} -gt 0 ]; then
        note=" (timeout(1): still running after $CALL_TIMEOUT s, so it was killed)"
    fi
    printf '\n    command: %s\n    exit: %s%s\n    stdout: %s\n    stderr: %s' \
        "${LAST_CMD:-}" "${RC:-}" "$note" "$(printf '%s' "${OUT:-}" | head -c 600)" \
        "$(printf '%s' "${ERR:-}" | head -c 600)"
}

# expect_rc N DESCRIPTION: the last call exited with N.
expect_rc() {
    if [ "$RC" = "$1" ]; then pass; else
        fail "$2: expected exit $1, got $RC$(_ctx)"
    fi
}

# expect_rc_in "N M ..." DESCRIPTION: the last call exited with one of them.
expect_rc_in() {
    case " $1 " in *" $RC "*) pass ;; *)
        fail "$2: expected exit in {$1}, got $RC$(_ctx)" ;;
    esac
}

# expect_stderr DESCRIPTION: the last call wrote a message on stderr.
expect_stderr() {
    if [ -n "$ERR" ]; then pass; else
        fail "$1: expected a message on stderr, got none$(_ctx)"
    fi
}

# expect_error N DESCRIPTION: exit N, a message on stderr, nothing on stdout.
expect_error() {
    expect_rc "$1" "$2"
    expect_stderr "$2"
    if [ -z "$OUT" ]; then pass; else
        fail "$2: expected nothing on stdout$(_ctx)"
    fi
}

assert_eq() {
    # assert_eq ACTUAL EXPECTED DESCRIPTION
    if [ "$1" = "$2" ]; then pass; else
        fail "$3: expected '$2', got '$1'"
    fi
}

assert_ne() {
    if [ "$1" != "$2" ]; then pass; else
        fail "$3: expected something other than '$2'"
    fi
}

# assert_gt A B DESCRIPTION: integers, A > B.
assert_gt() {
    if [[ "$1" =~ ^[0-9]+$ && "$2" =~ ^[0-9]+$ ]] && [ "$1" -gt "$2" ]; then pass; else
        fail "$3: expected '$1' > '$2'"
    fi
}

assert_match() {
    # assert_match TEXT EXTENDED_REGEX DESCRIPTION
    if [[ "$1" =~ $2 ]]; then pass; else
        fail "$3: '$1' does not match /$2/"
    fi
}

assert_contains() {
    # assert_contains HAYSTACK NEEDLE DESCRIPTION
    case "$1" in *"$2"*) pass ;; *)
        fail "$3: expected to find '$2' in: $(printf '%s' "$1" | head -c 800)" ;;
    esac
}

assert_not_contains() {
    case "$1" in *"$2"*)
        fail "$3: '$2' must not appear in: $(printf '%s' "$1" | head -c 800)" ;;
    *) pass ;; esac
}

assert_file() {
    if [ -e "$1" ]; then pass; else fail "$2: $1 does not exist"; fi
}

assert_no_file() {
    if [ ! -e "$1" ]; then pass; else fail "$2: $1 exists"; fi
}

# jget JSON FILTER: jq -r FILTER on JSON text; prints "<bad json>" if it
# cannot be parsed, so that assertions on it fail visibly.
jget() {
    printf '%s' "$1" | jq -r "$2" 2>/dev/null || echo "<bad json>"
}

# wait_for DESCRIPTION CMD [ARG...]: run CMD until it succeeds, at most
# ${WAIT_TRIES:-200} times with 0.05 s between tries. Returns 1 (after
# recording a failure) when it never succeeded.
wait_for() {
    local what=$1 i
    shift
    for ((i = 0; i < ${WAIT_TRIES:-200}; i++)); do
        if "$@" >/dev/null 2>&1; then
            pass
            return 0
        fi
        sleep 0.05
    done
    fail "timed out waiting for: $what"
    return 1
}

# events FILE: the JSON event lines of a `lease run/elect --json` stderr, as
# one JSON array (non-JSON lines are skipped, and so are the library's own
# log lines, which carry a "level").
events() {
    grep '^{' "$1" 2>/dev/null | jq -s 'map(select(has("level") | not))' 2>/dev/null || echo '[]'
}

# ev FILE JQ_FILTER: jq -r over the events array.
ev() {
    events "$1" | jq -r "$2" 2>/dev/null || echo "<bad json>"
}

# A child's busy loop, bounded so that nothing outlives a broken test for long.
LOOP_60S='i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done'

# Predicates for wait_for.
key_state_is() {
    # key_state_is KEY STATE [STORE_URL]
    local s
    s=$("$LEASE" --store "${3:-$LEASE_STORE}" show "$1" --json 2>/dev/null) || return 1
    [ "$(printf '%s' "$s" | jq -r .state 2>/dev/null)" = "$2" ]
}

pid_gone() {
    # kill -0 fails, or only a zombie is left (dead, not yet reaped).
    ! kill -0 "$1" 2>/dev/null || process_exited "$1"
}

process_exited() {
    # True once the pid is gone or a zombie (Linux /proc; `lease run` is
    # Linux-only anyway: signalfd, PR_SET_PDEATHSIG).
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    st=${st##*) }
    case $st in Z*|X*) return 0 ;; esac
    return 1
}

# wait_exit PID VAR DESCRIPTION: wait (bounded) for background child PID
# and put its exit status in VAR ("timeout" if it did not end in time; it is
# killed then).
wait_exit() {
    local pid=$1 var=$2 what=$3 i st
    for ((i = 0; i < ${WAIT_TRIES:-200}; i++)); do
        if process_exited "$pid"; then
            wait "$pid"
            st=$?
            printf -v "$var" '%s' "$st"
            return 0
        fi
        sleep 0.05
    done
    fail "$what: pid $pid still running after $((${WAIT_TRIES:-200} / 20)) s; killing it"
    if is_my_child "$pid"; then
        kill_tree "$pid"
    fi
    wait "$pid" 2>/dev/null
    printf -v "$var" '%s' timeout
    return 1
}

# A snapshot of every lease in a store, without the fields that move with
# time (remaining_ms), sorted: equal snapshots mean "nothing changed".
snapshot() {
    "$LEASE" --store "${1:-$LEASE_STORE}" ls --json 2>&1 |
        jq -S 'map(del(.remaining_ms)) | sort_by(.key)' 2>&1
}

# start_locker DBFILE SECONDS: hold the SQLite database's write lock from
# another process (sqlite3) for SECONDS. Returns once the lock is held;
# $LOCKER is the background pid, and the file $T/unlocked appears just
# before the lock is dropped.
start_locker() {
    rm -f "$T/locked" "$T/unlocked"
    {
        (
            echo '.timeout 5000'
            echo 'BEGIN EXCLUSIVE;'
            echo ".shell touch '$T/locked'"
            sleep "$2"
            echo ".shell touch '$T/unlocked'"
            echo 'COMMIT;'
        ) | sqlite3 -bail "$1" >"$T/locker.out" 2>&1
    } &
    LOCKER=$!
    bg_register "$LOCKER"
    wait_for "the sqlite3 locker holds the write lock" test -e "$T/locked"
}

# stop_locker: drop the lock now (the locker's death rolls it back).
stop_locker() {
    if is_my_child "$LOCKER"; then
        kill_tree "$LOCKER"
    fi
    wait "$LOCKER" 2>/dev/null
    return 0
}

UUID_RE='^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'

finish() {
    if [ "$FAILURES" -ne 0 ]; then
        echo "$TEST_NAME: $FAILURES of $((CHECKS + FAILURES)) checks FAILED" >&2
        exit 1
    fi
    echo "$TEST_NAME: all $CHECKS checks passed"
    exit 0
}

# start_mute_server: a TCP server on a free loopback port that accepts
# connections and never answers (60 s at most), for a client caught while
# it waits. Sets MPORT and MUTE (its pid); each accepted connection touches
# $T/mute.accepted.
start_mute_server() {
    cat >"$T/mute.py" <<'PYEOF'
import socket, sys, time, os
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
conns = []
end = time.time() + 60
s.settimeout(0.2)
while time.time() < end:
    try:
        c, _ = s.accept()
        conns.append(c)
        open(sys.argv[2], "w").close()
    except socket.timeout:
        pass
PYEOF
    python3 "$T/mute.py" "$T/mute.port" "$T/mute.accepted" &
    MUTE=$!
    bg_register "$MUTE"
    wait_for "the silent server listens" test -s "$T/mute.port"
    MPORT=$(cat "$T/mute.port")
}
