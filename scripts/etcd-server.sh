#!/usr/bin/env bash
# Start or stop throw-away etcd members for the tests, on loopback.
#
#   etcd-server.sh start DIR NAME CLIENT_PORT PEER_PORT [CLUSTER [new|existing]]
#       CLUSTER is etcd's --initial-cluster (default: this member alone)
#   etcd-server.sh stop DIR [NAME]     (SIGTERM; every member in DIR without NAME)
#   etcd-server.sh kill DIR NAME       (SIGKILL)
#   etcd-server.sh url DIR             etcd://127.0.0.1:PORT,... of DIR's members
#
# Each member's data, pid and log live in DIR/NAME.
set -euo pipefail

cmd=${1:?usage: etcd-server.sh start|stop|kill|url DIR ...}
dir=${2:?missing DIR}

wait_ready() { # port
  for _ in $(seq 200); do   # bounded: 200 x 50 ms
    if curl -fs -m 1 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '"health":"true"'; then
      return 0
    fi
    sleep 0.05
  done
  return 1
}

case "$cmd" in
start)
  name=${3:?missing NAME}; cport=${4:?missing CLIENT_PORT}; pport=${5:?missing PEER_PORT}
  cluster=${6:-$name=http://127.0.0.1:$pport}
  state=${7:-new}
  mkdir -p "$dir/$name"
  echo "$cport" > "$dir/$name/client_port"
  nohup etcd --name "$name" --data-dir "$dir/$name/data" \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" \
    --initial-cluster-token "lease-test-$(basename "$dir")" \
    > "$dir/$name/log" 2>&1 &
  echo $! > "$dir/$name/pid"
  # A member of a cluster is healthy only once a quorum is up: the caller
  # checks that, after starting them all.
  if [ "$cluster" = "$name=http://127.0.0.1:$pport" ] && ! wait_ready "$cport"; then
    echo "etcd-server.sh: member $name on port $cport did not become healthy" >&2
    exit 1
  fi
  ;;
stop|kill)
  sig=TERM; [ "$cmd" = kill ] && sig=KILL
  for m in "$dir"/${3:-*}/; do
    [ -f "$m/pid" ] || continue
    pid=$(cat "$m/pid")
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$m/pid"
  done
  ;;
ready)
  wait_ready "$(cat "$dir/${3:?missing NAME}/client_port")"
  ;;
url)
  ports=$(cat "$dir"/*/client_port | sed 's/^/127.0.0.1:/' | paste -sd, -)
  echo "etcd://$ports"
  ;;
*)
  echo "usage: etcd-server.sh start|stop|kill|ready|url DIR ..." >&2
  exit 2
  ;;
esac
