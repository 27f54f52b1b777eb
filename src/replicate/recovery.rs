//! Recovery of the state folder when a replica starts: the newest readable
//! checkpoint (unreadable ones set aside and reported), then the journal
//! replayed after it, rebuilding the newest accepted state (for
//! validation), the visible state and every retained or pinned one, with
//! the files that resolved (`resolved.log`) filled in. Pins whose state is
//! no longer retained are dropped.
//!
//! Refuses a journal compacted past every readable checkpoint and a
//! journal that ends before the committed state; `ReplicaConfig::cancel`
//! interrupts it between segments and every 4,096 records.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use super::{decode, ReplicaConfig, ReplicaError};
use crate::bootstrap::after_gap::GcHold;
use crate::catalog::tree::UNKNOWN_TIME;
use crate::catalog::{load_durable, Catalog, Resolutions, Tree};
use crate::checkpoint::{self, CheckpointData};
use crate::event::{BlobId, StateId};
use crate::journal::{Journal, JournalConfig, JournalError};
use crate::source::{DupWindow, Position, Validator};
use crate::status::Progress;

/// What recovery rebuilt, for the threads to start from.
pub(super) struct Recovered {
    pub catalog: Arc<Catalog>,
    pub journal: Journal,
    pub resolutions: Arc<Resolutions>,
    pub gc_hold: Arc<GcHold>,
    /// Counters, with the checkpoint and the newest accepted state filled in.
    pub progress: Arc<Progress>,
    /// The validator at the newest journaled state, for ingest.
    pub validator: Validator,
    /// Its duplicate window, for checkpoints.
    pub window: Arc<DupWindow>,
    /// Where the source continues after the newest journaled event.
    pub resume: Option<Position>,
    /// The visible tree, the stager's first pending tree.
    pub visible: Arc<Tree>,
    /// The state of the checkpoint restored from (0: none).
    pub base: StateId,
    /// The blobs files of records after the visible one name (staged
    /// before a stop, or by `stagefs bootstrap`): GC keeps them until the
    /// stager has read those records (`gc::GcGate::starting`).
    pub after_visible: HashSet<BlobId>,
}

/// Recovers the state folder (see the module docs). The caller holds its
/// lock.
pub(super) fn recover(cfg: &ReplicaConfig) -> Result<Recovered, ReplicaError> {
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
    let mut after_visible = HashSet::new();
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
        if rec.id > record.visible {
            after_visible.extend(added.iter().filter_map(|f| f.content().map(|(b, _)| b)));
        }
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
    Ok(Recovered {
        catalog,
        journal,
        resolutions,
        gc_hold,
        progress,
        validator,
        window,
        resume,
        visible,
        base,
        after_visible,
    })
}
