"""Fixtures of the binding's tests: the store under test (LEASE_PY_TEST_URL,
which ctest sets; without it the tests fail, they never skip) and a fresh
key prefix per test, so runs never meet each other's keys."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Iterator

import pytest

import lease


@pytest.fixture
def url() -> str:
    value = os.environ.get("LEASE_PY_TEST_URL")
    if not value:
        pytest.fail("LEASE_PY_TEST_URL is not set: run these tests through "
                    "ctest (ctest -R python), which sets it")
    return value


@pytest.fixture
def store(url: str) -> Iterator[lease.Store]:
    with lease.open(url) as s:
        yield s


@pytest.fixture
def prefix() -> str:
    return f"py-{uuid.uuid4().hex[:12]}/"


def reap(pid: int, what: str) -> int:
    """The exit code of the forked child `pid`, waited for 15 s at most;
    a child still running then is killed and the test fails with `what`."""
    end = time.monotonic() + 15
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(what)
