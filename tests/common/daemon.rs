//! A real `stagefs mount` process under test.
//!
//! - [`DaemonArgs`]: the folders of one test (`source/ events/ cm/` — the
//!   layout `Workload` and `write_seed_example` write — plus `state/` and
//!   `mnt/`) and the flags built from them.
//! - [`Daemon`]: spawns the real binary, waits until the mountpoint is a
//!   mount point, reads its status, signals it, restarts it, and in `Drop`
//!   always leaves no mount behind (SIGTERM, wait, then `umount2(MNT_DETACH)`
//!   and SIGKILL), printing the daemon's stderr when the test panicked.
//! - [`EventWriter`]: hand-written source events and files.
//! - Table readers and the workload oracle in comparable form.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagefs::daemon::unescape_mountinfo;
use stagefs::event::StateId;
use stagefs::workload::{TableContent, Workload};

use super::{detach, sha256_hex};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_stagefs");

/// Default deadline of the waits below.
pub const WAIT: Duration = Duration::from_secs(10);

/// A `stagefs` command with a quiet-enough log (`STAGEFS_LOG` passes through).
pub fn stagefs() -> Command {
    Command::new(BIN)
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after `timeout`
/// with `what` and the last diagnostic `diag()`.
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
    diag: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}\n{}", diag());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True when `path` (canonical) is listed in /proc/self/mountinfo — also
/// for a dead FUSE mount, where `stat` fails with ENOTCONN.
pub fn mounted(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| Path::new(&unescape_mountinfo(mp)) == path)
    })
}

/// The folders and flags of one daemon.
#[derive(Debug, Clone)]
pub struct DaemonArgs {
    pub mnt: PathBuf,
    pub state: PathBuf,
    pub source_root: PathBuf,
    pub events: PathBuf,
    pub cm_root: Option<PathBuf>,
    pub retain: Option<usize>,
    /// Extra environment of the daemon process.
    pub env: Vec<(String, String)>,
    /// Follow a Hive metastore instead of the native events.
    pub hive: Option<HiveMetastoreArgs>,
    /// More flags, appended as given (e.g. `--metrics ADDR`).
    pub extra: Vec<OsString>,
}

/// `--hive-metastore URL --source-map M... --hive-poll-ms N`, with the
/// password passed as STAGEFS_METASTORE_PASSWORD.
#[derive(Debug, Clone)]
pub struct HiveMetastoreArgs {
    pub url: String,
    pub password: String,
    pub source_map: Vec<String>,
    pub poll_ms: u64,
}

impl DaemonArgs {
    /// `root/{source,events,cm,state,mnt}`; creates the source folders and
    /// the mountpoint (not the state: the daemon creates it).
    pub fn under(root: &Path) -> DaemonArgs {
        let root = root.canonicalize().expect("canonical temp dir");
        for d in ["source", "events", "cm", "mnt"] {
            fs::create_dir_all(root.join(d)).expect("create test folder");
        }
        DaemonArgs {
            mnt: root.join("mnt"),
            state: root.join("state"),
            source_root: root.join("source"),
            events: root.join("events"),
            cm_root: Some(root.join("cm")),
            retain: None,
            env: Vec::new(),
            hive: None,
            extra: Vec::new(),
        }
    }

    pub fn env(mut self, name: &str, value: &str) -> DaemonArgs {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn retain(mut self, n: usize) -> DaemonArgs {
        self.retain = Some(n);
        self
    }

    /// Appends `flag` to the command line.
    pub fn arg(mut self, flag: &str) -> DaemonArgs {
        self.extra.push(flag.into());
        self
    }

    pub fn hive_metastore(mut self, hive: HiveMetastoreArgs) -> DaemonArgs {
        self.hive = Some(hive);
        self
    }

    /// The `stagefs mount ...` arguments.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "mount".into(),
            self.mnt.clone().into(),
            "--state".into(),
            self.state.clone().into(),
        ];
        if let Some(hive) = &self.hive {
            a.extend(["--hive-metastore".into(), hive.url.clone().into()]);
            for m in &hive.source_map {
                a.extend(["--source-map".into(), m.into()]);
            }
            a.extend(["--hive-poll-ms".into(), hive.poll_ms.to_string().into()]);
        } else {
            a.extend([
                "--source-root".into(),
                self.source_root.clone().into(),
                "--events".into(),
                self.events.clone().into(),
            ]);
        }
        if let (Some(cm), None) = (&self.cm_root, &self.hive) {
            a.push("--cm-root".into());
            a.push(cm.clone().into());
        }
        if let Some(n) = self.retain {
            a.push("--retain".into());
            a.push(n.to_string().into());
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// One `stagefs mount` process (and its restarts).
pub struct Daemon {
    args: DaemonArgs,
    child: Option<Child>,
    /// Where each run's stderr goes (`stderr-<run>.log` next to the state).
    logs: Vec<PathBuf>,
    exit: Option<ExitStatus>,
}

impl Daemon {
    /// Starts the daemon and waits until it is mounted.
    pub fn start(args: DaemonArgs) -> Daemon {
        let mut d = Daemon::spawn(args);
        d.wait_mounted();
        d
    }

    /// Starts the daemon without waiting (for runs expected to fail).
    pub fn spawn(args: DaemonArgs) -> Daemon {
        let mut d = Daemon {
            args,
            child: None,
            logs: Vec::new(),
            exit: None,
        };
        d.launch();
        d
    }

    fn launch(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        let dir = self.args.mnt.parent().expect("mnt has a parent").to_owned();
        let log = dir.join(format!(
            "stderr-{}-{}.log",
            self.args
                .mnt
                .file_name()
                .unwrap_or_default()
                .to_string_lossy(),
            self.logs.len()
        ));
        let f = File::create(&log).expect("create stderr log");
        let mut cmd = stagefs();
        if let Some(hive) = &self.args.hive {
            cmd.env("STAGEFS_METASTORE_PASSWORD", &hive.password);
        }
        let child = cmd
            .args(self.args.args())
            .envs(self.args.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("spawn stagefs");
        self.logs.push(log);
        self.child = Some(child);
        self.exit = None;
    }

    pub fn args(&self) -> &DaemonArgs {
        &self.args
    }

    pub fn mnt(&self) -> &Path {
        &self.args.mnt
    }

    /// `MOUNT/rel`.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.args.mnt.join(rel)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("daemon running").id() as i32
    }

    /// The stderr of the current (or last) run.
    pub fn stderr(&self) -> String {
        self.logs
            .last()
            .and_then(|p| fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Every run's stderr, the newest last (for diagnostics).
    pub fn all_stderr(&self) -> String {
        let mut out = String::new();
        for (i, p) in self.logs.iter().enumerate() {
            let text = fs::read_to_string(p).unwrap_or_default();
            let tail = if text.len() > 6000 {
                let mut start = text.len() - 6000;
                while !text.is_char_boundary(start) {
                    start += 1;
                }
                &text[start..]
            } else {
                &text[..]
            };
            out.push_str(&format!("--- daemon run {i} stderr (tail) ---\n{tail}\n"));
        }
        out
    }

    /// Diagnostics for a failed wait: status (if readable) and stderr.
    pub fn diag(&self) -> String {
        let status = fs::read_to_string(self.join(".stagefs/status"))
            .unwrap_or_else(|e| format!("(status unreadable: {e})"));
        format!("status: {status}\n{}", self.all_stderr())
    }

    /// Exit status if the process has ended (reaps it).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                self.exit = Some(st);
            }
        }
        self.exit
    }

    pub fn is_running(&mut self) -> bool {
        self.try_exit();
        self.child.is_some()
    }

    /// Waits for the process to end.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until MOUNTPOINT is a mount point (and the status answers).
    pub fn wait_mounted(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            if mounted(&self.args.mnt) && fs::metadata(self.join(".stagefs/status")).is_ok() {
                return;
            }
            if let Some(st) = self.try_exit() {
                panic!(
                    "stagefs exited ({st}) before mounting\n{}",
                    self.all_stderr()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "stagefs did not mount within {WAIT:?}\n{}",
                    self.all_stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    fn signal_and_wait(&mut self, sig: i32) -> ExitStatus {
        self.signal(sig);
        match self.wait_exit(WAIT) {
            Some(st) => st,
            None => panic!(
                "stagefs did not exit within {WAIT:?} after signal {sig}\n{}",
                self.all_stderr()
            ),
        }
    }

    /// SIGTERM and wait for the exit.
    pub fn sigterm(&mut self) -> ExitStatus {
        self.signal_and_wait(libc::SIGTERM)
    }

    /// SIGINT and wait for the exit.
    pub fn sigint(&mut self) -> ExitStatus {
        self.signal_and_wait(libc::SIGINT)
    }

    /// `kill -9`: the FUSE mount is left dead (ENOTCONN) behind.
    pub fn kill9(&mut self) {
        self.signal_and_wait(libc::SIGKILL);
    }

    /// Runs the same command again and waits until it is mounted.
    pub fn restart(&mut self) {
        assert!(!self.is_running(), "restart of a running daemon");
        self.launch();
        self.wait_mounted();
    }

    /// Runs the same command again without waiting.
    pub fn respawn(&mut self) {
        assert!(!self.is_running(), "respawn of a running daemon");
        self.launch();
    }

    /// The status JSON read through the mount.
    pub fn status(&self) -> Value {
        let p = self.join(".stagefs/status");
        let text = fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("read {}: {e}\n{}", p.display(), self.all_stderr()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("status JSON: {e}\n{text}"))
    }

    fn try_status(&self) -> Option<Value> {
        let text = fs::read_to_string(self.join(".stagefs/status")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Polls the status until `pred` holds; returns that status.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_status_for(what, WAIT, pred)
    }

    pub fn wait_status_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        poll(
            what,
            timeout,
            || self.try_status().filter(|s| pred(s)),
            || self.diag(),
        )
    }

    /// Waits until the visible state is at least `id`.
    pub fn wait_visible(&self, id: u64) -> Value {
        self.wait_status(&format!("visible >= {id}"), |s| visible(s) >= id)
    }

    /// Waits until the visible state is at least `id`, and a GC pass has
    /// finished after that. (GC only runs when the catalog changed, and the
    /// pass that finishes may have started just before: to know that a
    /// pass saw a state, wait for its effect, e.g. a blob gone.)
    pub fn wait_visible_and_gc(&self, id: u64) -> Value {
        let s = self.wait_visible(id);
        let runs = gc_runs(&s);
        self.wait_status(&format!("a GC run after visible {id}"), |s| {
            gc_runs(s) > runs
        })
    }
}

pub fn visible(s: &Value) -> u64 {
    s["visible"].as_u64().expect("status.visible")
}

pub fn gc_runs(s: &Value) -> u64 {
    s["gc"]["runs"].as_u64().unwrap_or(0)
}

pub fn retained(s: &Value) -> Vec<u64> {
    s["retained"]
        .as_array()
        .expect("status.retained")
        .iter()
        .map(|v| v.as_u64().expect("retained id"))
        .collect()
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let mnt = self.args.mnt.clone();
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut done = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    done = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !done {
                eprintln!("stagefs ignored SIGTERM for 5 s; detaching and killing");
                detach(&mnt);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if mounted(&mnt) {
            detach(&mnt);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.all_stderr());
        }
    }
}

/// Sets a flag on drop (stops helper threads when a test panics).
pub struct StopOnDrop(pub Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Writes hand-made source files and events (`events/log-000001.jsonl`).
pub struct EventWriter {
    source: PathBuf,
    cm: PathBuf,
    log: PathBuf,
}

impl EventWriter {
    pub fn new(args: &DaemonArgs) -> EventWriter {
        EventWriter {
            source: args.source_root.clone(),
            cm: args.cm_root.clone().expect("cm root"),
            log: args.events.join("log-000001.jsonl"),
        }
    }

    /// Writes `bytes` at `source/rel` (whole, via rename); returns the
    /// event's file object.
    pub fn put_file(&self, rel: &str, bytes: &[u8]) -> Value {
        let p = self.source.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir source");
        let tmp = p.with_extension("tmp-writing");
        fs::write(&tmp, bytes).expect("write source file");
        fs::rename(&tmp, &p).expect("rename source file");
        json!({"path": rel, "size": bytes.len(), "sha256": sha256_hex(bytes)})
    }

    /// Moves `source/rel` (holding `bytes`) to change management, as Hive
    /// does before overwriting or dropping it.
    pub fn retire(&self, rel: &str, bytes: &[u8]) {
        let name = rel.rsplit('/').next().expect("name");
        let to = self.cm.join(format!("{name}_{}", sha256_hex(bytes)));
        fs::rename(self.source.join(rel), to).expect("retire to cm");
    }

    /// Appends one event line (a single write).
    pub fn append(&self, event: Value) {
        let mut line = serde_json::to_vec(&event).expect("event JSON");
        line.push(b'\n');
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        f.write_all(&line).expect("append event");
    }
}

/// sha256 hex of a whole file.
pub fn file_sha(path: &Path) -> String {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    sha256_hex(&buf)
}

/// Every file below `dir`: relative path → sha256 hex.
pub fn read_tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, rel: &str, out: &mut BTreeMap<String, String>) {
        let here = if rel.is_empty() {
            base.to_owned()
        } else {
            base.join(rel)
        };
        for e in fs::read_dir(&here).unwrap_or_else(|e| panic!("read_dir {}: {e}", here.display()))
        {
            let e = e.expect("dir entry");
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().expect("file type").is_dir() {
                walk(base, &r, out);
            } else {
                out.insert(r.clone(), file_sha(&base.join(&r)));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

/// A table read the way a careful reader does: open the directory once,
/// then read its `state_id` and every file through that handle, so a
/// commit in between cannot mix versions. Returns (state_id, content).
pub fn read_table(table: &Path) -> (u64, BTreeMap<String, String>) {
    use std::os::unix::io::AsRawFd;
    let dir = File::open(table).unwrap_or_else(|e| panic!("open {}: {e}", table.display()));
    let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let id = super::getxattr(&at, "user.stagefs.state_id")
        .unwrap_or_else(|e| panic!("state_id of {}: errno {e}", table.display()));
    let content = read_tree(&at);
    drop(dir);
    (id.parse().expect("decimal state_id"), content)
}

/// The oracle's table content in `read_tree` form.
pub fn expected_tree(content: &TableContent) -> BTreeMap<String, String> {
    content
        .iter()
        .map(|(k, v)| (k.clone(), v.to_hex()))
        .collect()
}

/// The id at which `db.table` last changed at or before `at`, per the
/// oracle (for tables never renamed into their name).
pub fn last_change(w: &Workload, db: &str, table: &str, at: u64) -> u64 {
    let target = w.expected_table(StateId(at), db, table).cloned();
    let mut last = at;
    for s in (0..at).rev() {
        if w.expected_table(StateId(s), db, table).cloned() == target {
            last = s;
        } else {
            break;
        }
    }
    last
}

/// Sum of the sizes of the staged blobs under `state/blobs` (not `tmp/`).
pub fn blob_store_bytes(state: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(state.join("blobs")).expect("blobs dir") {
        let e = e.expect("entry");
        if e.file_name() == "tmp" || !e.file_type().expect("type").is_dir() {
            continue;
        }
        for b in fs::read_dir(e.path()).expect("blob shard") {
            // GC may remove a listed blob before its stat: it no longer counts.
            match b.expect("blob").metadata() {
                Ok(m) => total += m.len(),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => panic!("blob metadata: {err}"),
            }
        }
    }
    total
}

/// Where the blob with sha256 `hex` is stored.
pub fn blob_path(state: &Path, hex: &str) -> PathBuf {
    state.join("blobs").join(&hex[..2]).join(hex)
}
