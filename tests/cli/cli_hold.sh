#!/usr/bin/env bash
# cli_hold: `lease hold` and `lease claim` - many leases in one session for
# one command: the child's environment (LEASE_COUNT, LEASE_KEY_<i>,
# LEASE_TOKEN_<i>, LEASE_SHARDS, LEASE_SHARD_<i>; no LEASE_KEY nor
# LEASE_TOKEN), all or nothing when a key is busy, usage errors before any
# acquire (keys too many for the command's environment among them),
# --keys-from (CRLF and comment lines too), claim around another owner's shards, the command
# stopped (exit 4) when one of its grants is taken behind its back, keys
# acquired in byte order, a key lost while --wait waits for a later one
# (exit 4, the command never started), and --wait through a store failure.
#
# No assertion here is about durations: waits are bounded loops on what the
# store or the tool's events say.
. "$(dirname "$0")/lib.sh" "$@"

DB=$T/hold.db
export LEASE_STORE=sqlite://$DB
export T
OWNER_B=6f1c2b7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f

file_has() {
    grep -q "$2" "$1" 2>/dev/null
}

# lib_lost FILE: the library logged a grant lost (its JSON lines carry a
# "level"; the tool's own events do not).
lib_lost() {
    grep '"level"' "$1" 2>/dev/null | grep -q '"lost"'
}

# held_keys PREFIX: the keys under PREFIX held now, sorted, one per line.
held_keys() {
    "$LEASE" ls "$1" --json 2>/dev/null |
        jq -r '[.[] | select(.state == "held") | .key] | sort | .[]' 2>/dev/null
}

# no_key_under PREFIX: the store has no lease at all under PREFIX (nothing
# was ever acquired there).
no_key_under() {
    [ "$("$LEASE" ls "$1" --json 2>/dev/null | jq 'length' 2>/dev/null)" = 0 ]
}

# The child of (a), (d) and (e): its environment, one variable a line, into
# $T/$0.env (keys hold no newline here), and the store seen while it runs.
# shellcheck disable=SC2016
DUMP='{
    echo "count=${LEASE_COUNT-unset}"
    echo "key=${LEASE_KEY-unset}"
    echo "token=${LEASE_TOKEN-unset}"
    echo "stale=${LEASE_KEY_7-unset}"
    echo "owner=${LEASE_OWNER-unset}"
    echo "ttl=${LEASE_TTL_MS-unset}"
    echo "shards=${LEASE_SHARDS-unset}"
    i=0
    while [ "$i" -lt "${LEASE_COUNT:-0}" ]; do
        eval "echo \"key_$i=\${LEASE_KEY_$i-unset}\""
        eval "echo \"token_$i=\${LEASE_TOKEN_$i-unset}\""
        eval "echo \"shard_$i=\${LEASE_SHARD_$i-unset}\""
        i=$((i + 1))
    done
} > "$T/$0.env"
"$1" ls --json > "$T/$0.ls"'

# envv TAG NAME: the value the child of TAG had for NAME.
envv() {
    sed -n "s/^$2=//p" "$T/$1.env" 2>/dev/null | head -n 1
}

section "(a) hold of 3 keys: the environment, held while CMD runs, released after"
# An outer run's or hold's variables must not leak into this command.
call env LEASE_KEY=outer LEASE_TOKEN=99 LEASE_KEY_7=stale \
    "$LEASE" hold a/one "a/two words=2" a/three --json --pass-store -- sh -c "$DUMP" a "$LEASE"
expect_rc 0 "hold of 3 keys"
assert_eq "$(envv a count)" 3 "LEASE_COUNT"
assert_eq "$(envv a key_0)|$(envv a key_1)|$(envv a key_2)" "a/one|a/two words=2|a/three" \
    "LEASE_KEY_<i>: the keys in the order given, whole"
assert_eq "$(envv a key)" unset "no LEASE_KEY (not even the outer one)"
assert_eq "$(envv a token)" unset "no LEASE_TOKEN (not even the outer one)"
assert_eq "$(envv a stale)" unset "an outer LEASE_KEY_7 is dropped"
assert_eq "$(envv a shards)" unset "no LEASE_SHARDS for hold"
assert_match "$(envv a owner)" "$UUID_RE" "LEASE_OWNER is a UUID"
assert_eq "$(envv a ttl)" 30000 "LEASE_TTL_MS by default"
LS_A=$(cat "$T/a.ls" 2>/dev/null)
for i in 0 1 2; do
    k=$(envv a "key_$i")
    assert_match "$(envv a "token_$i")" '^[1-9][0-9]*$' "LEASE_TOKEN_$i is a number"
    assert_eq "$(jget "$LS_A" ".[] | select(.key == \"$k\") | [.state, .owner, (.token | tostring)] | @tsv")" \
        "$(printf 'held\t%s\t%s' "$(envv a owner)" "$(envv a "token_$i")")" \
        "while CMD runs, $k is held by LEASE_OWNER with LEASE_TOKEN_$i"
done
printf '%s\n' "$ERR" >"$T/a.err"
assert_eq "$(ev "$T/a.err" '[.[].event] | join(" ")')" \
    "acquired acquired acquired started exited released released released" \
    "hold --json: one acquired and one released event per key, in order"
assert_eq "$(ev "$T/a.err" '[.[] | select(.event == "acquired") | "\(.key)=\(.token)"] | join(",")')" \
    "a/one=$(envv a token_0),a/two words=2=$(envv a token_1),a/three=$(envv a token_2)" \
    "acquired events: each key with the token its command was given"
assert_eq "$(ev "$T/a.err" '.[] | select(.event == "started") | .count')" 3 \
    "started event: the count of keys"
assert_eq "$(ev "$T/a.err" '.[] | select(.event == "exited") | [.code, .before_deadline] | @tsv')" \
    "$(printf '0\ttrue')" "exited event: code 0, before the deadline"
assert_eq "$(held_keys a/)" "" "after CMD: no key is held"
call "$LEASE" show "a/two words=2" --json
assert_eq "$(jget "$OUT" '[.state, (.token | tostring)] | @tsv')" "$(printf 'free\t%s' "$(envv a token_1)")" \
    "after CMD: the key was released (not left to expire)"

call "$LEASE" hold a/one --ttl 5s -- sh -c 'exit 7'
expect_rc 7 "hold exits with the command's status"

section "(b) a key held by another owner: exit 3, nothing left held, CMD not run"
call "$LEASE" acquire b/2 --owner "$OWNER_B" --ttl 60s
expect_rc 0 "another owner takes b/2"
call "$LEASE" hold b/1 b/2 b/3 -- touch "$T/b.ran"
expect_rc 3 "hold with a busy key: exit 3"
assert_contains "$ERR" "b/2" "the message names the busy key"
assert_no_file "$T/b.ran" "the command did not run"
assert_eq "$(held_keys b/)" "b/2" "only the other owner's key is held"
call "$LEASE" show b/1 --json
assert_eq "$(jget "$OUT" .state)" free "b/1, acquired before b/2, was released"
call "$LEASE" show b/3 --json
expect_rc 1 "b/3, after the busy key, was never acquired"
call "$LEASE" show b/2 --json
assert_eq "$(jget "$OUT" .owner)" "$OWNER_B" "b/2 still the other owner's"
call "$LEASE" hold b/9 b/2 --wait 300ms -- touch "$T/b.ran"
expect_rc 7 "hold --wait with a key still busy after the wait: exit 7"
assert_no_file "$T/b.ran" "the command did not run after the wait"
assert_eq "$(held_keys b/)" "b/2" "nothing of ours held after the wait"

section "(c) usage errors: exit 2, a message, nothing acquired"
usage_case() {
    local what=$1
    shift
    call "$LEASE" "$@"
    expect_error 2 "$what"
    if no_key_under c/; then pass; else
        fail "$what: something was acquired under c/: $("$LEASE" ls c/ 2>&1 | head -c 400)"
    fi
}
usage_case "a key given twice" hold c/1 c/2 c/1 -- true
assert_contains "$ERR" "c/1" "the duplicate is named"
printf 'c/5\nc/1\n' >"$T/c.keys"
usage_case "a key of the file also on the command line" hold c/1 --keys-from "$T/c.keys" -- true
usage_case "no keys" hold -- true
assert_contains "$ERR" "no keys" "no keys: said so"
: >"$T/c.empty"
usage_case "an empty --keys-from and no KEY" hold --keys-from "$T/c.empty" -- true
usage_case "--keys-from a missing file" hold c/1 --keys-from "$T/no-such-file" -- true
usage_case "an unknown flag" hold c/1 --nosuch -- true
usage_case "no command" hold c/1 c/2
usage_case "a bad --ttl" hold c/1 --ttl 0 -- true
usage_case "claim: --count above --of" claim c --count 11 --of 10 -- true
usage_case "claim: --count 0" claim c --count 0 --of 10 -- true
usage_case "claim: --of 0" claim c --count 1 --of 0 -- true
usage_case "claim: --of above the cap" claim c --count 1 --of 100001 -- true
usage_case "claim: no --of" claim c --count 1 -- true
usage_case "claim: no --count" claim c --of 3 -- true
usage_case "claim: no PREFIX" claim --count 1 --of 3 -- true
usage_case "claim: --wait is not one of its flags" claim c --count 1 --of 3 --wait 1s -- true
usage_case "claim: two prefixes" claim c d --count 1 --of 3 -- true

section "(d) --keys-from: 50 keys (and blank lines), after those of the command line"
{
    for i in $(seq 1 50); do
        echo "d/file key $i"
        [ $((i % 10)) = 0 ] && echo && echo "  "
    done
} >"$T/d.keys"
call "$LEASE" hold d/arg --keys-from "$T/d.keys" --pass-store -- sh -c "$DUMP" d "$LEASE"
expect_rc 0 "hold --keys-from of 50 keys"
assert_eq "$(envv d count)" 51 "LEASE_COUNT: the key of the command line and the 50 of the file"
WANT=$(printf 'd/arg\n'; seq 1 50 | sed 's/^/d\/file key /')
GOT=$(for i in $(seq 0 50); do envv d "key_$i"; done)
assert_eq "$GOT" "$WANT" "LEASE_KEY_0 .. LEASE_KEY_50: the keys, in order"
assert_eq "$(jq '[.[] | select(.state == "held" and (.key | startswith("d/")))] | length' "$T/d.ls" 2>/dev/null)" 51 \
    "while CMD runs, the 51 keys are held"
assert_eq "$(held_keys d/)" "" "after CMD: none is held"
call sh -c "printf 'd/in1\nd/in2\n' | \"\$0\" hold --keys-from - -- sh -c 'echo \"\$LEASE_COUNT \$LEASE_KEY_0 \$LEASE_KEY_1\"'" "$LEASE"
expect_rc 0 "hold --keys-from - (stdin)"
assert_eq "$OUT" "2 d/in1 d/in2" "--keys-from -: the keys from stdin"

section "(e) claim 3 of 10 while another owner holds shards 1, 4 and 7"
for i in 1 4 7; do
    call "$LEASE" acquire "e/$i" --owner "$OWNER_B" --ttl 60s
    expect_rc 0 "another owner takes e/$i"
done
call "$LEASE" claim e --count 3 --of 10 --json --pass-store -- sh -c "$DUMP" e "$LEASE"
expect_rc 0 "claim 3 of 10"
assert_eq "$(envv e count)" 3 "LEASE_COUNT: 3 shards claimed"
SHARDS=$(envv e shards)
assert_match "$SHARDS" '^[0-9] [0-9] [0-9]$' "LEASE_SHARDS: three shard numbers"
assert_eq "$(printf '%s\n' $SHARDS | sort -n | tr '\n' ' ')" "$SHARDS " "LEASE_SHARDS ascending"
for s in $SHARDS; do
    case " 1 4 7 " in *" $s "*) fail "claimed shard $s, which the other owner holds" ;; *) pass ;; esac
done
LS_E=$(cat "$T/e.ls" 2>/dev/null)
for i in 0 1 2; do
    s=$(envv e "shard_$i")
    assert_eq "$s" "$(echo "$SHARDS" | cut -d' ' -f$((i + 1)))" "LEASE_SHARD_$i: shard order"
    assert_eq "$(envv e "key_$i")" "e/$s" "LEASE_KEY_$i is exactly PREFIX/<shard>"
    assert_eq "$(jget "$LS_E" ".[] | select(.key == \"e/$s\") | [.state, .owner, (.token | tostring)] | @tsv")" \
        "$(printf 'held\t%s\t%s' "$(envv e owner)" "$(envv e "token_$i")")" \
        "while CMD runs, e/$s is held by LEASE_OWNER with LEASE_TOKEN_$i"
done
assert_eq "$(jget "$LS_E" '[.[] | select(.state == "held" and .owner != "'"$OWNER_B"'")] | length')" 3 \
    "while CMD runs, exactly 3 shards are held besides the other owner's"
printf '%s\n' "$ERR" >"$T/e.err"
assert_eq "$(ev "$T/e.err" '[.[] | select(.event == "acquired") | .shard] | map(tostring) | join(" ")')" \
    "$SHARDS" "acquired events: one per shard claimed, with its shard"
assert_eq "$(held_keys e/)" "$(printf 'e/1\ne/4\ne/7')" "after CMD: only the other owner's shards are held"

section "(f) claim when every shard is held elsewhere: exit 3"
for i in 0 1 2; do
    call "$LEASE" acquire "f/$i" --owner "$OWNER_B" --ttl 60s
    expect_rc 0 "another owner takes f/$i"
done
call "$LEASE" claim f --count 2 --of 3 -- touch "$T/f.ran"
expect_rc 3 "claim with every shard busy: exit 3"
assert_contains "$ERR" "could be claimed" "claim: the message says no shard could be claimed"
assert_no_file "$T/f.ran" "the command did not run"

section "(g) a grant released and taken behind the command's back: stopped, exit 4"
"$LEASE" hold g/1 g/2 g/3 --ttl 3s --json -- sh -c "$LOOP_60S" >"$T/g.out" 2>"$T/g.err" &
HOLD_PID=$!
bg_register "$HOLD_PID"
wait_for "g: started event" file_has "$T/g.err" '"event":"started"'
G_CHILD=$(ev "$T/g.err" '.[] | select(.event == "started") | .pid')
G_OWNER=$(ev "$T/g.err" '.[] | select(.event == "acquired" and .key == "g/2") | .owner')
G_TOKEN=$(ev "$T/g.err" '.[] | select(.event == "acquired" and .key == "g/2") | .token')
call "$LEASE" release g/2 --owner "$G_OWNER" --token "$G_TOKEN"
expect_rc 0 "g/2 released behind the command's back"
call "$LEASE" acquire g/2 --owner "$OWNER_B" --ttl 60s
expect_rc 0 "another owner takes g/2"
wait_exit "$HOLD_PID" hold_rc "lease hold whose grant was taken"
assert_eq "$hold_rc" 4 "lease hold exits 4 when one of its grants was lost"
if [[ "$G_CHILD" =~ ^[0-9]+$ ]]; then
    wait_for "g: the child ($G_CHILD) is gone" pid_gone "$G_CHILD"
else
    fail "g: no child pid in the started event: $G_CHILD"
fi
assert_eq "$(ev "$T/g.err" '[.[] | select(.event == "lost") | .key] | join(" ")')" "g/2" \
    "one lost event, for g/2"
assert_eq "$(ev "$T/g.err" '.[] | select(.event == "lost") | .reason')" ELOST "lost: ELOST"
assert_eq "$(ev "$T/g.err" '[.[] | select(.event == "stopping")] | length > 0')" true \
    "a stopping event"
assert_eq "$(ev "$T/g.err" '.[] | select(.event == "exited") | .before_deadline')" true \
    "the command exited before the deadline"
assert_eq "$(ev "$T/g.err" '[.[] | select(.event == "released") | .key] | join(" ")')" "g/1 g/3" \
    "the grants still held were released"
assert_eq "$(held_keys g/)" "g/2" "afterwards only the other owner's g/2 is held"
call "$LEASE" show g/2 --json
assert_eq "$(jget "$OUT" .owner)" "$OWNER_B" "g/2 is the other owner's (the lost grant released nothing)"

section "(h) --keys-from a file with CRLF line ends: the CR is no part of the key"
printf 'h/1\r\nh/2\r\n\r\n' >"$T/h.keys"
call "$LEASE" hold --keys-from "$T/h.keys" -- sh -c 'printf "%s|%s|%s" "$LEASE_COUNT" "$LEASE_KEY_0" "$LEASE_KEY_1"'
expect_rc 0 "hold --keys-from a CRLF file"
assert_eq "$OUT" "2|h/1|h/2" "the keys without their CR (and the CRLF blank line skipped)"
assert_eq "$("$LEASE" ls h/ --json 2>/dev/null | jq -r '[.[].key] | sort | join(" ")' 2>/dev/null)" \
    "h/1 h/2" "the store has h/1 and h/2, nothing with a CR"

section "(h2) --keys-from: comment lines are no keys"
printf '# the keys of h2\nh2/1\n   # indented, after spaces\n\t# after a tab\n\nh2/2 # not a comment: part of the key\n#\n' \
    >"$T/h2.keys"
call "$LEASE" hold --keys-from "$T/h2.keys" -- sh -c 'printf "%s|%s|%s" "$LEASE_COUNT" "$LEASE_KEY_0" "$LEASE_KEY_1"'
expect_rc 0 "hold --keys-from a file with comments"
assert_eq "$OUT" "2|h2/1|h2/2 # not a comment: part of the key" \
    "the two keys; the comment lines skipped, a '#' after a key kept in it"
assert_eq "$("$LEASE" ls --json 2>/dev/null | jq -r '[.[].key | select(startswith("#") or startswith(" ") or startswith("\t"))] | length' 2>/dev/null)" \
    0 "the store has no key made of a comment"
printf '# only comments\n  \n' >"$T/h2.none"
usage_case "a --keys-from of comments only, and no KEY" hold --keys-from "$T/h2.none" -- true
assert_contains "$ERR" "no keys" "comments only: no keys"
call "$LEASE" hold '#h2' -- sh -c 'printf %s "$LEASE_KEY_0"'
expect_rc 0 "a key that starts with '#' on the command line"
assert_eq "$OUT" "#h2" "the command line's key that starts with '#'"

section "(h3) --pass-store: CMD gets LEASE_STORE with it, and only with it"
STORE_OF_CMD='printf "[%s]" "${LEASE_STORE-unset}"'
call "$LEASE" hold h3/1 -- sh -c "$STORE_OF_CMD"
assert_eq "$OUT" "[unset]" "hold without --pass-store: no LEASE_STORE"
call "$LEASE" hold h3/1 --pass-store -- sh -c "$STORE_OF_CMD"
assert_eq "$OUT" "[$LEASE_STORE]" "hold --pass-store: LEASE_STORE"
call "$LEASE" claim h3 --count 1 --of 2 -- sh -c "$STORE_OF_CMD"
assert_eq "$OUT" "[unset]" "claim without --pass-store: no LEASE_STORE"
call "$LEASE" claim h3 --count 1 --of 2 --pass-store -- sh -c "$STORE_OF_CMD"
assert_eq "$OUT" "[$LEASE_STORE]" "claim --pass-store: LEASE_STORE"
for cmd in hold claim; do
    call "$LEASE" "$cmd" --help
    assert_contains "$OUT" "--pass-store  give CMD the store URL" "$cmd --help documents --pass-store"
done

section "(i) keys too many for the command's environment: exit 2, nothing acquired"
seq 1 20000 | sed 's/^/c\/a-key-of-some-length-/' >"$T/i.keys"
usage_case "hold of 20000 keys (over 1 MiB of environment)" hold --keys-from "$T/i.keys" -- true
assert_contains "$ERR" "1024 KiB" "the message names the limit"
usage_case "claim of 30000 shards (LEASE_SHARDS over 128 KiB)" claim c --count 30000 --of 30000 -- true
assert_contains "$ERR" "128 KiB" "the message names the limit of one variable"
call "$LEASE" claim i --count 3 --of 30000 -- sh -c 'echo "$LEASE_COUNT"'
expect_rc 0 "claim 3 of 30000 shards: within the limits"
assert_eq "$OUT" 3 "claim of 3 of 30000: 3 shards"

section "(j) hold acquires in byte order, whatever the order given"
call "$LEASE" hold j/b j/c j/a --json -- sh -c 'echo "$LEASE_KEY_0 $LEASE_KEY_1 $LEASE_KEY_2"'
expect_rc 0 "hold j/b j/c j/a"
assert_eq "$OUT" "j/b j/c j/a" "LEASE_KEY_<i> keeps the order given"
printf '%s\n' "$ERR" >"$T/j.err"
# Each grant's deadline is its acquire's time plus the ttl: their order
# is the order of the acquires.
assert_eq "$(ev "$T/j.err" '[.[] | select(.event == "acquired")] | sort_by(.deadline_ns) | map(.key) | join(" ")')" \
    "j/a j/b j/c" "the keys were acquired in byte order"

section "(k) a key lost while hold --wait waits for a later one: exit 4, CMD not run"
call "$LEASE" acquire k/2 --owner "$OWNER_B" --ttl 60s --json
expect_rc 0 "another owner takes k/2"
K2_TOKEN=$(jget "$OUT" .token)
"$LEASE" hold k/1 k/2 --wait 60s --ttl 3s --json -- touch "$T/k.ran" >"$T/k.out" 2>"$T/k.err" &
HOLD_PID=$!
bg_register "$HOLD_PID"
wait_for "k: k/1 held by the hold, waiting for k/2" key_state_is k/1 held
call "$LEASE" show k/1 --json
K_OWNER=$(jget "$OUT" .owner)
K_TOKEN=$(jget "$OUT" .token)
call "$LEASE" release k/1 --owner "$K_OWNER" --token "$K_TOKEN"
expect_rc 0 "k/1 released behind the waiting hold's back"
call "$LEASE" acquire k/1 --owner "$OWNER_B" --ttl 60s
expect_rc 0 "another owner takes k/1"
# The session finds k/1 taken at its next renewal and says so (the
# library's warning, a JSON line with a level); then k/2 is let go.
wait_for "k: the session saw k/1 lost" lib_lost "$T/k.err"
call "$LEASE" release k/2 --owner "$OWNER_B" --token "$K2_TOKEN"
expect_rc 0 "the other owner lets k/2 go"
wait_exit "$HOLD_PID" hold_rc "lease hold whose first key was lost while it waited"
assert_eq "$hold_rc" 4 "exit 4: a key was lost before the command started"
assert_eq "$(ev "$T/k.err" '[.[] | select(.event == "started")] | length')" 0 \
    "no started event: the command was not run"
assert_no_file "$T/k.ran" "the command did not run"
assert_contains "$(cat "$T/k.err")" "k/1 was lost before the command could start" \
    "the message names the lost key"
assert_eq "$(ev "$T/k.err" '[.[] | select(.event == "lost") | "\(.key) \(.reason)"] | join(",")')" \
    "k/1 ELOST" "one lost event: k/1, with its own reason"
assert_eq "$(held_keys k/)" "k/1" "afterwards only the other owner's k/1 is held (k/2 released)"

section "(l) hold --wait through a store failure: retried while the wait lasts"
start_locker "$DB" 3
call "$LEASE" --timeout 300ms hold l/1 --wait 30s -- touch "$T/l.ran"
expect_rc 0 "hold --wait 30s while the database is locked for 3 s"
assert_file "$T/unlocked" "the hold ended after the lock was dropped"
assert_file "$T/l.ran" "the command ran"
wait_exit "$LOCKER" locker_rc "the sqlite3 locker"

finish
