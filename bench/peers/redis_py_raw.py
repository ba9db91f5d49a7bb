#!/usr/bin/python3
"""Yardstick: redis-py (Debian python3-redis) doing a lease cycle's two
operations raw, with nothing of a lock library around them: SET key token
NX PX 30000, then release by a compare-and-delete script (EVALSHA, the
script registered once per process). Two round trips and two AOF writes
per cycle, as a lease cycle. Each process has its own connection and
token. The server is the redis:// URL in LEASE_STORE (the one the binding
and bench_cycle use; not on the command line): host, port, /db, the
user before '@', ?password_file=PATH (its first line, as liblease reads
it); a password in the URL itself is refused, as bench/python.sh does."""
import argparse
import os
import uuid
from urllib.parse import parse_qs, unquote, urlsplit

import redis

import cycles

# KEYS[1] = key, ARGV[1] = the token SET wrote. A token that is not there
# any more deletes nothing and returns 0, which the cycle reports.
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--prefix", default="rp")
    a = p.parse_args()
    if not 1 <= a.clients <= 256 or not 0 < a.seconds <= 3600:
        p.error("--clients 1..256, --seconds 0..3600")
    return a


def server():
    """redis.Redis keyword arguments from LEASE_STORE."""
    u = urlsplit(os.environ.get("LEASE_STORE", ""))
    if u.scheme != "redis" or not u.hostname:
        raise SystemExit("redis_py_raw.py: LEASE_STORE must be a redis://host:port URL")
    if u.password is not None:
        raise SystemExit("redis_py_raw.py: no password in the URL: use ?password_file=PATH")
    kw = {"host": u.hostname, "port": u.port or 6379,
          "db": int(u.path.strip("/") or 0)}
    if u.username:
        kw["username"] = unquote(u.username)
    files = parse_qs(u.query).get("password_file")
    if files:
        with open(files[0], encoding="utf-8") as f:
            kw["password"] = f.readline().rstrip("\r\n")
    return kw


def make(args):
    r = redis.Redis(**server())
    return r, r.register_script(RELEASE), uuid.uuid4().hex


def cycle(conn, key):
    r, release, token = conn
    if not r.set(key, token, nx=True, px=30000):
        return False
    if release(keys=[key], args=[token]) != 1:
        raise RuntimeError("%s: the compare-and-delete found another token" % key)
    return True


if __name__ == "__main__":
    cycles.run(cycle, make, parse_args())
