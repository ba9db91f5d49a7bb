#!/usr/bin/env bash
# pg_hostile.sh - the PostgreSQL store against hostile servers and bad URLs
# (issue 10, the PostgreSQL parts of items 4, 5, 7 and 10). The servers are
# fake_pg.py on 127.0.0.1: a real server cannot hang, trickle or answer
# garbage on purpose. Needs no real server.
#
#   - a call is bounded as a whole by --timeout: a server that accepts and
#     never answers, one that trickles bytes, one that completes the
#     startup and then never answers a query, two such hosts in one URL,
#     and a URL asking connect_timeout=30: exit 6 or 7 within 5 s (the
#     generous bound; --timeout is 1 s);
#   - a fencing token that is 0, negative, above 2^63-1, not a number or
#     NULL is LEASE_ESTORE (exit 6) naming the fencing token, never a grant;
#     catalog answers with a column missing are read as "not there";
#   - a bad URL parameter is exit 2 before any connection, even when the
#     server is unreachable;
#   - a `lease run` child holds no descriptor of the store's connection;
#   - the password shows nowhere.
#
# usage: pg_hostile.sh PATH_TO_LEASE_BINARY

. "$(dirname "$0")/../cli/lib.sh" "$@"

FAKE=$(cd "$(dirname "$0")" && pwd)/fake_pg.py
PW=Hx7qZWk3pR
command -v python3 >/dev/null || die "python3 is needed for the fake servers"

# start_fake MODE [VALUE]: a fake server in the background; sets PORT.
start_fake() {
    local out=$T/fake.$RANDOM i
    python3 "$FAKE" "$@" >"$out" 2>"$out.err" &
    bg_register $!
    PORT=
    for ((i = 0; i < 100; i++)); do
        PORT=$(head -n1 "$out" 2>/dev/null)
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    die "fake_pg.py $* did not start: $(cat "$out.err")"
}


# bounded DESCRIPTION URL: acquire --timeout 1s ends in time, uncertain.
bounded() {
    timed "$LEASE" --timeout 1s --store "$2" acquire k
    expect_rc_in "6 7" "$1: the store failed or timed out"
    if [ "$MS" -lt 5000 ]; then pass; else
        fail "$1: took $MS ms with --timeout 1s (bound 5000 ms)"
    fi
    assert_not_contains "$OUT$ERR" "$PW" "$1: the password"
}

section "a call is bounded as a whole by --timeout"
start_fake hang
HANG=$PORT
bounded "accepts, never answers" "postgres://u:$PW@127.0.0.1:$HANG/db"
bounded "never answers, connect_timeout=30 asked" \
    "postgres://u:$PW@127.0.0.1:$HANG/db?connect_timeout=30"
start_fake hang
bounded "two hosts, neither answers" "postgres://u:$PW@127.0.0.1:$HANG,127.0.0.1:$PORT/db"
start_fake trickle
bounded "trickles one byte every 0.3 s" "postgres://u:$PW@127.0.0.1:$PORT/db"
start_fake silent
bounded "starts up, then never answers a query" "postgres://u:$PW@127.0.0.1:$PORT/db"

section "what the server answers is range-checked"
start_fake token 7
call "$LEASE" --timeout 5s --store "postgres://u:$PW@127.0.0.1:$PORT/db" acquire k --json
expect_rc 0 "the fake server grants token 7 (it speaks enough of the protocol)"
assert_eq "$(printf '%s' "$OUT" | jq -r .token 2>/dev/null)" 7 "token 7 read back"
for token in 0 -1 9223372036854775808 18446744073709551617 abc "7x" NULL; do
    start_fake token "$token"
    call "$LEASE" --timeout 5s --store "postgres://u:$PW@127.0.0.1:$PORT/db" acquire k --json
    expect_rc 6 "token '$token' from the server is a store failure"
    assert_contains "$ERR" "fencing token" "token '$token': the message names it"
    assert_not_contains "$OUT" "\"token\"" "token '$token': no grant printed"
    assert_not_contains "$OUT$ERR" "$PW" "token '$token': the password"
done

# Catalog answers with fewer columns than asked: read as "not there"
# (no label or ttl column, no usable history), never past the answer.
start_fake narrow
call "$LEASE" --timeout 5s --store "postgres://u:$PW@127.0.0.1:$PORT/db" acquire k --json
expect_rc 0 "catalog answers one column short: the lease is granted all the same"
assert_eq "$(printf '%s' "$OUT" | jq -r .token 2>/dev/null)" 7 "one column short: token 7 read back"
assert_not_contains "$OUT$ERR" "$PW" "one column short: the password"

section "bad input is exit 2 before any connection"
for url in "postgres://u:$PW@127.0.0.1:1/db?lease_table=bad;name" \
    "postgres://u:$PW@127.0.0.1:1/db?fence_table=Bad" \
    "postgres://u:$PW@127.0.0.1:1/db?history_table=a.b.c" \
    "postgres://u:$PW@127.0.0.1:1/db?data_table=" \
    "postgres://u:$PW@127.0.0.1:1/db?lease_table=$(printf 'x%.0s' {1..70})" \
    "postgres://u:$PW@127.0.0.1:1/db?connect_timeout=abc" \
    "postgres://u:$PW@127.0.0.1:1/db?no_such_libpq_option=1" \
    "postgres://u:$PW@127.0.0.1:1/db?sslmode=bogus" \
    "postgres://u:$PW@127.0.0.1:1/db?target_session_attrs=leader" \
    "postgres://u:$PW@127.0.0.1:1/db?gssencmode=maybe" \
    "postgres://u:$PW@127.0.0.1:1/db?channel_binding=x" \
    "postgres://u:$PW@127.0.0.1:1/db?keepalives=abc" \
    "postgres://u:$PW@127.0.0.1:99999/db" \
    "postgres://u:$PW@[::1]x/db" \
    "postgres:u:$PW@127.0.0.1:1/db"; do
    timed "$LEASE" --timeout 5s --store "$url" show k
    expect_rc 2 "$url"
    expect_stderr "$url"
    assert_not_contains "$OUT$ERR" "$PW" "$url: the password"
done
# ... and the same URL with good parameters is only unreachable (exit 6).
call "$LEASE" --timeout 5s --store "postgres://u:$PW@127.0.0.1:1/db?lease_table=good_name" show k
expect_rc 6 "a good URL to a closed port"

# Only the store's socket is checked here: other descriptors the CLI opens
# (the lost-pipe) are tests/cli's, and the test runner may pass its own.
section "a lease run child holds no descriptor of the store"
start_fake token 9
call "$LEASE" --timeout 5s --store "postgres://u:$PW@127.0.0.1:$PORT/db" run k -- \
    bash -c 'for f in /proc/$$/fd/*; do echo "${f##*/} $(readlink "$f")"; done'
assert_contains "$OUT" "0 " "the child listed its descriptors"
assert_not_contains "$OUT" "socket:" "the child's descriptors hold no socket"

finish
