"""Waits that Ctrl-C and asyncio can cancel.

A C call that waits (an acquire or a campaign with ``wait=``) holds its
thread until it returns, and Python runs a signal handler only between
bytecodes: a Ctrl-C would wait for the whole wait.  So a waiting call runs
on a thread of its own with a ``lease_cancel`` handle in its options, and
the caller waits for that thread in a way Python can interrupt (an Event in
a synchronous caller, a future in a coroutine).  When the caller is
interrupted or cancelled it fires the handle: the library makes no further
try, and a try in progress ends within the store's timeout.  Whatever the
call got in the meantime (a grant, an election) is undone (released), by
the caller if it is still there to see it, else by the waiting thread: a
cancelled wait never leaves a lease held.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from typing import Callable, Generic, Optional, TypeVar

from . import _capi

T = TypeVar("T")

# How long a caller's wait goes without looking at signals: Ctrl-C ends a
# wait within this, plus one store call in progress.
_SLICE = 0.05


class _Call(Generic[T]):
    """One waiting call on its thread, and who undoes its result."""

    def __init__(self, fn: Callable[[ctypes.c_void_p], T],
                 undo: Callable[[T], None]) -> None:
        self._fn = fn
        self._undo = undo
        self._mu = threading.Lock()
        self._abandoned = False     # the caller left: the thread undoes
        self._finished = False      # undone (or taken) and handle freed
        self.done = threading.Event()
        self.result: Optional[T] = None
        self.error: Optional[BaseException] = None
        self.on_done: Optional[Callable[[], None]] = None
        self._thread = threading.Thread(target=self._run, name="lease-wait",
                                        daemon=True)
        lib = _capi.lib()
        handle = ctypes.c_void_p()
        rc = lib.lease_cancel_new(ctypes.byref(handle))
        if rc < 0:
            raise MemoryError(_capi.errmsg())
        self._cancel = handle

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        """Whether the call's thread may still end (started, not ended)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            result: Optional[T] = self._fn(self._cancel)
            error: Optional[BaseException] = None
        except BaseException as e:  # delivered to the caller, re-raised
            result, error = None, e
        with self._mu:
            self.result, self.error = result, error
            abandoned = self._abandoned
            self.done.set()
            on_done = self.on_done
        if abandoned:
            self._finish(undo=True)
        elif on_done is not None:
            on_done()

    def cancel(self) -> None:
        """Fire the handle: the call ends after its try in progress."""
        _capi.lib().lease_cancel_fire(self._cancel)

    def abandon(self) -> None:
        """The caller will not wait any more: undo the result now if there
        is one, else let the thread undo it when the call ends."""
        with self._mu:
            if not self.done.is_set():
                self._abandoned = True
                return
        self._finish(undo=True)

    def _finish(self, undo: bool) -> None:
        """Once: undo the result if asked, free the handle."""
        with self._mu:
            if self._finished:
                return
            self._finished = True
        if undo and self.error is None and self.result is not None:
            try:
                self._undo(self.result)
            except Exception:
                pass  # best effort: the lease then runs out by its ttl
        _capi.lib().lease_cancel_free(self._cancel)
        self._cancel = ctypes.c_void_p()

    def outcome(self) -> T:
        """The call's result (its handle freed), or its error raised."""
        self._finish(undo=False)
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def call(fn: Callable[[ctypes.c_void_p], T], undo: Callable[[T], None],
         linger: bool = True) -> T:
    """Run ``fn(cancel)`` on a thread of its own and wait for it; an
    exception in the wait (KeyboardInterrupt) cancels it and undoes what it
    got before the exception goes on (unless a second one comes meanwhile:
    then the call's thread undoes it when it ends).  ``linger`` False: the
    exception goes on at once, and the call's thread undoes what it got
    when it ends (for a call that sees its cancel only now and then)."""
    c: _Call[T] = _Call(fn, undo)
    try:
        c.start()
        # In slices: a signal may be delivered to another thread, and the
        # handler (KeyboardInterrupt) runs on this one only when it runs
        # Python code again, which each slice's end lets it do.
        while not c.done.wait(_SLICE):
            pass
        return c.outcome()
    except BaseException:
        c.cancel()
        if not linger:
            c.abandon()
            raise
        try:
            # The call ends after its try in progress (a pause ends at
            # once; a store call within its timeout): then its result is
            # undone here, before the interruption goes on. A thread that
            # never started (interrupted in start()) is not waited for.
            while not c.done.wait(_SLICE) and c.alive():
                pass
        except BaseException:
            c.abandon()  # interrupted again: the thread undoes it
            raise
        c.abandon()
        raise


async def call_async(fn: Callable[[ctypes.c_void_p], T],
                     undo: Callable[[T], None]) -> T:
    """As :func:`call`, awaited: the event loop runs on while the call
    waits on its thread; cancelling the task cancels the wait, and what the
    call got is undone (off the loop) before CancelledError goes on (unless
    the task is cancelled again meanwhile: then its thread undoes it)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        def settle() -> None:
            if not fut.done():
                fut.set_result(None)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits the result any more

    c: _Call[T] = _Call(fn, undo)
    c.on_done = wake
    try:
        c.start()
        # Shielded: cancelling the task must not cancel `fut`, which the
        # call's thread settles and the cleanup below still awaits.
        await asyncio.shield(fut)
    except BaseException:
        c.cancel()
        try:
            # The call ends after its try in progress (within the store's
            # timeout); its result is undone off the loop, and only then
            # does the cancellation go on: the caller sees nothing held.
            await asyncio.shield(fut)
            await loop.run_in_executor(None, c.abandon)
        except BaseException:
            # Cancelled again: the call's thread undoes it when it ends.
            threading.Thread(target=c.abandon, daemon=True).start()
        raise
    return c.outcome()
