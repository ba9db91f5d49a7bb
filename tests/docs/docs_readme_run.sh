#!/usr/bin/env bash
# docs_readme_run: the README's command-line examples work as written. Every
# ```sh block right after the marker line <!-- readme-run --> runs, in the
# README's order, in one bash with `set -euo pipefail` (so that a variable
# one block sets serves the next, as in a reader's shell), in an empty
# directory, with the build's `lease` first on PATH and LEASE_STORE on an
# SQLite file of the temp dir (the embedded store: no server). A block that
# fails, or runs past its time bound, fails the test and is named by its
# line. The blocks together must run each command the README teaches on
# the embedded store, so that unmarking one is seen too. A marker that is
# not right before a ```sh fence is an error.
#   usage: docs_readme_run.sh LEASE_BINARY README
# LEASE_README_BLOCK_TIMEOUT: seconds each block may take (default 60).
. "$(dirname "$0")/../cli/lib.sh" "$1"
README=${2:?usage: $0 LEASE_BINARY README}
[ -r "$README" ] || die "cannot read $README"
MARKER='<!-- readme-run -->'
LIMIT=${LEASE_README_BLOCK_TIMEOUT:-60}
# What a reader learns to run from these blocks (`lease CMD` in them).
COMMANDS=(acquire renew show ls release history fence run hold claim elect)

# The blocks as one script: "#@ LINE" (the fence's line) before each
# block's lines; "#@ error LINE WHY" for a misplaced marker or a block
# that never ends.
extract() {
    awk -v marker="$MARKER" '
        inblock && /^```[ \t]*$/ { inblock = 0; prev = $0; next }
        inblock { print; next }
        prev == marker {
            if ($0 ~ /^```sh[ \t]*$/) { print "#@ " NR; inblock = 1; prev = $0; next }
            print "#@ error " NR " " marker " is not right before a ```sh fence"
        }
        { prev = $0 }
        END { if (inblock) print "#@ error " NR " a marked block that never ends" }
    ' "$1"
}

section "the marked \`\`\`sh blocks of README.md"
blocks=$(extract "$README")
errors=$(printf '%s\n' "$blocks" | sed -n 's/^#@ error //p')
assert_eq "$errors" "" "misplaced markers or unended blocks"
nblocks=$(printf '%s\n' "$blocks" | grep -cE '^#@ [0-9]+$')
assert_gt "$nblocks" 0 "blocks marked $MARKER"
[ "$nblocks" -gt 0 ] || die "nothing to run"
for cmd in "${COMMANDS[@]}"; do
    if printf '%s\n' "$blocks" | grep -qE "(^|[^A-Za-z0-9_./-])lease +$cmd( |$)"; then pass; else
        fail "no marked block runs 'lease $cmd' (mark its example $MARKER, or say why it cannot run)"
    fi
done

# The script: a watchdog per block sends SIGTERM to the whole process
# group (timeout(1) below makes one) when the block runs past LIMIT, and
# says so; the EXIT trap names the block that failed. A finished block
# stops its watchdog, whose sleep writes to no pipe of ours (ctest waits
# for those).
{
    cat <<EOF
set -euo pipefail
__limit=$LIMIT
__line=0
__readme=$(printf '%q' "$(basename "$README")")
EOF
    cat <<'EOF'
__watch() {
    ( trap 'kill "${__s:-}" 2>/dev/null; exit 0' TERM
      sleep "$__limit" >/dev/null 2>&1 </dev/null & __s=$!
      if wait "$__s"; then
          echo "$__readme:$__line: the block there ran past ${__limit}s" >&2
          kill -TERM 0
      fi ) &
    __wd=$!
}
__done() {
    kill -TERM "$__wd" 2>/dev/null || true
    wait "$__wd" 2>/dev/null || true
}
trap '__rc=$?; [ "$__rc" -eq 0 ] || echo "$__readme:$__line: the block there failed (exit $__rc)" >&2' EXIT
EOF
    printf '%s\n' "$blocks" | awk '
        /^#@ [0-9]+$/ { if (n++) print "__done"; print "__line=" $2; print "__watch"; next }
        { print }
        END { if (n) print "__done"; print "echo README-RUN-COMPLETE" }
    '
} >"$T/readme-run.sh"

section "run them against the embedded store"
work=$T/work
mkdir -p "$work" || die "mkdir"
store="sqlite://$T/readme.db"
# Bounded as a whole by its own timeout(1) (each block's bound plus a
# margin), not call's shorter one: timeout(1) runs the script in a process
# group of its own, which the watchdog ends.
BOUND=()
call env -C "$work" PATH="$(dirname "$LEASE"):$PATH" LEASE_STORE="$store" \
    timeout -k 5 $((nblocks * LIMIT + 30)) bash "$T/readme-run.sh"
echo "$OUT"
[ -z "$ERR" ] || echo "$ERR" >&2
expect_rc 0 "the README's marked blocks, in order, in one bash"
assert_contains "$OUT" "README-RUN-COMPLETE" "the script ran to its end"

section "they ran on the store of the test"
call "$LEASE" --store "$store" show jobs/nightly-rebuild
expect_rc 0 "lease show of the key the examples acquired"

finish
