//! `--bootstrap` from the Hive metastore's own tables (issue 12), on a
//! private PostgreSQL and a private MariaDB: a warehouse of 500 tables and
//! over 5,000 partitions whose events were purged, bootstrapped while a
//! writer keeps inserting, overwriting (reusing file names), adding and
//! dropping partitions and renaming tables. The bootstrap's state and every
//! later state must equal the oracle, table by table (MariaDB runs 100
//! tables unless STAGEFS_LONG_TESTS is set, to keep the suite short). Then: `kill -9`
//! during a bootstrap (the rerun copies nothing already staged), and a
//! table that changes faster than it can be listed (reported, never shown).
//! A replica stalled at an id gap: bootstrapped again by the live mount
//! (the old state served meanwhile) and by `stagefs bootstrap` on the
//! stopped folder (which leaves a healthy folder alone).
//! Transactional tables: bootstrapped to exactly the files a Hive reader at
//! the snapshot reads (base, deltas, aborted and compacted directories),
//! reported when only Hive's row filtering could read them, and brought
//! forward by the COMMIT_TXN events that follow.
//!
//! Bigger warehouses run with STAGEFS_LONG_TESTS=1.

mod common;
#[path = "common/dbserver.rs"]
mod dbserver;
#[path = "common/hms_warehouse.rs"]
mod hms_warehouse;
#[path = "common/metastore_rows.rs"]
mod metastore_rows;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::daemon::*;
use common::*;
use dbserver::{DbServer, Kind, TableCase, PASSWORD};
use hms_warehouse::{HmsWarehouse, Shape};
use serde_json::Value;

fn long() -> bool {
    std::env::var_os("STAGEFS_LONG_TESTS").is_some()
}

/// A test's temporary directory, kept (and its path printed) when the test
/// fails and `STAGEFS_KEEP_FAILED` is set: the state folder, the warehouse
/// and the logs of a failing run can then be inspected. Declared first in
/// a test, it is dropped last (after the daemon has unmounted).
struct TestDir(Option<tempfile::TempDir>);

impl TestDir {
    fn new() -> TestDir {
        TestDir(Some(tempfile::tempdir().expect("temporary directory")))
    }

    fn path(&self) -> &Path {
        self.0.as_ref().expect("present until dropped").path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("STAGEFS_KEEP_FAILED").is_some() {
            if let Some(dir) = self.0.take() {
                eprintln!("STAGEFS_KEEP_FAILED: kept {}", dir.keep().display());
            }
        }
    }
}

/// Every table of the oracle at `id` equals what `root` (the mount, or a
/// snapshot directory) shows, and no other table is there.
fn check_at(root: &Path, wh: &HmsWarehouse, id: i64) {
    check_content(root, wh.expected(id), &id.to_string());
}

/// `root` shows exactly `expected` (`what` names it in failures).
fn check_content(root: &Path, expected: &stagefs::workload::WarehouseContent, what: &str) {
    let mut dbs: Vec<String> = expected
        .keys()
        .filter_map(|k| k.split_once('.').map(|(db, _)| db.to_owned()))
        .collect();
    dbs.dedup();
    for db in &dbs {
        let want: Vec<String> = expected
            .keys()
            .filter_map(|k| k.strip_prefix(&format!("{db}.")).map(str::to_owned))
            .collect();
        assert_eq!(names(&root.join(db)), want, "tables of {db} at {what}");
    }
    for (key, content) in expected.iter() {
        let (db, t) = key.split_once('.').expect("db.table");
        let (_, got) = read_table(&root.join(db).join(t));
        assert_eq!(got, expected_tree(content), "{key} at {what}");
    }
}

fn wait_mounted_long(d: &mut Daemon, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !(mounted(d.mnt()) && std::fs::metadata(d.join(".stagefs/status")).is_ok()) {
        if let Some(st) = d.try_exit() {
            panic!("stagefs exited ({st}) before mounting\n{}", d.all_stderr());
        }
        assert!(
            Instant::now() < deadline,
            "not mounted within {timeout:?}\n{}",
            d.all_stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn setup(kind: Kind, root: &Path, shape: &Shape) -> (DbServer, HmsWarehouse) {
    let server = DbServer::start(kind);
    server.create_metastore("hive", TableCase::Upper);
    let wh = HmsWarehouse::create(&server, "hive", &root.join("hive"), shape);
    (server, wh)
}

/// Runs `wh.step()` every `pause` on a thread until the returned flag is set.
fn busy_writer(
    mut wh: HmsWarehouse,
    pause: Duration,
    mut step: impl FnMut(&mut HmsWarehouse) + Send + 'static,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<HmsWarehouse>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let handle = std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            step(&mut wh);
            std::thread::sleep(pause);
        }
        wh
    });
    (stop, handle)
}

fn bootstrap_under_a_busy_writer(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let shape = Shape {
        databases: 5,
        // The full 500 tables on PostgreSQL; MariaDB runs the same code
        // on 100 by default (the whole suite must stay short).
        tables_per_db: match (long(), kind) {
            (true, _) => 400,
            (false, Kind::Postgres) => 100,
            (false, Kind::MariaDb) => 20,
        },
        partitions_per_table: 11,
        unpartitioned_every: 25,
        file_bytes: 64,
        seed: 12,
    };
    let t0 = Instant::now();
    let (server, wh) = setup(kind, &root, &shape);
    eprintln!("{kind:?}: warehouse built in {:?}", t0.elapsed());
    let tables = wh.table_names().len();
    if kind == Kind::Postgres || long() {
        assert!(
            tables >= 500 && wh.partition_count() >= 5000,
            "{tables} tables, {} partitions",
            wh.partition_count()
        );
    }
    let (first, files) = (wh.latest(), wh.file_count());
    eprintln!(
        "{kind:?}: {tables} tables, {} partitions, {files} files, history up to {first}",
        wh.partition_count()
    );
    let source_map = wh.source_map();
    // About 40 changes a second over 500 tables: the same pressure per
    // table for a smaller warehouse (a table touched in every round could
    // never be listed consistently, which is the next tests' case).
    let pause = Duration::from_millis(25 * 500 / tables.max(1) as u64);
    let (stop, writer) = busy_writer(wh, pause, |wh| {
        wh.step();
    });

    let args = args
        .hive_metastore(HiveMetastoreArgs {
            url: server.url("hive"),
            password: PASSWORD.into(),
            source_map,
            poll_ms: 50,
        })
        .retain(100_000)
        .arg("--bootstrap");
    let started = Instant::now();
    let mut d = Daemon::spawn(args);
    wait_mounted_long(&mut d, Duration::from_secs(240));
    eprintln!(
        "{kind:?}: bootstrapped and mounted in {:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let wh = writer.join().expect("writer");
    let last = wh.latest();
    let s = d.wait_status_for("every event replicated", Duration::from_secs(120), |s| {
        visible(s) >= last as u64
    });
    let b = &s["bootstrap"];
    eprintln!("{kind:?}: bootstrap report {b}");
    assert_eq!(b["phase"], "done", "{s}");
    let y = b["state_id"].as_i64().expect("bootstrap state id");
    assert!(
        y > first,
        "the writer ran during the bootstrap ({y} > {first})"
    );
    assert!(
        b["files_copied"].as_u64().unwrap() + b["files_reused"].as_u64().unwrap() >= files as u64,
        "every listed file staged: {b}"
    );
    // Through the mount: the last state, and the oldest retained one.
    check_at(d.mnt(), &wh, last);
    if let Some(first_shown) = retained(&s).into_iter().find(|&r| r >= y as u64) {
        let snapshots = d.join(".stagefs/snapshots");
        check_at(
            &snapshots.join(first_shown.to_string()),
            &wh,
            first_shown as i64,
        );
    }
    assert!(!d.all_stderr().contains(PASSWORD));
    assert!(d.stderr().contains("bootstrap"), "a progress line");
    // Every state from the bootstrap's on, from the journal: the bootstrap
    // record (the mount may have committed a newer state at once), then
    // each event after it.
    let state = d.args().state.clone();
    d.sigterm();
    let checked = check_journal(&state, &wh, y, last);
    eprintln!("{kind:?}: {checked} states checked against the oracle");
    drop(server);
}

/// Replays `state`'s journal: its first record is the bootstrap state at
/// `y` and equals the oracle there; every later record's state equals the
/// oracle at its id (the tables it touched, and the table list), through
/// `last`, which is compared whole. Returns the states checked.
fn check_journal(state: &Path, wh: &HmsWarehouse, y: i64, last: i64) -> usize {
    check_journal_from(state, wh, y, None, last)
}

/// Every state id `state`'s commit log records as visible or retained.
fn committed_ids(state: &Path) -> std::collections::BTreeSet<i64> {
    let log = stagefs::durable::read_log(&state.join("commits.log"))
        .expect("commits.log")
        .expect("a commit record");
    let mut ids = std::collections::BTreeSet::new();
    for rec in &log.records {
        let r: Value = serde_json::from_slice(rec).expect("commit record JSON");
        ids.extend(r["visible"].as_i64());
        if let Some(retained) = r["retained"].as_array() {
            ids.extend(retained.iter().filter_map(Value::as_i64));
        }
    }
    ids
}

/// What a replay of the journal knows of the files its states name.
struct Replayed {
    /// Reference key → the file's reference in its record.
    refs: std::collections::HashMap<stagefs::event::BlobId, stagefs::event::FileRef>,
    /// States the replica committed (made visible).
    committed: std::collections::BTreeSet<i64>,
}

/// [`check_journal`], where the record at `again` (a re-bootstrap) is
/// compared whole, as the first one is.
///
/// A state the replica never committed may name Hive files it never read:
/// the stager commits the newest complete state and need not stage (nor
/// record in `resolved.log`) a file that a later state already replaced.
/// Such a file's content is what the stager would read for it, its
/// change-management copy (named by its checksum); every committed state,
/// and every bootstrap record, is compared by what `resolved.log` holds.
fn check_journal_from(
    state: &Path,
    wh: &HmsWarehouse,
    y: i64,
    again: Option<i64>,
    last: i64,
) -> usize {
    use stagefs::journal::{Journal, JournalConfig};
    let (journal, _) = Journal::open(JournalConfig::new(state.join("journal"))).expect("journal");
    let resolutions = stagefs::catalog::Resolutions::open(state).expect("resolved.log");
    let mut follower = journal.follower(stagefs::event::StateId(0));
    let mut tree = stagefs::catalog::Tree::empty();
    let mut replayed = Replayed {
        refs: std::collections::HashMap::new(),
        committed: committed_ids(state),
    };
    assert!(
        replayed.committed.contains(&last),
        "the last state is committed: {:?}",
        replayed.committed
    );
    let mut checked = 0;
    while let Some(rec) = follower.try_next().expect("read") {
        let entry: stagefs::journal::JournalEntry =
            serde_json::from_slice(&rec.payload).expect("record JSON");
        let (next, added) = tree.apply(&entry.event).expect("the record applies");
        resolutions.attach(&added);
        replayed
            .refs
            .extend(added.iter().map(|f| (f.blob, f.file.clone())));
        tree = next;
        let id = rec.id.0 as i64;
        if checked == 0 {
            assert_eq!(id, y, "the first record is the bootstrap state");
        }
        let whole = checked == 0 || id == last || Some(id) == again;
        let touched: Option<Vec<String>> = (!whole).then(|| {
            entry
                .event
                .changes
                .iter()
                .flat_map(|c| {
                    [
                        format!("{}.{}", c.db, c.table),
                        format!("{}.{}", c.new_db, c.new_table),
                    ]
                })
                .collect()
        });
        check_tree(&tree, wh, id, touched.as_deref(), &replayed);
        checked += 1;
    }
    assert_eq!(
        tree.state_id.0 as i64, last,
        "the journal reaches the last event"
    );
    checked
}

/// `tree` holds exactly the oracle's tables at `id` (only the tables in
/// `only`, when given, are compared file by file). A file `resolved.log`
/// does not resolve must be one the stager had no need to read (see
/// [`check_journal_from`]): a Hive file with a change-management copy, in
/// a state never committed.
fn check_tree(
    tree: &stagefs::catalog::Tree,
    wh: &HmsWarehouse,
    id: i64,
    only: Option<&[String]>,
    replayed: &Replayed,
) {
    use sha2::Digest;
    use stagefs::catalog::Node;
    let expected = wh.expected(id);
    let mut got_tables = Vec::new();
    for (db, node) in tree.root.children.iter() {
        if let Node::Dir(d) = node {
            for (t, _) in d.children.iter() {
                got_tables.push(format!("{db}.{t}"));
            }
        }
    }
    let want: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(got_tables, want, "tables at {id}");
    for (key, content) in expected.iter() {
        if only.is_some_and(|o| !o.contains(key)) {
            continue;
        }
        let (db, t) = key.split_once('.').unwrap();
        let mut got = std::collections::BTreeMap::new();
        for (path, f) in tree.table(db, t).expect("table").file_nodes_below() {
            let blob = if f.is_resolved() {
                f.blob()
            } else {
                let r = replayed.refs.get(&f.key()).expect("the file's record");
                assert!(
                    !replayed.committed.contains(&id),
                    "{key}/{path} at {id}: a committed state names a file resolved.log does not resolve ({r:?})"
                );
                let cm = r.cm_path.as_deref().unwrap_or_else(|| {
                    panic!("{key}/{path} at {id}: unresolved, and no change-management copy to read ({r:?})")
                });
                let bytes = std::fs::read(cm).unwrap_or_else(|e| panic!("{cm}: {e}"));
                stagefs::event::BlobId(sha2::Sha256::digest(&bytes).into())
            };
            got.insert(path, blob.to_hex());
        }
        assert_eq!(got, expected_tree(content), "{key} at {id} (journal)");
    }
}

#[test]
fn postgres_bootstrap_under_a_busy_writer_equals_the_oracle_at_its_id_and_after() {
    bootstrap_under_a_busy_writer(Kind::Postgres);
}

#[test]
fn mariadb_bootstrap_under_a_busy_writer_equals_the_oracle_at_its_id_and_after() {
    bootstrap_under_a_busy_writer(Kind::MariaDb);
}

fn bootstrap_command(state: &Path, url: &str, map: &[String]) -> std::process::Command {
    let mut cmd = stagefs();
    cmd.arg("bootstrap")
        .arg("--state")
        .arg(state)
        .arg("--hive-metastore")
        .arg(url)
        .env("STAGEFS_METASTORE_PASSWORD", PASSWORD);
    for m in map {
        cmd.arg("--source-map").arg(m);
    }
    cmd
}

fn staged_lines(state: &Path) -> usize {
    std::fs::read(state.join("bootstrap/staged.log"))
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

fn report(state: &Path) -> Value {
    let text = std::fs::read_to_string(state.join("bootstrap/report.json")).expect("report.json");
    serde_json::from_str(&text).expect("report JSON")
}

fn kill9_during_bootstrap_resumes_and_copies_nothing_staged_again(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let shape = Shape {
        databases: 2,
        tables_per_db: 80,
        partitions_per_table: 16,
        unpartitioned_every: 10,
        file_bytes: 16 << 10,
        seed: 5,
    };
    let t0 = Instant::now();
    let (server, wh) = setup(kind, &root, &shape);
    let files = wh.file_count();
    let state = args.state.clone();
    let url = server.url("hive");
    let map = wh.source_map();
    let log =
        |run: usize| std::fs::File::create(root.join(format!("bootstrap-{run}.log"))).unwrap();
    // Killed at two points, then a run that completes.
    let mut killed_at = Vec::new();
    // (Files are made durable, and logged, in groups of 1024.)
    for (run, target) in [(0, 1024), (1, 2048)] {
        let mut child = bootstrap_command(&state, &url, &map)
            .stderr(log(run))
            .spawn()
            .expect("spawn");
        assert!(files > target + 512, "{files} files");
        poll(
            "staged files to reach the kill point",
            Duration::from_secs(120),
            || (staged_lines(&state) >= target).then_some(()),
            || format!("{} staged of {files}", staged_lines(&state)),
        );
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
        killed_at.push(staged_lines(&state));
    }
    let st = bootstrap_command(&state, &url, &map)
        .stderr(log(2))
        .status()
        .expect("run");
    assert!(
        st.success(),
        "{}",
        std::fs::read_to_string(root.join("bootstrap-2.log")).unwrap()
    );
    let r = report(&state);
    eprintln!("killed with {killed_at:?} of {files} files staged; last run: {r}");
    let (copied, reused) = (
        r["files_copied"].as_u64().unwrap(),
        r["files_reused"].as_u64().unwrap(),
    );
    assert_eq!(copied + reused, files as u64, "{r}");
    assert!(
        reused as usize >= killed_at[1],
        "what was staged is not copied again: {r}"
    );
    assert_eq!(
        staged_lines(&state),
        files,
        "each file staged (and logged) once"
    );
    let y = r["state_id"].as_i64().unwrap();
    assert_eq!(y, wh.latest());

    // Mounting the bootstrapped folder shows the warehouse at its id.
    let args = args.hive_metastore(HiveMetastoreArgs {
        url,
        password: PASSWORD.into(),
        source_map: map,
        poll_ms: 50,
    });
    let d = Daemon::start(args);
    let s = d.wait_visible(y as u64);
    assert_eq!(s["bootstrap"]["state_id"], y, "{s}");
    check_at(d.mnt(), &wh, y);
    eprintln!("{kind:?}: {:?} in all", t0.elapsed());
}

#[test]
fn postgres_kill9_during_bootstrap_resumes_and_copies_nothing_staged_again() {
    kill9_during_bootstrap_resumes_and_copies_nothing_staged_again(Kind::Postgres);
}

#[test]
fn mariadb_kill9_during_bootstrap_resumes_and_copies_nothing_staged_again() {
    kill9_during_bootstrap_resumes_and_copies_nothing_staged_again(Kind::MariaDb);
}

fn a_table_changing_faster_than_it_can_be_listed_is_reported(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let shape = Shape {
        databases: 1,
        tables_per_db: 6,
        partitions_per_table: 3,
        unpartitioned_every: 0,
        file_bytes: 64,
        seed: 9,
    };
    let t0 = Instant::now();
    let (server, wh) = setup(kind, &root, &shape);
    let map = wh.source_map();
    let (stop, writer) = busy_writer(wh, Duration::from_millis(10), |wh| {
        wh.insert_into("db0", "t3");
    });
    let out = bootstrap_command(&args.state, &server.url("hive"), &map)
        .output()
        .expect("run");
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("db0.t3"), "{stderr}");
    let r = report(&args.state);
    let unlisted = r["unlisted"].as_array().expect("unlisted tables");
    assert_eq!(unlisted.len(), 1, "{r}");
    assert_eq!(unlisted[0]["table"], "db0.t3");
    // Either way the table kept changing under the bootstrap: an event
    // touched it during a listing, or (when that round's listing won the
    // race) one of its files changed while it was copied.
    let reason = unlisted[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("while it was being listed")
            || reason.contains("changed while it was copied"),
        "{r}"
    );
    // Nothing was journaled: a mount of this folder shows nothing.
    let journal: Vec<PathBuf> = std::fs::read_dir(args.state.join("journal"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for seg in journal {
        let len = std::fs::metadata(&seg).map(|m| m.len()).unwrap_or(0);
        assert!(len <= 16, "{} holds records", seg.display());
    }
    eprintln!("{kind:?}: {:?} in all", t0.elapsed());
}

#[test]
fn postgres_a_table_changing_faster_than_it_can_be_listed_is_reported_and_nothing_is_shown() {
    a_table_changing_faster_than_it_can_be_listed_is_reported(Kind::Postgres);
}

#[test]
fn mariadb_a_table_changing_faster_than_it_can_be_listed_is_reported_and_nothing_is_shown() {
    a_table_changing_faster_than_it_can_be_listed_is_reported(Kind::MariaDb);
}

/// The stall reason in a status, or "".
fn stall_reason(s: &Value) -> String {
    s["stalled"]["reason"].as_str().unwrap_or("").to_owned()
}

/// Status while the re-bootstrap runs: stalled at the gap, bootstrapping.
fn bootstrapping_again(s: &Value) -> bool {
    stall_reason(s).contains("bootstrapping again")
        && s["bootstrap"]["phase"]
            .as_str()
            .is_some_and(|p| p != "done")
}

/// The cleaner purges `steps` events `d` has not read: `d` is stopped
/// (SIGSTOP) meanwhile so that it cannot read them first; one more event
/// follows the gap. Returns the missing ids.
fn gap_while_stopped(d: &Daemon, wh: &mut HmsWarehouse, steps: usize) -> (i64, i64) {
    d.signal(libc::SIGSTOP);
    let from = wh.latest() + 1;
    for _ in 0..steps {
        wh.step();
    }
    let to = wh.latest();
    wh.purge_events(from, to);
    wh.step();
    d.signal(libc::SIGCONT);
    (from, to)
}

fn gap_stall_on_a_live_mount_bootstraps_again(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let shape = Shape {
        databases: 2,
        tables_per_db: 12,
        partitions_per_table: 4,
        unpartitioned_every: 4,
        file_bytes: 256,
        seed: 41,
    };
    let t0 = Instant::now();
    let (server, mut wh) = setup(kind, &root, &shape);
    let args = args
        .hive_metastore(HiveMetastoreArgs {
            url: server.url("hive"),
            password: PASSWORD.into(),
            source_map: wh.source_map(),
            poll_ms: 50,
        })
        .retain(100_000)
        .arg("--bootstrap");
    let mut d = Daemon::spawn(args);
    wait_mounted_long(&mut d, Duration::from_secs(60));
    let first = d.wait_status("the first bootstrap", |s| s["bootstrap"]["phase"] == "done");
    let y0 = first["bootstrap"]["state_id"]
        .as_i64()
        .expect("bootstrap id");
    for _ in 0..8 {
        wh.step();
    }
    let old = wh.latest();
    d.wait_visible(old as u64);
    check_at(d.mnt(), &wh, old);
    let old_content = wh.expected(old).clone();

    let (gap_from, gap_to) = gap_while_stopped(&d, &mut wh, 6);
    // More events while it bootstraps again (a few per listing window over
    // 24 tables: the rounds converge).
    let (stop, writer) = busy_writer(wh, Duration::from_millis(300), |wh| {
        wh.step();
    });

    // Until the new state commits, readers see the old one exactly, and
    // the visible id does not move.
    let old_xattr = old.to_string();
    let mut during = 0;
    let mut killed = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_visible = old as u64;
    let y = loop {
        assert!(Instant::now() < deadline, "no re-bootstrap\n{}", d.diag());
        let before = d.status();
        let v = visible(&before);
        assert!(
            v >= seen_visible,
            "visible went back from {seen_visible} to {v}"
        );
        seen_visible = v;
        if v > old as u64 {
            break before;
        }
        // Reading the xattr moves this process's view to the newest state;
        // the new one may have committed since `before` was read.
        let x = getxattr(d.mnt(), "user.stagefs.visible").unwrap();
        if x != old_xattr {
            let now = d.status();
            assert!(visible(&now) > old as u64, "visible {x}, status {now}");
            break now;
        }
        // The view stays at the old state while this process keeps reading.
        check_content(d.mnt(), &old_content, "the old state");
        let after = d.status();
        if bootstrapping_again(&before) && bootstrapping_again(&after) && visible(&after) == v {
            assert!(
                stall_reason(&after).contains(&format!(
                    "events {gap_from}..{gap_to} are missing from the metastore"
                )),
                "{after}"
            );
            during += 1;
            if !killed && during >= 2 {
                // kill -9 in the middle: the same command resumes.
                killed = true;
                d.kill9();
                d.restart();
                let s = d.status();
                let v = visible(&s);
                assert!(
                    v >= seen_visible,
                    "visible went back from {seen_visible} to {v}"
                );
                if v == old as u64 {
                    check_content(d.mnt(), &old_content, "the old state after kill -9");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        during >= 1,
        "the old state was read while bootstrapping again"
    );
    let y = y["bootstrap"]["state_id"].as_i64().unwrap_or(0);
    let s = d.wait_status("the re-bootstrap reported", |s| {
        s["bootstrap"]["phase"] == "done" && s["bootstrap"]["state_id"].as_i64() > Some(old)
    });
    let y = s["bootstrap"]["state_id"].as_i64().unwrap().max(y);
    assert!(y > gap_to, "the new state ({y}) is past the gap ({gap_to})");
    assert!(
        !stall_reason(&s).contains("missing"),
        "the stall is over: {s}"
    );
    // Later events keep applying.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let wh = writer.join().expect("writer");
    let last = wh.latest();
    assert!(last > y, "events after the re-bootstrap ({last} > {y})");
    let prev = std::cell::Cell::new(seen_visible);
    d.wait_status_for("every event replicated", Duration::from_secs(60), |s| {
        let v = visible(s);
        assert!(
            v >= prev.get(),
            "visible went back from {} to {v}",
            prev.get()
        );
        prev.set(v);
        v >= last as u64
    });
    check_at(d.mnt(), &wh, last);
    assert_eq!(
        getxattr(d.mnt(), "user.stagefs.visible").unwrap(),
        last.to_string()
    );
    // The journal: the first bootstrap, events, the re-bootstrap at `y`
    // (equal to the oracle there, whole), events after it.
    let state = d.args().state.clone();
    d.sigterm();
    let checked = check_journal_from(&state, &wh, y0, Some(y), last);
    // A restart replays to the same content.
    d.restart();
    let s = d.wait_visible(last as u64);
    assert_eq!(visible(&s), last as u64, "{s}");
    check_at(d.mnt(), &wh, last);
    eprintln!(
        "{kind:?}: gap {gap_from}..{gap_to}, re-bootstrap at {y}, {during} reads of the old state during it, \
         killed: {killed}, {checked} states checked, {:?} in all",
        t0.elapsed()
    );
    drop(server);
}

#[test]
fn postgres_a_gap_stall_on_a_live_mount_bootstraps_again_while_the_old_state_stays_served() {
    gap_stall_on_a_live_mount_bootstraps_again(Kind::Postgres);
}

#[test]
fn mariadb_a_gap_stall_on_a_live_mount_bootstraps_again_while_the_old_state_stays_served() {
    gap_stall_on_a_live_mount_bootstraps_again(Kind::MariaDb);
}

/// The ids of `state`'s journal records, in order.
fn journal_ids(state: &Path) -> Vec<i64> {
    use stagefs::journal::{Journal, JournalConfig};
    let (journal, _) = Journal::open(JournalConfig::new(state.join("journal"))).expect("journal");
    let mut follower = journal.follower(stagefs::event::StateId(0));
    let mut ids = Vec::new();
    while let Some(rec) = follower.try_next().expect("read") {
        ids.push(rec.id.0 as i64);
    }
    ids
}

/// `stagefs bootstrap` run to its end: (succeeded, stderr).
fn run_bootstrap(state: &Path, url: &str, map: &[String]) -> (bool, String) {
    let out = bootstrap_command(state, url, map).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    (out.status.success(), stderr)
}

/// `stagefs bootstrap` (the command, no mount) on a state folder: from
/// empty it bootstraps; on a healthy folder it does nothing; on a folder
/// a mount holds it refuses; on a folder whose replication stopped at an
/// id gap it bootstraps again, and a later mount continues from there.
fn bootstrap_command_brings_a_gap_stalled_folder_forward(kind: Kind) {
    let dir = TestDir::new();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let shape = Shape {
        databases: 2,
        tables_per_db: 6,
        partitions_per_table: 3,
        unpartitioned_every: 3,
        file_bytes: 256,
        seed: 77,
    };
    let t0 = Instant::now();
    let (server, mut wh) = setup(kind, &root, &shape);
    let (url, map) = (server.url("hive"), wh.source_map());
    let state = args.state.clone();

    let (ok, stderr) = run_bootstrap(&state, &url, &map);
    assert!(ok, "{stderr}");
    let y0 = report(&state)["state_id"].as_i64().expect("state id");
    assert_eq!(y0, wh.latest());

    // A healthy folder (the events after it are all there): nothing to
    // do, nothing touched; the mount applies those events later.
    for _ in 0..3 {
        wh.step();
    }
    let report_bytes = || std::fs::read(state.join("bootstrap/report.json")).unwrap();
    let before = (journal_ids(&state), report_bytes());
    let (ok, stderr) = run_bootstrap(&state, &url, &map);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("no gap; nothing to do"), "{stderr}");
    assert_eq!((journal_ids(&state), report_bytes()), before, "untouched");

    // A mount without --bootstrap replicates on; meanwhile the command
    // refuses the folder.
    let args = args.hive_metastore(HiveMetastoreArgs {
        url: url.clone(),
        password: PASSWORD.into(),
        source_map: map.clone(),
        poll_ms: 50,
    });
    let mut d = Daemon::start(args);
    let old = wh.latest();
    d.wait_visible(old as u64);
    check_at(d.mnt(), &wh, old);
    let (ok, stderr) = run_bootstrap(&state, &url, &map);
    assert!(
        !ok && stderr.contains("is in use by another stagefs process"),
        "{stderr}"
    );

    // The mount stalls at the gap, serving the old state.
    let (gap_from, gap_to) = gap_while_stopped(&d, &mut wh, 4);
    assert_eq!(gap_from, old + 1);
    let missing = format!("events {gap_from}..{gap_to} are missing from the metastore");
    let s = d.wait_status("the stall at the gap", |s| {
        stall_reason(s).contains(&format!("{missing}: re-bootstrap"))
    });
    assert_eq!(visible(&s), old as u64, "{s}");
    check_at(d.mnt(), &wh, old);
    d.sigterm();
    wh.step();

    // The command bootstraps the stopped folder again, past the gap.
    let started = Instant::now();
    let (ok, stderr) = run_bootstrap(&state, &url, &map);
    let _ = std::fs::write(root.join("rebootstrap.log"), &stderr);
    assert!(ok, "{stderr}");
    eprintln!("{kind:?}: bootstrapped again in {:?}", started.elapsed());
    assert!(stderr.contains("bootstrapping again"), "{stderr}");
    let r = report(&state);
    let y = r["state_id"].as_i64().expect("state id");
    assert_eq!(
        y,
        wh.latest(),
        "the metastore's id (no writer meanwhile): {r}"
    );
    assert!(y > gap_to, "{r}");
    assert!(
        r["files_reused"].as_u64().unwrap() > 0,
        "files staged by the first bootstrap are not copied again: {r}"
    );
    // Its record replaces the old state: the warehouse at `y`, whole.
    let ids = journal_ids(&state);
    assert_eq!(ids.last(), Some(&y), "{ids:?}");
    // The GC hold waits for `y` only (a run under way holds with no id).
    let marker = state.join("bootstrap/after_gap.json");
    if let Ok(text) = std::fs::read_to_string(&marker) {
        let m: Value = serde_json::from_str(&text).expect("marker JSON");
        assert_eq!(m["state_id"], y, "{m}");
    }

    // A mount continues from `y` with incremental events.
    d.restart();
    let s = d.wait_visible(y as u64);
    assert_eq!(s["bootstrap"]["state_id"], y, "{s}");
    check_at(d.mnt(), &wh, y);
    for _ in 0..4 {
        wh.step();
    }
    let last = wh.latest();
    // Garbage collection runs again: the hold is lifted.
    let s = d.wait_visible_and_gc(last as u64);
    assert!(!marker.exists(), "the GC hold is released");
    assert!(stall_reason(&s).is_empty(), "{s}");
    check_at(d.mnt(), &wh, last);
    d.sigterm();
    // Every event once: the first bootstrap, the events up to the gap,
    // the re-bootstrap, the events after it; each state equals the oracle.
    let ids = journal_ids(&state);
    let want: Vec<i64> = (y0..=old).chain(y..=last).collect();
    assert_eq!(ids, want, "one record per id, none twice");
    let checked = check_journal_from(&state, &wh, y0, Some(y), last);
    eprintln!(
        "{kind:?}: gap {gap_from}..{gap_to}, re-bootstrap at {y}, {checked} states checked, {:?} in all",
        t0.elapsed()
    );
    drop(server);
}

#[test]
fn postgres_bootstrap_command_brings_a_gap_stalled_folder_forward_and_leaves_a_healthy_one() {
    bootstrap_command_brings_a_gap_stalled_folder_forward(Kind::Postgres);
}

#[test]
fn mariadb_bootstrap_command_brings_a_gap_stalled_folder_forward_and_leaves_a_healthy_one() {
    bootstrap_command_brings_a_gap_stalled_folder_forward(Kind::MariaDb);
}

/// A transactional table's directories at the snapshot, and what a Hive
/// reader reads of them (`AcidUtils.getAcidState` with the snapshot's
/// `ValidWriteIdList`, worked out by hand). Write ids 1..=8 are allocated
/// (`NWI_NEXT` 9): 6 by aborted txn 16, 8 by txn 18, still open; the
/// compactor's txns 10 and 20 committed, its txn 40 is still running.
const ACID_FILES: [&str; 15] = [
    // An original file from before the table was transactional: obsolete
    // once there is a base.
    "000000_0",
    "delta_0000001_0000001_0000/bucket_00000",
    // An INSERT OVERWRITE base, older than the compacted one.
    "base_0000002/bucket_00000",
    // Major compaction by txn 10 (committed): the base read.
    "base_0000003_v0000010/bucket_00000",
    // Compacted into delta_4_5 by txn 20 (committed): obsolete.
    "delta_0000004_0000004_0000/bucket_00000",
    "delta_0000005_0000005_0000/bucket_00000",
    "delta_0000004_0000005_v0000020/bucket_00000",
    "delete_delta_0000004_0000005_v0000020/bucket_00000",
    // Write id 6 aborted.
    "delta_0000006_0000006_0000/bucket_00000",
    // Two statements of one transaction: both read.
    "delta_0000007_0000007_0000/bucket_00000",
    "delta_0000007_0000007_0001/bucket_00000",
    "delete_delta_0000007_0000007_0001/bucket_00000",
    // Open at the snapshot; its COMMIT_TXN comes after the bootstrap.
    "delta_0000008_0000008_0000/bucket_00000",
    // Above the high watermark.
    "delta_0000009_0000009_0000/bucket_00000",
    // A compaction still running (txn 40 open).
    "base_0000007_v0000040/bucket_00000",
];

const ACID_READ: [&str; 6] = [
    "base_0000003_v0000010/bucket_00000",
    "delete_delta_0000004_0000005_v0000020/bucket_00000",
    "delete_delta_0000007_0000007_0001/bucket_00000",
    "delta_0000004_0000005_v0000020/bucket_00000",
    "delta_0000007_0000007_0000/bucket_00000",
    "delta_0000007_0000007_0001/bucket_00000",
];

fn transactional_tables_bootstrap_to_what_hive_reads(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let shape = Shape {
        databases: 1,
        tables_per_db: 2,
        partitions_per_table: 2,
        unpartitioned_every: 0,
        file_bytes: 64,
        seed: 21,
    };
    let (server, mut wh) = setup(kind, &root, &shape);
    wh.create_acid_table("db0", "acid", &ACID_FILES, &ACID_READ);
    // A streaming batch over write ids 1..=3 whose second txn is open: a
    // Hive reader filters that write id's rows, a copy cannot.
    let streamed = "delta_0000001_0000003/bucket_00000";
    wh.create_acid_table("db0", "streamed", &[streamed], &[]);
    wh.set_txns(
        &[(16, 'a'), (18, 'o'), (32, 'o'), (40, 'o')],
        &[
            ("db0", "acid", 6, 16),
            ("db0", "acid", 8, 18),
            ("db0", "streamed", 2, 32),
        ],
        &[("db0", "acid", 9), ("db0", "streamed", 4)],
    );
    let (url, map) = (server.url("hive"), wh.source_map());

    let reported = root.join("state-reported");
    let out = bootstrap_command(&reported, &url, &map)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let r = report(&reported);
    let unlisted = r["unlisted"].as_array().expect("unlisted tables");
    assert_eq!(unlisted.len(), 1, "only the undecidable table: {r}");
    assert_eq!(unlisted[0]["table"], "db0.streamed", "{r}");
    let reason = unlisted[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("delta_0000001_0000003") && reason.contains("still open"),
        "{reason}"
    );

    // The streaming transaction commits: now every write id of the batch
    // is valid, and the table can be bootstrapped.
    wh.commit_acid("db0", "streamed", 32, &[streamed]);
    let st = bootstrap_command(&args.state, &url, &map)
        .status()
        .expect("run");
    assert!(st.success());
    let y = report(&args.state)["state_id"].as_i64().unwrap();
    assert_eq!(y, wh.latest());

    let args = args.hive_metastore(HiveMetastoreArgs {
        url,
        password: PASSWORD.into(),
        source_map: map,
        poll_ms: 50,
    });
    let d = Daemon::start(args);
    d.wait_visible(y as u64);
    check_at(d.mnt(), &wh, y);
    let (_, acid) = read_table(&d.join("db0/acid"));
    assert_eq!(
        acid.keys().map(String::as_str).collect::<Vec<_>>(),
        ACID_READ
    );

    // Write id 8 commits after the bootstrap: its event brings its delta.
    let id = wh.commit_acid(
        "db0",
        "acid",
        18,
        &["delta_0000008_0000008_0000/bucket_00000"],
    );
    d.wait_visible(id as u64);
    check_at(d.mnt(), &wh, id);
    let (_, acid) = read_table(&d.join("db0/acid"));
    assert!(acid.contains_key("delta_0000008_0000008_0000/bucket_00000"));
    assert_eq!(acid.len(), ACID_READ.len() + 1);
}

#[test]
fn postgres_transactional_tables_bootstrap_to_what_a_hive_reader_reads_then_commits_apply() {
    transactional_tables_bootstrap_to_what_hive_reads(Kind::Postgres);
}

#[test]
fn mariadb_transactional_tables_bootstrap_to_what_a_hive_reader_reads_then_commits_apply() {
    transactional_tables_bootstrap_to_what_hive_reads(Kind::MariaDb);
}
