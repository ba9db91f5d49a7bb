# common.sh - shared start of the install tests. Source it as:
#   . "$(dirname "$0")/common.sh" BUILD_DIR SOURCE_DIR
#
# It loads tests/cli/lib.sh (temp dir $T removed on exit, the assertions)
# with the build's own `lease`, and sets:
#   BUILD, SRC           the two arguments, absolute
#   PREFIX               "$T/pre fix": where install_prefix installs. The
#                        space is deliberate: lease.pc, the CMake package and
#                        the tool's run path must all survive it.
#   LIBDIR BINDIR INCLUDEDIR DOCDIR MANDIR
#                        the install directories under $PREFIX, as this
#                        build was configured (GNUInstallDirs)
#   CMAKE                the cmake that configured the build (ctest passes it)
# Every tool a test needs is required: a missing one fails the test.

BUILD=${1:?usage: $0 BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: $0 BUILD_DIR SOURCE_DIR}
BUILD=$(cd "$BUILD" && pwd) || exit 1
SRC=$(cd "$SRC" && pwd) || exit 1

. "$SRC/tests/cli/lib.sh" "$BUILD/lease"

# What the tests run must find the installed library by itself, never
# through a path the caller's environment happens to hold.
unset LD_LIBRARY_PATH LD_PRELOAD

CMAKE=${CMAKE:-cmake}
PREFIX="$T/pre fix"

# require TOOL...: fail (not skip) when a tool the test needs is missing.
require() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required by this test but was not found in PATH"
    done
}
require "$CMAKE" cc pkg-config readelf ldd

# cache_var NAME DEFAULT: a variable of the build's CMakeCache.txt.
cache_var() {
    local v
    v=$(sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -n 1)
    printf '%s\n' "${v:-$2}"
}

# An absolute install directory (a packaging setting) is not under the
# prefix; the tests install with --prefix only, so it must be relative.
install_dir() {
    local d
    d=$(cache_var "CMAKE_INSTALL_$1" "$2")
    case $d in
        /*) die "CMAKE_INSTALL_$1 is absolute ($d): these tests need it relative to the prefix" ;;
    esac
    printf '%s\n' "$PREFIX/$d"
}
LIBDIR=$(install_dir LIBDIR lib)
BINDIR=$(install_dir BINDIR bin)
INCLUDEDIR=$(install_dir INCLUDEDIR include)
DOCDIR=$(install_dir DOCDIR share/doc/lease)
MANDIR=$(install_dir MANDIR share/man)

# The project's version, from the header CMake reads it from.
VERSION=$(sed -n 's/^#define LEASE_VERSION_STRING "\(.*\)"$/\1/p' "$SRC/include/lease/version.h")
[ -n "$VERSION" ] || die "no LEASE_VERSION_STRING in $SRC/include/lease/version.h"

# install_prefix: cmake --install the build into $PREFIX. Installs of one
# build may run at once (ctest -j): each writes only under its own prefix.
install_prefix() {
    section "cmake --install $BUILD --prefix '$PREFIX'"
    call "$CMAKE" --install "$BUILD" --prefix "$PREFIX"
    expect_rc 0 "cmake --install into a prefix with a space"
    [ "$RC" = 0 ] || die "the install failed; nothing else can be checked"
    assert_file "$LIBDIR/pkgconfig/lease.pc" "lease.pc installed"
}

# Only the installed lease.pc, and the system's for liblease's own
# dependencies: never a lease.pc of the system or of another prefix.
use_installed_pc() {
    export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
    if pkg-config --exists lease; then pass; else
        die "pkg-config does not find lease with PKG_CONFIG_PATH=$PKG_CONFIG_PATH: $(pkg-config --print-errors --exists lease 2>&1)"
    fi
}

# pc_words VAR ARGS...: the output of `pkg-config ARGS` split into the
# array VAR as the shell would read it. lease.pc escapes a space of the
# prefix as "\ ", so plain $(pkg-config ...) would split the path in two:
# eval keeps "pre\ fix" one word.
pc_words() {
    local var=$1 out
    shift
    out=$(pkg-config "$@") || die "pkg-config $* failed"
    eval "$var=($out)"
}

# loaded_liblease PROGRAM: the path of the liblease.so.0 the dynamic loader
# picks for PROGRAM (empty if none), as ldd reports it.
loaded_liblease() {
    ldd "$1" 2>/dev/null | sed -n 's/^[[:space:]]*liblease\.so\.0 => \(.*\) (0x[0-9a-f]*)$/\1/p'
}

# expect_installed_liblease PROGRAM DESCRIPTION: PROGRAM loads the
# installed liblease, not the build's or a system copy.
expect_installed_liblease() {
    local lib
    lib=$(loaded_liblease "$1")
    if [ -z "$lib" ]; then
        fail "$2: ldd finds no liblease.so.0 for $1: $(ldd "$1" 2>&1 | head -c 800)"
        return
    fi
    if [ "$(readlink -f "$lib")" = "$(readlink -f "$LIBDIR/liblease.so.0")" ]; then pass; else
        fail "$2: loads $lib, not the installed $LIBDIR/liblease.so.0"
    fi
}

# The consumer program of the pkg-config, CMake and static tests.
APP_C="$SRC/tests/install/consumer/app.c"
