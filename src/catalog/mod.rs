//! The catalog: source states as immutable trees, the commit rule, retention
//! and pins.
//!
//! Two halves with one writer each:
//! - [`Pending`] belongs to the stager thread: the states after the visible
//!   one, built from journal events before their files are staged, and the
//!   set of blobs they still miss, each with every source it can be read
//!   from (all file entries of pending states naming it: copies and empty
//!   files share a blob). [`Pending::newest_complete`] is the commit rule
//!   of SPEC §3: the newest state whose every referenced blob is staged,
//!   whichever entry it was read through. At most `max_states` states wait
//!   one by one; past that the newest absorbs the events that follow (see
//!   [`Pending::bounded`]), so the stager always reads on.
//! - [`Catalog`] is shared: the committed (retained) versions, the visible
//!   pointer and the pins, behind one mutex for writers and published to
//!   readers as an immutable [`Snapshot`] through `ArcSwap` (no lock on the
//!   read path). Every change is made durable (commit record, pins file)
//!   before it is published, so what a reader saw survives a crash.
//!
//! The commit record is appended to `commits.log` (a [`RecordLog`]: one
//! `fdatasync` per commit, torn tail skipped on load and cut before the
//! next append, rewritten down to its last record past
//! [`COMMIT_LOG_COMPACT_AT`]). A state folder from before the log keeps
//! its record in `commit.json`, which is read when the log has no record
//! and removed once the log's first record is durable, so the ratchet
//! carries over.

pub mod resolutions;
pub mod tree;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

pub use resolutions::Resolutions;
pub use tree::{
    AddedFile, ApplyError, DirKind, DirNode, FileNode, Meta, Name, Node, NodeId, Resolution, Tree,
};

use crate::durable::{read_log, write_atomic, RecordLog};
use crate::event::{BlobId, Event, FileRef, StateId};

/// Why a catalog operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("writing {path}: {source}")]
    Persist {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading {path}: {detail}")]
    Load { path: PathBuf, detail: String },
}

/// Why a pin was refused (all map to EINVAL except `NotPinnable`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PinError {
    #[error("pin value must be a decimal state-id or `visible`")]
    BadValue,
    #[error("state {0} is not retained")]
    NotRetained(StateId),
    #[error("table {0} does not exist at state {1}")]
    NoTableAtState(String, StateId),
    #[error("pins apply to the mount root and table directories only")]
    NotPinnable,
    #[error("{0}")]
    Persist(String),
}

/// What a pin applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PinScope {
    Root,
    Table { db: String, table: String },
}

impl PinScope {
    /// `"/"` for the root, `"db.table"` for a table: the keys of status `pins`.
    pub fn label(&self) -> String {
        match self {
            PinScope::Root => "/".into(),
            PinScope::Table { db, table } => format!("{db}.{table}"),
        }
    }
}

/// The pins in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pins {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<StateId>,
    /// `"db.table"` → state.
    #[serde(default)]
    pub tables: BTreeMap<String, StateId>,
    /// `stagefs run` sessions by id: each holds its state like a pin
    /// (retained, never collected) until its leader exits.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sessions: BTreeMap<String, SessionHold>,
}

/// A `stagefs run` session: its state and the process that leads it
/// (named by pid and start time, so a reused pid is not mistaken for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHold {
    pub state: StateId,
    pub pid: u32,
    /// Clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
    /// When it began, Unix epoch milliseconds.
    pub since_ms: i64,
}

impl Pins {
    pub fn get(&self, scope: &PinScope) -> Option<StateId> {
        match scope {
            PinScope::Root => self.root,
            PinScope::Table { .. } => self.tables.get(&scope.label()).copied(),
        }
    }

    /// Every pinned state-id (sessions included).
    pub fn states(&self) -> impl Iterator<Item = StateId> + '_ {
        self.root
            .into_iter()
            .chain(self.tables.values().copied())
            .chain(self.sessions.values().map(|h| h.state))
    }

    /// Scope label → state of the pins proper (no sessions), for status.
    pub fn labelled(&self) -> BTreeMap<String, StateId> {
        let mut out = self.tables.clone();
        if let Some(r) = self.root {
            out.insert("/".into(), r);
        }
        out
    }
}

/// What readers see: immutable, replaced whole on every change.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The newest complete state.
    pub visible: Arc<Tree>,
    /// Retained committed versions (always including `visible` and every
    /// pinned state).
    pub versions: BTreeMap<StateId, Arc<Tree>>,
    pub pins: Pins,
}

impl Snapshot {
    /// The tree the mount root shows: the root pin, else the visible state.
    pub fn root_tree(&self) -> &Arc<Tree> {
        self.pins
            .root
            .and_then(|s| self.versions.get(&s))
            .unwrap_or(&self.visible)
    }

    /// The tree a table path resolves through: table pin, then root pin,
    /// then visible.
    pub fn table_tree(&self, db: &str, table: &str) -> &Arc<Tree> {
        let key = format!("{db}.{table}");
        self.pins
            .tables
            .get(&key)
            .and_then(|s| self.versions.get(s))
            .unwrap_or_else(|| self.root_tree())
    }
}

/// The durable record of what is visible and retained.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRecord {
    pub visible: StateId,
    pub retained: Vec<StateId>,
}

/// The commit log: one [`CommitRecord`] (JSON) per record, newest last.
const COMMIT_LOG: &str = "commits.log";
/// Where state folders written before the commit log keep their record.
const LEGACY_COMMIT_FILE: &str = "commit.json";
const PINS_FILE: &str = "pins.json";
/// Past this size the next commit rewrites the log down to its one
/// record (about 10,000 commits; two flushes then instead of one).
pub const COMMIT_LOG_COMPACT_AT: u64 = 1 << 20;

fn load_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> Result<T, CatalogError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| CatalogError::Load {
            path: path.to_owned(),
            detail: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(CatalogError::Load {
            path: path.to_owned(),
            detail: e.to_string(),
        }),
    }
}

/// Reads the commit record and pins of a state directory (restart, status).
pub fn load_durable(state_dir: &Path) -> Result<(CommitRecord, Pins), CatalogError> {
    Ok((
        load_commit_record(state_dir)?,
        load_json(&state_dir.join(PINS_FILE))?,
    ))
}

/// The newest durable commit record: the commit log's last whole record,
/// else (a folder from before the log) `commit.json`, else the empty one.
fn load_commit_record(state_dir: &Path) -> Result<CommitRecord, CatalogError> {
    let path = state_dir.join(COMMIT_LOG);
    let load_err = |detail: String| CatalogError::Load {
        path: path.clone(),
        detail,
    };
    let log = read_log(&path).map_err(|e| load_err(e.to_string()))?;
    match log.as_ref().and_then(|l| l.records.last()) {
        Some(last) => serde_json::from_slice(last).map_err(|e| load_err(e.to_string())),
        None => load_json(&state_dir.join(LEGACY_COMMIT_FILE)),
    }
}

/// Whether `state_dir` holds a commit record (of either format).
pub fn has_commit_record(state_dir: &Path) -> bool {
    state_dir.join(COMMIT_LOG).exists() || state_dir.join(LEGACY_COMMIT_FILE).exists()
}

/// The writer's side of the commit log, opened at the first commit.
struct CommitWriter {
    log: RecordLog,
    /// `commit.json` is still there and goes after the first append.
    legacy: bool,
}

struct Control {
    versions: BTreeMap<StateId, Arc<Tree>>,
    visible: Arc<Tree>,
    pins: Pins,
    retain: usize,
    commits: Option<CommitWriter>,
}

/// The shared half: committed versions, visible pointer, pins.
pub struct Catalog {
    control: Mutex<Control>,
    published: ArcSwap<Snapshot>,
    state_dir: PathBuf,
}

impl Catalog {
    /// A catalog whose visible state is `visible`, retaining `versions`
    /// (restart rebuilds these from the journal).
    pub fn new(
        state_dir: &Path,
        visible: Arc<Tree>,
        mut versions: BTreeMap<StateId, Arc<Tree>>,
        pins: Pins,
        retain: usize,
    ) -> Catalog {
        versions.insert(visible.state_id, Arc::clone(&visible));
        let control = Control {
            versions,
            visible,
            pins,
            retain: retain.max(1),
            commits: None,
        };
        let published = ArcSwap::from_pointee(control.snapshot());
        Catalog {
            control: Mutex::new(control),
            published,
            state_dir: state_dir.to_owned(),
        }
    }

    /// The current snapshot; lock-free.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.published.load_full()
    }

    fn lock(&self) -> MutexGuard<'_, Control> {
        // A poisoned lock means a writer panicked mid-update; the control
        // data is only changed after the durable write succeeded, so it is
        // still consistent.
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `tree` the visible state: records it durably, applies
    /// retention, then publishes. Returns the states dropped by retention.
    pub fn commit(&self, tree: Arc<Tree>) -> Result<Vec<StateId>, CatalogError> {
        let mut c = self.lock();
        if tree.state_id <= c.visible.state_id {
            return Ok(Vec::new()); // the ratchet: never backwards
        }
        let mut versions = c.versions.clone();
        versions.insert(tree.state_id, Arc::clone(&tree));
        let dropped = retention(&versions, &c.pins, tree.state_id, c.retain);
        for s in &dropped {
            versions.remove(s);
        }
        let record = CommitRecord {
            visible: tree.state_id,
            retained: versions.keys().copied().collect(),
        };
        self.append_commit(&mut c.commits, &record)?;
        c.versions = versions;
        c.visible = tree;
        self.published.store(Arc::new(c.snapshot()));
        Ok(dropped)
    }

    /// Makes `record` durable: one append + `fdatasync` to the commit log
    /// (opened, and its torn tail cut, at the first commit).
    fn append_commit(
        &self,
        writer: &mut Option<CommitWriter>,
        record: &CommitRecord,
    ) -> Result<(), CatalogError> {
        let path = self.state_dir.join(COMMIT_LOG);
        let persist_err = |source| CatalogError::Persist {
            path: path.clone(),
            source,
        };
        let bytes =
            serde_json::to_vec(record).map_err(|e| persist_err(std::io::Error::other(e)))?;
        let w = match writer {
            Some(w) => w,
            None => {
                let (log, found) = RecordLog::open(&path).map_err(persist_err)?;
                if let Some(reason) = &found.torn {
                    tracing::warn!(path = %path.display(), %reason, "commit log tail was cut");
                }
                let legacy = self.state_dir.join(LEGACY_COMMIT_FILE).exists();
                writer.insert(CommitWriter { log, legacy })
            }
        };
        if w.log.len() > COMMIT_LOG_COMPACT_AT {
            w.log.rewrite(&[&bytes]).map_err(persist_err)?;
        } else {
            w.log.append(&bytes).map_err(persist_err)?;
        }
        if w.legacy {
            // The log now holds a newer record than commit.json, and is
            // read first; a failed removal only leaves a stale file.
            let legacy = self.state_dir.join(LEGACY_COMMIT_FILE);
            match std::fs::remove_file(&legacy) {
                Ok(()) => tracing::info!("commit record migrated from commit.json to commits.log"),
                Err(e) => {
                    tracing::warn!(path = %legacy.display(), error = %e, "could not remove the old commit record")
                }
            }
            w.legacy = false;
        }
        Ok(())
    }

    fn persist<T: Serialize>(&self, file: &str, value: &T) -> Result<(), CatalogError> {
        let path = self.state_dir.join(file);
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| CatalogError::Persist {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&path, &bytes).map_err(|source| CatalogError::Persist { path, source })
    }

    /// Pins `scope` at `value` (`"visible"` or a decimal id). Durable before
    /// it returns.
    pub fn set_pin(&self, scope: &PinScope, value: &str) -> Result<StateId, PinError> {
        let mut c = self.lock();
        let state = c.parse_state(value)?;
        let tree = c.versions.get(&state).ok_or(PinError::NotRetained(state))?;
        let mut pins = c.pins.clone();
        match scope {
            PinScope::Root => pins.root = Some(state),
            PinScope::Table { db, table } => {
                if tree.table(db, table).is_none() {
                    return Err(PinError::NoTableAtState(scope.label(), state));
                }
                pins.tables.insert(scope.label(), state);
            }
        }
        self.persist(PINS_FILE, &pins)
            .map_err(|e| PinError::Persist(e.to_string()))?;
        c.pins = pins;
        self.published.store(Arc::new(c.snapshot()));
        Ok(state)
    }

    /// Opens session `id` at `value` (`"visible"` or a decimal id of a
    /// retained state) for the leader in `hold` (its `state` is filled
    /// in here). Durable before it returns; returns the state.
    pub fn open_session(
        &self,
        id: &str,
        value: &str,
        mut hold: SessionHold,
    ) -> Result<StateId, PinError> {
        let mut c = self.lock();
        let state = c.parse_state(value)?;
        if !c.versions.contains_key(&state) {
            return Err(PinError::NotRetained(state));
        }
        hold.state = state;
        let mut pins = c.pins.clone();
        pins.sessions.insert(id.to_owned(), hold);
        self.persist(PINS_FILE, &pins)
            .map_err(|e| PinError::Persist(e.to_string()))?;
        c.pins = pins;
        self.published.store(Arc::new(c.snapshot()));
        Ok(state)
    }

    /// Ends session `id`; `Ok(false)` when there was none. Its state goes
    /// at the next commit unless something else keeps it.
    pub fn close_session(&self, id: &str) -> Result<bool, PinError> {
        let mut c = self.lock();
        if !c.pins.sessions.contains_key(id) {
            return Ok(false);
        }
        let mut pins = c.pins.clone();
        pins.sessions.remove(id);
        self.persist(PINS_FILE, &pins)
            .map_err(|e| PinError::Persist(e.to_string()))?;
        c.pins = pins;
        self.published.store(Arc::new(c.snapshot()));
        Ok(true)
    }

    /// Removes the pin of `scope`; `Ok(false)` when there was none.
    pub fn remove_pin(&self, scope: &PinScope) -> Result<bool, PinError> {
        let mut c = self.lock();
        let mut pins = c.pins.clone();
        let had = match scope {
            PinScope::Root => pins.root.take().is_some(),
            PinScope::Table { .. } => pins.tables.remove(&scope.label()).is_some(),
        };
        if !had {
            return Ok(false);
        }
        self.persist(PINS_FILE, &pins)
            .map_err(|e| PinError::Persist(e.to_string()))?;
        c.pins = pins;
        // Versions that were kept only for this pin go at the next commit.
        self.published.store(Arc::new(c.snapshot()));
        Ok(true)
    }
}

impl Control {
    /// A pin or session value: `visible` or a decimal state-id.
    fn parse_state(&self, value: &str) -> Result<StateId, PinError> {
        let value = value.trim_end_matches(['\n', '\0']).trim();
        if value == "visible" {
            Ok(self.visible.state_id)
        } else if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
            Ok(StateId(value.parse().map_err(|_| PinError::BadValue)?))
        } else {
            Err(PinError::BadValue)
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            visible: Arc::clone(&self.visible),
            versions: self.versions.clone(),
            pins: self.pins.clone(),
        }
    }
}

/// The states to drop: all but the newest `retain` committed states, the
/// visible one and every pinned one.
fn retention(
    versions: &BTreeMap<StateId, Arc<Tree>>,
    pins: &Pins,
    visible: StateId,
    retain: usize,
) -> Vec<StateId> {
    let pinned: Vec<StateId> = pins.states().collect();
    // State 0 (before any event) is not a source state worth browsing once
    // a real one is visible.
    let empty = (visible > StateId(0)
        && versions.contains_key(&StateId(0))
        && !pinned.contains(&StateId(0)))
    .then_some(StateId(0));
    let mut dropped: Vec<StateId> = versions
        .keys()
        .rev()
        .filter(|s| !pinned.contains(s) && **s != StateId(0))
        .skip(retain)
        .filter(|&&s| s != visible)
        .copied()
        .collect();
    dropped.extend(empty);
    dropped
}

/// One state after the visible one, waiting for its files.
struct PendingState {
    tree: Arc<Tree>,
    added: Vec<AddedFile>,
    /// Directory prefix → new prefix for every table (`db/table`) or
    /// partition (`db/table/k=v…`) the event renamed, in order: files added
    /// before it now sit under the new name.
    renamed: Vec<(Vec<Name>, Vec<Name>)>,
    /// Whether the event can stop referencing files of earlier states
    /// (drops and overwrites); inserts and creates never do, so waiting
    /// files need no re-check there.
    may_unreference: bool,
}

/// A file a pending state waits for, at its path in that state.
struct Unresolved<'a> {
    dir: Vec<Name>,
    file: &'a AddedFile,
}

impl PendingState {
    /// Carries the waiting files into this state: follows a rename, adds
    /// this event's missing files, drops those it no longer references.
    fn carry<'a, S>(&'a self, unresolved: &mut Vec<Unresolved<'a>>, missing: &HashMap<BlobId, S>) {
        for (from, to) in &self.renamed {
            for u in unresolved.iter_mut() {
                if u.dir.starts_with(from) {
                    u.dir.splice(..from.len(), to.iter().cloned());
                }
            }
        }
        unresolved.extend(
            self.added
                .iter()
                .filter(|f| missing.contains_key(&f.blob))
                .map(|f| Unresolved {
                    dir: f.dir.clone(),
                    file: f,
                }),
        );
        if self.may_unreference {
            unresolved.retain(|u| still_references(&self.tree, &u.dir, &u.file.name, u.file.blob));
        }
    }
}

/// Where a missing blob can be read from: one [`FileRef`] per distinct
/// source place among the file entries of pending states that name it.
#[derive(Debug, Default)]
struct Sources {
    files: Vec<FileRef>,
    /// `(path, name, cm_path)` of each of `files` (what `candidate_places`
    /// looks at), with how many pending entries name it.
    places: HashMap<Place, u32>,
    /// Where the next attempt starts (attempts rotate through `files`).
    next: usize,
}

type Place = (String, String, Option<String>);

fn place_of(file: &FileRef) -> Place {
    (file.path.clone(), file.name.clone(), file.cm_path.clone())
}

impl Sources {
    /// Counts one more entry naming `file`'s place; true when the place is
    /// new.
    fn add(&mut self, file: &FileRef) -> bool {
        let count = self.places.entry(place_of(file)).or_insert(0);
        *count += 1;
        if *count > 1 {
            return false;
        }
        self.files.push(file.clone());
        true
    }

    /// One entry naming `file`'s place is gone (its state committed or no
    /// longer references it): the place stops being a source with its last
    /// entry, except the blob's last source, which stays while the blob is
    /// missing (it is abandoned once no entry names it at all).
    fn remove(&mut self, file: &FileRef) {
        let place = place_of(file);
        let Some(count) = self.places.get_mut(&place) else {
            return;
        };
        if *count > 1 {
            *count -= 1;
            return;
        }
        if self.files.len() <= 1 {
            return;
        }
        self.places.remove(&place);
        let at_place = |f: &FileRef| {
            (f.path.as_str(), f.name.as_str(), f.cm_path.as_deref())
                == (place.0.as_str(), place.1.as_str(), place.2.as_deref())
        };
        if let Some(i) = self.files.iter().position(at_place) {
            self.files.remove(i);
            if self.next > i {
                self.next -= 1;
            }
        }
    }
}

/// What the file entries of pending states reference, as GC needs it:
/// every entry's key ([`AddedFile::blob`]) with how many entries name it
/// and the resolution cell of one of them. A persistent map: the stager
/// hands GC a copy per batch in O(1), and it changes by the entries each
/// event adds and each commit or merge drops, never by a walk of the
/// pending trees (which share all but a few directories each, so a walk
/// costs the changed directories' entries once per state).
#[derive(Clone, Default)]
pub struct PendingRefs(imbl::HashMap<BlobId, EntryRefs>);

#[derive(Clone)]
struct EntryRefs {
    entries: u32,
    cell: Option<Arc<Resolution>>,
}

impl PendingRefs {
    /// The blob each referenced file has now, as [`FileNode::blob`] gives
    /// it: its content once known, else its key.
    pub fn blobs(&self) -> impl Iterator<Item = BlobId> + '_ {
        self.0.iter().map(|(key, r)| {
            r.cell
                .as_ref()
                .and_then(|c| c.get())
                .map_or(*key, |(blob, _)| blob)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn names(&self, key: &BlobId) -> bool {
        self.0.contains_key(key)
    }

    fn add(&mut self, f: &AddedFile) {
        match self.0.get_mut(&f.blob) {
            Some(r) => r.entries += 1,
            None => {
                self.0.insert(
                    f.blob,
                    EntryRefs {
                        entries: 1,
                        cell: f.resolution.clone(),
                    },
                );
            }
        }
    }

    /// One entry naming `f`'s key is gone; true when it was the last.
    fn remove(&mut self, f: &AddedFile) -> bool {
        let Some(r) = self.0.get_mut(&f.blob) else {
            return false;
        };
        r.entries = r.entries.saturating_sub(1);
        if r.entries > 0 {
            return false;
        }
        self.0.remove(&f.blob);
        true
    }
}

/// Most sources one fetch attempt tries (attempts rotate through the rest).
pub const SOURCES_PER_ATTEMPT: usize = 8;

/// The stager's half: states built from events but not yet committed.
pub struct Pending {
    latest: Arc<Tree>,
    states: VecDeque<PendingState>,
    /// Blobs referenced by pending states that are not staged yet, with
    /// where each can be read from.
    missing: HashMap<BlobId, Sources>,
    /// Most states kept one by one; see [`Pending::bounded`].
    max_states: usize,
    /// `added` length of the newest state at its last pruning (merged
    /// states only).
    pruned_at: usize,
    /// What the entries of `states` name (GC's view, [`Pending::refs`]).
    refs: PendingRefs,
    /// The newest state whose event may stop referencing earlier files:
    /// past it, a state that waits makes every later one wait.
    last_unreferencing: Option<StateId>,
    /// Missing blobs no entry names any more (a merge dropped the last
    /// one), returned by the next [`Pending::committed`].
    abandoned: Vec<BlobId>,
}

impl Pending {
    /// Starts after `latest` (the visible tree, at startup), keeping every
    /// state one by one.
    pub fn new(latest: Arc<Tree>) -> Pending {
        Pending::bounded(latest, usize::MAX)
    }

    /// Like [`Pending::new`], with at most `max_states` (at least 1)
    /// states waiting one by one. When that many wait, each further event
    /// is merged into the newest state instead of adding one: the newest
    /// state then stands for all of them (it becomes the merged run's last
    /// state), so only the last of a merged run can become visible, and
    /// its file list keeps only entries its tree still references. Memory
    /// stays bounded by `max_states` trees plus the newest state's files,
    /// however long a blocked state waits, and the events that would
    /// unblock it are still read.
    pub fn bounded(latest: Arc<Tree>, max_states: usize) -> Pending {
        Pending {
            latest,
            states: VecDeque::new(),
            missing: HashMap::new(),
            max_states: max_states.max(1),
            pruned_at: 0,
            refs: PendingRefs::default(),
            last_unreferencing: None,
            abandoned: Vec::new(),
        }
    }

    pub fn latest(&self) -> &Arc<Tree> {
        &self.latest
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Applies an event on top of the newest state. `is_staged` says whether
    /// an added file's content is already in the store; files that are not
    /// are returned, to be fetched, and block commits until
    /// [`Pending::staged`] is called with their [`AddedFile::blob`] key.
    /// A file whose blob is missing already is returned too when it is a
    /// new source for it (another path with the same content): the blob's
    /// next attempt should try it.
    pub fn apply(
        &mut self,
        event: &Event,
        is_staged: impl FnMut(&AddedFile) -> bool,
    ) -> Result<Vec<AddedFile>, ApplyError> {
        let (tree, added) = self.latest.apply(event)?;
        Ok(self.push_applied(event, Arc::new(tree), added, is_staged))
    }

    /// Like [`Pending::apply`] with the result of `Tree::apply` already at
    /// hand (ingest computed it to validate the event): `tree` must be the
    /// newest state's content after `event`.
    pub fn push_applied(
        &mut self,
        event: &Event,
        tree: Arc<Tree>,
        added: Vec<AddedFile>,
        mut is_staged: impl FnMut(&AddedFile) -> bool,
    ) -> Vec<AddedFile> {
        let mut to_fetch = Vec::new();
        for f in &added {
            self.refs.add(f);
            let new_source = match self.missing.get_mut(&f.blob) {
                Some(sources) => sources.add(&f.file),
                None if is_staged(f) => false,
                None => self.missing.entry(f.blob).or_default().add(&f.file),
            };
            if new_source {
                to_fetch.push(f.clone());
            }
        }
        self.latest = Arc::clone(&tree);
        use crate::event::Op;
        let renamed: Vec<(Vec<Name>, Vec<Name>)> = event
            .changes
            .iter()
            .filter_map(|c| match c.op {
                Op::RenameTable => Some((
                    vec![Name::from(c.db.as_str()), Name::from(c.table.as_str())],
                    vec![
                        Name::from(c.new_db.as_str()),
                        Name::from(c.new_table.as_str()),
                    ],
                )),
                Op::RenamePartition => {
                    // The table exists after the event (it applied); its
                    // keys give the partitions' directory names.
                    let table = tree.table(&c.db, &c.table)?;
                    let dir = |spec: &std::collections::BTreeMap<String, String>| {
                        let mut dir = vec![Name::from(c.db.as_str()), Name::from(c.table.as_str())];
                        dir.extend(crate::catalog::tree::partition_names(table, spec)?);
                        Some(dir)
                    };
                    Some((dir(c.partition.as_ref()?)?, dir(c.new_partition.as_ref()?)?))
                }
                _ => None,
            })
            .collect();
        let may_unreference = event.changes.iter().any(|c| {
            matches!(
                c.op,
                Op::DropDatabase
                    | Op::DropTable
                    | Op::DropPartition
                    | Op::ReplaceFiles
                    | Op::TruncateTable
            )
        });
        if may_unreference {
            self.last_unreferencing = Some(tree.state_id);
        }
        if self.states.len() >= self.max_states {
            self.merge_into_newest(tree, added, renamed, may_unreference);
        } else {
            self.pruned_at = 0;
            self.states.push_back(PendingState {
                tree,
                added,
                renamed,
                may_unreference,
            });
        }
        to_fetch
    }

    /// Makes the newest state stand for one more event (the bound of
    /// [`Pending::bounded`] is reached): what `carry` would do across the
    /// two states, done once here. Its earlier files move with the
    /// event's renames; the incoming waits get every rename in order.
    fn merge_into_newest(
        &mut self,
        tree: Arc<Tree>,
        added: Vec<AddedFile>,
        renamed: Vec<(Vec<Name>, Vec<Name>)>,
        may_unreference: bool,
    ) {
        let Some(newest) = self.states.back_mut() else {
            return;
        };
        for (from, to) in &renamed {
            for f in newest.added.iter_mut() {
                if f.dir.starts_with(from) {
                    f.dir.splice(..from.len(), to.iter().cloned());
                }
            }
        }
        newest.added.extend(added);
        newest.renamed.extend(renamed);
        newest.may_unreference |= may_unreference;
        newest.tree = tree;
        // Entries the merged state no longer references wait for nothing:
        // drop them whenever the list has doubled, so it stays within
        // twice the files the newest tree holds, in amortised linear time.
        if newest.added.len() > 2 * self.pruned_at.max(1024) {
            let tree = Arc::clone(&newest.tree);
            let (refs, missing, abandoned) =
                (&mut self.refs, &mut self.missing, &mut self.abandoned);
            newest.added.retain(|f| {
                let keep = still_references(&tree, &f.dir, &f.name, f.blob);
                if !keep {
                    forget_entry(f, refs, missing, abandoned);
                }
                keep
            });
            self.pruned_at = newest.added.len();
        }
    }

    /// A blob is now staged (or will be made durable before the next commit).
    pub fn staged(&mut self, blob: &BlobId) {
        self.missing.remove(blob);
    }

    /// A blob thought staged was lost before it became durable: states that
    /// reference it wait for it again, and it is read again from any of
    /// their entries naming it (or from `read_from`, the file it came from).
    pub fn unstaged(&mut self, blob: BlobId, read_from: &FileRef) {
        if !self.refs.names(&blob) {
            // Nothing waits for it (its states committed meanwhile).
            self.abandoned.push(blob);
            return;
        }
        let mut sources = Sources::default();
        for f in self.states.iter().flat_map(|s| s.added.iter()) {
            if f.blob == blob {
                sources.add(&f.file);
            }
        }
        sources.add(read_from);
        self.missing.insert(blob, sources);
    }

    /// Blobs still missing.
    pub fn missing(&self) -> impl Iterator<Item = &BlobId> {
        self.missing.keys()
    }

    pub fn is_missing(&self, blob: &BlobId) -> bool {
        self.missing.contains_key(blob)
    }

    /// The sources the next attempt to read `blob` tries: up to
    /// [`SOURCES_PER_ATTEMPT`] of them, starting where the last attempt
    /// stopped, so every source is tried in turn. Empty when the blob is
    /// not missing.
    pub fn next_sources(&mut self, blob: &BlobId) -> Vec<FileRef> {
        let Some(s) = self.missing.get_mut(blob) else {
            return Vec::new();
        };
        let n = s.files.len().min(SOURCES_PER_ATTEMPT);
        let start = s.next % s.files.len().max(1);
        let out = (0..n)
            .map(|i| s.files[(start + i) % s.files.len()].clone())
            .collect();
        s.next = (start + n) % s.files.len().max(1);
        out
    }

    /// Makes the next attempt for `blob` start at its newest source (one
    /// just added is the likeliest to be there).
    pub fn try_newest_source_next(&mut self, blob: &BlobId) {
        if let Some(s) = self.missing.get_mut(blob) {
            s.next = s.files.len().saturating_sub(1);
        }
    }

    /// The commit rule: the newest pending state all of whose blobs are
    /// staged. A missing blob blocks every state that still references it
    /// (through any entry), and no state after it is dropped.
    pub fn newest_complete(&self) -> Option<Arc<Tree>> {
        if self.missing.is_empty() {
            return self.states.back().map(|s| Arc::clone(&s.tree));
        }
        let mut unresolved = Vec::new();
        let mut best = None;
        for state in &self.states {
            state.carry(&mut unresolved, &self.missing);
            if unresolved.is_empty() {
                best = Some(&state.tree);
            } else if self
                .last_unreferencing
                .is_none_or(|last| state.tree.state_id >= last)
            {
                // No later event drops a file: whatever waits here waits
                // in every later state too.
                break;
            }
        }
        best.cloned()
    }

    /// The oldest pending state that cannot commit and the first missing
    /// file it waits for (for the status `stalled` field).
    pub fn first_blocked(&self) -> Option<(StateId, &AddedFile)> {
        let mut unresolved = Vec::new();
        for state in &self.states {
            state.carry(&mut unresolved, &self.missing);
            if let Some(u) = unresolved.first() {
                return Some((state.tree.state_id, u.file));
            }
        }
        None
    }

    /// Forgets every pending state up to and including `state` (it was
    /// committed). Each missing blob keeps as sources only the entries of
    /// the states still pending; those no later state references are
    /// dropped from the missing set and returned, so their fetches can stop.
    pub fn committed(&mut self, state: StateId) -> Vec<BlobId> {
        while self
            .states
            .front()
            .is_some_and(|s| s.tree.state_id <= state)
        {
            if let Some(s) = self.states.pop_front() {
                for f in &s.added {
                    forget_entry(f, &mut self.refs, &mut self.missing, &mut self.abandoned);
                }
            }
        }
        if self.states.is_empty() {
            self.pruned_at = 0;
        }
        let mut abandoned = std::mem::take(&mut self.abandoned);
        // One abandoned at a merge may be wanted again by a later event.
        abandoned.retain(|b| !self.missing.contains_key(b));
        abandoned
    }

    /// What the pending states' entries reference (GC keeps their blobs):
    /// a copy that costs nothing to take.
    pub fn refs(&self) -> &PendingRefs {
        &self.refs
    }

    /// Every tree still pending, oldest first.
    pub fn trees(&self) -> impl Iterator<Item = &Arc<Tree>> {
        self.states.iter().map(|s| &s.tree)
    }
}

/// The pending entry `f` is gone: it stops counting as a reference and as
/// a source of its blob, and a missing blob no entry names any more is
/// abandoned (nothing waits for it).
fn forget_entry(
    f: &AddedFile,
    refs: &mut PendingRefs,
    missing: &mut HashMap<BlobId, Sources>,
    abandoned: &mut Vec<BlobId>,
) {
    let last = refs.remove(f);
    if let Some(sources) = missing.get_mut(&f.blob) {
        if last {
            missing.remove(&f.blob);
            abandoned.push(f.blob);
        } else {
            sources.remove(&f.file);
        }
    }
}

/// Whether `tree` has, at `dir`/`name`, the file of key `blob`.
fn still_references(tree: &Tree, dir: &[Name], name: &Name, blob: BlobId) -> bool {
    match tree.lookup(dir, name) {
        Some(Node::File(node)) => node.key() == blob,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
