#!/usr/bin/env python3
"""fake_kube.py - a small Kubernetes API server for coordination.k8s.io/v1
Lease objects, for the tests of the Kubernetes store (no API server is
packaged for Debian). Python standard library only.

    fake_kube.py --port PORT [--host 127.0.0.1] --token-file FILE
                 [--forbidden-token-file FILE] [--tls-cert PEM --tls-key PEM]
                 [--pid-file FILE] [--watch-window N] [--bookmark-seconds S]
                 [--http-port PORT]

What it mirrors of a real API server (kube-apiserver 1.30, generic
registry + etcd3 storage, the Lease strategy) and what it does not is in
tests/kubernetes/README.md; its fidelity is checked with kubectl and
python3-kubernetes (tests/kubernetes/kube_kubectl.sh, kube_interop.sh)
and its protocol by tests/kubernetes/kube_double.sh.

In short: one global resourceVersion counter, bumped by every write that
changes an object (a write that changes nothing is not a write, as in
etcd3 storage); PUT needs the resourceVersion it read (the Lease strategy
refuses unconditional updates) and creates a missing object (it allows
create-on-update); PATCH (merge, strategic treated as merge, JSON patch);
DELETE with preconditions; list with selectors and pagination; watch from a
bounded window of past events (410 past it); bearer token auth (401/403);
discovery documents for kubectl; every answer carries a Date header.

Test hooks, outside the API paths (loopback clients, the allowed token):
  POST /fake/v1/faults {"status":429,"retry_after":2,"count":1,
                        "path_prefix":"/apis/","method":"PUT",
                        "commit":false,"close":false,"verb":"watch"}
       the next COUNT matching requests answer STATUS (a Status body;
       Retry-After when given). "commit": the request is carried out
       first and its answer replaced (a write whose answer is lost);
       "close": the connection is closed without an answer; "verb":
       only requests of that verb (get, list, watch, update ...).
       Hostile answers instead of a Status ("status" is then ignored):
       "answer":"bloat" a 200 whose body (a watch: one event line) is
       [{},{},...] of "bytes" (default just under 4 MiB); "answer":"raw"
       a 200 whose body is "text" as given (a watch: one line of it);
       "answer":"repeat_continue" a list page that ignores the continue
       token it was given and answers the first page with one fixed
       continue token.
  POST /fake/v1/delay {"ms":N,"count":M,"path_prefix":..., "method":...}
  POST /fake/v1/clock {"offset_s":N}   the Date header runs N s ahead
  POST /fake/v1/reset                  clears faults, delays and offset
  GET  /fake/v1/stats  {"requests":N,"writes":N,"commits":N,"watches":N,"gone":N,
                        "verbs":{"get":N,"list":N,"create":N,...}}
       writes = write requests on the API paths (answered or not),
       commits = writes that made a new resourceVersion.
One line per request is logged to stderr (method, path, status, ms); the
Authorization header never is.
"""
import argparse
import base64
import collections
import copy
import datetime
import hmac
import json
import os
import random
import re
import select
import socket
import ssl
import sys
import threading
import time
import traceback
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

GROUP = "coordination.k8s.io"
GV = GROUP + "/v1"
MAX_BODY = 3 * 1024 * 1024          # the API server's request body limit
ANNOTATIONS_MAX = 256 * 1024        # TotalAnnotationSizeLimitB
INT32_MAX = 2**31 - 1

LEASES_RE = re.compile(
    r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?/?$")
ALL_LEASES = "/apis/coordination.k8s.io/v1/leases"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QNAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# metav1.MicroTime is parsed with RFC3339Micro: exactly six digits.
MICROTIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})"
    r"(Z|[+-]\d{2}:\d{2})$")
TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?"
    r"(Z|[+-]\d{2}:\d{2})$")

REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden",
           404: "NotFound", 405: "MethodNotAllowed", 406: "NotAcceptable",
           409: "Conflict", 410: "Gone", 411: "BadRequest",
           413: "RequestEntityTooLarge", 415: "UnsupportedMediaType",
           422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable", 504: "Timeout"}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch",
         "update", "watch"]


class ApiError(Exception):
    """An answer that is a metav1 Status."""

    def __init__(self, code, message, reason=None, details=None, headers=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details
        self.headers = headers or {}

    def body(self):
        return status_obj(self.code, self.reason, self.message, self.details)


def status_obj(code, reason, message, details=None):
    st = {"kind": "Status", "apiVersion": "v1", "metadata": {},
          "status": "Failure", "message": message, "reason": reason,
          "code": code}
    if details:
        st["details"] = details
    return st


def not_found(name):
    return ApiError(404, 'leases.%s "%s" not found' % (GROUP, name),
                    details={"name": name, "group": GROUP, "kind": "leases"})


def conflict(name, why):
    return ApiError(409, 'Operation cannot be fulfilled on leases.%s "%s": %s'
                    % (GROUP, name, why),
                    details={"name": name, "group": GROUP, "kind": "leases"})


MODIFIED_MSG = ("the object has been modified; please apply your changes to "
                "the latest version and try again")


def invalid(name, causes):
    """422 Invalid from a list of (field, value, message)."""
    parts = ["%s: Invalid value: %s: %s" % (f, json.dumps(v), m)
             for f, v, m in causes]
    msg = 'Lease.%s "%s" is invalid: %s' % (
        GROUP, name, parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]")
    det = {"name": name, "group": GROUP, "kind": "Lease",
           "causes": [{"reason": "FieldValueInvalid", "field": f,
                       "message": "Invalid value: %s: %s" % (json.dumps(v), m)}
                      for f, v, m in causes]}
    return ApiError(422, msg, details=det)


def bad_request(msg):
    return ApiError(400, msg)


def decode_error(msg):
    return bad_request('Lease in version "v1" cannot be handled as a Lease: '
                       + msg)


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def parse_offset(tz):
    if tz == "Z":
        return datetime.timezone.utc
    sign = 1 if tz[0] == "+" else -1
    h, m = int(tz[1:3]), int(tz[4:6])
    if h > 23 or m > 59:
        raise ValueError("offset")
    return datetime.timezone(sign * datetime.timedelta(hours=h, minutes=m))


def norm_microtime(field, s):
    """A MicroTime as the server stores it: UTC, six digits, Z."""
    if not isinstance(s, str):
        raise decode_error("%s: expected a string" % field)
    m = MICROTIME.match(s)
    if not m:
        raise decode_error('%s: parsing time "%s" as '
                           '"2006-01-02T15:04:05.000000Z07:00": cannot parse'
                           % (field, s))
    try:
        y, mo, d, hh, mi, ss, us = (int(x) for x in m.groups()[:7])
        t = datetime.datetime(y, mo, d, hh, mi, ss, us, parse_offset(m.group(8)))
    except ValueError:
        raise decode_error('%s: parsing time "%s": out of range' % (field, s))
    return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_time(field, s):
    if s is None:
        return None
    if not isinstance(s, str) or not TIME.match(s):
        raise decode_error('%s: parsing time "%s": cannot parse' % (field, s))
    return s


def want_type(field, v, typ, tname):
    if v is None:
        return None
    if typ is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
        if ok and not -2**31 <= v <= INT32_MAX:
            raise decode_error("%s: number %d overflows int32" % (field, v))
    else:
        ok = isinstance(v, typ)
    if not ok:
        raise decode_error("json: cannot unmarshal %s into Go struct field "
                           "%s of type %s" % (type(v).__name__, field, tname))
    return v


def want_str_map(field, v):
    if v is None:
        return None
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise decode_error("json: cannot unmarshal into Go struct field %s of "
                           "type map[string]string" % field)
    return dict(v)


def decode_lease(body):
    """The Lease a client sent, decoded as the API server decodes it: wrong
    JSON types are 400, unknown fields are dropped."""
    if not isinstance(body, dict):
        raise decode_error("json: cannot unmarshal into Go value of type v1.Lease")
    kind = want_type("kind", body.get("kind"), str, "string")
    api = want_type("apiVersion", body.get("apiVersion"), str, "string")
    if kind not in (None, "", "Lease") or api not in (None, "", GV):
        raise bad_request("the object provided is unrecognized (must be of "
                          "type Lease): %s/%s" % (api, kind))
    md = body.get("metadata") or {}
    if not isinstance(md, dict):
        raise decode_error("metadata: expected an object")
    out_md = {}
    for f in ("name", "generateName", "namespace", "uid", "resourceVersion"):
        v = want_type("metadata." + f, md.get(f), str, "string")
        if v:
            out_md[f] = v
    for f in ("labels", "annotations"):
        v = want_str_map("metadata." + f, md.get(f))
        if v:
            out_md[f] = v
    if md.get("ownerReferences"):
        out_md["ownerReferences"] = want_type(
            "metadata.ownerReferences", md["ownerReferences"], list, "[]OwnerReference")
    check_time("metadata.creationTimestamp", md.get("creationTimestamp"))
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        raise decode_error("spec: expected an object")
    out_spec = {}
    for f in ("holderIdentity", "preferredHolder", "strategy"):
        v = want_type("LeaseSpec.spec." + f, spec.get(f), str, "string")
        if v is not None:
            out_spec[f] = v
    for f in ("leaseDurationSeconds", "leaseTransitions"):
        v = want_type("LeaseSpec.spec." + f, spec.get(f), int, "int32")
        if v is not None:
            out_spec[f] = v
    for f in ("acquireTime", "renewTime"):
        if spec.get(f) is not None:
            out_spec[f] = norm_microtime("spec." + f, spec[f])
    return {"metadata": out_md, "spec": out_spec}


def qualified_name_errors(field, key):
    errs = []
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        errs.append((field, key, "prefix part must be a lowercase RFC 1123 subdomain"))
    if not name or len(name) > 63 or not QNAME.match(name):
        errs.append((field, key, "name part must consist of alphanumeric characters, "
                     "'-', '_' or '.', and must start and end with an alphanumeric "
                     "character, at most 63 characters"))
    return errs


def validate(lease):
    """422 causes for a decoded Lease (ValidateLease + ValidateObjectMeta)."""
    md, spec = lease["metadata"], lease["spec"]
    name = md.get("name", "")
    errs = []
    if not name:
        errs.append(("metadata.name", name, "name or generateName is required"))
    elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        errs.append(("metadata.name", name, "a lowercase RFC 1123 subdomain must "
                     "consist of lower case alphanumeric characters, '-' or '.', "
                     "and must start and end with an alphanumeric character"))
    size = 0
    for k, v in (md.get("annotations") or {}).items():
        errs += qualified_name_errors("metadata.annotations", k)
        size += len(k.encode()) + len(v.encode())
    if size > ANNOTATIONS_MAX:
        errs.append(("metadata.annotations", "", "Too long: must have at most "
                     "%d bytes" % ANNOTATIONS_MAX))
    for k, v in (md.get("labels") or {}).items():
        errs += qualified_name_errors("metadata.labels", k)
        if len(v) > 63 or not LABEL_VALUE.match(v):
            errs.append(("metadata.labels", v, "a valid label must be an empty "
                         "string or consist of alphanumeric characters, '-', '_' "
                         "or '.', at most 63 characters"))
    d = spec.get("leaseDurationSeconds")
    if d is not None and d <= 0:
        errs.append(("spec.leaseDurationSeconds", d, "must be greater than 0"))
    t = spec.get("leaseTransitions")
    if t is not None and t < 0:
        errs.append(("spec.leaseTransitions", t, "must be greater than or equal to 0"))
    if spec.get("preferredHolder") and not spec.get("strategy"):
        errs.append(("spec.preferredHolder", spec["preferredHolder"],
                     "may only be specified if `strategy` is defined"))
    return errs


def parse_bool(v):
    """A boolean query parameter as Go's strconv.ParseBool reads it
    (python3-kubernetes sends watch=True)."""
    if v in (None, ""):
        return False
    if v in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if v in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise bad_request('invalid boolean value "%s"' % v)


def parse_selector(s, kind):
    """[(key, op, value)] from a label or field selector (equality based)."""
    out = []
    for part in (s or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(!?)([^=!\s]+)\s*(?:(==|=|!=)\s*(.*))?$", part)
        if not m or (m.group(1) and m.group(3)):
            raise bad_request("unable to parse requirement: %s %r" % (kind, part))
        if m.group(3) is None:
            if kind == "fieldSelector":
                raise bad_request("invalid selector: '%s'; can't understand '%s'"
                                  % (s, part))
            out.append((m.group(2), "!" if m.group(1) else "exists", None))
        else:
            out.append((m.group(2), "!=" if m.group(3) == "!=" else "=", m.group(4)))
    if kind == "fieldSelector":
        for k, _, _ in out:
            if k not in ("metadata.name", "metadata.namespace"):
                raise bad_request('field label not supported: %s' % k)
    return out


def matches(obj, labels_sel, fields_sel):
    labels = obj["metadata"].get("labels") or {}
    for k, op, v in labels_sel:
        if op == "exists" and k not in labels:
            return False
        if op == "!" and k in labels:
            return False
        if op == "=" and labels.get(k) != v:
            return False
        if op == "!=" and labels.get(k) == v:
            return False
    for k, op, v in fields_sel:
        got = obj["metadata"].get(k.split(".", 1)[1], "")
        if (op == "=") != (got == v):
            return False
    return True


def merge_patch(target, patch, strategic):
    """RFC 7386 JSON merge patch; a strategic merge patch is treated as one
    (a Lease has no merge-keyed lists), its $-directives dropped."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if strategic and k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v, strategic)
    return out


def json_pointer(doc, path):
    if path == "":
        return None, None
    if not path.startswith("/"):
        raise ValueError("bad pointer %r" % path)
    toks = [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]
    cur = doc
    for t in toks[:-1]:
        cur = cur[int(t)] if isinstance(cur, list) else cur[t]
    return cur, toks[-1]


def json_patch(doc, ops):
    """RFC 6902 add/remove/replace/test/copy/move."""
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list")
    for op in ops:
        try:
            kind, path = op["op"], op["path"]
            parent, key = json_pointer(doc, path)
            if kind in ("copy", "move"):
                sp, sk = json_pointer(doc, op["from"])
                value = sp[int(sk)] if isinstance(sp, list) else sp[sk]
                if kind == "move":
                    del sp[int(sk) if isinstance(sp, list) else sk]
                kind, op = "add", dict(op, value=copy.deepcopy(value))
            if kind == "test":
                got = parent[int(key)] if isinstance(parent, list) else parent[key]
                if got != op["value"]:
                    raise ApiError(422, "testing value %s failed" % path)
            elif kind == "remove":
                del parent[int(key) if isinstance(parent, list) else key]
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    i = len(parent) if key == "-" else int(key)
                    if kind == "add":
                        parent.insert(i, op["value"])
                    else:
                        parent[i] = op["value"]
                else:
                    if kind == "replace" and key not in parent:
                        raise KeyError(key)
                    parent[key] = op["value"]
            else:
                raise ValueError("unknown op %r" % kind)
        except ApiError:
            raise
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ApiError(422, "the server rejected our request due to an error "
                           "in our request: json patch: %s" % e)
    return doc


class Store:
    """The objects, the resourceVersion counter, the event window and the
    test hooks, behind one lock."""

    def __init__(self, window):
        self.cond = threading.Condition()
        self.rv = 1
        self.objects = {}                      # (ns, name) -> stored Lease
        self.events = collections.deque()      # (rv, ns, type, obj, old)
        self.window = window
        self.dropped_upto = 0                  # rv of the newest dropped event
        self.faults = []
        self.delays = []
        self.clock_offset = 0.0
        self.stats = {"requests": 0, "writes": 0, "commits": 0, "watches": 0,
                      "gone": 0, "verbs": {v: 0 for v in VERBS}}

    # --- hooks ---------------------------------------------------------
    def count(self, verb):
        with self.cond:
            self.stats["requests"] += 1
            if verb:
                self.stats["verbs"][verb] += 1
                if verb in ("create", "update", "patch", "delete", "deletecollection"):
                    self.stats["writes"] += 1
                if verb == "watch":
                    self.stats["watches"] += 1

    @staticmethod
    def _take(lst, method, path, verb=None):
        for h in lst:
            if path.startswith(h.get("path_prefix", "/apis/")) and \
                    h.get("method", method).upper() == method and \
                    h.get("verb", verb) == verb:
                h["count"] -= 1
                if h["count"] <= 0:
                    lst.remove(h)
                return dict(h)
        return None

    def take_hooks(self, method, path, verb=None):
        with self.cond:
            return (self._take(self.faults, method, path, verb),
                    self._take(self.delays, method, path, verb))

    # --- writes ----------------------------------------------------------
    def _commit(self, ns, name, typ, obj, old):
        """Store obj (None: delete) under a new resourceVersion; record the
        event. Caller holds the lock."""
        self.rv += 1
        self.stats["commits"] += 1
        if obj is not None:
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[(ns, name)] = obj
            ev = copy.deepcopy(obj)
        else:
            ev = copy.deepcopy(old)
            ev["metadata"]["resourceVersion"] = str(self.rv)
            del self.objects[(ns, name)]
        self.events.append((self.rv, ns, typ, ev, old))
        while len(self.events) > self.window:
            self.dropped_upto = self.events.popleft()[0]
        self.cond.notify_all()
        return copy.deepcopy(obj if obj is not None else ev)

    def create(self, ns, lease, how=201):
        md = lease["metadata"]
        if md.get("generateName") and not md.get("name"):
            md["name"] = md["generateName"] + "".join(
                random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        if md.get("namespace", ns) != ns:
            raise bad_request("the namespace of the provided object does not "
                              "match the namespace sent on the request")
        md["namespace"] = ns
        errs = validate(lease)
        if errs:
            raise invalid(md.get("name", ""), errs)
        if md.pop("resourceVersion", None):
            # etcd3 storage refuses it; the registry passes the error on.
            raise ApiError(500, "resourceVersion should not be set on objects "
                           "to be created")
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = now_rfc3339()
        with self.cond:
            if (ns, md["name"]) in self.objects:
                raise ApiError(409, 'leases.%s "%s" already exists'
                               % (GROUP, md["name"]), reason="AlreadyExists",
                               details={"name": md["name"], "group": GROUP,
                                        "kind": "leases"})
            return how, self._commit(ns, md["name"], "ADDED", lease, None)

    def get(self, ns, name):
        with self.cond:
            obj = self.objects.get((ns, name))
            if obj is None:
                raise not_found(name)
            return copy.deepcopy(obj)

    def update(self, ns, name, lease, precondition_rv=None, from_patch=False):
        """PUT (and PATCH, with from_patch): the Lease strategy allows create
        on update and refuses unconditional updates."""
        md = lease["metadata"]
        if md.get("name", name) != name:
            raise bad_request("the name of the object (%s) does not match the "
                              "name on the URL (%s)" % (md.get("name"), name))
        md["name"] = name
        if md.get("namespace", ns) != ns:
            raise bad_request("the namespace of the provided object does not "
                              "match the namespace sent on the request")
        md["namespace"] = ns
        with self.cond:
            old = self.objects.get((ns, name))
            if old is None:
                if from_patch:
                    raise not_found(name)
                md.pop("resourceVersion", None)
                return self.create(ns, lease, how=201)
            want = md.get("resourceVersion") if not from_patch else precondition_rv
            if not from_patch and not want:
                raise invalid(name, [("metadata.resourceVersion", 0,
                                      "must be specified for an update")])
            if want and want != old["metadata"]["resourceVersion"]:
                raise conflict(name, MODIFIED_MSG)
            if md.get("uid") and md["uid"] != old["metadata"]["uid"]:
                raise invalid(name, [("metadata.uid", md["uid"], "field is immutable")])
            md["uid"] = old["metadata"]["uid"]
            md["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            md["resourceVersion"] = old["metadata"]["resourceVersion"]
            errs = validate(lease)
            if errs:
                raise invalid(name, errs)
            if lease == old:
                # etcd3 storage: an update that changes nothing is no write.
                return 200, copy.deepcopy(old)
            return 200, self._commit(ns, name, "MODIFIED", lease, old)

    def delete(self, ns, name, pre):
        with self.cond:
            old = self.objects.get((ns, name))
            if old is None:
                raise not_found(name)
            p_rv, p_uid = pre.get("resourceVersion"), pre.get("uid")
            if p_uid and p_uid != old["metadata"]["uid"]:
                raise conflict(name, "Precondition failed: UID in precondition: "
                               "%s, UID in object meta: %s"
                               % (p_uid, old["metadata"]["uid"]))
            if p_rv and p_rv != old["metadata"]["resourceVersion"]:
                raise conflict(name, "Precondition failed: ResourceVersion in "
                               "precondition: %s, ResourceVersion in object "
                               "meta: %s" % (p_rv, old["metadata"]["resourceVersion"]))
            self._commit(ns, name, "DELETED", None, old)
            return old["metadata"]["uid"]

    def listing(self, ns, labels_sel, fields_sel):
        """(resourceVersion, matching objects sorted by namespace/name)."""
        with self.cond:
            items = [copy.deepcopy(o) for (n, _), o in sorted(self.objects.items())
                     if (ns is None or n == ns) and matches(o, labels_sel, fields_sel)]
            return self.rv, items


def list_page(store, ns, q):
    labels_sel = parse_selector(q.get("labelSelector"), "labelSelector")
    fields_sel = parse_selector(q.get("fieldSelector"), "fieldSelector")
    rv, items = store.listing(ns, labels_sel, fields_sel)
    meta = {"resourceVersion": str(rv)}
    start = ""
    if q.get("continue"):
        try:
            tok = json.loads(base64.urlsafe_b64decode(q["continue"].encode()))
            start, rv = tok["start"], tok["rv"]
            meta["resourceVersion"] = str(rv)
        except (ValueError, KeyError, TypeError):
            raise bad_request("continue key is not valid: malformed")
        items = [o for o in items if
                 o["metadata"]["namespace"] + "/" + o["metadata"]["name"] > start]
    try:
        limit = int(q.get("limit") or 0)
    except ValueError:
        raise bad_request("limit: invalid value %r" % q.get("limit"))
    if limit > 0 and len(items) > limit:
        last = items[limit - 1]["metadata"]
        meta["continue"] = base64.urlsafe_b64encode(json.dumps(
            {"rv": rv, "start": last["namespace"] + "/" + last["name"]}).encode()).decode()
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    for o in items:                       # list items carry no type meta
        o.pop("kind", None)
        o.pop("apiVersion", None)
    return {"kind": "LeaseList", "apiVersion": GV, "metadata": meta, "items": items}


def typed(obj):
    out = {"kind": "Lease", "apiVersion": GV}
    out.update(obj)
    return out


def discovery(path, host):
    lease_res = {"name": "leases", "singularName": "lease", "namespaced": True,
                 "kind": "Lease", "verbs": VERBS,
                 "storageVersionHash": "gqkMMb/YqFM="}
    gv = {"groupVersion": GV, "version": "v1"}
    group = {"name": GROUP, "versions": [gv], "preferredVersion": gv}
    docs = {
        "/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake-kube",
                     "gitCommit": "0000000000000000000000000000000000000000",
                     "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                     "goVersion": "go1.22.0", "compiler": "gc",
                     "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"],
                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                 "serverAddress": host}]},
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1",
                    "resources": [{"name": "namespaces", "singularName": "namespace",
                                   "namespaced": False, "kind": "Namespace",
                                   "verbs": ["get", "list"], "shortNames": ["ns"]}]},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]},
        "/apis/" + GROUP: dict({"kind": "APIGroup", "apiVersion": "v1"}, **group),
        "/apis/" + GV: {"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": GV, "resources": [lease_res]},
    }
    return docs.get(path.rstrip("/") or "/")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube/1"
    sys_version = ""
    store = None            # set in main()
    tokens = ("", "")       # (allowed, forbidden)
    bookmark_seconds = 5.0

    # --- plumbing --------------------------------------------------------
    def setup(self):
        # TLS: the handshake runs here, in the connection's thread, bounded,
        # not in the accepting thread.
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
            self.request.settimeout(None)
        # As Go's net/http: no Nagle. Without it a keep-alive client's
        # delayed ACK holds each small answer back ~40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def log_message(self, fmt, *args):
        pass        # one line per request is written by log_line

    def log_line(self, status):
        ms = (time.monotonic() - self.t0) * 1000
        sys.stderr.write("%s %s %s %s %.1fms\n" % (
            time.strftime("%H:%M:%S"), self.command, self.path, status, ms))
        sys.stderr.flush()

    def date_time_string(self, timestamp=None):
        if timestamp is None:
            timestamp = time.time() + self.store.clock_offset
        return formatdate(timestamp, usegmt=True)

    def reply(self, code, obj, headers=None, text=None):
        # A real API server ends a JSON body with a newline: a client that
        # reads a refused watch line by line must still see the Status.
        data = (text if text is not None else
                json.dumps(obj, separators=(",", ":")) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type",
                         "text/plain; charset=utf-8" if text is not None
                         else "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        # Headers and body in one write (one segment for a small answer).
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(data)
        self.flush_headers()
        self.log_line(code)

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline(64).strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline(64)
                    return data
                data += self.rfile.read(size)
                self.rfile.readline(64)
                if len(data) > MAX_BODY:
                    self.close_connection = True
                    raise ApiError(413, "Request entity too large: limit is 3145728")
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, "Request entity too large: limit is 3145728")
        return self.rfile.read(n) if n > 0 else b""

    def auth(self):
        """'ok' or 'forbidden'; raises 401."""
        h = self.headers.get("Authorization", "")
        if h.startswith("Bearer "):
            tok = h[7:].strip().encode()
            allowed, forbidden = self.tokens
            if allowed and hmac.compare_digest(tok, allowed):
                return "ok"
            if forbidden and hmac.compare_digest(tok, forbidden):
                return "forbidden"
        raise ApiError(401, "Unauthorized")

    def json_body(self, raw):
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise bad_request("Lease in version \"v1\" cannot be handled as a "
                              "Lease: invalid JSON: %s" % e)

    # --- dispatch -------------------------------------------------------
    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def dispatch(self):
        self.t0 = time.monotonic()
        url = urlsplit(self.path)
        path = url.path
        q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if path in ("/healthz", "/livez", "/readyz"):
                return self.reply(200, None, text="ok")
            raw = self.read_body()
            who = self.auth()
            if path.startswith("/fake/"):
                return self.fake_api(path, raw, who)
            self.api(path, q, raw, who)
        except ApiError as e:
            self.reply(e.code, e.body(), e.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:                               # a bug of the double
            traceback.print_exc()
            self.reply(500, status_obj(500, "InternalError", "fake_kube: internal error"))

    def verb_of(self, path, q):
        m = LEASES_RE.match(path)
        if not m and path.rstrip("/") != ALL_LEASES:
            return None
        name = m.group(2) if m else None
        if self.command in ("GET", "HEAD"):
            if parse_bool(q.get("watch")):
                return "watch"
            return "get" if name else "list"
        return {("POST", False): "create", ("PUT", True): "update",
                ("PATCH", True): "patch", ("DELETE", True): "delete",
                ("DELETE", False): "deletecollection"}.get((self.command, bool(name)))

    def api(self, path, q, raw, who):
        verb = self.verb_of(path, q)
        self.store.count(verb)
        fault, delay = self.store.take_hooks(self.command, path, verb)
        if delay:
            time.sleep(delay["ms"] / 1000.0)
        if fault and fault.get("close"):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return self.log_line("closed")
        if fault and fault.get("answer"):
            return self.hostile(fault, self.verb_of(path, q), q)
        if fault and not fault.get("commit"):
            raise fault_error(fault)
        if self.command == "GET":
            doc = discovery(path, "%s:%d" % self.server.server_address[:2])
            if doc is not None:
                return self.reply(200, doc)
            if path.startswith("/openapi/"):
                raise ApiError(404, "the server could not find the requested resource")
        if verb is None and self.command == "GET" and path.startswith("/api/v1/namespaces"):
            return self.reply(200, self.namespaces(path[len("/api/v1/namespaces"):]))
        if verb is None:
            if LEASES_RE.match(path) or path.rstrip("/") == ALL_LEASES:
                raise ApiError(405, "the server does not allow this method on "
                               "the requested resource")
            raise ApiError(404, "the server could not find the requested resource")
        m = LEASES_RE.match(path)
        ns, name = (m.group(1), m.group(2)) if m else (None, None)
        if who != "ok":
            raise ApiError(403, 'leases.%s%s is forbidden: User "system:'
                           'serviceaccount:default:forbidden" cannot %s resource '
                           '"leases" in API group "%s"%s'
                           % (GROUP, ' "%s"' % name if name else "", verb, GROUP,
                              ' in the namespace "%s"' % ns if ns else " at the cluster scope"),
                           details={"name": name or "", "group": GROUP, "kind": "leases"})
        if ns is not None and (len(ns) > 63 or not DNS_LABEL.match(ns)):
            raise ApiError(404, 'namespaces "%s" not found' % ns,
                           details={"name": ns, "kind": "namespaces"})
        if verb == "watch":
            return self.watch(ns, q)
        code, obj = self.crud(verb, ns, name, q, raw)
        if fault:                               # "commit": done, answer lost
            raise fault_error(fault)
        self.reply(code, obj)

    def hostile(self, f, verb, q):
        """A hostile answer of the faults hook (see the docstring)."""
        if f["answer"] == "repeat_continue":
            q = dict(q, limit=q.get("limit") or "1")
            q.pop("continue", None)
            m = LEASES_RE.match(urlsplit(self.path).path)
            page = list_page(self.store, m.group(1) if m else None, q)
            page["metadata"]["continue"] = "c2FtZS1wYWdlLWFnYWlu"
            return self.reply(200, page)
        text = f["text"]
        if f["answer"] == "bloat":
            n = max(2, f["bytes"]) // 3
            text = "[" + ",".join(["{}"] * n) + "]"
        if verb != "watch":
            return self.reply_json_text(text)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.log_line("200 hostile watch")
        data = (text + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        self.wfile.flush()

    def reply_json_text(self, text):
        data = (text + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.log_line(200)

    def namespaces(self, rest):
        """GET /api/v1/namespaces[/NAME]: every DNS-1123 label is a namespace
        that exists; the list has default and those holding Leases."""
        def ns_obj(n):
            return {"metadata": {"name": n}, "status": {"phase": "Active"}}
        name = rest.strip("/")
        if name:
            if "/" in name or len(name) > 63 or not DNS_LABEL.match(name):
                raise ApiError(404, 'namespaces "%s" not found' % name,
                               details={"name": name, "kind": "namespaces"})
            return dict({"kind": "Namespace", "apiVersion": "v1"}, **ns_obj(name))
        with self.store.cond:
            names = sorted({"default"} | {n for n, _ in self.store.objects})
            rv = self.store.rv
        return {"kind": "NamespaceList", "apiVersion": "v1",
                "metadata": {"resourceVersion": str(rv)},
                "items": [ns_obj(n) for n in names]}

    def content_type(self):
        return self.headers.get("Content-Type", "").split(";")[0].strip().lower()

    def crud(self, verb, ns, name, q, raw):
        st = self.store
        if verb == "get":
            return 200, typed(st.get(ns, name))
        if verb == "list":
            return 200, list_page(st, ns, q)
        if verb in ("create", "update"):
            if self.content_type() != "application/json":
                raise ApiError(415, 'the body of the request was in an unknown '
                               'format - accepted media types include: '
                               'application/json')
            lease = decode_lease(self.json_body(raw))
            if verb == "create":
                code, obj = st.create(ns, lease)
            else:
                code, obj = st.update(ns, name, lease)
            return code, typed(obj)
        if verb == "patch":
            return 200, typed(self.patch(ns, name, raw))
        if verb == "delete":
            opts = self.json_body(raw) if raw.strip() else {}
            pre = (opts.get("preconditions") or {}) if isinstance(opts, dict) else {}
            uid = st.delete(ns, name, pre)
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Success",
                         "details": {"name": name, "group": GROUP,
                                     "kind": "leases", "uid": uid}}
        # deletecollection
        labels_sel = parse_selector(q.get("labelSelector"), "labelSelector")
        fields_sel = parse_selector(q.get("fieldSelector"), "fieldSelector")
        _, items = st.listing(ns, labels_sel, fields_sel)
        for o in items:
            try:
                st.delete(o["metadata"]["namespace"], o["metadata"]["name"], {})
            except ApiError:
                pass
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                     "status": "Success"}

    def patch(self, ns, name, raw):
        ct = self.content_type()
        if ct not in ("application/merge-patch+json",
                      "application/strategic-merge-patch+json",
                      "application/json-patch+json"):
            raise ApiError(415, "the body of the request was in an unknown format "
                           "- accepted media types include: application/json-patch+json, "
                           "application/merge-patch+json, "
                           "application/strategic-merge-patch+json")
        patch = self.json_body(raw)
        with self.store.cond:      # read-modify-write under the lock
            cur = typed(self.store.get(ns, name))
            if ct == "application/json-patch+json":
                new = json_patch(cur, patch)
            else:
                if not isinstance(patch, dict):
                    raise bad_request("merge patch must be a JSON object")
                new = merge_patch(cur, patch, ct.startswith("application/strategic"))
            want = ((new.get("metadata") or {}).get("resourceVersion")
                    if isinstance(new, dict) else None)
            if want == cur["metadata"]["resourceVersion"]:
                want = None
            lease = decode_lease(new)
            if want:
                raise conflict(name, MODIFIED_MSG)
            return self.store.update(ns, name, lease, precondition_rv=None,
                                     from_patch=True)[1]

    # --- watch ----------------------------------------------------------
    def client_gone(self):
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def send_chunk(self, obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def watch(self, ns, q):
        labels_sel = parse_selector(q.get("labelSelector"), "labelSelector")
        fields_sel = parse_selector(q.get("fieldSelector"), "fieldSelector")
        try:
            timeout = int(q["timeoutSeconds"]) if q.get("timeoutSeconds") else \
                random.randint(30, 60)
        except ValueError:
            raise bad_request("timeoutSeconds: invalid value")
        rv_param = q.get("resourceVersion", "")
        if rv_param not in ("", "0") and not rv_param.isdigit():
            raise bad_request('invalid resource version "%s"' % rv_param)
        bookmarks = parse_bool(q.get("allowWatchBookmarks"))
        st = self.store
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.log_line("200 watch")
        with st.cond:
            if rv_param in ("", "0"):
                since = st.rv
                initial = [("ADDED", o) for _, o in sorted(st.objects.items())
                           if (ns is None or o["metadata"]["namespace"] == ns)
                           and matches(o, labels_sel, fields_sel)]
            else:
                since, initial = int(rv_param), []
                if since < st.dropped_upto:
                    initial = None
        try:
            if initial is None:
                # RV older than the window: one ERROR event, then the end.
                with st.cond:
                    st.stats["gone"] += 1
                self.send_chunk({"type": "ERROR", "object": status_obj(
                    410, "Expired", "too old resource version: %s (%d)"
                    % (rv_param, st.dropped_upto + 1))})
            else:
                for typ, o in initial:
                    self.send_chunk({"type": typ, "object": typed(copy.deepcopy(o))})
                self.stream(ns, since, labels_sel, fields_sel, timeout, bookmarks)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def stream(self, ns, since, labels_sel, fields_sel, timeout, bookmarks):
        st = self.store
        deadline = time.monotonic() + timeout
        next_bm = time.monotonic() + self.bookmark_seconds
        while time.monotonic() < deadline:
            with st.cond:
                if st.rv <= since:
                    st.cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                if since < st.dropped_upto:
                    out, gone = [], True
                else:
                    out = [e for e in st.events if e[0] > since]
                    gone = False
                cur = st.rv
            if gone:
                with st.cond:
                    st.stats["gone"] += 1
                self.send_chunk({"type": "ERROR", "object": status_obj(
                    410, "Expired", "too old resource version: %d" % since)})
                return
            for rv, ev_ns, typ, obj, old in out:
                since = rv
                if ns is not None and ev_ns != ns:
                    continue
                now_in = matches(obj, labels_sel, fields_sel)
                was_in = old is not None and matches(old, labels_sel, fields_sel)
                if typ == "MODIFIED" and now_in != was_in:
                    typ = "ADDED" if now_in else "DELETED"
                elif not now_in:
                    continue
                self.send_chunk({"type": typ, "object": typed(copy.deepcopy(obj))})
            if bookmarks and time.monotonic() >= next_bm:
                next_bm = time.monotonic() + self.bookmark_seconds
                self.send_chunk({"type": "BOOKMARK", "object": {
                    "kind": "Lease", "apiVersion": GV,
                    "metadata": {"resourceVersion": str(max(since, cur))}}})
            if self.client_gone():
                return

    # --- test hooks -----------------------------------------------------
    def fake_api(self, path, raw, who):
        if self.client_address[0] not in ("127.0.0.1", "::1"):
            raise ApiError(403, "test hooks answer loopback clients only")
        if who != "ok":
            raise ApiError(403, "test hooks need the allowed token")
        st = self.store
        if self.command == "GET" and path == "/fake/v1/stats":
            with st.cond:
                return self.reply(200, copy.deepcopy(st.stats))
        if self.command != "POST":
            raise ApiError(404, "no such test hook")
        body = self.json_body(raw) if raw.strip() else {}
        if not isinstance(body, dict):
            raise bad_request("expected a JSON object")
        with st.cond:
            if path == "/fake/v1/faults":
                f = {"status": int(body.get("status", 500)),
                     "count": int(body.get("count", 1)),
                     "path_prefix": str(body.get("path_prefix", "/apis/")),
                     "commit": bool(body.get("commit")),
                     "close": bool(body.get("close"))}
                if body.get("retry_after") is not None:
                    f["retry_after"] = int(body["retry_after"])
                if body.get("method"):
                    f["method"] = str(body["method"]).upper()
                if body.get("verb"):
                    f["verb"] = str(body["verb"])
                if body.get("answer") in ("bloat", "raw", "repeat_continue"):
                    f["answer"] = body["answer"]
                    f["bytes"] = int(body.get("bytes", 4 * 1024 * 1024 - 4096))
                    f["text"] = str(body.get("text", ""))
                st.faults.append(f)
            elif path == "/fake/v1/delay":
                d = {"ms": int(body.get("ms", 0)), "count": int(body.get("count", 1)),
                     "path_prefix": str(body.get("path_prefix", "/apis/"))}
                if body.get("method"):
                    d["method"] = str(body["method"]).upper()
                st.delays.append(d)
            elif path == "/fake/v1/clock":
                st.clock_offset = float(body.get("offset_s", 0))
            elif path == "/fake/v1/reset":
                st.faults, st.delays, st.clock_offset = [], [], 0.0
            else:
                raise ApiError(404, "no such test hook")
        self.reply(200, {"ok": True})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        # A client that resets or leaves mid-request is no server error.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        super().handle_error(request, client_address)


def fault_error(f):
    code = f["status"]
    headers = {}
    msg = "fake_kube: injected fault %d" % code
    if f.get("retry_after") is not None:
        headers["Retry-After"] = str(f["retry_after"])
        if code == 429:
            msg = "Too many requests, please try again later."
    return ApiError(code, msg, headers=headers,
                    details={"retryAfterSeconds": f["retry_after"]}
                    if f.get("retry_after") is not None else None)


def read_token(path):
    if not path:
        return b""
    with open(path, "rb") as f:
        return f.read().strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--forbidden-token-file")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--pid-file")
    ap.add_argument("--watch-window", type=int, default=1000,
                    help="past events kept for watches from a resourceVersion")
    ap.add_argument("--bookmark-seconds", type=float, default=5.0)
    ap.add_argument("--http-port", type=int, default=0,
                    help="also serve plain HTTP on this port")
    a = ap.parse_args()
    if bool(a.tls_cert) != bool(a.tls_key):
        ap.error("--tls-cert and --tls-key go together")
    allowed = read_token(a.token_file)
    if not allowed:
        ap.error("the token file is empty")
    Handler.tokens = (allowed, read_token(a.forbidden_token_file))
    Handler.store = Store(max(1, a.watch_window))
    Handler.bookmark_seconds = a.bookmark_seconds
    srv = Server((a.host, a.port), Handler)
    if a.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls_cert, a.tls_key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True,
                                     do_handshake_on_connect=False)
    if a.http_port:
        # A second, plain-HTTP listener on the same objects (a TLS server
        # for kubectl, which sends no token over plain HTTP, and plain HTTP
        # for a client under test).
        plain = Server((a.host, a.http_port), Handler)
        threading.Thread(target=plain.serve_forever, args=(0.2,), daemon=True).start()
    if a.pid_file:                      # written once the ports are bound
        tmp = a.pid_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % os.getpid())
        os.replace(tmp, a.pid_file)
    sys.stderr.write("fake_kube: serving on %s:%d%s%s\n"
                     % (a.host, a.port, " (TLS)" if a.tls_cert else "",
                        ", plain HTTP on %d" % a.http_port if a.http_port else ""))
    sys.stderr.flush()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass

if __name__ == "__main__":
    main()
