"""Sessions: many leases of one owner, renewed by one thread over one
connection (lease/session.h).  :meth:`Store.session` opens a
:class:`Session`, whose acquire and claim give :class:`Held` keys."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
import types
from typing import (TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple,
                    Type)

from . import _capi, _wait
from ._callbacks import Losable
from ._common import (Busy, Error, Info, Lost, Seconds, StoreError, Timeout,
                      _count, _error, _fork_safe, _live, _name_bytes,
                      _new_owner,
                      _slice_ms, _wait_ms)

if TYPE_CHECKING:
    from . import Store

# The kinds of calls into a session (Session._call). Adding calls (acquire,
# claim) and releases exclude each other: an adding call may be handed a
# lease_held * that the library kept already (claim), which a release on
# another thread could free before this one has read it.
_ADD, _RELEASE, _USE = 0, 1, 2


class Held(Losable):
    """One lease kept by a :class:`Session`: its key, owner, label and
    fencing token, renewed by the session until released.

    Ask ``valid`` (or call :meth:`check`) before each side effect and pass
    ``token`` along to be fenced.  When the store refuses its renewal (or
    renewals fail until its local deadline), ``lost`` is set and the
    :meth:`on_lost` callbacks run; the session's other leases are not
    affected.  The properties never touch the store and may be read from
    any thread; once released (or the session closed) it is never valid.
    In a child made by ``os.fork()`` it is never valid.
    """

    def __init__(self, session: "Session", ptr: int,
                 grant: _capi.lease_grant) -> None:
        self._init_loss()
        self._session = session
        # The library's lease_held *, None once released; guarded by the
        # session's _reg, which is never held while the library frees it.
        self._ptr: Optional[int] = ptr
        self._grant = grant
        self._pid = os.getpid()

    @property
    def session(self) -> "Session":
        return self._session

    @property
    def key(self) -> str:
        return _capi.text(self._grant.key)

    @property
    def owner(self) -> str:
        """The session's owner identity (a UUID)."""
        return _capi.text(self._grant.owner)

    @property
    def label(self) -> str:
        return _capi.text(self._grant.label)

    @property
    def token(self) -> int:
        """The fencing token: pass it to every write the lease guards."""
        return int(self._grant.token)

    @property
    def ttl(self) -> float:
        """The ttl the store granted, in seconds."""
        return float(self._grant.ttl_ms) / 1000

    def _ask(self, fn: str) -> int:
        if os.getpid() != self._pid or self.lost.is_set():
            return 0
        with self._session._reg:
            if self._ptr is None:
                return 0
            return int(getattr(_capi.lib(), fn)(self._ptr))

    @property
    def valid(self) -> bool:
        """True while authority holds: kept, not lost, and the local
        deadline has not passed."""
        return bool(self._ask("lease_held_valid"))

    @property
    def remaining(self) -> float:
        """Seconds before the local deadline (0.0 once passed, lost or
        released)."""
        return self._ask("lease_held_remaining_ms") / 1000

    def check(self) -> None:
        """Raise :class:`Lost` unless authority still holds."""
        if not self.valid:
            raise Lost(f"'{self.key}': authority over the lease is gone "
                       f"(token {self.token})", _capi.LEASE_ELOST)

    def __repr__(self) -> str:
        return (f"<lease.Held key={self.key!r} token={self.token} "
                f"owner={self.owner} valid={self.valid}>")


class Session:
    """Many leases of one owner, renewed together; made by
    :meth:`Store.session`.

    The library renews every lease of the session every ttl/3 from one
    thread, over one connection of its own (opened with the store's URL;
    the :class:`Store` may be closed meanwhile), in batches where the store
    can.  Each :class:`Held` keeps its own local deadline and is lost
    alone.  A context manager: leaving the ``with`` block closes the
    session, which releases every lease it still keeps.

    ``len(session)`` is how many leases it keeps (held or lost, not yet
    released).  Safe to share between threads.  In a child made by
    ``os.fork()`` every call raises :class:`StoreError` and closing only
    forgets the session: its thread and leases are the parent's.
    """

    def __init__(self, store: "Store", ttl_ms: int,
                 label: Optional[bytes]) -> None:
        """Internal: use :meth:`Store.session`."""
        self._pid = os.getpid()
        self._ttl_ms = ttl_ms
        self._label = label or b""
        self._owner = _new_owner()
        # The library's lease_session *; NULL once closed.
        self._ptr = ctypes.c_void_p()
        # The gate of calls (see _call): how many of each kind run, how
        # many releases wait, and whether close began.
        self._cv = threading.Condition()
        self._running = [0, 0, 0]
        self._releases_waiting = 0
        self._closing = False
        # The Held of each lease_held * kept; taken by the session's thread
        # (on_lost), so never held while calling into the session.
        self._reg = threading.Lock()
        self._held: Dict[int, Held] = {}
        _fork_safe.add(self)

        def on_lost(session: Optional[int], held: Optional[int], reason: int,
                    payload: Optional[int]) -> None:
            # The session's thread, which releases and close wait for: find
            # the Held, set its event and queue its callbacks; no blocking.
            with self._reg:
                h = self._held.get(held) if held else None
            if h is not None:
                h._set_lost(reason)

        # Called by the session's thread: it lives until the session is
        # closed, and so does this Session (in _live), dropped or not.
        self._cb: Optional[object] = _capi.SESSION_LOST_CB(on_lost)
        opts = _capi.session_opts_init()
        opts.owner = self._owner
        opts.ttl_ms = ttl_ms
        opts.label = label
        opts.on_lost = self._cb
        _live.add(self)
        err: Optional[Error] = None
        try:
            with store._lock:
                rc = _capi.lib().lease_session_open(
                    ctypes.byref(self._ptr), store._h(), ctypes.byref(opts))
                err = _error(rc) if rc < 0 else None
        finally:
            if not self._ptr.value:
                _live.discard(self)
                self._cb = None
        if err is not None:
            raise err

    # -- what it is

    @property
    def owner(self) -> str:
        """The owner identity (a UUID) of every lease of the session."""
        return self._owner.decode()

    @property
    def ttl(self) -> float:
        """Every lease's ttl, in seconds."""
        return self._ttl_ms / 1000

    @property
    def label(self) -> str:
        return self._label.decode("utf-8", "surrogateescape")

    @property
    def closed(self) -> bool:
        return self._closing

    def __len__(self) -> int:
        """How many leases the session keeps (held or lost, not released);
        0 once closed."""
        with self._cv:
            if self._closing:
                return 0
        with self._call(_USE) as ptr:
            return int(_capi.lib().lease_session_count(ptr))

    def __repr__(self) -> str:
        state = " closed" if self._closing else ""
        return (f"<lease.Session owner={self.owner} ttl={self.ttl:g}"
                f"{state}>")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, et: Optional[Type[BaseException]],
                 ev: Optional[BaseException],
                 tb: Optional[types.TracebackType]) -> None:
        try:
            self.close()
        except Error:
            if et is None:
                raise

    # -- the gate

    @contextlib.contextmanager
    def _call(self, kind: int) -> Iterator[ctypes.c_void_p]:
        """Run one call into the library: refused in a forked child and
        once close began; close waits for the calls in progress, since the
        library must not be entered once it has freed the session."""
        with self._cv:
            if kind == _RELEASE:
                self._releases_waiting += 1
            try:
                while True:
                    if os.getpid() != self._pid:
                        raise StoreError(
                            f"this session belongs to process {self._pid}: "
                            f"a forked child neither holds nor renews its "
                            f"leases", _capi.LEASE_ESTORE)
                    if self._closing:
                        raise ValueError("operation on a closed "
                                         "lease.Session")
                    if self._ready(kind):
                        break
                    self._cv.wait()
            finally:
                if kind == _RELEASE:
                    self._releases_waiting -= 1
                    self._cv.notify_all()
            self._running[kind] += 1
        try:
            yield self._ptr
        finally:
            with self._cv:
                self._running[kind] -= 1
                self._cv.notify_all()

    def _ready(self, kind: int) -> bool:
        # A release goes before adding calls that have not begun (one store
        # call each), so that a loop of acquires cannot hold it off.
        if kind == _ADD:
            return not self._running[_RELEASE] and not self._releases_waiting
        if kind == _RELEASE:
            return not self._running[_ADD]
        return True

    def _adopt(self, ptr: int) -> Tuple[Held, bool]:
        """The Held of a lease_held * the library just gave (made on first
        sight) and whether it is held; inside an adding call."""
        lib = _capi.lib()
        with self._reg:
            h = self._held.get(ptr)
            if h is None:
                g = lib.lease_held_grant(ptr)
                h = Held(self, ptr, _capi.lease_grant.from_buffer_copy(
                    g.contents))
                self._held[ptr] = h
            state = int(lib.lease_held_state(ptr))
        if state == _capi.LEASE_KEEPER_LOST:
            # Lost before it was in _held: on_lost found no Held to tell.
            h._set_lost(None)
        return h, state == _capi.LEASE_KEEPER_HELD

    # -- keeping leases

    def acquire(self, key: str, wait: Optional[Seconds] = None) -> Held:
        """Acquire ``key`` for the session (its owner, ttl and label) and
        keep it: the :class:`Held`.

        ``wait`` (seconds; None or 0: try once) retries while another owner
        holds the key.  Raises :class:`Busy` (no wait) or :class:`Timeout`
        (the wait ran out), each with ``holder``; :class:`InvalidArgument`
        for a key the session keeps already; ValueError once closed.
        """
        k = _name_bytes("key", key)
        wait_ms = _wait_ms(wait)
        if not wait_ms:
            return self._acquire(k, 0, None)
        # On a thread of its own, as Store.acquire's wait: Ctrl-C reaches
        # the caller at once, and the slice in progress (which the library
        # cannot cut short here) ends on that thread, which then lets go
        # of anything it got.

        def undo(held: Held) -> None:
            try:
                self.release(held)
            except Exception:
                pass  # closed meanwhile: close released it
        return _wait.call(lambda c: self._acquire(k, wait_ms, c), undo,
                          linger=False)

    def _acquire(self, k: bytes, wait_ms: int,
                 cancel: Optional[ctypes.c_void_p]) -> Held:
        end = time.monotonic() + wait_ms / 1000
        lib = _capi.lib()
        while True:
            out = ctypes.c_void_p()
            holder = _capi.lease_info()
            with self._call(_ADD) as ptr:
                rc = lib.lease_session_acquire(
                    ctypes.byref(out), ctypes.byref(holder), ptr, k,
                    _slice_ms(end) if wait_ms else 0, None, None)
                if rc == 0 and out.value is not None:
                    return self._adopt(out.value)[0]
                err = _error(rc)
            if isinstance(err, (Busy, Timeout)) and holder.owner:
                err.holder = Info._from_c(holder)
            # A wait is a series of slices, so that close (and a cancel)
            # can come between.
            if not wait_ms or time.monotonic() >= end or \
                    (cancel is not None and lib.lease_cancel_fired(cancel)) or \
                    not isinstance(err, (Busy, Timeout, StoreError)):
                raise err

    def claim(self, prefix: str, count: int, of: int) -> List[Held]:
        """Work partitioning: hold ``count`` of the ``of`` keys
        ``f"{prefix}{i}"`` (i in ``range(of)``), and return the
        :class:`Held` of each held, in key order.

        Each key is tried once, without waiting, from an offset derived
        from the owner, so that replicas spread over the keys; keys the
        session holds already count (and are returned as the same Held).
        Fewer than ``count`` are returned when fewer were free; claim again
        later for the rest.  Raises :class:`StoreError` only when the store
        failed before any key could be tried.
        """
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be str, not {type(prefix).__name__}")
        want = _count("count", count)
        n = _count("of", of)
        if want > n:
            raise ValueError(f"count ({want}) must not be more than of ({n})")
        keys = [_name_bytes("key", f"{prefix}{i}") for i in range(n)]
        arr = (ctypes.c_char_p * n)(*keys)
        out = (ctypes.c_void_p * n)()
        got = ctypes.c_size_t(0)
        lib = _capi.lib()
        with self._call(_ADD) as ptr:
            rc = lib.lease_session_claim(ctypes.byref(got), out, ptr, arr, n,
                                         want)
            if rc < 0:
                raise _error(rc)
            adopted = [self._adopt(p) for p in out if p]
        return [h for h, held in adopted if held]

    def release(self, held: Held) -> None:
        """Stop keeping ``held`` and release its lease now.

        Raises :class:`Lost` when it had been lost (it is forgotten all the
        same), :class:`StoreError` when the release failed (the lease runs
        out by itself), ValueError when it was released already.
        """
        if not isinstance(held, Held):
            raise TypeError(f"held must be lease.Held, not "
                            f"{type(held).__name__}")
        if held._session is not self:
            raise ValueError(f"'{held.key}' is kept by another session")
        with self._call(_RELEASE) as ptr:
            with self._reg:
                p, held._ptr = held._ptr, None
                if p is not None:
                    del self._held[p]
            if p is None:
                raise ValueError(f"'{held.key}' was released already")
            rc = _capi.lib().lease_session_release(ptr, p)
            err = _error(rc) if rc < 0 else None
        held._forget_callbacks()
        if err is not None:
            raise err

    # -- closing

    def _after_fork_in_child(self) -> None:
        # Threads of the parent may have held these, or been counted in
        # them; the child has none of them (and every call refuses there).
        self._cv = threading.Condition()
        self._running = [0, 0, 0]
        self._releases_waiting = 0
        self._reg = threading.Lock()

    def close(self) -> None:
        """Release every lease the session keeps, stop its thread and close
        its connection; later calls raise ValueError.  Waits for calls in
        progress on other threads (a waiting acquire gives up within a few
        seconds).  Raises :class:`StoreError` when a release failed (those
        leases run out by themselves); leases lost earlier are not
        reported again.  In a forked child it only forgets the session."""
        self._close(None)

    def _close(self, drain: Optional[float]) -> None:
        if os.getpid() != self._pid:
            with self._cv:
                self._closing = True
            _live.discard(self)
            return
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: not any(self._running), drain):
                return  # at exit, a call that does not end: leave it all
            ptr = self._ptr.value
            self._ptr.value = None
        with self._reg:
            helds = list(self._held.values())
            self._held.clear()
            for h in helds:
                h._ptr = None
        rc = int(_capi.lib().lease_session_close(ptr, 1)) if ptr else 0
        err = _error(rc) if rc < 0 else None
        _live.discard(self)
        self._cb = None
        for h in helds:
            h._forget_callbacks()
        if err is not None and not isinstance(err, Lost):
            raise err

    def _at_exit(self) -> None:
        self._close(10.0)
