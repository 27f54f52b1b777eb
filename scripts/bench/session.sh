#!/usr/bin/env bash
# Small files and metadata through a `stagefs run` session (issue 34):
# 2,000 × 4 KiB files in one partitioned table (bench/small, 100 files per
# partition), opened by absolute path from the mount root, against the
# same files on the source disk. Method and figures: docs/BENCHMARKS.md
# ("Sessions: small files and metadata").
#
#   scripts/bench/session.sh      (root: FUSE mounts, drop_caches, unshare)
#
# Rows, each the median of REPS with the range:
#   warm   open+read of every file, a second time in the same process
#          (bench_mount readfiles), files/s
#   cold   os.walk + lstat of the table after `drop_caches=2` (dentries and
#          inodes, so the kernel forgets every FUSE name), seconds
# Readers: native (the source tree), plain (a process outside any
# session), session (`stagefs run`), private (`stagefs run
# --private-mount`: a FUSE connection of the session's own, the same path
# whatever the host daemon's mode); each on the default mount and on a
# no-open mount (STAGEFS_NO_OPEN=1).
#
# Environment: BENCH_DIR [/var/tmp/stagefs-bench-session]  REPS [5]
#              SMALL [2000]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH_DIR=${BENCH_DIR:-/var/tmp/stagefs-bench-session}
REPS=${REPS:-5}
SMALL=${SMALL:-2000}
DATA=$BENCH_DIR/data-$SMALL
MNT=$BENCH_DIR/mnt
OUT=$BENCH_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)
STAGEFS=$REPO/target/release/stagefs
HELPER=$REPO/target/release/examples/bench_mount

log() { printf '[session %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
load1() { cut -d' ' -f1 /proc/loadavg; }
[[ $(id -u) == 0 ]] || die "run as root"

PIDS=()
cleanup() {
    local rc=$?
    set +e
    for m in "$MNT"/*; do
        mountpoint -q "$m" 2>/dev/null && { umount "$m" 2>/dev/null || umount -l "$m"; }
    done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$MNT" "$OUT"
(cd "$REPO" && cargo build --release -q --bin stagefs --example bench_mount)

wait_mounted() {
    for _ in $(seq 300); do
        mountpoint -q "$1" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
visible() { getfattr --only-values -n user.stagefs.visible "$1" 2>/dev/null || echo 0; }
start() { # name state [env...]
    local name=$1 state=$2
    shift 2
    mkdir -p "$MNT/$name"
    env "$@" "$STAGEFS" mount "$MNT/$name" --state "$state" --source-root "$DATA/source" \
        --events "$DATA/events" >"$OUT/$name.log" 2>&1 &
    PIDS+=("$!")
    wait_mounted "$MNT/$name" "$!" || die "$name did not mount (see $OUT/$name.log)"
    for _ in $(seq 600); do
        (($(visible "$MNT/$name") >= LAST_ID)) && return 0
        sleep 0.2
    done
    die "$name does not show state $LAST_ID"
}

if [[ ! -f $DATA/.generated ]]; then
    rm -rf "$DATA"
    mkdir -p "$DATA"
    "$HELPER" gen "$DATA" --big-mib 1 --small "$SMALL" --small-bytes 4096 --meta 1000 >"$DATA/last_id"
    touch "$DATA/.generated"
fi
LAST_ID=$(cat "$DATA/last_id")
start default "$DATA/state"
if [[ ! -d $DATA/state-noopen ]]; then
    mkdir -p "$DATA/state-noopen"
    cp -al "$DATA/state/blobs" "$DATA/state-noopen/blobs"
    cp -a "$DATA/state/journal" "$DATA/state-noopen/"
    for f in commits.log commit.json pins.json; do
        if [[ -f $DATA/state/$f ]]; then cp -a "$DATA/state/$f" "$DATA/state-noopen/"; fi
    done
fi
start noopen "$DATA/state-noopen" STAGEFS_NO_OPEN=1
LIST=$DATA/lists/small.txt
grep -c . "$LIST" >/dev/null || die "no file list"

# One measurement as READER on ROOT: prints "warm_files_per_s cold_s".
WALK='import os,sys,time
t=time.perf_counter(); n=0
for d,ds,fs in os.walk(sys.argv[1]):
    for f in fs: os.lstat(os.path.join(d,f)); n+=1
print("%.6f"%(time.perf_counter()-t))'
measure() { # reader root
    local reader=$1 root=$2 wrap=()
    case $reader in
    session) wrap=("$STAGEFS" run "$root" --) ;;
    private) wrap=("$STAGEFS" run --private-mount "$root" --) ;;
    esac
    local warm cold
    "${wrap[@]}" "$HELPER" readfiles "$root" "$LIST" >/dev/null
    warm=$("${wrap[@]}" sh -c '"$1" readfiles "$2" "$3" >/dev/null; "$1" readfiles "$2" "$3"' _ "$HELPER" "$root" "$LIST" | cut -d' ' -f1)
    sync
    echo 2 >/proc/sys/vm/drop_caches
    cold=$("${wrap[@]}" python3 -c "$WALK" "$root/bench/small")
    awk -v w="$warm" -v n="$SMALL" -v c="$cold" 'BEGIN{printf "%.0f %s\n", n/w, c}'
}

LOAD0=$(load1)
log "load before: $LOAD0; $REPS repetitions"
: >"$OUT/raw.txt"
for r in $(seq "$REPS"); do
    for cfg in "native native $DATA/source" \
        "plain default $MNT/default" "session default $MNT/default" "private default $MNT/default" \
        "plain noopen $MNT/noopen" "session noopen $MNT/noopen" "private noopen $MNT/noopen"; do
        read -r reader mount root <<<"$cfg"
        echo "$r $reader $mount $(measure "$reader" "$root")" >>"$OUT/raw.txt"
    done
done
LOAD1=$(load1)
# Median and range per reader: files/s (warm), s (cold), ratios to native.
awk -v l0="$LOAD0" -v l1="$LOAD1" '
function med(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ k = $2 "/" $3; n[k]++; w[k, n[k]] = $4; c[k, n[k]] = $5; if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
END {
    printf "load %s -> %s\n", l0, l1
    for (i = 1; i <= m; i++) {
        k = order[i]
        for (j = 1; j <= n[k]; j++) { ww[j] = w[k, j]; cc[j] = c[k, j] }
        mw[k] = med(ww, n[k]); mc[k] = med(cc, n[k])
        lw[k] = ww[1]; hw[k] = ww[n[k]]; lc[k] = cc[1]; hc[k] = cc[n[k]]
    }
    nw = mw["native/native"]; nc = mc["native/native"]
    printf "%-16s %22s %8s %26s %8s\n", "reader", "warm files/s (range)", "ratio", "cold walk s (range)", "ratio"
    for (i = 1; i <= m; i++) {
        k = order[i]
        printf "%-16s %8d (%d-%d) %8.2f %10.4f (%.4f-%.4f) %8.2f\n", k, mw[k], lw[k], hw[k], mw[k] / nw, mc[k], lc[k], hc[k], nc / mc[k]
    }
}' "$OUT/raw.txt" | tee "$OUT/summary.txt"
