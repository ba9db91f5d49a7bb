#!/usr/bin/env bash
# etcd_hostile (issue 10, items 5, 6, 7 and 10): what an "etcd" answers is
# input. A fake member (fake_etcd.py: python3 on 127.0.0.1, a stand-in for
# a broken or hostile server only, speaking the JSON gateway: the store's
# ?transport=json) never answers, trickles, sends 128 MiB, answers slowly,
# answers a list with 32 MiB that would take about 280 MB to hold, or
# answers malformed JSON (etcd_hostile_grpc.sh does the same over gRPC).
# Every case ends with exit 6 (ESTORE) or 7 (ETIMEOUT) and a message naming
# what was wrong, never a crash or success; a `--timeout 1s` call returns
# within a generous 10 s, the costly list within its timeouts and 150 MB.
# Bad URL parameters are exit 2 before any connection.
. "$(dirname "$0")/../cli/lib.sh" "$@"
HERE=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || die "python3 is required"
[ -x /usr/bin/time ] || die "/usr/bin/time is required (GNU time, for the max RSS)"

. "$HERE/fake_lib.sh"

# start_fake NAME MODE [ARG]: a fake member; its port in $FPORT_<NAME>.
start_fake() {
    local name=$1
    shift
    start_fake_member "$name" python3 fake_etcd.py "$@"
}

section "a member that accepts and never answers"
start_fake silent silent
timed "$LEASE" --store "etcd://127.0.0.1:$FPORT_silent?transport=json" --timeout 1s acquire k
expect_rc_in "6 7" "never answered: ESTORE or ETIMEOUT"
expect_stderr "never answered"
within_bound "never answered"

section "a member that trickles one byte every 0.2 s"
start_fake trickle trickle
timed "$LEASE" --store "etcd://127.0.0.1:$FPORT_trickle?transport=json" --timeout 1s acquire k
expect_rc_in "6 7" "trickled: ESTORE or ETIMEOUT"
within_bound "trickled"

section "a timeout on a reused keep-alive connection says what happened"
S=$T/script.json
start_fake script script "$S"
FAKE="etcd://127.0.0.1:$FPORT_script?transport=json"
echo '{"/v3/lease/grant": "@hang"}' >"$S"
timed "$LEASE" --store "$FAKE" --timeout 1s acquire k
expect_error 6 "grant never answered on the connection of the open"
within_bound "grant never answered"
assert_contains "$ERR" "timed out after" "the message says it timed out"
assert_contains "$ERR" "waiting for the answer of http://127.0.0.1:$FPORT_script" \
    "the message names the member"
assert_not_contains "$ERR" "connect" "the message does not blame the connect"

section "one deadline for every request of a call"
# Each answer takes 0.6 s: the grant and the txn of one acquire together
# take 1.2 s, more than the call's 1 s (the open, a call of its own,
# takes 0.6 s).
echo '{"@delay": 0.6}' >"$S"
timed "$LEASE" --store "$FAKE" --timeout 1s acquire k
expect_rc_in "6 7" "acquire of two 0.6 s requests within --timeout 1s"
expect_stderr "two slow requests"
within_bound "two slow requests"
echo '{"@delay": 0.1}' >"$S"
call "$LEASE" --store "$FAKE" --timeout 1s acquire k --json
expect_rc 0 "the same fake answering in 0.1 s: the acquire succeeds"

section "a huge answer: aborted, memory bounded"
start_fake huge huge
huge_answer_bounded "etcd://127.0.0.1:$FPORT_huge?transport=json" "128 MiB"

section "a list answer that costs far more to hold than to send"
start_fake bigtxn bigtxn $(((32 << 20) - 4096))
costly_answer "etcd://127.0.0.1:$FPORT_bigtxn?transport=json" \
    "32 MiB of key-values to ls (about 280 MB as JSON values)" ls

# ---- malformed answers --------------------------------------------------
OWNER=7d4e2f4c-9a51-4c5e-8e39-3c2f1b0a9d11
b64() { printf '%s' "$1" | base64 -w0; }
O64=$(b64 "$OWNER")

# malformed DESCRIPTION SCRIPT NEEDLE ARGS...: with SCRIPT as the fake's
# answers, `lease ARGS` exits 6 with NEEDLE in its message.
malformed() {
    local desc=$1 script=$2 needle=$3
    shift 3
    printf '%s\n' "$script" >"$S"
    call "$LEASE" --store "$FAKE" --timeout 5s "$@"
    expect_error 6 "$desc"
    assert_contains "$ERR" "$needle" "$desc: the message"
}

# txn RESPONSES [SUCCEEDED]: a txn answer.
txn() { echo "{\"header\":{\"revision\":\"9\"},\"succeeded\":${2:-true},\"responses\":$1}"; }
# range KVS: a txn response of a range.
range() { echo "{\"response_range\":{\"kvs\":$1,\"count\":\"1\"}}"; }
# kv CREATE LEASE VALUE64: a kv of a lease/ key.
kv() { echo "{\"key\":\"$(b64 /lease/lease/k)\",\"create_revision\":\"$1\",\"mod_revision\":\"$1\",\"version\":\"1\",\"lease\":\"$2\",\"value\":\"$3\"}"; }
meta() { echo "{\"key\":\"$(b64 /lease/meta/k)\",\"create_revision\":\"5\",\"value\":\"$(b64 "$1")\"}"; }
seen() { echo "{\"key\":\"$(b64 /lease/seen/k)\",\"mod_revision\":\"$1\"}"; }
HELD="[$(range "[$(kv 5 7587 "$O64")]"),$(range "[$(meta $'10000\nlabel')]"),$(range "[$(seen 5)]")]"

section "malformed grant answers"
ACQ=(acquire k --ttl 10s)
malformed "grant TTL 9e12 s" '{"/v3/lease/grant":{"ID":"7587","TTL":"9000000000000"}}' \
    "TTL 9000000000000 s is not within" "${ACQ[@]}"
malformed "grant TTL -1" '{"/v3/lease/grant":{"ID":"7587","TTL":"-1"}}' "TTL -1 s" "${ACQ[@]}"
malformed "grant TTL 0" '{"/v3/lease/grant":{"ID":"7587","TTL":"0"}}' "TTL 0 s" "${ACQ[@]}"
malformed "grant TTL 1.5" '{"/v3/lease/grant":{"ID":"7587","TTL":1.5}}' \
    "field 'TTL' is not a 64-bit integer" "${ACQ[@]}"
malformed "grant ID 0" '{"/v3/lease/grant":{"ID":"0","TTL":"10"}}' "lease ID 0" "${ACQ[@]}"
malformed "grant ID -7" '{"/v3/lease/grant":{"ID":"-7","TTL":"10"}}' "lease ID -7" "${ACQ[@]}"
malformed "grant ID not a number" '{"/v3/lease/grant":{"ID":"7x","TTL":"10"}}' \
    "field 'ID' is not a 64-bit integer" "${ACQ[@]}"
malformed "grant ID above 2^63" '{"/v3/lease/grant":{"ID":"9223372036854775808","TTL":"10"}}' \
    "field 'ID' is not a 64-bit integer" "${ACQ[@]}"

section "malformed acquire answers: the token"
RESP='[{"response_put":{}},{"response_put":{}},{"response_put":{}},{"response_put":{}},{"response_range":{"count":"1"}}]'
malformed "txn revision 0 as the token" \
    "{\"/v3/kv/txn\":{\"header\":{\"revision\":\"0\"},\"succeeded\":true,\"responses\":$RESP}}" \
    "revision 0 is not a token" "${ACQ[@]}"
malformed "txn revision missing" "{\"/v3/kv/txn\":{\"succeeded\":true,\"responses\":$RESP}}" \
    "revision 0 is not a token" "${ACQ[@]}"
malformed "txn revision -3" \
    "{\"/v3/kv/txn\":{\"header\":{\"revision\":\"-3\"},\"succeeded\":true,\"responses\":$RESP}}" \
    "revision -3 is not a token" "${ACQ[@]}"
malformed "txn revision of 20 digits" \
    "{\"/v3/kv/txn\":{\"header\":{\"revision\":\"99999999999999999999\"},\"succeeded\":true}}" \
    "field 'revision' is not a 64-bit integer" "${ACQ[@]}"
malformed "succeeded is a string" '{"/v3/kv/txn":{"header":{"revision":"9"},"succeeded":"yes"}}' \
    "field 'succeeded' is not true or false" "${ACQ[@]}"
malformed "responses is not an array" '{"/v3/kv/txn":{"header":{"revision":"9"},"responses":"x"}}' \
    "field 'responses' is not an array" "${ACQ[@]}"
malformed "kvs holds a number" "{\"/v3/kv/txn\":$(txn "[$(range '[1]')]" false)}" \
    "field 'kvs' holds something that is not an object" "${ACQ[@]}"
malformed "header is a string" '{"/v3/kv/txn":{"header":"x"}}' \
    "field 'header' is not an object" "${ACQ[@]}"
malformed "not JSON" '{"/v3/kv/txn":{"@raw":"{{{"}}' "malformed answer: not a JSON object" "${ACQ[@]}"
malformed "an empty body" '{"/v3/kv/txn":{"@raw":""}}' "malformed answer: not a JSON object" "${ACQ[@]}"
malformed "a JSON array" '{"/v3/kv/txn":[1,2]}' "malformed answer: not a JSON object" "${ACQ[@]}"
deep=$(python3 -c 'print("{\"a\":" * 40 + "1" + "}" * 40)')
malformed "nested 40 deep" "{\"/v3/kv/txn\":$deep}" "nested more than 16 deep" "${ACQ[@]}"

section "malformed acquire answers: the holder of a busy key"
malformed "holder value not base64" "{\"/v3/kv/txn\":$(txn "[$(range "[$(kv 5 7587 '!!!!')]")]" false)}" \
    "field 'value' is not base64 text" "${ACQ[@]}"
malformed "holder key not base64" \
    "{\"/v3/kv/txn\":$(txn '[{"response_range":{"kvs":[{"key":"a=b="}]}}]' false)}" \
    "field 'key' is not base64 text" "${ACQ[@]}"
malformed "holder owner not a UUID" \
    "{\"/v3/kv/txn\":$(txn "[$(range "[$(kv 5 7587 "$(b64 nobody)")]")]" false)}" \
    "is not a UUID" "${ACQ[@]}"
malformed "holder token 0" "{\"/v3/kv/txn\":$(txn "[$(range "[$(kv 0 7587 "$O64")]")]" false)}" \
    "create_revision 0 is not a token" "${ACQ[@]}"

section "malformed inspect answers"
malformed "time to live -5 s" "{\"/v3/kv/txn\":$(txn "$HELD"),\"/v3/lease/timetolive\":{\"TTL\":\"-5\"}}" \
    "TTL -5 s is not within" show k
malformed "time to live 9e12 s" \
    "{\"/v3/kv/txn\":$(txn "$HELD"),\"/v3/lease/timetolive\":{\"TTL\":\"9000000000000\"}}" \
    "TTL 9000000000000 s is not within" show k
malformed "a meta/ ttl of -1" \
    "{\"/v3/kv/txn\":$(txn "[$(range "[$(kv 5 7587 "$O64")]"),$(range "[$(meta $'-1\nl')]")]")}" \
    "the ttl of the meta/ value" show k
malformed "a free key's token -1" "{\"/v3/kv/txn\":$(txn "[{},{},$(range "[$(seen -1)]")]")}" \
    "mod_revision -1 is not a token" show k
malformed "a held key's lease -4" "{\"/v3/kv/txn\":$(txn "[$(range "[$(kv 5 -4 "$O64")]")]")}" \
    "lease -4 is not a lease" show k
printf '%s\n' "{\"/v3/kv/txn\":$(txn "$HELD"),\"/v3/lease/timetolive\":{\"TTL\":\"-1\"}}" >"$S"
call "$LEASE" --store "$FAKE" show k --json
expect_rc 0 "time to live -1 (expired just now) is an answer"
assert_eq "$(jget "$OUT" .remaining_ms)" "0" "time to live -1: nothing remains"

section "malformed renew, fence and history answers"
malformed "keep-alive TTL -1" "{\"/v3/kv/txn\":$(txn "$HELD"),\"/v3/lease/keepalive\":{\"result\":{\"TTL\":\"-1\"}}}" \
    "TTL -1 s" renew k --owner "$OWNER" --token 5
malformed "keep-alive TTL 9e12" \
    "{\"/v3/kv/txn\":$(txn "$HELD"),\"/v3/lease/keepalive\":{\"result\":{\"TTL\":\"9000000000000\"}}}" \
    "TTL 9000000000000 s" renew k --owner "$OWNER" --token 5
malformed "a fencing mark that is not a number" \
    "{\"/v3/kv/txn\":$(txn "[$(range "[{\"value\":\"$(b64 abc)\"}]")]" false)}" \
    "the mark of 'r' is not a token" fence r 5
malformed "a fencing mark of 0" \
    "{\"/v3/kv/txn\":$(txn "[$(range "[{\"value\":\"$(b64 00000000000000000000)\"}]")]" false)}" \
    "the mark of 'r' is not a token" fence r 5
# `history` inspects the key first (a txn of its own), then reads history.
# One fake serves every case: a sequence per case, on a fresh fake each.
start_fake script2 script "$S"
FAKE="etcd://127.0.0.1:$FPORT_script2?transport=json"
malformed "a history entry without an owner" \
    "{\"/v3/kv/txn\":{\"@seq\":[$(txn "$HELD"),$(txn "[$(range "[{\"create_revision\":\"5\",\"value\":\"$(b64 $'x\n1\n2\nl')\"}]")]")]}}" \
    "the entry of token 5 is not" history k
start_fake script3 script "$S"
FAKE="etcd://127.0.0.1:$FPORT_script3?transport=json"
malformed "an end marker with a short name" \
    "{\"/v3/kv/txn\":{\"@seq\":[$(txn "$HELD"),$(txn "[{},$(range "[{\"key\":\"$(b64 x)\",\"value\":\"$(b64 $'released\n1')\"}]")]")]}}" \
    "an end marker is not" history k

section "bad URL parameters: exit 2 before any connection"
start_fake rec record
R=127.0.0.1:$FPORT_rec
echo "not a key" >"$T/file.pem"
for url in "etcd://127.0.0.1" "etcd://127.0.0.1:99999" "etcd://127.0.0.1:0" "etcd://$R," \
    "etcd://$R,,$R" "etcd://127.0.0.1:12x" "etcd://$R?bogus=1" "etcd://$R?cacert=$T/file.pem" \
    "etcds://$R?cacert=$T/missing.pem" "etcds://$R?cacert=" "etcds://$R?cert=$T/file.pem" \
    "etcds://$R?cacert=$T/file.pem&cacert=$T/file.pem" "etcd://[zz]:2379" "etcd://h%20x:2379"; do
    call "$LEASE" --store "$url" show k
    expect_error 2 "bad URL $url"
done
assert_eq "$(cat "$T/rec.port.conns")" "0" "no connection was made for a bad URL"

finish
