"""What needs no server: arguments refused before any call into the
library, the error classes and their codes, the messages' passwords, the
loading of the library, the default store, the structures' layout."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import Any, Callable, Iterator

import pytest

import lease
from lease import _capi


@pytest.fixture
def local(tmp_path: Any) -> Iterator[lease.Store]:
    with lease.open(f"sqlite://{tmp_path}/args.db") as s:
        yield s


def _no_c_call() -> ctypes.CDLL:
    raise AssertionError("the library was called")


BAD: list[tuple[str, Callable[[lease.Store], object], type]] = [
    ("key int", lambda s: s.acquire(1, ttl=1), TypeError),  # type: ignore
    ("key empty", lambda s: s.acquire("", ttl=1), ValueError),
    ("key long", lambda s: s.acquire("k" * 256, ttl=1), ValueError),
    ("key NUL", lambda s: s.acquire("a\0b", ttl=1), ValueError),
    ("ttl 0", lambda s: s.acquire("k", ttl=0), ValueError),
    ("ttl negative", lambda s: s.acquire("k", ttl=-1), ValueError),
    ("ttl nan", lambda s: s.acquire("k", ttl=float("nan")), ValueError),
    ("ttl inf", lambda s: s.acquire("k", ttl=float("inf")), ValueError),
    ("ttl bool", lambda s: s.acquire("k", ttl=True), TypeError),
    ("ttl str", lambda s: s.acquire("k", ttl="5s"), TypeError),  # type: ignore
    ("wait negative", lambda s: s.acquire("k", ttl=1, wait=-1), ValueError),
    ("owner", lambda s: s.acquire("k", ttl=1, owner="me"), ValueError),
    ("label long", lambda s: s.acquire("k", ttl=1, label="x" * 256), ValueError),
    ("label bytes", lambda s: s.acquire("k", ttl=1, label=b"x"), TypeError),  # type: ignore
    ("renew grant", lambda s: s.renew("grant"), TypeError),  # type: ignore
    ("release grant", lambda s: s.release(None), TypeError),  # type: ignore
    ("show key", lambda s: s.show(b"k"), TypeError),  # type: ignore
    ("fence token 0", lambda s: s.fence("r", 0), ValueError),
    ("fence token big", lambda s: s.fence("r", 2**63), ValueError),
    ("fence token bool", lambda s: s.fence("r", True), TypeError),
    ("fence token float", lambda s: s.fence("r", 1.0), TypeError),  # type: ignore
    ("fence resource", lambda s: s.fence("", 1), ValueError),
    ("hold ttl", lambda s: s.hold("k", ttl=0), ValueError),
    ("hold wait", lambda s: s.hold("k", wait=True), TypeError),
    ("hold key", lambda s: s.hold(None), TypeError),  # type: ignore
    ("list prefix", lambda s: s.list(1), TypeError),  # type: ignore
    ("list prefix NUL", lambda s: s.list("a\0"), ValueError),
    ("list prefix long", lambda s: s.list("p" * 256), ValueError),
    ("history key", lambda s: s.history(""), ValueError),
    ("history limit 0", lambda s: s.history("k", limit=0), ValueError),
    ("history limit bool", lambda s: s.history("k", limit=True), TypeError),
    ("history limit float",
     lambda s: s.history("k", limit=2.0), TypeError),  # type: ignore
    ("elect name int", lambda s: s.elect(1), TypeError),  # type: ignore
    ("elect name empty", lambda s: s.elect(""), ValueError),
    # The key is "election/" + name: at most 255 - 9 bytes of name.
    ("elect name long", lambda s: s.elect("n" * 247), ValueError),
    ("elect ttl 0", lambda s: s.elect("n", ttl=0), ValueError),
    ("elect ttl bool", lambda s: s.elect("n", ttl=True), TypeError),
    ("elect wait negative", lambda s: s.elect("n", wait=-1), ValueError),
    ("elect wait nan", lambda s: s.elect("n", wait=float("nan")), ValueError),
    ("elect label",
     lambda s: s.elect("n", label=3), TypeError),  # type: ignore
    ("leader name", lambda s: s.leader(b"n"), TypeError),  # type: ignore
    ("leader name long", lambda s: s.leader("n" * 247), ValueError),
    ("session ttl 0", lambda s: s.session(ttl=0), ValueError),
    ("session ttl str",
     lambda s: s.session(ttl="1"), TypeError),  # type: ignore
    ("session label long",
     lambda s: s.session(label="x" * 256), ValueError),
    ("grant on_lost", lambda s: lease.Grant(_capi.lease_grant()).on_lost(
        "print"), TypeError),  # type: ignore
    ("leader on_lost",
     lambda s: lease.Leader("n").on_lost(None), TypeError),  # type: ignore
]


@pytest.mark.parametrize("name,call,exc", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise_before_any_call(
        local: lease.Store, monkeypatch: pytest.MonkeyPatch, name: str,
        call: Callable[[lease.Store], object], exc: type) -> None:
    monkeypatch.setattr(_capi, "lib", _no_c_call)
    with pytest.raises(exc):
        call(local)


# Called with an open session and a lease.Held of another session.
SessionCall = Callable[[lease.Session, lease.Held], object]
SESSION_BAD: list[tuple[str, SessionCall, type]] = [
    ("acquire key", lambda s, h: s.acquire(7), TypeError),  # type: ignore
    ("acquire key empty", lambda s, h: s.acquire(""), ValueError),
    ("acquire wait", lambda s, h: s.acquire("k", wait=-0.5), ValueError),
    ("acquire wait bool", lambda s, h: s.acquire("k", wait=False), TypeError),
    ("claim prefix",
     lambda s, h: s.claim(None, 1, 2), TypeError),  # type: ignore
    ("claim count 0", lambda s, h: s.claim("p/", 0, 2), ValueError),
    ("claim count > of", lambda s, h: s.claim("p/", 3, 2), ValueError),
    ("claim of bool", lambda s, h: s.claim("p/", 1, True), TypeError),
    ("claim of float",
     lambda s, h: s.claim("p/", 1, 2.0), TypeError),  # type: ignore
    # The last key, "p...p9", is 256 bytes.
    ("claim key long", lambda s, h: s.claim("p" * 255, 1, 10), ValueError),
    ("claim key NUL", lambda s, h: s.claim("p\0", 1, 1), ValueError),
    ("release str", lambda s, h: s.release("k"), TypeError),  # type: ignore
    ("release another's", lambda s, h: s.release(h), ValueError),
    ("held on_lost", lambda s, h: h.on_lost(1), TypeError),  # type: ignore
]


@pytest.mark.parametrize("name,call,exc", SESSION_BAD,
                         ids=[b[0] for b in SESSION_BAD])
def test_bad_session_arguments_raise_before_any_call(
        local: lease.Store, name: str, call: SessionCall, exc: type) -> None:
    with local.session(ttl=30) as s, local.session(ttl=30) as other:
        theirs = other.acquire("theirs")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_capi, "lib", _no_c_call)
            with pytest.raises(exc):
                call(s, theirs)
        assert len(s) == 0 and len(other) == 1


def test_bad_open_arguments_raise_before_connecting() -> None:
    # An unreachable server: any attempt to reach it would be a StoreError.
    unreachable = "postgres://u:pw@127.0.0.1:1/db"
    with pytest.raises(ValueError):
        lease.open(unreachable, timeout=0)
    with pytest.raises(TypeError):
        lease.open(unreachable, timeout=True)
    with pytest.raises(TypeError):
        lease.open(b"sqlite:x.db")  # type: ignore[arg-type]


def test_error_classes_match_the_library_codes() -> None:
    names = {lease.InvalidArgument: "EINVALID", lease.Busy: "EBUSY",
             lease.Lost: "ELOST", lease.Stale: "ESTALE",
             lease.Timeout: "ETIMEOUT", lease.StoreError: "ESTORE",
             lease.NotFound: "ENOTFOUND", lease.OutOfMemory: "ENOMEM",
             lease.Unsupported: "EUNSUPPORTED"}
    for cls, name in names.items():
        assert issubclass(cls, lease.Error)
        assert _capi.error_name(cls.code) == name
    assert issubclass(lease.InvalidArgument, ValueError)
    assert issubclass(lease.OutOfMemory, MemoryError)
    assert issubclass(lease.Timeout, TimeoutError)


def test_errors_carry_code_and_message(local: lease.Store) -> None:
    with pytest.raises(lease.InvalidArgument) as e:
        lease.open("nosuchscheme://x")
    assert e.value.code == -1 and isinstance(e.value, ValueError)
    assert str(e.value)
    with pytest.raises(lease.NotFound) as nf:
        local.show("never-acquired")
    assert nf.value.code == -7 and "never-acquired" in str(nf.value)


def test_failing_open_hides_the_password() -> None:
    with pytest.raises(lease.Error) as e:
        lease.open("postgres://lease:s3cretpw@127.0.0.1:1/db", timeout=2)
    assert e.value.code in (-6, -1)
    assert "s3cretpw" not in str(e.value) and "s3cretpw" not in repr(e.value)


def test_closed_store(local: lease.Store) -> None:
    local.close()
    local.close()
    assert local.closed and "closed" in repr(local)
    with pytest.raises(ValueError):
        local.show("k")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != "LEASE_STORE"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, text=True,
                          capture_output=True, timeout=60)


def test_missing_library_says_how_to_point_at_it() -> None:
    r = _python("import lease\n"
                "try:\n"
                "    lease.open('sqlite:x.db')\n"
                "except OSError as e:\n"
                "    print(type(e).__name__, e)\n",
                LEASE_LIBRARY="/nonexistent/liblease.so.0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("LibraryNotFound ")
    assert "LEASE_LIBRARY" in r.stdout


def test_default_store_is_the_tools(tmp_path: Any) -> None:
    cli = os.environ.get("LEASE_PY_CLI")
    assert cli, "LEASE_PY_CLI is not set: run through ctest"
    state = tmp_path / "state" / "deep"
    env = {"XDG_STATE_HOME": str(state)}
    r = _python("import lease\n"
                "with lease.open() as s:\n"
                "    g = s.acquire('default-key', ttl=60, label='py')\n"
                "    print(g.token)\n", **env)
    assert r.returncode == 0, r.stderr
    assert (state / "lease").is_dir()
    assert (state / "lease").stat().st_mode & 0o777 == 0o700
    e = {k: v for k, v in os.environ.items() if k != "LEASE_STORE"}
    e.update(env)
    shown = subprocess.run([cli, "show", "default-key", "--json"], env=e,
                           text=True, capture_output=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert '"label": "py"' in shown.stdout.replace('":"', '": "')
    # LEASE_STORE, when set, comes first.
    other = tmp_path / "other.db"
    r = _python("import lease\n"
                "with lease.open() as s:\n"
                "    print(s.url)\n", LEASE_STORE=f"sqlite://{other}", **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"sqlite://{other}"


def test_structures_match_the_c_layout() -> None:
    tool = os.environ.get("LEASE_PY_LAYOUT")
    assert tool, "LEASE_PY_LAYOUT is not set: run through ctest"
    out = subprocess.run([tool], check=True, text=True, capture_output=True,
                         timeout=60).stdout
    structs = {"lease_grant": _capi.lease_grant, "lease_info": _capi.lease_info,
               "lease_acquire_opts": _capi.lease_acquire_opts,
               "lease_keeper_opts": _capi.lease_keeper_opts,
               "lease_history_entry": _capi.lease_history_entry,
               "lease_campaign_opts": _capi.lease_campaign_opts,
               "lease_session_opts": _capi.lease_session_opts}
    inits = {"lease_acquire_opts": _capi.acquire_opts_init(),
             "lease_keeper_opts": _capi.keeper_opts_init(),
             "lease_campaign_opts": _capi.campaign_opts_init(),
             "lease_session_opts": _capi.session_opts_init()}
    seen = 0
    for line in out.splitlines():
        kind, name, a, b = line.split()
        if kind == "init":
            assert getattr(inits[name], a) == int(b), line
        elif name == "-":
            assert ctypes.sizeof(structs[kind]) == int(b), line
        else:
            field = getattr(structs[kind], name)
            assert (field.offset, field.size) == (int(a), int(b)), line
        seen += 1
    # The structs whole, their fields, the *_INIT values printed.
    assert seen == 7 + (7 + 8 + 8 + 5 + 7 + 7 + 9) + (5 + 3 + 3 + 5)
    for struct in structs.values():
        assert len(struct._fields_) == sum(
            1 for line in out.splitlines()
            if line.startswith(struct.__name__ + " ") and " - " not in line)
