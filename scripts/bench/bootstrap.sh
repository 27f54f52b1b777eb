#!/usr/bin/env bash
# Bootstrap benchmark (issue 12): `stagefs bootstrap` of a Hive warehouse
# built through the metastore's tables on a private PostgreSQL (started by
# the bench itself, as the tests do), against `cp -r` + `sync` of the same
# files in the same run, repetitions interleaved; and the metadata snapshot
# of 10,000 partitions alone (time, peak RSS). Method and figures:
# docs/BENCHMARKS.md ("Bootstrap").
#
#   scripts/bench/bootstrap.sh            # full: ~10k partitions, 4 GiB, 3 reps each
#   QUICK=1 scripts/bench/bootstrap.sh    # quick: 2,000 partitions, 1 GiB, 2 reps
#
# Run as root or as a user that can run PostgreSQL (as root the server runs
# as the `postgres` user: scripts/setup.sh installs the packages). The
# release build is done first (not part of the timed figures).
#
# Environment (defaults in brackets):
#   BENCH_DIR [/tmp]   a fresh folder below it holds the warehouse, one copy
#                      at a time and the database; removed on exit
#   REPS [3, QUICK 2]  interleaved cp / bootstrap repetitions per data set
#   SMALL_TABLES [100, QUICK 20]  small files: 10 databases x SMALL_TABLES
#   SMALL_PARTS [10]   x SMALL_PARTS partitions, 1-2 files each
#   SMALL_BYTES [4096] bytes per small file
#   BIG_MIB [128]      MiB per large file
#   BIG_PARTS [21, QUICK 5]  partitions of the large table (1-2 files each:
#                      21 gives 32 files = 4 GiB at 128 MiB); 0 skips
#   SNAPSHOT_REPS [3]  snapshot-phase-alone runs on the small warehouse
#   DB [postgres]      postgres or mariadb
#   PROFILE [release]  cargo profile of the binaries
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
    REPS=${REPS:-2} SMALL_TABLES=${SMALL_TABLES:-20} BIG_PARTS=${BIG_PARTS:-5}
fi
REPS=${REPS:-3}
PROFILE=${PROFILE:-release}
DB=${DB:-postgres}
BENCH_DIR=${BENCH_DIR:-/tmp}
cd "$REPO"
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
cargo build --profile "$PROFILE" --bin stagefs --example bench_bootstrap >&2
case $PROFILE in
    dev | test) OUT=target/debug ;;
    *) OUT=target/$PROFILE ;;
esac

WORK=$(mktemp -d "$BENCH_DIR/stagefs-bootstrap-bench.XXXXXX")
# The database's temp folder goes there too, so one removal takes all.
export TMPDIR=$WORK
cleanup() { rm -rf -- "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
chmod 755 "$WORK"

started=$(date +%s)
echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), profile $PROFILE"
echo "# small files"
"$OUT/examples/bench_bootstrap" "$OUT/stagefs" --db "$DB" --dir "$WORK" \
    --databases 10 --tables "${SMALL_TABLES:-100}" \
    --partitions "${SMALL_PARTS:-10}" --bytes "${SMALL_BYTES:-4096}" \
    --reps "$REPS" --snapshot-reps "${SNAPSHOT_REPS:-3}"

if [[ ${BIG_PARTS:-21} != 0 ]]; then
    echo "# large files"
    "$OUT/examples/bench_bootstrap" "$OUT/stagefs" --db "$DB" --dir "$WORK" \
        --databases 1 --tables 1 --partitions "${BIG_PARTS:-21}" \
        --bytes $(( ${BIG_MIB:-128} << 20 )) --reps "$REPS"
fi
echo "# done in $(( $(date +%s) - started )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
