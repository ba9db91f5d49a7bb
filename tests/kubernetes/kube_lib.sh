# kube_lib.sh - what the Kubernetes store's test scripts share: doubles
# (scripts/kube-server.sh, fake_kube.py) started in $T and stopped on exit,
# and the double's API. Sourced after tests/cli/lib.sh, with SRC set.
KS=$SRC/scripts/kube-server.sh
for tool in curl jq ss shuf; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required"
done

# The doubles this script started, stopped on exit before lib.sh's cleanup
# removes $T.
KUBE_DIRS=()
kube_cleanup() {
    local d
    for d in ${KUBE_DIRS[@]+"${KUBE_DIRS[@]}"}; do
        "$KS" stop "$d" >/dev/null 2>&1
    done
    cleanup
}
trap kube_cleanup EXIT

# start_double NAME [OPTIONS...]: a double in $T/NAME; sets URL, DIR, BASE, TOKEN.
start_double() {
    pick_port || die "no free port"
    DIR=$T/$1
    shift
    "$KS" start "$DIR" "$PORT" "$@" >/dev/null || die "the double did not start"
    KUBE_DIRS+=("$DIR")
    URL=$("$KS" url "$DIR")
    BASE=http://127.0.0.1:$PORT
    TOKEN=$(cat "$DIR/token")
}

# kapi METHOD PATH [JSON]: the double's API as the allowed client.
kapi() {
    local ct=application/json
    [ "$1" = PATCH ] && ct=application/merge-patch+json
    curl -sS --max-time 10 -X "$1" -H "Authorization: Bearer $TOKEN" \
        -H "Content-Type: $ct" ${3:+--data "$3"} "$BASE$2"
}
LEASES=/apis/coordination.k8s.io/v1/namespaces/default/leases

