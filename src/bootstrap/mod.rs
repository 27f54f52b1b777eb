//! Bootstrap: start replicating a Hive warehouse that already holds data
//! (SPEC §2 "Bootstrap", docs/HIVE.md "Bootstrap", issue 12).
//!
//! Owns `<state>/bootstrap/` (`staged.log`: files already copied;
//! `report.json`: the outcome) and the first journal record of a
//! bootstrapped state folder.
//!
//! The run, in rounds:
//! 1. [`snapshot::read`]: databases, tables, partition keys, partitions,
//!    locations and table parameters in one consistent database snapshot,
//!    with the event id X it is at.
//! 2. Each table's locations are listed (a transactional table's: only
//!    the `base_`/`delta_` directories a Hive reader at X reads, chosen
//!    by [`acid`]; undecidable ones make the table untrusted) and every
//!    file is staged
//!    ([`listing`]: copied into the blob store with its sha256, published
//!    durably in groups). Tables go in chunks; a lister thread lists the
//!    next chunk while the driver stages the one before.
//! 3. The events after X are read (the notification log, decoded exactly
//!    as incremental replication decodes them) and merged with the
//!    listings by [`plan::Plan`]: a table an event touched before its
//!    listing was checked is *tainted* and listed again in the next round
//!    from a newer snapshot; the others are brought forward by the events.
//!    After at most `max_rounds` rounds, tables still tainted are reported
//!    by name and reason and the bootstrap fails: nothing is shown.
//! 4. The finished state (every table at one source id Y, the last event
//!    merged) is written as ONE journal record at id Y whose source
//!    position is `EVENT_ID` Y: the changes that build the whole warehouse
//!    from empty. Before it, what each listed file resolved to is made
//!    durable in `resolved.log` (the files are staged already). The
//!    replica then replays or stages that record like any other: its
//!    state commits as one state; ingest continues at Y + 1, so no event is
//!    missed or applied twice.
//!
//! Nothing is visible before the record is committed. A run killed at any
//! point leaves no record; the same command starts over from a new
//! snapshot and finds the files it staged in `staged.log` (not copied
//! again). Called by the daemon before it starts the replica
//! (`--bootstrap`) and by `stagefs bootstrap`.
//!
//! After an id gap on a folder that already replicates, the same steps 1-3
//! ([`rebuild`]) run inside the replica's ingest thread
//! ([`after_gap`]); its record replaces the replica's newest state with the
//! bootstrapped warehouse ([`plan::replacing`]) at an id above every id
//! the folder holds.

pub mod acid;
pub mod after_gap;
pub mod listing;
pub mod plan;
pub mod progress;
pub mod snapshot;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::catalog::Resolutions;
use crate::event::{is_valid_file_name, is_valid_source_path, BlobId, FileRef, StateId, Verify};
use crate::journal::{Journal, JournalConfig, JournalEntry};
use crate::source::hive::adapter::{name, DEFAULT_PARTITION};
use crate::source::hive::model::NotificationRow;
use crate::source::hive::{HiveConfig, HiveRows, HiveSource};
use crate::source::{DecodeError, Position, Source, SourceError};
use crate::stage::BlobStore;
use crate::status::{BootstrapReport, UnlistedTable};

use crate::source::hive::map::Place;
use listing::{list_location, list_remote, FileStager, ListedFile, Staged};
use plan::{PartitionFiles, Plan, TableBase, TableName};
pub use progress::BootstrapProgress;
use snapshot::{Snapshot, SnapshotError, TableMeta};

/// How to bootstrap.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    pub state_dir: PathBuf,
    /// Must read a metastore (`--hive-metastore`).
    pub hive: HiveConfig,
    /// Rounds of listing (the first included) before tainted tables are
    /// reported and the bootstrap fails.
    pub max_rounds: u32,
    /// Wait after a round's listing before reading the events that check
    /// it: a Hive write puts its files in place before its event commits.
    pub settle: Duration,
    pub copy_threads: usize,
    /// Tables listed and staged together (at most; a chunk also ends at
    /// `files_per_chunk` files).
    pub tables_per_chunk: usize,
    pub files_per_chunk: usize,
    /// How often the progress line is logged.
    pub report_every: Duration,
    /// How remote locations (S3) are listed and read.
    pub remotes: crate::source_file::Remotes,
}

impl BootstrapConfig {
    pub fn new(state_dir: &Path, hive: HiveConfig) -> BootstrapConfig {
        BootstrapConfig {
            state_dir: state_dir.to_owned(),
            hive,
            max_rounds: 6,
            settle: Duration::from_secs(1),
            copy_threads: 4,
            tables_per_chunk: 512,
            files_per_chunk: 4096,
            report_every: Duration::from_secs(5),
            remotes: crate::source_file::Remotes::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{0}")]
    Usage(String),
    #[error("bootstrap: {0}")]
    Failed(String),
    #[error("bootstrap: {count} table(s) could not be listed consistently: {list}", count = .0.len(), list = describe(.0))]
    Unlisted(Vec<UnlistedTable>),
    #[error("bootstrap stopped before it completed (run the same command to resume)")]
    Stopped,
}

fn describe(tables: &[UnlistedTable]) -> String {
    let mut parts: Vec<String> = tables
        .iter()
        .take(5)
        .map(|t| format!("{} ({})", t.table, t.reason))
        .collect();
    if tables.len() > 5 {
        parts.push(format!("and {} more", tables.len() - 5));
    }
    parts.join("; ")
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The bootstrap state was journaled at this id.
    Bootstrapped(StateId),
    /// The state folder already holds replicated state: nothing to do.
    AlreadyReplicating(StateId),
}

const DIR: &str = "bootstrap";
const REPORT_FILE: &str = "report.json";

/// The last outcome recorded in `state_dir` (for status after a restart).
pub fn last_report(state_dir: &Path) -> Option<BootstrapReport> {
    let bytes = std::fs::read(state_dir.join(DIR).join(REPORT_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_report(state_dir: &Path, report: &BootstrapReport) {
    let path = state_dir.join(DIR).join(REPORT_FILE);
    let text = serde_json::to_vec_pretty(report).unwrap_or_default();
    if let Err(e) = crate::durable::write_atomic(&path, &text) {
        warn!(error = %e, "cannot record the bootstrap report");
    }
}

/// Runs a bootstrap into `cfg.state_dir` (see the module docs). The caller
/// must not run a replica on the folder meanwhile (the state lock is held).
/// `stop` is polled between steps. A folder that already replicates is left
/// as it is ([`Outcome::AlreadyReplicating`]); the re-bootstrap after an id
/// gap runs inside the replica instead (`replicate.rs`, [`rebuild`]).
pub fn run(
    cfg: &BootstrapConfig,
    progress: &BootstrapProgress,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Outcome, BootstrapError> {
    if !matches!(cfg.hive.rows, HiveRows::Metastore(_)) {
        return Err(BootstrapError::Usage(
            "--bootstrap reads the metastore's tables: give --hive-metastore URL".into(),
        ));
    }
    let io = |what: String| move |e: String| BootstrapError::Failed(format!("{what}: {e}"));
    std::fs::create_dir_all(&cfg.state_dir).map_err(|e| {
        BootstrapError::Failed(format!("creating {}: {e}", cfg.state_dir.display()))
    })?;
    let _lock = crate::state_lock::lock_state(&cfg.state_dir)
        .map_err(|e| BootstrapError::Usage(e.to_string()))?;
    let (mut journal, _) = Journal::open(JournalConfig::new(cfg.state_dir.join("journal")))
        .map_err(|e| io("opening the journal".into())(e.to_string()))?;
    if let Some(last) = journal.last_id() {
        info!(%last, "the state folder already replicates; no bootstrap needed");
        return Ok(Outcome::AlreadyReplicating(last));
    }
    let blobs = Arc::new(
        BlobStore::open(&cfg.state_dir)
            .map_err(|e| io("opening the blob store".into())(e.to_string()))?
            .with_remotes(cfg.remotes.clone())
            .with_event_time_margin(cfg.hive.event_time_margin),
    );
    let resolutions = Resolutions::open(&cfg.state_dir)
        .map_err(|e| io("opening resolved.log".into())(e.to_string()))?;
    let built = rebuild(cfg, progress, stop, blobs, 0)?;

    // Durability order: blobs (published while staging) → what each
    // listed file resolved to → the journal record.
    built.record_contents(&resolutions)?;
    let event = built.event;
    let y = event.id;
    let entry = JournalEntry {
        next: Position::Hive {
            hive_event_id: y.0 as i64,
        },
        event,
    };
    let payload = serde_json::to_vec(&entry)
        .map_err(|e| io("encoding the bootstrap record".into())(e.to_string()))?;
    journal
        .append(y, &payload)
        .and_then(|()| journal.sync())
        .map_err(|e| io("writing the bootstrap record".into())(e.to_string()))?;
    let report = finished(&cfg.state_dir, progress, y);
    info!(
        state_id = %y,
        changes = entry.event.changes.len(),
        record_bytes = payload.len(),
        files_copied = report.files_copied,
        files_reused = report.files_reused,
        seconds = report.elapsed_seconds,
        "bootstrap complete"
    );
    Ok(Outcome::Bootstrapped(y))
}

/// The gap `(from, to)` right after event `after` in the metastore of
/// `hive`, if its notification log lacks the next events (purged before a
/// replica read them); None when the next event is there or none is yet.
pub fn gap_after(hive: &HiveConfig, after: StateId) -> Result<Option<(i64, i64)>, BootstrapError> {
    let mut source = HiveSource::open(hive, after.0 as i64)
        .map_err(|e| BootstrapError::Failed(format!("opening the metastore: {e}")))?;
    match source.poll(1) {
        Ok(_) => Ok(None),
        Err(SourceError::Fatal(r)) => match source.gap() {
            Some(gap) => Ok(Some(gap)),
            None => Err(BootstrapError::Failed(format!(
                "reading the metastore: {r}"
            ))),
        },
        Err(SourceError::Transient(e)) => Err(BootstrapError::Failed(format!(
            "reading the metastore: {e}"
        ))),
    }
}

/// Marks `progress` done at `y` and records the report; returns it.
pub fn finished(state_dir: &Path, progress: &BootstrapProgress, y: StateId) -> BootstrapReport {
    progress.done(y.0 as i64);
    let report = progress.report();
    write_report(state_dir, &report);
    report
}

/// A bootstrapped warehouse, staged, not journaled yet.
pub struct Built {
    /// The changes that build the warehouse from empty, at its id.
    pub event: crate::event::Event,
    /// Reference key of every listed file → its content.
    contents: HashMap<BlobId, (BlobId, u64)>,
}

impl Built {
    /// Records (durably) what each listed file resolved to: before the
    /// journal record, so replaying it finds every file's content.
    pub fn record_contents(&self, resolutions: &Resolutions) -> Result<(), BootstrapError> {
        for f in self.event.files() {
            let Some(key) = f.key else { continue };
            if let Some(&(blob, size)) = self.contents.get(&key) {
                resolutions
                    .resolve(key, blob, size, true)
                    .map_err(|e| BootstrapError::Failed(format!("{}: {e}", f.source_label())))?;
            }
        }
        resolutions
            .flush()
            .map_err(|e| BootstrapError::Failed(format!("recording resolved files: {e}")))
    }
}

/// Steps 1-3 of the module docs: snapshot, listing and staging, exactness
/// rounds. The first snapshot must be above event `after` (the id a
/// replica already holds; 0 for an empty folder): below it the run waits,
/// saying so, since a state folder's id never goes back. A failure is
/// recorded in `progress` and `report.json`. Nothing is journaled here.
pub fn rebuild(
    cfg: &BootstrapConfig,
    progress: &BootstrapProgress,
    stop: &(dyn Fn() -> bool + Sync),
    blobs: Arc<BlobStore>,
    after: i64,
) -> Result<Built, BootstrapError> {
    let HiveRows::Metastore(url) = &cfg.hive.rows else {
        return Err(BootstrapError::Usage(
            "--bootstrap reads the metastore's tables: give --hive-metastore URL".into(),
        ));
    };
    std::fs::create_dir_all(cfg.state_dir.join(DIR)).map_err(|e| {
        BootstrapError::Failed(format!(
            "creating {}: {e}",
            cfg.state_dir.join(DIR).display()
        ))
    })?;
    let stager = FileStager::open(&cfg.state_dir.join(DIR), blobs, cfg.copy_threads)
        .map_err(BootstrapError::Failed)?;
    let done = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        let reporter = scope.spawn(|| {
            let mut last = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if last.elapsed() >= cfg.report_every {
                    progress.log_line();
                    last = Instant::now();
                }
            }
        });
        let mut driver = Driver {
            cfg,
            url,
            progress,
            stager: &stager,
            stop,
            after,
            contents: HashMap::new(),
        };
        let result = driver.build().map(|event| Built {
            event,
            contents: driver.contents,
        });
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = reporter.join();
        result
    });
    match result {
        Ok(built) => {
            progress.set_phase("committing");
            Ok(built)
        }
        Err(e) => {
            let unlisted = match &e {
                BootstrapError::Unlisted(t) => t.clone(),
                _ => Vec::new(),
            };
            progress.failed(e.to_string(), unlisted);
            write_report(&cfg.state_dir, &progress.report());
            Err(e)
        }
    }
}

/// One run's working state.
struct Driver<'a> {
    cfg: &'a BootstrapConfig,
    url: &'a str,
    progress: &'a BootstrapProgress,
    stager: &'a FileStager,
    stop: &'a (dyn Fn() -> bool + Sync),
    /// The id the replica already holds: the first snapshot must be above.
    after: i64,
    /// Reference key of every listed file → its content.
    contents: HashMap<BlobId, (BlobId, u64)>,
}

/// Notification rows read but not merged yet.
struct Events {
    source: HiveSource,
    rows: VecDeque<NotificationRow>,
    last_read: i64,
}

impl Driver<'_> {
    fn check_stop(&self) -> Result<(), BootstrapError> {
        if (self.stop)() {
            Err(BootstrapError::Stopped)
        } else {
            Ok(())
        }
    }

    /// One metastore snapshot, retried while the metastore is unavailable.
    fn snapshot(&self) -> Result<Snapshot, BootstrapError> {
        let mut attempt = 0u32;
        loop {
            self.check_stop()?;
            match snapshot::read(self.url, &self.cfg.hive.catalog) {
                Ok(s) => return Ok(s),
                Err(SnapshotError::Fatal(e)) => {
                    return Err(BootstrapError::Failed(format!(
                        "reading the metastore: {e}"
                    )))
                }
                Err(SnapshotError::Unavailable(e)) => {
                    warn!(error = %e, "cannot read the metastore snapshot; retrying");
                    std::thread::sleep(crate::stage::backoff(attempt));
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    fn build(&mut self) -> Result<crate::event::Event, BootstrapError> {
        let mut plan = Plan::new();
        let mut snap = self.snapshot()?;
        let mut said = false;
        while self.after > 0 && snap.event_id <= self.after {
            // The ratchet: the new state's id must be above every id the
            // replica has shown; a metastore behind it (restored from a
            // backup, say) is waited for, never followed back.
            if !said {
                warn!(
                    metastore = snap.event_id,
                    replica = self.after,
                    "bootstrap: the metastore's current event id is not above the replica's; \
                     waiting for it to pass (a state folder's id never goes back)"
                );
                said = true;
            }
            self.progress.set_phase("waiting");
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                self.check_stop()?;
                std::thread::sleep(Duration::from_millis(50));
            }
            snap = self.snapshot()?;
        }
        if snap.event_id < 1 {
            return Err(BootstrapError::Failed(
                "the metastore's notification log has no event yet (NEXT_EVENT_ID is 1): \
                 a bootstrap state needs an event id; is DbNotificationListener configured?"
                    .into(),
            ));
        }
        info!(
            snapshot = snap.event_id,
            databases = snap.databases.len(),
            tables = snap.tables.len(),
            partitions = snap.partition_count(),
            "bootstrap: metastore snapshot read"
        );
        let mut events = Events {
            source: HiveSource::open(&self.cfg.hive, snap.event_id)
                .map_err(|e| BootstrapError::Failed(format!("opening the metastore: {e}")))?,
            rows: VecDeque::new(),
            last_read: snap.event_id,
        };
        let mut databases = Vec::new();
        for db in &snap.databases {
            databases.push(name(db, "database").map_err(BootstrapError::Failed)?);
        }
        let all: Vec<&TableMeta> = snap.tables.iter().collect();
        let (bases, listed) = self.list_round(0, &snap, &all)?;
        let through = self.settle_and_catch_up(&mut events, listed)?;
        plan.seed(snap.event_id, &databases, bases, through)
            .map_err(|e| BootstrapError::Failed(e.to_string()))?;
        self.merge_through(&mut plan, &mut events, through)?;

        let mut round = 1;
        while !plan.tainted().is_empty() && round < self.cfg.max_rounds {
            self.check_stop()?;
            let snap = self.snapshot()?;
            if snap.event_id < plan.at() {
                return Err(BootstrapError::Failed(format!(
                    "the metastore snapshot went back from id {} to {}",
                    plan.at(),
                    snap.event_id
                )));
            }
            self.read_through(&mut events, snap.event_id)?;
            self.merge_through(&mut plan, &mut events, snap.event_id)?;
            let wanted: Vec<&TableMeta> = snap
                .tables
                .iter()
                .filter(|t| table_name(t).is_ok_and(|n| plan.tainted().contains_key(&n)))
                .collect();
            info!(
                round,
                snapshot = snap.event_id,
                tables = wanted.len(),
                "bootstrap: listing tables again that changed while they were listed"
            );
            let (bases, listed) = self.list_round(round, &snap, &wanted)?;
            let through = self.settle_and_catch_up(&mut events, listed)?;
            plan.rebase(round, snap.event_id, bases, through)
                .map_err(|e| BootstrapError::Failed(e.to_string()))?;
            self.merge_through(&mut plan, &mut events, through)?;
            round += 1;
        }
        plan.finish().map_err(|tainted| {
            BootstrapError::Unlisted(
                tainted
                    .into_iter()
                    .map(|((db, t), reason)| UnlistedTable {
                        table: format!("{db}.{t}"),
                        reason,
                    })
                    .collect(),
            )
        })
    }

    /// Lists and stages `tables` of `snap`, in chunks. Returns the bases
    /// and when the round's last listing ended (the staging of the last
    /// chunk comes after it). A lister thread lists one chunk ahead, so
    /// chunk N+1 is listed while chunk N is staged; the chunks are staged
    /// and turned into bases in order.
    fn list_round(
        &mut self,
        round: u32,
        snap: &Snapshot,
        tables: &[&TableMeta],
    ) -> Result<(Vec<TableBase>, Instant), BootstrapError> {
        self.progress.set_phase("listing");
        let partitions = tables.iter().map(|t| t.partitions.len() as u64).sum();
        self.progress
            .start_round(round, snap.event_id, tables.len() as u64, partitions);
        let limits = (
            self.cfg.tables_per_chunk.max(1),
            self.cfg.files_per_chunk.max(1),
        );
        let (map, stop) = ((&self.cfg.hive.source_map, &self.cfg.remotes), self.stop);
        std::thread::scope(|scope| {
            // Room for one listed chunk: the lister is at most one ahead.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Chunk, BootstrapError>>(1);
            scope.spawn(move || {
                let mut rest = tables;
                while !rest.is_empty() {
                    let chunk = if stop() {
                        Err(BootstrapError::Stopped)
                    } else {
                        list_chunk(&mut rest, map, limits)
                    };
                    let failed = chunk.is_err();
                    // A closed channel: the driver returned (an error).
                    if tx.send(chunk).is_err() || failed {
                        return;
                    }
                }
            });
            let mut bases = Vec::with_capacity(tables.len());
            let mut listed_at = Instant::now();
            for chunk in rx {
                let chunk = chunk?;
                self.check_stop()?;
                listed_at = chunk.listed_at;
                let staged = self.stager.stage(&chunk.files, self.progress);
                for (t, found, first) in chunk.tables {
                    bases.push(self.base(snap.event_id, t, found, &staged[first..])?);
                    self.progress.table_listed();
                }
            }
            Ok((bases, listed_at))
        })
    }

    /// A table's listing turned into catalog changes' material.
    fn base(
        &mut self,
        snapshot_id: i64,
        t: &TableMeta,
        found: Result<Vec<LocationFiles>, String>,
        staged: &[Staged],
    ) -> Result<TableBase, BootstrapError> {
        let (db, table) = table_name(t).map_err(BootstrapError::Failed)?;
        let mut keys = Vec::with_capacity(t.partition_keys.len());
        for k in &t.partition_keys {
            keys.push(name(k, "partition key").map_err(BootstrapError::Failed)?);
        }
        let mut untrusted = None;
        let mut partitions = Vec::new();
        let mut i = 0;
        match found {
            Err(reason) => {
                untrusted = Some(reason);
                for p in &t.partitions {
                    match partition_spec(&keys, &p.values) {
                        Ok(spec) => partitions.push(PartitionFiles {
                            spec: Some(spec),
                            files: Vec::new(),
                        }),
                        Err(e) => return Err(BootstrapError::Failed(format!("{db}.{table}: {e}"))),
                    }
                }
            }
            Ok(locations) => {
                for loc in locations {
                    let mut files = Vec::with_capacity(loc.files.len());
                    for (uri, f) in &loc.files {
                        let result = staged.get(i).cloned();
                        i += 1;
                        match result {
                            Some(Staged::Stored { blob, size }) => {
                                let file = file_ref(snapshot_id, uri, f).map_err(|e| {
                                    BootstrapError::Failed(format!("{db}.{table}: {e}"))
                                })?;
                                if let Some(key) = file.key {
                                    self.contents.insert(key, (blob, size));
                                }
                                files.push(file);
                            }
                            Some(Staged::Changed(reason)) => {
                                untrusted.get_or_insert(reason);
                            }
                            None => {
                                untrusted.get_or_insert("a listed file was not staged".into());
                            }
                        }
                    }
                    partitions.push(PartitionFiles {
                        spec: loc.spec,
                        files,
                    });
                }
            }
        }
        Ok(TableBase {
            name: (db, table),
            partition_keys: keys,
            partitions,
            untrusted,
        })
    }

    /// Waits until the settle time has passed since the round's last
    /// listing ended (`listed_at`), then reads every event there is;
    /// returns the last id read (the end of the round's watch windows).
    /// What the wait is for (a write's event committing after its files
    /// landed) only needs it to follow the listing, not the copies, so the
    /// staging of the last chunk counts towards it.
    fn settle_and_catch_up(
        &self,
        events: &mut Events,
        listed_at: Instant,
    ) -> Result<i64, BootstrapError> {
        self.progress.set_phase("events");
        let until = listed_at + self.cfg.settle;
        while Instant::now() < until {
            self.check_stop()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        loop {
            let before = events.last_read;
            self.poll(events)?;
            if events.last_read == before {
                return Ok(events.last_read);
            }
        }
    }

    /// Reads until event `id` is read.
    fn read_through(&self, events: &mut Events, id: i64) -> Result<(), BootstrapError> {
        while events.last_read < id {
            self.poll(events)?;
            if events.last_read < id {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    fn poll(&self, events: &mut Events) -> Result<(), BootstrapError> {
        let mut attempt = 0u32;
        loop {
            self.check_stop()?;
            match events.source.poll(self.cfg.hive.batch) {
                Ok(rows) => {
                    if let Some(last) = rows.last() {
                        events.last_read = last.event_id;
                    }
                    events.rows.extend(rows);
                    return Ok(());
                }
                Err(SourceError::Transient(e)) => {
                    warn!(error = %e, "cannot read the notification log; retrying");
                    std::thread::sleep(crate::stage::backoff(attempt));
                    attempt = attempt.saturating_add(1);
                }
                Err(SourceError::Fatal(r)) => {
                    return Err(BootstrapError::Failed(format!(
                        "reading the events after the snapshot: {r}"
                    )))
                }
            }
        }
    }

    /// Merges the rows read with ids up to `id` into the plan.
    fn merge_through(
        &self,
        plan: &mut Plan,
        events: &mut Events,
        id: i64,
    ) -> Result<(), BootstrapError> {
        let mut attempt = 0u32;
        while let Some(row) = events.rows.front() {
            if row.event_id > id {
                break;
            }
            if row.event_id <= plan.at() {
                events.rows.pop_front();
                continue;
            }
            let event = match events.source.decode(row, plan.tree()) {
                Ok(e) => e,
                Err(DecodeError::Retry(e)) => {
                    self.check_stop()?;
                    warn!(error = %e, "cannot decode an event yet; retrying");
                    std::thread::sleep(crate::stage::backoff(attempt));
                    attempt = attempt.saturating_add(1);
                    continue;
                }
                Err(DecodeError::Rejected(r)) => {
                    return Err(BootstrapError::Failed(format!(
                        "an event after the snapshot cannot be replicated: {r}"
                    )))
                }
            };
            plan.apply_event(&event)
                .map_err(|e| BootstrapError::Failed(e.to_string()))?;
            self.progress.event_applied();
            events.rows.pop_front();
        }
        Ok(())
    }
}

/// Tables listed together, with every file of theirs in one list.
struct Chunk<'t> {
    /// Each table, its listing, and where its files start in `files`.
    tables: Vec<TableListing<'t>>,
    files: Vec<ListedFile>,
    /// When the chunk's listing ended.
    listed_at: Instant,
}

type TableListing<'t> = (&'t TableMeta, Result<Vec<LocationFiles>, String>, usize);

/// Lists the next tables of `rest` (taking them off it) until the chunk
/// holds `tables_per_chunk` tables or `files_per_chunk` files.
fn list_chunk<'t>(
    rest: &mut &[&'t TableMeta],
    map: (
        &crate::source::hive::map::SourceMap,
        &crate::source_file::Remotes,
    ),
    (tables_per_chunk, files_per_chunk): (usize, usize),
) -> Result<Chunk<'t>, BootstrapError> {
    let mut tables = Vec::new();
    let mut files: Vec<ListedFile> = Vec::new();
    while let Some((t, more)) = rest.split_first() {
        if tables.len() >= tables_per_chunk || files.len() >= files_per_chunk {
            break;
        }
        *rest = more;
        let found = list_table(t, map)?;
        let first = files.len();
        if let Ok(locations) = &found {
            for loc in locations {
                files.extend(loc.files.iter().map(|(_, f)| f.clone()));
            }
        }
        tables.push((*t, found, first));
    }
    Ok(Chunk {
        tables,
        files,
        listed_at: Instant::now(),
    })
}

/// One listed location: its partition (None: unpartitioned) and files
/// with their source URIs.
struct LocationFiles {
    spec: Option<std::collections::BTreeMap<String, String>>,
    files: Vec<(String, ListedFile)>,
}

fn table_name(t: &TableMeta) -> Result<TableName, String> {
    Ok((name(&t.db, "database")?, name(&t.name, "table")?))
}

/// `key → raw value` (empty values become Hive's default partition).
fn partition_spec(
    keys: &[String],
    values: &[String],
) -> Result<std::collections::BTreeMap<String, String>, String> {
    if keys.len() != values.len() {
        return Err(format!(
            "partition ({}) does not match the partition keys ({})",
            values.join(", "),
            keys.join(", ")
        ));
    }
    let mut spec = std::collections::BTreeMap::new();
    for (k, v) in keys.iter().zip(values) {
        let v = if v.is_empty() { DEFAULT_PARTITION } else { v };
        if v.contains('\0') || v.len() > 1024 {
            return Err(format!(
                "partition value of `{k}` must be at most 1024 bytes without NUL"
            ));
        }
        spec.insert(k.clone(), v.to_owned());
    }
    Ok(spec)
}

/// Lists every location of `t`: beneath the directory a `--source-map`
/// gives it, else where it is (HDFS, S3). `Err` (inside `Ok`) when the
/// table cannot be listed now (an unmapped location, an unreadable
/// directory, an unreachable server): the table is then untrusted. Views
/// have no data.
fn list_table(
    t: &TableMeta,
    (map, remotes): (
        &crate::source::hive::map::SourceMap,
        &crate::source_file::Remotes,
    ),
) -> Result<Result<Vec<LocationFiles>, String>, BootstrapError> {
    let (db, table) = table_name(t).map_err(BootstrapError::Failed)?;
    let mut keys = Vec::new();
    for k in &t.partition_keys {
        keys.push(name(k, "partition key").map_err(BootstrapError::Failed)?);
    }
    if t.table_type.as_deref() == Some("VIRTUAL_VIEW") {
        return Ok(Ok(if keys.is_empty() {
            vec![LocationFiles {
                spec: None,
                files: Vec::new(),
            }]
        } else {
            Vec::new()
        }));
    }
    let list = |uri: &str| -> Result<Vec<(String, ListedFile)>, String> {
        let files = match map.place(uri)? {
            Place::Mapped(mapped, below) => {
                let dir = mapped.join(below);
                let mut files = list_location(mapped, &dir)?;
                if t.is_transactional() {
                    files = acid::choose_listed(&dir, files, t.acid.as_ref())
                        .map_err(|e| format!("transactional table, {uri}: {e}"))?;
                }
                files
            }
            // Which base_/delta_ directories are valid is read from their
            // `_metadata_acid` files, which only a local listing reads.
            Place::Remote(_) if t.is_transactional() => {
                return Err(format!(
                    "transactional table at {uri}: bootstrapped only through --source-map"
                ))
            }
            Place::Remote(location) => list_remote(&location, uri, remotes)?,
        };
        let base = uri.trim_end_matches('/');
        Ok(files
            .into_iter()
            .map(|f| (format!("{base}/{}", f.rel), f))
            .collect())
    };
    let mut out = Vec::new();
    if keys.is_empty() {
        let Some(uri) = &t.location else {
            return Ok(Err(format!("{db}.{table} has no location")));
        };
        match list(uri) {
            Ok(files) => out.push(LocationFiles { spec: None, files }),
            Err(e) => return Ok(Err(e)),
        }
        return Ok(Ok(out));
    }
    for p in &t.partitions {
        let spec = partition_spec(&keys, &p.values)
            .map_err(|e| BootstrapError::Failed(format!("{db}.{table}: {e}")))?;
        let uri = match (&p.location, &t.location) {
            (Some(l), _) => l.clone(),
            (None, Some(tl)) => format!("{}/{}", tl.trim_end_matches('/'), p.name),
            (None, None) => {
                return Ok(Err(format!(
                    "{db}.{table} partition {} has no location",
                    p.name
                )))
            }
        };
        match list(&uri) {
            Ok(files) => out.push(LocationFiles {
                spec: Some(spec),
                files,
            }),
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(out))
}

/// The reference of a listed, staged file: unverified (no checksum is
/// known for a listed file), keyed by the snapshot and its path.
fn file_ref(snapshot_id: i64, uri: &str, f: &ListedFile) -> Result<FileRef, String> {
    let (subdir, file_name) = f.split();
    if !is_valid_file_name(file_name) {
        return Err(format!("file name `{file_name}` of {uri} cannot be shown"));
    }
    if let Some(s) = subdir {
        if !is_valid_source_path(s) {
            return Err(format!("subdirectory `{s}` of {uri} cannot be shown"));
        }
    }
    let mut h = Sha256::new();
    h.update(b"stagefs bootstrap file\0");
    h.update(snapshot_id.to_le_bytes());
    h.update(f.path.as_os_str().as_encoded_bytes());
    Ok(FileRef {
        path: f.path.to_string_lossy().into_owned(),
        name: file_name.to_owned(),
        subdir: subdir.map(str::to_owned),
        verify: Verify::None,
        key: Some(BlobId(h.finalize().into())),
        cm_path: None,
        uri: Some(uri.to_owned()),
        source_dir: f
            .source_dir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned()),
        cm_dir: None,
    })
}
