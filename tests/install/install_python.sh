#!/usr/bin/env bash
# install_python: the Python package, installed. cmake --install into a
# prefix with a space puts python/lease/*.py and py.typed, as they are in
# the source tree and nothing else, into <prefix>/lib/python3/dist-packages/
# lease (LEASE_PYTHON_DIR); then Debian's python3, run outside the source
# tree with PYTHONPATH and LD_LIBRARY_PATH pointing into the prefix and no
# LEASE_LIBRARY, imports the installed package (not python/lease of the
# source tree), loads the installed liblease.so.0 by its soname, and
# acquires, shows and releases a lease on SQLite.
# Usage: install_python.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

# Debian's interpreter, the one the package's directory is laid out for (a
# python3 earlier on PATH, e.g. pyenv's, is another installation).
PY=/usr/bin/python3
[ -x "$PY" ] || die "$PY is required by this test (Debian package python3)"

# LEASE_PYTHON_DIR, as install_dir reads the GNU directories.
d=$(cache_var LEASE_PYTHON_DIR lib/python3/dist-packages)
case $d in
    /*) die "LEASE_PYTHON_DIR is absolute ($d): this test needs it relative to the prefix" ;;
esac
PYDIR="$PREFIX/$d"
PKGDIR="$PYDIR/lease"

install_prefix

section "the installed package: the source tree's modules and py.typed"
want=$(cd "$SRC/python/lease" && find . -maxdepth 1 -type f \( -name '*.py' -o -name py.typed \) |
    sed 's|^\./||' | sort)
assert_contains "$want" "__init__.py" "the source tree's package has __init__.py"
assert_contains "$want" "py.typed" "the source tree's package has py.typed"
for f in $want; do
    assert_file "$PKGDIR/$f" "installed"
    if cmp -s "$SRC/python/lease/$f" "$PKGDIR/$f"; then pass; else
        fail "$PKGDIR/$f differs from $SRC/python/lease/$f"
    fi
done
# Nothing else: no tests, no __pycache__ (Debian byte-compiles at install).
got=$(cd "$PKGDIR" 2>/dev/null && find . -mindepth 1 | sed 's|^\./||' | sort)
assert_eq "$got" "$want" "the files under $PKGDIR"

section "import lease from the prefix, acquire and release on SQLite"
# Run from an empty directory, so that neither the current directory nor
# the script's location puts the source tree's python/ on sys.path; the
# environment is cleared of what could point elsewhere.
work="$T/py"
mkdir -p "$work" || die "mkdir"
db="sqlite://$T/python.db"
script='
import json, os, sys
import lease
with lease.open(sys.argv[1]) as store:
    g = store.acquire("install/python", ttl=30, label="installed")
    held = store.show("install/python").state
    store.release(g)
    free = store.show("install/python").state
maps = set()
with open("/proc/self/maps") as f:
    for line in f:
        fields = line.split(None, 5)
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("liblease.so"):
            maps.add(fields[5].strip())
print(json.dumps({"file": lease.__file__, "version": lease.library_version(),
                  "token": g.token, "held": held, "free": free,
                  "libs": sorted(maps)}))
'
call env -u LEASE_LIBRARY -u LEASE_STORE -u PYTHONHOME -u PYTHONSTARTUP \
    PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH="$PYDIR" LD_LIBRARY_PATH="$LIBDIR" \
    bash -c 'cd "$1" && shift && exec "$@"' run "$work" "$PY" -c "$script" "$db"
expect_rc 0 "python3 -c 'import lease ...' with PYTHONPATH and LD_LIBRARY_PATH into the prefix"
PYOUT=$OUT
file=$(jget "$OUT" .file)
assert_eq "$(readlink -f "$file")" "$(readlink -f "$PKGDIR/__init__.py")" \
    "lease.__file__ is the installed package's, not the source tree's"
assert_not_contains "$file" "$SRC/python" "lease.__file__"
assert_eq "$(jget "$OUT" .version)" "$VERSION" "lease.library_version()"
assert_gt "$(jget "$OUT" .token)" 0 "the fencing token"
assert_eq "$(jget "$OUT" .held)" held "the key after acquire"
assert_eq "$(jget "$OUT" .free)" free "the key after release"
# The one liblease the process mapped is the prefix's, found by soname.
assert_eq "$(jget "$OUT" '.libs | length')" 1 "liblease files mapped"
assert_eq "$(readlink -f "$(jget "$OUT" '.libs[0]')")" "$(readlink -f "$LIBDIR/liblease.so.0")" \
    "the liblease python3 loaded"

section "the store the package wrote is the tool's"
call env -u LD_LIBRARY_PATH "$BINDIR/lease" --store "$db" show install/python --json
expect_rc 0 "the installed lease show"
assert_eq "$(jget "$OUT" .state)" free "the key, seen by the tool"
assert_eq "$(jget "$OUT" .token)" "$(jget "$PYOUT" .token)" "the key's token, the package's grant's"

finish
