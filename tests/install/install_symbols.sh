#!/usr/bin/env bash
# install_symbols: the ABI of liblease.so, built and installed. It exports
# exactly the public API under LEASE_0: every name matches ^lease_[a-z]
# (src/liblease.map keeps every dependency's symbols local), every function
# the public headers declare is exported, and nothing else is; the lease__
# internals the store modules call are under LEASE_PRIVATE, and nothing
# else; its SONAME is liblease.so.0. Each store module exports its entry
# point alone.
# Usage: install_symbols.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"
require nm

install_prefix

section "the functions the public headers declare"
# Preprocessed, so that comments, macros (LEASE_ERROR_MAP) and conditional
# parts are resolved as a C program sees them; then every "lease_name("
# that is left is a function declaration: the headers define no function,
# and a function pointer type reads "(*lease_name)(", which does not match.
printf '#include <lease.h>\n#include <lease/sys/store.h>\n' >"$T/headers.c"
call cc -E -P -I "$SRC/include" "$T/headers.c"
expect_rc 0 "cc -E of the public headers"
[ "$RC" = 0 ] || die "the public headers do not preprocess"
declared=$(printf '%s\n' "$OUT" | grep -oE '\blease_[a-z0-9_]+[[:space:]]*\(' |
    sed 's/[[:space:](]*$//' | sort -u)
ndeclared=$(printf '%s\n' "$declared" | grep -c .)
# A floor, so that a parse that finds next to nothing cannot pass.
assert_gt "$ndeclared" 40 "functions found in the public headers"
for f in lease_store_open lease_store_close lease_owner_new lease_acquire \
    lease_renew lease_release lease_fence_advance lease_fence_mark \
    lease_keeper_start lease_keeper_valid lease_keeper_stop lease_campaign \
    lease_errmsg lease_version lease_store_builtin lease_store_client_version \
    lease_backend_register lease_store_seterr; do
    assert_contains "$declared"$'\n' "$f"$'\n' "a function a C program uses is declared"
done

# check_exports FILE: the dynamic symbol table of one liblease.so.
check_exports() {
    local lib=$1 exported name bad missing extra soname
    section "exports of $lib"
    call nm -D --defined-only "$lib"
    expect_rc 0 "nm -D --defined-only"
    # "ADDRESS TYPE NAME@@LEASE_0"; the version nodes themselves are the
    # absolute symbols LEASE_0 and LEASE_PRIVATE.
    exported=$(printf '%s\n' "$OUT" | awk 'NF >= 3 { print $3 }' | grep '@@LEASE_0$' |
        sed 's/@.*//' | grep -vx 'LEASE_0' | sort -u)
    private=$(printf '%s\n' "$OUT" | awk 'NF >= 3 { print $3 }' | grep -v '@@LEASE_0$' |
        grep -vxE 'LEASE_0|LEASE_PRIVATE' | sort -u)
    bad=$(printf '%s\n' "$private" | grep -vE '^lease__[a-z_0-9]+@@LEASE_PRIVATE$' |
        grep . | head -n 20)
    assert_eq "$bad" "" "other exports than lease__*@@LEASE_PRIVATE (first 20)"
    # What the modules call: at least the error setter and the URL parser.
    assert_contains "$private" "lease__url_parse@@LEASE_PRIVATE" "the internals for modules"
    bad=$(printf '%s\n' "$exported" | grep -vE '^lease_[a-z]' | grep . | head -n 20)
    assert_eq "$bad" "" "exported names not matching ^lease_[a-z] (first 20)"
    missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported") | head -n 20)
    assert_eq "$missing" "" "functions declared in the public headers but not exported"
    extra=$(comm -13 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported") | head -n 20)
    assert_eq "$extra" "" "exported names no public header declares"

    call readelf -d "$lib"
    expect_rc 0 "readelf -d"
    soname=$(printf '%s\n' "$OUT" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
    assert_eq "$soname" "liblease.so.0" "SONAME"
}

check_exports "$BUILD/lib/liblease.so.$VERSION"
check_exports "$LIBDIR/liblease.so.0"

# The store modules (LEASE_STORE_MODULES): the entry point and nothing else.
section "exports of the store modules"
for m in "$LIBDIR"/lease/liblease-store-*.so; do
    [ -e "$m" ] || continue
    call nm -D --defined-only "$m"
    expect_rc 0 "nm -D --defined-only $m"
    assert_eq "$(printf '%s\n' "$OUT" | awk 'NF >= 3 { print $3 }' | sort -u)" \
        "lease__store_module_entry" "the exports of ${m##*/}"
done

finish
