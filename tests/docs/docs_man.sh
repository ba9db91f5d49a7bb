#!/usr/bin/env bash
# docs_man: every generated man page renders with man(1) without a single
# warning, and has the sections every page must have.
#   usage: docs_man.sh LEASE_BINARY PAGE...
. "$(dirname "$0")/../cli/lib.sh" "$1"
shift

if ! command -v man >/dev/null 2>&1; then
    die "man(1) is required (Debian packages man-db and groff-base)"
fi
[ $# -gt 0 ] || die "no man page given"

for page in "$@"; do
    name=$(basename "$page")
    section "$name"
    assert_file "$page" "$name was generated"
    [ -s "$page" ] || { fail "$name is empty"; continue; }

    # Fixed locale and width: the same rendering on every machine.
    LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" >"$T/page.txt" 2>"$T/page.err"
    rc=$?
    assert_eq "$rc" 0 "man --warnings -l $name exits 0"
    if [ -s "$T/page.err" ]; then
        fail "man --warnings -l $name wrote on stderr: $(head -c 800 "$T/page.err")"
    else
        pass
    fi

    # The title line names the page: lease(1), liblease(3), lease-stores(7).
    title=${name%.*}\(${name##*.}\)
    assert_contains "$(head -n 1 "$T/page.txt")" "$title" "$name: title line"
    for sec in NAME SYNOPSIS DESCRIPTION "SEE ALSO"; do
        if grep -qx "$sec" "$T/page.txt"; then pass; else
            fail "$name has no $sec section"
        fi
    done
    # NAME is "page - what it is", as apropos(1) and whatis(1) read it.
    name_line=$(sed -n '/^NAME$/{n;p;q}' "$T/page.txt" | sed 's/^ *//')
    assert_match "$name_line" "^${name%.*} - .+" "$name: NAME line"
done

finish
