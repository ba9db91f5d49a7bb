#!/usr/bin/env python3
"""fake_pg.py MODE [VALUE] - a hostile PostgreSQL server on 127.0.0.1.

It listens on a free loopback port, writes the port number on stdout (one
line) and serves until killed. It exists only to play a broken or hostile
server, which a real one cannot (issue 10, items 5 and 7):

  hang      accept, read, never answer
  trickle   answer the startup with one byte every 0.3 s, forever
            (a valid start, then a message that never ends)
  silent    complete the startup (no password), then never answer a query
  token V   a server that answers every statement as the lease store
            expects, except that acquire returns the fencing token V
            (text as PostgreSQL would send it; "NULL" for a NULL)
  narrow    as token 7, but the catalog queries (the lease table's
            columns, the history table's definition and privileges) answer
            one column where the store asks for several

Every loop is bounded by the life of the process: the test kills it.
"""
import socket
import struct
import sys
import threading
import time


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def startup(conn):
    """Read the startup packet, refusing SSL/GSS requests first."""
    while True:
        (length,) = struct.unpack("!i", recv_exact(conn, 4))
        body = recv_exact(conn, length - 4)
        (code,) = struct.unpack("!i", body[:4])
        if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest
            conn.sendall(b"N")
            continue
        return


def msg(kind, payload=b""):
    return kind + struct.pack("!i", len(payload) + 4) + payload


def ready():
    return msg(b"Z", b"I")


def row_description(ncols):
    out = struct.pack("!h", ncols)
    for i in range(ncols):
        out += b"c%d\0" % i + struct.pack("!ihihih", 0, 0, 25, -1, -1, 0)
    return msg(b"T", out)


def data_row(values):
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += struct.pack("!i", -1)
        else:
            out += struct.pack("!i", len(v)) + v
    return msg(b"D", out)


def answer_for(sql, token, narrow=False):
    """Rows for a statement of the lease store, by what its text asks."""
    if b"set_config" in sql:
        return [[b"1", b"1"]]
    if b"has_table_privilege" in sql:
        return [[b"t"]] if narrow else [[b"t", b"t"]]
    if b"to_regclass" in sql:
        return [[b"t"]]
    if b"pg_attribute" in sql:
        return [[b"t"]] if narrow else [[b"t", b"t"]]
    if b"RETURNING l.fencing_token" in sql or sql.startswith(b"WITH o AS"):
        row = [None if token == b"NULL" else token]
        if b"clock_us" in sql:  # tokens=clock: the clock it used, now
            row.append(b"%d" % (time.time_ns() // 1000))
        return [row]
    return []


def serve_lease(conn, token, narrow=False):
    """The extended query protocol, just as much as libpq uses."""
    statements = {}
    portal_sql = b""
    out = b""
    startup(conn)
    conn.sendall(msg(b"R", struct.pack("!i", 0)) + ready())
    while True:
        kind = recv_exact(conn, 1)
        (length,) = struct.unpack("!i", recv_exact(conn, 4))
        body = recv_exact(conn, length - 4)
        if kind == b"P":  # Parse: name\0 sql\0 ...
            name, rest = body.split(b"\0", 1)
            statements[name] = rest.split(b"\0", 1)[0]
            out += msg(b"1")
        elif kind == b"B":  # Bind: portal\0 statement\0 ...
            _, rest = body.split(b"\0", 1)
            portal_sql = statements.get(rest.split(b"\0", 1)[0], b"")
            out += msg(b"2")
        elif kind == b"D":  # Describe
            rows = answer_for(portal_sql, token, narrow)
            ncols = len(rows[0]) if rows else 0
            if body[:1] == b"S":
                sql = statements.get(body[1:].split(b"\0", 1)[0], b"")
                rows = answer_for(sql, token, narrow)
                ncols = len(rows[0]) if rows else 0
                out += msg(b"t", struct.pack("!h", 0))
            out += row_description(ncols) if ncols else msg(b"n")
        elif kind == b"E":  # Execute
            rows = answer_for(portal_sql, token, narrow)
            for r in rows:
                out += data_row(r)
            out += msg(b"C", b"SELECT %d\0" % len(rows))
        elif kind == b"S":  # Sync
            conn.sendall(out + ready())
            out = b""
        elif kind == b"Q":  # simple query: BEGIN, DDL, COMMIT, ...
            conn.sendall(msg(b"C", b"SELECT 0\0") + ready())
        elif kind == b"X":
            return


def handle(conn, mode, value):
    try:
        if mode == "hang":
            while conn.recv(4096):
                pass
        elif mode == "trickle":
            # A valid start, then a long ParameterStatus, a byte at a time.
            startup(conn)
            for b in msg(b"R", struct.pack("!i", 0)) + b"S" + struct.pack("!i", 100000):
                conn.sendall(bytes([b]))
                time.sleep(0.3)
            while True:
                conn.sendall(b"a")
                time.sleep(0.3)
        elif mode == "silent":
            startup(conn)
            conn.sendall(msg(b"R", struct.pack("!i", 0)) + ready())
            while conn.recv(4096):
                pass
        elif mode == "narrow":
            serve_lease(conn, b"7", narrow=True)
        else:
            serve_lease(conn, value)
    except (ConnectionError, OSError):
        pass
    finally:
        conn.close()


def main():
    mode = sys.argv[1]
    value = sys.argv[2].encode() if len(sys.argv) > 2 else b""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn, mode, value), daemon=True).start()


if __name__ == "__main__":
    main()
