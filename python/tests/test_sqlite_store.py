"""What only the embedded SQLite store can show without a server's help: a
store failure, made by holding the database's lock from another
connection for longer than the store's timeout."""

from __future__ import annotations

import os
import sqlite3

import pytest

import lease


def test_store_error_of_an_acquire_names_its_owner(tmp_path: "os.PathLike[str]") -> None:
    path = os.path.join(os.fspath(tmp_path), "lease.db")
    with lease.open("sqlite://" + path, timeout=0.3) as store:
        store.release(store.acquire("k", ttl=10))  # the file exists
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(lease.StoreError) as e:
                store.acquire("k", ttl=10)
        finally:
            other.execute("ROLLBACK")
            other.close()
        owner = e.value.owner
        assert owner is not None and len(owner) == 36
        # Asking again as that owner is the safe retry: it is had now.
        g = store.acquire("k", ttl=10, owner=owner)
        assert g.owner == owner
        store.release(g)
