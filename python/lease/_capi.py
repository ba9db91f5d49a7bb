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

# lease/lease.h, lease/keeper.h, lease/election.h, lease/session.h
LEASE_ACQUIRE_OPTS_VERSION = 2
LEASE_KEEPER_OPTS_VERSION = 1
LEASE_CAMPAIGN_OPTS_VERSION = 2
LEASE_SESSION_OPTS_VERSION = 1

# lease/election.h: the key of an election is "election/" + name.
LEASE_ELECTION_PREFIX = "election/"
LEASE_ELECTION_NAME_MAX = LEASE_KEY_MAX - len(LEASE_ELECTION_PREFIX)

# lease/history.h
LEASE_HISTORY_READ_MAX = 200

# lease/lease.h: the longest wait of one call (24 h).
LEASE_WAIT_MAX_MS = 24 * 3600 * 1000

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


class lease_history_entry(ctypes.Structure):
    """struct lease_history_entry (lease/history.h); `ended` is enum
    lease_ended."""

    _fields_ = [
        ("token", ctypes.c_uint64),
        ("owner", ctypes.c_char * LEASE_OWNER_BUFSZ),
        ("label", ctypes.c_char * (LEASE_LABEL_MAX + 1)),
        ("ttl_ms", ctypes.c_uint64),
        ("acquired_ms", ctypes.c_int64),
        ("ended", ctypes.c_int),
        ("ended_ms", ctypes.c_int64),
    ]


# typedef void (*lease_stepdown_cb)(lease_election *, int reason, void *);
STEPDOWN_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int,
                               ctypes.c_void_p)


class lease_campaign_opts(ctypes.Structure):
    """struct lease_campaign_opts (lease/election.h)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("ttl_ms", ctypes.c_uint64),
        ("label", ctypes.c_char_p),
        ("wait_ms", ctypes.c_uint64),
        ("on_stepdown", STEPDOWN_CB),
        ("payload", ctypes.c_void_p),
        ("cancel", ctypes.c_void_p),   # lease_cancel *
    ]


def campaign_opts_init() -> lease_campaign_opts:
    """LEASE_CAMPAIGN_OPTS_INIT: { VERSION, 0, NULL, 0, NULL, NULL, NULL }."""
    return lease_campaign_opts(version=LEASE_CAMPAIGN_OPTS_VERSION, ttl_ms=0,
                               label=None, wait_ms=0, payload=None)


# typedef void (*lease_session_lost_cb)(lease_session *, lease_held *,
#                                       int reason, void *payload);
SESSION_LOST_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_void_p)


class lease_session_opts(ctypes.Structure):
    """struct lease_session_opts (lease/session.h)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("owner", ctypes.c_char_p),
        ("ttl_ms", ctypes.c_uint64),
        ("label", ctypes.c_char_p),
        ("renew_every_ms", ctypes.c_uint64),
        ("batch_max", ctypes.c_size_t),
        ("on_lost", SESSION_LOST_CB),
        ("payload", ctypes.c_void_p),
        ("step_down", ctypes.c_int),
    ]


def session_opts_init() -> lease_session_opts:
    """LEASE_SESSION_OPTS_INIT: { VERSION, NULL, 0, NULL, 0, 0, NULL, NULL,
    0 }."""
    return lease_session_opts(version=LEASE_SESSION_OPTS_VERSION, owner=None,
                              ttl_ms=0, label=None, renew_every_ms=0,
                              batch_max=0, payload=None, step_down=0)


StorePtr = ctypes.c_void_p
KeeperPtr = ctypes.c_void_p
ElectionPtr = ctypes.c_void_p
SessionPtr = ctypes.c_void_p
HeldPtr = ctypes.c_void_p

_c_int = ctypes.c_int
_c_u64 = ctypes.c_uint64
_c_i64 = ctypes.c_int64
_c_char_p = ctypes.c_char_p
_c_size = ctypes.c_size_t
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
    "lease_list": (_c_int, [_p(_p(lease_info)), _p(_c_size), StorePtr,
                            _c_char_p]),
    "lease_list_free": (None, [_p(lease_info)]),
    # history.h
    "lease_history": (_c_int, [_p(_p(lease_history_entry)), _p(_c_size),
                               StorePtr, _c_char_p, _c_size]),
    "lease_history_free": (None, [_p(lease_history_entry)]),
    "lease_ended_name": (_c_char_p, [_c_int]),
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
    # election.h
    "lease_campaign": (_c_int, [_p(ElectionPtr), StorePtr, _c_char_p,
                                _p(lease_campaign_opts)]),
    "lease_election_is_leader": (_c_int, [ElectionPtr]),
    "lease_election_epoch": (_c_u64, [ElectionPtr]),
    "lease_election_deadline_ns": (_c_i64, [ElectionPtr]),
    "lease_election_grant": (_p(lease_grant), [ElectionPtr]),
    "lease_resign": (_c_int, [ElectionPtr]),
    "lease_leader_get": (_c_int, [_p(lease_info), StorePtr, _c_char_p]),
    # session.h
    "lease_session_open": (_c_int, [_p(SessionPtr), StorePtr,
                                    _p(lease_session_opts)]),
    # on_lost (lease_held_lost_cb) is always NULL here: the session's
    # on_lost reports every grant.
    "lease_session_acquire": (_c_int, [_p(HeldPtr), _p(lease_info),
                                       SessionPtr, _c_char_p, _c_u64,
                                       ctypes.c_void_p, ctypes.c_void_p]),
    "lease_session_claim": (_c_int, [_p(_c_size), _p(HeldPtr), SessionPtr,
                                     _p(_c_char_p), _c_size, _c_size]),
    "lease_held_valid": (_c_int, [HeldPtr]),
    "lease_held_remaining_ms": (_c_u64, [HeldPtr]),
    "lease_held_token": (_c_u64, [HeldPtr]),
    "lease_held_state": (_c_int, [HeldPtr]),
    "lease_held_grant": (_p(lease_grant), [HeldPtr]),
    "lease_session_release": (_c_int, [SessionPtr, HeldPtr]),
    "lease_session_count": (_c_size, [SessionPtr]),
    "lease_session_close": (_c_int, [SessionPtr, _c_int]),
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


def ended_name(ended: int) -> str:
    """lease_ended_name(): "held", "released", "expired", "lost"."""
    return text(lib().lease_ended_name(ended))
