#!/usr/bin/env python3
"""fake_redis.py - a hostile or broken Redis server for the tests, on 127.0.0.1.

    fake_redis.py PORTFILE [--trickle SECONDS] [--trickle-only CMD]...
                  [--reply CMD=RESP]... [--replies FILE] [--lifetime SECONDS]

It listens on a free loopback port, writes the port to PORTFILE (once it
listens), and answers every command like a durable Redis that knows every
script (SCRIPT LOAD gives the script's SHA1, CONFIG GET a durable setting,
AUTH and SELECT +OK, PING +PONG), except:
  --reply CMD=RESP   answer CMD (the first word, or "SCRIPT" for SCRIPT LOAD)
                     with RESP, written with \\r\\n escapes (e.g. ':1\\r\\n');
                     the word CLOSE closes the connection instead;
                     EVALSHA without a --reply is -ERR.
  --replies FILE     lines CMD=RESP like --reply, read again for every
                     command (a test changes them between calls, and one
                     server serves many cases).
  --trickle S        send each reply one byte at a time, S seconds apart
                     (only for the commands named by --trickle-only, if any).
  --big CMD=N:SIZE   answer CMD with an array of N strings of SIZE bytes
                     each (N integers when SIZE is 0), made as it is sent:
                     a reply too large to give on the command line.
It exits by itself after --lifetime seconds (default 60), so a test that
forgets it leaves nothing behind.
"""
import argparse
import codecs
import hashlib
import os
import socket
import sys
import threading
import time

DEFAULTS = {
    "CONFIG": b"*4\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n"
              b"$11\r\nappendfsync\r\n$6\r\nalways\r\n",
    "AUTH": b"+OK\r\n",
    "SELECT": b"+OK\r\n",
    "PING": b"+PONG\r\n",
    "EVALSHA": b"-ERR this fake server was given no reply for EVALSHA\r\n",
}


def read_line(f):
    line = f.readline(65536)
    if not line.endswith(b"\r\n"):
        return None
    return line[:-2]


def read_command(f):
    """One RESP array of bulk strings, or None at EOF or on anything else."""
    head = read_line(f)
    if not head or head[:1] != b"*":
        return None
    argv = []
    for _ in range(int(head[1:])):
        size = read_line(f)
        if not size or size[:1] != b"$":
            return None
        data = f.read(int(size[1:]) + 2)
        if len(data) != int(size[1:]) + 2:
            return None
        argv.append(data[:-2])
    return argv


def parse_reply(spec, replies):
    cmd, _, resp = spec.partition("=")
    replies[cmd.upper()] = codecs.decode(resp, "unicode_escape").encode("latin-1")


def answer(argv, replies, opts):
    name = argv[0].decode("latin-1").upper()
    if opts.replies:
        replies = dict(replies)
        try:
            with open(opts.replies) as f:
                for line in f.read().splitlines():
                    if line:
                        parse_reply(line, replies)
        except OSError:
            pass
    if name in replies:
        return replies[name]
    if name == "SCRIPT" and len(argv) >= 3:
        sha = hashlib.sha1(argv[2]).hexdigest().encode()
        return b"$40\r\n" + sha + b"\r\n"
    return DEFAULTS.get(name, b"-ERR unknown command\r\n")


def send_big(conn, spec):
    """An array of n strings of size bytes (integers when size is 0)."""
    n, size = (int(x) for x in spec.split(":"))
    conn.sendall(b"*%d\r\n" % n)
    item = b":1\r\n" if size == 0 else b"$%d\r\n%s\r\n" % (size, b"x" * size)
    batch = max(1, (1 << 20) // len(item))
    for i in range(0, n, batch):  # bounded by n
        conn.sendall(item * min(batch, n - i))


def serve(conn, opts, replies):
    f = conn.makefile("rb")
    try:
        while True:
            argv = read_command(f)
            if argv is None:
                return
            name = argv[0].decode("latin-1").upper()
            if name in opts.big:
                send_big(conn, opts.big[name])
                continue
            reply = answer(argv, replies, opts)
            if reply == b"CLOSE":
                return
            slow = opts.trickle > 0 and (not opts.trickle_only or
                                         name in opts.trickle_only)
            if not slow:
                conn.sendall(reply)
                continue
            for i in range(len(reply)):  # bounded by the reply's length
                conn.sendall(reply[i:i + 1])
                time.sleep(opts.trickle)
    except OSError:
        pass
    finally:
        f.close()
        conn.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("portfile")
    p.add_argument("--trickle", type=float, default=0)
    p.add_argument("--trickle-only", action="append", default=[])
    p.add_argument("--reply", action="append", default=[])
    p.add_argument("--replies")
    p.add_argument("--lifetime", type=float, default=60)
    p.add_argument("--big", action="append", default=[])
    opts = p.parse_args()
    opts.big = dict((c.upper(), v) for c, _, v in (b.partition("=") for b in opts.big))
    opts.trickle_only = [c.upper() for c in opts.trickle_only]
    replies = {}
    for r in opts.reply:
        parse_reply(r, replies)

    # Bounded life: whatever happens, the process ends.
    threading.Timer(opts.lifetime, lambda: os._exit(0)).start()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    tmp = opts.portfile + ".tmp"
    with open(tmp, "w") as out:
        out.write("%d\n" % lsock.getsockname()[1])
    os.rename(tmp, opts.portfile)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=serve, args=(conn, opts, replies),
                         daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
