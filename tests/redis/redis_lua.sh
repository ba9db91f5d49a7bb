#!/usr/bin/env bash
# redis_lua.sh - the store's Lua scripts (src/stores/redis/*.lua) as files
# of their own: each must parse and run without the C around it.
#
#   redis_lua.sh syntax DIR       luac5.1 -p on lib.lua + each other script
#                                 (Redis runs Lua 5.1); fails if one fails
#                                 or none is found
#   redis_lua.sh alone DIR URL    fence.lua run as a user would, with
#                                 redis-cli --eval on the server at URL
set -euo pipefail

mode=${1:?usage: redis_lua.sh syntax|alone DIR [URL]}
dir=${2:?missing DIR}
T=$(mktemp -d "${TMPDIR:-/tmp}/lease-redis_lua.XXXXXX")
trap 'rm -rf "$T"' EXIT

case "$mode" in
syntax)
  command -v luac5.1 >/dev/null || { echo "FATAL: luac5.1 not found (scripts/deps.sh installs lua5.1)" >&2; exit 1; }
  n=0 bad=0
  for f in "$dir"/*.lua; do
    [ -e "$f" ] || continue
    [ "$(basename "$f")" = lib.lua ] && continue
    # Named after the script, so luac's message points at it.
    cat "$dir/lib.lua" "$f" > "$T/$(basename "$f")"
    if luac5.1 -p "$T/$(basename "$f")"; then n=$((n + 1)); else echo "FAIL: $f" >&2; bad=$((bad + 1)); fi
  done
  echo "redis_lua_syntax: $n scripts parse, $bad do not"
  [ "$n" -gt 0 ] || { echo "FAIL: no script found in $dir" >&2; exit 1; }
  [ "$bad" -eq 0 ]
  ;;
alone)
  url=${3:-}
  [ -n "$url" ] || { echo "LEASE_TEST_REDIS_URL is not set: start a server (scripts/test.sh does)" >&2; exit 1; }
  # Like the tests' 64-bit tokens: beyond 2^53, where Lua numbers round.
  key="lease-test:redis_lua_alone:$$:$RANDOM" tok=9223372036854775806
  cat "$dir/lib.lua" "$dir/fence.lua" > "$T/f.lua"
  fence() { redis-cli -u "$url" --no-raw --eval "$T/f.lua" "$key" , "$1"; }
  # stderr apart: redis-cli warns there about a password in -u.
  got=$(fence "$tok" 2>"$T/err") || { echo "FAIL: redis-cli --eval: $got $(cat "$T/err")" >&2; exit 1; }
  mark=$(redis-cli -u "$url" --raw get "$key" 2>>"$T/err") || true
  low=$(fence 5 2>>"$T/err") || true
  redis-cli -u "$url" del "$key" >/dev/null 2>&1 || true
  want=$(printf '1) (integer) 1\n2) "%s"' "$tok")
  [ "$got" = "$want" ] || { echo "FAIL: advance: expected '$want', got '$got'" >&2; exit 1; }
  [ "$mark" = "$tok" ] || { echo "FAIL: the mark key holds '$mark', not $tok" >&2; exit 1; }
  want=$(printf '1) (integer) 0\n2) "%s"' "$tok")
  [ "$low" = "$want" ] || { echo "FAIL: lower token: expected '$want', got '$low'" >&2; exit 1; }
  echo "redis_lua_alone: fence.lua advanced $key to $tok and refused 5"
  ;;
*)
  echo "redis_lua.sh: unknown mode '$mode'" >&2
  exit 2
  ;;
esac
