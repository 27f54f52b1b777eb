//! A reader host's blob cache (`--cache DIR`): file content fetched from
//! the publication on demand, verified before it is served, and kept
//! under `--cache-size`.
//!
//! - `blobs/<sha256>`: a whole file. Small files (one object at URL) are
//!   fetched whole at first open and verified by their sha256.
//! - `partial/<sha256>`: a large file (published as pieces) being filled
//!   piece by piece ([`Partial`]): a read at offset X fetches and
//!   verifies only the pieces it covers, plus [`READ_AHEAD`] pieces after
//!   them in the background, so the first bytes of a 1 GiB file cost one
//!   piece's GET. `partial/<sha256>.have` lists the pieces written (each
//!   hashed again before it is first served after a restart, so a crash
//!   mid-write never serves torn bytes) and `partial/<sha256>.list` keeps
//!   the piece list. Once every piece is there the file moves to
//!   `blobs/`. Every piece is verified by its name, the piece list by its
//!   name, and the list's name comes from the verified catalog, so the
//!   assembled file needs no second hash.
//! - Pieces are written `O_DIRECT` where the filesystem allows (not
//!   through the page cache), a shared folder's piece objects are read
//!   that way too (the cache is the copy that is kept), and the pieces
//!   being read, verified, are kept in memory by their [`Partial`] (the
//!   read-ahead window and the pieces being read) and served from there;
//!   a piece no longer in memory is read from the file.
//!
//! The cache makes room before it writes: the least recently used files
//! go first, never a large file some open handle is reading. When no room
//! can be made (the limit is smaller than what open files hold), the
//! fetch fails with a reason: the read gets `EIO`, status says why. A
//! fetch that fails (storage unreachable, a corrupt object) places
//! nothing, so no unverified byte is ever served. Removing a whole blob
//! never disturbs a reader that has it open (its descriptor keeps the
//! bytes).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::SystemTime;

use bytes::Bytes;
use object_store::ObjectStore;

use crate::event::BlobId;
use crate::publish::layout::{self, PIECE_SIZE};
use crate::publish::load::{get_pieces, get_verified, get_verified_into, LoadError, DIRECT_ALIGN};
use crate::publish::pieces::PieceList;

/// Pieces fetched ahead of a read, in the background (8 MiB each).
pub const READ_AHEAD: usize = 4;

/// Pieces `warm` fetches at once.
const WARM_PARALLEL: usize = 4;

/// Verified pieces a [`Partial`] keeps in memory for its reads: the
/// read-ahead window and the pieces being read.
const KEPT_PIECES: usize = READ_AHEAD + 2;

/// Spare piece buffers a [`Partial`] keeps for its next fetches.
const SPARE_BUFFERS: usize = 2;

/// What the cache did (status, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheReport {
    pub bytes: u64,
    pub limit: u64,
    /// Objects fetched (whole small files and pieces).
    pub fetched: u64,
    pub fetched_bytes: u64,
    pub failures: u64,
    /// `failures` by [`FetchError::reason`].
    pub failures_by_reason: BTreeMap<&'static str, u64>,
    pub evicted: u64,
    /// Why the last failed fetch failed.
    pub last_error: Option<String>,
    /// Whether the last fetch failed: bytes some reader asked for are
    /// unreachable now (cleared by the next fetch that succeeds).
    pub unreachable: bool,
}

pub struct BlobCache {
    dir: PathBuf,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Handle,
    /// Piece lists of large files, by the file's sha256 (from the loader).
    pieces: Mutex<HashMap<BlobId, BlobId>>,
    /// Large files being filled, while something reads them.
    partials: Mutex<HashMap<BlobId, Weak<Partial>>>,
    limit: u64,
    bytes: AtomicU64,
    /// Serializes making room (two fetches must not both count the same
    /// free bytes).
    room: Mutex<()>,
    report: Mutex<CacheReport>,
    next_temp: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("writing the cache: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "the cache is full: {need} more bytes do not fit under --cache-size {limit} \
         ({held} bytes are held by files being read)"
    )]
    Full { need: u64, limit: u64, held: u64 },
}

/// Every [`FetchError::reason`], in the order metrics list them.
pub const FETCH_FAILURE_REASONS: [&str; 5] =
    ["unreachable", "missing", "corrupt", "cache_full", "io"];

impl FetchError {
    /// Why, in one word (the `reason` label of the metrics): the storage
    /// did not answer, the object is not there, it does not verify, the
    /// cache has no room, or writing the cache failed.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::Load(LoadError::Store { .. }) => "unreachable",
            FetchError::Load(LoadError::Missing { .. }) => "missing",
            FetchError::Load(LoadError::Corrupt { .. }) => "corrupt",
            FetchError::Full { .. } => "cache_full",
            FetchError::Io(_) => "io",
        }
    }
}

impl From<FetchError> for std::io::Error {
    fn from(e: FetchError) -> std::io::Error {
        match e {
            FetchError::Io(e) => e,
            e => std::io::Error::other(e.to_string()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes a file takes on disk (partial files are sparse).
fn disk_bytes(m: &std::fs::Metadata) -> u64 {
    (m.blocks() * 512).min(m.len())
}

impl BlobCache {
    /// The cache in `dir/blobs` and `dir/partial` (created), fetching
    /// through `rt`.
    pub fn open(
        dir: &Path,
        store: Arc<dyn ObjectStore>,
        rt: tokio::runtime::Handle,
        limit: u64,
    ) -> std::io::Result<BlobCache> {
        let blobs = dir.join("blobs");
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&blobs)?;
        std::fs::create_dir_all(dir.join("partial"))?;
        // Temp files of a killed run.
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let mut bytes = 0;
        for e in std::fs::read_dir(&blobs)? {
            bytes += e?.metadata().map_or(0, |m| m.len());
        }
        for e in std::fs::read_dir(dir.join("partial"))? {
            let e = e?;
            if BlobId::from_hex(&e.file_name().to_string_lossy()).is_some() {
                bytes += e.metadata().map_or(0, |m| disk_bytes(&m));
            }
        }
        Ok(BlobCache {
            dir: dir.to_owned(),
            store,
            rt,
            pieces: Mutex::new(HashMap::new()),
            partials: Mutex::new(HashMap::new()),
            limit,
            bytes: AtomicU64::new(bytes),
            room: Mutex::new(()),
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

    fn partial_path(&self, id: &BlobId, ext: &str) -> PathBuf {
        self.dir
            .join("partial")
            .join(format!("{}{ext}", id.to_hex()))
    }

    /// Counts a fetch of `len` bytes (already reserved by `make_room`).
    fn fetched(&self, len: u64) {
        let mut r = lock(&self.report);
        r.fetched += 1;
        r.fetched_bytes += len;
        r.unreachable = false;
    }

    fn failed(&self, what: &str, e: &FetchError) {
        tracing::warn!("fetching {what} failed: {e}");
        let mut r = lock(&self.report);
        r.failures += 1;
        *r.failures_by_reason.entry(e.reason()).or_default() += 1;
        r.unreachable = true;
        r.last_error = Some(format!("fetching {what}: {e}"));
    }

    fn sub_bytes(&self, len: u64) {
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(len))
            });
    }

    /// The cached path of `id`, all of it fetched first when missing (a
    /// large file too: every piece). On a failed fetch the path is
    /// returned all the same (nothing is there, so the view's open fails
    /// with EIO) and the reason is kept.
    pub fn path_for(&self, id: &BlobId) -> PathBuf {
        let path = self.blob_path(id);
        if let Err(e) = self.ensure_whole(id) {
            // Already counted and logged by the fetch.
            tracing::debug!(blob = %id.to_hex(), "not cached: {e}");
        }
        path
    }

    /// Makes `blobs/<id>` whole: bytes fetched for it.
    pub fn ensure_whole(&self, id: &BlobId) -> Result<u64, FetchError> {
        let path = self.blob_path(id);
        if let Ok(f) = File::options().write(true).open(&path) {
            // The least recently used blobs are evicted first.
            let _ = f.set_modified(SystemTime::now());
            return Ok(0);
        }
        match self.partial(id)? {
            Some(part) => part.fill(self),
            None => self.fetch_small(id, &path),
        }
    }

    /// A reader for `id` when it is a large file not yet whole in the
    /// cache (`None`: open the whole blob's path).
    pub fn open_partial(&self, id: &BlobId) -> Result<Option<Arc<Partial>>, FetchError> {
        if self.blob_path(id).exists() {
            return Ok(None);
        }
        self.partial(id)
    }

    /// The live [`Partial`] of `id`, opened (its piece list fetched) when
    /// none is; `None` when `id` is not a large file.
    fn partial(&self, id: &BlobId) -> Result<Option<Arc<Partial>>, FetchError> {
        let Some(list_id) = lock(&self.pieces).get(id).copied() else {
            return Ok(None);
        };
        let mut partials = lock(&self.partials);
        if let Some(p) = partials.get(id).and_then(Weak::upgrade) {
            return Ok(Some(p));
        }
        let part = Arc::new(
            Partial::open(self, *id, list_id)
                .inspect_err(|e| self.failed(&format!("the piece list of {}", id.to_hex()), e))?,
        );
        partials.retain(|_, w| w.strong_count() > 0);
        partials.insert(*id, Arc::downgrade(&part));
        Ok(Some(part))
    }

    /// Fetches a file published as one object into `dest`.
    fn fetch_small(&self, id: &BlobId, dest: &Path) -> Result<u64, FetchError> {
        let temp = self.dir.join("tmp").join(format!(
            "{}.{}",
            id.to_hex(),
            self.next_temp.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let bytes = self.rt.block_on(get_verified(
                &*self.store,
                &layout::blob(id),
                id,
                PIECE_SIZE,
            ))?;
            let len = bytes.len() as u64;
            self.make_room(len, None)?;
            let placed = (|| {
                let mut f = File::create(&temp)?;
                f.write_all(&bytes)?;
                f.sync_all()?;
                std::fs::rename(&temp, dest)
            })();
            if let Err(e) = placed {
                self.sub_bytes(len);
                return Err(e.into());
            }
            self.fetched(len);
            Ok(len)
        })();
        if let Err(e) = &result {
            let _ = std::fs::remove_file(&temp);
            self.failed(&id.to_hex(), e);
        }
        result
    }

    /// Evicts until `need` more bytes fit under the limit, and reserves
    /// them (a caller that then fails to write gives them back); the least
    /// recently used files go first, never a large file being read (nor
    /// `keep`). Fails when they still do not fit.
    fn make_room(&self, need: u64, keep: Option<&BlobId>) -> Result<(), FetchError> {
        let _one = lock(&self.room);
        if self.bytes.load(Ordering::Relaxed) + need <= self.limit {
            self.bytes.fetch_add(need, Ordering::Relaxed);
            return Ok(());
        }
        let live: Vec<BlobId> = lock(&self.partials)
            .iter()
            .filter(|(_, w)| w.strong_count() > 0)
            .map(|(id, _)| *id)
            .collect();
        let mut candidates: Vec<(SystemTime, u64, BlobId, bool)> = Vec::new();
        for (sub, partial) in [("blobs", false), ("partial", true)] {
            let Ok(entries) = std::fs::read_dir(self.dir.join(sub)) else {
                continue;
            };
            for e in entries.filter_map(|e| e.ok()) {
                let Some(id) = BlobId::from_hex(&e.file_name().to_string_lossy()) else {
                    continue;
                };
                if (partial && live.contains(&id)) || Some(&id) == keep {
                    continue;
                }
                let Ok(m) = e.metadata() else { continue };
                let len = if partial { disk_bytes(&m) } else { m.len() };
                candidates.push((
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    len,
                    id,
                    partial,
                ));
            }
        }
        candidates.sort();
        // Down to 90 % of the limit, so the next fetches need not evict.
        let target = (self.limit / 10 * 9).saturating_sub(need);
        let mut evicted = 0;
        for (_, len, id, partial) in candidates {
            if self.bytes.load(Ordering::Relaxed) <= target {
                break;
            }
            let removed = if partial {
                let r = std::fs::remove_file(self.partial_path(&id, ""));
                let _ = std::fs::remove_file(self.partial_path(&id, ".have"));
                r
            } else {
                std::fs::remove_file(self.blob_path(&id))
            };
            if removed.is_ok() {
                self.sub_bytes(len);
                evicted += 1;
            }
        }
        lock(&self.report).evicted += evicted;
        let bytes = self.bytes.load(Ordering::Relaxed);
        if bytes + need > self.limit {
            return Err(FetchError::Full {
                need,
                limit: self.limit,
                held: bytes,
            });
        }
        self.bytes.fetch_add(need, Ordering::Relaxed);
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Missing,
    /// Written before a restart: hashed again before it is served.
    Claimed,
    Fetching,
    Present,
}

/// A large file being filled piece by piece (see the module doc). Shared
/// by every handle reading it; dropped (its file kept) when none is.
pub struct Partial {
    id: BlobId,
    list: PieceList,
    file: File,
    /// The same file opened `O_DIRECT` (when the filesystem allows it):
    /// pieces are written through it, not through the page cache. A
    /// buffered write into fresh page-cache pages was the largest cost of
    /// a cold read (docs/BENCHMARKS.md); the pieces being read are served
    /// from memory instead ([`Partial::mem`]).
    direct: Option<File>,
    /// Cleared when the filesystem refuses a direct write (`EINVAL`).
    direct_ok: AtomicBool,
    have: Mutex<File>,
    pieces: Mutex<Vec<Piece>>,
    changed: Condvar,
    /// The thread moving the filled file to `blobs/`.
    placing: Mutex<Option<std::thread::JoinHandle<()>>>,
    mem: Mutex<Mem>,
}

/// A piece's bytes at a page-aligned address (as `O_DIRECT` needs: the
/// pieces are read into it that way from a folder, and written from it).
struct PieceBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl PieceBuf {
    fn new(capacity: usize) -> PieceBuf {
        let mem = vec![0u8; capacity + DIRECT_ALIGN];
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        PieceBuf { mem, start, len: 0 }
    }

    fn capacity(&self) -> usize {
        self.mem.len() - self.start
    }

    /// The first `len` bytes, to be filled (`len` at most the capacity).
    fn fill(&mut self, len: usize) -> &mut [u8] {
        self.len = len;
        &mut self.mem[self.start..self.start + len]
    }

    fn bytes(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }
}

/// A kept piece lent to a read's reply ([`Bytes::from_owner`]).
struct KeptPiece(Arc<PieceBuf>);

impl AsRef<[u8]> for KeptPiece {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// A [`Partial`]'s pieces in memory: verified pieces, least recently
/// used first, and buffers to reuse (fresh memory costs a page fault per
/// page). Dropped with the `Partial` when its last reader closes.
#[derive(Default)]
struct Mem {
    kept: Vec<(usize, Arc<PieceBuf>)>,
    spare: Vec<PieceBuf>,
}

impl Partial {
    fn open(cache: &BlobCache, id: BlobId, list_id: BlobId) -> Result<Partial, FetchError> {
        let list_path = cache.partial_path(&id, ".list");
        // The local copy when it verifies (restart in an outage), else
        // the storage's.
        let list = match std::fs::read(&list_path)
            .ok()
            .filter(|b| layout::content_id(b) == list_id)
            .and_then(|b| PieceList::decode(&b).ok())
        {
            Some(l) => l,
            None => {
                let l = cache.rt.block_on(get_pieces(&*cache.store, &list_id))?;
                crate::durable::write_atomic(&list_path, &l.encode())?;
                l
            }
        };
        let path = cache.partial_path(&id, "");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if file.metadata()?.len() != list.size {
            file.set_len(list.size)?;
        }
        let _ = file.set_modified(SystemTime::now());
        let mut pieces = vec![Piece::Missing; list.pieces.len()];
        let have_path = cache.partial_path(&id, ".have");
        let mut log = Vec::new();
        if let Ok(mut f) = File::open(&have_path) {
            f.read_to_end(&mut log)?;
        }
        for c in log.chunks_exact(4) {
            let i = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
            if let Some(p) = pieces.get_mut(i) {
                *p = Piece::Claimed;
            }
        }
        let have = File::options().append(true).create(true).open(&have_path)?;
        // tmpfs (before 6.6) and some others refuse O_DIRECT: buffered.
        let direct = File::options()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .ok();
        Ok(Partial {
            id,
            list,
            file,
            direct,
            direct_ok: AtomicBool::new(true),
            have: Mutex::new(have),
            pieces: Mutex::new(pieces),
            changed: Condvar::new(),
            placing: Mutex::new(None),
            mem: Mutex::new(Mem::default()),
        })
    }

    pub fn size(&self) -> u64 {
        self.list.size
    }

    /// Up to `size` bytes at `offset` (short only at the end of the file),
    /// fetching the pieces they lie in first; then starts fetching the
    /// next [`READ_AHEAD`] pieces in the background.
    pub fn read_at(
        self: &Arc<Self>,
        cache: &Arc<BlobCache>,
        offset: u64,
        size: u32,
    ) -> Result<Bytes, FetchError> {
        let end = (offset + u64::from(size)).min(self.list.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let first = self.list.piece_at(offset);
        let last = self.list.piece_at(end - 1);
        for i in first..=last {
            self.ensure(cache, i, true)?;
        }
        // After the read's own pieces: read-ahead never takes the room
        // the read needs.
        self.read_ahead(
            cache,
            last + 1..(last + 1 + READ_AHEAD).min(self.list.pieces.len()),
        );
        // Within one kept piece (1 MiB reads of 8 MiB pieces, nearly
        // every read): the reply is a slice of the piece, not a copy.
        if first == last {
            if let Some(p) = self.kept(first) {
                let start = self.list.range(first).start;
                return Ok(Bytes::from_owner(KeptPiece(p))
                    .slice((offset - start) as usize..(end - start) as usize));
            }
        }
        let mut buf = Vec::with_capacity((end - offset) as usize);
        for i in first..=last {
            let r = self.list.range(i);
            let (from, to) = (offset.max(r.start), end.min(r.end));
            match self.kept(i) {
                Some(p) => buf.extend_from_slice(
                    &p.bytes()[(from - r.start) as usize..(to - r.start) as usize],
                ),
                // Present on disk (a restart's pieces, or one no longer
                // in memory).
                None => {
                    let at = buf.len();
                    buf.resize(at + (to - from) as usize, 0);
                    self.file.read_exact_at(&mut buf[at..], from)?;
                }
            }
        }
        Ok(Bytes::from(buf))
    }

    /// Piece `i` from memory (marked most recently used).
    fn kept(&self, i: usize) -> Option<Arc<PieceBuf>> {
        let mut mem = lock(&self.mem);
        let at = mem.kept.iter().position(|(k, _)| *k == i)?;
        let entry = mem.kept.remove(at);
        let p = Arc::clone(&entry.1);
        mem.kept.push(entry);
        Some(p)
    }

    /// A buffer for a piece of `len` bytes: a spare one when there is.
    fn buffer(&self, len: usize) -> PieceBuf {
        let mut mem = lock(&self.mem);
        match mem.spare.iter().position(|b| b.capacity() >= len) {
            Some(at) => mem.spare.swap_remove(at),
            None => PieceBuf::new(len),
        }
    }

    fn give_back(mem: &mut Mem, buf: PieceBuf) {
        if mem.spare.len() < SPARE_BUFFERS {
            mem.spare.push(buf);
        }
    }

    /// Keeps verified piece `i` in memory, dropping the least recently
    /// used beyond [`KEPT_PIECES`].
    fn keep(&self, i: usize, buf: PieceBuf) {
        let mut mem = lock(&self.mem);
        mem.kept.push((i, Arc::new(buf)));
        while mem.kept.len() > KEPT_PIECES {
            let (_, old) = mem.kept.remove(0);
            // Still being copied by a read: freed by it.
            if let Ok(old) = Arc::try_unwrap(old) {
                Self::give_back(&mut mem, old);
            }
        }
    }

    /// Writes a verified piece at `start`: its page-aligned part through
    /// the `O_DIRECT` descriptor when there is one, the rest buffered.
    fn write_piece(&self, data: &[u8], start: u64) -> std::io::Result<()> {
        let mut direct_len = 0;
        if let Some(direct) = &self.direct {
            if self.direct_ok.load(Ordering::Relaxed) && start % DIRECT_ALIGN as u64 == 0 {
                let len = data.len() / DIRECT_ALIGN * DIRECT_ALIGN;
                match direct.write_all_at(&data[..len], start) {
                    Ok(()) => direct_len = len,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        tracing::debug!("O_DIRECT refused, pieces written buffered: {e}");
                        self.direct_ok.store(false, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.file
            .write_all_at(&data[direct_len..], start + direct_len as u64)
    }

    /// Fetches every missing piece (`WARM_PARALLEL` at a time) and moves
    /// the file to `blobs/`: bytes fetched.
    fn fill(self: &Arc<Self>, cache: &BlobCache) -> Result<u64, FetchError> {
        let before = cache.report().fetched_bytes;
        let n = self.list.pieces.len();
        let next = AtomicU64::new(0);
        std::thread::scope(|s| -> Result<(), FetchError> {
            let workers: Vec<_> = (0..WARM_PARALLEL.min(n))
                .map(|_| {
                    s.spawn(|| -> Result<(), FetchError> {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                            if i >= n {
                                return Ok(());
                            }
                            self.ensure(cache, i, false)?;
                        }
                    })
                })
                .collect();
            let mut result = Ok(());
            for w in workers {
                let r = w.join().unwrap_or_else(|_| {
                    Err(FetchError::Io(std::io::Error::other(
                        "a fetch thread panicked",
                    )))
                });
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })?;
        // Warmed means whole in `blobs/`: joined under the lock, so a
        // second `fill` waits for the same placing to finish.
        let mut placing = lock(&self.placing);
        if let Some(t) = placing.take() {
            let _ = t.join();
        }
        drop(placing);
        Ok(cache.report().fetched_bytes.saturating_sub(before))
    }

    /// Starts background fetches of `range`'s missing pieces.
    fn read_ahead(self: &Arc<Self>, cache: &Arc<BlobCache>, range: std::ops::Range<usize>) {
        for i in range {
            {
                let mut p = lock(&self.pieces);
                if p[i] != Piece::Missing {
                    continue;
                }
                p[i] = Piece::Fetching;
            }
            let part = Arc::clone(self);
            let cache_ = Arc::clone(cache);
            // A thread of its own: the fetch blocks on the runtime.
            let spawned = std::thread::Builder::new()
                .name("stagefs-read-ahead".into())
                .spawn(move || {
                    let r = part.fetch(&cache_, i, true).map(Some);
                    part.settle(&cache_, i, r);
                });
            if spawned.is_err() {
                lock(&self.pieces)[i] = Piece::Missing;
            }
        }
    }

    /// Blocks until piece `i` is present: fetches it (kept in memory for
    /// reads when `keep`), or waits for the fetch under way.
    fn ensure(self: &Arc<Self>, cache: &BlobCache, i: usize, keep: bool) -> Result<(), FetchError> {
        let claimed = {
            let mut p = lock(&self.pieces);
            loop {
                match p[i] {
                    Piece::Present => return Ok(()),
                    Piece::Fetching => {
                        p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
                    }
                    Piece::Missing | Piece::Claimed => {
                        let claimed = p[i] == Piece::Claimed;
                        p[i] = Piece::Fetching;
                        break claimed;
                    }
                }
            }
        };
        let r = if claimed && self.verify_local(i) {
            Ok(None)
        } else {
            self.fetch(cache, i, keep).map(Some)
        };
        let ok = r.as_ref().map(|_| ()).map_err(|e| e.to_string());
        self.settle(cache, i, r);
        ok.map_err(|e| FetchError::Io(std::io::Error::other(e)))
    }

    /// Whether piece `i`, written before a restart, is intact.
    fn verify_local(&self, i: usize) -> bool {
        let r = self.list.range(i);
        let mut buf = vec![0u8; (r.end - r.start) as usize];
        self.file.read_exact_at(&mut buf, r.start).is_ok()
            && layout::content_id(&buf) == self.list.pieces[i]
    }

    /// Fetches, verifies and writes piece `i`, and keeps it in memory
    /// for reads when `keep`: its length.
    fn fetch(&self, cache: &BlobCache, i: usize, keep: bool) -> Result<u64, FetchError> {
        let piece = self.list.pieces[i];
        let range = self.list.range(i);
        let len = range.end - range.start;
        let mut buf = self.buffer(len as usize);
        if let Err(e) = cache.rt.block_on(get_verified_into(
            &*cache.store,
            &layout::blob(&piece),
            &piece,
            buf.fill(len as usize),
        )) {
            Self::give_back(&mut lock(&self.mem), buf);
            return Err(e.into());
        }
        if let Err(e) = cache.make_room(len, Some(&self.id)) {
            Self::give_back(&mut lock(&self.mem), buf);
            return Err(e);
        }
        let written = self
            .write_piece(buf.bytes(), range.start)
            .and_then(|_| lock(&self.have).write_all(&(i as u32).to_le_bytes()));
        if let Err(e) = written {
            cache.sub_bytes(len);
            Self::give_back(&mut lock(&self.mem), buf);
            return Err(e.into());
        }
        cache.fetched(len);
        if keep {
            self.keep(i, buf);
        } else {
            Self::give_back(&mut lock(&self.mem), buf);
        }
        Ok(len)
    }

    /// Records the outcome of piece `i`'s fetch and wakes its waiters;
    /// with every piece present, moves the file to `blobs/`.
    fn settle(self: &Arc<Self>, cache: &BlobCache, i: usize, r: Result<Option<u64>, FetchError>) {
        if let Err(e) = &r {
            cache.failed(&format!("piece {i} of {}", self.id.to_hex()), e);
        }
        let mut p = lock(&self.pieces);
        p[i] = match &r {
            Ok(_) => Piece::Present,
            Err(_) => Piece::Missing,
        };
        if r.is_ok() && p.iter().all(|s| *s == Piece::Present) {
            // The flush of the whole file to disk must not hold up the
            // read that fetched the last piece: a thread of its own (the
            // file is served from `partial/` meanwhile). It is recorded
            // before any waiter wakes, so a `fill` that saw the last piece
            // arrive always finds it to join.
            let part = Arc::clone(self);
            let (dest, src) = (cache.blob_path(&self.id), cache.partial_path(&self.id, ""));
            let extras = [
                cache.partial_path(&self.id, ".have"),
                cache.partial_path(&self.id, ".list"),
            ];
            let spawned = std::thread::Builder::new()
                .name("stagefs-place".into())
                .spawn(move || part.complete(&src, &dest, &extras));
            match spawned {
                Ok(t) => *lock(&self.placing) = Some(t),
                Err(e) => tracing::warn!("placing a filled file: {e}"),
            }
        }
        self.changed.notify_all();
    }

    /// Moves the whole file `src` to `dest` in `blobs/` once it is on
    /// disk (later opens read it there), and drops its piece records.
    fn complete(&self, src: &Path, dest: &Path, extras: &[PathBuf]) {
        match self
            .file
            .sync_all()
            .and_then(|_| std::fs::rename(src, dest))
        {
            Ok(()) => {
                for e in extras {
                    let _ = std::fs::remove_file(e);
                }
            }
            // Already moved by another completion, or evicted: harmless.
            Err(e) => tracing::debug!(blob = %self.id.to_hex(), "placing a filled file: {e}"),
        }
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

#[cfg(test)]
mod piece_tests {
    use super::*;
    use crate::publish::open_store;
    use object_store::{ObjectStoreExt, PutPayload};

    /// A large file of `n` 64 KiB pieces published at a fresh URL, and a
    /// cache of `limit` bytes over it.
    fn published(
        n: usize,
        limit: u64,
    ) -> (
        tempfile::TempDir,
        tokio::runtime::Runtime,
        Arc<BlobCache>,
        BlobId,
        Vec<u8>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("pub").display());
        let store = open_store(&url).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let piece = 64usize << 10;
        let content: Vec<u8> = (0..n * piece - 100).map(|i| (i * 7 % 251) as u8).collect();
        let ids: Vec<BlobId> = content.chunks(piece).map(layout::content_id).collect();
        for (c, id) in content.chunks(piece).zip(&ids) {
            rt.block_on(store.put(&layout::blob(id), PutPayload::from(c.to_vec())))
                .unwrap();
        }
        let list = PieceList {
            size: content.len() as u64,
            piece_size: piece as u32,
            pieces: ids,
        };
        let list_id = layout::content_id(&list.encode());
        rt.block_on(store.put(&layout::pieces(&list_id), PutPayload::from(list.encode())))
            .unwrap();
        let file = layout::content_id(&content);
        let cache = Arc::new(
            BlobCache::open(&dir.path().join("cache"), store, rt.handle().clone(), limit).unwrap(),
        );
        cache.add_piece_lists(&HashMap::from([(file, list_id)]));
        (dir, rt, cache, file, content)
    }

    #[test]
    fn a_read_in_the_middle_fetches_only_its_pieces_and_what_follows() {
        let (_dir, _rt, cache, file, content) = published(32, 1 << 30);
        let part = cache.open_partial(&file).unwrap().expect("a large file");
        let at = 20 * (64 << 10) + 5;
        assert_eq!(
            part.read_at(&cache, at as u64, 4096).unwrap(),
            content[at..at + 4096]
        );
        let r = cache.report();
        assert!(r.fetched <= 1 + READ_AHEAD as u64, "{r:?}");
        assert!(!cache.blob_path(&file).exists());
        // Warming fills the rest; the whole file then opens as a blob.
        drop(part);
        cache.ensure_whole(&file).unwrap();
        assert_eq!(std::fs::read(cache.blob_path(&file)).unwrap(), content);
        assert_eq!(cache.report().fetched, 32, "each piece fetched once");
        assert!(cache.open_partial(&file).unwrap().is_none());
    }

    #[test]
    fn reads_are_served_from_kept_pieces_and_from_the_file_once_dropped() {
        let n = KEPT_PIECES * 2 + 3;
        let (_dir, _rt, cache, file, content) = published(n, 1 << 30);
        let part = cache.open_partial(&file).unwrap().unwrap();
        // Reads across piece boundaries, in order, then the first pieces
        // again: no longer in memory, read back from the file.
        let step = 50_000;
        let mut at = 0;
        while at < content.len() {
            let got = part.read_at(&cache, at as u64, step as u32).unwrap();
            assert_eq!(got, content[at..(at + step).min(content.len())], "at {at}");
            at += step;
        }
        assert!(part.kept(0).is_none());
        // A read within a kept piece lends the piece: no copy.
        let last = n - 1;
        let start = (last * (64 << 10)) as u64;
        let got = part.read_at(&cache, start + 10, 100).unwrap();
        let kept = part.kept(last).expect("the last piece read is kept");
        assert_eq!(got.as_ptr(), kept.bytes()[10..].as_ptr());
        assert_eq!(got, content[start as usize + 10..start as usize + 110]);
        assert_eq!(
            part.read_at(&cache, 100, 200_000).unwrap(),
            content[100..200_100]
        );
        assert!(lock(&part.mem).kept.len() <= KEPT_PIECES);
        assert_eq!(cache.report().fetched, n as u64, "each piece fetched once");
    }

    #[test]
    fn a_piece_that_does_not_fit_is_a_clear_error_and_nothing_is_served() {
        // Room for two pieces: the file being read holds them.
        let (_dir, _rt, cache, file, content) = published(8, 2 * (64 << 10));
        let part = cache.open_partial(&file).unwrap().unwrap();
        assert_eq!(part.read_at(&cache, 0, 100).unwrap(), content[..100]);
        let mut failed = None;
        for i in 1..8u64 {
            if let Err(e) = part.read_at(&cache, i * (64 << 10), 100) {
                failed = Some(e.to_string());
                break;
            }
        }
        let failed = failed.expect("the bound holds");
        assert!(failed.contains("the cache is full"), "{failed}");
        let r = cache.report();
        assert!(r.bytes <= 2 * (64 << 10), "{r:?}");
        assert!(r.unreachable && r.last_error.is_some(), "{r:?}");
    }
}
