#!/usr/bin/env python3
"""clientgo_leader.py - a small leader with client-go's LeaseLock semantics,
driven through python3-kubernetes' CoordinationV1Api: a real client of the
Lease API, for checking the test double and the Kubernetes store against
what client-go leaders do (tests/kubernetes/kube_interop.sh).

    clientgo_leader.py --url http://127.0.0.1:PORT --namespace NS --name LEASE
                       --identity ID --duration S --token-file F
                       [--retry S] [--renew-deadline S] [--run-seconds N]
                       [--clock-offset S]

The rules (client-go tools/leaderelection, LeaderElector.tryAcquireOrRenew,
restated, not copied):
  - read the Lease; absent: create it holding it (acquireTime = renewTime =
    now, leaseTransitions 0);
  - the record seen (holderIdentity, leaseDurationSeconds, acquireTime,
    renewTime, leaseTransitions: the spec, not the resourceVersion, as
    client-go compares its observed record) is compared with the last one
    observed; a change restarts the observation on OUR monotonic clock
    (the holder's renewTime is never compared with our wall clock);
  - held by another, and observed unchanged for less than its
    leaseDurationSeconds: not ours, try again in --retry s;
  - otherwise (free, ours, or unchanged for the whole duration) write it
    with the resourceVersion read (a CAS): renewTime = now; taking over from
    another holder also sets acquireTime = now and leaseTransitions + 1;
  - a 409 (someone else wrote first) is no error: read again next round;
  - a leader renews every --retry s; if no renewal succeeded for
    --renew-deadline s (less than the duration) it stops leading ("lost").
Output, one line per change, flushed: "leader ID" when it starts leading,
"lost" when it stops, "observed HOLDER" ("observed -" for none) when the
holder it sees changes. On SIGTERM it stops leading without clearing the
Lease (client-go's ReleaseOnCancel=false) and exits 0; after --run-seconds
it exits 0 as well (bounded, so that a failed test leaves nothing behind).
--clock-offset S writes acquireTime and renewTime S seconds off this host's
clock (negative: behind), as a holder whose clock is wrong would.
"""
import argparse
import datetime
import signal
import sys
import time

try:
    import kubernetes.client as kc
    from kubernetes.client.rest import ApiException
except ImportError:
    sys.stderr.write("clientgo_leader.py: python3-kubernetes is required "
                     "(apt-get install python3-kubernetes)\n")
    sys.exit(3)

STOP = [False]


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


CLOCK_OFFSET = [0.0]


def now_micro():
    """A timezone-aware UTC datetime, on this holder's (possibly wrong)
    clock. The client serializes it with isoformat(), which drops the
    fraction when it is zero: MicroTime needs its six digits, so never hand
    it a zero fraction."""
    t = datetime.datetime.now(datetime.timezone.utc) + \
        datetime.timedelta(seconds=CLOCK_OFFSET[0])
    return t.replace(microsecond=t.microsecond or 1)


def record_of(lease):
    s = lease.spec
    return (s.holder_identity or "", s.lease_duration_seconds,
            s.acquire_time, s.renew_time, s.lease_transitions)


class Leader:
    def __init__(self, api, a):
        self.api, self.a = api, a
        self.observed = None        # the record last seen
        self.observed_at = 0.0      # when it was first seen (monotonic)
        self.last_holder = None
        self.leading = False
        self.last_renew = 0.0       # monotonic time of our last good write

    def observe(self, lease):
        rec = record_of(lease)
        if rec != self.observed:
            self.observed, self.observed_at = rec, time.monotonic()
        holder = rec[0] or "-"
        if holder != self.last_holder:
            self.last_holder = holder
            say("observed " + holder)

    def create(self):
        now = now_micro()
        body = kc.V1Lease(
            metadata=kc.V1ObjectMeta(name=self.a.name),
            spec=kc.V1LeaseSpec(holder_identity=self.a.identity,
                                lease_duration_seconds=self.a.duration,
                                acquire_time=now, renew_time=now,
                                lease_transitions=0))
        got = self.api.create_namespaced_lease(self.a.namespace, body,
                                               _request_timeout=5)
        self.observe(got)
        return True

    def try_acquire_or_renew(self):
        """True if we hold the Lease after this round."""
        try:
            lease = self.api.read_namespaced_lease(self.a.name, self.a.namespace,
                                                   _request_timeout=5)
        except ApiException as e:
            if e.status == 404:
                try:
                    return self.create()
                except ApiException:
                    return False        # someone created it first: next round
            return False
        self.observe(lease)
        spec = lease.spec
        holder = spec.holder_identity or ""
        mine = holder == self.a.identity
        duration = spec.lease_duration_seconds or self.a.duration
        if holder and not mine and \
                time.monotonic() - self.observed_at < duration:
            return False
        now = now_micro()
        if not mine:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.a.identity
        spec.lease_duration_seconds = self.a.duration
        spec.renew_time = now
        try:
            # The body carries metadata.resourceVersion as read: a CAS.
            got = self.api.replace_namespaced_lease(self.a.name, self.a.namespace,
                                                    lease, _request_timeout=5)
        except ApiException:
            return False                # 409 and the rest: read again
        self.observe(got)
        return True

    def run(self):
        end = time.monotonic() + self.a.run_seconds
        while not STOP[0] and time.monotonic() < end:
            ok = self.try_acquire_or_renew()
            if ok:
                self.last_renew = time.monotonic()
                if not self.leading:
                    self.leading = True
                    say("leader " + self.a.identity)
            elif self.leading and \
                    time.monotonic() - self.last_renew >= self.a.renew_deadline:
                self.leading = False
                say("lost")
            self.sleep(self.a.retry)
        if self.leading:
            say("lost")             # stops leading; the Lease is not cleared

    def sleep(self, s):
        end = time.monotonic() + s
        while not STOP[0] and time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def main():
    ap = argparse.ArgumentParser(description="a client-go style Lease leader")
    ap.add_argument("--url", required=True)
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--name", required=True)
    ap.add_argument("--identity", required=True)
    ap.add_argument("--duration", type=int, default=15)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--retry", type=float, default=2.0)
    ap.add_argument("--renew-deadline", type=float, default=0)
    ap.add_argument("--cacert")
    ap.add_argument("--run-seconds", type=float, default=300)
    ap.add_argument("--clock-offset", type=float, default=0.0)
    a = ap.parse_args()
    CLOCK_OFFSET[0] = a.clock_offset
    if a.duration <= 0:
        ap.error("--duration must be at least 1")
    if a.renew_deadline <= 0:
        a.renew_deadline = a.duration * 0.75
    if a.renew_deadline >= a.duration:
        ap.error("--renew-deadline must be less than --duration")
    with open(a.token_file) as f:
        token = f.read().strip()
    cfg = kc.Configuration()
    cfg.host = a.url
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    if a.cacert:
        cfg.ssl_ca_cert = a.cacert
    api = kc.CoordinationV1Api(kc.ApiClient(cfg))
    signal.signal(signal.SIGTERM, lambda *_: STOP.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: STOP.__setitem__(0, True))
    Leader(api, a).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
