#!/usr/bin/env bash
# Staging from HDFS (issue 29; docs/BENCHMARKS.md "Staging from HDFS"):
# Hive files on a private HDFS (Hadoop's MiniDFSCluster, one DataNode)
# staged by the Replica pipeline (4 fetch threads, HDFS checksum and
# sha256, fdatasync, commit) against `rclone copy` (Debian's rclone, HDFS
# backend, 4 transfers) + `sync` and `hdfs dfs -get -t 4` (Hadoop's
# FsShell, JVM start included and timed alone) + `sync` of the same files
# from the same cluster, repetitions interleaved
# (examples/bench_core/hdfs.rs).
#
#   scripts/bench/hdfs.sh          4 × 256 MiB and 10,000 × 4 KiB, 3 reps
#   QUICK=1 scripts/bench/hdfs.sh  small sizes, to check the script
#
# Needs the servers of scripts/setup-servers.sh (the HDFS launcher, Java,
# rclone). Environment (defaults in brackets): BENCH_WORK
# [/var/tmp/stagefs-bench-hdfs] REPS [3] SMALL [10000] SMALL_BYTES [4096]
# LARGE [4] LARGE_MIB [256]. Prints a Markdown table and keeps it with the
# raw output in $BENCH_WORK/results-<time>/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ ${QUICK:-0} == 1 ]]; then
    REPS=${REPS:-1} SMALL=${SMALL:-500} LARGE=${LARGE:-2} LARGE_MIB=${LARGE_MIB:-32}
fi
BENCH_WORK=${BENCH_WORK:-/var/tmp/stagefs-bench-hdfs}
REPS=${REPS:-3}
SMALL=${SMALL:-10000}
SMALL_BYTES=${SMALL_BYTES:-4096}
LARGE=${LARGE:-4}
LARGE_MIB=${LARGE_MIB:-256}

log() { printf '[hdfs-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# shellcheck source=scripts/bench/remote-lib.sh
. "$REPO/scripts/bench/remote-lib.sh"
remote_prepare
remote_machine "rclone: $(rclone version | head -1); java: $(java -version 2>&1 | head -1); Hadoop 3.4.2 (MiniDFSCluster)"

log "hdfs-stage"
"$REPO/target/release/examples/bench_core" hdfs-stage --small "$SMALL" --small-bytes "$SMALL_BYTES" \
    --large "$LARGE" --large-mib "$LARGE_MIB" --reps "$REPS" --work "$BENCH_WORK" | tee "$OUT/stage.txt"
remote_summary "stagefs staging from HDFS"
