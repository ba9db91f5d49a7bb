#!/usr/bin/env bash
# Build lease the ways users and developers build it, warnings as errors in
# each: with gcc, the default RelWithDebInfo build and Debug with
# AddressSanitizer + UndefinedBehaviorSanitizer, each running the tests
# through ctest (every test in the first; in the second all but five that
# mostly wait on servers restarting or failing over, three that check the
# Kubernetes double against real clients and one that waits on renewal
# rounds); the same two with clang,
# compiled; an SQLite-only build running the tests that apply to it but
# eight that wait on ttls and locks (they ran in the first); then
# the libFuzzer targets (clang), each run for LEASE_FUZZ_SECONDS (default
# 20) through ctest, so that a regression in a parser is caught.
# The store servers the tests need (and the Kubernetes Lease API double) are
# started here, on loopback ports in a temporary directory, and stopped on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

. scripts/ports.sh

work=$(mktemp -d /tmp/lease-test.XXXXXX)
chmod 0755 "$work"   # the servers run as their own users
cleanup() {
  scripts/pg-server.sh stop "$work/pg" || true
  scripts/redis-server.sh stop "$work/redis" || true
  scripts/etcd-server.sh stop "$work/etcd" || true
  scripts/kube-server.sh stop "$work/kube" || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting PostgreSQL on loopback"
pick_port
scripts/pg-server.sh start "$work/pg" "$PORT"
LEASE_TEST_PG_URL=$(scripts/pg-server.sh url "$work/pg")
export LEASE_TEST_PG_URL

echo "== starting Redis on loopback"
pick_port
scripts/redis-server.sh start "$work/redis" "$PORT"
LEASE_TEST_REDIS_URL=$(scripts/redis-server.sh url "$work/redis")
export LEASE_TEST_REDIS_URL

echo "== starting etcd on loopback"
pick_port
cport=$PORT
pick_port
scripts/etcd-server.sh start "$work/etcd" e1 "$cport" "$PORT"
LEASE_TEST_ETCD_URL=$(scripts/etcd-server.sh url "$work/etcd")
export LEASE_TEST_ETCD_URL

# No Kubernetes API server is packaged for Debian: the Kubernetes store's
# tests run against the Lease API double in tests/kubernetes/, whose
# fidelity tests check it with kubectl and python3-kubernetes.
echo "== starting the Kubernetes Lease API double on loopback"
pick_port
scripts/kube-server.sh start "$work/kube" "$PORT"
LEASE_TEST_KUBE_URL=$(scripts/kube-server.sh url "$work/kube")
export LEASE_TEST_KUBE_URL

# build DIR CMAKE_ARGS...: configure and build, warnings as errors.
build() {
  local dir=$1; shift
  cmake -S . -B "$dir" -DLEASE_WERROR=ON -DLEASE_MAN=ON -DLEASE_TESTS=ON "$@" >/dev/null
  cmake --build "$dir" -j2
}

# run_suite DIR [CTEST_ARGS...]: every test of the build in DIR.
run_suite() {
  local dir=$1; shift
  (cd "$dir" && ctest --output-on-failure --timeout 600 "$@")
}

stage() { echo "== $* ($(date -u +%H:%M:%S))"; }

stage "build: gcc, RelWithDebInfo (the default users build), then every test"
build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=gcc
run_suite build
stage "build: gcc, Debug + ASan + UBSan, then every test but nine"
build build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=gcc -DLEASE_SANITIZE=ON
# Every test but the five that spend their minutes waiting on servers
# (replication, restarts, quorum loss, a killed leader): their client code
# paths are the ones the other tests run, and the gcc suite above ran them;
# the three that check the Kubernetes double against kubectl and
# python3-kubernetes (their C paths are kube_checks' and the conformance
# suite's, run here); and session_kubernetes, half a minute of renewal rounds
# against the double (the session's code runs here on the four other
# stores, the Kubernetes store's renew in conformance_ and keeper_kubernetes).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite build-asan \
  -E '^(redis_failover|redis_wait_replicas|redis_restart|etcd_quorum_loss|etcd_leader_kill|kube_double|kube_kubectl|kube_interop|session_kubernetes)$'
# clang's warnings differ from gcc's: both configurations are compiled
# with it, warnings as errors; the tests ran above.
stage "build: clang, RelWithDebInfo (compiled only)"
build build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang
stage "build: clang, Debug + ASan + UBSan, every store built into liblease.so (compiled only)"
# -DLEASE_STORE_MODULES=OFF: the one build of the shared library without
# store modules, so that that configuration keeps compiling.
build build-clang-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DLEASE_SANITIZE=ON \
  -DLEASE_STORE_MODULES=OFF
# The smallest build: SQLite only, and the tests that apply to it (the
# Debian packages, which have every store, were built and checked above)
# but eight that spend their time waiting on ttls, renewals and locks:
# they ran above on the same SQLite code, and what this build compiles out
# (the other stores) is what the rest check, from the URLs it refuses to
# the library's and the CLI's start with one store.
stage "build: SQLite only (-DLEASE_WITH_POSTGRES/REDIS/ETCD/KUBERNETES=OFF), then its tests but eight"
build build-min -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=gcc \
  -DLEASE_WITH_POSTGRES=OFF -DLEASE_WITH_REDIS=OFF -DLEASE_WITH_ETCD=OFF -DLEASE_WITH_KUBERNETES=OFF
run_suite build-min -LE package \
  -E '^(cli_run|cli_hold|cli_badinput|cli_elect|cli_agent|sqlite_corrupt|sqlite_busy|session_sqlite)$'
stage "fuzz targets (clang, libFuzzer + ASan + UBSan, ${LEASE_FUZZ_SECONDS:-20} s each)"
build build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DLEASE_FUZZ=ON \
  -DLEASE_FUZZ_SECONDS="${LEASE_FUZZ_SECONDS:-20}"
# Two at a time: each target is one process with its fakes in it, on ports
# of its own; they share nothing but the two cores.
run_suite build-fuzz -j2
stage "all passed"
