#!/usr/bin/env python3
"""fake_etcd.py - a broken or hostile "etcd" on 127.0.0.1, for the tests of
what the etcd store does with answers it must not trust. Never a stand-in
for etcd's behaviour: the real store tests run against real members.

    fake_etcd.py PORTFILE MODE [ARG]

It listens on a free loopback port, writes it to PORTFILE, and serves
until killed or for LIFETIME seconds (bounded, so a test that dies leaves
nothing running for long). It logs one line per request to PORTFILE.log.

MODES
  silent        reads each request and never answers
  trickle       answers one byte every 0.2 s, forever
  huge          answers 200 with a body of 128 MiB (JSON that never ends)
  bigtxn SIZE   answers every txn with SIZE bytes of JSON: a range's
                key-values that hold a key of 40 base64 digits only (each
                about 9 times its size to hold as JSON values), and every
                other path with its default answer
  record        counts connections in PORTFILE.conns, then closes them
                (a "proxy" that must see nothing)
  script FILE   answers from FILE, a JSON object {path: answer}; an answer
                is the JSON value to send, or the string "@hang" (never
                answer that request), or {"@raw": "text"} (sent as is).
                Paths it does not name get a well-formed default answer.
                A key "@delay" (seconds) delays every answer. An answer
                {"@seq": [A1, A2, ...]} gives A1 to the first request of
                that path, A2 to the next ... and the last one after.
"""
import json
import os
import socket
import sys
import threading
import time

LIFETIME = 120
SEQ = {}            # path -> how many requests of it were answered
SEQ_LOCK = threading.Lock()

DEFAULTS = {
    "/v3/kv/range": {"header": {"revision": "5"}, "count": "0"},
    "/v3/lease/grant": {"header": {"revision": "5"}, "ID": "7587", "TTL": "10"},
    "/v3/kv/txn": {"header": {"revision": "6"}, "succeeded": True,
                   "responses": [{"response_put": {}}, {"response_put": {}},
                                 {"response_put": {}}, {"response_put": {}},
                                 {"response_range": {"count": "1"}}]},
    "/v3/lease/keepalive": {"result": {"ID": "7587", "TTL": "10"}},
    "/v3/lease/timetolive": {"ID": "7587", "TTL": "9"},
    "/v3/lease/revoke": {"header": {"revision": "7"}},
}


def read_request(f):
    """One HTTP request from file f: (path, body), or None at EOF."""
    line = f.readline(65536)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    path = parts[1] if len(parts) > 1 else "/"
    length = 0
    while True:
        h = f.readline(65536)
        if not h or h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = f.read(length) if length else b""
    return path, body


def send(conn, status, payload):
    head = "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
        status, len(payload))
    conn.sendall(head.encode() + payload)


def serve(conn, mode, arg, logf):
    f = conn.makefile("rb")
    script = {}
    if mode == "script":
        with open(arg) as sf:
            script = json.load(sf)
    while True:
        req = read_request(f)
        if req is None:
            return
        path, _ = req
        with open(logf, "a") as lf:
            lf.write(path + "\n")
        if mode == "silent":
            time.sleep(LIFETIME)
            return
        if mode == "trickle":
            for ch in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
                conn.sendall(bytes([ch]))
                time.sleep(0.2)
            return
        if mode == "huge":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (128 << 20))
            conn.sendall(b'{"header":{"revision":"5"},"kvs":[')
            chunk = b'{"key":"YQ==","value":"YQ=="},' * 2048
            for _ in range((128 << 20) // len(chunk)):
                conn.sendall(chunk)
            return
        if mode == "bigtxn" and path == "/v3/kv/txn":
            send(conn, "200 OK", BIGTXN[0])
            continue
        time.sleep(float(script.get("@delay", 0)))
        answer = script.get(path, DEFAULTS.get(path, {}))
        if isinstance(answer, dict) and "@seq" in answer:
            with SEQ_LOCK:
                i = SEQ.get(path, 0)
                SEQ[path] = i + 1
            answer = answer["@seq"][min(i, len(answer["@seq"]) - 1)]
        if answer == "@hang":
            time.sleep(LIFETIME)
            return
        if isinstance(answer, dict) and "@raw" in answer:
            send(conn, "200 OK", answer["@raw"].encode("latin-1"))
        else:
            send(conn, "200 OK", json.dumps(answer).encode())


BIGTXN = []


def big_txn(size):
    """A txn answer of about `size` bytes (bigtxn)."""
    head = b'{"header":{"revision":"6"},"succeeded":true,"responses":[{"response_range":{"kvs":['
    entry = b'{"key":"' + b"L2xlYXNlL3NlZW4v" * 2 + b'YWJjZGVmZ2g="},'
    body = head + entry * ((size - len(head) - 8) // len(entry))
    return body[:-1] + b"]}}]}"


def handle(conn, mode, arg, logf):
    try:
        serve(conn, mode, arg, logf)
    except (OSError, ValueError):
        pass
    finally:
        conn.close()


def main():
    portfile, mode = sys.argv[1], sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else None
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(1.0)
    conns = 0
    if mode == "bigtxn":
        BIGTXN.append(big_txn(int(arg)))
    if mode == "record":
        with open(portfile + ".conns", "w") as cf:
            cf.write("0\n")
    open(portfile + ".log", "w").close()
    tmp = portfile + ".tmp"
    with open(tmp, "w") as pf:
        pf.write("%d\n" % srv.getsockname()[1])
    os.rename(tmp, portfile)
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conns += 1
        if mode == "record":
            with open(portfile + ".conns", "w") as cf:
                cf.write("%d\n" % conns)
            conn.close()
            continue
        threading.Thread(target=handle, args=(conn, mode, arg, portfile + ".log"),
                         daemon=True).start()


if __name__ == "__main__":
    main()
