#!/usr/bin/env bash
# Acquire + release cycles per second of the Python binding (python/lease),
# side by side in one run with the C library and with redis-py, on the
# same stores:
#
#   redis   the binding (bench/peers/lease_py.py: Store.acquire +
#           Store.release), the C library (bench/bench_cycle: lease_acquire
#           + lease_release) and redis-py doing the same two operations raw
#           (bench/peers/redis_py_raw.py: SET NX PX, then a compare-and-
#           delete script), all against one Redis server
#   sqlite  the binding and bench_cycle on one SQLite file
#
# Every tool runs C processes, each with its own connection and owner,
# over keys (c * 1000 / C + i) % 1000, ttl 30 s, for S seconds; the runs
# are interleaved round by round (the order flipping every round, after a
# warm-up run of each whose figures are not kept), and the script prints
# a markdown table of the medians and of the median of the rounds' ratios
# binding / C and binding / redis-py.
#
#   bench/python.sh [--seconds S] [--rounds R] [--clients "1 4"]
#                   [--stores "sqlite redis"] [--redis URL] [BUILD_DIR]
#
# BUILD_DIR (default: build) holds bench/bench_cycle and lib/liblease.so.0,
# which the binding loads too (LEASE_LIBRARY): both sides run one library.
# The binding is the source tree's python/lease. Without --redis a Redis
# server (appendonly yes, appendfsync always, as the store needs) is started
# on a free loopback port in a temporary directory and stopped on exit;
# --redis redis://HOST:PORT[/DB][?password_file=PATH] uses a running one
# (no password in the URL: it would be on the command lines). Debian's
# python3 with python3-redis runs the Python sides; missing Debian packages
# are installed (as root). PYBENCH_RAW=FILE keeps every run's figure
# ("STORE C TOOL CYCLES_PER_S ROUND"). Figures only: compare the columns
# of one run.
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "$0")/.." && pwd)
peers=$root/bench/peers
seconds=5
rounds=3
clients_list="1"
stores="sqlite redis"
redis_url=""
build=$root/build
# Debian's interpreter, where python3-redis lives (a python3 earlier on
# PATH, e.g. pyenv's, would not see it).
py=/usr/bin/python3
# No __pycache__ left in the source tree by python/lease or bench/peers.
export PYTHONDONTWRITEBYTECODE=1

. "$(dirname "$0")/lib.sh"

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --clients) clients_list=${2:?}; shift 2 ;;
    --stores) stores=${2:?}; shift 2 ;;
    --redis) redis_url=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) build=$1; shift ;;
    esac
  done
  in_range "$seconds" 1 600 || die "--seconds must be 1..600"
  in_range "$rounds" 1 50 || die "--rounds must be 1..50"
  local s c
  for s in $stores; do
    case "$s" in sqlite|redis) ;; *) die "unknown store '$s' (sqlite, redis)" ;; esac
  done
  for c in $clients_list; do
    in_range "$c" 1 64 || die "clients must be 1..64, not '$c'"
  done
  if [ -n "$redis_url" ]; then
    [[ $redis_url =~ ^redis://[^/?#]+ ]] || die "--redis: a redis://HOST:PORT URL"
    # user:password@ (the user alone is fine): a password would be on the
    # command line of bench_cycle, and in this script's.
    [[ $redis_url =~ ^redis://[^/?#@]*:[^/?#@]*@ ]] &&
      die "--redis: no password in the URL; use ?password_file=PATH"
  fi
  return 0
}

# As scripts/deps.sh does: ask apt only when something is missing.
install_deps() {
  local p missing=()
  local packages=(python3 python3-redis)
  [ -n "$redis_url" ] || packages+=(redis-server redis-tools)
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

find_build() {
  build=$(cd "$build" 2>/dev/null && pwd) || die "no build directory '$build'"
  driver=$build/bench/bench_cycle
  library=$build/lib/liblease.so.0
  [ -x "$driver" ] || die "no $driver: build the target bench_cycle (cmake --build $build --target bench_cycle)"
  [ -e "$library" ] || die "no $library: build the project first"
}

cleanup() {
  local rc=$?
  if [ -d "$tmp/redis" ]; then "$root/scripts/redis-server.sh" stop "$tmp/redis" || true; fi
  rm -rf "$tmp"
  exit "$rc"
}

declare -A url
start_servers() {
  local s
  for s in $stores; do
    case "$s" in
    sqlite) mkdir -p "$tmp/sqlite"; url[sqlite]="sqlite://$tmp/sqlite/lease.db" ;;
    redis)
      if [ -n "$redis_url" ]; then
        url[redis]=$redis_url
      else
        . "$root/scripts/ports.sh"
        pick_port
        timeout 60 "$root/scripts/redis-server.sh" start "$tmp/redis" "$PORT"
        url[redis]="redis://127.0.0.1:$PORT"
      fi
      ;;
    esac
  done
}

# The value of NAME=VALUE in a line like bench_cycle's.
field() {
  sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" | head -n 1
}

# run STORE C TOOL: one run, appending "STORE C TOOL CYCLES_PER_S ROUND" to
# $results. The binding and bench_cycle share a key prefix per store, so
# that both find the same keys already made; redis-py's keys are its own.
# The Python sides read the URL from LEASE_STORE.
run() {
  local s=$1 c=$2 tool=$3 out cmd
  case "$tool" in
  c) cmd=("$driver" --store "${url[$s]}" --prefix "$prefix/$s") ;;
  python) cmd=("$py" "$peers/lease_py.py" --prefix "$prefix/$s") ;;
  redis-py) cmd=("$py" "$peers/redis_py_raw.py" --prefix "$prefix/rp") ;;
  esac
  out=$(LEASE_STORE=${url[$s]} LEASE_LIBRARY=$library PYTHONPATH=$root/python \
    timeout $((seconds + 60)) "${cmd[@]}" --clients "$c" --seconds "$seconds") ||
    die "$tool on $s at $c client(s) failed"
  echo "$s $c $tool $(field cycles_per_s <<<"$out") $round" >>"$results"
}

tools_of() {
  case "$1" in
  redis) echo "python c redis-py" ;;
  *) echo "python c" ;;
  esac
}

# run_all STORE C: each tool once, in this round's order.
run_all() {
  local t tools
  tools=$(tools_of "$1")
  ((round % 2)) || tools=$(tr ' ' '\n' <<<"$tools" | tac | tr '\n' ' ')
  for t in $tools; do run "$1" "$2" "$t"; done
}

run_rounds() {
  local s c kept=$results seconds_kept=$seconds
  # Warm-up, not kept: the first cycle on each key makes its row.
  results=$tmp/warm-up seconds=2 round=1
  for s in $stores; do
    log "warm-up: $s"
    run_all "$s" "${clients_list##* }"
  done
  results=$kept seconds=$seconds_kept
  for ((round = 1; round <= rounds; round++)); do
    for c in $clients_list; do
      for s in $stores; do
        log "round $round/$rounds: $s, $c client(s)"
        run_all "$s" "$c"
      done
    done
  done
}

median() {
  awk -v s="$1" -v c="$2" -v t="$3" '$1 == s && $2 == c && $3 == t && $4 != "" { print $4 }' "$results" |
    sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# Median over the rounds of python / TOOL, the two runs of a round side
# by side (a slow spell of the shared machine falls on both).
ratio_median() {
  awk -v s="$1" -v c="$2" -v t="$3" '
    $1 == s && $2 == c && $3 == "python" { l[$5] = $4 }
    $1 == s && $2 == c && $3 == t { p[$5] = $4 }
    END { for (r in l) if ((r in p) && p[r] > 0) printf "%.4f\n", l[r] / p[r] }' "$results" |
    sort -n | awk '{ v[NR] = $1 }
      END {
        if (!NR) { printf "–"; exit }
        printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      }'
}

print_table() {
  local s c name rp ratio_rp
  echo "| store, clients | Python binding cycles/s | C (bench_cycle) cycles/s | redis-py raw cycles/s | binding / C | binding / redis-py |"
  echo "|---|---|---|---|---|---|"
  for s in $stores; do
    for c in $clients_list; do
      case "$s" in sqlite) name=SQLite ;; redis) name=Redis ;; esac
      rp="–" ratio_rp="–"
      if [ "$s" = redis ]; then
        rp=$(median "$s" "$c" redis-py)
        ratio_rp=$(ratio_median "$s" "$c" redis-py)
      fi
      echo "| $name, $c | $(median "$s" "$c" python) | $(median "$s" "$c" c) | ${rp:-–} |" \
        "$(ratio_median "$s" "$c" c) | $ratio_rp |"
    done
  done
}

versions() {
  local v
  v="python3 $("$py" -c 'import platform; print(platform.python_version())')"
  v="$v, liblease $(LEASE_LIBRARY=$library PYTHONPATH=$root/python "$py" -c \
    'import lease; print(lease.library_version())')"
  case " $stores " in *" redis "*)
    v="$v, redis-py $("$py" -c 'import redis; print(redis.__version__)')"
    [ -n "$redis_url" ] || v="$v, $(redis-server --version | grep -o 'v=[0-9.]*' | sed 's/v=/Redis /')"
    ;;
  esac
  echo "$v"
}

main() {
  parse_args "$@"
  install_deps
  find_build
  tmp=$(mktemp -d /tmp/lease-python-bench.XXXXXX)
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  results=$tmp/results
  : >"$results"
  prefix="pybench$$"
  start_servers
  run_rounds
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "$rounds rounds of $seconds s; medians (ratios: of the rounds' ratios); $(versions);" \
    "bench_cycle and liblease from $build"
  print_table
  if [ -n "${PYBENCH_RAW:-}" ]; then cp "$results" "$PYBENCH_RAW"; fi
}

main "$@"
