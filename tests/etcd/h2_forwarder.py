#!/usr/bin/env python3
"""h2_forwarder.py - a TCP forwarder on 127.0.0.1 in front of a real etcd
member, that closes every connection CLOSE_AFTER seconds after it opened
(an etcd restart, an idle timeout or a load balancer would), and counts the
connections that do not begin with HTTP/2's preface (HTTP/1.x ones) in
PORTFILE.h1.

    h2_forwarder.py PORTFILE TARGET_PORT CLOSE_AFTER

Serves until killed or for LIFETIME seconds (bounded).
"""
import os
import socket
import sys
import threading
import time

LIFETIME = 120
PREFACE = b"PRI * HTTP/2.0"
lock = threading.Lock()
h1 = 0


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client, target_port, close_after, portfile):
    global h1
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port), timeout=5)
        upstream.settimeout(None)
        first = client.recv(len(PREFACE), socket.MSG_PEEK | socket.MSG_WAITALL)
    except OSError:
        client.close()
        return
    if not first.startswith(PREFACE):
        with lock:
            h1 += 1
            with open(portfile + ".h1.tmp", "w") as f:
                f.write("%d\n" % h1)
            os.rename(portfile + ".h1.tmp", portfile + ".h1")
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()

    def cut():
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    threading.Timer(close_after, cut).start()


def main():
    portfile, target_port, close_after = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    with open(portfile + ".h1", "w") as f:
        f.write("0\n")
    with open(portfile + ".tmp", "w") as f:
        f.write("%d\n" % srv.getsockname()[1])
    os.rename(portfile + ".tmp", portfile)
    threading.Timer(LIFETIME, lambda: os._exit(0)).start()
    while True:
        client, _ = srv.accept()
        threading.Thread(target=serve, args=(client, target_port, close_after, portfile),
                         daemon=True).start()


if __name__ == "__main__":
    main()
