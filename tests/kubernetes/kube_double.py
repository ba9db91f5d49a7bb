#!/usr/bin/env python3
"""kube_double.py - the Kubernetes test double's own protocol checks.

    kube_double.py [PATH_TO_kube-server.sh]

Starts tests/kubernetes/fake_kube.py through scripts/kube-server.sh on a free
loopback port (its own temp dir, a watch window of 5 events), talks plain
HTTP to it with urllib and asserts what the Kubernetes store relies on:
resourceVersion semantics (one global counter; 409 on a stale one; an
update that changes nothing is not a write), 201/409 AlreadyExists/404/422/
400 answers, bearer token auth (401, 403), the Date header, watch
(MODIFIED after a PUT; ERROR 410 for a resourceVersion older than the
window), list selectors and pagination, DELETE preconditions, and the fault
hooks (429 + Retry-After; a write whose answer is lost). Every check can
fail; the server is stopped and the temp dir removed on every exit.
"""
import email.utils
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
KUBE_SH = sys.argv[1] if len(sys.argv) > 1 else \
    os.path.join(HERE, "..", "..", "scripts", "kube-server.sh")
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"

FAILURES = []
CHECKS = [0]


def check(cond, what):
    CHECKS[0] += 1
    if cond:
        print("ok   - " + what)
    else:
        print("FAIL - " + what)
        FAILURES.append(what)


def free_port():
    """A loopback port nothing listens on (bounded: 200 candidates), below
    the kernel's ephemeral range as scripts/ports.sh draws them: a port in
    that range may be taken at any moment by an outgoing connection."""
    hi = 32767
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph = int(f.read().split()[0])
        if eph > 11000:
            hi = eph - 1
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        p = random.randint(10000, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise SystemExit("FATAL: no free port")


class Api:
    def __init__(self, base, token):
        self.base, self.token = base, token

    def call(self, method, path, body=None, token=None, ctype="application/json",
             raw=None):
        """(status, headers, parsed JSON body or text)."""
        data = raw if raw is not None else (
            json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        tok = self.token if token is None else token
        if tok:
            req.add_header("Authorization", "Bearer " + tok)
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                code, hdrs, text = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            code, hdrs, text = e.code, e.headers, e.read()
        try:
            return code, hdrs, json.loads(text)
        except ValueError:
            return code, hdrs, text.decode(errors="replace")


def lease(name, holder=None, duration=10, rv=None, annotations=None, labels=None):
    md = {"name": name}
    if rv:
        md["resourceVersion"] = rv
    if annotations:
        md["annotations"] = annotations
    if labels:
        md["labels"] = labels
    spec = {"leaseDurationSeconds": duration}
    if holder:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": md, "spec": spec}


def reason(body):
    return body.get("reason") if isinstance(body, dict) else None


def rv_of(body):
    return int(body["metadata"]["resourceVersion"])


class Watch(threading.Thread):
    """Reads a watch stream into self.events (bounded by timeoutSeconds)."""

    def __init__(self, api, query):
        super().__init__(daemon=True)
        self.api, self.query, self.events = api, query, []
        self.started = threading.Event()

    def run(self):
        req = urllib.request.Request(self.api.base + LEASES + "?" + self.query)
        req.add_header("Authorization", "Bearer " + self.api.token)
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                self.started.set()
                for line in r:
                    self.events.append(json.loads(line))
        except (OSError, ValueError) as e:
            self.events.append({"type": "client-error", "object": str(e)})
        finally:
            self.started.set()


def checks_auth(api, forbidden):
    code, h, body = api.call("GET", LEASES, token="")
    check(code == 401 and reason(body) == "Unauthorized", "no token: 401 Unauthorized")
    check(h.get("Date") is not None, "a 401 answer carries a Date header")
    code, _, _ = api.call("GET", LEASES, token="not-the-token")
    check(code == 401, "a wrong token: 401")
    code, _, _ = api.call("GET", "/version", token="")
    check(code == 401, "discovery needs a token too: 401 without")
    code, _, body = api.call("GET", LEASES + "/x", token=forbidden)
    check(code == 403 and reason(body) == "Forbidden", "the forbidden token: 403 Forbidden")
    code, _, _ = api.call("GET", "/apis", token=forbidden)
    check(code == 200, "the forbidden token may read discovery (system:discovery)")
    code, h, body = api.call("GET", "/apis/coordination.k8s.io/v1")
    names = [r.get("name") for r in body.get("resources", [])] if isinstance(body, dict) else []
    check(code == 200 and "leases" in names, "discovery lists leases in coordination.k8s.io/v1")
    d = h.get("Date")
    ok = False
    if d:
        t = email.utils.parsedate_to_datetime(d).timestamp()
        ok = abs(t - time.time()) < 60 and d.endswith(" GMT")
    check(ok, "Date header in RFC 7231 form, the server's clock (%s)" % d)


def checks_create(api):
    code, _, a = api.call("POST", LEASES, lease("a", "alice"))
    check(code == 201 and a.get("metadata", {}).get("uid"), "create: 201 with a uid")
    code, _, body = api.call("POST", LEASES, lease("a", "bob"))
    check(code == 409 and reason(body) == "AlreadyExists", "create twice: 409 AlreadyExists")
    code, _, body = api.call("GET", LEASES + "/nope")
    check(code == 404 and reason(body) == "NotFound", "get a missing lease: 404 NotFound")
    for bad, what in ((lease("Bad_Name"), "a name that is not a DNS-1123 subdomain"),
                      (lease("x" * 254), "a name of 254 characters"),
                      (lease("d0", duration=0), "leaseDurationSeconds 0"),
                      (lease("dm", duration=-3), "a negative leaseDurationSeconds"),
                      (lease("big", annotations={"liblease/h": "x" * (256 * 1024)}),
                       "annotations over 256 KiB"),
                      (lease("ak", annotations={"bad key!": "v"}), "an invalid annotation key")):
        code, _, body = api.call("POST", LEASES, bad)
        check(code == 422 and reason(body) == "Invalid", "422 Invalid for " + what)
    code, _, _ = api.call("POST", LEASES, lease("x" * 253))
    check(code == 201, "a name of 253 characters is valid")
    body = lease("s")
    body["spec"]["leaseDurationSeconds"] = "5"
    code, _, _ = api.call("POST", LEASES, body)
    check(code == 400, "a string leaseDurationSeconds: 400 (a decode error, as a real server)")
    body = lease("t")
    body["spec"]["renewTime"] = "2026-12-01T03:04:05.123Z"
    code, _, _ = api.call("POST", LEASES, body)
    check(code == 400, "a MicroTime without six digits: 400")
    body["spec"]["renewTime"] = "2026-12-01T03:04:05.123456Z"
    code, _, got = api.call("POST", LEASES, body)
    check(code == 201 and got["spec"]["renewTime"] == "2026-12-01T03:04:05.123456Z",
          "a MicroTime is stored as given")
    code, _, _ = api.call("POST", LEASES, raw=b"{not json")
    check(code == 400, "bad JSON: 400")
    return a


def checks_update(api, a):
    rv0 = rv_of(a)
    a["spec"]["holderIdentity"] = "bob"
    code, _, a2 = api.call("PUT", LEASES + "/a", a)
    check(code == 200 and rv_of(a2) > rv0, "PUT with the current resourceVersion: 200, new rv")
    code, _, body = api.call("PUT", LEASES + "/a", a)
    check(code == 409 and reason(body) == "Conflict" and
          "the object has been modified" in body.get("message", ""),
          "PUT with a stale resourceVersion: 409 Conflict")
    code, _, cur = api.call("GET", LEASES + "/a")
    check(cur["spec"]["holderIdentity"] == "bob" and rv_of(cur) == rv_of(a2),
          "the refused PUT changed nothing")
    unconditional = lease("a", "carol")
    code, _, body = api.call("PUT", LEASES + "/a", unconditional)
    check(code == 422, "PUT without a resourceVersion: 422 (Lease refuses unconditional updates)")
    code, _, same = api.call("PUT", LEASES + "/a", cur)
    check(code == 200 and rv_of(same) == rv_of(cur),
          "a PUT that changes nothing makes no new resourceVersion")
    code, _, b = api.call("POST", LEASES, lease("b", "zed"))
    check(code == 201 and rv_of(b) > rv_of(a2), "the counter is global: b's rv > a's")
    code, _, lst = api.call("GET", LEASES)
    check(int(lst["metadata"]["resourceVersion"]) == rv_of(b),
          "a list's resourceVersion is the counter")
    patch = {"metadata": {"resourceVersion": str(rv0)}, "spec": {"holderIdentity": "p"}}
    code, _, body = api.call("PATCH", LEASES + "/a", patch, ctype="application/merge-patch+json")
    check(code == 409, "a merge patch carrying a stale resourceVersion: 409")
    code, _, body = api.call("PATCH", LEASES + "/a", {"spec": {"holderIdentity": "p"}},
                             ctype="application/merge-patch+json")
    check(code == 200 and body["spec"]["holderIdentity"] == "p", "a merge patch: 200")
    return b


def checks_list_delete(api):
    for n, team in (("l1", "x"), ("l2", "y"), ("l3", "x")):
        api.call("POST", LEASES, lease(n, labels={"team": team}))
    code, _, lst = api.call("GET", LEASES + "?labelSelector=team%3Dx")
    names = [o["metadata"]["name"] for o in lst.get("items", [])]
    check(code == 200 and names == ["l1", "l3"], "labelSelector team=x: l1, l3 (%s)" % names)
    code, _, lst = api.call("GET", LEASES + "?fieldSelector=metadata.name%3Dl2")
    names = [o["metadata"]["name"] for o in lst.get("items", [])]
    check(names == ["l2"], "fieldSelector metadata.name=l2")
    code, _, p1 = api.call("GET", LEASES + "?labelSelector=team&limit=2")
    cont = p1.get("metadata", {}).get("continue")
    code, _, p2 = api.call("GET", LEASES + "?labelSelector=team&limit=2&continue=" + str(cont))
    got = [o["metadata"]["name"] for o in p1.get("items", []) + p2.get("items", [])]
    check(cont and got == ["l1", "l2", "l3"] and not p2["metadata"].get("continue"),
          "limit + continue pages through l1, l2, l3")
    code, _, cur = api.call("GET", LEASES + "/l1")
    opts = {"kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": str(rv_of(cur) - 1)}}
    code, _, body = api.call("DELETE", LEASES + "/l1", opts)
    check(code == 409, "DELETE with a stale resourceVersion precondition: 409")
    opts["preconditions"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
    code, _, body = api.call("DELETE", LEASES + "/l1", opts)
    check(code == 200 and body.get("status") == "Success", "DELETE: 200, Status Success")
    code, _, _ = api.call("GET", LEASES + "/l1")
    check(code == 404, "deleted: GET 404")
    code, _, _ = api.call("DELETE", LEASES + "/l1")
    check(code == 404, "DELETE of a missing lease: 404")
    code, _, body = api.call("PUT", LEASES + "/l1", lease("l1", rv=cur["metadata"]["resourceVersion"]))
    check(code == 201, "PUT on a missing lease creates it (Lease allows create on update): 201")


def checks_watch(api, b_old):
    _, _, b = api.call("GET", LEASES + "/b")
    _, _, lst = api.call("GET", LEASES)        # the counter: within the window
    w = Watch(api, "watch=1&fieldSelector=metadata.name%%3Db&resourceVersion=%d"
              "&timeoutSeconds=3" % rv_of(lst))
    w.start()
    w.started.wait(5)
    b["spec"]["holderIdentity"] = "watched"
    code, _, b2 = api.call("PUT", LEASES + "/b", b)
    api.call("PUT", LEASES + "/a", lease("a", "not-b"))      # another object: not sent
    w.join(10)
    ev = [(e["type"], e["object"].get("metadata", {}).get("resourceVersion"),
           e["object"].get("spec", {}).get("holderIdentity")) for e in w.events]
    check(code == 200 and ev == [("MODIFIED", b2["metadata"]["resourceVersion"], "watched")],
          "watch from the list's rv delivers one MODIFIED with the PUT's rv (%s)" % ev)
    check(not w.is_alive(), "the watch ends after timeoutSeconds")
    w = Watch(api, "watch=1&fieldSelector=metadata.name%3Db&timeoutSeconds=1")
    w.start()
    w.join(10)
    check([e["type"] for e in w.events] == ["ADDED"],
          "a watch without a resourceVersion starts with ADDED for the object")
    for i in range(7):          # more writes than the window (5) keeps
        code, _, b2 = api.call("PUT", LEASES + "/b", dict(b2, spec={"holderIdentity": "h%d" % i}))
    w = Watch(api, "watch=1&resourceVersion=%d&timeoutSeconds=3" % rv_of(b_old))
    w.start()
    w.join(10)
    ev = w.events
    check(len(ev) == 1 and ev[0]["type"] == "ERROR" and ev[0]["object"].get("code") == 410,
          "a watch from a resourceVersion older than the window: one ERROR 410, then the end")


def checks_faults(api):
    code, _, st0 = api.call("GET", "/fake/v1/stats")
    code, _, _ = api.call("POST", "/fake/v1/faults",
                          {"status": 429, "retry_after": 2, "count": 1, "path_prefix": "/apis/"})
    check(code == 200, "a fault is armed")
    code, h, body = api.call("GET", LEASES + "/b")
    check(code == 429 and h.get("Retry-After") == "2" and reason(body) == "TooManyRequests",
          "the armed fault: 429 TooManyRequests with Retry-After: 2")
    code, _, cur = api.call("GET", LEASES + "/b")
    check(code == 200, "count 1: the next request is answered again")
    api.call("POST", "/fake/v1/faults", {"status": 500, "count": 1, "method": "PUT",
                                         "commit": True})
    code, _, _ = api.call("PUT", LEASES + "/b", dict(cur, spec={"holderIdentity": "lost"}))
    code2, _, after = api.call("GET", LEASES + "/b")
    check(code == 500 and after["spec"].get("holderIdentity") == "lost" and
          rv_of(after) > rv_of(cur), "a commit fault: the write is done, its answer is a 500")
    code, _, st = api.call("GET", "/fake/v1/stats")
    check(st["writes"] - st0["writes"] == 1 and st["verbs"]["update"] - st0["verbs"]["update"] == 1,
          "stats count the write requests (%s)" % st)
    api.call("POST", "/fake/v1/faults", {"status": 503, "count": 5})
    api.call("POST", "/fake/v1/reset")
    code, _, _ = api.call("GET", LEASES + "/b")
    check(code == 200, "reset clears the armed faults")
    code, _, _ = api.call("POST", "/fake/v1/faults", {"status": 429}, token="")
    check(code == 401, "the test hooks need the token")


def main():
    tmp = tempfile.mkdtemp(prefix="lease-kube_double.")
    srv = os.path.join(tmp, "kube")
    started = False
    try:
        for _ in range(3):          # a port taken between the probe and the bind
            port = free_port()
            r = subprocess.run(["bash", KUBE_SH, "start", srv, str(port),
                                "--watch-window", "5"], capture_output=True, text=True)
            if r.returncode == 0:
                started = True
                break
            sys.stderr.write(r.stderr)
            subprocess.run(["bash", KUBE_SH, "stop", srv])
        if not started:
            print("FATAL: the fake API server did not start")
            return 1
        with open(os.path.join(srv, "token")) as f:
            token = f.read().strip()
        with open(os.path.join(srv, "forbidden-token")) as f:
            forbidden = f.read().strip()
        api = Api("http://127.0.0.1:%d" % port, token)
        checks_auth(api, forbidden)
        a = checks_create(api)
        b = checks_update(api, a)
        checks_list_delete(api)
        checks_watch(api, b)
        checks_faults(api)
        with open(os.path.join(srv, "kube.log")) as f:
            log = f.read()
        check(token not in log and forbidden not in log and "PUT " + LEASES in log,
              "the server log has one line per request and no token")
    finally:
        subprocess.run(["bash", KUBE_SH, "stop", srv])
        subprocess.run(["rm", "-rf", tmp])
    print("%d checks, %d failed" % (CHECKS[0], len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
