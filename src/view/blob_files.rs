//! Open descriptors of staged blobs, kept from one OPEN to the next.
//!
//! Most of a warm OPEN of a small file was `File::open` of its blob in the
//! store (a path walk of `blobs/…/<sha256>` on the host's filesystem). The
//! view keeps the descriptors of the blobs most recently opened and gives
//! each OPEN a clone of the `Arc<File>`: a handle still owns its
//! descriptor, so an open file keeps its bytes whatever happens to this
//! cache or to the blob's path afterwards (SPEC §3 rule 5).
//!
//! Bounded: at most `capacity` descriptors (a quarter of the
//! process's descriptor limit, at most [`MAX_KEPT`]); past it, the
//! descriptor least recently used is closed (second-chance order: O(1) per
//! OPEN). A kept descriptor of a blob that garbage collection removed
//! (link count 0) would keep that blob's disk space: [`BlobFiles::prune`],
//! called by the maintenance thread every 250 ms, closes those.
//! A blob's content never changes under its id, so a kept descriptor
//! always reads the bytes a fresh open would.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::event::BlobId;

/// Most descriptors kept, whatever the descriptor limit.
pub const MAX_KEPT: usize = 4096;

struct Kept {
    file: Arc<File>,
    /// Used since it was last passed over for eviction.
    used: bool,
}

#[derive(Default)]
struct Inner {
    files: HashMap<BlobId, Kept>,
    /// Insertion order, for second-chance eviction: every key of `files`
    /// once (and nothing else).
    order: VecDeque<BlobId>,
}

pub struct BlobFiles {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl BlobFiles {
    /// A cache sized to the process's descriptor limit (`RLIMIT_NOFILE`).
    pub fn for_this_process() -> BlobFiles {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-pointer.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            1024
        };
        BlobFiles::with_capacity((soft / 4).min(MAX_KEPT))
    }

    /// A cache of at most `capacity` descriptors (0: none kept).
    pub fn with_capacity(capacity: usize) -> BlobFiles {
        BlobFiles {
            inner: Mutex::new(Inner::default()),
            capacity,
        }
    }

    /// Descriptors kept now (tests, status).
    pub fn len(&self) -> usize {
        self.lock().files.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Each update leaves the map and the order consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The blob `id`'s descriptor: the kept one, else `path` opened now
    /// (and kept).
    pub fn open(&self, id: &BlobId, path: &Path) -> io::Result<Arc<File>> {
        if let Some(kept) = self.lock().files.get_mut(id) {
            kept.used = true;
            return Ok(Arc::clone(&kept.file));
        }
        let file = Arc::new(File::open(path)?);
        if self.capacity == 0 {
            return Ok(file);
        }
        let mut inner = self.lock();
        if let Some(kept) = inner.files.get(id) {
            // Another thread opened it meanwhile: keep one descriptor.
            return Ok(Arc::clone(&kept.file));
        }
        while inner.files.len() >= self.capacity {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            let second_chance = match inner.files.get_mut(&old) {
                Some(k) if k.used => {
                    k.used = false;
                    true
                }
                _ => false,
            };
            if second_chance {
                inner.order.push_back(old);
            } else {
                inner.files.remove(&old);
            }
        }
        inner.files.insert(
            *id,
            Kept {
                file: Arc::clone(&file),
                used: false,
            },
        );
        inner.order.push_back(*id);
        Ok(file)
    }

    /// Closes the kept descriptors of blobs no longer in the store (link
    /// count 0: garbage collection removed them), and of any that cannot
    /// be inspected; returns how many.
    pub fn prune(&self) -> usize {
        let files: Vec<(BlobId, Arc<File>)> = self
            .lock()
            .files
            .iter()
            .map(|(id, k)| (*id, Arc::clone(&k.file)))
            .collect();
        let gone: Vec<BlobId> = files
            .iter()
            .filter(|(_, f)| f.metadata().map_or(true, |m| m.nlink() == 0))
            .map(|(id, _)| *id)
            .collect();
        drop(files);
        if gone.is_empty() {
            return 0;
        }
        let mut inner = self.lock();
        for id in &gone {
            inner.files.remove(id);
        }
        let Inner { files, order } = &mut *inner;
        order.retain(|id| files.contains_key(id));
        gone.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn blob(dir: &Path, n: u8, bytes: &[u8]) -> (BlobId, std::path::PathBuf) {
        let path = dir.join(format!("b{n}"));
        std::fs::write(&path, bytes).unwrap();
        (BlobId([n; 32]), path)
    }

    fn read_all(f: &File) -> Vec<u8> {
        let mut out = Vec::new();
        let mut f = f.try_clone().unwrap();
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn a_second_open_reuses_the_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let (id, path) = blob(dir.path(), 1, b"one");
        let c = BlobFiles::with_capacity(4);
        let a = c.open(&id, &path).unwrap();
        // The path is gone: only the kept descriptor can answer.
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        let b = c.open(&id, &path).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(read_all(&b), b"one");
    }

    #[test]
    fn the_least_recently_used_descriptor_is_closed_past_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlobFiles::with_capacity(2);
        let blobs: Vec<_> = (1..=3).map(|n| blob(dir.path(), n, &[n])).collect();
        let first = c.open(&blobs[0].0, &blobs[0].1).unwrap();
        c.open(&blobs[1].0, &blobs[1].1).unwrap();
        // Used again: the second blob goes first.
        c.open(&blobs[0].0, &blobs[0].1).unwrap();
        c.open(&blobs[2].0, &blobs[2].1).unwrap();
        assert_eq!(c.len(), 2);
        std::fs::remove_file(&blobs[1].1).unwrap();
        assert!(c.open(&blobs[1].0, &blobs[1].1).is_err(), "closed");
        assert!(Arc::ptr_eq(
            &first,
            &c.open(&blobs[0].0, &blobs[0].1).unwrap()
        ));
    }

    #[test]
    fn a_removed_blob_is_pruned_and_an_open_handle_keeps_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (id, path) = blob(dir.path(), 7, b"seven");
        let (other, other_path) = blob(dir.path(), 8, b"eight");
        let c = BlobFiles::with_capacity(4);
        let handle = c.open(&id, &path).unwrap();
        c.open(&other, &other_path).unwrap();
        assert_eq!(c.prune(), 0);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(c.prune(), 1);
        assert_eq!(c.len(), 1);
        assert_eq!(read_all(&handle), b"seven", "the handle's own descriptor");
        assert!(c.open(&id, &path).is_err(), "no longer kept");
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (id, path) = blob(dir.path(), 2, b"two");
        let c = BlobFiles::with_capacity(0);
        let a = c.open(&id, &path).unwrap();
        let b = c.open(&id, &path).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(c.len(), 0);
    }
}
