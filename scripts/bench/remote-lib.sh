# Shared by scripts/bench/s3.sh and scripts/bench/hdfs.sh (sourced, not
# run): setting up, building, recording the machine, and the summary.
# Expects REPO, BENCH_WORK and a log function; sets OUT.

# Installs the servers, makes $OUT and builds bench_core (release).
remote_prepare() {
    "$REPO/scripts/setup-servers.sh" >&2
    OUT=$BENCH_WORK/results-$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$OUT"
    log "building (release)"
    (cd "$REPO" && cargo build --release --quiet --example bench_core)
}

# Writes $OUT/machine.txt: the machine, the scratch disk, the line given
# (tool versions), date, commit and load.
remote_machine() {
    {
        echo "machine: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
        echo "scratch: $(findmnt -no FSTYPE,SOURCE -T "$BENCH_WORK") ($BENCH_WORK)"
        echo "$1"
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  git: $(cd "$REPO" && git rev-parse --short HEAD)  load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    } >"$OUT/machine.txt"
}

# Prints (and keeps in $OUT/summary.md) a Markdown summary titled $1 of
# the ROW and NOTE lines in $OUT/stage.txt.
remote_summary() {
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
    {
        echo "# $1, $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo
        sed 's/^/    /' "$OUT/machine.txt"
        echo
        echo "| Benchmark | Figure | Target | Met |"
        echo "|---|---|---|---|"
        grep -h '^ROW|' "$OUT/stage.txt" | sed 's/^ROW|//' | awk -F'|' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }'
        echo
        grep -h '^NOTE|' "$OUT/stage.txt" | sed 's/^NOTE|/- /'
    } | tee "$OUT/summary.md"
}
