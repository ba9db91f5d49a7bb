#!/usr/bin/env bash
# Sessions against keepers with 1,000 and 10,000 leases per process, on
# every store: starts its own servers (durable settings, as the test
# scripts start them) on loopback in a temporary directory, runs
# bench_session for each store and prints a markdown table.
#
#   bench/session.sh [--build DIR] [--hold SEC] [--stores "sqlite postgres redis etcd"]
#                    [--runs "session:1000 session:10000 keepers:1000"] [--out FILE]
#
# --build   the build directory holding bench/bench_session (default: build)
# --hold    seconds each run holds its leases (default 60; 20 for a trial)
# --out     also keep the JSON lines of every run in FILE
# Ports (loopback): BENCH_PG_PORT (35432), BENCH_REDIS_PORT (36379),
# BENCH_ETCD_PORT and BENCH_ETCD_PEER_PORT (32379, 32380), and one free
# forwarder port per run in BENCH_FWD_PORT (37000) .. +99.
#
# Every server store is measured through bench_session's forwarder, which
# counts the round trips; each server is stopped before the next starts,
# so that an idle one does not share the machine with the next.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
hold=60
stores="sqlite postgres redis etcd"
runs="session:1000 session:10000 keepers:1000"
out=""
pg_port=${BENCH_PG_PORT:-35432}
redis_port=${BENCH_REDIS_PORT:-36379}
etcd_port=${BENCH_ETCD_PORT:-32379}
etcd_peer=${BENCH_ETCD_PEER_PORT:-32380}
fwd_port=${BENCH_FWD_PORT:-37000}

. "$(dirname "$0")/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=${2:?}; shift 2 ;;
  --hold) hold=${2:?}; shift 2 ;;
  --stores) stores=${2:?}; shift 2 ;;
  --runs) runs=${2:?}; shift 2 ;;
  --out) out=${2:?}; shift 2 ;;
  *) die "unknown option '$1' (see the head of this script)" ;;
  esac
done
bin=$build/bench/bench_session
[ -x "$bin" ] || die "no $bin: build the project first (cmake --build $build)"
command -v jq >/dev/null || die "needs jq for the table"

tmp=$(mktemp -d /tmp/lease-bench-session.XXXXXX)
# The PostgreSQL server runs as its own user and must reach its directory.
chmod 0755 "$tmp"
running=""
cleanup() {
  case "$running" in
  postgres) "$root/scripts/pg-server.sh" stop "$tmp/pg" ;;
  redis) "$root/scripts/redis-server.sh" stop "$tmp/redis" ;;
  etcd) "$root/scripts/etcd-server.sh" stop "$tmp/etcd" ;;
  esac
  rm -rf "$tmp"
}
trap cleanup EXIT
results=$tmp/results.jsonl
: > "$results"

# Start the server of one store; sets target (HOST:PORT the forwarder
# relays to), url_of (the store URL with __PORT__ for the forwarder's
# port) and pids (the server's processes).
start_server() {
  case "$1" in
  sqlite)
    target=""
    pids=""
    ;;
  postgres)
    "$root/scripts/pg-server.sh" start "$tmp/pg" "$pg_port"
    running=postgres
    # The password goes through a password file, not the command line.
    printf '127.0.0.1:*:lease:lease:%s\n' "$(cat "$tmp/pg/password")" > "$tmp/pgpass"
    chmod 0600 "$tmp/pgpass"
    export PGPASSFILE=$tmp/pgpass
    target=127.0.0.1:$pg_port
    url_of="postgres://lease@127.0.0.1:__PORT__/lease"
    pids=$(head -n 1 "$tmp/pg/data/postmaster.pid")
    ;;
  redis)
    "$root/scripts/redis-server.sh" start "$tmp/redis" "$redis_port"
    running=redis
    target=127.0.0.1:$redis_port
    url_of="redis://127.0.0.1:__PORT__"
    pids=$(cat "$tmp/redis/redis.pid")
    ;;
  etcd)
    "$root/scripts/etcd-server.sh" start "$tmp/etcd" e1 "$etcd_port" "$etcd_peer"
    running=etcd
    target=127.0.0.1:$etcd_port
    url_of="etcd://127.0.0.1:__PORT__"
    pids=$(cat "$tmp/etcd/e1/pid")
    ;;
  *) die "unknown store '$1' (sqlite, postgres, redis or etcd)" ;;
  esac
}

stop_server() {
  running_was=$running
  running=""
  case "$running_was" in
  postgres) "$root/scripts/pg-server.sh" stop "$tmp/pg" ;;
  redis) "$root/scripts/redis-server.sh" stop "$tmp/redis" ;;
  etcd) "$root/scripts/etcd-server.sh" stop "$tmp/etcd" ;;
  esac
}

# The next forwarder port from BENCH_FWD_PORT up that no socket of this
# host uses as its local port (clients take ports in this range too).
next_port=$fwd_port
free_port() {
  local p
  for ((p = next_port; p < fwd_port + 100; p++)); do
    if [ -z "$(ss -Htan "( sport = :$p )")" ]; then
      next_port=$((p + 1))
      port=$p
      return 0
    fi
  done
  die "no free forwarder port in $fwd_port..$((fwd_port + 99))"
}

# One run: store mode leases index.
run_one() {
  local store=$1 mode=$2 n=$3 i=$4 port url rc=0
  local -a args=(--leases "$n" --mode "$mode" --hold "$hold" --ttl-ms 30000 --renew-ms 10000)
  if [ "$store" = sqlite ]; then
    url="sqlite://$tmp/sqlite-$i.db"
  else
    free_port
    url=${url_of/__PORT__/$port}
    args+=(--forward "$port:$target" --server-pids "$pids")
  fi
  echo "== $store $mode $n" >&2
  "$bin" --store "$url" "${args[@]}" > "$tmp/run-$i.out" || rc=$?
  grep '^#' "$tmp/run-$i.out" >&2 || true
  grep '^{' "$tmp/run-$i.out" | jq -c --argjson rc "$rc" '. + {exit: $rc}' >> "$results" ||
    echo "session.sh: $store $mode $n printed no result (exit $rc)" >&2
}

i=0
for store in $stores; do
  start_server "$store"
  for r in $runs; do
    run_one "$store" "${r%%:*}" "${r##*:}" "$i"
    i=$((i + 1))
  done
  stop_server
done

[ -z "$out" ] || cp "$results" "$out"

echo
echo "| store | mode | leases held | acquire | TCP conns | threads | fds | RSS (peak) | CPU % of a core | server CPU % | round trips / tick | lost | release |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
jq -r '
  def f1: (. * 10 | round) / 10 | tostring;
  def f2: (. * 100 | round) / 100 | tostring;
  def mb: (. / 1024 | f1) + " MB";
  [ .store, .mode,
    (if .acquired == .leases then (.leases | tostring)
     else "\(.acquired) of \(.leases): \(.acquire_error)" end),
    (.acquire_s | f1) + " s",
    (.tcp_connections | tostring), (.threads | tostring), (.fds | tostring),
    (.rss_kb | mb) + " (" + (.hwm_kb | mb) + ")",
    (.cpu_pct | f2),
    (if .server_cpu_pct == null then "-" else (.server_cpu_pct | f2) end),
    (if .turns_per_tick != null then (.turns_per_tick | f1)
     else (.syncs_per_tick | f1) + " commits" end),
    (.lost | tostring),
    (.release_s | f1) + " s"
  ] | "| " + join(" | ") + " |"' "$results"
