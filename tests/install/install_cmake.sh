#!/usr/bin/env bash
# install_cmake: install into a prefix with a space, then configure, build
# and run the CMake project of tests/install/consumer
# (find_package(lease 0.1 REQUIRED), lease::lease) with CMAKE_PREFIX_PATH
# at that prefix; and check that the package's version file refuses a
# request for an incompatible version (find_package(lease 9.0)).
# Usage: install_cmake.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

install_prefix

section "find_package(lease 0.1 REQUIRED) and lease::lease"
# The consumer gets a copy of the program: the project must not reach into
# the source tree for anything else.
mkdir -p "$T/consumer" || die "mkdir"
cp "$SRC/tests/install/consumer/CMakeLists.txt" "$APP_C" "$T/consumer/" || die "cp"
call "$CMAKE" -S "$T/consumer" -B "$T/consumer-build" "-DCMAKE_PREFIX_PATH=$PREFIX"
expect_rc 0 "configure the consumer with CMAKE_PREFIX_PATH at the prefix"
assert_contains "$OUT" "lease_VERSION=$VERSION" "the version find_package found"
[ "$RC" = 0 ] || die "the consumer did not configure"
# The package that was found is the installed one, not the build tree's.
lease_dir=$(sed -n 's/^lease_DIR:PATH=//p' "$T/consumer-build/CMakeCache.txt")
assert_eq "$lease_dir" "$LIBDIR/cmake/lease" "lease_DIR"
cmake_stores=$(printf '%s\n' "$OUT" | sed -n 's/^-- lease_STORES=//p')

call "$CMAKE" --build "$T/consumer-build"
expect_rc 0 "build the consumer"
[ "$RC" = 0 ] || die "the consumer did not build"

section "run the consumer"
expect_installed_liblease "$T/consumer-build/app" "the consumer's liblease"
call env -u LD_LIBRARY_PATH "$T/consumer-build/app" "sqlite://$T/cmake.db"
expect_rc 0 "open, acquire, release through lease::lease"
assert_contains "$OUT" "liblease $VERSION (headers $VERSION)" "lease_version() and LEASE_VERSION_STRING"
token=$(printf '%s\n' "$OUT" | sed -n 's/^token //p')
assert_gt "${token:-0}" 0 "the fencing token"

section "lease_STORES is what the library has"
call "$BINDIR/lease" --version
expect_rc 0 "the installed lease --version"
tool_stores=$(printf '%s\n' "$OUT" | sed -n 's/^stores: //p')
assert_eq "$cmake_stores" "$tool_stores" "lease_STORES of the CMake package"

section "find_package(lease 9.0) fails"
mkdir -p "$T/too-new" || die "mkdir"
cat >"$T/too-new/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(lease_too_new LANGUAGES C)
find_package(lease 9.0 REQUIRED)
EOF
call "$CMAKE" -S "$T/too-new" -B "$T/too-new-build" "-DCMAKE_PREFIX_PATH=$PREFIX"
expect_rc 1 "find_package(lease 9.0 REQUIRED) with only $VERSION installed"
# Refused for its version (leaseConfigVersion.cmake said no), not missing.
assert_contains "$ERR" "considered but not accepted" "the installed package was found and refused"
assert_contains "$ERR" "leaseConfig.cmake, version: $VERSION" "the refusal names the installed version"

finish
