#!/usr/bin/env bash
# cli_child_fds: the command of `lease run` and `lease elect` inherits
# stdin, stdout, stderr and what the user opened for it, and none of the
# descriptors of the tool or the library (a pipe, a store's socket or
# file): for every store.
#
# Every store this build has (the "stores:" line of `lease --version`):
# for postgres, redis and etcd it needs LEASE_TEST_PG_URL,
# LEASE_TEST_REDIS_URL and LEASE_TEST_ETCD_URL (scripts/test.sh exports
# them) and fails without them, never skips.
. "$(dirname "$0")/lib.sh" "$@"
export T

has_store sqlite || fail "lease --version names no sqlite store: '$(lease_stores)'"
declare -A URLS=([sqlite]="sqlite://$T/fds.db")
server_urls URLS PG:postgres REDIS:redis ETCD:etcd

: >"$T/userfile"

# fds PID: the descriptors of a process, "N -> target" one a line, sorted.
fds() {
    local f
    for f in /proc/"$1"/fd/*; do
        [ -e "$f" ] || [ -L "$f" ] || continue
        printf '%s -> %s\n' "${f##*/}" "$(readlink "$f")"
    done | sort -n
}

started_or_gone() {
    test -s "$1" || process_exited "$2"
}

# check NAME EXPECTED_FDS [REDIRECT] ARG...: run `lease ARG... -- CMD` where
# CMD records its pid and then becomes `sleep` (exec: same pid), list its
# descriptors from outside, and compare their numbers with EXPECTED_FDS.
# `lease` starts with nothing open but 0, 1, 2 and (with 3) fd 3 on
# $T/userfile: whatever the test runner left open is closed first.
check() {
    local name=$1 expected=$2 with3=$3 pid child rc got i
    shift 3
    rm -f "$T/$name.pid"
    (
        for f in /proc/$BASHPID/fd/*; do
            n=${f##*/}
            [ "$n" -gt 2 ] 2>/dev/null && eval "exec $n>&-" 2>/dev/null
        done
        if [ "$with3" = 3 ]; then
            exec 3<"$T/userfile"
        fi
        exec "$LEASE" "$@" -- sh -c 'echo $$ > "$T/$0.pid.tmp"; mv "$T/$0.pid.tmp" "$T/$0.pid"; exec sleep 30' "$name"
    ) >"$T/$name.out" 2>"$T/$name.err" &
    pid=$!
    bg_register "$pid"
    wait_for "$name: the command started (or lease ended)" started_or_gone "$T/$name.pid" "$pid"
    if [ ! -s "$T/$name.pid" ]; then
        wait_exit "$pid" rc "$name"
        fail "$name: lease ended (exit $rc) before its command started: $(cat "$T/$name.err")"
        return
    fi
    child=$(cat "$T/$name.pid" 2>/dev/null)
    for ((i = 0; i < 200; i++)); do
        [ "$(cat "/proc/$child/comm" 2>/dev/null)" = sleep ] && break
        sleep 0.05
    done
    assert_eq "$(cat "/proc/$child/comm" 2>/dev/null)" sleep "$name: the command became sleep"
    got=$(fds "$child")
    assert_eq "$(printf '%s\n' "$got" | cut -d' ' -f1 | tr '\n' ' ')" "$expected" \
        "$name: the command's descriptors are only $expected
$got"
    if [ "$with3" = 3 ]; then
        assert_contains "$got" "3 -> $T/userfile" "$name: fd 3 is the user's file"
    fi
    kill -TERM "$child" 2>/dev/null
    wait_exit "$pid" rc "$name"
    assert_eq "$rc" 143 "$name: lease exits with the command's status (SIGTERM)$(printf '\n%s' "$(cat "$T/$name.err")")"
}

for store in sqlite postgres redis etcd; do
    url=${URLS[$store]:-}
    [ -n "$url" ] || continue
    section "$store"
    check "run-$store" "0 1 2 " - --store "$url" run "fds-run-$store" --ttl 10s
    check "run3-$store" "0 1 2 3 " 3 --store "$url" run "fds-run3-$store" --ttl 10s
    check "elect-$store" "0 1 2 " - --store "$url" elect "fds-elect-$store" --ttl 10s
    check "elect3-$store" "0 1 2 3 " 3 --store "$url" elect "fds-elect3-$store" --ttl 10s
done

finish
