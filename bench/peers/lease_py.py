#!/usr/bin/python3
"""The lease Python binding (python/lease) through cycles.py: C processes,
each with its own Store and owner, loop Store.acquire(key, ttl=30, owner)
+ Store.release(grant), as bench_cycle does in C over the same liblease.
A Busy acquire counts as busy. The store is LEASE_STORE (lease.open()'s
default), so that its URL is not on the command line; the library is the
one LEASE_LIBRARY names, or liblease.so.0."""
import argparse
import uuid

import cycles
import lease


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--prefix", default="py")
    a = p.parse_args()
    if not 1 <= a.clients <= 256 or not 0 < a.seconds <= 3600:
        p.error("--clients 1..256, --seconds 0..3600")
    return a


def make(args):
    # Opened in the client process (cycles.py calls make() after fork):
    # a store belongs to the process that opened it.
    return lease.open(), str(uuid.uuid4())


def cycle(conn, key):
    store, owner = conn
    try:
        grant = store.acquire(key, ttl=30, owner=owner)
    except lease.Busy:
        return False
    store.release(grant)
    return True


if __name__ == "__main__":
    cycles.run(cycle, make, parse_args())
