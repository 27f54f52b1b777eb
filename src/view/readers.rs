//! Readers (SPEC §3 rule 8): who sent a request, and which whole-mount
//! state that reader's walks resolve in.
//!
//! A *reader* is a process, or every process of a `stagefs run` session.
//! The fuse adapter passes the request's pid, which is the calling
//! *thread*; `ProcTable` maps it to its process (`Tgid:` in
//! `/proc/<tid>/status`) and names the process by (pid, start time) —
//! `/proc/<pid>/stat` field 22 — so a reused pid is a different reader.
//! The mapping is cached and re-checked (one `stat` read) once per
//! `RECHECK`.
//!
//! A process's *view* is one state: the tree every root- and
//! database-level name resolves in (below a table everything is an
//! immutable node, so nothing else depends on the reader). The rule for
//! when a view moves to the newest visible state ([`ViewRule`],
//! [`decide`], documented in docs/SEMANTICS.md "Readers") looks at the
//! *gap* before a request — from the reply to the process's previous
//! request of any kind ([`Readers::served`]); there is no gap while another
//! request of the process is in flight ([`Readers::begin`]) — and, only
//! when the gap is long enough for a move to be considered, at what the
//! process did in it: how long its threads (and its parent's) ran on a CPU or waited in
//! the run queue (`/proc/<pid>/task/*/schedstat` fields 1 and 2). A gap
//! in which they were busy for at least a quarter of the time is
//! *computing* (a query engine planning between its listing and its
//! reads, or a query starved of CPU), not a pause:
//! - a gap of `quiet_gap` that is not computing moves the view (a new
//!   query starts fresh);
//! - once the view is `max_age` old, a gap of `poll_gap` that is not
//!   computing moves it (a polling loop gets new states);
//! - a gap in which the process's own threads computed keeps the view at
//!   any age (one long query on a starved host); its parent's computing
//!   keeps it only until the view is `hard_age` old (the bound for a
//!   process whose parent never rests);
//! - reading the root's `user.stagefs.visible`, opening `.stagefs/status`
//!   or changing a pin moves it at once (read-your-check);
//! - reading the root's `user.stagefs.hold` moves it at once and *holds*
//!   it — for the process and every process below it — until the next
//!   read of `hold` (which moves and holds again), a read-your-check, or
//!   `setfattr -x user.stagefs.hold` ([`Readers::release`]): the query
//!   boundary a long-lived engine session marks for exactness.
//!
//! The samples are taken when a move is considered (never on the plain
//! request path), when a view is made, and by [`Readers::mark_quiet`]
//! soon after a gap begins, so what is counted for a gap is what happened
//! within it. Without schedstat (no `CONFIG_SCHED_INFO`, a process the
//! daemon may not read) gaps are wall-clock pauses. A gap in which a
//! thread of the process was seen in uninterruptible sleep (`D`: a disk
//! read, a page of the mount) is never a pause, and neither is a gap
//! throughout which the process's driver waited for its answer (its
//! parent blocked in one read of a socket to it: PySpark's py4j call in
//! flight, see [`super::driver_wait`]), for at most
//! [`ViewRule::driver_call_limit`] per wait.
//!
//! A session's view never moves. Membership: a process belongs to the
//! session whose leader (the `stagefs run` process, which then executes
//! the command) is its nearest ancestor, found once per process by walking
//! the parent chain in `/proc` and cached. Sessions themselves are catalog
//! holds (durable, retained, see `Catalog::open_session`); this module
//! only recognises their members and ends sessions whose leader died.
//! Holds are this module's alone (in memory: a daemon restart drops them,
//! as it drops views).
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

use super::driver_wait::{driver_wait, DriverWait};
use crate::catalog::{SessionHold, Snapshot, Tree};
use crate::event::StateId;

/// How often a cached thread → process mapping is re-checked against
/// pid reuse.
const RECHECK: Duration = Duration::from_secs(1);
/// Cached processes not seen for this long are forgotten.
const FORGET_PROC: Duration = Duration::from_secs(30);
/// A view whose process made no request for this long is forgotten even
/// while the process computes (its state is then no longer kept from GC).
const FORGET_BUSY: Duration = Duration::from_secs(600);

/// Per-thread totals of one process since each thread started: (thread
/// id, time on a CPU, time runnable but waiting for one) — fields 1 and 2
/// of `/proc/<pid>/task/<tid>/schedstat`.
pub type ThreadTimes = Vec<(u32, Duration, Duration)>;

/// One sample of a process: its threads' times and its parent's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Busy {
    pub own: ThreadTimes,
    /// The parent (pid, its threads); `None` for init or an unreadable
    /// parent.
    pub parent: Option<(u32, ThreadTimes)>,
    /// This daemon's request threads ([`request_thread_times`]), each
    /// thread's time inside handlers added to its time on a CPU: a
    /// request the process sent waits unread in the kernel's queue only
    /// while every one of them is busy, and the process then looks idle
    /// while it waits for this daemon.
    pub daemon: ThreadTimes,
    /// One of its own threads was blocked in the kernel when sampled
    /// (state `D` in `/proc/<pid>/task/<tid>/stat`: waiting for a disk,
    /// or for a FUSE request this daemon has not yet begun): inside work,
    /// not pausing, though it neither runs nor waits for a CPU.
    pub blocked: bool,
    /// A thread of its parent blocked reading a socket whose other end
    /// this process holds: its driver waiting for its answer (a py4j call
    /// in flight, see [`super::driver_wait`]).
    pub driver: Option<DriverWait>,
    /// The machine's steal time so far, summed over its CPUs (`/proc/stat`:
    /// time the hypervisor ran something else while a virtual CPU had
    /// work). A process on a stolen CPU neither runs nor waits in the
    /// run queue, as far as its own counters tell.
    pub steal: Duration,
}

/// Where samples come from (`None`: unknown — no such process, or a
/// kernel without schedstat). Replaceable in tests.
pub type BusySource = Box<dyn Fn(ProcId) -> Option<Busy> + Send + Sync>;

/// Growth of (run, wait) summed over `now`'s threads since `mark`; a
/// thread the mark lacks (new since) counts its whole life, a thread gone
/// since counts nothing.
fn grown(now: &ThreadTimes, mark: &ThreadTimes) -> (Duration, Duration) {
    let mut run = Duration::ZERO;
    let mut wait = Duration::ZERO;
    for (tid, r, w) in now {
        let (r0, w0) = mark
            .iter()
            .find(|(t, ..)| t == tid)
            .map_or((Duration::ZERO, Duration::ZERO), |(_, r0, w0)| (*r0, *w0));
        run += r.saturating_sub(r0);
        wait += w.saturating_sub(w0);
    }
    (run, wait)
}

/// The least growth of (run + wait) of any one thread present in both
/// samples (zero when none is). Used for this daemon's request threads:
/// the kernel hands a queued request to whichever of them reads next, so
/// a request can only wait unread while every one is busy, and its wait
/// is bounded by the least busy one's time — not by their sum, which
/// grows with every other reader's requests on a busy host.
fn least_grown(now: &ThreadTimes, mark: &ThreadTimes) -> Duration {
    now.iter()
        .filter_map(|(tid, r, w)| {
            let (_, r0, w0) = mark.iter().find(|(t, ..)| t == tid)?;
            Some(r.saturating_sub(*r0) + w.saturating_sub(*w0))
        })
        .min()
        .unwrap_or_default()
}

/// What a process did between two samples: the input of [`decide`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Wall-clock time between the samples.
    pub span: Duration,
    /// Its own threads' time on a CPU, summed.
    pub run: Duration,
    /// Its own threads' time runnable but waiting for a CPU, summed.
    pub wait: Duration,
    /// Its parent's threads' run and wait time, summed (a driver that
    /// computes while its child, the engine, waits for it).
    pub parent: Duration,
    /// The least time any one of this daemon's request threads was busy
    /// (on a CPU, waiting for one, or inside a handler): a request waits
    /// unread in the kernel's queue only while all of them are busy, so
    /// this bounds the time the process spent blocked on a request of its
    /// own that this daemon had yet to read (see [`least_grown`]).
    pub daemon_wait: Duration,
    /// One of its own threads was blocked in the kernel (state `D`) at
    /// either sample: the gap is not a pause.
    pub blocked: bool,
    /// Its driver (the parent) was blocked in one and the same read of a
    /// socket to it at both samples: the gap lies inside one request the
    /// driver made (one query or one step of it), and is not a pause.
    pub driver_waiting: bool,
    /// The machine's steal time between the samples: time its CPUs were
    /// taken by the hypervisor, when the process could not run.
    pub steal: Duration,
}

impl Activity {
    fn between(now: &Busy, now_at: Instant, mark: &Busy, mark_at: Instant) -> Activity {
        let (run, wait) = grown(&now.own, &mark.own);
        let parent = match (&now.parent, &mark.parent) {
            (Some((p, t)), Some((p0, t0))) if p == p0 => {
                let (r, w) = grown(t, t0);
                r + w
            }
            _ => Duration::ZERO,
        };
        Activity {
            span: now_at.saturating_duration_since(mark_at),
            run,
            wait,
            parent,
            daemon_wait: least_grown(&now.daemon, &mark.daemon),
            blocked: now.blocked || mark.blocked,
            driver_waiting: now.driver.is_some() && now.driver == mark.driver,
            steal: now.steal.saturating_sub(mark.steal),
        }
    }
}

/// When a process's view moves on (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct ViewRule {
    pub quiet_gap: Duration,
    pub poll_gap: Duration,
    pub max_age: Duration,
    /// A parent's computing keeps a view at most this old; a view idle
    /// this long whose process is not computing is forgotten.
    pub hard_age: Duration,
    /// Samples closer together than this tell nothing about a gap.
    pub min_span: Duration,
    /// A gap in which the process's threads and its parent's were busy
    /// (running or waiting to run) for at least this share of it, in
    /// percent, is computing, not a pause.
    pub busy_percent: u32,
    /// One wait of a driver for its engine (the parent blocked reading a
    /// socket to it) keeps the engine's view at most this long: a driver
    /// that waits for ever (a streaming query's `awaitTermination`) must
    /// not freeze what its engine sees.
    pub driver_call_limit: Duration,
}

impl Default for ViewRule {
    fn default() -> Self {
        // Measured (docs/SEMANTICS.md "Readers"): inside one query of
        // DuckDB, Python or `find`, the gaps between requests that reach
        // the daemon stay below ~5 ms on an idle machine and ~25 ms on a
        // loaded one; a Spark driver's gaps inside a query (planning) run
        // to a second and more, busy on the CPU.
        ViewRule {
            quiet_gap: Duration::from_millis(250),
            poll_gap: Duration::from_millis(40),
            max_age: Duration::from_secs(2),
            hard_age: Duration::from_secs(10),
            min_span: Duration::from_millis(10),
            busy_percent: 25,
            driver_call_limit: FORGET_BUSY,
        }
    }
}

/// What [`decide`] says about a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The gap is too short for a move.
    Keep,
    /// The view moves to the newest visible state.
    Move,
    /// The wall clock alone would have moved it, but the process was
    /// computing (or the samples span too little time to tell).
    KeepBusy,
}

/// The view rule (module docs) for a view `age` old after a gap `idle`
/// long, given what the process did in the gap (`None`: not measured,
/// then the gap counts as a pause).
pub fn decide(rule: &ViewRule, age: Duration, idle: Duration, act: Option<Activity>) -> Decision {
    let wall_due = idle >= rule.quiet_gap || (age >= rule.max_age && idle >= rule.poll_gap);
    if !wall_due {
        return Decision::Keep;
    }
    let Some(a) = act else {
        return Decision::Move;
    };
    // Samples closer than this tell nothing: keep (the gap then
    // restarts, and the next one is measured afresh).
    if a.span < rule.min_span {
        return Decision::KeepBusy;
    }
    // A thread blocked in the kernel (a disk read, a FUSE request not
    // yet begun) is inside work, and so is an engine whose driver waits
    // for its answer through the whole gap: never a pause, whatever the
    // counters say.
    if a.blocked || a.driver_waiting {
        return Decision::KeepBusy;
    }
    let busy_share =
        |busy: Duration| busy.as_nanos() * 100 >= a.span.as_nanos() * u128::from(rule.busy_percent);
    // Its own threads on a CPU or waiting for one, or blocked on a
    // request of its own this daemon had yet to read, or the machine's
    // CPUs taken by the hypervisor (steal: a thread running on a stolen
    // CPU neither runs nor waits by its own counters): computing, at any
    // age. A query that runs for a minute on a starved host stays on one
    // state; a loop that computes through every gap without pausing
    // stays too, until it pauses or reads `user.stagefs.visible`.
    if busy_share(a.run + a.wait + a.daemon_wait + a.steal) {
        return Decision::KeepBusy;
    }
    // Its parent computing (a Python driver while its JVM waits) keeps a
    // view only up to the hard age: the bound for a process whose parent
    // never rests.
    if age < rule.hard_age && busy_share(a.run + a.wait + a.daemon_wait + a.steal + a.parent) {
        return Decision::KeepBusy;
    }
    Decision::Move
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

/// The environment variable that names a job's state (rule 10).
pub const STATE_ID_VAR: &[u8] = b"STAGEFS_STATE_ID";

/// `STAGEFS_STATE_ID` of process `pid` as its environment was at exec
/// (`/proc/<pid>/environ`; unreadable for other users' processes).
fn read_job_state(pid: u32) -> Option<StateId> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    job_state_in(&env)
}

/// `STAGEFS_STATE_ID=N` among NUL-separated `NAME=value` entries.
fn job_state_in(environ: &[u8]) -> Option<StateId> {
    environ.split(|b| *b == 0).find_map(|entry| {
        let value = entry.strip_prefix(STATE_ID_VAR)?.strip_prefix(b"=")?;
        let text = std::str::from_utf8(value).ok()?;
        text.parse().ok().map(StateId)
    })
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

/// The thread ids of process `pid` (`/proc/<pid>/task`).
fn tids_of(pid: u32) -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        tasks
            .flatten()
            .filter_map(|t| t.file_name().to_str().and_then(|t| t.parse().ok()))
            .collect(),
    )
}

/// Each thread's (id, run, wait) of process `pid`: fields 1 and 2
/// (nanoseconds) of `/proc/<pid>/task/<tid>/schedstat`.
fn thread_times(pid: u32) -> Option<ThreadTimes> {
    times_of(pid, &tids_of(pid)?)
}

/// Whether one of the threads `tids` of process `pid` is in
/// uninterruptible sleep (state `D`, field 3 of its `stat`; the command
/// name before it may hold spaces and parentheses).
fn any_blocked(pid: u32, tids: &[u32]) -> bool {
    tids.iter().any(|tid| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
            .is_ok_and(|t| thread_state(&t) == Some('D'))
    })
}

/// Field 3 of a `stat` line.
fn thread_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// (id, run, wait) of the threads `tids` of process `pid`; a thread that
/// exited meanwhile is left out. `None` without schedstat.
fn times_of(pid: u32, tids: &[u32]) -> Option<ThreadTimes> {
    let mut out = Vec::with_capacity(tids.len());
    for &tid in tids {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")) else {
            continue;
        };
        let (run, wait) = parse_schedstat(&text)?;
        out.push((tid, run, wait));
    }
    Some(out)
}

/// The threads of process `pid` whose name starts with `prefix`
/// (`/proc/<pid>/task/<tid>/comm`).
fn named_threads(pid: u32, prefix: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| t.file_name().to_str().and_then(|t| t.parse().ok()))
        .collect()
}

/// The names fuser gives the threads that read and answer this daemon's
/// FUSE requests (`fuser-<n>`).
const REQUEST_THREADS: &str = "fuser-";

/// This daemon's request threads' times, each thread's time inside
/// handlers ([`handler_began`]) added to its run time. While *all* of
/// them are busy — running, waiting for a CPU, or blocked in a handler
/// (a disk read, a fetch) — a request a reader sent waits unread, and the
/// reader looks idle while it waits for this daemon; the daemon's other
/// threads (staging, publishing, GC, a test harness serving a mount
/// in-process) keep no reader waiting, so they are not counted. The
/// thread list is found by name and re-read once per [`RECHECK`].
fn request_thread_times() -> ThreadTimes {
    static FOUND: Mutex<Option<(Instant, Vec<u32>)>> = Mutex::new(None);
    let me = std::process::id();
    let tids = {
        let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
        match &*found {
            Some((at, tids)) if at.elapsed() < RECHECK => tids.clone(),
            _ => {
                let tids = named_threads(me, REQUEST_THREADS);
                *found = Some((Instant::now(), tids.clone()));
                tids
            }
        }
    };
    let mut times = times_of(me, &tids).unwrap_or_default();
    for (tid, run, _) in &mut times {
        *run += handler_time(*tid);
    }
    times
}

/// One request thread's time inside handlers: the total of those ended,
/// and the start of the one under way (nanoseconds since [`epoch`]; 0
/// when none is).
struct HandlerClock {
    tid: u32,
    total: AtomicU64,
    since: AtomicU64,
}

/// Every thread that ever began a handler, found by id.
static HANDLER_CLOCKS: Mutex<Vec<Arc<HandlerClock>>> = Mutex::new(Vec::new());

/// A thread's entry in [`HANDLER_CLOCKS`], removed when the thread exits
/// (so a reused thread id never finds a dead thread's clock).
struct MyClock(Arc<HandlerClock>);

impl Drop for MyClock {
    fn drop(&mut self) {
        lock(&HANDLER_CLOCKS).retain(|c| !Arc::ptr_eq(c, &self.0));
    }
}

thread_local! {
    static MY_CLOCK: MyClock = {
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::gettid() } as u32;
        let clock = Arc::new(HandlerClock {
            tid,
            total: AtomicU64::new(0),
            since: AtomicU64::new(0),
        });
        lock(&HANDLER_CLOCKS).push(Arc::clone(&clock));
        MyClock(clock)
    };
}

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch() -> u64 {
    // At least 1: 0 means "not in a handler".
    (epoch().elapsed().as_nanos() as u64).max(1)
}

/// The calling request thread begins handling a request: until
/// [`handler_ended`], it cannot read another one, whether it runs or
/// blocks (two relaxed stores; called by the fuse adapter on every request).
pub fn handler_began() {
    let now = since_epoch();
    MY_CLOCK.with(|c| c.0.since.store(now, Ordering::Relaxed));
}

/// The calling request thread finished the request [`handler_began`] began.
pub fn handler_ended() {
    let now = since_epoch();
    MY_CLOCK.with(|MyClock(c)| {
        let since = c.since.swap(0, Ordering::Relaxed);
        if since != 0 {
            c.total
                .fetch_add(now.saturating_sub(since), Ordering::Relaxed);
        }
    });
}

/// Thread `tid`'s time inside handlers so far, the one under way included.
fn handler_time(tid: u32) -> Duration {
    let clock = lock(&HANDLER_CLOCKS)
        .iter()
        .find(|c| c.tid == tid)
        .map(Arc::clone);
    let Some(c) = clock else {
        return Duration::ZERO;
    };
    // `since` first: a handler ending between the two loads is then
    // counted twice (an over-estimate keeps views), never missed.
    let since = c.since.load(Ordering::Relaxed);
    let total = c.total.load(Ordering::Relaxed);
    let current = if since == 0 {
        0
    } else {
        since_epoch().saturating_sub(since)
    };
    Duration::from_nanos(total + current)
}

/// A sample of `proc` and its parent from `/proc`. `None` when the
/// process is gone or reused, or the kernel has no schedstat.
pub fn proc_busy(proc: ProcId) -> Option<Busy> {
    let tids = tids_of(proc.pid)?;
    let own = times_of(proc.pid, &tids)?;
    let blocked = any_blocked(proc.pid, &tids);
    let stat = read_stat(proc.pid)?;
    // Checked after reading, so a pid reused meanwhile is not counted.
    if stat.start != proc.start || stat.exited {
        return None;
    }
    let parent = (stat.ppid > 1)
        .then(|| thread_times(stat.ppid).map(|t| (stat.ppid, t)))
        .flatten();
    let me = std::process::id();
    if proc.pid == me {
        // The reader is this very process: a mount served in-process
        // (tests, benchmarks), whose other threads are this daemon's and
        // other readers'. None of them is the reader's computing, and a
        // request's thread is not known to the maintenance thread that
        // samples gaps: such a reader's gaps are wall-clock pauses.
        return Some(Busy::default());
    }
    let daemon = request_thread_times();
    let driver = parent
        .as_ref()
        .and_then(|(ppid, _)| driver_wait(*ppid, proc.pid));
    Some(Busy {
        own,
        parent,
        daemon,
        blocked,
        driver,
        steal: machine_steal(),
    })
}

/// The machine's steal time so far: the eighth value of `/proc/stat`'s
/// `cpu` line, in clock ticks (zero where it cannot be read).
fn machine_steal() -> Duration {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_steal(&t, clock_ticks()))
        .unwrap_or_default()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// The steal time of a `/proc/stat` text: its first line "cpu user nice
/// system idle iowait irq softirq steal …", at `hz` ticks per second.
fn parse_steal(stat: &str, hz: u64) -> Option<Duration> {
    let line = stat.lines().next()?;
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let ticks: u64 = f.nth(7)?.parse().ok()?;
    Some(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000 / hz),
    ))
}

/// Fields 1 and 2 of a `schedstat` line: "<cpu ns> <run_delay ns>
/// <timeslices>".
fn parse_schedstat(text: &str) -> Option<(Duration, Duration)> {
    let mut f = text.split_whitespace();
    let run: u64 = f.next()?.parse().ok()?;
    let wait: u64 = f.next()?.parse().ok()?;
    Some((Duration::from_nanos(run), Duration::from_nanos(wait)))
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
    /// The process's sample at `mark_at` (`None`: not known, then gaps
    /// are wall-clock pauses). Taken when the view was taken or a move
    /// considered, and again by [`Readers::mark_quiet`] soon after each
    /// gap begins, so what is counted for a gap is what happened within
    /// it, not in the burst before it.
    mark: Option<Busy>,
    mark_at: Instant,
    /// The process's requests begun ([`Readers::begin`]) and not yet
    /// answered ([`Readers::served`]), counted while it has a view. While
    /// one is in flight the process is waiting for this daemon: whatever
    /// the clock says, it is not pausing between queries.
    in_flight: u32,
    /// While moves wait for the process's working directory to leave a
    /// live name ([`Readers::tree_for_unless`]): since when, and the last
    /// move that waited. A wait with no waiting move for
    /// [`CWD_WAIT_LIMIT`] is over (the directory was moved meanwhile);
    /// the next starts afresh.
    cwd_wait: Option<(Instant, Instant)>,
    /// The driver's wait the latest sample saw, and when it was first
    /// seen (one wait keeps the view for at most
    /// [`ViewRule::driver_call_limit`]).
    driver_since: Option<(DriverWait, Instant)>,
}

/// How long a move waits at most for the adapter to move a working
/// directory off its live name. It takes one maintenance pass, a few
/// milliseconds (a failed attempt ends the wait at once); the limit is for
/// a daemon starved of CPU for seconds, which must not freeze the view.
const CWD_WAIT_LIMIT: Duration = Duration::from_secs(5);

impl ReaderView {
    fn new(tree: Arc<Tree>, now: Instant, mark: Option<Busy>) -> ReaderView {
        let driver = mark_driver(&mark);
        ReaderView {
            tree,
            taken: now,
            last: now,
            mark,
            mark_at: now,
            in_flight: 0,
            cwd_wait: None,
            driver_since: None,
        }
        .with_sample(driver, now)
    }

    /// Notes the driver's wait of a new sample taken at `at`.
    fn with_sample(mut self, driver: Option<DriverWait>, at: Instant) -> ReaderView {
        self.note_driver(driver, at);
        self
    }

    fn note_driver(&mut self, driver: Option<DriverWait>, at: Instant) {
        self.driver_since = match (driver, self.driver_since) {
            (Some(w), Some((seen, since))) if seen == w => Some((seen, since)),
            (Some(w), _) => Some((w, at)),
            (None, _) => None,
        };
    }

    /// Whether the driver's current wait began (was first seen) at least
    /// `limit` before `now`.
    fn driver_call_too_long(&self, now: Instant, limit: Duration) -> bool {
        self.driver_since
            .is_some_and(|(_, since)| now.duration_since(since) >= limit)
    }

    /// The view moved to `tree`: a fresh view that keeps the count of the
    /// requests still in flight.
    fn moved(&self, tree: Arc<Tree>, now: Instant, mark: Option<Busy>) -> ReaderView {
        ReaderView {
            in_flight: self.in_flight,
            driver_since: self.driver_since,
            ..ReaderView::new(tree, now, mark)
        }
    }

    /// Another request of the process than the one asking is in flight
    /// (the asking one counts itself when it began under this view; when
    /// it began before the view existed, one other is missed, which only
    /// errs towards the wall-clock rule).
    fn waiting_on_daemon(&self) -> bool {
        self.in_flight > 1
    }
}

/// The driver's wait a sample saw.
fn mark_driver(sample: &Option<Busy>) -> Option<DriverWait> {
    sample.as_ref().and_then(|b| b.driver)
}

/// A gap this long (no request from the process) has its sample taken
/// by [`Readers::mark_quiet`]: shorter than any gap the rule acts on, so
/// the mark lands near the gap's start.
pub const MARK_QUIET_AFTER: Duration = Duration::from_millis(5);

/// What the process belongs to, decided once per process.
#[derive(Clone)]
struct Membership {
    session: Option<String>,
    seen: Instant,
}

/// A process's ancestors (itself first), found once.
struct Lineage {
    chain: Vec<ProcId>,
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
    /// Holders (`user.stagefs.hold`) and the tree each holds.
    holds: Mutex<HashMap<ProcId, Arc<Tree>>>,
    lineage: Mutex<HashMap<ProcId, Lineage>>,
    busy: BusySource,
    unattributed: AtomicU64,
    moves: AtomicU64,
    /// Gaps the wall clock alone would have taken as a pause that kept
    /// the view because the process was computing.
    busy_keeps: AtomicU64,
    /// Of those, the ones where its own wait for a CPU alone made it busy.
    starved_keeps: AtomicU64,
    /// Moves the rule would have made that waited for the process's
    /// working directory to leave its live name.
    cwd_keeps: AtomicU64,
    invalidations: AtomicU64,
    /// Each process's `STAGEFS_STATE_ID` (rule 10), read once.
    jobs: Mutex<HashMap<ProcId, (Option<StateId>, Instant)>>,
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
    /// kept it, because the process (or its parent) was computing: on a
    /// CPU or waiting for one.
    pub busy_keeps: u64,
    /// Of those, the ones where the process's own wait for a CPU alone
    /// made the gap busy.
    pub starved_keeps: u64,
    /// Moves that waited for the process's working directory to be moved
    /// off its table's live name.
    pub cwd_keeps: u64,
    /// Processes holding a view (`user.stagefs.hold`).
    pub holds: usize,
    /// Table entries the adapter asked the kernel to drop.
    pub dentry_invalidations: u64,
}

impl Readers {
    pub fn new(rule: ViewRule, enabled: bool) -> Readers {
        Readers::with_busy(rule, enabled, Box::new(proc_busy))
    }

    /// As [`Readers::new`], with samples from `busy` instead of `/proc`
    /// (tests simulate busy and starved processes with it).
    pub fn with_busy(rule: ViewRule, enabled: bool, busy: BusySource) -> Readers {
        Readers {
            rule,
            enabled,
            procs: ProcTable::default(),
            views: Mutex::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            holds: Mutex::new(HashMap::new()),
            lineage: Mutex::new(HashMap::new()),
            busy,
            unattributed: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            busy_keeps: AtomicU64::new(0),
            starved_keeps: AtomicU64::new(0),
            cwd_keeps: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            jobs: Mutex::new(HashMap::new()),
        }
    }

    /// The state a job process asks for (SPEC §3 rule 10): the
    /// `STAGEFS_STATE_ID` its environment was started with, unless it is a
    /// member of a session (whose state `stagefs run` put there) or views
    /// are off. Read once per process from `/proc/<pid>/environ`; nothing
    /// else of the environment is kept.
    pub fn job_state(&self, reader: Reader, snap: &Snapshot) -> Option<StateId> {
        let Reader::Process(proc) = reader else {
            return None;
        };
        if !self.enabled {
            return None;
        }
        let now = Instant::now();
        if self.session_of(proc, snap, now).is_some() {
            return None;
        }
        let mut jobs = lock(&self.jobs);
        if let Some((state, seen)) = jobs.get_mut(&proc) {
            *seen = now;
            return *state;
        }
        let state = read_job_state(proc.pid);
        jobs.insert(proc, (state, now));
        state
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
    /// its session's state, else the hold it is under, else its view
    /// (moved by the rule), else (not attributable, or views off) the
    /// newest visible state.
    pub fn tree_for(&self, reader: Reader, snap: &Snapshot) -> Arc<Tree> {
        self.tree_for_unless(reader, snap, |_, _| false)
    }

    /// As [`Readers::tree_for`], but a move the rule would make to `to`
    /// waits while `stranded(proc, to)` holds (the view keeps its state
    /// for this request): the adapter has not yet moved the process's
    /// working directory off a live name that would then answer another
    /// directory (see `View::strands_cwd`).
    pub fn tree_for_unless(
        &self,
        reader: Reader,
        snap: &Snapshot,
        stranded: impl Fn(ProcId, &Tree) -> bool,
    ) -> Arc<Tree> {
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
        if let Some((_, tree)) = self.hold_over(proc, now) {
            return tree;
        }
        // The plain path: one map operation under the lock.
        {
            let mut views = lock(&self.views);
            if let Some(v) = views.get_mut(&proc) {
                if v.waiting_on_daemon() || self.wall_decision(v, now) == Decision::Keep {
                    v.last = now;
                    return Arc::clone(&v.tree);
                }
            }
        }
        // A new view (its first mark), or a move is being considered:
        // sample outside the lock.
        let sample = (self.busy)(proc);
        let sampled_at = Instant::now();
        let mut views = lock(&self.views);
        let Some(v) = views.get_mut(&proc) else {
            let tree = Arc::clone(&snap.visible);
            views.insert(proc, ReaderView::new(Arc::clone(&tree), now, sample));
            return tree;
        };
        if v.waiting_on_daemon() || self.wall_decision(v, now) == Decision::Keep {
            // Another thread of the process made a request meanwhile.
            v.last = now;
            return Arc::clone(&v.tree);
        }
        let mut act = sample
            .as_ref()
            .zip(v.mark.as_ref())
            .map(|(s, m)| Activity::between(s, sampled_at, m, v.mark_at));
        let (age, idle) = (now.duration_since(v.taken), now.duration_since(v.last));
        if sample.is_some() {
            v.note_driver(mark_driver(&sample), sampled_at);
            v.mark = sample;
            v.mark_at = sampled_at;
        }
        if let Some(a) = act.as_mut() {
            a.driver_waiting &= !v.driver_call_too_long(sampled_at, self.rule.driver_call_limit);
        }
        match decide(&self.rule, age, idle, act) {
            Decision::Keep | Decision::KeepBusy => {
                self.count_busy_keep(act);
                tracing::debug!(
                    pid = proc.pid,
                    at = %v.tree.state_id,
                    age_ms = age.as_millis() as u64,
                    idle_ms = idle.as_millis() as u64,
                    activity = ?act.map(ActivityMs::from),
                    "view kept: computing"
                );
                v.last = now;
                return Arc::clone(&v.tree);
            }
            Decision::Move => {}
        }
        // Never backwards: a check by another thread may have moved the
        // view past `snap` meanwhile.
        let tree = if v.tree.state_id > snap.visible.state_id {
            Arc::clone(&v.tree)
        } else {
            Arc::clone(&snap.visible)
        };
        let since = match v.cwd_wait {
            Some((since, last)) if now.duration_since(last) < CWD_WAIT_LIMIT => since,
            _ => now,
        };
        let waited_long = now.duration_since(since) >= CWD_WAIT_LIMIT;
        if v.tree.state_id != tree.state_id && !waited_long && stranded(proc, &tree) {
            v.cwd_wait = Some((since, now));
            self.cwd_keeps.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                pid = proc.pid,
                at = %v.tree.state_id,
                to = %tree.state_id,
                "view kept: its working directory is not yet moved off the live name"
            );
            v.last = now;
            return Arc::clone(&v.tree);
        }
        if v.tree.state_id != tree.state_id {
            self.moves.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                pid = proc.pid,
                from = %v.tree.state_id,
                to = %tree.state_id,
                age_ms = age.as_millis() as u64,
                idle_ms = idle.as_millis() as u64,
                activity = ?act.map(ActivityMs::from),
                "view moved"
            );
        }
        let mark = v.mark.take();
        let mark_at = v.mark_at;
        *v = v.moved(tree, now, mark);
        v.mark_at = mark_at;
        Arc::clone(&v.tree)
    }

    fn count_busy_keep(&self, act: Option<Activity>) {
        self.busy_keeps.fetch_add(1, Ordering::Relaxed);
        let starved = act.is_some_and(|a| {
            a.span >= self.rule.min_span
                && a.wait.as_nanos() * 100 >= a.span.as_nanos() * u128::from(self.rule.busy_percent)
        });
        if starved {
            self.starved_keeps.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request from thread `pid` begins: until it is answered
    /// ([`Readers::served`]) its process waits for this daemon, and no
    /// other request of it sees a gap (a thread blocked on a slow read —
    /// a disk under load, a fetch on a reader host — is inside a query,
    /// not between two). One cached lookup and one map update; nothing
    /// for a process without a view.
    pub fn begin(&self, pid: u32) {
        let Some(proc) = self.view_of_thread(pid) else {
            return;
        };
        if let Some(v) = lock(&self.views).get_mut(&proc) {
            v.in_flight += 1;
        }
    }

    /// A request from thread `pid` was answered: its process's current
    /// gap starts now. Called after every request, not only those that
    /// resolve a root- or database-level name, so the time a process
    /// spends inside a table (or blocked on this daemon's replies) is not
    /// counted as a pause. One cached lookup and one map update; nothing
    /// for a process without a view.
    pub fn served(&self, pid: u32) {
        let Some(proc) = self.view_of_thread(pid) else {
            return;
        };
        let now = Instant::now();
        if let Some(v) = lock(&self.views).get_mut(&proc) {
            v.last = v.last.max(now);
            v.in_flight = v.in_flight.saturating_sub(1);
        }
    }

    /// The process of thread `pid`, when views are on and it is known.
    fn view_of_thread(&self, pid: u32) -> Option<ProcId> {
        if !self.enabled || pid == 0 {
            return None;
        }
        self.procs.identify(pid, Instant::now())
    }

    /// Samples every process whose gap began at least
    /// [`MARK_QUIET_AFTER`] ago and has no mark since, so that what is
    /// counted for that gap when it ends is what happened within it.
    /// Called by the fuse adapter's maintenance thread every few
    /// milliseconds; a mark it misses (that thread starved) leaves an
    /// older one, which only errs towards keeping a view.
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
            let Some(sample) = (self.busy)(proc) else {
                continue;
            };
            let at = Instant::now();
            if let Some(v) = lock(&self.views).get_mut(&proc) {
                v.note_driver(sample.driver, at);
                v.mark = Some(sample);
                v.mark_at = at;
            }
        }
    }

    /// What the rule says about `v`'s gap on wall-clock time alone
    /// (`Keep`: no move is considered, nothing needs sampling).
    fn wall_decision(&self, v: &ReaderView, now: Instant) -> Decision {
        decide(
            &self.rule,
            now.duration_since(v.taken),
            now.duration_since(v.last),
            None,
        )
    }

    /// Read-your-check: `reader` just learnt that `snap.visible` is
    /// visible; its view moves there now (a session's never moves; a
    /// hold it is under moves there and stays).
    pub fn checked(&self, reader: Reader, snap: &Snapshot) {
        let Reader::Process(proc) = reader else {
            return;
        };
        if !self.enabled || self.session_of(proc, snap, Instant::now()).is_some() {
            return;
        }
        if let Some((holder, _)) = self.hold_over(proc, Instant::now()) {
            self.hold_at(holder, snap);
            return;
        }
        // A fresh mark: what the process did before the check is not
        // charged to the next gap (a read of /proc, but a check is rare).
        let fresh = (self.busy)(proc);
        let now = Instant::now();
        let mut views = lock(&self.views);
        // Never backwards: another thread of the process may have moved
        // the view past `snap` (taken before this thread got the lock).
        let tree = match views.get(&proc) {
            Some(v) if v.tree.state_id > snap.visible.state_id => Arc::clone(&v.tree),
            _ => Arc::clone(&snap.visible),
        };
        let old_mark = views.get_mut(&proc).and_then(|v| v.mark.take());
        let mark = fresh.or(old_mark);
        let new_id = tree.state_id;
        let view = match views.get(&proc) {
            Some(v) => v.moved(tree, now, mark),
            None => ReaderView::new(tree, now, mark),
        };
        let old = views.insert(proc, view);
        if old.is_some_and(|v| v.tree.state_id != new_id) {
            self.moves.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `user.stagefs.hold` read by `reader`: it (and every process below
    /// it) sees the newest visible state from now until its next read of
    /// `hold`, a read-your-check, or [`Readers::release`]. Returns the
    /// state held; `None` for an unattributable reader or views off.
    pub fn hold(&self, reader: Reader, snap: &Snapshot) -> Option<StateId> {
        let Reader::Process(proc) = reader else {
            return None;
        };
        if !self.enabled {
            return None;
        }
        Some(self.hold_at(proc, snap))
    }

    /// `holder` holds the newest of `snap.visible` and what it and the
    /// processes below it were shown (never backwards).
    fn hold_at(&self, holder: ProcId, snap: &Snapshot) -> StateId {
        let now = Instant::now();
        let under = self.hold_over(holder, now).map(|(_, t)| t);
        let own_view = lock(&self.views).get(&holder).map(|v| Arc::clone(&v.tree));
        let mut holds = lock(&self.holds);
        let mut tree = Arc::clone(&snap.visible);
        for t in [holds.get(&holder).cloned(), under, own_view]
            .into_iter()
            .flatten()
        {
            if t.state_id > tree.state_id {
                tree = t;
            }
        }
        let id = tree.state_id;
        let old = holds.insert(holder, tree);
        if old.is_none_or(|t| t.state_id != id) {
            self.moves.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(pid = holder.pid, to = %id, "view held");
        }
        id
    }

    /// `setfattr -x user.stagefs.hold` by `reader`: its hold ends; it and
    /// the processes below it take the newest visible state at their next
    /// request. False when it held nothing.
    pub fn release(&self, reader: Reader) -> bool {
        let Reader::Process(proc) = reader else {
            return false;
        };
        self.drop_hold(proc)
    }

    fn drop_hold(&self, holder: ProcId) -> bool {
        if lock(&self.holds).remove(&holder).is_none() {
            return false;
        }
        // Their views are older than the held state: fresh ones (the
        // newest visible, at least the held state) keep them moving
        // forward.
        let below: Vec<ProcId> = lock(&self.lineage)
            .iter()
            .filter(|(_, l)| l.chain.contains(&holder))
            .map(|(p, _)| *p)
            .collect();
        let mut views = lock(&self.views);
        views.remove(&holder);
        for p in below {
            views.remove(&p);
        }
        true
    }

    /// The nearest holder among `proc` and its ancestors, and its tree.
    fn hold_over(&self, proc: ProcId, now: Instant) -> Option<(ProcId, Arc<Tree>)> {
        if lock(&self.holds).is_empty() {
            return None;
        }
        let chain = self.lineage_of(proc, now);
        let holds = lock(&self.holds);
        chain
            .iter()
            .find_map(|p| holds.get(p).map(|t| (*p, Arc::clone(t))))
    }

    /// `proc` and its ancestors, nearest first (walked once, cached).
    fn lineage_of(&self, proc: ProcId, now: Instant) -> Vec<ProcId> {
        if let Some(l) = lock(&self.lineage).get_mut(&proc) {
            l.seen = now;
            return l.chain.clone();
        }
        let chain = ancestors(proc);
        lock(&self.lineage).insert(
            proc,
            Lineage {
                chain: chain.clone(),
                seen: now,
            },
        );
        chain
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

    /// The state of the session `proc` belongs to, if any.
    pub fn session_tree_of(&self, proc: ProcId, snap: &Snapshot) -> Option<Arc<Tree>> {
        self.session_tree(proc, snap, Instant::now())
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

    /// Periodic upkeep: forgets the views of exited processes and of
    /// processes idle (no request) for the hard age that are not
    /// computing ([`Readers::rests`]; for [`FORGET_BUSY`] at most), the
    /// holds of exited holders, and stale caches; returns the sessions
    /// whose leader has exited, for the caller to close.
    ///
    /// A live process's view is not forgotten at the quiet gap: only the
    /// request that ends a gap can tell a pause from computing.
    pub fn maintain(&self, snap: &Snapshot) -> Vec<String> {
        let now = Instant::now();
        let idle: Vec<ProcId> = lock(&self.views)
            .iter()
            .filter(|(_, v)| v.in_flight == 0 && now.duration_since(v.last) >= self.rule.quiet_gap)
            .map(|(p, _)| *p)
            .collect();
        let forgotten: Vec<ProcId> = idle
            .into_iter()
            .filter(|p| !is_alive(*p) || self.rests(*p, now))
            .collect();
        if !forgotten.is_empty() {
            let mut views = lock(&self.views);
            for p in forgotten {
                views.remove(&p);
            }
        }
        let holders: Vec<ProcId> = lock(&self.holds).keys().copied().collect();
        for h in holders.into_iter().filter(|h| !is_alive(*h)) {
            self.drop_hold(h);
        }
        self.procs.forget_older(now);
        lock(&self.members).retain(|_, m| now.duration_since(m.seen) < FORGET_PROC);
        lock(&self.lineage).retain(|_, l| now.duration_since(l.seen) < FORGET_PROC);
        lock(&self.jobs).retain(|_, (_, seen)| now.duration_since(*seen) < FORGET_PROC);
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

    /// Whether `proc`'s view, idle for at least the hard age, can be
    /// forgotten (its next request then takes the newest state, and the
    /// view no longer keeps its state from GC): only when the rule would
    /// move it were a request to come now. A query engine computing for
    /// more than the hard age between two requests of one query (Spark
    /// planning on a starved host: 13 s measured at load 17) keeps it.
    fn rests(&self, proc: ProcId, now: Instant) -> bool {
        let (age, idle, mark, mark_at) = match lock(&self.views).get(&proc) {
            Some(v) if v.in_flight == 0 => (
                now.duration_since(v.taken),
                now.duration_since(v.last),
                v.mark.clone(),
                v.mark_at,
            ),
            _ => return false,
        };
        if idle < self.rule.hard_age {
            return false;
        }
        if idle >= FORGET_BUSY {
            return true;
        }
        let sample = (self.busy)(proc);
        let act = sample
            .as_ref()
            .zip(mark.as_ref())
            .map(|(s, m)| Activity::between(s, Instant::now(), m, mark_at));
        decide(&self.rule, age, idle, act) == Decision::Move
    }

    /// Trees that views and holds use: GC roots (their files stay
    /// readable).
    pub fn held_trees(&self) -> Vec<Arc<Tree>> {
        let mut out: Vec<Arc<Tree>> = lock(&self.views)
            .values()
            .map(|v| Arc::clone(&v.tree))
            .collect();
        out.extend(lock(&self.holds).values().cloned());
        out
    }

    /// Every tree a reader's root- and database-level names resolve in
    /// now, besides the visible one: views, holds, `stagefs run`
    /// sessions and the states of `STAGEFS_STATE_ID` jobs (pins aside).
    pub fn answering_trees(&self, snap: &Snapshot) -> Vec<Arc<Tree>> {
        let mut out = self.held_trees();
        let states = snap.pins.sessions.values().map(|h| h.state);
        let jobs: Vec<StateId> = lock(&self.jobs).values().filter_map(|(s, _)| *s).collect();
        out.extend(
            states
                .chain(jobs)
                .filter_map(|id| snap.versions.get(&id).cloned()),
        );
        out
    }

    /// The adapter invalidated one table entry (for status and benchmarks).
    pub fn count_invalidation(&self) {
        self.invalidations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn summary(&self) -> ReadersSummary {
        let holds = lock(&self.holds);
        let views = lock(&self.views);
        let mut oldest = None::<StateId>;
        for id in views
            .values()
            .map(|v| v.tree.state_id)
            .chain(holds.values().map(|t| t.state_id))
        {
            oldest = Some(oldest.map_or(id, |o| o.min(id)));
        }
        ReadersSummary {
            views: views.len(),
            oldest_view: oldest,
            unattributed_requests: self.unattributed.load(Ordering::Relaxed),
            view_moves: self.moves.load(Ordering::Relaxed),
            busy_keeps: self.busy_keeps.load(Ordering::Relaxed),
            starved_keeps: self.starved_keeps.load(Ordering::Relaxed),
            cwd_keeps: self.cwd_keeps.load(Ordering::Relaxed),
            holds: holds.len(),
            dentry_invalidations: self.invalidations.load(Ordering::Relaxed),
        }
    }
}

/// An [`Activity`] in milliseconds, for the debug log.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug only
struct ActivityMs {
    span: u64,
    run: u64,
    wait: u64,
    parent: u64,
    daemon_wait: u64,
    driver_waiting: bool,
    steal: u64,
}

impl From<Activity> for ActivityMs {
    fn from(a: Activity) -> Self {
        let ms = |d: Duration| d.as_millis() as u64;
        ActivityMs {
            span: ms(a.span),
            run: ms(a.run),
            wait: ms(a.wait),
            parent: ms(a.parent),
            daemon_wait: ms(a.daemon_wait),
            driver_waiting: a.driver_waiting,
            steal: ms(a.steal),
        }
    }
}

/// The working directories of every process we can see that lie under
/// `mount` (readlink of `/proc/<pid>/cwd`; processes of other users are
/// skipped when the daemon is not root).
/// The working directory of process `pid`, as `/proc` names it; an
/// unhashed one (its name taken by another directory) without the
/// " (deleted)" mark.
pub fn cwd_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
        .ok()
        .map(without_deleted_mark)
}

fn without_deleted_mark(p: PathBuf) -> PathBuf {
    match p.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(s) => PathBuf::from(s),
        None => p,
    }
}

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
        .map(without_deleted_mark)
        .filter(|p| p.starts_with(mount))
        .collect()
}

/// `proc` and its ancestors up to (not including) init, nearest first.
fn ancestors(proc: ProcId) -> Vec<ProcId> {
    let mut chain = vec![proc];
    let mut at = proc;
    // A parent chain is short; the bound only guards against a loop
    // through a pid reused while we walk.
    for _ in 0..128 {
        let Some(stat) = read_stat(at.pid) else {
            break;
        };
        if stat.ppid <= 1 {
            break;
        }
        let Some(parent) = read_stat(stat.ppid) else {
            break;
        };
        // A parent started after its child is a reused pid: the real
        // parent is gone.
        if parent.start > at.start {
            break;
        }
        at = ProcId {
            pid: stat.ppid,
            start: parent.start,
        };
        chain.push(at);
    }
    chain
}

/// The session whose leader is `proc` or its nearest ancestor.
fn find_session(
    proc: ProcId,
    sessions: &std::collections::BTreeMap<String, SessionHold>,
) -> Option<String> {
    ancestors(proc).into_iter().find_map(|p| {
        sessions
            .iter()
            .find(|(_, h)| h.pid == p.pid && h.start == p.start)
            .map(|(id, _)| id.clone())
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single map operation; a panic elsewhere cannot
    // leave a map half-changed.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::thread;

    #[test]
    fn a_job_state_is_read_from_its_variable_alone() {
        let env = b"PATH=/bin\0STAGEFS_STATE_IDX=7\0STAGEFS_STATE_ID=42\0HOME=/root\0";
        assert_eq!(job_state_in(env), Some(StateId(42)));
        assert_eq!(job_state_in(b"STAGEFS_STATE_ID=x\0"), None);
        assert_eq!(job_state_in(b"A=1\0"), None);
        assert_eq!(job_state_in(b""), None);
    }

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

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A gap's activity: span, own run, own wait, parent (ms).
    fn act(span: u64, run: u64, wait: u64, parent: u64) -> Option<Activity> {
        Some(Activity {
            span: ms(span),
            run: ms(run),
            wait: ms(wait),
            parent: ms(parent),
            daemon_wait: Duration::ZERO,
            blocked: false,
            driver_waiting: false,
            steal: Duration::ZERO,
        })
    }

    #[test]
    fn view_rule_keeps_bursts_and_moves_pollers() {
        let rule = ViewRule::default();
        let d = |age: u64, idle: u64, a: Option<Activity>| decide(&rule, ms(age), ms(idle), a);
        use Decision::*;
        // A burst several seconds long with small gaps stays, unsampled.
        assert_eq!(d(5_000, 5, None), Keep);
        // A pause of the quiet gap moves, at any age.
        assert_eq!(d(300, 260, None), Move);
        assert_eq!(d(300, 260, act(250, 3, 1, 0)), Move);
        // A young view survives a poller's pause; an old one moves once
        // the pause reaches the poll gap.
        assert_eq!(d(1_000, 160, act(150, 1, 0, 0)), Keep);
        assert_eq!(d(2_100, 30, act(20, 1, 0, 0)), Keep);
        assert_eq!(d(2_100, 60, act(50, 1, 0, 0)), Move);
        // ... unless it computed through the pause.
        assert_eq!(d(2_100, 60, act(50, 10, 5, 0)), KeepBusy);
        // Past the hard age, short gaps still keep it: a gap shorter
        // than the poll gap is inside a query, however old the view.
        assert_eq!(d(10_500, 5, None), Keep);
        assert_eq!(d(10_500, 15, None), Keep);
        assert_eq!(d(10_500, 45, act(40, 1, 0, 0)), Move);
        assert_eq!(d(10_500, 45, act(40, 8, 3, 0)), KeepBusy);
    }

    /// The gaps measured on real engines (docs/SEMANTICS.md "Readers"),
    /// as the daemon samples them.
    #[test]
    fn a_computing_gap_is_no_pause() {
        let rule = ViewRule::default();
        let d = |age: u64, idle: u64, a: Option<Activity>| decide(&rule, ms(age), ms(idle), a);
        use Decision::*;
        // A Spark driver plans between its listing and its reads: 700 ms
        // without a request, its threads on a CPU for 400 ms of it.
        assert_eq!(d(900, 700, act(690, 400, 20, 0)), KeepBusy);
        // The same on a loaded host: little CPU, much run-queue wait.
        assert_eq!(d(900, 700, act(690, 60, 150, 0)), KeepBusy);
        // Its driver (the parent, py4j) computing while the JVM waits.
        assert_eq!(d(900, 700, act(690, 10, 0, 170)), KeepBusy);
        // Just under a quarter busy: a pause.
        assert_eq!(d(900, 700, act(690, 100, 60, 10)), Move);
        // Between two queries the driver sleeps: a pause, it moves.
        assert_eq!(d(900, 400, act(390, 20, 5, 2)), Move);
        // Past the hard age its parent's work does not keep it: the
        // bound counts only the process's own threads.
        assert_eq!(d(10_500, 400, act(390, 20, 5, 390)), Move);
        // A view 10 s old whose process computed through the whole gap
        // (threads summed over the span) stays: one long query.
        assert_eq!(d(10_500, 400, act(390, 300, 85, 0)), KeepBusy);
        // Samples too close together to tell: kept, measured afresh.
        assert_eq!(d(900, 700, act(5, 0, 0, 0)), KeepBusy);
        // A JVM idle for 15 ms mid-query, its view 10 s old on a host at
        // load 17 (measured: Spark, whose queries then take 5–34 s):
        // not a pause, whatever the view's age.
        assert_eq!(d(39_000, 15, act(15, 0, 0, 0)), Keep);
        assert_eq!(d(10_782, 30, act(30, 0, 17, 0)), Keep);
        // The same JVM 99 ms without a request, a third of it waiting
        // for a CPU (measured, mid-query): computing.
        assert_eq!(d(10_782, 99, act(99, 0, 30, 0)), KeepBusy);
        // Blocked on a request this daemon had yet to read.
        let blocked = Some(Activity {
            daemon_wait: ms(19),
            ..act(60, 0, 0, 0).unwrap()
        });
        assert_eq!(d(39_000, 60, blocked), KeepBusy);
        assert_eq!(d(39_000, 60, act(60, 0, 0, 0)), Move);
        // Likewise a quiet gap spent blocked on a starved daemon.
        let blocked = Some(Activity {
            daemon_wait: ms(100),
            ..act(300, 0, 0, 0).unwrap()
        });
        assert_eq!(d(900, 310, blocked), KeepBusy);
    }

    #[test]
    fn a_thread_blocked_in_the_kernel_makes_a_gap_no_pause() {
        assert_eq!(thread_state("12 (java) D 1 2 3"), Some('D'));
        assert_eq!(thread_state("12 (a) S (b)) R 1 2"), Some('R'));
        assert_eq!(thread_state("12 (sleep) S 1"), Some('S'));
        assert_eq!(thread_state("garbage"), None);
        let rule = ViewRule::default();
        let blocked = |span: u64| {
            let mut a = act(span, 0, 0, 0).unwrap();
            a.blocked = true;
            Some(a)
        };
        // Old view, long idle gap with no thread on a CPU: the hard and
        // the quiet rule would move it, but a thread was waiting for a
        // disk (or a page of the mount) the whole time.
        assert_eq!(
            decide(&rule, ms(60_000), ms(300), blocked(290)),
            Decision::KeepBusy
        );
        assert_eq!(
            decide(&rule, ms(60_000), ms(300), act(290, 0, 0, 0)),
            Decision::Move
        );
        // This process's own threads are sampled, and none is blocked.
        let me = proc_of_pid(std::process::id()).unwrap();
        let tids = tids_of(me.pid).unwrap();
        assert!(!tids.is_empty());
        assert!(!any_blocked(me.pid, &[]));
    }

    #[test]
    fn request_threads_are_found_by_name() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        // Not fuser's prefix: another test may sample this process.
        let t = std::thread::Builder::new()
            .name("stagefs-rq-test".into())
            .spawn(move || {
                tx.send(unsafe { libc::gettid() } as u32).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        let me = std::process::id();
        let found = named_threads(me, "stagefs-rq-");
        let times = times_of(me, &found).expect("schedstat");
        let _ = stop_tx.send(());
        t.join().unwrap();
        assert_eq!(found, vec![tid]);
        assert_eq!(times.len(), 1);
        assert_eq!(times[0].0, tid);
        assert!(named_threads(me, "no-such-thread-").is_empty());
        // A thread gone since it was found is left out, not an error.
        assert_eq!(times_of(me, &[tid]), Some(vec![]));
    }

    #[test]
    fn a_request_waits_unread_no_longer_than_the_least_busy_request_thread() {
        // Two request threads: one busy throughout (serving other
        // readers), one idle for most of the gap: a request of this
        // process would have been read by the idle one.
        let mark = vec![(1, ms(100), ms(10)), (2, ms(50), ms(5))];
        let now = vec![(1, ms(160), ms(50)), (2, ms(52), ms(6))];
        assert_eq!(least_grown(&now, &mark), ms(3));
        // Both busy: the less busy one bounds the wait.
        let now = vec![(1, ms(160), ms(50)), (2, ms(130), ms(45))];
        assert_eq!(least_grown(&now, &mark), ms(100));
        // A thread only one sample has tells nothing; none in common: 0.
        let now = vec![(1, ms(160), ms(50)), (3, ms(0), ms(0))];
        assert_eq!(least_grown(&now, &mark), ms(100));
        assert_eq!(least_grown(&vec![(3, ms(9), ms(9))], &mark), ms(0));
    }

    #[test]
    fn a_request_thread_is_busy_while_inside_a_handler() {
        let tid = unsafe { libc::gettid() } as u32;
        handler_began();
        std::thread::sleep(ms(20));
        let under_way = handler_time(tid);
        assert!(under_way >= ms(20), "{under_way:?}");
        handler_ended();
        let ended = handler_time(tid);
        assert!(ended >= under_way, "{ended:?}");
        std::thread::sleep(ms(20));
        assert_eq!(handler_time(tid), ended, "no handler under way");
        // A thread that exited leaves no clock behind.
        let other = std::thread::spawn(|| {
            handler_began();
            handler_ended();
            (unsafe { libc::gettid() }) as u32
        })
        .join()
        .unwrap();
        assert_eq!(handler_time(other), Duration::ZERO);
    }

    #[test]
    fn schedstat_run_delay_is_the_second_field() {
        assert_eq!(
            parse_schedstat("123 4567 8\n"),
            Some((Duration::from_nanos(123), Duration::from_nanos(4567)))
        );
        assert_eq!(parse_schedstat("123\n"), None);
        let me = proc_of_pid(std::process::id()).expect("this process");
        // In-process (this test is the reader of its own mount): nothing
        // counted, its gaps are wall-clock pauses.
        let b = proc_busy(me).expect("this process");
        assert!(b.own.is_empty() && b.parent.is_none() && b.daemon.is_empty());
        // Another process: its threads, its parent (this process) and
        // this daemon's request threads (none here: no mount is served).
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let c = proc_of_pid(child.id()).expect("the child");
        let b = proc_busy(c).expect("schedstat of the child");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(b.own.len(), 1, "sleep has one thread");
        assert_eq!(b.parent.as_ref().map(|p| p.0), Some(me.pid), "the parent");
        assert!(b.daemon.is_empty(), "no request threads: {:?}", b.daemon);
        // Threads count summed; a new thread wholly, a gone one not.
        let mark = vec![
            (1, ms(100), ms(10)),
            (2, ms(100), ms(10)),
            (4, ms(5), ms(5)),
        ];
        let now = vec![
            (1, ms(150), ms(12)),
            (2, ms(180), ms(10)),
            (3, ms(90), ms(1)),
        ];
        assert_eq!(grown(&now, &mark), (ms(50 + 80 + 90), ms(2 + 1)));
        let gone = ProcId {
            pid: me.pid,
            start: me.start + 1,
        };
        assert_eq!(proc_busy(gone), None, "a reused pid is not counted");
        // A parent that changed (reparented) counts nothing.
        let t0 = Instant::now();
        let t1 = t0 + ms(100);
        let before = Busy {
            own: vec![],
            parent: Some((7, vec![(7, ms(10), ms(0))])),
            daemon: vec![(1, ms(0), ms(3))],
            blocked: false,
            driver: None,
            steal: Duration::ZERO,
        };
        let after = Busy {
            own: vec![],
            parent: Some((9, vec![(9, ms(500), ms(0))])),
            daemon: vec![],
            blocked: false,
            driver: None,
            steal: Duration::ZERO,
        };
        assert_eq!(Activity::between(&after, t1, &before, t0).parent, ms(0));
        let same = Busy {
            own: vec![],
            parent: Some((7, vec![(7, ms(40), ms(5))])),
            daemon: vec![(1, ms(9), ms(10))],
            blocked: false,
            driver: None,
            steal: Duration::ZERO,
        };
        let a = Activity::between(&same, t1, &before, t0);
        assert_eq!((a.span, a.parent, a.daemon_wait), (ms(100), ms(35), ms(16)));
    }

    /// Readers whose processes' wait for a CPU is what the test sets
    /// (ms); they never run, and have no parent.
    fn simulated(rule: ViewRule) -> (Readers, Arc<AtomicU64>) {
        let delay = Arc::new(AtomicU64::new(0));
        let d = Arc::clone(&delay);
        let readers = Readers::with_busy(
            rule,
            true,
            Box::new(move |_| {
                Some(Busy {
                    own: vec![(1, Duration::ZERO, ms(d.load(Ordering::Relaxed)))],
                    parent: None,
                    daemon: vec![],
                    blocked: false,
                    driver: None,
                    steal: Duration::ZERO,
                })
            }),
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

    /// A move that would strand the process's working directory on a
    /// live name waits for the adapter to move it (a burst stays where it
    /// is), then happens at the next pause; a directory that is never
    /// moved holds the view back for at most `CWD_WAIT_LIMIT`.
    #[test]
    fn a_move_waits_for_the_working_directory_to_leave_the_live_name() {
        let (r, _delay) = simulated(ViewRule::default());
        let stranded = AtomicBool::new(true);
        let strands = |_: ProcId, to: &Tree| {
            assert_eq!(to.state_id, StateId(2), "only a move is asked about");
            stranded.load(Ordering::Relaxed)
        };
        assert_eq!(
            r.tree_for_unless(me(), &snap_at(1), strands).state_id,
            StateId(1)
        );
        thread::sleep(Duration::from_millis(300));
        assert_eq!(
            r.tree_for_unless(me(), &snap_at(2), strands).state_id,
            StateId(1)
        );
        assert_eq!(
            r.tree_for_unless(me(), &snap_at(2), strands).state_id,
            StateId(1)
        );
        assert_eq!(r.summary().cwd_keeps, 1);
        // Moved off the live name: the next pause moves the view.
        stranded.store(false, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(300));
        assert_eq!(
            r.tree_for_unless(me(), &snap_at(2), strands).state_id,
            StateId(2)
        );
        assert_eq!(r.summary().view_moves, 1);

        // Never moved: the view waits no longer than the limit.
        stranded.store(true, Ordering::Relaxed);
        let started = Instant::now();
        let mut at = StateId(2);
        while at == StateId(2) {
            thread::sleep(Duration::from_millis(300));
            at = r
                .tree_for_unless(me(), &snap_at(3), |_, _| stranded.load(Ordering::Relaxed))
                .state_id;
            assert!(
                started.elapsed() < CWD_WAIT_LIMIT * 3,
                "the view never moved"
            );
        }
        assert_eq!(at, StateId(3));
        assert!(started.elapsed() >= CWD_WAIT_LIMIT);
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
            min_span: Duration::from_millis(5),
            busy_percent: 25,
            driver_call_limit: Duration::from_millis(600),
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
            min_span: Duration::from_millis(5),
            busy_percent: 25,
            driver_call_limit: FORGET_BUSY,
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

    /// One thread of a query blocked on a slow read (a disk under load, a
    /// fetch on a reader host) while another thread of it resolves a
    /// table name: the process is waiting for this daemon, not pausing,
    /// however long the read takes and however old the view; once the
    /// read is answered and the process really pauses, the view moves.
    #[test]
    fn a_request_in_flight_is_no_pause() {
        let (r, _delay) = simulated(quick_rule());
        let pid = std::process::id();
        r.begin(pid); // the table lookup that makes the view
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        r.served(pid);
        r.begin(pid); // the slow read
        thread::sleep(quick_rule().hard_age + ms(100));
        r.maintain(&snap_at(2));
        assert_eq!(r.summary().views, 1, "maintenance forgot a waiting view");
        r.begin(pid); // another thread's lookup
        assert_eq!(
            r.tree_for(me(), &snap_at(2)).state_id,
            StateId(1),
            "a lookup beside a read in flight moved the view"
        );
        r.served(pid);
        r.served(pid); // the read is answered
        thread::sleep(quick_rule().quiet_gap + ms(20));
        r.begin(pid);
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(2));
        r.served(pid);
        // A move keeps the count: with one request in flight across it,
        // a later lookup beside it keeps the new view.
        r.begin(pid);
        thread::sleep(quick_rule().quiet_gap + ms(20));
        r.begin(pid);
        assert_eq!(r.tree_for(me(), &snap_at(3)).state_id, StateId(2));
        r.served(pid);
        r.served(pid);
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
        // A process that waits for a CPU through most of every gap is
        // inside one long query, past the hard age too: it keeps its view
        // until it really pauses.
        let rule = quick_rule();
        let (r, delay) = simulated(rule);
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        let start = Instant::now();
        let mut since = start;
        while start.elapsed() < rule.hard_age * 2 {
            thread::sleep(Duration::from_millis(30));
            starve(&delay, &mut since, 10);
            assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(1));
        }
        thread::sleep(rule.quiet_gap + ms(20));
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(2));
    }

    /// `user.stagefs.hold`: the holder and every process below it see the
    /// held state until the next read of it, a check, or the release.
    #[test]
    fn a_hold_keeps_the_holder_and_its_children_until_released() {
        let (r, _delay) = simulated(quick_rule());
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        assert_eq!(r.hold(me(), &snap_at(2)), Some(StateId(2)));
        // A child of this process is under the hold too.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let kid = Reader::Process(proc_of_pid(child.id()).expect("child"));
        assert_eq!(r.tree_for(kid, &snap_at(3)).state_id, StateId(2));
        // A quiet pause and the hard age move no held view.
        thread::sleep(quick_rule().hard_age + ms(100));
        assert_eq!(r.tree_for(me(), &snap_at(3)).state_id, StateId(2));
        assert_eq!(r.tree_for(kid, &snap_at(3)).state_id, StateId(2));
        assert_eq!(r.summary().holds, 1);
        assert!(r.held_trees().iter().any(|t| t.state_id == StateId(2)));
        // The next read of `hold` moves it (never backwards).
        assert_eq!(r.hold(me(), &snap_at(4)), Some(StateId(4)));
        assert_eq!(r.hold(me(), &snap_at(3)), Some(StateId(4)));
        assert_eq!(r.tree_for(kid, &snap_at(4)).state_id, StateId(4));
        // A check by a process under the hold moves the hold.
        r.checked(kid, &snap_at(5));
        assert_eq!(r.tree_for(me(), &snap_at(5)).state_id, StateId(5));
        // Released: both take the newest state at their next request.
        assert!(r.release(me()));
        assert!(!r.release(me()), "a second release found a hold");
        assert_eq!(r.tree_for(me(), &snap_at(6)).state_id, StateId(6));
        assert_eq!(r.tree_for(kid, &snap_at(6)).state_id, StateId(6));
        assert_eq!(r.summary().holds, 0);
        // A holder that exits lets go at the next maintenance pass.
        assert_eq!(r.hold(kid, &snap_at(7)), Some(StateId(7)));
        child.kill().expect("kill");
        child.wait().expect("reap");
        r.maintain(&snap_at(7));
        assert_eq!(r.summary().holds, 0, "an exited holder's hold stayed");
        assert_eq!(r.hold(Reader::Unattributed, &snap_at(7)), None);
    }

    /// The CPU-time rule through [`Readers`]: a gap in which the process
    /// ran keeps its view and is counted; a sleep moves it.
    #[test]
    fn a_process_computing_through_a_gap_keeps_its_view() {
        let run = Arc::new(AtomicU64::new(0));
        let r2 = Arc::clone(&run);
        let r = Readers::with_busy(
            quick_rule(),
            true,
            Box::new(move |_| {
                Some(Busy {
                    own: vec![(1, ms(r2.load(Ordering::Relaxed)), Duration::ZERO)],
                    parent: None,
                    daemon: vec![],
                    blocked: false,
                    driver: None,
                    steal: Duration::ZERO,
                })
            }),
        );
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        // 150 ms pass, 120 of them on a CPU (planning).
        let t0 = Instant::now();
        thread::sleep(ms(150));
        run.fetch_add(t0.elapsed().as_millis() as u64 - 30, Ordering::Relaxed);
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(1));
        let s = r.summary();
        assert_eq!((s.busy_keeps, s.starved_keeps, s.view_moves), (1, 0, 0));
        // Then it sleeps: a pause.
        thread::sleep(ms(150));
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(2));
        assert_eq!(r.summary().view_moves, 1);
    }

    /// A gap in which the hypervisor took the machine's CPUs (steal) is
    /// no pause: a thread running on a stolen CPU neither runs nor waits
    /// by its own counters (measured: a Python walker mid-walk, 34 ms
    /// with no run and no wait at load 13–34 on this 2-vCPU VM, its view
    /// moved between its listing and its opens).
    #[test]
    fn a_gap_the_hypervisor_took_is_no_pause() {
        let stat = "cpu  3409088 30306 1633499 636796 18782 0 16758 2555 0 0\n\
                    cpu0 1740956 12134 767536 343635 4547 0 3523 1305 0 0\n";
        assert_eq!(parse_steal(stat, 100), Some(Duration::from_millis(25_550)));
        assert_eq!(parse_steal("cpu0 1 2 3 4 5 6 7 8\n", 100), None);
        assert_eq!(parse_steal("cpu  1 2 3\n", 100), None);
        assert!(machine_steal() < Duration::from_secs(365 * 86_400));
        let rule = ViewRule::default();
        let with_steal = |steal: u64| {
            let mut a = act(34, 0, 0, 0).unwrap();
            a.steal = ms(steal);
            Some(a)
        };
        assert_eq!(
            decide(&rule, ms(23_749), ms(48), with_steal(0)),
            Decision::Move
        );
        assert_eq!(
            decide(&rule, ms(23_749), ms(48), with_steal(10)),
            Decision::KeepBusy
        );
        assert_eq!(
            decide(&rule, ms(23_749), ms(48), with_steal(5)),
            Decision::Move
        );
        let t0 = Instant::now();
        let b = |steal: u64| Busy {
            steal: ms(steal),
            ..Busy::default()
        };
        let a = Activity::between(&b(25_600), t0 + ms(48), &b(25_550), t0);
        assert_eq!(a.steal, ms(50));
    }

    /// An engine whose driver waits for its answer (the parent blocked in
    /// one read of a socket to it) through a gap in which none of its
    /// threads ran keeps its view: the gap is inside the driver's call
    /// (measured: a PySpark JVM asleep 46–84 ms inside a 7 s query on a
    /// host at load 13–23, its view 19 s and 46 s old). A new call (the
    /// driver's thread switched in between) is a new wait; one wait keeps
    /// the view at most `driver_call_limit`.
    #[test]
    fn an_engine_whose_driver_waits_for_it_keeps_its_view() {
        let rule = quick_rule();
        let still = DriverWait {
            tid: 7,
            switches: 40,
            socket: 99,
        };
        let d = |age: u64, idle: u64, waiting: bool| {
            let mut a = act(48, 0, 0, 0).unwrap();
            a.driver_waiting = waiting;
            decide(&ViewRule::default(), ms(age), ms(idle), Some(a))
        };
        assert_eq!(d(45_951, 84, true), Decision::KeepBusy);
        assert_eq!(d(45_951, 84, false), Decision::Move);
        assert_eq!(d(900, 300, true), Decision::KeepBusy);
        let busy = |driver: Option<DriverWait>| Busy {
            driver,
            ..Busy::default()
        };
        let t0 = Instant::now();
        let a = |now: Option<DriverWait>, mark: Option<DriverWait>| {
            Activity::between(&busy(now), t0 + ms(50), &busy(mark), t0).driver_waiting
        };
        let next = DriverWait {
            switches: 42,
            ..still
        };
        assert!(a(Some(still), Some(still)), "one wait through the gap");
        assert!(!a(Some(next), Some(still)), "a new call of the driver");
        assert!(!a(None, Some(still)) && !a(Some(still), None) && !a(None, None));

        let wait = Arc::new(Mutex::new(Some(still)));
        let w2 = Arc::clone(&wait);
        let r = Readers::with_busy(rule, true, Box::new(move |_| Some(busy(*lock(&w2)))));
        assert_eq!(r.tree_for(me(), &snap_at(1)).state_id, StateId(1));
        // A quiet gap, the driver in the same wait: kept.
        thread::sleep(ms(150));
        r.mark_quiet();
        thread::sleep(ms(10));
        assert_eq!(r.tree_for(me(), &snap_at(2)).state_id, StateId(1));
        assert_eq!(r.summary().busy_keeps, 1);
        // The driver's call returned and it made the next one: moves.
        *lock(&wait) = Some(next);
        thread::sleep(ms(150));
        assert_eq!(r.tree_for(me(), &snap_at(3)).state_id, StateId(3));
        // That call lasts past the limit: its gaps are pauses again.
        for state in 4..20 {
            thread::sleep(ms(120));
            if r.tree_for(me(), &snap_at(state)).state_id == StateId(state) {
                assert!(
                    state >= 7,
                    "moved at state {state}, before the call's {:?} limit",
                    rule.driver_call_limit
                );
                return;
            }
        }
        panic!("a driver's call past its limit still kept the view");
    }
}
