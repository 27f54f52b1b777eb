//! Acceptance of decoded events, whatever their source: strictly increasing
//! ids (an identical re-delivery is ignored, a different event under a used
//! id is rejected) and whether the event applies to the newest accepted
//! state (`catalog::Tree::apply`), after the structural bounds of
//! [`Event::check_bounds`] (partition keys, subdirectory depth). Only accepted events reach the journal,
//! so a corrected source replaces a rejected event after a restart.
//!
//! Duplicate detection is bounded ([`DupWindow`]): the (id, content hash)
//! of at least the last [`DUPLICATE_WINDOW`] accepted events are kept (and
//! carried across a restart by the checkpoint). A re-delivered id inside
//! the window is ignored when identical and rejected when different; an id
//! older than the window is rejected, because it can no longer be told
//! from a conflicting event.
//!
//! Called by the ingest thread for every event, and by recovery to replay
//! the journal.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use super::Rejection;
use crate::catalog::{AddedFile, Resolutions, Tree};
use crate::event::{Event, StateId};

/// What happened to one event.
#[derive(Debug)]
pub enum Verdict {
    /// New event, with the state after it (the validator's new latest).
    Accepted(Box<Accepted>),
    /// Same id and content as an event already accepted.
    Duplicate,
}

/// An accepted event and what applying it gave.
#[derive(Debug)]
pub struct Accepted {
    pub event: Event,
    pub tree: Arc<Tree>,
    pub added: Vec<AddedFile>,
}

/// Accepted events whose re-delivery is recognised (see the module docs).
pub const DUPLICATE_WINDOW: usize = 100_000;

/// (id, content hash) of the most recent accepted events, in id order.
/// Shared between the validator (the writer) and the checkpoint writer,
/// which saves the part at or below the checkpoint's state.
#[derive(Debug)]
pub struct DupWindow {
    entries: Mutex<Entries>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Entries {
    q: VecDeque<(StateId, u64)>,
    /// Ids at or below this may have been forgotten (0: none was).
    forgot_through: StateId,
}

impl DupWindow {
    pub fn new(capacity: usize) -> DupWindow {
        DupWindow {
            entries: Mutex::new(Entries::default()),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Plain pushes and pops: a poisoned lock still guards whole data.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an accepted event (ids must increase), forgetting the oldest
    /// past the capacity.
    pub fn push(&self, id: StateId, hash: u64) {
        let mut e = self.lock();
        e.q.push_back((id, hash));
        while e.q.len() > self.capacity {
            if let Some((gone, _)) = e.q.pop_front() {
                e.forgot_through = gone;
            }
        }
    }

    /// Puts back entries saved by a checkpoint (older than anything pushed).
    pub fn restore(&self, saved: &[(StateId, u64)]) {
        let mut e = self.lock();
        let before = e.q.front().map_or(StateId(u64::MAX), |e| e.0);
        for s in saved.iter().rev().filter(|s| s.0 < before) {
            if e.q.len() >= self.capacity {
                break;
            }
            e.q.push_front(*s);
        }
        // What the checkpoint's window no longer held is forgotten.
        if let Some(oldest) = e.q.front().map(|s| s.0) {
            e.forgot_through = e.forgot_through.max(StateId(oldest.0.saturating_sub(1)));
        }
    }

    /// The hash of the accepted event `id`, and the newest id that may
    /// have been forgotten (None: nothing was).
    fn lookup(&self, id: StateId) -> (Option<u64>, Option<StateId>) {
        let e = self.lock();
        let hash =
            e.q.binary_search_by_key(&id, |(i, _)| *i)
                .ok()
                .map(|i| e.q[i].1);
        (
            hash,
            (e.forgot_through > StateId(0)).then_some(e.forgot_through),
        )
    }

    /// The entries at or below `id` (what a checkpoint at `id` saves).
    pub fn through(&self, id: StateId) -> Vec<(StateId, u64)> {
        let e = self.lock();
        let end = e.q.partition_point(|s| s.0 <= id);
        e.q.range(..end).copied().collect()
    }

    pub fn len(&self) -> usize {
        self.lock().q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().q.is_empty()
    }
}

/// Accepts or rejects events against the newest accepted state.
pub struct Validator {
    latest: Arc<Tree>,
    /// Recent accepted events, to recognise identical re-deliveries.
    seen: Arc<DupWindow>,
    /// Fills the content of files resolved already (after a restart).
    resolutions: Option<Arc<Resolutions>>,
}

/// The content hash of `event` (kept in the duplicate window and saved by
/// checkpoints, so its definition must not change): SipHash
/// (`DefaultHasher`) of the event's canonical form, its compact
/// `serde_json` serialisation, so key order and spacing don't matter.
fn content_hash(event: &Event) -> u64 {
    hash_canonical(&serde_json::to_vec(event).unwrap_or_default())
}

/// [`content_hash`] from the canonical form already serialised
/// (`serde_json::to_vec(event)`, which the journal record embeds).
fn hash_canonical(canonical: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    // `[u8]` hashes as the `Vec<u8>` the hash was first defined over.
    canonical.hash(&mut h);
    h.finish()
}

impl Validator {
    pub fn new(latest: Arc<Tree>) -> Validator {
        Validator {
            latest,
            seen: Arc::new(DupWindow::new(DUPLICATE_WINDOW)),
            resolutions: None,
        }
    }

    /// Files of the trees this validator builds get their content from
    /// `resolutions` once known.
    pub fn with_resolutions(mut self, resolutions: Arc<Resolutions>) -> Validator {
        self.resolutions = Some(resolutions);
        self
    }

    /// Records an event already accepted before (journal replay at start).
    pub fn replayed(&mut self, event: &Event, tree_after: Arc<Tree>) {
        self.seen.push(event.id, content_hash(event));
        self.latest = tree_after;
    }

    /// Starts from a checkpoint: `latest` is its newest state and `seen`
    /// the duplicate window it saved.
    pub fn restored(&mut self, latest: Arc<Tree>, seen: &[(StateId, u64)]) {
        self.seen.restore(seen);
        self.latest = latest;
    }

    /// The duplicate window, for the checkpoint writer.
    pub fn window(&self) -> Arc<DupWindow> {
        Arc::clone(&self.seen)
    }

    pub fn latest(&self) -> &Arc<Tree> {
        &self.latest
    }

    pub fn last_id(&self) -> StateId {
        self.latest.state_id
    }

    /// Accepts `event` (read at `file`:`line`, when the source has lines).
    pub fn check(
        &mut self,
        event: Event,
        file: Option<String>,
        line: Option<u64>,
    ) -> Result<Verdict, Rejection> {
        self.check_hashed(event, None, file, line)
    }

    /// [`Validator::check`] for an event whose canonical form
    /// (`serde_json::to_vec(&event)`) the caller has serialised already
    /// (for the journal): hashed instead of serialising the event again.
    pub fn check_canonical(
        &mut self,
        event: Event,
        canonical: &[u8],
        file: Option<String>,
        line: Option<u64>,
    ) -> Result<Verdict, Rejection> {
        self.check_hashed(event, Some(hash_canonical(canonical)), file, line)
    }

    fn check_hashed(
        &mut self,
        event: Event,
        hash: Option<u64>,
        file: Option<String>,
        line: Option<u64>,
    ) -> Result<Verdict, Rejection> {
        let hash = || hash.unwrap_or_else(|| content_hash(&event));
        let reject = |reason: String| Rejection {
            state_id: Some(event.id),
            file: file.clone(),
            line,
            reason,
        };
        let last = self.latest.state_id;
        if event.id <= last {
            let hash = hash();
            let (known, forgot) = self.seen.lookup(event.id);
            return match known {
                Some(h) if h == hash => Ok(Verdict::Duplicate),
                Some(_) => Err(reject(format!(
                    "id {} was already used by a different event",
                    event.id
                ))),
                None if forgot.is_some_and(|f| event.id <= f) => Err(reject(format!(
                    "id {} is older than the duplicate-detection window (the last {} accepted events): it cannot be told from a conflicting event",
                    event.id, DUPLICATE_WINDOW
                ))),
                None => Err(reject(format!(
                    "id {} does not increase past {last}",
                    event.id
                ))),
            };
        }
        // Bounds first (every source): they keep `apply` and every walk
        // of the tree shallow.
        event.check_bounds().map_err(|e| reject(e.to_string()))?;
        let (tree, added) = self
            .latest
            .apply(&event)
            .map_err(|e| reject(e.to_string()))?;
        if let Some(r) = &self.resolutions {
            r.attach(&added);
        }
        self.seen.push(event.id, hash());
        self.latest = Arc::new(tree);
        Ok(Verdict::Accepted(Box::new(Accepted {
            event,
            tree: Arc::clone(&self.latest),
            added,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(v: &mut Validator, text: &str, n: u64) -> Result<Verdict, Rejection> {
        let event = Event::parse_line(text.as_bytes()).unwrap();
        v.check(event, Some("log.jsonl".into()), Some(n))
    }

    #[test]
    fn validator_ignores_identical_redelivery_and_rejects_conflicts() {
        let mut v = Validator::new(Arc::new(Tree::empty()));
        assert!(matches!(
            check(
                &mut v,
                r#"{"id": 5, "op": "create_database", "db": "d"}"#,
                1
            ),
            Ok(Verdict::Accepted(_))
        ));
        assert!(matches!(
            check(
                &mut v,
                r#"{"op": "create_database", "id": 5,  "db": "d"}"#,
                2
            ),
            Ok(Verdict::Duplicate)
        ));
        let r = check(
            &mut v,
            r#"{"id": 5, "op": "create_database", "db": "e"}"#,
            3,
        )
        .unwrap_err();
        assert_eq!((r.state_id, r.line), (Some(StateId(5)), Some(3)));
        let r = check(&mut v, r#"{"id": 4, "op": "noop"}"#, 4).unwrap_err();
        assert!(r.reason.contains("does not increase"), "{r}");
        let r = check(
            &mut v,
            r#"{"id": 6, "op": "create_database", "db": "d"}"#,
            5,
        )
        .unwrap_err();
        assert_eq!(
            r.to_string(),
            "event 6 at log.jsonl:5: database `d` already exists"
        );
        assert_eq!(v.last_id(), StateId(5));
    }

    #[test]
    fn the_content_hash_of_a_serialised_event_is_the_hash_of_the_event() {
        let event = Event::parse_line(
            br#"{"id": 3, "op": "add_files", "db": "d", "table": "t", "files": [{"path": "x", "size": 1, "sha256": "0000000000000000000000000000000000000000000000000000000000000000"}]}"#,
        )
        .unwrap();
        let canonical = serde_json::to_vec(&event).unwrap();
        assert_eq!(hash_canonical(&canonical), content_hash(&event));
        // The definition checkpoints saved: SipHash of the Vec<u8>.
        let mut h = DefaultHasher::new();
        canonical.hash(&mut h);
        assert_eq!(content_hash(&event), h.finish());
    }

    #[test]
    fn duplicate_window_forgets_the_oldest_and_rejects_ids_before_it() {
        let w = DupWindow::new(3);
        for i in 1..=5 {
            w.push(StateId(i), i * 10);
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.lookup(StateId(4)), (Some(40), Some(StateId(2))));
        assert_eq!(w.lookup(StateId(2)).0, None);
        assert_eq!(
            w.through(StateId(4)),
            vec![(StateId(3), 30), (StateId(4), 40)]
        );
        // A restore only fills in older entries, up to the capacity.
        let r = DupWindow::new(3);
        r.push(StateId(6), 60);
        r.restore(&[(StateId(4), 40), (StateId(5), 50), (StateId(6), 0)]);
        assert_eq!(
            r.through(StateId(9)),
            vec![(StateId(4), 40), (StateId(5), 50), (StateId(6), 60)]
        );
    }

    #[test]
    fn validator_rejects_a_redelivery_older_than_its_window() {
        let mut v = Validator::new(Arc::new(Tree::empty()));
        v.seen = Arc::new(DupWindow::new(2));
        for (n, db) in ["a", "b", "c"].iter().enumerate() {
            let line = format!(
                r#"{{"id": {}, "op": "create_database", "db": "{db}"}}"#,
                n + 1
            );
            assert!(matches!(
                check(&mut v, &line, n as u64),
                Ok(Verdict::Accepted(_))
            ));
        }
        assert!(matches!(
            check(
                &mut v,
                r#"{"id": 2, "op": "create_database", "db": "b"}"#,
                9
            ),
            Ok(Verdict::Duplicate)
        ));
        let r = check(
            &mut v,
            r#"{"id": 1, "op": "create_database", "db": "a"}"#,
            10,
        )
        .unwrap_err();
        assert!(
            r.reason
                .contains("older than the duplicate-detection window"),
            "{r}"
        );
    }
}
