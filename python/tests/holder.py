"""A holder for test_store.py's stopped-holder test, run as a child process.

argv: URL KEY RESOURCE. Holds KEY (ttl 1 s), fences RESOURCE with its token,
prints "token N" and waits for a line on stdin (the parent stops it with
SIGSTOP meanwhile and lets another holder take over). Then it fences again,
waits (bounded) for grant.lost, and prints one JSON line of what it saw.
"""

from __future__ import annotations

import json
import sys

import lease


def main() -> int:
    url, key, resource = sys.argv[1:4]
    seen: dict[str, object] = {}
    with lease.open(url) as store:
        try:
            with store.hold(key, ttl=1) as grant:
                store.fence(resource, grant.token)
                print(f"token {grant.token}", flush=True)
                sys.stdin.readline()
                seen["valid_after_resume"] = grant.valid
                try:
                    store.fence(resource, grant.token)
                    seen["fence"] = "accepted"
                except lease.Stale as e:
                    seen["fence"] = "stale"
                    seen["fence_code"] = e.code
                seen["lost"] = grant.lost.wait(timeout=20)
                try:
                    grant.check()
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
