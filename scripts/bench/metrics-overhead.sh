#!/usr/bin/env bash
# Cost of `--metrics` on reads (docs/OPERATIONS.md, "Overhead").
#
# Writes a table of FILES small files (PARTS partitions), mounts it with and
# without --metrics (alternating, ROUNDS times each; one state folder, so
# only the first mount stages), and times open+read of every file once per
# fresh mount: every file costs lookup, open, read, release requests, the
# request-heaviest read path (large files go through passthrough and never
# reach the daemon). Prints the median seconds per pass and per file.
#
#   scripts/bench/metrics-overhead.sh            # target/release/stagefs
#   STAGEFS_BIN=target/debug/stagefs FILES=2000 ROUNDS=5 scripts/bench/metrics-overhead.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${STAGEFS_BIN:-target/release/stagefs}")
files=${FILES:-2000}
parts=${PARTS:-20}
rounds=${ROUNDS:-5}
port=${PORT:-19464}
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-metrics-bench.XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    mountpoint -q "$work/mnt" && umount -l "$work/mnt" || true
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work"/{source,events,mnt}
last=$(/usr/bin/python3 - "$work" "$files" "$parts" <<'PY'
import hashlib, json, os, sys
work, files, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ev = [{"id": 1, "op": "create_database", "db": "bench"},
      {"id": 2, "op": "create_table", "db": "bench", "table": "t", "partition_keys": ["p"]}]
per = files // parts
with open(f"{work}/list.txt", "w") as lst:
    for p in range(parts):
        refs = []
        for i in range(per):
            rel = f"bench/t/p={p}/f{i:05}"
            data = (f"{p}-{i}-".encode() * 1000)[:4096]
            os.makedirs(os.path.dirname(f"{work}/source/{rel}"), exist_ok=True)
            with open(f"{work}/source/{rel}", "wb") as f:
                f.write(data)
            refs.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            lst.write(rel + "\n")
        ev.append({"id": len(ev) + 1, "op": "add_files", "db": "bench", "table": "t",
                   "partition": {"p": str(p)}, "files": refs})
with open(f"{work}/events/log-000001.jsonl", "w") as f:
    for e in ev:
        f.write(json.dumps(e) + "\n")
print(len(ev))
PY
)
pass() {  # seconds to open+read every listed file once
    /usr/bin/python3 - "$work/mnt" "$work/list.txt" <<'PY'
import sys, time
mnt, names = sys.argv[1], open(sys.argv[2]).read().split()
t = time.perf_counter()
for n in names:
    with open(f"{mnt}/{n}", "rb") as f:
        f.read()
print(f"{time.perf_counter() - t:.4f}")
PY
}
declare -a off on
for r in $(seq "$rounds"); do
    for mode in off on; do
        flags=()
        [ "$mode" = on ] && flags=(--metrics "127.0.0.1:$port")
        "$bin" mount "$work/mnt" --state "$work/state" --source-root "$work/source" \
            --events "$work/events" "${flags[@]}" 2>>"$work/log" &
        pid=$!
        until [ -r "$work/mnt/.stagefs/status" ] && grep -Eq "\"visible\": $last([^0-9]|$)" "$work/mnt/.stagefs/status" 2>/dev/null; do sleep 0.1; done
        s=$(pass)
        if [ "$mode" = on ]; then
            on+=("$s")
            reads=$(curl -s "http://127.0.0.1:$port/metrics" | grep -E '^stagefs_fuse_request_duration_seconds_count\{op="(lookup|open|read)"\}' | tr '\n' ' ')
        else
            off+=("$s")
        fi
        kill -TERM "$pid"; wait "$pid" || true; pid=
    done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mo=$(median "${off[@]}"); mn=$(median "${on[@]}")
echo "files $files x 4 KiB, $rounds rounds, binary $bin"
echo "without --metrics: passes ${off[*]} s, median $mo s ($(awk -v s="$mo" -v n="$files" 'BEGIN{printf "%.1f", s/n*1e6}') us/file)"
echo "with --metrics:    passes ${on[*]} s, median $mn s ($(awk -v s="$mn" -v n="$files" 'BEGIN{printf "%.1f", s/n*1e6}') us/file)"
echo "difference: $(awk -v a="$mo" -v b="$mn" 'BEGIN{printf "%+.1f%%", (b-a)/a*100}')"
echo "last scrape: $reads"
