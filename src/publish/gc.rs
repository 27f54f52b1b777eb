//! Retention and garbage collection at the URL (SPEC §8 "Retention at
//! URL"), run by the publisher — the holder of HEAD, the only writer of
//! states and the only deleter — on its own thread, between two
//! publications, so nothing it writes races with what it deletes.
//!
//! One run:
//!
//! 1. **Keep**: the newest `retain` states under `states/`, the state
//!    HEAD names, the publisher host's own pins and sessions, and every
//!    state a live lease names (a lease is honoured until its expiry plus
//!    the grace period, which absorbs clock skew between hosts).
//! 2. **Condemn** every other state: write `condemned/<id>` (with its root
//!    and the time), *then* list the leases again — a lease written
//!    before the mark is seen and the state is spared (its mark removed);
//!    a taker that writes its lease after the mark sees the mark and
//!    gives up (`lease::acquire`) — and only then delete `states/<id>`,
//!    so no reader starts loading it afterwards.
//! 3. **Mark** every catalog, piece list and blob reachable from the kept
//!    states and from states condemned less than the grace period ago: a
//!    reader that read `states/<id>` (or HEAD) just before the state was
//!    condemned has the whole grace period to load its catalogs.
//! 4. **Sweep** catalogs, then piece lists, then blobs (top down: what is
//!    left never points at what is gone) that are unmarked and older than
//!    the grace period (orphans of a killed publisher go too), then the
//!    marks of states whose grace has passed and leases long expired.
//!
//! Any error before the sweep ends the run with nothing deleted. Catalogs
//! and piece lists are immutable, so what they reference is remembered
//! between runs and each is read once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload};
use tracing::{info, warn};

use super::catalog_object::{DirObject, Entry, MAX_CATALOG_BYTES};
use super::layout;
use super::lease;
use super::load::{get_bounded, get_pieces, get_record, get_verified, LoadError};
use super::record::{parse_i64, parse_u64, RecordKind};
use crate::event::{BlobId, StateId};

/// How long a condemned state's objects, and an expired lease's state,
/// stay by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct GcConfig {
    /// Newest published states kept (`--retain`).
    pub retain: usize,
    pub grace: Duration,
}

impl GcConfig {
    /// How often the publisher collects: half the grace period, between
    /// 200 ms and 5 minutes.
    pub fn interval(&self) -> Duration {
        (self.grace / 2).clamp(Duration::from_millis(200), Duration::from_secs(300))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{op} {object}: {source}")]
    Store {
        op: &'static str,
        object: String,
        source: object_store::Error,
    },
}

/// What collection did (status, tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub runs: u64,
    /// States kept by the last run (retained, leased, held).
    pub kept: Vec<StateId>,
    /// Of those, the ones only a lease or a local hold keeps.
    pub leased: Vec<StateId>,
    pub states_condemned: u64,
    /// Leases at the URL not expired, at the last run.
    pub leases_live: u64,
    pub objects_deleted: u64,
    pub bytes_deleted: u64,
    pub last_error: Option<String>,
}

/// Everything reachable from some states.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Marked {
    pub catalogs: HashSet<BlobId>,
    pub pieces: HashSet<BlobId>,
    pub blobs: HashSet<BlobId>,
}

/// What one catalog object references.
#[derive(Debug, Clone)]
struct Refs {
    dirs: Vec<BlobId>,
    blobs: Vec<BlobId>,
    pieces: Vec<BlobId>,
}

/// A condemnation mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub state: StateId,
    pub root: BlobId,
    pub condemned_ms: i64,
}

impl Mark {
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "stagefs-condemned 1\nstate {}\nroot {}\ncondemned_ms {}\n",
            self.state.0,
            self.root.to_hex(),
            self.condemned_ms
        )
        .into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Option<Mark> {
        let text = std::str::from_utf8(bytes).ok()?.strip_suffix('\n')?;
        let lines: Vec<&str> = text.split('\n').collect();
        let [magic, state, root, ms] = lines[..] else {
            return None;
        };
        (magic == "stagefs-condemned 1").then_some(())?;
        let root = root.strip_prefix("root ")?;
        Some(Mark {
            state: StateId(parse_u64(state.strip_prefix("state ")?)?),
            root: BlobId::from_hex(root)
                .filter(|_| root.bytes().all(|b| !b.is_ascii_uppercase()))?,
            condemned_ms: parse_i64(ms.strip_prefix("condemned_ms ")?)?,
        })
    }
}

/// Which states a run keeps: the newest `retain` published, HEAD's, the
/// held ones and the live-leased ones (those of `states` only).
pub fn kept_states(
    states: &BTreeSet<StateId>,
    head: Option<StateId>,
    retain: usize,
    held: &[StateId],
    leased: &[StateId],
) -> BTreeSet<StateId> {
    let mut kept: BTreeSet<StateId> = states.iter().rev().take(retain.max(1)).copied().collect();
    for s in head.iter().chain(held).chain(leased) {
        if states.contains(s) {
            kept.insert(*s);
        }
    }
    kept
}

/// The states live leases name: a lease counts until `expires_ms + grace`.
fn live_leased(leases: &[lease::Listed], now_ms: i64, grace_ms: i64) -> Vec<StateId> {
    leases
        .iter()
        .filter_map(|l| l.lease.as_ref())
        .filter(|l| l.expires_ms.saturating_add(grace_ms) > now_ms)
        .map(|l| l.state)
        .collect()
}

/// The collector: remembers what immutable objects reference.
#[derive(Default)]
pub struct Collector {
    refs: HashMap<BlobId, Refs>,
    piece_blobs: HashMap<BlobId, Vec<BlobId>>,
    roots: HashMap<StateId, BlobId>,
}

fn store_err(op: &'static str, object: &Path) -> impl FnOnce(object_store::Error) -> GcError {
    let object = object.to_string();
    move |source| GcError::Store { op, object, source }
}

async fn list_all(store: &dyn ObjectStore, prefix: &str) -> Result<Vec<ObjectMeta>, GcError> {
    let p = Path::from(prefix);
    store
        .list(Some(&p))
        .try_collect()
        .await
        .map_err(store_err("listing", &p))
}

/// Deletes `path`; one already gone is fine.
async fn delete(store: &dyn ObjectStore, path: &Path) -> Result<(), GcError> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(store_err("deleting", path)(e)),
    }
}

impl Collector {
    pub fn new() -> Collector {
        Collector::default()
    }

    /// The root catalog of published state `id` (None: not published).
    async fn root_of(
        &mut self,
        store: &dyn ObjectStore,
        id: StateId,
    ) -> Result<Option<BlobId>, LoadError> {
        if let Some(r) = self.roots.get(&id) {
            return Ok(Some(*r));
        }
        match get_record(store, &layout::state(id), RecordKind::State, None).await {
            Ok(d) => {
                self.roots.insert(id, d.published.root);
                Ok(Some(d.published.root))
            }
            Err(LoadError::Missing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Everything reachable from the catalogs `roots`. An object that
    /// cannot be read fails the mark (nothing is deleted then).
    pub async fn mark(
        &mut self,
        store: &dyn ObjectStore,
        roots: impl IntoIterator<Item = BlobId>,
    ) -> Result<Marked, LoadError> {
        let mut m = Marked::default();
        let mut todo: Vec<BlobId> = roots.into_iter().collect();
        while let Some(id) = todo.pop() {
            if !m.catalogs.insert(id) {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = self.refs.entry(id) {
                let path = layout::catalog(&id);
                let bytes = get_verified(store, &path, &id, MAX_CATALOG_BYTES).await?;
                let obj = DirObject::decode(&bytes).map_err(|e| LoadError::Corrupt {
                    object: path.to_string(),
                    detail: e.to_string(),
                })?;
                slot.insert(refs_of(&obj));
            }
            let r = &self.refs[&id];
            todo.extend(r.dirs.iter().copied());
            m.blobs.extend(r.blobs.iter().copied());
            for list in r.pieces.clone() {
                if m.pieces.insert(list) {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        self.piece_blobs.entry(list)
                    {
                        slot.insert(get_pieces(store, &list).await?.pieces);
                    }
                    m.blobs.extend(self.piece_blobs[&list].iter().copied());
                }
            }
        }
        Ok(m)
    }

    /// One collection (see the module): `head` is the state HEAD names,
    /// `held` the publisher host's own pins and sessions. Returns what
    /// every kept state reaches: the publisher trusts only that to be at
    /// the URL afterwards.
    pub async fn run(
        &mut self,
        store: &dyn ObjectStore,
        head: Option<StateId>,
        held: &[StateId],
        cfg: &GcConfig,
        report: &mut GcReport,
    ) -> Result<Marked, GcError> {
        let now = lease::now_ms();
        let grace_ms = cfg.grace.as_millis() as i64;
        let states: BTreeSet<StateId> = list_all(store, "states/")
            .await?
            .iter()
            .filter_map(|m| layout::state_of(&m.location))
            .collect();
        let leases = lease::list(store).await?;
        let leased = live_leased(&leases, now, grace_ms);
        report.leases_live = leases
            .iter()
            .filter_map(|l| l.lease.as_ref())
            .filter(|l| l.expires_ms > now)
            .count() as u64;
        let mut kept = kept_states(&states, head, cfg.retain, held, &leased);
        let mut marks: BTreeMap<StateId, Mark> = BTreeMap::new();
        for m in list_all(store, layout::CONDEMNED).await? {
            let Some(state) = layout::state_of(&m.location) else {
                continue;
            };
            match get_bounded(store, &m.location, 512).await {
                Ok(bytes) => match Mark::decode(&bytes).filter(|k| k.state == state) {
                    Some(mark) => {
                        marks.insert(state, mark);
                    }
                    None => warn!("{} is not a condemnation mark; left alone", m.location),
                },
                Err(LoadError::Missing { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // A kept state that still carries a mark (a crash between the
        // mark and the lease check): spared.
        for s in kept.iter().filter(|s| marks.contains_key(s)) {
            delete(store, &layout::condemned(*s)).await?;
        }
        marks.retain(|s, _| !kept.contains(s));

        // Condemn: mark, list leases again, then delete the state.
        let doomed: Vec<StateId> = states.difference(&kept).copied().collect();
        let mut written = Vec::new();
        for &s in &doomed {
            let Some(root) = self.root_of(store, s).await? else {
                continue;
            };
            let mark = Mark {
                state: s,
                root,
                condemned_ms: now,
            };
            let path = layout::condemned(s);
            store
                .put(&path, PutPayload::from(mark.encode()))
                .await
                .map_err(store_err("writing", &path))?;
            written.push(mark);
        }
        if !written.is_empty() {
            let again = live_leased(&lease::list(store).await?, lease::now_ms(), grace_ms);
            for mark in written {
                if again.contains(&mark.state) {
                    delete(store, &layout::condemned(mark.state)).await?;
                    kept.insert(mark.state);
                    continue;
                }
                delete(store, &layout::state(mark.state)).await?;
                report.states_condemned += 1;
                info!(
                    state = mark.state.0,
                    "state condemned: no longer retained or leased"
                );
                marks.insert(mark.state, mark);
            }
        }

        // Mark from what is kept and what is still in its grace.
        let mut roots = Vec::new();
        for &s in &kept {
            if let Some(r) = self.root_of(store, s).await? {
                roots.push(r);
            }
        }
        let kept_marked = self.mark(store, roots.clone()).await?;
        let graced: Vec<BlobId> = marks
            .values()
            .filter(|m| now - m.condemned_ms < grace_ms)
            .map(|m| m.root)
            .collect();
        let marked = if graced.is_empty() {
            kept_marked.clone()
        } else {
            self.mark(store, roots.into_iter().chain(graced)).await?
        };

        // Sweep, top down.
        let old = |m: &ObjectMeta| now - m.last_modified.timestamp_millis() >= grace_ms;
        for (prefix, set) in [
            ("catalogs/", &marked.catalogs),
            ("pieces/", &marked.pieces),
            ("blobs/", &marked.blobs),
        ] {
            for meta in list_all(store, prefix).await? {
                let id = meta.location.filename().and_then(BlobId::from_hex);
                if id.is_some_and(|id| set.contains(&id)) || !old(&meta) {
                    continue;
                }
                if id.is_none() {
                    continue; // not ours: left alone
                }
                delete(store, &meta.location).await?;
                report.objects_deleted += 1;
                report.bytes_deleted += meta.size;
            }
        }
        for mark in marks.values().filter(|m| now - m.condemned_ms >= grace_ms) {
            delete(store, &layout::condemned(mark.state)).await?;
            self.roots.remove(&mark.state);
        }
        for l in &leases {
            if l.lease
                .as_ref()
                .is_some_and(|l| l.expires_ms.saturating_add(grace_ms) <= now)
            {
                delete(store, &l.path).await?;
            }
        }
        // Forget what is gone.
        self.refs.retain(|id, _| marked.catalogs.contains(id));
        self.piece_blobs.retain(|id, _| marked.pieces.contains(id));
        report.runs += 1;
        report.leased = kept
            .iter()
            .filter(|s| !states.iter().rev().take(cfg.retain.max(1)).any(|r| r == *s))
            .filter(|s| Some(**s) != head)
            .copied()
            .collect();
        report.kept = kept.into_iter().collect();
        report.last_error = None;
        Ok(kept_marked)
    }
}

fn refs_of(obj: &DirObject) -> Refs {
    let mut r = Refs {
        dirs: Vec::new(),
        blobs: Vec::new(),
        pieces: Vec::new(),
    };
    for (_, e) in &obj.entries {
        match e {
            Entry::Dir(d) => r.dirs.push(*d),
            Entry::File(f) => match f.pieces {
                Some(p) => r.pieces.push(p),
                None => r.blobs.push(f.sha256),
            },
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> BTreeSet<StateId> {
        v.iter().map(|&s| StateId(s)).collect()
    }

    #[test]
    fn the_newest_retained_head_held_and_leased_states_are_kept() {
        let states = ids(&[3, 5, 8, 9, 12]);
        assert_eq!(
            kept_states(&states, Some(StateId(12)), 2, &[], &[]),
            ids(&[9, 12])
        );
        assert_eq!(
            kept_states(
                &states,
                Some(StateId(12)),
                2,
                &[StateId(3)],
                &[StateId(5), StateId(7)]
            ),
            ids(&[3, 5, 9, 12]),
            "a lease on a state that is not published keeps nothing"
        );
        // HEAD is kept even when newer states were written without it.
        assert_eq!(
            kept_states(&states, Some(StateId(8)), 1, &[], &[]),
            ids(&[8, 12])
        );
    }

    #[test]
    fn a_mark_round_trips() {
        let m = Mark {
            state: StateId(7),
            root: BlobId([9; 32]),
            condemned_ms: 123,
        };
        assert_eq!(Mark::decode(&m.encode()), Some(m));
        assert_eq!(Mark::decode(b"stagefs-condemned 1\nstate 7\n"), None);
    }

    #[test]
    fn expired_leases_count_for_the_grace_period_only() {
        let l = |state, expires_ms| lease::Listed {
            path: Path::from("leases/x"),
            id: None,
            lease: Some(lease::Lease {
                state: StateId(state),
                expires_ms,
                holder: String::new(),
            }),
        };
        let leases = [l(1, 1000), l(2, 500), l(3, 5000)];
        assert_eq!(
            live_leased(&leases, 1200, 300),
            vec![StateId(1), StateId(3)]
        );
    }
}
