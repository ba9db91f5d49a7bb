"""The binding against one store (LEASE_PY_TEST_URL): the same module runs
against SQLite, PostgreSQL, Redis, etcd and Kubernetes. Every wait is
bounded; nothing depends on a sleep being long enough."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

import lease
from conftest import reap

HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")


def poll(cond: "object", timeout: float, step: float = 0.05) -> bool:
    """Ask cond() until it is true or `timeout` seconds have passed."""
    end = time.monotonic() + timeout
    while True:
        if cond():  # type: ignore[operator]
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step)


def test_acquire_renew_release_show(store: lease.Store, prefix: str) -> None:
    key = prefix + "cycle"
    g = store.acquire(key, ttl=10, label="worker one")
    assert g.token > 0 and g.key == key and g.label == "worker one"
    assert g.valid and 0 < g.remaining <= 10
    uuid.UUID(g.owner)
    info = store.show(key)
    assert (info.state, info.held, info.owner, info.label, info.token) == \
        ("held", True, g.owner, "worker one", g.token)
    assert 0 < info.remaining <= 10
    assert store.renew(g, ttl=20) is g
    assert g.token == info.token and g.ttl >= 20
    store.release(g)
    assert not g.valid
    after = store.show(key)
    assert after.state == "free" and after.owner is None and after.token == g.token
    g2 = store.acquire(key, ttl=10)
    assert g2.token > g.token
    store.release(g2)


def test_renew_after_release_is_lost(store: lease.Store, prefix: str) -> None:
    g = store.acquire(prefix + "k", ttl=10)
    store.release(g)
    with pytest.raises(lease.Lost) as e:
        store.renew(g)
    assert e.value.code == -3 and e.value.name == "ELOST"
    assert g.lost.is_set() and not g.valid
    with pytest.raises(lease.Lost):
        g.check()


def test_busy_names_the_holder(store: lease.Store, prefix: str) -> None:
    key = prefix + "busy"
    g = store.acquire(key, ttl=10, label="first")
    with pytest.raises(lease.Busy) as e:
        store.acquire(key, ttl=10)
    assert e.value.code == -2 and isinstance(e.value, lease.Error)
    assert e.value.holder is not None
    assert e.value.holder.owner == g.owner and e.value.holder.state == "held"
    # The same owner acquiring again is a retry: same token.
    again = store.acquire(key, ttl=10, owner=g.owner)
    assert again.token == g.token
    store.release(g)


def test_wait_times_out(store: lease.Store, prefix: str) -> None:
    key = prefix + "wait"
    g = store.acquire(key, ttl=30)
    start = time.monotonic()
    with pytest.raises(lease.Timeout) as e:
        store.acquire(key, ttl=10, wait=0.3)
    assert e.value.code == -5 and isinstance(e.value, TimeoutError)
    assert time.monotonic() - start < 10
    store.release(g)
    # Free again: a wait that finds the key free acquires at once.
    g2 = store.acquire(key, ttl=10, wait=5)
    assert g2.token > g.token
    store.release(g2)


def test_fence_refuses_an_older_token(store: lease.Store, prefix: str) -> None:
    key, res = prefix + "k", prefix + "resource"
    old = store.acquire(key, ttl=10)
    assert store.fence(res, old.token) == old.token
    store.release(old)
    new = store.acquire(key, ttl=10)
    assert store.fence(res, new.token) == new.token
    with pytest.raises(lease.Stale) as e:
        store.fence(res, old.token)
    assert e.value.code == -4
    # Refused without changing the mark; the same generation writes again.
    assert store.fence(res, new.token) == new.token
    store.release(new)


def test_hold_renews_past_its_ttl_and_releases(store: lease.Store,
                                                prefix: str) -> None:
    key = prefix + "hold"
    with store.hold(key, ttl=1, label="held") as g:
        token = g.token
        # Three ttls, asking valid all along: only renewals keep it true.
        end = time.monotonic() + 3 * g.ttl
        while time.monotonic() < end:
            assert g.valid, "the keeper let the lease lapse"
            g.check()
            time.sleep(0.1)
        info = store.show(key)
        assert info.state == "held" and info.token == token
        assert info.owner == g.owner and info.label == "held"
        assert not g.lost.is_set()
    assert not g.valid and g.remaining == 0.0
    assert store.show(key).state == "free"


def test_hold_busy_raises_on_enter(store: lease.Store, prefix: str) -> None:
    key = prefix + "hold-busy"
    g = store.acquire(key, ttl=30)
    with pytest.raises(lease.Busy):
        with store.hold(key, ttl=5):
            pytest.fail("entered a held key")
    with pytest.raises(lease.Timeout):
        with store.hold(key, ttl=5, wait=0.2):
            pytest.fail("entered a held key")
    store.release(g)


def test_leaving_after_a_loss_raises_lost(store: lease.Store,
                                          prefix: str) -> None:
    key = prefix + "taken"
    with pytest.raises(lease.Lost):
        with store.hold(key, ttl=1) as g:
            # Acquiring again as the same owner is a retry that gives the
            # same grant; releasing that ends the lease, and the keeper's
            # next renewal is refused.
            store.release(store.acquire(key, ttl=1, owner=g.owner))
            assert g.lost.wait(timeout=15)
            assert not g.valid
    # A body that raised keeps its own exception.
    with pytest.raises(KeyError):
        with store.hold(key, ttl=1) as g:
            store.release(store.acquire(key, ttl=1, owner=g.owner))
            assert g.lost.wait(timeout=15)
            raise KeyError("body")


def test_stopped_holder_is_fenced(store: lease.Store, url: str,
                                  prefix: str) -> None:
    key, res = prefix + "paused", prefix + "db"
    child = subprocess.Popen([sys.executable, HOLDER, url, key, res],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line.startswith("token "), line
        old = int(line.split()[1])
        os.kill(child.pid, signal.SIGSTOP)
        # Stopped past its ttl: the store lets the lease go.
        assert poll(lambda: store.show(key).state != "held", 30), \
            "the stopped holder's lease never ran out"
        g = store.acquire(key, ttl=30)
        assert g.token > old
        assert store.fence(res, g.token) == g.token
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate("go\n", timeout=60)
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen == {"valid_after_resume": False, "fence": "stale",
                        "fence_code": -4, "lost": True, "check": "lost",
                        "exit": "lost"}
        assert child.returncode == 0
        # The successor still holds, with its mark intact.
        assert store.show(key).token == g.token
        assert store.fence(res, g.token) == g.token
        store.release(g)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait(timeout=10)


def test_forked_child_leaves_the_parents_lease(store: lease.Store,
                                               prefix: str) -> None:
    key = prefix + "fork"
    pid = -1
    try:
        with store.hold(key, ttl=1) as g:
            pid = os.fork()
            if pid != 0:
                # Bounded wait for the child, which leaves the block at once.
                assert reap(pid, "the forked child hung leaving the block") == 0
                # Still the parent's, and still renewed past the ttl.
                end = time.monotonic() + 2 * g.ttl
                while time.monotonic() < end:
                    assert g.valid
                    time.sleep(0.1)
                info = store.show(key)
                assert info.state == "held" and info.token == g.token
                assert info.owner == g.owner
    finally:
        if pid == 0:
            # The child: never valid, its store refuses calls, and leaving
            # the block released nothing (the parent checks the store).
            ok = not g.valid and sys.exc_info()[0] is None
            try:
                store.show(key)
                ok = False
            except lease.StoreError:
                pass
            os._exit(0 if ok else 3)
    assert store.show(key).state == "free"


def test_forked_child_never_waits_on_a_lock_of_the_parent(
        store: lease.Store, prefix: str) -> None:
    """A thread of the parent in a store call at fork() holds the store's
    lock; the child has no such thread, so its calls and close() must not
    wait for that lock: they refuse at once, as in any child."""
    with store.session(ttl=30) as session:
        # As a call in progress on another thread would.
        with store._lock, session._cv:
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    try:
                        store.show(prefix + "k")
                    except lease.StoreError:
                        session.close()
                        store.close()
                        code = 0
                finally:
                    os._exit(code)
        assert reap(pid, "the forked child waited on the parent's lock") == 0


def test_threads_share_one_store(store: lease.Store, prefix: str) -> None:
    key, res = prefix + "shared", prefix + "shared-db"
    tokens: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                g = store.acquire(key, ttl=10, wait=30)
                # One holder at a time: each fences a greater token.
                store.fence(res, g.token)
                tokens.append(g.token)
                store.release(g)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(tokens) == 20 and tokens == sorted(set(tokens))


def test_repr_and_messages_hide_the_password(store: lease.Store, url: str,
                                             prefix: str) -> None:
    password = urlsplit(url).password
    assert store.url in repr(store) and str(store) == store.url
    key = prefix + "pw"
    g = store.acquire(key, ttl=10)
    with pytest.raises(lease.Busy) as e:
        store.acquire(key, ttl=10)
    store.release(g)
    if password:
        assert "***" in store.url
        for text in (repr(store), str(store), str(e.value), repr(e.value)):
            assert password not in text
    else:
        assert store.url == url


def flush() -> None:
    """Wait (bounded) until the on_lost callbacks queued so far have run."""
    assert lease._callbacks.dispatcher.flush(30), "callbacks did not run"


def test_list_sorted_by_key_free_ones_included(store: lease.Store,
                                               prefix: str) -> None:
    a = store.acquire(prefix + "a", ttl=30, label="A")
    b = store.acquire(prefix + "b", ttl=30)
    store.release(b)
    c = store.acquire(prefix + "c", ttl=30)
    other = store.acquire(prefix.rstrip("/") + "-other/a", ttl=30)
    listed = store.list(prefix)
    assert iter(listed) is listed
    infos = list(listed)
    assert [i.key for i in infos] == [prefix + "a", prefix + "b", prefix + "c"]
    assert [i.state for i in infos] == ["held", "free", "held"]
    assert (infos[0].owner, infos[0].label, infos[0].token) == \
        (a.owner, "A", a.token)
    assert infos[1].owner is None and infos[1].token == b.token
    assert infos[2].owner == c.owner
    assert [i.key for i in store.list(prefix + "c")] == [prefix + "c"]
    assert list(store.list(prefix + "none")) == []
    # A prefix is bytes, not a folder: "py-x" holds "py-x/a" and
    # "py-x-other/a". (Not the whole store: the suites share the servers,
    # and some leave keys damaged on purpose, which a list refuses.)
    wider = [i.key for i in store.list(prefix.rstrip("/"))]
    assert wider == [other.key, prefix + "a", prefix + "b", prefix + "c"]
    for g in (a, c, other):
        store.release(g)


def test_history_newest_first(store: lease.Store, prefix: str) -> None:
    key = prefix + "hist"
    assert store.history(key) == []
    first = store.acquire(key, ttl=30, label="first")
    store.release(first)
    second = store.acquire(key, ttl=30, label="second")
    entries = store.history(key)
    assert [(e.token, e.owner, e.label, e.ended) for e in entries] == [
        (second.token, second.owner, "second", "held"),
        (first.token, first.owner, "first", "released")]
    newest, oldest = entries
    assert newest.key == key and newest.ttl >= 30
    assert newest.ended_ms == 0 and newest.ended_at is None
    assert oldest.acquired_ms > 0 and oldest.ended_ms >= oldest.acquired_ms
    assert oldest.acquired_at is not None and oldest.ended_at is not None
    assert oldest.acquired_at.tzinfo is not None
    assert store.history(key, limit=1) == [newest]
    with pytest.raises(dataclasses.FrozenInstanceError):
        newest.token = 1  # type: ignore[misc]
    store.release(second)
    assert store.history(key)[0].ended == "released"


def test_on_lost_runs_once_off_the_keepers_thread(store: lease.Store,
                                                  prefix: str) -> None:
    key = prefix + "cb"
    left = threading.Event()
    calls: list[tuple[lease.Grant, bool]] = []

    def callback(g: lease.Grant) -> None:
        # Returns once the block is left: on the keeper's own thread this
        # would hold up the keeper's stop, which joins that thread, until
        # the wait ran out.
        calls.append((g, left.wait(timeout=20)))

    with pytest.raises(lease.Lost):
        with store.hold(key, ttl=1) as grant:
            grant.on_lost(callback)
            store.release(store.acquire(key, ttl=1, owner=grant.owner))
            assert grant.lost.wait(timeout=15)
    left.set()
    flush()
    assert calls == [(grant, True)]
    assert grant.lost_reason == lease.Lost.code


def test_on_lost_once_and_at_once_when_lost_already(store: lease.Store,
                                                    prefix: str) -> None:
    g = store.acquire(prefix + "k", ttl=10)
    seen: list[tuple[lease.Grant, int]] = []
    g.on_lost(lambda x: seen.append((x, threading.get_ident())))
    store.release(g)
    for _ in range(2):
        with pytest.raises(lease.Lost):
            store.renew(g)
    flush()
    assert len(seen) == 1 and seen[0][0] is g
    assert seen[0][1] != threading.get_ident()
    # Registered once lost: runs at once, on this thread.
    g.on_lost(lambda x: seen.append((x, threading.get_ident())))
    assert seen[1] == (g, threading.get_ident())
    flush()
    assert len(seen) == 2


def test_a_raising_callback_is_logged(
        store: lease.Store, prefix: str,
        caplog: pytest.LogCaptureFixture) -> None:
    g = store.acquire(prefix + "k", ttl=10)
    after: list[lease.Grant] = []

    def bad(x: lease.Grant) -> None:
        raise RuntimeError("callback failed")

    g.on_lost(bad)
    g.on_lost(after.append)
    store.release(g)
    with caplog.at_level("ERROR", logger="lease"):
        with pytest.raises(lease.Lost):
            store.renew(g)
        flush()
        # Registered once lost: runs at once; its exception is logged too.
        g.on_lost(bad)
    assert after == [g]
    errors = [r for r in caplog.records if r.name == "lease"]
    assert len(errors) == 2
    for r in errors:
        assert r.exc_info is not None and r.exc_info[0] is RuntimeError
