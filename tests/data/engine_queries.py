"""Query engines against a stagefs mount, for tests/engines.rs.

The table MOUNT/wh/facts has six partitions p=a .. p=f, each one file
`000000_0` that the source keeps overwriting (INSERT OVERWRITE of one
partition per event, reusing the name). Event e writes partition
"abcdef"[e % 6] with variant k = e % 60: a Parquet file of
100 + (k % 13) * 37 rows, every row v = k.

So in every source state the six partitions hold six consecutive variants
(mod 60), each partition its own residue mod 6, each with its full row
count. A query result that is not such a set matches no source state:
"mixed". A query that raises (a listed file gone, a footer read at one
version and bytes at another) is "failed".

Usage:
  engine_queries.py make OUTDIR
      writes OUTDIR/<k>.parquet for k in 0..60 (pyarrow)
  engine_queries.py spark MOUNT QUERIES [--hold] [--interval S]
      one long-lived local-mode Spark driver; QUERIES queries of
      spark.read.parquet(MOUNT/wh/facts) (partition discovery) GROUP BY p
  engine_queries.py duckdb MOUNT QUERIES [--hold] [--cwd] [--interval S]
      one DuckDB connection; read_parquet('.../*/*', hive_partitioning=1)
      by absolute glob, or (--cwd) with the working directory in the table
  engine_queries.py pandas MOUNT QUERIES [--hold] [--interval S]
      one Python process; pandas.read_parquet(MOUNT/wh/facts) (pyarrow's
      dataset discovery of the p=... directories) grouped by p

--hold reads the root's user.stagefs.hold before each query (the query
boundary a long-lived session marks for exactness).

Each query is one JSON line on stderr, or in the file QUERY_LINES names
(the JVM's own messages on stderr can run into a line there); the last
line on stdout is the summary {"queries", "mixed", "failed", "states",
"seconds"}.
"""

import json
import os
import sys
import time

PARTS = "abcdef"
LINES = open(os.environ["QUERY_LINES"], "a") if os.environ.get("QUERY_LINES") else sys.stderr
VARIANTS = 60


def rows(k):
    return 100 + (k % 13) * 37


def make(outdir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(outdir, exist_ok=True)
    for k in range(VARIANTS):
        n = rows(k)
        table = pa.table({"v": pa.array([k] * n, pa.int64()), "r": pa.array(range(n), pa.int64())})
        pq.write_table(table, os.path.join(outdir, f"{k}.parquet"))


def check(result):
    """result: {partition: (min v, max v, count)} -> None if it is a source
    state, else why not."""
    if sorted(result) != list(PARTS):
        return f"partitions {sorted(result)}"
    ks = {}
    for p, (lo, hi, cnt) in result.items():
        if lo != hi:
            return f"p={p} holds variants {lo}..{hi}"
        if cnt != rows(lo):
            return f"p={p} variant {lo} has {cnt} rows, not {rows(lo)}"
        if lo % 6 != PARTS.index(p):
            return f"p={p} holds variant {lo}"
        ks[p] = lo
    got = set(ks.values())
    for top in got:
        if got == {(top - i) % VARIANTS for i in range(6)}:
            return None
    return f"variants {sorted(got)} are not six consecutive writes"


def hold(mount):
    return int(os.getxattr(mount, "user.stagefs.hold"))


def run(queries, mount, n, use_hold, interval):
    mixed = failed = 0
    states = set()
    began = time.monotonic()
    for q in range(n):
        t0 = time.time()
        held = hold(mount) if use_hold else None
        line = {"q": q, "t0": round(t0, 3), "held": held}
        try:
            result = queries()
            why = check(result)
            line["result"] = {p: list(v) for p, v in sorted(result.items())}
            if why:
                mixed += 1
                line["mixed"] = why
            else:
                states.add(tuple(sorted(result.items())))
        except Exception as e:  # a failed query, reported and counted
            failed += 1
            line["failed"] = f"{type(e).__name__}: {str(e)[:400]}"
        line["t1"] = round(time.time(), 3)
        print(json.dumps(line), file=LINES, flush=True)
        time.sleep(interval)
    summary = {
        "queries": n,
        "mixed": mixed,
        "failed": failed,
        "states": len(states),
        "seconds": round(time.monotonic() - began, 1),
    }
    print(json.dumps(summary), flush=True)


def spark(mount, n, use_hold, interval):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("stagefs-engines")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "32")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    path = f"{mount}/wh/facts"

    def query():
        df = spark.read.parquet(path)
        out = df.groupBy("p").agg(F.min("v"), F.max("v"), F.count("*")).collect()
        return {r[0]: (r[1], r[2], r[3]) for r in out}

    try:
        run(query, mount, n, use_hold, interval)
    finally:
        spark.stop()


def duckdb_queries(mount, n, use_hold, cwd, interval):
    import duckdb

    con = duckdb.connect()
    glob = "*/*" if cwd else f"{mount}/wh/facts/*/*"
    if cwd:
        os.chdir(f"{mount}/wh/facts")
    sql = (
        "SELECT p, min(v), max(v), count(*) FROM "
        f"read_parquet('{glob}', hive_partitioning=1) GROUP BY p"
    )

    def query():
        return {r[0]: (r[1], r[2], r[3]) for r in con.execute(sql).fetchall()}

    run(query, mount, n, use_hold, interval)


def pandas_queries(mount, n, use_hold, interval):
    import pandas as pd

    path = f"{mount}/wh/facts"

    def query():
        df = pd.read_parquet(path)
        g = df.groupby("p", observed=True)["v"].agg(["min", "max", "count"])
        return {str(p): (int(r["min"]), int(r["max"]), int(r["count"])) for p, r in g.iterrows()}

    run(query, mount, n, use_hold, interval)


def main(argv):
    if len(argv) >= 2 and argv[0] == "make":
        make(argv[1])
        return
    if len(argv) < 3 or argv[0] not in ("spark", "duckdb", "pandas"):
        sys.exit(__doc__)
    engine, mount, n = argv[0], argv[1], int(argv[2])
    flags = argv[3:]
    interval = 0.3
    if "--interval" in flags:
        interval = float(flags[flags.index("--interval") + 1])
    use_hold = "--hold" in flags
    if engine == "spark":
        spark(mount, n, use_hold, interval)
    elif engine == "pandas":
        pandas_queries(mount, n, use_hold, interval)
    else:
        duckdb_queries(mount, n, use_hold, "--cwd" in flags, interval)


if __name__ == "__main__":
    main(sys.argv[1:])
