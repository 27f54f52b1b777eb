//! Replication from a real metastore database: a private PostgreSQL and a
//! private MariaDB (tests/common/dbserver.rs) hold NOTIFICATION_LOG and
//! TXN_WRITE_NOTIFICATION_LOG rows for a warehouse that changes by native
//! events (`stagefs::workload::hive_export`), and stagefs follows them through
//! `--hive-metastore` exactly as it would a Hive cluster's. The states are
//! the native ones; a metastore that stops is retried (status says why)
//! and replication goes on when it is back, losing nothing and applying
//! nothing twice.

#[path = "common/metastore_rows.rs"]
mod db_writer;
#[path = "common/dbserver.rs"]
mod dbserver;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use stagefs::catalog::Tree;
use stagefs::event::{BlobId, StateId};
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::source::hive::model::{NotificationRow, TxnWriteRow};
use stagefs::source::hive::{HiveConfig, HiveRows};
use stagefs::workload::hive_export::{HiveWriter, LogConverter};
use stagefs::workload::{Workload, WorkloadConfig};

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Copies the rows `HiveWriter` appends to its JSON Lines file into the
/// metastore database, as the listener would have written them there.
struct Feeder {
    rows: PathBuf,
    done: usize,
    db: db_writer::MetastoreWriter,
    last_id: i64,
}

impl Feeder {
    fn feed(&mut self) {
        let text = std::fs::read_to_string(&self.rows).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[self.done..] {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v.get("WNL_TXNID").is_some() {
                let row: TxnWriteRow = serde_json::from_value(v).unwrap();
                self.db.append_txn_write(&row);
            } else {
                let row: NotificationRow = serde_json::from_value(v).unwrap();
                self.last_id = row.event_id;
                self.db.insert_row(&row);
            }
        }
        self.done = lines.len();
        self.db.set_next_event_id(self.last_id + 1);
    }
}

fn table_files(tree: &Tree) -> BTreeMap<String, Vec<(String, BlobId)>> {
    let mut out = BTreeMap::new();
    for (db, d) in tree.root.children.iter() {
        for (t, table) in d.as_dir().unwrap().children.iter() {
            out.insert(format!("{db}.{t}"), table.as_dir().unwrap().files_below());
        }
    }
    out
}

fn check_against_oracle(tree: &Tree, workload: &Workload, id: StateId) {
    let Some(expected) = workload.expected(id) else {
        return;
    };
    let got = table_files(tree);
    for (key, table) in expected.iter() {
        let want: Vec<(String, BlobId)> = table.iter().map(|(p, b)| (p.clone(), *b)).collect();
        assert_eq!(got.get(key), Some(&want), "{key} at state {id}");
    }
    assert_eq!(got.len(), expected.len(), "tables at state {id}");
}

fn follow_a_metastore(kind: Kind) {
    let mut server = DbServer::start(kind);
    server.create_metastore("hms", TableCase::Upper);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("src");
    let mut workload = Workload::new(
        &root,
        WorkloadConfig {
            seed: 11,
            table_churn: true,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let writer = HiveWriter::for_workload(&root, &root.join("hive/rows.jsonl"), true).unwrap();
    let map = SourceMap::parse(&writer.source_map_args()).unwrap();
    let mut converter = LogConverter::new(&root.join("events"), writer);
    let mut feeder = Feeder {
        rows: root.join("hive/rows.jsonl"),
        done: 0,
        db: db_writer::MetastoreWriter::new(&server, "hms", TableCase::Upper),
        last_id: 0,
    };
    let mut step = |n: usize, workload: &mut Workload, feeder: &mut Feeder| {
        for _ in 0..n {
            workload.step().unwrap();
            workload.flush().unwrap();
            converter.pump().unwrap();
        }
        feeder.feed();
    };
    step(60, &mut workload, &mut feeder);

    let pwfile = dir.path().join("pw");
    std::fs::write(&pwfile, format!("{PASSWORD}\n")).unwrap();
    let url = format!("{}?password_file={}", server.url("hms"), pwfile.display());
    let state = dir.path().join("state");
    let mut cfg = ReplicaConfig::new(&state, Path::new(""), Path::new(""));
    let mut hive = HiveConfig::new(HiveRows::Metastore(url), map);
    hive.poll_interval = Duration::from_millis(50);
    hive.batch = 16; // several full batches in a row
    cfg.hive = Some(hive);
    cfg.retain = 10_000;
    let replica = Replica::start(cfg.clone()).unwrap();
    let latest = workload.latest();
    wait_for("the first states", Duration::from_secs(30), || {
        replica.catalog().snapshot().visible.state_id == latest
    });
    let status = replica.status();
    assert_eq!(status.source.kind, "hive");
    assert_eq!(status.source.newest, Some(latest.0 as i64));
    assert!(!status.source.location.contains(PASSWORD));

    // The metastore goes away: the last state stays served, status says why.
    server.stop();
    wait_for("the outage in status", Duration::from_secs(30), || {
        replica.status().source.error.is_some()
    });
    let status = replica.status();
    assert_eq!(status.visible, latest);
    let why = status.stalled.clone().map(|s| s.reason).unwrap_or_default();
    assert!(
        why.contains("unavailable") && why.contains("retrying"),
        "{why}"
    );
    assert!(!status.to_json().contains(PASSWORD));
    server.restart();
    // The admin connection died with the server.
    feeder.db = db_writer::MetastoreWriter::new(&server, "hms", TableCase::Upper);
    step(40, &mut workload, &mut feeder);
    let latest = workload.latest();
    wait_for(
        "the states after the outage",
        Duration::from_secs(60),
        || replica.catalog().snapshot().visible.state_id == latest,
    );
    assert!(replica.status().stalled.is_none());
    assert!(replica.status().source.error.is_none());

    // A restart of stagefs resumes after the last journaled event.
    replica.stop();
    step(20, &mut workload, &mut feeder);
    let replica = Replica::start(cfg).unwrap();
    let latest = workload.latest();
    wait_for(
        "the states after the restart",
        Duration::from_secs(60),
        || replica.catalog().snapshot().visible.state_id == latest,
    );
    let snap = replica.catalog().snapshot();
    for (id, tree) in &snap.versions {
        check_against_oracle(tree, &workload, *id);
    }
    let status = replica.status();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    assert_eq!(status.source.position, Some(latest.0 as i64));
    replica.stop();
}

#[test]
fn postgres_metastore_replicates_the_native_states_through_an_outage() {
    follow_a_metastore(Kind::Postgres);
}

#[test]
fn mariadb_metastore_replicates_the_native_states_through_an_outage() {
    follow_a_metastore(Kind::MariaDb);
}

/// Events 1..=3 are good; event 4's `EVENT_TYPE` is NULL (a value its
/// column cannot hold in Hive's schema). Replication stops at the last good
/// state, 3, and the stall names event 4.
fn a_bad_row_stops_after_the_good_rows_before_it(kind: Kind) {
    let server = DbServer::start(kind);
    server.create_metastore("hms", TableCase::Upper);
    let mut db = db_writer::MetastoreWriter::new(&server, "hms", TableCase::Upper);
    db.append(&db_writer::NewEvent::json(
        "CREATE_DATABASE",
        "sales",
        "",
        "{}",
    ));
    db.append(&db_writer::NewEvent::json("OPEN_TXN", "", "", "{}"));
    db.append(&db_writer::NewEvent::json("OPEN_TXN", "", "", "{}"));
    let (nullable, bad) = match kind {
        Kind::Postgres => (
            r#"ALTER TABLE "NOTIFICATION_LOG" ALTER COLUMN "EVENT_TYPE" DROP NOT NULL"#,
            r#"INSERT INTO "NOTIFICATION_LOG" ("NL_ID", "EVENT_ID", "EVENT_TIME", "EVENT_TYPE") VALUES (500, 4, 0, NULL)"#,
        ),
        Kind::MariaDb => (
            "ALTER TABLE `NOTIFICATION_LOG` MODIFY `EVENT_TYPE` varchar(32) NULL",
            "INSERT INTO `NOTIFICATION_LOG` (`NL_ID`, `EVENT_ID`, `EVENT_TIME`, `EVENT_TYPE`) VALUES (500, 4, 0, NULL)",
        ),
    };
    db.execute(nullable);
    db.execute(bad);

    let dir = tempfile::tempdir().unwrap();
    let pwfile = dir.path().join("pw");
    std::fs::write(&pwfile, PASSWORD).unwrap();
    let url = format!("{}?password_file={}", server.url("hms"), pwfile.display());
    let mut cfg = ReplicaConfig::new(&dir.path().join("state"), Path::new(""), Path::new(""));
    let mut hive = HiveConfig::new(
        HiveRows::Metastore(url),
        SourceMap::parse::<&str>(&[]).unwrap(),
    );
    hive.poll_interval = Duration::from_millis(50);
    cfg.hive = Some(hive);
    let replica = Replica::start(cfg).unwrap();
    wait_for("the stall at event 4", Duration::from_secs(30), || {
        replica.status().stalled.is_some()
    });
    wait_for("state 3 visible", Duration::from_secs(30), || {
        replica.catalog().snapshot().visible.state_id == StateId(3)
    });
    let stall = replica.status().stalled.unwrap();
    assert_eq!(stall.state_id, Some(StateId(4)), "{stall:?}");
    let text = format!("{} {}", stall.file.as_deref().unwrap_or(""), stall.reason);
    assert!(text.contains("EVENT_ID 4, column EVENT_TYPE"), "{text}");
    replica.stop();
}

#[test]
fn postgres_bad_row_stops_after_the_good_rows_before_it() {
    a_bad_row_stops_after_the_good_rows_before_it(Kind::Postgres);
}

#[test]
fn mariadb_bad_row_stops_after_the_good_rows_before_it() {
    a_bad_row_stops_after_the_good_rows_before_it(Kind::MariaDb);
}
