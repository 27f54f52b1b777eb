//! stagefs against a real Hive metastore: Hive 4.0.1's standalone metastore
//! (tests/java/hms-launcher) on a private PostgreSQL, its schema made by
//! Hive's own schematool, our `NotificationLogListener` as transactional
//! listener (rows built by Hive's MessageBuilder, inserted by its RawStore),
//! DML events and change management on, warehouse and cmroot on a private
//! HDFS (Hadoop's MiniDFSCluster); also Hive 3.1.3 with HCatalog's own
//! DbNotificationListener (tests/java/hms3-launcher). A driver does through
//! `HiveMetaStoreClient` what HiveServer2 does for CREATE DATABASE/TABLE,
//! ADD/DROP PARTITION, INSERT INTO, INSERT OVERWRITE (recycling the replaced
//! files through ReplChangeManager), rename, truncate and DROP TABLE.
//!
//! The check: every `NOTIFICATION_LOG` row Hive wrote, read through stagefs's
//! own metastore source, is decoded by stagefs's decoder without a
//! rejection, and folding the decoded messages gives exactly the source's
//! tables, partitions and files (name and HDFS checksum), as the driver's
//! oracle reads them from the metastore API and an HDFS listing. Both
//! message encoders (JSON and gzip JSON) are run.
//!
//! `STAGEFS_CAPTURE_HIVE_ROWS=1` also writes the rows to
//! `tests/data/hive-real/` (see its README).
//!
//! Needs `scripts/setup-servers.sh` (Java 17 + Maven: the HDFS and metastore
//! launchers) and `scripts/setup.sh` (PostgreSQL).

mod common;
#[path = "common/dbserver.rs"]
mod dbserver;
#[path = "common/real_hive_mount.rs"]
mod real_hive_mount;
mod servers;

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::Value;

use common::daemon::{visible, Daemon, DaemonArgs, HiveMetastoreArgs};
use dbserver::{DbServer, Kind, PASSWORD};
use real_hive_mount::{
    all_rows, check_walk, metastore_db, oracle_tables, walk_mount, RealHive, Tables, Walkers,
    Within,
};
use servers::hms::{Encoder, Hive, ManagedTables, RealMetastore};
use servers::MiniHdfs;
use stagefs::source::hive::message::decode_message;
use stagefs::source::hive::model::{FileUri, HiveMessage, HiveTable, NotificationRow, RowSource};

/// `db.table` → partition values (empty for an unpartitioned table) →
/// file name → HDFS checksum.
type Content = BTreeMap<String, BTreeMap<Vec<String>, BTreeMap<String, Option<String>>>>;

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

fn file_entries(files: &[FileUri]) -> impl Iterator<Item = (String, Option<String>)> + '_ {
    files
        .iter()
        .map(|f| (file_name(&f.path), f.checksum.clone()))
}

/// The source's content as the driver's oracle shows it.
fn oracle(source: &Value) -> Content {
    let files = |v: &Value| -> BTreeMap<String, Option<String>> {
        v.as_array()
            .expect("files")
            .iter()
            .map(|f| {
                (
                    file_name(f["path"].as_str().expect("path")),
                    f["checksum"].as_str().map(str::to_owned),
                )
            })
            .collect()
    };
    let mut out = Content::new();
    for (key, t) in source.as_object().expect("source object") {
        let mut parts = BTreeMap::new();
        if let Some(ps) = t["partitions"].as_array() {
            for p in ps {
                let values = p["values"]
                    .as_array()
                    .expect("values")
                    .iter()
                    .map(|v| v.as_str().expect("value").to_owned())
                    .collect();
                parts.insert(values, files(&p["files"]));
            }
        } else {
            parts.insert(Vec::new(), files(&t["files"]));
        }
        out.insert(key.clone(), parts);
    }
    out
}

/// Whether Hive's listener names no files of `table`'s added partitions
/// (an external table, translated from managed by Hive 4's default or not).
fn external(table: &HiveTable) -> bool {
    let param = |k: &str| {
        table
            .parameters
            .iter()
            .any(|(key, v)| key.eq_ignore_ascii_case(k) && v.eq_ignore_ascii_case("true"))
    };
    table.table_type.as_deref() == Some("EXTERNAL_TABLE") || param("EXTERNAL")
}

/// What the decoded notifications (each with its event id) say the
/// source holds. A partition an external table's ADD_PARTITION adds
/// without naming its files gets what stagefs lists there at the event:
/// the files the oracle shows in it after the driver's operation that
/// wrote the event (`replies`, in order: the first whose event id is at
/// least the row's). The operations after such an add leave the
/// partition alone until that reply, so the oracle is its content at
/// the event.
fn fold(messages: &[(i64, HiveMessage)], replies: &[Value]) -> Content {
    let listed = |event_id: i64, key: &str, values: &[String]| {
        let reply = replies
            .iter()
            .find(|r| r["event_id"].as_i64().expect("event_id") >= event_id)
            .expect("a reply after every event");
        oracle(&reply["source"])
            .get(key)
            .and_then(|t| t.get(values))
            .cloned()
            .unwrap_or_default()
    };
    let mut out = Content::new();
    for (event_id, m) in messages {
        match m {
            HiveMessage::CreateDatabase { .. } | HiveMessage::NoData { .. } => {}
            HiveMessage::CommitTxn { txn_id } => panic!("no transactions were run ({txn_id})"),
            HiveMessage::DropDatabase { db } => {
                out.retain(|k, _| !k.starts_with(&format!("{db}.")));
            }
            HiveMessage::CreateTable { table, files } => {
                let mut parts = BTreeMap::new();
                if table.partition_keys.is_empty() {
                    parts.insert(Vec::new(), file_entries(files).collect());
                }
                out.insert(format!("{}.{}", table.db, table.name), parts);
            }
            HiveMessage::DropTable { db, table } => {
                out.remove(&format!("{db}.{table}"));
            }
            HiveMessage::AlterTable {
                before,
                after,
                is_truncate,
            } => {
                let old = format!("{}.{}", before.db, before.name);
                let new = format!("{}.{}", after.db, after.name);
                let mut parts = out.remove(&old).expect("altered table known");
                if *is_truncate {
                    parts.values_mut().for_each(BTreeMap::clear);
                }
                out.insert(new, parts);
            }
            HiveMessage::AddPartition {
                table,
                partitions,
                files,
            } => {
                let key = format!("{}.{}", table.db, table.name);
                let t = out.get_mut(&key).expect("table known");
                for (i, p) in partitions.iter().enumerate() {
                    let named = files.get(i).filter(|f| !f.is_empty());
                    let fs = match named {
                        Some(f) => file_entries(f).collect(),
                        None if external(table) => listed(*event_id, &key, &p.values),
                        None => BTreeMap::new(),
                    };
                    t.insert(p.values.clone(), fs);
                }
            }
            HiveMessage::AlterPartition {
                table,
                after,
                is_truncate,
                ..
            } => {
                if *is_truncate {
                    let t = out
                        .get_mut(&format!("{}.{}", table.db, table.name))
                        .expect("table known");
                    t.get_mut(&after.values).expect("partition known").clear();
                }
            }
            HiveMessage::DropPartition { table, partitions } => {
                let t = out
                    .get_mut(&format!("{}.{}", table.db, table.name))
                    .expect("table known");
                for p in partitions {
                    t.remove(p);
                }
            }
            HiveMessage::TruncatePartitions { table, partitions } => {
                let t = out
                    .get_mut(&format!("{}.{}", table.db, table.name))
                    .expect("table known");
                for p in partitions {
                    t.get_mut(p).expect("partition known").clear();
                }
            }
            HiveMessage::Insert {
                table,
                partition,
                replace,
                files,
            } => {
                let t = out
                    .get_mut(&format!("{}.{}", table.db, table.name))
                    .expect("table known");
                let key = partition
                    .as_ref()
                    .map(|p| p.values.clone())
                    .unwrap_or_default();
                let entry = t.entry(key).or_default();
                if *replace {
                    entry.clear();
                }
                entry.extend(file_entries(files));
            }
        }
    }
    out
}

fn write_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("write local file");
    path.display().to_string()
}

/// The driver's operations; returns every reply (event id + oracle), in
/// order.
fn workload(hms: &mut RealMetastore) -> Vec<Value> {
    let dir = hms.scratch();
    let a = write_file(&dir, "a.csv", "1,one\n2,two\n");
    let b = write_file(&dir, "b.csv", "3,three\n");
    let c = write_file(&dir, "c.csv", "4,four\n5,five\n6,six\n");
    let ops: &[&[&str]] = &[
        &["create-db", "sales"],
        &["create-table", "sales", "orders", "text", "dt", "region"],
        &["add-partition", "sales", "orders", "2024-01-01", "eu"],
        &["add-partition", "sales", "orders", "2024-01-02", "us"],
        &["insert", "sales", "orders", "into", &a, "2024-01-01", "eu"],
        &["insert", "sales", "orders", "into", &b, "2024-01-01", "eu"],
        &["insert", "sales", "orders", "into", &c, "2024-01-02", "us"],
        &[
            "insert",
            "sales",
            "orders",
            "overwrite",
            &b,
            "2024-01-01",
            "eu",
        ],
        &["create-table", "sales", "flat", "parquet"],
        &["insert", "sales", "flat", "into", &a],
        &["insert", "sales", "flat", "into", &c],
        &["create-table", "sales", "gone", "text"],
        &["insert", "sales", "gone", "into", &a],
        &["drop-table", "sales", "gone"],
        &["add-partition", "sales", "orders", "2024-01-03", "eu"],
        &["insert", "sales", "orders", "into", &a, "2024-01-03", "eu"],
        &["drop-partition", "sales", "orders", "2024-01-02", "us"],
        // ALTER TABLE archive EXCHANGE PARTITION … WITH TABLE orders: a
        // whole spec, then a partial one (every region of the day).
        &["create-table", "sales", "archive", "text", "dt", "region"],
        &[
            "exchange",
            "sales",
            "orders",
            "sales",
            "archive",
            "2024-01-01",
            "eu",
        ],
        &["add-partition", "sales", "orders", "2024-01-03", "us"],
        &["insert", "sales", "orders", "into", &c, "2024-01-03", "us"],
        &[
            "exchange",
            "sales",
            "orders",
            "sales",
            "archive",
            "2024-01-03",
        ],
        &["insert", "sales", "archive", "into", &c, "2024-01-01", "eu"],
        &["rename", "sales", "flat", "flat2"],
        &["insert", "sales", "flat2", "overwrite", &b],
        &["create-table", "sales", "trunc", "text"],
        &["insert", "sales", "trunc", "into", &c],
        &["truncate", "sales", "trunc"],
    ];
    let mut replies = Vec::new();
    let mut prev = hms.ready()["event_id"].as_i64().unwrap_or(0);
    for op in ops {
        let reply = hms.call(op).unwrap_or_else(|e| panic!("{e}"));
        let id = reply["event_id"].as_i64().expect("event_id");
        assert!(id > prev, "{op:?} wrote no notification ({prev} → {id})");
        prev = id;
        replies.push(reply);
    }
    replies
}

fn real_metastore_rows_decode_and_fold_to_the_source(hive: Hive, kind: Kind, encoder: Encoder) {
    let server = DbServer::start(kind);
    server.create_database("hive");
    let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
    let db = metastore_db(kind, &server);
    let mut hms =
        RealMetastore::start_hive(hive, &db, hdfs.uri(), encoder).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("metastore ready: {}", hms.ready());
    let replies = workload(&mut hms);
    let last = replies.last().expect("a reply").clone();
    let newest = last["event_id"].as_i64().expect("event_id");

    // The rows Hive wrote, through stagefs's own metastore source.
    let (mut source, rows) = all_rows(&server);
    assert_eq!(
        source.newest_event_id().expect("newest id"),
        Some(newest),
        "NOTIFICATION_SEQUENCE agrees with the metastore API"
    );
    assert_eq!(rows.last().map(|r| r.event_id), Some(newest));
    let want_format = match encoder {
        Encoder::Json => "json-0.2",
        Encoder::Gzip => "gzip(json-2.0)",
    };
    let mut messages = Vec::new();
    let mut types = BTreeMap::<String, usize>::new();
    for row in &rows {
        assert_eq!(
            row.message_format.as_deref(),
            Some(want_format),
            "event {}",
            row.event_id
        );
        *types.entry(row.event_type.clone()).or_default() += 1;
        match decode_message(row) {
            Ok(m) => messages.push((row.event_id, m)),
            Err(e) => panic!(
                "stagefs rejects Hive's row {} ({}): {e}\n{:?}",
                row.event_id, row.event_type, row.message
            ),
        }
    }
    eprintln!("event types: {types:?}");
    for t in [
        "CREATE_DATABASE",
        "CREATE_TABLE",
        "ADD_PARTITION",
        "INSERT",
        "DROP_PARTITION",
        "ALTER_TABLE",
        "DROP_TABLE",
    ] {
        assert!(types.contains_key(t), "no {t} row among {types:?}");
    }
    // Every insert names its file with Hive's HDFS checksum and the cmroot.
    for (_, m) in &messages {
        if let HiveMessage::Insert { files, .. } = m {
            assert!(!files.is_empty(), "{m:?}");
            for f in files {
                assert!(f.path.starts_with(hdfs.uri()), "{f:?}");
                assert!(f.checksum.is_some(), "{f:?}");
                assert!(f.cm_root.is_some(), "{f:?}");
            }
        }
    }
    assert_eq!(
        fold(&messages, &replies),
        oracle(&last["source"]),
        "the decoded log against the source"
    );

    if std::env::var_os("STAGEFS_CAPTURE_HIVE_ROWS").is_some() {
        let dir = servers::repo_root().join("tests/data/hive-real");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let name = match (hive, kind, encoder) {
            (Hive::V3, Kind::Postgres, _) => "hive3-postgres-json.jsonl",
            (Hive::V3, Kind::MariaDb, _) => "hive3-mariadb-json.jsonl",
            (Hive::V4, Kind::Postgres, Encoder::Json) => "postgres-json.jsonl",
            (Hive::V4, Kind::Postgres, Encoder::Gzip) => "postgres-gzip.jsonl",
            (Hive::V4, Kind::MariaDb, Encoder::Json) => "mariadb-json.jsonl",
            (Hive::V4, Kind::MariaDb, Encoder::Gzip) => "mariadb-gzip.jsonl",
        };
        let mut out = String::new();
        for row in &rows {
            out.push_str(&serde_json::to_string(row).expect("row"));
            out.push('\n');
        }
        std::fs::write(dir.join(name), out).expect("write rows");
        let oracle_name = name.replace(".jsonl", "-source.json");
        std::fs::write(
            dir.join(oracle_name),
            serde_json::to_string_pretty(&serde_json::json!({ "replies": replies }))
                .expect("oracle"),
        )
        .expect("write oracle");
    }
}

/// The captured rows (tests/data/hive-real/, written by a run with
/// `STAGEFS_CAPTURE_HIVE_ROWS=1`) decode and fold to the captured oracle,
/// without Java or a database: the real rows stay in the fast tests.
#[test]
fn captured_real_rows_decode_and_fold_to_the_captured_source() {
    let dir = servers::repo_root().join("tests/data/hive-real");
    for name in [
        "postgres-json",
        "postgres-gzip",
        "mariadb-json",
        "hive3-postgres-json",
        "hive3-mariadb-json",
    ] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.jsonl"))).expect("rows");
        let captured: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}-source.json"))).expect("oracle"),
        )
        .expect("oracle JSON");
        let replies = captured["replies"].as_array().expect("replies");
        let messages: Vec<(i64, HiveMessage)> = text
            .lines()
            .map(|l| {
                let row: NotificationRow = serde_json::from_str(l).expect("row JSON");
                let m =
                    decode_message(&row).unwrap_or_else(|e| panic!("{name} {}: {e}", row.event_id));
                (row.event_id, m)
            })
            .collect();
        assert!(messages.len() > 20, "{name}: {} rows", messages.len());
        let last = replies.last().expect("a reply");
        assert_eq!(fold(&messages, replies), oracle(&last["source"]), "{name}");
    }
}

#[test]
fn real_metastore_json_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Hive::V4, Kind::Postgres, Encoder::Json);
}

#[test]
fn real_metastore_gzip_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Hive::V4, Kind::Postgres, Encoder::Gzip);
}

#[test]
fn real_metastore_on_mariadb_json_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Hive::V4, Kind::MariaDb, Encoder::Json);
}

/// Hive 3.1.3 with HCatalog's own DbNotificationListener (json-0.2 only).
#[test]
fn hive3_metastore_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Hive::V3, Kind::Postgres, Encoder::Json);
}

/// Hive 3.1.3 on MariaDB (`schematool -dbType mysql`, DataNucleus told
/// to use its MySQL adapter: see the launcher). Long-only, to keep the
/// default suite's time: its captured rows
/// (tests/data/hive-real/hive3-mariadb-json.jsonl) are decoded and folded
/// by the fast offline test, and `stagefs_follows_the_hive3_metastore_on_mariadb`
/// follows the live metastore in the default run.
#[test]
fn hive3_metastore_on_mariadb_rows_decode_and_fold_to_the_source() {
    if std::env::var_os("STAGEFS_LONG_TESTS").is_none() {
        eprintln!("SKIPPED: needs STAGEFS_LONG_TESTS=1");
        return;
    }
    real_metastore_rows_decode_and_fold_to_the_source(Hive::V3, Kind::MariaDb, Encoder::Json);
}

// ---------------------------------------------------------------------------
// The stagefs daemon following the real metastore.
// ---------------------------------------------------------------------------

/// The driver's operations for round `r` in database `db`: CREATE/ALTER/
/// DROP, INSERT INTO, INSERT OVERWRITE reusing `000000_0`, truncate of a
/// table and of a partition, rename, drop of a partition, a table and a
/// whole database (cascade, the previous round's).
fn mount_round(r: usize, dir: &std::path::Path) -> Vec<Vec<String>> {
    let db = format!("r{r}");
    let file = |n: usize| {
        let body: String = (0..(n % 7 + 1))
            .map(|i| format!("{},round {r} file {n} row {i}\n", n * 10 + i))
            .collect();
        write_file(dir, &format!("r{r}-{n}.csv"), &body)
    };
    let mut ops: Vec<Vec<&str>> = Vec::new();
    let f: Vec<String> = (0..15).map(file).collect();
    ops.push(vec!["create-db", &db, "repl-source"]);
    ops.push(vec!["create-table", &db, "flat", "parquet"]);
    ops.push(vec!["insert", &db, "flat", "into", &f[4]]);
    ops.push(vec!["insert", &db, "flat", "overwrite", &f[5]]);
    ops.push(vec!["insert", &db, "flat", "into", &f[6]]);
    ops.push(vec!["create-table", &db, "orders", "text", "dt", "region"]);
    ops.push(vec!["add-partition", &db, "orders", "2024-01-01", "eu"]);
    ops.push(vec!["add-partition", &db, "orders", "2024-01-02", "us"]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "into",
        &f[0],
        "2024-01-01",
        "eu",
    ]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "into",
        &f[1],
        "2024-01-01",
        "eu",
    ]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "into",
        &f[2],
        "2024-01-02",
        "us",
    ]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "overwrite",
        &f[3],
        "2024-01-01",
        "eu",
    ]);
    ops.push(vec!["create-table", &db, "gone", "text"]);
    ops.push(vec!["insert", &db, "gone", "into", &f[7]]);
    ops.push(vec!["drop-table", &db, "gone"]);
    ops.push(vec!["add-partition", &db, "orders", "2024-01-03", "eu"]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "into",
        &f[8],
        "2024-01-03",
        "eu",
    ]);
    ops.push(vec!["drop-partition", &db, "orders", "2024-01-02", "us"]);
    // EXCHANGE PARTITION into `archive`: one partition, then every region
    // of a day (a partial spec); the destination is written after it.
    ops.push(vec!["create-table", &db, "archive", "text", "dt", "region"]);
    ops.push(vec![
        "exchange",
        &db,
        "orders",
        &db,
        "archive",
        "2024-01-01",
        "eu",
    ]);
    ops.push(vec!["add-partition", &db, "orders", "2024-01-04", "eu"]);
    ops.push(vec!["add-partition", &db, "orders", "2024-01-04", "us"]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "into",
        &f[12],
        "2024-01-04",
        "eu",
    ]);
    ops.push(vec![
        "insert",
        &db,
        "orders",
        "into",
        &f[13],
        "2024-01-04",
        "us",
    ]);
    ops.push(vec![
        "exchange",
        &db,
        "orders",
        &db,
        "archive",
        "2024-01-04",
    ]);
    ops.push(vec![
        "insert",
        &db,
        "archive",
        "into",
        &f[14],
        "2024-01-01",
        "eu",
    ]);
    ops.push(vec!["truncate", &db, "orders", "2024-01-03", "eu"]);
    ops.push(vec!["rename", &db, "flat", "flat2"]);
    ops.push(vec!["insert", &db, "flat2", "overwrite", &f[9]]);
    ops.push(vec!["create-table", &db, "trunc", "text"]);
    ops.push(vec!["insert", &db, "trunc", "into", &f[10]]);
    ops.push(vec!["truncate", &db, "trunc"]);
    ops.push(vec!["insert", &db, "trunc", "overwrite", &f[11]]);
    let prev = r.checked_sub(1).map(|p| format!("r{p}"));
    let mut out: Vec<Vec<String>> = ops
        .into_iter()
        .map(|o| o.into_iter().map(str::to_owned).collect())
        .collect();
    if let Some(prev) = prev {
        out.push(vec!["alter-db-not-repl-source".into(), prev.clone()]);
        out.push(vec!["drop-db".into(), prev, "cascade".into()]);
    }
    out
}

fn stagefs_follows_the_real_metastore(hive: Hive, kind: Kind, encoder: Encoder) {
    let rounds: usize = if std::env::var_os("STAGEFS_LONG_TESTS").is_some() {
        12
    } else {
        2
    };
    let server = DbServer::start(kind);
    server.create_database("hive");
    let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
    let mut hms =
        RealMetastore::start_hive(hive, &metastore_db(kind, &server), hdfs.uri(), encoder)
            .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("metastore ready: {}", hms.ready());

    let tmp = tempfile::tempdir().expect("tempdir");
    // No --source-map: every hdfs:// URI is read from the mini cluster.
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
    // The daemon starts behind: the first operations (an INSERT OVERWRITE
    // of a table among them) run before it, so the file the earlier INSERT
    // named is only in cmroot when it fetches it.
    let scratch = hms.scratch();
    let mut ops = (0..rounds).flat_map(|r| mount_round(r, &scratch));
    for op in ops.by_ref().take(5) {
        assert!(
            op[0] != "rename" && op[0] != "add-partition",
            "renames and added partitions wait for the daemon"
        );
        apply(&mut hms, &mut oracles, &op);
    }
    let d = Daemon::start(args);
    let mnt = d.mnt().to_owned();

    let walkers = Walkers::start(&mnt, 2);
    // The oracles (indices) each exchange ended at.
    let mut exchanges: Vec<usize> = Vec::new();

    for op in ops {
        if op[0] == "rename" {
            // Hive moves a renamed table's files and keeps no copy in
            // cmroot (docs/HIVE.md "Limits"): stagefs must have staged
            // them first.
            let id = oracles.last().expect("oracle").0;
            d.wait_status_for(
                &format!("visible >= {id} before a rename"),
                std::time::Duration::from_secs(60),
                |s| visible(s) >= id,
            );
        }
        apply(&mut hms, &mut oracles, &op);
        if op[0] == "exchange" {
            exchanges.push(oracles.len() - 1);
        }
        if (op[0] == "add-partition" || op[0] == "exchange") && hive == Hive::V4 {
            // A translated table's ADD_PARTITION names no files (also the
            // one an exchange writes): stagefs lists the partition, which
            // must not change before it does (docs/HIVE.md "Partitions an
            // event adds without their files").
            let id = oracles.last().expect("oracle").0;
            d.wait_status_for(
                &format!("visible >= {id} after an added partition"),
                std::time::Duration::from_secs(60),
                |s| visible(s) >= id,
            );
        }
    }
    let last = oracles.last().expect("oracle").0;
    let s = d.wait_status_for(
        &format!("visible >= {last}"),
        std::time::Duration::from_secs(120),
        |s| visible(s) >= last,
    );
    let (seen, moved) = walkers.finish();
    eprintln!("status at the end: {s}");
    assert_eq!(visible(&s), last, "{s}");
    assert!(
        s["staging"]["from_change_management"].as_u64() > Some(0),
        "no file came from cmroot: {s}"
    );

    // Every walk of the mount equals the source at its view's state-id.
    let mut bad: Vec<String> = seen
        .iter()
        .flat_map(|w| check_walk(&oracles, w, Within::Table))
        .collect();
    // An exchange is one metastore transaction: no walk inside it may show
    // the partition in both tables (or in neither), only the whole mount
    // before or after it.
    let mut inside_exchange = 0;
    for w in &seen {
        for &k in &exchanges {
            let ((lo, before), (hi, after)) = (&oracles[k - 1], &oracles[k]);
            if *lo < w.state && w.state < *hi {
                inside_exchange += 1;
                if &w.tables != before && &w.tables != after {
                    bad.push(format!(
                        "view {} inside the exchange {lo}..{hi} is neither the source before nor after it: {:?}",
                        w.state, w.tables
                    ));
                }
            }
        }
    }
    eprintln!("{inside_exchange} walks inside an exchange's events");
    let states: std::collections::BTreeSet<u64> = seen.iter().map(|w| w.state).collect();
    let reads: usize = seen.iter().map(|w| w.tables.len()).sum();
    eprintln!(
        "{} walks ({reads} table reads) at {} distinct states of {}, {moved} walks across a view move, {} anomalies",
        seen.len(),
        states.len(),
        oracles.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} anomalies, first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(states.len() > 10, "the readers saw {} states", states.len());

    // The final content, exactly: the same tables, the same bytes.
    let _ = common::getxattr(&mnt, "user.stagefs.visible");
    let end = walk_mount(&mnt).expect("a quiet mount's view holds");
    assert_eq!(end.state, last);
    let want = &oracles.last().expect("oracle").1;
    assert_eq!(&end.tables, want, "the mount against the source at {last}");
    assert!(
        want.values().map(BTreeMap::len).sum::<usize>() > 0,
        "the source holds files at the end"
    );
    assert!(s["stalled"].is_null(), "{s}");
    drop(d);
    drop(hms);
}

/// Runs one driver operation and records the oracle after it.
fn apply(hms: &mut RealMetastore, oracles: &mut Vec<(u64, Tables)>, op: &[String]) {
    let words: Vec<&str> = op.iter().map(String::as_str).collect();
    let reply = hms.call(&words).unwrap_or_else(|e| panic!("{e}"));
    let id = reply["event_id"].as_u64().expect("event_id");
    let (prev, tables) = oracles.last().expect("oracle");
    if op[0] == "alter-db-not-repl-source" && id == *prev {
        // Hive 4 writes no ALTER_DATABASE row for a change of the
        // replication parameters alone (shouldSkipCapturing); Hive 3.1.3
        // may write one (a row without data, checked as any other).
        assert_eq!(&oracle_tables(&reply["source"]), tables, "{op:?}");
        return;
    }
    assert!(id > *prev, "{op:?} wrote no event");
    oracles.push((id, oracle_tables(&reply["source"])));
}

#[test]
fn stagefs_follows_the_real_metastore_on_postgres() {
    stagefs_follows_the_real_metastore(Hive::V4, Kind::Postgres, Encoder::Json);
}

/// The daemon following Hive 3.1.3 with HCatalog's DbNotificationListener.
#[test]
fn stagefs_follows_the_hive3_metastore_on_postgres() {
    stagefs_follows_the_real_metastore(Hive::V3, Kind::Postgres, Encoder::Json);
}

/// The daemon following Hive 3.1.3 on MariaDB.
#[test]
fn stagefs_follows_the_hive3_metastore_on_mariadb() {
    stagefs_follows_the_real_metastore(Hive::V3, Kind::MariaDb, Encoder::Json);
}

#[test]
fn stagefs_follows_the_real_metastore_on_mariadb() {
    stagefs_follows_the_real_metastore(Hive::V4, Kind::MariaDb, Encoder::Gzip);
}

// ---------------------------------------------------------------------------
// Two catalogs with the same `db.table`, and insert-only ACID transactions.
// ---------------------------------------------------------------------------

/// A daemon following one catalog, its readers, and that catalog's
/// oracle after each operation.
struct Follower {
    catalog: &'static str,
    daemon: Daemon,
    walkers: Option<Walkers>,
    _tmp: tempfile::TempDir,
}

impl Follower {
    fn start(server: &DbServer, catalog: &'static str, bootstrap: bool) -> Follower {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut args = DaemonArgs::under(tmp.path()).hive_metastore(HiveMetastoreArgs {
            url: server.url("hive"),
            password: PASSWORD.into(),
            source_map: Vec::new(),
            poll_ms: 50,
        });
        if catalog != "hive" {
            args = args.arg("--catalog").arg(catalog);
        }
        if bootstrap {
            args = args.arg("--bootstrap");
        }
        let daemon = Daemon::start(args);
        let walkers = Some(Walkers::start(daemon.mnt(), 2));
        Follower {
            catalog,
            daemon,
            walkers,
            _tmp: tmp,
        }
    }

    /// Waits for `last`, stops the readers and checks every walk and the
    /// final mount against `oracles`; returns (walks, distinct states).
    fn finish(&mut self, oracles: &[(u64, Tables)]) -> (usize, usize) {
        let last = oracles.last().expect("oracle").0;
        let s = self.daemon.wait_status_for(
            &format!("{}: visible >= {last}", self.catalog),
            std::time::Duration::from_secs(120),
            |s| visible(s) >= last,
        );
        let (seen, moved) = self.walkers.take().expect("walkers").finish();
        assert_eq!(visible(&s), last, "{s}");
        assert!(s["stalled"].is_null(), "{s}");
        let bad: Vec<String> = seen
            .iter()
            .flat_map(|w| check_walk(oracles, w, Within::Table))
            .collect();
        let states: std::collections::BTreeSet<u64> = seen.iter().map(|w| w.state).collect();
        eprintln!(
            "catalog {}: {} walks at {} distinct states of {}, {moved} across a view move, {} anomalies",
            self.catalog,
            seen.len(),
            states.len(),
            oracles.len(),
            bad.len()
        );
        assert!(
            bad.is_empty(),
            "catalog {}: {} anomalies, first: {:#?}",
            self.catalog,
            bad.len(),
            &bad[..bad.len().min(5)]
        );
        let mnt = self.daemon.mnt().to_owned();
        let _ = common::getxattr(&mnt, "user.stagefs.visible");
        let end = walk_mount(&mnt).expect("a quiet mount's view holds");
        assert_eq!(end.state, last);
        assert_eq!(
            &end.tables,
            &oracles.last().expect("oracle").1,
            "catalog {}: the mount against the source at {last}",
            self.catalog
        );
        (seen.len(), states.len())
    }
}

/// Runs one driver operation; pushes each catalog's oracle after it.
fn apply_catalogs(
    hms: &mut RealMetastore,
    oracles: &mut BTreeMap<&'static str, Vec<(u64, Tables)>>,
    op: &[String],
) -> Value {
    let words: Vec<&str> = op.iter().map(String::as_str).collect();
    let reply = hms.call(&words).unwrap_or_else(|e| panic!("{e}"));
    let id = reply["event_id"].as_u64().expect("event_id");
    for (cat, list) in oracles.iter_mut() {
        let first = list.is_empty();
        let prev = list.last().map(|(i, _)| *i).unwrap_or(0);
        assert!(first || id > prev, "{op:?} wrote no event");
        let source = match (&reply["sources"], *cat) {
            (Value::Null, "hive") => reply["source"].clone(),
            // Not a catalog yet: nothing in it.
            (Value::Null, _) => Value::Object(Default::default()),
            (all, _) => all[*cat].clone(),
        };
        list.push((id, oracle_tables(&source)));
    }
    reply
}

fn words(op: &[&str]) -> Vec<String> {
    op.iter().map(|w| (*w).to_owned()).collect()
}

/// Two catalogs, `hive` and `spark`, each with a database `sales` and a
/// table `sales.t` (partitioned) and `sales.flat`, written alternately.
/// One daemon follows `hive` (the default) from the start; another
/// follows `spark` (`--catalog spark --bootstrap`), started while the
/// driver writes. Each mount equals its catalog's oracle at every state
/// its readers saw, and at the end.
#[test]
fn stagefs_follows_one_catalog_of_a_real_metastore_with_two() {
    let kind = Kind::Postgres;
    let server = DbServer::start(kind);
    server.create_database("hive");
    let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
    // Managed tables stay managed: each under its database's location in
    // its catalog (`/warehouse/sales.db`, `/catalogs/spark/sales.db`).
    let mut hms = RealMetastore::start_with(
        Hive::V4,
        &metastore_db(kind, &server),
        hdfs.uri(),
        Encoder::Json,
        ManagedTables::Kept,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("metastore ready: {}", hms.ready());
    let dir = hms.scratch();
    let file = |cat: &str, n: usize| {
        let body: String = (0..(n % 5 + 1))
            .map(|i| format!("{},{cat} file {n} row {i}\n", n * 10 + i))
            .collect();
        write_file(&dir, &format!("{cat}-{n}.csv"), &body)
    };
    let mut oracles: BTreeMap<&'static str, Vec<(u64, Tables)>> = BTreeMap::new();
    oracles.insert("hive", Vec::new());
    oracles.insert("spark", Vec::new());
    apply_catalogs(&mut hms, &mut oracles, &words(&["state"]));
    apply_catalogs(&mut hms, &mut oracles, &words(&["create-catalog", "spark"]));
    for db in ["sales", "sales@spark"] {
        apply_catalogs(
            &mut hms,
            &mut oracles,
            &words(&["create-db", db, "repl-source"]),
        );
    }
    let mut hive = Follower::start(&server, "hive", false);
    let mut spark = None;
    let rounds = if std::env::var_os("STAGEFS_LONG_TESTS").is_some() {
        6
    } else {
        2
    };
    let mut n = 0;
    for r in 0..rounds {
        let mut ops: Vec<Vec<String>> = Vec::new();
        for db in ["sales", "sales@spark"] {
            if r == 0 {
                ops.push(words(&["create-table", db, "t", "text", "dt"]));
                ops.push(words(&["create-table", db, "flat", "text"]));
            }
            ops.push(words(&[
                "add-partition",
                db,
                "t",
                &format!("2024-01-0{}", r + 1),
            ]));
        }
        for i in 0..3 {
            for (cat, db) in [("hive", "sales"), ("spark", "sales@spark")] {
                n += 1;
                let f = file(cat, n);
                let day = format!("2024-01-0{}", r + 1);
                let op = match i {
                    0 => vec!["insert", db, "t", "into", &f, &day],
                    1 => vec!["insert", db, "flat", "into", &f],
                    _ => vec!["insert", db, "t", "overwrite", &f, &day],
                };
                ops.push(words(&op));
            }
        }
        if r > 0 {
            // Only the hive catalog's partition goes: the other stays.
            ops.push(words(&["drop-partition", "sales", "t", "2024-01-01"]));
        }
        for (k, op) in ops.iter().enumerate() {
            apply_catalogs(&mut hms, &mut oracles, op);
            if r == 0 && k == ops.len() / 2 {
                // Bootstrap of the other catalog while the driver writes.
                spark = Some(Follower::start(&server, "spark", true));
            }
        }
    }
    let (hive_end, spark_end) = (
        &oracles["hive"].last().expect("oracle").1,
        &oracles["spark"].last().expect("oracle").1,
    );
    eprintln!("hive at the end: {hive_end:?}\nspark at the end: {spark_end:?}");
    assert_eq!(
        hive_end.keys().collect::<Vec<_>>(),
        spark_end.keys().collect::<Vec<_>>(),
        "the same tables in both catalogs"
    );
    assert_ne!(hive_end, spark_end, "the two catalogs hold different files");
    let mut spark = spark.expect("the spark follower started");
    let (hw, hs) = hive.finish(&oracles["hive"]);
    let (sw, ss) = spark.finish(&oracles["spark"]);
    assert!(hs > 5 && ss > 5, "states seen: hive {hs}, spark {ss}");
    assert!(hw > 0 && sw > 0);
    let s = spark.daemon.status();
    eprintln!("spark follower status: {s}");

    // The rows: each names its catalog; the other catalog's are skipped.
    let (_, rows) = all_rows(&server);
    let cats: BTreeMap<Option<String>, usize> = rows.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.cat_name.clone()).or_default() += 1;
        m
    });
    eprintln!("rows by CAT_NAME: {cats:?}");
    assert!(
        cats.get(&Some("spark".into())).is_some_and(|&n| n > 5),
        "{cats:?}"
    );
    drop(spark);
    drop(hive);
    drop(hms);
}

/// A catalog the metastore lacks stops the daemon at start with a reason.
#[test]
fn a_catalog_the_real_metastore_lacks_is_an_error_at_start() {
    let RealHive {
        server,
        hdfs: _hdfs,
        hms,
    } = RealHive::start(Kind::Postgres);
    let tmp = tempfile::tempdir().expect("tempdir");
    let args = DaemonArgs::under(tmp.path())
        .hive_metastore(HiveMetastoreArgs {
            url: server.url("hive"),
            password: PASSWORD.into(),
            source_map: Vec::new(),
            poll_ms: 50,
        })
        .arg("--catalog")
        .arg("nosuch");
    let mut d = Daemon::spawn(args);
    let status = d
        .wait_exit(std::time::Duration::from_secs(60))
        .expect("the daemon exits");
    assert!(!status.success());
    let err = d.all_stderr();
    assert!(
        err.contains("--catalog nosuch: the metastore has no such catalog (catalogs in its CTLGS table: hive)"),
        "{err}"
    );
    drop(hms);
}

/// Insert-only ACID tables written as HiveServer2 writes them: open_txns,
/// allocate_table_write_ids, the file under `delta_W_W_0000/`,
/// add_write_notification_log, commit_txn, and aborted transactions
/// (their files on HDFS, never valid). Our listener writes the
/// transaction rows as DbNotificationListener does. The daemon follows;
/// every walk equals the oracle (committed write ids only) at its state.
fn stagefs_follows_insert_only_transactions(kind: Kind) {
    let RealHive {
        server,
        hdfs: _hdfs,
        mut hms,
    } = RealHive::start(kind);
    eprintln!("metastore ready: {}", hms.ready());
    let dir = hms.scratch();
    let mut oracles: BTreeMap<&'static str, Vec<(u64, Tables)>> = BTreeMap::new();
    oracles.insert("hive", Vec::new());
    apply_catalogs(&mut hms, &mut oracles, &words(&["state"]));
    for op in [
        vec!["create-db", "acid", "repl-source"],
        vec!["create-acid-table", "acid", "t", "text"],
        vec!["create-acid-table", "acid", "p", "text", "dt"],
        vec!["add-partition", "acid", "p", "2024-01-01"],
    ] {
        apply_catalogs(&mut hms, &mut oracles, &words(&op));
    }
    let mut follower = Follower::start(&server, "hive", false);
    let rounds = if std::env::var_os("STAGEFS_LONG_TESTS").is_some() {
        10
    } else {
        3
    };
    let mut last = Value::Null;
    for r in 0..rounds {
        for (k, (table, end)) in [
            ("t", "commit"),
            ("t", "abort"),
            ("p", "commit"),
            ("t", "commit"),
            ("p", "abort"),
            ("p", "commit"),
        ]
        .into_iter()
        .enumerate()
        {
            let body: String = (0..(k + 1))
                .map(|i| format!("{},round {r} op {k} row {i}\n", r * 100 + k * 10 + i))
                .collect();
            let f = write_file(&dir, &format!("acid-{r}-{k}.csv"), &body);
            let mut op = vec!["acid-insert", "acid", table, end, &f];
            if table == "p" {
                op.push("2024-01-01");
            }
            last = apply_catalogs(&mut hms, &mut oracles, &words(&op));
        }
    }
    let (walks, states) = follower.finish(&oracles["hive"]);
    assert!(walks > 0 && states > 5, "{walks} walks at {states} states");

    // The aborted transactions' files are on HDFS, hidden by the oracle.
    let hidden: usize = ["acid.t", "acid.p"]
        .iter()
        .map(|t| {
            let tn = &last["source"][*t];
            let direct = tn["hidden"].as_array().map_or(0, Vec::len);
            let parts: usize = tn["partitions"].as_array().map_or(0, |ps| {
                ps.iter()
                    .map(|p| p["hidden"].as_array().map_or(0, Vec::len))
                    .sum()
            });
            direct + parts
        })
        .sum();
    assert_eq!(hidden, 2 * rounds, "aborted files on HDFS: {last}");

    // The rows Hive's transaction handler had our listener write.
    let (mut source, rows) = all_rows(&server);
    let mut types = BTreeMap::<String, usize>::new();
    for row in &rows {
        let n = types.entry(row.event_type.clone()).or_default();
        *n += 1;
        let first = *n == 1;
        let m = decode_message(row).unwrap_or_else(|e| {
            panic!(
                "stagefs rejects row {} ({}): {e}",
                row.event_id, row.event_type
            )
        });
        if row.event_type.ends_with("_TXN") || row.event_type.starts_with("ALLOC_WRITE_ID") {
            assert_eq!(row.cat_name, None, "{row:?}");
            if first {
                eprintln!("{} {}: {:?}", row.event_id, row.event_type, row.message);
            }
        }
        if let HiveMessage::CommitTxn { txn_id } = m {
            let writes = source.txn_writes(txn_id).expect("txn writes");
            assert_eq!(writes.len(), 1, "transaction {txn_id}: {writes:?}");
            for w in &writes {
                if first {
                    eprintln!("TXN_WRITE_NOTIFICATION_LOG of {txn_id}: {w:?}");
                }
                let write = stagefs::source::hive::message::decode_txn_write(w)
                    .unwrap_or_else(|e| panic!("{w:?}: {e}"));
                assert_eq!(write.files.len(), 1, "{write:?}");
                let f = &write.files[0];
                assert!(f.checksum.is_some() && f.cm_root.is_some(), "{f:?}");
                assert!(
                    f.subdir.as_deref().is_some_and(|s| s.starts_with("delta_")),
                    "{f:?}"
                );
            }
        }
    }
    eprintln!("event types: {types:?}");
    let n = rounds * 6;
    assert_eq!(types.get("OPEN_TXN"), Some(&n), "{types:?}");
    assert_eq!(types.get("ALLOC_WRITE_ID_EVENT"), Some(&n), "{types:?}");
    assert_eq!(types.get("COMMIT_TXN"), Some(&(rounds * 4)), "{types:?}");
    assert_eq!(types.get("ABORT_TXN"), Some(&(rounds * 2)), "{types:?}");
    drop(follower);
    drop(hms);
}

#[test]
fn stagefs_follows_insert_only_transactions_on_the_real_metastore() {
    stagefs_follows_insert_only_transactions(Kind::Postgres);
}

/// The same on MariaDB (`schematool -dbType mysql`): the transaction
/// handler's SQL, and our listener's rows written on its connection.
#[test]
fn stagefs_follows_insert_only_transactions_on_the_real_metastore_on_mariadb() {
    stagefs_follows_insert_only_transactions(Kind::MariaDb);
}

/// Hive 4's default makes a managed table external
/// (`TRANSLATED_TO_EXTERNAL`), and Hive names no files in its ADD_PARTITION
/// rows: stagefs lists such a partition at the source and accepts the
/// listing only when nothing in it changed after the event (docs/HIVE.md,
/// "Partitions an event adds without their files"). A partition whose
/// files were there before its event is shown with them. One whose
/// directory got a file after its event, before stagefs (started late)
/// listed it, cannot be proven: the states holding it are never shown,
/// status says why, and the partition's drop lets replication go on.
#[test]
fn a_partition_changed_after_its_event_is_never_shown_until_dropped() {
    let RealHive {
        server,
        mut hdfs,
        mut hms,
    } = RealHive::start(Kind::Postgres);
    let first = hms.call(&["state"]).unwrap_or_else(|e| panic!("{e}"));
    let mut oracles: Vec<(u64, Tables)> = vec![(
        first["event_id"].as_u64().expect("event_id"),
        oracle_tables(&first["source"]),
    )];
    for op in [
        words(&["create-db", "lp"]),
        words(&["create-table", "lp", "t", "text", "ds"]),
    ] {
        apply(&mut hms, &mut oracles, &op);
    }
    let state = hms.call(&["state"]).unwrap_or_else(|e| panic!("{e}"));
    let table = state["source"]["lp.t"]["location"]
        .as_str()
        .expect("location")
        .to_owned();
    assert!(table.contains("/external/"), "a translated table: {state}");
    let dir = table
        .strip_prefix(hdfs.uri())
        .expect("the table is on the mini cluster")
        .to_owned();
    // ds=old: its file is there before its event (as a load puts it).
    hdfs.put_bytes(&format!("{dir}/ds=old/000000_0"), b"1,old\n", None)
        .unwrap_or_else(|e| panic!("{e}"));
    apply(
        &mut hms,
        &mut oracles,
        &words(&["add-partition", "lp", "t", "old"]),
    );
    let old = oracles.last().expect("oracle").0;
    assert_eq!(oracles.last().expect("oracle").1["lp.t"].len(), 1);
    // ds=late: added empty; a file lands in it after the margin.
    apply(
        &mut hms,
        &mut oracles,
        &words(&["add-partition", "lp", "t", "late"]),
    );
    let late = oracles.last().expect("oracle").0;
    std::thread::sleep(std::time::Duration::from_millis(2500));
    hdfs.put_bytes(&format!("{dir}/ds=late/000000_0"), b"2,late\n", None)
        .unwrap_or_else(|e| panic!("{e}"));

    let tmp = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(
        DaemonArgs::under(tmp.path()).hive_metastore(HiveMetastoreArgs {
            url: server.url("hive"),
            password: PASSWORD.into(),
            source_map: Vec::new(),
            poll_ms: 50,
        }),
    );
    let mnt = d.mnt().to_owned();
    let walkers = Walkers::start(&mnt, 2);
    let s = d.wait_status_for(
        "a stall naming the unproven partition",
        std::time::Duration::from_secs(60),
        |s| {
            s["stalled"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("lp.t partition (late)"))
        },
    );
    let reason = s["stalled"]["reason"].as_str().expect("reason").to_owned();
    eprintln!("stalled: {reason}");
    assert!(
        reason.contains(&format!("event {late}"))
            && reason.contains("the partition directory was modified at"),
        "{reason}"
    );
    // Waiting, not failing: the state before is served meanwhile.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let s = d.status();
    assert_eq!(visible(&s), old, "{s}");
    let _ = common::getxattr(&mnt, "user.stagefs.visible");
    let at_old = walk_mount(&mnt).expect("a quiet mount's view holds");
    assert_eq!(at_old.state, old);
    assert_eq!(
        at_old.tables,
        oracles.iter().find(|(id, _)| *id == old).expect("oracle").1,
        "ds=old with the file it held at its event"
    );

    // Dropped, the unproven content is in no later state.
    apply(
        &mut hms,
        &mut oracles,
        &words(&["drop-partition", "lp", "t", "late"]),
    );
    let dropped = oracles.last().expect("oracle").0;
    let s = d.wait_status_for(
        &format!("visible >= {dropped}"),
        std::time::Duration::from_secs(60),
        |s| visible(s) >= dropped,
    );
    let (seen, moved) = walkers.finish();
    assert!(s["stalled"].is_null(), "{s}");
    let bad: Vec<String> = seen
        .iter()
        .flat_map(|w| check_walk(&oracles, w, Within::Table))
        .collect();
    let states: std::collections::BTreeSet<u64> = seen.iter().map(|w| w.state).collect();
    eprintln!(
        "{} walks at states {states:?} ({moved} across a view move), {} anomalies",
        seen.len(),
        bad.len()
    );
    assert!(bad.is_empty(), "{:#?}", &bad[..bad.len().min(5)]);
    assert!(
        states.iter().all(|&id| id < late || id >= dropped),
        "a state holding the unproven partition was shown: {states:?}"
    );
    let _ = common::getxattr(&mnt, "user.stagefs.visible");
    let end = walk_mount(&mnt).expect("a quiet mount's view holds");
    assert_eq!(end.state, dropped);
    assert_eq!(&end.tables, &oracles.last().expect("oracle").1);
    drop(d);
    drop(hms);
}
