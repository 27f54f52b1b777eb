#!/usr/bin/env bash
# Core replication benchmarks (docs/BENCHMARKS.md, "Core replication"), or
# with the argument `checkpoints` those of "Checkpoints and restart".
#
# Builds examples/bench_core/ in release, runs each benchmark in its own
# process, prints the figure table and rewrites the section between the
# `core:begin` / `core:end` (or `checkpoints:begin` / `checkpoints:end`)
# markers of docs/BENCHMARKS.md with it.
#
#   scripts/bench/core.sh                 # everything (~2-3 minutes after the build)
#   scripts/bench/core.sh checkpoints     # checkpoint cost, restart after 10M events, lag, memory (~4-5 min quiet)
#   STAGEFS_BENCH_WORK=/path scripts/bench/core.sh   # scratch folder (default $TMPDIR or /tmp)
#   STAGEFS_BENCH_QUICK=1 scripts/bench/core.sh      # small sizes, for checking the script; does not touch the doc
#
# The checkpoint set needs ~2.5 GiB of scratch space (a 10M-event log and
# its full journal), removed when it ends.
set -euo pipefail
set_name="${1:-core}"
case "$set_name" in
    core | checkpoints) ;;
    *) echo "usage: $0 [checkpoints]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/../.."
root=$(pwd)
doc="$root/docs/BENCHMARKS.md"
work="${STAGEFS_BENCH_WORK:-${TMPDIR:-/tmp}}"
quick="${STAGEFS_BENCH_QUICK:-0}"

echo "building (release)..." >&2
cargo build --release --example bench_core --quiet
bin="${CARGO_TARGET_DIR:-$root/target}/release/examples/bench_core"

out=$(mktemp)
section=$(mktemp)
trap 'rm -f "$out" "$section"' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
run() {
    echo "== bench_core $*" >&2
    "$bin" "$@" --work "$work" >>"$out"
}
if [[ "$set_name" == checkpoints && "$quick" == 1 ]]; then
    run checkpoint --files 200000
    run lag --files 200000 --seconds 5
    run restart --events 1000000
elif [[ "$set_name" == checkpoints ]]; then
    run checkpoint --files 1000000
    run lag --files 1000000 --seconds 20
    run restart --events 10000000
elif [[ "$quick" == 1 ]]; then
    run ingest --events 100000
    run commit --inserts 200
    run memory --shape 100x1000 --sizes 1
    run stage --files 8 --mib 32 --reps 1
else
    run ingest --events 1000000
    run commit --inserts 300
    run memory --shape 1000x1000 --sizes 1
    run memory --shape 1x1000000
    run stage --files 64 --mib 32 --reps 3
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
took=$(( $(date +%s) - started ))

# The machine, as the figures depend on it.
fs_dev=$(df --output=source "$work" | tail -1)
fs_type=$(df --output=fstype "$work" | tail -1)
disk_name=$(lsblk -no PKNAME "$fs_dev" 2>/dev/null | head -1)
disk_name=${disk_name:-$(basename "$fs_dev")}
disk=$(lsblk -dno NAME,SIZE,ROTA "/dev/$disk_name" 2>/dev/null \
    | awk '{ printf "%s, %s, rotational flag %s", $1, $2, $3 }')
disk_model=$(cat "/sys/block/$disk_name/device/model" 2>/dev/null | sed 's/ *$//' || true)
[[ "$disk_name" == vd* ]] && disk_model="${disk_model:-virtio block device}"
model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)
sha_ni=$(grep -qw sha_ni /proc/cpuinfo && echo "yes" || echo "no")
commit=$(git rev-parse --short HEAD)
dirty=$(git diff --quiet -- src && echo "" || echo " (src modified)")

{
    echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on commit \`$commit\`$dirty, $(rustc --version | cut -d' ' -f1-2), in ${took} s."
    echo
    echo "| Machine | |"
    echo "|---|---|"
    echo "| CPU | $(nproc) × $model (SHA-NI: $sha_ni), virtual machine |"
    echo "| Memory | $mem |"
    echo "| Kernel | $(uname -sr) |"
    echo "| Scratch disk | $fs_type on $fs_dev ($disk; $disk_model; as reported by the VM) |"
    echo "| Load average (1/5/15 min) | before $load_before, after $load_after |"
    echo
    echo "| Benchmark | Figure | Target | Met |"
    echo "|---|---|---|---|"
    grep '^ROW|' "$out" | sed 's/^ROW|//' | awk -F'|' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }'
    echo
    grep '^NOTE|' "$out" | sed 's/^NOTE|/- /'
} >"$section"

cat "$section"

if [[ "$quick" == 1 ]]; then
    echo "(quick run: $doc not updated)" >&2
    exit 0
fi
begin="<!-- $set_name:begin -->"
end="<!-- $set_name:end -->"
if ! grep -q "$begin" "$doc" || ! grep -q "$end" "$doc"; then
    echo "$doc lacks the $set_name:begin/$set_name:end markers; not updated" >&2
    exit 1
fi
awk -v section="$section" -v begin="$begin" -v end="$end" '
    $0 == begin { print; while ((getline line < section) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip { print }
' "$doc" >"$doc.tmp"
mv "$doc.tmp" "$doc"
echo "updated $doc" >&2
