#!/usr/bin/env bash
# Install the Debian packages the build and the tests need, if any is missing.
# Runs as root on a fresh machine; asks apt only when something is missing.
set -euo pipefail

packages=(
  gcc make cmake pkg-config
  libsqlite3-dev libpq-dev libhiredis-dev libcurl4-openssl-dev libssl-dev libmicrohttpd-dev uuid-dev libjansson-dev   # the library and the CLI
  scdoc   # the man pages
  clang libclang-rt-14-dev llvm-14   # the clang builds and the fuzz targets: clang, its libFuzzer runtime, llvm-symbolizer for stacks
  libcmocka-dev python3 python3-pytest python3-mypy python3-psycopg2 python3-psycopg sqlite3 jq postgresql-15 redis-server redis-sentinel redis-tools etcd-server etcd-client prometheus curl openssl iproute2 coreutils util-linux time man-db groff-base   # the tests
  debhelper dpkg-dev dh-python   # the Debian packages (tests/package); dh-python: dh_python3 for python3-lease
  lua5.1   # luac5.1 -p checks the Redis scripts (Redis runs Lua 5.1)
  python3-grpcio   # the gRPC fake etcd member of tests/etcd/etcd_hostile_grpc.sh
  python3-kubernetes   # a real client (CoordinationV1Api) checked against the Kubernetes test double, as kubectl is (below)
)

# kubectl: Debian's kubernetes-client, unless a kubectl is installed already
# (some images carry another vendor's package of it, which Debian's would
# conflict with); the tests use whichever is on PATH.
if ! command -v kubectl >/dev/null 2>&1; then
  packages+=(kubernetes-client)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps.sh: run as root (or install these packages): ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
