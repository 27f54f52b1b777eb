//! A reader host's blob cache (`--cache DIR`, `blobs/<sha256>`): file
//! content fetched from the publication on first open, verified before it
//! is placed (each piece of a large file by its name, the whole file by
//! its sha256), and kept under `--cache-size` by removing the least
//! recently opened blobs.
//!
//! The view opens a blob by path; [`BlobCache::path_for`] is that path
//! function: it fetches the blob first when it is not cached. A blob that
//! cannot be fetched (storage unreachable, a corrupt object) is not
//! placed, so the open fails with `EIO`, and the reason is kept for
//! status. Removing a blob never disturbs a reader that has it open (the
//! open descriptor keeps its bytes).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use object_store::ObjectStore;
use sha2::{Digest, Sha256};

use crate::event::BlobId;
use crate::publish::layout::{self, PIECE_SIZE};
use crate::publish::load::{get_pieces, get_verified, LoadError};

/// What the cache did (status, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheReport {
    pub bytes: u64,
    pub limit: u64,
    pub fetched: u64,
    pub fetched_bytes: u64,
    pub failures: u64,
    pub evicted: u64,
    /// Why the last failed fetch failed.
    pub last_error: Option<String>,
}

pub struct BlobCache {
    dir: PathBuf,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Handle,
    /// Piece lists of large files, by the file's sha256 (from the loader).
    pieces: Mutex<HashMap<BlobId, BlobId>>,
    limit: u64,
    bytes: AtomicU64,
    report: Mutex<CacheReport>,
    next_temp: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("writing the cache: {0}")]
    Io(#[from] std::io::Error),
    #[error("the pieces of {0} do not make up its content")]
    Assembly(String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl BlobCache {
    /// The cache in `dir/blobs` (created), fetching through `rt`.
    pub fn open(
        dir: &Path,
        store: Arc<dyn ObjectStore>,
        rt: tokio::runtime::Handle,
        limit: u64,
    ) -> std::io::Result<BlobCache> {
        let blobs = dir.join("blobs");
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&blobs)?;
        // Temp files of a killed run.
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let mut bytes = 0;
        for e in std::fs::read_dir(&blobs)? {
            bytes += e?.metadata().map_or(0, |m| m.len());
        }
        Ok(BlobCache {
            dir: dir.to_owned(),
            store,
            rt,
            pieces: Mutex::new(HashMap::new()),
            limit,
            bytes: AtomicU64::new(bytes),
            report: Mutex::new(CacheReport {
                bytes,
                limit,
                ..CacheReport::default()
            }),
            next_temp: AtomicU64::new(0),
        })
    }

    /// Learns piece lists (from each state the loader loads).
    pub fn add_piece_lists(&self, lists: &HashMap<BlobId, BlobId>) {
        let mut p = lock(&self.pieces);
        for (k, v) in lists {
            p.insert(*k, *v);
        }
    }

    pub fn report(&self) -> CacheReport {
        let mut r = lock(&self.report).clone();
        r.bytes = self.bytes.load(Ordering::Relaxed);
        r
    }

    fn blob_path(&self, id: &BlobId) -> PathBuf {
        self.dir.join("blobs").join(id.to_hex())
    }

    /// The cached path of `id`, fetched first when missing. On a failed
    /// fetch the path is returned all the same (nothing is there, so the
    /// view's open fails with EIO) and the reason is kept.
    pub fn path_for(&self, id: &BlobId) -> PathBuf {
        let path = self.blob_path(id);
        if let Ok(f) = File::options().write(true).open(&path) {
            // The least recently opened blobs are evicted first.
            let _ = f.set_modified(SystemTime::now());
            return path;
        }
        match self.rt.block_on(self.fetch(id, &path)) {
            Ok(len) => {
                let total = self.bytes.fetch_add(len, Ordering::Relaxed) + len;
                {
                    let mut r = lock(&self.report);
                    r.fetched += 1;
                    r.fetched_bytes += len;
                }
                if total > self.limit {
                    self.evict(&path);
                }
            }
            Err(e) => {
                tracing::warn!(blob = %id.to_hex(), "fetching a file's content failed: {e}");
                let mut r = lock(&self.report);
                r.failures += 1;
                r.last_error = Some(format!("fetching {}: {e}", id.to_hex()));
            }
        }
        path
    }

    async fn fetch(&self, id: &BlobId, dest: &Path) -> Result<u64, FetchError> {
        let list = lock(&self.pieces).get(id).copied();
        let temp = self.dir.join("tmp").join(format!(
            "{}.{}",
            id.to_hex(),
            self.next_temp.fetch_add(1, Ordering::Relaxed)
        ));
        let result = async {
            let mut f = File::create(&temp)?;
            let mut whole = Sha256::new();
            let mut len = 0u64;
            match list {
                None => {
                    let bytes =
                        get_verified(&*self.store, &layout::blob(id), id, PIECE_SIZE).await?;
                    f.write_all(&bytes)?;
                    len += bytes.len() as u64;
                    whole.update(&bytes);
                }
                Some(list) => {
                    let list = get_pieces(&*self.store, &list).await?;
                    for piece in &list.pieces {
                        let bytes = get_verified(
                            &*self.store,
                            &layout::blob(piece),
                            piece,
                            u64::from(list.piece_size),
                        )
                        .await?;
                        f.write_all(&bytes)?;
                        len += bytes.len() as u64;
                        whole.update(&bytes);
                    }
                }
            }
            if BlobId(whole.finalize().into()) != *id {
                return Err(FetchError::Assembly(id.to_hex()));
            }
            f.sync_all()?;
            std::fs::rename(&temp, dest)?;
            Ok(len)
        }
        .await;
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    /// Removes the least recently opened blobs (never `keep`) until the
    /// cache is under 90 % of its limit.
    fn evict(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("blobs")) else {
            return;
        };
        let mut blobs: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        blobs.sort();
        let target = self.limit / 10 * 9;
        let mut evicted = 0;
        for (_, len, path) in blobs {
            if self.bytes.load(Ordering::Relaxed) <= target {
                break;
            }
            if path == keep {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                self.bytes.fetch_sub(len, Ordering::Relaxed);
                evicted += 1;
            }
        }
        lock(&self.report).evicted += evicted;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::publish::open_store;
    use object_store::{ObjectStoreExt, PutPayload};

    fn id(bytes: &[u8]) -> BlobId {
        layout::content_id(bytes)
    }

    #[test]
    fn a_full_cache_evicts_the_least_recently_opened_and_fetches_again() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("pub").display());
        let store = open_store(&url).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let contents: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 1000]).collect();
        for c in &contents {
            rt.block_on(store.put(&layout::blob(&id(c)), PutPayload::from(c.clone())))
                .unwrap();
        }
        let cache =
            BlobCache::open(&dir.path().join("cache"), store, rt.handle().clone(), 2500).unwrap();
        for c in &contents {
            let path = cache.path_for(&id(c));
            assert_eq!(std::fs::read(&path).unwrap(), *c);
            // Opened in order: each one more recently than the one before.
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = cache.report();
        assert!(r.bytes <= 2500, "{r:?}");
        assert!(r.evicted >= 1, "{r:?}");
        assert_eq!((r.fetched, r.failures), (4, 0), "{r:?}");
        // The newest stayed; the oldest went and comes back verified.
        assert!(cache.blob_path(&id(&contents[3])).exists());
        assert!(!cache.blob_path(&id(&contents[0])).exists());
        assert_eq!(
            std::fs::read(cache.path_for(&id(&contents[0]))).unwrap(),
            contents[0]
        );
    }

    #[test]
    fn content_that_does_not_verify_is_never_placed() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("pub").display());
        let store = open_store(&url).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let good = b"good".to_vec();
        rt.block_on(store.put(
            &layout::blob(&id(&good)),
            PutPayload::from(b"evil".to_vec()),
        ))
        .unwrap();
        let cache = BlobCache::open(
            &dir.path().join("cache"),
            store,
            rt.handle().clone(),
            1 << 20,
        )
        .unwrap();
        let path = cache.path_for(&id(&good));
        assert!(!path.exists());
        let r = cache.report();
        assert_eq!(r.failures, 1);
        assert!(r.last_error.unwrap().contains("does not match its name"));
    }
}
