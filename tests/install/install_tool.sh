#!/usr/bin/env bash
# install_tool: install into a prefix with a space, then check what was
# installed: the list of files a C team and a user need, the installed
# `lease` (no LD_LIBRARY_PATH: it finds the liblease beside it through its
# run path) with the stores of this build, acquire and release on SQLite,
# `lease help`, the .load line of `lease fence-sql sqlite` (the installed
# extension, loaded by sqlite3 as printed), and every installed man page
# rendering without a warning.
# Usage: install_tool.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

install_prefix
INSTALLED_LEASE="$BINDIR/lease"

section "the installed files"
for f in "$INCLUDEDIR/lease.h" "$INCLUDEDIR/lease/version.h" \
    "$LIBDIR/liblease.so.0" "$LIBDIR/liblease.a" "$LIBDIR/pkgconfig/lease.pc" \
    "$LIBDIR/cmake/lease/leaseConfig.cmake" "$LIBDIR/cmake/lease/leaseConfigVersion.cmake" \
    "$DOCDIR/README.md" "$INSTALLED_LEASE"; do
    assert_file "$f" "installed"
done
# The store modules and the agent (LEASE_STORE_MODULES), under <libdir>/lease.
if grep -q '^LEASE_STORE_MODULES:BOOL=ON$' "$BUILD/CMakeCache.txt"; then
    assert_file "$LIBDIR/lease/lease-agent.so" "the agent module installed"
    for s in postgres redis etcd kubernetes; do
        if has_store "$s"; then
            assert_file "$LIBDIR/lease/liblease-store-$s.so" "the $s store module installed"
        fi
    done
fi
# Every public header, not only the two named above.
for h in $(cd "$SRC/include" && find . -name '*.h' | sort); do
    assert_file "$INCLUDEDIR/${h#./}" "public header installed"
done
# liblease.so.0 is the soname link to the real file, liblease.so.VERSION.
link=$(readlink "$LIBDIR/liblease.so.0")
assert_eq "$link" "liblease.so.$VERSION" "lib/liblease.so.0 is a symlink to the versioned library"
assert_file "$LIBDIR/$link" "the target of liblease.so.0"
if [ -f "$LIBDIR/$link" ] && [ ! -L "$LIBDIR/$link" ]; then pass; else
    fail "$LIBDIR/$link is not a regular file"
fi

section "lease --version"
expect_installed_liblease "$INSTALLED_LEASE" "the installed lease's liblease"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --version
expect_rc 0 "installed lease --version"
installed_version=$OUT
call "$BUILD/lease" --version
expect_rc 0 "the build's lease --version"
built_version=$OUT
assert_contains "$installed_version" "lease $VERSION (liblease $VERSION)" "the tool's and the library's version"
stores=$(printf '%s\n' "$installed_version" | sed -n 's/^stores: //p')
assert_match "$stores" '^sqlite(, [a-z]+)*$' "the stores: line"
assert_eq "$stores" "$(printf '%s\n' "$built_version" | sed -n 's/^stores: //p')" \
    "the installed lease's stores are the build's"
# Each store of the line reports the client library it was linked with.
IFS=', ' read -r -a store_list <<<"$stores"
for s in ${store_list[@]+"${store_list[@]}"}; do
    assert_match "$installed_version" "(^|"$'\n'")$s: [^"$'\n'"]+" "the client library of the store $s"
done

section "acquire and release on SQLite"
db="sqlite://$T/tool.db"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$db" acquire install/tool --ttl 30s --json
expect_rc 0 "installed lease acquire"
owner=$(jget "$OUT" .owner)
token=$(jget "$OUT" .token)
assert_match "$owner" "$UUID_RE" "the owner"
assert_gt "$token" 0 "the fencing token"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$db" release install/tool --owner "$owner" --token "$token"
expect_rc 0 "installed lease release"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$db" show install/tool --json
expect_rc 0 "installed lease show"
assert_eq "$(jget "$OUT" .state)" "free" "the key after the release"

section "lease help"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" help
expect_rc 0 "installed lease help"
assert_contains "$OUT" "usage: lease" "lease help"

section "lease fence-sql sqlite: the installed extension's path"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" fence-sql sqlite
expect_rc 0 "installed lease fence-sql sqlite"
assert_file "$LIBDIR/liblease_sqlite_fence.so" "the SQLite fencing extension installed"
load=$(printf '%s\n' "$OUT" | sed -n 's/^--     \(\.load .*\)$/\1/p')
assert_contains "$load" "$LIBDIR/liblease_sqlite_fence" "the .load line names the installed extension"
# As printed: the prefix's space has the path quoted for the shell.
call sqlite3 "$T/fence.db" ".bail on" "$load" "SELECT lease_fence('r', 3);"
expect_rc 0 "sqlite3 runs the printed .load line"
assert_eq "$OUT" 3 "the installed extension's lease_fence"

section "man pages"
# Built (scdoc was found) means installed, each rendering cleanly.
if [ -e "$BUILD/docs/man/lease.1" ]; then
    require man
    for page in man1/lease.1 man3/liblease.3 man7/lease-stores.7; do
        assert_file "$MANDIR/$page" "man page installed"
        # man -l formats the file alone; --warnings has groff report
        # every problem on stderr.
        call env LC_ALL=C.UTF-8 MANWIDTH=80 MANPAGER=cat PAGER=cat \
            man --warnings -l "$MANDIR/$page"
        expect_rc 0 "man -l $page"
        assert_eq "$ERR" "" "warnings of man -l $page"
        assert_ne "$OUT" "" "the text of $page"
    done
else
    section "no man pages in this build ($BUILD/docs/man/lease.1): scdoc was not found or LEASE_MAN=OFF"
    assert_no_file "$MANDIR/man1/lease.1" "no man page installed when none was built"
fi

finish
