//! The stager thread: turns journaled events into committed versions.
//!
//! A journal [`Follower`] from the visible state: each record is applied to
//! the newest pending tree ([`Pending::push_applied`], after
//! [`crate::catalog::Tree::apply`] or with the tree the re-bootstrap built,
//! taken from the [`Handoff`]); each blob not stored is sent to the fetch
//! workers ([`super::fetch`]) with every source naming it (at most
//! `fetch_threads × 64` attempts out at once, the rest queued by blob id);
//! failed fetches are retried with capped backoff; and the newest complete
//! state is committed ([`Catalog::commit`]) after its blobs and the
//! resolutions of its Hive files are durable.
//!
//! While few blobs are wanted (fewer than [`GROUP_SYNC_MIN`] in flight,
//! queued or waiting to be published), a fetch worker makes a file known by
//! content durable at its blob path itself ([`BlobStore::publish`] of its one
//! copy), so the flushes of a small group run while the files are copied and
//! a commit then waits for its commit record only. A larger group is left
//! to one [`BlobStore::publish`] before the commit (one `syncfs` where the
//! store's filesystem allows it). Commits start at most every
//! [`MIN_COMMIT_INTERVAL`], counted from the start of the previous one, so
//! under a steady stream they follow each other: what arrives during a
//! commit's flush joins the next.
//!
//! It reads at most [`READ_AHEAD_STATES`] states ahead while every fetch
//! goes well, and on while one fails, so the event that unblocks a waiting
//! state is always read. What its pending states reference is published to
//! GC through the [`GcGate`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, error, info, info_span, warn};

use super::fetch::{self, FetchPool, Finished, PoolConfig};
use super::gc::GcGate;
use super::ingest::Handoff;
use super::threads::spawn_supervised;
use super::{decode, ReplicaError, Shared};
use crate::catalog::tree::UNKNOWN_TIME;
use crate::catalog::{AddedFile, Catalog, Pending, Resolutions, Tree};
use crate::event::{BlobId, FileRef, StateId};
use crate::journal::Follower;
use crate::source::Accepted;
use crate::stage::{
    backoff, BlobStore, FetchOutcome, Fetched, StageError, Unsynced, GROUP_SYNC_MIN,
};
use crate::status::{Progress, Stall};

/// Abandoned fetch threads (stuck in a source read) allowed at once; see
/// [`fetch::PoolConfig::max_abandoned`].
const MAX_ABANDONED_FETCHES: usize = 64;

/// Starts the fetch workers and the stager thread, which follows the
/// journal from the visible state (`follower`) with `visible` as its first
/// pending tree.
pub(super) fn start(
    shared: &Shared,
    follower: Follower,
    visible: Arc<Tree>,
) -> Result<JoinHandle<()>, ReplicaError> {
    let cfg = &shared.cfg;
    let publish_in_worker = Arc::new(AtomicBool::new(true));
    let fetches = {
        let (blobs, fetch_cfg) = (Arc::clone(&shared.blobs), Arc::clone(cfg));
        let in_worker = Arc::clone(&publish_in_worker);
        let work: fetch::Work<FetchJob, FetchResult> = Arc::new(move |job: &FetchJob| {
            let (i, fetched) = blobs.fetch_unsynced_any(
                &job.files,
                &fetch_cfg.source_root,
                fetch_cfg.cm_root.as_deref(),
            )?;
            let file = job.files[i].clone();
            let fetched = if in_worker.load(Ordering::Relaxed) {
                publish_known(&blobs, &file, fetched)?
            } else {
                fetched
            };
            Ok((file, fetched))
        });
        let (progress, stop) = (Arc::clone(&shared.progress), Arc::clone(&shared.stop));
        let background = shared.background;
        let spawn: fetch::Spawn =
            Arc::new(move |name: &str, f| spawn_supervised(name, background, f, &progress, &stop));
        let pool = PoolConfig {
            threads: cfg.fetch_threads,
            timeout: cfg.fetch_timeout,
            max_abandoned: MAX_ABANDONED_FETCHES,
        };
        FetchPool::start(pool, FetchJob::pool_key, work, spawn)
            .map_err(|e| ReplicaError::Io("starting the fetch threads".to_owned(), e))?
    };
    let stager = Stager {
        resolutions: Arc::clone(&shared.resolutions),
        pending: Pending::bounded(visible, cfg.max_pending),
        follower,
        catalog: Arc::clone(&shared.catalog),
        blobs: Arc::clone(&shared.blobs),
        progress: Arc::clone(&shared.progress),
        gate: Arc::clone(&shared.gate),
        handoff: Arc::clone(&shared.handoff),
        fetches,
        in_flight: HashSet::new(),
        max_in_flight: cfg.fetch_threads.max(1) * FETCHES_QUEUED_PER_THREAD,
        queued: VecDeque::new(),
        queued_set: HashSet::new(),
        retry_now: HashSet::new(),
        retries: HashMap::new(),
        errors: HashMap::new(),
        unsynced: HashMap::new(),
        publish_in_worker,
        stop: Arc::clone(&shared.stop),
    };
    shared.spawn("stager", shared.background, Box::new(move || stager.run()))
}

/// In a fetch worker: makes the copy of `file`, when it is known by content,
/// durable at its blob path now, so the stager gets it staged. A Hive file's
/// copy is left to the stager's group (`Stager::publish_staged`), which
/// keeps its blob from GC until the resolution is recorded.
fn publish_known(
    blobs: &BlobStore,
    file: &FileRef,
    mut fetched: Fetched,
) -> Result<Fetched, StageError> {
    if file.known().is_none() {
        return Ok(fetched);
    }
    if let Some(copy) = fetched.copy.take() {
        blobs.publish(vec![copy]).map_err(|(e, _)| e)?;
    }
    Ok(fetched)
}

/// One attempt to stage a blob: the sources to try, in order (file
/// entries naming it, see `Pending::next_sources`).
#[derive(Clone)]
struct FetchJob {
    key: BlobId,
    files: Vec<FileRef>,
}

impl FetchJob {
    /// The fetch pool's identity of an attempt: the blob and the first
    /// source it reads. A retry of a blob whose read hangs waits for that
    /// read only when it would start at the same source; with other
    /// sources it goes ahead.
    fn pool_key(job: &FetchJob) -> (BlobId, String) {
        (
            job.key,
            job.files
                .first()
                .map(|f| f.path.clone())
                .unwrap_or_default(),
        )
    }
}

/// A finished attempt: on success, the source that gave the blob.
type FetchResult = Result<(FileRef, Fetched), StageError>;

struct Retry {
    attempt: u32,
    at: Instant,
}

struct Stager {
    pending: Pending,
    follower: Follower,
    catalog: Arc<Catalog>,
    blobs: Arc<BlobStore>,
    progress: Arc<Progress>,
    gate: Arc<GcGate>,
    handoff: Arc<Handoff>,
    fetches: FetchPool<FetchJob, (BlobId, String), FetchResult>,
    /// Blobs whose attempt the fetch workers have.
    in_flight: HashSet<BlobId>,
    /// Most attempts handed to the fetch workers at once; the rest wait in
    /// `queued` (a blob id each), so memory and the job channel stay small
    /// however many files are missing.
    max_in_flight: usize,
    queued: VecDeque<BlobId>,
    queued_set: HashSet<BlobId>,
    /// In-flight blobs that gained a source meanwhile: retried at once if
    /// the attempt fails.
    retry_now: HashSet<BlobId>,
    retries: HashMap<BlobId, Retry>,
    errors: HashMap<BlobId, (u32, String)>,
    /// Verified copies not yet durable: published as a group before the
    /// next commit (see `BlobStore::publish`).
    unsynced: HashMap<BlobId, (FileRef, Unsynced)>,
    /// Set while fewer than [`GROUP_SYNC_MIN`] blobs are wanted: the fetch
    /// workers publish the copies of files known by content themselves (see
    /// the module docs).
    publish_in_worker: Arc<AtomicBool>,
    resolutions: Arc<Resolutions>,
    stop: Arc<AtomicBool>,
}

const STAGER_BATCH: usize = 8192;
/// Pending states the stager reads ahead of staging while every fetch
/// goes well. Each pending state keeps its own copy of the directories
/// its event changed (~10 KiB for an INSERT into a table of 100
/// partitions), so reading a backlog of 50,000 events at once cost
/// 500 MiB of fresh memory and, in zeroing those pages, more CPU than
/// ingest. Past this many the rest waits in the journal (read from its
/// files later, see `Follower`) while the fetches drain, unless a fetch
/// is failing: then the stager reads on up to `max_pending`, so the event
/// that unblocks a waiting state (a drop, an overwrite) is always read.
const READ_AHEAD_STATES: usize = 4096;
/// Fetch attempts handed out per fetch thread at most (see `max_in_flight`).
const FETCHES_QUEUED_PER_THREAD: usize = 64;
/// At most one commit (one durable commit record) per this interval, from
/// the start of one to the start of the next.
const MIN_COMMIT_INTERVAL: Duration = Duration::from_millis(10);

impl Stager {
    fn run(mut self) {
        let mut failed_commit: Option<String> = None;
        let mut last_stall_check = Instant::now();
        let mut reporter = CatchUpReporter::new();
        let mut last_commit = Instant::now() - MIN_COMMIT_INTERVAL;
        let mut dirty = false;
        while !self.stop.load(Ordering::Relaxed) {
            let mut changed = match self.read_events() {
                Ok(n) => n > 0,
                Err(e) => {
                    error!(error = %e, "the stager cannot read the journal; replication stops");
                    self.progress.set_stage_stall(Some(Stall {
                        state_id: None,
                        reason: format!("reading the journal: {e}"),
                        file: None,
                        line: None,
                    }));
                    return;
                }
            };
            changed |= self.collect_fetches();
            self.resubmit_due();
            // Each commit writes the commit record durably; under a steady
            // stream of events, one commit per interval covers them all.
            dirty |= changed;
            let mut committed = false;
            if (dirty && last_commit.elapsed() >= MIN_COMMIT_INTERVAL) || failed_commit.is_some() {
                last_commit = Instant::now();
                failed_commit = self.commit().err();
                dirty = false;
                committed = true;
            }
            // The stall check walks the pending states: do it when something
            // changed or a commit (which may have dropped the blocked state)
            // ran, else twice a second (retries, late files). Status must
            // not report a stall on a state that is already visible.
            if changed || committed || last_stall_check.elapsed() >= Duration::from_millis(500) {
                self.update_stall(failed_commit.as_deref());
                last_stall_check = Instant::now();
            }
            reporter.tick(&self.progress, self.catalog.snapshot().visible.state_id);
        }
    }

    /// Reads a batch of journal records into pending states.
    fn read_events(&mut self) -> Result<usize, ReplicaError> {
        let mut n = 0;
        let gate_lock = Arc::clone(&self.gate);
        let mut gate = None;
        // Past `READ_AHEAD_STATES` only while a fetch fails; `Pending`
        // merges past its own bound, so the event that unblocks a waiting
        // state is always read.
        while n < STAGER_BATCH && !self.read_far_enough() {
            let idle =
                self.in_flight.is_empty() && self.queued.is_empty() && self.retries.is_empty();
            let rec = if n == 0 && idle {
                self.follower.next_timeout(Duration::from_millis(20))?
            } else {
                self.follower.try_next()?
            };
            let Some(rec) = rec else { break };
            let applied = self.handoff.take(rec.id);
            let g = gate.get_or_insert_with(|| gate_lock.lock());
            let blobs = &self.blobs;
            let unsynced = &self.unsynced;
            let marking = g.marking;
            let mut touched = Vec::new();
            let is_staged = |f: &AddedFile| {
                // A Hive file unresolved yet has nothing stored to look for.
                let Some((blob, _)) = f.content() else {
                    return false;
                };
                if marking {
                    touched.push(blob);
                }
                unsynced.contains_key(&f.blob) || blobs.contains(&blob)
            };
            let to_fetch = match applied {
                Some(a) => {
                    let Accepted { event, tree, added } = a;
                    self.pending.push_applied(&event, tree, added, is_staged)
                }
                None => {
                    let entry = decode(rec.id, &rec.payload)?;
                    let (tree, added) = self.pending.latest().apply(&entry.event).map_err(|e| {
                        ReplicaError::BadRecord {
                            id: rec.id,
                            detail: e.to_string(),
                        }
                    })?;
                    self.resolutions.attach(&added);
                    self.pending
                        .push_applied(&entry.event, Arc::new(tree), added, is_staged)
                }
            };
            g.touched.extend(touched);
            g.read(rec.id.0);
            for f in to_fetch {
                self.wants(f.blob);
            }
            n += 1;
        }
        if let Some(mut g) = gate {
            g.pending = self.pending.refs().clone();
        }
        Ok(n)
    }

    /// Whether reading more events can wait: enough states are pending,
    /// fetches are under way for them and none is failing (see
    /// [`READ_AHEAD_STATES`]).
    fn read_far_enough(&self) -> bool {
        self.pending.len() >= READ_AHEAD_STATES
            && !(self.in_flight.is_empty() && self.queued.is_empty())
            && self.errors.is_empty()
            && self.retries.is_empty()
    }

    /// `blob` is newly missing, or has a new source: attempt it now (a
    /// waiting retry is not waited out; a new source is tried first).
    fn wants(&mut self, blob: BlobId) {
        if self.in_flight.contains(&blob) {
            self.retry_now.insert(blob);
            return;
        }
        if self.retries.remove(&blob).is_some() {
            self.pending.try_newest_source_next(&blob);
        }
        self.submit(blob);
    }

    /// Queues an attempt for `blob` unless one is queued or in flight.
    fn submit(&mut self, blob: BlobId) {
        if !self.in_flight.contains(&blob) && self.queued_set.insert(blob) {
            self.queued.push_back(blob);
        }
        self.send_queued();
    }

    /// Hands queued attempts to the fetch workers, up to `max_in_flight`.
    fn send_queued(&mut self) {
        while self.in_flight.len() < self.max_in_flight {
            let Some(blob) = self.queued.pop_front() else {
                break;
            };
            self.queued_set.remove(&blob);
            let files = self.pending.next_sources(&blob);
            if files.is_empty() {
                continue; // staged or abandoned meanwhile
            }
            self.in_flight.insert(blob);
            self.fetches.submit(FetchJob { key: blob, files });
        }
        let wanted = self.in_flight.len() + self.queued.len();
        self.progress
            .in_flight
            .store(wanted as u64, Ordering::Relaxed);
        self.publish_in_worker.store(
            wanted + self.unsynced.len() < GROUP_SYNC_MIN,
            Ordering::Relaxed,
        );
    }

    /// Takes finished fetches; true when one completed.
    fn collect_fetches(&mut self) -> bool {
        let mut any = false;
        let wait = if self.in_flight.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_millis(2)
        };
        let mut first = true;
        loop {
            let next = self.fetches.next(if first { wait } else { Duration::ZERO });
            first = false;
            let (key, result) = match next {
                None => break,
                Some(Finished::Done(job, result)) => (job.key, result),
                Some(Finished::TimedOut(job, after)) => {
                    (job.key, Err(StageError::TimedOut { after }))
                }
            };
            self.in_flight.remove(&key);
            let now = self.retry_now.remove(&key);
            let result = result.and_then(|(file, fetched)| {
                self.resolve(&file, fetched).map(|fetched| (file, fetched))
            });
            match result {
                Ok((file, fetched)) => {
                    if let Some(copy) = fetched.copy {
                        self.unsynced.insert(key, (file.clone(), copy));
                    }
                    if fetched.outcome != FetchOutcome::AlreadyPresent {
                        self.progress.files_fetched.fetch_add(1, Ordering::Relaxed);
                        self.progress
                            .bytes_fetched
                            .fetch_add(fetched.size, Ordering::Relaxed);
                    }
                    if fetched.outcome == FetchOutcome::FromChangeManagement {
                        self.progress
                            .fetches_from_cm
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    self.errors.remove(&key);
                    self.pending.staged(&key);
                    self.progress
                        .unverified_files
                        .store(self.resolutions.unverified_files(), Ordering::Relaxed);
                    any = true;
                }
                Err(e) => {
                    self.progress.count_fetch_failure(e.kind_label());
                    let attempt = self.errors.get(&key).map_or(0, |(a, _)| a + 1);
                    if attempt == 0 {
                        warn!(blob = %key, error = %e, "cannot stage a file yet; retrying with backoff");
                    } else {
                        debug!(blob = %key, attempt, error = %e, "retry failed");
                    }
                    let reason = match &e {
                        StageError::NoSpace { .. } => format!("disk full: {e}"),
                        _ => e.to_string(),
                    };
                    self.errors.insert(key, (attempt, reason));
                    if self.pending.is_missing(&key) {
                        let at = if now {
                            self.pending.try_newest_source_next(&key);
                            Instant::now()
                        } else {
                            Instant::now() + backoff(attempt)
                        };
                        self.retries.insert(key, Retry { attempt, at });
                    }
                }
            }
        }
        self.send_queued();
        any
    }

    fn resubmit_due(&mut self) {
        let now = Instant::now();
        let due: Vec<BlobId> = self
            .retries
            .iter()
            .filter(|(_, r)| r.at <= now)
            .map(|(b, _)| *b)
            .collect();
        for b in due {
            if let Some(r) = self.retries.remove(&b) {
                if self.pending.is_missing(&b) {
                    debug!(blob = %b, attempt = r.attempt, "retrying");
                    self.submit(b);
                }
            }
        }
    }

    /// Records what a file not known by content turned out to be (its cells
    /// in every tree get the blob and size). Its copy is always published
    /// (`BlobStore::fetch_unsynced`), so GC cannot take the blob away between
    /// the read and this record.
    fn resolve(&self, file: &FileRef, fetched: Fetched) -> Result<Fetched, StageError> {
        if file.known().is_some() {
            return Ok(fetched);
        }
        let unverified = matches!(file.verify, crate::event::Verify::None);
        self.resolutions
            .resolve(file.key(), fetched.blob, fetched.size, unverified)
            .map_err(|detail| StageError::Unavailable {
                path: file.source_label().to_owned(),
                detail,
            })?;
        Ok(fetched)
    }

    /// Makes every unsynced copy durable and puts it in place (durability
    /// order step 1, for the whole group). Blobs that did not make it are
    /// missing again and fetched again.
    fn publish_staged(&mut self) -> Result<(), String> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        let mut files: HashMap<BlobId, FileRef> = HashMap::new();
        let mut batch = Vec::with_capacity(self.unsynced.len());
        for (_, (file, copy)) in self.unsynced.drain() {
            // `publish` reports failures by blob id.
            files.insert(copy.id(), file);
            batch.push(copy);
        }
        {
            // Blobs of files resolved at fetch time are referenced by no
            // tree GC may have marked already: keep them from this pass.
            let mut g = self.gate.lock();
            if g.marking {
                g.touched.extend(batch.iter().map(Unsynced::id));
            }
        }
        match self.blobs.publish(batch) {
            Ok(()) => Ok(()),
            Err((e, failed)) => {
                warn!(error = %e, blobs = failed.len(), "cannot make staged files durable; fetching them again");
                for id in failed {
                    if let Some(file) = files.remove(&id) {
                        let key = file.key();
                        self.pending.unstaged(key, &file);
                        self.errors.insert(key, (0, e.to_string()));
                        self.submit(key);
                    }
                }
                Err(match &e {
                    StageError::NoSpace { .. } => format!("disk full: {e}"),
                    _ => e.to_string(),
                })
            }
        }
    }

    /// Commits the newest complete state, if it is newer than the visible.
    fn commit(&mut self) -> Result<(), String> {
        let Some(tree) = self.pending.newest_complete() else {
            return Ok(());
        };
        let id = tree.state_id;
        let span = info_span!("commit", state_id = %id);
        let _g = span.enter();
        let started = Instant::now();
        self.publish_staged()?;
        // Durability order: blobs, then what the files resolved to, then
        // the commit record.
        if let Err(e) = self.resolutions.flush() {
            warn!(error = %e, "cannot record resolved files; will retry");
            return Err(e.to_string());
        }
        match self.catalog.commit(tree) {
            Ok(dropped) => {
                debug!(dropped = dropped.len(), "committed");
                self.progress.commits.fetch_add(1, Ordering::Relaxed);
                self.progress.commit_duration.observe(started.elapsed());
                for b in self.pending.committed(id) {
                    self.retries.remove(&b);
                    self.errors.remove(&b);
                    self.retry_now.remove(&b);
                }
                let mut g = self.gate.lock();
                g.pending = self.pending.refs().clone();
                Ok(())
            }
            Err(e) => {
                warn!(error = %e, "cannot record the commit; will retry");
                Err(e.to_string())
            }
        }
    }

    fn update_stall(&self, commit_error: Option<&str>) {
        let oldest = self
            .pending
            .trees()
            .next()
            .map_or(UNKNOWN_TIME, |t| t.time_ms);
        self.progress
            .oldest_pending_time_ms
            .store(oldest, Ordering::Relaxed);
        let stall = if let Some(e) = commit_error {
            Some(Stall {
                state_id: self.pending.trees().last().map(|t| t.state_id),
                reason: format!("cannot record the commit: {e}"),
                file: None,
                line: None,
            })
        } else {
            self.pending.first_blocked().and_then(|(state, f)| {
                let (_, reason) = self.errors.get(&f.blob)?;
                Some(Stall {
                    state_id: Some(state),
                    reason: format!("waiting for {}: {reason} (retrying)", f.file.source_label()),
                    file: None,
                    line: None,
                })
            })
        };
        self.progress.set_stage_stall(stall);
    }
}

/// Logs a line every few seconds while replication is behind the source:
/// a long backlog shows progress, not silence.
struct CatchUpReporter {
    last: Instant,
    /// Visible id and fetched bytes at the last tick (None before the first).
    visible: Option<StateId>,
    bytes: u64,
}

const REPORT_EVERY: Duration = Duration::from_secs(5);

impl CatchUpReporter {
    fn new() -> CatchUpReporter {
        CatchUpReporter {
            last: Instant::now(),
            visible: None,
            bytes: 0,
        }
    }

    fn tick(&mut self, progress: &Progress, visible: StateId) {
        let elapsed = self.last.elapsed();
        if elapsed < REPORT_EVERY {
            return;
        }
        let latest = progress.latest(visible);
        let bytes = progress.bytes_fetched.load(Ordering::Relaxed);
        let lag = latest.0 - visible.0;
        if let (true, Some(before)) = (lag > 0, self.visible) {
            let secs = elapsed.as_secs_f64();
            let ids_per_s = visible.0.saturating_sub(before.0) as f64 / secs;
            let mib_per_s = bytes.saturating_sub(self.bytes) as f64 / secs / f64::from(1 << 20);
            let eta = if ids_per_s > 0.0 {
                format!("{:.0}s", lag as f64 / ids_per_s)
            } else {
                "unknown (no progress)".to_owned()
            };
            info!(
                visible = %visible,
                latest = %latest,
                lag_ids = lag,
                ids_per_s = format!("{ids_per_s:.0}"),
                mib_per_s = format!("{mib_per_s:.1}"),
                eta,
                "catching up"
            );
        }
        *self = CatchUpReporter {
            last: Instant::now(),
            visible: Some(visible),
            bytes,
        };
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::event::Verify;
    use crate::stage::testing::*;

    #[test]
    fn a_worker_publishes_a_file_known_by_content_and_leaves_a_hive_file_to_the_group() {
        let fx = fixture();
        let store = store(&fx);
        put(&fx.src, "d/known", b"known bytes");
        let known = file_ref("d/known", b"known bytes");
        let fetched = store.fetch_unsynced(&known, &fx.src, None).unwrap();
        assert!(fetched.copy.is_some());
        let fetched = publish_known(&store, &known, fetched).unwrap();
        // Durable at its blob path before the stager hears of it.
        assert!(fetched.copy.is_none());
        assert!(store.contains(&known.key()));
        assert_eq!(fs_read(&store, &known.key()), b"known bytes");
        assert_eq!(temp_count(&fx.state), 0);

        put(&fx.src, "t/000000_0", b"hive bytes");
        let hive = hive_ref(&fx.src, "t/000000_0", Verify::None);
        let fetched = store.fetch_unsynced(&hive, Path::new(""), None).unwrap();
        let fetched = publish_known(&store, &hive, fetched).unwrap();
        // Its resolution is not recorded yet: the copy waits for the group.
        let copy = fetched.copy.expect("the Hive copy is left to the stager");
        assert!(!store.contains(&copy.id()));
        assert_eq!(temp_count(&fx.state), 1);
    }

    fn fs_read(store: &BlobStore, blob: &BlobId) -> Vec<u8> {
        std::fs::read(store.path(blob)).unwrap()
    }
}
