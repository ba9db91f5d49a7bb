#!/usr/bin/env bash
# redis_hostile: what a Redis server answers is input too (issue 10).
#
# (a) a server trickling its replies one byte at a time: `--timeout 1s`
#     bounds the whole call (connect, script loads, command, reply), so the
#     call ends within a generous 4 s with exit 6 or 7, never 0;
# (b) a grant or renewal that arrives complete but after its own local
#     deadline (ttl shorter than the trickle) is never a success;
# (c) malformed answers (SCAN cursor as an integer, tokens of 0, negative,
#     above 2^63-1, nil, wrong types, wrong sizes, no expiry, a reply larger
#     as a whole than any the store asks for) exit 6 with a message naming
#     what was wrong, never crash, EBUSY or success;
# (d) ?password_file=PATH: a 0600 file works, a group/other-readable one is
#     refused with exit 2, and no password read from it - nor one in the URL
#     - appears when a server echoes it in an error;
# (e) bad URL parameters exit 2 before any connection is tried.
# The fake servers are tests/redis/fake_redis.py on 127.0.0.1.
. "$(dirname "$0")/redis_lib.sh" "$@"

FAKE_PY=$HERE/fake_redis.py
command -v python3 >/dev/null 2>&1 || die "python3 is required for the fake Redis server"
OWNER=1b4e28ba-2fa1-11d2-883f-0016d3cca427
PW=hunter2-Secret-pw

# fake_start ARGS...: a fake server with these options; sets FAKE_URL and
# FAKE_PID. Bounded wait for its port file.
fake_start() {
    local pf=$T/fake.port.$RANDOM i
    python3 "$FAKE_PY" "$pf" --lifetime 300 "$@" >"$T/fake.log" 2>&1 &
    FAKE_PID=$!
    bg_register "$FAKE_PID"
    for ((i = 0; i < 200; i++)); do
        [ -s "$pf" ] && break
        sleep 0.05
    done
    [ -s "$pf" ] || die "the fake Redis server did not start: $(cat "$T/fake.log")"
    FAKE_URL="redis://127.0.0.1:$(cat "$pf")"
}

fake_stop() {
    if is_my_child "$FAKE_PID"; then
        kill_tree "$FAKE_PID"
    fi
    wait "$FAKE_PID" 2>/dev/null
    return 0
}


no_crash() {
    if [ "$RC" -ge 128 ] || [ "$RC" = 124 ]; then
        fail "$1: crashed or hung (exit $RC)$(_ctx)"
    else
        pass
    fi
}

section "(a) a trickling server: the call is bounded as a whole"
fake_start --trickle 0.5
timed "$LEASE" --store "$FAKE_URL" --timeout 1s acquire k --ttl 10s
expect_rc_in "6 7" "acquire against a server trickling everything"
[ "$MS" -lt 4000 ] && pass || fail "acquire took $MS ms with --timeout 1s (bound: 4000)$(_ctx)"
fake_stop
# Connect and script loads are quick; only the command's reply trickles
# (17 bytes 0.1 s apart: 1.7 s). The same server serves (b).
printf '%s\n' 'EVALSHA=*2\r\n:1\r\n$1\r\n7\r\n' >"$T/replies"
fake_start --trickle 0.1 --trickle-only EVALSHA --replies "$T/replies"
for cmd in "acquire k --ttl 10s" "show k" "renew k --owner $OWNER --token 7 --ttl 10s"; do
    # shellcheck disable=SC2086
    timed "$LEASE" --store "$FAKE_URL" --timeout 1s $cmd
    expect_rc_in "6 7" "$cmd: trickled reply"
    [ "$MS" -lt 4000 ] && pass || fail "$cmd took $MS ms with --timeout 1s (bound: 4000)$(_ctx)"
    assert_not_contains "$OUT" "valid_ms" "$cmd: no grant printed"
done

section "(b) a grant that arrives after its local deadline is no success"
# Complete after ~1.7 s, well within --timeout 20s, but past the 500 ms
# lease's deadline.
call "$LEASE" --store "$FAKE_URL" --timeout 20s acquire k --ttl 500ms --json
expect_error 6 "acquire answered after its deadline"
assert_contains "$ERR" "past the local deadline" "acquire too late: the message says why"
# 4 bytes: 0.4 s, past the 200 ms lease's deadline.
printf '%s\n' 'EVALSHA=:1\r\n' >"$T/replies"
call "$LEASE" --store "$FAKE_URL" --timeout 20s renew k --owner "$OWNER" --token 7 --ttl 200ms --json
expect_error 6 "renew answered after its deadline"
assert_contains "$ERR" "past the local deadline" "renew too late: the message says why"
fake_stop

section "(c) malformed answers: exit 6 with a message, never a crash"
# garbage CMD=RESP "lease args" DESCRIPTION, against the one fake server
# of this section, which reads its replies from $T/replies for every command.
garbage() {
    local reply=$1 args=$2 what=$3
    printf '%s\n' "$reply" >"$T/replies"
    # shellcheck disable=SC2086
    call "$LEASE" --store "$FAKE_URL" --timeout 5s $args
    no_crash "$what"
    expect_error 6 "$what"
    assert_contains "$ERR" "malformed answer" "$what: the message says the answer was malformed"
}
: >"$T/replies"
fake_start --replies "$T/replies"
TOK_OK='$1\r\n7\r\n'
HUGE='$20\r\n18446744073709551615\r\n'
OVER='$19\r\n9223372036854775808\r\n'
UUIDS='$36\r\n6f1c2b7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f\r\n'
E='$0\r\n\r\n'
garbage 'SCAN=*2\r\n:0\r\n*0\r\n' "ls" "ls: SCAN cursor as an integer"
garbage 'SCAN=*2\r\n$1\r\n0\r\n:5\r\n' "ls" "ls: SCAN keys not an array"
garbage 'SCAN=*1\r\n$1\r\n0\r\n' "ls" "ls: SCAN reply of one element"
garbage 'SCAN=*2\r\n$2\r\n-1\r\n*0\r\n' "ls" "ls: negative SCAN cursor"
garbage 'SCAN=*2\r\n$1\r\n0\r\n*1\r\n:3\r\n' "ls" "ls: SCAN key as an integer"
garbage 'SCAN=:0\r\n' "ls" "ls: SCAN reply an integer"
garbage "EVALSHA=*7\r\n:1\r\n$HUGE$E$E$E\$2\r\n-1\r\n$E" "show k" "show: counter above 2^64"
garbage "EVALSHA=*7\r\n:1\r\n$OVER$E$E$E\$2\r\n-1\r\n$E" "show k" "show: counter 2^63"
garbage "EVALSHA=*7\r\n:1\r\n\$2\r\n-5\r\n$E$E$E\$2\r\n-1\r\n$E" "show k" "show: negative counter"
garbage "EVALSHA=*7\r\n:1\r\n$TOK_OK$UUIDS$E$OVER\$3\r\n100\r\n\$4\r\n1000\r\n" "show k" "show: token 2^63"
garbage "EVALSHA=*7\r\n:1\r\n$TOK_OK$UUIDS$E$TOK_OK\$2\r\n-1\r\n\$4\r\n1000\r\n" "show k" "show: held lease without expiry"
garbage "EVALSHA=*7\r\n:1\r\n$TOK_OK\$3\r\nbob\r\n$E$TOK_OK\$3\r\n100\r\n\$4\r\n1000\r\n" "show k" "show: owner not a UUID"
garbage 'EVALSHA=$-1\r\n' "show k" "show: nil"
garbage 'EVALSHA=:1\r\n' "show k" "show: an integer"
garbage "EVALSHA=*7\r\n\$1\r\n1\r\n$TOK_OK$E$E$E\$2\r\n-1\r\n$E" "show k" "show: flag as a string"
garbage "EVALSHA=*3\r\n:1\r\n$TOK_OK$E" "show k" "show: three elements"
garbage 'EVALSHA=*2\r\n:1\r\n$1\r\n0\r\n' "acquire k --ttl 10s" "acquire: token 0"
garbage "EVALSHA=*2\r\n:1\r\n$HUGE" "acquire k --ttl 10s" "acquire: token above 2^64"
garbage "EVALSHA=*2\r\n:1\r\n$OVER" "acquire k --ttl 10s" "acquire: token 2^63"
garbage 'EVALSHA=*2\r\n:1\r\n:-3\r\n' "acquire k --ttl 10s" "acquire: negative token"
garbage 'EVALSHA=*2\r\n:1\r\n$-1\r\n' "acquire k --ttl 10s" "acquire: nil token"
garbage 'EVALSHA=*2\r\n:1\r\n$2\r\n 7\r\n' "acquire k --ttl 10s" "acquire: token with a blank"
garbage 'EVALSHA=*2\r\n:2\r\n$1\r\n7\r\n' "acquire k --ttl 10s" "acquire: flag 2"
garbage 'EVALSHA=:1\r\n' "acquire k --ttl 10s" "acquire: an integer"
garbage 'EVALSHA=*0\r\n' "acquire k --ttl 10s" "acquire: empty array"
garbage 'EVALSHA=*6\r\n:0\r\n$-1\r\n$-1\r\n$-1\r\n$-1\r\n$-1\r\n' "acquire k --ttl 10s" "acquire: busy with nil holder"
garbage "EVALSHA=*6\r\n:0\r\n$UUIDS$E$TOK_OK\$2\r\n-1\r\n\$4\r\n1000\r\n" "acquire k --ttl 10s" "acquire: busy holder without expiry"
garbage 'EVALSHA=:7\r\n' "release k --owner $OWNER --token 7" "release: integer 7"
garbage 'EVALSHA=$1\r\n1\r\n' "renew k --owner $OWNER --token 7 --ttl 10s" "renew: a string"
garbage 'EVALSHA=*2\r\n:1\r\n$1\r\n0\r\n' "fence res 5" "fence: mark 0"
garbage "EVALSHA=*2\r\n:0\r\n$OVER" "fence res 5" "fence: mark 2^63"
# Lengths that would make the client allocate gigabytes before any byte
# of the content has come.
garbage 'EVALSHA=*2147483647\r\n' "acquire k --ttl 10s" "acquire: array of 2^31-1 elements"
garbage 'EVALSHA=*00000000000000000000000000002147483647\r\n' "acquire k --ttl 10s" "acquire: padded array length"
garbage 'EVALSHA=*2\r\n:1\r\n$99999999999\r\nab' "acquire k --ttl 10s" "acquire: a 100 GB string"
garbage 'SCAN=*2\r\n$1\r\n0\r\n*1073741824\r\n' "ls" "ls: SCAN with 2^30 keys"
# A protocol error (no valid type byte) and a reply cut short.
printf '%s\n' 'EVALSHA=?what\r\n' >"$T/replies"
call "$LEASE" --store "$FAKE_URL" --timeout 5s acquire k --ttl 10s
no_crash "acquire: protocol error"
expect_error 6 "acquire: protocol error"
printf '%s\n' 'EVALSHA=*2\r\n:1\r\n$5\r\n12' >"$T/replies"
call "$LEASE" --store "$FAKE_URL" --timeout 1s acquire k --ttl 10s
no_crash "acquire: reply cut short"
expect_rc_in "6 7" "acquire: reply cut short"
# Every string and array within bounds, the reply as a whole not: what
# hiredis has parsed counts too (two strings of 40 MiB; a million and
# one objects), refused before it is all in memory.
for big in 2:41943040 1048576:0; do
    fake_stop
    fake_start --big "EVALSHA=$big"
    call "$LEASE" --store "$FAKE_URL" --timeout 10s acquire k --ttl 10s
    no_crash "acquire: an array of $big"
    expect_error 6 "acquire: an array of $big"
    assert_contains "$ERR" "more than the store ever asks for" \
        "acquire: an array of $big, refused as too large"
done

# The same 100 GB string header, one byte at a time: hiredis has taken
# the '$' before the length comes, and the length is still refused at once
# (not waited on until the timeout).
fake_stop
fake_start --trickle 0.01 --trickle-only EVALSHA --reply 'EVALSHA=*2\r\n:1\r\n$99999999999\r\n'
call "$LEASE" --store "$FAKE_URL" --timeout 5s acquire k --ttl 10s
no_crash "acquire: a 100 GB string header, trickled"
expect_error 6 "acquire: a 100 GB string header, trickled"
assert_contains "$ERR" "a string longer than the store ever sends" \
    "acquire: a trickled 100 GB string header, refused at its length"
fake_stop
fake_start --trickle 0.01 --trickle-only EVALSHA --reply 'EVALSHA=*2147483647\r\n'
call "$LEASE" --store "$FAKE_URL" --timeout 5s acquire k --ttl 10s
expect_error 6 "acquire: a trickled array of 2^31-1 elements"
assert_contains "$ERR" "an array longer than the store ever sends" \
    "acquire: a trickled array header of 2^31-1, refused at its length"
# A line ends at "\r\n", as hiredis reads it, not at a bare "\n": a status
# line holding one ("+a\n$10") hides no header, and the array header after
# it is refused at its length.
fake_stop
fake_start --reply 'EVALSHA=*2\r\n+a\n$10\r\n*2000000\r\n\r\n'
call "$LEASE" --store "$FAKE_URL" --timeout 2s acquire k --ttl 10s
no_crash "acquire: a bare newline in a status line"
expect_error 6 "acquire: a bare newline in a status line"
assert_contains "$ERR" "an array longer than the store ever sends" \
    "acquire: the header after a bare newline, refused at its length"

section "(d) password_file= and passwords echoed by a server"
redis_start pw || die "cannot start a Redis server"
rcli pw config set requirepass "$PW" >/dev/null || die "cannot set a password"
URL=$(redis_url pw)
printf '%s\n' "$PW" >"$T/pwfile"
chmod 600 "$T/pwfile"
call "$LEASE" --store "$URL/?password_file=$T/pwfile" acquire k --ttl 10s --json
expect_rc 0 "password_file 0600 with a trailing newline"
printf '%s' "wrong-$PW" >"$T/pw-wrong"
chmod 600 "$T/pw-wrong"
call "$LEASE" --store "$URL/?password_file=$T/pw-wrong" show k
expect_error 6 "password_file with a wrong password"
assert_not_contains "$OUT$ERR" "$PW" "wrong password: not in the output"
chmod 644 "$T/pwfile"
call "$LEASE" --store "$URL/?password_file=$T/pwfile" show k
expect_error 2 "password_file readable by others"
assert_contains "$ERR" "chmod 600" "password_file 0644: the message says what to do"
chmod 640 "$T/pwfile"
call "$LEASE" --store "$URL/?password_file=$T/pwfile" show k
expect_error 2 "password_file readable by the group"
chmod 600 "$T/pwfile"
call "$LEASE" --store "$URL/?password_file=$T/missing" show k
expect_error 2 "password_file that does not exist"
call "$LEASE" --store "redis://:x@127.0.0.1:$PORT_pw/?password_file=$T/pwfile" show k
expect_error 2 "a password and a password_file"
: >"$T/pw-empty"
chmod 600 "$T/pw-empty"
call "$LEASE" --store "$URL/?password_file=$T/pw-empty" show k
expect_error 2 "an empty password_file"
# A hostile server that repeats the password in its error replies.
printf '%s' "$PW" >"$T/pw-fake"
chmod 600 "$T/pw-fake"
for reply in "AUTH=-ERR wrong password $PW\r\n" "EVALSHA=-ERR no such script for $PW\r\n"; do
    printf '%s\n' "$reply" >"$T/replies"
    for url in "$FAKE_URL/?password_file=$T/pw-fake" "redis://u:$PW@${FAKE_URL#redis://}"; do
        call "$LEASE" --store "$url" show k
        expect_error 6 "a server echoing the password (${reply%%=*})"
        assert_not_contains "$OUT$ERR" "$PW" "${reply%%=*} echo: no password in the output"
    done
done
fake_stop

section "(e) bad URL parameters: exit 2 before connecting"
CLOSED=$(free_port) || die "no free port"
for q in "?wait_replicas=x" "?wait_replicas=101" "?wait_timeout=0" "?wait_timeout=soon" \
    "?prefix=a{b" "?bogus=1" "?password_file=" "/x1" "/-1"; do
    call "$LEASE" --store "redis://127.0.0.1:$CLOSED$q" show k
    expect_error 2 "URL with $q"
done
for hp in "127.0.0.1:0" "127.0.0.1:+5" "127.0.0.1:99999" "127.0.0.1:x" "a,b"; do
    call "$LEASE" --store "redis://$hp" show k
    expect_error 2 "URL with host:port $hp"
done

finish
