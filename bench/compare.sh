#!/usr/bin/env bash
# Lease cycles against the raw store and the peers, side by side: starts
# PostgreSQL, Redis (appendonly yes, appendfsync always) and etcd on
# loopback in a temporary directory, then runs, interleaved round by
# round, bench_cycle (acquire + release on keys i%1000, ttl 30 s) and the
# yardsticks Debian has for each store:
#
#   postgres  pgbench running the spec chapter's acquire upsert and release
#             UPDATE (bench/peers/pg_cycle.sql), -M prepared
#   redis     redis-py's Lock (bench/peers/redis_py_lock.py), and
#             redis-benchmark with one EVAL doing SET NX PX + compare-and-
#             delete per cycle (bench/peers/redis_cycle.lua: one round trip
#             and one AOF write per cycle, a ceiling rather than a peer)
#   etcd      python-etcd3's Lock (bench/peers/etcd3_lock.py), over gRPC
#   sqlite    none (no server to measure against); the row is the figure
#
# and prints a markdown table of the medians over the rounds, with the
# median of each round's lease / yardstick ratio, then, for Redis, the AOF
# bytes and server CPU per cycle. docs/benchmarks.md tells what each runs.
#
#   bench/compare.sh [--seconds S] [--rounds R] [--stores "sqlite postgres redis etcd"]
#                    [--clients "1 8"] [--baseline OLD_BUILD_DIR] [BUILD_DIR]
#
# BUILD_DIR holds bench/bench_cycle; without it the project is built in
# the temporary directory. --baseline runs an older build's bench_cycle in
# the same rounds too, as one more yardstick (before/after, side by side).
# Missing Debian packages are installed (as root). Ports (loopback):
# COMPARE_PG_PORT (45432), COMPARE_REDIS_PORT (46379), COMPARE_ETCD_PORT
# and COMPARE_ETCD_PEER_PORT (42379, 42380).
# COMPARE_RAW=FILE keeps every run's figure ("STORE C TOOL VALUE ROUND").
# Figures only: the machine's other work shows in them, so compare the
# columns of one run, not runs of different days.
set -euo pipefail
# A failing command inside $(...) stops the script too.
shopt -s inherit_errexit

root=$(cd "$(dirname "$0")/.." && pwd)
peers=$root/bench/peers
seconds=5
rounds=3
stores="sqlite postgres redis etcd"
clients_list="1 8"
build=""
baseline=""
pg_port=${COMPARE_PG_PORT:-45432}
redis_port=${COMPARE_REDIS_PORT:-46379}
etcd_port=${COMPARE_ETCD_PORT:-42379}
etcd_peer=${COMPARE_ETCD_PEER_PORT:-42380}
# Debian's interpreter, where python3-redis and python3-etcd3 live (a
# python3 earlier on PATH, e.g. pyenv's, would not see them).
py=/usr/bin/python3
# No __pycache__ left in the source tree by bench/peers/cycles.py.
export PYTHONDONTWRITEBYTECODE=1

. "$(dirname "$0")/lib.sh"

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --stores) stores=${2:?}; shift 2 ;;
    --clients) clients_list=${2:?}; shift 2 ;;
    --baseline) baseline=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) build=$1; shift ;;
    esac
  done
  in_range "$seconds" 1 600 || die "--seconds must be 1..600"
  in_range "$rounds" 1 50 || die "--rounds must be 1..50"
  local s c
  for s in $stores; do
    case "$s" in sqlite|postgres|redis|etcd) ;; *) die "unknown store '$s'" ;; esac
  done
  for c in $clients_list; do
    in_range "$c" 1 64 || die "clients must be 1..64, not '$c'"
  done
}

# Install what the servers and the yardsticks need, the way scripts/deps.sh
# does: ask apt only when something is missing.
install_deps() {
  local p missing=()
  local packages=(postgresql-15 postgresql-contrib postgresql-client redis-server redis-tools
    etcd-server curl python3 python3-redis python3-etcd3)
  [ -n "$build" ] || packages+=(gcc make cmake pkg-config libsqlite3-dev libpq-dev
    libhiredis-dev libcurl4-openssl-dev libmicrohttpd-dev uuid-dev libjansson-dev)
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "run as root (or install these packages): ${missing[*]}"
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 1200 apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Build bench_cycle in the temporary directory unless a build was given.
find_driver() {
  if [ -z "$build" ]; then
    build=$tmp/build
    log "building the project in $build"
    if ! timeout 1200 cmake -S "$root" -B "$build" >"$tmp/cmake.log" 2>&1 ||
      ! timeout 1800 cmake --build "$build" -j"$(nproc)" --target bench_cycle >>"$tmp/cmake.log" 2>&1; then
      tail -n 30 "$tmp/cmake.log" >&2
      die "the build failed"
    fi
  fi
  driver=$(cd "$build" && pwd)/bench/bench_cycle
  [ -x "$driver" ] || die "no $driver: build the target bench_cycle first"
  if [ -n "$baseline" ]; then
    baseline_driver=$(cd "$baseline" && pwd)/bench/bench_cycle
    [ -x "$baseline_driver" ] || die "no $baseline_driver: build the baseline's bench_cycle first"
  fi
}

cleanup() {
  local rc=$?
  if [ -d "$tmp/pg" ]; then "$root/scripts/pg-server.sh" stop "$tmp/pg" || true; fi
  if [ -d "$tmp/redis" ]; then "$root/scripts/redis-server.sh" stop "$tmp/redis" || true; fi
  if [ -d "$tmp/etcd" ]; then "$root/scripts/etcd-server.sh" stop "$tmp/etcd" || true; fi
  rm -rf "$tmp"
  exit "$rc"
}

# psql as the lease role; the password comes from $PGPASSFILE.
lease_psql() {
  timeout 60 psql -h 127.0.0.1 -p "$pg_port" -U lease -d lease -X -q -v ON_ERROR_STOP=1 "$@"
}

# The store URL of each store started (no password: PostgreSQL's is in
# $PGPASSFILE).
declare -A url
start_servers() {
  local s
  for s in $stores; do
    case "$s" in
    sqlite) url[sqlite]="sqlite://$tmp/sqlite/lease.db"; mkdir -p "$tmp/sqlite" ;;
    postgres)
      timeout 120 "$root/scripts/pg-server.sh" start "$tmp/pg" "$pg_port"
      # The password goes through a password file, not a command line.
      printf '127.0.0.1:%s:lease:lease:%s\n' "$pg_port" "$(cat "$tmp/pg/password")" >"$tmp/pgpass"
      chmod 0600 "$tmp/pgpass"
      export PGPASSFILE=$tmp/pgpass
      url[postgres]="postgres://lease@127.0.0.1:$pg_port/lease"
      lease_psql -f "$peers/pg_schema.sql"
      ;;
    redis)
      # No AOF rewrite during the run: it would reset the size measured.
      timeout 60 "$root/scripts/redis-server.sh" start "$tmp/redis" "$redis_port" \
        --auto-aof-rewrite-percentage 0
      url[redis]="redis://127.0.0.1:$redis_port"
      ;;
    etcd)
      timeout 60 "$root/scripts/etcd-server.sh" start "$tmp/etcd" e1 "$etcd_port" "$etcd_peer"
      url[etcd]="etcd://127.0.0.1:$etcd_port"
      ;;
    esac
  done
}

# The value of NAME=VALUE in a line like bench_cycle's.
field() {
  sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" | head -n 1
}

# Redis INFO field, e.g. redis_info aof_current_size.
redis_info() {
  timeout 10 redis-cli -h 127.0.0.1 -p "$redis_port" info "$2" | tr -d '\r' |
    sed -n "s/^$1:\([0-9.]*\)$/\1/p"
}

# The server's CPU so far, user + system, in seconds.
redis_cpu() {
  awk -v s="$(redis_info used_cpu_sys cpu)" -v u="$(redis_info used_cpu_user cpu)" \
    'BEGIN { printf "%.6f", s + u }'
}

# per_cycle BEFORE AFTER CYCLES SCALE: (AFTER - BEFORE) * SCALE / CYCLES.
per_cycle() {
  awk -v a="$1" -v b="$2" -v n="$3" -v k="$4" 'BEGIN { printf "%.0f", (b - a) * k / n }'
}

# Run CMD... against Redis and record, besides its figure, the AOF bytes
# and the server's CPU (user + system, µs) per cycle. Prints the command's
# output line.
redis_measured() {
  local tag=$1 c=$2 out aof0 aof1 cpu0 cpu1 n
  shift 2
  aof0=$(redis_info aof_current_size persistence)
  cpu0=$(redis_cpu)
  out=$("$@")
  aof1=$(redis_info aof_current_size persistence)
  cpu1=$(redis_cpu)
  n=$(field cycles <<<"$out")
  if [ -n "$n" ] && [ "$n" -gt 0 ]; then
    echo "redis $c $tag.aof $(per_cycle "$aof0" "$aof1" "$n" 1) $round" >>"$results"
    echo "redis $c $tag.cpu $(per_cycle "$cpu0" "$cpu1" "$n" 1e6) $round" >>"$results"
  fi
  echo "$out"
}

# One run of each measure of one store at C clients; each appends
# "STORE C TOOL CYCLES_PER_S ROUND" to $results. Every run is bounded.
run_ours() {
  run_driver "$1" "$2" lease "$driver"
  if [ -n "$baseline" ]; then run_driver "$1" "$2" baseline "$baseline_driver"; fi
}

# run_driver STORE C TAG BENCH_CYCLE: one run of a build's bench_cycle.
#
# On PostgreSQL each build runs on a lease table of its own, made by its
# store as users get it (pgbench keeps the reference table): a table made
# by this version has acquired_at, so its history is written when grants
# end (docs/stores.md), and one version's grants must not meet another's.
run_driver() {
  local s=$1 c=$2 tag=$3 bin=$4 out store=${url[$1]}
  [ "$s" = postgres ] && store="$store?lease_table=cycle_$tag"
  local cmd=(timeout $((seconds + 60)) "$bin" --store "$store" --clients "$c" --seconds "$seconds"
    --prefix "$cycle_prefix")
  if [ "$s" = redis ]; then
    out=$(redis_measured "$tag" "$c" "${cmd[@]}")
  else
    out=$("${cmd[@]}")
  fi
  echo "$s $c $tag $(field cycles_per_s <<<"$out") $round" >>"$results"
}

run_pgbench() {
  local c=$1 out tps
  out=$(timeout $((seconds + 60)) pgbench -h 127.0.0.1 -p "$pg_port" -U lease -n -M prepared \
    -D ttl=30s -f "$peers/pg_cycle.sql" -c "$c" -j "$c" -T "$seconds" lease 2>&1) ||
    { echo "$out" >&2; die "pgbench failed"; }
  # One run of the script is one cycle (two autocommit statements).
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -n 1)
  echo "postgres $c pgbench ${tps%.*} $round" >>"$results"
}

run_redis_py() {
  local c=$1 out
  out=$(redis_measured redis-py "$c" timeout $((seconds + 60)) "$py" "$peers/redis_py_lock.py" \
    --port "$redis_port" --clients "$c" --seconds "$seconds" --prefix "rp$RANDOM")
  echo "redis $c redis-py $(field cycles_per_s <<<"$out") $round" >>"$results"
}

# redis-benchmark runs a number of requests, not a time: give it more than
# it can do and stop it with SIGINT after S seconds. The cycles are the
# server's count of EVAL calls over those S seconds (every call is a whole
# cycle: the script is atomic, so its SET NX always finds the key free).
# Prints a line like bench_cycle's.
redis_benchmark_cycles() {
  local c=$1 n0 n1
  n0=$(eval_calls)
  timeout -s INT "$seconds" redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$c" -n 1000000000 \
    -r 1000 -q eval "$(cat "$peers/redis_cycle.lua")" 1 "rb/k__rand_int__" tok 30000 \
    >"$tmp/rb.out" 2>&1 || true
  n1=$(eval_calls)
  [ "$n1" -gt "$n0" ] || { cat "$tmp/rb.out" >&2; die "redis-benchmark ran no EVAL"; }
  echo "cycles_per_s=$(((n1 - n0) / seconds)) cycles=$((n1 - n0))"
}

# EVAL calls the server has answered so far.
eval_calls() {
  local n
  n=$(timeout 10 redis-cli -h 127.0.0.1 -p "$redis_port" info commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_eval:calls=\([0-9]*\),.*/\1/p')
  echo "${n:-0}"
}

run_redis_benchmark() {
  local c=$1 out
  out=$(redis_measured redis-benchmark "$c" redis_benchmark_cycles "$c")
  echo "redis $c redis-benchmark $(field cycles_per_s <<<"$out") $round" >>"$results"
}

run_etcd3() {
  local c=$1 out
  out=$(timeout $((seconds + 60)) "$py" "$peers/etcd3_lock.py" --port "$etcd_port" \
    --clients "$c" --seconds "$seconds" --prefix "pe$RANDOM")
  echo "etcd $c python-etcd3 $(field cycles_per_s <<<"$out") $round" >>"$results"
}

run_peers() {
  case "$1" in
  postgres) run_pgbench "$2" ;;
  redis) run_redis_py "$2"; run_redis_benchmark "$2" ;;
  etcd) run_etcd3 "$2" ;;
  esac
}

# One key prefix for every bench_cycle run, and a warm-up run of each tool
# whose figures are not kept: pgbench's keys stay in the reference table
# from one run to the next, so ours must too. With a fresh prefix a run's
# first cycle on each of its 1,000 keys would create the key's row (and
# its counter and history) while pgbench only updates its rows: a quarter
# of the cycles of a 5 s run at 8 clients, counted against us.
cycle_prefix="cmp$$"
warm_up() {
  local s c=${clients_list##* } kept=$results seconds_kept=$seconds
  results=$tmp/warm-up
  seconds=2
  round=0
  for s in $stores; do
    log "warm-up: $s, $c client(s)"
    run_ours "$s" "$c"
    run_peers "$s" "$c"
  done
  results=$kept
  seconds=$seconds_kept
}

# The rounds: in each, every store and client count once, ours and the
# peers back to back, so that a slow spell of the machine falls on both;
# the order flips every round, so that neither always runs first.
run_rounds() {
  local s c
  warm_up
  for ((round = 1; round <= rounds; round++)); do
    for c in $clients_list; do
      for s in $stores; do
        log "round $round/$rounds: $s, $c client(s)"
        if ((round % 2)); then
          run_ours "$s" "$c"
          run_peers "$s" "$c"
        else
          run_peers "$s" "$c"
          run_ours "$s" "$c"
        fi
      done
    done
  done
}

# Median of the values recorded for STORE C TOOL (empty if none).
median() {
  awk -v s="$1" -v c="$2" -v t="$3" '$1 == s && $2 == c && $3 == t && $4 != "" { print $4 }' "$results" |
    sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# Median over the rounds of lease / TOOL, each round's two runs side by
# side: a slow spell of the shared machine falls on both runs of a round,
# so this ratio is steadier than the ratio of the medians.
ratio_median() {
  awk -v s="$1" -v c="$2" -v t="$3" '
    $1 == s && $2 == c && $3 == "lease" { l[$5] = $4 }
    $1 == s && $2 == c && $3 == t { p[$5] = $4 }
    END { for (r in l) if ((r in p) && p[r] > 0) printf "%.4f\n", l[r] / p[r] }' "$results" |
    sort -n | awk '{ v[NR] = $1 }
      END {
        if (!NR) { printf "–"; exit }
        printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      }'
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else printf "–" }'
}

print_tables() {
  local s c lease peer y name
  echo "| store, clients | lease cycles/s | yardstick | yardstick cycles/s | ratio |"
  echo "|---|---|---|---|---|"
  for s in $stores; do
    for c in $clients_list; do
      lease=$(median "$s" "$c" lease)
      case "$s" in
      sqlite) name=SQLite; y="" ;;
      postgres) name=PostgreSQL; y="pgbench" ;;
      redis) name=Redis; y="redis-py redis-benchmark" ;;
      etcd) name=etcd; y="python-etcd3" ;;
      esac
      [ -z "$baseline" ] || y="baseline $y"
      if [ -z "$y" ]; then echo "| $name, $c | ${lease:-–} | – | – | – |"; continue; fi
      for peer in $y; do
        local v label=$peer
        v=$(median "$s" "$c" "$peer")
        [ "$peer" = redis-benchmark ] && label="redis-benchmark, 1 EVAL/cycle"
        [ "$peer" = pgbench ] && label="pgbench, reference SQL"
        [ "$peer" = baseline ] && label="lease, baseline build"
        echo "| $name, $c | ${lease:-–} | $label | ${v:-–} | $(ratio_median "$s" "$c" "$peer") |"
      done
    done
  done
  case " $stores " in *" redis "*) ;; *) return 0 ;; esac
  echo
  echo "| Redis, clients | AOF bytes/cycle: lease | redis-py | redis-benchmark | lease / redis-py |" \
    "server CPU µs/cycle: lease | redis-py | redis-benchmark | lease / redis-py |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for c in $clients_list; do
    local la pa ba lc pc bc
    la=$(median redis "$c" lease.aof); pa=$(median redis "$c" redis-py.aof)
    ba=$(median redis "$c" redis-benchmark.aof)
    lc=$(median redis "$c" lease.cpu); pc=$(median redis "$c" redis-py.cpu)
    bc=$(median redis "$c" redis-benchmark.cpu)
    echo "| $c | ${la:-–} | ${pa:-–} | ${ba:-–} | $(ratio "$la" "$pa") |" \
      "${lc:-–} | ${pc:-–} | ${bc:-–} | $(ratio "$lc" "$pc") |"
  done
}

main() {
  parse_args "$@"
  install_deps
  tmp=$(mktemp -d /tmp/lease-compare.XXXXXX)
  # The PostgreSQL server runs as its own user and must reach its directory.
  chmod 0755 "$tmp"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  results=$tmp/results
  : >"$results"
  find_driver
  start_servers
  run_rounds
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "$rounds rounds of $seconds s; medians (ratio: of the rounds' ratios); bench_cycle from $build" \
    "${baseline:+(baseline: $baseline)}"
  print_tables
  if [ -n "${COMPARE_RAW:-}" ]; then cp "$results" "$COMPARE_RAW"; fi
}

main "$@"
