"""Leadership: :meth:`Store.elect` gives a :class:`Campaign`, whose
``with`` block leads as a :class:`Leader` (lease/election.h)."""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
import types
from typing import TYPE_CHECKING, Optional, Type

from . import _capi, _wait
from ._callbacks import Losable
from ._common import (Busy, Error, Info, Lost, StoreError, Timeout, _error,
                      _live, _open_handle)

if TYPE_CHECKING:
    from . import Store

class Leader(Losable):
    """Leadership of one election, inside ``with store.elect(...)``.

    ``epoch`` is the fencing token of this leadership: carry it into every
    write to a downstream system, which refuses smaller epochs
    (:meth:`Store.fence`), because a deposed leader may still have writes
    in flight.  Ask ``valid`` (or call :meth:`check`) before each side
    effect, never a boolean of your own: the library steps down, and
    ``valid`` turns False, at the first failed renewal or once the local
    deadline comes within a quarter of the ttl.  ``lost`` is then set and
    the :meth:`on_lost` callbacks run.

    The properties never touch the store and may be read from any thread.
    In a child made by ``os.fork()`` a leader is never valid.
    """

    def __init__(self, name: str) -> None:
        self._init_loss()
        self._name = name
        self._pid = os.getpid()
        # The library's lease_election *, written by lease_campaign() and
        # taken (set to NULL) by the resign; guarded by _mu, which is never
        # held while resigning.
        self._ptr = ctypes.c_void_p()
        self._mu = threading.Lock()
        self._grant = _capi.lease_grant()

    @property
    def name(self) -> str:
        """The election's name."""
        return self._name

    @property
    def key(self) -> str:
        """The lease behind the leadership: ``"election/" + name``."""
        return _capi.text(self._grant.key)

    @property
    def owner(self) -> str:
        """This candidate's owner identity (a UUID, new for each campaign)."""
        return _capi.text(self._grant.owner)

    @property
    def label(self) -> str:
        return _capi.text(self._grant.label)

    @property
    def epoch(self) -> int:
        """The leader's epoch: its fencing token, greater than every earlier
        leader's."""
        return int(self._grant.token)

    @property
    def ttl(self) -> float:
        """The ttl the store granted, in seconds."""
        return float(self._grant.ttl_ms) / 1000

    @property
    def valid(self) -> bool:
        """True while this process leads with certainty: not resigned, not
        stepped down, and more than a quarter of the ttl left before the
        local deadline."""
        if os.getpid() != self._pid or self.lost.is_set():
            return False
        with self._mu:
            if not self._ptr.value:
                return False
            return bool(_capi.lib().lease_election_is_leader(self._ptr))

    @property
    def remaining(self) -> float:
        """Seconds for which leadership is certain: until ``valid`` turns
        False if no renewal succeeds meanwhile (0.0 once it is False)."""
        if os.getpid() != self._pid or self.lost.is_set():
            return 0.0
        lib = _capi.lib()
        with self._mu:
            if not self._ptr.value or \
                    not lib.lease_election_is_leader(self._ptr):
                return 0.0
            deadline = int(lib.lease_election_deadline_ns(self._ptr))
        # The library's step-down point: a quarter of the ttl before the
        # local deadline.
        quarter = int(self._grant.ttl_ms) * 1_000_000 // 4
        left = deadline - quarter - int(lib.lease_clock_ns())
        return max(0, left) / 1e9

    def check(self) -> None:
        """Raise :class:`Lost` unless this process still leads."""
        if not self.valid:
            raise Lost(f"election '{self._name}': leadership is gone "
                       f"(epoch {self.epoch})", _capi.LEASE_ELOST)

    def __repr__(self) -> str:
        return (f"<lease.Leader name={self._name!r} epoch={self.epoch} "
                f"owner={self.owner} valid={self.valid}>")


def _wait_ms_until(end: Optional[float]) -> int:
    """The library's wait for a try of a wait ending at ``end``
    (time.monotonic(); None: never): at least 1 ms, at most the library's
    longest wait."""
    if end is None:
        return _capi.LEASE_WAIT_MAX_MS
    left = math.ceil((end - time.monotonic()) * 1000)
    return max(1, min(left, _capi.LEASE_WAIT_MAX_MS))


def _pause(cancel: ctypes.c_void_p, end: Optional[float]) -> None:
    """A second, or up to ``end``, or until ``cancel`` is fired: bounded."""
    until = time.monotonic() + 1.0
    if end is not None:
        until = min(until, end)
    while time.monotonic() < until and \
            not _capi.lib().lease_cancel_fired(cancel):
        time.sleep(0.02)


class Campaign:
    """The context manager of :meth:`Store.elect`; its ``__enter__`` waits
    for leadership and gives the :class:`Leader`, its ``__exit__``
    resigns."""

    def __init__(self, store: "Store", name: bytes, ttl_ms: int,
                 label: Optional[bytes], wait_ms: Optional[int]) -> None:
        self._store = store
        self._name = name
        self._opts = _capi.campaign_opts_init()
        self._opts.ttl_ms = ttl_ms
        self._opts.label = label
        self._wait_ms = wait_ms
        self._leader: Optional[Leader] = None
        # Called by the library's renewing thread: it lives here until
        # lease_resign() has joined that thread.
        self._cb: Optional[object] = None
        self._err: Optional[Error] = None

    def __enter__(self) -> Leader:
        if self._leader is not None or self._cb is not None:
            raise RuntimeError("a lease.Campaign is entered once")
        leader = Leader(self._name.decode("utf-8", "surrogateescape"))

        def on_stepdown(election: Optional[int], reason: int,
                        payload: Optional[int]) -> None:
            # The renewing thread, which lease_resign() joins: set the
            # event and queue the callbacks, nothing that could block.
            leader._set_lost(reason)

        self._cb = _capi.STEPDOWN_CB(on_stepdown)
        self._opts.on_stepdown = self._cb
        # Registered before the library may start its thread, so that the
        # callback outlives it even if this frame is interrupted once the
        # campaign has succeeded (the exit path then resigns).
        self._leader = leader
        _live.add(self)
        try:
            self._campaign(leader)
            g = _capi.lib().lease_election_grant(leader._ptr)
            leader._grant = _capi.lease_grant.from_buffer_copy(g.contents)
        except BaseException:
            if leader._ptr.value:
                # Interrupted once leading: nobody would leave the block.
                self._resign(leader)
                self._leader = None
            else:
                # The callback object stays referenced: a wait abandoned by
                # a second Ctrl-C may still lead on its thread, which then
                # resigns (and lets go of it) itself.
                _live.discard(self)
                self._leader = None
            raise
        return leader

    def _campaign(self, leader: Leader) -> None:
        """Campaign until leader._ptr is set, or raise."""
        store = self._store
        opts = self._opts
        # One try on the store's connection; a wait runs on a connection of
        # its own, so that the store's other users are not held up.
        opts.wait_ms = 0
        with store._lock:
            err = self._try(store._h(), leader)
        if err is None:
            return
        if not isinstance(err, Busy) or self._wait_ms == 0:
            raise err
        end = None if self._wait_ms is None else \
            time.monotonic() + self._wait_ms / 1000

        def wait(cancel: ctypes.c_void_p) -> Leader:
            # A connection of its own, and a cancel handle that Ctrl-C
            # fires (see _wait): each try waits as long as it may, the
            # library's longest wait when None was asked.
            opts.cancel = cancel
            handle = _open_handle(store._open_url, store._timeout_ms)
            try:
                while True:
                    opts.wait_ms = _wait_ms_until(end)
                    err = self._try(handle, leader)
                    if err is None:
                        return leader
                    # A store failure is waited out as a busy key is (the
                    # library does so within one wait); the last one is told.
                    if not isinstance(err, (Busy, Timeout, StoreError)) or \
                            _capi.lib().lease_cancel_fired(cancel) or \
                            (end is not None and time.monotonic() >= end):
                        raise err
                    if isinstance(err, StoreError):
                        # A failure the library did not wait out (one
                        # after the lease was had, as the start of its
                        # renewal): a pause before the next try, not a spin.
                        _pause(cancel, end)
            finally:
                _capi.lib().lease_store_close(handle)
        def undo(got: Leader) -> None:
            self._resign(got)
        _wait.call(wait, undo)

    def _try(self, handle: ctypes.c_void_p, leader: Leader) -> Optional[Error]:
        """One lease_campaign() on ``handle``; None on success, else the
        error, with the current leader as ``holder`` when another leads."""
        lib = _capi.lib()
        rc = lib.lease_campaign(ctypes.byref(leader._ptr), handle, self._name,
                                ctypes.byref(self._opts))
        if rc >= 0:
            return None
        err = _error(rc)
        if isinstance(err, (Busy, Timeout)):
            info = _capi.lease_info()
            if lib.lease_leader_get(ctypes.byref(info), handle,
                                    self._name) == 0 and \
                    info.state == _capi.LEASE_STATE_HELD:
                err.holder = Info._from_c(info)
        return err

    def _resign(self, leader: Optional[Leader] = None) -> int:
        """Resign (stop renewing, join the thread, release) once; `leader`
        when the block was never entered (a wait abandoned meanwhile)."""
        leader = leader if leader is not None else self._leader
        assert leader is not None
        with leader._mu:
            ptr = leader._ptr.value
            leader._ptr.value = None
        rc = 0
        if ptr:
            rc = int(_capi.lib().lease_resign(ptr))
            self._err = _error(rc) if rc < 0 else None
        _live.discard(self)
        self._cb = None
        leader._forget_callbacks()
        return rc

    def _at_exit(self) -> None:
        leader = self._leader
        if leader is not None and os.getpid() == leader._pid:
            self._resign()

    def __exit__(self, et: Optional[Type[BaseException]],
                 ev: Optional[BaseException],
                 tb: Optional[types.TracebackType]) -> None:
        leader = self._leader
        if leader is None:
            return
        if os.getpid() != leader._pid:
            # A forked child: the renewing thread exists only in the parent,
            # and the leadership is the parent's; leave both alone.
            _live.discard(self)
            return
        was_lost = leader.lost.is_set()
        rc = self._resign()
        if et is not None:
            return
        if was_lost or leader.lost.is_set():
            raise Lost(f"election '{leader.name}': leadership was lost "
                       f"(epoch {leader.epoch})", _capi.LEASE_ELOST)
        if rc < 0 and self._err is not None:
            raise self._err

