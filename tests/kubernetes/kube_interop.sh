#!/usr/bin/env bash
# kube_interop: issue 17 point 7, `lease elect` and a client-go style leader
# (clientgo_leader.py, python3-kubernetes' CoordinationV1Api with
# LeaseLock's rules) competing for the same Lease on the test double.
#
#   kube_interop.sh PATH_TO_LEASE_BINARY
#
# 0. python3-kubernetes' watch (kubernetes.watch.Watch) sees a create, an
#    update and a delete on the double;
# 1. the python leader (duration D = 3 s, renewing every second) leads;
# 2. `lease elect` campaigns on the same Lease (ttl D): while the python
#    leader renews (3 D), it never leads (its command never starts, the
#    Lease's holderIdentity, sampled every 0.5 s, stays the python leader);
# 3. the python leader is stopped (SIGTERM: it stops renewing, the Lease is
#    not cleared): `lease elect` leads within 4 D (a bound, not a timing
#    assertion);
# 4. a new python leader starts: while `lease elect` renews (3 D), it never
#    leads;
# 5. `lease elect` is stopped (SIGTERM: its command ends, it releases): the
#    python leader takes over within 4 D.
# Throughout: one leader at a time, from both sides' own logs (each line
# stamped when it was printed; a leadership ends before the next begins) and
# from the holderIdentity samples (py-1, then lease's owner, then py-2, never
# back). A missing python3-kubernetes is a failure, never a skip.
. "$(dirname "$0")/../cli/lib.sh" "$@"

HERE=$(cd "$(dirname "$0")" && pwd)
KUBE_SH=$HERE/../../scripts/kube-server.sh
PY=/usr/bin/python3
LEADER=$HERE/clientgo_leader.py
D=3
for tool in curl jq ss; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FATAL: '$tool' is required by kube_interop but was not found in PATH" >&2
        exit 1
    fi
done
if ! "$PY" -c 'import kubernetes.client' 2>/dev/null; then
    echo "FATAL: python3-kubernetes is required by kube_interop" \
        "(apt-get install python3-kubernetes)" >&2
    exit 1
fi
if ! has_store kubernetes; then
    echo "FATAL: this lease has no kubernetes store (stores: $(lease_stores))" >&2
    exit 1
fi

KDIR=$T/kube
trap '"$KUBE_SH" stop "$KDIR" >/dev/null 2>&1; cleanup' EXIT
started=0
for _ in 1 2 3; do
    pick_port || die "no free port"
    if "$KUBE_SH" start "$KDIR" "$PORT" >"$T/start.out" 2>&1; then
        started=1
        break
    fi
    "$KUBE_SH" stop "$KDIR" >/dev/null 2>&1
done
[ "$started" = 1 ] || die "the double did not start: $(cat "$T/start.out")"
URL=$("$KUBE_SH" url "$KDIR")
API=http://127.0.0.1:$PORT/apis/coordination.k8s.io/v1/namespaces/default/leases
(umask 077 && printf 'Authorization: Bearer %s\n' "$(cat "$KDIR/token")" >"$T/auth-header")
section "double on 127.0.0.1:$PORT"

now_ms() { date +%s%3N; }

# stamp FILE: copy stdin to FILE, each line prefixed with the time it came.
stamp() {
    local line
    while IFS= read -r line; do
        printf '%s %s\n' "$(now_ms)" "$line" >>"$1"
    done
}

section "0. python3-kubernetes' list + watch on the double"
# A real client's watch (kubernetes.watch.Watch: watch=True, the list's
# resourceVersion, a field selector): a create, an update and a delete of
# another object arrive as ADDED, MODIFIED, DELETED, in order.
cat >"$T/watch.py" <<'PYEOF'
import sys, threading, time
import kubernetes.client as kc, kubernetes.watch as kw
cfg = kc.Configuration()
cfg.host = sys.argv[1]
cfg.api_key = {"authorization": open(sys.argv[2]).read().strip()}
cfg.api_key_prefix = {"authorization": "Bearer"}
api = kc.CoordinationV1Api(kc.ApiClient(cfg))
rv = api.list_namespaced_lease("default").metadata.resource_version
def writer():
    time.sleep(0.5)
    api.create_namespaced_lease("default", kc.V1Lease(
        metadata=kc.V1ObjectMeta(name="watch-probe"),
        spec=kc.V1LeaseSpec(holder_identity="w1", lease_duration_seconds=3)))
    l = api.read_namespaced_lease("watch-probe", "default")
    l.spec.holder_identity = "w2"
    api.replace_namespaced_lease("watch-probe", "default", l)
    api.delete_namespaced_lease("watch-probe", "default")
threading.Thread(target=writer, daemon=True).start()
out = []
for ev in kw.Watch().stream(api.list_namespaced_lease, "default", resource_version=rv,
                            field_selector="metadata.name=watch-probe", timeout_seconds=3):
    out.append("%s:%s" % (ev["type"], ev["object"].spec.holder_identity))
print(" ".join(out))
PYEOF
call "$PY" "$T/watch.py" "http://127.0.0.1:$PORT" "$KDIR/token"
expect_rc 0 "the python client's watch"
assert_eq "$OUT" "ADDED:w1 MODIFIED:w2 DELETED:w2" "python3-kubernetes watch events"

# The object `lease elect interop` uses: its key is election/interop, which
# is no object name; the store maps it. Found by its liblease/key
# annotation after one acquire/release (which leaves the object, free).
call "$LEASE" --store "$URL" acquire election/interop --ttl 1s --json
expect_rc 0 "lease acquire election/interop (to make the object)"
call "$LEASE" --store "$URL" release election/interop --owner "$(jget "$OUT" .owner)" \
    --token "$(jget "$OUT" .token)"
expect_rc 0 "release it"
NAME=$(curl -sS --max-time 10 -H @"$T/auth-header" "$API" |
    jq -r '[.items[] | select(.metadata.annotations["liblease/key"] == "election/interop")]
           | if length == 1 then .[0].metadata.name else "" end')
[ -n "$NAME" ] || die "no single Lease carries liblease/key election/interop"
section "the election's Lease: $NAME"

holder() {
    curl -sS --max-time 5 -H @"$T/auth-header" "$API/$NAME" | jq -r '.spec.holderIdentity // ""'
}

# Sample holderIdentity every 0.5 s (bounded: 400 samples, 200 s).
(for ((i = 0; i < 400; i++)); do
    printf '%s %s\n' "$(now_ms)" "$(holder 2>/dev/null || echo '?')" >>"$T/holders"
    sleep 0.5
done) &
bg_register $!

# py_start N: start the python leader py-N, its stamped output in $T/py-N,
# its pid in PYPID[N].
PYPID=()
py_start() {
    "$PY" "$LEADER" --url "http://127.0.0.1:$PORT" --namespace default --name "$NAME" \
        --identity "py-$1" --duration "$D" --retry 1 --token-file "$KDIR/token" \
        --run-seconds 150 2>"$T/py-$1.err" > >(stamp "$T/py-$1") &
    PYPID[$1]=$!
    bg_register $!
}
has_line() { grep -q -- "$2" "$1" 2>/dev/null; }
# time_of FILE PATTERN: the stamp of the first line matching PATTERN.
time_of() { grep -- "$2" "$1" 2>/dev/null | head -n 1 | cut -d' ' -f1; }

section "1. the python leader leads"
py_start 1
WAIT_TRIES=400 wait_for "py-1 leads" has_line "$T/py-1" " leader py-1$"

section "2. lease elect campaigns while py-1 renews: it never leads"
cat >"$T/cmd.sh" <<EOF
trap 'echo "\$(date +%s%3N) stopped" >>"$T/elect.events"; exit 0' TERM
echo "\$(date +%s%3N) elected \$LEASE_OWNER \$LEASE_EPOCH" >>"$T/elect.events"
i=0; while [ \$i -lt 1200 ]; do sleep 0.1; i=\$((i+1)); done
EOF
"$LEASE" --store "$URL" elect interop --ttl "${D}s" --wait 120s --json -- sh "$T/cmd.sh" \
    >"$T/elect.out" 2>"$T/elect.err" &
ELECT=$!
bg_register "$ELECT"
sleep $((3 * D))
assert_eq "$(cat "$T/elect.events" 2>/dev/null)" "" "lease elect did not lead while py-1 renewed"
if has_line "$T/py-1" " lost$"; then fail "py-1 lost leadership while renewing"; else pass; fi
assert_eq "$(holder)" py-1 "the Lease's holder is still py-1"
if kill -0 "$ELECT" 2>/dev/null; then pass; else fail "lease elect is still campaigning"; fi

section "3. py-1 stops (SIGTERM, the Lease not cleared): lease elect takes over"
kill -0 "${PYPID[1]}" 2>/dev/null || die "py-1 is not running"
kill -TERM "${PYPID[1]}"
WAIT_TRIES=100 wait_for "py-1 says lost" has_line "$T/py-1" " lost$"
WAIT_TRIES=$((4 * D * 20)) wait_for "lease elect leads within 4 D" has_line "$T/elect.events" " elected "
ELECT_OWNER=$(grep ' elected ' "$T/elect.events" | head -n 1 | cut -d' ' -f3)
assert_match "$ELECT_OWNER" '^[0-9a-f-]{36}$' "lease elect's command got its owner"
assert_eq "$(holder)" "$ELECT_OWNER" "the Lease's holder is lease elect's owner"
T_P1_LOST=$(time_of "$T/py-1" " lost$")
T_E_ELECTED=$(time_of "$T/elect.events" " elected ")
# before_ms A B DESCRIPTION: both stamps known and A <= B.
before_ms() {
    if [ -n "$1" ] && [ -n "$2" ] && [ "$1" -le "$2" ]; then pass; else fail "$3"; fi
}
before_ms "$T_P1_LOST" "$T_E_ELECTED" \
    "py-1 stopped leading ($T_P1_LOST) before lease elect led ($T_E_ELECTED)"

section "4. a new python leader while lease elect renews: it never leads"
py_start 2
WAIT_TRIES=600 wait_for "py-2 observes lease elect's owner" has_line "$T/py-2" " observed $ELECT_OWNER$"
sleep $((3 * D))
if has_line "$T/py-2" " leader py-2$"; then fail "py-2 led while lease elect renewed"; else pass; fi
assert_eq "$(holder)" "$ELECT_OWNER" "the holder is still lease elect's owner"
if has_line "$T/elect.events" " stopped$"; then fail "lease elect stepped down while renewing"; else pass; fi

section "5. lease elect stops (SIGTERM: it releases): py-2 takes over"
kill -TERM "$ELECT"
wait_exit "$ELECT" ELECT_RC "lease elect exits after SIGTERM"
assert_eq "$ELECT_RC" 0 "lease elect exit status (its command's, after SIGTERM)"
WAIT_TRIES=$((4 * D * 20)) wait_for "py-2 leads within 4 D" has_line "$T/py-2" " leader py-2$"
assert_eq "$(holder)" py-2 "the Lease's holder is py-2"
T_E_STOPPED=$(time_of "$T/elect.events" " stopped$")
T_P2_LEADER=$(time_of "$T/py-2" " leader py-2$")
before_ms "$T_E_STOPPED" "$T_P2_LEADER" \
    "lease elect's command stopped ($T_E_STOPPED) before py-2 led ($T_P2_LEADER)"
kill -TERM "${PYPID[2]}" 2>/dev/null

section "one holder at a time in the samples: py-1, lease elect, py-2, never back"
# The sampler polls every half second: let it record py-2 (bounded).
WAIT_TRIES=200 wait_for "the sampler saw py-2" grep -q ' py-2$' "$T/holders"
seq=$(cut -d' ' -f2- "$T/holders" | sed "s/^$ELECT_OWNER\$/E/; s/^py-1\$/P1/; s/^py-2\$/P2/; s/^\$/-/" | uniq | tr '\n' ' ')
assert_match "$seq" '^(- )?P1 (- )?E (- )?P2 ' "holder sequence ($seq)"
assert_eq "$(grep -o ' E ' <<<" $seq " | wc -l)" 1 "lease elect held one stretch"
echo "python py-1: $(tr '\n' '|' <"$T/py-1")"
echo "python py-2: $(tr '\n' '|' <"$T/py-2")"
echo "lease elect: $(tr '\n' '|' <"$T/elect.events")"
assert_not_contains "$(cat "$KDIR/kube.log" "$T/elect.err" "$T/py-1.err" "$T/py-2.err")" \
    "$(cat "$KDIR/token")" "no token in any log"
finish
