#!/usr/bin/env bash
# Start or stop a throw-away PostgreSQL server for the tests, on loopback.
#
#   pg-server.sh start DIR PORT                  a primary
#   pg-server.sh start DIR PORT standby PRIMARY_DIR [sync|async]
#                                                a streaming standby of the
#                                                primary in PRIMARY_DIR
#   pg-server.sh stop DIR                        stop at once (-m immediate)
#   pg-server.sh restart DIR                     -m immediate, then start again
#                                                on the same port
#   pg-server.sh promote DIR                     promote a standby (waits)
#   pg-server.sh url DIR                         prints the lease role's URL
#
# DIR is made (and must be new); the server's data, socket and log live
# there. PostgreSQL refuses to run as root, so as root the server runs as
# the `postgres` user, which must be able to reach DIR (every parent
# directory searchable). The role `lease` (password in DIR/password) owns
# the database `lease`; TCP connections need that password (scram-sha-256).
#
# A standby is a pg_basebackup -R of the primary by the `replicator` role
# (trusted for replication on 127.0.0.1). Its DIR gets the primary's
# password, so `url` works for it too. `sync` (the default) sets the
# primary's synchronous_standby_names to '*' once the standby streams, and
# waits until the standby is synchronous: from then on every commit the
# primary acknowledges is on the standby as well. `async` sets it to ''.
# The standby itself never inherits the setting, so once promoted it
# commits on its own.
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
die() {
  echo "pg-server.sh: $*" >&2
  exit 1
}

cmd=${1:?usage: pg-server.sh start|stop|restart|promote|url DIR ...}
dir=${2:?missing DIR}
bin=$(pgbin)

# psql as the superuser over the Unix socket of the server in $1.
su_psql() {
  local d=$1
  shift
  as_pg "$bin/psql" -h "$d" -p "$(cat "$d/port")" -U postgres -d postgres \
    -X -q -v ON_ERROR_STOP=1 "$@"
}

pg_start() {
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
    -o "-c port=$1 -c unix_socket_directories=$dir" start >/dev/null ||
    { tail -n 20 "$dir/log" >&2 2>/dev/null; die "the server in $dir did not start"; }
}

case "$cmd" in
start)
  port=${3:?missing PORT}
  role=${4:-primary}
  mkdir -p "$dir"
  chmod 0755 "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  as_pg test -w "$dir" ||
    die "the postgres user cannot write $dir (is every parent directory searchable?)"
  case "$role" in
  primary)
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
    pg_start "$port"
    echo "$port" > "$dir/port"
    pw=$(cat "$dir/password")
    su_psql "$dir" -v pw="$pw" <<'SQL'
CREATE ROLE lease LOGIN PASSWORD :'pw';
CREATE ROLE replicator LOGIN REPLICATION;
CREATE DATABASE lease OWNER lease;
SQL
    ;;
  standby)
    pdir=${5:?missing PRIMARY_DIR}
    mode=${6:-sync}
    case "$mode" in sync) names='*' ;; async) names='' ;;
      *) die "standby mode must be sync or async, not '$mode'" ;; esac
    [ -f "$pdir/port" ] && [ -f "$pdir/password" ] || die "$pdir holds no primary"
    pport=$(cat "$pdir/port")
    app="standby$port"
    cp "$pdir/password" "$dir/password"
    chmod 0644 "$dir/password"
    echo "$pdir" > "$dir/primary"
    as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$pport" -U replicator \
      -D "$dir/data" -R -X stream --checkpoint=fast \
      -d "application_name=$app" >/dev/null
    # A setting of the primary's (an earlier standby's) must not follow
    # the copy: a promoted standby waiting for a standby of its own would
    # never commit.
    sed -i '/^[[:space:]]*synchronous_standby_names/d' "$dir/data/postgresql.auto.conf"
    grep -q "application_name=$app" "$dir/data/postgresql.auto.conf" ||
      die "pg_basebackup -R did not write primary_conninfo with application_name=$app"
    pg_start "$port"
    echo "$port" > "$dir/port"
    su_psql "$pdir" -v names="$names" >/dev/null <<'SQL'
ALTER SYSTEM SET synchronous_standby_names = :'names';
SELECT pg_reload_conf();
SQL
    # Bounded: the standby must stream (and be synchronous when asked)
    # within 30 s.
    want=async
    [ "$mode" = sync ] && want=sync
    for ((i = 0; i < 300; i++)); do
      st=$(su_psql "$pdir" -At -c "SELECT state || '/' || sync_state FROM pg_stat_replication WHERE application_name = '$app'" || true)
      [ "$st" = "streaming/$want" ] && break
      sleep 0.1
    done
    [ "$st" = "streaming/$want" ] ||
      die "standby $app is '$st' on the primary, not streaming/$want"
    ;;
  *)
    die "role must be primary or standby, not '$role'"
    ;;
  esac
  ;;
stop)
  if [ -d "$dir/data" ]; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  ;;
restart)
  [ -f "$dir/port" ] || die "$dir holds no server"
  as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  pg_start "$(cat "$dir/port")"
  ;;
promote)
  as_pg "$bin/pg_ctl" -D "$dir/data" -w -t 60 promote >/dev/null
  ;;
url)
  echo "postgres://lease:$(cat "$dir/password")@127.0.0.1:$(cat "$dir/port")/lease"
  ;;
*)
  echo "usage: pg-server.sh start|stop|restart|promote|url DIR ..." >&2
  exit 2
  ;;
esac
