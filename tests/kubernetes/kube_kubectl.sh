#!/usr/bin/env bash
# kube_kubectl: kubectl, a real client, against the Kubernetes test double
# (tests/kubernetes/fake_kube.py), and what `lease acquire` writes as kubectl
# sees it.
#
#   kube_kubectl.sh PATH_TO_LEASE_BINARY
#
# (a) discovery and auth: `kubectl version` reaches the double with the
#     bearer token (kubeconfig in the test's temp dir, never printed); a
#     wrong token is refused (401), the forbidden one too (403);
# (b) `kubectl apply -f` a Lease manifest creates it, `kubectl get lease
#     NAME -o json` shows it, a second apply changes it (a strategic merge
#     patch) with a new resourceVersion, `kubectl get leases` lists it,
#     `kubectl delete lease NAME` removes it and `get` then fails NotFound;
# (c) `lease acquire KEY --store kubernetes+http://...` then `kubectl get
#     lease NAME -o json`: spec.holderIdentity = the owner,
#     leaseDurationSeconds = the ttl in whole seconds, the annotation
#     liblease/token = the token lease printed, liblease/key = the key; for
#     a key that is no object name, the one object whose liblease/key is the
#     key; after `lease release` the holder is cleared and the token kept.
#
# kubectl sends no bearer token over plain HTTP, so the double serves HTTPS
# to it (a self-signed certificate, kube-server.sh --tls) and plain HTTP on
# a second port to lease, both on the same objects. A missing kubectl is a
# failure, never a skip.
. "$(dirname "$0")/../cli/lib.sh" "$@"

HERE=$(cd "$(dirname "$0")" && pwd)
KUBE_SH=$HERE/../../scripts/kube-server.sh
for tool in kubectl curl openssl ss; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by kube_kubectl but was not found in PATH" \
            "(kubectl: apt-get install kubernetes-client)" >&2
        exit 1
    fi
done

KDIR=$T/kube
trap '"$KUBE_SH" stop "$KDIR" >/dev/null 2>&1; cleanup' EXIT

# Start the double: HTTPS on TPORT, plain HTTP on HPORT (up to 3 tries, a
# port may be taken between the probe and the bind).
started=0
for _ in 1 2 3; do
    pick_port || die "no free port"
    TPORT=$PORT
    pick_port || die "no free port"
    HPORT=$PORT
    if "$KUBE_SH" start "$KDIR" "$TPORT" --tls --http-port "$HPORT" >"$T/start.out" 2>&1; then
        started=1
        break
    fi
    "$KUBE_SH" stop "$KDIR" >/dev/null 2>&1
done
[ "$started" = 1 ] || die "the double did not start: $(cat "$T/start.out")"
HTTP_URL="kubernetes+http://127.0.0.1:$HPORT/default?token_file=$KDIR/token"
section "double on https://127.0.0.1:$TPORT (kubectl) and http://127.0.0.1:$HPORT (lease)"

# kubeconfig TOKENFILE: a kubeconfig for the double (mode 0600), on stdout.
kubeconfig() {
    cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: double
  cluster:
    server: https://127.0.0.1:$TPORT
    certificate-authority: $KDIR/ca.pem
users:
- name: tester
  user:
    tokenFile: $1
contexts:
- name: double
  context:
    cluster: double
    user: tester
    namespace: default
current-context: double
EOF
}
(umask 077 && kubeconfig "$KDIR/token" >"$T/kubeconfig" &&
    kubeconfig "$KDIR/forbidden-token" >"$T/kubeconfig-forbidden" &&
    od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$T/wrong-token" &&
    kubeconfig "$T/wrong-token" >"$T/kubeconfig-wrong")

# k ARG...: kubectl on the double (bounded, output in $OUT/$ERR/$RC).
k() {
    call kubectl --kubeconfig "$T/kubeconfig" --request-timeout=10s "$@"
}

# obj NAME: the Lease as the double stores it (plain HTTP, jq-able).
obj() {
    curl -sS --max-time 10 -H @"$T/auth-header" \
        "http://127.0.0.1:$HPORT/apis/coordination.k8s.io/v1/namespaces/default/leases/$1"
}
(umask 077 && printf 'Authorization: Bearer %s\n' "$(cat "$KDIR/token")" >"$T/auth-header")

section "(a) discovery and auth"
k version -o json
expect_rc 0 "kubectl version reaches the double"
assert_eq "$(jget "$OUT" .serverVersion.gitVersion)" "v1.30.0-fake-kube" "kubectl sees the double's version"
k api-resources --api-group=coordination.k8s.io -o name
expect_rc 0 "kubectl api-resources"
assert_contains "$OUT" "leases.coordination.k8s.io" "discovery lists leases"
call kubectl --kubeconfig "$T/kubeconfig-wrong" --request-timeout=10s get leases
assert_ne "$RC" 0 "a wrong token is refused"
assert_match "$ERR" "Unauthorized|provide credentials|logged in" "kubectl reports 401 for a wrong token"
call kubectl --kubeconfig "$T/kubeconfig-forbidden" --request-timeout=10s get lease x
assert_ne "$RC" 0 "the forbidden token is refused"
assert_match "$ERR" "[Ff]orbidden" "kubectl reports 403 for the forbidden token"
for f in "$T/out" "$T/err" "$KDIR/kube.log"; do
    assert_not_contains "$(cat "$f")" "$(cat "$KDIR/token")" "no token in $(basename "$f")"
done

section "(b) apply, get, apply again, list, delete"
manifest() {
    cat <<EOF
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: kubectl-demo
  labels:
    app: fidelity
spec:
  holderIdentity: $1
  leaseDurationSeconds: $2
EOF
}
manifest alice 10 >"$T/lease.yaml"
# --validate=false: the double serves no OpenAPI document (see README.md).
k apply --validate=false -f "$T/lease.yaml"
expect_rc 0 "kubectl apply creates the Lease"
assert_contains "$OUT" "created" "apply says created"
k get lease kubectl-demo -o json
expect_rc 0 "kubectl get lease -o json"
assert_eq "$(jget "$OUT" '.spec.holderIdentity')" alice "holderIdentity as applied"
assert_eq "$(jget "$OUT" '.spec.leaseDurationSeconds')" 10 "leaseDurationSeconds as applied"
assert_eq "$(jget "$OUT" '.metadata.labels.app')" fidelity "labels as applied"
assert_eq "$(jget "$OUT" '.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"] | fromjson | .spec.holderIdentity')" \
    alice "kubectl's last-applied annotation is kept"
rv1=$(jget "$OUT" '.metadata.resourceVersion')
uid1=$(jget "$OUT" '.metadata.uid')
assert_eq "$(obj kubectl-demo | jq -r .metadata.resourceVersion)" "$rv1" "kubectl shows the stored resourceVersion"

manifest bob 20 >"$T/lease.yaml"
k apply --validate=false -f "$T/lease.yaml"
expect_rc 0 "a second apply"
assert_contains "$OUT" "configured" "the second apply changes the Lease"
k get lease kubectl-demo -o json
assert_eq "$(jget "$OUT" '.spec.holderIdentity')" bob "the second apply's holder"
assert_eq "$(jget "$OUT" '.spec.leaseDurationSeconds')" 20 "the second apply's duration"
assert_eq "$(jget "$OUT" '.metadata.uid')" "$uid1" "the same object (uid kept)"
assert_gt "$(jget "$OUT" '.metadata.resourceVersion')" "$rv1" "a new resourceVersion"
k apply --validate=false -f "$T/lease.yaml"
assert_contains "$OUT" "unchanged" "applying the same manifest again changes nothing"

k get leases -o name
expect_rc 0 "kubectl get leases"
assert_contains "$OUT" "lease.coordination.k8s.io/kubectl-demo" "the list has the Lease"
k get leases -l app=fidelity -o name
assert_contains "$OUT" "kubectl-demo" "a label selector finds it"
k get leases -l app=other -o name
assert_not_contains "$OUT" "kubectl-demo" "another label selector does not"

k delete lease kubectl-demo
expect_rc 0 "kubectl delete lease"
k get lease kubectl-demo -o json
assert_ne "$RC" 0 "get after delete fails"
assert_contains "$ERR" "NotFound" "get after delete: NotFound"

section "(c) what lease acquire wrote, as kubectl sees it"
if ! has_store kubernetes; then
    fail "this lease has no kubernetes store (stores: $(lease_stores))"
    finish
fi
OWNER=3f0c2a52-6d1e-4a53-9d1e-0a4f2b7c9e11
call "$LEASE" --store "$HTTP_URL" acquire kube-kubectl-key --ttl 7500ms --owner "$OWNER" \
    --label fidelity --json
expect_rc 0 "lease acquire on the double"
TOKEN=$(jget "$OUT" .token)
assert_match "$TOKEN" '^[0-9]+$' "lease printed a token"
k get lease kube-kubectl-key -o json
expect_rc 0 "kubectl get lease shows the object lease wrote"
assert_eq "$(jget "$OUT" '.spec.holderIdentity')" "$OWNER" "spec.holderIdentity = the owner"
assert_eq "$(jget "$OUT" '.spec.leaseDurationSeconds')" 8 "leaseDurationSeconds = the ttl rounded up (7.5 s -> 8)"
assert_eq "$(jget "$OUT" '.metadata.annotations["liblease/token"]')" "$TOKEN" "annotation liblease/token = the token printed"
assert_eq "$(jget "$OUT" '.metadata.annotations["liblease/key"]')" kube-kubectl-key "annotation liblease/key = the key"
assert_match "$(jget "$OUT" '.spec.renewTime')" '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{6}Z$' "renewTime is a MicroTime"

KEY="jobs/Nightly_Backup.v2"   # no object name (/, _, upper case)
call "$LEASE" --store "$HTTP_URL" acquire "$KEY" --ttl 5s --owner "$OWNER" --json
expect_rc 0 "lease acquire of a key that is no object name"
TOKEN2=$(jget "$OUT" .token)
k get leases -o json
NAME=$(printf '%s' "$OUT" | jq -r --arg k "$KEY" '[.items[] | select(.metadata.annotations["liblease/key"] == $k)] | if length == 1 then .[0].metadata.name else "not exactly one" end' 2>/dev/null)
assert_match "$NAME" '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$' "one object carries the key, under a valid name ($NAME)"
k get lease "$NAME" -o json
assert_eq "$(jget "$OUT" '.spec.holderIdentity')" "$OWNER" "its holder is the owner"
assert_eq "$(jget "$OUT" '.metadata.annotations["liblease/token"]')" "$TOKEN2" "its liblease/token is the token printed"

call "$LEASE" --store "$HTTP_URL" release kube-kubectl-key --owner "$OWNER" --token "$TOKEN"
expect_rc 0 "lease release"
k get lease kube-kubectl-key -o json
expect_rc 0 "the released Lease stays"
assert_eq "$(jget "$OUT" '.spec.holderIdentity // ""')" "" "released: no holder"
assert_eq "$(jget "$OUT" '.metadata.annotations["liblease/token"]')" "$TOKEN" "released: the token counter is kept"
assert_not_contains "$(cat "$KDIR/kube.log")" "$(cat "$KDIR/token")" "no token in the double's log"

finish
