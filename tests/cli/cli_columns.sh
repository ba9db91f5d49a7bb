#!/usr/bin/env bash
# cli_columns: the text of `lease ls`, `lease show` and `lease history`
# keeps its columns in line when a value is wider than the classic width:
# the 16-digit clock tokens of PostgreSQL, Redis and Kubernetes beside
# tokens=counter ones (1), a key over 32 columns, a 24 h ttl. ls's rows
# start each column at the same place; history's header starts each
# column where its rows do.
#
# Every store this build has among postgres, redis and kubernetes: needs
# LEASE_TEST_PG_URL, LEASE_TEST_REDIS_URL and LEASE_TEST_KUBE_URL
# (scripts/test.sh exports them) and fails without them, never skips.
# SQLite always, for the long key and the long ttl.
. "$(dirname "$0")/lib.sh" "$@"

# Columns are characters: bash counts them in a UTF-8 locale (C.UTF-8 is
# in every glibc since 2.35, and in Debian's before).
export LC_ALL=C.UTF-8
[ "$(x=é; echo "${#x}")" = 1 ] || die "bash does not count UTF-8 characters under LC_ALL=C.UTF-8"

declare -A URLS=()
server_urls URLS PG:postgres REDIS:redis KUBE:kubernetes
# A prefix of this run alone: the servers are shared.
P=cols$$-$RANDOM

# with_param URL PARAM: URL with one more query parameter.
with_param() {
    case $1 in *\?*) printf '%s&%s' "$1" "$2" ;; *) printf '%s?%s' "$1" "$2" ;; esac
}

# starts LINE: the column (0-based) at which each whitespace-separated
# field of LINE starts, space-separated.
starts() {
    local line=$1 i prev=' ' out=()
    for ((i = 0; i < ${#line}; i++)); do
        if [ "$prev" = ' ' ] && [ "${line:i:1}" != ' ' ]; then
            out+=("$i")
        fi
        prev=${line:i:1}
    done
    echo "${out[*]}"
}

# first N WORDS: the first N of the words.
first() {
    local n=$1
    shift
    echo "${@:1:n}"
}

# col TEXT WORD: where WORD starts in TEXT (0-based).
col() {
    local head=${1%%"$2"*}
    echo "${#head}"
}

# label_start LINE: where the label of an ls row starts: after "ms left"
# and two spaces in a held row, the sixth field of an expired one (its "-"
# stands for the time left); "none" in a free row.
label_start() {
    local row=$1
    # shellcheck disable=SC2046
    set -- $(starts "$row") "" "" "" "" "" ""
    case $row in
        *"ms left  "*) echo $(($(col "$row" "ms left") + 9)) ;;
        *" expired "*) echo "$6" ;;
        *) echo none ;;
    esac
}

# ls_aligned WHAT OUTPUT: the rows of ls (no key holds a space here)
# start key, state, "token" and the token at the same columns, and end the
# time left (right-aligned) at the same column: the label of every row
# with a holder starts at the same column.
ls_aligned() {
    local what=$1 line want="" got n=0 label
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        n=$((n + 1))
        label=$(label_start "$line")
        [ "$label" != none ] || continue
        # shellcheck disable=SC2046
        got="$(first 4 $(starts "$line")) $label"
        if [ -z "$want" ]; then
            want=$got
        elif [ "$got" != "$want" ]; then
            fail "$what: the columns of '$line' start at $got, those of the first row at $want"
            printf '%s\n' "$2" >&2
            return
        fi
    done <<<"$2"
    assert_gt "$n" 1 "$what: more than one row"
    pass
}

# history_aligned WHAT OUTPUT: each row starts its first six columns
# where the header starts TOKEN, ACQUIRED, ENDED, ENDED AT, TTL and LABEL.
history_aligned() {
    local what=$1 header line want got n=0
    header=$(printf '%s\n' "$2" | head -n 1)
    assert_match "$header" '^TOKEN ' "$what: the header"
    want="0 $(col "$header" ACQUIRED) $(col "$header" "ENDED ") $(col "$header" "ENDED AT")"
    want="$want $(col "$header" TTL) $(col "$header" LABEL)"
    while IFS= read -r line; do
        n=$((n + 1))
        # shellcheck disable=SC2046
        got=$(first 6 $(starts "$line"))
        if [ "$got" != "$want" ]; then
            fail "$what: the columns of '$line' start at $got, the header's at $want"
            printf '%s\n' "$2" >&2
            return
        fi
    done < <(printf '%s\n' "$2" | tail -n +2)
    assert_gt "$n" 1 "$what: more than one row"
    pass
}

for store in "${!URLS[@]}"; do
    section "$store: a 16-digit clock token beside a counter token"
    U=${URLS[$store]}
    C=$(with_param "$U" tokens=counter)
    call "$LEASE" --store "$C" acquire "$P/counter" --ttl 1m --label counter --json
    expect_rc 0 "$store: acquire with tokens=counter"
    assert_eq "$(jget "$OUT" .token)" 1 "$store: a fresh key's counter token"
    call "$LEASE" --store "$U" acquire "$P/clock" --ttl 1m --label clock --json
    expect_rc 0 "$store: acquire with clock tokens"
    assert_match "$(jget "$OUT" .token)" '^[0-9]{16}$' "$store: a 16-digit clock token"
    call "$LEASE" --store "$U" ls "$P/"
    expect_rc 0 "$store: ls"
    echo "$OUT"
    ls_aligned "$store: ls" "$OUT"

    # The history of one key: a counter grant, then a clock grant.
    call "$LEASE" --store "$C" acquire "$P/h" --ttl 1m --label first --json
    call "$LEASE" --store "$C" release "$P/h" --owner "$(jget "$OUT" .owner)" --token "$(jget "$OUT" .token)"
    expect_rc 0 "$store: release the counter grant"
    call "$LEASE" --store "$U" acquire "$P/h" --ttl 1m --label second --json
    expect_rc 0 "$store: the clock grant"
    call "$LEASE" --store "$U" history "$P/h"
    expect_rc 0 "$store: history"
    echo "$OUT"
    history_aligned "$store: history" "$OUT"
    call "$LEASE" --store "$U" show "$P/clock"
    expect_rc 0 "$store: show"
    # shellcheck disable=SC2046
    assert_eq "$(first 4 $(starts "$OUT"))" "0 33 42 48" "$store: show keeps the classic columns"
done

section "sqlite: a key over 32 columns, a ttl of 24 h"
export LEASE_STORE=sqlite://$T/columns.db
LONG=$P/a-key-that-is-longer-than-thirty-two-columns
call "$LEASE" acquire "$P/short" --ttl 24h --label short
call "$LEASE" acquire "$LONG" --ttl 1m --label long
call "$LEASE" acquire "$P/é-accent" --ttl 1m --label accent
call "$LEASE" ls "$P/"
expect_rc 0 "sqlite: ls"
echo "$OUT"
ls_aligned "sqlite: ls with a long key and a non-ASCII one" "$OUT"
call "$LEASE" acquire "$P/t" --ttl 24h --label day --json
call "$LEASE" release "$P/t" --owner "$(jget "$OUT" .owner)" --token "$(jget "$OUT" .token)"
call "$LEASE" acquire "$P/t" --ttl 1s --label second
call "$LEASE" history "$P/t"
expect_rc 0 "sqlite: history"
echo "$OUT"
history_aligned "sqlite: history with a 24 h ttl" "$OUT"

section "sqlite: an expired lease names its last holder; a free key's row ends at its token"
call "$LEASE" acquire "$P/gone" --ttl 100ms --label gone --json
GONE_OWNER=$(jget "$OUT" .owner)
for _ in $(seq 100); do
    call "$LEASE" show "$P/gone" --json
    [ "$(jget "$OUT" .state)" = expired ] && break
    sleep 0.1
done
assert_eq "$(jget "$OUT" .state)" expired "sqlite: a 100 ms lease expires"
call "$LEASE" show "$P/gone"
assert_match "$OUT" " expired +token 1 +- +gone \\($GONE_OWNER\\)$" "sqlite: show of an expired lease"
call "$LEASE" ls "$P/"
echo "$OUT"
ls_aligned "sqlite: ls with an expired lease" "$OUT"
call "$LEASE" acquire "$P/free" --ttl 1m --json
call "$LEASE" release "$P/free" --owner "$(jget "$OUT" .owner)" --token "$(jget "$OUT" .token)"
call "$LEASE" show "$P/free"
assert_match "$OUT" " free +token 1$" "sqlite: show of a free key, no padding after its token"

finish
