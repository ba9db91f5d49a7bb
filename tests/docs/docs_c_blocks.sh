#!/usr/bin/env bash
# docs_c_blocks: every ```c block of README.md and docs/*.md is C that
# builds. A block is a translation unit unless the line right before its
# fence is the marker <!-- c-fragment -->: a unit must compile on its own
# (cc -c) against the source tree's include/, in strict C11 and with the
# project's warnings made errors, so that a reader can paste it into a file
# of their own. A fragment is a few lines out of a program (statements
# without their function, "..." for what the reader fills in): it cannot be
# compiled, so what it names must at least exist: every lease_*/LEASE_*
# name in it is declared in a public header, and every header it includes
# from the project is one. A marker that is not right before a ```c fence
# is an error, and so is a block that never ends.
#   usage: docs_c_blocks.sh LEASE_BINARY SOURCE_DIR CC [WARNING_FLAG...]
. "$(dirname "$0")/../cli/lib.sh" "$1"
SRC=${2:?usage: $0 LEASE_BINARY SOURCE_DIR CC [WARNING_FLAG...]}
CC=${3:?usage: $0 LEASE_BINARY SOURCE_DIR CC [WARNING_FLAG...]}
shift 3
WARNINGS=("$@")
SRC=$(cd "$SRC" && pwd) || die "no source directory $2"
command -v "$CC" >/dev/null 2>&1 || die "no C compiler '$CC'"
MARKER='<!-- c-fragment -->'

# blocks FILE...: writes each ```c block to $T/blocks/N.c and prints one
# line per block, "FILE<TAB>LINE<TAB>KIND<TAB>PATH" (KIND: unit or
# fragment; LINE: the fence's line), or "FILE<TAB>LINE<TAB>error<TAB>WHY".
# A fence may be indented by up to three spaces (CommonMark).
blocks() {
    mkdir -p "$T/blocks" || die "mkdir"
    awk -v dir="$T/blocks" -v marker="$MARKER" '
        function report(kind, what) { printf "%s\t%d\t%s\t%s\n", FILENAME, FNR, kind, what }
        FNR == 1 {
            if (inblock) { report("error", "a ```c block that never ends"); inblock = 0 }
            prev = ""
        }
        inblock && /^ ? ? ?```[ \t]*$/ { inblock = 0; close(out); prev = $0; next }
        inblock { print > out; next }
        /^ ? ? ?```[ \t]*c[ \t]*$/ {
            n++
            out = dir "/" n ".c"
            printf "" > out
            report(prev == marker ? "fragment" : "unit", out)
            inblock = 1
            next
        }
        prev == marker { report("error", marker " is not right before a ```c fence") }
        { prev = $0 }
        END { if (inblock) report("error", "a ```c block that never ends") }
    ' "$@"
}

# fragment_check WHERE PATH: the names of the project in a fragment exist.
# lease__/LEASE__ names are internal, or a store's own in
# docs/writing-a-store.md, and left out.
fragment_check() {
    local where=$1 path=$2 name header missing=()
    for name in $(grep -oE '\b(lease|LEASE)_[A-Za-z0-9_]+' "$path" | grep -vE '^(lease|LEASE)__' | sort -u); do
        grep -rqw -- "$name" "$SRC/include" || missing+=("$name")
    done
    if [ ${#missing[@]} -eq 0 ]; then pass; else
        fail "$where: a fragment names what no public header declares: ${missing[*]}"
    fi
    for header in $(sed -nE 's/^[ \t]*#[ \t]*include[ \t]*[<"](lease[^>"]*)[>"].*/\1/p' "$path"); do
        if [ -f "$SRC/include/$header" ]; then pass; else
            fail "$where: a fragment includes <$header>, which is not in include/"
        fi
    done
}

section "the \`\`\`c blocks of README.md and docs/*.md"
cd "$SRC" || die "cd $SRC"
files=(README.md docs/*.md)
[ -f README.md ] || die "no README.md in $SRC"
manifest=$(blocks "${files[@]}")
units=0
fragments=0
readme_units=0
while IFS=$'\t' read -r file line kind what; do
    [ -n "$file" ] || continue
    where="$file:$line"
    case $kind in
    error)
        fail "$where: $what"
        ;;
    unit)
        units=$((units + 1))
        [ "$file" = README.md ] && readme_units=$((readme_units + 1))
        # -O2: some warnings (uninitialized use) need the optimizer's
        # analysis; -c and no link: a unit may call the application's own
        # functions, declared but defined elsewhere.
        call "$CC" -std=c11 -pedantic ${WARNINGS[@]+"${WARNINGS[@]}"} -Werror -O2 \
            -I "$SRC/include" -c "$what" -o "$what.o"
        if [ "$RC" -eq 0 ]; then pass; else
            fail "$where: the \`\`\`c block does not compile as a translation unit" \
                "(mark a true fragment with $MARKER on the line before the fence):"$'\n'"$ERR"
        fi
        ;;
    fragment)
        fragments=$((fragments + 1))
        fragment_check "$where" "$what"
        ;;
    esac
done <<<"$manifest"
echo "compiled $units blocks, checked the names of $fragments fragments"
# The README's two programs are units; if none was found, the extraction
# is what broke.
assert_gt "$readme_units" 1 "translation units found in README.md"

finish
