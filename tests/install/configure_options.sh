#!/usr/bin/env bash
# configure_options: the optional stores' configure options on a machine
# without libpq. pkg-config is limited to copies of the .pc files of the
# libraries liblease always needs, so libpq, hiredis and libcurl are
# missing whatever this machine has. Then:
#   -DLEASE_WITH_POSTGRES=ON    fails, naming the package to install;
#   -DLEASE_WITH_POSTGRES=AUTO  succeeds without the store, and says so;
#   -DLEASE_WITH_REDIS=bogus    fails.
# Each is a fresh configure of the source tree in its own directory; nothing
# is built or installed (a configure is what is under test).
# Usage: configure_options.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

section "a pkg-config that sees only sqlite3, uuid, jansson, libmicrohttpd"
# With the modules they require themselves (libmicrohttpd needs gnutls,
# which needs nettle ...): without those pkg-config would refuse
# libmicrohttpd too.
pcdir="$T/pkgconfig"
mkdir -p "$pcdir" || die "mkdir"
todo=(sqlite3 uuid jansson libmicrohttpd)
copied=" "
while [ ${#todo[@]} -gt 0 ]; do
    m=${todo[0]}
    todo=("${todo[@]:1}")
    case $copied in *" $m "*) continue ;; esac
    d=$(pkg-config --variable=pcfiledir "$m") || die "pkg-config does not find $m, which the build needs"
    cp "$d/$m.pc" "$pcdir/" || die "cp $d/$m.pc"
    copied="$copied$m "
    # "name [op version]" per line: the name is the first word.
    for r in $(pkg-config --print-requires --print-requires-private "$m" | awk '{ print $1 }'); do
        todo+=("$r")
    done
done
for m in libpq hiredis libcurl; do
    assert_not_contains "$copied" " $m " "the copied modules"
done

# PKG_CONFIG_PATH is searched before PKG_CONFIG_LIBDIR: unset, or the
# system's directories would come back through it.
limited=(env -u PKG_CONFIG_PATH -u PKG_CONFIG_SYSROOT_DIR "PKG_CONFIG_LIBDIR=$pcdir")
call "${limited[@]}" pkg-config --exists libpq
expect_rc 1 "libpq is invisible to the limited pkg-config"
call "${limited[@]}" pkg-config --exists sqlite3 uuid jansson libmicrohttpd
expect_rc 0 "the libraries liblease always needs are visible"

# configure NAME OPTIONS...: configure the source tree in $T/NAME, in the
# environment PKGENV (the limited pkg-config, unless changed). The tests
# (cmocka) and the man pages (scdoc) are off: neither is about the stores,
# and cmocka's .pc is not among the four.
configure() {
    local name=$1
    shift
    call "${PKGENV[@]}" "$CMAKE" -S "$SRC" -B "$T/$name" -DLEASE_TESTS=OFF -DLEASE_MAN=OFF "$@"
    CONFIGURE_LOG="$OUT"$'\n'"$ERR"
}
PKGENV=("${limited[@]}")

section "-DLEASE_WITH_POSTGRES=ON without libpq fails"
configure pg-on -DLEASE_WITH_POSTGRES=ON
assert_ne "$RC" 0 "configure with LEASE_WITH_POSTGRES=ON and no libpq: exit status"
assert_contains "$CONFIGURE_LOG" "libpq-dev" "the error names the Debian package"
assert_contains "$CONFIGURE_LOG" "LEASE_WITH_POSTGRES=ON" "the error names the option"

section "-DLEASE_WITH_POSTGRES=AUTO without libpq succeeds without the store"
configure pg-auto -DLEASE_WITH_POSTGRES=AUTO
expect_rc 0 "configure with LEASE_WITH_POSTGRES=AUTO and no libpq"
assert_contains "$CONFIGURE_LOG" "store postgres: off (libpq not found; install libpq-dev)" "the configure output"
# No libpq, hiredis or libcurl: the SQLite store alone.
assert_contains "$CONFIGURE_LOG" "lease $VERSION: stores sqlite"$'\n' "the stores of this configuration"

section "the default configure without cmocka: no tests, and says so"
# A user's plain `cmake -B build` must work on a machine without
# libcmocka-dev (the limited pkg-config has no cmocka.pc): AUTO leaves the
# tests out and says how to get them; ON fails.
call "${PKGENV[@]}" "$CMAKE" -S "$SRC" -B "$T/tests-auto" -DLEASE_MAN=OFF
expect_rc 0 "configure with the default LEASE_TESTS (AUTO) and no cmocka"
assert_contains "$OUT" "tests: off (cmocka not found; install libcmocka-dev)" "the configure output"
call "${PKGENV[@]}" "$CMAKE" -S "$SRC" -B "$T/tests-on" -DLEASE_MAN=OFF -DLEASE_TESTS=ON
assert_ne "$RC" 0 "configure with LEASE_TESTS=ON and no cmocka: exit status"

section "-DLEASE_WITH_REDIS=bogus fails"
# With the system's pkg-config: were the value not checked, it would be
# taken for ON and pass wherever hiredis is installed; with hiredis hidden
# it would fail anyway, for the wrong reason.
PKGENV=(env)
configure redis-bogus -DLEASE_WITH_REDIS=bogus
assert_ne "$RC" 0 "configure with LEASE_WITH_REDIS=bogus: exit status"
assert_contains "$CONFIGURE_LOG" "LEASE_WITH_REDIS=bogus" "the error names the bad value"
assert_contains "$CONFIGURE_LOG" "ON, OFF or AUTO" "the error says what is allowed"

finish
