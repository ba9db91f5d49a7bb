#!/usr/bin/env bash
# redis_durability: start three servers - durable (appendonly yes,
# appendfsync always), without the append-only file (and with a password),
# and with appendfsync everysec - and run the C test redis_durability, which
# captures the library's log through lease_log_set.
#
# usage: redis_durability.sh LEASE_BINARY REDIS_DURABILITY_BINARY
. "$(dirname "$0")/redis_lib.sh" "$1"
PROG=${2:?usage: $0 LEASE_BINARY REDIS_DURABILITY_BINARY}

PW=s3cret-Durability-pw
redis_start durable || die "start the durable server"
redis_start noaof --appendonly no || die "start the server without AOF"
# The password is set once the server runs (redis-server.sh pings without one).
rcli noaof config set requirepass "$PW" >/dev/null || die "set the password"
redis_start everysec --appendfsync everysec || die "start the everysec server"

call "$PROG" "$(redis_url durable)" "redis://:$PW@127.0.0.1:$PORT_noaof" "$(redis_url everysec)"
printf '%s\n' "$OUT"
printf '%s\n' "$ERR" >&2
expect_rc 0 "the C test redis_durability"
finish
