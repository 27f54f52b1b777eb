//! `stagefs mount --hive-metastore URL` end to end, on a private PostgreSQL
//! and a private MariaDB: a native workload is turned into Hive rows
//! (`stagefs::workload::hive_export`), the rows are written into the metastore
//! database the way DbNotificationListener writes them, and the mount must
//! show exactly the workload's oracle at the replicated id. Then the daemon
//! is killed with -9 while polling and restarted (nothing lost, nothing
//! applied twice), and the metastore is stopped and restarted under a
//! running daemon (the mount keeps serving, replication resumes).

mod common;
#[path = "common/dbserver.rs"]
mod dbserver;
#[path = "common/metastore_rows.rs"]
mod metastore_rows;

use std::path::Path;
use std::time::Duration;

use common::daemon::*;
use common::*;
use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use metastore_rows::{ExportPump, MetastoreWriter};
use stagefs::event::StateId;
use stagefs::workload::hive_export::{HiveWriter, LogConverter};
use stagefs::workload::{Workload, WorkloadConfig};

/// Every table of the oracle at `state` equals what the mount shows.
fn check_warehouse(d: &Daemon, w: &Workload, state: u64) {
    let expected = w.expected(StateId(state)).expect("oracle state");
    let files: usize = expected.values().map(|t| t.len()).sum();
    assert!(files > 0, "the oracle has files at {state}");
    for (key, content) in expected.iter() {
        let (db, t) = key.split_once('.').expect("db.table");
        let (_, got) = read_table(&d.join(&format!("{db}/{t}")));
        assert_eq!(got, expected_tree(content), "{key} at {state}");
    }
    let mut dbs: Vec<&str> = expected
        .keys()
        .filter_map(|k| k.split_once('.'))
        .map(|(db, _)| db)
        .collect();
    dbs.dedup();
    for db in dbs {
        let want: Vec<String> = expected
            .keys()
            .filter_map(|k| k.strip_prefix(&format!("{db}.")).map(str::to_owned))
            .collect();
        assert_eq!(names(&d.join(db)), want, "tables of {db} at {state}");
    }
}

/// The native workload, its conversion to Hive rows, and the copy of those
/// rows into the metastore.
struct Feed {
    workload: Workload,
    converter: LogConverter,
    pump: ExportPump,
}

impl Feed {
    fn new(root: &Path) -> (Feed, Vec<String>) {
        let workload = Workload::new(
            root,
            WorkloadConfig {
                seed: 17,
                ..WorkloadConfig::default()
            },
        )
        .expect("workload");
        let rows = root.join("hive/rows.jsonl");
        let writer = HiveWriter::for_workload(root, &rows, true).expect("hive writer");
        let maps = writer.source_map_args();
        let feed = Feed {
            workload,
            converter: LogConverter::new(&root.join("events"), writer),
            pump: ExportPump::new(&rows),
        };
        (feed, maps)
    }

    /// `steps` more native events, converted and written to the metastore;
    /// returns the newest id.
    fn advance(&mut self, steps: usize, db: &mut MetastoreWriter) -> u64 {
        for _ in 0..steps {
            self.workload.step().expect("workload step");
        }
        self.workload.flush().expect("flush");
        self.converter.pump().expect("convert");
        self.converter.writer.sync().expect("sync rows");
        self.pump.pump(db);
        let last = self.pump.last as u64;
        assert_eq!(
            last,
            self.workload.latest().0,
            "Hive ids follow the native ids"
        );
        last
    }
}

fn status_text(d: &Daemon) -> String {
    std::fs::read_to_string(d.join(".stagefs/status")).unwrap_or_default()
}

fn mount_follows_the_metastore(kind: Kind) {
    let mut server = DbServer::start(kind);
    server.create_metastore("hive", TableCase::Upper);
    let mut db = MetastoreWriter::new(&server, "hive", TableCase::Upper);

    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let (mut feed, source_map) = Feed::new(&root);
    let first = feed.advance(40, &mut db);
    let args = args.hive_metastore(HiveMetastoreArgs {
        url: server.url("hive"),
        password: PASSWORD.into(),
        source_map,
        poll_ms: 50,
    });

    let mut d = Daemon::start(args);
    d.wait_visible(first);
    check_warehouse(&d, &feed.workload, first);

    // kill -9 while it polls (and replicates what just arrived), restart:
    // nothing lost, nothing applied twice (a repeat would stall it).
    let second = feed.advance(40, &mut db);
    std::thread::sleep(Duration::from_millis(30));
    d.kill9();
    detach(d.mnt());
    d.restart();
    let s = d.wait_visible(second);
    assert_eq!(visible(&s), second, "{s}");
    check_warehouse(&d, &feed.workload, second);

    // The metastore goes away under a running daemon: status says so, the
    // mount keeps serving the last state; when it is back, replication
    // resumes with the events written meanwhile... once they can be written.
    server.stop();
    let s = d.wait_status_for(
        "the metastore reported unavailable",
        Duration::from_secs(30),
        |s| s.to_string().contains("unavailable"),
    );
    eprintln!("status while the metastore is down: {s}");
    check_warehouse(&d, &feed.workload, second);
    assert!(!status_text(&d).contains(PASSWORD), "{}", status_text(&d));
    server.restart();
    let mut db = MetastoreWriter::new(&server, "hive", TableCase::Upper);
    let third = feed.advance(40, &mut db);
    let s = d.wait_status_for("replication resumed", Duration::from_secs(60), |s| {
        visible(s) >= third
    });
    assert_eq!(visible(&s), third, "{s}");
    check_warehouse(&d, &feed.workload, third);
    assert!(
        !d.all_stderr().contains(PASSWORD),
        "the password reached the log"
    );
}

#[test]
fn postgres_metastore_feeds_the_mount_across_kill9_and_metastore_restart() {
    mount_follows_the_metastore(Kind::Postgres);
}

#[test]
fn mariadb_metastore_feeds_the_mount_across_kill9_and_metastore_restart() {
    mount_follows_the_metastore(Kind::MariaDb);
}
