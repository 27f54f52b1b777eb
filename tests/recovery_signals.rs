//! SIGINT and SIGTERM while the daemon is still recovering (docs/SEMANTICS.md
//! "Restart"): `stagefs mount` and `stagefs replicate` on a state folder
//! whose journal of 300,000 records has no checkpoint, so the start replays
//! all of it (the journal is built quickly by an in-process replica with
//! checkpoint writing off; the product's replay is not slowed). The signal
//! is sent once the process has installed its handlers (`SigCgt` in
//! /proc/PID/status) and before it mounted. Each interrupted start must
//! say it stopped during recovery, exit 0, leave the mountpoint as it was
//! (not mounted, still an empty directory) and change no file of the state
//! folder; a later start recovers the same content, checked through the
//! mount against the oracle.

mod common;
use stagefs::testkit::metadata_log;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::daemon::*;
use metadata_log::{write_metadata_log, Oracle};
use stagefs::event::StateId;
use stagefs::replicate::{Replica, ReplicaConfig};
use stagefs::workload::Rng;

const EVENTS: u64 = 300_000;

/// Every file of the state folder: relative path → (size, mtime ns).
fn state_files(state: &Path) -> BTreeMap<String, (u64, i64)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u64, i64)>) {
        for e in fs::read_dir(dir).expect("read state folder").flatten() {
            let p = e.path();
            let m = fs::symlink_metadata(&p).expect("stat state file");
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if m.is_dir() {
                walk(root, &p, out);
            }
            out.insert(rel, (m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec()));
        }
    }
    let mut out = BTreeMap::new();
    walk(state, state, &mut out);
    out
}

/// Lines of /proc/self/mountinfo that name a path under `root`.
fn mounts_under(root: &Path) -> Vec<String> {
    let root = root.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&root))
        .map(str::to_owned)
        .collect()
}

/// True once `pid` catches both SIGINT and SIGTERM (its handlers are in).
fn catches_stop_signals(pid: i32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let bit = |sig: i32| 1u64 << (sig - 1);
    caught & bit(libc::SIGINT) != 0 && caught & bit(libc::SIGTERM) != 0
}

/// Waits until `child` catches the stop signals, sends `sig`, waits for
/// the exit; returns it and whether the process had mounted first.
fn signal_once_handled(child: &mut Child, sig: i32, mnt: Option<&Path>) -> (ExitStatus, bool) {
    let pid = child.id() as i32;
    let deadline = Instant::now() + WAIT;
    while !catches_stop_signals(pid) {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("stagefs exited ({st}) before installing its signal handlers");
        }
        assert!(
            Instant::now() < deadline,
            "stagefs did not install its signal handlers"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let was_mounted = mnt.is_some_and(mounted);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return (st, was_mounted);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            if let Some(m) = mnt {
                common::detach(m);
            }
            panic!("stagefs did not exit within {WAIT:?} of signal {sig} during recovery");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The table partitions seen through the mount, as the oracle has them.
fn mounted_partitions(mnt: &Path, oracle: &Oracle) -> Oracle {
    oracle
        .keys()
        .map(|k| {
            let (db, t) = k.split_once('.').unwrap();
            let parts = fs::read_dir(mnt.join(db).join(t))
                .unwrap_or_else(|e| panic!("list {k} through the mount: {e}"))
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            (k.clone(), parts)
        })
        .collect()
}

#[test]
fn sigint_and_sigterm_during_recovery_exit_0_mount_nothing_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let mut oracle = Oracle::new();
    let last = write_metadata_log(&args.events, 1, EVENTS, &mut Rng::new(11), &mut oracle);
    // The long journal, with no checkpoint to start from.
    {
        let mut cfg = ReplicaConfig::new(&args.state, &args.source_root, &args.events);
        cfg.checkpoint_events = 0;
        cfg.checkpoint_interval = Duration::from_secs(1 << 40);
        let replica = Replica::start(cfg).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while replica.catalog().snapshot().visible.state_id < StateId(last) {
            assert!(Instant::now() < deadline, "{:?}", replica.status());
            std::thread::sleep(Duration::from_millis(20));
        }
        replica.stop();
    }
    let before = state_files(&args.state);
    let mounts_before = mounts_under(&root);
    assert!(stagefs::checkpoint::list(&args.state).unwrap().is_empty());

    // Interrupted starts: mount + SIGINT, mount + SIGTERM, replicate +
    // SIGTERM. A start that got through recovery before the signal (a very
    // slow test machine) is retried, at most 3 times.
    let flags = [
        "--checkpoint-events",
        "0",
        "--checkpoint-interval",
        "1000000",
    ];
    let mount_cmd = || {
        let mut a = args.args();
        a.extend(flags.iter().map(Into::into));
        a
    };
    let replicate_cmd = || {
        let mut a = vec![
            "replicate".into(),
            "--state".into(),
            args.state.clone().into_os_string(),
            "--source-root".into(),
            args.source_root.clone().into_os_string(),
            "--events".into(),
            args.events.clone().into_os_string(),
        ];
        a.extend(flags.iter().map(Into::into));
        a
    };
    let cases: [(&str, Vec<std::ffi::OsString>, i32, bool); 3] = [
        ("mount, SIGINT", mount_cmd(), libc::SIGINT, true),
        ("mount, SIGTERM", mount_cmd(), libc::SIGTERM, true),
        ("replicate, SIGTERM", replicate_cmd(), libc::SIGTERM, false),
    ];
    for (what, cmd, sig, mounts) in cases {
        let mut in_recovery = false;
        for attempt in 0..3 {
            let log = root.join(format!(
                "stderr-{}-{attempt}.log",
                what.replace([',', ' '], "")
            ));
            let mut child = stagefs()
                .args(&cmd)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let (status, was_mounted) =
                signal_once_handled(&mut child, sig, mounts.then_some(args.mnt.as_path()));
            let stderr = fs::read_to_string(&log).unwrap_or_default();
            assert!(
                status.success(),
                "{what}: exit {status} after the signal\n{stderr}"
            );
            assert!(!mounted(&args.mnt), "{what}: left a mount\n{stderr}");
            // (stagefs mounts only on an empty directory.)
            assert_eq!(
                fs::read_dir(&args.mnt).unwrap().count(),
                0,
                "{what}: the mountpoint changed"
            );
            if stderr.contains("stopped during recovery") {
                assert!(!was_mounted, "{what}: mounted before recovery ended");
                assert!(
                    !stderr.contains("mounted") || stderr.contains("nothing was mounted"),
                    "{what}: {stderr}"
                );
                assert_eq!(mounts_under(&root), mounts_before, "{what}: mounts changed");
                assert_eq!(
                    state_files(&args.state),
                    before,
                    "{what}: the interrupted start changed the state folder"
                );
                in_recovery = true;
                break;
            }
            eprintln!("{what}: attempt {attempt} finished recovery before the signal; again");
        }
        assert!(in_recovery, "{what}: no signal landed during recovery");
    }

    // A full start recovers the same content.
    let mut args = args;
    args.extra.extend(flags.iter().map(Into::into));
    let d = Daemon::start(args);
    let s = d.wait_visible(last);
    assert_eq!(visible(&s), last);
    assert_eq!(s["checkpoint"]["replayed_records"].as_u64(), Some(last));
    assert_eq!(mounted_partitions(d.mnt(), &oracle), oracle);
    drop(d);
}
