//! The Hive source end to end without a mount: NOTIFICATION_LOG rows (as
//! `--hive-events` JSON Lines, written by `workload::hive_export` the way Hive's
//! listener would) → journal → staged, checksum-verified blobs → commits,
//! checked against native replication of the same warehouse and against the
//! workload's oracle.

use stagefs::testkit::hive_pipeline::{content, hive_rows_config, native_trees};
use stagefs::testkit::source_files;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use source_files::{event, put_file};
use stagefs::catalog::Node;
use stagefs::event::{BlobId, Change, Event, FileRef, Op, StateId};
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::source::hive::map::SourceMap;
use stagefs::workload::hive_export::{hdfs_checksum, HiveWriter, LogConverter, TxnFiles};
use stagefs::workload::{write_seed_example, Workload, WorkloadConfig};

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A warehouse written by native events under `root` and the same events
/// as Hive rows in `root/hive/rows.jsonl`.
struct HiveFixture {
    rows: PathBuf,
    map: Vec<String>,
}

impl HiveFixture {
    fn writer(root: &Path, gzip: bool) -> (HiveWriter, HiveFixture) {
        let rows = root.join("hive/rows.jsonl");
        let writer = HiveWriter::for_workload(root, &rows, gzip).unwrap();
        let map = writer.source_map_args();
        let fx = HiveFixture { rows, map };
        (writer, fx)
    }

    /// Converts the native log under `root/events` into rows.
    fn convert(root: &Path, gzip: bool) -> HiveFixture {
        let (writer, fx) = HiveFixture::writer(root, gzip);
        let mut c = LogConverter::new(&root.join("events"), writer);
        c.pump().unwrap();
        fx
    }

    fn config(&self, state: &Path) -> ReplicaConfig {
        hive_rows_config(state, &self.rows, SourceMap::parse(&self.map).unwrap())
    }
}

#[test]
fn seed_example_through_hive_rows_gives_the_native_states() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let fx = HiveFixture::convert(src.path(), true);
    let replica = Replica::start(fx.config(state.path())).unwrap();
    wait_for("state 50", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    let native = native_trees(src.path());
    let snap = replica.catalog().snapshot();
    for (id, tree) in &snap.versions {
        let expected = native.range(..=*id).next_back().map(|(_, t)| content(t));
        assert_eq!(Some(content(tree)), expected, "state {id}");
    }
    assert_eq!(
        content(&snap.visible),
        content(&native[&StateId(50)]),
        "state 50"
    );
    // Every file checked with its HDFS checksum, counted as verified.
    snap.visible.for_each_file(&mut |f| {
        assert_eq!(f.verified, "hdfs-md5md5crc32c");
        assert!(f.source.starts_with("hdfs://"), "{}", f.source);
    });
    let status = replica.status();
    assert_eq!(status.source.kind, "hive");
    assert_eq!(status.source.position, Some(50));
    assert_eq!(status.unverified_files, 0);
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    // 000002_0 only exists in change management: fetched from there.
    assert!(status.staging.from_change_management >= 1);
}

#[test]
fn workload_through_hive_rows_matches_the_oracle_at_every_retained_state() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut workload = Workload::new(
        src.path(),
        WorkloadConfig {
            seed: 7,
            table_churn: true,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let (writer, fx) = HiveFixture::writer(src.path(), true);
    let mut converter = LogConverter::new(&src.path().join("events"), writer);
    // Converted as the workload writes, as a listener would: every file
    // is still at its source path when its event is written.
    let mut steps = |n: usize| {
        for _ in 0..n {
            workload.step().unwrap();
            workload.flush().unwrap();
            converter.pump().unwrap();
        }
        workload.latest()
    };
    // Half before the replica starts, half while it runs: at least two
    // states become visible whatever the commits' pace.
    let first = steps(75);
    let replica = Replica::start(fx.config(state.path())).unwrap();
    wait_for("the first half", Duration::from_secs(30), || {
        replica.catalog().snapshot().visible.state_id == first
    });
    let latest = steps(75);
    wait_for("the last state", Duration::from_secs(30), || {
        replica.catalog().snapshot().visible.state_id == latest
    });
    let snap = replica.catalog().snapshot();
    assert!(snap.versions.len() > 1, "{:?}", snap.versions.keys());
    for (id, tree) in &snap.versions {
        let Some(expected) = workload.expected(*id) else {
            continue; // before the first event
        };
        for (key, table) in expected.iter() {
            let (db, t) = key.split_once('.').unwrap();
            let got: Vec<(String, BlobId)> = tree
                .table(db, t)
                .unwrap_or_else(|| panic!("{key} missing at {id}"))
                .files_below();
            let want: Vec<(String, BlobId)> = table.iter().map(|(p, b)| (p.clone(), *b)).collect();
            assert_eq!(got, want, "{key} at state {id}");
        }
    }
    assert!(replica.status().stalled.is_none());
}

const TXN_DELTA: &str = "delta_0000001_0000001_0000";

/// Events 1..=3 create `sales.orders` (partitioned by `ds`) and
/// `sales.totals`; event 4 commits one transaction that writes a delta
/// file into each (in [`TXN_DELTA`]).
fn two_table_transaction(root: &Path) -> HiveFixture {
    let (mut w, fx) = HiveFixture::writer(root, true);
    w.write_event(&event(
        r#"{"id": 1, "op": "create_database", "db": "sales"}"#,
    ))
    .unwrap();
    w.write_event(&event(
        r#"{"id": 2, "op": "create_table", "db": "sales", "table": "orders", "partition_keys": ["ds"]}"#,
    ))
    .unwrap();
    w.write_event(&event(
        r#"{"id": 3, "op": "create_table", "db": "sales", "table": "totals"}"#,
    ))
    .unwrap();
    let delta = TXN_DELTA;
    let a = put_file(
        root,
        &format!("sales.db/orders/ds=2024-01-01/{delta}/bucket_00000"),
        b"orders",
    );
    let b = put_file(
        root,
        &format!("sales.db/totals/{delta}/bucket_00000"),
        b"totals",
    );
    let id = w
        .write_txn(
            1_700_000_000,
            &[
                TxnFiles {
                    db: "sales".into(),
                    table: "orders".into(),
                    partition: Some(BTreeMap::from([("ds".into(), "2024-01-01".into())])),
                    files: vec![(a, Some(delta.into()))],
                },
                TxnFiles {
                    db: "sales".into(),
                    table: "totals".into(),
                    partition: None,
                    files: vec![(b, Some(delta.into()))],
                },
            ],
        )
        .unwrap();
    assert_eq!(id, 4);
    fx
}

#[test]
fn commit_txn_across_two_tables_appears_as_one_state_with_its_delta_directories() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = src.path();
    let fx = two_table_transaction(root);
    let delta = TXN_DELTA;
    let replica = Replica::start(fx.config(state.path())).unwrap();
    wait_for("state 4", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == StateId(4)
    });
    let snap = replica.catalog().snapshot();
    for (id, tree) in &snap.versions {
        let orders = tree.table("sales", "orders").map(|t| t.files_below().len());
        let totals = tree.table("sales", "totals").map(|t| t.files_below().len());
        // Both tables' files, or neither's.
        assert!(
            matches!(
                (orders, totals),
                (Some(0), Some(0)) | (Some(1), Some(1)) | (None, _)
            ),
            "state {id}: orders {orders:?} totals {totals:?}"
        );
    }
    let tree = &snap.visible;
    let orders = tree.table("sales", "orders").unwrap();
    assert_eq!(
        orders
            .files_below()
            .into_iter()
            .map(|(p, _)| p)
            .collect::<Vec<_>>(),
        vec![format!("ds=2024-01-01/{delta}/bucket_00000")]
    );
    let totals = tree.table("sales", "totals").unwrap();
    match totals.child(delta) {
        Some(Node::Dir(d)) => assert!(d.child("bucket_00000").is_some()),
        other => panic!("no {delta} directory: {other:?}"),
    }
}

/// Rows for the seed example, replicated until the stall reports; returns
/// the replica and the stall reason.
fn stall_after(fx: &HiveFixture, state: &Path, visible: u64, what: &str) -> (Replica, String) {
    let replica = Replica::start(fx.config(state)).unwrap();
    wait_for(what, Duration::from_secs(20), || {
        replica.status().stalled.is_some()
            && replica.catalog().snapshot().visible.state_id == StateId(visible)
    });
    let reason = replica.status().stalled.unwrap().reason;
    (replica, reason)
}

fn rows_of(fx: &HiveFixture) -> Vec<String> {
    std::fs::read_to_string(&fx.rows)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn set_rows(fx: &HiveFixture, rows: &[String]) {
    std::fs::write(&fx.rows, rows.join("\n") + "\n").unwrap();
}

/// The SPEC example as Hive rows (no checksums) in `src`, of which a
/// replica in `state` has followed the first 30: the fixture, all the
/// rows, the replica.
fn seed_followed_to_30(src: &Path, state: &Path) -> (HiveFixture, Vec<String>, Replica) {
    write_seed_example(src).unwrap();
    let fx = HiveFixture::convert(src, false);
    let rows = rows_of(&fx);
    set_rows(&fx, &rows[..30]);
    let replica = Replica::start(fx.config(state)).unwrap();
    wait_for("state 30", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == StateId(30)
    });
    (fx, rows, replica)
}

#[test]
fn an_id_gap_stops_at_the_last_good_state_asking_for_a_re_bootstrap() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let fx = HiveFixture::convert(src.path(), true);
    let mut rows = rows_of(&fx);
    // Events 21..=24 purged by the cleaner before they were replicated.
    rows.drain(20..24);
    set_rows(&fx, &rows);
    let (_r, reason) = stall_after(&fx, state.path(), 20, "the gap");
    assert!(
        reason.contains("events 21..24 are missing from the metastore: re-bootstrap"),
        "{reason}"
    );
}

#[test]
fn a_repeated_id_stops_replication_as_corruption() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let fx = HiveFixture::convert(src.path(), true);
    let mut rows = rows_of(&fx);
    let again = rows[29].clone();
    rows.insert(30, again);
    set_rows(&fx, &rows);
    let (_r, reason) = stall_after(&fx, state.path(), 30, "the repeat");
    assert!(reason.contains("event 30 was read again"), "{reason}");
}

#[test]
fn an_undecodable_message_stops_at_the_event_before_it() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let fx = HiveFixture::convert(src.path(), true);
    let mut rows = rows_of(&fx);
    let mut row: serde_json::Value = serde_json::from_str(&rows[39]).unwrap();
    row["MESSAGE"] = "not base64 at all!".into();
    rows[39] = row.to_string();
    set_rows(&fx, &rows);
    let (_r, reason) = stall_after(&fx, state.path(), 39, "the bad message");
    assert!(
        reason.starts_with("event 40: cannot decode the INSERT message"),
        "{reason}"
    );
}

#[test]
fn an_unmapped_uri_is_rejected_as_bad_input() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let mut fx = HiveFixture::convert(src.path(), false);
    // Only the change-management root is mapped, and the warehouse is on a
    // file system stagefs has no reader for (an unmapped hdfs:// URI would
    // be read on HDFS).
    fx.map.retain(|m| m.contains("cmroot"));
    let rows = rows_of(&fx).join("\n").replace(
        "hdfs://stagefs-demo:8020/warehouse",
        "abfs://stagefs-demo/warehouse",
    );
    set_rows(&fx, &[rows]);
    let (_r, reason) = stall_after(&fx, state.path(), 19, "the unmapped URI");
    assert!(reason.contains("no --source-map covers"), "{reason}");
    assert!(reason.starts_with("event 20"), "{reason}");
}

#[test]
fn a_checksum_mismatch_at_source_is_fetched_from_cm_and_at_both_stalls() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = src.path();
    write_seed_example(root).unwrap();
    let fx = HiveFixture::convert(root, true);
    // Same size, other bytes at the source: the cm copy has the right ones.
    // (Replaced, not rewritten in place: the cm copy is a hard link.)
    let a = root.join("source/default/blah/p=a/000001_0");
    std::fs::remove_file(&a).unwrap();
    std::fs::write(&a, b"6\n").unwrap();
    // 000003_0 wrong at the source and in cm: state 40 cannot complete.
    let c = root.join("source/default/blah/p=a/000003_0");
    std::fs::remove_file(&c).unwrap();
    std::fs::write(&c, b"16\n").unwrap();
    let cm_c = std::fs::read_dir(root.join("hive-cm"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("000003_0_")
        })
        .unwrap();
    std::fs::remove_file(&cm_c).unwrap();
    std::fs::write(&cm_c, b"17\n").unwrap();
    let (replica, reason) = stall_after(&fx, state.path(), 39, "the bad file");
    assert!(reason.contains("HDFS checksum mismatch"), "{reason}");
    assert!(reason.contains("000003_0"), "{reason}");
    let snap = replica.catalog().snapshot();
    let files = snap.visible.table("default", "blah").unwrap().files_below();
    let expected = BlobId(<sha2::Sha256 as sha2::Digest>::digest(b"5\n").into());
    assert_eq!(files[0], ("p=a/000001_0".to_owned(), expected));
    assert!(replica.status().staging.from_change_management >= 1);
    drop(replica);
    // The right bytes arrive in cm: replication goes on to 50.
    std::fs::remove_file(&cm_c).unwrap();
    std::fs::write(&cm_c, b"15\n").unwrap();
    assert!(cm_c.to_string_lossy().ends_with(&hdfs_checksum(b"15\n")));
    let replica = Replica::start(fx.config(state.path())).unwrap();
    wait_for("state 50", Duration::from_secs(30), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
}

#[test]
fn restart_resumes_after_the_last_journaled_event() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (fx, rows, replica) = seed_followed_to_30(src.path(), state.path());
    replica.stop();
    set_rows(&fx, &rows);
    let replica = Replica::start(fx.config(state.path())).unwrap();
    wait_for("state 50", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    let status = replica.status();
    // Only events 31..=50 were read again; nothing applied twice.
    assert_eq!(status.events_accepted, 20);
    assert!(status.stalled.is_none());
    assert_eq!(
        content(&replica.catalog().snapshot().visible),
        content(&native_trees(src.path())[&StateId(50)])
    );
}

#[test]
fn a_symlink_out_of_the_mapped_directory_stalls_and_nothing_is_read() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = src.path();
    write_seed_example(root).unwrap();
    // Without checksums there is no change-management copy to fall back on.
    let (mut writer, fx) = HiveFixture::writer(root, true);
    writer.set_checksums(false);
    LogConverter::new(&root.join("events"), writer)
        .pump()
        .unwrap();
    // Event 20's file becomes a link to bytes outside `source/` (the
    // mapped directory): the same bytes, so only the link gives it away.
    let secret = root.join("outside/000001_0");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    let linked = root.join("source/default/blah/p=a/000001_0");
    std::fs::rename(&linked, &secret).unwrap();
    std::os::unix::fs::symlink(&secret, &linked).unwrap();
    let (replica, reason) = stall_after(&fx, state.path(), 19, "the escaping link");
    assert!(reason.contains("000001_0"), "{reason}");
    assert!(reason.contains("leaves its root"), "{reason}");
    assert_eq!(replica.status().staging.from_change_management, 0);
    drop(replica);
    let blob = BlobId(<sha2::Sha256 as sha2::Digest>::digest(b"5\n").into()).to_hex();
    assert!(
        !state
            .path()
            .join("blobs")
            .join(&blob[..2])
            .join(&blob)
            .exists(),
        "the linked bytes were staged"
    );
}

/// A change of `op` on sales.`table` in partition `ds`.
fn change(op: Op, table: &str, ds: Option<&str>, files: Vec<FileRef>) -> Change {
    let mut c = Change::new(op, "sales", table);
    c.partition = ds.map(|ds| BTreeMap::from([("ds".to_owned(), ds.to_owned())]));
    c.files = files;
    c
}

#[test]
fn partition_renames_ctas_into_partitions_and_external_tables_match_the_writer_at_every_state() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = src.path();
    let (mut w, fx) = HiveFixture::writer(root, true);
    // Following the rows as they are written, each state waited for before
    // the next is written, so every state commits and is checked.
    let replica = Replica::start(fx.config(state.path())).unwrap();
    let mut oracle = BTreeMap::new();
    let mut write = |w: &mut HiveWriter, id: u64, changes: Vec<Change>| {
        let e = Event {
            id: StateId(id),
            time_ms: Some(1_700_000_000_000 + id as i64 * 1000),
            changes,
        };
        w.write_event(&e).unwrap();
        oracle.insert(StateId(id), content(w.tree()));
        wait_for(&format!("state {id}"), Duration::from_secs(20), || {
            replica.catalog().snapshot().visible.state_id == StateId(id)
        });
    };
    write(
        &mut w,
        1,
        vec![Change::new(Op::CreateDatabase, "sales", "")],
    );
    let mut create = Change::new(Op::CreateTable, "sales", "orders");
    create.partition_keys = vec!["ds".into()];
    write(&mut w, 2, vec![create.clone()]);
    let a = put_file(root, "sales/orders/ds=1/000000_0", b"a");
    let b = put_file(root, "sales/orders/ds=1/000001_0", b"b");
    let c = put_file(root, "sales/orders/ds=2/000000_0", b"c");
    write(
        &mut w,
        3,
        vec![change(Op::AddPartition, "orders", Some("1"), vec![a, b])],
    );
    write(
        &mut w,
        4,
        vec![change(Op::AddFiles, "orders", Some("2"), vec![c])],
    );
    // ALTER TABLE orders PARTITION (ds='1') RENAME TO PARTITION (ds='2024/01').
    let mut rename = change(Op::RenamePartition, "orders", Some("1"), vec![]);
    rename.new_partition = Some(BTreeMap::from([("ds".into(), "2024/01".into())]));
    write(&mut w, 5, vec![rename]);
    let d = put_file(root, "sales/orders/ds=2024%2F01/000002_0", b"d");
    write(
        &mut w,
        6,
        vec![change(Op::AddFiles, "orders", Some("2024/01"), vec![d])],
    );
    // CREATE TABLE summary PARTITIONED BY (ds) AS SELECT ...
    let s1 = put_file(root, "tmp/q1/000000_0", b"s1");
    let s2 = put_file(root, "tmp/q2/000000_0", b"s2");
    let s3 = put_file(root, "tmp/q2/000001_0", b"s3");
    let mut ctas = create.clone();
    ctas.table = "summary".into();
    write(
        &mut w,
        7,
        vec![
            ctas,
            change(Op::AddPartition, "summary", Some("x"), vec![s1]),
            change(Op::AddPartition, "summary", Some("y"), vec![s2, s3]),
        ],
    );
    // An external table: created, renamed, made managed again.
    let mut ext = Change::new(Op::CreateTable, "sales", "raw");
    ext.not_in_log = Some("external".into());
    write(&mut w, 8, vec![ext]);
    let mut moved = Change::new(Op::RenameTable, "sales", "raw");
    (moved.new_db, moved.new_table) = ("sales".into(), "raw_2024".into());
    write(&mut w, 9, vec![moved]);
    let mut rename_back = change(Op::RenamePartition, "summary", Some("y"), vec![]);
    rename_back.new_partition = Some(BTreeMap::from([("ds".into(), "z".into())]));
    write(&mut w, 10, vec![rename_back]);

    let snap = replica.catalog().snapshot();
    assert_eq!(snap.visible.state_id, StateId(10));
    assert!(snap.versions.len() > 1);
    for (id, tree) in &snap.versions {
        assert_eq!(Some(&content(tree)), oracle.get(id), "state {id}");
    }
    let status = replica.status();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    let listed: Vec<&str> = status.not_in_log.iter().map(|t| t.table.as_str()).collect();
    assert_eq!(listed, vec!["sales.raw_2024"]);
    assert!(status.not_in_log[0].reason.starts_with("external table"));
    let orders = snap.visible.table("sales", "orders").unwrap();
    assert!(orders.child("ds=1").is_none() && orders.child("ds=2024%2F01").is_some());
    // The renamed partition's files are the ones staged before the rename.
    assert_eq!(
        oracle[&StateId(10)]["sales.summary"]
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        vec!["ds=x/000000_0", "ds=z/000000_0", "ds=z/000001_0"]
    );
}

#[test]
fn a_corrected_row_resumes_replication_without_a_restart() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let fx = HiveFixture::convert(src.path(), true);
    let rows = rows_of(&fx);
    let mut broken = rows.clone();
    let mut row: serde_json::Value = serde_json::from_str(&broken[39]).unwrap();
    row["MESSAGE"] = "not base64 at all!".into();
    broken[39] = row.to_string();
    set_rows(&fx, &broken);
    let (replica, reason) = stall_after(&fx, state.path(), 39, "the bad message");
    assert!(reason.starts_with("event 40: cannot decode"), "{reason}");
    let accepted = replica.status().events_accepted;
    // The row is corrected in the file while the daemon runs.
    set_rows(&fx, &rows);
    let last = rows
        .iter()
        .filter_map(|r| serde_json::from_str::<serde_json::Value>(r).ok()?["EVENT_ID"].as_u64())
        .max()
        .unwrap();
    wait_for(
        "replication past the corrected row",
        Duration::from_secs(20),
        || replica.catalog().snapshot().visible.state_id == StateId(last),
    );
    let status = replica.status();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    // Events 1..=39 were not applied again.
    assert_eq!(status.events_accepted, accepted + (last - 39));
    assert_eq!(status.events_duplicate, 0);
    replica.stop();
}

/// A repeated id whose first copy ends a full batch (the next poll asks
/// for rows after it): the export is corrupt, and replication stops at the
/// last good state naming the repeat.
#[test]
fn a_repeated_id_at_a_batch_boundary_stops_replication() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_seed_example(src.path()).unwrap();
    let fx = HiveFixture::convert(src.path(), true);
    let mut rows = rows_of(&fx);
    let again = rows[29].clone(); // event 30
    rows.insert(30, again);
    set_rows(&fx, &rows);
    let mut cfg = fx.config(state.path());
    cfg.hive.as_mut().unwrap().batch = 30; // event 30 ends the first batch
    let replica = Replica::start(cfg).unwrap();
    wait_for("the stall", Duration::from_secs(20), || {
        replica.status().stalled.is_some()
    });
    wait_for("state 30", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == StateId(30)
    });
    let stall = replica.status().stalled.unwrap();
    assert!(
        stall
            .reason
            .contains("event 30 was read again after event 30"),
        "{stall:?}"
    );
    assert_eq!(stall.state_id, Some(StateId(30)));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(replica.catalog().snapshot().visible.state_id, StateId(30));
    replica.stop();
}

/// The export replaced by a longer one (written aside, renamed into
/// place): followed on, from the row after the last one read.
#[test]
fn a_replaced_hive_events_file_is_followed() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (fx, rows, replica) = seed_followed_to_30(src.path(), state.path());
    let accepted = replica.status().events_accepted;
    let aside = fx.rows.with_extension("tmp");
    std::fs::write(&aside, rows.join("\n") + "\n").unwrap();
    std::fs::rename(&aside, &fx.rows).unwrap();
    wait_for("state 50", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id == StateId(50)
    });
    let status = replica.status();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    assert_eq!(
        status.events_accepted,
        accepted + 20,
        "nothing applied twice"
    );
    replica.stop();
}

/// A TXN_WRITE_NOTIFICATION_LOG row that shows up after its COMMIT_TXN
/// was read (against the documented order, which is Hive's): the commit
/// was applied with the rows before it, so replication stops there and
/// says why instead of going on as if nothing happened.
#[test]
fn a_write_row_after_its_commit_stops_replication_and_says_why() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = src.path();
    let fx = two_table_transaction(root);
    let mut rows = rows_of(&fx);
    let late = rows
        .iter()
        .rposition(|r| r.contains("WNL_TXNID") && r.contains("totals"))
        .unwrap();
    let row = rows.remove(late);
    set_rows(&fx, &rows);
    let commit: serde_json::Value =
        serde_json::from_str(rows.iter().find(|r| r.contains("\"COMMIT_TXN\"")).unwrap()).unwrap();
    let commit = StateId(commit["EVENT_ID"].as_u64().unwrap());
    let replica = Replica::start(fx.config(state.path())).unwrap();
    wait_for("the commit applied", Duration::from_secs(20), || {
        replica.catalog().snapshot().visible.state_id >= commit
    });
    rows.push(row);
    set_rows(&fx, &rows);
    wait_for("the stall", Duration::from_secs(20), || {
        replica.status().stalled.is_some()
    });
    let stall = replica.status().stalled.unwrap();
    assert!(
        stall.reason.contains("after its COMMIT_TXN") && stall.reason.contains("re-bootstrap"),
        "{stall:?}"
    );
    replica.stop();
}

/// ALTER TABLE archive EXCHANGE PARTITION … WITH TABLE orders, written as
/// the real metastore writes it (an ADD_PARTITION naming the files at
/// their new place, then one DROP_PARTITION per partition, consecutive
/// ids): the replica makes the rows one event, so every state it keeps
/// equals the writer's, none has a partition in both tables, and the
/// moved files are read from the destination.
#[test]
fn an_exchange_partition_is_one_state_and_matches_the_writer() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let root = src.path();
    let (mut w, fx) = HiveFixture::writer(root, false);
    let replica = Replica::start(fx.config(state.path())).unwrap();
    let mut oracle = BTreeMap::new();
    // Writes `changes` at the writer's next id; the exchange's drops take
    // the ids after it, which hold the same content.
    let mut write = |w: &mut HiveWriter, changes: Vec<Change>| {
        let id = w.next_id() as u64;
        let e = Event {
            id: StateId(id),
            time_ms: Some(1_700_000_000_000 + id as i64 * 1000),
            changes,
        };
        w.write_event(&e).unwrap();
        let last = w.next_id() as u64 - 1;
        for s in id..=last {
            oracle.insert(StateId(s), content(w.tree()));
        }
        wait_for(&format!("state {last}"), Duration::from_secs(20), || {
            replica.catalog().snapshot().visible.state_id == StateId(last)
        });
        (id, last)
    };
    write(&mut w, vec![Change::new(Op::CreateDatabase, "sales", "")]);
    for t in ["orders", "archive"] {
        let mut create = Change::new(Op::CreateTable, "sales", t);
        create.partition_keys = vec!["ds".into()];
        write(&mut w, vec![create]);
    }
    let a = put_file(root, "sales/orders/ds=1/000000_0", b"a");
    let b = put_file(root, "sales/orders/ds=1/000001_0", b"b");
    let c = put_file(root, "sales/orders/ds=2/000000_0", b"c");
    let d = put_file(root, "sales/orders/ds=3/000000_0", b"d");
    write(
        &mut w,
        vec![change(
            Op::AddPartition,
            "orders",
            Some("1"),
            vec![a.clone(), b.clone()],
        )],
    );
    write(
        &mut w,
        vec![change(
            Op::AddPartition,
            "orders",
            Some("2"),
            vec![c.clone()],
        )],
    );
    write(
        &mut w,
        vec![change(
            Op::AddPartition,
            "orders",
            Some("3"),
            vec![d.clone()],
        )],
    );
    // One partition, then two.
    let (one, one_end) = write(
        &mut w,
        vec![
            change(Op::AddPartition, "archive", Some("1"), vec![a, b]),
            change(Op::DropPartition, "orders", Some("1"), vec![]),
        ],
    );
    assert_eq!(one_end, one + 1);
    let (two, two_end) = write(
        &mut w,
        vec![
            change(Op::AddPartition, "archive", Some("2"), vec![c]),
            change(Op::AddPartition, "archive", Some("3"), vec![d]),
            change(Op::DropPartition, "orders", Some("2"), vec![]),
            change(Op::DropPartition, "orders", Some("3"), vec![]),
        ],
    );
    assert_eq!(two_end, two + 2);
    let e = put_file(root, "sales/archive/ds=1/000002_0", b"e");
    let (last, _) = write(
        &mut w,
        vec![change(Op::AddFiles, "archive", Some("1"), vec![e])],
    );

    // The rows: an ADD_PARTITION into archive, then the drops from orders.
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&fx.rows)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let shape: Vec<(i64, &str, &str)> = rows
        .iter()
        .filter(|r| r["EVENT_ID"].as_i64().unwrap() >= one as i64)
        .map(|r| {
            (
                r["EVENT_ID"].as_i64().unwrap(),
                r["EVENT_TYPE"].as_str().unwrap(),
                r["TBL_NAME"].as_str().unwrap(),
            )
        })
        .collect();
    let one = one as i64;
    assert_eq!(
        shape,
        vec![
            (one, "ADD_PARTITION", "archive"),
            (one + 1, "DROP_PARTITION", "orders"),
            (one + 2, "ADD_PARTITION", "archive"),
            (one + 3, "DROP_PARTITION", "orders"),
            (one + 4, "DROP_PARTITION", "orders"),
            (one + 5, "INSERT", "archive"),
        ]
    );
    assert!(rows[one as usize - 1]["MESSAGE"]
        .as_str()
        .map(|m| serde_json::from_str::<serde_json::Value>(m).unwrap())
        .map(|m| m["partitionFiles"][0]["files"][0]
            .as_str()
            .unwrap()
            .to_owned())
        .unwrap()
        .contains("/sales.db/archive/ds=1/000000_0#"));

    let snap = replica.catalog().snapshot();
    assert_eq!(snap.visible.state_id, StateId(last));
    assert!(snap.versions.len() > 1);
    for (id, tree) in &snap.versions {
        assert_eq!(Some(&content(tree)), oracle.get(id), "state {id}");
        let t = content(tree);
        let parts = |table: &str| -> std::collections::BTreeSet<String> {
            t.get(table)
                .map(|files| {
                    files
                        .iter()
                        .map(|(p, _)| p.split('/').next().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert!(
            parts("sales.orders").is_disjoint(&parts("sales.archive")),
            "state {id} has a partition in both tables: {t:?}"
        );
    }
    let status = replica.status();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    assert_eq!(
        oracle[&StateId(last)]["sales.archive"]
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        vec![
            "ds=1/000000_0",
            "ds=1/000001_0",
            "ds=1/000002_0",
            "ds=2/000000_0",
            "ds=3/000000_0"
        ]
    );
    assert!(oracle[&StateId(last)]
        .get("sales.orders")
        .is_none_or(|f| f.is_empty()));
}
