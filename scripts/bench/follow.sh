#!/usr/bin/env bash
# Many hosts (docs/BENCHMARKS.md, "Many hosts"): publisher visible → reader
# host visible at 100 events/s with --poll-ms 1000 and 100, and a state of
# 1,000,000 files (1,000 partitions × 1,000): its catalog load on a reader
# host, reader memory per file against the publisher's, and the bytes a
# reader host reads for a commit that changes one partition.
#
#   scripts/bench/follow.sh                     # ~4 minutes after the build
#   SECONDS_PER_RUN=60 PARTS=1000 FILES=1000 scripts/bench/follow.sh
#   STAGEFS_BENCH_WORK=/path scripts/bench/follow.sh    # scratch (default $TMPDIR or /tmp)
#
# Prints ROW|figure|value|goal|met and NOTE lines, then the load average and
# commit to paste beside them. Needs FUSE (root, or fusermount3 as set up by
# scripts/setup.sh).
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
work="${STAGEFS_BENCH_WORK:-${TMPDIR:-/tmp}}/stagefs-bench-follow"
secs="${SECONDS_PER_RUN:-30}"
parts="${PARTS:-1000}"
files="${FILES:-1000}"

echo "building (release)..." >&2
cargo build --release --quiet --bin stagefs --example bench_follow
bin="$root/target/release/examples/bench_follow"
stagefs="$root/target/release/stagefs"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for poll in 1000 100; do
    echo "== follow latency, --poll-ms $poll" >&2
    "$bin" latency --bin "$stagefs" --work "$work/latency-$poll" --poll-ms "$poll" --seconds "$secs"
done
echo "== catalog of $parts × $files files" >&2
"$bin" catalog --bin "$stagefs" --work "$work/catalog" --parts "$parts" --files "$files"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, load $load_before -> $load_after, $(date -u '+%Y-%m-%d %H:%M UTC')"
