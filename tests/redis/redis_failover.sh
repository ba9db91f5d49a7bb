#!/usr/bin/env bash
# redis_failover: the replication warning, measured. "Asynchronous replication
# can promote a replica that never received the original lock, allowing
# another client to acquire it" - and "an asynchronously replicated counter
# can lose an acknowledged increment during promotion; if that happens, a
# new owner may receive a token that is not newer than one already
# observed."
#
# Setup: a primary and a replica (both durable: appendonly yes, appendfsync
# always), three Sentinels (quorum 2, failover-timeout 5 s) monitoring them,
# and a fenced resource whose high-water mark lives in a separate SQLite
# file (it survives every failover).
#
# Each round:
#   1. owner A acquires KEY on the primary (ttl 30 s) and installs its token
#      at the resource (fence);
#   2. the primary is killed (kill -9) at once;
#   3. the Sentinels promote the replica (waited for, bounded);
#   4. owner B acquires KEY on the new primary. If that succeeds while A's
#      lease is still unexpired, the new primary had lost A's grant (N).
#      If B is told "busy", the grant survived: A releases and B acquires;
#   5. B installs its token at the resource; then A, now stale, writes with
#      its token. The resource must reject A whenever B's token is greater;
#      when B's token is not greater than A's (the counter lost A's
#      increment: M), this is recorded, and the resource must still never
#      accept a token lower than its mark. With clock tokens (the default,
#      issue 13) B's token must be greater than A's in every round, so the
#      resource always rejects the stale A;
#   6. B releases; the killed server comes back as a replica of the new
#      primary; the roles swap for the next round.
#
# The rounds cycle through four modes, the first three with the default
# clock-floored tokens (?tokens=clock: a new token is at least the server's
# clock in microseconds, so the promoted replica's next token is newer even
# when A's grant and its counter were lost):
#   plain        nothing is done to replication: on one host the replica
#                has A's grant in its socket before A even gets its answer;
#   paused       the replica's processing of writes is paused (CLIENT PAUSE
#                WRITE) just before A's acquire and resumed once its link to
#                the dead primary is gone: the replication lag of a loaded
#                or distant replica, made certain;
#   paused-wait  as paused, with ?wait_replicas=1&wait_timeout=500ms on A's
#                URL: A is told ESTORE (ownership uncertain) instead of a
#                grant the replica never acknowledged. An acquire that
#                succeeds in this mode must survive the failover;
#   paused-counter  as paused, with ?tokens=counter on A's and B's URLs: the
#                control. The lost grant takes its counter increment with it
#                and B is handed exactly A's token, so the resource accepts
#                both owners: this shows the test can see the failure that
#                clock tokens prevent.
#
# Passes when every round failed over, no stale write was accepted (a write
# whose token was lower than the mark, or A's write after B's greater token
# was installed), no acknowledged wait_replicas grant was lost, in every
# clock round B's token was greater than A's (when A got one) and no
# acknowledged token was handed out twice over all clock rounds, and at
# least one paused-counter round gave B exactly A's token. N and M are
# measurements, printed in the summary lines; so is how often the resource
# accepted the stale owner's write because B was handed A's very token.
# Nothing here asserts a duration.
#
# LEASE_FAILOVER_ROUNDS (default 12: 3 rounds per mode) sets the number of
# rounds; at least 4, so that the control runs.
. "$(dirname "$0")/redis_lib.sh" "$@"

if ! command -v redis-sentinel >/dev/null 2>&1; then
    echo "FATAL: redis-sentinel is required by the failover test but was not found in PATH" >&2
    exit 1
fi

ROUNDS=${LEASE_FAILOVER_ROUNDS:-12}
[ "$ROUNDS" -ge 4 ] ||
    die "LEASE_FAILOVER_ROUNDS=$ROUNDS: at least 4 rounds are needed, so that the paused-counter control (round 4) runs"
# Long enough that even a failover that needs a second election (Sentinel
# waits 2 x failover-timeout = 10 s before it) ends inside A's lease.
TTL_MS=30000
KEY=failover/job
RES=failover/resource
FENCE="sqlite://$T/resource.db"
MASTER=m
# Not 1000: a Sentinel sends its first PING on a new link only after 1 s
# (its ping period), so with down-after 1000 every link it opens - to each
# newly promoted master, each restarted replica - is "down" for a moment,
# and when all three see that about a new master they start a failover that
# is aborted, after which none may try again for 2 x failover-timeout.
DOWN_AFTER_MS=1500
SYNC_OPTS=(--repl-diskless-sync-delay 0)

# ---- setup -------------------------------------------------------------------

redis_start n1 "${SYNC_OPTS[@]}" || die "start n1"
redis_start n2 "${SYNC_OPTS[@]}" --replicaof 127.0.0.1 "$PORT_n1" || die "start n2"
WAIT_TRIES=600 wait_for "n2 is in sync with n1" replica_synced n2 || die "no replication"
for s in s1 s2 s3; do
    sentinel_start "$s" "$MASTER" "$PORT_n1" 2 \
        "sentinel down-after-milliseconds $MASTER $DOWN_AFTER_MS" \
        "sentinel failover-timeout $MASTER 5000" || die "start sentinel $s"
done

# scli NAME ARGS...: redis-cli against sentinel NAME.
scli() {
    local name=$1
    shift
    timeout -k 2 10 redis-cli -h 127.0.0.1 -p "$(cat "$T/$name/port")" "$@"
}

# sentinel_field NAME FIELD: a field of `SENTINEL master m` on sentinel NAME.
sentinel_field() {
    scli "$1" sentinel master "$MASTER" 2>/dev/null | tr -d '\r' |
        awk -v f="$2" 'NR % 2 == 1 { k = $0 } NR % 2 == 0 && k == f { print; exit }'
}

# sentinels_ready PRIMARY REPLICA: every sentinel sees PRIMARY as the master,
# the two other sentinels, and REPLICA as a healthy replica (flags exactly
# "slave": not down, not disconnected; its link to the master up).
sentinels_ready() {
    local p=$1 r=$2 s rport line
    rport=$(cat "$T/$r/port")
    for s in s1 s2 s3; do
        [ "$(sentinel_field "$s" port)" = "$(cat "$T/$p/port")" ] || return 1
        [ "$(sentinel_field "$s" flags)" = master ] || return 1
        [ "$(sentinel_field "$s" num-other-sentinels)" = 2 ] || return 1
        line=$(scli "$s" sentinel replicas "$MASTER" 2>/dev/null | tr -d '\r' |
            awk 'NR % 2 == 1 { k = $0 } NR % 2 == 0 { v[k] = $0 }
                 k == "master-link-status" && NR % 2 == 0 { print v["port"], v["flags"], v["master-link-status"] }')
        printf '%s\n' "$line" | grep -qx "$rport slave ok" || return 1
    done
    replica_synced "$r"
}

# promoted_to REPLICA: a sentinel names REPLICA as the master of m, and
# REPLICA itself says it is a master.
promoted_to() {
    local r=$1 rport s addr
    rport=$(cat "$T/$r/port")
    for s in s1 s2 s3; do
        addr=$(scli "$s" sentinel get-master-addr-by-name "$MASTER" 2>/dev/null | tr -d '\r' | tail -1)
        if [ "$addr" = "$rport" ]; then
            [ "$(rcli "$r" role 2>/dev/null | head -1 | tr -d '\r')" = master ] && return 0
        fi
    done
    return 1
}

# What the sentinels and servers say, for a failure message.
sentinel_dump() {
    local s n
    for s in s1 s2 s3; do
        echo "--- sentinel $s: master: $(scli "$s" sentinel master "$MASTER" 2>&1 | tr -d '\r' | paste -sd' ' | head -c 600)"
        echo "    replicas: $(scli "$s" sentinel replicas "$MASTER" 2>&1 | tr -d '\r' | paste -sd' ' | head -c 800)"
        echo "    log: $(tail -8 "$T/$s/sentinel.log")"
    done
    for n in n1 n2; do
        echo "--- $n: $(rcli "$n" info replication 2>&1 | tr -d '\r' | paste -sd' ' | head -c 400)"
    done
}

# link_gone REPLICA: the replica has dropped its link to the dead primary
# (or has already been promoted).
link_gone() {
    rcli "$1" info replication 2>/dev/null | tr -d '\r' |
        grep -qx -e 'master_link_status:down' -e 'role:master'
}

t0=$(now_ms)
WAIT_TRIES=600 wait_for "the sentinels see n1, each other and n2" sentinels_ready n1 n2 ||
    { sentinel_dump; die "the sentinels never got ready"; }
echo "sentinels ready after $(($(now_ms) - t0)) ms"

# fence_call TOKEN WHO: the resource's fencing check for a write of WHO.
# Sets F_RC (0 accepted, 5 stale), F_MARK (the mark after) and keeps the
# invariant counter: an accepted token lower than the mark it was checked
# against is a stale write accepted.
MARK=0          # the resource's mark as we last saw it
STALE_ACCEPTED=0
fence_call() {
    local tok=$1 who=$2
    call "$LEASE" --store "$FENCE" fence "$RES" "$tok" --json
    F_RC=$RC
    F_MARK=$(jget "$OUT" .mark)
    case $F_RC in
    0)
        if [ "$tok" -lt "$MARK" ]; then
            STALE_ACCEPTED=$((STALE_ACCEPTED + 1))
            fail "the resource accepted $who's token $tok below its mark $MARK"
        fi
        assert_eq "$F_MARK" "$tok" "accepted $who's token $tok: the mark is now $tok"
        ;;
    5)
        if [ "$tok" -ge "$MARK" ]; then
            fail "the resource rejected $who's token $tok although its mark was $MARK"
        fi
        assert_eq "$F_MARK" "$MARK" "rejected $who's token $tok: the mark stays $MARK"
        ;;
    *) fail "fence $tok for $who: unexpected exit $F_RC$(_ctx)" ;;
    esac
    [[ "$F_MARK" =~ ^[0-9]+$ ]] && MARK=$F_MARK
}

# verdict CODE: a fencing outcome in words.
verdict() {
    case $1 in 0) echo accepted ;; 5) echo rejected ;; none) echo - ;; *) echo "exit $1" ;; esac
}

# ---- rounds ------------------------------------------------------------------

PRIMARY=n1
REPLICA=n2
MODES=(plain paused paused-wait paused-counter)
declare -A ROUNDS_OF=() WITHIN_OF=() NEWER_OF=() EQUAL_OF=() LOWER_OF=()
for m in "${MODES[@]}"; do
    ROUNDS_OF[$m]=0 WITHIN_OF[$m]=0 NEWER_OF[$m]=0 EQUAL_OF[$m]=0 LOWER_OF[$m]=0
done
declare -A SEEN_TOKENS=()   # every acknowledged token of the clock rounds
REPEATS=0                   # ... and how often one came again
# seen_once ROUND WHO TOKEN: a clock round's acknowledged token must be new.
seen_once() {
    if [ -n "${SEEN_TOKENS[$3]:-}" ]; then
        REPEATS=$((REPEATS + 1))
        fail "round $1: $2's token $3 was already acknowledged (${SEEN_TOKENS[$3]})"
    else
        SEEN_TOKENS[$3]="round $1, $2"
        pass
    fi
}
N_WITHIN=0            # B granted while A's acknowledged lease was unexpired
M_BACK=0 M_EQUAL=0 M_LOWER=0
GRANT_SURVIVED=0
SAME_TOKEN_STALE_ACCEPTED=0
A_UNCERTAIN=0         # A told ESTORE (paused-wait rounds)
FAILOVERS=0
for ((r = 1; r <= ROUNDS; r++)); do
    mode=${MODES[$(((r - 1) % 4))]}
    ROUNDS_OF[$mode]=$((${ROUNDS_OF[$mode]} + 1))
    P_URL=$(redis_url "$PRIMARY")
    R_URL=$(redis_url "$REPLICA")
    A_URL=$P_URL
    [ "$mode" = paused-wait ] && A_URL="$P_URL?wait_replicas=1&wait_timeout=500ms"
    if [ "$mode" = paused-counter ]; then
        A_URL="$P_URL?tokens=counter"
        R_URL="$R_URL?tokens=counter"
    fi
    ownerA=$(cat /proc/sys/kernel/random/uuid)
    section "round $r ($mode): primary $PRIMARY ($P_URL), replica $REPLICA ($R_URL)"

    # 1. A acquires on the primary and installs its token.
    if [ "$mode" != plain ]; then
        rcli "$REPLICA" client pause 10000 write >/dev/null || fail "round $r: CLIENT PAUSE on the replica"
        t_pause=$(now_ms)
    fi
    tA=$(date +%s%3N)
    call "$LEASE" --store "$A_URL" acquire "$KEY" --ttl "${TTL_MS}ms" --owner "$ownerA" --json
    a_rc=$RC
    tokA=""
    if [ "$a_rc" = 0 ]; then
        tokA=$(jget "$OUT" .token)
        assert_gt "$tokA" 0 "round $r: A's token"
        fence_call "$tokA" A
        fenceA_rc=$F_RC
    elif [ "$a_rc" = 6 ] && [ "$mode" = paused-wait ]; then
        # Granted on the primary, not acknowledged by the replica: A is told
        # its ownership is uncertain, and so does not start any work.
        A_UNCERTAIN=$((A_UNCERTAIN + 1))
        assert_contains "$ERR" uncertain "round $r: A's ESTORE says ownership is uncertain"
        fenceA_rc=none
    else
        fail "round $r: A's acquire on the primary$(_ctx)"
        die "round $r: A could not acquire"
    fi

    # 2. kill -9 the primary at once.
    t_kill=$(now_ms)
    redis_kill9 "$PRIMARY"
    if [ "$mode" != plain ]; then
        # Unpause as soon as the replica has dropped its link to the dead
        # primary: the paused write went with the link.
        WAIT_TRIES=400 wait_for "round $r: the replica noticed the dead primary" link_gone "$REPLICA"
        # (A Sentinel's promotion kills normal clients: retry, bounded.)
        for ((try = 0; try < 5; try++)); do
            [ "$(rcli "$REPLICA" client unpause 2>/dev/null)" = OK ] && break
            sleep 0.1
        done
        [ "$try" -lt 5 ] || fail "round $r: CLIENT UNPAUSE on the replica failed"
        echo "round $r: the replica's writes were paused for $(($(now_ms) - t_pause)) ms"
    fi

    # 3. the Sentinels promote the replica.
    if WAIT_TRIES=600 wait_for "round $r: the sentinels promote $REPLICA" promoted_to "$REPLICA"; then
        FAILOVERS=$((FAILOVERS + 1))
    else
        sentinel_dump
        die "round $r: no failover"
    fi
    failover_ms=$(($(now_ms) - t_kill))

    # 4. B acquires on the new primary (bounded retries while the promotion
    #    settles: a replica refuses writes until it is a master).
    for ((try = 0; try < 50; try++)); do
        call "$LEASE" --store "$R_URL" acquire "$KEY" --ttl "${TTL_MS}ms" --json
        tB=$(date +%s%3N)
        [ "$RC" = 6 ] || break
        sleep 0.1
    done
    b_first=$RC
    within=no
    case $b_first in
    0)
        tokB=$(jget "$OUT" .token)
        ownerB=$(jget "$OUT" .owner)
        # A's lease expires in the store no earlier than tA + ttl (its expiry
        # was set after tA); B's grant was made no later than tB.
        if [ "$tB" -lt $((tA + TTL_MS)) ]; then
            within=yes
            WITHIN_OF[$mode]=$((${WITHIN_OF[$mode]} + 1))
            [ "$a_rc" = 0 ] && N_WITHIN=$((N_WITHIN + 1))
        fi
        ;;
    3)
        # The grant survived the failover: it must be A's, intact.
        GRANT_SURVIVED=$((GRANT_SURVIVED + 1))
        call "$LEASE" --store "$R_URL" show "$KEY" --json
        assert_eq "$(jget "$OUT" .owner)" "$ownerA" "round $r: the surviving grant is A's"
        if [ -z "$tokA" ]; then
            # A was told ESTORE, yet its grant survived: retrying with the
            # same owner is safe and gives A its token.
            call "$LEASE" --store "$R_URL" acquire "$KEY" --ttl "${TTL_MS}ms" --owner "$ownerA" --json
            expect_rc 0 "round $r: A's retry with the same owner on the new primary"
            tokA=$(jget "$OUT" .token)
        fi
        assert_eq "$(jget "$OUT" .token)" "$tokA" "round $r: the surviving grant has A's token"
        call "$LEASE" --store "$R_URL" release "$KEY" --owner "$ownerA" --token "$tokA"
        expect_rc 0 "round $r: A releases on the new primary"
        call "$LEASE" --store "$R_URL" acquire "$KEY" --ttl "${TTL_MS}ms" --json
        expect_rc 0 "round $r: B acquires after A's release"
        [ "$RC" = 0 ] || die "round $r: B could not acquire"
        tokB=$(jget "$OUT" .token)
        ownerB=$(jget "$OUT" .owner)
        ;;
    *)
        fail "round $r: B's acquire on the new primary: exit $b_first$(_ctx)"
        die "round $r: B could not acquire"
        ;;
    esac

    if [ "$mode" = paused-wait ] && [ "$a_rc" = 0 ] && [ "$within" = yes ]; then
        fail "round $r: A's grant was acknowledged by the replica (wait_replicas=1), yet the promoted replica granted the key to B"
    fi

    # 5. B installs its token; then stale A writes with its own.
    backwards=no
    staleA_rc=none
    if [ -n "$tokA" ] && [ "$tokB" -le "$tokA" ]; then
        backwards=yes
        M_BACK=$((M_BACK + 1))
        if [ "$tokB" -eq "$tokA" ]; then
            M_EQUAL=$((M_EQUAL + 1)) EQUAL_OF[$mode]=$((${EQUAL_OF[$mode]} + 1))
        else
            M_LOWER=$((M_LOWER + 1)) LOWER_OF[$mode]=$((${LOWER_OF[$mode]} + 1))
        fi
    elif [ -n "$tokA" ]; then
        NEWER_OF[$mode]=$((${NEWER_OF[$mode]} + 1))
    fi
    if [ "$mode" != paused-counter ]; then
        # Clock tokens: B's is newer than A's, whatever the failover lost.
        if [ -n "$tokA" ]; then
            assert_gt "$tokB" "$tokA" "round $r ($mode): B's token is newer than A's"
            seen_once "$r" A "$tokA"
        fi
        seen_once "$r" B "$tokB"
    fi
    fence_call "$tokB" B
    fenceB_rc=$F_RC
    if [ -n "$tokA" ]; then
        if [ "$tokB" -ge "$tokA" ] && [ "$fenceA_rc" = 0 ]; then
            assert_eq "$fenceB_rc" 0 "round $r: B's token $tokB >= A's $tokA is accepted"
        fi
        if [ "$tokB" -lt "$tokA" ] && [ "$fenceA_rc" = 0 ]; then
            assert_eq "$fenceB_rc" 5 "round $r: B's token $tokB went below A's $tokA: the resource rejects it (ESTALE)"
        fi
        fence_call "$tokA" "A (stale)"
        staleA_rc=$F_RC
        if [ "$tokB" -gt "$tokA" ]; then
            # (Always so in a clock round: asserted above.)
            if [ "$staleA_rc" = 0 ]; then
                STALE_ACCEPTED=$((STALE_ACCEPTED + 1))
                fail "round $r: the stale owner A's write (token $tokA) was accepted after B's token $tokB"
            else
                assert_eq "$staleA_rc" 5 "round $r: the stale owner A is rejected (ESTALE)"
            fi
        elif [ "$staleA_rc" = 0 ]; then
            # B got A's very generation (or a lower one): the resource cannot
            # tell A from B. Recorded: this is what asynchronous replication risks.
            SAME_TOKEN_STALE_ACCEPTED=$((SAME_TOKEN_STALE_ACCEPTED + 1))
        fi
    else
        assert_eq "$fenceB_rc" 0 "round $r: B's token $tokB is accepted (A never had one)"
    fi

    printf 'round %2d %-14s: A %s, failover %5d ms, B first try %s, B token %s, B within A'"'"'s ttl %s, token not newer %s; resource: A %s, B %s, stale A %s (mark %s)\n' \
        "$r" "$mode" "$([ "$a_rc" = 0 ] && echo "token $tokA" || echo "ESTORE")" "$failover_ms" \
        "$(case $b_first in 0) echo granted ;; 3) echo busy ;; *) echo "exit $b_first" ;; esac)" \
        "$tokB" "$within" "$backwards" \
        "$(verdict "$fenceA_rc")" "$(verdict "$fenceB_rc")" "$(verdict "$staleA_rc")" "$MARK"

    # 6. B releases; the dead server comes back as a replica of the new
    #    primary, and the roles swap.
    call "$LEASE" --store "$R_URL" release "$KEY" --owner "$ownerB" --token "$tokB"
    expect_rc 0 "round $r: B releases"
    [ "$r" -lt "$ROUNDS" ] || break
    redis_restart "$PRIMARY" "${SYNC_OPTS[@]}" --replicaof 127.0.0.1 "$(cat "$T/$REPLICA/port")" ||
        die "round $r: restart $PRIMARY as a replica"
    old=$PRIMARY
    PRIMARY=$REPLICA
    REPLICA=$old
    t0=$(now_ms)
    WAIT_TRIES=600 wait_for "round $r: $REPLICA syncs with $PRIMARY and the sentinels see it" \
        sentinels_ready "$PRIMARY" "$REPLICA" ||
        { sentinel_dump; die "round $r: the sentinels never saw the new replica"; }
    echo "round $r: the new replica was ready after $(($(now_ms) - t0)) ms"
done

# ---- summary -------------------------------------------------------------------

assert_eq "$FAILOVERS" "$ROUNDS" "a failover happened in every round"
assert_eq "$STALE_ACCEPTED" 0 "stale writes accepted"
# The control: without clock tokens a lost grant hands B A's very token.
# If this fails, the rounds did not lose a grant, and the clock rounds
# proved nothing either.
assert_gt "${EQUAL_OF[paused-counter]}" 0 \
    "paused-counter (the control): B was handed exactly A's token in at least one of ${ROUNDS_OF[paused-counter]} rounds"
ACKED=$((ROUNDS - A_UNCERTAIN))
echo "redis failover: $ROUNDS rounds, second owner acquired within the first lease in $N_WITHIN, token went backwards in $M_BACK, stale writes accepted $STALE_ACCEPTED"
echo "redis failover details: first owner acknowledged in $ACKED, told ESTORE (uncertain) in $A_UNCERTAIN;" \
    "grant survived the failover in $GRANT_SURVIVED; token not newer: equal $M_EQUAL, lower $M_LOWER;" \
    "stale owner's write accepted because its token equalled the new owner's: $SAME_TOKEN_STALE_ACCEPTED;" \
    "acknowledged tokens in clock rounds: ${#SEEN_TOKENS[@]} distinct, $REPEATS seen again"
for m in "${MODES[@]}"; do
    echo "redis failover mode $m: rounds ${ROUNDS_OF[$m]}, second owner granted within the first lease ${WITHIN_OF[$m]}," \
        "B's token vs A's: newer ${NEWER_OF[$m]}, equal ${EQUAL_OF[$m]}, lower ${LOWER_OF[$m]}"
done
finish
