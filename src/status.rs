//! Status: what replication is doing, as the JSON of SPEC §7.
//!
//! [`Progress`] is the shared board the pipeline threads write to (atomics
//! and two small mutexes, never held across I/O); [`StatusReport`] is the
//! rendered, serialisable picture served by `.stagefs/status` and
//! `stagefs status`.
//!
//! Status owns the report types of every part it shows, and the parts fill
//! them: a source its [`SourceReport`] (`Source::report`), the bootstrap
//! its [`BootstrapReport`], the view its [`ReadersReport`]. So this module
//! imports no reporting module, and each of them imports it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::catalog::tree::UNKNOWN_TIME;
use crate::catalog::Snapshot;
use crate::event::StateId;
use crate::latency::LatencyHistogram;

/// Why replication cannot progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stall {
    /// The event that cannot be made visible (for a rejected line: its id,
    /// or null when the id could not be read).
    pub state_id: Option<StateId>,
    pub reason: String,
    /// Source log file and line, for a rejected event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
}

/// A table whose data the source's log does not carry (docs/HIVE.md
/// "What is not replicated"): the mount shows only what events name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotInLog {
    /// `db.table`
    pub table: String,
    pub reason: String,
}

/// What status shows about the source (SPEC §7 `source`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceReport {
    /// `native` or `hive`.
    pub kind: String,
    /// The events folder, the `--hive-events` path, or the metastore URL
    /// without its password.
    pub location: String,
    /// Hive: the last `EVENT_ID` read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    /// The newest id the source reports (the metastore's `NEXT_EVENT_ID - 1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest: Option<i64>,
    /// Why the source cannot be read right now (retrying), or null.
    #[serde(default)]
    pub error: Option<String>,
}

/// A table that could not be bootstrapped, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnlistedTable {
    /// `db.table`.
    pub table: String,
    pub reason: String,
}

/// The status JSON's `bootstrap` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BootstrapReport {
    /// `snapshot`, `waiting` (a re-bootstrap whose metastore is not above
    /// the replica's id yet), `listing`, `events`, `committing`, `done`,
    /// `failed`.
    pub phase: String,
    pub round: u32,
    /// The id of the newest metadata snapshot.
    pub snapshot_id: i64,
    /// The id the bootstrap state is at (once done).
    pub state_id: Option<i64>,
    pub tables_total: u64,
    pub tables_listed: u64,
    pub partitions: u64,
    pub files_copied: u64,
    pub bytes_copied: u64,
    /// Files already staged by an earlier (killed) run: not copied again.
    pub files_reused: u64,
    pub bytes_reused: u64,
    pub events_applied: u64,
    pub elapsed_seconds: f64,
    pub bytes_per_second: f64,
    /// Seconds until every table of this round is listed, when known.
    pub eta_seconds: Option<f64>,
    /// Tables listed again because they changed while listed.
    pub relisted: u64,
    /// Tables that could not be listed consistently (bootstrap failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unlisted: Vec<UnlistedTable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Counters and states written by the pipeline.
#[derive(Debug)]
pub struct Progress {
    pub latest: AtomicU64,
    pub latest_time_ms: AtomicI64,
    /// Source time of the oldest event not yet visible, or UNKNOWN_TIME.
    pub oldest_pending_time_ms: AtomicI64,
    pub events_accepted: AtomicU64,
    pub events_duplicate: AtomicU64,
    /// Source events rejected (each stops ingest until restart).
    pub events_rejected: AtomicU64,
    pub files_fetched: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub fetches_from_cm: AtomicU64,
    pub fetch_failures: AtomicU64,
    /// `fetch_failures` by [`crate::stage::StageError::kind_label`].
    fetch_failures_by_reason: Mutex<BTreeMap<&'static str, u64>>,
    pub in_flight: AtomicU64,
    pub commits: AtomicU64,
    /// How long each commit took (for `--metrics`).
    pub commit_duration: LatencyHistogram,
    pub gc_runs: AtomicU64,
    pub gc_removed: AtomicU64,
    pub gc_freed_bytes: AtomicU64,
    /// A rejected source line: replication stops reading the log.
    pub ingest_stall: Mutex<Option<Stall>>,
    /// A state that cannot complete (missing file, disk full, ...).
    pub stage_stall: Mutex<Option<Stall>>,
    /// Files staged without a checksum to verify them with (Hive).
    pub unverified_files: AtomicU64,
    /// The source, as its ingest thread last reported it.
    pub source: Mutex<SourceReport>,
    /// The bootstrap that built this state folder's first state, if any.
    pub bootstrap: Mutex<Option<BootstrapReport>>,
    /// Replication stopped for good (a pipeline thread panicked): shown
    /// before any other stall, never cleared until restart.
    pub failure: Mutex<Option<Stall>>,
    /// Checkpoints: the newest one, what the start restored, problems.
    pub checkpoint: Mutex<CheckpointReport>,
    /// When the newest checkpoint was written (Unix epoch ms), for its age.
    pub checkpoint_written_ms: AtomicI64,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            latest: AtomicU64::new(0),
            latest_time_ms: AtomicI64::new(UNKNOWN_TIME),
            oldest_pending_time_ms: AtomicI64::new(UNKNOWN_TIME),
            events_accepted: AtomicU64::new(0),
            events_duplicate: AtomicU64::new(0),
            events_rejected: AtomicU64::new(0),
            files_fetched: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            fetches_from_cm: AtomicU64::new(0),
            fetch_failures: AtomicU64::new(0),
            fetch_failures_by_reason: Mutex::new(BTreeMap::new()),
            in_flight: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            commit_duration: LatencyHistogram::for_commits(),
            gc_runs: AtomicU64::new(0),
            gc_removed: AtomicU64::new(0),
            gc_freed_bytes: AtomicU64::new(0),
            ingest_stall: Mutex::new(None),
            stage_stall: Mutex::new(None),
            unverified_files: AtomicU64::new(0),
            source: Mutex::new(SourceReport::default()),
            bootstrap: Mutex::new(None),
            failure: Mutex::new(None),
            checkpoint: Mutex::new(CheckpointReport::default()),
            checkpoint_written_ms: AtomicI64::new(UNKNOWN_TIME),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Progress {
    pub fn set_ingest_stall(&self, stall: Option<Stall>) {
        *lock(&self.ingest_stall) = stall;
    }

    pub fn set_stage_stall(&self, stall: Option<Stall>) {
        *lock(&self.stage_stall) = stall;
    }

    /// One failed fetch attempt, `reason` a short fixed label.
    pub fn count_fetch_failure(&self, reason: &'static str) {
        self.fetch_failures.fetch_add(1, Ordering::Relaxed);
        *lock(&self.fetch_failures_by_reason)
            .entry(reason)
            .or_insert(0) += 1;
    }

    pub fn fetch_failures_by_reason(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.fetch_failures_by_reason).clone()
    }

    pub fn set_source(&self, report: SourceReport) {
        *lock(&self.source) = report;
    }

    /// The newest accepted state-id; never below `visible` (after a
    /// restart ingest has not reported yet, but the journal held at least
    /// the visible state).
    pub fn latest(&self, visible: StateId) -> StateId {
        StateId(self.latest.load(Ordering::Relaxed).max(visible.0))
    }

    /// Records why replication stopped for good; the first reason stays.
    pub fn set_failure(&self, stall: Stall) {
        lock(&self.failure).get_or_insert(stall);
    }

    /// The checkpoint report with its age as of now.
    pub fn checkpoint(&self) -> CheckpointReport {
        let mut c = lock(&self.checkpoint).clone();
        let written = self.checkpoint_written_ms.load(Ordering::Relaxed);
        c.age_seconds = (written != UNKNOWN_TIME && c.last_id.is_some())
            .then(|| ((now_ms() - written).max(0)) as f64 / 1000.0);
        c
    }

    pub fn set_checkpoint(&self, f: impl FnOnce(&mut CheckpointReport)) {
        f(&mut lock(&self.checkpoint));
    }

    /// The stall to report while `visible` is shown. A stager stall names
    /// the first state still waiting for a file; once that state is visible
    /// (a commit ran but the stager has not re-checked yet) it is over.
    pub fn stalled(&self, visible: StateId) -> Option<Stall> {
        lock(&self.failure)
            .clone()
            .or_else(|| lock(&self.ingest_stall).clone())
            .or_else(|| {
                lock(&self.stage_stall)
                    .clone()
                    .filter(|s| s.state_id.is_none_or(|id| id > visible))
            })
    }
}

/// Journal counters shown in status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalReport {
    pub records: u64,
    pub ring_reads: u64,
    pub file_reads: u64,
    /// Segment files on disk (compaction removes old ones).
    #[serde(default)]
    pub segments: u64,
    /// Durable bytes in them.
    #[serde(default)]
    pub bytes: u64,
}

/// Checkpoints (docs/OPERATIONS.md "Checkpoints") shown in status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReport {
    /// State-id of the newest checkpoint (written by this run or loaded at
    /// start); null when there is none.
    pub last_id: Option<StateId>,
    /// Seconds since it was written; null when there is none.
    pub age_seconds: Option<f64>,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Checkpoints written by this run.
    pub written: u64,
    /// The checkpoint the start restored from (null: replayed the whole
    /// journal) and the journal records it replayed after it.
    pub restored_from: Option<StateId>,
    pub replayed_records: u64,
    /// Checkpoints the start could not use and why, and the last failed
    /// write (cleared by the next good one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Staging counters shown in status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagingReport {
    pub files_fetched: u64,
    pub bytes_fetched: u64,
    pub from_change_management: u64,
    pub failures: u64,
    pub in_flight: u64,
}

/// Garbage-collection counters shown in status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    pub runs: u64,
    pub removed_blobs: u64,
    pub freed_bytes: u64,
}

/// The JSON object of SPEC §7 (plus pipeline counters).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub visible: StateId,
    pub latest: StateId,
    pub lag_events: u64,
    pub lag_seconds: Option<f64>,
    pub pins: BTreeMap<String, StateId>,
    pub retained: Vec<StateId>,
    pub staged_bytes: u64,
    pub stalled: Option<Stall>,
    /// What replication follows and where it is in it.
    #[serde(default)]
    pub source: SourceReport,
    /// Files whose source gave no checksum: staged as read (`verified` = `none`).
    #[serde(default)]
    pub unverified_files: u64,
    /// Tables of the visible state whose data is not in the source's log
    /// (Hive external tables).
    #[serde(default)]
    pub not_in_log: Vec<NotInLog>,
    /// False when rendered from the state folder with no daemon running.
    pub running: bool,
    pub events_accepted: u64,
    pub events_duplicate: u64,
    pub commits: u64,
    pub journal: JournalReport,
    #[serde(default)]
    pub checkpoint: CheckpointReport,
    pub staging: StagingReport,
    pub gc: GcReport,
    /// Readers' views (SPEC §3.8); filled in by the mount's view layer,
    /// absent when rendered without a mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readers: Option<ReadersReport>,
    /// `stagefs run` sessions in force.
    #[serde(default)]
    pub sessions: Vec<SessionReport>,
    /// Bootstrap progress while one runs, then its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapReport>,
    /// `--publish URL`: what is published there (SPEC §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish: Option<PublishStatus>,
}

/// A publishing daemon's `publish` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishStatus {
    pub url: String,
    /// The state the head at the URL names, once known.
    pub published: Option<StateId>,
    /// When that head was written (ms since the epoch), and how long ago.
    pub published_ms: Option<i64>,
    pub age_ms: Option<i64>,
    /// States published by this process (heads written).
    pub states: u64,
    pub objects_written: u64,
    pub bytes_written: u64,
    /// Failed attempts, in all and by reason.
    pub failures: u64,
    pub failures_by_reason: BTreeMap<String, u64>,
    /// Why the last attempt failed (null once one succeeds).
    pub error: Option<String>,
    /// Publishing stopped for good (`error` says why).
    pub stopped: bool,
    /// Leases at the URL not expired, at the last collection.
    pub leases_live: u64,
    /// Published states kept by the last collection.
    pub kept: Vec<StateId>,
    pub gc_runs: u64,
    pub gc_objects_deleted: u64,
}

impl PublishStatus {
    pub fn of(r: &crate::publish::PublishReport) -> PublishStatus {
        PublishStatus {
            url: r.url.clone(),
            published: r.published,
            published_ms: r.published_ms,
            age_ms: r.published_ms.map(|ms| (now_ms() - ms).max(0)),
            states: r.states,
            objects_written: r.objects_written,
            bytes_written: r.bytes_written,
            failures: r.failures.values().sum(),
            failures_by_reason: r
                .failures
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            error: r.error.clone(),
            stopped: r.fatal,
            leases_live: r.gc.leases_live,
            kept: r.gc.kept.clone(),
            gc_runs: r.gc.runs,
            gc_objects_deleted: r.gc.objects_deleted,
        }
    }
}

/// Per-process views in use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadersReport {
    /// Live processes with a view (forgotten when the process exits or
    /// the view would move at any request, at most ~10 s after its last).
    pub views: usize,
    /// The oldest state a view shows.
    pub oldest_view: Option<StateId>,
    /// Requests no process could be named for (pid 0, another pid
    /// namespace): they see the newest visible state.
    pub unattributed_requests: u64,
    /// Times a view moved to a newer state.
    pub view_moves: u64,
    /// Requests after a wall-clock gap long enough to move the view that
    /// kept it, because the process spent the gap waiting for a CPU.
    #[serde(default)]
    pub starved_keeps: u64,
    /// Requests after a wall-clock gap long enough to move the view that
    /// kept it, because the process (or its parent) was computing: on a
    /// CPU or waiting for one (`starved_keeps` are among them).
    #[serde(default)]
    pub busy_keeps: u64,
    /// Moves the rule would have made that waited (one request each)
    /// until the process's working directory, inside a table, was moved
    /// off the table's live name to its snapshot path.
    #[serde(default)]
    pub cwd_keeps: u64,
    /// Table entries the mount asked the kernel to drop (old versions).
    pub dentry_invalidations: u64,
}

/// One `stagefs run` session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionReport {
    pub id: String,
    pub state: StateId,
    pub pid: u32,
    /// Start, Unix epoch milliseconds.
    pub since_ms: i64,
}

/// The sessions of `pins`, for status.
pub fn sessions_report(pins: &crate::catalog::Pins) -> Vec<SessionReport> {
    pins.sessions
        .iter()
        .map(|(id, h)| SessionReport {
            id: id.clone(),
            state: h.state,
            pid: h.pid,
            since_ms: h.since_ms,
        })
        .collect()
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl StatusReport {
    /// A report with nothing known yet.
    pub fn empty() -> StatusReport {
        StatusReport {
            visible: StateId(0),
            latest: StateId(0),
            lag_events: 0,
            lag_seconds: None,
            pins: BTreeMap::new(),
            retained: Vec::new(),
            staged_bytes: 0,
            stalled: None,
            source: SourceReport::default(),
            unverified_files: 0,
            not_in_log: Vec::new(),
            running: false,
            events_accepted: 0,
            events_duplicate: 0,
            commits: 0,
            journal: JournalReport::default(),
            checkpoint: CheckpointReport::default(),
            staging: StagingReport::default(),
            gc: GcReport::default(),
            readers: None,
            sessions: Vec::new(),
            bootstrap: None,
            publish: None,
        }
    }

    /// Renders the live picture.
    pub fn live(
        progress: &Progress,
        snapshot: &Snapshot,
        staged_bytes: u64,
        journal: JournalReport,
    ) -> StatusReport {
        let visible = snapshot.visible.state_id;
        let latest = progress.latest(visible);
        let source = lock(&progress.source).clone();
        // Events the source has that were not read yet count as lag too.
        let newest = source
            .newest
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0)
            .max(latest.0);
        let lag_events = newest - visible.0;
        let lag_seconds = if lag_events == 0 {
            Some(0.0)
        } else {
            let oldest = progress.oldest_pending_time_ms.load(Ordering::Relaxed);
            let oldest = if oldest == UNKNOWN_TIME {
                progress.latest_time_ms.load(Ordering::Relaxed)
            } else {
                oldest
            };
            (oldest != UNKNOWN_TIME).then(|| ((now_ms() - oldest).max(0)) as f64 / 1000.0)
        };
        StatusReport {
            visible,
            latest,
            lag_events,
            lag_seconds,
            pins: snapshot.pins.labelled(),
            retained: snapshot.versions.keys().copied().collect(),
            staged_bytes,
            stalled: progress.stalled(visible),
            source,
            unverified_files: progress.unverified_files.load(Ordering::Relaxed),
            not_in_log: snapshot
                .visible
                .not_in_log()
                .into_iter()
                .map(|(table, reason)| NotInLog { table, reason })
                .collect(),
            running: true,
            events_accepted: progress.events_accepted.load(Ordering::Relaxed),
            events_duplicate: progress.events_duplicate.load(Ordering::Relaxed),
            commits: progress.commits.load(Ordering::Relaxed),
            journal,
            checkpoint: progress.checkpoint(),
            staging: StagingReport {
                files_fetched: progress.files_fetched.load(Ordering::Relaxed),
                bytes_fetched: progress.bytes_fetched.load(Ordering::Relaxed),
                from_change_management: progress.fetches_from_cm.load(Ordering::Relaxed),
                failures: progress.fetch_failures.load(Ordering::Relaxed),
                in_flight: progress.in_flight.load(Ordering::Relaxed),
            },
            gc: GcReport {
                runs: progress.gc_runs.load(Ordering::Relaxed),
                removed_blobs: progress.gc_removed.load(Ordering::Relaxed),
                freed_bytes: progress.gc_freed_bytes.load(Ordering::Relaxed),
            },
            readers: None,
            sessions: sessions_report(&snapshot.pins),
            bootstrap: lock(&progress.bootstrap).clone(),
            publish: None,
        }
    }

    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stall(id: Option<u64>) -> Stall {
        Stall {
            state_id: id.map(StateId),
            reason: "waiting for db/t/f".into(),
            file: None,
            line: None,
        }
    }

    #[test]
    fn a_stager_stall_on_a_state_already_visible_is_not_reported() {
        let p = Progress::default();
        p.set_stage_stall(Some(stall(Some(4))));
        assert_eq!(p.stalled(StateId(3)), Some(stall(Some(4))));
        assert_eq!(p.stalled(StateId(4)), None);
        assert_eq!(p.stalled(StateId(6)), None);
        // Without a state-id (the journal cannot be read) it always shows.
        p.set_stage_stall(Some(stall(None)));
        assert_eq!(p.stalled(StateId(6)), Some(stall(None)));
        // An ingest stall is about the source, not a pending state.
        p.set_stage_stall(None);
        p.set_ingest_stall(Some(stall(Some(2))));
        assert_eq!(p.stalled(StateId(6)), Some(stall(Some(2))));
    }
}
