#!/usr/bin/env bash
# install_modules: liblease.so loads the PostgreSQL, Redis and etcd stores
# from modules (<libdir>/lease/liblease-store-*.so) on first use, and the
# tool loads `agent` (lease-agent.so, with libmicrohttpd) for that command
# alone. Checked on the build tree's lease and on an install into a prefix,
# with the dynamic loader's own trace (LD_DEBUG=libs):
#  - --version and commands on an SQLite URL map no client library of
#    another store (libpq, hiredis, libcurl) nor libmicrohttpd; the
#    control: --version --verbose does map them, so the trace is read right;
#  - a redis:// URL maps the Redis module and hiredis, and nothing of the
#    other stores;
#  - with a module file removed from the install, its URL fails with exit 2
#    and a message naming the store and the missing file; --version says
#    "(not installed)"; the other stores still work.
# Usage: install_modules.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

STORES=$(lease_stores)
modular=0
if grep -q '^LEASE_STORE_MODULES:BOOL=ON$' "$BUILD/CMakeCache.txt"; then modular=1; fi
if [ "$modular" = 0 ]; then
    section "LEASE_STORE_MODULES is off in this build: every store is built in"
    finish
fi

install_prefix
INSTALLED_LEASE="$BINDIR/lease"
FOREIGN='libpq\.so|libhiredis\.so|libcurl\.so|libmicrohttpd\.so|libgnutls\.so|liblease-store-|lease-agent\.so'

# libs_of LEASE ARGS...: run it under LD_DEBUG=libs; the libraries the loader
# mapped ("calling init: PATH"), one a line, in $LIBS; its exit in $RC.
libs_of() {
    call env -u LD_LIBRARY_PATH LD_DEBUG=libs "$@"
    LIBS=$(printf '%s\n' "$ERR" | sed -n 's/.*calling init: //p' | sort -u)
}

db="sqlite://$T/mod.db"
# Under the install prefix as the library sees it: without symlinks.
LIBDIR=$(cd "$LIBDIR" && pwd -P) || die "no $LIBDIR"
n=0
for lease in "$BUILD/lease" "$INSTALLED_LEASE"; do
    n=$((n + 1))
    section "$lease: SQLite and --version map no other store's library"
    libs_of "$lease" --version
    expect_rc 0 "--version"
    assert_contains "$LIBS" "liblease.so.0" "the trace names what was mapped"
    assert_not_contains "$LIBS" "libpq" "--version"
    assert_eq "$(printf '%s\n' "$LIBS" | grep -E "$FOREIGN")" "" "--version maps none of them"
    for args in "acquire mod/$n --ttl 30s --json" "show mod/$n" "ls"; do
        # shellcheck disable=SC2086 # the words of args
        libs_of "$lease" --store "$db" $args
        expect_rc 0 "$args on SQLite"
        assert_eq "$(printf '%s\n' "$LIBS" | grep -E "$FOREIGN")" "" "$args maps none of them"
    done

    section "$lease: --version --verbose loads each module (the control)"
    libs_of "$lease" --version --verbose
    expect_rc 0 "--version --verbose"
    for s in postgres redis etcd kubernetes; do
        case ", $STORES," in *", $s,"*) ;; *) continue ;; esac
        assert_contains "$LIBS" "liblease-store-$s.so" "--version --verbose maps the $s module"
        assert_not_contains "$OUT" "$s: module" "--verbose prints the $s client library"
    done
    assert_contains "$LIBS" "libmicrohttpd.so" "--version --verbose maps libmicrohttpd"

    if has_store redis; then
        section "$lease: a redis:// URL maps the Redis module alone"
        libs_of "$lease" --store redis://127.0.0.1:1 ls
        expect_rc 6 "nothing listens on port 1"
        assert_contains "$LIBS" "liblease-store-redis.so" "the Redis module"
        assert_contains "$LIBS" "libhiredis.so" "hiredis"
        assert_eq "$(printf '%s\n' "$LIBS" | grep -E 'libpq\.so|libcurl\.so|libmicrohttpd\.so')" "" \
            "nothing of PostgreSQL, etcd or the agent"
    fi
done

section "a module that is not installed"
removed=
for s in redis postgres etcd; do
    if has_store "$s"; then removed=$s; break; fi
done
[ -n "$removed" ] || { section "no store module in this build"; finish; }
case $removed in
    redis) url=redis://127.0.0.1:1 ;;
    postgres) url=postgres://127.0.0.1:1/db ;;
    etcd) url=etcd://127.0.0.1:1 ;;
esac
module="$LIBDIR/lease/liblease-store-$removed.so"
assert_file "$module" "the $removed module installed"
rm -f "$module"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$url" ls
expect_rc 2 "a URL of a store whose module is missing"
assert_contains "$ERR" "the $removed store is a module that is not installed: no $module" \
    "the message names the store and the missing file"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --version
expect_rc 0 "--version without the module"
assert_contains "$OUT" "$removed: module $module (not installed)" "--version says so"
assert_contains "$OUT" "stores: $STORES" "the stores: line stays the build's"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --version --verbose
expect_rc 0 "--version --verbose without the module"
assert_contains "$OUT" "$removed: the $removed store is a module that is not installed" \
    "--version --verbose says so"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$db" ls
expect_rc 0 "SQLite without the module"

section "an agent module of another version"
# The tool hands the module its own structs: a module built with another
# version is refused before its cmd_agent runs (which would print "ran").
cat >"$T/agent_other.c" <<'EOF_C'
#include <stdio.h>
const char cli_agent_version[] = "0.0.0-other";
int cmd_agent(void *g, void *a) { (void)g; (void)a; puts("ran"); return 0; }
EOF_C
call cc -shared -fPIC -o "$LIBDIR/lease/lease-agent.so" "$T/agent_other.c"
expect_rc 0 "cc a stand-in agent module of another version"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$db" agent x --listen 127.0.0.1:1
expect_rc 1 "agent with a module of another version"
assert_contains "$ERR" "is not of lease" "the message says why"
assert_not_contains "$OUT" "ran" "the module's cmd_agent did not run"

section "the agent module not installed"
rm -f "$LIBDIR/lease/lease-agent.so"
call env -u LD_LIBRARY_PATH "$INSTALLED_LEASE" --store "$db" agent x --listen 127.0.0.1:1
expect_rc 1 "agent without its module"
assert_contains "$ERR" "lease agent: cannot load the agent module: " "the message"
assert_contains "$ERR" "lease-agent.so" "the message names the file"

finish
