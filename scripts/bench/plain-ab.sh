#!/usr/bin/env bash
# Plain processes, before/after (issue 34 item 2; docs/BENCHMARKS.md
# "Plain processes"): native vs two stagefs binaries on hard-linked copies
# of one staged state (default mounts), with the measures of
# scripts/bench/session.sh (warm open+read of 2,000 x 4 KiB files by
# absolute path, files/s; cold os.walk + lstat after drop_caches=2, s),
# the readers interleaved native, BASE, NEW per repetition.
#
#   scripts/bench/plain-ab.sh BASE_BIN NEW_BIN      (root)
#
# Environment: BENCH_DIR [/var/tmp/stagefs-bench-plain]  REPS [7]
#              HOLD=SECONDS keeps both mounts up after the run (perf).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BASE=$1 NEW=$2
BENCH_DIR=${BENCH_DIR:-/var/tmp/stagefs-bench-plain}
REPS=${REPS:-7}
SMALL=2000
DATA=$BENCH_DIR/data-$SMALL
MNT=$BENCH_DIR/mnt
OUT=$BENCH_DIR/ab-$(date -u +%Y%m%dT%H%M%SZ)
HELPER=$REPO/target/release/examples/bench_mount
[[ -x $HELPER ]] || (cd "$REPO" && cargo build --release -q --example bench_mount)
log() { printf '[ab %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
PIDS=()
cleanup() {
    set +e
    for m in "$MNT"/*; do mountpoint -q "$m" 2>/dev/null && { umount "$m" 2>/dev/null || umount -l "$m"; }; done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
mkdir -p "$MNT" "$OUT"
visible() { getfattr --only-values -n user.stagefs.visible "$1" 2>/dev/null || echo 0; }
start() { # name bin state [env...]
    local name=$1 bin=$2 state=$3; shift 3
    mkdir -p "$MNT/$name"
    env "$@" "$bin" mount "$MNT/$name" --state "$state" --source-root "$DATA/source" \
        --events "$DATA/events" >"$OUT/$name.log" 2>&1 &
    PIDS+=("$!")
    for _ in $(seq 300); do mountpoint -q "$MNT/$name" && break; sleep 0.1; done
    for _ in $(seq 600); do (($(visible "$MNT/$name") >= LAST_ID)) && return 0; sleep 0.2; done
    echo "no state" >&2; exit 1
}
if [[ ! -f $DATA/.generated ]]; then
    rm -rf "$DATA"; mkdir -p "$DATA"
    "$HELPER" gen "$DATA" --big-mib 1 --small "$SMALL" --small-bytes 4096 --meta 1000 >"$DATA/last_id"
    touch "$DATA/.generated"
fi
LAST_ID=$(cat "$DATA/last_id")
start base "$BASE" "$DATA/state"
if [[ ! -d $DATA/state-new ]]; then
    mkdir -p "$DATA/state-new"
    cp -al "$DATA/state/blobs" "$DATA/state-new/blobs"
    cp -a "$DATA/state/journal" "$DATA/state-new/"
    for f in commits.log commit.json pins.json; do [[ -f $DATA/state/$f ]] && cp -a "$DATA/state/$f" "$DATA/state-new/"; done
fi
start new "$NEW" "$DATA/state-new"
LIST=$DATA/lists/small.txt
WALK='import os,sys,time
t=time.perf_counter(); n=0
for d,ds,fs in os.walk(sys.argv[1]):
    for f in fs: os.lstat(os.path.join(d,f)); n+=1
print("%.6f"%(time.perf_counter()-t))'
measure() { # root
    local root=$1 warm cold
    "$HELPER" readfiles "$root" "$LIST" >/dev/null
    warm=$(sh -c '"$1" readfiles "$2" "$3" >/dev/null; "$1" readfiles "$2" "$3"' _ "$HELPER" "$root" "$LIST" | cut -d' ' -f1)
    sync; echo 2 >/proc/sys/vm/drop_caches
    cold=$(python3 -c "$WALK" "$root/bench/small")
    awk -v w="$warm" -v n="$SMALL" -v c="$cold" 'BEGIN{printf "%.0f %s\n", n/w, c}'
}
LOAD0=$(load1)
log "load before: $LOAD0"
: >"$OUT/raw.txt"
for r in $(seq "$REPS"); do
    for cfg in "native $DATA/source" "base $MNT/base" "new $MNT/new"; do
        read -r reader root <<<"$cfg"
        echo "$r $reader x $(measure "$root") $(load1)" | tee -a "$OUT/raw.txt"
    done
done
LOAD1=$(load1)
awk -v l0="$LOAD0" -v l1="$LOAD1" '
function med(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ k = $2; n[k]++; w[k, n[k]] = $4; c[k, n[k]] = $5; if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
END {
    printf "load %s -> %s\n", l0, l1
    for (i = 1; i <= m; i++) { k = order[i]
        for (j = 1; j <= n[k]; j++) { ww[j] = w[k, j]; cc[j] = c[k, j] }
        mw[k] = med(ww, n[k]); mc[k] = med(cc, n[k]); lw[k] = ww[1]; hw[k] = ww[n[k]]; lc[k] = cc[1]; hc[k] = cc[n[k]] }
    nw = mw["native"]; nc = mc["native"]
    for (i = 1; i <= m; i++) { k = order[i]
        printf "%-8s warm %8d (%d-%d) %5.3fx   cold %.4f (%.4f-%.4f) %5.3fx\n", k, mw[k], lw[k], hw[k], mw[k] / nw, mc[k], lc[k], hc[k], nc / mc[k] }
}' "$OUT/raw.txt" | tee "$OUT/summary.txt"
if [[ -n ${HOLD:-} ]]; then log "holding mounts: $MNT"; sleep "$HOLD"; fi
