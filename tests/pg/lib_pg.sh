# shellcheck shell=bash
# lib_pg.sh - throw-away PostgreSQL servers for one test script.
# Source it after setting PG_SERVER (path of scripts/pg-server.sh):
#
#   pg_tmpdir                      makes $PG_T (mktemp -d, reachable by the
#                                  postgres user); the EXIT trap stops every
#                                  server started here and removes $PG_T
#   free_port                      prints a free loopback TCP port
#                                  (scripts/ports.sh)
#   pg_start NAME [ROLE ARGS...]   starts a server in $PG_T/NAME on a free
#                                  port (a few ports are tried, in case another
#                                  process takes one first); sets PG_PORT
#   pg_stop NAME                   stops it (-m immediate)
#   pg_bg_register PID             the EXIT trap kills PID (a background
#                                  client) before it stops the servers
#
# Every wait is bounded; failures print the server's log.

pg_tmpdir() {
    PG_T=$(mktemp -d "${TMPDIR:-/tmp}/lease-pg.XXXXXX") || {
        echo "FATAL: mktemp -d failed" >&2
        exit 1
    }
    # The server runs as `postgres`: it must reach the directories below.
    chmod 0755 "$PG_T"
    PG_NAMES=()
    PG_PIDS=()
    trap pg_cleanup EXIT
    trap 'echo "interrupted" >&2; exit 130' INT TERM HUP
}

pg_cleanup() {
    local rc=$? n
    for n in ${PG_PIDS[@]+"${PG_PIDS[@]}"}; do
        kill -KILL "$n" 2>/dev/null
        wait "$n" 2>/dev/null
    done
    for n in ${PG_NAMES[@]+"${PG_NAMES[@]}"}; do
        bash "$PG_SERVER" stop "$PG_T/$n" >/dev/null 2>&1 || true
    done
    if [ -n "${LEASE_TEST_KEEP:-}" ]; then
        echo "kept $PG_T" >&2
    else
        rm -rf "$PG_T"
    fi
    exit $rc
}

# free_port and pick_port (drawn below the kernel's ephemeral range).
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/ports.sh"

pg_start() {
    local name=$1 try
    shift
    for ((try = 0; try < 5; try++)); do
        PG_PORT=$(free_port) || return 1
        rm -rf "${PG_T:?}/$name"
        PG_NAMES+=("$name")
        if bash "$PG_SERVER" start "$PG_T/$name" "$PG_PORT" "$@" >"$PG_T/$name.start" 2>&1; then
            return 0
        fi
        bash "$PG_SERVER" stop "$PG_T/$name" >/dev/null 2>&1 || true
        echo "# starting $name on port $PG_PORT failed (try $((try + 1))):" >&2
        sed 's/^/#   /' "$PG_T/$name.start" >&2
        tail -n 5 "$PG_T/$name/log" 2>/dev/null | sed 's/^/#   log: /' >&2
    done
    echo "FATAL: could not start the PostgreSQL server $name" >&2
    return 1
}

pg_stop() {
    bash "$PG_SERVER" stop "$PG_T/$1"
}

pg_bg_register() {
    PG_PIDS+=("$1")
}
