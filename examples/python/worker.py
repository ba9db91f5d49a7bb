#!/usr/bin/env python3
"""A worker that holds a lease and writes under its fencing token.

    python3 worker.py --store sqlite:///tmp/lease.db --sqlite /tmp/orders.db --order 7
    python3 worker.py --postgres "$APP_DATABASE_URL" --order 7

It holds the lease KEY (default orders/eu) while it works: store.hold()
acquires it, and the library renews it in the background until the block
ends.  It ships the order in each database given: one transaction whose
first statement is the fencing check (lease_fence in SQLite,
lease_fence_check in PostgreSQL, for the resource KEY) and whose next is
the write, so that the check and the write commit together or not at all.
A worker whose token is older than one the database has already accepted
(its lease ran out while it was paused, and a newer holder wrote) is
refused, writes nothing, and exits with status 3.

The store is --store, else $LEASE_STORE, else the `lease` tool's default.
PostgreSQL goes through psycopg (3); fence_kit.postgres() takes a psycopg2
connection as well.  Keep passwords out of the URLs given here, which other
users see in ps: $LEASE_STORE, and ~/.pgpass or PGPASSWORD for libpq.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from typing import Optional

import lease
import lease.fence_kit

SCHEMA_SQL = ("CREATE TABLE IF NOT EXISTS shipments ("
              "order_id bigint NOT NULL, token bigint NOT NULL)")


def ship_sqlite(path: str, resource: str, order: int, token: int) -> None:
    """Ship `order` in the SQLite database at `path`, fenced by `token`."""
    # isolation_level=None: no transaction of Python's own; BEGIN IMMEDIATE
    # takes the write lock before the check, so nobody writes in between.
    db = sqlite3.connect(path, isolation_level=None)
    try:
        lease.fence_kit.sqlite(db)
        db.execute(SCHEMA_SQL)
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("SELECT lease_fence(?, ?)", (resource, token))
            db.execute("INSERT INTO shipments (order_id, token) VALUES (?, ?)",
                       (order, token))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()


def ship_postgres(url: str, resource: str, order: int, token: int) -> None:
    """Ship `order` in the PostgreSQL database at `url`, fenced by `token`."""
    import psycopg

    with psycopg.connect(url) as db:
        lease.fence_kit.postgres(db)        # installs the kit, or checks it
        with db.transaction():
            db.execute(SCHEMA_SQL)
        with db.transaction():              # commits both, or neither
            db.execute("SELECT lease_fence_check(%s, %s)", (resource, token))
            db.execute("INSERT INTO shipments (order_id, token) VALUES (%s, %s)",
                       (order, token))


def work(store_url: Optional[str], key: str, order: int,
         sqlite_path: Optional[str], postgres_url: Optional[str]) -> int:
    """Hold the lease `key` and ship `order` in each database given."""
    with lease.open(store_url) as store:
        with store.hold(key, ttl=30, wait=60) as grant:
            try:
                if sqlite_path:
                    grant.check()                   # raises lease.Lost
                    ship_sqlite(sqlite_path, key, order, grant.token)
                    print(f"order {order} shipped in {sqlite_path} "
                          f"under token {grant.token}")
                if postgres_url:
                    grant.check()
                    ship_postgres(postgres_url, key, order, grant.token)
                    print(f"order {order} shipped in PostgreSQL "
                          f"under token {grant.token}")
            except Exception as e:
                if not lease.fence_kit.stale(e):
                    raise
                print(f"refused: token {grant.token} is stale: {e}",
                      file=sys.stderr)
                return 3
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", help="the lease store's URL")
    p.add_argument("--key", default="orders/eu",
                   help="the lease, and the resource the databases fence")
    p.add_argument("--order", type=int, required=True)
    p.add_argument("--sqlite", metavar="PATH")
    p.add_argument("--postgres", metavar="URL")
    args = p.parse_args(argv)
    if not args.sqlite and not args.postgres:
        p.error("give --sqlite PATH, --postgres URL, or both")
    return work(args.store, args.key, args.order, args.sqlite, args.postgres)


if __name__ == "__main__":
    sys.exit(main())
