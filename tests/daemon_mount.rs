//! The real `stagefs mount` command: the SPEC §1 example through the daemon
//! with a late file, versioned directories and open files across commits
//! and GC, signals, external unmount, the state lock, usage errors, crash
//! and resume, and `stagefs status`. Each test has its own temp dir.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::daemon::*;
use common::*;
use serde_json::{json, Value};
use stagefs::event::StateId;
use stagefs::workload::{write_seed_example, Workload, WorkloadConfig};

fn fd_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// The table as `p=x/name` → content (trimmed).
fn contents(table: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for p in names(table) {
        for f in names(&table.join(&p)) {
            let text = fs::read_to_string(table.join(&p).join(&f))
                .unwrap_or_else(|e| panic!("read {p}/{f}: {e}"));
            out.insert(format!("{p}/{f}"), text.trim().to_owned());
        }
    }
    out
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// SPEC §1 content of default.blah by the id at which it last changed.
fn example_states() -> BTreeMap<u64, BTreeMap<String, String>> {
    let a5 = ("p=a/000001_0", "5");
    let b10 = ("p=b/000002_0", "10");
    let a15 = ("p=a/000003_0", "15");
    let b20 = ("p=b/000004_0", "20");
    BTreeMap::from([
        (10, map(&[])),
        (20, map(&[a5])),
        (30, map(&[a5, b10])),
        (40, map(&[a5, b10, a15])),
        (50, map(&[a5, a15, b20])),
    ])
}

/// What a reader thread saw: (state_id, content) per look, or an error.
type Look = Result<(u64, BTreeMap<String, String>), String>;
type Seen = Vec<Look>;

/// Looks at default.blah the way a reader does: open the table directory,
/// read its state_id on the handle, list and read everything through it.
fn look(table: &Path) -> Option<Look> {
    let dir = match File::open(table) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return None,
        Err(e) => return Some(Err(format!("open table: {e}"))),
    };
    let at = fd_path(&dir);
    let id = match getxattr(&at, "user.stagefs.state_id") {
        Ok(v) => v,
        Err(e) => return Some(Err(format!("state_id: errno {e}"))),
    };
    let id: u64 = match id.parse() {
        Ok(i) => i,
        Err(_) => return Some(Err(format!("state_id {id:?}"))),
    };
    let content = std::panic::catch_unwind(|| contents(&at)).map_err(|_| "read failed".to_owned());
    Some(content.map(|c| (id, c)))
}

#[test]
fn example_with_a_late_file_only_ever_shows_source_states() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    write_seed_example(&root).unwrap();
    // Hold the second file back: its only copy is in change management.
    let cm_name = format!("000002_0_{}", sha256_hex(b"10\n"));
    let held = root.join(&cm_name);
    fs::rename(args.cm_root.as_ref().unwrap().join(&cm_name), &held).unwrap();
    // The log only up to 40; event 50 comes later.
    let log = args.events.join("log-000001.jsonl");
    let text = fs::read_to_string(&log).unwrap();
    let (mut upto40, mut line50) = (String::new(), String::new());
    for l in text.lines() {
        let id = serde_json::from_str::<Value>(l).unwrap()["id"]
            .as_u64()
            .unwrap();
        if id <= 40 {
            upto40.push_str(l);
            upto40.push('\n');
        } else {
            line50 = format!("{l}\n");
        }
    }
    assert!(line50.contains("replace_files"));
    fs::write(&log, upto40).unwrap();

    let d = Daemon::start(args.clone());
    let table = d.join("default/blah");
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, table) = (Arc::clone(&stop), table.clone());
        std::thread::spawn(move || {
            let mut seen: Seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                if let Some(r) = look(&table) {
                    seen.push(r);
                }
            }
            seen
        })
    };
    let _stop_guard = StopOnDrop(Arc::clone(&stop));

    d.wait_visible(20);
    let s = d.wait_status("stalled on 000002_0", |s| {
        s["stalled"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("000002_0"))
    });
    assert_eq!(visible(&s), 20, "{s}");
    assert_eq!(s["latest"], 40, "{s}");
    assert_eq!(s["lag_events"], 20, "{s}");
    assert_eq!(s["stalled"]["state_id"], 30, "{s}");
    assert_eq!(contents(&table), example_states()[&20]);
    assert_eq!(getxattr(&table, "user.stagefs.state_id").unwrap(), "20");
    assert_eq!(getxattr(d.mnt(), "user.stagefs.visible").unwrap(), "20");
    assert_eq!(getxattr(d.mnt(), "user.stagefs.latest").unwrap(), "40");
    // It stays there while the file is missing.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(visible(&d.status()), 20);

    // The file arrives late: picked up by the retry, 40 becomes visible.
    fs::rename(&held, args.cm_root.as_ref().unwrap().join(&cm_name)).unwrap();
    let s = d.wait_visible(40);
    assert_eq!(visible(&s), 40, "{s}");
    let s = d.wait_status("no stall", |s| s["stalled"].is_null());
    assert_eq!(s["lag_events"], 0, "{s}");
    assert_eq!(contents(&table), example_states()[&40]);

    // The overwrite of p=b.
    fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line50.as_bytes()))
        .unwrap();
    d.wait_visible(50);
    assert_eq!(contents(&table), example_states()[&50]);
    assert_eq!(
        fs::read_to_string(table.join("p=b/000004_0")).unwrap(),
        "20\n"
    );
    assert_eq!(names(&table.join("p=b")), vec!["000004_0"]);
    // Let the reader look at 50 a few times.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(200) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    let seen = reader.join().unwrap();

    let states = example_states();
    let mut last = 0;
    let mut ids = std::collections::BTreeSet::new();
    for r in &seen {
        let (id, content) = r.as_ref().unwrap_or_else(|e| panic!("reader: {e}"));
        let want = states
            .get(id)
            .unwrap_or_else(|| panic!("state_id {id} is not a state of the table"));
        assert_eq!(content, want, "at state_id {id}: not the source's content");
        assert!(*id >= last, "state_id went back from {last} to {id}");
        last = *id;
        ids.insert(*id);
    }
    assert!(ids.contains(&20) && ids.contains(&50), "reader saw {ids:?}");
    assert!(!ids.contains(&30), "30 was never complete alone: {ids:?}");
    eprintln!("reader: {} looks, states {ids:?}", seen.len());
}

/// db `default`, table `blah` partitioned by p, with the first commits.
fn small_table(w: &EventWriter) {
    w.append(json!({"id": 1, "op": "create_database", "db": "default"}));
    w.append(
        json!({"id": 2, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}),
    );
}

#[test]
fn open_table_directory_keeps_its_version_across_commits() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let w = EventWriter::new(&args);
    small_table(&w);
    let f1 = w.put_file("default/blah/p=a/000000_0", b"one\n");
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f1]}));
    let d = Daemon::start(args);
    d.wait_visible(3);
    let held = File::open(d.join("default/blah")).unwrap();
    let at = fd_path(&held);
    // Several commits: an overwrite of the same name, a new partition, a
    // drop of the first one.
    w.retire("default/blah/p=a/000000_0", b"one\n");
    let f2 = w.put_file("default/blah/p=a/000000_0", b"two\n");
    w.append(json!({"id": 4, "op": "replace_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f2]}));
    d.wait_visible(4);
    let f3 = w.put_file("default/blah/p=b/000000_0", b"three\n");
    w.append(json!({"id": 5, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "b"}, "files": [f3]}));
    d.wait_visible(5);
    w.retire("default/blah/p=a/000000_0", b"two\n");
    w.append(json!({"id": 6, "op": "drop_partition", "db": "default", "table": "blah", "partition": {"p": "a"}}));
    d.wait_visible(6);
    assert_eq!(
        contents(&d.join("default/blah")),
        map(&[("p=b/000000_0", "three")])
    );
    assert_eq!(contents(&at), map(&[("p=a/000000_0", "one")]));
    assert_eq!(getxattr(&at, "user.stagefs.state_id").unwrap(), "3");
    assert_eq!(
        getxattr(&d.join("default/blah"), "user.stagefs.state_id").unwrap(),
        "6"
    );
}

#[test]
fn open_file_reads_its_bytes_after_overwrite_and_gc() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(1);
    let state = args.state.clone();
    let w = EventWriter::new(&args);
    small_table(&w);
    let old: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let f1 = w.put_file("default/blah/p=a/000000_0", &old);
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f1]}));
    let d = Daemon::start(args);
    let s = d.wait_visible(3);
    let bytes_before = s["staged_bytes"].as_u64().unwrap();
    let path = d.join("default/blah/p=a/000000_0");
    let mut open = File::open(&path).unwrap();
    let mut head = vec![0u8; 1000];
    open.read_exact(&mut head).unwrap();
    // Overwrite the same name with something small, a few times.
    let mut prev = old.clone();
    for (id, text) in [(4u64, "new 4\n"), (5, "new 5\n"), (6, "new 6\n")] {
        w.retire("default/blah/p=a/000000_0", &prev);
        let f = w.put_file("default/blah/p=a/000000_0", text.as_bytes());
        w.append(json!({"id": id, "op": "replace_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f]}));
        d.wait_visible(id);
        prev = text.as_bytes().to_vec();
    }
    assert_eq!(fs::read_to_string(&path).unwrap(), "new 6\n");
    let old_blob = blob_path(&state, &sha256_hex(&old));
    let s = d.wait_status("GC removed the old blob", |s| {
        s["staged_bytes"].as_u64().unwrap() < bytes_before
            && !old_blob.exists()
            && s["gc"]["removed_blobs"].as_u64().unwrap() >= 1
    });
    assert!(s["staged_bytes"].as_u64().unwrap() < 1000, "{s}");
    // The file opened before keeps reading its own bytes to the end.
    let mut rest = Vec::new();
    open.read_to_end(&mut rest).unwrap();
    head.extend(rest);
    assert_eq!(head.len(), old.len());
    assert!(head == old, "bytes of the open file changed");
    // And again from the start (pread at 0).
    let mut again = vec![0u8; 4096];
    let n = std::os::unix::fs::FileExt::read_at(&open, &mut again, 0).unwrap();
    assert_eq!(&again[..n], &old[..n]);
}

/// SPEC §3.4 says a table directory reached once keeps showing its version
/// "including all partitions and files below it". With `--retain 1`, GC
/// removes the blobs of that version while the directory is still open.
#[test]
fn open_table_directory_still_reads_its_files_after_gc() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path()).retain(1);
    let state = args.state.clone();
    let w = EventWriter::new(&args);
    small_table(&w);
    let f1 = w.put_file("default/blah/p=a/000000_0", b"first version\n");
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f1]}));
    let d = Daemon::start(args);
    d.wait_visible(3);
    let held = File::open(d.join("default/blah")).unwrap();
    let at = fd_path(&held);
    w.retire("default/blah/p=a/000000_0", b"first version\n");
    let f2 = w.put_file("default/blah/p=a/000000_0", b"second\n");
    w.append(json!({"id": 4, "op": "replace_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f2]}));
    d.wait_visible(4);
    let old_blob = blob_path(&state, &sha256_hex(b"first version\n"));
    // Two GC passes after the commit that let version 3 go.
    let runs = d.status()["gc"]["runs"].as_u64().unwrap();
    d.wait_status("two GC passes", |s| {
        s["gc"]["runs"].as_u64().unwrap() >= runs + 2
    });
    assert_eq!(names(&at), vec!["p=a"]);
    assert_eq!(
        fs::read_to_string(at.join("p=a/000000_0")).map_err(|e| e.to_string()),
        Ok("first version\n".to_owned()),
        "a file below an open table directory became unreadable after GC"
    );
    // Once the directory is closed, its version's blobs go.
    drop(held);
    d.wait_status("GC removed the first blob", |_| !old_blob.exists());
}

fn assert_not_mounted_and_clean(mnt: &Path) {
    assert!(!mounted(mnt), "{} is still a mount point", mnt.display());
    let md = fs::metadata(mnt).unwrap_or_else(|e| panic!("stat {}: {e}", mnt.display()));
    assert!(md.is_dir());
    assert!(names(mnt).is_empty());
}

fn seeded(dir: &Path) -> DaemonArgs {
    let args = DaemonArgs::under(dir);
    write_seed_example(args.mnt.parent().unwrap()).unwrap();
    args
}

#[test]
fn sigterm_unmounts_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()));
    d.wait_visible(50);
    let st = d.sigterm();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.all_stderr());
    assert_not_mounted_and_clean(d.mnt());
}

#[test]
fn sigint_unmounts_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()));
    d.wait_visible(50);
    let st = d.sigint();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.all_stderr());
    assert_not_mounted_and_clean(d.mnt());
}

#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()));
    d.wait_visible(50);
    let st = d.sigint();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.all_stderr());
    // The harness sends stderr to a file: no terminal, so no colour.
    let log = d.stderr();
    assert!(
        log.contains("INFO"),
        "expected info lines in the log: {log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log written to a file:\n{}",
        log.escape_debug()
    );
}

#[test]
fn external_umount_makes_the_daemon_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()));
    d.wait_visible(50);
    let out = std::process::Command::new("umount")
        .arg(d.mnt())
        .output()
        .unwrap();
    assert!(out.status.success(), "umount: {out:?}");
    let st = d
        .wait_exit(WAIT)
        .unwrap_or_else(|| panic!("daemon still running after umount\n{}", d.all_stderr()));
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.all_stderr());
    assert_not_mounted_and_clean(d.mnt());
}

#[test]
fn sigterm_with_an_open_file_exits_0_and_leaves_no_dead_mount() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(seeded(dir.path()));
    d.wait_visible(50);
    let mut f = File::open(d.join("default/blah/p=a/000001_0")).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "5\n");
    let cwd_holder = File::open(d.join("default/blah/p=b")).unwrap();
    let started = Instant::now();
    let st = d.sigterm();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.all_stderr());
    assert!(started.elapsed() < Duration::from_secs(8));
    // No "Transport endpoint is not connected" left on the mountpoint.
    assert_not_mounted_and_clean(d.mnt());
    drop(f);
    drop(cwd_holder);
}

/// One line on stderr, for a usage error.
fn one_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got:\n{stderr}"
    );
    lines[0]
}

fn run(args: &[std::ffi::OsString]) -> Output {
    stagefs().args(args).output().unwrap()
}

#[test]
fn second_daemon_on_the_same_state_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let args = seeded(dir.path());
    let d = Daemon::start(args.clone());
    d.wait_visible(50);
    let mut other = args.clone();
    other.mnt = args.mnt.parent().unwrap().join("mnt2");
    fs::create_dir(&other.mnt).unwrap();
    let _guard = MountGuard(other.mnt.clone());
    let started = Instant::now();
    let out = run(&other.args());
    assert!(started.elapsed() < WAIT);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let line = one_line(&String::from_utf8_lossy(&out.stderr)).to_lowercase();
    assert!(
        line.contains("in use") || line.contains("lock"),
        "unclear: {line}"
    );
    assert!(!mounted(&other.mnt));
    // The first one is unaffected.
    assert_eq!(visible(&d.status()), 50);
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let args = seeded(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let check = |a: &DaemonArgs, what: &str, needle: &str| {
        let _guard = MountGuard(a.mnt.clone());
        let out = run(&a.args());
        assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = one_line(&stderr);
        assert!(line.contains(needle), "{what}: {line:?} lacks {needle:?}");
        assert!(!mounted(&a.mnt), "{what}: mounted anyway");
    };
    // A source root that does not exist.
    let mut a = args.clone();
    a.source_root = root.join("no-such-source");
    check(&a, "missing --source-root", "no-such-source");
    // Events folder that does not exist.
    let mut a = args.clone();
    a.events = root.join("no-such-events");
    check(&a, "missing --events", "no-such-events");
    // A mountpoint that does not exist.
    let mut a = args.clone();
    a.mnt = root.join("no-such-mnt");
    check(&a, "missing mountpoint", "no-such-mnt");
    // A mountpoint that is not empty.
    let mut a = args.clone();
    a.mnt = root.join("full-mnt");
    fs::create_dir(&a.mnt).unwrap();
    fs::write(a.mnt.join("something"), b"x").unwrap();
    check(&a, "non-empty mountpoint", "not an empty directory");
    // A mountpoint that is a file.
    let mut a = args.clone();
    a.mnt = root.join("file-mnt");
    fs::write(&a.mnt, b"x").unwrap();
    check(&a, "file mountpoint", "file-mnt");
    // Nothing was created or locked: a proper start still works.
    let d = Daemon::start(args);
    d.wait_visible(50);
}

/// Every table of the oracle at `state` equals what the mount shows.
fn check_warehouse(d: &Daemon, w: &Workload, state: u64) {
    let expected = w.expected(StateId(state)).unwrap();
    let mut dbs: Vec<String> = expected
        .keys()
        .map(|k| k.split_once('.').unwrap().0.to_owned())
        .collect();
    dbs.dedup();
    for (key, content) in expected.iter() {
        let (db, t) = key.split_once('.').unwrap();
        let (_, got) = read_table(&d.join(&format!("{db}/{t}")));
        assert_eq!(got, expected_tree(content), "{key} at {state}");
    }
    for db in dbs {
        let listed = names(&d.join(&db));
        let want: Vec<String> = expected
            .keys()
            .filter_map(|k| k.strip_prefix(&format!("{db}.")).map(str::to_owned))
            .collect();
        assert_eq!(listed, want, "tables of {db} at {state}");
    }
}

#[test]
fn kill9_then_the_same_command_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let root = args.mnt.parent().unwrap().to_owned();
    let mut w = Workload::new(
        &root,
        WorkloadConfig {
            seed: 9,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    for _ in 0..60 {
        w.step().unwrap();
    }
    let mut d = Daemon::start(args);
    let first = w.latest().0;
    d.wait_visible(first);
    check_warehouse(&d, &w, first);
    // More events while it runs, then kill -9 in the middle.
    for _ in 0..60 {
        w.step().unwrap();
    }
    std::thread::sleep(Duration::from_millis(30));
    let before = visible(&d.status());
    d.kill9();
    // The kernel mount is left dead behind a killed FUSE daemon.
    assert!(mounted(d.mnt()), "kill -9 left no mount");
    // (stat of the root may still answer from the attribute cache.)
    let e = fs::read_dir(d.mnt()).map(|_| ()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    // SPEC §6: running the same command again resumes, on the dead mount
    // the killed daemon left; nobody unmounts it by hand.
    d.restart();
    let s = d.status();
    assert!(visible(&s) >= before, "visible went back: {before} → {s}");
    let all = w.latest().0;
    d.wait_visible(all);
    check_warehouse(&d, &w, all);
    // And it carries on to the end.
    for _ in 0..30 {
        w.step().unwrap();
    }
    let last = w.latest().0;
    d.wait_visible(last);
    check_warehouse(&d, &w, last);
    // And the resumed daemon stops as any other: SIGINT, unmount, exit 0.
    let st = d.sigint();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.all_stderr());
    assert!(!mounted(d.mnt()), "still mounted after SIGINT");
}

fn status_cli(args: &[&std::ffi::OsStr]) -> Value {
    let out = stagefs().arg("status").args(args).output().unwrap();
    assert!(out.status.success(), "stagefs status {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status JSON: {e}\n{}", String::from_utf8_lossy(&out.stdout)))
}

fn assert_spec_fields(s: &Value) {
    for f in [
        "visible",
        "latest",
        "lag_events",
        "lag_seconds",
        "pins",
        "retained",
        "staged_bytes",
        "stalled",
    ] {
        assert!(s.get(f).is_some(), "status lacks {f}: {s}");
    }
    assert!(s["visible"].is_u64() && s["latest"].is_u64());
    assert_eq!(
        s["lag_events"].as_u64().unwrap(),
        s["latest"].as_u64().unwrap() - s["visible"].as_u64().unwrap()
    );
    assert!(s["lag_seconds"].is_null() || s["lag_seconds"].is_f64());
    assert!(s["pins"].is_object() && s["retained"].is_array());
    assert!(s["staged_bytes"].is_u64());
    assert!(s["stalled"].is_null() || s["stalled"]["reason"].is_string());
}

#[test]
fn status_command_with_and_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let args = seeded(dir.path());
    let mut d = Daemon::start(args.clone());
    d.wait_visible(50);
    // Only committed states are versions (50 may be the only one here).
    setxattr(&d.join("default/blah"), "user.stagefs.pin", b"visible").unwrap();
    let live = status_cli(&[d.mnt().as_os_str()]);
    assert_spec_fields(&live);
    assert_eq!(live["visible"], 50);
    assert_eq!(live["latest"], 50);
    assert_eq!(live["lag_events"], 0);
    assert_eq!(live["pins"], json!({"default.blah": 50}));
    assert!(retained(&live).contains(&50));
    assert!(live["staged_bytes"].as_u64().unwrap() >= 8);
    assert!(live["stalled"].is_null());
    // From the state folder while the daemon runs (its status file is
    // written every second).
    let state = args.state.as_os_str();
    let from_state = poll(
        "status --state with a daemon",
        WAIT,
        || {
            let out = stagefs()
                .args(["status".as_ref(), "--state".as_ref(), state])
                .output()
                .unwrap();
            out.status
                .success()
                .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
                .filter(|s| s["visible"] == 50 && s["pins"]["default.blah"] == 50)
        },
        || d.diag(),
    );
    assert_spec_fields(&from_state);
    assert_eq!(from_state["running"], true);
    let st = d.sigterm();
    assert_eq!(st.code(), Some(0));
    // And with no daemon at all.
    let offline = status_cli(&["--state".as_ref(), state]);
    assert_spec_fields(&offline);
    assert_eq!(offline["running"], false);
    assert_eq!(offline["visible"], 50);
    assert_eq!(offline["latest"], 50);
    assert_eq!(offline["pins"], json!({"default.blah": 50}));
    assert!(retained(&offline).contains(&50));
    // status of a folder that is not a mount: exit 2, one line.
    let out = stagefs().arg("status").arg(d.mnt()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    one_line(&String::from_utf8_lossy(&out.stderr));
}

/// Bad input through the real daemon: the mount keeps serving the last good
/// state while status names the event, file, line and reason; after the line
/// is corrected and the daemon restarted, replication continues.
#[test]
fn rejected_event_keeps_the_mount_serving_and_resumes_after_correction() {
    let dir = tempfile::tempdir().unwrap();
    let args = DaemonArgs::under(dir.path());
    let w = EventWriter::new(&args);
    small_table(&w);
    let f1 = w.put_file("default/blah/p=a/000000_0", b"good\n");
    w.append(json!({"id": 3, "op": "add_files", "db": "default", "table": "blah", "partition": {"p": "a"}, "files": [f1]}));
    // Line 4: files for a table that does not exist.
    let f2 = w.put_file("default/blah/p=a/000001_0", b"never\n");
    w.append(json!({"id": 4, "op": "add_files", "db": "default", "table": "nope", "partition": {"p": "a"}, "files": [f2.clone()]}));
    w.append(json!({"id": 5, "op": "noop"}));
    let log = args.events.join("log-000001.jsonl");
    let mut d = Daemon::start(args);
    let s = d.wait_status("the rejection at the last good state", |s| {
        !s["stalled"].is_null() && s["visible"] == 3
    });
    assert_eq!(s["stalled"]["state_id"], 4, "{s}");
    assert_eq!(s["stalled"]["file"], "log-000001.jsonl", "{s}");
    assert_eq!(s["stalled"]["line"], 4, "{s}");
    assert!(
        s["stalled"]["reason"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{s}"
    );
    assert_eq!(s["visible"], 3, "{s}");
    // The mount serves the last good state, whole.
    assert_eq!(
        fs::read_to_string(d.join("default/blah/p=a/000000_0")).unwrap(),
        "good\n"
    );
    assert_eq!(names(&d.join("default")), vec!["blah"]);

    // Correct line 4, restart: 4 and 5 apply.
    let text = fs::read_to_string(&log).unwrap();
    let fixed: Vec<String> = text
        .lines()
        .map(|l| l.replace("\"nope\"", "\"blah\""))
        .collect();
    fs::write(&log, fixed.join("\n") + "\n").unwrap();
    assert!(d.sigterm().success());
    d.restart();
    d.wait_visible(5);
    assert!(d.status()["stalled"].is_null());
    assert_eq!(
        fs::read_to_string(d.join("default/blah/p=a/000001_0")).unwrap(),
        "never\n"
    );
}

/// A state folder written before the commit log (its record in
/// `commit.json`, as branch main wrote it) opens at its visible state —
/// the ratchet carries over — and moves to `commits.log` at the next commit.
#[test]
fn state_folder_with_commit_json_keeps_its_visible_state_and_migrates() {
    let dir = tempfile::tempdir().unwrap();
    let args = seeded(dir.path());
    let state = args.state.clone();
    let w = EventWriter::new(&args);
    let mut d = Daemon::start(args);
    let s = d.wait_visible(50);
    let retained = retained(&s);
    assert_eq!(d.sigterm().code(), Some(0));
    // The old format: commit.json only.
    fs::remove_file(state.join("commits.log")).unwrap();
    fs::write(
        state.join("commit.json"),
        serde_json::to_vec_pretty(&json!({"visible": 50, "retained": retained})).unwrap(),
    )
    .unwrap();
    d.restart();
    // Recovery finishes before the mount appears: the first status already
    // shows state 50, never an older one.
    assert_eq!(visible(&d.status()), 50);
    assert!(
        state.join("commit.json").exists(),
        "kept until the next commit"
    );
    w.append(json!({"id": 51, "op": "noop"}));
    d.wait_visible(51);
    assert!(!state.join("commit.json").exists());
    assert!(state.join("commits.log").exists());
    assert_eq!(d.sigterm().code(), Some(0));
    d.restart();
    assert_eq!(visible(&d.status()), 51);
}
