//! Crash test of the replication core: a real child process replicates a
//! growing workload and is killed with SIGKILL at random moments (during
//! staging, commits, GC); after each kill the state folder is recovered and
//! checked:
//! - the visible id never goes backwards (the ratchet);
//! - the visible state equals the source's state at that id, and every file
//!   it references is staged with the right bytes;
//! - temp files do not accumulate;
//!
//! At the end replication finishes at the source's latest state.
//!
//! The child is this test binary itself, re-run with `STAGEFS_CRASH_CHILD`.
//! `STAGEFS_LONG_TESTS=1` runs 200 kills instead of 24.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stagefs::testkit::oracle;

use oracle::{check_tree, crash_config as config};
use stagefs::event::StateId;
use stagefs::replicate::Replica;
use stagefs::workload::{Rng, Workload, WorkloadConfig};

/// The child: replicate until killed.
#[test]
fn crash_child() {
    let (Ok(state), Ok(src)) = (
        std::env::var("STAGEFS_CRASH_CHILD"),
        std::env::var("STAGEFS_CRASH_SRC"),
    ) else {
        return; // not running as the child
    };
    let _replica = Replica::start(config(Path::new(&state), Path::new(&src))).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn spawn_child(state: &Path, src: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("STAGEFS_CRASH_CHILD", state)
        .env("STAGEFS_CRASH_SRC", src)
        .env("STAGEFS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Temp files in `blobs/tmp` and its shard directories.
fn count_tmp(state: &Path) -> usize {
    let tmp = state.join("blobs/tmp");
    std::fs::read_dir(&tmp)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| match e.file_type().is_ok_and(|t| t.is_dir()) {
                    true => std::fs::read_dir(e.path()).map(|d| d.count()).unwrap_or(0),
                    false => 1,
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn sigkill_during_staging_and_commits_loses_nothing() {
    let long = std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1");
    let kills = if long { 200 } else { 24 };
    let src = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut w = Workload::new(
        src.path(),
        WorkloadConfig {
            seed: 11,
            min_file_bytes: 1 << 10,
            max_file_bytes: 256 << 10,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let mut rng = Rng::new(99);
    let mut last_visible = StateId(0);
    let mut max_tmp = 0;
    for round in 0..kills {
        // The source keeps changing between and during runs.
        for _ in 0..(5 + rng.below(40)) {
            w.step().unwrap();
        }
        let mut child = spawn_child(state.path(), src.path());
        let deadline = Instant::now() + Duration::from_millis(30 + rng.below(400) as u64);
        while Instant::now() < deadline {
            for _ in 0..rng.below(3) {
                w.step().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        max_tmp = max_tmp.max(count_tmp(state.path()));

        let replica = Replica::start(config(state.path(), src.path())).unwrap();
        let visible = replica.catalog().snapshot().visible.state_id;
        assert!(
            visible >= last_visible,
            "round {round}: visible went back from {last_visible} to {visible}"
        );
        // Check what is retained once the pipeline is quiet (GC may drop
        // versions retention let go of while it ran).
        let (catalog, blobs) = (replica.catalog().clone(), replica.blobs().clone());
        replica.stop();
        let snap = catalog.snapshot();
        check_tree(&snap.visible, &w, &blobs, &format!("kill {round}"));
        for tree in snap.versions.values() {
            check_tree(tree, &w, &blobs, &format!("kill {round}"));
        }
        last_visible = snap.visible.state_id;
        // Recovery removed the killed run's temp files, and a clean stop
        // leaves none of its own.
        assert_eq!(count_tmp(state.path()), 0, "temp files left after recovery");
    }
    // Finally let it finish.
    let latest = w.latest();
    let replica = Replica::start(config(state.path(), src.path())).unwrap();
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
    assert!(last_visible > StateId(0), "no kill happened after a commit");
    eprintln!("{kills} kills; visible advanced to {last_visible} before the final run; at most {max_tmp} temp files at a kill");
}
