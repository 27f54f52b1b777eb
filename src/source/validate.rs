//! Acceptance of decoded events, whatever their source: strictly increasing
//! ids (an identical re-delivery is ignored, a different event under a used
//! id is rejected) and whether the event applies to the newest accepted
//! state (`catalog::Tree::apply`), after the structural bounds of
//! [`Event::check_bounds`] (partition keys, subdirectory depth). Only accepted events reach the journal,
//! so a corrected source replaces a rejected event after a restart.
//!
//! Called by the ingest thread for every event, and by recovery to replay
//! the journal.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

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

/// Accepts or rejects events against the newest accepted state.
pub struct Validator {
    latest: Arc<Tree>,
    /// (id, content hash) of every accepted event, in id order, to
    /// recognise identical re-deliveries.
    seen: Vec<(StateId, u64)>,
    /// Fills the content of files resolved already (after a restart).
    resolutions: Option<Arc<Resolutions>>,
}

fn content_hash(event: &Event) -> u64 {
    let mut h = DefaultHasher::new();
    // Canonical form: re-serialised, so key order and spacing don't matter.
    serde_json::to_vec(event).unwrap_or_default().hash(&mut h);
    h.finish()
}

impl Validator {
    pub fn new(latest: Arc<Tree>) -> Validator {
        Validator {
            latest,
            seen: Vec::new(),
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
        self.seen.push((event.id, content_hash(event)));
        self.latest = tree_after;
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
        let reject = |reason: String| Rejection {
            state_id: Some(event.id),
            file: file.clone(),
            line,
            reason,
        };
        let last = self.latest.state_id;
        if event.id <= last {
            let hash = content_hash(&event);
            let known = self
                .seen
                .binary_search_by_key(&event.id, |(id, _)| *id)
                .ok()
                .map(|i| self.seen[i].1);
            return match known {
                Some(h) if h == hash => Ok(Verdict::Duplicate),
                Some(_) => Err(reject(format!(
                    "id {} was already used by a different event",
                    event.id
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
        self.seen.push((event.id, content_hash(&event)));
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
}
