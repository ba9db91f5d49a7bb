#!/usr/bin/env bash
# docs_readme_c_uninstalled: README.md's program of "Use it from C" builds
# and runs against the build tree, before any install, as the README says:
# the ```sh block after <!-- readme-c-uninstalled --> runs in one bash with
# `set -euo pipefail`, its /path/to/lease/build the build directory of this
# test, next to report.c (the ```c block after <!-- readme-c-example -->).
# pkg-config must take the build's lease-uninstalled.pc (the source tree's
# headers, the build's library) and the program must take a lease on the
# relative SQLite store the block names, once per run.
#   usage: docs_readme_c_uninstalled.sh LEASE_BINARY BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/../cli/lib.sh" "$1"
BUILD=${2:?usage: $0 LEASE_BINARY BUILD_DIR SOURCE_DIR}
SRC=${3:?usage: $0 LEASE_BINARY BUILD_DIR SOURCE_DIR}
BUILD=$(cd "$BUILD" && pwd) || die "no build directory $2"
SRC=$(cd "$SRC" && pwd) || die "no source directory $3"
README=$SRC/README.md
PLACEHOLDER=/path/to/lease/build
for tool in cc pkg-config ldd; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required by this test but was not found in PATH"
done
# Only what the block itself sets may point at the build tree.
unset PKG_CONFIG_PATH LD_LIBRARY_PATH LD_PRELOAD

# block MARKER FENCE: the lines of the block that opens with FENCE right
# after the line MARKER.
block() {
    awk -v marker="$1" -v fence="$2" '
        state == 0 && $0 == marker { state = 1; next }
        state == 1 { state = ($0 == fence) ? 2 : -1; next }
        state == 2 && $0 == "```" { exit }
        state == 2 { print }
    ' "$README"
}

section "the README's program and its commands for a build tree"
code=$(block '<!-- readme-c-example -->' '```c')
assert_contains "$code" "int main(" "the program after <!-- readme-c-example -->"
commands=$(block '<!-- readme-c-uninstalled -->' '```sh')
assert_contains "$commands" "$PLACEHOLDER" "the commands after <!-- readme-c-uninstalled --> name the build directory"
assert_contains "$commands" "report.c" "the commands build report.c"
[ -n "$code" ] && [ -n "$commands" ] || die "nothing to build"
assert_file "$BUILD/lease-uninstalled.pc" "the build's lease-uninstalled.pc"

section "pkg-config takes the build tree for lease"
# A space in a path is escaped in the .pc as "\ " (as in lease.pc).
call env PKG_CONFIG_PATH="$BUILD" pkg-config --variable=includedir lease
expect_rc 0 "pkg-config --variable=includedir lease"
assert_eq "${OUT//\\ / }" "$SRC/include" "the include directory: the source tree's"
call env PKG_CONFIG_PATH="$BUILD" pkg-config --variable=libdir lease
assert_eq "${OUT//\\ / }" "$BUILD/lib" "the library directory: the build's"

section "run the commands"
work=$T/work
mkdir -p "$work" || die "mkdir"
printf '%s\n' "$code" >"$work/report.c"
script=${commands//"$PLACEHOLDER"/$(printf '%q' "$BUILD")}
for n in 1 2; do
    call env -C "$work" bash -c "set -euo pipefail; $script"
    expect_rc 0 "the README's commands for a build tree, run $n"
    assert_contains "$OUT" "wrote the report with token $n" "the program's lease, run $n"
done
assert_file "$work/report.db" "the SQLite store of the block's URL, in the working directory"
call env LD_LIBRARY_PATH="$BUILD/lib" ldd "$work/report"
assert_contains "$OUT" "$BUILD/lib/liblease.so.0" "the program loads the build's liblease"

finish
