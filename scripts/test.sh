#!/usr/bin/env bash
# Build lease twice (plain, and with AddressSanitizer + UndefinedBehaviorSanitizer),
# warnings as errors, and run every test through ctest in both builds; then
# build the libFuzzer targets (clang) and run each for LEASE_FUZZ_SECONDS
# (default 20) through ctest, so that a regression in a parser is caught.
# The store servers the tests need are started here, on loopback ports in a
# temporary directory, and stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

free_port() {
  local p
  for p in $(shuf -i 20000-60000 -n 100); do
    if ! ss -Htln "sport = :$p" | grep -q .; then echo "$p"; return 0; fi
  done
  echo "test.sh: no free port found" >&2
  return 1
}

work=$(mktemp -d /tmp/lease-test.XXXXXX)
chmod 0755 "$work"   # the servers run as their own users
cleanup() {
  scripts/pg-server.sh stop "$work/pg" || true
  scripts/redis-server.sh stop "$work/redis" || true
  scripts/etcd-server.sh stop "$work/etcd" || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting PostgreSQL on loopback"
scripts/pg-server.sh start "$work/pg" "$(free_port)"
LEASE_TEST_PG_URL=$(scripts/pg-server.sh url "$work/pg")
export LEASE_TEST_PG_URL

echo "== starting Redis on loopback"
scripts/redis-server.sh start "$work/redis" "$(free_port)"
LEASE_TEST_REDIS_URL=$(scripts/redis-server.sh url "$work/redis")
export LEASE_TEST_REDIS_URL

echo "== starting etcd on loopback"
scripts/etcd-server.sh start "$work/etcd" e1 "$(free_port)" "$(free_port)"
LEASE_TEST_ETCD_URL=$(scripts/etcd-server.sh url "$work/etcd")
export LEASE_TEST_ETCD_URL

run_suite() {
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DLEASE_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j2
  (cd "$dir" && ctest --output-on-failure --timeout 600)
}

echo "== build and tests"
run_suite build
echo "== build and tests with ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite build-asan -DLEASE_SANITIZE=ON
echo "== fuzz targets (clang, libFuzzer + ASan + UBSan, ${LEASE_FUZZ_SECONDS:-20} s each)"
run_suite build-fuzz -DCMAKE_C_COMPILER=clang -DLEASE_FUZZ=ON \
  -DLEASE_FUZZ_SECONDS="${LEASE_FUZZ_SECONDS:-20}"
