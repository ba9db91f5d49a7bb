#!/usr/bin/env bash
# redis_wait_replicas: ?wait_replicas=N&wait_timeout=DUR - after each
# acquisition the store WAITs for N replicas; when fewer acknowledge in
# time the grant exists on the primary but may not survive a failover, so
# acquire fails with ESTORE (exit 6: ownership uncertain), and acquiring
# again with the same owner is safe: same token once it succeeds.
#
# A primary and one replica (--replicaof), both started here.
# (a) replica up, wait_replicas=1: acquisitions succeed, and the replica
#     has the grant as soon as acquire returns.
# (b) replica stopped: ESTORE; the grant is on the primary (another owner
#     is busy, not granted); the same owner's retry stays ESTORE with no
#     new token; the message names the owner and the token (also the
#     owner acquire made up when none was given); replica back: the retry
#     succeeds with the same token.
# (c) wait_replicas=2 with one replica: ESTORE; retried with
#     wait_replicas=1 by the same owner: the same token.
# (d) renew and release do not wait (the URL promises it for acquisitions).
# (e) a URL naming the replica: acquisitions fail with ESTORE (READONLY).
. "$(dirname "$0")/redis_lib.sh" "$@"

# No 5 s delay before a full sync (the default of diskless sync).
redis_start primary --repl-diskless-sync-delay 0 || die "start the primary"
redis_start replica --replicaof 127.0.0.1 "$PORT_primary" || die "start the replica"
WAIT_TRIES=400 wait_for "the replica is in sync" replica_synced replica || die "no replication"

P=$(redis_url primary)
W1="$P?wait_replicas=1&wait_timeout=1s"
W2="$P?wait_replicas=2&wait_timeout=1s"
OWNER_A=0b0b0b0b-aaaa-4aaa-8aaa-000000000001
OWNER_B=0b0b0b0b-bbbb-4bbb-8bbb-000000000002
OWNER_C=0b0b0b0b-cccc-4ccc-8ccc-000000000003
OWNER_D=0b0b0b0b-dddd-4ddd-8ddd-000000000004

# field_on NAME KEY FIELD: the token or owner of KEY's newest grant on
# server NAME (the store's key layout: the list lease:{KEY}:token, its head
# the grant "TOKEN OWNER ...", see src/stores/redis/lib.lua).
field_on() {
    local n=1
    [ "$3" = owner ] && n=2
    rcli "$1" lindex "lease:{$2}:token" 0 2>/dev/null | cut -d' ' -f"$n"
}

section "(a) replica up: wait_replicas=1 acquisitions succeed"
last=0
for i in 1 2 3 4 5; do
    t0=$(now_ms)
    call "$LEASE" --store "$W1" acquire "ok$i" --ttl 30s --json
    expect_rc 0 "acquire ok$i with wait_replicas=1"
    echo "acquire ok$i with wait_replicas=1: $(($(now_ms) - t0)) ms"
    tok=$(jget "$OUT" .token)
    owner=$(jget "$OUT" .owner)
    # WAIT returned 1: the replica acknowledged the write, so it has it now.
    assert_eq "$(field_on replica "ok$i" owner)" "$owner" "the replica has the grant of ok$i"
    assert_eq "$(field_on replica "ok$i" token)" "$tok" "the replica has the token of ok$i"
done
call "$LEASE" --store "$W1" acquire same --ttl 30s --owner "$OWNER_A" --json
expect_rc 0 "acquire same by A"
tok_a=$(jget "$OUT" .token)
call "$LEASE" --store "$W1" acquire same --ttl 30s --owner "$OWNER_A" --json
expect_rc 0 "acquire same again by A"
assert_eq "$(jget "$OUT" .token)" "$tok_a" "A's retry: the same token"
call "$LEASE" --store "$W1" acquire same --ttl 30s --owner "$OWNER_B"
expect_error 3 "B on A's key: busy"

section "(b) replica stopped: acquire is ESTORE, the same owner's retry is safe"
redis_stop replica
t0=$(now_ms)
call "$LEASE" --store "$W1" acquire k --ttl 30s --owner "$OWNER_B" --json
echo "acquire with the replica down: exit $RC after $(($(now_ms) - t0)) ms"
expect_error 6 "acquire with wait_replicas=1 and no replica"
assert_contains "$ERR" ESTORE "the message names ESTORE"
assert_contains "$ERR" uncertain "the message says ownership is uncertain"
assert_not_contains "$ERR" EBUSY "not EBUSY"
# The grant was made on the primary before the WAIT: it is held by B there.
call "$LEASE" --store "$P" show k --json
expect_rc 0 "show k on the primary"
assert_eq "$(jget "$OUT" .state)" held "k is held on the primary"
assert_eq "$(jget "$OUT" .owner)" "$OWNER_B" "k is held by B, whose acquire said ESTORE"
tok_b=$(jget "$OUT" .token)
assert_gt "$tok_b" 0 "k has a token"
call "$LEASE" --store "$W1" acquire k --ttl 30s --owner "$OWNER_C"
expect_error 3 "another owner is busy on k (not granted, not ESTORE)"
call "$LEASE" --store "$W1" acquire k --ttl 30s --owner "$OWNER_B" --json
expect_error 6 "B's retry while the replica is still down"
call "$LEASE" --store "$P" show k --json
assert_eq "$(jget "$OUT" .token)" "$tok_b" "B's failed retry issued no new token"
assert_eq "$(jget "$OUT" .owner)" "$OWNER_B" "still B's"
# The message names the owner and the token: the retry it calls safe needs
# the owner, and a user who let acquire pick one has no other way to it.
call "$LEASE" --store "$W1" acquire k --ttl 30s --owner "$OWNER_B"
expect_error 6 "B's retry, in text"
assert_contains "$ERR" "owner $OWNER_B" "the message names B's owner"
assert_contains "$ERR" "token $tok_b " "the message names B's token"
call "$LEASE" --store "$W1" acquire anon --ttl 30s
expect_error 6 "acquire with no --owner while the replica is down"
anon_owner=$(printf '%s' "$ERR" | grep -oE 'owner [0-9a-f-]{36}' | head -n 1 | cut -d' ' -f2)
anon_tok=$(printf '%s' "$ERR" | grep -oE 'token [0-9]+' | head -n 1 | cut -d' ' -f2)
call "$LEASE" --store "$P" show anon --json
assert_eq "$(jget "$OUT" .owner)" "$anon_owner" "the generated owner the message names holds anon"
assert_eq "$(jget "$OUT" .token)" "$anon_tok" "the token the message names is anon's"

redis_restart replica --replicaof 127.0.0.1 "$PORT_primary" || die "restart the replica"
WAIT_TRIES=400 wait_for "the replica is in sync again" replica_synced replica
call "$LEASE" --store "$W1" acquire k --ttl 30s --owner "$OWNER_B" --json
expect_rc 0 "B's retry once the replica is back"
assert_eq "$(jget "$OUT" .token)" "$tok_b" "B's retry gets the same token"
assert_eq "$(field_on replica k token)" "$tok_b" "the replica has B's grant"
call "$LEASE" --store "$W1" acquire anon --ttl 30s --owner "$anon_owner" --json
expect_rc 0 "the retry with the owner the message named"
assert_eq "$(jget "$OUT" .token)" "$anon_tok" "it gets the token the message named"

section "(c) wait_replicas=2 with one replica"
call "$LEASE" --store "$W2" acquire k2 --ttl 30s --owner "$OWNER_D" --json
expect_error 6 "acquire with wait_replicas=2 and one replica"
assert_contains "$ERR" uncertain "the message says ownership is uncertain"
call "$LEASE" --store "$P" show k2 --json
assert_eq "$(jget "$OUT" .owner)" "$OWNER_D" "k2 is D's on the primary"
tok_d=$(jget "$OUT" .token)
call "$LEASE" --store "$W2" acquire k2 --ttl 30s --owner "$OWNER_D" --json
expect_error 6 "D's retry with wait_replicas=2 stays ESTORE"
call "$LEASE" --store "$W1" acquire k2 --ttl 30s --owner "$OWNER_D" --json
expect_rc 0 "D's retry with wait_replicas=1"
assert_eq "$(jget "$OUT" .token)" "$tok_d" "D's retry gets the same token"

section "(d) renew and release do not wait for replicas"
call "$LEASE" --store "$W2" renew k2 --owner "$OWNER_D" --token "$tok_d" --ttl 30s
expect_rc 0 "renew with wait_replicas=2 (renewals are not waited for)"
call "$LEASE" --store "$W2" release k2 --owner "$OWNER_D" --token "$tok_d"
expect_rc 0 "release with wait_replicas=2"
call "$LEASE" --store "$W1" acquire k2 --ttl 30s --owner "$OWNER_A" --json
expect_rc 0 "the next owner of k2"
assert_gt "$(jget "$OUT" .token)" "$tok_d" "the next token of k2 is greater"

section "(e) a URL that names the replica"
RU=$(redis_url replica)
call "$LEASE" --store "$RU" acquire onreplica --ttl 30s
expect_error 6 "acquire on a read-only replica: ESTORE, not busy, not granted"
assert_contains "$ERR" READONLY "the message passes on the server's READONLY"
call "$LEASE" --store "$P" show onreplica
expect_rc 1 "nothing was granted on the primary"
call "$LEASE" --store "$RU" show k --json
expect_rc 0 "show on the replica (read-only work)"
assert_eq "$(jget "$OUT" .owner)" "$OWNER_B" "the replica reports the replicated grant"
call "$LEASE" --store "$RU" fence resx 5
expect_error 6 "fence on a read-only replica: ESTORE"

section "bad parameters"
for q in "wait_replicas=-1" "wait_replicas=x" "wait_replicas=" "wait_timeout=0s" \
    "wait_timeout=1" "wait_timeout=abc" "wait_replica=1"; do
    call "$LEASE" --store "$P?$q" acquire bad --ttl 5s
    expect_rc 2 "URL parameter $q is refused (usage error)"
    assert_contains "$ERR" EINVALID "URL parameter $q: EINVALID"
done

finish
