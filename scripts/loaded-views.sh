#!/usr/bin/env bash
# The view-rule tests on a busy host (issue: "a view rule that holds for
# real query engines and under load"): runs the real-engine, reader and
# consistency tests while LOAD_PROCS busy loops (`yes > /dev/null`, default
# 8) compete for the CPUs, RUNS times in a row, and says how each went and
# what the load average was. Each run's tests start once the 1-minute load
# average has reached LOAD_MIN (default 90 % of LOAD_PROCS).
#
#   scripts/loaded-views.sh            # 1 run, 8 loops, debug build
#   RUNS=5 scripts/loaded-views.sh     # five runs in a row
#
# Every test's whole output is kept under OUT (default a new temporary
# folder, printed at the start), so a failure can be read in full.
# Exit status: 0 when every test of every run passed.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-1}
LOAD_PROCS=${LOAD_PROCS:-8}
# The loops alone bring the 1-minute average near LOAD_PROCS after a few
# minutes (never past it); the tests add the rest (runs reach 11-17).
LOAD_MIN=${LOAD_MIN:-$((LOAD_PROCS * 9 / 10))}
TESTS=${TESTS:-"engines readers consistency"}
OUT=${OUT:-$(mktemp -d /tmp/stagefs-loaded.XXXXXX)}
mkdir -p "$OUT"
echo "loaded-views: outputs in $OUT" >&2

# The tests' own profile, built before the load starts.
cargo test --no-run --quiet $(printf -- "--test %s " $TESTS)

loops=()
stop_load() {
  for p in "${loops[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  loops=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM

sample_load() {
  while :; do
    cut -d' ' -f1 /proc/loadavg >>"$1"
    sleep 10
  done
}

failed=0
for run in $(seq 1 "$RUNS"); do
  for _ in $(seq 1 "$LOAD_PROCS"); do
    yes >/dev/null &
    loops+=($!)
  done
  # The tests start once the 1-minute load average shows the loops
  # (LOAD_MIN, default 90 % of LOAD_PROCS; at most 5 minutes).
  for i in $(seq 1 300); do
    awk -v min="$LOAD_MIN" '{ exit !($1 >= min) }' /proc/loadavg && break
    [ "$i" = 300 ] && echo "run $run: load still below $LOAD_MIN after 5 minutes" >&2
    sleep 1
  done
  loadlog=$OUT/run$run.load
  : >"$loadlog"
  sample_load "$loadlog" &
  loops+=($!)
  started=$(date -u +%H:%M:%S)
  summary=""
  for t in $TESTS; do
    log=$OUT/run$run.$t.log
    if cargo test --quiet --test "$t" -- --nocapture >"$log" 2>&1; then
      summary+=" $t:ok"
    else
      summary+=" $t:FAILED"
      failed=1
    fi
    res=$(grep -E "^test result:" "$log" | tail -1 || true)
    summary+="(${res#test result: })"
  done
  stop_load
  range=$(sort -n "$loadlog" | sed -n '1p;$p' | paste -sd- -)
  echo "run $run ($started-$(date -u +%H:%M:%S) UTC, $LOAD_PROCS loops, load $range):$summary"
  grep -hE "FAILED|panicked" "$OUT"/run"$run".*.log | head -20 || true
done
exit "$failed"
