#!/usr/bin/env bash
# Per-process views (docs/BENCHMARKS.md, "Per-process views"): the cost of
# attributing requests to readers, the memory per view, and 8 reader
# processes plus the consistency checker on a replicating mount, with views
# on and with STAGEFS_VIEWS=off, in one run.
#
#   scripts/bench/readers.sh                    # ~1 minute after the build
#   SECONDS_PER_RUN=60 PROCS=16 scripts/bench/readers.sh
#   STAGEFS_BENCH_WORK=/path scripts/bench/readers.sh   # scratch (default $TMPDIR or /tmp)
#
# Prints ROW|name|value|unit lines; paste them into docs/BENCHMARKS.md with
# the load average and commit printed at the end. Needs python3 and FUSE
# (root, or fusermount3 as set up by scripts/setup.sh).
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
work="${STAGEFS_BENCH_WORK:-${TMPDIR:-/tmp}}/stagefs-bench-readers"
secs="${SECONDS_PER_RUN:-20}"
procs="${PROCS:-8}"

echo "building (release)..." >&2
cargo build --release --quiet --bin stagefs --example bench_readers
bin="$root/target/release/examples/bench_readers"
stagefs="$root/target/release/stagefs"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== attribution" >&2
"$bin" attribution
echo "== memory" >&2
"$bin" memory --views 100000
echo "== mixed, views on" >&2
"$bin" mixed "$stagefs" "$work" --seconds "$secs" --procs "$procs"
echo "== mixed, views off" >&2
STAGEFS_VIEWS=off "$bin" mixed "$stagefs" "$work" --seconds "$secs" --procs "$procs"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, load $load_before -> $load_after, $(date -u '+%Y-%m-%d %H:%M UTC')"
