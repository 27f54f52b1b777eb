//! The GC thread: mark and sweep of the blob store.
//!
//! Every `gc_interval` (2 s) when the set of versions changed, and no
//! sooner than [`GC_SCAN_SPACING`] times the last pass's scan after it,
//! the blobs of every retained version, of what the stager's pending
//! states reference and of the directories readers hold are marked, and
//! every other stored blob is deleted, in batches of [`GC_BATCH`] under the
//! [`GcGate`].
//!
//! GC and the stager agree through the gate: the stager publishes what its
//! pending states reference ([`catalog::PendingRefs`]) and checks blob
//! presence under it, and GC never deletes a blob the stager referenced
//! after GC took its view of the trees. Until the stager has read every
//! record journaled before the start, the blobs those records name are
//! marked too (they may already be stored: staged before a stop, or by
//! `stagefs bootstrap`). While a re-bootstrap's files belong to no
//! visible state yet ([`GcHold`]), passes are skipped.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{HeldDirs, ReplicaConfig, ReplicaError, Shared};
use crate::bootstrap::after_gap::GcHold;
use crate::catalog::{self, Catalog};
use crate::event::BlobId;
use crate::stage::{BlobStore, StageError};
use crate::status::Progress;

/// Starts the GC thread.
pub(super) fn start(shared: &Shared) -> Result<JoinHandle<()>, ReplicaError> {
    let (catalog, blobs, progress, gate, stop, cfg) = (
        Arc::clone(&shared.catalog),
        Arc::clone(&shared.blobs),
        Arc::clone(&shared.progress),
        Arc::clone(&shared.gate),
        Arc::clone(&shared.stop),
        Arc::clone(&shared.cfg),
    );
    let hold = Arc::clone(&shared.gc_hold);
    shared.spawn(
        "gc",
        shared.background,
        Box::new(move || run_gc(&cfg, &catalog, &blobs, &progress, &gate, &hold, &stop)),
    )
}

/// Shared between the stager and GC; see the module docs.
#[derive(Default)]
pub(super) struct GcGate {
    inner: Mutex<GateState>,
}

#[derive(Default)]
pub(super) struct GateState {
    pub marking: bool,
    /// Blobs the stager referenced since GC took its view.
    pub touched: HashSet<BlobId>,
    /// What the stager's pending states reference, as of its last batch.
    pub pending: catalog::PendingRefs,
    /// What readers hold, once a mount is serving.
    pub held: Option<HeldDirs>,
    /// The newest journal record at start, and the blobs the records
    /// after the visible state name: some may be stored already (staged
    /// before a stop, or by `stagefs bootstrap`) and nothing else marks
    /// them until the stager has read those records. Emptied then.
    journaled_at_start: u64,
    after_visible: Arc<HashSet<BlobId>>,
}

impl GcGate {
    /// A gate for a replica that starts with `visible` visible and its
    /// journal ending at `latest`, whose records after `visible` name
    /// `after_visible`.
    pub(super) fn starting(visible: u64, latest: u64, after_visible: HashSet<BlobId>) -> GcGate {
        let mut state = GateState {
            journaled_at_start: latest,
            after_visible: Arc::new(after_visible),
            ..GateState::default()
        };
        state.read(visible);
        GcGate {
            inner: Mutex::new(state),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, GateState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl GateState {
    /// The stager has read (applied to its pending states) record `id`
    /// (records are read in order).
    pub fn read(&mut self, id: u64) {
        if id >= self.journaled_at_start && !self.after_visible.is_empty() {
            // Its pending states name them from now on.
            self.after_visible = Arc::default();
        }
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
    let (pending, snapshot, held, after_visible) = {
        let mut g = gate.lock();
        g.marking = true;
        g.touched.clear();
        (
            g.pending.clone(),
            catalog.snapshot(),
            g.held.clone(),
            Arc::clone(&g.after_visible),
        )
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
        // Records journaled before the start that the stager has not
        // read yet (see `GateState::after_visible`).
        live.extend(after_visible.iter().copied());
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
    use crate::catalog::Tree;
    use crate::event::Event;

    /// Blobs staged for records after the visible state (before a stop,
    /// or by `stagefs bootstrap`) are referenced by nothing else GC sees
    /// until the stager has read those records: they are kept till then.
    #[test]
    fn blobs_named_by_records_journaled_at_start_stay_until_the_stager_has_read_them() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(dir.path()).unwrap();
        let id = BlobId::from_hex(&format!("{:064x}", 42)).unwrap();
        let path = blobs.path(&id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"staged before the start").unwrap();
        let catalog = Catalog::new(
            dir.path(),
            Arc::new(Tree::empty()),
            Default::default(),
            Default::default(),
            2,
        );
        // Visible 0, the journal ending at 42, whose records name the blob.
        let gate = GcGate::starting(0, 42, HashSet::from([id]));
        let stop = AtomicBool::new(false);
        let pass = || collect_garbage(&catalog, &blobs, &gate, &stop).unwrap();
        assert_eq!(pass().removed, 0);
        assert!(blobs.contains(&id));
        gate.lock().read(41);
        assert_eq!(pass().removed, 0);
        assert!(blobs.contains(&id));
        // The stager read through 42 (and, here, references nothing): the
        // blob nothing references goes.
        gate.lock().read(42);
        assert_eq!(pass().removed, 1);
        assert!(!blobs.contains(&id));
    }

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
