#!/usr/bin/env bash
# resource_redis: the Redis Functions library resource/redis/lease_fence.lua
# on the shared test server (LEASE_TEST_REDIS_URL; without it this fails,
# it never skips).
#
#   resource_redis.sh LEASE_BINARY LEASE_FENCE_LUA
#
# (a) the library alone, through redis-cli: it loads (twice: REPLACE), a
#     fresh mark is nil, a token is accepted and written, an equal one too,
#     a smaller one is refused with "STALE token T < mark M" and writes
#     nothing, bad tokens and a bad mark key are refused and write nothing.
# (b) the stale holder with real processes: A holds a lease through
#     `lease run` on a SQLite lease store, is stopped (SIGSTOP) past its
#     ttl, B takes the lease and writes through lease_fence_set, A resumes
#     and writes with its old token: Redis refuses it and keeps B's value.
# (c) the control: the same race with a plain SET lets A's stale write
#     overwrite B's, which is what the fence is for.
#
# No fixed sleeps: every wait is a bounded loop on a file or on the store.
. "$(dirname "$0")/../cli/lib.sh" "$1"

LUA=${2:?usage: resource_redis.sh LEASE_BINARY LEASE_FENCE_LUA}
URL=${LEASE_TEST_REDIS_URL:-}
if [ -z "$URL" ]; then
    echo "LEASE_TEST_REDIS_URL is not set: start a server (scripts/test.sh does)" >&2
    exit 1
fi
command -v redis-cli >/dev/null || die "redis-cli is required"
export URL T

# rc ARGS...: redis-cli on the test server; stdout only (it warns on stderr
# about a password in -u). Raw output: an error reply is its bare text.
rc() {
    ${BOUND[@]+"${BOUND[@]}"} redis-cli -u "$URL" --raw "$@" 2>>"$T/redis-cli.err"
}
P="lease-test:resource_redis:$$:$RANDOM"
MARK="$P:{r}:mark" DATA="$P:{r}:data"
cleanup_keys() { rc DEL "$MARK" "$DATA" "$P:{c}:mark" "$P:{c}:data" >/dev/null || true; }
trap 'cleanup_keys; cleanup' EXIT

section "(a) the library through redis-cli"
assert_eq "$(rc -x FUNCTION LOAD REPLACE <"$LUA")" lease_fence "FUNCTION LOAD REPLACE"
assert_eq "$(rc -x FUNCTION LOAD REPLACE <"$LUA")" lease_fence "loading again replaces it"
assert_eq "$(rc FCALL_RO lease_fence_mark 1 "$MARK")" "" "a fresh mark is nil"
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 41 first)" OK "token 41 accepted"
assert_eq "$(rc GET "$DATA")" first "41's value written"
assert_eq "$(rc FCALL_RO lease_fence_mark 1 "$MARK")" 41 "the mark is 41"
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 41 second)" OK "an equal token accepted"
assert_eq "$(rc GET "$DATA")" second "the equal token's value written"
assert_eq "$(rc FCALL lease_fence_check 1 "$MARK" 42)" 42 "check advances to 42"
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 41 stale)" "STALE token 41 < mark 42" \
    "a stale token refused"
assert_eq "$(rc GET "$DATA")" second "the stale value was not written"
assert_eq "$(rc FCALL lease_fence_check 1 "$MARK" 7)" "STALE token 7 < mark 42" \
    "check refuses a stale token"
assert_eq "$(rc GET "$MARK")" 42 "refusals left the mark"
# Beyond 2^53, where Lua numbers would round: compared as decimal strings.
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 9223372036854775806 big)" OK "2^63-2 accepted"
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 9223372036854775805 x)" \
    "STALE token 9223372036854775805 < mark 9223372036854775806" "2^63-3 refused after 2^63-2"
for bad in 0 -1 01 +5 1e3 abc "" " 5" 9223372036854775808 18446744073709551616; do
    assert_match "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" "$bad" x)" "^ERR bad token" \
        "bad token '$bad' refused"
done
assert_eq "$(rc GET "$DATA")" big "bad tokens wrote nothing"
assert_eq "$(rc GET "$MARK")" 9223372036854775806 "bad tokens left the mark"
rc SET "$MARK" not-a-token >/dev/null
assert_match "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 5 x)" "^ERR bad mark" "a bad mark key refused"
assert_eq "$(rc GET "$DATA")" big "a bad mark wrote nothing"
assert_match "$(rc FCALL lease_fence_set 1 "$MARK" 5 x)" "^ERR wrong number" "wrong key count refused"
cleanup_keys
# A mark lost (evicted, expired, deleted) while its data remains would let
# any token in: refused until a mark is installed again.
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 50 fifty)" OK "token 50 accepted"
rc DEL "$MARK" >/dev/null
assert_match "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 3 stale)" "^ERR mark missing" \
    "data without its mark refused"
assert_eq "$(rc GET "$DATA")" fifty "nothing written without the mark"
assert_eq "$(rc FCALL lease_fence_check 1 "$MARK" 50)" 50 "the holder installs its mark again"
assert_eq "$(rc FCALL lease_fence_set 2 "$MARK" "$DATA" 3 stale)" "STALE token 3 < mark 50" \
    "then the stale token is refused as such"
assert_match "$(rc FCALL lease_fence_set 2 "$MARK" "$MARK" 60 x)" "^ERR the mark key and the data key" \
    "the same key as mark and data refused"
assert_eq "$(rc GET "$MARK")" 50 "the mark was not overwritten"
cleanup_keys

# race WRITE MARK DATA TAG: A holds key TAG through `lease run` and is
# stopped past its ttl; B takes it and writes B; A resumes and writes A
# with its old token. WRITE is how a worker writes ("fence" or "set").
# A's reply is in $A_REPLY, its token in $A_TOKEN, B's in $B_TOKEN.
race() {
    local how=$1 mark=$2 data=$3 tag=$4 pid cpid
    local write='if [ "$1" = fence ]; then redis-cli -u "$URL" --raw FCALL lease_fence_set 2 "$2" "$3" "$LEASE_TOKEN" "$4"; else redis-cli -u "$URL" --raw SET "$3" "$4"; fi'
    # Worker A: say its pid and token, wait (bounded) for the go, write.
    local worker_a=': > "$T/$5.ready"; echo $$ > "$T/$5.pid"; echo "$LEASE_TOKEN" > "$T/$5.token"
i=0; while [ ! -e "$T/$5.go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
'"$write"' > "$T/$5.reply" 2>/dev/null; : > "$T/$5.done"'
    "$LEASE" run "$tag" --ttl 1s -- sh -c "$worker_a" a "$how" "$mark" "$data" A "$tag" \
        2>"$T/$tag.a.err" &
    pid=$!
    bg_register "$pid"
    wait_for "$tag: A's worker runs" test -e "$T/$tag.ready"
    cpid=$(cat "$T/$tag.pid")
    # The whole of A: its supervisor and its worker (a process group of
    # its own), as a pause of the machine or the VM would.
    kill -STOP "$pid"
    kill -STOP -- "-$cpid"
    wait_for "$tag: A's lease expired in the store" key_state_is "$tag" expired
    call "$LEASE" run "$tag" --ttl 30s -- sh -c 'echo "$LEASE_TOKEN"; '"$write" b "$how" "$mark" "$data" B
    expect_rc 0 "$tag: B takes the lease and writes"
    B_TOKEN=$(printf '%s\n' "$OUT" | head -n 1)
    assert_eq "$(printf '%s\n' "$OUT" | sed -n 2p)" OK "$tag: B's write accepted"
    # A's worker goes first, before its supervisor can stop it: a request
    # already on its way when the pause began.
    : > "$T/$tag.go"
    kill -CONT -- "-$cpid"
    wait_for "$tag: A's worker wrote" test -e "$T/$tag.done"
    kill -CONT "$pid"
    wait_exit "$pid" A_EXIT "$tag: A's lease run ends"
    A_TOKEN=$(cat "$T/$tag.token")
    A_REPLY=$(cat "$T/$tag.reply")
    assert_gt "$B_TOKEN" "$A_TOKEN" "$tag: B's token is greater than A's"
}

section "(b) A stopped past its lease, B writes, A's late write is refused by Redis"
race fence "$MARK" "$DATA" fenced
assert_eq "$A_REPLY" "STALE token $A_TOKEN < mark $B_TOKEN" "A's stale write refused by Redis"
assert_eq "$(rc GET "$DATA")" B "B's value stands"
assert_eq "$(rc GET "$MARK")" "$B_TOKEN" "the mark is B's token"

section "(c) control: the same race with a plain SET lets A's stale write through"
race set "$P:{c}:mark" "$P:{c}:data" unfenced
assert_eq "$A_REPLY" OK "A's stale SET accepted"
assert_eq "$(rc GET "$P:{c}:data")" A "A's stale value overwrote B's"

finish
