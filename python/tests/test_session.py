"""Sessions (store.session: acquire, claim, release, close) against one
store (LEASE_PY_TEST_URL), as test_store.py. Every wait is bounded; nothing
depends on a sleep being long enough."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from typing import Callable

import pytest

import lease
from conftest import reap


def flush() -> None:
    """Wait (bounded) until the on_lost callbacks queued so far have run."""
    assert lease._callbacks.dispatcher.flush(30), "callbacks did not run"


def test_many_keys_renewed_released_and_closed(store: lease.Store,
                                               prefix: str) -> None:
    keys = [f"{prefix}k{i:02}" for i in range(20)]
    with store.session(ttl=1, label="many") as s:
        helds = [s.acquire(k) for k in keys]
        assert len(s) == 20
        assert [h.key for h in helds] == keys
        assert all(h.owner == s.owner and h.label == "many" for h in helds)
        for h in helds:
            info = store.show(h.key)
            assert (info.state, info.owner, info.token) == \
                ("held", s.owner, h.token)
        # Three ttls: only the session's renewals keep them valid.
        end = time.monotonic() + 3 * s.ttl
        while time.monotonic() < end:
            assert all(h.valid for h in helds), "a lease lapsed"
            time.sleep(0.1)
        assert [i.state for i in store.list(prefix)] == ["held"] * 20
        s.release(helds[0])
        assert len(s) == 19 and not helds[0].valid
        assert helds[0].remaining == 0.0
        assert store.show(keys[0]).state == "free"
        with pytest.raises(ValueError):
            s.release(helds[0])
        with pytest.raises(lease.Lost):
            helds[0].check()
        # Acquired again: a new grant, a greater token.
        again = s.acquire(keys[0])
        assert again is not helds[0] and again.token > helds[0].token
        with pytest.raises(lease.InvalidArgument):
            s.acquire(keys[0])  # kept already
        assert not any(h.lost.is_set() for h in helds)
    assert s.closed and len(s) == 0
    assert not any(h.valid for h in helds) and not again.valid
    assert [i.state for i in store.list(prefix)] == ["free"] * 20
    with pytest.raises(ValueError):
        s.acquire(keys[0])


def test_busy_and_waiting_acquire(store: lease.Store, prefix: str) -> None:
    key = prefix + "contended"
    other = store.acquire(key, ttl=30, label="other")
    with store.session(ttl=10) as s:
        with pytest.raises(lease.Busy) as busy:
            s.acquire(key)
        assert busy.value.holder is not None
        assert busy.value.holder.owner == other.owner
        with pytest.raises(lease.Timeout) as timeout:
            s.acquire(key, wait=0.3)
        assert timeout.value.holder is not None
        assert timeout.value.holder.label == "other"
        assert len(s) == 0
        # A lease nobody renews, longer than one slice of the wait: taken
        # once it has run out, after several slices.
        squatter = store.acquire(prefix + "squatted", ttl=3)
        h = s.acquire(squatter.key, wait=30)
        assert h.token > squatter.token and h.valid
    store.release(other)


def test_claim_spreads_over_the_keys(store: lease.Store, prefix: str) -> None:
    p = prefix + "shard/"
    everyone = {f"{p}{i}" for i in range(4)}
    with store.session(ttl=10) as a, store.session(ttl=10) as b, \
            store.session(ttl=10) as c:
        mine = a.claim(p, 2, 4)
        assert len(mine) == 2 and all(h.valid for h in mine)
        theirs = b.claim(p, 2, 4)
        assert len(theirs) == 2
        assert {h.key for h in mine} | {h.key for h in theirs} == everyone
        assert c.claim(p, 1, 4) == []  # all taken
        assert len(c) == 0
        # Kept keys count, as the same Held objects.
        assert a.claim(p, 2, 4) == mine and len(a) == 2
        for h in mine + theirs:
            assert store.show(h.key).owner == h.owner
            assert h.key in everyone
        b.release(theirs[0])
        got = c.claim(p, 1, 4)
        assert [h.key for h in got] == [theirs[0].key]
        assert got[0].token > theirs[0].token


def test_one_lost_key_loses_alone(store: lease.Store, prefix: str) -> None:
    calls: dict[str, int] = {}

    def count(h: lease.Held) -> None:
        calls[h.key] = calls.get(h.key, 0) + 1

    with store.session(ttl=1) as s:
        helds = [s.acquire(f"{prefix}{i}") for i in range(3)]
        for h in helds:
            h.on_lost(count)
        victim = helds[1]
        # The session's own grant, ended behind its back; then another
        # owner takes the key: the session's next renewal is refused.
        store.release(store.acquire(victim.key, ttl=1, owner=s.owner))
        thief = store.acquire(victim.key, ttl=30)
        assert victim.lost.wait(timeout=15)
        assert not victim.valid and victim.lost_reason == lease.Lost.code
        with pytest.raises(lease.Lost):
            victim.check()
        # The others are renewed on, past their ttl.
        end = time.monotonic() + 2 * s.ttl
        while time.monotonic() < end:
            assert helds[0].valid and helds[2].valid
            time.sleep(0.1)
        assert not helds[0].lost.is_set() and not helds[2].lost.is_set()
        # A claim over the three keys finds the lost one kept, not held:
        # not returned, not tried again, and its loss not told twice.
        assert s.claim(prefix, 3, 3) == [helds[0], helds[2]]
        flush()
        assert calls == {victim.key: 1}
        # Registered once lost: runs at once.
        victim.on_lost(count)
        assert calls == {victim.key: 2}
        assert len(s) == 3  # kept until released
        with pytest.raises(lease.Lost):
            s.release(victim)
        assert len(s) == 2
        info = store.show(victim.key)
        assert (info.owner, info.token) == (thief.owner, thief.token)
    flush()
    assert calls == {victim.key: 2}  # closing is not a loss
    store.release(thief)


def test_close_from_a_callback(store: lease.Store, prefix: str) -> None:
    s = store.session(ttl=1)
    a = s.acquire(prefix + "a")
    b = s.acquire(prefix + "b")
    # The callbacks run off the session's thread: one may close it.
    a.on_lost(lambda h: h.session.close())
    store.release(store.acquire(a.key, ttl=1, owner=s.owner))
    assert a.lost.wait(timeout=15)
    flush()
    assert s.closed and not b.valid
    assert store.show(b.key).state == "free"


def test_forked_child_leaves_the_parents_session(store: lease.Store,
                                                 prefix: str) -> None:
    with store.session(ttl=1) as s:
        held = s.acquire(prefix + "fork")
        pid = os.fork()
        if pid == 0:
            ok = not held.valid
            calls: list[Callable[[], object]] = [
                lambda: s.acquire(prefix + "child"),
                lambda: s.release(held), lambda: len(s)]
            for call in calls:
                try:
                    call()
                    ok = False
                except lease.StoreError:
                    pass
            s.close()  # forgets it: the parent's thread and leases
            os._exit(0 if ok else 3)
        assert reap(pid, "the forked child hung") == 0
        end = time.monotonic() + 2 * s.ttl
        while time.monotonic() < end:
            assert held.valid
            time.sleep(0.1)
        assert len(s) == 1
        info = store.show(held.key)
        assert (info.state, info.token) == ("held", held.token)
    assert store.show(held.key).state == "free"


def test_garbage_collection_releases_nothing(store: lease.Store,
                                             prefix: str) -> None:
    key = prefix + "forgotten"

    def forget() -> tuple[str, int]:
        s = store.session(ttl=1)
        h = s.acquire(key)
        return s.owner, h.token

    owner, token = forget()
    gc.collect()
    # Still renewed past its ttl by the session nobody refers to.
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        info = store.show(key)
        assert (info.state, info.owner, info.token) == ("held", owner, token)
        time.sleep(0.2)
    for obj in list(lease._common._live):
        if isinstance(obj, lease.Session) and obj.owner == owner:
            obj.close()
    assert store.show(key).state == "free"


def test_interpreter_exit_releases_what_is_live(url: str,
                                                prefix: str) -> None:
    # Entered and never left, never closed: released at exit.
    code = (
        "import sys, lease\n"
        "url, p = sys.argv[1:3]\n"
        "store = lease.open(url)\n"
        "store.hold(p + 'hold', ttl=60).__enter__()\n"
        "store.elect(p + 'leader', ttl=60).__enter__()\n"
        "store.session(ttl=60).acquire(p + 'session')\n"
        "print('held', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code, url, prefix],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "held\n", r.stderr
    with lease.open(url) as store:
        for key in ("hold", "election/" + prefix + "leader", "session"):
            full = key if key.startswith("election/") else prefix + key
            assert store.show(full).state == "free", full
