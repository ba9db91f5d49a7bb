#!/usr/bin/env bash
# pg_failover.sh sync|async [stall] [counter] PG_SERVER_SCRIPT FAILOVER_CLIENT
#
# A primary and a streaming standby on loopback (scripts/pg-server.sh), a
# client (pg_failover_client) acquiring and releasing one key through the
# multi-host URL
#   postgres://lease:PW@127.0.0.1:P1,127.0.0.1:P2/lease?target_session_attrs=read-write
# and recording every token whose acquire returned OK. Mid-run the primary
# is killed (pg_ctl stop -m immediate) and the standby promoted
# (pg_ctl promote).
#
# sync  (synchronous_standby_names='*', synchronous_commit=on): every token
#       issued after the promotion must be greater than every token
#       acknowledged before it, no token may be acknowledged twice, and
#       the acknowledged tokens must only grow. The test fails otherwise.
# async (synchronous_standby_names=''): the same is measured and reported
#       in one summary line ("async failover: N acknowledged tokens lost,
#       reissued token values: ..."); a loss never fails the run.
#
# stall: before the kill, the primary's WAL sender is frozen (SIGSTOP) for
#       a while, so the standby falls behind as a real one does under load
#       or a slow network; then it is killed with the primary. With sync,
#       the primary acknowledges nothing during the stall and the run must
#       still pass. With async, the tokens acknowledged during the stall
#       cannot be on the standby: the run checks that the measurement sees
#       them lost (and reissued), i.e. that it can see a loss at all.
#
# Tokens: clock (the store's default) unless `counter` is given (the URL
# then gets &tokens=counter). With clock tokens a grant is at least the
# server's clock in microseconds, so the promoted standby goes on above
# every token the old primary issued, lost or not: then async is held to
# the sync rules (greater after the promotion, none twice, growing) and the
# grants lost with the old primary are only counted: tokens acknowledged
# before the promotion above the last token the standby had replayed
# (read on it just before the promotion). With counter tokens async keeps
# today's verdict: reported; with stall, the loss and reissue must show.
set -u
MODE=${1:?usage: pg_failover.sh sync|async [stall] PG_SERVER_SCRIPT FAILOVER_CLIENT}
shift
STALL=
if [ "${1:-}" = stall ]; then STALL=1; shift; fi
TOKENS=clock
if [ "${1:-}" = counter ]; then TOKENS=counter; shift; fi
PG_SERVER=${1:?missing PG_SERVER_SCRIPT}
CLIENT=${2:?missing FAILOVER_CLIENT}
case $MODE in sync|async) ;; *) echo "mode must be sync or async" >&2; exit 2 ;; esac
. "$(dirname "$0")/lib_pg.sh"

ms() { echo $(($(date +%s%N) / 1000000)); }
# OK lines in phase $1 (and with a time >= $2 if given)
n_ok() {
    awk -v ph="$1" -v since="${2:-0}" '$1 == "OK" && $3 == ph && $4 >= since { n++ } END { print n + 0 }' \
        "$PG_T/client.out" 2>/dev/null || echo 0
}

# wait_until DESCRIPTION BOUND_S CMD...: poll CMD every 50 ms, at most BOUND_S.
wait_until() {
    local what=$1 bound=$2 i
    shift 2
    for ((i = 0; i < bound * 20; i++)); do
        "$@" && return 0
        sleep 0.05
    done
    echo "# gave up waiting ($bound s) for: $what" >&2
    return 1
}
client_alive() { kill -0 "$CPID" 2>/dev/null; }
client_gone() { ! client_alive; }
have() { [ "$(n_ok "$1" "${3:-0}")" -ge "$2" ] || ! client_alive; }
su_psql() { # DIR SQL [DB]: as the superuser over the server's Unix socket
    local as=()
    [ "$(id -u)" -eq 0 ] && as=(runuser -u postgres --)
    "${as[@]}" psql -h "$1" -p "$(cat "$1/port")" -U postgres -d "${3:-postgres}" -X -At -c "$2"
}

pg_tmpdir
t0=$(ms)
pg_start primary || exit 1
P1=$PG_PORT
pg_start standby standby "$PG_T/primary" "$MODE" || exit 1
P2=$PG_PORT
NAME="$MODE${STALL:+ (stalled standby)}, $TOKENS tokens"
echo "# $NAME: primary on $P1, standby on $P2, ready in $(($(ms) - t0)) ms"
echo "# $(su_psql "$PG_T/primary" "SELECT 'primary: synchronous_standby_names=''' || current_setting('synchronous_standby_names') || ''', synchronous_commit=' || current_setting('synchronous_commit') || ', standby ' || string_agg(application_name || ' ' || state || '/' || sync_state, ', ') FROM pg_stat_replication")"
PW=$(cat "$PG_T/primary/password")
URL="postgres://lease:$PW@127.0.0.1:$P1,127.0.0.1:$P2/lease?target_session_attrs=read-write"
[ "$TOKENS" = counter ] && URL="$URL&tokens=counter"

mkdir "$PG_T/ctl"
"$CLIENT" "$URL" "$PG_T/ctl" 100 >"$PG_T/client.out" 2>"$PG_T/client.err" &
CPID=$!
pg_bg_register "$CPID"

wait_until "200 tokens before the failover" 30 have old 200
client_alive || { echo "FAIL: the client ended early:" >&2; cat "$PG_T/client.err" >&2; exit 1; }

STALLED=0
if [ -n "$STALL" ]; then
    WS=$(su_psql "$PG_T/primary" "SELECT pid FROM pg_stat_replication")
    [[ "$WS" =~ ^[0-9]+$ ]] || { echo "FAIL: no WAL sender pid ('$WS')" >&2; exit 1; }
    kill -STOP "$WS"
    t_stall=$(ms)
    if [ "$MODE" = async ]; then
        wait_until "50 tokens acknowledged during the stall" 20 have old 50 "$t_stall"
    else
        sleep 2.5 # a synchronous primary must acknowledge nothing now
    fi
    STALLED=$(n_ok old "$t_stall")
    echo "# WAL sender $WS frozen for $(($(ms) - t_stall)) ms; $STALLED tokens acknowledged meanwhile"
fi

t_kill=$(ms)
touch "$PG_T/ctl/killing"
[ -n "$STALL" ] && kill -KILL "$WS" 2>/dev/null
pg_stop primary
echo "# primary killed (-m immediate) after $(n_ok old) acknowledged tokens"
sleep 0.3
# The last token the standby has (nothing reaches it any more): what the
# promoted server goes on from.
SMAX=$(su_psql "$PG_T/standby" "SELECT coalesce(max(fencing_token), 0) FROM coordination_lease" lease)
[[ "$SMAX" =~ ^[0-9]+$ ]] || { echo "FAIL: cannot read the standby's last token ('$SMAX')" >&2; exit 1; }
echo "# the standby's last token before the promotion: $SMAX"
bash "$PG_SERVER" promote "$PG_T/standby" || { echo "FAIL: promote failed" >&2; exit 1; }
touch "$PG_T/ctl/promoted"
t_prom=$(ms)
echo "# standby promoted $((t_prom - t_kill)) ms after the kill"
wait_until "100 tokens after the promotion" 40 have post 100
touch "$PG_T/ctl/stop"
wait_until "the client to stop" 15 client_gone || kill -KILL "$CPID" 2>/dev/null
wait "$CPID"
crc=$?

out=$PG_T/client.out
if grep -qF -- "$PW" "$out" "$PG_T/client.err"; then
    echo "FAIL: the password appears in the client's output" >&2
    exit 1
fi
echo "# client exit $crc; acquires that failed (after their 3 s wait): $(grep -c '^ERR' "$out")" \
    "$(grep -m1 '^ERR' "$out" | cut -c1-160)"

# The verdict, from the OK lines "OK token phase ms". Acknowledged before
# the promotion: old, pre; issued after it: mid, post (the old primary was
# dead by then). Clock tokens (~1.8e15) are exact in awk's doubles, but
# must print and key arrays as integers, not as %.6g.
awk -v CONVFMT=%.0f -v OFMT=%.0f -v mode="$MODE" -v stall="$STALL" -v stalled="$STALLED" -v t_kill="$t_kill" \
    -v tokens="$TOKENS" -v smax="$SMAX" '
$1 == "OK" {
    n++; tok = $2 + 0; ph = $3
    seen[tok]++
    if (seen[tok] == 2) dups = dups " " tok
    if (n > 1 && tok <= prev) nonincr++
    prev = tok
    if (ph == "old" || ph == "pre") {
        npre++; if (tok > maxpre) maxpre = tok; pre[tok] = 1
    } else {
        npost++; if (minpost == "" || tok < minpost) minpost = tok; post[tok] = 1
        if (first_after == "") first_after = $4
    }
}
# Ascending runs "a-b" of the tokens t in [lo, hi] with want[t] set.
function ranges(want, lo, hi,    t, out, start) {
    out = ""; start = ""
    for (t = lo; t <= hi + 1; t++) {
        if (t <= hi && (t in want)) { if (start == "") start = t }
        else if (start != "") {
            out = out " " (start == t - 1 ? start : start "-" (t - 1)); start = ""
        }
    }
    return out
}
END {
    lost = 0; nre = 0
    for (t in pre) if (minpost != "" && t + 0 >= minpost) { lost++; lostset[t + 0] = 1 }
    # Acknowledged but never on the standby (its last token, smax): with
    # clock tokens lost with the old primary, yet not issued again.
    gone = 0
    for (t in pre) if (t + 0 > smax + 0) gone++
    for (t in post) if (t in pre) { nre++; reset[t + 0] = 1 }
    lostlist = ranges(lostset, minpost + 0, maxpre + 0)
    reissued = nre ? ranges(reset, minpost + 0, maxpre + 0) " (" nre " values)" : ""
    printf "# %s: %d tokens acknowledged before the promotion (max %s), %d after (min %s); first grant %s ms after the kill\n",
        mode, npre, maxpre, npost, minpost, first_after - t_kill
    printf "%s failover, %s tokens%s: %d acknowledged tokens lost, reissued token values:%s\n",
        mode, tokens, stall ? " (standby stalled, " stalled " tokens acknowledged during the stall)" : "",
        lost, reissued == "" ? " none" : reissued
    printf "%s failover, %s tokens: %d acknowledged grants never reached the standby (tokens above its last, %s)\n",
        mode, tokens, gone, smax
    if (lost > 0) printf "%s failover: acknowledged before the promotion but not on the promoted standby:%s\n", mode, lostlist
    bad = 0
    if (npre == 0 || npost == 0) { print "FAIL: no tokens on one side of the failover"; bad = 1 }
    if (mode == "sync" || tokens == "clock") {
        if (minpost != "" && minpost <= maxpre) {
            printf "FAIL: a token issued after the promotion (%s) is not greater than one acknowledged before it (%s)\n", minpost, maxpre
            bad = 1
        }
        if (dups != "") { printf "FAIL: tokens acknowledged twice:%s\n", dups; bad = 1 }
        if (nonincr > 0) { printf "FAIL: %d acknowledgements did not increase the token\n", nonincr; bad = 1 }
    } else if (stall) {
        # Self-check of the measurement: tokens acknowledged while the WAL
        # sender was frozen were never sent, so they must show as lost.
        if (stalled == 0) { print "FAIL: no token was acknowledged during the stall"; bad = 1 }
        else if (lost == 0) { print "FAIL: the stalled standby lost nothing: the measurement cannot see a loss"; bad = 1 }
    }
    exit bad
}' "$out"
rc=$?
if [ $rc -ne 0 ]; then
    echo "--- client output around the failover:" >&2
    grep -n -B5 -A5 -m1 ' \(pre\|mid\|post\) ' "$out" >&2
fi
exit $rc
