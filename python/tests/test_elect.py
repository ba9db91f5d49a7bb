"""Leadership (store.elect, store.leader) against one store
(LEASE_PY_TEST_URL), as test_store.py. Every wait is bounded; nothing
depends on a sleep being long enough."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator

import pytest

import lease
from conftest import reap

ELECTOR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "elector.py")


def poll(cond: "object", timeout: float, step: float = 0.05) -> bool:
    """Ask cond() until it is true or `timeout` seconds have passed."""
    end = time.monotonic() + timeout
    while True:
        if cond():  # type: ignore[operator]
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step)


@pytest.fixture
def other(url: str) -> Iterator[lease.Store]:
    """A second candidate's own store."""
    with lease.open(url) as s:
        yield s


@pytest.fixture
def name(prefix: str) -> str:
    return prefix + "election"


def test_two_candidates_one_leads(store: lease.Store, other: lease.Store,
                                  name: str) -> None:
    assert store.leader(name) is None  # never led
    with store.elect(name, ttl=10, label="first", wait=0) as leader:
        assert leader.valid and leader.epoch > 0 and leader.name == name
        assert leader.key == "election/" + name and leader.label == "first"
        assert 0 < leader.remaining <= 10
        leader.check()
        seen = other.leader(name)
        assert seen is not None
        assert (seen.owner, seen.label, seen.token, seen.state) == \
            (leader.owner, "first", leader.epoch, "held")
        with pytest.raises(lease.Busy) as busy:
            with other.elect(name, ttl=10, wait=0):
                pytest.fail("two leaders")
        assert busy.value.holder is not None
        assert busy.value.holder.owner == leader.owner
        with pytest.raises(lease.Timeout) as timeout:
            with other.elect(name, ttl=10, wait=0.3):
                pytest.fail("two leaders")
        assert timeout.value.holder is not None
        assert timeout.value.holder.token == leader.epoch
        assert leader.valid and not leader.lost.is_set()
    # Resigned: nobody leads, and the leader knows it is not one.
    assert not leader.valid and leader.remaining == 0.0
    assert other.leader(name) is None
    with pytest.raises(lease.Lost):
        leader.check()


def test_a_waiting_candidate_leads_next_with_a_greater_epoch(
        store: lease.Store, other: lease.Store, name: str) -> None:
    resign = threading.Event()
    led = threading.Event()
    second: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def candidate() -> None:
        try:
            # wait=None: blocks until it leads.
            with other.elect(name, ttl=10, label="second") as b:
                second.append((b.epoch, b.owner))
                led.set()
                resign.wait(timeout=60)
        except BaseException as e:  # reported by the test's thread
            errors.append(e)
            led.set()

    with store.elect(name, ttl=10, label="first", wait=0) as first:
        t = threading.Thread(target=candidate, daemon=True)
        t.start()
        info = store.leader(name)
        assert info is not None and info.owner == first.owner
        assert not led.is_set()  # the first still leads
    assert led.wait(timeout=60), "the waiting candidate never led"
    assert errors == []
    epoch, owner = second[0]
    assert epoch > first.epoch
    info = store.leader(name)
    assert info is not None and (info.owner, info.token, info.label) == \
        (owner, epoch, "second")
    resign.set()
    t.join(timeout=60)
    assert not t.is_alive() and errors == []
    assert store.leader(name) is None


def test_a_wait_outlasts_the_slices_of_the_librarys_wait(
        store: lease.Store, name: str) -> None:
    # A lease nobody renews, held longer than one slice of the wait: the
    # candidate leads only once it has run out, after several slices.
    squatter = store.acquire("election/" + name, ttl=3)
    with store.elect(name, ttl=10, wait=30) as leader:
        assert leader.epoch > squatter.token
        assert store.history("election/" + name)[1].token == squatter.token


def test_a_lost_leader_steps_down(store: lease.Store, name: str) -> None:
    calls: list[lease.Leader] = []
    with pytest.raises(lease.Lost):
        with store.elect(name, ttl=1) as leader:
            leader.on_lost(calls.append)
            # The same owner acquiring is a retry of the leader's own
            # grant; releasing that ends the lease, and the next renewal is
            # refused: the leader steps down.
            store.release(store.acquire(leader.key, ttl=1,
                                        owner=leader.owner))
            assert leader.lost.wait(timeout=15)
            assert not leader.valid and leader.remaining == 0.0
            assert leader.lost_reason == lease.Lost.code
            with pytest.raises(lease.Lost):
                leader.check()
    assert lease._callbacks.dispatcher.flush(30)
    assert calls == [leader]
    # A body that raised keeps its own exception.
    with pytest.raises(KeyError):
        with store.elect(name, ttl=1) as leader:
            store.release(store.acquire(leader.key, ttl=1,
                                        owner=leader.owner))
            assert leader.lost.wait(timeout=15)
            raise KeyError("body")


def test_a_stopped_leader_is_replaced_and_sees_it(
        store: lease.Store, url: str, name: str, prefix: str) -> None:
    res = prefix + "db"
    child = subprocess.Popen([sys.executable, ELECTOR, url, name, res],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line.startswith("epoch "), line
        old = int(line.split()[1])
        os.kill(child.pid, signal.SIGSTOP)
        # Stopped past its ttl: nobody leads any more.
        assert poll(lambda: store.leader(name) is None, 30), \
            "the stopped leader's lease never ran out"
        with store.elect(name, ttl=30, wait=0) as leader:
            assert leader.epoch > old
            assert store.fence(res, leader.epoch) == leader.epoch
            os.kill(child.pid, signal.SIGCONT)
            out, _ = child.communicate("go\n", timeout=60)
            seen = json.loads(out.strip().splitlines()[-1])
            assert seen == {"valid_after_resume": False, "fence": "stale",
                            "lost": True, "on_lost": True, "check": "lost",
                            "exit": "lost"}
            assert child.returncode == 0
            # The new leader still leads, its mark intact.
            info = store.leader(name)
            assert info is not None and info.token == leader.epoch
            assert leader.valid
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait(timeout=10)


def test_forked_child_leaves_the_parents_leadership(store: lease.Store,
                                                    name: str) -> None:
    pid = -1
    try:
        with store.elect(name, ttl=1) as leader:
            pid = os.fork()
            if pid != 0:
                assert reap(pid, "the forked child hung leaving the block") == 0
                # Still the parent's, still renewed past the ttl.
                end = time.monotonic() + 2 * leader.ttl
                while time.monotonic() < end:
                    assert leader.valid
                    time.sleep(0.1)
                info = store.leader(name)
                assert info is not None and info.owner == leader.owner
                assert info.token == leader.epoch
    finally:
        if pid == 0:
            # The child: never a leader; leaving resigned nothing (the
            # parent checks the store).
            ok = not leader.valid and sys.exc_info()[0] is None
            os._exit(0 if ok else 3)
    assert store.leader(name) is None
