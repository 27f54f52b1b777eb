//! The replication pipeline: source → journal → staged blobs → commits,
//! one file per thread.
//!
//! [`Replica::start`] recovers the state folder (`recovery.rs`) and starts
//! the threads, each the single writer of what it owns:
//! - **ingest** (`ingest.rs`) follows the source, validates each event
//!   against the newest accepted state and appends accepted events to the
//!   journal, fsynced in groups on the journal's sync thread (`syncer.rs`).
//!   A rejected event holds ingest at the last good state until the source
//!   is corrected ([`Source::reread_from`](crate::source::Source::reread_from)).
//! - **stager** (`stager.rs`) follows the journal (memory ring first, segment
//!   files when behind), builds pending states ([`catalog::Pending`],
//!   bounded in number), sends each missing blob to the fetch workers,
//!   retries failures with capped backoff, and commits the newest complete
//!   state ([`catalog::Catalog::commit`]: commit record fsynced before the
//!   new state is published).
//! - **fetch workers** ([`fetch`]) copy and verify one file each into the
//!   blob store; one that makes no progress for `fetch_timeout` (a hung
//!   source read) is abandoned and replaced, and the attempt retried.
//! - **gc** (`gc.rs`) deletes blobs that no retained or pending state
//!   references, nor any directory a reader holds.
//! - **checkpoint** (`checkpointer.rs`) writes the retained and pinned trees
//!   to `checkpoints/` every [`ReplicaConfig::checkpoint_events`] state-ids
//!   or [`ReplicaConfig::checkpoint_interval`], then compacts the journal
//!   ([`crate::checkpoint`]). A restart loads the newest readable
//!   checkpoint and replays only the journal after it.
//!
//! Every thread is supervised and runs at its CPU priority (`threads.rs`).
//! GC and the stager agree through `gc::GcGate`: the stager publishes what
//! its pending states reference ([`catalog::PendingRefs`]: the visible tree
//! plus the file entries of their events) and checks blob presence under
//! the gate, and GC never deletes a blob the stager referenced after GC
//! took its view of the trees. Open files need no protection: a reader
//! holds the blob's file descriptor, so unlinking it does not disturb the
//! read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{error, info_span};

use crate::bootstrap::after_gap::GcHold;
use crate::catalog::{self, Catalog, Resolutions};
use crate::checkpoint;
use crate::event::StateId;
use crate::journal::{Compactor, Journal, JournalEntry, JournalError};
use crate::source::hive::{HdfsChecks, HiveConfig};
use crate::stage::{BlobStore, StageError};
use crate::state_lock::{lock_state, StateLock, StateLockError};
use crate::status::{JournalReport, Progress, StatusReport};

mod checkpointer;
pub mod fetch;
mod gc;
mod ingest;
mod recovery;
mod stager;
mod syncer;
mod threads;

use gc::GcGate;
use ingest::Handoff;
use threads::{spawn_supervised, Cpu, BACKGROUND_NICE};

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
    /// How remote source files (S3) are reached.
    pub remotes: crate::source_file::Remotes,
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
            remotes: crate::source_file::Remotes::default(),
            rebootstrap: false,
        }
    }
}

/// Default of [`ReplicaConfig::fetch_timeout`] (`--fetch-timeout`): long
/// enough for a busy NFS server, short enough that a hang shows in status.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
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

/// Directories readers hold (from the mount's view): GC keeps their blobs.
pub type HeldDirs = Arc<dyn Fn() -> Vec<Arc<catalog::DirNode>> + Send + Sync>;

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
        let blobs = Arc::new(
            BlobStore::open(&cfg.state_dir)?
                .with_checks(Arc::new(HdfsChecks))
                .with_remotes(cfg.remotes.clone())
                .with_event_time_margin(
                    cfg.hive
                        .as_ref()
                        .map_or_else(Default::default, |h| h.event_time_margin),
                ),
        );
        let recovered = recovery::recover(&cfg)?;
        let journal = recovered.journal;
        let journal_stats = journal.stats();
        let compactor = journal.compactor();
        let stager_follower = journal.follower(recovered.visible.state_id);
        let gate = GcGate::starting(
            recovered.visible.state_id.0,
            recovered.progress.latest.load(Ordering::Relaxed),
            recovered.after_visible,
        );
        let shared = Shared {
            cfg: Arc::new(cfg),
            catalog: recovered.catalog,
            blobs,
            resolutions: recovered.resolutions,
            journal: Arc::new(Mutex::new(journal)),
            progress: recovered.progress,
            gate: Arc::new(gate),
            handoff: Arc::new(Handoff::default()),
            gc_hold: recovered.gc_hold,
            stop: Arc::new(AtomicBool::new(false)),
            background: Cpu::below(BACKGROUND_NICE),
        };

        let mut replica = Replica {
            catalog: Arc::clone(&shared.catalog),
            blobs: Arc::clone(&shared.blobs),
            progress: Arc::clone(&shared.progress),
            journal: Arc::clone(&shared.journal),
            journal_stats,
            compactor: compactor.clone(),
            gate: Arc::clone(&shared.gate),
            stop: Arc::clone(&shared.stop),
            threads: Vec::new(),
            _lock: lock,
        };
        // source → ingest → journal → stager (⇄ fetch workers) → catalog,
        // with gc and checkpoints beside them. A thread that cannot start
        // drops `replica`, which stops and joins those started before it.
        let threads = &mut replica.threads;
        threads.push(ingest::start(
            &shared,
            recovered.resume,
            recovered.validator,
        )?);
        threads.push(stager::start(&shared, stager_follower, recovered.visible)?);
        threads.push(gc::start(&shared)?);
        threads.push(checkpointer::start(
            &shared,
            compactor,
            recovered.window,
            recovered.base,
        )?);
        Ok(replica)
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

/// What the pipeline threads share; each thread's `start` takes its part.
struct Shared {
    cfg: Arc<ReplicaConfig>,
    catalog: Arc<Catalog>,
    blobs: Arc<BlobStore>,
    resolutions: Arc<Resolutions>,
    /// Written by ingest only.
    journal: Arc<Mutex<Journal>>,
    progress: Arc<Progress>,
    gate: Arc<GcGate>,
    handoff: Arc<Handoff>,
    gc_hold: Arc<GcHold>,
    stop: Arc<AtomicBool>,
    /// The staging threads' priority: below the thread that started the
    /// replica.
    background: Cpu,
}

impl Shared {
    /// Starts a supervised pipeline thread (see `threads.rs`).
    fn spawn(
        &self,
        name: &str,
        cpu: Cpu,
        f: Box<dyn FnOnce() + Send>,
    ) -> Result<JoinHandle<()>, ReplicaError> {
        spawn_supervised(name, cpu, f, &self.progress, &self.stop)
            .map_err(|e| ReplicaError::Io(format!("starting the {name} thread"), e))
    }
}
