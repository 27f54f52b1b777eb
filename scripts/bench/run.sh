#!/usr/bin/env bash
# Mount benchmarks: stagefs against native reads, bindfs, mergerfs and
# rclone mount, side by side on the same data in one run, plus replication
# lag (event appended -> visible through the mount). Method and figures:
# docs/BENCHMARKS.md ("Mount").
#
#   scripts/bench/run.sh            full run (~10-15 min on 2 cores)
#   QUICK=1 scripts/bench/run.sh    small sizes, 3 repetitions (~2-3 min)
#
# Needs root (/dev/fuse, drop_caches). Environment (defaults in brackets):
#   BENCH_DIR [/var/tmp/stagefs-bench]  data, state, mount points, results
#   BIG_MIB [1024]  SMALL [10000]  SMALL_BYTES [4096]  META [100000]
#   REPS [5]        repetitions per figure (median reported)
#   SYSTEMS ["native stagefs stagefs-noopen stagefs-user main bindfs mergerfs rclone"]
#                   stagefs-noopen: STAGEFS_NO_OPEN=1; main: the stagefs binary
#                   MAIN_STAGEFS points at (e.g. a release build of branch main),
#                   skipped when unset
#   LAG_RATES [100,1000]  LAG_SECONDS [10]  events/s and seconds per rate
#   BENCHES ["read lag core"]  which parts to run
#   LOAD_MAX [1.0]  LOAD_WAIT [30]   wait up to LOAD_WAIT s for the 1-min
#                   load average to drop below LOAD_MAX before timing
# Generated data and its staged state are kept in BENCH_DIR for later runs.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
    BIG_MIB=${BIG_MIB:-256} SMALL=${SMALL:-2000} META=${META:-20000}
    REPS=${REPS:-3} LAG_SECONDS=${LAG_SECONDS:-3} LOAD_WAIT=${LOAD_WAIT:-0}
fi
BIG_MIB=${BIG_MIB:-1024}
SMALL=${SMALL:-10000}
SMALL_BYTES=${SMALL_BYTES:-4096}
META=${META:-100000}
REPS=${REPS:-5}
LAG_RATES=${LAG_RATES:-100,1000}
LAG_SECONDS=${LAG_SECONDS:-10}
BENCHES=${BENCHES:-read lag core}
SYSTEMS=${SYSTEMS:-native stagefs stagefs-noopen stagefs-user main bindfs mergerfs rclone}
MAIN_STAGEFS=${MAIN_STAGEFS:-}
LOAD_MAX=${LOAD_MAX:-1.0}
LOAD_WAIT=${LOAD_WAIT:-30}
BENCH_DIR=${BENCH_DIR:-/var/tmp/stagefs-bench}

DATA=$BENCH_DIR/data-${BIG_MIB}m-${SMALL}x${SMALL_BYTES}-${META}
MNT=$BENCH_DIR/mnt
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$BENCH_DIR/results-$STAMP
STAGEFS=$REPO/target/release/stagefs
HELPER=$REPO/target/release/examples/bench_mount

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
load1() { cut -d' ' -f1 /proc/loadavg; }

[[ $(id -u) == 0 ]] || die "run as root (FUSE mounts, drop_caches)"
[[ -e /dev/fuse ]] || die "/dev/fuse is missing"

# ---------------------------------------------------------------- cleanup
PIDS=()
cleanup() {
    local rc=$?
    set +e
    for m in "$MNT"/*; do
        [[ -d $m ]] || continue
        if mountpoint -q "$m"; then
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
        fi
    done
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- tools
declare -A HAVE
install_tools() {
    local want=(bindfs mergerfs rclone fio hyperfine attr fuse3) missing=()
    for p in "${want[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        local installable=()
        local policy
        for p in "${missing[@]}"; do
            # Not `apt-cache policy | grep -q`: under pipefail, grep's early
            # exit kills apt-cache with SIGPIPE and the pipeline fails.
            policy=$(apt-cache policy "$p" 2>/dev/null || true)
            if [[ $policy =~ Candidate:\ [0-9] ]]; then
                installable+=("$p")
            else
                log "note: Debian package $p is not available here; its part is skipped"
            fi
        done
        if ((${#installable[@]})); then
            log "installing ${installable[*]}"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${installable[@]}" >/dev/null ||
                log "note: apt-get install failed for some of: ${installable[*]}"
        fi
    fi
    for t in bindfs mergerfs rclone fio hyperfine getfattr; do
        if command -v "$t" >/dev/null; then HAVE[$t]=1; else HAVE[$t]=0; fi
    done
}

# ---------------------------------------------------------------- helpers
wait_quiet() { # wait (bounded) for a quiet machine; returns the load seen
    local waited=0
    while (($(awk -v l="$(load1)" -v m="$LOAD_MAX" 'BEGIN{print (l > m)}'))) && ((waited < LOAD_WAIT)); do
        ((waited == 0)) && log "load $(load1) > $LOAD_MAX; waiting up to ${LOAD_WAIT}s"
        sleep 5
        waited=$((waited + 5))
    done
    load1
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

median() { sort -g | awk '{a[NR]=$1} END{if(NR==0){print "nan"} else if(NR%2){print a[(NR+1)/2]} else {print (a[NR/2]+a[NR/2+1])/2}}'; }

# seconds taken by a command (its output discarded)
timeit() {
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.6f\n", b-a}'
}

# GB/s of one sequential read with dd bs=1M
dd_gbs() {
    dd if="$1" of=/dev/null bs=1M 2>&1 | awk '/copied/{for(i=1;i<=NF;i++) if($i=="copied,"){print $1/$(i+1)/1e9}}'
}

wait_mounted() { # path, pid (optional): until path is a mount point
    for _ in $(seq 300); do
        mountpoint -q "$1" && return 0
        if [[ -n ${2:-} ]] && ! kill -0 "$2" 2>/dev/null; then return 1; fi
        sleep 0.1
    done
    return 1
}

xattr() { getfattr --only-values -n "user.stagefs.$2" "$1" 2>/dev/null || true; }

# stagefs mount of a state; extra env (e.g. STAGEFS_NO_PASSTHROUGH=1) first;
# BIN overrides the binary (main's build)
start_stagefs() { # name state source events [env...]
    local name=$1 state=$2 source=$3 events=$4
    shift 4
    mkdir -p "$MNT/$name"
    env "$@" "${BIN:-$STAGEFS}" mount "$MNT/$name" --state "$state" --source-root "$source" \
        --events "$events" >"$OUT/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait_mounted "$MNT/$name" "$pid" || die "stagefs $name did not mount (see $OUT/$name.log)"
}

wait_visible() { # mount id timeout_s
    local deadline=$((SECONDS + $3)) v
    while ((SECONDS < deadline)); do
        v=$(xattr "$1" visible)
        [[ -n $v && $v -ge $2 ]] && return 0
        sleep 0.2
    done
    return 1
}

stop_stagefs() { # name
    umount "$MNT/$1" 2>/dev/null || umount -l "$MNT/$1"
    for _ in $(seq 100); do
        grep -q " $MNT/$1 " /proc/self/mountinfo || break
        sleep 0.1
    done
}

# ---------------------------------------------------------------- build + data
build() {
    log "building stagefs and the helper (release)"
    (cd "$REPO" && cargo build --release -q --bin stagefs --example bench_mount)
}

prepare_data() {
    if [[ ! -f $DATA/.generated ]]; then
        log "generating data in $DATA (1 x ${BIG_MIB} MiB, $SMALL x $SMALL_BYTES B, $META metadata files)"
        rm -rf "$DATA"
        mkdir -p "$DATA"
        "$HELPER" gen "$DATA" --big-mib "$BIG_MIB" --small "$SMALL" --small-bytes "$SMALL_BYTES" \
            --meta "$META" >"$DATA/last_id"
        touch "$DATA/.generated"
    fi
    LAST_ID=$(cat "$DATA/last_id")
    BIG_SHA=$(cat "$DATA/big.sha256")
    BLOB=$DATA/state/blobs/${BIG_SHA:0:2}/$BIG_SHA
    if [[ ! -f $DATA/.staged ]]; then
        log "staging through the daemon (state $DATA/state)"
        local t0=$SECONDS
        start_stagefs stage-once "$DATA/state" "$DATA/source" "$DATA/events"
        wait_visible "$MNT/stage-once" "$LAST_ID" 1800 || die "staging did not finish (see $OUT/stage-once.log)"
        log "staged $LAST_ID events in $((SECONDS - t0)) s"
        echo "$((SECONDS - t0))" >"$DATA/stage_seconds"
        stop_stagefs stage-once
        sleep 0.5
        touch "$DATA/.staged"
    fi
    # One state per extra daemon: blobs hard-linked (same inodes: same page
    # cache), the journal and commit record copied. main's binary gets
    # neither: it cannot read this branch's commit log or journal records
    # (the other way round works), so it ingests the events itself; every
    # blob is already there.
    local s f
    for s in state-user state-noopen state-main; do
        [[ -d $DATA/$s ]] && continue
        mkdir -p "$DATA/$s"
        cp -al "$DATA/state/blobs" "$DATA/$s/blobs"
        [[ $s == state-main ]] && continue
        cp -a "$DATA/state/journal" "$DATA/$s/"
        for f in commits.log commit.json pins.json; do
            if [[ -f $DATA/state/$f ]]; then cp -a "$DATA/state/$f" "$DATA/$s/"; fi
        done
    done
    [[ -f $BLOB ]] || die "staged blob $BLOB missing"
    # Small-file blobs (the warm-up list for stagefs' backing files).
    find "$DATA/state/blobs" -type f -size -64k >"$OUT/small-blobs.txt"
}

# ---------------------------------------------------------------- mounts
declare -A ROOT_OF
mount_all() {
    for s in $SYSTEMS; do
        case $s in
        native) ROOT_OF[$s]=$DATA/source ;;
        stagefs)
            start_stagefs stagefs "$DATA/state" "$DATA/source" "$DATA/events"
            ROOT_OF[$s]=$MNT/stagefs
            ;;
        stagefs-user)
            start_stagefs stagefs-user "$DATA/state-user" "$DATA/source" "$DATA/events" STAGEFS_NO_PASSTHROUGH=1
            ROOT_OF[$s]=$MNT/stagefs-user
            ;;
        stagefs-noopen)
            start_stagefs stagefs-noopen "$DATA/state-noopen" "$DATA/source" "$DATA/events" STAGEFS_NO_OPEN=1
            ROOT_OF[$s]=$MNT/stagefs-noopen
            ;;
        main)
            [[ -n $MAIN_STAGEFS && -x $MAIN_STAGEFS ]] || { log "note: MAIN_STAGEFS not set, main skipped"; continue; }
            BIN=$MAIN_STAGEFS start_stagefs main "$DATA/state-main" "$DATA/source" "$DATA/events"
            wait_visible "$MNT/main" "$LAST_ID" 600 || die "main did not stage (see $OUT/main.log)"
            ROOT_OF[$s]=$MNT/main
            ;;
        bindfs)
            ((HAVE[bindfs])) || { log "note: bindfs missing, skipped"; continue; }
            mkdir -p "$MNT/bindfs"
            bindfs -r "$DATA/source" "$MNT/bindfs"
            ROOT_OF[$s]=$MNT/bindfs
            ;;
        mergerfs)
            ((HAVE[mergerfs])) || { log "note: mergerfs missing, skipped"; continue; }
            mkdir -p "$MNT/mergerfs"
            mergerfs -o ro "$DATA/source" "$MNT/mergerfs"
            ROOT_OF[$s]=$MNT/mergerfs
            ;;
        rclone)
            ((HAVE[rclone])) || { log "note: rclone missing, skipped"; continue; }
            mkdir -p "$MNT/rclone"
            RCLONE_CONFIG=/dev/null rclone mount "$DATA/source" "$MNT/rclone" --read-only \
                --vfs-cache-mode off --daemon --log-level ERROR --log-file "$OUT/rclone.log"
            wait_mounted "$MNT/rclone" || die "rclone did not mount"
            ROOT_OF[$s]=$MNT/rclone
            ;;
        *) die "unknown system $s" ;;
        esac
    done
    for s in stagefs stagefs-noopen stagefs-user main; do
        [[ -n ${ROOT_OF[$s]:-} ]] || continue
        wait_visible "${ROOT_OF[$s]}" "$LAST_ID" 300 || die "$s does not show state $LAST_ID"
    done
    # The backing page cache is shared: every FUSE system reads the same
    # staged blob or source file it would in production.
    for s in "${!ROOT_OF[@]}"; do
        [[ -r ${ROOT_OF[$s]}/bench/big/data.bin ]] || die "$s: bench/big/data.bin not readable"
    done
}

unmount_all() {
    for s in bindfs mergerfs rclone; do
        [[ -n ${ROOT_OF[$s]:-} ]] || continue
        umount "$MNT/$s" 2>/dev/null || umount -l "$MNT/$s"
    done
    for s in stagefs stagefs-noopen stagefs-user main; do
        if [[ -n ${ROOT_OF[$s]:-} ]]; then stop_stagefs "$s"; fi
    done
    ROOT_OF=()
}

# Bring what `system` reads from into the page cache (after drop_caches):
# the mount's own caches stay cold, the backing store is warm.
warm_backing() {
    case $1 in
    stagefs | stagefs-noopen | stagefs-user | main)
        cat "$BLOB" >/dev/null
        xargs -a "$OUT/small-blobs.txt" -d '\n' cat >/dev/null
        ;;
    native) # the staged blob for the big file, the plain tree for the rest
        cat "$BLOB" >/dev/null
        (cd "$DATA/source" && xargs -a "$DATA/lists/small.txt" -d '\n' cat >/dev/null)
        find "$DATA/source/bench/meta" -printf '%s\n' >/dev/null
        ;;
    *)
        cat "$DATA/source/bench/big/data.bin" >/dev/null
        (cd "$DATA/source" && xargs -a "$DATA/lists/small.txt" -d '\n' cat >/dev/null)
        find "$DATA/source/bench/meta" -printf '%s\n' >/dev/null
        ;;
    esac
}

# ---------------------------------------------------------------- read benches
RAW=
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RAW"; }

bench_read() {
    RAW=$OUT/raw.tsv
    : >"$RAW"
    mount_all
    local order=() s
    for s in $SYSTEMS; do
        if [[ -n ${ROOT_OF[$s]:-} ]]; then order+=("$s"); fi
    done
    local load
    load=$(wait_quiet)
    log "read benchmarks: ${order[*]}; $REPS repetitions; load $load"
    echo "$load" >"$OUT/load-read-start"
    for ((r = 1; r <= REPS; r++)); do
        # Rotate the order each repetition so drift hits everyone alike.
        local n=${#order[@]} k
        for ((k = 0; k < n; k++)); do
            s=${order[$(((k + r) % n))]}
            local root=${ROOT_OF[$s]}
            local big=$root/bench/big/data.bin
            [[ $s == native ]] && big=$BLOB
            drop_caches
            warm_backing "$s"
            record seq_first "$s" "$r" "$(dd_gbs "$big")"
            record small_first "$s" "$r" "$("$HELPER" readfiles "$root" "$DATA/lists/small.txt" | cut -d' ' -f1)"
            record meta_first "$s" "$r" "$(timeit find "$root/bench/meta" -printf '%s %T@\n')"
            record seq_again "$s" "$r" "$(dd_gbs "$big")"
            record small_again "$s" "$r" "$("$HELPER" readfiles "$root" "$DATA/lists/small.txt" | cut -d' ' -f1)"
            record small_table "$s" "$r" "$("$HELPER" readfiles "$root" "$DATA/lists/small.txt" --at bench/small | cut -d' ' -f1)"
            record meta_again "$s" "$r" "$(timeit find "$root/bench/meta" -printf '%s %T@\n')"
        done
        log "repetition $r/$REPS done (load $(load1))"
    done
    echo "$(load1)" >"$OUT/load-read-end"
    unmount_all
}

med() { awk -F'\t' -v b="$1" -v s="$2" '$1==b && $2==s {print $4}' "$RAW" | median; }

table_read() {
    local order=()
    for s in $SYSTEMS; do
        if [[ -n $(awk -F'\t' -v s="$s" '$2==s' "$RAW" | head -1) ]]; then order+=("$s"); fi
    done
    local hdr="| benchmark (median of $REPS) |" sep="|---|"
    for s in "${order[@]}"; do hdr+=" $s |"; sep+="---:|"; done
    echo "$hdr"
    echo "$sep"
    # name, unit, kind (rate: higher is better, given directly; secs)
    local rows=(
        "seq_first|sequential read ${BIG_MIB} MiB, first through the mount (GB/s)|gbs"
        "seq_again|sequential read again, mount cache warm (GB/s)|gbs"
        "small_first|open+read $SMALL × $SMALL_BYTES B, mount cold (files/s)|files"
        "small_again|open+read again, mount warm (files/s)|files"
        "small_table|open+read again, openat relative to the table directory (files/s)|files"
        "meta_first|find -printf %s over $META files, mount cold (s)|secs"
        "meta_again|find again, mount warm (s)|secs"
    )
    for row in "${rows[@]}"; do
        IFS='|' read -r key label kind <<<"$row"
        local line="| $label |" nat
        nat=$(med "$key" native)
        for s in "${order[@]}"; do
            local v cell
            v=$(med "$key" "$s")
            case $kind in
            gbs) cell=$(awk -v v="$v" -v n="$nat" 'BEGIN{printf "%.2f (%.2f×)", v, v/n}') ;;
            files) cell=$(awk -v v="$v" -v n="$nat" -v c="$SMALL" 'BEGIN{printf "%.0f (%.2f×)", c/v, n/v}') ;;
            secs) cell=$(awk -v v="$v" -v n="$nat" 'BEGIN{printf "%.3f (%.2f×)", v, n/v}') ;;
            esac
            line+=" $cell |"
        done
        echo "$line"
    done
    echo
    echo "Ratios in parentheses are speed relative to native (1.00× = as fast as reading the files directly; higher is better)."
}

# ---------------------------------------------------------------- lag
bench_lag() {
    local dir=$BENCH_DIR/lag-run
    rm -rf "$dir"
    mkdir -p "$dir/events" "$dir/source"
    start_stagefs lag "$dir/state" "$dir/source" "$dir/events"
    local load
    load=$(wait_quiet)
    log "replication lag at $LAG_RATES events/s, ${LAG_SECONDS}s each (load $load)"
    echo "$load" >"$OUT/load-lag-start"
    "$HELPER" lag "$MNT/lag" "$dir/events" "$dir/source" --rates "$LAG_RATES" \
        --seconds "$LAG_SECONDS" --dump "$OUT/lag-timeline.txt" | tee "$OUT/lag.txt" >&2
    echo "$(load1)" >"$OUT/load-lag-end"
    cp "$MNT/lag/.stagefs/status" "$OUT/lag-status.json" 2>/dev/null || true
    stop_stagefs lag
    rm -rf "$dir"
}

table_lag() {
    echo "| events/s | events | p50 ms | p90 ms | p99 ms | max ms | producer achieved/s |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
    sed -E 's/([a-z_0-9]+)=/\1 /g' "$OUT/lag.txt" | awk '{
        for(i=1;i<NF;i+=2) v[$i]=$(i+1);
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", v["rate"], v["events"], v["p50_ms"], v["p90_ms"], v["p99_ms"], v["max_ms"], v["achieved_rate"] }'
}

# ---------------------------------------------------------------- main
mkdir -p "$BENCH_DIR" "$MNT" "$OUT"
for m in "$MNT"/*; do # leftovers of a killed run
    if [[ -d $m ]] && mountpoint -q "$m"; then umount -l "$m"; fi
done
install_tools
build
T0=$SECONDS
{
    echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), $(free -g | awk '/Mem:/{print $2}') GiB RAM"
    echo "filesystem: $(findmnt -no FSTYPE,OPTIONS -T "$BENCH_DIR")"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  git: $(cd "$REPO" && git rev-parse --short HEAD)"
    echo "versions: $(bindfs --version 2>/dev/null | head -1); $(mergerfs --version 2>/dev/null | head -1); $(rclone version 2>/dev/null | head -1)"
} >"$OUT/machine.txt"
if [[ " $BENCHES " == *" read "* ]]; then
    prepare_data
    bench_read
fi
if [[ " $BENCHES " == *" lag "* ]]; then
    bench_lag
fi
CORE_NOTE="not run (BENCHES has no \"core\"): metadata events/s, staging vs cp and commit time vs catalog size not measured here"
if [[ " $BENCHES " == *" core "* && ! -x $REPO/scripts/bench/core.sh ]]; then
    CORE_NOTE="scripts/bench/core.sh not present: metadata events/s, staging vs cp and commit time vs catalog size not measured here"
elif [[ " $BENCHES " == *" core "* ]]; then
    log "running scripts/bench/core.sh"
    QUICK=$QUICK "$REPO/scripts/bench/core.sh" | tee "$OUT/core.txt" >&2 && CORE_NOTE="see core.txt" || CORE_NOTE="core.sh failed"
fi

{
    echo "# stagefs mount benchmarks, $(date -u +%Y-%m-%d)"
    echo
    sed 's/^/    /' "$OUT/machine.txt"
    echo
    if [[ -s ${RAW:-/nonexistent} ]]; then
        echo "## Reads (load $(cat "$OUT/load-read-start") → $(cat "$OUT/load-read-end"))"
        echo
        table_read
        echo
        echo "Staging the data set through the daemon took $(cat "$DATA/stage_seconds" 2>/dev/null || echo '?') s (first run only)."
        echo
    fi
    if [[ -s $OUT/lag.txt ]]; then
        echo "## Replication lag, event appended → visible (load $(cat "$OUT/load-lag-start") → $(cat "$OUT/load-lag-end"))"
        echo
        table_lag
        echo
    fi
    echo "core: $CORE_NOTE"
    echo
    echo "wall time: $((SECONDS - T0)) s; raw figures in $OUT"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
