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
mod servers;

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::Value;

use common::daemon::{read_tree, visible, Daemon, DaemonArgs, HiveMetastoreArgs};
use dbserver::{DbServer, Kind, PASSWORD, USER};
use servers::hms::{Encoder, Hive, MetastoreDb, RealMetastore};
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

fn real_metastore_rows_decode_and_fold_to_the_source(hive: Hive, kind: Kind, encoder: Encoder) {
    let server = DbServer::start(kind);
    server.create_database("hive");
    let hdfs = MiniHdfs::start(1).unwrap_or_else(|e| panic!("{e}"));
    let db = metastore_db(kind, &server);
    let mut hms =
        RealMetastore::start_hive(hive, &db, hdfs.uri(), encoder).unwrap_or_else(|e| panic!("{e}"));
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
        let name = match (hive, kind, encoder) {
            (Hive::V3, Kind::Postgres, _) => "hive3-postgres-json.jsonl",
            (Hive::V3, Kind::MariaDb, _) => unreachable!("Hive 3.1.3 on MariaDB is not run"),
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
    for name in [
        "postgres-json",
        "postgres-gzip",
        "mariadb-json",
        "hive3-postgres-json",
    ] {
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

// ---------------------------------------------------------------------------
// The stagefs daemon following the real metastore.
// ---------------------------------------------------------------------------

/// `db.table` → path below the table (`k=v/…/name`) → sha256 hex.
type Tables = BTreeMap<String, BTreeMap<String, String>>;

/// The oracle's tables, as the mount lays them out: a partition's files
/// under its `k1=v1/k2=v2` directory, each file where it lies below its
/// partition's (or the table's) location.
fn oracle_tables(source: &Value) -> Tables {
    let below = |loc: &str, path: &str| -> String {
        path.strip_prefix(loc)
            .and_then(|r| r.strip_prefix('/'))
            .unwrap_or_else(|| panic!("{path} is not below {loc}"))
            .to_owned()
    };
    let mut out = Tables::new();
    for (key, t) in source.as_object().expect("source object") {
        let mut files = BTreeMap::new();
        let add = |files: &mut BTreeMap<String, String>, dir: &str, loc: &str, list: &Value| {
            for f in list.as_array().expect("files") {
                let rel = below(loc, f["path"].as_str().expect("path"));
                let rel = if dir.is_empty() {
                    rel
                } else {
                    format!("{dir}/{rel}")
                };
                files.insert(rel, f["sha256"].as_str().expect("sha256").to_owned());
            }
        };
        match t.get("partitions") {
            None => add(
                &mut files,
                "",
                t["location"].as_str().expect("location"),
                &t["files"],
            ),
            Some(parts) => {
                let keys: Vec<&str> = t["partition_keys"]
                    .as_array()
                    .expect("keys")
                    .iter()
                    .map(|k| k.as_str().expect("key"))
                    .collect();
                for p in parts.as_array().expect("partitions") {
                    let dir: Vec<String> = keys
                        .iter()
                        .zip(p["values"].as_array().expect("values"))
                        .map(|(k, v)| format!("{k}={}", v.as_str().expect("value")))
                        .collect();
                    add(
                        &mut files,
                        &dir.join("/"),
                        p["location"].as_str().expect("location"),
                        &p["files"],
                    );
                }
            }
        }
        out.insert(key.clone(), files);
    }
    out
}

/// One walk of the mount by a reader: the state its view showed (the
/// root's `user.stagefs.state_id`, the same before and after the walk) and
/// every `db.table` in it with its content.
struct Walk {
    state: u64,
    tables: Tables,
}

fn root_state(mnt: &std::path::Path) -> u64 {
    common::getxattr(mnt, "user.stagefs.state_id")
        .expect("state_id of the root")
        .parse()
        .expect("decimal state_id")
}

/// Walks every `db/table` of the mount, each table read through one
/// directory handle. `None` when the view moved during the walk (the walk
/// then spans two states and is not checked).
fn walk_mount(mnt: &std::path::Path) -> Option<Walk> {
    let state = root_state(mnt);
    let mut tables = Tables::new();
    for db in std::fs::read_dir(mnt).expect("read the mount").flatten() {
        let db_name = db.file_name().to_string_lossy().into_owned();
        if db_name.starts_with('.') {
            continue;
        }
        let Ok(list) = std::fs::read_dir(db.path()) else {
            continue;
        };
        for t in list.flatten() {
            let Ok(dir) = std::fs::File::open(t.path()) else {
                continue;
            };
            use std::os::unix::io::AsRawFd;
            let at = std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
            let changed: u64 = common::getxattr(&at, "user.stagefs.state_id")
                .unwrap_or_else(|e| panic!("state_id of {}: errno {e}", t.path().display()))
                .parse()
                .expect("decimal state_id");
            if changed > state {
                // The other reader thread moved this process's view.
                return None;
            }
            let key = format!("{db_name}.{}", t.file_name().to_string_lossy());
            tables.insert(key, read_tree(&at));
        }
    }
    (root_state(mnt) == state).then_some(Walk { state, tables })
}

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
    let f: Vec<String> = (0..12).map(file).collect();
    ops.push(vec!["create-db", &db, "repl-source"]);
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
    ops.push(vec!["create-table", &db, "flat", "parquet"]);
    ops.push(vec!["insert", &db, "flat", "into", &f[4]]);
    ops.push(vec!["insert", &db, "flat", "overwrite", &f[5]]);
    ops.push(vec!["insert", &db, "flat", "into", &f[6]]);
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

/// Whether a walk shows what the oracle says at its state, table by
/// table (present or not, and content): exactly the oracle after the
/// operation that ended at that id, or, for an id inside an operation of
/// several events (a truncate's two rows, a cascading drop), the oracle
/// before or after it (each table changes once within one operation).
fn check_walk(oracles: &[(u64, Tables)], w: &Walk) -> Vec<String> {
    let k = match oracles.binary_search_by_key(&w.state, |(id, _)| *id) {
        Ok(k) => Ok(k),
        Err(0) => return vec![format!("view {} before the first oracle", w.state)],
        Err(k) if k == oracles.len() => {
            return vec![format!("view {} after the last operation", w.state)]
        }
        Err(k) => Err(k),
    };
    let mut names: std::collections::BTreeSet<&String> = w.tables.keys().collect();
    match k {
        Ok(k) => names.extend(oracles[k].1.keys()),
        Err(k) => {
            names.extend(oracles[k - 1].1.keys());
            names.extend(oracles[k].1.keys());
        }
    }
    let mut bad = Vec::new();
    for name in names {
        let got = w.tables.get(name);
        let ok = match k {
            Ok(k) => oracles[k].1.get(name) == got,
            Err(k) => oracles[k - 1].1.get(name) == got || oracles[k].1.get(name) == got,
        };
        if !ok {
            let (lo, hi) = match k {
                Ok(k) => (k, k),
                Err(k) => (k - 1, k),
            };
            bad.push(format!(
                "{name} in view {}: mount {got:?}, source at {} {:?}, at {} {:?}",
                w.state,
                oracles[lo].0,
                oracles[lo].1.get(name),
                oracles[hi].0,
                oracles[hi].1.get(name)
            ));
        }
    }
    bad
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
    // of a partition and of a table among them) run before it, so the files
    // their earlier INSERTs named are only in cmroot when it fetches them.
    let scratch = hms.scratch();
    let mut ops = (0..rounds).flat_map(|r| mount_round(r, &scratch));
    for op in ops.by_ref().take(12) {
        assert_ne!(op[0], "rename", "renames wait for the daemon");
        apply(&mut hms, &mut oracles, &op);
    }
    let d = Daemon::start(args);
    let mnt = d.mnt().to_owned();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            let mnt = mnt.clone();
            std::thread::spawn(move || {
                let (mut seen, mut moved) = (Vec::new(), 0usize);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Reading `user.stagefs.visible` moves this process's
                    // view to the newest state at once (docs/SEMANTICS.md,
                    // "The view rule"): each walk sees a fresh state.
                    let _ = common::getxattr(&mnt, "user.stagefs.visible");
                    match walk_mount(&mnt) {
                        Some(w) => seen.push(w),
                        None => moved += 1,
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                (seen, moved)
            })
        })
        .collect();

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
    }
    let last = oracles.last().expect("oracle").0;
    let s = d.wait_status_for(
        &format!("visible >= {last}"),
        std::time::Duration::from_secs(120),
        |s| visible(s) >= last,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut seen, mut moved) = (Vec::new(), 0);
    for r in readers {
        let (w, m) = r.join().expect("reader");
        seen.extend(w);
        moved += m;
    }
    eprintln!("status at the end: {s}");
    assert_eq!(visible(&s), last, "{s}");
    assert!(
        s["staging"]["from_change_management"].as_u64() > Some(0),
        "no file came from cmroot: {s}"
    );

    // Every walk of the mount equals the source at its view's state-id.
    let bad: Vec<String> = seen.iter().flat_map(|w| check_walk(&oracles, w)).collect();
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

fn metastore_db(kind: Kind, server: &DbServer) -> MetastoreDb {
    match kind {
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
    }
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

#[test]
fn stagefs_follows_the_real_metastore_on_mariadb() {
    stagefs_follows_the_real_metastore(Hive::V4, Kind::MariaDb, Encoder::Gzip);
}
