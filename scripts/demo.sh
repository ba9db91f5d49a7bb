#!/usr/bin/env bash
# Build lease and play the stale-owner race with real processes:
# worker A is paused past its ttl, worker B takes over, A's late write is
# rejected by the fenced resource. Pass --store URL to use another store.
#
# Then the same race against an HTTP service that keeps its own state
# (examples/fence_http_service.c, fenced with lease_fence_local): A and B
# are `lease run` commands that write with curl, sending their lease in the
# headers Lease-Key and Lease-Token; A's late write gets 409 Conflict and
# B's value stands.
#
#   scripts/demo.sh [--store URL] [--ttl DUR]
#   scripts/demo.sh --http-only LEASE_BINARY SERVICE_BINARY
#       the HTTP scenario alone, with binaries already built (its test,
#       tests/resource/resource_http.sh, runs it so); exit 0 only when A's
#       late write got 409 and the service holds B's value.
set -euo pipefail
cd "$(dirname "$0")/.."

KEY=demo/http-report
TTL=1s

# Every wait below is a bounded loop (at most 10 s, 50 ms apart) on what a
# process or the store says: no sleep on luck.
wait_until() {
    local what=$1 i
    shift
    for ((i = 0; i < 200; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.05
    done
    echo "demo: timed out waiting for $what" >&2
    return 1
}

key_expired() { "$LEASE" show "$KEY" --json | grep -q '"state":"expired"'; }
# A process that is gone, or a zombie nobody reaped yet.
gone() {
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    st=${st##*) }
    case $st in Z*|X*) return 0 ;; esac
    return 1
}

# The client both workers run under `lease run`: one PUT of $2 as NAME
# "report", its HTTP code and the service's answer into $W/$1.*. The lease
# comes from the environment `lease run` gives its command.
CLIENT='code=$(curl -sS -o "$W/$1.body" -w "%{http_code}" -X PUT \
  -H "Lease-Key: $LEASE_KEY" -H "Lease-Token: $LEASE_TOKEN" \
  --data-binary "$2" "$SERVICE_URL/data/report") || code=000
echo "$code" > "$W/$1.code"; echo "$LEASE_TOKEN" > "$W/$1.token"'

# Worker A: a first write under its lease, then (told to go by the demo,
# after the pause) its late write, with the token it still carries.
WORKER_A='sh -c "$CLIENT" client a-first "written by A"
echo $$ > "$W/a.pid"; : > "$W/a.ready"
i=0; while [ ! -e "$W/a.go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
sh -c "$CLIENT" client a-late "late write by A"; : > "$W/a.done"'

say() { printf '%-9s %s\n' "$1" "$2"; }

play_http() {
    local stored
    # Not local: the exit trap reads them after this function has returned.
    svc='' a_pid='' a_cpid=''
    W=$(mktemp -d "${TMPDIR:-/tmp}/lease-demo-http.XXXXXX")
    export W CLIENT LEASE_STORE=${STORE_URL:-sqlite://$W/leases.db}
    # Each pid is cleared once its process has been reaped, so that a
    # recycled pid is never signalled.
    trap 'for p in $a_cpid $a_pid; do kill -KILL "$p" 2>/dev/null || true; done
          if [ -n "$svc" ]; then kill "$svc" 2>/dev/null; wait "$svc" 2>/dev/null; fi
          rm -rf "$W"' EXIT

    "$SERVICE" >"$W/service.out" 2>&1 &
    svc=$!
    wait_until "the service to listen" grep -q '^listening on ' "$W/service.out"
    SERVICE_URL=http://$(sed -n 's/^listening on //p' "$W/service.out")
    export SERVICE_URL
    say service "fences PUT /data/NAME by Lease-Key and Lease-Token, at $SERVICE_URL"

    "$LEASE" run "$KEY" --ttl "$TTL" -- sh -c "$WORKER_A" 2>"$W/a.err" &
    a_pid=$!
    wait_until "worker A to write" test -e "$W/a.ready"
    a_cpid=$(cat "$W/a.pid")
    say "A" "token $(cat "$W/a-first.token"): PUT /data/report -> $(cat "$W/a-first.code") $(cat "$W/a-first.body")"
    # All of A (supervisor and command, a process group of its own) stops,
    # as under a long GC pause or a suspended VM.
    kill -STOP "$a_pid"
    kill -STOP -- "-$a_cpid"
    say "A" "paused (SIGSTOP) past its $TTL lease"
    wait_until "A's lease to expire in the store" key_expired
    "$LEASE" run "$KEY" --ttl 30s -- sh -c "$CLIENT" client b "written by B"
    say "B" "token $(cat "$W/b.token"): PUT /data/report -> $(cat "$W/b.code") $(cat "$W/b.body")"
    # A's command resumes first: its late request was already on its way.
    : > "$W/a.go"
    kill -CONT -- "-$a_cpid"
    wait_until "A's late write" test -e "$W/a.done"
    say "A" "resumed; late write with token $(cat "$W/a-late.token") -> $(cat "$W/a-late.code") $(cat "$W/a-late.body")"
    kill -CONT "$a_pid"
    wait_until "A's lease run to end" gone "$a_pid"
    wait "$a_pid" || true # 4: it says its lease was lost while A ran
    a_pid='' a_cpid=''
    stored=$(curl -sS "$SERVICE_URL/data/report")
    say service "/data/report holds: $stored"
    if [ "$(cat "$W/a-late.code")" = 409 ] && [ "$stored" = "written by B" ]; then
        say result "the stale write was refused (409); B's value stands"
        return 0
    fi
    say result "FAILED: the service accepted a stale write or lost B's"
    return 1
}

if [ "${1:-}" = --http-only ]; then
    LEASE=${2:?usage: demo.sh --http-only LEASE_BINARY SERVICE_BINARY}
    SERVICE=${3:?usage: demo.sh --http-only LEASE_BINARY SERVICE_BINARY}
    case $LEASE in /*) ;; *) LEASE=$OLDPWD/$LEASE ;; esac
    case $SERVICE in /*) ;; *) SERVICE=$OLDPWD/$SERVICE ;; esac
    play_http
    exit
fi

# --store URL applies to both scenarios.
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[$i]} in
    --store) STORE_URL=${args[$((i + 1))]:-} ;;
    --store=*) STORE_URL=${args[$i]#--store=} ;;
    esac
done

scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASE_TESTS=OFF >/dev/null
cmake --build build-release -j2 --target stale_owner fence_http_service lease_cli >/dev/null
status=0
build-release/stale_owner "$@" || status=$?
[ "$status" -ne 2 ] || exit 2 # bad usage
echo
echo "The same race against an HTTP service that fences its own writes:"
LEASE=build-release/lease SERVICE=build-release/fence_http_service
play_http || status=1
exit "$status"
