//! The replication pipeline: source log → journal → staged blobs → commits.
//!
//! [`Replica::start`] recovers the state folder and runs four kinds of
//! threads, each the single writer of what it owns:
//! - **ingest** tails the source log, validates each line against the newest
//!   accepted state, and appends accepted events to the journal (fsynced in
//!   groups). A rejected line holds ingest at the last good state until
//!   the source is corrected: it is read again from the rejected position
//!   (about once a second, [`Source::reread_from`]), never before it.
//! - **stager** follows the journal (memory ring first, segment files when
//!   behind), builds pending states ([`catalog::Pending`], bounded in
//!   number), sends each missing blob to the fetch workers with every source
//!   naming it (at most `fetch_threads × 64` attempts out at once), retries
//!   failures with capped backoff, and
//!   commits the newest complete state ([`catalog::Catalog::commit`]: commit
//!   record fsynced before the new state is published).
//! - **fetch workers** ([`fetch`]) copy and verify one file each into the
//!   blob store; one that makes no progress for `fetch_timeout` (a hung
//!   source read) is abandoned and replaced, and the attempt retried.
//! - **gc** deletes blobs that no retained or pending state references.
//! - **checkpoint** writes the retained and pinned trees to
//!   `checkpoints/` every [`ReplicaConfig::checkpoint_events`] state-ids or
//!   [`ReplicaConfig::checkpoint_interval`], then compacts the journal
//!   ([`crate::checkpoint`]). A restart loads the newest readable
//!   checkpoint and replays only the journal after it.
//!
//! GC and the stager agree through [`GcGate`]: the stager publishes what
//! its pending states reference ([`catalog::PendingRefs`]: the visible tree
//! plus the file entries of their events) and checks blob presence under
//! the gate, and GC never
//! deletes a blob the stager referenced after GC took its view of the
//! trees. Open files need no protection: a reader holds the blob's file
//! descriptor, so unlinking it does not disturb the read.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, error, info, info_span, warn};

use crate::bootstrap::after_gap::{AfterGap, Gap, GcHold};
use crate::bootstrap::{BootstrapConfig, Built};
use crate::catalog::tree::UNKNOWN_TIME;
use crate::catalog::{self, load_durable, AddedFile, Catalog, Pending, Resolutions, Tree};
use crate::checkpoint::{self, CheckpointData};
use crate::event::{BlobId, FileRef, StateId};
use crate::journal::{
    encode_entry, journal_payload, Compactor, Journal, JournalConfig, JournalEntry, JournalError,
};
use crate::source::hive::{HiveConfig, HiveSource};
use crate::source::native::{LogPosition, NativeSource, SourceLog};
use crate::source::Rejection;
use crate::source::{
    Accepted, DecodeError, DupWindow, Position, Source, SourceError, Validator, Verdict,
};
use crate::stage::{backoff, BlobStore, FetchOutcome, Fetched, StageError, Unsynced};
use crate::state_lock::{lock_state, StateLock, StateLockError};
use crate::status::{JournalReport, Progress, Stall, StatusReport};

pub mod fetch;
mod syncer;

use fetch::{FetchPool, Finished, PoolConfig};

/// How to run replication.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    pub state_dir: PathBuf,
    pub source_root: PathBuf,
    pub events_dir: PathBuf,
    pub cm_root: Option<PathBuf>,
    /// Newest unpinned versions kept browsable.
    pub retain: usize,
    /// Journal records kept in memory for the stager...
    pub ring_capacity: usize,
    /// ...and the bound on their payload bytes.
    pub ring_bytes: usize,
    /// Size after which the journal starts a new segment file.
    pub segment_bytes: u64,
    /// A checkpoint once the visible state-id moved this far past the last
    /// one (0: never by count)...
    pub checkpoint_events: u64,
    /// ...or once this long has passed with a newer visible state.
    pub checkpoint_interval: Duration,
    /// The rate checkpoints are written at, bytes/s (0: full speed).
    pub checkpoint_rate: u64,
    /// Asked during recovery: `true` stops [`Replica::start`] with
    /// [`ReplicaError::Cancelled`] (Ctrl-C during a long start).
    pub cancel: Option<fn() -> bool>,
    pub fetch_threads: usize,
    /// A fetch that makes no progress for this long (a read of the source
    /// that hangs) is abandoned and retried: see [`fetch`].
    pub fetch_timeout: Duration,
    /// Most states kept one by one ahead of the visible one; past it, the
    /// newest pending state absorbs each further event
    /// ([`catalog::Pending::bounded`]), so reading never stops.
    pub max_pending: usize,
    pub gc_interval: Duration,
    /// How often ingest looks for new lines when caught up.
    pub poll_interval: Duration,
    /// Follow Hive's notification log instead of `events_dir`.
    pub hive: Option<HiveConfig>,
    /// `--bootstrap`: a Hive source that stops at an id gap bootstraps
    /// again from the metastore (`bootstrap::after_gap`) while the visible
    /// state stays served; without it the gap stalls replication.
    pub rebootstrap: bool,
}

impl ReplicaConfig {
    pub fn new(state_dir: &Path, source_root: &Path, events_dir: &Path) -> ReplicaConfig {
        ReplicaConfig {
            state_dir: state_dir.to_owned(),
            source_root: source_root.to_owned(),
            events_dir: events_dir.to_owned(),
            cm_root: None,
            retain: 16,
            ring_capacity: crate::journal::DEFAULT_RING_CAPACITY,
            ring_bytes: crate::journal::DEFAULT_RING_BYTES,
            segment_bytes: crate::journal::DEFAULT_SEGMENT_BYTES,
            checkpoint_events: checkpoint::DEFAULT_CHECKPOINT_EVENTS,
            checkpoint_interval: checkpoint::DEFAULT_CHECKPOINT_INTERVAL,
            checkpoint_rate: checkpoint::DEFAULT_CHECKPOINT_RATE_MIB << 20,
            cancel: None,
            fetch_threads: 4,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            max_pending: 200_000,
            gc_interval: Duration::from_secs(2),
            poll_interval: Duration::from_millis(5),
            hive: None,
            rebootstrap: false,
        }
    }
}

/// Default of [`ReplicaConfig::fetch_timeout`] (`--fetch-timeout`): long
/// enough for a busy NFS server, short enough that a hang shows in status.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Abandoned fetch threads (stuck in a source read) allowed at once; see
/// [`fetch::PoolConfig::max_abandoned`].
const MAX_ABANDONED_FETCHES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("state folder {0} is in use by another stagefs process")]
    Locked(PathBuf),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Catalog(#[from] catalog::CatalogError),
    #[error("journal record {id} is unreadable: {detail}")]
    BadRecord { id: StateId, detail: String },
    #[error("the journal ends at state {journal} but state {visible} was committed; the journal was damaged")]
    JournalBehindCommit { journal: StateId, visible: StateId },
    #[error("this state folder follows {0}; use a new --state folder for another source")]
    WrongSource(&'static str),
    #[error("{0}")]
    Source(String),
    #[error("the journal was compacted through state {floor} but no readable checkpoint at or after it was found ({detail}); restore the checkpoints folder or remove the state folder to replicate from the start")]
    CompactedWithoutCheckpoint { floor: StateId, detail: String },
    /// Recovery was asked to stop (`ReplicaConfig::cancel`).
    #[error("recovery was interrupted")]
    Cancelled,
}

impl From<StateLockError> for ReplicaError {
    fn from(e: StateLockError) -> ReplicaError {
        match e {
            StateLockError::InUse(dir) => ReplicaError::Locked(dir),
            StateLockError::Open(path, e) => {
                ReplicaError::Io(format!("opening {}", path.display()), e)
            }
        }
    }
}

/// The entry a journal record holds.
fn decode(id: StateId, payload: &[u8]) -> Result<JournalEntry, ReplicaError> {
    JournalEntry::decode(payload).map_err(|e| ReplicaError::BadRecord {
        id,
        detail: e.to_string(),
    })
}

/// Accepted events with the trees ingest already built for them, so the
/// stager need not decode and apply them again: only the re-bootstrap's
/// (one event naming every file of the warehouse). Only durable events are
/// handed over (after the journal sync); the stager still takes its order
/// and pace from the journal and falls back to decoding a record when its
/// entry is not here (read from files, or dropped at the capacity bound).
///
/// Ingest's own batches are not handed over: each tree holds its own copy
/// of the directories its event changed (~10 KiB for an INSERT into a
/// table of 100 partitions), and freed on the stager thread that memory
/// went back to ingest as fresh pages (mimalloc's cross-thread frees),
/// whose zeroing took half of the ingest thread's time at 30,000 Hive
/// events/s. Dropped where it was built, it is reused hot; the stager
/// decodes and applies each record itself (~5–10 µs).
#[derive(Default)]
struct Handoff {
    queue: Mutex<HandoffQueue>,
}

/// Entries with their journal payload size, the measure of their memory.
#[derive(Default)]
struct HandoffQueue {
    entries: VecDeque<(Accepted, usize)>,
    bytes: usize,
}

/// Entries kept for the stager (like the journal ring, a bound on memory):
/// at most this many...
const HANDOFF_CAPACITY: usize = 8192;
/// ...and at most this many bytes of their events' journal payloads.
const HANDOFF_BYTES: usize = 64 << 20;

impl HandoffQueue {
    fn pop_front(&mut self) -> Option<Accepted> {
        let (a, bytes) = self.entries.pop_front()?;
        self.bytes -= bytes;
        Some(a)
    }
}

impl Handoff {
    fn lock(&self) -> MutexGuard<'_, HandoffQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a batch of (accepted event, its journal payload bytes); the
    /// oldest entries go past the bounds (the stager decodes those).
    fn push(&self, batch: Vec<(Accepted, usize)>) {
        let mut q = self.lock();
        for (a, bytes) in batch {
            q.bytes += bytes;
            q.entries.push_back((a, bytes));
        }
        while q.entries.len() > HANDOFF_CAPACITY || q.bytes > HANDOFF_BYTES {
            q.pop_front();
        }
    }

    /// The entry for `id`, dropping older ones the stager went past.
    fn take(&self, id: StateId) -> Option<Accepted> {
        let mut q = self.lock();
        while q.entries.front().is_some_and(|(a, _)| a.event.id < id) {
            q.pop_front();
        }
        if q.entries.front().is_some_and(|(a, _)| a.event.id == id) {
            q.pop_front()
        } else {
            None
        }
    }
}

/// Directories readers hold (from the mount's view): GC keeps their blobs.
pub type HeldDirs = Arc<dyn Fn() -> Vec<Arc<catalog::DirNode>> + Send + Sync>;

/// Shared between the stager and GC; see the module docs.
#[derive(Default)]
struct GcGate {
    inner: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    marking: bool,
    /// Blobs the stager referenced since GC took its view.
    touched: HashSet<BlobId>,
    /// What the stager's pending states reference, as of its last batch.
    pending: catalog::PendingRefs,
    /// What readers hold, once a mount is serving.
    held: Option<HeldDirs>,
}

impl GcGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running replication.
pub struct Replica {
    catalog: Arc<Catalog>,
    blobs: Arc<BlobStore>,
    progress: Arc<Progress>,
    journal: Arc<Mutex<Journal>>,
    journal_stats: Arc<crate::journal::JournalStats>,
    compactor: Compactor,
    gate: Arc<GcGate>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _lock: StateLock,
}

impl Replica {
    /// Recovers the state folder and starts the pipeline threads.
    pub fn start(cfg: ReplicaConfig) -> Result<Replica, ReplicaError> {
        let span = info_span!("recover", state = %cfg.state_dir.display());
        let _g = span.enter();
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(|e| ReplicaError::Io(format!("creating {}", cfg.state_dir.display()), e))?;
        let lock = lock_state(&cfg.state_dir)?;
        let blobs = Arc::new(BlobStore::open(&cfg.state_dir)?);
        let (record, mut pins) = load_durable(&cfg.state_dir)?;
        let cancelled = || cfg.cancel.is_some_and(|c| c());
        let journal_dir = cfg.state_dir.join("journal");
        // The newest readable checkpoint at or below the committed state;
        // unreadable ones are set aside and reported.
        let found = checkpoint::load_newest(&cfg.state_dir, record.visible).map_err(|e| {
            ReplicaError::Io(
                format!(
                    "reading checkpoints in {}",
                    checkpoint::dir(&cfg.state_dir).display()
                ),
                e,
            )
        })?;
        let restored = found.loaded;
        let base = restored.as_ref().map_or(StateId(0), |l| l.data.state);
        if let Some(floor) = crate::journal::compacted_through(&journal_dir)? {
            if base < floor {
                return Err(ReplicaError::CompactedWithoutCheckpoint {
                    floor,
                    detail: if found.skipped.is_empty() {
                        "no checkpoint files".to_owned()
                    } else {
                        found.skipped.join("; ")
                    },
                });
            }
        }
        if cancelled() {
            return Err(ReplicaError::Cancelled);
        }
        let mut jcfg = JournalConfig::new(journal_dir);
        jcfg.ring_capacity = cfg.ring_capacity;
        jcfg.ring_bytes = cfg.ring_bytes;
        jcfg.segment_bytes = cfg.segment_bytes;
        jcfg.cancel = cfg.cancel;
        // Every committed state must survive recovery: it may cut a torn
        // tail only above the commit record's visible state.
        jcfg.durable_through = record.visible;
        let (journal, report) = match Journal::open(jcfg) {
            Err(JournalError::Cancelled) => return Err(ReplicaError::Cancelled),
            r => r?,
        };
        if let Some(reason) = &report.reason {
            warn!(truncated_bytes = report.truncated_bytes, %reason, "journal tail was cut");
        }

        // Start from the checkpoint (or the empty tree), then replay the
        // journal after it: rebuild the newest accepted state (for
        // validation), the visible state and every retained one.
        let keep: HashSet<StateId> = record
            .retained
            .iter()
            .copied()
            .chain(pins.states())
            .collect();
        let resolutions = Arc::new(Resolutions::open(&cfg.state_dir)?);
        let gc_hold = Arc::new(GcHold::open(&cfg.state_dir));
        if gc_hold.holds(record.visible) {
            info!("a re-bootstrap after an id gap is under way or not visible yet: garbage collection waits for it");
        }
        let mut tree = Arc::new(Tree::empty());
        let mut validator =
            Validator::new(Arc::clone(&tree)).with_resolutions(Arc::clone(&resolutions));
        let mut versions = std::collections::BTreeMap::new();
        let mut resume: Option<Position> = None;
        let (ckpt_id, ckpt_size, ckpt_written) = match &restored {
            Some(l) => (Some(l.data.state), l.size, l.data.created_ms),
            None => (None, 0, UNKNOWN_TIME),
        };
        if let Some(l) = restored {
            let CheckpointData {
                state,
                resume: at,
                window,
                versions: saved,
                ..
            } = l.data;
            info!(checkpoint = %state, path = %l.path.display(), versions = saved.len(), "restoring from checkpoint");
            tree = Arc::clone(&saved[&state]);
            validator.restored(Arc::clone(&tree), &window);
            resume = at;
            versions = saved
                .into_iter()
                .filter(|(s, _)| keep.contains(s) || *s == record.visible)
                .collect();
        }
        let mut visible = (record.visible == tree.state_id).then(|| Arc::clone(&tree));
        let mut follower = journal.follower(base);
        let started = Instant::now();
        let mut replayed = 0u64;
        while let Some(rec) = follower.try_next()? {
            if replayed % 4096 == 4095 && cancelled() {
                return Err(ReplicaError::Cancelled);
            }
            let entry = decode(rec.id, &rec.payload)?;
            let (next, added) = tree
                .apply(&entry.event)
                .map_err(|e| ReplicaError::BadRecord {
                    id: rec.id,
                    detail: e.to_string(),
                })?;
            resolutions.attach(&added);
            tree = Arc::new(next);
            validator.replayed(&entry.event, Arc::clone(&tree));
            if rec.id == record.visible {
                visible = Some(Arc::clone(&tree));
            }
            if keep.contains(&rec.id) {
                versions.insert(rec.id, Arc::clone(&tree));
            }
            resume = Some(entry.next);
            replayed += 1;
        }
        drop(follower);
        let visible = visible.ok_or(ReplicaError::JournalBehindCommit {
            journal: tree.state_id,
            visible: record.visible,
        })?;
        info!(
            replayed,
            checkpoint = base.0,
            visible = %visible.state_id,
            latest = %tree.state_id,
            ms = started.elapsed().as_millis() as u64,
            "recovered"
        );
        let lost: Vec<String> = pins
            .tables
            .iter()
            .filter(|(_, s)| !versions.contains_key(s) && **s != visible.state_id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in lost {
            warn!(scope = %k, "dropping a pin whose state is no longer retained");
            pins.tables.remove(&k);
        }
        if pins
            .root
            .is_some_and(|s| !versions.contains_key(&s) && s != visible.state_id)
        {
            pins.root = None;
        }

        let catalog = Arc::new(Catalog::new(
            &cfg.state_dir,
            Arc::clone(&visible),
            versions,
            pins,
            cfg.retain,
        ));
        let progress = Arc::new(Progress::default());
        progress.set_checkpoint(|c| {
            c.last_id = ckpt_id;
            c.size_bytes = ckpt_size;
            c.restored_from = ckpt_id;
            c.replayed_records = replayed;
            c.problems = found.skipped.clone();
        });
        progress
            .checkpoint_written_ms
            .store(ckpt_written, Ordering::Relaxed);
        let window = validator.window();
        progress
            .unverified_files
            .store(resolutions.unverified_files(), Ordering::Relaxed);
        progress.latest.store(tree.state_id.0, Ordering::Relaxed);
        progress
            .latest_time_ms
            .store(tree.time_ms, Ordering::Relaxed);
        let journal_stats = journal.stats();
        let compactor = journal.compactor();
        let stager_follower = journal.follower(visible.state_id);
        let journal = Arc::new(Mutex::new(journal));
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(GcGate::default());
        let handoff = Arc::new(Handoff::default());
        let cfg = Arc::new(cfg);

        let mut threads = Vec::new();
        let background = Cpu::below(BACKGROUND_NICE);
        // Checkpoints go last: the stager's commits are what readers wait for.
        let lowest = Cpu::below(19);
        let spawn = |name: &str, cpu: Cpu, f: Box<dyn FnOnce() + Send>| {
            spawn_supervised(name, cpu, f, &progress, &stop)
                .map_err(|e| ReplicaError::Io(format!("starting the {name} thread"), e))
        };
        {
            let (journal, progress, stop, cfg) = (
                Arc::clone(&journal),
                Arc::clone(&progress),
                Arc::clone(&stop),
                Arc::clone(&cfg),
            );
            let handoff = Arc::clone(&handoff);
            let ingest: Box<dyn FnOnce() + Send> = match &cfg.hive {
                None => {
                    let pos = match resume {
                        Some(Position::Log(pos)) => pos,
                        None => LogPosition::default(),
                        Some(Position::Hive { .. }) => {
                            return Err(ReplicaError::WrongSource("a Hive notification log"))
                        }
                    };
                    let start = Position::Log(pos.clone());
                    let source =
                        NativeSource::new(SourceLog::new(&cfg.events_dir, pos), cfg.poll_interval);
                    Box::new(move || {
                        run_ingest(
                            source,
                            validator,
                            start,
                            IngestTo {
                                journal: &journal,
                                progress: &progress,
                                stop: &stop,
                            },
                            &mut |_, _| None,
                        )
                    })
                }
                Some(hive) => {
                    let after = match resume {
                        Some(Position::Hive { hive_event_id }) => hive_event_id,
                        None => 0,
                        Some(Position::Log(_)) => {
                            return Err(ReplicaError::WrongSource("a native events folder"))
                        }
                    };
                    let source = HiveSource::open(hive, after)
                        .map_err(|e| ReplicaError::Source(e.to_string()))?;
                    let start = Position::Hive {
                        hive_event_id: after,
                    };
                    let again = cfg.rebootstrap.then(|| AfterGap {
                        cfg: BootstrapConfig::new(&cfg.state_dir, hive.clone()),
                        blobs: Arc::clone(&blobs),
                        hold: Arc::clone(&gc_hold),
                    });
                    let (hive, resolutions) = (hive.clone(), Arc::clone(&resolutions));
                    Box::new(move || {
                        let mut on_fatal = |source: &mut HiveSource, validator: &mut Validator| {
                            let (Some(again), Some((from, to))) = (&again, source.gap()) else {
                                return None;
                            };
                            let at = validator.last_id();
                            let mut record = |built: Built| {
                                journal_rebootstrap(
                                    built,
                                    validator,
                                    &resolutions,
                                    &journal,
                                    &handoff,
                                    &progress,
                                    &stop,
                                )
                            };
                            let gap = Gap { from, to };
                            let y = again.run(gap, at, &progress, &stop, &mut record)?;
                            *source = reopen_hive(&hive, y, &progress, &stop)?;
                            Some(Position::Hive {
                                hive_event_id: y.0 as i64,
                            })
                        };
                        run_ingest(
                            source,
                            validator,
                            start,
                            IngestTo {
                                journal: &journal,
                                progress: &progress,
                                stop: &stop,
                            },
                            &mut on_fatal,
                        )
                    })
                }
            };
            threads.push(spawn("ingest", Cpu::Foreground, ingest)?);
        }
        let fetches = {
            let (blobs, fetch_cfg) = (Arc::clone(&blobs), Arc::clone(&cfg));
            let work: fetch::Work<FetchJob, FetchResult> = Arc::new(move |job: &FetchJob| {
                blobs
                    .fetch_unsynced_any(
                        &job.files,
                        &fetch_cfg.source_root,
                        fetch_cfg.cm_root.as_deref(),
                    )
                    .map(|(i, fetched)| (job.files[i].clone(), fetched))
            });
            let (progress, stop) = (Arc::clone(&progress), Arc::clone(&stop));
            let spawn: fetch::Spawn = Arc::new(move |name: &str, f| {
                spawn_supervised(name, background, f, &progress, &stop)
            });
            let pool = PoolConfig {
                threads: cfg.fetch_threads,
                timeout: cfg.fetch_timeout,
                max_abandoned: MAX_ABANDONED_FETCHES,
            };
            FetchPool::start(pool, FetchJob::pool_key, work, spawn)
                .map_err(|e| ReplicaError::Io("starting the fetch threads".to_owned(), e))?
        };
        {
            let stager = Stager {
                resolutions: Arc::clone(&resolutions),
                pending: Pending::bounded(visible, cfg.max_pending),
                follower: stager_follower,
                catalog: Arc::clone(&catalog),
                blobs: Arc::clone(&blobs),
                progress: Arc::clone(&progress),
                gate: Arc::clone(&gate),
                handoff: Arc::clone(&handoff),
                fetches,
                in_flight: HashSet::new(),
                max_in_flight: cfg.fetch_threads.max(1) * FETCHES_QUEUED_PER_THREAD,
                queued: VecDeque::new(),
                queued_set: HashSet::new(),
                retry_now: HashSet::new(),
                retries: HashMap::new(),
                errors: HashMap::new(),
                unsynced: HashMap::new(),
                stop: Arc::clone(&stop),
            };
            threads.push(spawn("stager", background, Box::new(move || stager.run()))?);
        }
        {
            let (catalog, blobs, progress, gate, stop, cfg) = (
                Arc::clone(&catalog),
                Arc::clone(&blobs),
                Arc::clone(&progress),
                Arc::clone(&gate),
                Arc::clone(&stop),
                Arc::clone(&cfg),
            );
            let hold = Arc::clone(&gc_hold);
            threads.push(spawn(
                "gc",
                background,
                Box::new(move || run_gc(&cfg, &catalog, &blobs, &progress, &gate, &hold, &stop)),
            )?);
        }
        {
            let checkpointer = Checkpointer {
                cfg: Arc::clone(&cfg),
                catalog: Arc::clone(&catalog),
                compactor: compactor.clone(),
                window,
                progress: Arc::clone(&progress),
                stop: Arc::clone(&stop),
                last: base,
            };
            threads.push(spawn(
                "checkpoint",
                lowest,
                Box::new(move || checkpointer.run()),
            )?);
        }

        Ok(Replica {
            catalog,
            blobs,
            progress,
            journal,
            journal_stats,
            compactor,
            gate,
            stop,
            threads,
            _lock: lock,
        })
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Tells GC what readers hold (open directories, referenced tables),
    /// so files below them stay readable after retention lets their
    /// version go.
    pub fn set_held_dirs(&self, held: HeldDirs) {
        self.gate.lock().held = Some(held);
    }

    pub fn blobs(&self) -> &Arc<BlobStore> {
        &self.blobs
    }

    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// The status of SPEC §7.
    pub fn status(&self) -> StatusReport {
        let s = &self.journal_stats;
        let size = self.compactor.size();
        StatusReport::live(
            &self.progress,
            &self.catalog.snapshot(),
            self.blobs.staged_bytes(),
            JournalReport {
                records: s.appended.load(Ordering::Relaxed),
                ring_reads: s.ring_reads.load(Ordering::Relaxed),
                file_reads: s.file_reads.load(Ordering::Relaxed),
                segments: size.segments,
                bytes: size.bytes,
            },
        )
    }

    /// Stops every thread and waits for them.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        match self.journal.lock() {
            Ok(j) => j.close(),
            Err(p) => p.into_inner().close(),
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                error!("a replication thread panicked");
            }
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts a pipeline thread whose panic is never silent: it is logged, the
/// status shows it as `stalled` for good, and the whole pipeline stops
/// (`stop`), so replication rests at the visible state (the mount keeps
/// serving it) until a restart, rather than running on with a part missing.
fn spawn_supervised(
    name: &str,
    cpu: Cpu,
    f: Box<dyn FnOnce() + Send>,
    progress: &Arc<Progress>,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let (progress, stop, thread) = (Arc::clone(progress), Arc::clone(stop), name.to_owned());
    std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        cpu.apply(&thread);
        let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) else {
            return;
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        let reason = format!(
            "internal error: the {thread} thread panicked ({what}); replication stopped at the visible state until stagefs is restarted"
        );
        error!(%reason, "a replication thread panicked");
        progress.set_failure(Stall {
            state_id: None,
            reason,
            file: None,
            line: None,
        });
        stop.store(true, Ordering::SeqCst);
    })
}

/// How a pipeline thread shares the CPU with the process's other threads.
#[derive(Clone, Copy, Debug)]
enum Cpu {
    /// Ingest: what the source logged is journaled first, at the source's
    /// pace (a Hive backlog before the metastore's cleaner drops it).
    Foreground,
    /// Work that can wait a moment: the stager, its fetch threads and GC
    /// ([`BACKGROUND_NICE`] above the thread that started the replica),
    /// checkpoints (19). While ingest catches up on a backlog, or the FUSE
    /// threads serve readers, they take the CPU left over; on an idle CPU
    /// they run as fast as ever. Nice values are per thread on Linux;
    /// under autogroups (the default) or a cgroup of its own they weigh
    /// only against stagefs's own threads.
    Background(libc::c_int),
}

/// How much lower the background threads' priority is: nice +10 gives a
/// thread ~1/10 of a normal thread's share of a CPU both want (CFS
/// weights 110 vs 1,024), never none.
const BACKGROUND_NICE: libc::c_int = 10;

impl Cpu {
    /// [`Cpu::Background`] `by` above the calling thread's nice value
    /// (at most 19, the lowest priority).
    fn below(by: libc::c_int) -> Cpu {
        // SAFETY: `__errno_location` is this thread's errno; `getpriority`
        // returns -1 both for nice -1 and for an error, which errno tells
        // apart. With `who` 0 it reads the calling thread (per thread on
        // Linux).
        let now = unsafe {
            *libc::__errno_location() = 0;
            let n = libc::getpriority(libc::PRIO_PROCESS, 0);
            if n == -1 && *libc::__errno_location() != 0 {
                0
            } else {
                n
            }
        };
        Cpu::Background((now + by).min(19))
    }

    /// Gives the calling thread this priority. Failing (a sandbox that
    /// forbids it) only costs speed: logged, not fatal.
    fn apply(self, thread: &str) {
        let Cpu::Background(nice) = self else {
            return;
        };
        // SAFETY: with `who` 0, setpriority changes only the calling
        // thread's nice value (Linux keeps it per thread).
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            let e = std::io::Error::last_os_error();
            warn!(thread, nice, error = %e, "could not lower the thread's CPU priority; it competes with ingest as an equal");
        }
    }
}

const INGEST_BATCH: usize = 4096;
/// Longest wait between attempts to read a source that is unavailable.
const SOURCE_BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Where ingest writes what it accepts, and its shared flags.
#[derive(Clone, Copy)]
struct IngestTo<'a> {
    journal: &'a Mutex<Journal>,
    progress: &'a Progress,
    stop: &'a AtomicBool,
}

/// Follows `source` into the journal. `start` is where the source was
/// opened (after the last journaled event). `on_fatal` gets a source that
/// cannot go on: `Some(position)` when it made the source able to go on
/// from `position` (the re-bootstrap after an id gap), `None` to hold at
/// the last good state until the source is corrected.
fn run_ingest<S: Source>(
    mut source: S,
    mut validator: Validator,
    start: Position,
    to: IngestTo<'_>,
    on_fatal: &mut dyn FnMut(&mut S, &mut Validator) -> Option<Position>,
) {
    let IngestTo {
        journal,
        progress,
        stop,
        ..
    } = to;
    // Records read but not journaled yet: kept across a retry of the first.
    let mut backlog: VecDeque<S::Record> = VecDeque::new();
    let mut hold = RejectionHold {
        taken_through: start,
        held_at: None,
    };
    let mut failures = 0u32;
    let mut last_error: Option<String> = None;
    let mut report_error = |progress: &Progress, error: Option<String>, failures: &mut u32| {
        match &error {
            Some(msg) if last_error.as_ref() != Some(msg) => {
                warn!(error = %msg, "the source cannot be read; retrying with backoff");
                progress.set_ingest_stall(Some(Stall {
                    state_id: None,
                    reason: format!("{msg} (retrying)"),
                    file: None,
                    line: None,
                }));
            }
            Some(_) => {}
            None if last_error.is_some() => {
                info!("the source can be read again");
                progress.set_ingest_stall(None);
                *failures = 0;
            }
            None => {}
        }
        last_error = error;
    };
    // The last batch's fdatasync, running while the next batch is read
    // (see `syncer`); settled before anything that waits.
    let syncer = syncer::Syncer::start();
    let mut in_flight: Option<syncer::InFlight> = None;
    let settle = |in_flight: &mut Option<syncer::InFlight>| -> bool {
        let Some(f) = in_flight.take() else {
            return true;
        };
        let mut j = match journal.lock() {
            Ok(j) => j,
            Err(p) => p.into_inner(),
        };
        syncer::settle(syncer.as_ref(), &mut j, f, &[], to).is_ok()
    };
    while !stop.load(Ordering::Relaxed) {
        if backlog.is_empty() {
            // A poll that may wait (a query, an idle source) comes after the
            // last batch is published.
            if !source.more_ready() && !settle(&mut in_flight) {
                return;
            }
            match source.poll(INGEST_BATCH) {
                Ok(records) => backlog.extend(records),
                Err(SourceError::Fatal(r)) => {
                    if !settle(&mut in_flight) {
                        return;
                    }
                    progress.set_source(source.report());
                    if let Some(at) = on_fatal(&mut source, &mut validator) {
                        hold.taken_through = at;
                        progress.set_source(source.report());
                        continue;
                    }
                    if !hold.wait(&mut source, &r, progress, stop) {
                        return;
                    }
                    continue;
                }
                Err(SourceError::Transient(msg)) => {
                    if !settle(&mut in_flight) {
                        return;
                    }
                    report_error(progress, Some(msg), &mut failures);
                    progress.set_source(source.report());
                    sleep_unless_stopped(source_backoff(failures), stop);
                    failures += 1;
                    continue;
                }
            }
        }
        if backlog.is_empty() {
            if !settle(&mut in_flight) {
                return;
            }
            report_error(progress, None, &mut failures);
            // Re-read after a rejection and nothing is wrong any more
            // (the bad record was removed): the hold is over.
            hold.release(progress);
            progress.set_source(source.report());
            sleep_unless_stopped(source.idle_wait(), stop);
            continue;
        }
        let mut accepted = 0u64;
        // A source record that cannot be accepted (held until corrected),
        // or a failure to journal an accepted one (stops for good: the
        // validator has taken it, so reading it again would skip it).
        let mut rejected = None;
        let mut failed = None;
        let mut last_taken = None;
        let mut retry = None;
        let mut j = match journal.lock() {
            Ok(j) => j,
            Err(p) => p.into_inner(),
        };
        let mut last_time = UNKNOWN_TIME;
        // This batch's records, to write again if the sync fails.
        let mut appended: Vec<(StateId, Vec<u8>)> = Vec::new();
        while let Some(record) = backlog.front() {
            let event = match source.decode(record, validator.latest()) {
                Ok(event) => event,
                Err(DecodeError::Retry(msg)) => {
                    retry = Some(msg);
                    break;
                }
                Err(DecodeError::Rejected(r)) => {
                    rejected = Some(r);
                    break;
                }
            };
            let (file, line) = source.locate(record);
            // Serialised once: the validator hashes these bytes and the
            // journal record embeds them.
            let canonical = serde_json::to_vec(&event);
            let verdict = match &canonical {
                Ok(bytes) => validator.check_canonical(event, bytes, file, line),
                Err(_) => validator.check(event, file, line),
            };
            match verdict {
                Ok(Verdict::Accepted(acc)) => {
                    let next = source.position_after(record);
                    let id = acc.event.id;
                    let payload = match canonical.and_then(|event| journal_payload(&event, &next)) {
                        Ok(p) => p,
                        Err(e) => {
                            let (file, line) = source.locate(record);
                            failed = Some(Rejection {
                                state_id: Some(id),
                                file,
                                line,
                                reason: format!("cannot encode the event: {e}"),
                            });
                            break;
                        }
                    };
                    if let Err(e) = j.append(id, &payload) {
                        let (file, line) = source.locate(record);
                        failed = Some(Rejection {
                            state_id: Some(id),
                            file,
                            line,
                            reason: format!("journal: {e}"),
                        });
                        break;
                    }
                    appended.push((id, payload));
                    if let Some(t) = acc.event.time_ms {
                        last_time = t;
                    }
                    // Dropped here, not handed to the stager (see `Handoff`).
                    drop(acc);
                    accepted += 1;
                }
                Ok(Verdict::Duplicate) => {
                    progress.events_duplicate.fetch_add(1, Ordering::Relaxed);
                }
                Err(r) => {
                    rejected = Some(r);
                    break;
                }
            }
            last_taken = backlog.pop_front();
        }
        if let Some(record) = &last_taken {
            hold.taken_through = source.position_after(record);
        }
        let this = syncer::Batch {
            accepted,
            appended,
            last_id: validator.last_id(),
            last_time,
        };
        if syncer::end_batch(syncer.as_ref(), &mut j, &mut in_flight, this, to).is_err() {
            return;
        }
        drop(j);
        // What waits below comes after the batch is published.
        if (failed.is_some() || rejected.is_some() || retry.is_some()) && !settle(&mut in_flight) {
            return;
        }
        progress.set_source(source.report());
        if accepted > 0 {
            hold.release(progress);
        }
        if let Some(r) = failed {
            error!(rejection = %r, "cannot journal an accepted event; replication stops at the last good state");
            stop_at_rejection(progress, r.stall(), stop);
            return;
        }
        if let Some(r) = rejected {
            // What follows the rejected record was read past it: forget it,
            // the re-read brings it back.
            backlog.clear();
            if !hold.wait(&mut source, &r, progress, stop) {
                return;
            }
            continue;
        }
        if let Some(msg) = retry {
            report_error(progress, Some(msg), &mut failures);
            sleep_unless_stopped(source_backoff(failures), stop);
            failures += 1;
        } else if accepted > 0 {
            report_error(progress, None, &mut failures);
        }
    }
    // Shutdown: what is durable is published (a restart finds it either way).
    settle(&mut in_flight);
}

/// Journals a re-bootstrap (the ingest thread, the journal's only writer):
/// the record at the new id replaces the newest accepted warehouse with the
/// bootstrapped one (`plan::replacing`), so the stager stages (nothing:
/// its files are stored) and commits it like any state. Durability order:
/// blobs (published while staging), what the files resolved to, the record.
fn journal_rebootstrap(
    built: Built,
    validator: &mut Validator,
    resolutions: &Resolutions,
    journal: &Mutex<Journal>,
    handoff: &Handoff,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<StateId, String> {
    built
        .record_contents(resolutions)
        .map_err(|e| e.to_string())?;
    let event = crate::bootstrap::plan::replacing(validator.latest(), built.event);
    let y = event.id;
    if y <= validator.last_id() {
        return Err(format!(
            "the bootstrap state {y} is not above the replica's {}",
            validator.last_id()
        ));
    }
    let acc = match validator.check(event, None, None) {
        Ok(Verdict::Accepted(acc)) => acc,
        Ok(Verdict::Duplicate) => return Err(format!("state {y} is already journaled")),
        Err(r) => return Err(r.reason),
    };
    let next = Position::Hive {
        hive_event_id: y.0 as i64,
    };
    let payload = encode_entry(&acc.event, &next)
        .map_err(|e| format!("encoding the bootstrap record: {e}"))?;
    let bytes = payload.len();
    let mut j = match journal.lock() {
        Ok(j) => j,
        Err(p) => p.into_inner(),
    };
    // The validator has accepted it: write it until it is durable.
    if let Err(e) = j.append(y, &payload).and_then(|()| j.sync()) {
        if !rewrite_journal_until_synced(&mut j, &[(y, payload)], e, progress, stop) {
            return Err("stopped before the bootstrap record was durable".into());
        }
    }
    drop(j);
    if let Some(t) = acc.event.time_ms {
        progress.latest_time_ms.store(t, Ordering::Relaxed);
    }
    handoff.push(vec![(*acc, bytes)]);
    progress.events_accepted.fetch_add(1, Ordering::Relaxed);
    progress.latest.store(y.0, Ordering::Relaxed);
    Ok(y)
}

/// The Hive source again, after the re-bootstrap at `y` (retried while the
/// metastore is unavailable; None at shutdown).
fn reopen_hive(
    hive: &HiveConfig,
    y: StateId,
    progress: &Progress,
    stop: &AtomicBool,
) -> Option<HiveSource> {
    let mut failures = 0;
    while !stop.load(Ordering::Relaxed) {
        match HiveSource::open(hive, y.0 as i64) {
            Ok(s) => {
                if failures > 0 {
                    progress.set_ingest_stall(None);
                }
                return Some(s);
            }
            Err(e) => {
                warn!(error = %e, "cannot open the metastore after the re-bootstrap; retrying");
                progress.set_ingest_stall(Some(Stall {
                    state_id: None,
                    reason: format!("opening the metastore: {e} (retrying)"),
                    file: None,
                    line: None,
                }));
                sleep_unless_stopped(source_backoff(failures), stop);
                failures += 1;
            }
        }
    }
    None
}

/// Delay before the next read of a source that failed `failures` times in
/// a row: 200 ms doubling, capped.
fn source_backoff(failures: u32) -> Duration {
    let ms = 200u64.saturating_mul(1u64.checked_shl(failures).unwrap_or(u64::MAX));
    Duration::from_millis(ms).min(SOURCE_BACKOFF_CAP)
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// After a failed journal sync: reports the stall, then (with capped
/// backoff) cuts the journal back to its durable end and writes `records`
/// again until a sync succeeds (true) or shutdown (false).
fn rewrite_journal_until_synced(
    j: &mut Journal,
    records: &[(StateId, Vec<u8>)],
    first: JournalError,
    progress: &Progress,
    stop: &AtomicBool,
) -> bool {
    let mut error = first;
    let mut attempt = 0;
    loop {
        let reason = if error.is_no_space() {
            format!("disk full: journal: {error} (retrying)")
        } else {
            format!("journal: {error} (retrying)")
        };
        if attempt == 0 {
            error!(%reason, "journal sync failed; ingest waits and retries");
        }
        progress.set_ingest_stall(Some(Stall {
            state_id: None,
            reason,
            file: None,
            line: None,
        }));
        let until = Instant::now() + backoff(attempt);
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let retried = j.reset_after_failure().and_then(|()| {
            for (id, payload) in records {
                j.append(*id, payload)?;
            }
            j.sync()
        });
        match retried {
            Ok(()) => {
                info!(
                    attempts = attempt + 1,
                    "journal sync succeeded again; ingest resumes"
                );
                progress.set_ingest_stall(None);
                return true;
            }
            Err(e) => {
                debug!(attempt, error = %e, "journal retry failed");
                error = e;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

/// How often a rejected record is looked at again.
const REREAD_INTERVAL: Duration = Duration::from_secs(1);

/// Ingest's place after a rejection: what it waits at, and where the
/// source is read again from.
struct RejectionHold {
    /// Where the source continues after the last record taken (accepted or
    /// a duplicate): the rejected record is the next one.
    taken_through: Position,
    /// The rejection ingest is held at, while the source is re-read.
    held_at: Option<String>,
}

impl RejectionHold {
    /// Holds ingest at a rejected record: reports it (logging it when it is
    /// new), then waits until the source may hold a correction and has
    /// been rewound to `taken_through` (true), or shutdown (false).
    fn wait<S: Source>(
        &mut self,
        source: &mut S,
        rejection: &Rejection,
        progress: &Progress,
        stop: &AtomicBool,
    ) -> bool {
        let text = rejection.to_string();
        if self.held_at.as_deref() != Some(text.as_str()) {
            progress.events_rejected.fetch_add(1, Ordering::Relaxed);
            error!(rejection = %text, "rejected a source event; replication waits at the last good state until the source is corrected");
        }
        progress.set_ingest_stall(Some(rejection.stall()));
        self.held_at = Some(text);
        loop {
            sleep_unless_stopped(REREAD_INTERVAL, stop);
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            if source.reread_from(&self.taken_through) {
                return true;
            }
        }
    }

    /// Ends the hold once the source reads well again.
    fn release(&mut self, progress: &Progress) {
        if let Some(was) = self.held_at.take() {
            info!(rejection = %was, "the rejected source event was corrected; ingest resumes");
            progress.set_ingest_stall(None);
        }
    }
}

/// Ends ingest at an accepted event that cannot be journaled: reports it
/// and waits for shutdown (a restart reads the event again).
fn stop_at_rejection(progress: &Progress, stall: Stall, stop: &AtomicBool) {
    progress.set_ingest_stall(Some(stall));
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
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
    follower: crate::journal::Follower,
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
/// At most one commit (one durable commit record) per this interval.
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
                failed_commit = self.commit().err();
                last_commit = Instant::now();
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
        self.progress.in_flight.store(
            (self.in_flight.len() + self.queued.len()) as u64,
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

/// The checkpoint thread: writes a checkpoint of the visible state when it
/// moved `checkpoint_events` state-ids past the last one or
/// `checkpoint_interval` passed, then prunes old checkpoints and compacts
/// the journal through the oldest one kept. Works on an immutable catalog
/// snapshot, so commits never wait for it. A failure is logged, shown in
/// status and retried at the next trigger; nothing is compacted then.
struct Checkpointer {
    cfg: Arc<ReplicaConfig>,
    catalog: Arc<Catalog>,
    compactor: Compactor,
    window: Arc<DupWindow>,
    progress: Arc<Progress>,
    stop: Arc<AtomicBool>,
    /// State of the newest checkpoint (0: none).
    last: StateId,
}

impl Checkpointer {
    fn run(mut self) {
        // Since the last checkpoint (or the start).
        let mut since = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            let visible = self.catalog.snapshot().visible.state_id;
            if visible <= self.last {
                continue;
            }
            let by_count = self.cfg.checkpoint_events > 0
                && visible.0 - self.last.0 >= self.cfg.checkpoint_events;
            if !by_count && since.elapsed() < self.cfg.checkpoint_interval {
                continue;
            }
            since = Instant::now();
            match self.checkpoint() {
                Ok(()) => {}
                Err(e) if self.stop.load(Ordering::Relaxed) => {
                    debug!(error = %e, "checkpoint abandoned at shutdown");
                }
                Err(e) => {
                    warn!(error = %e, "cannot write a checkpoint; will retry");
                    self.progress.set_checkpoint(|c| {
                        c.problems.retain(|p| !p.starts_with("last write failed"));
                        c.problems.push(format!("last write failed: {e}"));
                    });
                }
            }
        }
    }

    /// One checkpoint of the current snapshot, then pruning and compaction.
    fn checkpoint(&mut self) -> Result<(), String> {
        let started = Instant::now();
        let snapshot = self.catalog.snapshot();
        let state = snapshot.visible.state_id;
        let resume = self.position_after(state)?;
        let data = CheckpointData {
            state,
            created_ms: crate::status::now_ms(),
            resume,
            window: self.window.through(state),
            versions: snapshot.versions.clone(),
        };
        drop(snapshot);
        let rate = Some(self.cfg.checkpoint_rate).filter(|&r| r > 0);
        let (path, size) = checkpoint::write(&self.cfg.state_dir, &data, Some(&self.stop), rate)
            .map_err(|e| format!("writing the checkpoint of state {state}: {e}"))?;
        let wrote_ms = started.elapsed().as_millis() as u64;
        self.last = state;
        self.progress
            .checkpoint_written_ms
            .store(data.created_ms, Ordering::Relaxed);
        self.progress.set_checkpoint(|c| {
            c.last_id = Some(state);
            c.size_bytes = size;
            c.written += 1;
            c.problems.retain(|p| !p.starts_with("last write failed"));
        });
        drop(data);
        // Only once the new checkpoint is durable: drop the oldest, then
        // the journal that no kept checkpoint needs.
        let oldest = checkpoint::prune(&self.cfg.state_dir, Some(&self.stop))
            .map_err(|e| format!("removing old checkpoints: {e}"))?;
        let removed = match oldest {
            Some(through) => self
                .compactor
                .remove_through(through, Some(&self.stop))
                .map_err(|e| format!("compacting the journal: {e}"))?,
            None => 0,
        };
        info!(
            state = %state,
            bytes = size,
            ms = wrote_ms,
            path = %path.display(),
            segments_removed = removed,
            "checkpoint written"
        );
        Ok(())
    }

    /// The source position journaled with event `state` (where reading
    /// continues after it), for a restart with no journal record after it.
    fn position_after(&self, state: StateId) -> Result<Option<Position>, String> {
        if state == StateId(0) {
            return Ok(None);
        }
        let mut f = self.compactor.follower(StateId(state.0 - 1));
        match f.try_next() {
            Ok(Some(rec)) if rec.id == state => decode(rec.id, &rec.payload)
                .map(|e| Some(e.next))
                .map_err(|e| e.to_string()),
            Ok(_) => Err(format!("journal record {state} is not in the journal")),
            Err(e) => Err(format!("reading journal record {state}: {e}")),
        }
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

/// Blob deletion batch size: the gate is held per batch, so the stager
/// waits at most one batch of unlinks.
const GC_BATCH: usize = 256;

/// A GC pass's scan (marking every retained file and listing the store)
/// costs time in proportion to the files stored, whether anything became
/// garbage or not: the next pass starts no sooner than this many times
/// the last scan's duration after it, so scanning takes at most a tenth
/// of the GC thread's time (a store of millions of blobs, with commits
/// every moment, would otherwise be scanned back to back).
const GC_SCAN_SPACING: u32 = 9;

fn run_gc(
    cfg: &ReplicaConfig,
    catalog: &Catalog,
    blobs: &BlobStore,
    progress: &Progress,
    gate: &GcGate,
    hold: &GcHold,
    stop: &AtomicBool,
) {
    let mut last: Option<Arc<catalog::Snapshot>> = None;
    // Readers held directories at the last pass: their blobs may be free
    // once they close, with no new commit to trigger a pass.
    let mut held_last = false;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() < next {
            continue;
        }
        next = Instant::now() + cfg.gc_interval;
        let snapshot = catalog.snapshot();
        // A re-bootstrap's staged files belong to no state yet.
        if hold.holds(snapshot.visible.state_id) {
            continue;
        }
        if !held_last && last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &snapshot)) {
            continue;
        }
        match collect_garbage(catalog, blobs, gate, stop) {
            Ok(Collected {
                removed,
                freed,
                held,
                scan,
            }) => {
                next = next.max(Instant::now() + scan * GC_SCAN_SPACING);
                held_last = held > 0;
                progress.gc_runs.fetch_add(1, Ordering::Relaxed);
                progress.gc_removed.fetch_add(removed, Ordering::Relaxed);
                progress.gc_freed_bytes.fetch_add(freed, Ordering::Relaxed);
                if removed > 0 {
                    info!(removed, freed, "garbage collected");
                }
                last = Some(snapshot);
            }
            Err(e) => warn!(error = %e, "garbage collection failed; will retry"),
        }
    }
}

/// What one GC pass did.
struct Collected {
    /// Blobs removed and the bytes they held.
    removed: u64,
    freed: u64,
    /// Directories held by readers, whose files were kept.
    held: usize,
    /// How long marking and listing the store took (not the removals).
    scan: Duration,
}

/// One mark-and-sweep pass.
fn collect_garbage(
    catalog: &Catalog,
    blobs: &BlobStore,
    gate: &GcGate,
    stop: &AtomicBool,
) -> Result<Collected, StageError> {
    let started = Instant::now();
    let (pending, snapshot, held) = {
        let mut g = gate.lock();
        g.marking = true;
        g.touched.clear();
        (g.pending.clone(), catalog.snapshot(), g.held.clone())
    };
    let held_dirs = held.map(|h| h()).unwrap_or_default();
    let held_count = held_dirs.len();
    let result = (|| {
        let mut live: HashSet<BlobId> = HashSet::new();
        let mut seen_dirs: HashSet<catalog::NodeId> = HashSet::new();
        mark_versions(
            snapshot.versions.values().map(|tree| &tree.root),
            &mut live,
            &mut seen_dirs,
        );
        // Pending trees are the visible one (a version) plus the files
        // their events added: those entries are what they reference.
        live.extend(pending.blobs());
        for dir in &held_dirs {
            mark(dir, &mut live, &mut seen_dirs);
        }
        let stored = blobs.list()?;
        let candidates: Vec<BlobId> = stored.into_iter().filter(|b| !live.contains(b)).collect();
        let scan = started.elapsed();
        let (mut removed, mut freed) = (0, 0);
        for chunk in candidates.chunks(GC_BATCH) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let g = gate.lock();
            for b in chunk {
                if !g.touched.contains(b) {
                    freed += blobs.remove(b)?;
                    removed += 1;
                }
            }
        }
        Ok(Collected {
            removed,
            freed,
            held: held_count,
            scan,
        })
    })();
    let mut g = gate.lock();
    g.marking = false;
    g.touched.clear();
    result
}

/// Marks the blob of every file in `roots` (versions in state order). The
/// first is walked whole; each later one only where it differs from the
/// one before it (imbl's `diff` skips the map nodes two versions share), so
/// a pass costs the files once plus what changed between versions, not
/// the files once per retained version: 16 versions of a table whose
/// every partition changed between them are otherwise 16 walks of all of
/// its files.
fn mark_versions<'a>(
    roots: impl IntoIterator<Item = &'a Arc<catalog::DirNode>>,
    live: &mut HashSet<BlobId>,
    seen: &mut HashSet<catalog::NodeId>,
) {
    let mut before: Option<&Arc<catalog::DirNode>> = None;
    for root in roots {
        match before {
            None => mark(root, live, seen),
            Some(marked) => mark_changes(marked, root, live, seen),
        }
        before = Some(root);
    }
}

/// Marks `dir` given that every file below `marked` is marked already:
/// only the entries that are not the very nodes `marked` holds under the
/// same name are visited.
fn mark_changes(
    marked: &catalog::DirNode,
    dir: &catalog::DirNode,
    live: &mut HashSet<BlobId>,
    seen: &mut HashSet<catalog::NodeId>,
) {
    if !seen.insert(dir.meta.id) {
        return;
    }
    for change in marked.children.diff(&dir.children) {
        let node = match change {
            imbl::ordmap::DiffItem::Remove(..) => continue,
            imbl::ordmap::DiffItem::Add(_, node) => node,
            imbl::ordmap::DiffItem::Update {
                old: (_, catalog::Node::Dir(old)),
                new: (_, catalog::Node::Dir(new)),
            } => {
                mark_changes(old, new, live, seen);
                continue;
            }
            imbl::ordmap::DiffItem::Update { new: (_, node), .. } => node,
        };
        match node {
            catalog::Node::Dir(d) => mark(d, live, seen),
            catalog::Node::File(f) => {
                live.insert(f.blob());
            }
        }
    }
}

fn mark(dir: &catalog::DirNode, live: &mut HashSet<BlobId>, seen: &mut HashSet<catalog::NodeId>) {
    if !seen.insert(dir.meta.id) {
        return; // shared with a version already marked
    }
    for (_, child) in dir.children.iter() {
        match child {
            catalog::Node::Dir(d) => mark(d, live, seen),
            catalog::Node::File(f) => {
                live.insert(f.blob());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    /// GC's mark over retained versions, walking each only where it
    /// differs from the one before, marks exactly the union of every
    /// version's files: random adds, overwrites, drops, renames and
    /// truncates over two tables, versions taken at random gaps.
    #[test]
    fn marking_versions_by_their_changes_marks_every_file_of_every_version() {
        let sha = |n: usize| format!("{n:064x}");
        for seed in 0..40 {
            let mut rng = crate::workload::Rng::new(seed);
            let mut tree = Tree::empty();
            let mut roots = Vec::new();
            let mut id = 0u64;
            let mut ev = |line: String, tree: &mut Tree| {
                id += 1;
                let line = line.replace("ID", &id.to_string());
                if let Ok((next, _)) = tree.apply(&Event::parse_line(line.as_bytes()).unwrap()) {
                    *tree = next;
                }
            };
            ev(
                r#"{"id":ID,"op":"create_database","db":"d"}"#.into(),
                &mut tree,
            );
            for step in 0..120 {
                let t = format!("t{}", rng.below(2));
                let p = rng.below(4);
                let files = (0..rng.below(4))
                    .map(|k| {
                        format!(
                            r#"{{"path":"d/{t}/p={p}/f{step}_{k}","size":1,"sha256":"{}"}}"#,
                            sha(rng.below(60))
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                let line = match rng.below(10) {
                    0 => format!(
                        r#"{{"id":ID,"op":"create_table","db":"d","table":"{t}","partition_keys":["p"]}}"#
                    ),
                    1 => format!(
                        r#"{{"id":ID,"op":"drop_partition","db":"d","table":"{t}","partition":{{"p":"{p}"}}}}"#
                    ),
                    2 => format!(
                        r#"{{"id":ID,"op":"replace_files","db":"d","table":"{t}","partition":{{"p":"{p}"}},"files":[{files}]}}"#
                    ),
                    3 if rng.below(4) == 0 => {
                        format!(r#"{{"id":ID,"op":"drop_table","db":"d","table":"{t}"}}"#)
                    }
                    4 => format!(
                        r#"{{"id":ID,"op":"rename_table","db":"d","table":"{t}","new_db":"d","new_table":"t{}"}}"#,
                        rng.below(3)
                    ),
                    _ => format!(
                        r#"{{"id":ID,"op":"add_files","db":"d","table":"{t}","partition":{{"p":"{p}"}},"files":[{files}]}}"#
                    ),
                };
                ev(line, &mut tree);
                if rng.below(3) == 0 {
                    roots.push(Arc::clone(&tree.root));
                }
            }
            let mut expected = HashSet::new();
            for root in &roots {
                mark(root, &mut expected, &mut HashSet::new());
            }
            let (mut live, mut seen) = (HashSet::new(), HashSet::new());
            mark_versions(&roots, &mut live, &mut seen);
            assert_eq!(live, expected, "seed {seed}");
            assert!(
                !expected.is_empty(),
                "seed {seed}: the workload named no file"
            );
        }
    }
}
