#!/usr/bin/env bash
# Start or stop a throw-away Kubernetes Lease API server for the tests: the
# test double tests/kubernetes/fake_kube.py (no API server is packaged for
# Debian), on loopback.
#
#   kube-server.sh start DIR PORT [--tls] [extra fake_kube.py options...]
#   kube-server.sh stop DIR
#   kube-server.sh url DIR
#
# DIR's parent must exist, DIR must not: it is made (mode 0700) and holds
# the bearer token (DIR/token, random, mode 0600), a second token the server
# answers 403 to (DIR/forbidden-token), the pid file and the log
# (DIR/kube.log, one line per request, never a token). With --tls it serves
# HTTPS with a self-signed certificate for 127.0.0.1 (DIR/ca.pem) and `url`
# prints a kubernetes:// URL with cacert=; without, a kubernetes+http:// URL.
# `stop` stops the server and removes DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
fake=$here/../tests/kubernetes/fake_kube.py
python=/usr/bin/python3   # Debian's, whatever python3 comes first on PATH

cmd=${1:?usage: kube-server.sh start|stop|url DIR ...}
dir=${2:?missing DIR}

# new_token FILE: 32 random bytes, hex, in FILE (mode 0600).
new_token() {
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$1")
}

case "$cmd" in
start)
  port=${3:?missing PORT}
  shift 3
  tls=0
  if [ "${1:-}" = --tls ]; then tls=1; shift; fi
  if [ -e "$dir" ]; then
    echo "kube-server.sh: $dir exists already" >&2
    exit 1
  fi
  mkdir -m 0700 "$dir"
  dir=$(cd "$dir" && pwd)
  new_token "$dir/token"
  new_token "$dir/forbidden-token"
  echo "$port" > "$dir/port"
  opts=(--port "$port" --host 127.0.0.1 --token-file "$dir/token"
        --forbidden-token-file "$dir/forbidden-token" --pid-file "$dir/kube.pid")
  if [ "$tls" = 1 ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
      -addext subjectAltName=IP:127.0.0.1 -keyout "$dir/key.pem" \
      -out "$dir/ca.pem" >"$dir/openssl.log" 2>&1
    opts+=(--tls-cert "$dir/ca.pem" --tls-key "$dir/key.pem")
    echo https > "$dir/scheme"
  fi
  # Detached from the caller's terminal and descriptors (a test runner
  # waiting on its pipes must not wait on the server).
  setsid "$python" "$fake" "${opts[@]}" "$@" </dev/null >"$dir/kube.log" 2>&1 &
  # Bounded: at most 200 tries, 50 ms apart. The pid file is written once
  # the port is bound, so an answer then is this server's.
  for _ in $(seq 200); do
    if [ -f "$dir/kube.pid" ] &&
       curl -fsS -o /dev/null --max-time 2 -k \
         "$( [ "$tls" = 1 ] && echo https || echo http)://127.0.0.1:$port/healthz" 2>/dev/null; then
      exit 0
    fi
    if ! kill -0 $! 2>/dev/null; then break; fi
    sleep 0.05
  done
  echo "kube-server.sh: the server on port $port did not answer; its log:" >&2
  tail -n 20 "$dir/kube.log" >&2 || true
  kill $! 2>/dev/null || true
  exit 1
  ;;
stop)
  if [ -d "$dir" ]; then dir=$(cd "$dir" && pwd); fi
  if [ -f "$dir/kube.pid" ]; then
    pid=$(cat "$dir/kube.pid")
    # Only a process running fake_kube.py with this DIR's token is ours.
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/token"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  if [ -d "$dir" ]; then rm -rf "$dir"; fi
  ;;
url)
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/scheme" ]; then
    echo "kubernetes://127.0.0.1:$(cat "$dir/port")/default?token_file=$dir/token&cacert=$dir/ca.pem"
  else
    echo "kubernetes+http://127.0.0.1:$(cat "$dir/port")/default?token_file=$dir/token"
  fi
  ;;
*)
  echo "usage: kube-server.sh start|stop|url DIR ..." >&2
  exit 2
  ;;
esac
