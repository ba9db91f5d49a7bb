#!/usr/bin/env bash
# etcd_unreachable_member: a member whose connect times out - a host that is
# down or cut off drops the SYN instead of refusing it - must be skipped like
# a refused one: nothing was sent to it, so the request may go to the next
# member. etcd_client makes such a member on loopback (a listener whose
# queue is full, so the kernel drops new SYNs) and opens
# etcd://<that member>,<live member>: open, acquire, show and release must work.
. "$(dirname "$0")/etcd_lib.sh" "$@"
CLIENT=${2:?usage: $0 LEASE_BINARY ETCD_CLIENT_BINARY}

etcd_cluster 1 || die "start a member"
call "$CLIENT" unreachable "127.0.0.1:${CPORT[e1]}"
[ "$RC" = 0 ] && echo "$OUT"   # on failure, expect_rc shows it
expect_rc 0 "etcd_client unreachable: the request goes past a member whose connect times out"
finish
