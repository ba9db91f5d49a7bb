#!/usr/bin/env bash
# etcd_interop: the store's keys as etcd's own tools (etcdctl) see them, in
# both directions.
#
#   after `lease acquire jobs/x --label web-1`:
#     /lease/lease/jobs/x   value: the owner; create_revision = the token;
#                           attached to an etcd lease (etcdctl lease list)
#     /lease/meta/jobs/x    "<ttl_ms>\n<label>", the same etcd lease
#     /lease/seen/jobs/x    no lease; mod_revision = the token
#   the URL prefix /myapp moves all of it under /myapp/ (a separate space);
#   release deletes lease/ and meta/, keeps seen/, revokes the etcd lease;
#   fence marks live in fence/ as 20 zero-padded digits;
#   a key deleted or an etcd lease revoked with etcdctl ends the lease:
#   the holder's renew exits 4, the next token is greater;
#   the grant history: /lease/history/006/jobs/x/<etcd lease id, 16 hex>
#   (no lease; create_revision = the token; "<owner>\n<ttl_ms>\n<ms>\n<label>"),
#   and /lease/ended/006/jobs/x/<token, 20 digits> = "released\n<ms>" or
#   "lost\n<ms>" (006: the key's length, so jobs/x and jobs/x/y stay apart).
#   ls tells released keys (free) from keys that ended otherwise (expired)
#   by those markers, over more keys than one etcd txn may read.
. "$(dirname "$0")/etcd_lib.sh" "$@"

section "one member"
etcd_cluster 1 || die "start a member"

# keys PREFIX: the keys under PREFIX, one per line, sorted, without the
# history's (checked on their own below).
keys() {
    ectl get --prefix "$1" --keys-only | grep -v -e '^$' -e '/history/' -e '/ended/' | sort
}
# kv_json KEY: etcdctl get KEY -w json, 64-bit ids quoted (jq 1.6 rounds them).
kv_json() {
    ectl get "$1" -w json | sed -E 's/"(lease|cluster_id|member_id)":([0-9]+)/"\1":"\2"/g'
}
# lease_hex DECIMAL: etcdctl prints lease ids in hex.
lease_hex() {
    printf '%x' "$1"
}

section "lease acquire jobs/x --label web-1"
call "$LEASE" --store "$URL" acquire jobs/x --label web-1 --ttl 30s --json
expect_rc 0 "acquire jobs/x"
TOKEN=$(jget "$OUT" .token)
OWNER=$(jget "$OUT" .owner)
assert_token "$TOKEN" "token"

assert_eq "$(keys /lease/ | paste -sd' ' -)" \
    "/lease/lease/jobs/x /lease/meta/jobs/x /lease/seen/jobs/x" \
    "etcdctl get --prefix /lease/ shows the lease, meta and seen keys"
assert_eq "$(ectl get /lease/lease/jobs/x --print-value-only)" "$OWNER" \
    "the lease key's value is the owner"
assert_eq "$(ectl get /lease/meta/jobs/x --print-value-only)" "$(printf '30000\nweb-1')" \
    "the meta key's value is the ttl in ms and the label"
J=$(kv_json /lease/lease/jobs/x)
assert_eq "$(jget "$J" '.kvs[0].create_revision')" "$TOKEN" \
    "the lease key's create_revision is the token lease printed"
LID=$(jget "$J" '.kvs[0].lease')
assert_match "$LID" '^[1-9][0-9]*$' "the lease key is attached to an etcd lease"
J=$(kv_json /lease/meta/jobs/x)
assert_eq "$(jget "$J" '.kvs[0].lease')" "$LID" "the meta key has the same etcd lease"
J=$(kv_json /lease/seen/jobs/x)
assert_eq "$(jget "$J" '.kvs[0].mod_revision')" "$TOKEN" "the seen key's mod_revision is the token"
assert_eq "$(jget "$J" '.kvs[0].lease // "none"')" none "the seen key has no etcd lease"

LIST=$(ectl lease list)
assert_contains "$LIST" "found 1 leases" "etcdctl lease list shows one lease"
assert_contains "$LIST" "$(lease_hex "$LID")" "... the holder's"
TTL=$(ectl lease timetolive "$(lease_hex "$LID")" --keys)
assert_contains "$TTL" "granted with TTL(30s)" "etcdctl lease timetolive: granted 30 s"
assert_contains "$TTL" "/lease/lease/jobs/x" "... attached to the lease key"
assert_contains "$TTL" "/lease/meta/jobs/x" "... and to the meta key"

section "the grant's history entry"
HKEYS=$(ectl get --prefix /lease/history/ --keys-only | grep -v '^$')
assert_match "$HKEYS" '^/lease/history/006/jobs/x/[0-9a-f]{16}$' \
    "one history entry, named by key length, key and etcd lease id"
assert_eq "${HKEYS##*/}" "$(printf '%016x' "$LID")" "... the grant's etcd lease id"
J=$(kv_json "$HKEYS")
assert_eq "$(jget "$J" '.kvs[0].create_revision')" "$TOKEN" "its create_revision is the token"
assert_eq "$(jget "$J" '.kvs[0].lease // "none"')" none "it has no etcd lease: it outlives the grant"
assert_eq "$(ectl get "$HKEYS" --print-value-only | sed -n '1p;2p;4p' | paste -sd' ' -)" \
    "$OWNER 30000 web-1" "its value: owner, ttl, (time,) label"

section "URL prefix /myapp: the same key name in another space"
MY="$URL/myapp"
call "$LEASE" --store "$MY" acquire jobs/x --label web-2 --ttl 20s --json
expect_rc 0 "acquire jobs/x under /myapp (free there: another space)"
MY_TOKEN=$(jget "$OUT" .token)
MY_OWNER=$(jget "$OUT" .owner)
assert_gt "$MY_TOKEN" "$TOKEN" "a greater token (one cluster revision)"
assert_eq "$(keys /myapp/ | paste -sd' ' -)" \
    "/myapp/lease/jobs/x /myapp/meta/jobs/x /myapp/seen/jobs/x" \
    "the keys live under /myapp/"
assert_eq "$(ectl get /myapp/lease/jobs/x --print-value-only)" "$MY_OWNER" "the owner under /myapp/"
assert_eq "$(ectl get /myapp/meta/jobs/x --print-value-only)" "$(printf '20000\nweb-2')" "the meta under /myapp/"
assert_eq "$(jget "$(kv_json /myapp/lease/jobs/x)" '.kvs[0].create_revision')" "$MY_TOKEN" \
    "create_revision under /myapp/ is its token"
assert_eq "$(keys /lease/ | paste -sd' ' -)" \
    "/lease/lease/jobs/x /lease/meta/jobs/x /lease/seen/jobs/x" "nothing new under /lease/"
assert_eq "$(ectl get /lease/lease/jobs/x --print-value-only)" "$OWNER" "/lease/ keeps its owner"
assert_contains "$(ectl lease list)" "found 2 leases" "two etcd leases now"
call "$LEASE" --store "$URL/myapp/" show jobs/x --json
expect_rc 0 "show through .../myapp/ (trailing slash)"
assert_eq "$(jget "$OUT" .label)" web-2 "the same space with or without the trailing slash"

section "release: lease/ and meta/ go, seen/ stays, the etcd lease is revoked"
call "$LEASE" --store "$URL" release jobs/x --owner "$OWNER" --token "$TOKEN"
expect_rc 0 "release jobs/x"
assert_eq "$(keys /lease/ | paste -sd' ' -)" "/lease/seen/jobs/x" "only the seen key is left"
LIST=$(ectl lease list)
assert_contains "$LIST" "found 1 leases" "one etcd lease is left (/myapp's)"
assert_not_contains "$LIST" "$(lease_hex "$LID")" "the released lease's etcd lease was revoked"
call "$LEASE" --store "$URL" show jobs/x --json
expect_rc 0 "show jobs/x after release"
assert_eq "$(jget "$OUT" .state)" free "free"
assert_eq "$(jget "$OUT" .token)" "$TOKEN" "the last token is kept (from seen/)"
assert_eq "$(ectl get "/lease/ended/006/jobs/x/$(printf '%020d' "$TOKEN")" --print-value-only | head -1)" \
    released "the release wrote its end marker, named by the token"
call "$LEASE" --store "$URL" history jobs/x --json
expect_rc 0 "history jobs/x"
assert_eq "$(jget "$OUT" '[.[] | "\(.token) \(.ended) \(.label)"] | join(",")')" \
    "$TOKEN released web-1" "lease history reads it back"

section "fence marks"
call "$LEASE" --store "$URL" fence res/a 7 --json
expect_rc 0 "fence res/a 7"
assert_eq "$(ectl get /lease/fence/res/a --print-value-only)" 00000000000000000007 \
    "the mark is 20 zero-padded digits"
call "$LEASE" --store "$URL" fence res/a 12 --json
expect_rc 0 "fence res/a 12"
assert_eq "$(ectl get /lease/fence/res/a --print-value-only)" 00000000000000000012 "raised to 12"
call "$LEASE" --store "$URL" fence res/a 9 --json
expect_rc 5 "fence res/a 9 is stale"
assert_eq "$(ectl get /lease/fence/res/a --print-value-only)" 00000000000000000012 "still 12"

section "etcdctl del of the lease key ends the lease"
ectl del /myapp/lease/jobs/x >/dev/null || fail "etcdctl del"
call "$LEASE" --store "$MY" show jobs/x --json
expect_rc 0 "show after etcdctl del"
assert_ne "$(jget "$OUT" .state)" held "not held once its key was deleted"
call "$LEASE" --store "$MY" renew jobs/x --owner "$MY_OWNER" --token "$MY_TOKEN" --ttl 20s
expect_error 4 "the holder's renew after etcdctl del: lost"
call "$LEASE" --store "$MY" acquire jobs/x --ttl 20s --json
expect_rc 0 "acquire after etcdctl del"
assert_gt "$(jget "$OUT" .token)" "$MY_TOKEN" "a greater token"

section "etcdctl lease revoke ends the lease"
call "$LEASE" --store "$URL" acquire jobs/y --ttl 60s --json
expect_rc 0 "acquire jobs/y"
Y_TOKEN=$(jget "$OUT" .token)
Y_OWNER=$(jget "$OUT" .owner)
Y_LID=$(jget "$(kv_json /lease/lease/jobs/y)" '.kvs[0].lease')
ectl lease revoke "$(lease_hex "$Y_LID")" >/dev/null || fail "etcdctl lease revoke"
assert_eq "$(keys /lease/ | grep -c jobs/y)" 1 "only jobs/y's seen key is left"
call "$LEASE" --store "$URL" renew jobs/y --owner "$Y_OWNER" --token "$Y_TOKEN" --ttl 60s
expect_error 4 "the holder's renew after its etcd lease was revoked: lost"
call "$LEASE" --store "$URL" release jobs/y --owner "$Y_OWNER" --token "$Y_TOKEN"
expect_error 4 "... and its release: not the holder"
assert_eq "$(ectl get "/lease/ended/006/jobs/y/$(printf '%020d' "$Y_TOKEN")" --print-value-only | head -1)" \
    lost "the refused renew marked the grant lost"
call "$LEASE" --store "$URL" show jobs/y --json
assert_eq "$(jget "$OUT" .state)" expired "expired after the revoke (ended without a release)"
assert_eq "$(jget "$OUT" .token)" "$Y_TOKEN" "its last token is kept"
call "$LEASE" --store "$URL" acquire jobs/y --ttl 60s --json
expect_rc 0 "acquire jobs/y again"
assert_gt "$(jget "$OUT" .token)" "$Y_TOKEN" "a greater token"

section "ls sees what etcdctl sees"
call "$LEASE" --store "$URL" ls jobs/ --json
expect_rc 0 "ls jobs/"
assert_eq "$(jget "$OUT" '[.[].key] | join(" ")')" "jobs/x jobs/y" "ls lists every key ever acquired"


section "ls: released, expired and held keys in one list"
# 140 keys not held: every third ended without a release (its lease/ key
# deleted with etcdctl, so it has no end marker: expired), the others
# released (marker "released": free). ls reads their markers in txns of at
# most 128 reads (etcd's --max-txn-ops), so 140 takes two; each key must
# still get its own state, in key order, with one held key among them.
for i in $(seq -w 0 139); do
    out=$("$LEASE" --store "$URL" acquire "bulk/k$i" --ttl 60s --json) ||
        die "acquire bulk/k$i"
    if [ $((10#$i % 3)) -ne 0 ]; then
        "$LEASE" --store "$URL" release "bulk/k$i" --owner "$(jget "$out" .owner)" \
            --token "$(jget "$out" .token)" >/dev/null || die "release bulk/k$i"
    fi
done
ectl del --prefix /lease/lease/bulk/ >/dev/null || die "etcdctl del --prefix"
call "$LEASE" --store "$URL" acquire bulk/held --ttl 60s --json
expect_rc 0 "acquire bulk/held"
call "$LEASE" --store "$URL" ls bulk/ --json
expect_rc 0 "ls bulk/"
assert_eq "$(jget "$OUT" 'length')" 141 "ls lists all 141 keys"
assert_eq "$(jget "$OUT" '[.[].key] == ([.[].key] | sort)')" true "in key order"
assert_eq "$(jget "$OUT" '.[0] | "\(.key) \(.state)"')" "bulk/held held" "the held key is held"
assert_eq "$(jget "$OUT" '[.[1:][] | "\(.key | ltrimstr("bulk/k") | tonumber % 3 == 0) \(.state)"]
    | group_by(.) | map("\(.[0]):\(length)") | join(" ")')" \
    "false free:93 true expired:47" "released keys are free, the others expired, key by key"
assert_eq "$(jget "$OUT" '[.[1:][] | .token > 0] | all')" true "every key keeps its last token"
call "$LEASE" --store "$URL" show bulk/k000 --json
assert_eq "$(jget "$OUT" .state)" expired "show agrees: bulk/k000 expired"
call "$LEASE" --store "$URL" show bulk/k139 --json
assert_eq "$(jget "$OUT" .state)" free "show agrees: bulk/k139 released"

finish
