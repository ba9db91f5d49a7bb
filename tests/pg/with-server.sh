#!/usr/bin/env bash
# with-server.sh PG_SERVER_SCRIPT CMD [ARG...]
#
# Run CMD against a PostgreSQL server of its own: started with
# PG_SERVER_SCRIPT (scripts/pg-server.sh) on a free loopback port in a
# mktemp -d directory, stopped and removed on exit whatever happens.
# CMD gets, in its environment:
#   PG_TEST_URL     the lease role's URL (it holds the password)
#   PG_TEST_DIR     the server's directory (for pg-server.sh restart/stop)
#   PG_SERVER       the path of pg-server.sh
#   PG_CLOSED_PORT  a loopback port nobody listens on
# The exit status is CMD's.
set -u
PG_SERVER=${1:?usage: with-server.sh PG_SERVER_SCRIPT CMD [ARG...]}
shift
[ $# -gt 0 ] || { echo "usage: with-server.sh PG_SERVER_SCRIPT CMD [ARG...]" >&2; exit 2; }
. "$(dirname "$0")/lib_pg.sh"

pg_tmpdir
t0=$(date +%s%N)
pg_start db || exit 1
echo "# server started on port $PG_PORT in $((($(date +%s%N) - t0) / 1000000)) ms"
PG_TEST_URL=$(bash "$PG_SERVER" url "$PG_T/db")
PG_TEST_DIR=$PG_T/db
PG_CLOSED_PORT=$(free_port) || exit 1
export PG_TEST_URL PG_TEST_DIR PG_SERVER PG_CLOSED_PORT
"$@"
