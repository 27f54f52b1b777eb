#!/usr/bin/env bash
# Staging from S3 (issue 29; docs/BENCHMARKS.md "Staging from S3"): Hive
# files on a private SeaweedFS staged by the Replica pipeline (4 fetch
# threads, ETag checked, sha256, fdatasync, commit) against `rclone copy`
# (Debian's rclone, 4 transfers, MD5 checked against the ETag) + `sync`
# of the same objects from the same server, repetitions interleaved
# (examples/bench_core/s3.rs).
#
#   scripts/bench/s3.sh            4 × 256 MiB and 10,000 × 4 KiB, 3 reps
#   QUICK=1 scripts/bench/s3.sh    small sizes, to check the script
#
# Needs the servers of scripts/setup-servers.sh (SeaweedFS, rclone).
# Environment (defaults in brackets): BENCH_WORK [/var/tmp/stagefs-bench-s3]
# REPS [3] SMALL [10000] SMALL_BYTES [4096] LARGE [4] LARGE_MIB [256].
# Prints a Markdown table and keeps it with the raw output in
# $BENCH_WORK/results-<time>/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ ${QUICK:-0} == 1 ]]; then
    REPS=${REPS:-1} SMALL=${SMALL:-500} LARGE=${LARGE:-2} LARGE_MIB=${LARGE_MIB:-32}
fi
BENCH_WORK=${BENCH_WORK:-/var/tmp/stagefs-bench-s3}
REPS=${REPS:-3}
SMALL=${SMALL:-10000}
SMALL_BYTES=${SMALL_BYTES:-4096}
LARGE=${LARGE:-4}
LARGE_MIB=${LARGE_MIB:-256}

log() { printf '[s3-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

"$REPO/scripts/setup-servers.sh" >&2
OUT=$BENCH_WORK/results-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
log "building (release)"
(cd "$REPO" && cargo build --release --quiet --example bench_core)

{
    echo "machine: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
    echo "scratch: $(findmnt -no FSTYPE,SOURCE -T "$BENCH_WORK") ($BENCH_WORK)"
    echo "rclone: $(rclone version | head -1); SeaweedFS: $(~/.cache/stagefs-servers/bin/weed version 2>/dev/null | head -1)"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  git: $(cd "$REPO" && git rev-parse --short HEAD)  load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"

log "s3-stage"
"$REPO/target/release/examples/bench_core" s3-stage --small "$SMALL" --small-bytes "$SMALL_BYTES" \
    --large "$LARGE" --large-mib "$LARGE_MIB" --reps "$REPS" --work "$BENCH_WORK" | tee "$OUT/stage.txt"

{
    echo "# stagefs staging from S3, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    sed 's/^/    /' "$OUT/machine.txt"
    echo
    echo "| Benchmark | Figure | Target | Met |"
    echo "|---|---|---|---|"
    grep -h '^ROW|' "$OUT/stage.txt" | sed 's/^ROW|//' | awk -F'|' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }'
    echo
    grep -h '^NOTE|' "$OUT/stage.txt" | sed 's/^NOTE|/- /'
} | tee "$OUT/summary.md"
