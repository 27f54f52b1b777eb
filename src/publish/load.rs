//! Loading a published state from storage into a catalog [`Tree`]: the
//! reader's way in, and the publisher's after a restart (to learn what the
//! storage already holds).
//!
//! Every object is verified by its name (sha256) before it is decoded,
//! and the tree's shape is checked as it is built (databases under the
//! root, tables under databases, partitions at their depth), so hostile
//! storage yields an error, never a tree the view cannot serve. Directory
//! objects already loaded for another state are not fetched again: the
//! same object is the same node (the same inode), as on the publisher.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use imbl::OrdMap;
use object_store::{ObjectStore, ObjectStoreExt};

use super::catalog_object::{CatalogObjectError, DirObject, Entry, MAX_CATALOG_BYTES};
use super::layout;
use super::pieces::{PieceList, PiecesError};
use super::record::{self, Decoded, Published, RecordError, RecordKind};
use crate::catalog::{DirKind, DirNode, FileNode, Meta, Node, Tree};
use crate::event::{BlobId, StateId};

/// Deeper trees are refused (64 partition levels and subdirectories).
pub const MAX_DEPTH: usize = 160;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {object}: {source}")]
    Store {
        object: String,
        source: object_store::Error,
    },
    #[error("{object} is missing")]
    Missing { object: String },
    #[error("{object} is corrupt: {detail}")]
    Corrupt { object: String, detail: String },
}

impl LoadError {
    fn corrupt(object: &object_store::path::Path, detail: impl ToString) -> LoadError {
        LoadError::Corrupt {
            object: object.to_string(),
            detail: detail.to_string(),
        }
    }
}

/// Reads `path` whole, refusing one larger than `max` bytes before its
/// body is read.
pub async fn get_bounded(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    max: u64,
) -> Result<bytes::Bytes, LoadError> {
    let got = match store.get(path).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(LoadError::Missing {
                object: path.to_string(),
            })
        }
        Err(source) => {
            return Err(LoadError::Store {
                object: path.to_string(),
                source,
            })
        }
    };
    if got.meta.size > max {
        return Err(LoadError::corrupt(
            path,
            format!("{} bytes, more than the {max} allowed", got.meta.size),
        ));
    }
    got.bytes().await.map_err(|source| LoadError::Store {
        object: path.to_string(),
        source,
    })
}

/// Reads and verifies an immutable object named by its content id.
pub async fn get_verified(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    id: &BlobId,
    max: u64,
) -> Result<Vec<u8>, LoadError> {
    let bytes = get_bounded(store, path, max).await?;
    if layout::content_id(&bytes) != *id {
        return Err(LoadError::corrupt(
            path,
            "its content does not match its name",
        ));
    }
    Ok(bytes.to_vec())
}

/// Reads the immutable object `path` named by its content id, exactly
/// `buf.len()` bytes long, into `buf`, hashing it as it arrives (each
/// chunk while it is in the CPU's cache): a reader's pieces, straight
/// into the buffer they are written and served from. A folder's object
/// is read in place (no zeroed buffer of object_store's, no copy),
/// `O_DIRECT` where it can be ([`read_hashing`]). On an error `buf` holds
/// no verified content.
pub async fn get_verified_into(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    id: &BlobId,
    buf: &mut [u8],
) -> Result<(), LoadError> {
    use sha2::{Digest, Sha256};
    let store_err = |source| LoadError::Store {
        object: path.to_string(),
        source,
    };
    let got = match store.get(path).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(LoadError::Missing {
                object: path.to_string(),
            })
        }
        Err(source) => return Err(store_err(source)),
    };
    let want = buf.len();
    if got.meta.size != want as u64 || got.range.end - got.range.start != want as u64 {
        return Err(LoadError::corrupt(
            path,
            format!("{} bytes, not the {want} expected", got.meta.size),
        ));
    }
    let mut hash = Sha256::new();
    match got.payload {
        object_store::GetResultPayload::File(file, _) => {
            read_hashing(&file, got.range.start, buf, &mut hash).map_err(|e| {
                store_err(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(e),
                })
            })?;
        }
        object_store::GetResultPayload::Stream(mut stream) => {
            use futures::StreamExt;
            let mut at = 0;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(store_err)?;
                let Some(dest) = buf.get_mut(at..at + chunk.len()) else {
                    return Err(LoadError::corrupt(path, "longer than its listed size"));
                };
                dest.copy_from_slice(&chunk);
                hash.update(&chunk);
                at += chunk.len();
            }
            if at != want {
                return Err(LoadError::corrupt(path, "shorter than its listed size"));
            }
        }
    }
    if BlobId(hash.finalize().into()) != *id {
        return Err(LoadError::corrupt(
            path,
            "its content does not match its name",
        ));
    }
    Ok(())
}

/// Bytes read and hashed at a time from a folder.
const CHUNK: usize = 1 << 20;

/// The alignment `O_DIRECT` reads and writes need (of memory, offset and
/// length): a reader host's piece buffers are aligned to it.
pub const DIRECT_ALIGN: usize = 4096;

/// Reads `buf.len()` bytes of a folder's object `file` from `start` into
/// `buf`, hashing each chunk as it lands.
///
/// The aligned part is read `O_DIRECT` where the filesystem and `buf`'s
/// address allow it: a reader host keeps the bytes in its own cache, so a
/// copy in the page cache would be a second cache, paid with a fresh page
/// per 4 KiB and a copy of every byte (on a cold 1 GiB read, most of the
/// reader host's system time: docs/BENCHMARKS.md, "Reader hosts"). The
/// unaligned tail, and everything on a filesystem that refuses direct
/// reads, is read through the page cache. `file` is this read's own
/// descriptor (object_store opens one per get), so its flags are ours.
fn read_hashing(
    file: &std::fs::File,
    start: u64,
    buf: &mut [u8],
    hash: &mut sha2::Sha256,
) -> std::io::Result<()> {
    use sha2::Digest;
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    if start % DIRECT_ALIGN as u64 == 0
        && buf.as_ptr().align_offset(DIRECT_ALIGN) == 0
        && set_direct(file, true)
    {
        let aligned = buf.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        while done < aligned {
            let chunk = &mut buf[done..aligned.min(done + CHUNK)];
            match file.read_exact_at(chunk, start + done as u64) {
                Ok(()) => {}
                // Accepted at fcntl, refused at the read (some FUSE and
                // network filesystems): the page cache instead.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && done == 0 => break,
                Err(e) => return Err(e),
            }
            hash.update(&*chunk);
            done += chunk.len();
        }
        set_direct(file, false);
    }
    let len = buf.len();
    while done < len {
        let chunk = &mut buf[done..(done + CHUNK).min(len)];
        file.read_exact_at(chunk, start + done as u64)?;
        hash.update(&*chunk);
        done += chunk.len();
    }
    Ok(())
}

/// Sets or clears `O_DIRECT` on `file`: whether it is now as asked.
fn set_direct(file: &std::fs::File, on: bool) -> bool {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL on a descriptor `file` owns, with no
    // pointers.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return false;
        }
        let want = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        want == flags || libc::fcntl(fd, libc::F_SETFL, want) == 0
    }
}

/// Reads a head or state record.
pub async fn get_record(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    kind: RecordKind,
    trusted: Option<&ed25519_dalek::VerifyingKey>,
) -> Result<Decoded, LoadError> {
    let bytes = get_bounded(store, path, record::MAX_RECORD_BYTES as u64).await?;
    record::decode(kind, &bytes, trusted).map_err(|e: RecordError| LoadError::corrupt(path, e))
}

/// Reads and checks the piece list `id`.
pub async fn get_pieces(store: &dyn ObjectStore, id: &BlobId) -> Result<PieceList, LoadError> {
    let path = layout::pieces(id);
    let max = 24 + 32 * u64::from(super::pieces::MAX_PIECES);
    let bytes = get_verified(store, &path, id, max).await?;
    PieceList::decode(&bytes).map_err(|e: PiecesError| LoadError::corrupt(&path, e))
}

/// Objects and bytes read from the storage to load states (catalog
/// objects, and state records counted by the caller), not from local
/// copies: what following costs in transfer (metrics, benchmarks).
#[derive(Debug, Default)]
pub struct Downloads {
    objects: AtomicU64,
    bytes: AtomicU64,
}

impl Downloads {
    pub fn add(&self, bytes: u64) {
        self.objects.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn objects(&self) -> u64 {
        self.objects.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Builds trees from published catalogs, sharing the nodes of directory
/// objects it loaded before (while some tree still holds them).
#[derive(Default)]
pub struct Loader {
    dirs: HashMap<BlobId, Weak<DirNode>>,
    /// The piece list of every large file seen, by the file's sha256.
    pieces: HashMap<BlobId, BlobId>,
    /// A folder of local copies of catalog objects (a reader's cache):
    /// read first, verified like the storage's, and filled from it.
    local: Option<std::path::PathBuf>,
    downloads: Arc<Downloads>,
}

/// What a directory object may be, from where it is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    InRoot,
    InDatabase,
    /// Below a table with this many partition keys, at this partition depth.
    Below {
        keys: u16,
        depth: u16,
    },
}

impl Loader {
    pub fn new() -> Loader {
        Loader::default()
    }

    /// A loader that keeps a copy of every catalog object in `dir` and
    /// reads it from there first (a reader host restarted while the
    /// storage is unreachable still loads the states it had).
    pub fn with_local_copies(dir: &std::path::Path) -> Loader {
        Loader {
            local: Some(dir.to_owned()),
            ..Loader::default()
        }
    }

    /// Counts what it reads from the storage into `downloads` (shared
    /// by the loaders of one reader host).
    pub fn counting_into(mut self, downloads: Arc<Downloads>) -> Loader {
        self.downloads = downloads;
        self
    }

    /// What this loader read from the storage.
    pub fn downloads(&self) -> &Arc<Downloads> {
        &self.downloads
    }

    /// Every piece list seen: file sha256 → piece list.
    pub fn piece_lists(&self) -> &HashMap<BlobId, BlobId> {
        &self.pieces
    }

    /// The catalog object `id`, from the local copy when it verifies, else
    /// from the storage (then copied locally).
    async fn catalog_bytes(
        &self,
        store: &dyn ObjectStore,
        id: &BlobId,
    ) -> Result<Vec<u8>, LoadError> {
        let path = layout::catalog(id);
        let local = self.local.as_ref().map(|d| d.join(id.to_hex()));
        if let Some(copy) = &local {
            if let Ok(bytes) = std::fs::read(copy) {
                if layout::content_id(&bytes) == *id {
                    return Ok(bytes);
                }
            }
        }
        let bytes = get_verified(store, &path, id, MAX_CATALOG_BYTES).await?;
        self.downloads.add(bytes.len() as u64);
        if let Some(copy) = &local {
            if let Err(e) = crate::durable::write_atomic(copy, &bytes) {
                tracing::warn!("cannot keep a local copy of {path}: {e}");
            }
        }
        Ok(bytes)
    }

    /// The piece list of the large file whose content is `sha256`.
    pub fn pieces_of(&self, sha256: &BlobId) -> Option<BlobId> {
        self.pieces.get(sha256).copied()
    }

    /// The catalog objects whose nodes some loaded tree still holds.
    pub fn object_ids(&self) -> impl Iterator<Item = BlobId> + '_ {
        self.dirs
            .iter()
            .filter(|(_, w)| w.strong_count() > 0)
            .map(|(id, _)| *id)
    }

    /// Loads the tree of a published state (its root catalog `root`).
    pub async fn load(
        &mut self,
        store: &dyn ObjectStore,
        state_id: StateId,
        time_ms: i64,
        root: BlobId,
    ) -> Result<Tree, LoadError> {
        // Fetch every object not held yet, breadth first.
        let mut objects: HashMap<BlobId, DirObject> = HashMap::new();
        let mut level = vec![root];
        for _ in 0..=MAX_DEPTH {
            let mut next = Vec::new();
            for id in level {
                if objects.contains_key(&id) || self.held(&id).is_some() {
                    continue;
                }
                let path = layout::catalog(&id);
                let bytes = self.catalog_bytes(store, &id).await?;
                let obj = DirObject::decode(&bytes)
                    .map_err(|e: CatalogObjectError| LoadError::corrupt(&path, e))?;
                for (_, e) in &obj.entries {
                    if let Entry::Dir(child) = e {
                        next.push(*child);
                    }
                }
                objects.insert(id, obj);
            }
            if next.is_empty() {
                let root_node = self.build(&objects, root, Place::Root, 0)?;
                self.dirs.retain(|_, w| w.strong_count() > 0);
                return Ok(Tree {
                    state_id,
                    time_ms,
                    root: root_node,
                });
            }
            level = next;
        }
        Err(LoadError::corrupt(
            &layout::catalog(&root),
            format!("the tree is deeper than {MAX_DEPTH} levels"),
        ))
    }

    fn held(&self, id: &BlobId) -> Option<Arc<DirNode>> {
        self.dirs.get(id).and_then(Weak::upgrade)
    }

    fn build(
        &mut self,
        objects: &HashMap<BlobId, DirObject>,
        id: BlobId,
        place: Place,
        depth: usize,
    ) -> Result<Arc<DirNode>, LoadError> {
        let path = layout::catalog(&id);
        if let Some(node) = self.held(&id) {
            check_place(&node.kind, place).map_err(|d| LoadError::corrupt(&path, d))?;
            return Ok(node);
        }
        if depth > MAX_DEPTH {
            return Err(LoadError::corrupt(&path, "too deep"));
        }
        let obj = objects.get(&id).ok_or_else(|| LoadError::Missing {
            object: path.to_string(),
        })?;
        check_place(&obj.kind, place).map_err(|d| LoadError::corrupt(&path, d))?;
        let child_place = match (&obj.kind, place) {
            (DirKind::Root, _) => Place::InRoot,
            (DirKind::Database, _) => Place::InDatabase,
            (DirKind::Table { partition_keys, .. }, _) => Place::Below {
                keys: partition_keys.len() as u16,
                depth: 0,
            },
            (DirKind::Partition { depth }, Place::Below { keys, .. }) => Place::Below {
                keys,
                depth: *depth,
            },
            (DirKind::Subdir, p) => p,
            (DirKind::Partition { .. }, _) => {
                return Err(LoadError::corrupt(&path, "a partition outside a table"))
            }
        };
        let mut children = OrdMap::new();
        for (name, entry) in &obj.entries {
            let node = match entry {
                Entry::Dir(child) => {
                    Node::Dir(self.build(objects, *child, child_place, depth + 1)?)
                }
                Entry::File(f) => {
                    if let Some(p) = f.pieces {
                        self.pieces.insert(f.sha256, p);
                    }
                    Node::File(Arc::new(FileNode::restored(
                        Meta::restored(f.state_id, f.time_ms),
                        f.sha256,
                        f.size,
                        f.key,
                        f.source.clone(),
                        f.verified,
                    )))
                }
            };
            children.insert(name.clone(), node);
        }
        let node = Arc::new(DirNode {
            meta: Meta::restored(obj.state_id, obj.time_ms),
            kind: obj.kind.clone(),
            children,
        });
        self.dirs.insert(id, Arc::downgrade(&node));
        Ok(node)
    }
}

/// Whether a directory of `kind` may stand at `place`.
fn check_place(kind: &DirKind, place: Place) -> Result<(), String> {
    let ok = match (kind, place) {
        (DirKind::Root, Place::Root) => true,
        (DirKind::Database, Place::InRoot) => true,
        (DirKind::Table { .. }, Place::InDatabase) => true,
        (DirKind::Partition { depth }, Place::Below { keys, depth: above }) => {
            *depth == above + 1 && *depth <= keys
        }
        (DirKind::Subdir, Place::Below { .. }) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("a {kind:?} directory cannot stand at {place:?}"))
    }
}

/// The HEAD published at `url`, read once within `timeout` and, with
/// `trusted`, its signature verified (None: the URL holds no HEAD yet).
/// For `stagefs check`: it opens the storage and reads, and writes nothing.
pub fn read_head(
    url: &str,
    timeout: std::time::Duration,
    trusted: Option<&ed25519_dalek::VerifyingKey>,
) -> Result<Option<Published>, String> {
    let store = super::open_store(url).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let read = rt.block_on(async {
        tokio::time::timeout(
            timeout,
            get_record(&*store, &layout::head(), RecordKind::Head, trusted),
        )
        .await
    });
    match read {
        Err(_) => Err(format!("no answer within {timeout:?}")),
        Ok(Err(LoadError::Missing { .. })) => Ok(None),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(decoded)) => Ok(Some(decoded.published)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// Every length around the alignment and the chunk, at aligned and
    /// unaligned offsets and buffer addresses: the bytes and the hash are
    /// the file's, read directly or through the page cache alike.
    #[test]
    fn a_folder_object_reads_and_hashes_exactly_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        let content: Vec<u8> = (0..3 * CHUNK + 3 * DIRECT_ALIGN)
            .map(|i| (i * 7 + i / 4093) as u8)
            .collect();
        std::fs::write(&path, &content).unwrap();
        // Room to place a buffer at an aligned or unaligned address.
        let mut backing = vec![0u8; content.len() + 2 * DIRECT_ALIGN];
        let aligned_at = backing.as_ptr().align_offset(DIRECT_ALIGN);
        for start in [0, DIRECT_ALIGN, 512, 1] {
            for len in [
                0,
                1,
                DIRECT_ALIGN - 1,
                DIRECT_ALIGN,
                DIRECT_ALIGN + 1,
                CHUNK,
                CHUNK + 5,
                2 * CHUNK + DIRECT_ALIGN,
            ] {
                for at in [aligned_at, aligned_at + 1] {
                    let want = &content[start..start + len];
                    let buf = &mut backing[at..at + len];
                    let file = std::fs::File::open(&path).unwrap();
                    let mut hash = Sha256::new();
                    read_hashing(&file, start as u64, buf, &mut hash).unwrap();
                    assert!(buf == want, "start {start} len {len} at {at}");
                    assert_eq!(
                        <[u8; 32]>::from(hash.finalize()),
                        <[u8; 32]>::from(Sha256::digest(want)),
                        "start {start} len {len} at {at}"
                    );
                }
            }
        }
    }

    /// An object shorter than it was listed (truncated at storage after
    /// its size was read) is an error, never a short buffer.
    #[test]
    fn a_folder_object_shorter_than_asked_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        std::fs::write(&path, vec![5u8; 2 * DIRECT_ALIGN + 10]).unwrap();
        let mut backing = vec![0u8; 4 * DIRECT_ALIGN];
        let at = backing.as_ptr().align_offset(DIRECT_ALIGN);
        let file = std::fs::File::open(&path).unwrap();
        let r = read_hashing(
            &file,
            0,
            &mut backing[at..at + 3 * DIRECT_ALIGN],
            &mut Sha256::new(),
        );
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
