"""Spark as a writer through a real Hive metastore (tests/real_hive_spark.rs).

    spark_hive_writer.py THRIFT_URI WAREHOUSE [HIVE_JARS_CLASSPATH_FILE]

One local Spark session with Hive support against the metastore at
THRIFT_URI, its warehouse at WAREHOUSE (hdfs://...), DML events on. With a
classpath file (tests/java/spark-hive4-client/target/classpath.txt) Spark's
Hive client is Hive 4.0.1's (spark.sql.hive.metastore.version=4.0.1,
jars=path); without one, Spark's built-in Hive 2.3.10 client.

Protocol (stdout, one JSON object a line; stdin, one word a line):
- {"ready": true, "spark": VERSION, "hive_client": VERSION}
- for each step: {"step": N, "sql": [...]} once its statements ran, then it
  waits for a line `next` (the test records the source's state meanwhile);
- {"steps_done": true}, then it waits for `read MOUNT`: it reads every table
  of the database from MOUNT/<db>/<table> as plain Parquet or text files
  (partition columns from the directory names) and from the metastore, and
  answers {"read": {TABLE: {"replica": [...], "source": [...]}}} (rows as
  sorted lists of strings), then waits for `quit`.
- on an error: {"error": TEXT} and exit status 1.
"""

import json
import os
import sys
import traceback

DB = "sw"

# Each step is one or more statements; the test records the source's state
# after each step. Hive formats (STORED AS ...), partitioned and not.
STEPS = [
    [f"CREATE DATABASE {DB} WITH DBPROPERTIES ('repl.source.for'='stagefs')"],
    [
        f"CREATE TABLE {DB}.orders (id INT, v STRING) PARTITIONED BY (dt STRING) STORED AS PARQUET",
        f"CREATE TABLE {DB}.flat (id INT, v STRING) STORED AS PARQUET",
        f"CREATE TABLE {DB}.notes (id INT, v STRING) PARTITIONED BY (k STRING) STORED AS TEXTFILE",
    ],
    [f"INSERT INTO {DB}.flat VALUES (1, 'one'), (2, 'two')"],
    [f"INSERT INTO {DB}.flat VALUES (3, 'three')"],
    [f"INSERT INTO {DB}.orders PARTITION (dt='2024-01-01') VALUES (10, 'a')"],
    [f"INSERT INTO {DB}.orders PARTITION (dt='2024-01-01') VALUES (11, 'b')"],
    [f"INSERT INTO {DB}.orders PARTITION (dt='2024-01-02') VALUES (20, 'c')"],
    # A static partition overwritten.
    [f"INSERT OVERWRITE TABLE {DB}.orders PARTITION (dt='2024-01-01') VALUES (12, 'd')"],
    # A dynamic partition insert: one existing partition, two new ones.
    [
        f"INSERT INTO {DB}.orders PARTITION (dt) "
        "SELECT * FROM VALUES (21, 'e', '2024-01-02'), (30, 'f', '2024-01-03'), "
        "(40, 'g', '2024-01-04') AS t(id, v, dt)"
    ],
    [f"INSERT INTO {DB}.notes PARTITION (k) SELECT id, v, CAST(id % 2 AS STRING) FROM {DB}.flat"],
    [f"INSERT OVERWRITE TABLE {DB}.flat SELECT id + 100, v FROM {DB}.orders WHERE dt = '2024-01-02'"],
    [f"CREATE TABLE {DB}.ctas STORED AS PARQUET AS SELECT id, v FROM {DB}.orders WHERE dt <> '2024-01-03'"],
    [f"INSERT INTO {DB}.flat VALUES (4, 'four')"],
]


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def wait_for(word):
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    words = line.split()
    if not words or words[0] != word:
        raise RuntimeError(f"expected {word!r}, got {line!r}")
    return words[1:]


def session(thrift_uri, warehouse, jars_file):
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.master("local[2]")
        .appName("stagefs-spark-writer")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "768m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.hadoop.hive.metastore.uris", thrift_uri)
        .config("spark.hadoop.hive.metastore.warehouse.dir", warehouse)
        .config("spark.hadoop.fs.defaultFS", warehouse.split("/warehouse")[0])
        # HiveConf.FIRE_EVENTS_FOR_DML: Hive's loadTable/loadPartition fire
        # INSERT events only with it on.
        .config("spark.hadoop.hive.metastore.dml.events", "true")
        .config("spark.hadoop.hive.exec.dynamic.partition", "true")
        .config("spark.hadoop.hive.exec.dynamic.partition.mode", "nonstrict")
        # Hive-format tables written by Hive's load path (InsertIntoHiveTable
        # and Hive.loadTable/loadPartition), not converted to Spark's own
        # Parquet writer, which writes files and partitions with no INSERT
        # event at all (docs/HIVE.md, "Spark as a writer").
        .config("spark.sql.hive.convertMetastoreParquet", "false")
        .config("spark.sql.hive.convertMetastoreCtas", "false")
        .config("spark.sql.hive.convertMetastoreInsertDir", "false")
        .enableHiveSupport()
    )
    if jars_file:
        with open(jars_file) as f:
            jars = f.read().strip()
        b = (
            b.config("spark.sql.hive.metastore.version", "4.0.1")
            .config("spark.sql.hive.metastore.jars", "path")
            .config("spark.sql.hive.metastore.jars.path", ",".join("file://" + j for j in jars.split(":")))
        )
    return b.getOrCreate()


def rows(df):
    return sorted([[("" if x is None else str(x)) for x in r] for r in df.collect()])


def read_replica(spark, mount):
    out = {}
    for t in spark.catalog.listTables(DB):
        name = t.name
        meta = spark.sql(f"DESCRIBE FORMATTED {DB}.{name}").collect()
        fmt = " ".join(str(r[1]) for r in meta if r[0] and r[0].strip() == "InputFormat")
        path = "file://" + os.path.join(mount, DB, name)
        cols = [c.name for c in spark.catalog.listColumns(f"{DB}.{name}")]
        data_cols = [c.name for c in spark.catalog.listColumns(f"{DB}.{name}") if not c.isPartition]
        if "Parquet" in fmt:
            df = spark.read.option("basePath", path).parquet(path)
        else:
            schema = ", ".join(f"{c} STRING" for c in data_cols)
            df = spark.read.schema(schema).option("sep", "\x01").option("basePath", path).csv(path)
        replica = rows(df.selectExpr(*[f"CAST({c} AS STRING)" for c in cols]))
        source = rows(spark.table(f"{DB}.{name}").selectExpr(*[f"CAST({c} AS STRING)" for c in cols]))
        out[name] = {"replica": replica, "source": source}
    return out


def main():
    thrift_uri, warehouse = sys.argv[1], sys.argv[2]
    jars_file = sys.argv[3] if len(sys.argv) > 3 else None
    spark = session(thrift_uri, warehouse, jars_file)
    spark.sparkContext.setLogLevel("WARN")
    client = spark.conf.get("spark.sql.hive.metastore.version", "2.3.10")
    say({"ready": True, "spark": spark.version, "hive_client": client})
    for n, step in enumerate(STEPS):
        for sql in step:
            spark.sql(sql)
        say({"step": n, "sql": step})
        wait_for("next")
    say({"steps_done": True})
    (mount,) = wait_for("read")
    say({"read": read_replica(spark, mount)})
    wait_for("quit")
    spark.stop()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - reported to the test
        traceback.print_exc()
        say({"error": f"{type(e).__name__}: {e}"})
        sys.exit(1)
