//! Bootstrap again after an id gap (`--bootstrap` on a replica whose
//! metastore purged events it had not read yet), while the mount keeps
//! serving (docs/HIVE.md "Bootstrap after an id gap").
//!
//! Owns the re-bootstrap's retry loop, its status (the ingest stall says
//! why replication waits; `bootstrap` shows the run's progress) and
//! `<state>/bootstrap/after_gap.json`, the marker that a re-bootstrap is
//! under way or journaled but not visible yet. While the marker stands,
//! garbage collection pauses ([`GcHold`]): the files the run stages are
//! referenced by no state until its record is committed, and must not be
//! deleted meanwhile (nor after a `kill -9`, before the run resumes).
//!
//! Invariants:
//! - Nothing changes what readers see until the record is journaled and
//!   then committed by the stager like any state: the old visible state,
//!   pins and sessions stay served throughout.
//! - The record's id is above every id the replica holds (the ratchet; see
//!   [`super::rebuild`]'s `after`), and the record is journaled by the
//!   ingest thread, the journal's only writer, which then follows the
//!   metastore from that id on: no event applied twice, none missed.
//!
//! Called by the ingest thread (`replicate.rs`) when the Hive source stops
//! at a gap and the replica runs with `--bootstrap`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::{rebuild, BootstrapConfig, BootstrapError, BootstrapProgress, Built};
use crate::event::StateId;
use crate::stage::BlobStore;
use crate::status::{Progress, Stall};

const MARKER: &str = "after_gap.json";

/// What `after_gap.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    /// The missing ids.
    gap: (i64, i64),
    /// The newest id the replica held when the gap was found.
    replica_at: u64,
    /// The re-bootstrap's id, once journaled.
    state_id: Option<u64>,
}

fn marker_path(state_dir: &Path) -> PathBuf {
    state_dir.join(super::DIR).join(MARKER)
}

fn read_marker(state_dir: &Path) -> Option<Marker> {
    let bytes = std::fs::read(marker_path(state_dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_marker(state_dir: &Path, m: &Marker) -> Result<(), String> {
    let path = marker_path(state_dir);
    let dir = state_dir.join(super::DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let bytes = serde_json::to_vec_pretty(m).map_err(|e| e.to_string())?;
    crate::durable::write_atomic(&path, &bytes)
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Pauses garbage collection while a re-bootstrap's files are referenced
/// by no committed state. Shared by the ingest thread and GC.
pub struct GcHold {
    state_dir: PathBuf,
    /// 0: no hold; `u64::MAX`: a run under way; else hold until this id is
    /// visible.
    until: AtomicU64,
}

impl GcHold {
    /// The hold `state_dir`'s marker asks for (after a restart).
    pub fn open(state_dir: &Path) -> GcHold {
        let until = match read_marker(state_dir) {
            Some(m) => m.state_id.unwrap_or(u64::MAX),
            None => 0,
        };
        GcHold {
            state_dir: state_dir.to_owned(),
            until: AtomicU64::new(until),
        }
    }

    /// Whether GC must skip its pass with `visible` committed; lifts the
    /// hold (and removes the marker) once the re-bootstrap is visible.
    pub fn holds(&self, visible: StateId) -> bool {
        let until = self.until.load(Ordering::SeqCst);
        if until == 0 {
            return false;
        }
        if until != u64::MAX && visible.0 >= until {
            let path = marker_path(&self.state_dir);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(error = %e, "cannot remove {}; GC stays paused", path.display());
                    return true;
                }
            }
            // Only if no new run started meanwhile.
            let _ = self
                .until
                .compare_exchange(until, 0, Ordering::SeqCst, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn set(&self, until: u64) {
        self.until.store(until, Ordering::SeqCst);
    }
}

/// The missing ids `from..=to` that stopped the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub from: i64,
    pub to: i64,
}

/// A replica's re-bootstrap (see the module docs).
pub struct AfterGap {
    pub cfg: BootstrapConfig,
    pub blobs: Arc<BlobStore>,
    pub hold: Arc<GcHold>,
}

/// Longest wait before a failed re-bootstrap is tried again.
const RETRY_CAP: Duration = Duration::from_secs(120);

impl AfterGap {
    /// Bootstraps again until a run completes and `journal` records it
    /// (returns its id), or `stop` is set (None). `at` is the newest id
    /// the replica holds: the new state is above it. `journal` gets the
    /// staged warehouse and writes its record (the ingest thread's job).
    pub fn run(
        &self,
        gap: Gap,
        at: StateId,
        status: &Progress,
        stop: &AtomicBool,
        journal: &mut dyn FnMut(Built) -> Result<StateId, String>,
    ) -> Option<StateId> {
        let state_dir = &self.cfg.state_dir;
        let what = format!(
            "events {}..{} are missing from the metastore",
            gap.from, gap.to
        );
        let mut marker = Marker {
            gap: (gap.from, gap.to),
            replica_at: at.0,
            state_id: None,
        };
        self.hold.set(u64::MAX);
        if let Err(e) = write_marker(state_dir, &marker) {
            // The hold in memory still protects this run's files.
            warn!(error = %e, "cannot record that a re-bootstrap is under way");
        }
        let mut attempt = 0u32;
        loop {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            set_stall(
                status,
                format!(
                    "{what}: bootstrapping again (--bootstrap); state {at} stays served until it completes"
                ),
            );
            info!(from = gap.from, to = gap.to, replica = %at, "events are missing: bootstrapping again while the visible state is served");
            let progress = BootstrapProgress::default();
            let running = AtomicBool::new(true);
            let stopping = || stop.load(Ordering::Relaxed);
            let result = std::thread::scope(|scope| {
                scope.spawn(|| {
                    while running.load(Ordering::Relaxed) {
                        publish(status, &progress);
                        std::thread::sleep(Duration::from_millis(200));
                    }
                });
                let result = rebuild(
                    &self.cfg,
                    &progress,
                    &stopping,
                    Arc::clone(&self.blobs),
                    at.0 as i64,
                );
                running.store(false, Ordering::Relaxed);
                result
            });
            let failure = match result {
                Ok(built) => match journal(built) {
                    Ok(y) => {
                        marker.state_id = Some(y.0);
                        // Durable before GC may lift the hold: a restart
                        // holds until `y` is visible.
                        if let Err(e) = write_marker(state_dir, &marker) {
                            warn!(error = %e, "cannot record the re-bootstrap's id");
                        }
                        self.hold.set(y.0);
                        let report = super::finished(state_dir, &progress, y);
                        publish(status, &progress);
                        set_stall(status, String::new());
                        info!(
                            state_id = %y,
                            files_copied = report.files_copied,
                            files_reused = report.files_reused,
                            seconds = report.elapsed_seconds,
                            "bootstrapped again after the gap; replication continues from here"
                        );
                        return Some(y);
                    }
                    Err(e) => {
                        progress.failed(format!("journaling the bootstrap state: {e}"), Vec::new());
                        format!("journaling the bootstrap state: {e}")
                    }
                },
                Err(BootstrapError::Stopped) => return None,
                Err(e) => e.to_string(),
            };
            publish(status, &progress);
            let wait = Duration::from_secs(10u64 << attempt.min(4)).min(RETRY_CAP);
            error!(error = %failure, retry_in_s = wait.as_secs(), "the re-bootstrap failed; trying again");
            set_stall(
                status,
                format!(
                    "{what}: the re-bootstrap failed ({failure}); trying again in {} s; state {at} stays served",
                    wait.as_secs()
                ),
            );
            let until = Instant::now() + wait;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            attempt = attempt.saturating_add(1);
        }
    }
}

/// The ingest stall shown while the re-bootstrap runs (empty: cleared).
fn set_stall(status: &Progress, reason: String) {
    status.set_ingest_stall((!reason.is_empty()).then_some(Stall {
        state_id: None,
        reason,
        file: None,
        line: None,
    }));
}

fn publish(status: &Progress, progress: &BootstrapProgress) {
    *status.bootstrap.lock().unwrap_or_else(|p| p.into_inner()) = Some(progress.report());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gc_hold_follows_the_marker_and_lifts_once_the_state_is_visible() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!GcHold::open(dir.path()).holds(StateId(1)));
        let mut m = Marker {
            gap: (5, 9),
            replica_at: 4,
            state_id: None,
        };
        write_marker(dir.path(), &m).unwrap();
        // A run under way (after a restart too): held whatever is visible.
        assert!(GcHold::open(dir.path()).holds(StateId(1_000)));
        m.state_id = Some(12);
        write_marker(dir.path(), &m).unwrap();
        let hold = GcHold::open(dir.path());
        assert!(hold.holds(StateId(4)));
        assert!(!hold.holds(StateId(12)));
        assert!(read_marker(dir.path()).is_none(), "marker removed");
        assert!(!GcHold::open(dir.path()).holds(StateId(4)));
    }
}
