#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] - build the libFuzzer targets of tests/fuzz with
# clang (ASan + UBSan, in a build directory of their own) and run each for
# SECONDS (default 60) from its seed corpus in tests/fuzz/corpus/<target>/.
# Fails on any crash, leak, sanitizer report or broken property; the input
# that did it is printed in hex and kept under
# $LEASE_FUZZ_BUILD_DIR/tests/fuzz/fuzz-work/<target>/artifacts/.
# New corpus inputs stay in that build directory: copy one into
# tests/fuzz/corpus/<target>/ only on purpose (tests/fuzz/README.md).
# Needs no server: the store targets run their own fake on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
case $secs in
  ''|*[!0-9]*|0) echo "usage: scripts/fuzz.sh [SECONDS]  (a whole number above 0)" >&2; exit 2 ;;
esac
dir=${LEASE_FUZZ_BUILD_DIR:-build-fuzz}
cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
  -DLEASE_WERROR=ON -DLEASE_FUZZ=ON -DLEASE_FUZZ_SECONDS="$secs" >/dev/null
cmake --build "$dir" -j2
(cd "$dir" && ctest --output-on-failure -L fuzz --timeout $((secs + 600)))
