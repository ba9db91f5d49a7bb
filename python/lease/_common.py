"""What every part of the package shares: the errors, the checks of
arguments (done in Python, before any call into the library), the
:class:`Info` of a key, and the registry of what must be stopped when the
interpreter exits."""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import datetime
import math
import os
import time
import uuid
import weakref
from typing import Optional, Protocol, Type, Union

from . import _capi

Seconds = Union[int, float]

_U64_MAX = (1 << 64) - 1
_TOKEN_MAX = (1 << 63) - 1


# ---------------------------------------------------------------- errors

class Error(Exception):
    """A failure reported by liblease.

    ``code`` is the library's negative error code (``lease.Busy.code`` is
    -2, as LEASE_EBUSY); ``str(error)`` is the library's detailed message,
    which never holds a password from a store URL.
    """

    code: int = _capi.LEASE_EINVALID

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def name(self) -> str:
        """The code's name, as the C library spells it: "EBUSY"."""
        return _ERROR_NAMES.get(self.code, "EUNKNOWN")


class InvalidArgument(Error, ValueError):
    """An argument the library refused (LEASE_EINVALID)."""

    code = _capi.LEASE_EINVALID


class Busy(Error):
    """The lease is held by another owner (LEASE_EBUSY).

    ``holder`` is what the store said about the current holder, or None.
    """

    code = _capi.LEASE_EBUSY
    holder: Optional["Info"] = None


class Lost(Error):
    """This owner does not hold the lease any more (LEASE_ELOST)."""

    code = _capi.LEASE_ELOST


class Stale(Error):
    """A fencing token older than the resource's mark (LEASE_ESTALE)."""

    code = _capi.LEASE_ESTALE


class Timeout(Error, TimeoutError):
    """A wait ran out (LEASE_ETIMEOUT).

    ``holder`` is the holder that kept the lease, when the store said.
    """

    code = _capi.LEASE_ETIMEOUT
    holder: Optional["Info"] = None


class StoreError(Error):
    """The store failed or could not be reached (LEASE_ESTORE): whether the
    call took effect is unknown."""

    code = _capi.LEASE_ESTORE

    owner: Optional[str] = None
    """For an acquisition: the owner it asked as (made for it when none was
    given). Acquiring again with ``owner=`` this owner is safe: if the
    first one took effect, it gives the same grant back."""


class NotFound(Error):
    """No such key or resource (LEASE_ENOTFOUND)."""

    code = _capi.LEASE_ENOTFOUND


class OutOfMemory(Error, MemoryError):
    """The library ran out of memory (LEASE_ENOMEM)."""

    code = _capi.LEASE_ENOMEM


class Unsupported(Error):
    """Not supported by this store (LEASE_EUNSUPPORTED)."""

    code = _capi.LEASE_EUNSUPPORTED


_ERRORS: dict[int, Type[Error]] = {
    cls.code: cls for cls in (InvalidArgument, Busy, Lost, Stale, Timeout,
                              StoreError, NotFound, OutOfMemory, Unsupported)
}
_ERROR_NAMES = {
    _capi.LEASE_EINVALID: "EINVALID", _capi.LEASE_EBUSY: "EBUSY",
    _capi.LEASE_ELOST: "ELOST", _capi.LEASE_ESTALE: "ESTALE",
    _capi.LEASE_ETIMEOUT: "ETIMEOUT", _capi.LEASE_ESTORE: "ESTORE",
    _capi.LEASE_ENOTFOUND: "ENOTFOUND", _capi.LEASE_ENOMEM: "ENOMEM",
    _capi.LEASE_EUNSUPPORTED: "EUNSUPPORTED",
}


def _error(code: int) -> Error:
    """The exception for a failed call's code, with the detailed message of
    this thread's last failure: call it right after the call, on its thread
    (the library keeps the message per thread)."""
    message = _capi.errmsg() or _capi.strerror(code)
    return _ERRORS.get(code, Error)(message, code)


# ------------------------------------------------------------- arguments
# Checked in Python before any call into the library, so a bad argument is
# a TypeError or ValueError whatever the store, and nothing is sent.

def _seconds_ms(name: str, value: object, *, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not "
                        f"{type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be {'>= 0' if zero else '> 0'} "
                         f"seconds, not {value!r}")
    # Rounded up: a positive duration never becomes 0 ms.
    ms = math.ceil(value * 1000)
    if ms > _U64_MAX:
        raise ValueError(f"{name} is too large: {value!r}")
    return ms


def _name_bytes(what: str, value: object, limit: int = _capi.LEASE_KEY_MAX,
                empty: bool = False) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, not {type(value).__name__}")
    b = value.encode("utf-8", "surrogateescape")
    if not b and not empty:
        raise ValueError(f"{what} must not be empty")
    if len(b) > limit:
        raise ValueError(f"{what} is {len(b)} bytes: at most {limit}")
    if b"\0" in b:
        raise ValueError(f"{what} must not contain a NUL character")
    return b


def _token(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"token must be int, not {type(value).__name__}")
    if not 1 <= value <= _TOKEN_MAX:
        raise ValueError(f"token must be 1 .. 2**63-1, not {value}")
    return value


def _owner(value: object) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"owner must be str, not {type(value).__name__}")
    try:
        return str(uuid.UUID(value)).encode()
    except ValueError:
        raise ValueError("owner must be a UUID in text form") from None


# ------------------------------------------------------------------ info

_STATES = {_capi.LEASE_STATE_FREE: "free", _capi.LEASE_STATE_HELD: "held",
           _capi.LEASE_STATE_EXPIRED: "expired"}


@dataclasses.dataclass(frozen=True)
class Info:
    """The state of one key, as the store reports it.

    ``state`` is 'held' (an unexpired lease exists), 'expired' (its last
    lease ran out and was never released) or 'free'.  ``owner`` and
    ``label`` are None when there is no holder to show; ``remaining`` and
    ``ttl`` are seconds on the store's clock, 0 unless held.
    """

    key: str
    state: str
    owner: Optional[str]
    label: Optional[str]
    token: int
    remaining: float
    ttl: float

    @property
    def held(self) -> bool:
        return self.state == "held"

    @classmethod
    def _from_c(cls, c: _capi.lease_info) -> "Info":
        owner = _capi.text(c.owner)
        return cls(key=_capi.text(c.key),
                   state=_STATES.get(c.state, "free"),
                   owner=owner or None,
                   label=_capi.text(c.label) if owner else None,
                   token=int(c.token),
                   remaining=c.remaining_ms / 1000,
                   ttl=c.ttl_ms / 1000)


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """One grant of a key, from :meth:`Store.history`.

    ``ended`` says how it ended: 'held' (not yet: the current lease),
    'released', 'expired' (its ttl ran out with no word from the holder) or
    'lost' (the store refused the holder's renewal).  ``acquired_ms`` and
    ``ended_ms`` are wall-clock milliseconds since the Unix epoch, as the
    store recorded them (on its clock where it has one); ``ended_ms`` is 0
    while held or when the store cannot know (an expired grant on etcd).
    ``acquired_at`` and ``ended_at`` give them as aware datetimes (UTC).
    """

    key: str
    token: int
    owner: str
    label: str
    ttl: float
    acquired_ms: int
    ended: str
    ended_ms: int

    @property
    def acquired_at(self) -> Optional[datetime.datetime]:
        """When it was granted (None if the store has no time)."""
        return _utc(self.acquired_ms)

    @property
    def ended_at(self) -> Optional[datetime.datetime]:
        """When it ended (None while held or when the store cannot know)."""
        return _utc(self.ended_ms)

    @classmethod
    def _from_c(cls, key: str,
                c: _capi.lease_history_entry) -> "HistoryEntry":
        return cls(key=key, token=int(c.token), owner=_capi.text(c.owner),
                   label=_capi.text(c.label), ttl=c.ttl_ms / 1000,
                   acquired_ms=int(c.acquired_ms),
                   ended=_capi.ended_name(c.ended), ended_ms=int(c.ended_ms))


def _utc(ms: int) -> Optional[datetime.datetime]:
    if ms <= 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


# A long wait (for leadership, for a key of a session) is a series of the
# library's waits, each this long at most: Ctrl-C (KeyboardInterrupt), the
# end of a bounded wait and a session's close are noticed between two.
# Each one starts the library's backoff afresh (a few tries in its first
# second), so not much shorter.
_WAIT_SLICE_MS = 2000


def _slice_ms(end: Optional[float]) -> int:
    """The library's wait for the next slice of a wait ending at ``end``
    (time.monotonic(); None: never): at least 1 ms, so that a wait given
    is always waited, at most one slice."""
    if end is None:
        return _WAIT_SLICE_MS
    left = math.ceil((end - time.monotonic()) * 1000)
    return max(1, min(left, _WAIT_SLICE_MS))


def _label(value: object) -> Optional[bytes]:
    """A holder label (None: none), checked as the library checks it."""
    if value is None:
        return None
    return _name_bytes("label", value, _capi.LEASE_LABEL_MAX, True)


def _wait_ms(value: object) -> int:
    """A wait in ms: None and 0 both try once."""
    return _seconds_ms("wait", value, zero=True) if value is not None else 0


def _count(name: str, value: object, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, not {value}")
    return value


def _new_owner() -> bytes:
    """A fresh owner identity (a UUID), from the library."""
    buf = ctypes.create_string_buffer(_capi.LEASE_OWNER_BUFSZ)
    rc = _capi.lib().lease_owner_new(buf)
    if rc < 0:
        raise _error(rc)
    return buf.value


def _open_handle(url: bytes, timeout_ms: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    rc = _capi.lib().lease_store_open_timeout(ctypes.byref(handle), url,
                                              timeout_ms)
    if rc < 0:
        raise _error(rc)
    return handle


# ------------------------------------------------------------------ fork

class _ForkSafe(Protocol):
    def _after_fork_in_child(self) -> None: ...


# Objects whose locks a thread of the parent may have held at fork(): in
# the child that thread does not exist, so the lock would never be given
# back, and the child's next call (which only has to say the object is the
# parent's) would wait for it forever. They get fresh locks there.
_fork_safe: "weakref.WeakSet[_ForkSafe]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for obj in list(_fork_safe):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------- at exit

class _Running(Protocol):
    def _at_exit(self) -> None:
        """Stop the library's thread and release, in the process that
        started it; called once the interpreter begins to exit."""


# What runs a thread of the library that calls back into Python: holds
# entered and not left, elections leading, sessions open. Strong
# references: such an object (and the callback the library's thread calls)
# lives until it is stopped, even when the caller dropped it, so that the
# garbage collector never frees a callback still in use nor stops a lease
# behind the caller's back. At exit what is left is stopped (and released),
# so that no thread of the library calls into an interpreter that is
# shutting down.
_live: "set[_Running]" = set()


@atexit.register
def _stop_live() -> None:
    for obj in list(_live):
        try:
            obj._at_exit()
        except Exception:  # exiting: nothing else to tell it to
            pass
