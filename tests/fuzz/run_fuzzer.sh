#!/bin/sh
# run_fuzzer.sh BINARY SEEDS WORKDIR SECONDS [libFuzzer flags...]
# Fuzz BINARY for SECONDS, starting from the seed corpus SEEDS (read only:
# every file in it is run first, so a reproducer kept there is a regression
# test). New inputs go to WORKDIR/corpus, a crashing input to
# WORKDIR/artifacts, both emptied first so every run starts from the seeds.
# Exit status: libFuzzer's, non-zero on any crash, leak or broken property.
set -eu
bin=$1 seeds=$2 work=$3 secs=$4
shift 4
[ -d "$seeds" ] || { echo "run_fuzzer.sh: no seed corpus at $seeds" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
set +e
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" "$seeds"
rc=$?
set -e
for f in "$work"/artifacts/*; do
  [ -f "$f" ] || continue
  echo "== finding $f ($(wc -c <"$f") bytes), as hex:"
  od -An -tx1 -v "$f" | tr -d ' \n' | head -c 4096
  echo
done
exit $rc
