//! The publisher: after each commit, writes the newest visible state to
//! the storage at `--publish URL` (it may skip states), in the order
//! that never exposes a partial one:
//!
//! 1. every blob the state's new directories name (large files as
//!    pieces, then their piece list), each verified against its sha256
//!    as it is read from the local blob store, written create-only;
//! 2. the catalog object of every directory that changed, children
//!    before parents, create-only;
//! 3. `states/<id>`, create-only;
//! 4. `HEAD`, replaced by a conditional write of the version read last
//!    (create-only for the first), so a second publisher, or any other
//!    writer, is refused instead of overwritten.
//!
//! A publisher killed at any point leaves HEAD naming a state whose every
//! object was written before it. Restarted, it reads HEAD: one written by
//! another publisher (another state folder) stops the start with a clear
//! error; its own tells it what is published, whose catalog it loads to
//! learn which blobs and catalogs the storage holds, and it goes on with
//! the next visible state, never backwards.
//!
//! Directory objects are encoded once per node: nodes are immutable and
//! shared between versions, so a node seen before has the same object
//! (`dir_ids`, by node id, dropped once no tree holds the node).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::catalog_object::{verified_label, DirObject, Entry, FileEntry};
use super::gc::{Collector, GcConfig, GcReport};
use super::layout::{self, PIECE_SIZE};
use super::load::{get_record, LoadError, Loader};
use super::pieces::PieceList;
use super::record::{self, Published, PublisherId, RecordKind};
use super::store::{open_store, StoreUrlError};
use crate::catalog::{DirNode, Node, NodeId, Tree};
use crate::event::{BlobId, StateId};

/// Where a state folder keeps the identity it publishes under.
pub const PUBLISHER_ID_FILE: &str = "publisher-id";

/// The newest visible tree, as the catalog has it now.
pub type VisibleFn = Arc<dyn Fn() -> Arc<Tree> + Send + Sync>;
/// The local path of a staged blob.
pub type BlobPathFn = Arc<dyn Fn(&BlobId) -> PathBuf + Send + Sync>;
/// The trees this host's pins and `stagefs run` sessions hold: published
/// (without moving HEAD) and kept at the URL while held.
pub type HeldFn = Arc<dyn Fn() -> Vec<Arc<Tree>> + Send + Sync>;

pub struct PublishConfig {
    pub url: String,
    pub signing_key: Option<SigningKey>,
    /// The state folder: holds the publisher's identity.
    pub state_dir: PathBuf,
    /// Retention and collection at the URL.
    pub gc: GcConfig,
    pub held: Option<HeldFn>,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    #[error(
        "{url} is published by another publisher ({other}; this one is {me}): \
         a second publisher on one URL is refused"
    )]
    SecondPublisher {
        url: String,
        other: PublisherId,
        me: PublisherId,
    },
    #[error("the publisher identity {path}: {detail}")]
    Identity { path: PathBuf, detail: String },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("writing {object}: {source}")]
    Write {
        object: String,
        source: object_store::Error,
    },
    #[error("the staged copy of {blob}: {detail}")]
    Blob { blob: String, detail: String },
    #[error("HEAD changed under this publisher; reading it again")]
    HeadMoved,
    #[error(
        "states/{state} at the URL names another catalog than this state folder's state {state}"
    )]
    Diverged { state: u64 },
    #[error("a file's verification {0:?} cannot be published")]
    Verified(String),
}

impl PublishError {
    /// Errors that retrying cannot cure: publishing stops.
    pub fn is_fatal(&self) -> bool {
        match self {
            PublishError::Url(_)
            | PublishError::SecondPublisher { .. }
            | PublishError::Identity { .. }
            | PublishError::Diverged { .. }
            | PublishError::Verified(_) => true,
            PublishError::Load(_)
            | PublishError::Write { .. }
            | PublishError::Blob { .. }
            | PublishError::HeadMoved => false,
        }
    }

    /// Why, in one word (the `reason` label of the metrics).
    pub fn reason(&self) -> &'static str {
        match self {
            PublishError::Url(_) => "url",
            PublishError::SecondPublisher { .. } => "second_publisher",
            PublishError::Identity { .. } => "identity",
            PublishError::Load(LoadError::Store { .. }) | PublishError::Write { .. } => {
                "unreachable"
            }
            PublishError::Load(LoadError::Missing { .. }) => "missing",
            PublishError::Load(LoadError::Corrupt { .. }) => "corrupt",
            PublishError::Blob { .. } => "local_blob",
            PublishError::HeadMoved => "head_moved",
            PublishError::Diverged { .. } => "diverged",
            PublishError::Verified(_) => "verification",
        }
    }
}

/// Every [`PublishError::reason`], in the order metrics list them.
pub const PUBLISH_FAILURE_REASONS: [&str; 10] = [
    "unreachable",
    "missing",
    "corrupt",
    "local_blob",
    "head_moved",
    "second_publisher",
    "diverged",
    "identity",
    "url",
    "verification",
];

/// What the publisher did so far (status, tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    pub url: String,
    /// The state HEAD names, once known.
    pub published: Option<StateId>,
    /// When HEAD was last written, ms since the epoch.
    pub published_ms: Option<i64>,
    /// Why the last attempt failed (cleared by a success).
    pub error: Option<String>,
    /// Publishing stopped for good (`error` says why).
    pub fatal: bool,
    pub states: u64,
    pub objects_written: u64,
    pub bytes_written: u64,
    /// Failed attempts (each retried unless fatal), by
    /// [`PublishError::reason`].
    pub failures: BTreeMap<&'static str, u64>,
    pub gc: GcReport,
}

/// Reads a running publisher's report (metrics, status), also after the
/// [`Publisher`] handle moved elsewhere.
#[derive(Clone)]
pub struct PublishProbe(Arc<Mutex<PublishReport>>);

impl PublishProbe {
    pub fn read(&self) -> PublishReport {
        lock(&self.0).clone()
    }
}

/// The running publisher thread.
pub struct Publisher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    report: Arc<Mutex<PublishReport>>,
}

impl Publisher {
    /// Opens the storage and reads its HEAD (a second publisher is refused
    /// here, before anything is written), then publishes every newer
    /// visible state on a thread of its own until [`Publisher::stop`].
    pub fn start(
        cfg: PublishConfig,
        visible: VisibleFn,
        blob_path: BlobPathFn,
    ) -> Result<Publisher, PublishError> {
        let store = open_store(&cfg.url)?;
        let me = publisher_id(&cfg.state_dir)?;
        let report = Arc::new(Mutex::new(PublishReport {
            url: cfg.url.clone(),
            ..PublishReport::default()
        }));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PublishError::Identity {
                path: cfg.state_dir.clone(),
                detail: format!("starting the publisher's runtime: {e}"),
            })?;
        let mut session = Session {
            store,
            url: cfg.url,
            key: cfg.signing_key,
            me,
            head_version: None,
            published: None,
            dir_ids: HashMap::new(),
            uploaded: HashMap::new(),
            catalogs: HashSet::new(),
            blob_path,
            report: Arc::clone(&report),
            since_prune: 0,
            gc: cfg.gc,
            collector: Collector::new(),
            last_gc: None,
            held: cfg.held,
            held_published: HashSet::new(),
        };
        rt.block_on(session.resume())?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("stagefs-publish".into())
                .spawn(move || session.run(&rt, &*visible, &stop))
                .map_err(|e| PublishError::Identity {
                    path: cfg.state_dir.clone(),
                    detail: format!("starting the publisher thread: {e}"),
                })?
        };
        Ok(Publisher {
            stop,
            thread: Some(thread),
            report,
        })
    }

    pub fn report(&self) -> PublishReport {
        lock(&self.report).clone()
    }

    pub fn probe(&self) -> PublishProbe {
        PublishProbe(Arc::clone(&self.report))
    }

    /// True once publishing stopped for good (see the report's `error`).
    pub fn failed(&self) -> bool {
        lock(&self.report).fatal
    }

    /// Stops the thread after the step it is in (an interrupted state is
    /// left as a killed publisher leaves it: HEAD unchanged).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                warn!("the publisher thread panicked");
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The state folder's publisher identity, created on first use.
pub fn publisher_id(state_dir: &FsPath) -> Result<PublisherId, PublishError> {
    let path = state_dir.join(PUBLISHER_ID_FILE);
    let err = |detail: String| PublishError::Identity {
        path: path.clone(),
        detail,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => PublisherId::from_hex(text.trim_end())
            .ok_or_else(|| err("not 32 lower-case hex digits".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = PublisherId(super::keys::random_bytes().map_err(|e| err(e.to_string()))?);
            crate::durable::write_atomic(&path, format!("{id}\n").as_bytes())
                .map_err(|e| err(e.to_string()))?;
            Ok(id)
        }
        Err(e) => Err(err(e.to_string())),
    }
}

struct Session {
    store: Arc<dyn ObjectStore>,
    url: String,
    key: Option<SigningKey>,
    me: PublisherId,
    /// The version of HEAD last read or written (None: there is none).
    head_version: Option<UpdateVersion>,
    published: Option<StateId>,
    /// The catalog object of every directory node published (alive).
    dir_ids: HashMap<NodeId, (Weak<DirNode>, BlobId)>,
    /// File contents at the URL: sha256 → its piece list (large files).
    uploaded: HashMap<BlobId, Option<BlobId>>,
    /// Catalog objects at the URL.
    catalogs: HashSet<BlobId>,
    blob_path: BlobPathFn,
    report: Arc<Mutex<PublishReport>>,
    since_prune: u32,
    gc: GcConfig,
    collector: Collector,
    last_gc: Option<std::time::Instant>,
    held: Option<HeldFn>,
    /// Held states written to `states/` (HEAD unmoved) since the start.
    held_published: HashSet<StateId>,
}

fn put_opts(mode: PutMode) -> PutOptions {
    PutOptions {
        mode,
        ..PutOptions::default()
    }
}

impl Session {
    /// Reads HEAD: refuses another publisher's, and learns from our own
    /// what the storage already holds.
    async fn resume(&mut self) -> Result<(), PublishError> {
        let head = layout::head();
        let got = match self.store.get(&head).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                info!(url = %self.url, "publishing to a new URL");
                return Ok(());
            }
            Err(source) => {
                return Err(PublishError::Load(LoadError::Store {
                    object: head.to_string(),
                    source,
                }))
            }
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let decoded = get_record(&*self.store, &head, RecordKind::Head, None).await?;
        let p = decoded.published;
        if p.publisher != self.me {
            return Err(PublishError::SecondPublisher {
                url: self.url.clone(),
                other: p.publisher,
                me: self.me,
            });
        }
        self.head_version = Some(version);
        self.published = Some(p.state_id);
        {
            let mut r = lock(&self.report);
            r.published = Some(p.state_id);
            r.published_ms = Some(p.published_ms);
        }
        // What the published state holds need not be written again.
        let mut loader = Loader::new();
        match loader
            .load(&*self.store, p.state_id, p.time_ms, p.root)
            .await
        {
            Ok(tree) => {
                tree.for_each_file(&mut |f| {
                    self.uploaded.insert(f.blob(), loader.pieces_of(&f.blob()));
                });
                self.catalogs.extend(loader.object_ids());
                info!(url = %self.url, state = p.state_id.0, "resuming publishing");
            }
            Err(e) => {
                warn!(url = %self.url, "the published state {} does not load ({e}); every object is written again", p.state_id.0)
            }
        }
        Ok(())
    }

    fn run(
        &mut self,
        rt: &tokio::runtime::Runtime,
        visible: &dyn Fn() -> Arc<Tree>,
        stop: &AtomicBool,
    ) {
        let mut backoff = Duration::from_millis(100);
        while !stop.load(Ordering::Relaxed) {
            let tree = visible();
            let newer = tree.state_id.0 > 0 && self.published.is_none_or(|p| tree.state_id > p);
            if newer {
                match rt.block_on(self.publish(&tree, stop)) {
                    Ok(()) => backoff = Duration::from_millis(100),
                    Err(e) => {
                        let fatal = e.is_fatal();
                        {
                            let mut r = lock(&self.report);
                            r.error = Some(e.to_string());
                            r.fatal = fatal;
                            *r.failures.entry(e.reason()).or_default() += 1;
                        }
                        if fatal {
                            tracing::error!(url = %self.url, "publishing stopped: {e}");
                            return;
                        }
                        warn!(url = %self.url, state = tree.state_id.0, "publishing failed, retrying in {backoff:?}: {e}");
                        sleep_unless(stop, backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                        continue;
                    }
                }
            }
            if let Err(e) = rt.block_on(self.publish_held(stop)) {
                warn!(url = %self.url, "publishing a held state: {e}");
            }
            if self.published.is_some()
                && self
                    .last_gc
                    .is_none_or(|t| t.elapsed() >= self.gc.interval())
            {
                self.last_gc = Some(std::time::Instant::now());
                rt.block_on(self.collect_garbage());
            }
            // A commit is published within ~10 ms (a cheap check of the
            // visible tree; readers' follow latency adds to it).
            sleep_unless(stop, Duration::from_millis(10));
        }
    }

    /// Writes every state this host's pins and sessions hold to
    /// `states/<id>` (HEAD stays), so jobs on other hosts can read it and
    /// collection keeps it.
    async fn publish_held(&mut self, stop: &AtomicBool) -> Result<(), PublishError> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        for tree in held() {
            if tree.state_id.0 == 0 || self.held_published.contains(&tree.state_id) {
                continue;
            }
            if self.publish_state(&tree, stop).await?.is_some() {
                self.held_published.insert(tree.state_id);
            }
        }
        Ok(())
    }

    /// One collection at the URL (see `gc`); afterwards the publisher
    /// trusts only what the kept states reach to be there.
    async fn collect_garbage(&mut self) {
        let held: Vec<StateId> = self
            .held
            .as_ref()
            .map(|h| h().iter().map(|t| t.state_id).collect())
            .unwrap_or_default();
        let mut report = lock(&self.report).gc.clone();
        let result = self
            .collector
            .run(&*self.store, self.published, &held, &self.gc, &mut report)
            .await;
        match result {
            Ok(kept) => {
                self.uploaded.retain(|sha, list| match list {
                    Some(l) => kept.pieces.contains(l),
                    None => kept.blobs.contains(sha),
                });
                self.catalogs.retain(|id| kept.catalogs.contains(id));
                self.dir_ids.retain(|_, (_, id)| kept.catalogs.contains(id));
                self.held_published.retain(|s| held.contains(s));
            }
            Err(e) => {
                warn!(url = %self.url, "garbage collection at the URL failed (nothing more deleted this run): {e}");
                report.last_error = Some(e.to_string());
            }
        }
        lock(&self.report).gc = report;
    }

    /// Publishes `tree`: blobs, catalogs, state object, HEAD.
    async fn publish(&mut self, tree: &Tree, stop: &AtomicBool) -> Result<(), PublishError> {
        let Some(published) = self.publish_state(tree, stop).await? else {
            return Ok(());
        };
        self.put_head(&published).await?;
        self.since_prune += 1;
        if self.since_prune >= 64 {
            self.since_prune = 0;
            self.dir_ids.retain(|_, (w, _)| w.strong_count() > 0);
        }
        Ok(())
    }

    /// Writes `tree`'s blobs, catalogs and state object (None: stopped).
    async fn publish_state(
        &mut self,
        tree: &Tree,
        stop: &AtomicBool,
    ) -> Result<Option<Published>, PublishError> {
        // New directories, children before parents.
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        self.collect(&tree.root, &mut order, &mut seen);
        for dir in &order {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let obj = self.dir_object(dir).await?;
            let bytes = obj.encode();
            let id = layout::content_id(&bytes);
            if !self.catalogs.contains(&id) {
                self.put_immutable(&layout::catalog(&id), bytes).await?;
                self.catalogs.insert(id);
            }
            self.dir_ids.insert(dir.meta.id, (Arc::downgrade(dir), id));
        }
        let root = self.dir_ids[&tree.root.meta.id].1;
        let published = Published {
            state_id: tree.state_id,
            root,
            time_ms: tree.time_ms,
            publisher: self.me,
            published_ms: now_ms(),
        };
        self.put_state(&published).await?;
        Ok(Some(published))
    }

    fn collect(&self, dir: &Arc<DirNode>, out: &mut Vec<Arc<DirNode>>, seen: &mut HashSet<NodeId>) {
        if self.dir_ids.contains_key(&dir.meta.id) || !seen.insert(dir.meta.id) {
            return;
        }
        for child in dir.children.values() {
            if let Node::Dir(d) = child {
                self.collect(d, out, seen);
            }
        }
        out.push(Arc::clone(dir));
    }

    async fn dir_object(&mut self, dir: &DirNode) -> Result<DirObject, PublishError> {
        let mut entries = Vec::with_capacity(dir.children.len());
        for (name, child) in dir.children.iter() {
            let entry = match child {
                Node::Dir(d) => Entry::Dir(self.dir_ids[&d.meta.id].1),
                Node::File(f) => {
                    let sha = f.blob();
                    let pieces = self.upload_blob(&sha, f.size()).await?;
                    let verified = verified_label(f.verified)
                        .ok_or_else(|| PublishError::Verified(f.verified.to_owned()))?;
                    Entry::File(FileEntry {
                        state_id: f.meta.state_id,
                        time_ms: f.meta.time_ms,
                        size: f.size(),
                        sha256: sha,
                        key: f.resolved_key(),
                        pieces,
                        verified,
                        source: f.source.clone(),
                    })
                }
            };
            entries.push((name.clone(), entry));
        }
        Ok(DirObject {
            kind: dir.kind.clone(),
            state_id: dir.meta.state_id,
            time_ms: dir.meta.time_ms,
            entries,
        })
    }

    /// Writes the content `sha` (a blob, or pieces and their list) unless
    /// the storage holds it; returns its piece list.
    async fn upload_blob(
        &mut self,
        sha: &BlobId,
        size: u64,
    ) -> Result<Option<BlobId>, PublishError> {
        if let Some(p) = self.uploaded.get(sha) {
            return Ok(*p);
        }
        let path = (self.blob_path)(sha);
        let blob_err = |detail: String| PublishError::Blob {
            blob: sha.to_hex(),
            detail,
        };
        let mut file =
            std::fs::File::open(&path).map_err(|e| blob_err(format!("{}: {e}", path.display())))?;
        let mut whole = Sha256::new();
        let mut pieces = Vec::new();
        let mut total = 0u64;
        loop {
            let mut buf = Vec::with_capacity(PIECE_SIZE.min(size.max(1)) as usize);
            (&mut file)
                .take(PIECE_SIZE)
                .read_to_end(&mut buf)
                .map_err(|e| blob_err(format!("{}: {e}", path.display())))?;
            total += buf.len() as u64;
            if total > size {
                return Err(blob_err(format!("longer than its {size} bytes")));
            }
            whole.update(&buf);
            if size <= PIECE_SIZE {
                if BlobId(whole.finalize().into()) != *sha || total != size {
                    return Err(blob_err("its content does not match its sha256".into()));
                }
                self.put_immutable(&layout::blob(sha), buf).await?;
                self.uploaded.insert(*sha, None);
                return Ok(None);
            }
            if buf.is_empty() {
                break;
            }
            let piece = layout::content_id(&buf);
            self.put_immutable(&layout::blob(&piece), buf).await?;
            pieces.push(piece);
        }
        if BlobId(whole.finalize().into()) != *sha || total != size {
            return Err(blob_err("its content does not match its sha256".into()));
        }
        let list = PieceList {
            size,
            piece_size: PIECE_SIZE as u32,
            pieces,
        }
        .encode();
        let list_id = layout::content_id(&list);
        self.put_immutable(&layout::pieces(&list_id), list).await?;
        self.uploaded.insert(*sha, Some(list_id));
        Ok(Some(list_id))
    }

    /// A create-only write of an object named by its content: one that is
    /// there already has these bytes.
    async fn put_immutable(
        &self,
        path: &object_store::path::Path,
        bytes: Vec<u8>,
    ) -> Result<(), PublishError> {
        let len = bytes.len() as u64;
        match self
            .store
            .put_opts(path, PutPayload::from(bytes), put_opts(PutMode::Create))
            .await
        {
            Ok(_) => {
                let mut r = lock(&self.report);
                r.objects_written += 1;
                r.bytes_written += len;
                Ok(())
            }
            Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(source) => Err(PublishError::Write {
                object: path.to_string(),
                source,
            }),
        }
    }

    async fn put_state(&self, p: &Published) -> Result<(), PublishError> {
        let path = layout::state(p.state_id);
        let bytes = record::encode(RecordKind::State, p, self.key.as_ref());
        match self
            .store
            .put_opts(&path, PutPayload::from(bytes), put_opts(PutMode::Create))
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Written before a crash, or by someone else.
                let there = get_record(&*self.store, &path, RecordKind::State, None).await?;
                let q = there.published;
                if q.publisher != self.me {
                    Err(PublishError::SecondPublisher {
                        url: self.url.clone(),
                        other: q.publisher,
                        me: self.me,
                    })
                } else if q.root != p.root {
                    Err(PublishError::Diverged {
                        state: p.state_id.0,
                    })
                } else {
                    Ok(())
                }
            }
            Err(source) => Err(PublishError::Write {
                object: path.to_string(),
                source,
            }),
        }
    }

    async fn put_head(&mut self, p: &Published) -> Result<(), PublishError> {
        let head = layout::head();
        let bytes = record::encode(RecordKind::Head, p, self.key.as_ref());
        let mode = match &self.head_version {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v.clone()),
        };
        match self
            .store
            .put_opts(&head, PutPayload::from(bytes), put_opts(mode))
            .await
        {
            Ok(r) => {
                self.head_version = Some(UpdateVersion {
                    e_tag: r.e_tag,
                    version: r.version,
                });
                self.published = Some(p.state_id);
                let mut r = lock(&self.report);
                r.published = Some(p.state_id);
                r.published_ms = Some(p.published_ms);
                r.states += 1;
                r.error = None;
                Ok(())
            }
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                // Someone wrote HEAD since we read it: another publisher
                // is refused; our own earlier write (an answer lost) is
                // taken as the version to replace next.
                self.head_version = None;
                self.resume().await?;
                Err(PublishError::HeadMoved)
            }
            Err(source) => Err(PublishError::Write {
                object: head.to_string(),
                source,
            }),
        }
    }
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = std::time::Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}
