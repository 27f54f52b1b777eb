//! stagefs against a real Hive metastore: Hive 4.0.1's standalone metastore
//! (tests/java/hms-launcher) on a private PostgreSQL, its schema made by
//! Hive's own schematool, our `NotificationLogListener` as transactional
//! listener (rows built by Hive's MessageBuilder, inserted by its RawStore),
//! DML events and change management on, warehouse and cmroot on a private
//! HDFS (Hadoop's MiniDFSCluster). A driver does through
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

#[path = "common/dbserver.rs"]
mod dbserver;
mod servers;

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::Value;

use dbserver::{DbServer, Kind, PASSWORD, USER};
use servers::hms::{Encoder, MetastoreDb, RealMetastore};
use servers::MiniHdfs;
use stagefs::source::hive::message::decode_message;
use stagefs::source::hive::metastore::{MetastoreSource, Timeouts};
use stagefs::source::hive::model::{FileUri, HiveMessage, NotificationRow, RowSource};

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

/// What the decoded notifications say the source holds.
fn fold(messages: &[HiveMessage]) -> Content {
    let mut out = Content::new();
    for m in messages {
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
                let t = out
                    .get_mut(&format!("{}.{}", table.db, table.name))
                    .expect("table known");
                for (i, p) in partitions.iter().enumerate() {
                    let fs = files.get(i).map(|f| file_entries(f).collect());
                    t.insert(p.values.clone(), fs.unwrap_or_default());
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

/// The driver's operations; returns the last reply (event id + oracle).
fn workload(hms: &mut RealMetastore) -> Value {
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
        &["rename", "sales", "flat", "flat2"],
        &["insert", "sales", "flat2", "overwrite", &b],
        &["create-table", "sales", "trunc", "text"],
        &["insert", "sales", "trunc", "into", &c],
        &["truncate", "sales", "trunc"],
    ];
    let mut last = Value::Null;
    let mut prev = hms.ready()["event_id"].as_i64().unwrap_or(0);
    for op in ops {
        last = hms.call(op).unwrap_or_else(|e| panic!("{e}"));
        let id = last["event_id"].as_i64().expect("event_id");
        assert!(id > prev, "{op:?} wrote no notification ({prev} → {id})");
        prev = id;
    }
    last
}

fn real_metastore_rows_decode_and_fold_to_the_source(kind: Kind, encoder: Encoder) {
    let server = DbServer::start(kind);
    server.create_database("hive");
    let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
    let db = match kind {
        Kind::Postgres => MetastoreDb {
            db_type: "postgres",
            jdbc_url: format!("jdbc:postgresql://127.0.0.1:{}/hive", server.port()),
            user: USER.into(),
            password: PASSWORD.into(),
        },
        Kind::MariaDb => MetastoreDb {
            db_type: "mysql",
            jdbc_url: format!("jdbc:mariadb://127.0.0.1:{}/hive", server.port()),
            user: USER.into(),
            password: PASSWORD.into(),
        },
    };
    let mut hms = RealMetastore::start(&db, hdfs.uri(), encoder).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("metastore ready: {}", hms.ready());
    let last = workload(&mut hms);
    let newest = last["event_id"].as_i64().expect("event_id");

    // The rows Hive wrote, through stagefs's own metastore source.
    let mut source = MetastoreSource::open(
        &server.url("hive"),
        Some(PASSWORD.into()),
        Timeouts::default(),
    )
    .expect("metastore source");
    let mut rows: Vec<NotificationRow> = Vec::new();
    loop {
        let after = rows.last().map(|r| r.event_id).unwrap_or(0);
        let page = source.poll(after, 100).expect("poll");
        if page.is_empty() {
            break;
        }
        rows.extend(page);
    }
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
            Ok(m) => messages.push(m),
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
    for m in &messages {
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
        fold(&messages),
        oracle(&last["source"]),
        "the decoded log against the source"
    );

    if std::env::var_os("STAGEFS_CAPTURE_HIVE_ROWS").is_some() {
        let dir = servers::repo_root().join("tests/data/hive-real");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let name = match (kind, encoder) {
            (Kind::Postgres, Encoder::Json) => "postgres-json.jsonl",
            (Kind::Postgres, Encoder::Gzip) => "postgres-gzip.jsonl",
            (Kind::MariaDb, Encoder::Json) => "mariadb-json.jsonl",
            (Kind::MariaDb, Encoder::Gzip) => "mariadb-gzip.jsonl",
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
            serde_json::to_string_pretty(&last).expect("oracle"),
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
    for name in ["postgres-json", "postgres-gzip", "mariadb-json"] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.jsonl"))).expect("rows");
        let reply: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}-source.json"))).expect("oracle"),
        )
        .expect("oracle JSON");
        let messages: Vec<HiveMessage> = text
            .lines()
            .map(|l| {
                let row: NotificationRow = serde_json::from_str(l).expect("row JSON");
                decode_message(&row).unwrap_or_else(|e| panic!("{name} {}: {e}", row.event_id))
            })
            .collect();
        assert!(messages.len() > 20, "{name}: {} rows", messages.len());
        assert_eq!(fold(&messages), oracle(&reply["source"]), "{name}");
    }
}

#[test]
fn real_metastore_json_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Kind::Postgres, Encoder::Json);
}

#[test]
fn real_metastore_gzip_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Kind::Postgres, Encoder::Gzip);
}

#[test]
fn real_metastore_on_mariadb_json_rows_decode_and_fold_to_the_source() {
    real_metastore_rows_decode_and_fold_to_the_source(Kind::MariaDb, Encoder::Json);
}
