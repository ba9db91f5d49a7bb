#!/usr/bin/env bash
# etcd_endpoints: a request that cannot reach one member (nothing listens on
# its port: the connect is refused) goes to the next one.
#
#   etcd://127.0.0.1:<closed>,127.0.0.1:<live>          every command works
#   etcd://127.0.0.1:<closed>,<closed>,<live>           the same
#   etcd://127.0.0.1:<live>,127.0.0.1:<closed>          the same
#   lease run through <closed>,<live>                   renewals get through
#   etcd://127.0.0.1:<closed>,127.0.0.1:<closed>        exit 6, ESTORE, and
#                                                       the message says no
#                                                       member was reachable
. "$(dirname "$0")/etcd_lib.sh" "$@"

section "one live member, two closed ports"
etcd_cluster 1 || die "start a member"
LIVE=127.0.0.1:${CPORT[e1]}
C1=$(free_port) || die "no free port"
C2=$(free_port) || die "no free port"
for p in "$C1" "$C2"; do
    [ -z "$(ss -Htln "sport = :$p")" ] || die "port $p is not closed"
done

n=0
for U in "etcd://127.0.0.1:$C1,$LIVE" "etcd://127.0.0.1:$C1,127.0.0.1:$C2,$LIVE" \
         "etcd://$LIVE,127.0.0.1:$C1"; do
    n=$((n + 1))
    K=endpoints/k$n
    section "$U"
    call "$LEASE" --store "$U" acquire "$K" --ttl 30s --label "ep-$n" --json
    expect_rc 0 "acquire through $U"
    TOK=$(jget "$OUT" .token)
    OWN=$(jget "$OUT" .owner)
    assert_token "$TOK" "token through $U"
    call "$LEASE" --store "$U" show "$K" --json
    expect_rc 0 "show through $U"
    assert_eq "$(jget "$OUT" .state)" held "show: held"
    assert_eq "$(jget "$OUT" .owner)" "$OWN" "show: the owner"
    assert_eq "$(jget "$OUT" .label)" "ep-$n" "show: the label"
    assert_eq "$(jget "$OUT" .token)" "$TOK" "show: the token"
    call "$LEASE" --store "$U" renew "$K" --owner "$OWN" --token "$TOK" --json
    expect_rc 0 "renew through $U"
    call "$LEASE" --store "$U" ls endpoints/ --json
    expect_rc 0 "ls through $U"
    assert_eq "$(jget "$OUT" "map(select(.key == \"$K\")) | .[0].token")" "$TOK" "ls shows the key"
    call "$LEASE" --store "$U" fence endpoints/res "$TOK" --json
    expect_rc 0 "fence through $U"
    call "$LEASE" --store "$U" release "$K" --owner "$OWN" --token "$TOK"
    expect_rc 0 "release through $U"
    call "$LEASE" --store "$U" show "$K" --json
    expect_rc 0 "show after release through $U"
    assert_eq "$(jget "$OUT" .state)" free "the key is free after release"
    # The same key again through the live member alone: a greater token.
    call "$LEASE" --store "etcd://$LIVE" acquire "$K" --ttl 30s --json
    expect_rc 0 "acquire again through the live member alone"
    assert_gt "$(jget "$OUT" .token)" "$TOK" "a greater token"
done

section "lease run through a closed port first: the renewals get through"
# ttl 3 s renews every second; the child runs past the first deadline.
call "$LEASE" --store "etcd://127.0.0.1:$C1,$LIVE" run endpoints/run --ttl 3s --json -- sleep 4
expect_rc 0 "lease run's child ran to its end under the lease"
assert_not_contains "$ERR" '"event":"lost"' "no lost event"
assert_contains "$ERR" '"event":"released"' "released at the end"

section "no member reachable"
U="etcd://127.0.0.1:$C1,127.0.0.1:$C2"
call "$LEASE" --store "$U" acquire endpoints/none --ttl 30s
expect_error 6 "acquire with every member closed"
assert_contains "$ERR" ESTORE "the message names ESTORE"
assert_contains "$ERR" "no member reachable" "the message says that no member was reachable"
call "$LEASE" --store "$U" show endpoints/none
expect_error 6 "show with every member closed"

finish
