#!/usr/bin/env bash
# readme_c: the program of README.md's "Use it from C" builds and works.
# The ```c block after the marker <!-- readme-c-example --> is saved under
# the name the README gives it and compiled with the README's own command
# (the first line of the next ```sh block that runs pkg-config) against a
# prefix with a space; then it runs against an SQLite store in the temp
# dir, the URL from argv[1] and from LEASE_STORE, and must leave the lease
# released with a token that grew each time.
# Usage: readme_c.sh BUILD_DIR SOURCE_DIR
. "$(dirname "$0")/common.sh" "$@"

README="$SRC/README.md"
MARKER='<!-- readme-c-example -->'

section "the example in README.md"
assert_file "$README" "README.md"
# awk: 0 before the marker; 1 the marker seen; 2 in the ```c block right
# after it; 3 after it, before the next ```sh block; 4 in that block.
extract() {
    awk -v want="$1" -v marker="$MARKER" '
        state == 0 && $0 == marker { state = 1; next }
        state == 1 { state = ($0 == "```c") ? 2 : -1; next }
        state == 2 && $0 == "```" { state = 3; next }
        state == 2 { if (want == "c") print; next }
        state == 3 && $0 == "```sh" { state = 4; next }
        state == 4 && $0 == "```" { exit }
        state == 4 { if (want == "sh") print; next }
    ' "$README"
}
code=$(extract c)
assert_ne "$code" "" "a \`\`\`c block right after $MARKER"
[ -n "$code" ] || die "no example to build"
assert_contains "$code" "int main(" "the example is a complete program"
compile=$(extract sh | grep -m 1 'pkg-config')
assert_ne "$compile" "" "the compile command in the \`\`\`sh block after the example"
[ -n "$compile" ] || die "no compile command to run"
cfile=$(printf '%s\n' "$compile" | grep -oE '[A-Za-z0-9_.-]+\.c\b' | head -n 1)
exe=$(printf '%s\n' "$compile" | sed -n 's/.*-o \([A-Za-z0-9_.-]*\).*/\1/p')
assert_match "$cfile" '^[A-Za-z0-9_.-]+\.c$' "the source file the command compiles"
assert_match "$exe" '^[A-Za-z0-9_.-]+$' "the program the command writes (-o)"
[ -n "$cfile" ] && [ -n "$exe" ] || die "cannot tell the file names from: $compile"
assert_contains "$(cat "$README")" "Save it as \`$cfile\`" "the README names the file the command compiles"

install_prefix
use_installed_pc

section "compile it as the README says"
work="$T/readme"
mkdir -p "$work" || die "mkdir"
printf '%s\n' "$code" >"$work/$cfile"
call bash -c "cd \"\$1\" && $compile" readme "$work"
expect_rc 0 "$compile"
assert_file "$work/$exe" "the program"
[ -x "$work/$exe" ] || die "the example did not build"
# And without a warning, in strict C11.
pc_words pcflags --cflags lease
call cc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only "${pcflags[@]}" "$work/$cfile"
expect_rc 0 "the example compiles cleanly with -std=c11 -pedantic -Wall -Wextra -Werror"

section "run it"
# The README's command sets no run path: the installed library is found the
# way an install into a prefix of one's own is, through LD_LIBRARY_PATH.
# LEASE_STORE is unset where the URL must come from argv (lib.sh points
# it at a store of its own).
db="sqlite://$T/readme.db"
tokens=()
for how in argv argv env; do
    if [ "$how" = argv ]; then
        call env -u LEASE_STORE LD_LIBRARY_PATH="$LIBDIR" "$work/$exe" "$db"
    else
        call env LD_LIBRARY_PATH="$LIBDIR" LEASE_STORE="$db" "$work/$exe"
    fi
    expect_rc 0 "the example, store URL from $how"
    t=$(printf '%s\n' "$OUT" | grep -oE 'token [0-9]+' | head -n 1)
    tokens+=("${t#token }")
done
assert_gt "${tokens[0]:-0}" 0 "the first token"
assert_gt "${tokens[1]:-0}" "${tokens[0]:-x}" "the second run's token is greater"
assert_gt "${tokens[2]:-0}" "${tokens[1]:-x}" "the run with LEASE_STORE used the same store"
call env -u LEASE_STORE LD_LIBRARY_PATH="$LIBDIR" "$work/$exe"
expect_rc 2 "the example without a store URL"

section "it released its lease"
call "$BINDIR/lease" --store "$db" ls --json
expect_rc 0 "lease ls"
assert_eq "$(jget "$OUT" 'length')" 1 "keys in the example's store"
assert_eq "$(jget "$OUT" '.[0].state')" "free" "the example's key after it ended"
assert_eq "$(jget "$OUT" '.[0].token')" "${tokens[2]:-}" "the key's last token"

finish
