#!/usr/bin/env bash
# install_pkgconfig: install into a prefix with a space, then build a C
# program with the installed lease.pc alone and run it with no
# LD_LIBRARY_PATH: it must find the installed liblease through the run path
# taken from pkg-config, open an SQLite store, acquire, release, and report
# the version of the headers and of the library.
# Usage: install_pkgconfig.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

install_prefix
use_installed_pc

section "lease.pc"
call pkg-config --modversion lease
expect_rc 0 "pkg-config --modversion lease"
assert_eq "$OUT" "$VERSION" "lease.pc's Version"
call pkg-config --variable=prefix lease
assert_eq "$OUT" "${PREFIX// /\\ }" "lease.pc's prefix is the install's, its space escaped"

section "compile and link with pkg-config"
# The form that works with a space in the prefix: the output of pkg-config
# read by eval into an array, so that "pre\ fix" stays one word (pc_words
# in common.sh does `eval "flags=($(pkg-config --cflags --libs lease))"`).
# The libdir, for the run path, is escaped the same way.
pc_words pcflags --cflags --libs lease
pc_words libdir --variable=libdir lease
assert_eq "${#libdir[@]}" 1 "words in pkg-config --variable=libdir lease"
assert_eq "${libdir[0]-}" "$LIBDIR" "pkg-config --variable=libdir lease"
call cc -std=c11 -Wall -Wextra -Werror -o "$T/app" "$APP_C" "${pcflags[@]}" -Wl,-rpath,"${libdir[0]-}"
expect_rc 0 "cc app.c \$(pkg-config --cflags --libs lease) against the installed prefix"
[ "$RC" = 0 ] || die "the program did not build"

section "run with LD_LIBRARY_PATH unset"
expect_installed_liblease "$T/app" "the program's liblease"
call env -u LD_LIBRARY_PATH "$T/app" "sqlite://$T/pkgconfig.db"
expect_rc 0 "open, acquire, release through the installed library"
assert_contains "$OUT" "liblease $VERSION (headers $VERSION)" "lease_version() and LEASE_VERSION_STRING"
token=$(printf '%s\n' "$OUT" | sed -n 's/^token //p')
assert_gt "${token:-0}" 0 "the fencing token"

finish
