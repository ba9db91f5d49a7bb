#!/usr/bin/env bash
# docs_completion: completion/lease.bash, sourced in a `bash --norc` (no
# bash-completion package) and driven as bash drives it, through
# COMP_WORDS, COMP_CWORD, COMP_LINE and COMP_POINT.
#   usage: docs_completion.sh LEASE_BINARY COMPLETION_FILE
. "$(dirname "$0")/../cli/lib.sh" "$1"
COMPLETION=${2:?usage: $0 LEASE_BINARY COMPLETION_FILE}
[ -r "$COMPLETION" ] || die "cannot read $COMPLETION"
command -v python3 >/dev/null 2>&1 || die "python3 is required (a server that never answers)"

# The completion runs `lease` as the user typed it: put the binary under test
# first on PATH, under its installed name.
mkdir -p "$T/bin"
ln -s "$LEASE" "$T/bin/lease"
export PATH="$T/bin:$PATH"
unset LEASE_STORE

# comp_at LINE: what the completion offers at the end of LINE, one
# candidate per line in $OUT (sorted), bounded by timeout(1). COMP_WORDS is
# split as bash splits it: at blanks, and at ':' and '=' (COMP_WORDBREAKS),
# which become words of their own.
comp_at() {
    local line=$1
    # shellcheck disable=SC2016
    call bash --norc --noprofile -c '
        source "$1" || exit 99
        complete -p lease >/dev/null || exit 98
        COMP_LINE=$2
        COMP_POINT=${#COMP_LINE}
        COMP_WORDS=()
        w=""
        for ((i = 0; i < ${#COMP_LINE}; i++)); do
            c=${COMP_LINE:i:1}
            case $c in
                " ") [ -n "$w" ] && COMP_WORDS+=("$w"); w="" ;;
                ":" | "=") [ -n "$w" ] && COMP_WORDS+=("$w"); COMP_WORDS+=("$c"); w="" ;;
                *) if [ "$w" = ":" ] || [ "$w" = "=" ]; then w=""; fi; w+=$c ;;
            esac
        done
        # The word under the cursor (empty after a blank or a break).
        case $COMP_LINE in
            *" " | *":" | *"=") COMP_WORDS+=("") ;;
            *) COMP_WORDS+=("$w") ;;
        esac
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        COMPREPLY=()
        _lease lease "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]:-}"
        printf "%s\n" "${COMPREPLY[@]}"
    ' complete "$COMPLETION" "$line"
    OUT=$(printf '%s\n' "$OUT" | sed '/^$/d' | sort)
}

# timed_comp LINE: comp_at, with how long it took in $MS (milliseconds).
timed_comp() {
    stopwatch comp_at "$1"
}

# offers CANDIDATE DESCRIPTION: the last completion offered CANDIDATE.
offers() {
    if printf '%s\n' "$OUT" | grep -qxF -- "$1"; then pass; else
        fail "$2: '$1' not offered; got: [$(echo $OUT)]$(_ctx)"
    fi
}

section "the file loads in a bash without bash-completion"
comp_at "lease "
expect_rc 0 "completing 'lease '"
assert_eq "$ERR" "" "no error while completing"

section "commands"
comp_at "lease ac"
assert_eq "$OUT" acquire "lease ac<TAB>"
comp_at "lease "
HELP_CMDS=$("$LEASE" help | awk '/^commands:/ { on = 1; next } /^$/ { on = 0 }
    on && /^  [a-z]/ { print $1 }' | sort)
[ -n "$HELP_CMDS" ] || die "lease help lists no command"
assert_eq "$OUT" "$HELP_CMDS" "lease <TAB> offers exactly the commands of lease help"
comp_at "lease --timeout 2s hi"
assert_eq "$OUT" history "a command after a global flag and its value"
comp_at "lease help a"
assert_eq "$OUT" "$(printf 'acquire\nagent')" "lease help a<TAB>: the commands"

section "flags"
comp_at "lease acquire --"
for flag in --ttl --owner --label --wait --json --store --store-file --timeout; do
    offers "$flag" "lease acquire --<TAB>"
done
comp_at "lease --st"
assert_eq "$OUT" "$(printf -- '--store\n--store-file')" "lease --st<TAB>: the global flags"
# Each command's own flags are those of its usage line(s) in `lease help CMD`.
for cmd in $HELP_CMDS; do
    want=$("$LEASE" help "$cmd" | sed '/^$/q' | grep -oE -- '--[a-z][a-z-]*[a-z]' | sort -u)
    comp_at "lease $cmd --"
    got=$(printf '%s\n' "$OUT" | grep -vxE -- '--(store|store-file|timeout|help)?' | sort -u)
    assert_eq "$(echo $got)" "$(echo $want)" "lease $cmd --<TAB>: the flags of lease help $cmd"
done
comp_at "lease acquire k --ttl "
assert_eq "$OUT" "" "nothing is offered for a duration"

section "store URLs: the schemes of this binary's stores"
STORES=$(lease_stores)
assert_contains "$STORES" sqlite "lease --version names its stores"
comp_at "lease --store "
offers "sqlite:" "lease --store <TAB>"
for store in ${STORES//,/ }; do
    case $store in
        postgres) offers "postgres://" "lease --store <TAB>"; offers "postgresql://" "lease --store <TAB>" ;;
        redis) offers "redis://" "lease --store <TAB>" ;;
        etcd) offers "etcd://" "lease --store <TAB>"; offers "etcds://" "lease --store <TAB>" ;;
    esac
done
comp_at "lease --store=r"
case " $STORES " in
    *redis*) assert_eq "$OUT" "redis://" "lease --store=r<TAB>" ;;
    *) assert_eq "$OUT" "" "lease --store=r<TAB> without redis" ;;
esac
touch "$T/files.db"
comp_at "lease --store sqlite://$T/fil"
# bash replaces the part after the last ':' of the word.
assert_eq "$OUT" "//$T/files.db" "lease --store sqlite:///…/fil<TAB>: a file name"

section "--store-file: file names"
printf 'sqlite://%s/keys.db\n' "$T" >"$T/store.url"
chmod 600 "$T/store.url"
comp_at "lease --store-file $T/store.u"
assert_eq "$OUT" "$T/store.url" "lease --store-file …/store.u<TAB>"

section "keys from the store on the line"
DB="sqlite://$T/keys.db"
call "$LEASE" --store "$DB" acquire jobs/a
expect_rc 0 "acquire jobs/a"
call "$LEASE" --store "$DB" acquire other
expect_rc 0 "acquire other"
comp_at "lease --store $DB show j"
assert_eq "$OUT" jobs/a "lease --store URL show j<TAB>"
comp_at "lease --store=$DB history "
assert_eq "$OUT" "$(printf 'jobs/a\nother')" "lease --store=URL history <TAB>"
comp_at "lease --store-file $T/store.url renew j"
assert_eq "$OUT" jobs/a "lease --store-file PATH renew j<TAB>"
for cmd in acquire renew release show history run; do
    comp_at "lease $cmd --store $DB jo"
    assert_eq "$OUT" jobs/a "lease $cmd --store URL jo<TAB> (the store after the command)"
done
comp_at "lease --store $DB fence j"
assert_eq "$OUT" "" "fence takes a resource, not a key"
comp_at "lease --store $DB show jobs/a "
assert_eq "$OUT" "" "show takes one KEY"
comp_at "lease show j"
assert_eq "$OUT" "" "no store named: no keys (the default store is not opened)"
call "$LEASE" --store "$DB" acquire "odd:key"
comp_at "lease --store $DB show odd:"
assert_eq "$OUT" key "a key with ':' is cut where bash cuts the word"

section "keys from \$LEASE_STORE"
export LEASE_STORE=$DB
comp_at "lease show j"
assert_eq "$OUT" jobs/a "LEASE_STORE=URL lease show j<TAB>"
comp_at "lease run j"
assert_eq "$OUT" jobs/a "LEASE_STORE=URL lease run j<TAB>"
comp_at "lease run jobs/a -- ech"
offers echo "lease run KEY -- ech<TAB>: the command to run"
unset LEASE_STORE

section "a store that never answers: bounded, no keys"
# A listener that accepts connections and never says a word. Every
# completion below is bounded by timeout(1) at 10 s; it must take less than
# 5 s (the tool's default store timeout), a bit more than 1 s in fact.
CALL_TIMEOUT=10
BOUND=(timeout -k 2 10)
pick_port || die "no free port"
python3 -c '
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
conns = []
while True:
    c, _ = s.accept()
    conns.append(c)
' "$PORT" &
bg_register $!
wait_for "the silent listener" bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT"
for url in "redis://127.0.0.1:$PORT" "etcd://127.0.0.1:$PORT" \
    "postgres://127.0.0.1:$PORT/db"; do
    case " $STORES " in
        *" ${url%%:*}"*) ;;
        *) continue ;;
    esac
    timed_comp "lease --store $url show "
    expect_rc 0 "completion with $url returned"
    assert_eq "$OUT" "" "no keys from $url"
    if [ "$MS" -lt 5000 ]; then pass; else
        fail "completion with $url took $MS ms (expected a few seconds at most)"
    fi
done
export LEASE_STORE="redis://127.0.0.1:$PORT"
timed_comp "lease show "
assert_eq "$OUT" "" "no keys from an unanswering \$LEASE_STORE"
[ "$MS" -lt 5000 ] && pass || fail "completion with an unanswering \$LEASE_STORE took $MS ms"
unset LEASE_STORE
# Nothing listening at all.
pick_port || die "no free port"
timed_comp "lease --store redis://127.0.0.1:$PORT show "
assert_eq "$OUT" "" "no keys from a closed port"
[ "$MS" -lt 5000 ] && pass || fail "completion with a closed port took $MS ms"

finish
