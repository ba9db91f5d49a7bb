#!/usr/bin/env bash
# deb_build.sh - the Debian packages of debian/, built the way a packager
# builds them and checked the way a user gets them.
#
#   deb_build.sh LEASE_BINARY SOURCE_DIR
#
# 1. Copies SOURCE_DIR (what git would commit: tracked files and untracked
#    ones that are not ignored, so no build directory) into a temporary
#    directory and runs `dpkg-buildpackage -b -us -uc` there. The build must
#    be clean: no compiler, debhelper or dpkg warning (a dpkg-gensymbols
#    warning means debian/liblease0.symbols is out of date).
# 2. Checks the control fields and the file lists of liblease0, liblease-dev,
#    lease and python3-lease: each file in the package a user expects it in,
#    none in two.
# 3. Asks apt whether liblease0 and python3-lease would install on this
#    machine (apt-get -s: their dependencies met, nothing changed).
# 4. Unpacks them with `dpkg -x` into an empty directory (nothing is
#    installed on this machine) and uses them from there: the SONAME, the
#    packaged `lease` with every store against an SQLite file, its man pages,
#    a C program built with the packaged lease.pc (shared and static)
#    and with the packaged CMake package, and Debian's python3 importing the
#    packaged lease, which loads the packaged liblease.so.0 by its soname.
#
# LEASE_BINARY is the build tree's `lease`, which lib.sh wants up front;
# every check runs the packaged one. Fails, never skips, when a tool is
# missing (scripts/deps.sh installs them).

. "$(dirname "$0")/../cli/lib.sh" "$@"

SRC=${2:?usage: $0 LEASE_BINARY SOURCE_DIR}
SRC=$(cd "$SRC" && pwd) || die "source directory '$2' not found"
CC=${CC:-cc}
# Bound on dpkg-buildpackage: it takes about a minute on two cores, and
# ctest's own timeout for the whole test is 900 s.
BUILD_TIMEOUT=${LEASE_DEB_BUILD_TIMEOUT:-600}

section "tools"
for tool in dpkg-buildpackage dh dpkg-deb dpkg-parsechangelog dpkg-architecture \
    dpkg readelf ldd pkg-config "$CC" cmake man gzip apt-get /usr/bin/python3; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "'$tool' not found: scripts/deps.sh installs what this test needs (debhelper, dpkg-dev, man-db ...)"
done
pass

section "copy of the source tree"
# dpkg-buildpackage writes the packages into the parent of the tree.
OUTDIR=$T/debs
PKG=$OUTDIR/lease
mkdir -p "$PKG" || die "mkdir $PKG"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # A tracked file deleted in the working tree is left out, as a commit of
    # that tree would leave it out.
    (cd "$SRC" && git ls-files -co --exclude-standard -z |
        while IFS= read -r -d '' f; do
            if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
        done | xargs -0 -r cp -a --parents -t "$PKG") ||
        die "copying the files git lists in $SRC failed"
else
    # No git: everything but build directories (build*, and dpkg's obj-*).
    shopt -s dotglob
    for f in "$SRC"/*; do
        case ${f##*/} in build* | obj-* | .git) continue ;; esac
        cp -a "$f" "$PKG"/ || die "copying $f failed"
    done
    shopt -u dotglob
fi
assert_file "$PKG/debian/control" "the copy has debian/"
assert_file "$PKG/CMakeLists.txt" "the copy has the sources"
[ -e "$PKG/debian/control" ] || die "no debian/ directory to build from"

VERSION=$(dpkg-parsechangelog -l "$PKG/debian/changelog" -SVersion) ||
    die "debian/changelog: no version"
UPSTREAM=${VERSION%-*}
ARCH=$(dpkg-architecture -qDEB_HOST_ARCH)
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
echo "version $VERSION, $ARCH ($MULTIARCH)"

section "dpkg-buildpackage -b -us -uc"
t0=$(date +%s)
# Started from `make test`, the caller's make flags would hand the package
# build a jobserver it cannot reach; parallel=2 sets its own -j.
(cd "$PKG" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
    DEB_BUILD_OPTIONS="parallel=2 nocheck" \
    timeout -k 10 "$BUILD_TIMEOUT" dpkg-buildpackage -b -us -uc) >"$T/build.log" 2>&1
rc=$?
echo "dpkg-buildpackage: exit $rc after $(($(date +%s) - t0)) s"
if [ "$rc" -ne 0 ]; then
    tail -n 80 "$T/build.log" >&2
    [ "$rc" = 124 ] && echo "(timeout(1): still running after $BUILD_TIMEOUT s)" >&2
    die "dpkg-buildpackage failed (exit $rc); the end of its log is above"
fi
pass
# "warning:" in lower case is what gcc, ld and the dpkg tools write (CMake's
# own "CMake Warning:" about the variables debhelper always passes is not).
warnings=$(grep -E '(^|[^[:alnum:]_])warning:' "$T/build.log")
if [ -z "$warnings" ]; then pass; else
    fail "the package build has warnings:
$(grep -E -A25 '(^|[^[:alnum:]_])warning:' "$T/build.log" | head -n 80)"
    case $warnings in *dpkg-gensymbols*)
        echo "(dpkg-gensymbols: copy the diff's + lines into debian/liblease0.symbols, with the upstream version that brings them, e.g. $UPSTREAM)" >&2 ;;
    esac
fi

declare -A DEB
for p in liblease0 liblease-dev lease; do
    DEB[$p]=$OUTDIR/${p}_${VERSION}_${ARCH}.deb
done
# Pure Python: one package for every architecture.
DEB[python3-lease]=$OUTDIR/python3-lease_${VERSION}_all.deb
PACKAGES=(liblease0 liblease-dev lease python3-lease)
for p in "${PACKAGES[@]}"; do
    assert_file "${DEB[$p]}" "package $p was built"
done
for p in "${PACKAGES[@]}"; do
    [ -e "${DEB[$p]}" ] || die "not every package was built: $(ls "$OUTDIR")"
done

section "control fields"
field() { dpkg-deb -f "${DEB[$1]}" "$2"; }
# dep_names DEPENDS: the package names of a Depends field, one a line.
dep_names() {
    printf '%s\n' "$1" | tr ',|' '\n\n' | sed -E 's/^ *//; s/[ :(].*//' | grep .
}
for p in "${PACKAGES[@]}"; do
    assert_eq "$(field "$p" Package)" "$p" "$p: Package"
    assert_eq "$(field "$p" Version)" "$VERSION" "$p: Version"
done
for p in liblease0 liblease-dev lease; do
    assert_eq "$(field "$p" Architecture)" "$ARCH" "$p: Architecture"
done
assert_eq "$(field python3-lease Architecture)" all "python3-lease: Architecture"
assert_eq "$(field python3-lease Section)" python "python3-lease: Section"
assert_eq "$(field liblease0 Section)" "libs" "liblease0: Section"
assert_eq "$(field liblease-dev Section)" "libdevel" "liblease-dev: Section"
dev_depends=$(field liblease-dev Depends)
assert_contains "$dev_depends" "liblease0 (= $VERSION)" \
    "liblease-dev depends on exactly its liblease0"
# The shlibs (from debian/liblease0.symbols) give lease its dependency.
assert_match "$(field lease Depends)" "(^|, )liblease0 \(>= [^)]+\)" \
    "lease depends on liblease0 through its shlibs"
# python3-lease: Debian's python3 (${python3:Depends}, from dh_python3),
# and the liblease0 of this very version, a binNMU of it included.
py_depends=$(field python3-lease Depends)
assert_contains "$(dep_names "$py_depends")" "python3" "python3-lease depends on python3"
assert_contains "$py_depends" "liblease0 (>= $VERSION)" "python3-lease: liblease0 of this version"
assert_contains "$py_depends" "liblease0 (<< $VERSION.1~)" "python3-lease: liblease0 of this version"
# dh_python3 byte-compiles the package when it is installed, and removes
# the byte code when it is removed.
assert_contains "$(dpkg-deb -I "${DEB[python3-lease]}" postinst 2>&1)" "py3compile" \
    "python3-lease's postinst byte-compiles"
assert_contains "$(dpkg-deb -I "${DEB[python3-lease]}" prerm 2>&1)" "py3clean" \
    "python3-lease's prerm removes the byte code"
assert_match "$(dpkg-deb -I "${DEB[liblease0]}" shlibs 2>&1)" \
    "^liblease 0 liblease0( |$)" "liblease0 has a shlibs file for liblease.so.0"
assert_match "$(dpkg-deb -I "${DEB[liblease0]}" symbols 2>&1)" \
    "^liblease\.so\.0 liblease0 #MINVER#" "liblease0 has a symbols file"

section "file lists"
# contents PACKAGE: the files and symlinks of a .deb, without "./", no
# directories.
contents() {
    dpkg-deb -c "${DEB[$1]}" | awk '{print $6}' | sed 's|^\./||' | grep -v -e '^$' -e '/$'
}
declare -A FILES
for p in "${PACKAGES[@]}"; do
    FILES[$p]=$(contents "$p")
done
# has PACKAGE PATH DESCRIPTION: PATH (or PATH.gz: dh_compress decides) is
# in PACKAGE.
has() {
    if printf '%s\n' "${FILES[$1]}" | grep -qxF -e "$2" -e "$2.gz"; then pass; else
        fail "$3: $2 is not in $1, which has:
$(printf '%s\n' "${FILES[$1]}" | sed 's/^/    /')"
    fi
}
LIBDIR=usr/lib/$MULTIARCH
has liblease0 "$LIBDIR/liblease.so.0" "the SONAME link"
has liblease0 "$LIBDIR/liblease.so.$UPSTREAM" "the shared library"
# The store modules liblease.so.0 loads on first use (src/core/store.c).
for m in postgres redis etcd kubernetes; do
    has liblease0 "$LIBDIR/lease/liblease-store-$m.so" "the $m store module"
done
# The runtime package holds the shared library, its store modules and its
# Debian docs, nothing else: the .so link, a header or the .pc there would
# make two versions of liblease0 impossible to install side by side and
# pull -dev files into every system that runs lease.
extra=$(printf '%s\n' "${FILES[liblease0]}" |
    grep -vE "^($LIBDIR/liblease\.so\.0(\..*)?|$LIBDIR/lease/liblease-store-[a-z]+\.so|usr/share/doc/liblease0/.*)$")
assert_eq "$extra" "" "liblease0 holds only liblease.so.0* and the store modules"

has liblease-dev "$LIBDIR/liblease.so" "the link the linker uses (-llease)"
has liblease-dev "$LIBDIR/liblease.a" "the static library"
has liblease-dev "$LIBDIR/pkgconfig/lease.pc" "the pkg-config file"
for f in leaseConfig.cmake leaseConfigVersion.cmake leaseTargets.cmake; do
    has liblease-dev "$LIBDIR/cmake/lease/$f" "the CMake package"
done
has liblease-dev "usr/share/man/man3/liblease.3" "liblease(3)"
# Every public header of the source tree.
while IFS= read -r h; do
    has liblease-dev "usr/include/${h#"$PKG"/include/}" "a public header"
done < <(find "$PKG/include" -name '*.h' | sort)

has lease usr/bin/lease "the tool"
has lease "$LIBDIR/lease/lease-agent.so" "lease agent, loaded by the tool for that command"
# The resource-side kits (docs/fencing.md): the SQL and the Redis library,
# the SQLite extension for `.load`, and its static library for linking.
has lease usr/share/lease/fence.sql "the PostgreSQL fencing kit"
has lease usr/share/lease/lease_fence.lua "the Redis fencing library"
has lease "$LIBDIR/liblease_sqlite_fence.so" "the SQLite fencing extension"
has liblease-dev "$LIBDIR/liblease_sqlite_fence_static.a" "the SQLite fencing kit to link"
has lease usr/share/man/man1/lease.1 "lease(1)"
has lease usr/share/man/man7/lease-stores.7 "lease-stores(7)"
has lease usr/share/bash-completion/completions/lease "the bash completion"
# The zsh completion, if the project has one (a file starting "#compdef").
if grep -lqs '^#compdef' "$PKG"/completion/*; then
    if printf '%s\n' "${FILES[lease]}" | grep -qE '^usr/share/zsh/.+/_lease$'; then pass; else
        fail "the project has a zsh completion, lease has none under usr/share/zsh"
    fi
fi
has lease usr/share/doc/lease/README.md "the README"
for f in "$PKG"/docs/*.md; do
    has lease "usr/share/doc/lease/${f##*/}" "the documentation"
done
for f in "$PKG"/examples/*.c; do
    has lease "usr/share/doc/lease/examples/${f##*/}" "the examples"
done
# The Python package where Debian's python3 looks (on its sys.path): every
# module of the source tree and py.typed; nothing else but its Debian docs
# (no byte code: dh_python3 compiles at install).
PYDIR=usr/lib/python3/dist-packages
call /usr/bin/python3 -c 'import sys; print("\n".join(sys.path))'
expect_rc 0 "python3: sys.path"
assert_match "$OUT" "(^|"$'\n'")/$PYDIR($|"$'\n'")" "/$PYDIR is on Debian's python3's sys.path"
py_want=$(cd "$PKG/python/lease" && ls -- *.py py.typed | sed "s|^|$PYDIR/lease/|" | sort)
assert_contains "$py_want" "$PYDIR/lease/__init__.py" "the source tree's package"
for f in $py_want; do
    has python3-lease "$f" "the Python package"
done
extra=$(printf '%s\n' "${FILES[python3-lease]}" |
    grep -vxF -f <(printf '%s\n' "$py_want") | grep -v '^usr/share/doc/python3-lease/')
assert_eq "$extra" "" "python3-lease holds the package's modules and py.typed alone"

# dpkg refuses to install two packages that ship one file.
dups=$(for p in "${PACKAGES[@]}"; do printf '%s\n' "${FILES[$p]}"; done | sort | uniq -d)
assert_eq "$dups" "" "no file is in two packages"

section "apt would install liblease0 and python3-lease here"
# -s: apt resolves the dependencies against this machine's packages and
# prints what it would do, changing nothing (dpkg --dry-run would not
# check them: dpkg does at configure time). liblease0 is given too:
# python3-lease needs that version of it.
call apt-get install -s --no-install-recommends "${DEB[liblease0]}" "${DEB[python3-lease]}"
expect_rc 0 "apt-get install -s liblease0 python3-lease"
assert_match "$OUT" "(^|"$'\n'")Conf python3-lease \($VERSION " "apt would configure python3-lease"

section "unpacked: the library"
ROOT=$T/root
mkdir -p "$ROOT"
for p in "${PACKAGES[@]}"; do
    dpkg -x "${DEB[$p]}" "$ROOT" || die "dpkg -x ${DEB[$p]} failed"
done
ROOTLIB=$ROOT/$LIBDIR
assert_match "$(readelf -d "$ROOTLIB/liblease.so.0" 2>&1)" \
    "\(SONAME\) +Library soname: \[liblease\.so\.0\]" "SONAME of liblease.so.0"
# Debian's loader finds the library in the multiarch directory: a run path
# left in a packaged binary would be wrong (and is a packaging error).
assert_not_contains "$(readelf -d "$ROOT/usr/bin/lease" "$ROOTLIB/liblease.so.0" \
    "$ROOTLIB"/lease/*.so 2>&1)" "PATH)" "no RPATH or RUNPATH in the packaged binaries"
# The modules need the store's client library; liblease0 depends on it.
lib_depends=$(field liblease0 Depends)
for dep in libpq5 libhiredis libcurl; do
    assert_contains "$lib_depends" "$dep" "liblease0 depends on $dep (for its module)"
done
assert_contains "$(field lease Depends)" "libmicrohttpd" "lease depends on libmicrohttpd (agent)"

section "unpacked: lease"
# Every run of the packaged tool takes its library from the unpacked tree.
LEASE=$ROOT/usr/bin/lease
PL=(env "LD_LIBRARY_PATH=$ROOTLIB" "$LEASE")
assert_match "$(LD_LIBRARY_PATH=$ROOTLIB ldd "$LEASE" 2>&1)" \
    "liblease\.so\.0 => $ROOTLIB/liblease\.so\.0" "lease loads the unpacked liblease"
call "${PL[@]}" --version
expect_rc 0 "lease --version"
assert_contains "$OUT" "lease $UPSTREAM (liblease $UPSTREAM)" \
    "the tool and the library have the version of debian/changelog"
# ON in debian/rules: a package must never lack a store.
assert_contains "$OUT" "stores: sqlite, postgres, redis, etcd, kubernetes" "every store is built in"
assert_contains "$OUT" "postgres: module $ROOTLIB/lease/liblease-store-postgres.so (not loaded)" \
    "--version names the packaged module without loading it"
call "${PL[@]}" --version --verbose
expect_rc 0 "lease --version --verbose"
for c in "postgres: libpq " "redis: hiredis " "etcd: libcurl " "kubernetes: libcurl " "agent: libmicrohttpd "; do
    assert_contains "$OUT" "$c" "--version --verbose loads the packaged modules"
done

DB=sqlite://$T/deb.db
call "${PL[@]}" --store "$DB" acquire deb/check --ttl 30s --label deb --json
expect_rc 0 "acquire"
owner=$(jget "$OUT" .owner)
token=$(jget "$OUT" .token)
assert_match "$owner" "$UUID_RE" "acquire: an owner"
assert_match "$token" '^[0-9]+$' "acquire: a token"
call "${PL[@]}" --store "$DB" show deb/check --json
expect_rc 0 "show"
assert_eq "$(jget "$OUT" .state)" held "show: held after acquire"
call "${PL[@]}" --store "$DB" release deb/check --owner "$owner" --token "$token"
expect_rc 0 "release"
call "${PL[@]}" --store "$DB" show deb/check --json
expect_rc 0 "show"
assert_eq "$(jget "$OUT" .state)" free "show: free after release"

# The .load line names the extension beside liblease.so.0, as installed:
# /usr/lib/<multiarch>/liblease_sqlite_fence once installed (docs/fencing.md
# shows it), here in the unpacked tree.
call "${PL[@]}" fence-sql sqlite
expect_rc 0 "fence-sql sqlite"
assert_contains "$OUT" "--     .load $ROOTLIB/liblease_sqlite_fence"$'\n' \
    "fence-sql sqlite: the packaged extension's path"
assert_not_contains "$OUT" "No liblease_sqlite_fence.so" "fence-sql sqlite finds the extension there"

section "unpacked: man pages"
for page in man1/lease.1 man3/liblease.3 man7/lease-stores.7; do
    f=$ROOT/usr/share/man/$page
    [ -e "$f" ] || f=$f.gz
    # --warnings: groff's complaints (an unknown macro, a bad escape) go to
    # stderr, which must stay empty.
    call env MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -E UTF-8 -l "$f"
    expect_rc 0 "man -l $page"
    assert_eq "$ERR" "" "man -l $page: no warnings"
    name=${page#*/}
    assert_contains "$OUT" "${name%.*}" "man -l $page renders"
done

section "unpacked: a program built with lease.pc"
cat >"$T/version.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <lease.h>

int main(void)
{
    printf("%s\n", lease_version());
    return strcmp(lease_version(), LEASE_VERSION_STRING) != 0;
}
EOF
# The packaged lease.pc says prefix=/usr: the sysroot moves its paths into
# the unpacked tree, and the modules it requires come from this system.
PC=(env "PKG_CONFIG_SYSROOT_DIR=$ROOT" "PKG_CONFIG_PATH=$ROOTLIB/pkgconfig")
call "${PC[@]}" pkg-config --cflags --libs lease
expect_rc 0 "pkg-config --cflags --libs lease"
flags=$OUT
assert_contains "$flags" "-I$ROOT/usr/include" "the headers come from the package"
assert_contains "$flags" "-L$ROOTLIB" "the library comes from the package"
read -r -a flag_words <<<"$flags"
call "$CC" -std=c11 -Wall -Wextra -Werror "$T/version.c" "${flag_words[@]}" -o "$T/version"
expect_rc 0 "compile and link against the packaged liblease.so"
call env "LD_LIBRARY_PATH=$ROOTLIB" "$T/version"
expect_rc 0 "the program runs"
assert_eq "$OUT" "$UPSTREAM" "lease_version() of the packaged library"

# Static: liblease.a with the modules of Requires.private, which is what
# `pkg-config --static` adds; each of them must come with liblease-dev.
call "${PC[@]}" pkg-config --print-requires-private lease
expect_rc 0 "pkg-config --print-requires-private lease"
modules=$(printf '%s\n' "$OUT" | awk '{print $1}')
assert_ne "$modules" "" "lease.pc has Requires.private"
call "${PC[@]}" pkg-config --static --cflags --libs lease
expect_rc 0 "pkg-config --static --cflags --libs lease"
dev_names=$(dep_names "$dev_depends")
for m in $modules; do
    pcfile=$(pkg-config --variable=pcfiledir "$m")/$m.pc
    owner_pkg=$(dpkg -S "$pcfile" 2>/dev/null | head -n 1 | sed 's/[:,].*//')
    if [ -n "$owner_pkg" ] && printf '%s\n' "$dev_names" | grep -qxF "$owner_pkg"; then
        pass
    else
        fail "lease.pc requires $m ($pcfile, from '${owner_pkg:-no package}'), which liblease-dev does not depend on: $dev_depends"
    fi
done
read -r -a mod_libs <<<"$(pkg-config --libs $modules)"
call "$CC" -std=c11 "$T/version.c" "-I$ROOT/usr/include" "$ROOTLIB/liblease.a" \
    "${mod_libs[@]}" -pthread -o "$T/version-static"
expect_rc 0 "link against the packaged liblease.a and the Requires.private modules"
call "$T/version-static"
expect_rc 0 "the static program runs"
assert_eq "$OUT" "$UPSTREAM" "lease_version() of the packaged liblease.a"
assert_not_contains "$(readelf -d "$T/version-static" 2>&1)" "liblease" \
    "the static program needs no liblease.so"

section "unpacked: a program built with find_package(lease)"
mkdir -p "$T/cmake-consumer"
cp "$T/version.c" "$T/cmake-consumer/"
cat >"$T/cmake-consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(consumer C)
find_package(lease REQUIRED)
message(STATUS "lease_DIR=${lease_DIR}")
message(STATUS "lease_STORES=${lease_STORES}")
add_executable(version version.c)
target_link_libraries(version PRIVATE lease::lease)
EOF
call cmake -S "$T/cmake-consumer" -B "$T/cmake-consumer/build" \
    "-DCMAKE_PREFIX_PATH=$ROOT/usr" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
expect_rc 0 "cmake configure with the packaged lease CMake package"
assert_contains "$OUT" "lease_DIR=$ROOTLIB/cmake/lease" "find_package found the packaged one"
assert_contains "$OUT" "lease_STORES=sqlite;postgres;redis;etcd;kubernetes" "lease_STORES"
call cmake --build "$T/cmake-consumer/build"
expect_rc 0 "build with lease::lease"
call env "LD_LIBRARY_PATH=$ROOTLIB" "$T/cmake-consumer/build/version"
expect_rc 0 "the CMake-built program runs"
assert_eq "$OUT" "$UPSTREAM" "lease_version() through lease::lease"

section "unpacked: import lease"
# Debian's python3 with the unpacked tree in the places of the installed
# one: the package's directory on PYTHONPATH, the library's on
# LD_LIBRARY_PATH, no LEASE_LIBRARY; from an empty directory, so that no
# python/ of a source tree is on sys.path. The package finds
# liblease.so.0 by its soname, as it does once installed.
mkdir -p "$T/py"
script='
import json, os, sys
import lease
with lease.open(sys.argv[1]) as store:
    g = store.acquire("deb/python", ttl=30)
    held = store.show("deb/python").state
    store.release(g)
    free = store.show("deb/python").state
libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        fields = line.split(None, 5)
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("liblease.so"):
            libs.add(fields[5].strip())
print(json.dumps({"file": lease.__file__, "version": lease.library_version(),
                  "token": g.token, "held": held, "free": free, "libs": sorted(libs)}))
'
call env -u LEASE_LIBRARY -u LEASE_STORE -u PYTHONHOME PYTHONNOUSERSITE=1 \
    PYTHONDONTWRITEBYTECODE=1 "PYTHONPATH=$ROOT/$PYDIR" "LD_LIBRARY_PATH=$ROOTLIB" \
    bash -c 'cd "$1" && shift && exec "$@"' run "$T/py" /usr/bin/python3 -c "$script" "$DB"
expect_rc 0 "python3: import lease, open an SQLite store, acquire, release"
assert_eq "$(jget "$OUT" .file)" "$ROOT/$PYDIR/lease/__init__.py" "lease.__file__: the packaged module"
assert_eq "$(jget "$OUT" .version)" "$UPSTREAM" "lease.library_version()"
assert_match "$(jget "$OUT" .token)" '^[1-9][0-9]*$' "the fencing token"
assert_eq "$(jget "$OUT" .held)" held "show after acquire"
assert_eq "$(jget "$OUT" .free)" free "show after release"
assert_eq "$(jget "$OUT" '.libs | length')" 1 "liblease files mapped"
assert_eq "$(readlink -f "$(jget "$OUT" '.libs[0]')")" "$(readlink -f "$ROOTLIB/liblease.so.0")" \
    "the liblease the package loaded: the packaged one"

finish
