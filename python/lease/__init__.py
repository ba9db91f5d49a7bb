"""Distributed leases with fencing tokens, from Python.

A lease gives one holder at a time the right to act on a key, for a ttl it
renews; every grant carries a fencing token, strictly greater than every
earlier token of the key, which the protected resource checks so that a
paused former holder cannot write after its lease has passed to another::

    import lease

    with lease.open("sqlite:///var/lib/app/lease.db") as store:
        with store.hold("jobs/nightly", ttl=30) as grant:
            for item in work():
                grant.check()                      # raises lease.Lost
                write(item, fencing_token=grant.token)

The stores are those of liblease (SQLite, PostgreSQL, Redis, etcd,
Kubernetes), chosen by the URL's scheme.  Durations are seconds (int or
float).  Errors are :class:`Error` and its subclasses, each with ``.code``.

Beyond one lease: :meth:`Store.elect` leads an election (a
:class:`Leader` with its epoch), :meth:`Store.session` keeps many leases
with one thread (:class:`Session`, :class:`Held`), :meth:`Store.list` and
:meth:`Store.history` tell what the store holds and held.  A grant, a
leader and a held key share ``lost`` (a :class:`threading.Event`) and
``on_lost(callback)``; callbacks run on one thread of the package, never
on the library's renewing threads.

Threads: a :class:`Store` is one connection of the library, which serves one
thread at a time; each Store guards its connection with a lock, so sharing
one between threads is safe, and its calls run one after the other.  An
acquire that has to wait (``wait=``) tries once on the shared connection and
then waits on a connection of its own, so that a holder sharing the store
can still renew and release meanwhile.  The properties of a held grant
(``valid``, ``remaining``, ``lost``, ``check()``), a leader or a held key
never touch the store and may be used from any thread at once.

Processes: a store, a grant, a leader and a session belong to the process
that made them.  In a child made by ``os.fork()`` a store or a session
refuses every call (its connection is the parent's), a grant, leader or
held key is never valid, and leaving a ``hold`` or ``elect`` block neither
stops the parent's renewal nor releases the parent's lease.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import math
import os
import threading
import time
import types
from typing import Iterator, List, Optional, Type

from . import _capi, _wait, fence_kit
from ._callbacks import Losable
from ._capi import LibraryNotFound
from ._common import (
    Busy, Error, HistoryEntry, Info, InvalidArgument, Lost, NotFound,
    OutOfMemory, Seconds, Stale, StoreError, Timeout, Unsupported, _count,
    _error, _fork_safe, _label, _live, _name_bytes, _open_handle, _owner,
    _seconds_ms, _token, _wait_ms)
from ._election import Campaign, Leader
from ._session import Held, Session

__all__ = [
    "open", "Store", "Grant", "Hold", "Info",
    "Campaign", "Leader", "Session", "Held", "HistoryEntry",
    "Error", "InvalidArgument", "Busy", "Lost", "Stale", "Timeout",
    "StoreError", "NotFound", "OutOfMemory", "Unsupported", "LibraryNotFound",
    "library_version", "fence_kit",
]

# ----------------------------------------------------------------- grant

class Grant(Losable):
    """One grant of a lease: its key, owner, label and fencing token.

    From :meth:`Store.acquire` it is a one-shot grant that the caller renews
    and releases; from :meth:`Store.hold` the library's keeper renews it in
    the background until the ``with`` block ends.  ``valid`` and
    ``remaining`` come from the local monotonic deadline (when the last
    renewal was sent, plus the ttl, minus a margin for clock drift): past
    it, act as if the lease were lost, whatever the store may still say.

    A grant belongs to the process that acquired it: in a child made by
    ``os.fork()`` it is never valid.  A grant that is garbage collected
    releases nothing.

    ``lost`` (a :class:`threading.Event`) is set when authority is known
    lost: for a held grant when the keeper gives up, for a one-shot grant
    when a renew said :class:`Lost`; :meth:`on_lost` registers a callback.
    """

    def __init__(self, c: _capi.lease_grant) -> None:
        self._c = c
        self._pid = os.getpid()
        self._mu = threading.Lock()
        self._keeper: Optional[ctypes.c_void_p] = None
        self._ended = False
        self._init_loss()

    @property
    def key(self) -> str:
        return _capi.text(self._c.key)

    @property
    def owner(self) -> str:
        return _capi.text(self._c.owner)

    @property
    def label(self) -> str:
        return _capi.text(self._c.label)

    @property
    def token(self) -> int:
        """The fencing token: pass it to every write the lease guards."""
        return int(self._c.token)

    @property
    def ttl(self) -> float:
        """The ttl the store granted, in seconds (it may round up)."""
        return float(self._c.ttl_ms) / 1000

    @property
    def valid(self) -> bool:
        """True while authority holds: not lost and the local deadline has
        not passed.  Ask before each side effect, and still fence it."""
        if os.getpid() != self._pid or self.lost.is_set():
            return False
        with self._mu:
            if self._keeper is not None:
                return bool(_capi.lib().lease_keeper_valid(self._keeper))
            if self._ended:
                return False
            return bool(_capi.lib().lease_grant_valid(ctypes.byref(self._c)))

    @property
    def remaining(self) -> float:
        """Seconds before the local deadline (0.0 once passed or lost)."""
        if not self.valid:
            return 0.0
        with self._mu:
            if self._keeper is not None:
                ms = _capi.lib().lease_keeper_remaining_ms(self._keeper)
            else:
                ms = _capi.lib().lease_grant_remaining_ms(ctypes.byref(self._c))
        return int(ms) / 1000

    def check(self) -> None:
        """Raise :class:`Lost` unless authority still holds."""
        if not self.valid:
            raise Lost(f"'{self.key}': authority over the lease is gone "
                       f"(token {self.token})", _capi.LEASE_ELOST)

    def __repr__(self) -> str:
        return (f"<lease.Grant key={self.key!r} token={self.token} "
                f"owner={self.owner} valid={self.valid}>")


# ----------------------------------------------------------------- store

def _release_if_held(handle: ctypes.c_void_p, key: bytes,
                     opts: _capi.lease_acquire_opts) -> None:
    """One try for opts.owner (its own lease gives the same token back),
    released if had; best effort, errors ignored."""
    lib = _capi.lib()
    once = _capi.lease_acquire_opts.from_buffer_copy(opts)
    once.wait_ms = 0
    once.cancel = None
    g = _capi.lease_grant()
    if lib.lease_acquire(ctypes.byref(g), None, handle, key,
                         ctypes.byref(once)) == 0:
        lib.lease_release(handle, ctypes.byref(g))


def _acquire_args(key: object, ttl: object, owner: object, label: object,
                  wait: object) -> "tuple[bytes, _capi.lease_acquire_opts]":
    """Check an acquisition's arguments (before any store call) and build
    the library's options from them."""
    k = _name_bytes("key", key)
    opts = _capi.acquire_opts_init()
    opts.ttl_ms = _seconds_ms("ttl", ttl)
    opts.owner = _owner(owner) if owner is not None else None
    opts.label = (_name_bytes("label", label, _capi.LEASE_LABEL_MAX, True)
                  if label is not None else None)
    opts.wait_ms = _seconds_ms("wait", wait, zero=True) if wait is not None else 0
    return k, opts


class Store:
    """One connection to a lease store; made by :func:`lease.open`.

    A context manager: leaving the ``with`` block closes it.  Its ``repr``
    and ``str`` show the URL with any password replaced by ``***``.

    Safe to share between threads: a lock lets one call at a time use the
    connection; an acquire that has to wait does so on a connection of its
    own, opened for the wait, and leaves this one to the others.  In a
    child made by ``os.fork()`` every call raises :class:`StoreError`, and
    closing the store there leaves the parent's connection alone.
    """

    def __init__(self, handle: ctypes.c_void_p, url: bytes,
                 timeout_ms: int) -> None:
        """Internal: use :func:`lease.open`."""
        self._handle: Optional[ctypes.c_void_p] = handle
        # For the connections of waits; never shown (see url).
        self._open_url = url
        self._timeout_ms = timeout_ms
        self._pid = os.getpid()
        self._lock = threading.Lock()
        _fork_safe.add(self)
        lib = _capi.lib()
        self._url = _capi.text(lib.lease_store_url_redacted(handle))
        self._scheme = _capi.text(lib.lease_store_scheme(handle))

    @property
    def url(self) -> str:
        """The store's URL with any password replaced by ``***``."""
        return self._url

    @property
    def scheme(self) -> str:
        return self._scheme

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<lease.Store {self._url!r}{state}>"

    def __str__(self) -> str:
        return self._url

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, et: Optional[Type[BaseException]],
                 ev: Optional[BaseException],
                 tb: Optional[types.TracebackType]) -> None:
        self.close()

    def _after_fork_in_child(self) -> None:
        # The parent's lock may have been held by a thread that the child
        # does not have; every call here then only refuses (see _h).
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection; later calls raise ValueError.  Grants held
        with :meth:`hold` renew over their own connections and are not
        affected.  In a forked child it only forgets the handle."""
        with self._lock:
            handle, self._handle = self._handle, None
            if handle is not None and os.getpid() == self._pid:
                _capi.lib().lease_store_close(handle)

    def __del__(self) -> None:
        try:
            if getattr(self, "_handle", None) is not None and \
                    os.getpid() == self._pid:
                _capi.lib().lease_store_close(self._handle)
                self._handle = None
        except Exception:  # interpreter shutdown: nothing left to do
            pass

    def _h(self) -> ctypes.c_void_p:
        """The handle; call with self._lock held."""
        if self._handle is None:
            raise ValueError("I/O operation on a closed lease.Store")
        if os.getpid() != self._pid:
            raise StoreError(
                f"this store was opened by process {self._pid}: its "
                f"connection is that parent's; open a store in the child",
                _capi.LEASE_ESTORE)
        return self._handle

    # -- one-shot calls

    def acquire(self, key: str, *, ttl: Seconds, owner: Optional[str] = None,
                label: Optional[str] = None,
                wait: Optional[Seconds] = None) -> Grant:
        """Acquire ``key`` for ``ttl`` seconds and return the :class:`Grant`.

        ``owner`` (a UUID; default a new one) names the holder: acquiring
        again with the owner of the current lease gives the same token and a
        new expiry.  ``wait`` (seconds; None or 0: try once) retries while
        the key is held.  Nothing renews the grant: see :meth:`hold`.

        Raises :class:`Busy` (held, no wait) or :class:`Timeout` (the wait
        ran out), each with ``holder``; :class:`StoreError` when the outcome
        is unknown (retrying with ``owner=err.owner``, the same owner, is
        safe).
        """
        k, opts = _acquire_args(key, ttl, owner, label, wait)
        return self._acquire(k, opts)

    async def acquire_async(self, key: str, *, ttl: Seconds,
                            owner: Optional[str] = None,
                            label: Optional[str] = None,
                            wait: Optional[Seconds] = None) -> Grant:
        """:meth:`acquire`, awaited.  The call runs on a thread of its own,
        so waiting never blocks the event loop; cancelling the task ends
        the wait (within one store call) and releases anything it got
        before :class:`asyncio.CancelledError` goes on."""
        k, opts = _acquire_args(key, ttl, owner, label, wait)
        return await _wait.call_async(lambda c: self._acquire(k, opts, c),
                                      self._undo)

    def _acquire(self, key: bytes, opts: _capi.lease_acquire_opts,
                 cancel: Optional[ctypes.c_void_p] = None) -> Grant:
        """Acquire; a wait runs where Ctrl-C can end it (see _wait), or,
        given `cancel`, here (already off the caller's thread)."""
        # A copy: the caller's options (a Hold's, entered again) keep
        # their wait and no cancel handle of this call.
        opts = _capi.lease_acquire_opts.from_buffer_copy(opts)
        wait_ms = int(opts.wait_ms)
        if not wait_ms:
            with self._lock:
                return self._acquire_on(self._h(), key, opts)
        # A wait must not keep the connection from the other threads: a
        # holder sharing this store could not renew or release meanwhile,
        # so the wait would outlast its lease. One try here; the wait runs
        # on a connection of its own, opened for it.
        start = time.monotonic()
        opts.wait_ms = 0
        try:
            with self._lock:
                return self._acquire_on(self._h(), key, opts)
        except (Busy, StoreError):
            # A store failure is waited out as a busy key is (the library
            # does so within a wait); the wait's last failure is told.
            pass
        spent = math.floor((time.monotonic() - start) * 1000)
        opts.wait_ms = max(1, wait_ms - spent)

        def wait(c: ctypes.c_void_p) -> Grant:
            opts.cancel = c
            handle = _open_handle(self._open_url, self._timeout_ms)
            try:
                return self._acquire_on(handle, key, opts)
            except StoreError:
                if _capi.lib().lease_cancel_fired(c):
                    # Cancelled after a try of unknown outcome: the same
                    # owner asks once more, and lets go of what it holds.
                    _release_if_held(handle, key, opts)
                raise
            finally:
                _capi.lib().lease_store_close(handle)
        if cancel is not None:
            return wait(cancel)
        return _wait.call(wait, self._undo)

    def _undo(self, grant: Grant) -> None:
        """Release a grant a cancelled wait got (best effort)."""
        with self._lock:
            if self._handle is not None and os.getpid() == self._pid:
                _capi.lib().lease_release(self._handle, ctypes.byref(grant._c))

    def _acquire_on(self, h: ctypes.c_void_p, key: bytes,
                    opts: _capi.lease_acquire_opts) -> Grant:
        lib = _capi.lib()
        out = _capi.lease_grant()
        holder = _capi.lease_info()
        if opts.owner is None:
            # Made once: a wait after the first try asks as the same owner.
            buf = ctypes.create_string_buffer(_capi.LEASE_OWNER_BUFSZ)
            rc = lib.lease_owner_new(buf)
            if rc < 0:
                raise _error(rc)
            opts.owner = buf.value
        rc = lib.lease_acquire(ctypes.byref(out), ctypes.byref(holder), h,
                               key, ctypes.byref(opts))
        if rc < 0:
            err = _error(rc)
            if isinstance(err, (Busy, Timeout)) and holder.owner:
                # The library fills the holder's owner, label, token and
                # time left; it is the key's current lease.
                err.holder = dataclasses.replace(Info._from_c(holder),
                                                 key=self._key_text(key),
                                                 state="held")
            if isinstance(err, StoreError):
                err.owner = _capi.text(opts.owner)
            raise err
        return Grant(out)

    @staticmethod
    def _key_text(key: bytes) -> str:
        return key.decode("utf-8", "surrogateescape")

    def _own(self, grant: object) -> Grant:
        if not isinstance(grant, Grant):
            raise TypeError(f"grant must be lease.Grant, not "
                            f"{type(grant).__name__}")
        if grant._keeper is not None:
            raise ValueError("a grant held with Store.hold() is renewed by its "
                             "keeper and released when its block ends")
        if os.getpid() != grant._pid:
            raise Lost(f"'{grant.key}': this grant was acquired by process "
                       f"{grant._pid}; a forked child does not hold it",
                       _capi.LEASE_ELOST)
        return grant

    def renew(self, grant: Grant, ttl: Optional[Seconds] = None) -> Grant:
        """Extend ``grant`` to the store's clock + ``ttl`` seconds (None:
        its current ttl); returns the same grant, renewed in place.

        Raises :class:`Lost` (and sets ``grant.lost``) when the lease was
        released, expired or taken: an expired lease is never revived.
        """
        g = self._own(grant)
        ttl_ms = _seconds_ms("ttl", ttl) if ttl is not None else 0
        with self._lock:
            rc = _capi.lib().lease_renew(ctypes.byref(g._c), self._h(), ttl_ms)
            if rc < 0:
                err = _error(rc)
                if rc == _capi.LEASE_ELOST:
                    g._set_lost(rc)
                raise err
        return g

    def release(self, grant: Grant) -> None:
        """End the lease of ``grant`` now.  Raises :class:`Lost`, changing
        nothing, when it is not the key's current lease."""
        g = self._own(grant)
        with self._lock:
            rc = _capi.lib().lease_release(self._h(), ctypes.byref(g._c))
            if rc < 0:
                raise _error(rc)
        with g._mu:
            g._ended = True

    def show(self, key: str) -> Info:
        """The state of ``key``.  Raises :class:`NotFound` for a key that
        was never acquired."""
        k = _name_bytes("key", key)
        out = _capi.lease_info()
        with self._lock:
            rc = _capi.lib().lease_inspect(ctypes.byref(out), self._h(), k)
            if rc < 0:
                raise _error(rc)
        return Info._from_c(out)

    def fence(self, resource: str, token: int) -> int:
        """The fencing check of a resource whose marks live in this store:
        accept ``token`` if it is at least the resource's mark (raising the
        mark to it) and return the mark; raise :class:`Stale`, changing
        nothing, for an older token."""
        r = _name_bytes("resource", resource)
        t = _token(token)
        mark = ctypes.c_uint64(0)
        with self._lock:
            rc = _capi.lib().lease_fence_advance(ctypes.byref(mark), self._h(),
                                                 r, t)
            if rc < 0:
                raise _error(rc)
        return int(mark.value)

    def list(self, prefix: str = "") -> Iterator[Info]:
        """An iterator over every key that starts with ``prefix`` ("" for
        all), sorted by key, free ones included: one :class:`Info` each.
        The store is read once, when this is called."""
        p = _name_bytes("prefix", prefix, empty=True)
        out = ctypes.POINTER(_capi.lease_info)()
        n = ctypes.c_size_t(0)
        lib = _capi.lib()
        with self._lock:
            rc = lib.lease_list(ctypes.byref(out), ctypes.byref(n), self._h(),
                                p or None)
            if rc < 0:
                raise _error(rc)
        try:
            infos = [Info._from_c(out[i]) for i in range(n.value)]
        finally:
            lib.lease_list_free(out)
        return iter(infos)

    def history(self, key: str,
                limit: Optional[int] = None) -> List[HistoryEntry]:
        """The recent grants of ``key``, newest (highest token) first: a
        list of :class:`HistoryEntry`.

        ``limit`` (None: the library's most, 200) bounds how many; larger
        values give 200.  A key never acquired has an empty history.  The
        store keeps at least the newest 100 grants of each key.
        """
        k = _name_bytes("key", key)
        most = _capi.LEASE_HISTORY_READ_MAX
        n_max = most if limit is None else min(_count("limit", limit), most)
        out = ctypes.POINTER(_capi.lease_history_entry)()
        n = ctypes.c_size_t(0)
        lib = _capi.lib()
        with self._lock:
            rc = lib.lease_history(ctypes.byref(out), ctypes.byref(n),
                                   self._h(), k, n_max)
            if rc < 0:
                raise _error(rc)
        try:
            text = self._key_text(k)
            return [HistoryEntry._from_c(text, out[i]) for i in range(n.value)]
        finally:
            lib.lease_history_free(out)

    def leader(self, name: str) -> Optional[Info]:
        """The current leader of the election ``name`` (see :meth:`elect`),
        or None when nobody leads it: never led, resigned, or the last
        leader's lease ran out.  The :class:`Info`'s ``token`` is the
        leader's epoch, ``label`` and ``owner`` name it, ``remaining`` is
        its time left on the store's clock.  (``store.show("election/" +
        name)`` tells about the last leader too.)"""
        n = _name_bytes("name", name, _capi.LEASE_ELECTION_NAME_MAX)
        out = _capi.lease_info()
        with self._lock:
            rc = _capi.lib().lease_leader_get(ctypes.byref(out), self._h(), n)
            if rc < 0 and rc != _capi.LEASE_ENOTFOUND:
                raise _error(rc)
        if rc < 0 or out.state != _capi.LEASE_STATE_HELD:
            return None
        return Info._from_c(out)

    # -- holding

    def hold(self, key: str, ttl: Seconds = 30, *,
             wait: Optional[Seconds] = None,
             label: Optional[str] = None) -> "Hold":
        """Hold ``key`` for the length of a ``with`` block::

            with store.hold("jobs/nightly", ttl=30) as grant:
                ...

        Entering acquires (waiting up to ``wait`` seconds; None: try once)
        and starts the library's keeper, which renews every ttl/3 over its
        own connection; leaving stops it and releases the lease.  When
        authority ends (the store says Lost, or renewals fail until the
        local deadline), ``grant.lost`` is set and ``grant.valid`` turns
        False; leaving the block then raises :class:`Lost`, unless the body
        raised already.  Arguments are checked here, before any call.

        ``async with store.hold_async(...)`` is the same for a coroutine.
        """
        k, opts = _acquire_args(key, ttl, None, label, wait)
        return Hold(self, k, opts)

    def hold_async(self, key: str, ttl: Seconds = 30, *,
                   wait: Optional[Seconds] = None,
                   label: Optional[str] = None) -> "Hold":
        """:meth:`hold` for ``async with``: entering and leaving run off the
        event loop (a thread of their own), so they never block it;
        cancelling the task while it enters ends the wait and releases
        anything acquired.  The grant is the same as ``hold``'s; await
        ``grant.wait_lost()`` to learn of a loss."""
        return self.hold(key, ttl=ttl, wait=wait, label=label)

    def elect(self, name: str, ttl: Seconds = 30, *,
              label: Optional[str] = None,
              wait: Optional[Seconds] = None) -> Campaign:
        """Lead the election ``name`` for the length of a ``with`` block::

            with store.elect("scheduler", ttl=15, label=host) as leader:
                while leader.valid:
                    run_once(epoch=leader.epoch)

        Entering campaigns (the lease ``"election/" + name``, with a new
        owner) and blocks until this process leads: ``wait`` None waits
        without bound, 0 tries once (:class:`Busy` if another leads), a
        number waits at most that many seconds (:class:`Timeout`).  The
        wait runs on a connection of its own, on a thread of its own, so
        that Ctrl-C ends it.  While leading, the library renews every
        ttl/3 and steps down at the first failed renewal: ``leader.lost``
        is set and ``leader.valid`` turns False.  Leaving resigns (releases
        the lease); after a loss it raises :class:`Lost`, unless the body
        raised already.  Arguments are checked here, before any call.
        """
        n = _name_bytes("name", name, _capi.LEASE_ELECTION_NAME_MAX)
        ttl_ms = _seconds_ms("ttl", ttl)
        return Campaign(self, n, ttl_ms, _label(label),
                        None if wait is None else _wait_ms(wait))

    def session(self, ttl: Seconds = 30, *,
                label: Optional[str] = None) -> Session:
        """Open a :class:`Session`: many leases of one owner, renewed by one
        thread over one connection of its own (``with`` closes it)::

            with store.session(ttl=30, label=host) as s:
                mine = s.claim("shard/", 4, of=64)

        Every lease of the session has this ``ttl`` and ``label`` and is
        renewed every ttl/3.  Arguments are checked before any call.
        """
        ttl_ms = _seconds_ms("ttl", ttl)
        return Session(self, ttl_ms, _label(label))


class Hold:
    """The context manager of :meth:`Store.hold`; its ``__enter__`` gives
    the held :class:`Grant`."""

    def __init__(self, store: Store, key: bytes,
                 opts: _capi.lease_acquire_opts) -> None:
        self._store = store
        self._key = key
        self._opts = opts
        self._grant: Optional[Grant] = None
        # The callback object must outlive the keeper's thread, which calls
        # it: it lives here until lease_keeper_stop() has joined that thread.
        self._cb: Optional[object] = None
        self._err: Optional[Error] = None

    def __enter__(self) -> Grant:
        return self._enter(None)

    async def __aenter__(self) -> Grant:
        return await _wait.call_async(self._enter, self._undo)

    async def __aexit__(self, et: Optional[Type[BaseException]],
                        ev: Optional[BaseException],
                        tb: Optional[types.TracebackType]) -> None:
        # Stopping the keeper joins its thread and releases: off the loop.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.__exit__, et, ev, tb)

    def _undo(self, grant: Grant) -> None:
        """A cancelled entering got the grant: stop keeping it, release."""
        self._stop(release=True)

    def _enter(self, cancel: Optional[ctypes.c_void_p]) -> Grant:
        if self._grant is not None:
            raise RuntimeError("a lease.Hold is entered once")
        store = self._store
        grant = store._acquire(self._key, self._opts, cancel)

        def on_lost(keeper: Optional[int], reason: int,
                    payload: Optional[int]) -> None:
            # The keeper's own thread, which lease_keeper_stop() joins: set
            # the event and queue the callbacks, nothing that could block.
            grant._set_lost(reason)

        cb = _capi.LOST_CB(on_lost)
        kopts = _capi.keeper_opts_init()
        kopts.on_lost = cb
        keeper = ctypes.c_void_p()
        lib = _capi.lib()
        # Kept and registered before the keeper may start its thread: an
        # interruption after the start still finds them, to stop it.
        # The keeper's pointer is the grant's before the start writes it,
        # so no bytecode lies between the start and its being known.
        self._cb = cb
        self._grant = grant
        with grant._mu:
            grant._keeper = keeper
        _live.add(self)
        try:
            with store._lock:
                rc = lib.lease_keeper_start(ctypes.byref(keeper), store._h(),
                                            ctypes.byref(grant._c),
                                            ctypes.byref(kopts))
                err = _error(rc) if rc < 0 else None
                if err is not None:
                    # Not kept, so not left held until its ttl runs out.
                    lib.lease_release(store._h(), ctypes.byref(grant._c))
        except BaseException:
            self._stop(release=True)
            raise
        if err is not None:
            self._stop(release=False)  # none started: forgets it all
            raise err
        return grant

    def _stop(self, release: bool) -> int:
        """Stop the keeper (joining its thread), keep the last grant."""
        grant = self._grant
        assert grant is not None
        with grant._mu:
            keeper, grant._keeper = grant._keeper, None
            grant._ended = True
        if keeper is None or not keeper.value:
            _live.discard(self)
            self._cb = None
            return 0
        # Outside grant._mu: the stop joins the keeper and releases (a
        # store call), and `valid` must not wait for it meanwhile.
        last = _capi.lease_grant()
        rc = int(_capi.lib().lease_keeper_stop(ctypes.byref(last), keeper,
                                               1 if release else 0))
        err = _error(rc) if rc < 0 else None
        with grant._mu:
            if last.token:
                grant._c = last
        _live.discard(self)
        self._cb = None
        self._err = err
        grant._forget_callbacks()
        return rc

    def _at_exit(self) -> None:
        g = self._grant
        if g is not None and os.getpid() == g._pid:
            self._stop(release=True)

    def __exit__(self, et: Optional[Type[BaseException]],
                 ev: Optional[BaseException],
                 tb: Optional[types.TracebackType]) -> None:
        grant = self._grant
        if grant is None:
            return
        if os.getpid() != grant._pid:
            # A forked child: the keeper's thread exists only in the parent,
            # and the lease is the parent's; leave both alone.
            _live.discard(self)
            return
        was_lost = grant.lost.is_set()
        rc = self._stop(release=True)
        if et is not None:
            return
        if was_lost or grant.lost.is_set():
            raise Lost(f"'{grant.key}': authority was lost while held "
                       f"(token {grant.token})", _capi.LEASE_ELOST)
        if rc < 0 and self._err is not None:
            raise self._err


# ------------------------------------------------------------------ open

def _default_url() -> str:
    """LEASE_STORE, else the embedded SQLite file under $XDG_STATE_HOME (or
    ~/.local/state), as the `lease` tool picks it; its directory is made
    (0700) as the tool makes it."""
    lib = _capi.lib()
    buf = ctypes.create_string_buffer(4096)
    rc = lib.lease_default_store_url(buf, len(buf))
    if rc < 0:
        raise _error(rc)
    url = _capi.text(buf.value)
    if url.startswith("sqlite:///") and "LEASE_STORE" not in os.environ:
        # The URL's path is percent-encoded; the directory is the decoded one.
        from urllib.parse import unquote_to_bytes
        path = unquote_to_bytes(url[len("sqlite://"):])
        directory = os.path.dirname(path)
        if directory and directory != b"/":
            os.makedirs(directory, mode=0o700, exist_ok=True)
    return url


def open(url: Optional[str] = None, *, timeout: Seconds = 5.0) -> Store:
    """Open the store at ``url`` and return a :class:`Store`.

    ``url`` None: the environment variable LEASE_STORE, else the embedded
    SQLite file ``$XDG_STATE_HOME/lease/lease.db`` (``~/.local/state/...``),
    as the ``lease`` tool does.  ``timeout`` (seconds) bounds the opening
    and then every call of the store.

    Raises :class:`StoreError` when the store cannot be opened or reached,
    :class:`InvalidArgument` for a malformed URL or unknown scheme,
    :class:`LibraryNotFound` when liblease cannot be loaded (set
    LEASE_LIBRARY to its path).
    """
    if url is not None and not isinstance(url, str):
        raise TypeError(f"url must be str, not {type(url).__name__}")
    if url is not None and "\0" in url:
        raise ValueError("url must not contain a NUL character")
    timeout_ms = _seconds_ms("timeout", timeout)
    _capi.lib()
    if url is None:
        url = _default_url()
    raw = url.encode("utf-8", "surrogateescape")
    return Store(_open_handle(raw, timeout_ms), raw, timeout_ms)


def library_version() -> str:
    """The version of the liblease loaded ("0.1.0")."""
    return _capi.text(_capi.lib().lease_version())


# The public names are lease.X wherever they are defined: so tracebacks,
# reprs and pickles say, and so help(lease) lists them.
for _public in (Error, InvalidArgument, Busy, Lost, Stale, Timeout,
                StoreError, NotFound, OutOfMemory, Unsupported, Info,
                HistoryEntry, Campaign, Leader, Session, Held):
    _public.__module__ = __name__
del _public
