"""The loss of authority as seen from Python: the ``lost`` event of a grant,
a leader or a held key, and the ``on_lost`` callbacks registered on it.

The library reports a loss from a thread of its own (a keeper's, an
election's, a session's), which it joins or waits for when the holder stops:
a callback that ran there and waited for anything the stopping thread holds
would deadlock, and the library forbids calling most of its functions from
it.  So that thread only sets the event and queues the callbacks; one
thread of this package, the dispatcher, runs them in order, where they may
call anything (leave a ``with`` block, release, close a session).
"""

from __future__ import annotations

import logging
import os
import queue
import asyncio
import threading
from typing import Callable, List, Optional, Tuple, TypeVar, Union

_log = logging.getLogger("lease")

_T = TypeVar("_T", bound="Losable")
_Item = Union[Tuple["Losable", List[Callable[..., object]]], threading.Event]


def _report(callback: object, subject: object) -> None:
    """A callback raised: say so in the log ("lease" logger), as
    concurrent.futures does for its done callbacks; never let it reach the
    library's thread or the dispatcher's loop."""
    _log.exception("lease: on_lost callback %r of %r raised", callback,
                   subject)


class _Dispatcher:
    """One daemon thread that runs the queued callbacks, one at a time.

    Started on first use and again in a forked child (where the parent's
    thread does not exist).  A daemon thread, so that it never keeps the
    interpreter from exiting; callbacks still queued at exit may not run.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._queue: "queue.SimpleQueue[_Item]" = queue.SimpleQueue()
        self._pid = -1

    def _ensure(self) -> "queue.SimpleQueue[_Item]":
        with self._mu:
            if self._pid != os.getpid():
                # A fresh queue too: the parent's may hold the parent's items.
                self._queue = queue.SimpleQueue()
                t = threading.Thread(target=self._run, args=(self._queue,),
                                     name="lease-callbacks", daemon=True)
                t.start()
                self._pid = os.getpid()
            return self._queue

    def start(self) -> None:
        """Start the thread now, from a thread of the application: the
        library's threads then only queue."""
        self._ensure()

    def submit(self, subject: "Losable",
               callbacks: List[Callable[..., object]]) -> None:
        try:
            q = self._ensure()
        except RuntimeError:  # interpreter shutdown: no new thread
            return
        q.put((subject, callbacks))

    def flush(self, timeout: float) -> bool:
        """Wait until every callback queued before this call has run; False
        if that took longer than ``timeout`` seconds."""
        done = threading.Event()
        self._ensure().put(done)
        return done.wait(timeout)

    @staticmethod
    def _run(q: "queue.SimpleQueue[_Item]") -> None:
        while True:
            item = q.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            subject, callbacks = item
            for cb in callbacks:
                try:
                    cb(subject)
                except BaseException:
                    _report(cb, subject)


dispatcher = _Dispatcher()


class Losable:
    """What a grant, a leader and a held key share: the ``lost`` event, the
    ``lost_reason`` and :meth:`on_lost`."""

    lost: threading.Event
    """Set once authority is known lost; never cleared."""

    lost_reason: Optional[int]
    """The library's code for the loss (``lease.Lost.code``: the store said
    another owner holds the key; ``lease.StoreError.code``: renewals failed
    until the deadline came near, so authority is uncertain), or None."""

    def _init_loss(self) -> None:
        self.lost = threading.Event()
        self.lost_reason = None
        # Never held while calling into the library: the library's thread
        # takes it in _set_lost, and may be joined by a caller of the
        # library.
        self._loss_mu = threading.Lock()
        self._callbacks: List[Callable[..., object]] = []
        self._fired = False

    def on_lost(self: _T, callback: Callable[[_T], object]) -> None:
        """Run ``callback(self)`` once, when authority is lost.

        It runs on a thread of the package (not the library's renewing
        thread), after ``lost`` is set and ``lost_reason`` holds the
        library's code (``lease.Lost.code``: the store refused a renewal;
        ``lease.StoreError.code``: renewals failed until the deadline came
        near); callbacks run one at a time, in the
        order they were registered, so keep them short.  If authority is
        lost already, ``callback`` runs at once, on the calling thread.  It
        never runs for a lease that ends without a loss (released, resigned,
        closed).  An exception it raises is logged (the "lease" logger) and
        goes no further.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, not "
                            f"{type(callback).__name__}")
        with self._loss_mu:
            now = self._fired
            if not now:
                self._callbacks.append(callback)
        if now:
            try:
                callback(self)
            except BaseException:
                _report(callback, self)
        else:
            dispatcher.start()

    async def wait_lost(self) -> None:
        """Wait, without blocking the event loop, until authority is lost
        (at once if it is already).  A lease that ends without a loss
        (released, resigned, closed) never is: run this as a task beside
        the work and cancel it when the block ends::

            async with store.hold_async("jobs/nightly", ttl=30) as grant:
                watch = asyncio.ensure_future(grant.wait_lost())
                ...
        """
        if self.lost.is_set():
            return
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()

        def settle() -> None:
            if not fut.done():
                fut.set_result(None)

        def wake(_subject: object) -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        self.on_lost(wake)
        try:
            await fut
        finally:
            # Cancelled (or lost): this wait's callback goes, so waits that
            # are cancelled again and again leave nothing behind.
            with self._loss_mu:
                if wake in self._callbacks:
                    self._callbacks.remove(wake)

    def _set_lost(self, reason: Optional[int]) -> None:
        """Authority is gone: set ``lost`` and queue the callbacks, once.
        Safe from any thread, the library's included: it takes no lock a
        caller of the library holds, and runs no callback itself."""
        with self._loss_mu:
            if self._fired:
                return
            self.lost_reason = reason
            self.lost.set()
            self._fired = True
            callbacks, self._callbacks = self._callbacks, []
        if callbacks:
            dispatcher.submit(self, callbacks)

    def _forget_callbacks(self) -> None:
        """The lease ended without a loss: no callback will run."""
        with self._loss_mu:
            self._callbacks = []
