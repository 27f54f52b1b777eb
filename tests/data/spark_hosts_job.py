"""A Spark job across reader hosts, for tests/spark_hosts.rs (SPEC §3 rule 10).

Two tables the source keeps overwriting under the same file names, as
Hive's INSERT OVERWRITE does:

- MOUNT/wh/facts, partitions p=a .. p=f, each one file `000000_0` holding
  a facts variant k (0 <= k < FACTS): rows (key, v);
- MOUNT/wh/dims, partitions d=x, d=y, d=z, each one file `000000_0`
  holding a dims variant j (0 <= j < DIMS): rows (key, w).

The query joins them on `key` and groups by (p, d): count(*) and
sum(v * w). The test knows which variant each partition held at every
source state and computes the expected result from the rows this script
writes beside the Parquet files (rows.json), so a result read from any
other state, or from a mix of states, does not match.

Usage:
  spark_hosts_job.py make OUTDIR
      writes OUTDIR/facts-<k>.parquet, OUTDIR/dims-<j>.parquet (pyarrow)
      and OUTDIR/rows.json: {"facts": [[[key, v], ...], ...], "dims": ...}
  spark_hosts_job.py job MASTER MOUNT QUERIES [--no-executor-env]
      a driver on a standalone cluster (spark://...): QUERIES queries of
      the join. It passes its own STAGEFS_STATE_ID (as `stagefs run` set
      it) to the executors with spark.executorEnv.STAGEFS_STATE_ID, unless
      --no-executor-env (the negative control: executors on other hosts
      then read whatever state their host shows).

Each query is one JSON line on stdout: {"q", "state", "result": [[p, d,
count, sum], ...] sorted} or {"q", "state", "failed": why}.
"""

import json
import os
import sys

FACTS = 60
DIMS = 30
KEYS = 10


def facts_rows(k):
    return [((i * 7 + k) % KEYS, k) for i in range(40 + (k % 13) * 11)]


def dims_rows(j):
    return [(key, j * 100 + key) for key in range(KEYS) if (key + j) % 3 != 0]


def make(outdir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(outdir, exist_ok=True)
    rows = {"facts": [], "dims": []}
    for name, n, make_rows, col in (
        ("facts", FACTS, facts_rows, "v"),
        ("dims", DIMS, dims_rows, "w"),
    ):
        for k in range(n):
            r = make_rows(k)
            rows[name].append(r)
            table = pa.table(
                {
                    "key": pa.array([a for a, _ in r], pa.int64()),
                    col: pa.array([b for _, b in r], pa.int64()),
                }
            )
            pq.write_table(table, os.path.join(outdir, f"{name}-{k}.parquet"))
    with open(os.path.join(outdir, "rows.json"), "w") as f:
        json.dump(rows, f)


def job(master, mount, queries, executor_env):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    state = os.environ.get("STAGEFS_STATE_ID")
    if state is None:
        sys.exit("STAGEFS_STATE_ID is not set: start the driver with `stagefs run`")
    builder = (
        SparkSession.builder.master(master)
        .appName("stagefs-spark-hosts")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        # Both executors (one per worker host) before the first query.
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    if executor_env:
        builder = builder.config("spark.executorEnv.STAGEFS_STATE_ID", state)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def query():
        facts = spark.read.parquet(f"{mount}/wh/facts")
        dims = spark.read.parquet(f"{mount}/wh/dims")
        out = (
            facts.join(dims, "key")
            .groupBy("p", "d")
            .agg(F.count("*"), F.sum(F.col("v") * F.col("w")))
            .collect()
        )
        return sorted([r[0], r[1], r[2], r[3]] for r in out)

    try:
        for q in range(queries):
            line = {"q": q, "state": int(state)}
            try:
                line["result"] = query()
            except Exception as e:  # a failed query, reported and counted
                line["failed"] = f"{type(e).__name__}: {str(e)[:600]}"
            print(json.dumps(line), flush=True)
    finally:
        spark.stop()


def main(argv):
    if len(argv) >= 2 and argv[0] == "make":
        make(argv[1])
    elif len(argv) >= 4 and argv[0] == "job":
        flags = argv[4:]
        unknown = [f for f in flags if f != "--no-executor-env"]
        if unknown:
            sys.exit(f"unknown flags {unknown}")
        job(argv[1], argv[2], int(argv[3]), "--no-executor-env" not in flags)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
