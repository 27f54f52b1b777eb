#!/usr/bin/env bash
# Bootstrap benchmark (issue 12): `stagefs bootstrap` of a Hive warehouse
# built through the metastore's tables on a private PostgreSQL, against
# `cp -r` + `sync` of the same files in the same run; peak memory of the
# bootstrap from /usr/bin/time -v. Method and figures: docs/BENCHMARKS.md
# ("Bootstrap").
#
#   scripts/bench/bootstrap.sh
#
# Environment (defaults in brackets):
#   PROFILE [test]   cargo profile the binaries are built with
#   BENCH_DIR [/var/tmp]  where the warehouse and state folder are made
#   SMALL_TABLES [100] SMALL_PARTS [10] SMALL_BYTES [64]  small files: 10
#                    databases x SMALL_TABLES x SMALL_PARTS partitions
#   BIG_MIB_PER_FILE [64] BIG_FILES [8]  large files (BIG_FILES partitions
#                    of one table; 0 skips); each partition holds the
#                    files the warehouse generator writes for it
#   DB [postgres]    postgres or mariadb
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROFILE=${PROFILE:-test}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
DB=${DB:-postgres}
cd "$REPO"
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
cargo build --profile "$PROFILE" --bin stagefs --example bench_bootstrap >&2
case $PROFILE in
    dev | test) OUT=target/debug ;;
    *) OUT=target/$PROFILE ;;
esac

echo "# small files"
"$OUT/examples/bench_bootstrap" "$OUT/stagefs" --db "$DB" --dir "$BENCH_DIR" \
    --databases 10 --tables "${SMALL_TABLES:-100}" \
    --partitions "${SMALL_PARTS:-10}" --bytes "${SMALL_BYTES:-64}"

if [[ ${BIG_FILES:-8} != 0 ]]; then
    echo "# large files"
    "$OUT/examples/bench_bootstrap" "$OUT/stagefs" --db "$DB" --dir "$BENCH_DIR" \
        --databases 1 --tables 1 --partitions "${BIG_FILES:-8}" \
        --bytes $(( ${BIG_MIB_PER_FILE:-64} << 20 ))
fi
