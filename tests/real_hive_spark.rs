//! Spark as a writer through a real Hive metastore (issue 31): pyspark
//! (`enableHiveSupport()`, local mode, one session) writes Hive-format
//! tables through Hive 4.0.1's standalone metastore (tests/servers/hms.rs,
//! our NotificationLogListener, DML events and change management on) on a
//! private PostgreSQL, with warehouse and cmroot on a private HDFS
//! (MiniDFSCluster): CREATE DATABASE, CREATE TABLE (Parquet and text,
//! partitioned and not), INSERT INTO, INSERT OVERWRITE of a static
//! partition and of a table, dynamic partition inserts and a CTAS
//! (`tests/data/spark_hive_writer.py`). The stagefs daemon follows the
//! metastore's database.
//!
//! Spark's Hive client is Hive 4.0.1's
//! (`spark.sql.hive.metastore.version=4.0.1`, the jars of
//! tests/java/spark-hive4-client, built by `scripts/setup-servers.sh` into
//! the Maven cache): Spark's built-in 2.3.10 client fires INSERT events a
//! Hive 3/4 metastore records wrongly (docs/HIVE.md, "Spark as a writer").
//!
//! The checks: every row decodes, every INSERT names its files with HDFS
//! checksums; two readers walk the mount while Spark writes and every walk
//! equals the source (the launcher's oracle: the metastore API and an HDFS
//! listing, taken after each Spark step) at its state-id (inside a step of
//! several events, each partition before or after the step); at the end the
//! mount equals the source exactly; and Spark reads the replica's files and
//! gets the rows it reads from the metastore's tables. Run twice: with the
//! tables kept managed (`--translate-managed false`), where every file is in
//! an event, and with Hive 4's default, where the metastore makes them
//! external (`TRANSLATED_TO_EXTERNAL`) and the ADD_PARTITION of each
//! partition a load creates names none of its files, which stagefs lists
//! at the event (docs/HIVE.md "Partitions an event adds without their
//! files").
//!
//! Needs pyspark and Java 17 (`scripts/setup-readers.sh`), and
//! `scripts/setup-servers.sh` (the HDFS and metastore launchers, the Hive
//! 4.0.1 client jars) and `scripts/setup.sh` (PostgreSQL).

mod common;
#[path = "common/dbserver.rs"]
mod dbserver;
#[path = "common/real_hive_mount.rs"]
mod real_hive_mount;
mod servers;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::daemon::{visible, Daemon, DaemonArgs, HiveMetastoreArgs};
use common::require;
use dbserver::{DbServer, Kind, PASSWORD};
use real_hive_mount::{
    all_rows, check_walk, metastore_db, oracle_tables, walk_mount, Tables, Walk, Walkers, Within,
};
use servers::hms::{Encoder, Hive, ManagedTables, RealMetastore};
use servers::MiniHdfs;
use stagefs::source::hive::message::decode_message;
use stagefs::source::hive::model::{FileUri, HiveMessage, NotificationRow};

const WRITER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/spark_hive_writer.py"
);

/// A Spark step (statements) or the replica's read: at most this long.
const STEP_TIMEOUT: Duration = Duration::from_secs(240);

/// The Hive 4.0.1 client jars' class path (tests/java/spark-hive4-client).
fn hive4_client_jars() -> PathBuf {
    let cp = servers::repo_root().join("tests/java/spark-hive4-client/target/classpath.txt");
    let ok = std::fs::read_to_string(&cp).is_ok_and(|s| {
        s.trim()
            .split(':')
            .all(|j| std::path::Path::new(j).is_file())
    });
    assert!(
        ok,
        "the Hive 4.0.1 client jars for Spark are not resolved ({} is missing or names a missing jar): run scripts/setup-servers.sh",
        cp.display()
    );
    cp
}

/// The writer process: its JSON lines, and its stdin for the next word.
struct Writer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
}

impl Writer {
    fn start(hms: &RealMetastore, jars: &std::path::Path, log: &std::path::Path) -> Writer {
        let warehouse = hms.ready()["warehouse"]
            .as_str()
            .expect("warehouse")
            .to_owned();
        let mut cmd = Command::new("python3");
        cmd.arg(WRITER)
            .arg(hms.thrift_uri())
            .arg(&warehouse)
            .arg(jars)
            .env_remove("HADOOP_CONF_DIR")
            .env_remove("HIVE_CONF_DIR")
            .env_remove("SPARK_HOME")
            .env("PYSPARK_PYTHON", "python3")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log).expect("writer log")));
        let java_home = std::path::Path::new("/usr/lib/jvm/java-17-openjdk-amd64");
        if std::env::var_os("JAVA_HOME").is_none() && java_home.is_dir() {
            cmd.env("JAVA_HOME", java_home);
        }
        let mut child = cmd.spawn().expect("python3");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Only the protocol's JSON objects; anything else is noise.
                if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Writer {
            child,
            stdin,
            lines,
        }
    }

    /// The next JSON line; panics (with the writer's log) on an error
    /// line, an exit or a timeout.
    fn next(&mut self, log: &std::path::Path) -> Value {
        let tail = || servers::log_tail(log, 6000);
        match self.lines.recv_timeout(STEP_TIMEOUT) {
            Ok(v) if v.get("error").is_some() => {
                panic!("the Spark writer failed: {}\n{}", v["error"], tail())
            }
            Ok(v) => v,
            Err(e) => panic!("no answer from the Spark writer ({e})\n{}", tail()),
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .expect("write to the Spark writer");
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every notification row, decoded by stagefs's decoder.
fn decoded_rows(server: &DbServer) -> Vec<(NotificationRow, HiveMessage)> {
    let (_, rows) = all_rows(server);
    rows.into_iter()
        .map(|row| match decode_message(&row) {
            Ok(m) => (row, m),
            Err(e) => panic!(
                "stagefs rejects Spark's row {} ({}): {e}\n{:?}",
                row.event_id, row.event_type, row.message
            ),
        })
        .collect()
}

/// Hidden paths (staging directories, `_SUCCESS`) the source's listing
/// skipped, over every table and partition.
fn hidden_files(source: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for t in source.as_object().expect("source object").values() {
        let lists = std::iter::once(&t["hidden"]).chain(
            t["partitions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| &p["hidden"]),
        );
        for list in lists {
            out.extend(
                list.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|h| h.as_str().map(str::to_owned)),
            );
        }
    }
    out
}

/// What one run saw.
struct Run {
    /// The event id and the source's tables after each Spark step (the
    /// first: before any).
    oracles: Vec<(u64, Tables)>,
    /// The readers' walks while Spark wrote, and the walks across a view
    /// move (not checked).
    seen: Vec<Walk>,
    moved: usize,
    /// The mount once stagefs reached the last step's id.
    end: Walk,
    status: Value,
    /// Every notification row, decoded.
    rows: Vec<(NotificationRow, HiveMessage)>,
    /// Spark's read of each table: `replica` (the mount's files) and
    /// `source` (the metastore's table), rows as sorted string lists.
    read: serde_json::Map<String, Value>,
    /// Hidden files (`_SUCCESS`, staging directories) left in the source's
    /// table and partition directories.
    hidden: Vec<String>,
    hdfs_uri: String,
}

/// Starts PostgreSQL, HDFS, the metastore (managed tables as `managed`
/// says) and the daemon, runs the Spark writer's steps with two readers
/// walking the mount, and has Spark read the replica.
fn spark_writes(managed: ManagedTables) -> Run {
    require(&["pyspark"], true);
    let jars = hive4_client_jars();
    let server = DbServer::start(Kind::Postgres);
    server.create_database("hive");
    let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
    let mut hms = RealMetastore::start_with(
        Hive::V4,
        &metastore_db(Kind::Postgres, &server),
        hdfs.uri(),
        Encoder::Json,
        managed,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("metastore ready: {}", hms.ready());

    let tmp = tempfile::tempdir().expect("tempdir");
    let log = tmp.path().join("spark-writer.log");
    let started = Instant::now();
    let mut writer = Writer::start(&hms, &jars, &log);
    let ready = writer.next(&log);
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["hive_client"], "4.0.1", "{ready}");
    eprintln!("spark ready after {:?}: {ready}", started.elapsed());

    let args = DaemonArgs::under(tmp.path()).hive_metastore(HiveMetastoreArgs {
        url: server.url("hive"),
        password: PASSWORD.into(),
        source_map: Vec::new(),
        poll_ms: 50,
    });
    let first = hms.call(&["state"]).unwrap_or_else(|e| panic!("{e}"));
    let mut oracles: Vec<(u64, Tables)> = vec![(
        first["event_id"].as_u64().expect("event_id"),
        oracle_tables(&first["source"]),
    )];
    let d = Daemon::start(args);
    let mnt = d.mnt().to_owned();
    let walkers = Walkers::start(&mnt, 2);

    // Each Spark step, then the source's state after it.
    let mut hidden = Vec::new();
    let writes = Instant::now();
    loop {
        let line = writer.next(&log);
        if line.get("steps_done").is_some() {
            break;
        }
        assert!(line.get("step").is_some(), "{line}");
        let reply = hms.call(&["state"]).unwrap_or_else(|e| panic!("{e}"));
        let id = reply["event_id"].as_u64().expect("event_id");
        let prev = oracles.last().expect("oracle").0;
        assert!(id > prev, "step {line} wrote no event ({prev} → {id})");
        eprintln!("step {} → event {id}: {}", line["step"], line["sql"]);
        oracles.push((id, oracle_tables(&reply["source"])));
        hidden = hidden_files(&reply["source"]);
        writer.send("next");
    }
    let last = oracles.last().expect("oracle").0;
    let status = d.wait_status_for(
        &format!("visible >= {last}"),
        Duration::from_secs(120),
        |s| visible(s) >= last,
    );
    let (seen, moved) = walkers.finish();
    eprintln!(
        "spark wrote for {:?}; status at the end: {status}",
        writes.elapsed()
    );
    assert_eq!(visible(&status), last, "{status}");
    let _ = common::getxattr(&mnt, "user.stagefs.visible");
    let end = walk_mount(&mnt).expect("a quiet mount's view holds");
    assert_eq!(end.state, last);

    // Spark reads the replica's files and the source's tables.
    writer.send(&format!("read {}", mnt.display()));
    let read = writer.next(&log);
    let read = read["read"].as_object().expect("read answer").clone();
    eprintln!("spark read: {read:?}");
    drop(writer);
    let rows = decoded_rows(&server);
    drop(d);
    drop(hms);
    Run {
        oracles,
        seen,
        moved,
        end,
        status,
        rows,
        read,
        hidden,
        hdfs_uri: hdfs.uri().to_owned(),
    }
}

impl Run {
    /// The event types written, counted; prints each INSERT and
    /// ADD_PARTITION with its files.
    fn event_types(&self) -> BTreeMap<String, usize> {
        let mut types = BTreeMap::<String, usize>::new();
        for (row, m) in &self.rows {
            *types.entry(row.event_type.clone()).or_default() += 1;
            let names = |files: &[FileUri]| -> Vec<String> {
                files
                    .iter()
                    .map(|f| f.path.rsplit('/').next().unwrap_or("").to_owned())
                    .collect()
            };
            match m {
                HiveMessage::Insert {
                    files,
                    replace,
                    partition,
                    ..
                } => eprintln!(
                    "{} INSERT {:?} replace={replace} {:?}",
                    row.event_id,
                    partition.as_ref().map(|p| &p.values),
                    names(files)
                ),
                HiveMessage::AddPartition {
                    partitions, files, ..
                } => eprintln!(
                    "{} ADD_PARTITION {:?} {:?}",
                    row.event_id,
                    partitions.iter().map(|p| &p.values).collect::<Vec<_>>(),
                    files.iter().map(|f| names(f)).collect::<Vec<_>>()
                ),
                _ => {}
            }
        }
        eprintln!(
            "event types: {types:?}; hidden files left at the source: {:?}",
            self.hidden
        );
        types
    }

    /// Every file an event names carries its HDFS checksum.
    fn assert_checksums(&self) {
        for (row, m) in &self.rows {
            let files: Vec<&FileUri> = match m {
                HiveMessage::Insert { files, .. } | HiveMessage::CreateTable { files, .. } => {
                    files.iter().collect()
                }
                HiveMessage::AddPartition { files, .. } => files.iter().flatten().collect(),
                _ => Vec::new(),
            };
            for f in files {
                assert!(
                    f.path.starts_with(&self.hdfs_uri),
                    "{}: {f:?}",
                    row.event_id
                );
                assert!(f.checksum.is_some(), "{}: no checksum: {f:?}", row.event_id);
            }
        }
    }

    fn distinct_states(&self) -> usize {
        self.seen
            .iter()
            .map(|w| w.state)
            .collect::<std::collections::BTreeSet<u64>>()
            .len()
    }
}

impl Run {
    /// Every walk equals the source at its view's state-id (0 anomalies,
    /// more than 5 distinct states), the final mount equals the source,
    /// every table holds files, and Spark reads from the replica's files
    /// what it reads from the metastore's tables; prints the figures.
    fn assert_exact_replica(&self) {
        assert!(self.status["stalled"].is_null(), "{}", self.status);
        let bad: Vec<String> = self
            .seen
            .iter()
            .flat_map(|w| check_walk(&self.oracles, w, Within::Partition))
            .collect();
        eprintln!(
            "{} walks at {} distinct states of {} events, {} walks across a view move, {} anomalies",
            self.seen.len(),
            self.distinct_states(),
            self.end.state - self.oracles[0].0,
            self.moved,
            bad.len()
        );
        assert!(
            bad.is_empty(),
            "{} anomalies, first: {:#?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        );
        assert!(
            self.distinct_states() > 5,
            "{} states",
            self.distinct_states()
        );

        // The final content, exactly, and Spark's answers from it.
        let want = &self.oracles.last().expect("oracle").1;
        assert_eq!(&self.end.tables, want, "the mount against the source");
        for t in ["sw.orders", "sw.flat", "sw.notes", "sw.ctas"] {
            assert!(
                want.get(t).is_some_and(|f| !f.is_empty()),
                "{t} holds files at the source: {want:?}"
            );
        }
        assert_eq!(self.read.len(), 4, "{:?}", self.read);
        for (table, r) in &self.read {
            assert!(
                !r["source"].as_array().expect("rows").is_empty(),
                "{table}: {r}"
            );
            assert_eq!(r["replica"], r["source"], "{table}: replica against source");
        }
    }

    /// The ADD_PARTITION rows that name no file for some partition.
    fn partitions_added_without_files(&self) -> usize {
        self.rows
            .iter()
            .filter_map(|(_, m)| match m {
                HiveMessage::AddPartition {
                    partitions, files, ..
                } => Some(
                    (0..partitions.len())
                        .filter(|&i| files.get(i).is_none_or(Vec::is_empty))
                        .count(),
                ),
                _ => None,
            })
            .sum()
    }
}

/// Spark's managed tables kept managed (no metadata transformer, as a
/// Hive 3.1 metastore or a Hive 4 one configured so): every file Spark's
/// Hive client writes is named by an event, and the replica is exact.
#[test]
fn stagefs_replicates_what_spark_writes_to_managed_tables() {
    let run = spark_writes(ManagedTables::Kept);
    let types = run.event_types();
    run.assert_checksums();
    assert!(types.get("INSERT") >= Some(&6), "{types:?}");
    assert!(types.get("ADD_PARTITION") >= Some(&3), "{types:?}");
    assert_eq!(
        run.status["not_in_log"],
        serde_json::json!([]),
        "managed tables: {}",
        run.status
    );
    run.assert_exact_replica();
}

/// Hive 4's default: the metadata transformer makes Spark's tables
/// external (`TRANSLATED_TO_EXTERNAL`), and Hive's listener names no files
/// in their ADD_PARTITION rows, although each partition a load creates
/// already holds its files. stagefs lists those partitions at the source
/// at their event (docs/HIVE.md "Partitions an event adds without their
/// files"), and the replica is exact.
#[test]
fn stagefs_replicates_what_spark_writes_to_hive4_translated_tables() {
    let run = spark_writes(ManagedTables::Translated);
    let types = run.event_types();
    run.assert_checksums();
    assert!(types.get("INSERT") >= Some(&4), "{types:?}");
    let unnamed = run.partitions_added_without_files();
    assert!(
        unnamed >= 3,
        "partitions added without their files: {unnamed} ({types:?})"
    );
    assert_eq!(
        run.status["not_in_log"],
        serde_json::json!([]),
        "tables Hive translated to external are written with events: {}",
        run.status
    );
    run.assert_exact_replica();
}
