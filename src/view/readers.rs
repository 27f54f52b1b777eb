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
//!
//! where, for the first two, a *pause* does not count the time the
//! process spent runnable but not running (its threads' `run_delay`,
//! `/proc/<pid>/task/*/schedstat` field 2): on a starved machine a query's
//! gaps stretch past the quiet gap while it waits for a CPU, and that is
//! not a pause. The counter is read only when a wall-clock gap already
//! reaches a threshold (a move is being considered), never on the plain
//! request path, and by [`Readers::mark_quiet`] soon after a gap begins
//! (so the wait counted is the wait within the gap). A gap starts at the
//! reply to the process's previous request of any kind
//! ([`Readers::served`]), so time inside a table or waiting for this
//! daemon is no pause. The third rule uses wall-clock time alone: it is
//! the bound that holds whatever the load;
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

/// How long each thread of a process was runnable but waiting for a CPU,
/// in total since it started, by thread id (`None`: unknown — no such
/// process, or a kernel without `/proc/<pid>/task/*/schedstat`).
/// Replaceable in tests.
pub type RunDelaySource = Box<dyn Fn(ProcId) -> Option<RunDelays> + Send + Sync>;

/// Per-thread total run delays of one process: (thread id, total).
pub type RunDelays = Vec<(u32, Duration)>;

/// The CPU wait to take off a gap that thread `caller` ends: that
/// thread's wait since `mark`; when the mark does not have it (it is new),
/// the largest wait of any one thread since the mark (a thread new since
/// then: its whole life) — the largest, not the sum, so threads waiting
/// side by side are not counted twice.
fn waited_since(now: &RunDelays, mark: &RunDelays, caller: Option<u32>) -> Duration {
    let grown = |tid: u32, d: Duration| {
        let before = mark.iter().find(|(t, _)| *t == tid).map(|(_, m)| *m);
        d.saturating_sub(before.unwrap_or_default())
    };
    let own = caller.and_then(|c| {
        let d = now.iter().find(|(t, _)| *t == c)?.1;
        mark.iter().any(|(t, _)| *t == c).then(|| grown(c, d))
    });
    own.unwrap_or_else(|| {
        now.iter()
            .map(|(tid, d)| grown(*tid, *d))
            .max()
            .unwrap_or_default()
    })
}

thread_local! {
    /// The thread id of the request this daemon thread is serving, set by
    /// [`Readers::identify`] (a daemon thread serves one request at a
    /// time, and `tree_for` follows `identify` within it).
    static CALLER: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

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

/// How long each of `proc`'s threads spent runnable but not running:
/// field 2 (nanoseconds) of `/proc/<pid>/task/<tid>/schedstat`. `None`
/// when the process is gone or reused, or the kernel has no schedstat.
pub fn proc_run_delay(proc: ProcId) -> Option<RunDelays> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", proc.pid)).ok()?;
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        // A thread that exited meanwhile is left out.
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        out.push((tid, parse_run_delay(&text)?));
    }
    // Checked after reading, so a pid reused meanwhile is not counted.
    is_alive(proc).then_some(out)
}

/// Field 2 of a `schedstat` line: "<cpu ns> <run_delay ns> <timeslices>".
fn parse_run_delay(text: &str) -> Option<Duration> {
    let ns: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
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
    /// When the process's latest request of any kind ended (its reply
    /// was sent; see [`Readers::served`]), or its latest root- or
    /// database-level request began: where the current gap starts. Time
    /// a process spends waiting for this daemon's replies is no pause.
    last: Instant,
    /// The process's total run delay at `mark_at` (`None`: not known, then
    /// nothing is taken off a gap). Taken when the view was taken or a
    /// move considered, and again by [`Readers::mark_quiet`] soon after
    /// each gap begins, so the wait counted for a gap is the wait within
    /// it, not waits of the burst before it.
    delay_mark: Option<RunDelays>,
    mark_at: Instant,
}

impl ReaderView {
    fn new(tree: Arc<Tree>, now: Instant, delay_mark: Option<RunDelays>) -> ReaderView {
        ReaderView {
            tree,
            taken: now,
            last: now,
            delay_mark,
            mark_at: now,
        }
    }
}

/// A gap this long (no request from the process) has its run delay
/// marked by [`Readers::mark_quiet`]: shorter than any gap the rule acts
/// on, so the mark lands near the gap's start.
pub const MARK_QUIET_AFTER: Duration = Duration::from_millis(5);

/// Whether a view moves (the rule of the module docs). `waited` is how
/// much of the gap `idle` the process spent waiting for a CPU (`None`:
/// not measured); it is taken off the first two rules' pauses, never off
/// the third's.
fn rule_moves(rule: &ViewRule, age: Duration, idle: Duration, waited: Option<Duration>) -> bool {
    let pause = idle.saturating_sub(waited.unwrap_or_default());
    pause >= rule.quiet_gap
        || (age >= rule.max_age && pause >= rule.poll_gap)
        || (age >= rule.hard_age && idle >= rule.hard_gap)
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
    run_delay: RunDelaySource,
    unattributed: AtomicU64,
    moves: AtomicU64,
    /// Moves the wall-clock gap alone would have made but the process
    /// had been waiting for a CPU (for status and benchmarks).
    starved_keeps: AtomicU64,
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
    /// Requests after a wall-clock gap long enough to move the view that
    /// kept it, because the process spent the gap waiting for a CPU.
    pub starved_keeps: u64,
    /// Table entries the adapter asked the kernel to drop.
    pub dentry_invalidations: u64,
}

impl Readers {
    pub fn new(rule: ViewRule, enabled: bool) -> Readers {
        Readers::with_run_delay(rule, enabled, Box::new(proc_run_delay))
    }

    /// As [`Readers::new`], with run delays from `run_delay` instead of
    /// `/proc` (tests simulate a starved machine with it).
    pub fn with_run_delay(rule: ViewRule, enabled: bool, run_delay: RunDelaySource) -> Readers {
        Readers {
            rule,
            enabled,
            procs: ProcTable::default(),
            views: Mutex::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            run_delay,
            unattributed: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            starved_keeps: AtomicU64::new(0),
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
        CALLER.with(|c| c.set((pid != 0).then_some(pid)));
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
        // The plain path: one map operation under the lock.
        let read_delay = {
            let mut views = lock(&self.views);
            match views.get_mut(&proc) {
                None => true,
                Some(v) if !self.wall_moves(v, now) => {
                    v.last = now;
                    return Arc::clone(&v.tree);
                }
                Some(v) => !self.moves_at_any_delay(v, now),
            }
        };
        // A new view (its first mark), or a move is being considered and
        // the run delay could change the answer: read it outside the lock.
        let delay_now = if read_delay {
            (self.run_delay)(proc)
        } else {
            None
        };
        let mut views = lock(&self.views);
        let Some(v) = views.get_mut(&proc) else {
            let tree = Arc::clone(&snap.visible);
            views.insert(proc, ReaderView::new(Arc::clone(&tree), now, delay_now));
            return tree;
        };
        if !self.wall_moves(v, now) {
            // Another thread of the process made a request meanwhile.
            v.last = now;
            return Arc::clone(&v.tree);
        }
        let since_mark = delay_now
            .as_ref()
            .zip(v.delay_mark.as_ref())
            .map(|(now, mark)| waited_since(now, mark, CALLER.with(|c| c.get())));
        let (age, idle) = (now.duration_since(v.taken), now.duration_since(v.last));
        if delay_now.is_some() {
            v.delay_mark = delay_now;
            v.mark_at = now;
        }
        if !rule_moves(&self.rule, age, idle, since_mark) {
            self.starved_keeps.fetch_add(1, Ordering::Relaxed);
            v.last = now;
            return Arc::clone(&v.tree);
        }
        // Never backwards: a check by another thread may have moved the
        // view past `snap` meanwhile.
        let tree = if v.tree.state_id > snap.visible.state_id {
            Arc::clone(&v.tree)
        } else {
            Arc::clone(&snap.visible)
        };
        if v.tree.state_id != tree.state_id {
            self.moves.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                pid = proc.pid,
                from = %v.tree.state_id,
                to = %tree.state_id,
                age_ms = age.as_millis() as u64,
                idle_ms = idle.as_millis() as u64,
                waited_ms = since_mark.map(|d| d.as_millis() as u64),
                "view moved"
            );
        }
        let mark = v.delay_mark.take();
        *v = ReaderView::new(tree, now, mark);
        Arc::clone(&v.tree)
    }

    /// A request from thread `pid` was answered: its process's current
    /// gap starts now. Called after every request, not only those that
    /// resolve a root- or database-level name, so the time a process
    /// spends inside a table (or blocked on this daemon's replies) is not
    /// counted as a pause. One cached lookup and one map update; nothing
    /// for a process without a view.
    pub fn served(&self, pid: u32) {
        if !self.enabled || pid == 0 {
            return;
        }
        let now = Instant::now();
        let Some(proc) = self.procs.identify(pid, now) else {
            return;
        };
        if let Some(v) = lock(&self.views).get_mut(&proc) {
            v.last = v.last.max(now);
        }
    }

    /// Marks the run delay of every process whose gap began at least
    /// [`MARK_QUIET_AFTER`] ago and has no mark since, so that the CPU
    /// wait taken off that gap when it ends is the wait within it. Called
    /// by the fuse adapter's maintenance thread every few milliseconds; a
    /// mark it misses (that thread starved) leaves an older one, which
    /// only errs towards keeping a view.
    pub fn mark_quiet(&self) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let due: Vec<ProcId> = lock(&self.views)
            .iter()
            .filter(|(_, v)| v.mark_at < v.last && now.duration_since(v.last) >= MARK_QUIET_AFTER)
            .map(|(p, _)| *p)
            .collect();
        for proc in due {
            // Read outside the lock; a request meanwhile only makes the
            // mark a little early.
            let Some(delays) = (self.run_delay)(proc) else {
                continue;
            };
            let at = Instant::now();
            if let Some(v) = lock(&self.views).get_mut(&proc) {
                v.delay_mark = Some(delays);
                v.mark_at = at;
            }
        }
    }

    /// Whether `v` moves on wall-clock time alone (no CPU wait taken off).
    fn wall_moves(&self, v: &ReaderView, now: Instant) -> bool {
        rule_moves(
            &self.rule,
            now.duration_since(v.taken),
            now.duration_since(v.last),
            None,
        )
    }

    /// Whether `v` moves however long the process waited for a CPU (the
    /// third rule), so its run delay need not be read.
    fn moves_at_any_delay(&self, v: &ReaderView, now: Instant) -> bool {
        rule_moves(
            &self.rule,
            now.duration_since(v.taken),
            now.duration_since(v.last),
            Some(Duration::MAX),
        )
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
        // A fresh mark: waits before the check are not charged to the
        // next gap (a read of /proc, but a check is rare).
        let fresh = (self.run_delay)(proc);
        let now = Instant::now();
        let mut views = lock(&self.views);
        // Never backwards: another thread of the process may have moved
        // the view past `snap` (taken before this thread got the lock).
        let tree = match views.get(&proc) {
            Some(v) if v.tree.state_id > snap.visible.state_id => Arc::clone(&v.tree),
            _ => Arc::clone(&snap.visible),
        };
        let old_mark = views.get_mut(&proc).and_then(|v| v.delay_mark.take());
        let mark = fresh.or(old_mark);
        let new_id = tree.state_id;
        let old = views.insert(proc, ReaderView::new(tree, now, mark));
        if old.is_some_and(|v| v.tree.state_id != new_id) {
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

    /// Periodic upkeep: forgets the views of exited processes and those
    /// whose next request would take a fresh one whatever the process
    /// waited for (the third rule), and stale caches; returns the sessions
    /// whose leader has exited, for the caller to close.
    ///
    /// A live process's view is not forgotten at the quiet gap: only the
    /// request that ends a gap can tell a pause from a wait for a CPU (the
    /// kernel adds a wait to `run_delay` when the thread next runs, so a
    /// reading taken during a long wait misses it).
    pub fn maintain(&self, snap: &Snapshot) -> Vec<String> {
        let now = Instant::now();
        let idle: Vec<ProcId> = {
            let mut views = lock(&self.views);
            views.retain(|_, v| !self.moves_at_any_delay(v, now));
            views
                .iter()
                .filter(|(_, v)| self.wall_moves(v, now))
                .map(|(p, _)| *p)
                .collect()
        };
        let exited: Vec<ProcId> = idle.into_iter().filter(|p| !is_alive(*p)).collect();
        if !exited.is_empty() {
            let mut views = lock(&self.views);
            for p in exited {
                views.remove(&p);
            }
        }
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
        let views = lock(&self.views);
        let (mut n, mut oldest) = (0, None::<StateId>);
        for v in views.values() {
            n += 1;
            oldest = Some(oldest.map_or(v.tree.state_id, |o| o.min(v.tree.state_id)));
        }
        ReadersSummary {
            views: n,
            oldest_view: oldest,
            unattributed_requests: self.unattributed.load(Ordering::Relaxed),
            view_moves: self.moves.load(Ordering::Relaxed),
            starved_keeps: self.starved_keeps.load(Ordering::Relaxed),
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
    use std::thread;

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

    #[test]
    fn view_rule_keeps_bursts_and_moves_pollers() {
        let rule = ViewRule::default();
        let moves = |age: u64, idle: u64, waited: Option<u64>| {
            rule_moves(
                &rule,
                Duration::from_millis(age),
                Duration::from_millis(idle),
                waited.map(Duration::from_millis),
            )
        };
        // A burst several seconds long with small gaps stays.
        assert!(!moves(5_000, 10, None));
        // A pause of the quiet gap moves, at any age.
        assert!(moves(300, 260, None));
        // A young view survives a poller's pause; an old one moves.
        assert!(!moves(1_000, 60, None));
        assert!(moves(2_100, 60, None));
        // Past the hard age, a 10 ms pause is enough.
        assert!(!moves(10_500, 1, None));
        assert!(moves(10_500, 15, None));
        // Time spent waiting for a CPU is no pause for the first two
        // rules; the third counts wall-clock time whatever the wait.
        assert!(!moves(300, 400, Some(300)));
        assert!(moves(300, 400, Some(100)));
        assert!(!moves(2_100, 60, Some(30)));
        assert!(moves(10_500, 15, Some(15)));
    }

    #[test]
    fn schedstat_run_delay_is_the_second_field() {
        assert_eq!(
            parse_run_delay("123 4567 8\n"),
            Some(Duration::from_nanos(4567))
        );
        assert_eq!(parse_run_delay("123\n"), None);
        let me = proc_of_pid(std::process::id()).expect("this process");
        let threads = proc_run_delay(me).expect("schedstat of this process");
        assert!(threads.iter().any(|(tid, _)| *tid == me.pid));
        // Threads waiting side by side count once; a new thread wholly.
        let ms = Duration::from_millis;
        let mark = vec![(1, ms(100)), (2, ms(100))];
        let now = vec![(1, ms(150)), (2, ms(180)), (3, ms(90))];
        // The thread that ends the gap: its own wait.
        assert_eq!(waited_since(&now, &mark, Some(1)), ms(50));
        // Not known (or new): the largest of any one thread, not the sum.
        assert_eq!(waited_since(&now, &mark, None), ms(90));
        assert_eq!(waited_since(&now, &mark, Some(3)), ms(90));
        let gone = ProcId {
            pid: me.pid,
            start: me.start + 1,
        };
        assert_eq!(proc_run_delay(gone), None, "a reused pid is not counted");
    }

    /// Readers whose processes' run delay is what the test sets (ms).
    fn simulated(rule: ViewRule) -> (Readers, Arc<AtomicU64>) {
        let delay = Arc::new(AtomicU64::new(0));
        let d = Arc::clone(&delay);
        let readers = Readers::with_run_delay(
            rule,
            true,
            Box::new(move |_| Some(vec![(1, Duration::from_millis(d.load(Ordering::Relaxed)))])),
        );
        (readers, delay)
    }

    fn snap_at(id: u64) -> Snapshot {
        let tree = Arc::new(Tree {
            state_id: StateId(id),
            ..Tree::empty()
        });
        Snapshot {
            visible: Arc::clone(&tree),
            versions: [(StateId(id), tree)].into_iter().collect(),
            pins: Default::default(),
        }
    }

    fn me() -> Reader {
        Reader::Process(proc_of_pid(std::process::id()).expect("this process"))
    }

    /// Two threads of one process: one checks `visible` = 30 while the
    /// other still holds a snapshot taken at 20 (it read the snapshot
    /// before the first thread's check, and takes the lock after it).
    /// The view never goes back to 20: what a thread was told is visible
    /// stays the floor of every later request of its process.
    #[test]
    fn a_view_never_moves_back_to_an_older_snapshot() {
        let (r, _delay) = simulated(ViewRule::default());
        let (old, new) = (snap_at(20), snap_at(30));
        assert_eq!(r.tree_for(me(), &old).state_id, StateId(20));
        r.checked(me(), &new);
        r.checked(me(), &old);
        assert_eq!(r.tree_for(me(), &old).state_id, StateId(30));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            r.tree_for(me(), &old).state_id,
            StateId(30),
            "a move went back"
        );
        assert_eq!(r.tree_for(me(), &new).state_id, StateId(30));
    }

    /// Simulates that of the time since `*since`, all but `pause_ms` was
    /// spent waiting for a CPU; restarts `*since`.
    fn starve(delay: &AtomicU64, since: &mut Instant, pause_ms: u64) {
        let gap = since.elapsed().as_millis() as u64;
        delay.fetch_add(gap.saturating_sub(pause_ms), Ordering::Relaxed);
        *since = Instant::now();
    }

    /// The limit found with 200 readers on 2 cores (docs/benchmarks/HISTORY.md
    /// "Views under mixed readers"): a query's gap that stretched past the
    /// quiet gap because the process waited for a CPU kept its view.
    #[test]
    fn a_gap_spent_waiting_for_a_cpu_does_not_move_the_view() {
        let (r, delay) = simulated(ViewRule::default());
        let mut since = Instant::now();
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        // 300 ms pass, all but 10 ms runnable but not running.
        thread::sleep(Duration::from_millis(300));
        starve(&delay, &mut since, 10);
        assert_eq!(
            r.tree_for(me(), &snap_at(2)).state_id,
            StateId(1),
            "a starved query moved"
        );
        assert_eq!(r.summary().starved_keeps, 1);
        // The maintenance pass keeps it too (the process is alive).
        thread::sleep(Duration::from_millis(300));
        starve(&delay, &mut since, 10);
        r.maintain(&snap_at(2));
        assert_eq!(r.summary().views, 1, "maintenance forgot a starved view");
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(1));
        // A real pause (asleep, not waiting for a CPU) moves it.
        thread::sleep(Duration::from_millis(300));
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(2));
        assert_eq!(r.summary().view_moves, 1);
        // The view of a process that exited goes at the next pass.
        let gone = Reader::Process(ProcId {
            pid: 5_000_000,
            start: 1,
        });
        r.tree_for(gone, &snap_at(2));
        assert_eq!(r.summary().views, 2);
        thread::sleep(Duration::from_millis(300));
        r.maintain(&snap_at(2));
        assert_eq!(r.summary().views, 1, "an exited process's view stayed");
    }

    /// Scaled down from the default rule so the tests are quick.
    fn quick_rule() -> ViewRule {
        ViewRule {
            quiet_gap: Duration::from_millis(100),
            poll_gap: Duration::from_millis(20),
            max_age: Duration::from_millis(300),
            hard_age: Duration::from_millis(900),
            hard_gap: Duration::from_millis(5),
        }
    }

    /// A poller: a request every 30 ms, of which all but `pause_ms` is
    /// spent waiting for a CPU, until the view shows state 2; how long
    /// that took.
    fn advance_time(r: &Readers, delay: &AtomicU64, pause_ms: u64) -> Duration {
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        let start = Instant::now();
        let mut since = start;
        while r.tree_for(me(), &snap_at(2)).state_id != StateId(2) {
            // A hang guard, not a timing: the rule moves it in ~1 s.
            assert!(start.elapsed() < Duration::from_secs(30), "never advanced");
            thread::sleep(Duration::from_millis(30));
            starve(delay, &mut since, pause_ms);
        }
        start.elapsed()
    }

    /// A query that spends its time inside a table (requests that resolve
    /// no root- or database-level name) or waiting for this daemon's
    /// replies is not pausing: its view stays however old it gets.
    #[test]
    fn requests_inside_a_table_are_no_pause() {
        // Gaps far above the 5 ms between replies, so a late wakeup of this
        // thread on a loaded machine does not look like a pause.
        let rule = ViewRule {
            quiet_gap: Duration::from_millis(300),
            poll_gap: Duration::from_millis(150),
            max_age: Duration::from_millis(300),
            hard_age: Duration::from_secs(3600),
            hard_gap: Duration::from_millis(5),
        };
        let (r, _delay) = simulated(rule);
        let pid = std::process::id();
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        // Past the max age and the quiet gap, with a reply every 5 ms.
        let start = Instant::now();
        while start.elapsed() < rule.max_age + rule.quiet_gap {
            thread::sleep(Duration::from_millis(5));
            r.served(pid);
        }
        assert_eq!(
            r.tree_for(me(), &snap_at(2)).state_id,
            StateId(1),
            "a query's next table lookup moved the view"
        );
        // Once it really pauses, it moves.
        thread::sleep(rule.quiet_gap + Duration::from_millis(20));
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(2));
    }

    /// CPU waits of a burst are not taken off the quiet gap after it: the
    /// mark taken soon after the gap begins ([`Readers::mark_quiet`])
    /// bounds the wait counted to the wait within the gap, so a process
    /// that sleeps after a starved query starts the next one afresh.
    #[test]
    fn waits_before_a_gap_do_not_keep_the_view_across_it() {
        let rule = ViewRule {
            hard_age: Duration::from_secs(3600),
            ..quick_rule()
        };
        let pid = std::process::id();
        for marked in [false, true] {
            let (r, delay) = simulated(rule);
            assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
            // A burst that waited 10 s for a CPU in all (far more than
            // any late wakeup of this thread can add to the gap).
            for _ in 0..12 {
                thread::sleep(Duration::from_millis(5));
                r.served(pid);
            }
            delay.fetch_add(10_000, Ordering::Relaxed);
            // Then it sleeps past the quiet gap, not waiting for a CPU.
            thread::sleep(MARK_QUIET_AFTER + Duration::from_millis(5));
            if marked {
                r.mark_quiet();
            }
            thread::sleep(rule.quiet_gap);
            let moved = r.tree_for(me(), &snap_at(2)).state_id == StateId(2);
            assert_eq!(moved, marked, "marked at the gap's start: {marked}");
        }
    }

    #[test]
    fn a_poller_advances_on_a_starved_machine() {
        // Pauses of 25 ms (above the poll gap) between waits for a CPU:
        // it moves once the view is old, with no hard age to help.
        let rule = ViewRule {
            hard_age: Duration::from_secs(3600),
            ..quick_rule()
        };
        let (r, delay) = simulated(rule);
        let t = advance_time(&r, &delay, 25);
        assert!(t >= rule.max_age, "moved at {t:?}, before the max age");
        // A process that waits for a CPU through every gap still moves
        // at the hard age, on wall-clock time.
        let rule = quick_rule();
        let (r, delay) = simulated(rule);
        let t = advance_time(&r, &delay, 0);
        assert!(t >= rule.hard_age, "moved at {t:?}, before the hard age");
    }
}
