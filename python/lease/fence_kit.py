"""The resource-side fencing kits (docs/fencing.md), from Python.

A fencing token protects only a resource that checks it, in the same
transaction as the write it guards.  This module puts the project's checks
into the databases an application writes to:

- :func:`sqlite` loads the SQLite fencing extension into a
  :class:`sqlite3.Connection`: the SQL function ``lease_fence(resource,
  token)``, whose marks live in the table ``lease_fence`` of that database;
- :func:`postgres` installs the PostgreSQL kit (``fence.sql``: the table
  ``lease_fence_mark`` and the function ``lease_fence_check(resource,
  token)``) over a psycopg2 or psycopg (3) connection, or checks that the
  kit installed is this version and as ``fence.sql`` makes it.

Then, in the transaction of each protected write, the check comes first::

    lease.fence_kit.sqlite(db)                 # sqlite3.connect(..., isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    db.execute("SELECT lease_fence(?, ?)", ("orders/eu", grant.token))
    db.execute("UPDATE orders SET status = 'shipped' WHERE id = ?", (7,))
    db.execute("COMMIT")                       # on an error: ROLLBACK

A token older than the resource's mark fails the check (:func:`stale` says
so, whichever database), the transaction is rolled back, and nothing of it
is written.

Both helpers check their arguments first: a bad one raises TypeError or
ValueError before anything touches the connection.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import os
import re
import sqlite3
import sys
import threading
from typing import Any, List, Optional, Tuple, Union

from . import _capi

__all__ = ["sqlite", "sqlite_extension_path", "postgres", "PostgresKit",
           "stale", "KitError", "ExtensionNotFound"]

# The loadable extension's file, as resource/CMakeLists.txt builds it and
# the install puts it: in the directory of liblease.so.  SQLite derives the
# entry point, sqlite3_leasesqlitefence_init, from this name.
EXTENSION_FILE = "liblease_sqlite_fence.so"

# PostgreSQL limits identifiers to NAMEDATALEN - 1 bytes and silently cuts
# longer ones: a longer schema name would name another schema.
_PG_NAME_MAX = 63


class KitError(Exception):
    """The fencing kit cannot be used as it is: a PostgreSQL kit of another
    version, or one that is not as ``fence.sql`` makes it (a trigger on its
    table, another owner, ...), or an SQLite module that cannot load
    extensions.  The message says what and how to put it right."""


class ExtensionNotFound(FileNotFoundError):
    """The SQLite fencing extension is not where it was looked for; the
    message names the place and how to point at the extension."""


# ------------------------------------------------------------ arguments

def _text_arg(name: str, value: object, limit: Optional[int] = None) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    if "\0" in value:
        raise ValueError(f"{name} must not contain a NUL character")
    if limit is not None:
        n = len(value.encode("utf-8", "surrogateescape"))
        if n > limit:
            raise ValueError(f"{name} is {n} bytes: at most {limit}")
    return value


def _path_arg(value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, str):
        raise TypeError(f"path must be str or os.PathLike, not "
                        f"{type(value).__name__}")
    return _text_arg("path", value)


# ---------------------------------------------------------------- SQLite

class _DlInfo(ctypes.Structure):
    """Dl_info of <dlfcn.h>."""

    _fields_ = [("dli_fname", ctypes.c_char_p),
                ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def _dladdr() -> Any:
    """dladdr from the C library (glibc 2.34 and later), else libdl."""
    for name in (None, "libdl.so.2"):
        try:
            fn = ctypes.CDLL(name).dladdr
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        return fn
    return None


def _liblease_dir() -> Optional[str]:
    """The directory of the liblease this package loaded (LEASE_LIBRARY, or
    the soname as the loader found it), its symbolic links resolved, as
    `lease fence-sql sqlite` finds its own: None if the loader cannot say.

    The address asked about is that of a function of liblease from dlsym,
    which is in the library itself (never a program's PLT entry)."""
    lib = _capi.lib()
    fn = _dladdr()
    if fn is None:
        return None
    info = _DlInfo()
    address = ctypes.cast(lib.lease_version, ctypes.c_void_p)
    if fn(address, ctypes.byref(info)) == 0 or not info.dli_fname:
        return None
    fname = os.fsdecode(info.dli_fname)
    directory = os.path.dirname(fname)
    if not directory:
        return None
    return os.path.realpath(directory)


def sqlite_extension_path() -> str:
    """The path of the SQLite fencing extension beside the liblease this
    package loaded: ``<its directory>/liblease_sqlite_fence.so``, the file
    that ``lease fence-sql sqlite`` names on its ``.load`` line.

    Raises :class:`ExtensionNotFound` when that file is not there (or the
    loader cannot tell where liblease is), :class:`lease.LibraryNotFound`
    when liblease cannot be loaded.
    """
    directory = _liblease_dir()
    if directory is None:
        raise ExtensionNotFound(
            "cannot tell the directory of the liblease loaded, where the "
            f"SQLite fencing extension {EXTENSION_FILE} is installed: pass "
            "path= the extension's file (`lease fence-sql sqlite` prints it "
            "on its .load line)")
    path = os.path.join(directory, EXTENSION_FILE)
    if not os.path.isfile(path):
        raise ExtensionNotFound(
            f"no SQLite fencing extension beside liblease: {path} does not "
            f"exist (install it with liblease, or set {_capi.LIBRARY_ENV} to "
            "a liblease.so.0 beside it); or pass path= the extension's file "
            "(`lease fence-sql sqlite` prints it on its .load line)")
    return path


def sqlite(conn: sqlite3.Connection, *,
           path: Union[str, "os.PathLike[str]", None] = None) -> str:
    """Load the SQLite fencing extension into ``conn``: the SQL function
    ``lease_fence(resource, token)`` of ``include/lease/sqlite_fence.h``.

    ``path`` is the extension's file (with or without its ``.so``); None
    means the one beside the liblease this package loaded (see
    :func:`sqlite_extension_path`).  Extension loading is enabled for the
    load alone and disabled again, so the connection's SQL can never load
    one.  Loading again (into this or any connection) is fine.  Returns
    the path loaded.

    Use the function first in the transaction of each protected write,
    opened with ``BEGIN IMMEDIATE`` (a connection made with
    ``isolation_level=None``, so that Python's sqlite3 opens no deferred
    transaction of its own).  Its marks are kept in the table
    ``lease_fence`` of the main database, made by its first call.

    Raises TypeError or ValueError for bad arguments (before the connection
    is touched), :class:`ExtensionNotFound` when the extension is not
    found, :class:`KitError` when this Python's sqlite3 module cannot load
    extensions, :class:`sqlite3.Error` when SQLite refuses the file.
    """
    if not isinstance(conn, sqlite3.Connection):
        raise TypeError(f"conn must be a sqlite3.Connection, not "
                        f"{type(conn).__name__}")
    given = _path_arg(path) if path is not None else None
    if not hasattr(conn, "enable_load_extension"):
        raise KitError(
            "this Python's sqlite3 module was built without extension "
            "loading (SQLITE_OMIT_LOAD_EXTENSION): use a Python built with "
            "it, such as Debian's python3")
    if given is not None:
        # As sqlite3_load_extension() tries it: the name, then name + ".so".
        if not (os.path.isfile(given) or os.path.isfile(given + ".so")):
            raise ExtensionNotFound(
                f"no SQLite fencing extension at {given} (nor {given}.so)")
        ext = given
    else:
        ext = sqlite_extension_path()
    conn.enable_load_extension(True)
    try:
        conn.load_extension(ext)
    finally:
        conn.enable_load_extension(False)
    return ext


# ------------------------------------------------------------ PostgreSQL

@dataclasses.dataclass(frozen=True)
class PostgresKit:
    """What :func:`postgres` found: the schema that holds the kit, and
    whether this call installed it (False: this version was there)."""

    schema: str
    installed: bool


# The kit's script (fence.sql) runs as one transaction of its own between
# these two lines; postgres() runs what is between them in a transaction it
# opens itself, after its own look at what is installed.
_KIT_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED;\n"
_KIT_COMMIT = "\nCOMMIT;\n"
# The kit's functions: name and body (the text between $fn$ and $fn$, as
# PostgreSQL keeps it in pg_proc.prosrc, before the schema is written in).
_KIT_FUNCTION = re.compile(
    r"^CREATE OR REPLACE FUNCTION @schema@\.(\w+)\(.*?^AS \$fn\$(.*?)\$fn\$",
    re.MULTILINE | re.DOTALL)
_KIT_FUNCTIONS = ("lease_fence_check", "lease_fence_problem",
                  "lease_fence_definition_problems")

_kit_lock = threading.Lock()
_kit: Optional[Tuple[str, List[str], List[str]]] = None


def _postgres_kit() -> Tuple[str, List[str], List[str]]:
    """The kit of the liblease loaded (lease_fence_kit_text "postgres"):
    the script between its BEGIN and COMMIT, its functions' names and their
    bodies.  KitError if that liblease has no kit, or one of another form."""
    global _kit
    with _kit_lock:
        if _kit is not None:
            return _kit
        lib = _capi.lib()
        try:
            fn = lib.lease_fence_kit_text
        except AttributeError:
            raise KitError(
                "the liblease loaded has no lease_fence_kit_text(), which "
                "gives this package the PostgreSQL kit: install a liblease "
                "of this package's version, or the kit with `lease "
                "fence-sql postgres | psql`") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p]
        text = ctypes.c_void_p()
        size = ctypes.c_size_t()
        rc = fn(ctypes.byref(text), ctypes.byref(size), b"postgres")
        if rc < 0 or not text.value:
            raise KitError(f"lease_fence_kit_text: {_capi.errmsg()}")
        sql = ctypes.string_at(text.value, size.value).decode("utf-8")
        start = sql.find(_KIT_BEGIN)
        end = sql.rfind(_KIT_COMMIT)
        found = {m.group(1): m.group(2) for m in _KIT_FUNCTION.finditer(sql)}
        if start < 0 or end < start or sorted(found) != sorted(_KIT_FUNCTIONS):
            raise KitError("the PostgreSQL kit of the liblease loaded is not "
                           "of a form this package knows: install it with "
                           "`lease fence-sql postgres | psql`")
        body = sql[start + len(_KIT_BEGIN):end + 1]
        names = list(_KIT_FUNCTIONS)
        _kit = (body, names, [found[n] for n in names])
        return _kit


def _advisory_key(text: str) -> int:
    """lease_advisory_key(): the lock number every language derives from a
    name (docs/stores.md)."""
    fn = _capi.lib().lease_advisory_key
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_char_p]
    return int(fn(text.encode("utf-8", "surrogateescape")))


class _Pg:
    """The few calls postgres() makes, over either driver."""

    def __init__(self, conn: Any, driver: str) -> None:
        self.conn = conn
        self.driver = driver

    def cursor(self) -> Any:
        # Rows as tuples, whatever row or cursor factory the caller set.
        if self.driver == "psycopg":
            rows = importlib.import_module("psycopg.rows")
            return self.conn.cursor(row_factory=rows.tuple_row)
        ext = importlib.import_module("psycopg2.extensions")
        return self.conn.cursor(cursor_factory=ext.cursor)


def _pg_driver(conn: object) -> str:
    """'psycopg2' or 'psycopg' for a connection of that driver; TypeError
    otherwise.  Neither driver is imported: a connection of one exists only
    once its module is."""
    p2 = sys.modules.get("psycopg2.extensions")
    if p2 is not None and isinstance(conn, p2.connection):
        return "psycopg2"
    p3 = sys.modules.get("psycopg")
    if p3 is not None and isinstance(conn, p3.Connection):
        return "psycopg"
    if p3 is not None and isinstance(conn, p3.AsyncConnection):
        raise TypeError("conn is a psycopg AsyncConnection: pass a "
                        "psycopg.Connection (this call blocks)")
    raise TypeError(f"conn must be a psycopg2 or psycopg connection, not "
                    f"{type(conn).__name__}")


def _pg_check_idle(conn: Any, driver: str) -> None:
    """ValueError unless conn is open and in no transaction: postgres()
    runs in a transaction of its own, and leaves the caller's alone."""
    if conn.closed:
        raise ValueError("the connection is closed")
    if driver == "psycopg2":
        ext = sys.modules["psycopg2.extensions"]
        idle = conn.get_transaction_status() == ext.TRANSACTION_STATUS_IDLE
    else:
        pq = importlib.import_module("psycopg.pq")
        idle = conn.info.transaction_status == pq.TransactionStatus.IDLE
    if not idle:
        raise ValueError("the connection is in a transaction: commit or roll "
                         "it back first (the kit is installed or checked in "
                         "a transaction of its own)")


def postgres(conn: object, *, schema: Optional[str] = None,
             upgrade: bool = False) -> PostgresKit:
    """Make sure the PostgreSQL fencing kit of this liblease is in the
    database of ``conn``, a psycopg2 or psycopg (3) connection.

    In one transaction of ``conn`` (READ COMMITTED, as ``fence.sql`` runs):

    - no kit in the schema: install it, as ``lease fence-sql postgres |
      psql`` does (the same script, from liblease: the table
      ``lease_fence_mark``, the functions ``lease_fence_check``,
      ``lease_fence_problem`` and ``lease_fence_definition_problems``; it
      ends by checking what it leaves, and refuses a schema it cannot
      trust).  Installing needs the schema's owner.
    - this version's kit: check it with ``lease_fence_problem()``, the
      kit's own full check; any role that may use the schema can.
    - a kit of another version: :class:`KitError`, nothing changed; with
      ``upgrade=True``, run the script over it as the pipe into psql does
      (replacing the functions, keeping the marks).

    ``schema``: the schema of the kit; None means the connection's
    ``current_schema()`` (the first schema of its search_path that
    exists).  Writers then call ``lease_fence_check`` in that schema.
    Concurrent calls on one schema wait for each other (a transaction
    advisory lock), so a fleet of workers may all call this at start.

    The connection must be open and not in a transaction; its autocommit
    setting is as before when this returns.  Raises TypeError or
    ValueError for bad arguments, before the connection is touched;
    :class:`KitError` when the kit is of another version, or not as
    ``fence.sql`` makes it; the driver's error (its SQLSTATE LF003: a
    schema the kit refuses) when the install fails, rolled back.
    """
    driver = _pg_driver(conn)
    if schema is not None:
        schema = _text_arg("schema", schema, _PG_NAME_MAX)
    if not isinstance(upgrade, bool):
        raise TypeError(f"upgrade must be bool, not {type(upgrade).__name__}")
    c: Any = conn
    _pg_check_idle(c, driver)
    body, names, bodies = _postgres_kit()
    pg = _Pg(c, driver)
    autocommit = bool(c.autocommit)
    # Autocommit while this runs, so that the BEGIN below is the server's
    # own and sets the isolation level, with either driver.
    c.autocommit = True
    try:
        cur = pg.cursor()
        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        try:
            kit = _pg_transaction(cur, schema, upgrade, body, names, bodies)
        except BaseException:
            # The error that got here is the one to see, not a failed
            # ROLLBACK's on a connection that broke.
            try:
                if not c.closed:
                    cur.execute("ROLLBACK")
            except Exception:
                pass
            raise
        cur.execute("COMMIT")
        cur.close()
        return kit
    finally:
        if not c.closed:
            c.autocommit = autocommit


def _pg_transaction(cur: Any, schema: Optional[str], upgrade: bool,
                    body: str, names: List[str],
                    bodies: List[str]) -> PostgresKit:
    """postgres(), inside its transaction."""
    if schema is not None:
        cur.execute("SELECT pg_catalog.set_config('search_path', "
                    "pg_catalog.quote_ident(%s), true)", (schema,))
    cur.execute("SELECT pg_catalog.current_schema()")
    row = cur.fetchone()
    s = row[0] if row else None
    if s is None:
        where = (f"schema {schema!r} does not exist" if schema is not None
                 else "no schema of the connection's search_path exists")
        raise KitError(f"nowhere to put the fencing kit: {where}")
    # From here on the transaction's names are resolved in pg_catalog, then
    # s: the kit's script installs into s, and the check below is s's.
    cur.execute("SELECT pg_catalog.set_config('search_path', "
                "pg_catalog.quote_ident(%s), true)", (s,))
    cur.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)",
                (_advisory_key("lease-fence-kit:" + s),))
    # For each of the kit's functions: is one of that name in s, and is it
    # this kit's (its body as the script writes it into s)?
    cur.execute(
        "SELECT f.name,"
        " EXISTS (SELECT FROM pg_catalog.pg_proc AS p"
        "          WHERE p.pronamespace = n.oid AND p.proname = f.name),"
        " EXISTS (SELECT FROM pg_catalog.pg_proc AS p"
        "          WHERE p.pronamespace = n.oid AND p.proname = f.name"
        "            AND p.prosrc = pg_catalog.replace(pg_catalog.replace(f.body,"
        "                '@schema_name@', pg_catalog.quote_literal(n.nspname)),"
        "                '@schema@', pg_catalog.quote_ident(n.nspname)))"
        " FROM pg_catalog.pg_namespace AS n,"
        "      ROWS FROM (pg_catalog.unnest(%s::text[]),"
        "                 pg_catalog.unnest(%s::text[])) AS f(name, body)"
        " WHERE n.nspname = %s",
        (names, bodies, s))
    rows = cur.fetchall()
    present = [str(r[0]) for r in rows if r[1]]
    different = [str(r[0]) for r in rows if r[1] and not r[2]]
    if present and not different and len(present) == len(names):
        cur.execute("SELECT lease_fence_problem()")
        row = cur.fetchone()
        problem = row[0] if row else "lease_fence_problem() returned nothing"
        if problem is not None:
            raise KitError(
                f"the fencing kit in schema {s} is not as fence.sql installs "
                f"it: {problem}; no token is accepted until that is undone "
                "(`lease fence-sql postgres | psql`, as the schema's owner, "
                "checks it again)")
        return PostgresKit(schema=s, installed=False)
    if present and not upgrade:
        missing = sorted(set(names) - set(present))
        what = ([f"without {', '.join(missing)}"] if missing else []) + \
            ([f"{', '.join(sorted(different))} of another version"]
             if different else [])
        raise KitError(
            f"the fencing kit in schema {s} is not the one of liblease "
            f"{_capi.text(_capi.lib().lease_version())}: "
            f"{'; '.join(what)}; nothing changed. Upgrade it as the "
            "schema's owner: fence_kit.postgres(conn, upgrade=True), or "
            "`lease fence-sql postgres | psql`")
    # The script's text as it is (it has no parameters): the driver sends it
    # whole, and the server runs its statements in this transaction.
    cur.execute(body)
    return PostgresKit(schema=s, installed=True)


# --------------------------------------------------------------- errors

def stale(error: BaseException) -> bool:
    """True when ``error`` is a fencing check's refusal of a token older
    than the resource's mark: SQLSTATE LF001 from ``lease_fence_check``
    (psycopg's ``sqlstate``, psycopg2's ``pgcode``), or SQLite's ``stale
    fencing token`` from ``lease_fence``.  Treat it as a lost lease: roll
    back and stop writing.

    Under REPEATABLE READ or SERIALIZABLE, PostgreSQL may refuse a stale
    holder with a serialization failure (40001) instead: not counted here,
    and it does not commit either."""
    if not isinstance(error, BaseException):
        raise TypeError(f"error must be an exception, not "
                        f"{type(error).__name__}")
    for attr in ("sqlstate", "pgcode"):
        if getattr(error, attr, None) == "LF001":
            return True
    return (isinstance(error, sqlite3.Error)
            and str(error).startswith("stale fencing token"))
