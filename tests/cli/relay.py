#!/usr/bin/env python3
"""relay.py PORTFILE HOST:PORT - a TCP relay for tests of a store link that
freezes.

It listens on a free loopback port (written to PORTFILE once it listens)
and copies bytes both ways between each client and a connection of its own
to HOST:PORT. Stopping it (SIGSTOP) freezes every link at once without
closing any: bytes stop moving, new connections complete their handshake
in the listen backlog and then hear nothing, as behind a stalled network;
SIGCONT lets them all move again. When either side of a link closes, the
relay closes the other. It exits on its own after LIFETIME seconds, so
that nothing outlives a broken test for long.
"""
import os
import select
import socket
import sys
import time

LIFETIME = 600


def main():
    portfile, upstream = sys.argv[1], sys.argv[2]
    host, port = upstream.rsplit(":", 1)
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(lsock.getsockname()[1]))
    os.rename(portfile + ".tmp", portfile)

    peer = {}  # socket -> the socket its bytes go to
    end = time.monotonic() + LIFETIME
    while time.monotonic() < end:
        ready, _, _ = select.select([lsock] + list(peer), [], [], 1.0)
        for s in ready:
            if s is lsock:
                client, _ = lsock.accept()
                try:
                    server = socket.create_connection((host, int(port)), timeout=5)
                except OSError:
                    client.close()
                    continue
                server.settimeout(None)
                peer[client] = server
                peer[server] = client
                continue
            if s not in peer:
                continue  # closed earlier in this round, with its peer
            other = peer[s]
            try:
                data = s.recv(65536)
                if data:
                    other.sendall(data)
                    continue
            except OSError:
                pass
            for x in (s, other):
                peer.pop(x, None)
                x.close()


if __name__ == "__main__":
    main()
