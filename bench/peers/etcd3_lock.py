#!/usr/bin/python3
"""Yardstick: python-etcd3's Lock (Debian python3-etcd3, gRPC), acquire
+ release over C processes. acquire grants an etcd lease and runs a txn
(put if absent), release runs a txn (delete if ours); the lease is left
to expire: three consensus writes per cycle."""
import os

# python3-etcd3's generated modules predate protobuf 4: with a newer
# protobuf (pip, or a later Debian) importing them fails with
# "Descriptors cannot be created directly", and protobuf's documented
# workaround is its pure-Python implementation. Debian 12's protobuf
# (3.21) does not need it; setting it there changes nothing but speed,
# so only do it when the import fails.
try:
    import etcd3
except TypeError:
    os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    import etcd3

import cycles


def make(args):
    return etcd3.client(host=args.host, port=args.port, timeout=10)


def cycle(client, key):
    lock = client.lock(key, ttl=30)
    if not lock.acquire(timeout=0):
        return False
    lock.release()
    return True


if __name__ == "__main__":
    cycles.run(cycle, make, cycles.parse_args(__doc__))
