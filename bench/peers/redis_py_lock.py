#!/usr/bin/python3
"""Yardstick: redis-py's Lock (Debian python3-redis), acquire without
blocking + release, over C processes. acquire is SET key token NX PX ttl,
release a compare-and-delete script (EVALSHA): two round trips, two AOF
writes per cycle, like a lease cycle."""
import redis

import cycles


def make(args):
    return redis.Redis(host=args.host, port=args.port)


def cycle(r, key):
    lock = r.lock(key, timeout=30, blocking=False)
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


if __name__ == "__main__":
    cycles.run(cycle, make, cycles.parse_args(__doc__))
