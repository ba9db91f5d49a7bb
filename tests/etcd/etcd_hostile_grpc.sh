#!/usr/bin/env bash
# etcd_hostile_grpc: what an "etcd" answers over gRPC (the store's default
# transport) is input. A fake member (fake_etcd_grpc.py: python3-grpcio on
# 127.0.0.1, a stand-in for a broken or hostile server only) never answers,
# sends 64 MiB, sends protobuf that is cut short or of the wrong wire type,
# answers with what would cost far more to hold than it takes to send (32
# MiB of empty txn answers to a list, 4 MiB of bare key-values to the
# open's range read), or refuses with a message that repeats the password;
# an HTTP/1 server (fake_etcd.py) answers a gRPC call. Every case ends with
# exit 6 (ESTORE) or 7 (ETIMEOUT) and a message naming what was wrong,
# never a crash, a success or a password; a `--timeout 1s` call returns
# within a generous 10 s, and one against a costly answer within its
# timeouts and under 150 MB of memory. (etcd_hostile.sh does the same over
# the JSON gateway.)
. "$(dirname "$0")/../cli/lib.sh" "$@"
HERE=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || die "python3 is required"
# Debian's interpreter, where python3-grpcio lives (a python3 earlier on
# PATH, e.g. pyenv's, would not see it).
PY=/usr/bin/python3
"$PY" -c 'import grpc' 2>/dev/null || die "python3-grpcio is required (scripts/deps.sh installs it)"
[ -x /usr/bin/time ] || die "/usr/bin/time is required (GNU time, for the max RSS)"

. "$HERE/fake_lib.sh"

# start_fake NAME SCRIPT MODE [ARG...]: a fake member; its port in $FPORT_<NAME>.
start_fake() {
    local name=$1 script=$2
    shift 2
    start_fake_member "$name" "$PY" "$script" "$@"
}

section "a member that takes every call and never answers"
start_fake silent fake_etcd_grpc.py silent
timed "$LEASE" --store "etcd://127.0.0.1:$FPORT_silent" --timeout 1s acquire k
expect_rc_in "6 7" "never answered: ESTORE or ETIMEOUT"
expect_stderr "never answered"
within_bound "never answered"

section "a huge answer: aborted, memory bounded"
start_fake huge fake_etcd_grpc.py huge
huge_answer_bounded "etcd://127.0.0.1:$FPORT_huge" "64 MiB"

section "answers that cost far more to hold than to send"
start_fake txnempty fake_etcd_grpc.py txnempty $(((32 << 20) - 16))
costly_answer "etcd://127.0.0.1:$FPORT_txnempty" "32 MiB of empty txn answers to ls" ls
start_fake rangebig fake_etcd_grpc.py rangebig $(((4 << 20) - 16))
costly_answer "etcd://127.0.0.1:$FPORT_rangebig" "4 MiB of key-values to the open" show k

# bad_bytes HEX WHAT: the member answers every call with the message HEX;
# the open's range read refuses it as malformed.
n=0
bad_bytes() {
    n=$((n + 1))
    start_fake "bytes$n" fake_etcd_grpc.py bytes "$1"
    local port
    port=$(eval echo "\$FPORT_bytes$n")
    call "$LEASE" --store "etcd://127.0.0.1:$port" --timeout 5s show k
    expect_error 6 "$2"
    assert_contains "$ERR" "malformed answer" "$2: the message says the answer is malformed"
}

section "protobuf that cannot be read"
bad_bytes "0a" "a field cut before its length"
bad_bytes "0aff01" "a length past the end of the message"
bad_bytes "0a80808080808080808080" "a length that is not a varint (11 bytes)"
bad_bytes "1001" "a message field (kvs) sent as a varint"
bad_bytes "0b0c" "a group (wire type 3), which etcd never sends"
bad_bytes "00" "field number 0"
bad_bytes "0a021801ffffffffffffffffff7f" "a tag that overflows 64 bits"
bad_bytes "0a08080010001800200012021a" "a list entry (kvs) cut short"

section "a refusal that repeats the password"
start_fake abort fake_etcd_grpc.py abort 3 "no user root with password Ech0-Me-99 (Ech0-Me-99)"
call "$LEASE" --store "etcd://root:Ech0-Me-99@127.0.0.1:$FPORT_abort" show k
expect_error 6 "the fake refuses"
assert_contains "$ERR" "gRPC status 3" "the message gives the gRPC status"
assert_not_contains "$ERR" "Ech0-Me-99" "the password the server repeated is not shown"
start_fake authfail fake_etcd_grpc.py authfail "bad password Ech0-Me-99"
printf 'Ech0-Me-99\n' >"$T/echo.pw"
chmod 600 "$T/echo.pw"
call "$LEASE" --store "etcd://root@127.0.0.1:$FPORT_authfail?password_file=$T/echo.pw" show k
expect_error 6 "Authenticate refused (password from a file)"
assert_not_contains "$ERR" "Ech0-Me-99" "the file's password the server repeated is not shown"

section "a refusal that repeats the auth token"
start_fake tokecho fake_etcd_grpc.py tokenecho "T0ken.Ech0ed.42"
call "$LEASE" --store "etcd://root:pw@127.0.0.1:$FPORT_tokecho" show k
expect_error 6 "the fake refuses the authenticated call"
assert_contains "$ERR" "gRPC status 3" "the message gives the gRPC status"
assert_contains "$ERR" "withheld" "the message says etcd's text was withheld"
assert_not_contains "$ERR" "T0ken.Ech0ed.42" "the token the server repeated is not shown"

section "a refusal whose message holds control bytes and percent-escapes"
start_fake ctl fake_etcd_grpc.py abort 14 $'line one\nline two %41\x01'
call "$LEASE" --store "etcd://127.0.0.1:$FPORT_ctl" show k
expect_error 6 "UNAVAILABLE"
assert_contains "$ERR" "gRPC status 14" "the status is said"
assert_not_contains "$ERR" $'\x01' "no control byte reaches the message"
assert_eq "$(printf '%s' "$ERR" | wc -l)" "0" "the message is one line"

section "an HTTP/1 server answering a gRPC call"
echo '{}' >"$T/empty.json"
start_fake http1 fake_etcd.py script "$T/empty.json"
call "$LEASE" --store "etcd://127.0.0.1:$FPORT_http1" --timeout 5s show k
expect_error 6 "the JSON gateway's 404 to a gRPC call"
assert_contains "$ERR" "transport=json" "the message points to ?transport=json"

section "bad ?transport= values: exit 2 before any connection"
for t in "" grpcs JSON "json&transport=x"; do
    call "$LEASE" --store "etcd://127.0.0.1:1?transport=$t" show k
    expect_error 2 "transport='$t'"
done

finish
