#!/usr/bin/env bash
# etcd_proxy_cloexec (issue 10, items 4 and 6), against a real member:
#  - http_proxy, https_proxy, ALL_PROXY (and the upper-case forms) point at
#    a listener that records connections: the store still talks to etcd
#    directly, and the listener sees no connection at all;
#  - after an open, acquires (a reused keep-alive connection), an inspect,
#    a list and a release, every descriptor of the process is
#    close-on-exec (etcd_checks cloexec);
#  - with SSLKEYLOGFILE set, the key log file that libcurl's start-up
#    opens is close-on-exec too: the command of `lease run` does not
#    inherit it, and etcd_checks cloexec finds every descriptor marked.
. "$(dirname "$0")/etcd_lib.sh" "$1"
CHECKS_BIN=${2:?usage: $0 LEASE_BINARY ETCD_CHECKS_BINARY}
command -v python3 >/dev/null || die "python3 is required"

etcd_cluster 1 || die "no etcd member"

section "proxies in the environment are not used for the cluster"
pf=$T/proxy.port
python3 "$HERE/fake_etcd.py" "$pf" record &
bg_register $!
wait_for "the recording proxy listens" test -s "$pf" || die "no proxy listener"
PROXY=http://127.0.0.1:$(cat "$pf")
conns() { cat "$pf.conns" 2>/dev/null || echo "?"; }

# The proxy is proven to be a working trap first: curl itself goes there.
http_proxy=$PROXY curl -s -m 5 -o /dev/null "http://127.0.0.1:${CPORT[e1]}/health"
wait_for "the trap counts a connection of curl(1) through it" \
    bash -c "[ \"\$(cat '$pf.conns')\" = 1 ]"

WITH_PROXY=(env http_proxy="$PROXY" https_proxy="$PROXY" ALL_PROXY="$PROXY"
    all_proxy="$PROXY" HTTPS_PROXY="$PROXY" HTTP_PROXY="$PROXY" no_proxy= NO_PROXY=)
call "${WITH_PROXY[@]}" "$LEASE" --store "$URL" acquire proxy/k --ttl 10s --json
expect_rc 0 "acquire with every proxy variable set"
assert_token "$(jget "$OUT" .token)" "acquire through no proxy: a token"
call "${WITH_PROXY[@]}" "$LEASE" --store "$URL" show proxy/k --json
expect_rc 0 "show with every proxy variable set"
assert_eq "$(jget "$OUT" .state)" "held" "show: the key is held"
assert_eq "$(conns)" "1" "the proxy saw no connection of lease"

section "every descriptor is close-on-exec after store calls"
call "$CHECKS_BIN" cloexec "$URL"
expect_rc 0 "etcd_checks cloexec"
assert_contains "$OUT" "after acquire:" "the descriptors were checked after the acquire"

section "the TLS key log (SSLKEYLOGFILE) is not inherited"
# libcurl (OpenSSL) opens the file in curl_global_init, without O_CLOEXEC.
KEYLOG=$T/keylog
call env SSLKEYLOGFILE="$KEYLOG" "$LEASE" --store "$URL" run keylog/k --ttl 10s -- \
    sh -c 'for f in /proc/$$/fd/*; do echo "${f##*/} -> $(readlink "$f")"; done'
expect_rc 0 "lease run with SSLKEYLOGFILE set"
assert_file "$KEYLOG" "libcurl opened the key log (the check below can see it)"
assert_not_contains "$OUT" "$KEYLOG" "the command of lease run has no descriptor on the key log"
call env SSLKEYLOGFILE="$KEYLOG" "$CHECKS_BIN" cloexec "$URL"
expect_rc 0 "etcd_checks cloexec with SSLKEYLOGFILE set"

finish
