#!/usr/bin/env bash
# etcd_tls: etcds:// talks TLS to the JSON gateway, verifying the member's
# certificate against ?cacert=; without the right CA, or over plain HTTP to
# a TLS member, every command is ESTORE (exit 6), never success.
. "$(dirname "$0")/etcd_lib.sh" "$@"

command -v openssl >/dev/null || die "openssl is required"
C=$T/tls
mkdir -p "$C" "$ED/t1"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$C/ca.key" -out "$C/ca.crt" \
    -days 2 -subj "/CN=lease-test-ca" >/dev/null 2>&1 || die "make a CA"
openssl req -newkey rsa:2048 -nodes -keyout "$C/server.key" -out "$C/server.csr" \
    -subj "/CN=127.0.0.1" >/dev/null 2>&1 || die "make a key"
printf 'subjectAltName=IP:127.0.0.1\n' >"$C/ext.cnf"
openssl x509 -req -in "$C/server.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" \
    -CAcreateserial -out "$C/server.crt" -days 2 -extfile "$C/ext.cnf" >/dev/null 2>&1 ||
    die "sign the member's certificate"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$C/other.key" -out "$C/other.crt" \
    -days 2 -subj "/CN=another-ca" >/dev/null 2>&1 || die "make another CA"

section "a TLS member"
cp=$(free_port) && pp=$(free_port) || die "free ports"
nohup etcd --name t1 --data-dir "$ED/t1/data" \
    --listen-client-urls "https://127.0.0.1:$cp" --advertise-client-urls "https://127.0.0.1:$cp" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "t1=http://127.0.0.1:$pp" \
    --cert-file "$C/server.crt" --key-file "$C/server.key" >"$ED/t1/log" 2>&1 &
echo $! >"$ED/t1/pid"
ready() {
    curl -fs -m 1 --cacert "$C/ca.crt" "https://127.0.0.1:$cp/health" | grep -q '"health":"true"'
}
wait_for "the TLS member is healthy" ready || die "no TLS member"

TLS="etcds://127.0.0.1:$cp?cacert=$C/ca.crt"
call "$LEASE" --store "$TLS" acquire tls/k --ttl 10s --json
expect_rc 0 "acquire over TLS"
owner=$(jget "$OUT" .owner)
tok=$(jget "$OUT" .token)
call "$LEASE" --store "$TLS" show tls/k --json
assert_eq "$(jget "$OUT" .owner)" "$owner" "show over TLS: the owner"
call "$LEASE" --store "$TLS" renew tls/k --owner "$owner" --token "$tok"
expect_rc 0 "renew over TLS"
call "$LEASE" --store "$TLS" release tls/k --owner "$owner" --token "$tok"
expect_rc 0 "release over TLS"

section "the member's certificate is checked"
call "$LEASE" --store "etcds://127.0.0.1:$cp?cacert=$C/other.crt" acquire tls/x
expect_error 6 "a CA that did not sign the member"
call "$LEASE" --store "etcds://127.0.0.1:$cp" acquire tls/x
expect_error 6 "the system CAs do not know the test CA"
call "$LEASE" --store "etcd://127.0.0.1:$cp" acquire tls/x
expect_error 6 "plain HTTP to a TLS member"
call "$LEASE" --store "$TLS" show tls/x
expect_rc 1 "none of the refused acquisitions happened"

finish
