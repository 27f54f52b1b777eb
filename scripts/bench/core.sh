#!/usr/bin/env bash
# Core replication benchmarks (docs/BENCHMARKS.md, "Core replication").
#
# Builds examples/bench_core.rs in release, runs each benchmark in its own
# process, prints the figure table and rewrites the section between the
# `core:begin` / `core:end` markers of docs/BENCHMARKS.md with it.
#
#   scripts/bench/core.sh                 # everything (~2-3 minutes after the build)
#   STAGEFS_BENCH_WORK=/path scripts/bench/core.sh   # scratch folder (default $TMPDIR or /tmp)
#   STAGEFS_BENCH_QUICK=1 scripts/bench/core.sh      # small sizes, for checking the script; does not touch the doc
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
doc="$root/docs/BENCHMARKS.md"
work="${STAGEFS_BENCH_WORK:-${TMPDIR:-/tmp}}"
quick="${STAGEFS_BENCH_QUICK:-0}"

echo "building (release)..." >&2
cargo build --release --examples --quiet
bin="$root/target/release/examples/bench_core"

out=$(mktemp)
section=$(mktemp)
trap 'rm -f "$out" "$section"' EXIT

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
run() {
    echo "== bench_core $*" >&2
    "$bin" "$@" --work "$work" >>"$out"
}
if [[ "$quick" == 1 ]]; then
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
if ! grep -q '<!-- core:begin -->' "$doc" || ! grep -q '<!-- core:end -->' "$doc"; then
    echo "$doc lacks the core:begin/core:end markers; not updated" >&2
    exit 1
fi
awk -v section="$section" '
    /<!-- core:begin -->/ { print; while ((getline line < section) > 0) print line; skip = 1; next }
    /<!-- core:end -->/ { skip = 0 }
    !skip { print }
' "$doc" >"$doc.tmp"
mv "$doc.tmp" "$doc"
echo "updated $doc" >&2
