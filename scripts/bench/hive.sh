#!/usr/bin/env bash
# Hive source benchmarks of issue 11 (docs/BENCHMARKS.md, "Hive source
# (issue 11)"), all release builds, in one run:
#   1. gzip(json-2.0) INSERT rows decoded + validated + journaled per second
#      (bench_core hive-ingest: a real Replica on --hive-events rows);
#   2. metastore commit -> visible through the mount, p50/p99 at LAG_RATE
#      events/s with the default poll interval, on a PostgreSQL and a MariaDB
#      server this run starts itself (examples/bench_hive_lag.rs, which uses
#      tests/common/dbserver.rs: own data directory and port, torn down after);
#   3. Hive staging (sha256 + HDFS checksum in one pass) vs `cp -r` + `sync` of
#      the same files, many small and a few large (bench_core hive-stage).
#
#   scripts/bench/hive.sh            full run (~10 min after the build on 2 cores)
#   QUICK=1 scripts/bench/hive.sh    small sizes, to check the script (~2 min)
#
# Needs root (FUSE mount for the lag part; PostgreSQL then runs as the
# `postgres` user) and the servers of scripts/setup.sh. Environment
# (defaults in brackets):
#   BENCH_WORK [/var/tmp/stagefs-bench-hive]  scratch folder and results
#   BENCHES ["ingest lag stage"]  which parts to run
#   REPS [3]          repetitions of ingest and of each staging set
#   EVENTS [200000]   INSERT rows for ingest
#   SMALL [10000] SMALL_BYTES [4096] LARGE [4] LARGE_MIB [256]  staging sets
#   DBS ["postgres mariadb"]  LAG_RATE [100]  LAG_SECONDS [20]  LAG_REPS [3]
# Prints a summary (Markdown) and keeps it with the raw output in
# $BENCH_WORK/results-<time>/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
    REPS=${REPS:-1} EVENTS=${EVENTS:-20000} SMALL=${SMALL:-500} LARGE=${LARGE:-2}
    LARGE_MIB=${LARGE_MIB:-32} LAG_SECONDS=${LAG_SECONDS:-3} LAG_REPS=${LAG_REPS:-1}
fi
BENCH_WORK=${BENCH_WORK:-/var/tmp/stagefs-bench-hive}
BENCHES=${BENCHES:-ingest lag stage}
REPS=${REPS:-3}
EVENTS=${EVENTS:-200000}
SMALL=${SMALL:-10000}
SMALL_BYTES=${SMALL_BYTES:-4096}
LARGE=${LARGE:-4}
LARGE_MIB=${LARGE_MIB:-256}
DBS=${DBS:-postgres mariadb}
LAG_RATE=${LAG_RATE:-100}
LAG_SECONDS=${LAG_SECONDS:-20}
LAG_REPS=${LAG_REPS:-3}

log() { printf '[hive-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

[[ " $BENCHES " != *" lag "* || $(id -u) == 0 ]] || die "the lag part needs root (FUSE); run as root or BENCHES=\"ingest stage\""

# The lag part starts its own PostgreSQL and MariaDB servers: install them
# (and fuse3) on a fresh machine, as the test suite does.
if [[ " $BENCHES " == *" lag "* ]]; then
    "$REPO/scripts/setup.sh" >&2
fi

OUT=$BENCH_WORK/results-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"

log "building (release)"
(cd "$REPO" && cargo build --release --quiet --examples --bin stagefs)
CORE=$REPO/target/release/examples/bench_core
LAG=$REPO/target/release/examples/bench_hive_lag
STAGEFS=$REPO/target/release/stagefs

{
    echo "machine: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r)"
    echo "scratch: $(findmnt -no FSTYPE,SOURCE -T "$BENCH_WORK") ($BENCH_WORK)"
    echo "servers: $("$(ls -d /usr/lib/postgresql/*/bin | tail -1)/postgres" --version 2>/dev/null); $(mariadbd --version 2>/dev/null | cut -d' ' -f2-4)"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  git: $(cd "$REPO" && git rev-parse --short HEAD)$(cd "$REPO" && git diff --quiet -- src examples || echo ' (modified)')  $(rustc --version | cut -d' ' -f1-2)"
} >"$OUT/machine.txt"

T0=$SECONDS
part() { # name, then the command: runs it with the load before and after
    local name=$1
    shift
    local before
    before=$(loadavg)
    log "$name (load $before)"
    "$@" | tee -a "$OUT/$name.txt"
    echo "$before|$(loadavg)" >"$OUT/$name.load"
}

if [[ " $BENCHES " == *" ingest "* ]]; then
    part ingest "$CORE" hive-ingest --events "$EVENTS" --reps "$REPS" --work "$BENCH_WORK"
fi
if [[ " $BENCHES " == *" lag "* ]]; then
    for db in $DBS; do
        for ((r = 1; r <= LAG_REPS; r++)); do
            part "lag-$db" "$LAG" "$STAGEFS" --db "$db" --rate "$LAG_RATE" --seconds "$LAG_SECONDS"
        done
    done
fi
if [[ " $BENCHES " == *" stage "* ]]; then
    part stage "$CORE" hive-stage --small "$SMALL" --small-bytes "$SMALL_BYTES" --large "$LARGE" \
        --large-mib "$LARGE_MIB" --reps "$REPS" --work "$BENCH_WORK"
fi

# Median and range of column $2 (key=value lines) of a lag file.
lag_stat() {
    sed -E 's/.* '"$2"'=([0-9.]+).*/\1/' "$1" | sort -g |
        awk '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%.0f (%.0f–%.0f)", m, a[1], a[NR]}'
}

rows() { grep -h '^ROW|' "$@" | sed 's/^ROW|//' | awk -F'|' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }'; }
notes() { grep -h '^NOTE|' "$@" | sed 's/^NOTE|/- /'; }
load_of() { [[ -f $OUT/$1.load ]] && tr '|' '\n' <"$OUT/$1.load" | paste -sd' ' | awk '{printf "before %s %s %s, after %s %s %s", $1, $2, $3, $4, $5, $6}'; }

{
    echo "# stagefs Hive benchmarks (issue 11), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    sed 's/^/    /' "$OUT/machine.txt"
    echo
    if [[ -f $OUT/ingest.txt ]]; then
        echo "## 1. Ingest (load $(load_of ingest))"
        echo
        echo "| Benchmark | Figure | Target | Met |"
        echo "|---|---|---|---|"
        rows "$OUT/ingest.txt"
        echo
        notes "$OUT/ingest.txt"
        echo
    fi
    for db in $DBS; do
        f=$OUT/lag-$db.txt
        [[ -s $f ]] || continue
        echo "## 2. Lag, $db: $LAG_REPS runs of $LAG_SECONDS s at $LAG_RATE events/s, default poll interval (load $(load_of "lag-$db"), last run)"
        echo
        echo "| run | events seen | p50 ms | p90 ms | p99 ms | max ms | producer achieved/s |"
        echo "|---:|---:|---:|---:|---:|---:|---:|"
        awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
               printf "| %d | %s | %s | %s | %s | %s | %s |\n", NR, v["seen"], v["p50_ms"], v["p90_ms"], v["p99_ms"], v["max_ms"], v["achieved_rate"] }' "$f"
        echo
        echo "median (range) over the runs: p50 $(lag_stat "$f" p50_ms) ms, p99 $(lag_stat "$f" p99_ms) ms"
        echo
    done
    if [[ -f $OUT/stage.txt ]]; then
        echo "## 3. Staging vs cp + sync (load $(load_of stage))"
        echo
        echo "| Benchmark | Figure | Target | Met |"
        echo "|---|---|---|---|"
        rows "$OUT/stage.txt"
        echo
        notes "$OUT/stage.txt"
        echo
    fi
    echo "wall time $((SECONDS - T0)) s; raw output in $OUT"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
