//! The consistency checker: readers that compare what a destination shows
//! with the source's real states, for the tests and the benchmarks.
//!
//! - [`Oracle`]: every table's content at every state-id of a [`Workload`],
//!   kept as a list of changes per table so readers can ask "which states
//!   had exactly this content?" cheaply. The workload's writer records into
//!   it after each step; readers share it through an `Arc`.
//! - [`run_readers`]: K reader threads, each repeatedly picking a table and
//!   observing it, against a stagefs mount ([`Target::Stagefs`]) or a plain
//!   directory kept by the naive copier ([`Target::Naive`]).
//! - [`NaiveCopier`]: replication by *state transfer*, the contrast: for each
//!   event it copies the partition's *current* source files.
//! - [`DaemonProcess`]: a `stagefs mount` child process that is always
//!   stopped and unmounted on drop, even when a test panics.
//!
//! ## What counts as an anomaly on a stagefs mount
//!
//! A reader reads the root's `user.stagefs.visible` (V0), opens
//! `MOUNT/db/t` as a directory, reads `user.stagefs.state_id` (s) from that
//! descriptor, reads `visible` again (V1), then walks and reads everything
//! relative to the descriptor (`/proc/self/fd/N/...`). The path walk
//! resolved the table against one visible state Vt with V0 ≤ Vt ≤ V1
//! (visible never goes back). The observation (relative path → sha256) is
//! correct when all of these hold:
//!
//! 1. `s ≤ V1` (no state from the future);
//! 2. the content equals the oracle's content of `db.t` at some state in
//!    `[V0, V1]` (only source states, and the newest complete one at the
//!    time of the walk);
//! 3. the state-id is honest: the oracle's `db.t` at `s` is exactly this
//!    content, or — for a table that got here by `rename_table`, which keeps
//!    its `state_id` (SEMANTICS.md) — `db.t` did not exist at `s` and first
//!    appeared after `s` with exactly this content;
//! 4. per reader and table, `s` never decreases.
//!
//! A table that cannot be opened (`ENOENT`) is a correct observation only
//! when the oracle has no `db.t` at some state in `[V0, V1]`, with V1 read
//! after the failed open. Any other error is an anomaly.
//!
//! ## ... and on the naive copier's directory
//!
//! There is no xattr: an observation's state is the newest event the copier
//! had processed when the reader opened the table (P). The observation is an
//! anomaly when its content equals *no* source state of the table at or
//! after the state of the previous observation of that table by the same
//! reader (a state that never existed, or a step back in time). Read
//! errors (a file deleted under the reader) are counted apart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use imbl::OrdMap;
use sha2::{Digest, Sha256};

use crate::catalog::{Node, Tree};
use crate::event::{escape_path_name, BlobId, Change, Event, Op, StateId};
use crate::workload::{Rng, TableContent, WarehouseContent, Workload};

// ---------------------------------------------------------------------------
// The oracle

/// One table's history: `(id, content from id on)`, `None` = absent.
type History = Vec<(StateId, Option<Arc<TableContent>>)>;

#[derive(Default)]
struct OracleInner {
    newest: StateId,
    last: WarehouseContent,
    tables: BTreeMap<String, History>,
}

/// The expected content of every table at every recorded state-id.
#[derive(Default)]
pub struct Oracle {
    inner: RwLock<OracleInner>,
}

fn same(a: &Option<Arc<TableContent>>, b: &Option<Arc<TableContent>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y) || x == y,
        _ => false,
    }
}

impl Oracle {
    pub fn new() -> Arc<Oracle> {
        Arc::new(Oracle::default())
    }

    /// Records every state of `w` after the newest recorded one. Call it
    /// after each `step` (the writer is the only caller).
    pub fn record(&self, w: &Workload) {
        let latest = w.latest();
        let mut g = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let mut id = g.newest.0 + 1;
        while id <= latest.0 {
            let Some(content) = w.expected(StateId(id)).cloned() else {
                id += 1;
                continue;
            };
            let inner = &mut *g;
            for (key, c) in content.iter() {
                let now = Some(Arc::clone(c));
                let h = inner.tables.entry(key.clone()).or_default();
                if !h.last().is_some_and(|(_, prev)| same(prev, &now)) {
                    h.push((StateId(id), now));
                }
            }
            for (key, h) in inner.tables.iter_mut() {
                if !content.contains_key(key) && h.last().is_some_and(|(_, c)| c.is_some()) {
                    h.push((StateId(id), None));
                }
            }
            inner.last = content;
            id += 1;
        }
        g.newest = g.newest.max(latest);
    }

    /// The newest recorded state-id.
    pub fn newest(&self) -> StateId {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).newest
    }

    /// Waits (up to `timeout`) until `state` is recorded; false on timeout.
    pub fn wait_for(&self, state: StateId, timeout: Duration) -> bool {
        let start = Instant::now();
        while self.newest() < state {
            if start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// `db.table`'s content at `state` (None: the table did not exist).
    pub fn table_at(&self, key: &str, state: StateId) -> Option<Arc<TableContent>> {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let h = g.tables.get(key)?;
        let i = h.partition_point(|(id, _)| *id <= state);
        if i == 0 {
            None
        } else {
            h[i - 1].1.clone()
        }
    }

    /// Every table name that ever existed, and those that existed at `state`.
    pub fn table_names(&self, state: StateId) -> (Vec<String>, Vec<String>) {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let all: Vec<String> = g.tables.keys().cloned().collect();
        let at = g
            .tables
            .iter()
            .filter(|(_, h)| {
                let i = h.partition_point(|(id, _)| *id <= state);
                i > 0 && h[i - 1].1.is_some()
            })
            .map(|(k, _)| k.clone())
            .collect();
        (all, at)
    }

    /// The tables at the newest recorded state.
    pub fn current(&self) -> WarehouseContent {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .clone()
    }

    /// True when `db.table` held `content` (None = was absent) at some
    /// state in `[from, to]` (`to` = None: any state from `from` on).
    pub fn held_in(
        &self,
        key: &str,
        content: Option<&TableContent>,
        from: StateId,
        to: Option<StateId>,
    ) -> bool {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let empty = Vec::new();
        let h = g.tables.get(key).unwrap_or(&empty);
        let matches = |c: &Option<Arc<TableContent>>| match (c, content) {
            (None, None) => true,
            (Some(c), Some(o)) => **c == *o,
            _ => false,
        };
        // Before the first entry the table did not exist.
        let first = h.first().map_or(StateId(u64::MAX), |(id, _)| *id);
        if content.is_none() && from < first {
            return true;
        }
        for (i, (id, c)) in h.iter().enumerate() {
            let end = h.get(i + 1).map(|(next, _)| StateId(next.0 - 1));
            let starts_in_time = to.is_none_or(|to| *id <= to);
            let ends_after = end.is_none_or(|e| e >= from);
            if starts_in_time && ends_after && matches(c) {
                return true;
            }
        }
        false
    }

    /// True when every partition (first path level) of `content` equals
    /// that partition of `db.table` at some state from `from` on, each at
    /// its own state: the content is a mix of real partition states.
    pub fn partitions_each_held(&self, key: &str, content: &TableContent, from: StateId) -> bool {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(h) = g.tables.get(key) else {
            return false;
        };
        let part = |c: &TableContent, p: &str| -> Vec<(String, BlobId)> {
            c.iter()
                .filter(|(k, _)| k.split('/').next() == Some(p))
                .map(|(k, v)| (k.clone(), *v))
                .collect()
        };
        let parts: HashSet<&str> = content.keys().filter_map(|k| k.split('/').next()).collect();
        parts.iter().all(|p| {
            let want = part(content, p);
            h.iter().enumerate().any(|(i, (_, c))| {
                let ends_after = h.get(i + 1).is_none_or(|(next, _)| next.0 > from.0);
                ends_after && c.as_ref().is_some_and(|c| part(c, p) == want)
            })
        })
    }

    /// Check 3 of the module docs: the content at `s` is `content`, or the
    /// table was absent at `s` and first appeared after it with `content`.
    pub fn honest_state_id(&self, key: &str, s: StateId, content: &TableContent) -> bool {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(h) = g.tables.get(key) else {
            return false;
        };
        let i = h.partition_point(|(id, _)| *id <= s);
        let at_s = if i == 0 { None } else { h[i - 1].1.as_ref() };
        match at_s {
            Some(c) => **c == *content,
            None => h
                .get(i)
                .and_then(|(_, c)| c.as_ref())
                .is_some_and(|c| **c == *content),
        }
    }
}

// ---------------------------------------------------------------------------
// Observations

/// `fgetxattr(fd, name)` as a string.
pub fn fgetxattr_string(file: &File, name: &str) -> io::Result<String> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of
    // `len` writable bytes.
    xattr_string(|buf, len| unsafe { libc::fgetxattr(file.as_raw_fd(), cname.as_ptr(), buf, len) })
}

/// `getxattr(path, name)` as a string.
pub fn getxattr_string(path: &Path, name: &str) -> io::Result<String> {
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let cname = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: NUL-terminated strings and a buffer of `len` writable bytes.
    xattr_string(|buf, len| unsafe { libc::getxattr(cpath.as_ptr(), cname.as_ptr(), buf, len) })
}

/// Runs one xattr read into a 256-byte buffer and decodes the value.
fn xattr_string(read: impl FnOnce(*mut libc::c_void, usize) -> isize) -> io::Result<String> {
    let mut buf = vec![0u8; 256];
    let rc = read(buf.as_mut_ptr().cast(), buf.len());
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    String::from_utf8(buf).map_err(io::Error::other)
}

fn parse_id(s: &str) -> io::Result<StateId> {
    s.trim()
        .parse::<u64>()
        .map(StateId)
        .map_err(|e| io::Error::other(format!("not a state-id {s:?}: {e}")))
}

/// The root's `user.stagefs.visible`.
pub fn visible(mount: &Path) -> io::Result<StateId> {
    parse_id(&getxattr_string(mount, "user.stagefs.visible")?)
}

/// Every file below `dir` (relative path → sha256 of its bytes).
pub fn read_tree(dir: &Path) -> io::Result<TableContent> {
    let mut out = OrdMap::new();
    walk(dir, "", &mut out)?;
    Ok(out)
}

fn walk(base: &Path, rel: &str, out: &mut TableContent) -> io::Result<()> {
    let dir = if rel.is_empty() {
        base.to_owned()
    } else {
        base.join(rel)
    };
    for entry in fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let ft = entry.file_type()?;
        if ft.is_dir() {
            walk(base, &child, out)?;
        } else {
            let bytes = fs::read(base.join(&child))?;
            out.insert(child, BlobId(Sha256::digest(&bytes).into()));
        }
    }
    Ok(())
}

/// One table of a stagefs mount, read through one directory descriptor.
#[derive(Debug)]
pub struct TableObservation {
    /// `user.stagefs.state_id` of the table directory.
    pub state_id: StateId,
    pub content: TableContent,
}

/// Opens `MOUNT/db/t`, reads its `state_id` and everything below it
/// relative to the descriptor. `Err` with `NotFound` when there is no
/// such table.
pub fn observe_stagefs_table(mount: &Path, key: &str) -> io::Result<TableObservation> {
    let (db, t) = key.split_once('.').unwrap_or((key, ""));
    let dir = File::open(mount.join(db).join(t))?;
    let state_id = parse_id(&fgetxattr_string(&dir, "user.stagefs.state_id")?)?;
    let base = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let content = read_tree(&base)?;
    drop(dir);
    Ok(TableObservation { state_id, content })
}

/// Checks one table of a stagefs mount against the oracle (checks 1–3 of
/// the module docs), reading `visible` around the open. `Ok(Some(s))`: a
/// correct observation at `s`; `Ok(None)`: correctly absent.
pub fn check_stagefs_table(
    oracle: &Oracle,
    mount: &Path,
    key: &str,
) -> Result<Option<StateId>, String> {
    let v0 = visible(mount).map_err(|e| format!("reading visible: {e}"))?;
    let obs = observe_stagefs_table(mount, key);
    let v1 = visible(mount).map_err(|e| format!("reading visible: {e}"))?;
    if !oracle.wait_for(v1, Duration::from_secs(10)) {
        return Err(format!("visible {v1} is beyond the oracle's newest state"));
    }
    match obs {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if oracle.held_in(key, None, v0, Some(v1)) {
                Ok(None)
            } else {
                Err(format!(
                    "{key}: ENOENT but it existed in every state of [{v0}, {v1}]"
                ))
            }
        }
        Err(e) => Err(format!("{key}: read error: {e}")),
        Ok(o) => {
            let s = o.state_id;
            if s > v1 {
                return Err(format!("{key}: state_id {s} is newer than visible {v1}"));
            }
            if !oracle.held_in(key, Some(&o.content), v0, Some(v1)) {
                return Err(format!(
                    "{key}: content ({} files, state_id {s}) equals no source state in [{v0}, {v1}]{}",
                    o.content.len(),
                    describe_diff(oracle.table_at(key, s).as_deref(), &o.content)
                ));
            }
            if !oracle.honest_state_id(key, s, &o.content) {
                return Err(format!(
                    "{key}: content is a source state of [{v0}, {v1}] but not the one at its state_id {s}{}",
                    describe_diff(oracle.table_at(key, s).as_deref(), &o.content)
                ));
            }
            Ok(Some(s))
        }
    }
}

fn describe_diff(expected: Option<&TableContent>, got: &TableContent) -> String {
    let Some(exp) = expected else {
        return "; the oracle has no such table at its state_id".to_owned();
    };
    let missing: Vec<&String> = exp.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !exp.contains_key(*k)).collect();
    let differ: Vec<&String> = got
        .iter()
        .filter(|(k, v)| exp.get(*k).is_some_and(|e| e != *v))
        .map(|(k, _)| k)
        .collect();
    format!("; vs the oracle at state_id: missing {missing:?}, extra {extra:?}, different bytes {differ:?}")
}

// ---------------------------------------------------------------------------
// Readers

/// What the readers look at.
#[derive(Clone)]
pub enum Target {
    /// A stagefs mount point.
    Stagefs { mount: PathBuf },
    /// The naive copier's destination and its processed-event counter.
    Naive {
        dest: PathBuf,
        processed: Arc<AtomicU64>,
    },
}

#[derive(Debug, Clone)]
pub struct CheckConfig {
    pub readers: usize,
    /// Stop once this many observations were made (and `min_duration` passed)...
    pub target_observations: u64,
    pub min_duration: Duration,
    /// ... or at the latest after this long.
    pub max_duration: Duration,
    /// Before stopping at the target, also have seen this many distinct
    /// state-ids (a loaded machine commits fewer states per second: the
    /// run goes on, up to `max_duration`, until enough commits happened
    /// under the readers for the check to mean something).
    pub min_distinct_ids: usize,
    pub seed: u64,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            readers: 8,
            target_observations: 10_000,
            min_duration: Duration::from_secs(3),
            max_duration: Duration::from_secs(30),
            min_distinct_ids: 0,
            seed: 7,
        }
    }
}

/// One reader's range of ids (the state-ids it was shown).
#[derive(Debug, Clone, Default)]
pub struct ReaderStats {
    pub observations: u64,
    pub min_id: Option<StateId>,
    pub max_id: Option<StateId>,
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub observations: u64,
    /// Observations of a table that was (correctly or not) absent.
    pub absent: u64,
    pub anomalies: u64,
    /// Naive copier only: reads that failed (a file deleted under the reader).
    pub read_errors: u64,
    /// Naive copier only: anomalies whose every partition is a real source
    /// state of that partition, but whose combination never existed (the
    /// rubberbanding of SPEC §1).
    pub mixed_states: u64,
    /// The first few anomalies, described.
    pub first_anomalies: Vec<String>,
    pub readers: Vec<ReaderStats>,
    /// Distinct table state-ids observed (stagefs) or processed ids (naive).
    pub distinct_ids: usize,
    /// Lowest and highest visible (or processed) id seen around the reads.
    pub first_visible: Option<StateId>,
    pub last_visible: Option<StateId>,
    pub elapsed: Duration,
}

impl Report {
    pub fn anomaly_rate(&self) -> f64 {
        self.anomalies as f64 / self.observations.max(1) as f64
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} observations ({} absent) in {:.1} s, {} anomalies ({:.2}%; {} mixed partition states), {} read errors, {} distinct ids, visible {:?}..{:?}",
            self.observations,
            self.absent,
            self.elapsed.as_secs_f64(),
            self.anomalies,
            100.0 * self.anomaly_rate(),
            self.mixed_states,
            self.read_errors,
            self.distinct_ids,
            self.first_visible.map(|s| s.0),
            self.last_visible.map(|s| s.0),
        );
        for (i, r) in self.readers.iter().enumerate() {
            s.push_str(&format!(
                "\n  reader {i}: {} observations, ids {:?}..{:?}",
                r.observations,
                r.min_id.map(|s| s.0),
                r.max_id.map(|s| s.0)
            ));
        }
        for a in &self.first_anomalies {
            s.push_str(&format!("\n  anomaly: {a}"));
        }
        s
    }
}

const KEEP_ANOMALIES: usize = 5;

struct Shared {
    observations: AtomicU64,
    stop: AtomicBool,
    report: Mutex<Report>,
    ids: Mutex<HashSet<u64>>,
}

impl Shared {
    /// Records an anomaly; keeps the first few, one per table.
    fn anomaly(&self, what: String) {
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner());
        r.anomalies += 1;
        let table = what.split(':').next().unwrap_or("").to_owned();
        if r.first_anomalies.len() < KEEP_ANOMALIES
            && !r
                .first_anomalies
                .iter()
                .any(|a| a.split(':').next() == Some(&table))
        {
            r.first_anomalies.push(what);
        }
    }
}

/// Runs `cfg.readers` reader threads against `target` until enough
/// observations were made (or the time is up, or `stop` is set), and
/// reports. The oracle must keep being recorded meanwhile.
pub fn run_readers(
    target: &Target,
    oracle: &Arc<Oracle>,
    cfg: &CheckConfig,
    stop: &AtomicBool,
) -> Report {
    let shared = Arc::new(Shared {
        observations: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        report: Mutex::new(Report::default()),
        ids: Mutex::new(HashSet::new()),
    });
    let start = Instant::now();
    let handles: Vec<JoinHandle<ReaderStats>> = (0..cfg.readers)
        .map(|i| {
            let (target, oracle, shared) =
                (target.clone(), Arc::clone(oracle), Arc::clone(&shared));
            let seed = cfg.seed.wrapping_mul(1000).wrapping_add(i as u64);
            std::thread::spawn(move || reader(&target, &oracle, &shared, seed))
        })
        .collect();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let n = shared.observations.load(Ordering::Relaxed);
        let t = start.elapsed();
        let enough_ids =
            || shared.ids.lock().unwrap_or_else(|p| p.into_inner()).len() >= cfg.min_distinct_ids;
        if (n >= cfg.target_observations && t >= cfg.min_duration && enough_ids())
            || t >= cfg.max_duration
            || stop.load(Ordering::Relaxed)
        {
            break;
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    let stats: Vec<ReaderStats> = handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| {
                shared.anomaly("a reader thread panicked".to_owned());
                ReaderStats::default()
            })
        })
        .collect();
    let mut report = shared
        .report
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    report.observations = shared.observations.load(Ordering::Relaxed);
    report.distinct_ids = shared.ids.lock().unwrap_or_else(|p| p.into_inner()).len();
    report.readers = stats;
    report.elapsed = start.elapsed();
    report
}

/// Mostly tables that exist at `state` (the destination's current state);
/// sometimes any name ever used (dropped, renamed, not yet created), to
/// check absence.
fn pick_table(oracle: &Oracle, state: StateId, rng: &mut Rng) -> Option<String> {
    let (all, now) = oracle.table_names(state);
    let from = if !now.is_empty() && rng.below(100) < 85 {
        now
    } else {
        all
    };
    if from.is_empty() {
        None
    } else {
        Some(from[rng.below(from.len())].clone())
    }
}

fn reader(target: &Target, oracle: &Oracle, shared: &Shared, seed: u64) -> ReaderStats {
    let mut rng = Rng::new(seed);
    let mut stats = ReaderStats::default();
    // Per table: the last state-id seen (stagefs) or the state of the
    // previous observation (naive).
    let mut last: HashMap<String, StateId> = HashMap::new();
    let mut ids = HashSet::new();
    let mut vis = (None::<StateId>, None::<StateId>);
    while !shared.stop.load(Ordering::Relaxed) {
        let state = match target {
            Target::Stagefs { mount } => visible(mount).unwrap_or_default(),
            Target::Naive { processed, .. } => StateId(processed.load(Ordering::SeqCst)),
        };
        let Some(key) = pick_table(oracle, state, &mut rng) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let seen = match target {
            Target::Stagefs { mount } => observe_stagefs(oracle, mount, &key, &mut last, shared),
            Target::Naive { dest, processed } => {
                observe_naive(oracle, dest, processed, &key, &mut last, shared)
            }
        };
        let Some((id, v)) = seen else { continue };
        if let Some(id) = id {
            // Shared as soon as seen: the run's end may wait for enough.
            if ids.insert(id.0) {
                shared
                    .ids
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.0);
            }
            stats.min_id = Some(stats.min_id.map_or(id, |m| m.min(id)));
            stats.max_id = Some(stats.max_id.map_or(id, |m| m.max(id)));
        }
        vis.0 = Some(vis.0.map_or(v, |m: StateId| m.min(v)));
        vis.1 = Some(vis.1.map_or(v, |m: StateId| m.max(v)));
        stats.observations += 1;
        shared.observations.fetch_add(1, Ordering::Relaxed);
    }
    let mut r = shared.report.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = vis.0 {
        r.first_visible = Some(r.first_visible.map_or(v, |m| m.min(v)));
    }
    if let Some(v) = vis.1 {
        r.last_visible = Some(r.last_visible.map_or(v, |m| m.max(v)));
    }
    stats
}

/// One stagefs observation: `(table state-id if present, V0)`, or None when
/// the observation could not be made (counted as an anomaly).
fn observe_stagefs(
    oracle: &Oracle,
    mount: &Path,
    key: &str,
    last: &mut HashMap<String, StateId>,
    shared: &Shared,
) -> Option<(Option<StateId>, StateId)> {
    let v0 = match visible(mount) {
        Ok(v) => v,
        Err(e) => {
            shared.anomaly(format!("reading visible: {e}"));
            std::thread::sleep(Duration::from_millis(10));
            return None;
        }
    };
    let result = check_stagefs_table(oracle, mount, key);
    match result {
        Ok(Some(s)) => {
            if let Some(prev) = last.get(key) {
                if s < *prev {
                    shared.anomaly(format!("{key}: state_id went back from {prev} to {s}"));
                }
            }
            last.insert(key.to_owned(), s);
            Some((Some(s), v0))
        }
        Ok(None) => {
            shared
                .report
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .absent += 1;
            Some((None, v0))
        }
        Err(e) => {
            shared.anomaly(e);
            Some((None, v0))
        }
    }
}

/// One naive-copier observation: `(processed id, processed id)`.
fn observe_naive(
    oracle: &Oracle,
    dest: &Path,
    processed: &AtomicU64,
    key: &str,
    last: &mut HashMap<String, StateId>,
    shared: &Shared,
) -> Option<(Option<StateId>, StateId)> {
    let p = StateId(processed.load(Ordering::SeqCst));
    let (db, t) = key.split_once('.').unwrap_or((key, ""));
    let dir = dest.join(db).join(t);
    let content = if dir.is_dir() {
        match read_tree(&dir) {
            Ok(c) => Some(c),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.is_dir() => None,
            Err(_) => {
                shared
                    .report
                    .lock()
                    .unwrap_or_else(|q| q.into_inner())
                    .read_errors += 1;
                return None;
            }
        }
    } else {
        None
    };
    if content.is_none() {
        shared
            .report
            .lock()
            .unwrap_or_else(|q| q.into_inner())
            .absent += 1;
    }
    let prev = last.get(key).copied().unwrap_or(StateId(0));
    oracle.wait_for(p, Duration::from_secs(10));
    if !oracle.held_in(key, content.as_ref(), prev, None) {
        let mixed = content
            .as_ref()
            .is_some_and(|c| !c.is_empty() && oracle.partitions_each_held(key, c, prev));
        if mixed {
            shared
                .report
                .lock()
                .unwrap_or_else(|q| q.into_inner())
                .mixed_states += 1;
        }
        shared.anomaly(format!(
            "{key}: content ({} files{}) after processing {p} equals no source state at or after {prev}",
            content.as_ref().map_or(0, |c| c.len()),
            if mixed {
                ", each partition a real state: a mix that never existed"
            } else {
                ""
            }
        ));
    }
    last.insert(key.to_owned(), p);
    Some((Some(p), p))
}

// ---------------------------------------------------------------------------
// The naive state-transfer copier

/// Replication by state transfer: for each event of the log, in order, with
/// a delay like a real copier, it copies the partition's *current* source
/// files (as the source's metadata lists them now, not the event's files)
/// into `DEST/db/t/p=...`, and deletes on drops.
pub struct NaiveCopier {
    processed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<u64>>>,
}

impl NaiveCopier {
    pub fn start(
        source_root: &Path,
        events_dir: &Path,
        cm_root: &Path,
        dest: &Path,
        delay: Duration,
    ) -> NaiveCopier {
        let processed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = Copier {
            source_root: source_root.to_owned(),
            events_dir: events_dir.to_owned(),
            cm_root: cm_root.to_owned(),
            dest: dest.to_owned(),
            delay,
            head: Tree::empty(),
            queue: Vec::new(),
            files: BTreeMap::new(),
        };
        let (p, s) = (Arc::clone(&processed), Arc::clone(&stop));
        let thread = std::thread::spawn(move || c.run(&p, &s));
        NaiveCopier {
            processed,
            stop,
            thread: Some(thread),
        }
    }

    /// The newest event processed so far.
    pub fn processed(&self) -> &Arc<AtomicU64> {
        &self.processed
    }

    /// Stops and returns the number of events processed.
    pub fn stop(mut self) -> io::Result<u64> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("the copier panicked")),
            None => Ok(0),
        }
    }
}

impl Drop for NaiveCopier {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Copier {
    source_root: PathBuf,
    events_dir: PathBuf,
    cm_root: PathBuf,
    dest: PathBuf,
    delay: Duration,
    /// The source's metadata *now*: every event read so far applied.
    head: Tree,
    /// Events read and not processed yet.
    queue: Vec<Event>,
    /// Log file → bytes consumed.
    files: BTreeMap<String, u64>,
}

impl Copier {
    fn run(&mut self, processed: &AtomicU64, stop: &AtomicBool) -> io::Result<u64> {
        fs::create_dir_all(&self.dest)?;
        let mut n = 0;
        let mut next = 0;
        while !stop.load(Ordering::Relaxed) {
            self.read_log()?;
            if next >= self.queue.len() {
                self.queue.clear();
                next = 0;
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            let event = self.queue[next].clone();
            next += 1;
            self.process(&event)?;
            processed.store(event.id.0, Ordering::SeqCst);
            n += 1;
            std::thread::sleep(self.delay);
        }
        Ok(n)
    }

    /// Reads new complete lines of the log: applies them to `head` and
    /// queues them.
    fn read_log(&mut self) -> io::Result<()> {
        let mut names: Vec<String> = fs::read_dir(&self.events_dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".jsonl"))
            .collect();
        names.sort();
        for name in names {
            let done = self.files.get(&name).copied().unwrap_or(0);
            let bytes = fs::read(self.events_dir.join(&name))?;
            let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            let end = end as u64 + 1;
            if end <= done {
                continue;
            }
            for line in bytes[done as usize..end as usize].split(|b| *b == b'\n') {
                if line.is_empty() {
                    continue;
                }
                let Ok(event) = Event::parse_line(line) else {
                    continue;
                };
                if let Ok((tree, _)) = self.head.apply(&event) {
                    self.head = tree;
                    self.queue.push(event);
                }
            }
            self.files.insert(name, end);
        }
        Ok(())
    }

    fn process(&self, e: &Event) -> io::Result<()> {
        e.changes.iter().try_for_each(|c| self.process_change(c))
    }

    fn process_change(&self, e: &Change) -> io::Result<()> {
        let table_dir = self.dest.join(&e.db).join(&e.table);
        match e.op {
            Op::CreateDatabase => fs::create_dir_all(self.dest.join(&e.db)),
            Op::DropDatabase => remove_all(&self.dest.join(&e.db)),
            Op::CreateTable => fs::create_dir_all(&table_dir),
            Op::DropTable => remove_all(&table_dir),
            Op::RenameTable => {
                let to = self.dest.join(&e.new_db).join(&e.new_table);
                fs::create_dir_all(self.dest.join(&e.new_db))?;
                match fs::rename(&table_dir, &to) {
                    Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                    other => other,
                }
            }
            Op::Noop | Op::MarkTable => Ok(()),
            Op::AddPartition
            | Op::DropPartition
            | Op::AddFiles
            | Op::ReplaceFiles
            | Op::TruncateTable => self.copy_partition(e),
            Op::RenamePartition => {
                // Both partitions become what the source has now.
                self.copy_partition(e)?;
                let mut to = e.clone();
                to.partition = e.new_partition.clone();
                self.copy_partition(&to)
            }
        }
    }

    /// Makes `DEST/db/t/<partition>` equal to the partition's files at the
    /// source *now*.
    fn copy_partition(&self, e: &Change) -> io::Result<()> {
        let levels: Vec<String> = e
            .partition
            .iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", escape_path_name(v)))
            .collect();
        let mut dest = self.dest.join(&e.db).join(&e.table);
        for l in &levels {
            dest.push(l);
        }
        let mut node = self
            .head
            .table(&e.db, &e.table)
            .map(|t| Node::Dir(Arc::clone(t)));
        for l in &levels {
            node = node.and_then(|n| n.as_dir().and_then(|d| d.child(l)).cloned());
        }
        let Some(Node::Dir(part)) = node else {
            return remove_all(&dest);
        };
        fs::create_dir_all(&dest)?;
        let mut keep = HashSet::new();
        for (name, child) in part.children.iter() {
            let Node::File(f) = child else { continue };
            keep.insert(name.to_string());
            let from = self.source_root.join(&*f.source);
            let base = f.source.rsplit('/').next().unwrap_or(&f.source);
            let cm = self.cm_root.join(format!("{base}_{}", f.blob().to_hex()));
            let bytes = match fs::read(&from).or_else(|_| fs::read(&cm)) {
                Ok(b) => b,
                Err(_) => continue, // gone meanwhile: a naive copier skips it
            };
            let tmp = dest.join(format!(".{name}.copying"));
            fs::write(&tmp, &bytes)?;
            fs::rename(&tmp, dest.join(&**name))?;
        }
        for entry in fs::read_dir(&dest)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep.contains(&name) && entry.file_type()?.is_file() {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}

fn remove_all(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

// ---------------------------------------------------------------------------
// A daemon process that is always cleaned up

/// The `stagefs mount` flags (after the mountpoint) for a state folder and a
/// source warehouse: `--state`, `--source-root`, `--events`, `--cm-root` and,
/// when given, `--retain`.
pub fn mount_flags(
    state: &Path,
    source_root: &Path,
    events: &Path,
    cm_root: &Path,
    retain: Option<usize>,
) -> Vec<std::ffi::OsString> {
    let mut flags: Vec<std::ffi::OsString> = vec![
        "--state".into(),
        state.into(),
        "--source-root".into(),
        source_root.into(),
        "--events".into(),
        events.into(),
        "--cm-root".into(),
        cm_root.into(),
    ];
    if let Some(n) = retain {
        flags.push("--retain".into());
        flags.push(n.to_string().into());
    }
    flags
}

/// A `stagefs mount` child process. Dropping it sends SIGTERM, waits a
/// little, then detaches the mount and SIGKILLs whatever is left.
pub struct DaemonProcess {
    child: Option<Child>,
    mountpoint: PathBuf,
    log: PathBuf,
}

/// `umount2(path, MNT_DETACH)`, ignoring errors.
pub fn detach(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// True when `path` is listed as a mount point in /proc/self/mountinfo.
pub fn is_mounted(path: &Path) -> bool {
    crate::daemon::is_mount_point(path)
}

impl DaemonProcess {
    /// Starts `bin mount MNT args...`, logging to `log` (appended), and
    /// waits up to `timeout` for the mount to appear.
    pub fn start(
        bin: &Path,
        mountpoint: &Path,
        args: &[&std::ffi::OsStr],
        log: &Path,
        timeout: Duration,
    ) -> io::Result<DaemonProcess> {
        let filter = std::env::var("STAGEFS_LOG").unwrap_or_else(|_| "warn".into());
        Self::start_with_log_filter(bin, mountpoint, args, log, &filter, timeout)
    }

    /// [`DaemonProcess::start`] with `STAGEFS_LOG=filter` for the daemon.
    pub fn start_with_log_filter(
        bin: &Path,
        mountpoint: &Path,
        args: &[&std::ffi::OsStr],
        log: &Path,
        filter: &str,
        timeout: Duration,
    ) -> io::Result<DaemonProcess> {
        Self::start_with_env(bin, mountpoint, args, log, filter, &[], timeout)
    }

    /// [`DaemonProcess::start_with_log_filter`] with `env` added to the
    /// daemon's environment (e.g. `STAGEFS_NO_OPEN=1`).
    pub fn start_with_env(
        bin: &Path,
        mountpoint: &Path,
        args: &[&std::ffi::OsStr],
        log: &Path,
        filter: &str,
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> io::Result<DaemonProcess> {
        let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = Command::new(bin)
            .arg("mount")
            .arg(mountpoint)
            .args(args)
            .envs(env.iter().copied())
            .env("STAGEFS_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        let mut d = DaemonProcess {
            child: Some(child),
            mountpoint: mountpoint.to_owned(),
            log: log.to_owned(),
        };
        let start = Instant::now();
        while !is_mounted(mountpoint) {
            if let Some(c) = d.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    d.child = None;
                    return Err(io::Error::other(format!(
                        "the daemon exited with {status} before mounting; log: {}",
                        fs::read_to_string(log).unwrap_or_default()
                    )));
                }
            }
            if start.elapsed() > timeout {
                return Err(io::Error::other("the mount did not appear in time"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, reap, and lazily unmount the dead mount.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
        detach(&self.mountpoint);
    }

    /// SIGTERM and wait up to `timeout` for a clean exit; `Ok(true)` when it
    /// exited 0. Escalates to SIGKILL (and a detach) on timeout.
    pub fn terminate(&mut self, timeout: Duration) -> io::Result<bool> {
        let Some(mut c) = self.child.take() else {
            return Ok(false);
        };
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Some(status) = c.try_wait()? {
                if is_mounted(&self.mountpoint) {
                    detach(&self.mountpoint);
                }
                return Ok(status.success());
            }
            if start.elapsed() > timeout {
                // SAFETY: as above.
                unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
                let _ = c.wait();
                detach(&self.mountpoint);
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.terminate(Duration::from_secs(5));
        if is_mounted(&self.mountpoint) {
            detach(&self.mountpoint);
        }
    }
}

/// Parses the mount's `.stagefs/status`.
pub fn mount_status(mount: &Path) -> io::Result<crate::status::StatusReport> {
    let text = fs::read_to_string(mount.join(".stagefs/status"))?;
    serde_json::from_str(&text).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WorkloadConfig;

    /// The oracle's judgements on hand-made observations: a real state is
    /// accepted, a mix of two real states and a stale state are not.
    #[test]
    fn oracle_accepts_real_states_and_rejects_mixes() {
        let dir = tempfile::tempdir().unwrap();
        let oracle = Oracle::new();
        let mut w = Workload::new(
            dir.path(),
            WorkloadConfig {
                table_churn: false,
                tables_per_db: 1,
                partitions: 2,
                ..WorkloadConfig::default()
            },
        )
        .unwrap();
        let mut states = Vec::new();
        for _ in 0..60 {
            let id = w.step().unwrap();
            oracle.record(&w);
            states.push(id);
        }
        let key = "db0.t0";
        let latest = w.latest();
        let now = oracle.table_at(key, latest).unwrap();
        assert!(oracle.held_in(key, Some(&now), latest, Some(latest)));
        // Find two states whose partitions differ, and mix them.
        let mut found = false;
        'outer: for (i, a) in states.iter().enumerate() {
            for b in &states[i + 1..] {
                let (Some(ca), Some(cb)) = (oracle.table_at(key, *a), oracle.table_at(key, *b))
                else {
                    continue;
                };
                let pa = |c: &TableContent, p: &str| -> TableContent {
                    c.iter()
                        .filter(|(k, _)| k.starts_with(p))
                        .map(|(k, v)| (k.clone(), *v))
                        .collect()
                };
                let mix: TableContent = pa(&ca, "p=v0/").union(pa(&cb, "p=v1/"));
                let v0_differs = pa(&ca, "p=v0/") != pa(&cb, "p=v0/");
                let v1_differs = pa(&ca, "p=v1/") != pa(&cb, "p=v1/");
                if !(v0_differs && v1_differs) {
                    continue;
                }
                if oracle.held_in(key, Some(&mix), StateId(0), None) {
                    continue; // the mix happens to be a real state
                }
                assert!(oracle.partitions_each_held(key, &mix, StateId(0)));
                assert!(!oracle.honest_state_id(key, *b, &mix));
                found = true;
                break 'outer;
            }
        }
        assert!(found, "no mix could be built");
        // A stale state is not a state of a later window.
        let first = states
            .iter()
            .find_map(|s| oracle.table_at(key, *s).map(|c| (*s, c)))
            .unwrap();
        assert!(oracle.honest_state_id(key, first.0, &first.1) || first.1.is_empty());
        if *first.1 != *now {
            assert!(!oracle.held_in(key, Some(&first.1), latest, Some(latest)));
        }
        // Absence: before creation yes, now no.
        assert!(oracle.held_in(key, None, StateId(0), Some(StateId(0))));
        assert!(!oracle.held_in(key, None, latest, Some(latest)));
    }
}
