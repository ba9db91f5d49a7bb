#!/usr/bin/env python3
"""slow_clients.py HOST PORT: hold many slow HTTP connections to an agent.

Reads commands on stdin, one per line, and answers one line on stdout:
  open SRC N   open N connections from source address SRC (a loopback
               address: all of 127.0.0.0/8 is loopback on Linux), send each
               a partial request line and keep it open; answers
               "opened N" (or "error ..." if a connect failed).
  closed       how many of the connections the server has closed so far
               (EOF or reset); answers "closed N".
  quit         close everything and exit.
Nothing here waits without a bound: connects time out after 10 s, and the
"closed" check does not block.
"""
import errno
import select
import socket
import sys

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: slow"


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    socks = []
    closed = set()
    poller = select.epoll()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "open":
            src, n = words[1], int(words[2])
            try:
                for _ in range(n):
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.settimeout(10)
                    s.bind((src, 0))
                    s.connect((host, port))
                    s.sendall(PARTIAL)
                    s.setblocking(False)
                    poller.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
                    socks.append(s)
                print("opened", n, flush=True)
            except OSError as e:
                print("error", len(socks), errno.errorcode.get(e.errno, e.errno), e,
                      flush=True)
        elif words[0] == "closed":
            for fd, _ in poller.poll(0):
                closed.add(fd)
            print("closed", len(closed), flush=True)
        elif words[0] == "quit":
            break
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
