//! Checkpoints and journal compaction (docs/OPERATIONS.md "Checkpoints",
//! "Journal compaction"):
//! - a restart after many metadata events loads the newest checkpoint and
//!   replays only the journal after it (counted in records, not timed);
//!   the content equals the oracle, the ratchet and a pin hold;
//! - a corrupted newest checkpoint: the start uses the previous one and
//!   says so in status;
//! - SIGKILL at random moments while checkpoints are written and the
//!   journal compacted (≥ 20 cuts) never loses a record restart needs.
//!
//! `STAGEFS_LONG_TESTS=1` runs 3,000,000 events instead of 1,000,000 and
//! 100 kills instead of 24.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stagefs::testkit::metadata_log;
use stagefs::testkit::oracle;

use metadata_log::{write_metadata_log, Oracle};
use oracle::{check_tree, crash_config};
use stagefs::catalog::{PinScope, Tree};
use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::workload::{Rng, Workload, WorkloadConfig};

fn long() -> bool {
    std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1")
}

fn tree_partitions(tree: &Tree) -> Oracle {
    let mut out = Oracle::new();
    for (db, d) in tree.root.children.iter() {
        for (t, table) in d.as_dir().unwrap().children.iter() {
            let parts = table
                .as_dir()
                .unwrap()
                .children
                .keys()
                .map(|k| k.to_string())
                .collect();
            out.insert(format!("{db}.{t}"), parts);
        }
    }
    out
}

fn wait_visible(replica: &Replica, id: StateId, limit: Duration) {
    let started = Instant::now();
    while replica.catalog().snapshot().visible.state_id < id {
        assert!(
            started.elapsed() < limit,
            "visible did not reach {id}: {:?}",
            replica.status()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_checkpoint_at_least(replica: &Replica, id: StateId, limit: Duration) {
    let started = Instant::now();
    while replica.status().checkpoint.last_id.is_none_or(|c| c < id) {
        assert!(
            started.elapsed() < limit,
            "no checkpoint at or past {id}: {:?}",
            replica.status().checkpoint
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn metadata_config(state: &Path, src: &Path, every: u64) -> ReplicaConfig {
    std::fs::create_dir_all(src.join("source")).unwrap();
    std::fs::create_dir_all(src.join("events")).unwrap();
    let mut cfg = ReplicaConfig::new(state, &src.join("source"), &src.join("events"));
    cfg.checkpoint_events = every;
    cfg.checkpoint_interval = Duration::from_secs(3600);
    cfg.segment_bytes = 1 << 20;
    cfg
}

#[test]
fn restart_after_many_events_replays_only_the_journal_after_the_checkpoint() {
    let n: u64 = if long() { 3_000_000 } else { 1_000_000 };
    let every = n / 4;
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let cfg = metadata_config(state.path(), src.path(), every);
    let events = src.path().join("events");
    let mut rng = Rng::new(7);
    let mut oracle = Oracle::new();

    // First half, then a pin on one table, then the rest.
    let half = write_metadata_log(&events, 1, n / 2, &mut rng, &mut oracle);
    let pinned_oracle = oracle["d0.t1"].clone();
    let replica = Replica::start(cfg.clone()).unwrap();
    wait_visible(&replica, StateId(half), Duration::from_secs(300));
    let scope = PinScope::Table {
        db: "d0".into(),
        table: "t1".into(),
    };
    let pin = replica.catalog().set_pin(&scope, "visible").unwrap();
    let last = write_metadata_log(&events, half + 1, n - n / 2, &mut rng, &mut oracle);
    wait_visible(&replica, StateId(last), Duration::from_secs(300));
    // A checkpoint past the pin, so the restart cannot replay from before it.
    wait_checkpoint_at_least(&replica, StateId(last - every), Duration::from_secs(120));
    let before = replica.status();
    replica.stop();
    assert!(before.checkpoint.written >= 3, "{:?}", before.checkpoint);
    // Compacted: the first segments are gone, the floor is recorded.
    assert!(
        !state
            .path()
            .join("journal/00000000000000000001.seg")
            .exists()
            && state.path().join("journal/compacted-through").exists(),
        "the journal was not compacted: {:?}",
        before.journal
    );
    assert!(before.journal.bytes > 0 && before.journal.segments > 0);

    let replica = Replica::start(cfg).unwrap();
    let st = replica.status();
    let from = st
        .checkpoint
        .restored_from
        .expect("restarted without a checkpoint");
    assert_eq!(
        st.checkpoint.replayed_records,
        last - from.0,
        "replay read more than the journal after checkpoint {from}"
    );
    assert!(
        st.checkpoint.replayed_records <= every,
        "{:?}",
        st.checkpoint
    );
    assert!(
        st.checkpoint.problems.is_empty(),
        "{:?}",
        st.checkpoint.problems
    );
    let snap = replica.catalog().snapshot();
    // The ratchet: the visible state is where it was.
    assert_eq!(snap.visible.state_id, StateId(last));
    assert_eq!(tree_partitions(&snap.visible), oracle);
    // The pin holds, on the content the table had then.
    assert_eq!(snap.pins.tables.get("d0.t1"), Some(&pin));
    let pinned = &snap.versions[&pin];
    assert_eq!(tree_partitions(pinned)["d0.t1"], pinned_oracle);
    assert_eq!(
        snap.versions.keys().collect::<Vec<_>>(),
        before.retained.iter().collect::<Vec<_>>()
    );
    // Replication goes on from there.
    let next = write_metadata_log(&events, last + 1, 1000, &mut rng, &mut oracle);
    wait_visible(&replica, StateId(next), Duration::from_secs(60));
    assert_eq!(
        tree_partitions(&replica.catalog().snapshot().visible),
        oracle
    );
    replica.stop();
}

#[test]
fn corrupted_newest_checkpoint_falls_back_to_the_previous_one_and_says_so() {
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let cfg = metadata_config(state.path(), src.path(), 2_000);
    let events = src.path().join("events");
    let mut rng = Rng::new(3);
    let mut oracle = Oracle::new();
    let mut last = 0;
    let replica = Replica::start(cfg.clone()).unwrap();
    // Rounds, each waited for, so at least two checkpoints exist.
    for _ in 0..3 {
        last = write_metadata_log(&events, last + 1, 2_500, &mut rng, &mut oracle);
        wait_visible(&replica, StateId(last), Duration::from_secs(60));
        wait_checkpoint_at_least(&replica, StateId(last - 2_000), Duration::from_secs(60));
    }
    replica.stop();
    let kept = stagefs::checkpoint::list(state.path()).unwrap();
    assert_eq!(kept.len(), stagefs::checkpoint::KEEP, "{kept:?}");
    let (newest, previous) = (&kept[0], &kept[1]);
    let mut bytes = std::fs::read(&newest.1).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0xff;
    std::fs::write(&newest.1, bytes).unwrap();

    let replica = Replica::start(cfg).unwrap();
    let st = replica.status();
    assert_eq!(st.checkpoint.restored_from, Some(previous.0));
    assert_eq!(st.checkpoint.replayed_records, last - previous.0 .0);
    assert!(
        st.checkpoint
            .problems
            .iter()
            .any(|p| p.contains("unreadable") && p.contains("using the previous one")),
        "status does not say why: {:?}",
        st.checkpoint.problems
    );
    assert_eq!(replica.catalog().snapshot().visible.state_id, StateId(last));
    assert_eq!(
        tree_partitions(&replica.catalog().snapshot().visible),
        oracle
    );
    replica.stop();
    assert!(newest.1.with_extension("ckpt.corrupt").exists());
}

/// The kill test's child: replicate with checkpoints as often as possible
/// and a tiny segment size, so a kill lands in a checkpoint write or a
/// compaction most of the time.
fn kill_config(state: &Path, src: &Path) -> ReplicaConfig {
    let mut cfg = crash_config(state, src);
    cfg.checkpoint_events = 1;
    cfg.checkpoint_interval = Duration::from_millis(1);
    cfg.segment_bytes = 2048;
    cfg
}

#[test]
fn checkpoint_kill_child() {
    let (Ok(state), Ok(src)) = (
        std::env::var("STAGEFS_CKPT_CHILD"),
        std::env::var("STAGEFS_CKPT_SRC"),
    ) else {
        return; // not running as the child
    };
    let _replica = Replica::start(kill_config(Path::new(&state), Path::new(&src))).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A checkpoint write is in progress (or was cut): its temp file exists.
fn has_temp(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
    })
}

fn spawn_child(state: &Path, src: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "checkpoint_kill_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STAGEFS_CKPT_CHILD", state)
        .env("STAGEFS_CKPT_SRC", src)
        .env("STAGEFS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn sigkill_during_checkpoints_and_compaction_loses_no_needed_record() {
    let kills = if long() { 100 } else { 24 };
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut w = Workload::new(
        src.path(),
        WorkloadConfig {
            seed: 5,
            min_file_bytes: 64,
            max_file_bytes: 4 << 10,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let mut rng = Rng::new(17);
    let mut last_visible = StateId(0);
    let (mut mid_write, mut compacted) = (0, 0);
    for round in 0..kills {
        for _ in 0..(5 + rng.below(30)) {
            w.step().unwrap();
        }
        let mut child = spawn_child(state.path(), src.path());
        let deadline = Instant::now() + Duration::from_millis(100 + rng.below(500) as u64);
        while Instant::now() < deadline {
            for _ in 0..rng.below(3) {
                w.step().unwrap();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Then aim: kill as soon as a checkpoint is being written (its
        // temp file exists), within the next second.
        let ckpt_dir = stagefs::checkpoint::dir(state.path());
        let aim = Instant::now() + Duration::from_secs(1);
        while Instant::now() < aim && !has_temp(&ckpt_dir) {
            std::thread::yield_now();
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        if std::fs::read_dir(&ckpt_dir).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        }) {
            mid_write += 1;
        }

        let replica = Replica::start(kill_config(state.path(), src.path()))
            .unwrap_or_else(|e| panic!("round {round}: restart failed: {e}"));
        let st = replica.status();
        assert!(
            st.checkpoint.problems.is_empty(),
            "round {round}: {:?}",
            st.checkpoint.problems
        );
        if st.checkpoint.restored_from.is_some()
            && state.path().join("journal/compacted-through").exists()
        {
            compacted += 1;
        }
        let (catalog, blobs) = (replica.catalog().clone(), replica.blobs().clone());
        replica.stop();
        let snap = catalog.snapshot();
        assert!(
            snap.visible.state_id >= last_visible,
            "round {round}: visible went back from {last_visible} to {}",
            snap.visible.state_id
        );
        check_tree(&snap.visible, &w, &blobs, &format!("kill {round}"));
        for tree in snap.versions.values() {
            check_tree(tree, &w, &blobs, &format!("kill {round}"));
        }
        last_visible = snap.visible.state_id;
    }
    let latest = w.latest();
    let replica = Replica::start(kill_config(state.path(), src.path())).unwrap();
    wait_visible(&replica, latest, Duration::from_secs(60));
    check_tree(
        &replica.catalog().snapshot().visible,
        &w,
        replica.blobs(),
        "final run",
    );
    replica.stop();
    assert!(compacted > 0, "no restart ran on a compacted journal");
    assert!(mid_write > 0, "no kill landed in a checkpoint write");
    eprintln!("{kills} kills; {mid_write} left a checkpoint half-written; {compacted} restarts from a checkpoint on a compacted journal; visible reached {last_visible}");
}
