//! The fetch workers, with a deadline on progress: a read of a source that
//! hangs (a hard NFS mount whose server is gone, a FUSE source whose daemon
//! is stuck) must not tie up replication for good.
//!
//! A blocked `read(2)` cannot be cancelled, so a worker that made no
//! progress for [`PoolConfig::timeout`] is *abandoned*: the pool reports
//! the attempt as timed out ([`Finished::TimedOut`], the stager retries it
//! with backoff and shows the stall), starts a fresh worker in its place,
//! and lets the stuck thread run on detached. Whatever an abandoned attempt
//! eventually returns is dropped by the pool, never handed to the stager:
//! its copy is never published (dropping it removes its temp file).
//!
//! Invariants:
//! - At most [`PoolConfig::threads`] workers are live (not abandoned).
//! - At most [`PoolConfig::max_abandoned`] abandoned attempts are still
//!   running; at the bound no replacement is started, so a source where
//!   every read hangs leaves the pool with fewer (at worst no) live workers
//!   rather than an unbounded number of threads.
//! - While an abandoned attempt of a key is still running, a new attempt of
//!   the same key waits until it returns: a file whose read hangs holds one
//!   thread, not one per retry.
//! - Progress is "no heartbeat for the timeout": the copy loops in
//!   [`crate::stage`] call [`heartbeat`] after every chunk, so a large file
//!   read slowly but steadily never times out.
//!
//! Owned by the stager thread (single owner: every method takes `&mut
//! self`); the workers run the fetch closure it is given.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::warn;

pub use crate::stage::heartbeat;

/// How many workers, and when a worker counts as stuck.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    pub threads: usize,
    /// No progress for this long and the attempt is abandoned.
    pub timeout: Duration,
    /// Abandoned attempts that may still be running at once.
    pub max_abandoned: usize,
}

/// The fetch itself: run on a worker thread, once per attempt.
pub type Work<J, R> = Arc<dyn Fn(&J) -> R + Send + Sync>;
/// Starts a named thread (the pipeline's supervised spawn).
pub type Spawn =
    Arc<dyn Fn(&str, Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>> + Send + Sync>;

/// One attempt's end, as the stager sees it.
#[derive(Debug)]
pub enum Finished<J, R> {
    Done(J, R),
    /// No progress for `after`; the attempt was abandoned.
    TimedOut(J, Duration),
}

/// What one worker is doing, shared with its thread.
struct Slot {
    state: Mutex<SlotState>,
    /// Milliseconds since `epoch` at the last sign of progress.
    beat_ms: AtomicU64,
    epoch: Instant,
}

#[derive(Default)]
struct SlotState {
    ticket: Option<u64>,
    abandoned: bool,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn beat(&self) {
        self.beat_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.beat_ms.load(Ordering::Relaxed)))
    }
}

/// The worker's slot hears the heartbeats of the copies on its thread.
impl crate::stage::ProgressWatch for Slot {
    fn beat(&self) {
        Slot::beat(self);
    }
}

struct Queued<J> {
    ticket: u64,
    job: J,
}

struct Worker {
    slot: Arc<Slot>,
    handle: JoinHandle<()>,
}

/// The pool; see the module docs.
pub struct FetchPool<J, K, R> {
    cfg: PoolConfig,
    work: Work<J, R>,
    spawn: Spawn,
    key: fn(&J) -> K,
    queue: Option<Sender<Queued<J>>>,
    jobs: Arc<Mutex<Receiver<Queued<J>>>>,
    done_tx: Sender<(u64, R)>,
    done: Receiver<(u64, R)>,
    live: Vec<Worker>,
    /// Threads of abandoned attempts, detached when the pool goes.
    abandoned: Vec<JoinHandle<()>>,
    /// Attempts queued or running (not abandoned), by ticket.
    running: HashMap<u64, J>,
    /// Abandoned attempts still running, by ticket.
    stuck: HashMap<u64, K>,
    stuck_keys: HashSet<K>,
    /// Jobs waiting for an abandoned attempt of their key to return.
    deferred: HashMap<K, J>,
    timed_out: VecDeque<(J, Duration)>,
    next_ticket: u64,
    spawned: usize,
    epoch: Instant,
    /// A failure to start a worker, logged once.
    spawn_failed: bool,
}

impl<J, K, R> FetchPool<J, K, R>
where
    J: Clone + Send + 'static,
    K: Eq + Hash + Clone,
    R: Send + 'static,
{
    /// Starts `cfg.threads` workers running `work`.
    pub fn start(
        cfg: PoolConfig,
        key: fn(&J) -> K,
        work: Work<J, R>,
        spawn: Spawn,
    ) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let mut pool = FetchPool {
            cfg: PoolConfig {
                threads: cfg.threads.max(1),
                ..cfg
            },
            work,
            spawn,
            key,
            queue: Some(queue),
            jobs: Arc::new(Mutex::new(jobs)),
            done_tx,
            done,
            live: Vec::new(),
            abandoned: Vec::new(),
            running: HashMap::new(),
            stuck: HashMap::new(),
            stuck_keys: HashSet::new(),
            deferred: HashMap::new(),
            timed_out: VecDeque::new(),
            next_ticket: 0,
            spawned: 0,
            epoch: Instant::now(),
            spawn_failed: false,
        };
        while pool.live.len() < pool.cfg.threads {
            pool.spawn_worker()?;
        }
        Ok(pool)
    }

    /// Queues one attempt of `job`.
    pub fn submit(&mut self, job: J) {
        let key = (self.key)(&job);
        if self.stuck_keys.contains(&key) {
            self.deferred.insert(key, job);
            return;
        }
        self.enqueue(job);
    }

    /// Threads of abandoned attempts that have not returned yet.
    pub fn abandoned_running(&self) -> usize {
        self.stuck.len()
    }

    /// The next finished attempt, waiting up to `wait` for one. Also
    /// abandons workers stuck past the timeout and replaces them.
    pub fn next(&mut self, wait: Duration) -> Option<Finished<J, R>> {
        self.abandon_stuck();
        if let Some((job, after)) = self.timed_out.pop_front() {
            return Some(Finished::TimedOut(job, after));
        }
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (ticket, result) = match self.done.recv_timeout(left) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            };
            if let Some(key) = self.stuck.remove(&ticket) {
                // An abandoned attempt came back: its result is dropped
                // here, unseen, and a retry held for it may start.
                drop(result);
                self.stuck_keys.remove(&key);
                if let Some(job) = self.deferred.remove(&key) {
                    self.enqueue(job);
                }
                self.abandoned.retain(|h| !h.is_finished());
                self.replace_workers();
                continue;
            }
            if let Some(job) = self.running.remove(&ticket) {
                return Some(Finished::Done(job, result));
            }
        }
    }

    fn enqueue(&mut self, job: J) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.running.insert(ticket, job.clone());
        if let Some(q) = &self.queue {
            // The workers hold the receiver as long as the pool lives.
            let _ = q.send(Queued { ticket, job });
        }
    }

    fn abandon_stuck(&mut self) {
        let timeout = self.cfg.timeout;
        let mut i = 0;
        while i < self.live.len() {
            let slot = &self.live[i].slot;
            let stuck_ticket = {
                let mut s = slot.lock();
                match s.ticket {
                    Some(t) if slot.idle_for() >= timeout => {
                        s.abandoned = true;
                        Some(t)
                    }
                    _ => None,
                }
            };
            let Some(ticket) = stuck_ticket else {
                i += 1;
                continue;
            };
            let worker = self.live.swap_remove(i);
            self.abandoned.push(worker.handle);
            if let Some(job) = self.running.remove(&ticket) {
                let key = (self.key)(&job);
                self.stuck.insert(ticket, key.clone());
                self.stuck_keys.insert(key);
                self.timed_out.push_back((job, timeout));
            }
        }
        self.replace_workers();
    }

    /// Starts workers until `threads` are live, unless the abandoned ones
    /// are at their bound.
    fn replace_workers(&mut self) {
        while self.live.len() < self.cfg.threads && self.stuck.len() < self.cfg.max_abandoned {
            if let Err(e) = self.spawn_worker() {
                if !self.spawn_failed {
                    warn!(error = %e, "cannot start a fetch worker; will try again");
                    self.spawn_failed = true;
                }
                return;
            }
            self.spawn_failed = false;
        }
    }

    fn spawn_worker(&mut self) -> std::io::Result<()> {
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::default()),
            beat_ms: AtomicU64::new(0),
            epoch: self.epoch,
        });
        let (jobs, done, work, thread_slot) = (
            Arc::clone(&self.jobs),
            self.done_tx.clone(),
            Arc::clone(&self.work),
            Arc::clone(&slot),
        );
        let name = format!("fetch-{}", self.spawned);
        let handle = (self.spawn)(
            &name,
            Box::new(move || run_worker(&jobs, &done, &*work, thread_slot)),
        )?;
        self.spawned += 1;
        self.live.push(Worker { slot, handle });
        Ok(())
    }
}

fn run_worker<J, R>(
    jobs: &Mutex<Receiver<Queued<J>>>,
    done: &Sender<(u64, R)>,
    work: &(dyn Fn(&J) -> R + Send + Sync),
    slot: Arc<Slot>,
) {
    crate::stage::watch_this_thread(Some(
        Arc::clone(&slot) as Arc<dyn crate::stage::ProgressWatch>
    ));
    loop {
        let next = {
            let rx = jobs.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(Queued { ticket, job }) = next else {
            return; // the pool has gone
        };
        {
            let mut s = slot.lock();
            s.ticket = Some(ticket);
            slot.beat();
        }
        let result = work(&job);
        let abandoned = {
            let mut s = slot.lock();
            s.ticket = None;
            s.abandoned
        };
        if done.send((ticket, result)).is_err() || abandoned {
            // Abandoned: a fresh worker has taken this one's place.
            return;
        }
    }
}

impl<J, K, R> Drop for FetchPool<J, K, R> {
    /// Closes the queue and waits for the live workers to finish their
    /// current attempt, except those stuck past the timeout: those, and
    /// the abandoned ones, are left to end (or the process to exit)
    /// without us.
    fn drop(&mut self) {
        self.queue = None;
        let mut live = std::mem::take(&mut self.live);
        let mut detached = self.abandoned.len();
        while !live.is_empty() {
            live.retain(|w| {
                let stuck = w.slot.lock().ticket.is_some() && w.slot.idle_for() >= self.cfg.timeout;
                if stuck {
                    detached += 1;
                }
                !stuck && !w.handle.is_finished()
            });
            if !live.is_empty() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if detached > 0 {
            warn!(
                threads = detached,
                "fetch workers stuck in a source read were left behind at shutdown"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn spawn() -> Spawn {
        Arc::new(|name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.to_owned()).spawn(f)
        })
    }

    /// A "source" where jobs named in `hang` block until `release` is set.
    struct Gate {
        open: Mutex<bool>,
        cv: std::sync::Condvar,
        calls: AtomicUsize,
    }

    impl Gate {
        fn new() -> Arc<Gate> {
            Arc::new(Gate {
                open: Mutex::new(false),
                cv: std::sync::Condvar::new(),
                calls: AtomicUsize::new(0),
            })
        }

        fn wait(&self) {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.cv.wait(open).unwrap();
            }
        }

        fn release(&self) {
            *self.open.lock().unwrap() = true;
            self.cv.notify_all();
        }
    }

    fn pool(
        gate: &Arc<Gate>,
        threads: usize,
        max_abandoned: usize,
    ) -> FetchPool<&'static str, &'static str, String> {
        let g = Arc::clone(gate);
        let work: Work<&'static str, String> = Arc::new(move |job: &&'static str| {
            let n = g.calls.fetch_add(1, Ordering::SeqCst);
            if job.starts_with("hang") {
                g.wait();
            }
            format!("{job} attempt {n}")
        });
        let cfg = PoolConfig {
            threads,
            timeout: Duration::from_millis(100),
            max_abandoned,
        };
        FetchPool::start(cfg, |j| *j, work, spawn()).unwrap()
    }

    fn next_within(
        p: &mut FetchPool<&'static str, &'static str, String>,
        limit: Duration,
    ) -> Option<Finished<&'static str, String>> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(f) = p.next(Duration::from_millis(10)) {
                return Some(f);
            }
        }
        None
    }

    #[test]
    fn a_hung_attempt_times_out_and_the_others_go_on() {
        let gate = Gate::new();
        let mut p = pool(&gate, 1, 4);
        p.submit("hang-a");
        p.submit("b");
        match next_within(&mut p, Duration::from_secs(10)) {
            Some(Finished::TimedOut(job, after)) => {
                assert_eq!(job, "hang-a");
                assert_eq!(after, Duration::from_millis(100));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        // One worker only, stuck: the replacement runs `b`.
        match next_within(&mut p, Duration::from_secs(10)) {
            Some(Finished::Done(job, _)) => assert_eq!(job, "b"),
            other => panic!("expected b to finish, got {other:?}"),
        }
        assert_eq!(p.abandoned_running(), 1);
        gate.release();
    }

    #[test]
    fn an_abandoned_result_is_never_delivered_and_the_held_retry_runs() {
        let gate = Gate::new();
        let mut p = pool(&gate, 2, 4);
        p.submit("hang-a");
        assert!(matches!(
            next_within(&mut p, Duration::from_secs(10)),
            Some(Finished::TimedOut("hang-a", _))
        ));
        // The retry waits for the stuck attempt rather than taking a thread.
        p.submit("hang-a");
        assert!(next_within(&mut p, Duration::from_millis(400)).is_none());
        assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
        gate.release();
        // Only the retry's result comes out: attempt 1, never attempt 0.
        match next_within(&mut p, Duration::from_secs(10)) {
            Some(Finished::Done("hang-a", r)) => assert_eq!(r, "hang-a attempt 1"),
            other => panic!("expected the retry's result, got {other:?}"),
        }
        assert!(next_within(&mut p, Duration::from_millis(200)).is_none());
        assert_eq!(p.abandoned_running(), 0);
    }

    #[test]
    fn abandoned_threads_are_bounded() {
        let gate = Gate::new();
        let mut p = pool(&gate, 1, 2);
        for job in ["hang-1", "hang-2", "hang-3"] {
            p.submit(job);
        }
        let mut timeouts = 0;
        while let Some(f) = next_within(&mut p, Duration::from_millis(600)) {
            assert!(matches!(f, Finished::TimedOut(..)), "{f:?}");
            timeouts += 1;
        }
        // Two abandoned, then no replacement: the third waits in the queue.
        assert_eq!(timeouts, 2);
        assert_eq!(p.abandoned_running(), 2);
        assert_eq!(gate.calls.load(Ordering::SeqCst), 2);
        gate.release();
        match next_within(&mut p, Duration::from_secs(10)) {
            Some(Finished::Done("hang-3", _)) => {}
            other => panic!("expected hang-3 to run once a thread returned, got {other:?}"),
        }
    }

    #[test]
    fn steady_progress_never_times_out() {
        let work: Work<u32, u32> = Arc::new(|n: &u32| {
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(30));
                heartbeat();
            }
            *n
        });
        let cfg = PoolConfig {
            threads: 1,
            timeout: Duration::from_millis(100),
            max_abandoned: 1,
        };
        let mut p = FetchPool::start(cfg, |n| *n, work, spawn()).unwrap();
        p.submit(7);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < until, "no result");
            match p.next(Duration::from_millis(10)) {
                Some(Finished::Done(7, 7)) => break,
                Some(other) => panic!("{other:?}"),
                None => {}
            }
        }
    }
}
