#!/usr/bin/env bash
# Staging from S3 (issue 29; docs/BENCHMARKS.md "Staging from S3"): Hive
# files on a private SeaweedFS staged by the Replica pipeline (4 fetch
# threads, ETag checked, sha256, fdatasync, commit) against `rclone copy`
# (Debian's rclone, 4 transfers, MD5 checked against the ETag) + `sync`
# of the same objects from the same server, repetitions interleaved
# (examples/bench_core/s3.rs); then event → visible at 100 events/s with
# the files on S3 beside the same with the files in a local folder, the
# runs alternated (`bench_core s3-lag`).
#
#   scripts/bench/s3.sh              4 × 256 MiB and 10,000 × 4 KiB, 3 reps; lag
#   BENCHES=lag scripts/bench/s3.sh  the lag part only
#   QUICK=1 scripts/bench/s3.sh      small sizes, to check the script
#
# Needs the servers of scripts/setup-servers.sh (SeaweedFS, rclone).
# Environment (defaults in brackets): BENCH_WORK [/var/tmp/stagefs-bench-s3]
# REPS [3] SMALL [10000] SMALL_BYTES [4096] LARGE [4] LARGE_MIB [256]
# BENCHES ["stage lag"] LAG_RATE [100] LAG_SECONDS [20] LAG_REPS [2].
# Prints a Markdown table and keeps it with the raw output in
# $BENCH_WORK/results-<time>/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ ${QUICK:-0} == 1 ]]; then
    REPS=${REPS:-1} SMALL=${SMALL:-500} LARGE=${LARGE:-2} LARGE_MIB=${LARGE_MIB:-32}
    LAG_SECONDS=${LAG_SECONDS:-3} LAG_REPS=${LAG_REPS:-1}
fi
BENCHES=${BENCHES:-stage lag}
LAG_RATE=${LAG_RATE:-100}
LAG_SECONDS=${LAG_SECONDS:-20}
LAG_REPS=${LAG_REPS:-2}
BENCH_WORK=${BENCH_WORK:-/var/tmp/stagefs-bench-s3}
REPS=${REPS:-3}
SMALL=${SMALL:-10000}
SMALL_BYTES=${SMALL_BYTES:-4096}
LARGE=${LARGE:-4}
LARGE_MIB=${LARGE_MIB:-256}

log() { printf '[s3-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# shellcheck source=scripts/bench/remote-lib.sh
. "$REPO/scripts/bench/remote-lib.sh"
remote_prepare
remote_machine "rclone: $(rclone version | head -1); SeaweedFS: $(~/.cache/stagefs-servers/bin/weed version 2>/dev/null | head -1)"

: >"$OUT/stage.txt"
if [[ " $BENCHES " == *" stage "* ]]; then
    log "s3-stage"
    "$REPO/target/release/examples/bench_core" s3-stage --small "$SMALL" --small-bytes "$SMALL_BYTES" \
        --large "$LARGE" --large-mib "$LARGE_MIB" --reps "$REPS" --work "$BENCH_WORK" | tee "$OUT/stage.txt"
fi
if [[ " $BENCHES " == *" lag "* ]]; then
    log "s3-lag"
    "$REPO/target/release/examples/bench_core" s3-lag --rate "$LAG_RATE" --seconds "$LAG_SECONDS" \
        --reps "$LAG_REPS" --work "$BENCH_WORK" | tee -a "$OUT/stage.txt"
fi
remote_summary "stagefs staging from S3 and lag with files on S3"
