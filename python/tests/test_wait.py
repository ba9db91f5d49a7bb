"""Waits that end early: Ctrl-C in a waiting acquire, asyncio's
acquire_async and hold_async, and cancelling them.  Against the store of
LEASE_PY_TEST_URL.  A wait here is a minute long; each test ends it early,
so a wait that ran its minute out (the behaviour without cancellation) is
a failure, told by the time it took: over half the wait."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import threading
import time
from typing import Iterator

import pytest

import lease
from lease import _capi, _wait

WAIT = 60.0


@contextlib.contextmanager
def ctrl_c_ends_it() -> Iterator[None]:
    """The block waits; a SIGINT to the process (as Ctrl-C sends) 0.3 s in
    must end it with KeyboardInterrupt, well before its wait would end."""
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        timer.cancel()
    assert time.monotonic() - start < WAIT / 2


def wait_threads_gone(timeout: float = 30.0) -> bool:
    """Whether every thread of a wait has ended (bounded poll)."""
    end = time.monotonic() + timeout
    while any(t.name == "lease-wait" for t in threading.enumerate()):
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)
    return True


def test_ctrl_c_ends_a_wait(store: lease.Store, prefix: str) -> None:
    key = prefix + "ctrl-c"
    holder = store.acquire(key, ttl=120, label="holder")
    with ctrl_c_ends_it():
        store.acquire(key, ttl=30, wait=WAIT)
    assert wait_threads_gone()
    info = store.show(key)
    assert (info.state, info.owner, info.token) == \
        ("held", holder.owner, holder.token)
    store.release(holder)


def test_ctrl_c_ends_a_hold_wait(store: lease.Store, prefix: str) -> None:
    key = prefix + "ctrl-c-hold"
    holder = store.acquire(key, ttl=120)
    with ctrl_c_ends_it():
        with store.hold(key, ttl=30, wait=WAIT):
            pytest.fail("entered a hold on a held key")
    assert wait_threads_gone()
    assert store.show(key).owner == holder.owner
    store.release(holder)


def test_acquire_async_does_not_block_the_loop(store: lease.Store,
                                               prefix: str) -> None:
    key = prefix + "async"

    async def main() -> "tuple[lease.Grant, int]":
        holder = await store.acquire_async(key, ttl=120)
        ticks = 0
        waiter = asyncio.ensure_future(
            store.acquire_async(key, ttl=30, wait=WAIT))
        # The loop runs on while the waiter waits: these ticks happen.
        for _ in range(10):
            await asyncio.sleep(0.01)
            ticks += 1
        assert not waiter.done()
        await asyncio.get_running_loop().run_in_executor(
            None, store.release, holder)
        got = await asyncio.wait_for(waiter, WAIT)
        return got, ticks

    got, ticks = asyncio.run(main())
    assert ticks == 10
    assert got.valid and store.show(key).owner == got.owner
    store.release(got)


def test_cancelling_acquire_async(store: lease.Store, prefix: str) -> None:
    key = prefix + "async-cancel"
    holder = store.acquire(key, ttl=120)

    async def main() -> float:
        waiter = asyncio.ensure_future(
            store.acquire_async(key, ttl=30, wait=WAIT))
        await asyncio.sleep(0.3)
        start = time.monotonic()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return time.monotonic() - start

    assert asyncio.run(main()) < WAIT / 2
    assert wait_threads_gone()
    info = store.show(key)
    assert (info.owner, info.token) == (holder.owner, holder.token)
    store.release(holder)


def test_hold_async(store: lease.Store, prefix: str) -> None:
    key = prefix + "hold-async"

    async def main() -> int:
        async with store.hold_async(key, ttl=30, label="async") as grant:
            assert grant.valid and grant.label == "async"
            assert store.show(key).owner == grant.owner
            return grant.token

    token = asyncio.run(main())
    info = store.show(key)
    assert info.state == "free" and info.token == token


def test_cancelling_hold_async_while_it_waits(store: lease.Store,
                                              prefix: str) -> None:
    key = prefix + "hold-async-cancel"
    holder = store.acquire(key, ttl=120)
    entered = []

    async def body() -> None:
        async with store.hold_async(key, ttl=30, wait=WAIT):
            entered.append(1)

    async def main() -> float:
        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.3)
        start = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - start

    assert asyncio.run(main()) < WAIT / 2
    assert not entered
    assert store.show(key).owner == holder.owner
    store.release(holder)


def test_a_cancelled_call_undoes_what_it_got() -> None:
    """What the waiting call got as it was cancelled is undone before the
    interruption reaches the caller: the logic of _wait, with a call that
    gets its result just as the cancel is fired."""
    undone: "list[str]" = []

    def fn(cancel: ctypes.c_void_p) -> str:
        for _ in range(3000):
            if _capi.lib().lease_cancel_fired(cancel):
                return "grant"
            time.sleep(0.01)
        raise AssertionError("never cancelled")

    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        _wait.call(fn, undone.append)
    assert undone == ["grant"]

    async def cancelled() -> None:
        task = asyncio.ensure_future(_wait.call_async(fn, undone.append))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    undone.clear()
    asyncio.run(cancelled())
    assert undone == ["grant"]
    assert wait_threads_gone()


def test_ctrl_c_ends_an_election_wait(store: lease.Store, prefix: str) -> None:
    name = prefix + "elect"
    with store.elect(name, ttl=120) as leader:
        with ctrl_c_ends_it():
            with store.elect(name, ttl=30, wait=WAIT):
                pytest.fail("two leaders")
        assert wait_threads_gone()
        now = store.leader(name)
        assert now is not None and now.owner == leader.owner
        assert now.token == leader.epoch


def test_wait_lost(store: lease.Store, prefix: str) -> None:
    key = prefix + "wait-lost"

    async def main() -> lease.Grant:
        loop = asyncio.get_running_loop()
        async with store.hold_async(key, ttl=1) as grant:
            watch = asyncio.ensure_future(grant.wait_lost())
            await asyncio.sleep(0.05)
            assert not watch.done()
            # The same owner acquiring again then releasing: the keeper's
            # next renewal hears Lost.
            await loop.run_in_executor(None, lambda: store.release(
                store.acquire(key, ttl=1, owner=grant.owner)))
            await asyncio.wait_for(watch, 30)
            assert grant.lost.is_set() and not grant.valid
            await grant.wait_lost()  # lost already: at once
        return grant

    with pytest.raises(lease.Lost):
        asyncio.run(main())


def test_cancelled_wait_lost_leaves_nothing(store: lease.Store,
                                            prefix: str) -> None:
    g = store.acquire(prefix + "k", ttl=30)

    async def main() -> None:
        for _ in range(50):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(g.wait_lost(), 0.001)

    asyncio.run(main())
    assert g._callbacks == []
    store.release(g)


def test_ctrl_c_ends_a_session_wait(store: lease.Store, prefix: str) -> None:
    key = prefix + "session"
    holder = store.acquire(key, ttl=120)
    with store.session(ttl=30) as session:
        with ctrl_c_ends_it():
            session.acquire(key, wait=WAIT)
        assert wait_threads_gone()
        assert len(session) == 0
    assert store.show(key).owner == holder.owner
    store.release(holder)
