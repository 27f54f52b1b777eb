//! Shared harness for tests that mount a real FUSE filesystem.
//!
//! - [`TestMount`]: a catalog built by hand from event lines (blobs written
//!   into a temp dir), served by a `View` mounted on a fresh temp dir, and
//!   always unmounted in `Drop` — even when the test panics.
//! - [`MountGuard`]: the same safety net for mounts made by someone else
//!   (e.g. a daemon under test): lazily detaches the path on drop.
//! - xattr helpers over the raw syscalls, returning the errno on failure.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use stagefs::catalog::{Catalog, Pins, Tree};
use stagefs::event::{BlobId, Event, StateId};
use stagefs::fuse::{self, MountOptions, Mounted};
use stagefs::view::{StatusSource, View, ViewConfig};

/// Logs to stderr when `STAGEFS_LOG` is set (e.g. `STAGEFS_LOG=debug`).
pub fn init_logging() {
    if let Ok(filter) = std::env::var("STAGEFS_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Status for tests: `latest` is the newest state applied.
pub struct TestStatus {
    pub latest: Mutex<StateId>,
    pub catalog: Arc<Catalog>,
}

impl StatusSource for TestStatus {
    fn status_json(&self) -> String {
        let snap = self.catalog.snapshot();
        let latest = self.latest();
        format!(
            r#"{{"visible": {}, "latest": {}, "lag_events": {}}}"#,
            snap.visible.state_id,
            latest,
            latest.0.saturating_sub(snap.visible.state_id.0)
        )
    }

    fn latest(&self) -> StateId {
        *self.latest.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct TestMount {
    mounted: Option<Mounted>,
    mnt: PathBuf,
    blobs: PathBuf,
    catalog: Arc<Catalog>,
    view: Arc<View>,
    status: Arc<TestStatus>,
    tree: Mutex<Arc<Tree>>,
    // Last: removed only after the mount is gone.
    dir: tempfile::TempDir,
}

impl TestMount {
    /// An empty catalog (state 0), mounted with the default options (so
    /// `STAGEFS_NO_OPEN=1` runs the suite in no-open mode).
    pub fn new() -> TestMount {
        TestMount::with_options(MountOptions::default())
    }

    /// An empty catalog (state 0), mounted with `opts`.
    pub fn with_options(opts: MountOptions) -> TestMount {
        init_logging();
        let dir = tempfile::tempdir().expect("temp dir");
        let (state, blobs, mnt) = (
            dir.path().join("state"),
            dir.path().join("blobs"),
            dir.path().join("mnt"),
        );
        for d in [&state, &blobs, &mnt] {
            std::fs::create_dir(d).expect("create test dir");
        }
        let tree = Arc::new(Tree::empty());
        let catalog = Arc::new(Catalog::new(
            &state,
            Arc::clone(&tree),
            BTreeMap::new(),
            Pins::default(),
            16,
        ));
        let status = Arc::new(TestStatus {
            latest: Mutex::new(StateId(0)),
            catalog: Arc::clone(&catalog),
        });
        let b = blobs.clone();
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let view = Arc::new(View::new(
            Arc::clone(&catalog),
            Arc::new(move |id: &BlobId| b.join(id.to_hex())),
            Arc::clone(&status) as Arc<dyn StatusSource>,
            ViewConfig {
                uid,
                gid,
                mount_time: SystemTime::now(),
            },
        ));
        let mounted = fuse::mount(Arc::clone(&view), &mnt, &opts).expect("mount");
        let mnt = mounted.mountpoint().to_owned();
        TestMount {
            mounted: Some(mounted),
            mnt,
            blobs,
            catalog,
            view,
            status,
            tree: Mutex::new(tree),
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// `MOUNT/rel`.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn mounted(&self) -> &Mounted {
        self.mounted.as_ref().expect("mounted")
    }

    /// Stores `content` as a staged blob; returns the event's file object.
    pub fn file(&self, path: &str, content: &[u8]) -> String {
        let sha = sha256_hex(content);
        std::fs::write(self.blobs.join(&sha), content).expect("write blob");
        format!(
            r#"{{"path": "{path}", "size": {}, "sha256": "{sha}"}}"#,
            content.len()
        )
    }

    /// Applies one event line on the newest state and commits it, then
    /// reads the root's `user.stagefs.visible` as a script waiting for the
    /// state would: that read-your-check moves this process's view
    /// (SPEC §3.8) to it, so the test's next walk sees it.
    pub fn commit(&self, line: &str) {
        self.commit_quietly(line);
        let seen = getxattr(&self.mnt, "user.stagefs.visible").expect("read visible");
        let tree = self.tree.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(seen, tree.state_id.to_string(), "visible after commit");
    }

    /// Commits like [`TestMount::commit`] without the read-your-check:
    /// this process's view stays where the view rule puts it.
    pub fn commit_quietly(&self, line: &str) {
        let event = Event::parse_line(line.as_bytes()).expect("valid event");
        let mut tree = self.tree.lock().unwrap_or_else(|p| p.into_inner());
        let next = Arc::new(tree.apply(&event).expect("event applies").0);
        self.catalog.commit(Arc::clone(&next)).expect("commit");
        *self.status.latest.lock().unwrap_or_else(|p| p.into_inner()) = next.state_id;
        *tree = next;
    }

    /// `add_files` (or `replace_files` when `replace`) of one file into
    /// `default.blah` partition `p`.
    pub fn put(&self, id: u64, op: &str, p: &str, name: &str, content: &[u8]) {
        let f = self.file(&format!("default/blah/p={p}/{name}"), content);
        self.commit(&format!(
            r#"{{"id": {id}, "op": "{op}", "db": "default", "table": "blah", "partition": {{"p": "{p}"}}, "files": [{f}]}}"#
        ));
    }

    /// [`TestMount::put`] of `add_files` without the read-your-check.
    pub fn put_quietly(&self, id: u64, p: &str, name: &str, content: &[u8]) {
        let f = self.file(&format!("default/blah/p={p}/{name}"), content);
        self.commit_quietly(&format!(
            r#"{{"id": {id}, "op": "add_files", "db": "default", "table": "blah", "partition": {{"p": "{p}"}}, "files": [{f}]}}"#
        ));
    }

    /// SPEC §1 up to `last` (one of 10, 20, 30, 40): create at 5/10, then
    /// inserts (a,5) at 20, (b,10) at 30, (a,15) at 40.
    pub fn seed_example(&self, last: u64) {
        self.commit(r#"{"id": 5, "op": "create_database", "db": "default"}"#);
        self.commit(
            r#"{"id": 10, "op": "create_table", "db": "default", "table": "blah", "partition_keys": ["p"]}"#,
        );
        let inserts: [(u64, &str, &str, &[u8]); 3] = [
            (20, "a", "000001_0", b"5\n"),
            (30, "b", "000002_0", b"10\n"),
            (40, "a", "000003_0", b"15\n"),
        ];
        for (id, p, name, content) in inserts {
            if id <= last {
                self.put(id, "add_files", p, name, content);
            }
        }
    }

    /// Unmounts now (what `Drop` does), reporting failure.
    pub fn unmount(mut self) {
        if let Some(m) = self.mounted.take() {
            m.unmount().expect("unmount");
        }
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            if let Err(e) = m.unmount() {
                eprintln!("unmount failed ({e}); detaching");
                detach(&self.mnt);
            }
        }
    }
}

/// Lazily detaches a mount made by someone else when dropped.
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        if is_mountpoint(&self.0) {
            detach(&self.0);
        }
    }
}

/// `umount2(MNT_DETACH)`, ignoring errors.
pub fn detach(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Whether `path` is the root of a mount (its device differs from its
/// parent's).
pub fn is_mountpoint(path: &Path) -> bool {
    let (Ok(me), Some(parent)) = (std::fs::symlink_metadata(path), path.parent()) else {
        return false;
    };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != me.dev())
}

pub fn sha256_hex(content: &[u8]) -> String {
    Sha256::digest(content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn cpath(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path without NUL")
}

fn cname(name: &str) -> CString {
    CString::new(name).expect("name without NUL")
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `getxattr` with a buffer of `size` bytes (0 = size probe): the value
/// (or, for a probe, an empty vec and the size), else the errno.
pub fn getxattr_sized(path: &Path, name: &str, size: usize) -> Result<(Vec<u8>, usize), i32> {
    let mut buf = vec![0u8; size];
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: valid strings; buf has `size` writable bytes.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if rc < 0 {
        return Err(errno());
    }
    let len = rc as usize;
    buf.truncate(len.min(size));
    Ok((buf, len))
}

/// The value of `name`, probing the size first. The value may grow
/// between the probe and the read (a view moving from state 99 to 100):
/// `ERANGE` then, and the probe is made again.
pub fn getxattr(path: &Path, name: &str) -> Result<String, i32> {
    let mut tries = 0;
    loop {
        let (_, len) = getxattr_sized(path, name, 0)?;
        match getxattr_sized(path, name, len) {
            Ok((v, _)) => return Ok(String::from_utf8(v).expect("utf-8 xattr")),
            Err(libc::ERANGE) if tries < 10 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

pub fn setxattr(path: &Path, name: &str, value: &[u8]) -> Result<(), i32> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: valid strings; value is readable for its length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn removexattr(path: &Path, name: &str) -> Result<(), i32> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: valid strings.
    let rc = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
    if rc < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// `listxattr` with a buffer of `size` bytes (0 = probe): raw bytes and the
/// reported length, else the errno.
pub fn listxattr_sized(path: &Path, size: usize) -> Result<(Vec<u8>, usize), i32> {
    let mut buf = vec![0u8; size];
    let p = cpath(path);
    // SAFETY: valid string; buf has `size` writable bytes.
    let rc = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if rc < 0 {
        return Err(errno());
    }
    let len = rc as usize;
    buf.truncate(len.min(size));
    Ok((buf, len))
}

/// The attribute names of `path`.
pub fn listxattr(path: &Path) -> Result<Vec<String>, i32> {
    let (_, len) = listxattr_sized(path, 0)?;
    let (raw, _) = listxattr_sized(path, len)?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// Sorted names in a directory.
pub fn names(path: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(path)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", path.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    out.sort();
    out
}

/// Fails the test, with what to run, when `python3 -c 'import M'` fails
/// for one of `modules` (or, for Spark, when `java` is missing).
pub fn require(modules: &[&str], java: bool) {
    for m in modules {
        let ok = std::process::Command::new("python3")
            .args(["-c", &format!("import {m}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "python3 -c 'import {m}' fails: run scripts/setup-readers.sh (installs pyspark, pyarrow, duckdb from PyPI)"
        );
    }
    if java {
        let ok = std::process::Command::new("java")
            .arg("-version")
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "java is missing: pyspark needs a Java 17 or 21 runtime on PATH (apt-get install openjdk-17-jre-headless)"
        );
    }
}

/// The errno of an I/O result.
pub fn os_err<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error")
        .raw_os_error()
        .unwrap_or(0)
}
pub mod daemon;
pub mod hosts;

/// The last `n` bytes of `s` (from a character boundary).
pub fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Reads a child's pipe to its end on a thread of its own (a child
/// writing more than a pipe holds blocks until someone reads).
pub fn drain(r: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        buf
    })
}

/// Waits for `child`; after `timeout`, kills it and fails, naming where it
/// waited (its kernel state, wait channel and schedstat, read before the
/// kill), the tail of its stderr and `diag()`. Its stdout and stderr are
/// read while it runs: a child logging much (a JVM's exceptions) would
/// otherwise fill the pipe and block.
pub fn wait_or_kill(
    mut child: std::process::Child,
    timeout: std::time::Duration,
    diag: impl Fn() -> String,
) -> std::process::Output {
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let proc_file = |f: &str| {
                std::fs::read_to_string(format!("/proc/{}/{f}", child.id())).unwrap_or_default()
            };
            let state = proc_file("status")
                .lines()
                .filter(|l| l.starts_with("State") || l.contains("ctxt_switches"))
                .collect::<Vec<_>>()
                .join(", ");
            let (wchan, sched) = (proc_file("wchan"), proc_file("schedstat"));
            let _ = child.kill();
            let _ = child.wait();
            let err = err.join().unwrap_or_default();
            panic!(
                "the process did not finish in {timeout:?} ({state}; wchan {wchan}; \
                 schedstat {sched}); its stderr:\n{}\n{}",
                tail(&String::from_utf8_lossy(&err), 4000),
                diag()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}
