//! Crash test of the mounted daemon: `stagefs mount` (the real binary) is
//! killed with SIGKILL at random moments — while it stages files of 2 KiB to
//! 256 KiB, commits, and garbage-collects (`--retain 2`) — at least 20
//! times. After each kill the dead mount is detached (`umount -l`) and the
//! same command is run again; then, through the mount:
//! - the visible id is not lower than before the kill (the ratchet);
//! - every table shown equals the source's content at its `state_id`, and
//!   the set of tables is the source's at some visible state;
//! - `STATE/blobs/tmp` holds no more temp files than fetches can be in
//!   flight (4 fetch threads).
//!
//! At the end replication reaches the source's latest state.
//! `STAGEFS_LONG_TESTS=1` kills 200 times. A second test does the same in
//! no-open mode (`STAGEFS_NO_OPEN=1`), 8 kills (50 long).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stagefs::event::StateId;
use stagefs::testkit::checker::{check_stagefs_table, mount_flags, visible, DaemonProcess, Oracle};
use stagefs::workload::{Rng, Workload, WorkloadConfig};

struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }
    fn mnt(&self) -> PathBuf {
        self.root.path().join("mnt")
    }
}

/// The daemon on `w`'s source, with `env` added to its environment.
fn start(d: &Dirs, w: &Workload, env: &[(&str, &str)]) -> DaemonProcess {
    let flags = mount_flags(
        &d.state(),
        &w.source_root(),
        &w.events_dir(),
        &w.cm_root(),
        Some(2),
    );
    let args: Vec<&OsStr> = flags.iter().map(|f| f.as_os_str()).collect();
    DaemonProcess::start_with_env(
        Path::new(env!("CARGO_BIN_EXE_stagefs")),
        &d.mnt(),
        &args,
        &d.root.path().join("daemon.log"),
        "info,fuser=error",
        env,
        Duration::from_secs(30),
    )
    .expect("the daemon mounts")
}

fn count_tmp(state: &Path) -> usize {
    tmp_names(state).len()
}

/// Temp files are named `<sha>.<pid>.<n>.tmp`: those of one process.
fn count_tmp_of(state: &Path, pid: u32) -> usize {
    let tag = format!(".{pid}.");
    tmp_names(state).iter().filter(|n| n.contains(&tag)).count()
}

/// Names of the temp files in `blobs/tmp` and its shard directories.
fn tmp_names(state: &Path) -> Vec<String> {
    let names = |dir: &Path| -> Vec<(String, bool)> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| {
                        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                        (e.file_name().to_string_lossy().into_owned(), is_dir)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let tmp = state.join("blobs/tmp");
    names(&tmp)
        .into_iter()
        .flat_map(|(n, is_dir)| match is_dir {
            true => names(&tmp.join(&n)).into_iter().map(|(n, _)| n).collect(),
            false => vec![n],
        })
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Checks every table the mount shows; returns how many.
fn check_mount(oracle: &Oracle, mnt: &Path, what: &str) -> usize {
    let v0 = visible(mnt).unwrap();
    let mut listed = BTreeSet::new();
    for db in names(mnt) {
        for t in names(&mnt.join(&db)) {
            listed.insert(format!("{db}.{t}"));
        }
    }
    let v1 = visible(mnt).unwrap();
    let (all, _) = oracle.table_names(StateId(0));
    let matches_some_state = (v0.0..=v1.0).any(|v| {
        let at: BTreeSet<String> = all
            .iter()
            .filter(|k| oracle.table_at(k, StateId(v)).is_some())
            .cloned()
            .collect();
        at == listed
    });
    assert!(
        matches_some_state,
        "{what}: the tables listed {listed:?} are the source's at no state of [{v0}, {v1}]"
    );
    for key in &listed {
        if let Err(e) = check_stagefs_table(oracle, mnt, key) {
            panic!("{what}: {e}");
        }
    }
    listed.len()
}

/// The two tests share 2 cores: run them one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn long() -> bool {
    std::env::var("STAGEFS_LONG_TESTS").is_ok_and(|v| v == "1")
}

#[test]
fn sigkill_of_the_mounted_daemon_loses_nothing() {
    sigkill_rounds(if long() { 200 } else { 20 }, &[]);
}

/// The same in no-open mode (reads by inode, no OPEN/RELEASE), with fewer
/// kills: what differs is the read path and what GC keeps, not recovery.
#[test]
fn sigkill_of_the_mounted_daemon_loses_nothing_in_no_open_mode() {
    sigkill_rounds(if long() { 50 } else { 8 }, &[("STAGEFS_NO_OPEN", "1")]);
}

/// Kills the mounted daemon `kills` times (see the module docs).
fn sigkill_rounds(kills: usize, env: &[(&str, &str)]) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = Dirs {
        root: tempfile::tempdir().unwrap(),
    };
    std::fs::create_dir(d.mnt()).unwrap();
    let oracle = Oracle::new();
    let mut w = Workload::new(
        &d.root.path().join("src"),
        WorkloadConfig {
            seed: 31,
            databases: 1,
            tables_per_db: 3,
            partitions: 4,
            max_files_per_insert: 2,
            min_file_bytes: 2 << 10,
            max_file_bytes: 256 << 10,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    let mut rng = Rng::new(77);
    let mut last_visible = StateId(0);
    let (mut max_tmp_at_kill, mut max_tmp_after, mut tables_checked) = (0, 0, 0);
    let mut kills_staging = 0;
    let mut killed_pid: Option<u32> = None;
    let step = |w: &mut Workload| {
        w.step().unwrap();
        oracle.record(w);
    };
    for round in 0..kills {
        for _ in 0..(5 + rng.below(30)) {
            step(&mut w);
        }
        let mut daemon = start(&d, &w, env);
        let mnt = d.mnt();
        // Recovery: the ratchet, the content, the temp files.
        // Recovery removed every temp file of the killed run; what is there
        // now belongs to the new daemon (copies waiting for the next group
        // sync), so nothing accumulates across crashes.
        let tmp = count_tmp(&d.state());
        max_tmp_after = max_tmp_after.max(tmp);
        if let Some(pid) = killed_pid {
            assert_eq!(
                count_tmp_of(&d.state(), pid),
                0,
                "round {round}: temp files of the killed run survived the restart"
            );
        }
        let v = visible(&mnt).unwrap();
        assert!(
            v >= last_visible,
            "round {round}: visible went back from {last_visible} to {v}"
        );
        tables_checked += check_mount(&oracle, &mnt, &format!("round {round} after restart"));

        // Run for a random while, the source changing, then SIGKILL. Every
        // fourth round runs past the 2 s GC interval.
        let ms = if round % 4 == 3 {
            2000 + rng.below(1500)
        } else {
            20 + rng.below(800)
        };
        let deadline = Instant::now() + Duration::from_millis(ms as u64);
        while Instant::now() < deadline {
            for _ in 0..rng.below(3) {
                step(&mut w);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let before_kill = visible(&mnt).unwrap();
        assert!(
            before_kill >= v,
            "round {round}: visible went back while running"
        );
        killed_pid = daemon.pid();
        daemon.kill9();
        last_visible = before_kill;
        let tmp = count_tmp(&d.state());
        max_tmp_at_kill = max_tmp_at_kill.max(tmp);
        kills_staging += usize::from(tmp > 0);
        drop(daemon);
    }

    // The last run catches up with the source.
    let latest = w.latest();
    let mut daemon = start(&d, &w, env);
    let mnt = d.mnt();
    assert!(visible(&mnt).unwrap() >= last_visible);
    let started = Instant::now();
    while visible(&mnt).unwrap() < latest {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "did not reach {latest}: {}",
            std::fs::read_to_string(mnt.join(".stagefs/status")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = check_mount(&oracle, &mnt, "final");
    assert_eq!(n, w.expected(latest).unwrap().len(), "final table count");
    let status = stagefs::testkit::checker::mount_status(&mnt).unwrap();
    assert!(status.stalled.is_none(), "{:?}", status.stalled);
    assert!(
        daemon.terminate(Duration::from_secs(10)).unwrap(),
        "no clean exit: {}",
        daemon.log()
    );
    assert!(last_visible > StateId(0), "no kill happened after a commit");
    // What the killed runs were doing, from their logs.
    let log = daemon.log();
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    let (gc_passes, temp_cleanups) = (
        count("garbage collected"),
        count("removed leftover temp files"),
    );
    assert!(
        gc_passes > 0,
        "GC never removed anything: no kill could hit it"
    );
    eprintln!(
        "{kills} kills survived; visible reached {last_visible} before the final run and {latest} after; \
         {tables_checked} table checks; at most {max_tmp_at_kill} temp files at a kill, {max_tmp_after} after a restart; \
         {gc_passes} GC passes removed blobs across the runs; {temp_cleanups} restarts removed a killed fetch's temp files; \
         kills with fetches in flight: {kills_staging}"
    );
}
