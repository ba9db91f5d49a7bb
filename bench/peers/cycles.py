"""Shared driver of the Python yardsticks: C processes loop one lock's
acquire + release for S seconds, as bench/bench_cycle.c does, and the
parent prints the same line:

    cycles_per_s=N cycles=N busy=N seconds=S clients=C

Client c's i-th cycle uses key k<(c * 1000 / C + i) % 1000>, so clients
walk disjoint windows of the key space, like bench_cycle. A refused
acquire counts as busy, not as a cycle. Figures only.
"""
import argparse
import os
import struct
import sys
import time

KEYS = 1000


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--prefix", default="peer")
    a = p.parse_args()
    if not 1 <= a.clients <= 256 or not 0 < a.seconds <= 3600:
        p.error("--clients 1..256, --seconds 0..3600")
    return a


def _client(cycle, make, args, c, go_fd, wfd):
    """One process: its own connection (made by make()) and one warm-up
    cycle, then, once the parent says go, cycles until the end time it
    sends. cycle(conn, key) returns True for a cycle, False for a refused
    acquire."""
    cycles = busy = 0
    conn = make(args)
    cycle(conn, "%s/warm-up-%d" % (args.prefix, c))
    os.write(wfd, b"r")
    end = struct.unpack("d", _read_exactly(go_fd, 8))[0]
    i = 0
    while time.monotonic() < end:
        key = "%s/k%d" % (args.prefix, (c * KEYS // args.clients + i) % KEYS)
        i += 1
        if cycle(conn, key):
            cycles += 1
        else:
            busy += 1
    os.write(wfd, struct.pack("qq", cycles, busy))


def _read_exactly(fd, n):
    b = b""
    while len(b) < n:
        chunk = os.read(fd, n - len(b))
        if not chunk:
            raise EOFError("the other end went away")
        b += chunk
    return b


def run(cycle, make, args):
    """Fork the clients, start them together, sum their counts and print
    the figure.

    Each child connects and runs one warm-up cycle before the clock
    starts: a Python client library's first call loads and sets up much
    (measured 1.2 to 1.6 s per process on a loaded machine), which a C
    client has nothing of. It cannot be done once in the parent: a gRPC
    channel used before fork() stalls the fork (grpc's "Waiting for
    thread pool to idle before forking"). bench_cycle's clock includes its
    connect, a few milliseconds."""
    rfd, wfd = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    for c in range(args.clients):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(rfd)
                os.close(go_w)
                _client(cycle, make, args, c, go_r, wfd)
            except BaseException as e:  # report, never fall back into the parent's loop
                sys.stderr.write("%s: %s\n" % (os.path.basename(sys.argv[0]), e))
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(wfd)
    os.close(go_r)
    cycles = busy = 0
    failed = False
    try:
        _read_exactly(rfd, args.clients)  # every child is ready
        t0 = time.monotonic()
        # One 8-byte write per child: below PIPE_BUF, so each read gets one.
        for _ in pids:
            os.write(go_w, struct.pack("d", t0 + args.seconds))
        for _ in pids:
            n, m = struct.unpack("qq", _read_exactly(rfd, 16))
            cycles += n
            busy += m
        elapsed = time.monotonic() - t0
    except EOFError:
        failed = True
    os.close(go_w)
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        failed = failed or st != 0
    if failed:
        sys.exit(1)
    print("cycles_per_s=%.0f cycles=%d busy=%d seconds=%.2f clients=%d"
          % (cycles / elapsed, cycles, busy, elapsed, args.clients))
