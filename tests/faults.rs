//! Faults at the source and in the state folder, against the real daemon
//! and its mount (SPEC §3 rule 2, §7 `stalled`):
//! - a corrupted source file (same size, other bytes) is never served: the
//!   change-management copy is, or nothing until the file is right;
//! - a file missing from both the source and cm stalls replication at the
//!   last complete state, naming the path; a later state that no longer
//!   needs the file commits;
//! - a full disk under `--state` stalls with "disk full" while the mount
//!   keeps serving the last state, and replication resumes, losing nothing,
//!   once space is freed; a full disk under the journal stalls ingest only
//!   until space returns, without a restart;
//! - an unreadable source file (a directory, a FIFO) is retried and
//!   reported, and replication continues once it is fixed;
//! - a source path that leaves the source root through a symlink, or is a
//!   device node, is refused unopened and reported (with `--allow-other`
//!   the status names no host path), and the mount keeps serving;
//! - a source read that hangs (the source root on a FUSE layer whose reads
//!   block) times out after `--fetch-timeout`, is reported as a stall naming
//!   the file, and the state commits once the read is let go.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::event::StateId;
use stagefs::status::StatusReport;
use stagefs::testkit::checker::{
    detach, getxattr_string, is_mounted, mount_flags, mount_status, visible, DaemonProcess,
};

#[path = "common/fuse_attr.rs"]
mod fuse_attr;
#[path = "common/gatefs.rs"]
mod gatefs;

/// A hand-written source warehouse: `source/`, `events/`, `cm/`.
struct Source {
    root: PathBuf,
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Deterministic incompressible-looking bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

impl Source {
    fn new(root: &Path) -> Source {
        for d in ["source", "events", "cm"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let s = Source {
            root: root.to_owned(),
        };
        s.line(r#"{"id": 1, "op": "create_database", "db": "db"}"#);
        s.line(
            r#"{"id": 2, "op": "create_table", "db": "db", "table": "t", "partition_keys": ["p"]}"#,
        );
        s
    }

    fn source(&self, rel: &str) -> PathBuf {
        self.root.join("source").join(rel)
    }

    fn line(&self, json: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("events/log-000001.jsonl"))
            .unwrap();
        f.write_all(format!("{json}\n").as_bytes()).unwrap();
    }

    /// The file object of an event for `content` at `p=<p>/<name>`; the
    /// bytes are not written anywhere.
    fn file_ref(p: &str, name: &str, content: &[u8]) -> String {
        format!(
            r#"{{"path": "db/t/p={p}/{name}", "size": {}, "sha256": "{}"}}"#,
            content.len(),
            sha_hex(content)
        )
    }

    /// Writes `content` to the source path of `p=<p>/<name>`.
    fn put(&self, p: &str, name: &str, content: &[u8]) {
        let path = self.source(&format!("db/t/p={p}/{name}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// Writes the change-management copy of `content` named `name`.
    fn put_cm(&self, name: &str, content: &[u8]) {
        std::fs::write(
            self.root
                .join("cm")
                .join(format!("{name}_{}", sha_hex(content))),
            content,
        )
        .unwrap();
    }

    fn event(&self, id: u64, op: &str, p: &str, files: &[String]) {
        self.line(&format!(
            r#"{{"id": {id}, "op": "{op}", "db": "db", "table": "t", "partition": {{"p": "{p}"}}, "files": [{}]}}"#,
            files.join(", ")
        ));
    }
}

struct Setup {
    dir: tempfile::TempDir,
    src: Source,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let src = Source::new(&dir.path().join("src"));
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        Setup { dir, src }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn start(&self, state: &Path) -> DaemonProcess {
        self.start_with(state, &[])
    }

    /// [`Setup::start`] with more flags (e.g. `--allow-other`).
    fn start_with(&self, state: &Path, extra: &[&str]) -> DaemonProcess {
        self.start_on(state, &self.src.root.join("source"), extra)
    }

    /// [`Setup::start_with`], reading the source files from `source_root`.
    fn start_on(&self, state: &Path, source_root: &Path, extra: &[&str]) -> DaemonProcess {
        let root = &self.src.root;
        let flags = mount_flags(
            state,
            source_root,
            &root.join("events"),
            &root.join("cm"),
            None,
        );
        let mut args: Vec<&OsStr> = flags.iter().map(|f| f.as_os_str()).collect();
        args.extend(extra.iter().map(OsStr::new));
        DaemonProcess::start(
            Path::new(env!("CARGO_BIN_EXE_stagefs")),
            &self.mnt(),
            &args,
            &self.dir.path().join("daemon.log"),
            Duration::from_secs(20),
        )
        .expect("the daemon mounts")
    }

    fn status(&self) -> StatusReport {
        mount_status(&self.mnt()).unwrap()
    }

    fn file(&self, rel: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.mnt().join("db/t").join(rel))
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_visible(s: &Setup, id: u64, secs: u64) {
    let mnt = s.mnt();
    let start = Instant::now();
    while visible(&mnt).unwrap() < StateId(id) {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "visible did not reach {id} in {secs} s: {}",
            std::fs::read_to_string(mnt.join(".stagefs/status")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stall_reason(s: &Setup) -> Option<(Option<StateId>, String)> {
    s.status().stalled.map(|st| (st.state_id, st.reason))
}

#[test]
fn corrupted_source_file_is_never_served() {
    let s = Setup::new();
    let good = bytes(1, 4096);
    let mut corrupt = good.clone();
    corrupt[100] ^= 0xff;
    corrupt[4000] ^= 0x55;
    // Event 3: the source copy was corrupted (same size), cm has the right bytes.
    s.src.put("a", "f1", &corrupt);
    s.src.put_cm("f1", &good);
    // A control file whose source is right.
    let ok = bytes(2, 1000);
    s.src.put("a", "f0", &ok);
    s.src.event(
        3,
        "add_files",
        "a",
        &[
            Source::file_ref("a", "f0", &ok),
            Source::file_ref("a", "f1", &good),
        ],
    );
    // Event 4: corrupted at the source and no cm copy: never served.
    let good2 = bytes(3, 2048);
    let mut corrupt2 = good2.clone();
    corrupt2[0] ^= 1;
    s.src.put("b", "f2", &corrupt2);
    s.src
        .event(4, "add_files", "b", &[Source::file_ref("b", "f2", &good2)]);

    let _d = s.start(&s.dir.path().join("state"));
    wait_visible(&s, 3, 20);
    assert_eq!(s.file("p=a/f1").unwrap(), good, "bytes of the cm copy");
    assert_eq!(s.file("p=a/f0").unwrap(), ok);
    assert_eq!(
        getxattr_string(&s.mnt().join("db/t/p=a/f1"), "user.stagefs.sha256").unwrap(),
        sha_hex(&good)
    );
    let st = s.status();
    assert!(st.staging.from_change_management >= 1, "{:?}", st.staging);
    // State 4 waits for the right bytes, naming the file and the mismatch.
    wait_for("the stall of state 4", 20, || {
        stall_reason(&s).is_some_and(|(id, r)| id == Some(StateId(4)) && r.contains("db/t/p=b/f2"))
    });
    let (_, reason) = stall_reason(&s).unwrap();
    assert!(reason.contains("sha"), "{reason}");
    assert_eq!(visible(&s.mnt()).unwrap(), StateId(3));
    assert!(s.file("p=b/f2").is_err(), "a corrupted file was served");
    assert!(!s.mnt().join("db/t/p=b").exists());
    // Repaired at the source: picked up by the retry.
    s.src.put("b", "f2", &good2);
    wait_visible(&s, 4, 30);
    assert_eq!(s.file("p=b/f2").unwrap(), good2);
    assert!(s.status().stalled.is_none());
}

#[test]
fn missing_file_stalls_at_the_last_complete_state_until_a_later_state_drops_it() {
    let s = Setup::new();
    let a1 = bytes(10, 3000);
    s.src.put("a", "a1", &a1);
    s.src
        .event(3, "add_files", "a", &[Source::file_ref("a", "a1", &a1)]);
    // Event 4 names a file that is nowhere.
    let ghost = bytes(11, 500);
    s.src.event(
        4,
        "add_files",
        "b",
        &[Source::file_ref("b", "ghost", &ghost)],
    );
    // Event 5 is complete in itself but state 5 still holds the ghost.
    let a2 = bytes(12, 700);
    s.src.put("a", "a2", &a2);
    s.src
        .event(5, "add_files", "a", &[Source::file_ref("a", "a2", &a2)]);

    let _d = s.start(&s.dir.path().join("state"));
    // The stall can be reported before state 3's commit lands: wait for both.
    wait_for("the stall with 3 visible", 20, || {
        stall_reason(&s).is_some_and(|(_, r)| r.contains("db/t/p=b/ghost"))
            && visible(&s.mnt()).is_ok_and(|v| v == StateId(3))
    });
    let (id, reason) = stall_reason(&s).unwrap();
    assert_eq!(id, Some(StateId(4)), "{reason}");
    std::thread::sleep(Duration::from_millis(300));
    let mnt = s.mnt();
    assert_eq!(visible(&mnt).unwrap(), StateId(3));
    assert_eq!(s.status().latest, StateId(5));
    assert_eq!(s.file("p=a/a1").unwrap(), a1);
    assert!(
        !mnt.join("db/t/p=a/a2").exists(),
        "state 5 shown without its ghost"
    );

    // Event 6 overwrites p=b without the missing file: state 6 completes.
    let b1 = bytes(13, 900);
    s.src.put("b", "b1", &b1);
    s.src
        .event(6, "replace_files", "b", &[Source::file_ref("b", "b1", &b1)]);
    wait_visible(&s, 6, 20);
    assert_eq!(
        getxattr_string(&mnt.join("db/t"), "user.stagefs.state_id").unwrap(),
        "6"
    );
    let mut listed: Vec<String> = ["p=a", "p=b"]
        .iter()
        .flat_map(|p| {
            std::fs::read_dir(mnt.join("db/t").join(p))
                .unwrap()
                .map(move |e| format!("{p}/{}", e.unwrap().file_name().to_string_lossy()))
        })
        .collect();
    listed.sort();
    assert_eq!(listed, ["p=a/a1", "p=a/a2", "p=b/b1"]);
    assert_eq!(s.file("p=a/a2").unwrap(), a2);
    assert_eq!(s.file("p=b/b1").unwrap(), b1);
    assert!(s.status().stalled.is_none(), "{:?}", s.status().stalled);
}

/// A small tmpfs for `--state`, unmounted on drop (after the daemon, which
/// is declared later and so dropped first).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mount -t tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_owned())
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "remount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            detach(&self.0);
        }
    }
}

#[test]
fn disk_full_stalls_keeps_serving_and_resumes_when_space_is_freed() {
    let s = Setup::new();
    let small = Tmpfs::mount(&s.dir.path().join("statefs"), "4m");
    let state = small.0.join("state");
    // 12 files of 512 KiB, one event each, all in p=a: 6 MiB in the newest
    // state, more than the 4 MiB disk.
    let files: Vec<Vec<u8>> = (0..12).map(|i| bytes(100 + i, 512 << 10)).collect();
    for (i, f) in files.iter().enumerate() {
        let name = format!("{i:06}_0");
        s.src.put("a", &name, f);
        s.src.event(
            3 + i as u64,
            "add_files",
            "a",
            &[Source::file_ref("a", &name, f)],
        );
    }
    let last = 3 + files.len() as u64 - 1;
    let _d = s.start(&state);
    let mnt = s.mnt();
    wait_for("a disk-full stall", 30, || {
        stall_reason(&s).is_some_and(|(_, r)| r.contains("disk full"))
    });
    // Fetches already in flight when the first one hit the full disk may
    // still complete a state or two: wait until visible settles.
    let mut v = visible(&mnt).unwrap();
    loop {
        std::thread::sleep(Duration::from_millis(700));
        let now = visible(&mnt).unwrap();
        if now == v {
            break;
        }
        v = now;
    }
    let (id, reason) = stall_reason(&s).unwrap();
    eprintln!("stalled at visible {v} on {id:?}: {reason}");
    assert!(v < StateId(last), "everything fitted: visible {v}");
    // The mount keeps serving the last state, whole and right.
    let shown = (v.0.saturating_sub(2)) as usize;
    for (i, f) in files.iter().enumerate().take(shown) {
        assert_eq!(&s.file(&format!("p=a/{i:06}_0")).unwrap(), f, "file {i}");
    }
    assert!(!mnt.join(format!("db/t/p=a/{shown:06}_0")).exists());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(visible(&mnt).unwrap(), v, "moved on while the disk is full");
    assert!(stall_reason(&s).is_some_and(|(_, r)| r.contains("disk full")));

    // Free space: replication resumes and loses nothing.
    small.resize("64m");
    wait_visible(&s, last, 40);
    for (i, f) in files.iter().enumerate() {
        assert_eq!(&s.file(&format!("p=a/{i:06}_0")).unwrap(), f, "file {i}");
    }
    wait_for("the stall to clear", 10, || s.status().stalled.is_none());
}

/// Fills the filesystem holding `dir` with `dir/filler` until it is full.
fn fill_disk(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // The last pages may take small writes: fill them byte by byte.
    while f.write(&[0xa5]).is_ok_and(|n| n == 1) {}
    path
}

#[test]
fn journal_disk_full_stalls_ingest_until_space_returns_without_restart() {
    let s = Setup::new();
    let small = Tmpfs::mount(&s.dir.path().join("statefs"), "2m");
    let state = small.0.join("state");
    let _d = s.start(&state);
    wait_visible(&s, 2, 20);
    let filler = fill_disk(&small.0);
    // Metadata-only events: nothing to stage, so only the journal (and the
    // commit record) needs space. More than a page of records.
    let tables = 60u64;
    for i in 0..tables {
        s.src.line(&format!(
            r#"{{"id": {}, "op": "create_table", "db": "db", "table": "t{i}", "partition_keys": ["p"]}}"#,
            3 + i
        ));
    }
    let last = 3 + tables - 1;
    wait_for("a journal disk-full stall", 20, || {
        stall_reason(&s).is_some_and(|(_, r)| r.contains("journal") && r.contains("disk full"))
    });
    let v = visible(&s.mnt()).unwrap();
    assert!(v < StateId(last), "everything was journaled on a full disk");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        stall_reason(&s).is_some_and(|(_, r)| r.contains("journal")),
        "the stall cleared while the disk is still full: {:?}",
        s.status().stalled
    );

    // Space returns: the same daemon journals and commits everything.
    std::fs::remove_file(&filler).unwrap();
    wait_visible(&s, last, 30);
    let mut names: Vec<String> = std::fs::read_dir(s.mnt().join("db"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..tables).map(|i| format!("t{i}")).collect();
    want.push("t".to_owned());
    want.sort();
    assert_eq!(names, want);
    wait_for("the stall to clear", 10, || s.status().stalled.is_none());
    assert_eq!(s.status().latest, StateId(last));
}

#[test]
fn source_path_that_is_a_directory_is_retried_and_reported_until_fixed() {
    let s = Setup::new();
    let f = bytes(20, 1500);
    // The source path of the file is a directory (and there is no cm copy).
    std::fs::create_dir_all(s.src.source("db/t/p=a/f")).unwrap();
    s.src
        .event(3, "add_files", "a", &[Source::file_ref("a", "f", &f)]);
    let _d = s.start(&s.dir.path().join("state"));
    wait_for("the stall", 20, || {
        stall_reason(&s).is_some_and(|(_, r)| r.contains("db/t/p=a/f"))
    });
    let (id, reason) = stall_reason(&s).unwrap();
    assert_eq!(id, Some(StateId(3)));
    assert!(reason.contains("not a regular file"), "{reason}");
    wait_for("retries", 20, || s.status().staging.failures >= 3);
    assert_eq!(visible(&s.mnt()).unwrap(), StateId(2));
    // Fixed: the directory becomes the right file.
    std::fs::remove_dir(s.src.source("db/t/p=a/f")).unwrap();
    s.src.put("a", "f", &f);
    wait_visible(&s, 3, 30);
    assert_eq!(s.file("p=a/f").unwrap(), f);
    assert!(s.status().stalled.is_none());
}

#[test]
fn source_path_that_is_a_fifo_is_retried_and_reported_until_fixed() {
    let s = Setup::new();
    let f = bytes(21, 1500);
    let fifo = s.src.source("db/t/p=a/f");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    let c = std::ffi::CString::new(fifo.as_os_str().to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // A control file in another event, after it.
    let g = bytes(22, 100);
    s.src
        .event(3, "add_files", "a", &[Source::file_ref("a", "f", &f)]);
    s.src.put("b", "g", &g);
    s.src
        .event(4, "add_files", "b", &[Source::file_ref("b", "g", &g)]);
    let mut d = s.start(&s.dir.path().join("state"));
    // Nothing past 2 can commit while the file is unreadable; the wait is
    // reported, naming the file.
    let reported = {
        let start = Instant::now();
        loop {
            if stall_reason(&s).is_some_and(|(_, r)| r.contains("db/t/p=a/f")) {
                break true;
            }
            if start.elapsed() > Duration::from_secs(5) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let status_then = std::fs::read_to_string(s.mnt().join(".stagefs/status")).unwrap();
    // Fix it: a regular file with the right bytes replaces the FIFO (the
    // FIFO is kept aside so a stuck opener can be released afterwards).
    let aside = s.src.source("fifo-aside");
    std::fs::rename(&fifo, &aside).unwrap();
    s.src.put("a", "f", &f);
    let recovered = {
        let start = Instant::now();
        loop {
            if visible(&s.mnt()).unwrap() >= StateId(4) {
                break true;
            }
            if start.elapsed() > Duration::from_secs(15) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let status_after = std::fs::read_to_string(s.mnt().join(".stagefs/status")).unwrap();
    let served = s.file("p=a/f").ok();
    // Release a fetch blocked in open(2) on the FIFO, so the daemon can stop.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags_nonblock()
        .open(&aside);
    let clean = d.terminate(Duration::from_secs(10)).unwrap();
    assert!(
        reported && recovered && clean,
        "a FIFO at the source path: reported within 5 s: {reported}; replication continued within 15 s \
         of the fix: {recovered}; clean stop: {clean}. (A fetch thread blocks in open(2) on the FIFO: \
         the blob stays in flight, is never retried, and nothing is reported.)\nstatus before the fix: \
         {status_then}\nstatus after the fix: {status_after}"
    );
    assert_eq!(served, Some(f));
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

/// Waits until the stall names `path`, then returns its reason.
fn wait_stall_naming(s: &Setup, path: &str) -> (Option<StateId>, String) {
    wait_for("the stall", 20, || {
        stall_reason(s).is_some_and(|(_, r)| r.contains(path))
    });
    stall_reason(s).unwrap()
}

#[test]
fn source_symlink_out_of_the_root_is_refused_and_no_host_path_is_shown() {
    let s = Setup::new();
    // The file's bytes exist, but outside the source root: following the
    // link would stage (and serve to every reader) a file the source does
    // not own, as /etc/shadow would be with a link to it.
    let f = bytes(30, 1500);
    let outside = s.dir.path().join("outside-secret");
    std::fs::write(&outside, &f).unwrap();
    let link = s.src.source("db/t/p=a/f");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    s.src
        .event(3, "add_files", "a", &[Source::file_ref("a", "f", &f)]);
    let _d = s.start_with(&s.dir.path().join("state"), &["--allow-other"]);
    let (id, reason) = wait_stall_naming(&s, "db/t/p=a/f");
    assert_eq!(id, Some(StateId(3)));
    assert!(reason.contains("leaves its root"), "{reason}");
    assert_eq!(visible(&s.mnt()).unwrap(), StateId(2));
    assert!(
        s.file("p=a/f").is_err(),
        "a file outside the root was served"
    );
    // Readers of the status (any user, with --allow-other) see paths
    // relative to the roots, never the host's folders.
    let text = std::fs::read_to_string(s.mnt().join(".stagefs/status")).unwrap();
    let host = s.dir.path().canonicalize().unwrap();
    assert!(
        !text.contains(&*s.dir.path().to_string_lossy())
            && !text.contains(&*host.to_string_lossy()),
        "{text}"
    );
    assert!(text.contains("<source-root>/db/t/p=a/f"), "{text}");
    // Fixed at the source: a regular file replaces the link.
    std::fs::remove_file(&link).unwrap();
    s.src.put("a", "f", &f);
    wait_visible(&s, 3, 30);
    assert_eq!(s.file("p=a/f").unwrap(), f);
}

#[test]
fn source_path_that_is_a_device_node_is_refused_unopened_and_reported() {
    let s = Setup::new();
    let f = bytes(31, 800);
    let dev = s.src.source("db/t/p=a/f");
    std::fs::create_dir_all(dev.parent().unwrap()).unwrap();
    let c = std::ffi::CString::new(dev.as_os_str().to_str().unwrap()).unwrap();
    // Major 240 (local use) has no driver: opening it fails with ENXIO, so
    // a reason naming the device kind shows it was never opened.
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(240, 0)) };
    assert_eq!(
        rc,
        0,
        "mknod (needs root): {}",
        std::io::Error::last_os_error()
    );
    let g = bytes(32, 100);
    s.src
        .event(3, "add_files", "a", &[Source::file_ref("a", "f", &f)]);
    let _d = s.start(&s.dir.path().join("state"));
    let (id, reason) = wait_stall_naming(&s, "db/t/p=a/f");
    assert_eq!(id, Some(StateId(3)));
    assert!(
        reason.contains("not a regular file (a character device); refused without opening it"),
        "{reason}"
    );
    // The mount keeps serving while the state waits.
    assert_eq!(visible(&s.mnt()).unwrap(), StateId(2));
    assert!(s.mnt().join("db/t").is_dir());
    std::fs::remove_file(&dev).unwrap();
    s.src.put("a", "f", &f);
    s.src.put("b", "g", &g);
    s.src
        .event(4, "add_files", "b", &[Source::file_ref("b", "g", &g)]);
    wait_visible(&s, 4, 30);
    assert_eq!(s.file("p=a/f").unwrap(), f);
    assert_eq!(s.file("p=b/g").unwrap(), g);
}

#[test]
fn hung_source_read_times_out_is_reported_and_commits_once_released() {
    let s = Setup::new();
    // The source root is a FUSE layer over `source/` whose reads of
    // `slow.bin` hang, as on an NFS server that went away.
    let gate_mnt = s.dir.path().join("gate");
    std::fs::create_dir(&gate_mnt).unwrap();
    let gate = gatefs::GateFs::mount(&s.src.root.join("source"), &gate_mnt).unwrap();
    gate.hold("slow.bin");
    let f = bytes(40, 3000);
    s.src.put("a", "slow.bin", &f);
    s.src.event(
        3,
        "add_files",
        "a",
        &[Source::file_ref("a", "slow.bin", &f)],
    );
    let _d = s.start_on(
        &s.dir.path().join("state"),
        &gate_mnt,
        &["--fetch-timeout", "1"],
    );
    wait_visible(&s, 2, 20);
    let (id, reason) = wait_stall_naming(&s, "db/t/p=a/slow.bin");
    assert_eq!(id, Some(StateId(3)));
    assert!(reason.contains("read timed out after 1s"), "{reason}");
    assert!(
        gate.waiting() >= 1,
        "the daemon's read is blocked in the layer"
    );
    // While the read hangs, the stall stays and the retry does not pile up
    // blocked threads: one read waits at a time.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(stall_reason(&s).is_some_and(|(_, r)| r.contains("timed out")));
    assert_eq!(gate.waiting(), 1);
    assert_eq!(gate.waited(), 1, "a retry started another blocked read");
    assert_eq!(visible(&s.mnt()).unwrap(), StateId(2));
    // The read is let go: the abandoned attempt's result is dropped, the
    // retry reads the file, and the state commits.
    gate.release();
    wait_visible(&s, 3, 30);
    assert_eq!(s.file("p=a/slow.bin").unwrap(), f);
    wait_for("the stall to clear", 10, || s.status().stalled.is_none());
}
