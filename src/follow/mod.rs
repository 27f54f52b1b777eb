//! A reader host (`stagefs mount MNT --from URL --cache DIR`, SPEC §8):
//! follows the states a publisher writes to shared storage and serves
//! them through the same catalog and view as a replicating mount (views,
//! pins, sessions, snapshots, xattrs), with file content fetched on
//! demand into a bounded cache ([`cache`]).
//!
//! The follower thread polls HEAD every `--poll-ms`, verifies it (with
//! `--trusted-key`, its signature), loads a newer state's catalog
//! ([`crate::publish::load`]: only the directory objects it does not hold
//! yet) and commits it to the catalog, whose durable commit record in the
//! cache folder is the ratchet: the visible state never goes back, across
//! restarts too, and a HEAD behind it is refused with a status reason. A
//! state becomes visible only once its whole catalog is loaded; bytes come
//! later, verified. Catalog objects and state records are kept in the
//! cache folder, so a host restarted while the storage is unreachable
//! serves the states it had.

pub mod cache;
pub mod warm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ed25519_dalek::VerifyingKey;
use object_store::ObjectStore;
use serde_json::json;
use tracing::{debug, info, warn};

use crate::catalog::{load_durable, Catalog, Tree};
use crate::event::{BlobId, StateId};
use crate::publish::layout;
use crate::publish::load::{get_bounded, get_record, Downloads, LoadError, Loader};
use crate::publish::record::{self, Published, RecordKind};
use crate::publish::store::{open_store, StoreUrlError};
use crate::state_lock::{lock_state, StateLock};
use crate::view::{FetchedBlobs, FetchedFile, StatusSource};
use cache::BlobCache;

pub struct FollowConfig {
    pub url: String,
    pub cache_dir: PathBuf,
    pub cache_size: u64,
    pub trusted_key: Option<VerifyingKey>,
    pub poll: Duration,
    /// Published states kept browsable under snapshots.
    pub retain: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    #[error("the cache folder {0}: {1}")]
    Cache(PathBuf, String),
    #[error("the cached state {state} cannot be loaded: {source}")]
    Cached { state: u64, source: LoadError },
}

/// What the follower knows of the publication (status).
#[derive(Debug, Clone, Default)]
struct HeadView {
    head: Option<Published>,
    /// When HEAD was last read successfully (ms since the epoch).
    read_ms: Option<i64>,
    /// Why the visible state is not the head's (null when it is).
    reason: Option<(StateId, String)>,
    /// That reason in one word (one of [`STALL_REASONS`]).
    reason_kind: Option<&'static str>,
    /// HEAD reads, and of those the ones that failed.
    polls: u64,
    poll_failures: u64,
    /// Stalls begun, by kind.
    stalls: BTreeMap<&'static str, u64>,
}

/// Why a reader host's visible state is not the head's, as the `reason`
/// label of `stagefs_stalled`: HEAD cannot be read (the storage does not
/// answer, or there is no HEAD), it does not decode or verify, it names
/// an older state than the visible one, the state it names does not load,
/// or committing it locally failed. The message is in status.
pub const STALL_REASONS: [&str; 6] = [
    "unreachable",
    "head_missing",
    "head_invalid",
    "head_went_back",
    "state_unloadable",
    "commit_failed",
];

fn load_error_kind(e: &LoadError) -> &'static str {
    match e {
        LoadError::Store { .. } => "unreachable",
        LoadError::Missing { .. } => "head_missing",
        LoadError::Corrupt { .. } => "head_invalid",
    }
}

pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    catalog: Arc<Catalog>,
    cache: Arc<BlobCache>,
    head: Arc<Mutex<HeadView>>,
    downloads: Arc<Downloads>,
    url: String,
    on_demand: Arc<OnDemand>,
    _rt: Arc<tokio::runtime::Runtime>,
    _lock: StateLock,
}

/// States this host does not retain, loaded from the URL when a snapshot
/// path or a job names one (SPEC §8: every state retained or leased at
/// the URL), kept while in use and for the newest few.
struct OnDemand {
    store: Arc<dyn ObjectStore>,
    cache_dir: PathBuf,
    trusted: Option<VerifyingKey>,
    cache: Arc<BlobCache>,
    rt: tokio::runtime::Handle,
    loader: Mutex<Loader>,
    trees: Mutex<BTreeMap<StateId, Arc<Tree>>>,
    /// States found missing, and when: not asked for again for a second.
    misses: Mutex<std::collections::HashMap<StateId, std::time::Instant>>,
}

/// On-demand states kept loaded at most.
const ON_DEMAND_KEPT: usize = 16;

impl OnDemand {
    fn get(&self, id: StateId) -> Option<Arc<Tree>> {
        if let Some(t) = lock(&self.trees).get(&id) {
            return Some(Arc::clone(t));
        }
        if lock(&self.misses)
            .get(&id)
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return None;
        }
        let mut loader = lock(&self.loader);
        // Another thread may have loaded it meanwhile.
        if let Some(t) = lock(&self.trees).get(&id) {
            return Some(Arc::clone(t));
        }
        let loaded = self.rt.block_on(load_state(
            &*self.store,
            &self.cache_dir,
            self.trusted.as_ref(),
            &mut loader,
            id,
        ));
        match loaded {
            Ok(tree) => {
                self.cache.add_piece_lists(loader.piece_lists());
                let tree = Arc::new(tree);
                let mut trees = lock(&self.trees);
                trees.insert(id, Arc::clone(&tree));
                while trees.len() > ON_DEMAND_KEPT {
                    trees.pop_first();
                }
                info!(state = id.0, "loaded on demand");
                Some(tree)
            }
            Err(e) => {
                info!(state = id.0, "state {id} is not available at the URL: {e}");
                lock(&self.misses).insert(id, std::time::Instant::now());
                None
            }
        }
    }
}

/// Catalog bytes a load must fetch for its freed memory to be handed back
/// at once ([`return_freed_memory`]).
const LARGE_LOAD_BYTES: u64 = 4 << 20;

/// Gives the memory a state's load freed back to the system now.
///
/// The binary allocates with mimalloc, which keeps a thread's freed pages
/// until that thread allocates again after a purge delay. The loading
/// thread then sleeps until the next poll, so the transient buffers of a
/// large load stayed resident: ~200 MiB after a 1,000,000-file state
/// (541 MiB resident against 333 MiB with this; docs/BENCHMARKS.md, "Many
/// hosts"). A collection visits the thread's whole heap (25 ms with that
/// state), so only large loads ask for one. Under another global
/// allocator (the tests) this only touches mimalloc's own, empty, heap.
fn return_freed_memory() {
    let t = std::time::Instant::now();
    // SAFETY: mi_collect has no preconditions: it frees this thread's
    // free pages and purges the arenas' unused memory.
    unsafe { libmimalloc_sys::mi_collect(true) };
    debug!(us = t.elapsed().as_micros() as u64, "freed memory returned");
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What a follower shares with its thread.
struct Shared {
    store: Arc<dyn ObjectStore>,
    cache_dir: PathBuf,
    trusted: Option<VerifyingKey>,
    catalog: Arc<Catalog>,
    cache: Arc<BlobCache>,
    head: Arc<Mutex<HeadView>>,
    loader: Loader,
}

impl Follower {
    /// Opens the cache folder (locked: one mount per cache), restores the
    /// states it served, and starts following `cfg.url`.
    pub fn start(cfg: FollowConfig) -> Result<Follower, FollowError> {
        let cache_err = |e: String| FollowError::Cache(cfg.cache_dir.clone(), e);
        let store = open_store(&cfg.url)?;
        std::fs::create_dir_all(cfg.cache_dir.join("catalogs"))
            .and_then(|_| std::fs::create_dir_all(cfg.cache_dir.join("states")))
            .map_err(|e| cache_err(e.to_string()))?;
        let state_lock = lock_state(&cfg.cache_dir).map_err(|e| cache_err(e.to_string()))?;
        let rt = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("stagefs-follow-io")
                .enable_all()
                .build()
                .map_err(|e| cache_err(e.to_string()))?,
        );
        let cache = Arc::new(
            BlobCache::open(
                &cfg.cache_dir,
                Arc::clone(&store),
                rt.handle().clone(),
                cfg.cache_size,
            )
            .map_err(|e| cache_err(e.to_string()))?,
        );
        let (record, pins) = load_durable(&cfg.cache_dir).map_err(|e| cache_err(e.to_string()))?;
        let downloads = Arc::new(Downloads::default());
        let mut loader = Loader::with_local_copies(&cfg.cache_dir.join("catalogs"))
            .counting_into(Arc::clone(&downloads));
        // The states this cache served: the visible one must load (from
        // the local copies, or the storage); the others are kept if they do.
        let mut versions = BTreeMap::new();
        let mut visible = Arc::new(Tree::empty());
        let mut wanted: Vec<StateId> = record.retained.clone();
        wanted.extend(pins.states());
        wanted.push(record.visible);
        wanted.sort();
        wanted.dedup();
        for id in wanted.into_iter().filter(|id| id.0 > 0) {
            let loaded = rt.block_on(load_state(
                &*store,
                &cfg.cache_dir,
                cfg.trusted_key.as_ref(),
                &mut loader,
                id,
            ));
            match loaded {
                Ok(tree) => {
                    let tree = Arc::new(tree);
                    if id == record.visible {
                        visible = Arc::clone(&tree);
                    }
                    versions.insert(id, tree);
                }
                Err(source) if id == record.visible => {
                    return Err(FollowError::Cached {
                        state: id.0,
                        source,
                    })
                }
                Err(e) => warn!("the cached state {id} is dropped: {e}"),
            }
        }
        cache.add_piece_lists(loader.piece_lists());
        if !versions.is_empty() {
            return_freed_memory();
        }
        info!(url = %cfg.url, visible = visible.state_id.0, "following");
        let catalog = Arc::new(Catalog::new(
            &cfg.cache_dir,
            visible,
            versions,
            pins,
            cfg.retain,
        ));
        let head = Arc::new(Mutex::new(HeadView::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let on_demand = Arc::new(OnDemand {
            store: Arc::clone(&store),
            cache_dir: cfg.cache_dir.clone(),
            trusted: cfg.trusted_key,
            cache: Arc::clone(&cache),
            rt: rt.handle().clone(),
            loader: Mutex::new(
                Loader::with_local_copies(&cfg.cache_dir.join("catalogs"))
                    .counting_into(Arc::clone(&downloads)),
            ),
            trees: Mutex::new(BTreeMap::new()),
            misses: Mutex::new(std::collections::HashMap::new()),
        });
        let mut shared = Shared {
            store,
            cache_dir: cfg.cache_dir.clone(),
            trusted: cfg.trusted_key,
            catalog: Arc::clone(&catalog),
            cache: Arc::clone(&cache),
            head: Arc::clone(&head),
            loader,
        };
        let thread = {
            let stop = Arc::clone(&stop);
            let rt = Arc::clone(&rt);
            let poll = cfg.poll;
            std::thread::Builder::new()
                .name("stagefs-follow".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        rt.block_on(shared.poll_once());
                        let end = std::time::Instant::now() + poll;
                        while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < end {
                            std::thread::sleep(Duration::from_millis(20).min(poll));
                        }
                    }
                })
                .map_err(|e| cache_err(e.to_string()))?
        };
        Ok(Follower {
            stop,
            thread: Some(thread),
            catalog,
            cache,
            head,
            downloads,
            url: cfg.url,
            on_demand,
            _rt: rt,
            _lock: state_lock,
        })
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The view's path of a blob: fetched into the cache first if needed.
    pub fn blob_path(&self) -> Arc<dyn Fn(&BlobId) -> PathBuf + Send + Sync> {
        let cache = Arc::clone(&self.cache);
        Arc::new(move |b: &BlobId| cache.path_for(b))
    }

    /// States this host does not retain, from the URL (for the view).
    pub fn state_source(&self) -> crate::view::StateSourceFn {
        let on_demand = Arc::clone(&self.on_demand);
        Arc::new(move |id| on_demand.get(id))
    }

    /// Large files read before they are whole, and `stagefs warm`.
    pub fn fetched_blobs(&self) -> Arc<dyn FetchedBlobs> {
        Arc::new(CacheBlobs(Arc::clone(&self.cache)))
    }

    /// The status JSON of the mount (SPEC §7 for a reader host).
    pub fn status_source(&self) -> Arc<dyn StatusSource> {
        Arc::new(FollowStatus {
            probe: self.probe(),
            url: self.url.clone(),
        })
    }

    /// What the metrics read at scrape time.
    pub fn probe(&self) -> FollowProbe {
        FollowProbe {
            catalog: Arc::clone(&self.catalog),
            cache: Arc::clone(&self.cache),
            head: Arc::clone(&self.head),
            downloads: Arc::clone(&self.downloads),
        }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                warn!("the follower thread panicked");
            }
        }
    }
}

/// Loads published state `id`: its record from the cache folder when
/// there (verified again), else from the storage (then kept).
async fn load_state(
    store: &dyn ObjectStore,
    cache_dir: &Path,
    trusted: Option<&VerifyingKey>,
    loader: &mut Loader,
    id: StateId,
) -> Result<Tree, LoadError> {
    let local = cache_dir.join("states").join(format!("{:020}", id.0));
    let path = layout::state(id);
    let bytes = match std::fs::read(&local) {
        Ok(b) => b,
        Err(_) => {
            let b = get_bounded(store, &path, record::MAX_RECORD_BYTES as u64)
                .await?
                .to_vec();
            loader.downloads().add(b.len() as u64);
            b
        }
    };
    let decoded =
        record::decode(RecordKind::State, &bytes, trusted).map_err(|e| LoadError::Corrupt {
            object: path.to_string(),
            detail: e.to_string(),
        })?;
    let p = decoded.published;
    if p.state_id != id {
        return Err(LoadError::Corrupt {
            object: path.to_string(),
            detail: format!("it names state {}", p.state_id),
        });
    }
    let tree = loader.load(store, p.state_id, p.time_ms, p.root).await?;
    if !local.exists() {
        if let Err(e) = crate::durable::write_atomic(&local, &bytes) {
            warn!("cannot keep a copy of {path}: {e}");
        }
    }
    Ok(tree)
}

impl Shared {
    fn stall(&self, state: StateId, kind: &'static str, reason: String) {
        let mut h = lock(&self.head);
        if h.reason.as_ref().map(|(_, r)| r) != Some(&reason) {
            warn!("{reason}");
        }
        if h.reason_kind != Some(kind) {
            *h.stalls.entry(kind).or_default() += 1;
        }
        h.reason = Some((state, reason));
        h.reason_kind = Some(kind);
    }

    fn unstall(&self) {
        let mut h = lock(&self.head);
        h.reason = None;
        h.reason_kind = None;
    }

    /// Reads HEAD once and moves the visible state to it when newer.
    async fn poll_once(&mut self) {
        let visible = self.catalog.snapshot().visible.state_id;
        lock(&self.head).polls += 1;
        let head = match get_record(
            &*self.store,
            &layout::head(),
            RecordKind::Head,
            self.trusted.as_ref(),
        )
        .await
        {
            Ok(d) => d.published,
            Err(e) => {
                lock(&self.head).poll_failures += 1;
                self.stall(
                    visible,
                    load_error_kind(&e),
                    format!("HEAD cannot be used: {e}; serving state {visible}"),
                );
                return;
            }
        };
        {
            let mut h = lock(&self.head);
            h.head = Some(head.clone());
            h.read_ms = Some(now_ms());
        }
        if head.state_id < visible {
            self.stall(
                visible,
                "head_went_back",
                format!(
                    "HEAD went back from {visible} to {} (refused: the visible state never goes back)",
                    head.state_id
                ),
            );
            return;
        }
        if head.state_id == visible {
            self.unstall();
            return;
        }
        let fetched_before = self.loader.downloads().bytes();
        let loaded = load_state(
            &*self.store,
            &self.cache_dir,
            self.trusted.as_ref(),
            &mut self.loader,
            head.state_id,
        )
        .await;
        let tree = match loaded {
            Ok(t) => t,
            Err(e) => {
                self.stall(
                    visible,
                    "state_unloadable",
                    format!("state {} cannot be loaded: {e}", head.state_id),
                );
                return;
            }
        };
        self.cache.add_piece_lists(self.loader.piece_lists());
        match self.catalog.commit(Arc::new(tree)) {
            Ok(_) => {
                // A large load leaves its buffers freed behind; a small
                // one (a commit's few catalogs) is not worth a collection
                // of the whole heap.
                if self
                    .loader
                    .downloads()
                    .bytes()
                    .saturating_sub(fetched_before)
                    >= LARGE_LOAD_BYTES
                {
                    return_freed_memory();
                }
                self.unstall();
                info!(state = head.state_id.0, "following: visible");
            }
            Err(e) => self.stall(
                visible,
                "commit_failed",
                format!("committing state {}: {e}", head.state_id),
            ),
        }
    }
}

/// The cache as the view's source of fetched content.
struct CacheBlobs(Arc<BlobCache>);

impl FetchedBlobs for CacheBlobs {
    fn open(&self, blob: &BlobId) -> std::io::Result<Option<Arc<dyn FetchedFile>>> {
        let part = self.0.open_partial(blob)?;
        Ok(part.map(|part| {
            Arc::new(PartialFile {
                cache: Arc::clone(&self.0),
                part,
            }) as Arc<dyn FetchedFile>
        }))
    }

    fn warm(&self, blob: &BlobId) -> std::io::Result<u64> {
        Ok(self.0.ensure_whole(blob)?)
    }
}

/// One open handle's large file.
struct PartialFile {
    cache: Arc<BlobCache>,
    part: Arc<cache::Partial>,
}

impl FetchedFile for PartialFile {
    fn read_at(&self, offset: u64, size: u32) -> std::io::Result<Bytes> {
        Ok(self.part.read_at(&self.cache, offset, size)?)
    }
}

/// A reader host's state as its metrics read it (shared with status).
#[derive(Clone)]
pub struct FollowProbe {
    catalog: Arc<Catalog>,
    cache: Arc<BlobCache>,
    head: Arc<Mutex<HeadView>>,
    downloads: Arc<Downloads>,
}

/// One reading of a [`FollowProbe`].
#[derive(Debug, Clone)]
pub struct FollowMetrics {
    pub visible: StateId,
    /// The visible state's source time (ms since the epoch; `i64::MIN`
    /// when unknown).
    pub visible_time_ms: i64,
    /// The head last read (None until one was).
    pub head: Option<Published>,
    /// How long since HEAD was last read successfully.
    pub head_read_age_ms: Option<i64>,
    pub polls: u64,
    pub poll_failures: u64,
    /// Why the visible state is not the head's (one of [`STALL_REASONS`]).
    pub stalled: Option<&'static str>,
    /// Stalls begun, by reason.
    pub stalls: BTreeMap<&'static str, u64>,
    pub cache: cache::CacheReport,
    /// State records and catalog objects read from the storage.
    pub catalog_objects_fetched: u64,
    pub catalog_bytes_fetched: u64,
    pub retained: usize,
    pub pins: usize,
    pub sessions: usize,
}

impl FollowMetrics {
    /// Published states this host is behind the head it read.
    pub fn behind(&self) -> u64 {
        self.head
            .as_ref()
            .map_or(0, |p| p.state_id.0.saturating_sub(self.visible.0))
    }

    /// How long since the publisher wrote the head (ms), once read.
    pub fn head_age_ms(&self) -> Option<i64> {
        self.head
            .as_ref()
            .map(|p| (now_ms() - p.published_ms).max(0))
    }

    /// The visible state's source time behind the head's, in seconds.
    pub fn lag_seconds(&self) -> Option<f64> {
        self.head
            .as_ref()
            .filter(|p| p.time_ms != i64::MIN && self.visible_time_ms != i64::MIN)
            .map(|p| (p.time_ms - self.visible_time_ms).max(0) as f64 / 1000.0)
    }
}

impl FollowProbe {
    pub fn read(&self) -> FollowMetrics {
        let snap = self.catalog.snapshot();
        let h = lock(&self.head).clone();
        FollowMetrics {
            visible: snap.visible.state_id,
            visible_time_ms: snap.visible.time_ms,
            head_read_age_ms: h.read_ms.map(|t| (now_ms() - t).max(0)),
            head: h.head,
            polls: h.polls,
            poll_failures: h.poll_failures,
            stalled: h.reason_kind,
            stalls: h.stalls,
            cache: self.cache.report(),
            catalog_objects_fetched: self.downloads.objects(),
            catalog_bytes_fetched: self.downloads.bytes(),
            retained: snap.versions.len(),
            pins: snap.pins.labelled().len(),
            sessions: snap.pins.sessions.len(),
        }
    }
}

struct FollowStatus {
    probe: FollowProbe,
    url: String,
}

impl StatusSource for FollowStatus {
    fn status_json(&self) -> String {
        let m = self.probe.read();
        let snap = self.probe.catalog.snapshot();
        let reason = lock(&self.probe.head).reason.clone();
        let visible = m.visible.0;
        let latest = visible + m.behind();
        let c = &m.cache;
        json!({
            "role": "reader",
            "from": self.url,
            "visible": visible,
            "latest": latest,
            "lag_events": latest - visible,
            "lag_seconds": m.lag_seconds(),
            "head": m.head.as_ref().map(|p| json!({
                "state_id": p.state_id.0,
                "published_ms": p.published_ms,
                "age_ms": m.head_age_ms(),
                "publisher": p.publisher.to_hex(),
            })),
            "head_read_ms_ago": m.head_read_age_ms,
            "head_polls": m.polls,
            "head_poll_failures": m.poll_failures,
            "pins": snap.pins.labelled().into_iter().map(|(k, v)| (k, v.0)).collect::<BTreeMap<_, _>>(),
            "retained": snap.versions.keys().map(|s| s.0).collect::<Vec<_>>(),
            "stalled": reason.as_ref().map(|(s, r)| json!({"state_id": s.0, "reason": r, "kind": m.stalled})),
            "cache": {
                "bytes": c.bytes,
                "limit": c.limit,
                "fetched": c.fetched,
                "fetched_bytes": c.fetched_bytes,
                "failures": c.failures,
                "failures_by_reason": c.failures_by_reason,
                "evicted": c.evicted,
                "last_error": c.last_error,
            },
            "catalog": {
                "fetched": m.catalog_objects_fetched,
                "fetched_bytes": m.catalog_bytes_fetched,
            },
            // Bytes a reader asked for that cannot be fetched now (its
            // read got EIO): the last fetch failed, and why.
            "unreachable": c.unreachable.then(|| c.last_error.clone()).flatten(),
        })
        .to_string()
    }

    fn latest(&self) -> StateId {
        let visible = self.probe.catalog.snapshot().visible.state_id;
        lock(&self.probe.head)
            .head
            .as_ref()
            .map_or(visible, |p| p.state_id.max(visible))
    }
}
