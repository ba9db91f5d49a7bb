#!/usr/bin/env bash
# Start or stop a throw-away PostgreSQL server for the tests, on loopback.
#
#   pg-server.sh start DIR PORT [primary|standby PRIMARY_PORT SYNC]
#   pg-server.sh stop DIR
#   pg-server.sh url DIR        prints the lease role's URL
#
# DIR is made (and must be new); the server's data, socket and log live
# there. PostgreSQL refuses to run as root, so as root the server runs as
# the `postgres` user. The role `lease` (password in DIR/password) owns the
# database `lease`; TCP connections need that password (scram-sha-256).
set -euo pipefail

pgbin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] || { echo "pg-server.sh: no PostgreSQL server installed" >&2; exit 1; }
  echo "$d"
}
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd=${1:?usage: pg-server.sh start|stop|url DIR ...}
dir=${2:?missing DIR}
bin=$(pgbin)

case "$cmd" in
start)
  port=${3:?missing PORT}
  role=${4:-primary}
  mkdir -p "$dir"
  chmod 0755 "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  if [ "$role" = standby ]; then
    primary_port=${5:?missing PRIMARY_PORT}
    as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U replicator \
      -D "$dir/data" -R -X stream --checkpoint=fast \
      -d "application_name=standby$port" >/dev/null
  else
    head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$dir/password"
    chmod 0644 "$dir/password"
    as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-instructions >/dev/null
    cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 10
hot_standby = on
synchronous_commit = on
fsync = on
CONF
    {
      echo "local all all trust"
      echo "host replication replicator 127.0.0.1/32 trust"
      echo "host all lease 127.0.0.1/32 scram-sha-256"
    } > "$dir/data/pg_hba.conf"
    chown postgres: "$dir/data/pg_hba.conf" 2>/dev/null || true
  fi
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
    -o "-c port=$port -c unix_socket_directories=$dir" start >/dev/null
  if [ "$role" != standby ]; then
    pw=$(cat "$dir/password")
    as_pg "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
      -v pw="$pw" <<'SQL'
CREATE ROLE lease LOGIN PASSWORD :'pw';
CREATE ROLE replicator LOGIN REPLICATION;
CREATE DATABASE lease OWNER lease;
SQL
  fi
  echo "$port" > "$dir/port"
  ;;
stop)
  if [ -d "$dir/data" ]; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  ;;
url)
  echo "postgres://lease:$(cat "$dir/password")@127.0.0.1:$(cat "$dir/port")/lease"
  ;;
*)
  echo "usage: pg-server.sh start|stop|url DIR ..." >&2
  exit 2
  ;;
esac
