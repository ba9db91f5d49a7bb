#!/usr/bin/env bash
# Start or stop a throw-away Redis server for the tests, on loopback.
#
#   redis-server.sh start DIR PORT [extra redis-server options...]
#   redis-server.sh stop DIR
#   redis-server.sh url DIR
#
# DIR is made; the data (append-only file), pid and log live there. The
# default is the durable setting the lease store needs: appendonly yes,
# appendfsync always, no snapshots. Extra options override it.
set -euo pipefail

cmd=${1:?usage: redis-server.sh start|stop|url DIR ...}
dir=${2:?missing DIR}

case "$cmd" in
start)
  port=${3:?missing PORT}
  shift 3
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
    --appendonly yes --appendfsync always --save "" "$@"
  echo "$port" > "$dir/port"
  # Bounded: at most 100 tries, 50 ms apart.
  for _ in $(seq 100); do
    if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
      exit 0
    fi
    sleep 0.05
  done
  echo "redis-server.sh: server on port $port did not answer" >&2
  exit 1
  ;;
stop)
  if [ -f "$dir/redis.pid" ]; then
    pid=$(cat "$dir/redis.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || exit 0
      sleep 0.05
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  ;;
url)
  echo "redis://127.0.0.1:$(cat "$dir/port")"
  ;;
*)
  echo "usage: redis-server.sh start|stop|url DIR ..." >&2
  exit 2
  ;;
esac
