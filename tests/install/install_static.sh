#!/usr/bin/env bash
# install_static: install into a prefix with a space, then link the consumer
# program against the installed liblease.a with what lease.pc says a static
# link of liblease needs, and check that the result does not need
# liblease.so.0 and runs.
# Usage: install_static.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

install_prefix
use_installed_pc
assert_file "$LIBDIR/liblease.a" "liblease.a installed"

section "link liblease.a"
# liblease.a itself, then its dependencies as shared libraries: the modules
# lease.pc requires privately and lease.pc's own Libs.private. Not
# `pkg-config --static --libs lease` whole: that asks for the static
# dependencies of those libraries too (libpq's -lpgcommon, for one), which
# a distribution need not ship, and it is liblease being static that
# matters here.
pc_words cflags --static --cflags lease
requires=$(pkg-config --print-requires-private lease) || die "pkg-config --print-requires-private lease failed"
assert_contains " $(printf '%s ' $requires)" " sqlite3 " "lease.pc's Requires.private names the SQLite store's library"
pc_words deplibs --libs $requires
read -r -a own_private <<<"$(sed -n 's/^Libs\.private:[[:space:]]*//p' "$LIBDIR/pkgconfig/lease.pc")"
call cc -std=c11 -Wall -Wextra -Werror -o "$T/app-static" "$APP_C" "${cflags[@]}" \
    "$LIBDIR/liblease.a" "${deplibs[@]}" ${own_private[@]+"${own_private[@]}"}
expect_rc 0 "cc app.c \$(pkg-config --static --cflags lease) liblease.a + its private libs"
[ "$RC" = 0 ] || die "the static link failed"

section "no liblease.so.0 needed"
call readelf -d "$T/app-static"
expect_rc 0 "readelf -d"
assert_not_contains "$OUT" "liblease" "the static program's dynamic section (NEEDED, RUNPATH)"
assert_eq "$(loaded_liblease "$T/app-static")" "" "ldd of the static program"

section "run it"
call env -u LD_LIBRARY_PATH "$T/app-static" "sqlite://$T/static.db"
expect_rc 0 "open, acquire, release with liblease linked in"
assert_contains "$OUT" "liblease $VERSION (headers $VERSION)" "lease_version() and LEASE_VERSION_STRING"
token=$(printf '%s\n' "$OUT" | sed -n 's/^token //p')
assert_gt "${token:-0}" 0 "the fencing token"

finish
