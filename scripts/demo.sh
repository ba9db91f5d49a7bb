#!/usr/bin/env bash
# Build lease and play the stale-owner race with real processes:
# worker A is paused past its ttl, worker B takes over, A's late write is
# rejected by the fenced resource. Pass --store URL to use another store.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASE_TESTS=OFF >/dev/null
cmake --build build-release -j2 --target stale_owner lease_cli >/dev/null
exec build-release/stale_owner "$@"
