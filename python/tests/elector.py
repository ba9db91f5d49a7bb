"""A leader for test_elect.py's stopped-leader test, run as a child process.

argv: URL NAME RESOURCE. Leads NAME (ttl 1 s), fences RESOURCE with its
epoch, prints "epoch N" and waits for a line on stdin (the parent stops it
with SIGSTOP meanwhile and lets another candidate lead). Then it fences
again, waits (bounded) for leader.lost and its on_lost callback, and prints
one JSON line of what it saw.
"""

from __future__ import annotations

import json
import sys
import threading

import lease


def main() -> int:
    url, name, resource = sys.argv[1:4]
    seen: dict[str, object] = {}
    called: list[lease.Leader] = []
    done = threading.Event()
    with lease.open(url) as store:
        try:
            with store.elect(name, ttl=1, wait=0) as leader:
                def lost(x: lease.Leader) -> None:
                    called.append(x)
                    done.set()

                leader.on_lost(lost)
                store.fence(resource, leader.epoch)
                print(f"epoch {leader.epoch}", flush=True)
                sys.stdin.readline()
                seen["valid_after_resume"] = leader.valid
                try:
                    store.fence(resource, leader.epoch)
                    seen["fence"] = "accepted"
                except lease.Stale:
                    seen["fence"] = "stale"
                seen["lost"] = leader.lost.wait(timeout=20)
                seen["on_lost"] = done.wait(timeout=20) and \
                    called == [leader]
                try:
                    leader.check()
                    seen["check"] = "passed"
                except lease.Lost:
                    seen["check"] = "lost"
        except lease.Lost:
            seen["exit"] = "lost"
        else:
            seen["exit"] = "clean"
    print(json.dumps(seen), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
