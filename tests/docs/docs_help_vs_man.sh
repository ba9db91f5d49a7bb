#!/usr/bin/env bash
# docs_help_vs_man: lease(1) and `lease help` tell the same story. For each
# command, the set of --flags that `lease help CMD` mentions equals the set
# its "## CMD" subsection of the man page mentions; the commands, the global
# flags and the exit codes (0..7, from cli/cli.h) appear in both; `lease help
# CMD` prints exactly what `lease CMD --help` prints; `lease help nosuch` is a
# usage error.
#   usage: docs_help_vs_man.sh LEASE_BINARY LEASE_1_SCD CLI_H
. "$(dirname "$0")/../cli/lib.sh" "$1"
SCD=${2:?usage: $0 LEASE_BINARY LEASE_1_SCD CLI_H}
CLI_H=${3:?usage: $0 LEASE_BINARY LEASE_1_SCD CLI_H}
[ -r "$SCD" ] || die "cannot read $SCD"
[ -r "$CLI_H" ] || die "cannot read $CLI_H"

# man_section TITLE: the lines of the page's "# TITLE" section.
man_section() {
    awk -v t="# $1" '$0 == t { on = 1; next } /^# / { on = 0 } on' "$SCD"
}

# man_command CMD: the lines of the "## CMD" subsection of COMMANDS.
man_command() {
    man_section COMMANDS | awk -v t="## $1" '$0 == t { on = 1; next } /^##? / { on = 0 } on'
}

# flags: the distinct --flags in stdin, one per line, sorted.
flags() {
    grep -oE -- '--[a-z][a-z-]*[a-z]' | sort -u
}

# same_set WHAT A B: A and B (newline-separated) hold the same lines.
same_set() {
    local what=$1 only_a only_b
    only_a=$(comm -23 <(printf '%s\n' "$2" | sort -u) <(printf '%s\n' "$3" | sort -u))
    only_b=$(comm -13 <(printf '%s\n' "$2" | sort -u) <(printf '%s\n' "$3" | sort -u))
    if [ -z "$only_a$only_b" ]; then pass; else
        fail "$what differ: only in lease help: [$(echo $only_a)]; only in lease(1): [$(echo $only_b)]"
    fi
}

section "lease help: the main usage, as lease --help"
call "$LEASE" help
expect_rc 0 "lease help"
HELP=$OUT
[ -n "$HELP" ] || die "lease help printed nothing"
call "$LEASE" --help
assert_eq "$OUT" "$HELP" "lease help prints what lease --help prints"

section "the commands"
HELP_CMDS=$(printf '%s\n' "$HELP" | awk '/^commands:/ { on = 1; next } /^$/ { on = 0 }
    on && /^  [a-z]/ { print $1 }' | sort -u)
MAN_CMDS=$(man_section COMMANDS | sed -n 's/^## \([a-z-]*\)$/\1/p' | sort -u)
[ -n "$MAN_CMDS" ] || die "lease(1) has no '## COMMAND' subsection under '# COMMANDS'"
[ -n "$HELP_CMDS" ] || die "lease help lists no command under 'commands:'"
same_set "the commands" "$HELP_CMDS" "$MAN_CMDS"
for cmd in acquire renew release show ls history run fence elect leader agent help; do
    assert_contains " $(echo $MAN_CMDS) " " $cmd " "lease(1) documents $cmd"
done

section "each command: lease help CMD = lease CMD --help, and its flags = lease(1)'s"
DONE=""
for cmd in $MAN_CMDS $HELP_CMDS; do
    case " $DONE " in *" $cmd "*) continue ;; esac
    DONE="$DONE $cmd"
    call "$LEASE" "$cmd" --help
    expect_rc 0 "lease $cmd --help"
    CMD_HELP=$OUT
    call "$LEASE" help "$cmd"
    expect_rc 0 "lease help $cmd"
    assert_eq "$OUT" "$CMD_HELP" "lease help $cmd prints what lease $cmd --help prints"
    assert_contains "$OUT" "usage: lease $cmd" "lease help $cmd is the usage of $cmd"
    MAN_TEXT=$(man_command "$cmd")
    [ -n "$MAN_TEXT" ] || { fail "lease(1) has no '## $cmd' subsection"; continue; }
    same_set "the flags of $cmd" "$(printf '%s\n' "$OUT" | flags)" \
        "$(printf '%s\n' "$MAN_TEXT" | flags)"
done

section "global flags"
MAN_GLOBAL=$(man_section "GLOBAL OPTIONS")
[ -n "$MAN_GLOBAL" ] || fail "lease(1) has no '# GLOBAL OPTIONS' section"
for flag in --store --store-file --timeout --help --version; do
    # A definition in the man page: a line that starts with the flag in bold.
    if printf '%s\n' "$MAN_GLOBAL" | grep -q -- "^\*$flag\*"; then pass; else
        fail "lease(1) GLOBAL OPTIONS does not define $flag"
    fi
    if printf '%s\n' "$HELP" | flags | grep -qx -- "$flag"; then pass; else
        fail "lease help does not mention $flag"
    fi
done

section "exit codes: cli/cli.h, lease help and lease(1)"
H_CODES=$(sed -n 's/^ *EXIT_[A-Z]* = \([0-9]*\),\{0,1\}$/\1/p' "$CLI_H" | sort -n | tr '\n' ' ')
assert_eq "$H_CODES" "0 1 2 3 4 5 6 7 " "cli/cli.h defines the exit codes 0..7"
HELP_EXIT=$(printf '%s\n' "$HELP" | sed -n '/^exit codes:/,$p')
[ -n "$HELP_EXIT" ] || fail "lease help has no 'exit codes:' paragraph"
MAN_EXIT=$(man_section "EXIT STATUS")
[ -n "$MAN_EXIT" ] || fail "lease(1) has no '# EXIT STATUS' section"
MAN_CODES=$(printf '%s\n' "$MAN_EXIT" | sed -n 's/^\*\([0-9]*\)\*$/\1/p' | sort -n | tr '\n' ' ')
assert_eq "$MAN_CODES" "$H_CODES" "lease(1) EXIT STATUS documents exactly the codes of cli/cli.h"
for code in $H_CODES; do
    # "0 ok, 1 other failure, ...": the code, then the word that says it.
    if printf '%s\n' "$HELP_EXIT" | grep -qE "(^|[ :,])$code [a-z]"; then pass; else
        fail "lease help does not explain exit code $code: $HELP_EXIT"
    fi
done

section "lease help of an unknown command"
call "$LEASE" help nosuch
expect_error 2 "lease help nosuch"
assert_contains "$ERR" "unknown command 'nosuch'" "lease help nosuch names the command"
call "$LEASE" help acquire extra
expect_error 2 "lease help with two commands"
call "$LEASE" help --help
expect_rc 0 "lease help --help"
assert_contains "$OUT" "usage: lease help" "lease help --help prints the usage of help"

finish
