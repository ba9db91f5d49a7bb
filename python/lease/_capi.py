"""ctypes bindings to liblease's public C API (include/lease/*.h).

Every structure here mirrors its C declaration field for field, in order,
with the same widths; the options structures carry their ``version`` field
and are built from the values of their ``*_INIT`` macros.  Nothing here
reaches past the public headers.

The library is opened on first use, not at import: ``import lease`` works
on a machine without liblease (for documentation, type checking), and the
error that says how to point at the library comes when a store is opened.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

# lease/types.h
LEASE_KEY_MAX = 255
LEASE_LABEL_MAX = 255
LEASE_OWNER_LEN = 36
LEASE_OWNER_BUFSZ = LEASE_OWNER_LEN + 1

LEASE_STATE_FREE = 0
LEASE_STATE_HELD = 1
LEASE_STATE_EXPIRED = 2

# lease/errors.h: the values are part of the ABI.
LEASE_OK = 0
LEASE_EINVALID = -1
LEASE_EBUSY = -2
LEASE_ELOST = -3
LEASE_ESTALE = -4
LEASE_ETIMEOUT = -5
LEASE_ESTORE = -6
LEASE_ENOTFOUND = -7
LEASE_ENOMEM = -8
LEASE_EUNSUPPORTED = -9

# lease/lease.h and lease/keeper.h
LEASE_ACQUIRE_OPTS_VERSION = 2
LEASE_KEEPER_OPTS_VERSION = 1

LEASE_KEEPER_HELD = 0
LEASE_KEEPER_LOST = 1
LEASE_KEEPER_STOPPED = 2

# The soname the library is installed under (lease/version.h: major 0).
SONAME = "liblease.so.0"
LIBRARY_ENV = "LEASE_LIBRARY"


class lease_grant(ctypes.Structure):
    """struct lease_grant (lease/types.h)."""

    _fields_ = [
        ("key", ctypes.c_char * (LEASE_KEY_MAX + 1)),
        ("owner", ctypes.c_char * LEASE_OWNER_BUFSZ),
        ("label", ctypes.c_char * (LEASE_LABEL_MAX + 1)),
        ("token", ctypes.c_uint64),
        ("ttl_ms", ctypes.c_uint64),
        ("deadline_ns", ctypes.c_int64),
        ("acquired_ns", ctypes.c_int64),
    ]


class lease_info(ctypes.Structure):
    """struct lease_info (lease/types.h); `state` is enum lease_state."""

    _fields_ = [
        ("key", ctypes.c_char * (LEASE_KEY_MAX + 1)),
        ("owner", ctypes.c_char * LEASE_OWNER_BUFSZ),
        ("label", ctypes.c_char * (LEASE_LABEL_MAX + 1)),
        ("token", ctypes.c_uint64),
        ("held", ctypes.c_int),
        ("remaining_ms", ctypes.c_uint64),
        ("ttl_ms", ctypes.c_uint64),
        ("state", ctypes.c_int),
    ]


class lease_acquire_opts(ctypes.Structure):
    """struct lease_acquire_opts (lease/lease.h)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("owner", ctypes.c_char_p),
        ("ttl_ms", ctypes.c_uint64),
        ("label", ctypes.c_char_p),
        ("wait_ms", ctypes.c_uint64),
        ("backoff_min_ms", ctypes.c_uint64),
        ("backoff_max_ms", ctypes.c_uint64),
        ("cancel", ctypes.c_void_p),   # lease_cancel *
    ]


def acquire_opts_init() -> lease_acquire_opts:
    """LEASE_ACQUIRE_OPTS_INIT: { VERSION, NULL, 0, NULL, 0, 0, 0, NULL }."""
    return lease_acquire_opts(LEASE_ACQUIRE_OPTS_VERSION, None, 0, None, 0, 0, 0,
                              None)


# typedef void (*lease_lost_cb)(lease_keeper *, int reason, void *payload);
LOST_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class lease_keeper_opts(ctypes.Structure):
    """struct lease_keeper_opts (lease/keeper.h)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("renew_every_ms", ctypes.c_uint64),
        ("on_lost", LOST_CB),
        ("payload", ctypes.c_void_p),
        ("step_down", ctypes.c_int),
    ]


def keeper_opts_init() -> lease_keeper_opts:
    """LEASE_KEEPER_OPTS_INIT: { VERSION, 0, NULL, NULL, 0 }."""
    # ctypes zeroes the fields not given: on_lost is NULL.
    return lease_keeper_opts(version=LEASE_KEEPER_OPTS_VERSION,
                             renew_every_ms=0, payload=None, step_down=0)


StorePtr = ctypes.c_void_p
KeeperPtr = ctypes.c_void_p

_c_int = ctypes.c_int
_c_u64 = ctypes.c_uint64
_c_i64 = ctypes.c_int64
_c_char_p = ctypes.c_char_p
_p = ctypes.POINTER

# name: (restype, argtypes). CDLL (never PyDLL): ctypes releases the GIL
# around every call, so a wait or a slow store blocks only its own thread.
_PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    # errors.h
    "lease_error_name": (_c_char_p, [_c_int]),
    "lease_strerror": (_c_char_p, [_c_int]),
    "lease_errmsg": (_c_char_p, []),
    "lease_errcode": (_c_int, []),
    "lease_error_clear": (None, []),
    # version.h
    "lease_version": (_c_char_p, []),
    # store.h
    "lease_store_open_timeout": (_c_int, [_p(StorePtr), _c_char_p, _c_u64]),
    "lease_store_close": (None, [StorePtr]),
    "lease_store_scheme": (_c_char_p, [StorePtr]),
    "lease_store_url_redacted": (_c_char_p, [StorePtr]),
    "lease_default_store_url": (_c_int, [ctypes.c_char_p, ctypes.c_size_t]),
    "lease_clock_ns": (_c_i64, []),
    # lease.h
    "lease_owner_new": (_c_int, [ctypes.c_char_p]),
    "lease_cancel_new": (_c_int, [_p(ctypes.c_void_p)]),
    "lease_cancel_fire": (_c_int, [ctypes.c_void_p]),
    "lease_cancel_fired": (_c_int, [ctypes.c_void_p]),
    "lease_cancel_free": (None, [ctypes.c_void_p]),
    "lease_acquire": (_c_int, [_p(lease_grant), _p(lease_info), StorePtr,
                               _c_char_p, _p(lease_acquire_opts)]),
    "lease_renew": (_c_int, [_p(lease_grant), StorePtr, _c_u64]),
    "lease_release": (_c_int, [StorePtr, _p(lease_grant)]),
    "lease_grant_remaining_ms": (_c_u64, [_p(lease_grant)]),
    "lease_grant_valid": (_c_int, [_p(lease_grant)]),
    "lease_inspect": (_c_int, [_p(lease_info), StorePtr, _c_char_p]),
    # fence.h
    "lease_fence_advance": (_c_int, [_p(_c_u64), StorePtr, _c_char_p, _c_u64]),
    # keeper.h
    "lease_keeper_start": (_c_int, [_p(KeeperPtr), StorePtr, _p(lease_grant),
                                    _p(lease_keeper_opts)]),
    "lease_keeper_valid": (_c_int, [KeeperPtr]),
    "lease_keeper_remaining_ms": (_c_u64, [KeeperPtr]),
    "lease_keeper_token": (_c_u64, [KeeperPtr]),
    "lease_keeper_state_get": (_c_int, [KeeperPtr]),
    "lease_keeper_stop": (_c_int, [_p(lease_grant), KeeperPtr, _c_int]),
}


class LibraryNotFound(OSError):
    """liblease could not be loaded (see the message for LEASE_LIBRARY)."""


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The loaded liblease: LEASE_LIBRARY (a path) if set, else the soname.

    Raises LibraryNotFound, whose message says how to point at the library.
    """
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _load()
        return _lib


def _load() -> ctypes.CDLL:
    path = os.environ.get(LIBRARY_ENV) or SONAME
    try:
        dll = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryNotFound(
            f"cannot load liblease ({path}): {e}; install liblease0, or set "
            f"{LIBRARY_ENV} to the path of liblease.so.0") from None
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(dll, name)
        except AttributeError:
            raise LibraryNotFound(
                f"{path} has no {name}: not a liblease this binding supports; "
                f"set {LIBRARY_ENV} to the path of liblease.so.0") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return dll


def text(b: Optional[bytes]) -> str:
    """A C string from the library as str (bytes that are not UTF-8 are
    kept as surrogate escapes, so nothing is lost)."""
    return b.decode("utf-8", "surrogateescape") if b else ""


def errmsg() -> str:
    """The detailed message of the last failure on this thread."""
    return text(lib().lease_errmsg())


def strerror(code: int) -> str:
    return text(lib().lease_strerror(code))


def error_name(code: int) -> str:
    return text(lib().lease_error_name(code))
