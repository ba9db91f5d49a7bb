"""Fixtures of the binding's tests: the store under test (LEASE_PY_TEST_URL,
which ctest sets; without it the tests fail, they never skip) and a fresh
key prefix per test, so runs never meet each other's keys."""

from __future__ import annotations

import os
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
