"""lease.fence_kit: the fencing kits installed from Python, and writes
fenced by real tokens of the store under test (LEASE_PY_TEST_URL).

SQLite always; PostgreSQL (through psycopg2 and psycopg 3 both, each test
in a fresh schema of the server) when LEASE_PY_TEST_URL is a PostgreSQL
one: ctest's python_fence_kit_postgres runs them with -k postgres, which
fails when none was collected.  The examples of examples/python run as
their README shows them.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type, Union

import pytest

import lease
import lease.fence_kit as fence_kit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "python"
TEST_URL = os.environ.get("LEASE_PY_TEST_URL", "")
PG = TEST_URL.startswith(("postgres://", "postgresql://"))


def tokens(store: lease.Store, key: str) -> Tuple[int, int]:
    """Two tokens of `key`, older and newer, each a real grant's."""
    a = store.acquire(key, ttl=10)
    store.release(a)
    b = store.acquire(key, ttl=10)
    store.release(b)
    assert 0 < a.token < b.token
    return a.token, b.token


def poll(cond: Callable[[], bool], timeout: float) -> bool:
    """Ask cond() until it is true or `timeout` seconds have passed."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
    return True


def run(*argv: str, expect: int = 0, env: Optional[Dict[str, str]] = None) -> str:
    """Run a command (an example) to its end; its output, once its exit
    status is `expect`.  `env`: added to the environment."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120, env=dict(os.environ, **(env or {})))
    assert p.returncode == expect, (argv, p.returncode, p.stdout, p.stderr)
    return p.stdout


# ---------------------------------------------------------------- SQLite

def sqlite_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS shipments "
               "(order_id INTEGER NOT NULL, token INTEGER NOT NULL)")
    return db


def sqlite_ship(db: sqlite3.Connection, resource: str, order: int,
                token: int) -> None:
    """The documented write: the check first in a BEGIN IMMEDIATE
    transaction, then the write, one commit; ROLLBACK on an error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("SELECT lease_fence(?, ?)", (resource, token))
        db.execute("INSERT INTO shipments VALUES (?, ?)", (order, token))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def rows(db: sqlite3.Connection) -> List[Tuple[int, int]]:
    return [(int(r[0]), int(r[1])) for r in
            db.execute("SELECT order_id, token FROM shipments ORDER BY rowid")]


def sqlite_mark(db: sqlite3.Connection, resource: str) -> int:
    row = db.execute("SELECT mark FROM lease_fence WHERE resource = ?",
                     (resource,)).fetchone()
    assert row is not None
    return int(row[0])


def test_sqlite_extension_path_is_the_tools() -> None:
    """The extension found beside the liblease loaded is the one `lease
    fence-sql sqlite` names on its .load line (it adds the .so)."""
    out = run(os.environ["LEASE_PY_CLI"], "fence-sql", "sqlite")
    loads = [line[len("--     .load "):] for line in out.splitlines()
             if line.startswith("--     .load ")]
    assert len(loads) == 1, out
    path = fence_kit.sqlite_extension_path()
    assert path == loads[0] + ".so"
    assert os.path.isfile(path)


def test_sqlite_fenced_write(store: lease.Store, prefix: str,
                             tmp_path: Path) -> None:
    resource = prefix + "orders"
    older, newer = tokens(store, resource)
    db = sqlite_db(tmp_path / "app.db")
    assert fence_kit.sqlite(db) == fence_kit.sqlite_extension_path()

    sqlite_ship(db, resource, 1, newer)
    assert rows(db) == [(1, newer)] and sqlite_mark(db, resource) == newer

    with pytest.raises(sqlite3.OperationalError) as e:
        sqlite_ship(db, resource, 2, older)
    assert fence_kit.stale(e.value)
    assert f"token {older} < mark {newer}" in str(e.value)
    # The single statement form: the check in the write itself.
    with pytest.raises(sqlite3.OperationalError) as e:
        db.execute("INSERT INTO shipments SELECT ?, ? WHERE lease_fence(?, ?) > 0",
                   (3, older, resource, older))
    assert fence_kit.stale(e.value)
    assert rows(db) == [(1, newer)] and sqlite_mark(db, resource) == newer

    # The same token again: one holder writes several times.
    sqlite_ship(db, resource, 4, newer)
    assert rows(db) == [(1, newer), (4, newer)]
    db.close()

    # Another connection, the extension loaded twice: the marks are the
    # database's, and the older token stays refused.
    db = sqlite_db(tmp_path / "app.db")
    fence_kit.sqlite(db)
    fence_kit.sqlite(db)
    with pytest.raises(sqlite3.OperationalError) as e:
        sqlite_ship(db, resource, 5, older)
    assert fence_kit.stale(e.value)
    assert rows(db) == [(1, newer), (4, newer)]
    db.close()


def test_sqlite_loading_is_disabled_again(tmp_path: Path) -> None:
    db = sqlite3.connect(str(tmp_path / "x.db"), isolation_level=None)
    path = fence_kit.sqlite(db)
    with pytest.raises(sqlite3.OperationalError, match="not authorized"):
        db.load_extension(path)
    with pytest.raises(sqlite3.OperationalError, match="not authorized"):
        db.execute("SELECT load_extension(?)", (path,))
    db.close()


def test_sqlite_explicit_path(tmp_path: Path) -> None:
    """path=, with or without the .so, as `.load` takes it."""
    ext = fence_kit.sqlite_extension_path()
    paths: List[Union[str, Path]] = [ext, ext[:-len(".so")], Path(ext)]
    for given in paths:
        db = sqlite3.connect(":memory:", isolation_level=None)
        assert fence_kit.sqlite(db, path=given) == os.fspath(given)
        assert db.execute("SELECT lease_fence('r', 7)").fetchone() == (7,)
        db.close()
    db = sqlite3.connect(":memory:", isolation_level=None)
    missing = str(tmp_path / "nowhere" / "liblease_sqlite_fence")
    with pytest.raises(fence_kit.ExtensionNotFound, match=re.escape(missing)):
        fence_kit.sqlite(db, path=missing)


def test_sqlite_bad_arguments(tmp_path: Path) -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    for conn, path, err in ((None, None, TypeError), ("app.db", None, TypeError),
                            (db, 7, TypeError), (db, "", ValueError),
                            (db, "a\0b", ValueError)):
        with pytest.raises(err):
            fence_kit.sqlite(conn, path=path)  # type: ignore[arg-type]
    # Nothing was loaded, and the SQL cannot load anything.
    with pytest.raises(sqlite3.OperationalError, match="no such function"):
        db.execute("SELECT lease_fence('r', 1)")
    with pytest.raises(sqlite3.OperationalError, match="not authorized"):
        db.execute("SELECT load_extension(?)", (fence_kit.sqlite_extension_path(),))


SHOW_PATH = """
import sqlite3, lease.fence_kit as k
try:
    print(k.sqlite_extension_path())
    db = sqlite3.connect(":memory:", isolation_level=None)
    k.sqlite(db)
    print(db.execute("SELECT lease_fence('r', 3)").fetchone()[0])
except k.ExtensionNotFound as e:
    print("ExtensionNotFound:", e)
"""


def test_sqlite_beside_the_liblease_loaded(tmp_path: Path) -> None:
    """The extension is looked for beside the liblease the package loaded
    (LEASE_LIBRARY here), in its directory with links resolved, and the
    error says where it looked and how to point at it."""
    lib = Path(os.environ["LEASE_LIBRARY"]).resolve()
    ext = Path(fence_kit.sqlite_extension_path())
    real = tmp_path / "lib"
    real.mkdir()
    shutil.copy(lib, real / "liblease.so.0")
    (tmp_path / "link").symlink_to(real)
    env = dict(os.environ, LEASE_LIBRARY=str(tmp_path / "link" / "liblease.so.0"))

    def show() -> str:
        p = subprocess.run([sys.executable, "-c", SHOW_PATH], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout

    out = show()
    assert out.startswith("ExtensionNotFound: no SQLite fencing extension "
                          f"beside liblease: {real}/liblease_sqlite_fence.so "
                          "does not exist"), out
    assert "path=" in out and "LEASE_LIBRARY" in out
    shutil.copy(ext, real / ext.name)
    assert show() == f"{real}/liblease_sqlite_fence.so\n3\n"


def test_stale_tells_refusals_apart() -> None:
    assert fence_kit.stale(sqlite3.OperationalError(
        "stale fencing token: token 1 < mark 2"))
    assert not fence_kit.stale(sqlite3.OperationalError("no such table: x"))
    assert not fence_kit.stale(ValueError("stale fencing token"))
    assert not fence_kit.stale(lease.Stale("token 1 < mark 2"))
    with pytest.raises(TypeError):
        fence_kit.stale("stale fencing token")  # type: ignore[arg-type]


def test_sqlite_examples(store: lease.Store, prefix: str,
                         tmp_path: Path) -> None:
    """examples/python, as its README runs them, on a SQLite database."""
    key, db = prefix + "orders", str(tmp_path / "orders.db")
    worker, stale = str(EXAMPLES / "worker.py"), str(EXAMPLES / "stale_holder.py")
    # The store through LEASE_STORE: its URL may hold a password, which
    # stays out of argv.
    env = {"LEASE_STORE": TEST_URL}
    out = run(sys.executable, worker, "--key", key, "--sqlite", db,
              "--order", "7", env=env)
    first = store.show(key).token
    assert out == f"order 7 shipped in {db} under token {first}\n"
    out = run(sys.executable, stale, "--key", key, "--sqlite", db, env=env)
    b = store.show(key).token
    m = re.fullmatch(rf"SQLite: B shipped order 1 under token {b}\n"
                     rf"SQLite: A refused, token (\d+) < {b}\n", out)
    assert m is not None and first < int(m.group(1)) < b, out
    with sqlite3.connect(db) as c:
        assert [tuple(r) for r in c.execute(
            "SELECT order_id, token FROM shipments ORDER BY rowid")] == \
            [(7, first), (1, b)]


def test_docs_example_is_the_worker() -> None:
    """The Python blocks of docs/python.md's fencing section are the
    worker's own code, which test_*_examples run."""
    doc = (ROOT / "docs" / "python.md").read_text()
    section = doc[doc.index("## Fencing where the data lives"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    worker = (EXAMPLES / "worker.py").read_text()
    assert len(blocks) >= 2
    for b in blocks:
        assert b in worker, b


# ------------------------------------------------------------ PostgreSQL
# Defined only against a PostgreSQL store (see the module's docstring).

if PG:
    DRIVERS = ["psycopg2", "psycopg"]

    @pytest.fixture
    def schema() -> Iterator[str]:
        """A fresh schema, dropped afterwards."""
        name = f"py_fence_{uuid.uuid4().hex[:12]}"
        admin = importlib.import_module("psycopg2").connect(TEST_URL)
        admin.autocommit = True
        admin.cursor().execute(qualified("psycopg2", "CREATE SCHEMA {}", name))
        try:
            yield name
        finally:
            admin.cursor().execute(qualified("psycopg2", "DROP SCHEMA {} CASCADE",
                                             name))
            admin.close()

    def qualified(driver: str, text: str, schema: str) -> Any:
        """text with {} made the schema's name, quoted by the driver."""
        sql = importlib.import_module(driver + ".sql")
        return sql.SQL(text).format(sql.Identifier(schema))

    def connect(driver: str, search_path: str) -> Any:
        """A connection of `driver` whose search_path is `search_path`
        (set with a parameter, committed), idle."""
        conn = importlib.import_module(driver).connect(TEST_URL)
        cur = conn.cursor()
        cur.execute("SELECT pg_catalog.set_config('search_path', %s, false)",
                    (search_path,))
        conn.commit()
        return conn

    def pg_ship(conn: Any, resource: str, order: int, token: int) -> None:
        """The documented write: the check first, then the write, one
        commit; rolled back on an error."""
        cur = conn.cursor()
        try:
            cur.execute("SELECT lease_fence_check(%s, %s)", (resource, token))
            cur.execute("INSERT INTO shipments VALUES (%s, %s)", (order, token))
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def pg_one(conn: Any, sql: Any, *args: object) -> Any:
        cur = conn.cursor()
        cur.execute(sql, args)
        row = cur.fetchone()
        conn.commit()
        return row[0] if row else None

    def pg_rows(conn: Any) -> List[Tuple[int, int]]:
        cur = conn.cursor()
        cur.execute("SELECT order_id, token FROM shipments ORDER BY order_id, token")
        out = [(int(r[0]), int(r[1])) for r in cur.fetchall()]
        conn.commit()
        return out

    def idle(conn: Any, driver: str) -> bool:
        if driver == "psycopg":
            return bool(conn.info.transaction_status == 0)
        return bool(conn.get_transaction_status() == 0)

    @pytest.mark.parametrize("driver", DRIVERS)
    def test_postgres_fenced_write(driver: str, schema: str, store: lease.Store,
                                   prefix: str) -> None:
        resource = prefix + "orders"
        older, newer = tokens(store, resource)
        conn = connect(driver, schema)
        assert fence_kit.postgres(conn) == fence_kit.PostgresKit(schema, True)
        assert idle(conn, driver) and conn.autocommit is False
        cur = conn.cursor()
        cur.execute("CREATE TABLE shipments (order_id bigint, token bigint)")
        conn.commit()

        pg_ship(conn, resource, 1, newer)
        assert pg_rows(conn) == [(1, newer)]
        mark = "SELECT mark FROM lease_fence_mark WHERE resource = %s"
        assert pg_one(conn, mark, resource) == newer

        with pytest.raises(Exception) as e:
            pg_ship(conn, resource, 2, older)
        assert fence_kit.stale(e.value), e.value
        assert f"token {older} < mark {newer}" in str(e.value)
        assert pg_rows(conn) == [(1, newer)]
        assert pg_one(conn, mark, resource) == newer

        # Again: this version is there; it is checked, the marks are kept.
        assert fence_kit.postgres(conn) == fence_kit.PostgresKit(schema, False)
        with pytest.raises(Exception) as e:
            pg_ship(conn, resource, 3, older)
        assert fence_kit.stale(e.value)
        pg_ship(conn, resource, 4, newer)
        assert pg_rows(conn) == [(1, newer), (4, newer)]
        assert pg_one(conn, mark, resource) == newer
        conn.close()

    @pytest.mark.parametrize("driver", DRIVERS)
    @pytest.mark.parametrize("autocommit", [False, True])
    def test_postgres_schema_and_connection_kept(driver: str, autocommit: bool,
                                                 schema: str) -> None:
        """schema= puts the kit there, not in the search_path's schema;
        the connection's autocommit and search_path are as before."""
        conn = connect(driver, "public")
        conn.autocommit = autocommit
        assert fence_kit.postgres(conn, schema=schema) == \
            fence_kit.PostgresKit(schema, True)
        assert conn.autocommit is autocommit and idle(conn, driver)
        assert pg_one(conn, "SHOW search_path") == "public"
        assert pg_one(conn, "SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc"
                      " WHERE proname = 'lease_fence_check'"
                      " AND pronamespace = %s::regnamespace", schema) == 1
        assert pg_one(conn, qualified(driver, "SELECT {}.lease_fence_check('r', 5)",
                                      schema)) == 5
        assert fence_kit.postgres(conn, schema=schema).installed is False
        with pytest.raises(fence_kit.KitError, match="does not exist"):
            fence_kit.postgres(conn, schema=schema + "_none")
        assert conn.autocommit is autocommit and idle(conn, driver)
        conn.close()

    @pytest.mark.parametrize("driver", DRIVERS)
    def test_postgres_other_version(driver: str, schema: str) -> None:
        """An older kit is refused, untouched; upgrade=True runs the script
        over it as psql would, and its marks stay."""
        conn = connect(driver, schema)
        conn.autocommit = True
        old = (ROOT / "tests" / "resource" / "fence_kit_v0.sql").read_text()
        conn.cursor().execute(old)
        assert pg_one(conn, "SELECT lease_fence_check('r', 10)") == 10
        with pytest.raises(fence_kit.KitError, match="of another version"):
            fence_kit.postgres(conn)
        assert pg_one(conn, "SELECT pg_catalog.to_regclass('lease_fence_mark')") is None
        assert pg_one(conn, "SELECT mark FROM lease_fence WHERE resource = 'r'") == 10
        assert fence_kit.postgres(conn, upgrade=True) == \
            fence_kit.PostgresKit(schema, True)
        assert pg_one(conn, "SELECT mark FROM lease_fence_mark WHERE resource = 'r'") == 10
        with pytest.raises(Exception) as e:
            pg_one(conn, "SELECT lease_fence_check('r', 9)")
        assert fence_kit.stale(e.value)
        assert fence_kit.postgres(conn).installed is False
        assert conn.autocommit is True
        conn.close()

    @pytest.mark.parametrize("driver", DRIVERS)
    def test_postgres_refuses_what_the_kit_refuses(driver: str, schema: str) -> None:
        """A trigger on the kit's table: the kit's own check says so."""
        conn = connect(driver, schema)
        fence_kit.postgres(conn)
        cur = conn.cursor()
        cur.execute("CREATE FUNCTION reset_mark() RETURNS trigger LANGUAGE plpgsql"
                    " AS $$ BEGIN NEW.mark := 1; RETURN NEW; END $$")
        cur.execute("CREATE TRIGGER reset_mark BEFORE UPDATE ON lease_fence_mark"
                    " FOR EACH ROW EXECUTE FUNCTION reset_mark()")
        conn.commit()
        with pytest.raises(fence_kit.KitError, match="has triggers: reset_mark"):
            fence_kit.postgres(conn)
        assert idle(conn, driver) and conn.autocommit is False
        conn.close()

    @pytest.mark.parametrize("driver", DRIVERS)
    def test_postgres_bad_arguments(driver: str, schema: str) -> None:
        """Refused before anything is sent: the server's last query of the
        session stays the one before."""
        conn = connect(driver, schema)
        watcher = connect(driver, schema)
        pid = pg_one(conn, "SELECT pg_catalog.pg_backend_pid()")
        # Autocommit: no COMMIT of the driver's comes after the marker.
        conn.autocommit = True

        def last_query() -> Any:
            return pg_one(watcher, "SELECT query FROM pg_catalog.pg_stat_activity"
                          " WHERE pid = %s", pid)

        conn.cursor().execute("SELECT 'before'")
        assert last_query() == "SELECT 'before'"
        bad: List[Tuple[Tuple[object, ...], Dict[str, Any], Type[Exception]]] = [
                ((None,), {}, TypeError),
                ((sqlite3.connect(":memory:"),), {}, TypeError),
                ((conn.cursor(),), {}, TypeError),
                ((conn,), {"schema": 5}, TypeError),
                ((conn,), {"upgrade": "yes"}, TypeError),
                ((conn,), {"schema": ""}, ValueError),
                ((conn,), {"schema": "a\0b"}, ValueError),
                ((conn,), {"schema": "s" * 64}, ValueError)]
        for args, kw, err in bad:
            with pytest.raises(err):
                fence_kit.postgres(*args, **kw)
        assert last_query() == "SELECT 'before'"
        # In a transaction: refused, and the transaction is left as it was.
        conn.autocommit = False
        conn.cursor().execute("SELECT 'in a transaction'")
        with pytest.raises(ValueError, match="in a transaction"):
            fence_kit.postgres(conn)
        assert not idle(conn, driver)
        assert last_query() == "SELECT 'in a transaction'"
        conn.rollback()
        # The watcher does see a call that goes through.
        fence_kit.postgres(conn)
        assert last_query() not in ("SELECT 'in a transaction'", "ROLLBACK")
        conn.close()
        with pytest.raises(ValueError, match="closed"):
            fence_kit.postgres(conn)
        watcher.close()

    @pytest.mark.parametrize("driver", DRIVERS)
    def test_postgres_concurrent_installs(driver: str, schema: str) -> None:
        """Two connections at once: the second waits for the first's
        install, then finds this version there."""
        first, second = connect(driver, schema), connect(driver, schema)
        watcher = connect(driver, schema)
        pid = pg_one(second, "SELECT pg_catalog.pg_backend_pid()")
        # The first takes the install's lock, as postgres() does.
        cur = first.cursor()
        cur.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)",
                    (lease_advisory_key("lease-fence-kit:" + schema),))
        done: List[object] = []
        t = threading.Thread(target=lambda: done.append(fence_kit.postgres(second)))
        t.start()
        try:
            # Bounded: the second is seen waiting for that lock.
            assert poll(lambda: bool(pg_one(
                watcher, "SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks"
                " WHERE pid = %s AND locktype = 'advisory' AND NOT granted",
                pid) == 1), 60)
            assert done == []
            # The first installs, as postgres() does, while the second waits.
            cur.execute(fence_kit._postgres_kit()[0])
            first.commit()
        finally:
            first.rollback()
            t.join(60)
        assert not t.is_alive()
        assert done == [fence_kit.PostgresKit(schema, False)]
        for c in (first, second, watcher):
            c.close()

    def lease_advisory_key(text: str) -> int:
        import ctypes
        from lease import _capi
        fn = _capi.lib().lease_advisory_key
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_char_p]
        return int(fn(text.encode()))

    def test_postgres_examples(schema: str, store: lease.Store, prefix: str,
                               tmp_path: Path) -> None:
        """examples/python, as its README runs them, on PostgreSQL (the
        schema chosen by the URL's options) and SQLite at once."""
        key = prefix + "orders"
        # The password out of argv: libpq reads it from PGPASSWORD.
        u = urlsplit(TEST_URL)
        netloc = (f"{u.username}@" if u.username else "") + \
            (u.hostname or "") + (f":{u.port}" if u.port else "")
        query = (u.query + "&" if u.query else "") + \
            f"options=-csearch_path%3D{schema}"
        url = urlunsplit((u.scheme, netloc, u.path, query, ""))
        env = {"LEASE_STORE": TEST_URL, "PGPASSWORD": unquote(u.password or "")}
        db = str(tmp_path / "orders.db")
        worker, stale = str(EXAMPLES / "worker.py"), str(EXAMPLES / "stale_holder.py")
        out = run(sys.executable, worker, "--key", key, "--postgres", url,
                  "--order", "7", env=env)
        first = store.show(key).token
        assert out == f"order 7 shipped in PostgreSQL under token {first}\n"
        out = run(sys.executable, stale, "--key", key, "--sqlite", db,
                  "--postgres", url, env=env)
        b = store.show(key).token
        assert re.fullmatch(
            rf"SQLite: B shipped order 1 under token {b}\n"
            rf"SQLite: A refused, token (\d+) < {b}\n"
            rf"PostgreSQL: B shipped order 1 under token {b}\n"
            rf"PostgreSQL: A refused, token \1 < {b}\n", out), out
        conn = connect("psycopg", schema)
        assert pg_rows(conn) == sorted([(7, first), (1, b)])
        conn.close()
