//! The checkpoint thread: writes the retained and pinned trees of a catalog
//! snapshot, the duplicate window and the source position after the
//! visible state to `checkpoints/` ([`crate::checkpoint`]), keeps the
//! newest two, then compacts the journal through the oldest one kept.
//!
//! It runs when the visible state moved
//! [`super::ReplicaConfig::checkpoint_events`] past the last checkpoint or
//! [`super::ReplicaConfig::checkpoint_interval`] passed, at the lowest CPU
//! priority, paced to `checkpoint_rate`. It reads only immutable snapshots,
//! so commits never wait for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::threads::Cpu;
use super::{decode, ReplicaConfig, ReplicaError, Shared};
use crate::catalog::Catalog;
use crate::checkpoint::{self, CheckpointData};
use crate::event::StateId;
use crate::journal::Compactor;
use crate::source::{DupWindow, Position};
use crate::status::Progress;

/// Starts the checkpoint thread; `last` is the state of the checkpoint the
/// start restored from (0: none).
pub(super) fn start(
    shared: &Shared,
    compactor: Compactor,
    window: Arc<DupWindow>,
    last: StateId,
) -> Result<JoinHandle<()>, ReplicaError> {
    let checkpointer = Checkpointer {
        cfg: Arc::clone(&shared.cfg),
        catalog: Arc::clone(&shared.catalog),
        compactor,
        window,
        progress: Arc::clone(&shared.progress),
        stop: Arc::clone(&shared.stop),
        last,
    };
    // Checkpoints go last: the stager's commits are what readers wait for.
    shared.spawn(
        "checkpoint",
        Cpu::below(19),
        Box::new(move || checkpointer.run()),
    )
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
