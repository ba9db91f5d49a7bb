#!/usr/bin/env python3
"""The stale holder, played in one process: the fencing kit refuses it.

    python3 stale_holder.py --store sqlite:///tmp/lease.db --sqlite /tmp/orders.db
    python3 stale_holder.py --postgres "$APP_DATABASE_URL"

Holder A takes the lease KEY (default orders/eu) and is paused before it
writes; its lease ends (released here, where in life it would run out);
holder B takes the lease, with a newer token, and ships order 1; A resumes
and ships order 2 with its old token.  Each database given refuses A's
write, and keeps B's alone.  Exit 0 when every database refused A, 1 if
one let it in.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

import lease
import lease.fence_kit
from worker import ship_postgres, ship_sqlite


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", help="the lease store's URL")
    p.add_argument("--key", default="orders/eu")
    p.add_argument("--sqlite", metavar="PATH")
    p.add_argument("--postgres", metavar="URL")
    args = p.parse_args(argv)
    targets = [(name, ship, where) for name, ship, where in (
        ("SQLite", ship_sqlite, args.sqlite),
        ("PostgreSQL", ship_postgres, args.postgres)) if where]
    if not targets:
        p.error("give --sqlite PATH, --postgres URL, or both")

    with lease.open(args.store) as store:
        a = store.acquire(args.key, ttl=30)      # A holds the lease ...
        store.release(a)                          # ... and loses it, paused
        b = store.acquire(args.key, ttl=30)      # B: a newer token
        try:
            refused = 0
            for name, ship, where in targets:
                ship(where, args.key, 1, b.token)
                print(f"{name}: B shipped order 1 under token {b.token}")
                try:
                    ship(where, args.key, 2, a.token)
                    print(f"{name}: A's stale write got in (token {a.token})")
                except Exception as e:
                    if not lease.fence_kit.stale(e):
                        raise
                    print(f"{name}: A refused, token {a.token} < {b.token}")
                    refused += 1
        finally:
            store.release(b)
    return 0 if refused == len(targets) else 1


if __name__ == "__main__":
    sys.exit(main())
