//! Power-loss test of the replication core: the state folder lives on
//! [`PowerFs`], a FUSE layer that keeps only what was made durable (file
//! contents as of their last fsync/fdatasync, directory entries as of their
//! directory's last fsync; see tests/common/powerfs.rs). A child process
//! replicates a growing workload with `--state` on that layer; at a random
//! moment the power is cut (the layer fails every later operation, the child
//! is killed, and the backing directory is rewritten to the durable image).
//! Then replication restarts on what survived, and the test checks:
//! - the visible state never goes back below what was committed before the
//!   cut (the child reports each visible id it publishes; a commit is
//!   published only after its commit record is durable, so every reported
//!   id, even one read after the cut, was durably committed);
//! - every retained state equals the workload's oracle at its id, and every
//!   blob it references is present with the right bytes;
//! - no torn journal record is replayed (restart would fail decoding it, or
//!   rebuild a state that differs from the oracle).
//!
//! At the end replication finishes at the source's latest state.
//!
//! Unlike SIGKILL (crash_replicate.rs), a cut loses the page cache, so a
//! missing fsync shows: docs/PROOF.md records what this test catches when
//! one is removed. `STAGEFS_LONG_TESTS=1` runs 300 cuts instead of 50;
//! `STAGEFS_POWER_CUTS=N` runs N, and `STAGEFS_POWER_DEBUG=1` prints what
//! the child reports and each cut's counts.

#[path = "common/fuse_attr.rs"]
mod fuse_attr;
use stagefs::testkit::oracle;
#[path = "common/powerfs.rs"]
mod powerfs;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oracle::{check_tree, crash_config as config};
use powerfs::PowerFs;
use stagefs::event::StateId;
use stagefs::replicate::Replica;
use stagefs::workload::{Rng, Workload, WorkloadConfig};

/// The child: replicate with the state on the layer, printing every
/// visible id as soon as it is published, until killed.
#[test]
fn power_loss_child() {
    let (Ok(state), Ok(src)) = (
        std::env::var("STAGEFS_POWER_CHILD"),
        std::env::var("STAGEFS_POWER_SRC"),
    ) else {
        return; // not running as the child
    };
    let replica = match Replica::start(config(Path::new(&state), Path::new(&src))) {
        Ok(r) => r,
        // A cut during start-up: the parent kills us anyway.
        Err(e) => {
            println!("start failed: {e}");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    };
    let mut out = std::io::stdout().lock();
    let mut last = StateId(u64::MAX);
    loop {
        let visible = replica.catalog().snapshot().visible.state_id;
        if visible != last {
            let _ = writeln!(out, "visible {}", visible.0);
            let _ = out.flush();
            last = visible;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs the child; a thread keeps the highest visible id it reported.
fn spawn_child(state: &Path, src: &Path) -> (Child, std::thread::JoinHandle<()>, Arc<AtomicU64>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "power_loss_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STAGEFS_POWER_CHILD", state)
        .env("STAGEFS_POWER_SRC", src)
        .env_remove("STAGEFS_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let stdout = child.stdout.take().unwrap();
    let max = Arc::clone(&seen);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if std::env::var("STAGEFS_POWER_DEBUG").is_ok() {
                eprintln!("child: {line}");
            }
            // The first report shares its line with libtest's "test … ".
            let report = line
                .find("visible ")
                .map(|at| &line[at + "visible ".len()..]);
            if let Some(id) = report.and_then(|n| n.trim().parse().ok()) {
                max.fetch_max(id, Ordering::SeqCst);
            }
        }
    });
    (child, reader, seen)
}

#[test]
fn power_cut_at_random_points_loses_no_committed_state() {
    if std::env::var("STAGEFS_POWER_CHILD").is_ok() {
        return;
    }
    let long = std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1");
    let cuts = if long { 300 } else { 50 };
    let cuts = std::env::var("STAGEFS_POWER_CUTS").map_or(cuts, |v| v.parse().unwrap());
    let src = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (backing, mnt) = (dir.path().join("backing"), dir.path().join("mnt"));
    std::fs::create_dir(&backing).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let mut w = Workload::new(
        src.path(),
        WorkloadConfig {
            seed: 23,
            min_file_bytes: 512,
            max_file_bytes: 16 << 10,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let mut rng = Rng::new(2027);
    let mut last_visible = StateId(0);
    let (mut cuts_after_a_commit, mut reported_max) = (0, StateId(0));
    let started = Instant::now();
    for round in 0..cuts {
        let fs = PowerFs::mount(&backing, &mnt).unwrap();
        let (mut child, reader, seen) = spawn_child(&mnt, src.path());
        // The source changes while the child replicates: it ingests,
        // stages and commits until the cut, at a random moment.
        let deadline = Instant::now() + Duration::from_millis(20 + rng.below(600) as u64);
        let mut steps = 3 + rng.below(25);
        while Instant::now() < deadline {
            for _ in 0..steps.min(3) {
                w.step().unwrap();
            }
            steps = steps.saturating_sub(3);
            std::thread::sleep(Duration::from_millis(10));
        }
        let image = fs.cut();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        reader.join().unwrap();
        let counts = fs.counts();
        fs.restore(image).unwrap();
        let committed = StateId(seen.load(Ordering::SeqCst));
        if committed > last_visible {
            cuts_after_a_commit += 1;
        }
        reported_max = reported_max.max(committed);

        let when = format!("cut {round} ({counts:?})");
        if std::env::var("STAGEFS_POWER_DEBUG").is_ok() {
            eprintln!(
                "{when}: reported {committed}, last visible {last_visible}, latest {}",
                w.latest()
            );
        }
        let replica = Replica::start(config(&backing, src.path()))
            .unwrap_or_else(|e| panic!("{when}: restart on what survived failed: {e}"));
        let visible = replica.catalog().snapshot().visible.state_id;
        let floor = committed.max(last_visible);
        assert!(
            visible >= floor,
            "{when}: visible went back to {visible}, below {floor} committed before the cut"
        );
        let (catalog, blobs) = (replica.catalog().clone(), replica.blobs().clone());
        replica.stop();
        let snap = catalog.snapshot();
        check_tree(&snap.visible, &w, &blobs, &when);
        for tree in snap.versions.values() {
            check_tree(tree, &w, &blobs, &when);
        }
        last_visible = snap.visible.state_id;
    }
    let latest = w.latest();
    let replica = Replica::start(config(&backing, src.path())).unwrap();
    let start = Instant::now();
    while replica.catalog().snapshot().visible.state_id != latest {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "did not reach {latest}: {:?}",
            replica.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    check_tree(
        &replica.catalog().snapshot().visible,
        &w,
        replica.blobs(),
        "final run",
    );
    assert!(
        cuts_after_a_commit * 4 >= cuts,
        "only {cuts_after_a_commit} of {cuts} cuts came after a new commit: the test is not exercising commits"
    );
    eprintln!(
        "{cuts} power cuts in {:.0?}; {cuts_after_a_commit} after a new commit; highest committed id reported {reported_max}; latest {latest}",
        started.elapsed()
    );
}
