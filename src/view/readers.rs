//! Readers (SPEC §3 rule 8): who sent a request, and which whole-mount
//! state that reader's walks resolve in.
//!
//! A *reader* is a process, or every process of a `stagefs run` session.
//! The fuse adapter passes the request's pid, which is the calling
//! *thread*; [`ProcTable`] maps it to its process (`Tgid:` in
//! `/proc/<tid>/status`) and names the process by (pid, start time) —
//! `/proc/<pid>/stat` field 22 — so a reused pid is a different reader.
//! The mapping is cached and re-checked (one `stat` read) once per
//! [`RECHECK`].
//!
//! A process's *view* is one state: the tree every root- and
//! database-level name resolves in (below a table everything is an
//! immutable node, so nothing else depends on the reader). The rule for
//! when a view moves to the newest visible state ([`ViewRule`], documented
//! in docs/SEMANTICS.md "Readers"):
//! - a request after the process was quiet for `quiet_gap` takes the
//!   newest visible state (a new query starts fresh);
//! - once the view is `max_age` old, the first request after a pause of at
//!   least `poll_gap` moves it (a polling loop gets new states);
//! - a view older than `hard_age` moves at the first pause of `hard_gap`
//!   (a process that never pauses 40 ms still gets new states);
//! - reading the root's `user.stagefs.visible`, opening `.stagefs/status`
//!   or changing a pin moves it at once (read-your-check).
//!
//! A session's view never moves. Membership: a process belongs to the
//! session whose leader (the `stagefs run` process, which then executes
//! the command) is its nearest ancestor, found once per process by walking
//! the parent chain in `/proc` and cached. Sessions themselves are catalog
//! holds (durable, retained, see `Catalog::open_session`); this module
//! only recognises their members and ends sessions whose leader died.
//!
//! Requests that cannot be attributed (pid 0: the kernel could not map
//! the caller into the daemon's pid namespace; or no `/proc` entry) see
//! the newest visible state, as before views existed, and are counted.
//!
//! Called by [`super::View`] on every request that resolves a root- or
//! database-level name, and by the maintenance pass of the fuse adapter's
//! invalidation thread ([`Readers::maintain`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::catalog::{SessionHold, Snapshot, Tree};
use crate::event::StateId;

/// How often a cached thread → process mapping is re-checked against
/// pid reuse.
const RECHECK: Duration = Duration::from_secs(1);
/// Cached processes not seen for this long are forgotten.
const FORGET_PROC: Duration = Duration::from_secs(30);

/// When a process's view moves on (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct ViewRule {
    pub quiet_gap: Duration,
    pub poll_gap: Duration,
    pub max_age: Duration,
    pub hard_age: Duration,
    pub hard_gap: Duration,
}

impl Default for ViewRule {
    fn default() -> Self {
        // Measured (docs/SEMANTICS.md "Readers"): inside one query of
        // DuckDB, Python or `find`, the gaps between requests that reach
        // the daemon stay below ~5 ms on an idle machine and ~25 ms on a
        // loaded one; a 50 ms poller pauses 50 ms or more.
        ViewRule {
            quiet_gap: Duration::from_millis(250),
            poll_gap: Duration::from_millis(40),
            max_age: Duration::from_secs(2),
            hard_age: Duration::from_secs(10),
            hard_gap: Duration::from_millis(10),
        }
    }
}

/// A process, named so that a reused pid is a different one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcId {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
}

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy)]
struct Stat {
    ppid: u32,
    start: u64,
    /// Zombie or dead: the process has exited.
    exited: bool,
}

fn read_stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `/proc/<pid>/stat`; the command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    let state = *fields.first()?;
    Some(Stat {
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        exited: matches!(state, "Z" | "X" | "x"),
    })
}

fn read_tgid(tid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether `proc` is still running (not exited, pid not reused).
pub fn is_alive(proc: ProcId) -> bool {
    read_stat(proc.pid).is_some_and(|s| s.start == proc.start && !s.exited)
}

/// The process `pid` (a process id, not a thread id) now.
pub fn proc_of_pid(pid: u32) -> Option<ProcId> {
    let s = read_stat(pid)?;
    (!s.exited).then_some(ProcId {
        pid,
        start: s.start,
    })
}

struct CachedThread {
    thread_start: u64,
    proc: ProcId,
    checked: Instant,
}

/// Thread id → process, cached.
#[derive(Default)]
struct ProcTable {
    threads: Mutex<HashMap<u32, CachedThread>>,
}

impl ProcTable {
    fn identify(&self, tid: u32, now: Instant) -> Option<ProcId> {
        {
            let mut threads = lock(&self.threads);
            if let Some(c) = threads.get_mut(&tid) {
                if now.duration_since(c.checked) < RECHECK {
                    return Some(c.proc);
                }
                // Re-check against reuse with one read.
                if read_stat(tid).is_some_and(|s| s.start == c.thread_start) {
                    c.checked = now;
                    return Some(c.proc);
                }
                threads.remove(&tid);
            }
        }
        let thread = read_stat(tid)?;
        let tgid = if thread.exited { None } else { read_tgid(tid) }?;
        let start = if tgid == tid {
            thread.start
        } else {
            read_stat(tgid)?.start
        };
        let proc = ProcId { pid: tgid, start };
        lock(&self.threads).insert(
            tid,
            CachedThread {
                thread_start: thread.start,
                proc,
                checked: now,
            },
        );
        Some(proc)
    }

    fn forget_older(&self, now: Instant) {
        lock(&self.threads).retain(|_, c| now.duration_since(c.checked) < FORGET_PROC);
    }
}

/// One process's view.
#[derive(Clone)]
struct ReaderView {
    tree: Arc<Tree>,
    taken: Instant,
    last: Instant,
}

/// What the process belongs to, decided once per process.
#[derive(Clone)]
struct Membership {
    session: Option<String>,
    seen: Instant,
}

/// Per-reader views and session membership of one mount.
pub struct Readers {
    rule: ViewRule,
    /// False: every request sees the newest visible state (the behaviour
    /// before views; a test-only switch, `STAGEFS_VIEWS=off`).
    enabled: bool,
    procs: ProcTable,
    views: Mutex<HashMap<ProcId, ReaderView>>,
    members: Mutex<HashMap<ProcId, Membership>>,
    unattributed: AtomicU64,
    moves: AtomicU64,
    invalidations: AtomicU64,
}

/// The reader a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    Process(ProcId),
    /// pid 0 or not visible in our `/proc`.
    Unattributed,
}

/// Readers in use, for status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadersSummary {
    pub views: usize,
    pub oldest_view: Option<StateId>,
    pub unattributed_requests: u64,
    pub view_moves: u64,
    /// Table entries the adapter asked the kernel to drop.
    pub dentry_invalidations: u64,
}

impl Readers {
    pub fn new(rule: ViewRule, enabled: bool) -> Readers {
        Readers {
            rule,
            enabled,
            procs: ProcTable::default(),
            views: Mutex::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            unattributed: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
        }
    }

    /// Readers as configured by the environment: views on unless
    /// `STAGEFS_VIEWS=off` (tests use it to show what views prevent).
    pub fn from_env() -> Readers {
        let off = std::env::var("STAGEFS_VIEWS").is_ok_and(|v| v == "off" || v == "0");
        Readers::new(ViewRule::default(), !off)
    }

    pub fn identify(&self, pid: u32) -> Reader {
        let found = if pid == 0 {
            None
        } else {
            self.procs.identify(pid, Instant::now())
        };
        match found {
            Some(p) => Reader::Process(p),
            None => {
                self.unattributed.fetch_add(1, Ordering::Relaxed);
                Reader::Unattributed
            }
        }
    }

    /// The tree `reader`'s root- and database-level names resolve in:
    /// its session's state, else its view (moved by the rule), else (not
    /// attributable, or views off) the newest visible state.
    pub fn tree_for(&self, reader: Reader, snap: &Snapshot) -> Arc<Tree> {
        let Reader::Process(proc) = reader else {
            return Arc::clone(&snap.visible);
        };
        if !self.enabled {
            return Arc::clone(&snap.visible);
        }
        let now = Instant::now();
        if let Some(tree) = self.session_tree(proc, snap, now) {
            return tree;
        }
        let mut views = lock(&self.views);
        match views.get_mut(&proc) {
            Some(v) if !self.moves_on(v, now) => {
                v.last = now;
                Arc::clone(&v.tree)
            }
            Some(v) => {
                if v.tree.state_id != snap.visible.state_id {
                    self.moves.fetch_add(1, Ordering::Relaxed);
                }
                *v = ReaderView {
                    tree: Arc::clone(&snap.visible),
                    taken: now,
                    last: now,
                };
                Arc::clone(&v.tree)
            }
            None => {
                let tree = Arc::clone(&snap.visible);
                views.insert(
                    proc,
                    ReaderView {
                        tree: Arc::clone(&tree),
                        taken: now,
                        last: now,
                    },
                );
                tree
            }
        }
    }

    fn moves_on(&self, v: &ReaderView, now: Instant) -> bool {
        let idle = now.duration_since(v.last);
        let age = now.duration_since(v.taken);
        idle >= self.rule.quiet_gap
            || (age >= self.rule.max_age && idle >= self.rule.poll_gap)
            || (age >= self.rule.hard_age && idle >= self.rule.hard_gap)
    }

    /// Read-your-check: `reader` just learnt that `snap.visible` is
    /// visible; its view moves there now (a session's never moves).
    pub fn checked(&self, reader: Reader, snap: &Snapshot) {
        let Reader::Process(proc) = reader else {
            return;
        };
        if !self.enabled || self.session_of(proc, snap, Instant::now()).is_some() {
            return;
        }
        let now = Instant::now();
        let mut views = lock(&self.views);
        let old = views.insert(
            proc,
            ReaderView {
                tree: Arc::clone(&snap.visible),
                taken: now,
                last: now,
            },
        );
        if old.is_some_and(|v| v.tree.state_id != snap.visible.state_id) {
            self.moves.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The session `proc` belongs to (by id), if any.
    pub fn session_of(&self, proc: ProcId, snap: &Snapshot, now: Instant) -> Option<String> {
        if snap.pins.sessions.is_empty() {
            return None;
        }
        let mut members = lock(&self.members);
        if let Some(m) = members.get_mut(&proc) {
            m.seen = now;
            return m
                .session
                .clone()
                .filter(|id| snap.pins.sessions.contains_key(id));
        }
        let session = find_session(proc, &snap.pins.sessions);
        members.insert(
            proc,
            Membership {
                session: session.clone(),
                seen: now,
            },
        );
        session
    }

    fn session_tree(&self, proc: ProcId, snap: &Snapshot, now: Instant) -> Option<Arc<Tree>> {
        let id = self.session_of(proc, snap, now)?;
        let hold = snap.pins.sessions.get(&id)?;
        snap.versions.get(&hold.state).cloned()
    }

    /// `proc` leads session `id` from now on (it just registered it).
    pub fn joined(&self, proc: ProcId, id: &str) {
        lock(&self.members).insert(
            proc,
            Membership {
                session: Some(id.to_owned()),
                seen: Instant::now(),
            },
        );
    }

    /// `proc` leaves whatever session it was in (`setfattr -x
    /// user.stagefs.session`); its view starts afresh.
    pub fn left(&self, proc: ProcId) {
        lock(&self.members).insert(
            proc,
            Membership {
                session: None,
                seen: Instant::now(),
            },
        );
        lock(&self.views).remove(&proc);
    }

    /// Periodic upkeep: forgets idle views (their next request would take
    /// a fresh one anyway) and stale caches; returns the sessions whose
    /// leader has exited, for the caller to close.
    pub fn maintain(&self, snap: &Snapshot) -> Vec<String> {
        let now = Instant::now();
        lock(&self.views).retain(|_, v| !self.moves_on(v, now));
        self.procs.forget_older(now);
        lock(&self.members).retain(|_, m| now.duration_since(m.seen) < FORGET_PROC);
        snap.pins
            .sessions
            .iter()
            .filter(|(_, h)| {
                !is_alive(ProcId {
                    pid: h.pid,
                    start: h.start,
                })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Trees that views hold: GC roots (their files stay readable).
    pub fn held_trees(&self) -> Vec<Arc<Tree>> {
        lock(&self.views)
            .values()
            .map(|v| Arc::clone(&v.tree))
            .collect()
    }

    /// The adapter invalidated one table entry (for status and benchmarks).
    pub fn count_invalidation(&self) {
        self.invalidations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn summary(&self) -> ReadersSummary {
        let now = Instant::now();
        let views = lock(&self.views);
        let live = views.values().filter(|v| !self.moves_on(v, now));
        let (mut n, mut oldest) = (0, None::<StateId>);
        for v in live {
            n += 1;
            oldest = Some(oldest.map_or(v.tree.state_id, |o| o.min(v.tree.state_id)));
        }
        ReadersSummary {
            views: n,
            oldest_view: oldest,
            unattributed_requests: self.unattributed.load(Ordering::Relaxed),
            view_moves: self.moves.load(Ordering::Relaxed),
            dentry_invalidations: self.invalidations.load(Ordering::Relaxed),
        }
    }
}

/// The working directories of every process we can see that lie under
/// `mount` (readlink of `/proc/<pid>/cwd`; processes of other users are
/// skipped when the daemon is not root).
pub fn cwds_under(mount: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_link(e.path().join("cwd")).ok())
        // An unhashed directory reads as "<path> (deleted)".
        .map(
            |p| match p.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
                Some(s) => PathBuf::from(s),
                None => p,
            },
        )
        .filter(|p| p.starts_with(mount))
        .collect()
}

/// The session whose leader is `proc` or its nearest ancestor.
fn find_session(
    proc: ProcId,
    sessions: &std::collections::BTreeMap<String, SessionHold>,
) -> Option<String> {
    let leader_of = |p: ProcId| {
        sessions
            .iter()
            .find(|(_, h)| h.pid == p.pid && h.start == p.start)
            .map(|(id, _)| id.clone())
    };
    let mut at = proc;
    // A parent chain is short; the bound only guards against a loop
    // through a pid reused while we walk.
    for _ in 0..128 {
        if let Some(id) = leader_of(at) {
            return Some(id);
        }
        let stat = read_stat(at.pid)?;
        if stat.ppid <= 1 {
            return None;
        }
        let parent = read_stat(stat.ppid)?;
        // A parent started after its child is a reused pid: the real
        // parent is gone.
        if parent.start > at.start {
            return None;
        }
        at = ProcId {
            pid: stat.ppid,
            start: parent.start,
        };
    }
    None
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single map operation; a panic elsewhere cannot
    // leave a map half-changed.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line =
            "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(line).expect("parses");
        assert_eq!(s.ppid, 17);
        assert_eq!(s.start, 987654);
        assert!(!s.exited);
        let zombie = "7 (x) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert!(parse_stat(zombie).expect("parses").exited);
    }

    #[test]
    fn this_thread_maps_to_this_process() {
        let table = ProcTable::default();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let me = table.identify(tid, Instant::now()).expect("own thread");
        assert_eq!(me.pid, std::process::id());
        let other = std::thread::spawn(move || {
            // SAFETY: as above.
            let tid = unsafe { libc::gettid() } as u32;
            ProcTable::default().identify(tid, Instant::now())
        })
        .join()
        .expect("thread");
        assert_eq!(other, Some(me));
        assert!(is_alive(me));
    }

    fn view(taken_ms: u64, last_ms: u64, now: Instant) -> ReaderView {
        ReaderView {
            tree: Arc::new(Tree::empty()),
            taken: now - Duration::from_millis(taken_ms),
            last: now - Duration::from_millis(last_ms),
        }
    }

    #[test]
    fn view_rule_keeps_bursts_and_moves_pollers() {
        let r = Readers::new(ViewRule::default(), true);
        let now = Instant::now() + Duration::from_secs(60);
        // A burst several seconds long with small gaps stays.
        assert!(!r.moves_on(&view(5_000, 10, now), now));
        // A pause of the quiet gap moves, at any age.
        assert!(r.moves_on(&view(300, 260, now), now));
        // A young view survives a poller's pause; an old one moves.
        assert!(!r.moves_on(&view(1_000, 60, now), now));
        assert!(r.moves_on(&view(2_100, 60, now), now));
        // Past the hard age, a 10 ms pause is enough.
        assert!(!r.moves_on(&view(10_500, 1, now), now));
        assert!(r.moves_on(&view(10_500, 15, now), now));
    }
}
