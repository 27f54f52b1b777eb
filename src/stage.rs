//! The content-addressed blob store under `<state>/blobs/`, and the fetch of
//! one source file into it (DESIGN "stager", SPEC §3 rule 2).
//!
//! Owns every file below `<state>/blobs/`:
//! - `blobs/<ab>/<abcd…>`: one blob per distinct sha256 (64 lower-case hex
//!   digits, fanned out by the first two), holding exactly the bytes that hash
//!   to its name;
//! - `blobs/tmp/<0-15>/`: temp files of fetches in progress, all removed by
//!   [`BlobStore::open`] because after a crash they are garbage.
//!
//! Invariants:
//! - A blob path only ever holds verified, durable bytes: a fetch copies into
//!   a temp file while counting and hashing and compares size and sha256
//!   with the [`FileRef`]; then either [`BlobStore::fetch`] `sync_data`s it,
//!   renames it into place (never replacing an existing blob) and fsyncs the
//!   fan-out directory (and `blobs/` when the fan-out directory is new), or
//!   [`BlobStore::fetch_unsynced`] leaves it in `tmp/` for
//!   [`BlobStore::publish`] to make a whole group durable at once:
//!   `fdatasync` of every temp through its own descriptor (in parallel;
//!   a copy the caller already synced with [`Unsynced::sync_data`] is not
//!   synced twice), the renames, one fsync per touched fan-out directory
//!   (in parallel too); or, for a group of [`GROUP_SYNC_MIN`] or more on a
//!   local disk filesystem ([`GroupSync`]), one `syncfs`, each copy's own
//!   writeback result, the renames and one more `syncfs`. A fan-out
//!   directory a group creates becomes durable in `blobs/` with that
//!   group's renames (one fsync of `blobs/` among the directory fsyncs, or
//!   the second `syncfs`), not by a sync of its own. So a blob present
//!   after a crash is complete, and a blob at its path is durable
//!   (durability order, step 1).
//! - Same content is stored once, whatever file names reference it.
//! - [`BlobStore::staged_bytes`] is the total size of the stored blobs (and
//!   [`BlobStore::stored_blobs`] their number): scanned
//!   on open, then kept up to date by fetch and remove.
//!
//! Source and change-management files are opened only beneath their root
//! and only when regular ([`crate::source_open`]): a symlink out of the
//! root, a FIFO or a device node is a source problem like a missing file.
//! A native file's root is `--source-root` (or `--cm-root`); a Hive file's
//! is the `--source-map` directory its URI (or its cm root's URI) was
//! mapped through ([`FileRef::source_dir`], [`FileRef::cm_dir`]).
//!
//! Errors split by side: whatever is wrong at the *source* (missing, not
//! readable, escaping its root, not a regular file, wrong size, wrong
//! sha256, read error) makes that copy unusable and
//! the next place is tried; when none is usable the fetch fails with
//! [`StageError::Unavailable`] naming what was found where. Failures in the
//! *store* itself end the fetch at once: [`StageError::NoSpace`] for a full
//! disk, [`StageError::Io`] for anything else. The caller retries all of them
//! with [`backoff`].
//!
//! Called by the stager's fetch workers (in parallel: every method takes
//! `&self`), by the committer (`contains`), by GC (`list`, `remove`) and by
//! the status report (`staged_bytes`). The daemon's state lock guarantees one
//! process per store; within it, GC must not remove a blob that a fetch or a
//! retained version still needs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::durable::{fsync_dir, Writeback};
use crate::event::{is_valid_source_path, BlobId, FileRef, Verify};
use crate::source_open::open_beneath_sized;

/// Read → hash → write in chunks this large: big enough that syscall and
/// per-call hashing overhead vanish, small enough to stay in L2/L3.
const COPY_BUFFER_BYTES: usize = 1 << 20;
/// Start writeback of the temp file every this many bytes, so that the final
/// `sync_data` waits for the tail only, and the disk works while we hash.
#[cfg(target_os = "linux")]
const WRITEBACK_CHUNK_BYTES: u64 = 16 << 20;
/// Bytes [`copy_in_kernel`] copies with `copy_file_range` before hashing
/// them back: small enough that the hash follows the copy closely (the
/// piece is still in the page cache, and an 8 MiB file has two pieces to
/// overlap), large enough that the calls cost nothing. Each call is a sign
/// of progress for the fetch timeout.
const KERNEL_COPY_PIECE_BYTES: u64 = 4 << 20;
/// Files at least this large hash on a second thread while the copy goes
/// on ([`copy_in_kernel`], [`copy_pipelined`]); below it, starting a thread
/// costs more than the overlap saves.
const PIPELINE_MIN_BYTES: u64 = 8 << 20;
/// Buffers circulating in the pipeline: enough to keep both threads busy.
const PIPELINE_BUFFERS: usize = 4;
const TMP_DIR_NAME: &str = "tmp";
const TMP_SUFFIX: &str = ".tmp";
/// Temp files are spread over `tmp/0` … `tmp/15`. Creating a file takes
/// its directory's lock while the filesystem allocates the inode, so
/// parallel copies into one directory wait for each other: a bootstrap of
/// 15,000 small files spent 27 % of its samples spinning on the lock of
/// `tmp/` (`perf`, docs/BENCHMARKS.md "Bootstrap").
const TMP_SHARDS: u64 = 16;

/// Whoever watches the copies on a thread for signs of progress (the
/// fetch pool's deadline, [`crate::replicate::fetch`]).
pub trait ProgressWatch: Send + Sync {
    /// A chunk was read, copied or hashed.
    fn beat(&self);
}

thread_local! {
    /// The watch of the copies on this thread, if any.
    static WATCH: std::cell::RefCell<Option<Arc<dyn ProgressWatch>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes `watch` hear the [`heartbeat`]s of the copies on this thread
/// (`None`: nobody).
pub fn watch_this_thread(watch: Option<Arc<dyn ProgressWatch>>) {
    WATCH.with(|w| *w.borrow_mut() = watch);
}

/// Tells the watch of this thread that the copy is making progress (a
/// chunk was read, copied or hashed). A no-op on a thread nobody watches.
pub fn heartbeat() {
    WATCH.with(|w| {
        if let Some(watch) = w.borrow().as_ref() {
            watch.beat();
        }
    });
}

/// Where a fetched blob came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchOutcome {
    /// The blob was already stored; nothing was copied.
    AlreadyPresent,
    /// Copied from `source_root/<path>`.
    FromSource,
    /// Copied from the change-management root.
    FromChangeManagement,
}

/// Why a fetch (or another store operation) failed. All are transient from
/// the stager's point of view: it retries with [`backoff`].
#[derive(thiserror::Error, Debug)]
pub enum StageError {
    /// Neither the source nor the change-management root has a verified copy.
    /// `detail` says what was found at each place, naming the paths.
    #[error("{path} is unavailable: {detail}")]
    Unavailable { path: String, detail: String },
    /// The disk holding the store is full (ENOSPC / EDQUOT); replication
    /// resumes once space is freed.
    #[error("disk full writing {path}")]
    NoSpace { path: String },
    /// Any other I/O error in the store; `context` is a verb phrase with the path.
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    /// Reading the source made no progress for `after` (a hung NFS or FUSE
    /// source): the fetch workers abandoned the attempt
    /// ([`crate::replicate::fetch`]).
    #[error("read timed out after {after:?} with no progress")]
    TimedOut { after: Duration },
}

impl StageError {
    /// Every stage error may clear up on its own (the file arrives, space is
    /// freed, the disk recovers), so the stager retries all of them.
    pub fn is_retryable(&self) -> bool {
        match self {
            StageError::Unavailable { .. }
            | StageError::NoSpace { .. }
            | StageError::Io { .. }
            | StageError::TimedOut { .. } => true,
        }
    }

    /// Short label for the status report's `stalled.reason`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            StageError::Unavailable { .. } => "unavailable",
            StageError::NoSpace { .. } => "disk full",
            StageError::Io { .. } => "io",
            StageError::TimedOut { .. } => "timed out",
        }
    }
}

/// Delay before retry number `attempt` (0-based) of a failed fetch: 100 ms,
/// doubling, capped at 10 s (SPEC §3 rule 2).
pub fn backoff(attempt: u32) -> Duration {
    const FIRST_MS: u64 = 100;
    const CAP_MS: u64 = 10_000;
    let factor = 1u64.checked_shl(attempt).unwrap_or(u64::MAX);
    Duration::from_millis(FIRST_MS.saturating_mul(factor).min(CAP_MS))
}

/// The blob store. `Send + Sync`; share it through an `Arc`.
#[derive(Debug)]
pub struct BlobStore {
    /// `<state>/blobs`
    root: PathBuf,
    /// `<state>/blobs/tmp`
    tmp_dir: PathBuf,
    staged_bytes: AtomicU64,
    /// How many blobs are stored; kept with `staged_bytes`.
    stored_blobs: AtomicU64,
    /// Makes temp names unique within this process, so parallel fetches of
    /// one blob never share a temp file; the pid in the name is for humans
    /// reading a leftover.
    next_tmp: AtomicU64,
    /// This process's id, for the temp names (read once: `getpid` is a
    /// system call per temp otherwise).
    pid: u32,
    /// `fan_outs[b]`: what this store knows of the fan-out directory
    /// `<root>/<b as hex>` ([`FAN_OUT_UNKNOWN`], [`FAN_OUT_EXISTS`],
    /// [`FAN_OUT_DURABLE`]). Placing a blob in a directory known to exist
    /// needs no `mkdir`; one not known durable makes the placing caller
    /// sync `root` too (once per group, not once per directory). Fan-out
    /// directories are never removed; a rename that finds one gone anyway
    /// creates it again.
    fan_outs: Box<[AtomicU8]>,
    /// Open on `root` when a whole group can be made durable with one
    /// `syncfs` (see [`GroupSync`]); `None`: one `fdatasync` per copy.
    group_sync: Option<File>,
    /// Makes the checks beyond sha256 that files name ([`SourceChecks`]).
    checks: Arc<dyn SourceChecks>,
}

/// [`BlobStore`]`::fan_outs`: not looked at yet by this store.
const FAN_OUT_UNKNOWN: u8 = 0;
/// The fan-out directory exists (this store created or found it), but its
/// entry in `blobs/` may not be durable yet.
const FAN_OUT_EXISTS: u8 = 1;
/// The fan-out directory exists and `blobs/` was synced after it did.
const FAN_OUT_DURABLE: u8 = 2;

/// Copies in one [`BlobStore::publish`] from which a `syncfs` of the
/// store's filesystem replaces one `fdatasync` per copy. Measured
/// (docs/BENCHMARKS.md, "Blob group durability"): a single small blob is
/// faster with its own `fdatasync` (a `syncfs` also flushes every other
/// writer's dirty data), groups of 64 and more small blobs are 1.5–6×
/// faster with `syncfs`.
pub const GROUP_SYNC_MIN: usize = 32;

/// How [`BlobStore::publish`] makes a large group durable, chosen when the
/// store is opened from the filesystem that holds it.
///
/// `syncfs` makes a filesystem's data and metadata durable only where the
/// filesystem itself writes to a device: ext2/3/4, XFS and btrfs (and
/// tmpfs, where nothing is durable anyway). On anything else (a FUSE or
/// network filesystem, whose server may not see a `syncfs` at all) every
/// copy gets its own `fdatasync`. `STAGEFS_BLOB_SYNC=file` forces the
/// per-copy way everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupSync {
    /// One `fdatasync` per copy, one `fsync` per touched fan-out directory.
    PerFile,
    /// One `syncfs` before the renames and one after.
    Filesystem,
}

impl GroupSync {
    /// The way for a store at `root`.
    fn for_store(root: &Path) -> GroupSync {
        if std::env::var("STAGEFS_BLOB_SYNC").is_ok_and(|v| v == "file") {
            return GroupSync::PerFile;
        }
        const EXT4: i64 = 0xEF53;
        const XFS: i64 = 0x5846_5342;
        const BTRFS: i64 = 0x9123_683E;
        const TMPFS: i64 = 0x0102_1994;
        match filesystem_type(root) {
            Some(EXT4 | XFS | BTRFS | TMPFS) => GroupSync::Filesystem,
            _ => GroupSync::PerFile,
        }
    }
}

/// `statfs(2)`'s `f_type` of the filesystem holding `path`.
fn filesystem_type(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs fills a zeroed struct for a valid NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    Some(st.f_type as i64)
}

/// `syncfs(2)` of the filesystem `fd` is on.
fn syncfs(fd: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    #[cfg(test)]
    if let Some(errno) = test_hooks::injected_syncfs_errno() {
        return Err(io::Error::from_raw_os_error(errno));
    }
    // SAFETY: syncfs on a descriptor we own.
    if unsafe { libc::syncfs(fd.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl BlobStore {
    /// Opens (creating if needed) the store under `state_dir`, removes temp
    /// files left by a crash and sums the sizes of the stored blobs.
    /// `state_dir` itself must exist.
    pub fn open(state_dir: &Path) -> Result<BlobStore, StageError> {
        let root = state_dir.join("blobs");
        let tmp_dir = root.join(TMP_DIR_NAME);
        ensure_dir(&root)?;
        ensure_dir(&tmp_dir)?;
        for shard in 0..TMP_SHARDS {
            ensure_dir(&tmp_dir.join(shard.to_string()))?;
        }
        // Opened before any copy is written, so its `syncfs` reports every
        // writeback error of the filesystem from now on.
        let group_sync = match GroupSync::for_store(&root) {
            GroupSync::Filesystem => {
                Some(File::open(&root).map_err(|e| store_error("opening", &root, e))?)
            }
            GroupSync::PerFile => None,
        };
        let store = BlobStore {
            root,
            tmp_dir,
            staged_bytes: AtomicU64::new(0),
            stored_blobs: AtomicU64::new(0),
            next_tmp: AtomicU64::new(0),
            pid: std::process::id(),
            fan_outs: (0..256).map(|_| AtomicU8::new(FAN_OUT_UNKNOWN)).collect(),
            group_sync,
            checks: Arc::new(NoSourceChecks),
        };
        store.remove_leftover_temps()?;
        let (mut total, mut count) = (0u64, 0u64);
        store.for_each_blob(Sizes::Yes, |_, len| {
            total += len;
            count += 1;
        })?;
        store.staged_bytes.store(total, Ordering::Relaxed);
        store.stored_blobs.store(count, Ordering::Relaxed);
        Ok(store)
    }

    /// The store checking files also by what `checks` makes of their
    /// [`Verify`] (the Hive source's HDFS checksum); without it, a file
    /// that asks for more than size and sha256 is unusable.
    pub fn with_checks(mut self, checks: Arc<dyn SourceChecks>) -> BlobStore {
        self.checks = checks;
        self
    }

    /// Where the blob `id` is (or would be) stored.
    pub fn path(&self, id: &BlobId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join(&hex[..2]).join(hex)
    }

    /// True when the blob is stored. Only verified, synced blobs ever reach
    /// their path, so presence is proof of content.
    pub fn contains(&self, id: &BlobId) -> bool {
        fs::symlink_metadata(self.path(id)).is_ok_and(|m| m.is_file())
    }

    /// How [`BlobStore::publish`] makes groups of [`GROUP_SYNC_MIN`] or
    /// more copies durable on this store's filesystem.
    pub fn group_sync(&self) -> GroupSync {
        if self.group_sync.is_some() {
            GroupSync::Filesystem
        } else {
            GroupSync::PerFile
        }
    }

    /// Total size of the stored blobs.
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes.load(Ordering::Relaxed)
    }

    /// How many blobs are stored.
    pub fn stored_blobs(&self) -> u64 {
        self.stored_blobs.load(Ordering::Relaxed)
    }

    fn count_placed(&self, size: u64) {
        self.staged_bytes.fetch_add(size, Ordering::Relaxed);
        self.stored_blobs.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores the content `file` names, unless it is already stored: first
    /// from `source_root/<file.path>`, then from the change-management copies
    /// `<basename of path>_<sha256>` and `<file.name>_<sha256>` under
    /// `cm_root`. Returns where it came from. On `Ok` the blob is verified and
    /// durable; on `Err` nothing new is left at the blob path or in `tmp/`.
    pub fn fetch(
        &self,
        file: &FileRef,
        source_root: &Path,
        cm_root: Option<&Path>,
    ) -> Result<FetchOutcome, StageError> {
        if let Some((id, _)) = file.known() {
            if self.contains(&id) {
                // A parallel fetch may have renamed this blob in without having
                // fsynced the directory yet; syncing here keeps "Ok means
                // durable" true for every caller. On a clean directory it is cheap.
                self.sync_fan_out_dir(&id, false)?;
                return Ok(FetchOutcome::AlreadyPresent);
            }
        }
        let (origin, copy) = self.copy_from_first_usable(file, source_root, cm_root, true)?;
        if file.known().is_none() && self.contains(&copy.blob) {
            self.sync_fan_out_dir(&copy.blob, false)?;
            return Ok(FetchOutcome::AlreadyPresent);
        }
        self.install(copy.temp, &copy.blob, copy.size)?;
        Ok(origin)
    }

    /// Like [`BlobStore::fetch`], but leaves the verified copy in `tmp/`,
    /// neither synced nor in place: the stager makes a whole group durable
    /// with one [`BlobStore::publish`] before it commits, instead of two
    /// fsyncs per file. `copy` is `None` when the blob is already stored.
    /// Returns the content's blob and size: for a file not known by
    /// content (Hive), this is where they are learnt.
    pub fn fetch_unsynced(
        &self,
        file: &FileRef,
        source_root: &Path,
        cm_root: Option<&Path>,
    ) -> Result<Fetched, StageError> {
        if let Some((blob, size)) = file.known() {
            if self.contains(&blob) {
                // Blobs reach their path only through `install` or `publish`,
                // both of which return after the blob is durable.
                return Ok(Fetched {
                    outcome: FetchOutcome::AlreadyPresent,
                    blob,
                    size,
                    copy: None,
                });
            }
        }
        let (origin, copy) = self.copy_from_first_usable(file, source_root, cm_root, false)?;
        let (blob, size) = (copy.blob, copy.size);
        // A file learnt by reading keeps its copy even when the blob is
        // stored already: no tree names that blob for this file yet, so GC
        // may remove it before the stager records what the file resolved
        // to; publishing the copy puts it back (or finds it still there).
        Ok(Fetched {
            outcome: origin,
            blob,
            size,
            copy: Some(Unsynced {
                temp: copy.temp,
                id: blob,
                size,
                synced: false,
                source_after: copy.source_after,
            }),
        })
    }

    /// [`BlobStore::fetch_unsynced`] from the first of `files` that gives
    /// the content: they are file entries naming one blob (copies of the
    /// same bytes at several paths), tried in order. Returns which one
    /// gave it. A store-side error (disk full, I/O in the store) ends the
    /// attempt at once, since another source would meet it too; when no
    /// source has the content, the error names what was found at each.
    pub fn fetch_unsynced_any(
        &self,
        files: &[FileRef],
        source_root: &Path,
        cm_root: Option<&Path>,
    ) -> Result<(usize, Fetched), StageError> {
        let mut findings = Vec::new();
        for (i, file) in files.iter().enumerate() {
            match self.fetch_unsynced(file, source_root, cm_root) {
                Ok(fetched) => return Ok((i, fetched)),
                Err(e @ (StageError::NoSpace { .. } | StageError::Io { .. })) => return Err(e),
                Err(StageError::Unavailable { detail, .. }) if files.len() > 1 => {
                    findings.push(detail)
                }
                Err(e) if files.len() == 1 => return Err(e),
                Err(e) => findings.push(e.to_string()),
            }
        }
        Err(StageError::Unavailable {
            path: files
                .first()
                .map_or_else(String::new, |f| f.source_label().to_owned()),
            detail: if findings.is_empty() {
                "no source names it".to_owned()
            } else {
                findings.join("; ")
            },
        })
    }

    /// Makes a group of unsynced copies durable and puts them in place, in
    /// the durability order: first the bytes of every copy, then the
    /// renames into place, then the renames themselves. A blob is never at
    /// its path before its bytes are durable, and `Ok` means every blob of
    /// the group is durably at its path. On error, returns the blobs that
    /// are not durably in place (their temps are removed): fetch them again.
    ///
    /// Per copy ([`GroupSync::PerFile`], or fewer than [`GROUP_SYNC_MIN`]
    /// copies not yet synced): each temp file is fdatasynced through its
    /// own descriptor (on up to [`PUBLISH_SYNC_THREADS`] threads, so the
    /// filesystem can commit many in one journal transaction; copies
    /// already synced through [`Unsynced::sync_data`] are skipped), and
    /// each touched fan-out directory is fsynced once after the renames (on
    /// as many threads, for the same reason).
    ///
    /// By filesystem ([`GroupSync::Filesystem`]): one `syncfs` makes every
    /// copy's bytes durable, and each copy's own writeback result is then
    /// read through its descriptor (`sync_file_range` with `WAIT_AFTER`
    /// reports a failed writeback of that file once, whoever started it),
    /// so a copy whose bytes did not reach the disk is still reported by
    /// itself; one more `syncfs` after the renames replaces the directory
    /// fsyncs. If a `syncfs` fails, the per-copy way runs instead, which
    /// names the failing copies or directories.
    pub fn publish(&self, batch: Vec<Unsynced>) -> Result<(), (StageError, Vec<BlobId>)> {
        if batch.is_empty() {
            return Ok(());
        }
        let unsynced = batch.iter().filter(|u| !u.synced).count();
        let by_filesystem = self
            .group_sync
            .as_ref()
            .filter(|_| unsynced >= GROUP_SYNC_MIN);
        let mut failed = Vec::new();
        let mut first_error = None;
        let mut synced = Vec::with_capacity(batch.len());
        let results = match by_filesystem {
            Some(fd) => sync_by_filesystem(fd, batch),
            None => sync_all_data(batch),
        };
        for (u, result) in results {
            match result {
                Ok(()) => synced.push(u),
                Err(e) => {
                    // Dropping `u` removes its temp: the bytes may not be durable.
                    failed.push(u.id);
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut placed = Vec::with_capacity(synced.len());
        let mut touched = std::collections::BTreeSet::new();
        // Fan-out directories whose entry in `root` is not known durable:
        // `root` is synced with the renames, and they are marked durable
        // once that succeeded.
        let mut new_dirs = Vec::new();
        for mut u in synced {
            let dest = self.path(&u.id);
            let fan_out = dest.parent().unwrap_or(&self.root).to_path_buf();
            // placed_here: renamed into place (false: a parallel copy got
            // there first and this temp is dropped).
            let result = self.place(&u.temp.path, &u.id, &dest);
            match result {
                Ok(Placed {
                    placed_here,
                    dir_new,
                }) => {
                    if dir_new {
                        new_dirs.push(u.id);
                        touched.insert(self.root.clone());
                    }
                    if placed_here {
                        u.temp.keep = true;
                        self.count_placed(u.size);
                        placed.push((u.id, u.size));
                    }
                    // Even when another copy got there first, its rename may
                    // not be durable yet: sync the directory either way.
                    touched.insert(fan_out);
                }
                Err(e) => {
                    failed.push(u.id);
                    first_error.get_or_insert(e);
                }
            }
        }
        let renames_durable = match by_filesystem {
            Some(fd) if !touched.is_empty() => match syncfs(fd) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "syncfs of the blob store failed; syncing each directory");
                    false
                }
            },
            _ => false,
        };
        // In parallel: the filesystem commits concurrent directory syncs
        // together (one after another, 1,024 small blobs touch ~250).
        let dir_errors: Vec<(PathBuf, io::Error)> = if renames_durable {
            Vec::new()
        } else {
            in_parallel(touched.into_iter().collect(), |dir| {
                fsync_dir(&dir).err().map(|e| (dir, e))
            })
            .into_iter()
            .flatten()
            .collect()
        };
        if let Some((dir, e)) = dir_errors.into_iter().next() {
            // The renames may not survive a crash: take them out again so
            // nothing whose name is not durable is trusted as present.
            for (id, size) in &placed {
                if fs::remove_file(self.path(id)).is_ok() {
                    self.subtract_staged(*size);
                }
            }
            failed.extend(placed.iter().map(|(id, _)| *id));
            return Err((store_error("syncing directory", &dir, e), failed));
        }
        for id in &new_dirs {
            self.fan_out(id).store(FAN_OUT_DURABLE, Ordering::Relaxed);
        }
        match first_error {
            Some(e) => Err((e, failed)),
            None => Ok(()),
        }
    }

    fn copy_from_first_usable(
        &self,
        file: &FileRef,
        source_root: &Path,
        cm_root: Option<&Path>,
        sync: bool,
    ) -> Result<(FetchOutcome, Copied), StageError> {
        let path_ok = match file.known() {
            Some(_) => is_valid_source_path(&file.path),
            // Hive files carry the absolute local path `--source-map` gave.
            None => is_valid_mapped_path(&file.path),
        };
        if !path_ok {
            // `Path::join` with an absolute path would escape the source root.
            return Err(StageError::Unavailable {
                path: file.path.clone(),
                detail: "not a relative source path without `..`".to_owned(),
            });
        }
        let mut findings = Vec::new();
        for (place, origin) in candidate_places(file, source_root, cm_root) {
            let place = match place {
                Ok(place) => place,
                Err(problem) => {
                    findings.push(problem);
                    continue;
                }
            };
            match self.copy_verified(&place, file, sync)? {
                Ok(copied) => {
                    if origin == FetchOutcome::FromChangeManagement {
                        tracing::info!(
                            path = %file.path,
                            from = %place.shown().display(),
                            source_problem = %findings.join("; "),
                            "fetched from change management"
                        );
                    }
                    return Ok((origin, copied));
                }
                Err(problem) => findings.push(format!("{}: {problem}", place.shown().display())),
            }
        }
        match (&file.verify, &file.cm_path) {
            (Verify::Sha256 { .. }, _) if cm_root.is_none() => {
                findings.push("no change-management root configured".to_owned())
            }
            (Verify::Hdfs { .. }, None) => {
                findings.push("the file's URI names no change-management root".to_owned())
            }
            _ => {}
        }
        Err(StageError::Unavailable {
            path: file.source_label().to_owned(),
            detail: findings.join("; "),
        })
    }

    /// Deletes a blob (for GC) and returns the bytes freed; 0 when it was not
    /// stored, so GC may retry a removal that crashed half-way.
    pub fn remove(&self, id: &BlobId) -> Result<u64, StageError> {
        let path = self.path(id);
        let len = match fs::symlink_metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(store_error("inspecting", &path, e)),
        };
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(store_error("removing", &path, e)),
        }
        self.subtract_staged(len);
        self.sync_fan_out_dir(id, false)?;
        Ok(len)
    }

    /// Every stored blob, in id order.
    pub fn list(&self) -> Result<Vec<BlobId>, StageError> {
        let mut ids = Vec::new();
        // GC lists the store every pass: the entry's type from the
        // directory (d_type) instead of a stat per blob.
        self.for_each_blob(Sizes::No, |id, _| ids.push(id))?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Copies `place` into a new temp file, hashing and counting on the way,
    /// and checks what `file.verify` asks for: size and sha256, or the HDFS
    /// checksum (computed in the same pass), or nothing beyond a stable
    /// length. Returns the copy with its sha256 and size. The outer `Err` is
    /// a store failure (ends the fetch); the inner `Err` says why this copy
    /// is unusable (try the next place).
    fn copy_verified(
        &self,
        place: &Place,
        file: &FileRef,
        sync: bool,
    ) -> Result<Result<Copied, String>, StageError> {
        // Beneath its root, never through a link out of it, and only if it
        // is a regular file (a FIFO or device is refused unopened).
        // The size comes from the check of that very inode.
        let (mut src, expected) = match open_beneath_sized(&place.root, &place.relative) {
            Ok(opened) => opened,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let known = file.known();
        // Checked before copying so a wrong multi-GiB file costs nothing. A
        // file known only by its checksum must keep the length it had when
        // opened: growth or shrinking while reading is caught.
        if let Some((_, size)) = known {
            if expected != size {
                return Ok(Err(format!("size {expected} expected {size}")));
            }
        }
        let check = match stream_check(&*self.checks, &file.verify) {
            Ok(check) => check,
            Err(problem) => return Ok(Err(problem)),
        };
        let hashing = Hashing {
            sha: Sha256::new(),
            check,
        };
        if expected > COPY_BUFFER_BYTES as u64 {
            // Below one buffer the readahead window does not matter.
            advise_sequential(&src);
        }

        let mut temp = self.create_temp(&file.key())?;
        let copied = match copy_in_kernel(&src, &mut temp, expected, hashing)? {
            Ok(result) => result,
            Err(hashing) if expected >= PIPELINE_MIN_BYTES => {
                copy_pipelined(&mut src, &mut temp, expected, hashing)?
            }
            Err(hashing) => copy_sequential(&mut src, &mut temp, expected, hashing)?,
        };
        let (got, check) = match copied {
            Ok(digests) => digests,
            Err(problem) => return Ok(Err(problem)),
        };
        // `copy_file_range` never reads past `expected`: growth after the
        // last byte read shows only in the size. The caller also compares
        // the whole identity with what it listed.
        let source_after = match src.metadata() {
            Ok(m) if m.len() > expected => {
                return Ok(Err(format!(
                    "size {} expected {expected} (grew while reading)",
                    m.len()
                )))
            }
            Ok(m) => m,
            Err(e) => return Ok(Err(format!("cannot stat after the copy: {e}"))),
        };
        if let Some((sha, _)) = known {
            if got != sha {
                return Ok(Err(format!("sha mismatch (content hashes to {got})")));
            }
        }
        if let Some(check) = check {
            if let Err(problem) = verify_stored(check, &temp, expected)? {
                return Ok(Err(problem));
            }
        }
        if sync {
            temp.sync_data()?;
        }
        Ok(Ok(Copied {
            temp,
            blob: got,
            size: expected,
            source_after,
        }))
    }

    fn create_temp(&self, id: &BlobId) -> Result<TempBlob, StageError> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let path = self
            .tmp_dir
            .join((n % TMP_SHARDS).to_string())
            .join(format!("{}.{}.{n}{TMP_SUFFIX}", id.to_hex(), self.pid));
        // Readable too: after an in-kernel copy the temp is hashed back.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| store_error("creating", &path, e))?;
        Ok(TempBlob {
            path,
            file,
            writeback: Writeback::every(WRITEBACK_CHUNK_BYTES),
            keep: false,
        })
    }

    /// Moves a verified, synced temp file to the blob path and makes the
    /// rename durable. Never replaces an existing blob: when a parallel fetch
    /// of the same content got there first, this temp is simply dropped.
    fn install(&self, mut temp: TempBlob, id: &BlobId, size: u64) -> Result<(), StageError> {
        let dest = self.path(id);
        let Placed {
            placed_here,
            dir_new,
        } = self.place(&temp.path, id, &dest)?;
        if placed_here {
            temp.keep = true;
            self.count_placed(size);
        }
        if let Err(e) = self.sync_fan_out_dir(id, dir_new) {
            // The blob may not survive a crash, yet `contains` would report
            // it; take it out again so the retry redoes the whole fetch.
            if temp.keep && fs::remove_file(&dest).is_ok() {
                self.subtract_staged(size);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Renames the temp at `temp` to `dest`, the path of blob `id`, unless
    /// a blob is there already (`placed_here` false: a parallel copy got
    /// there first). Creates the fan-out directory first unless this store
    /// already knows it exists. Neither the rename nor the directory's
    /// entry in `root` is durable yet: `dir_new` says the caller must sync
    /// `root` as well as the fan-out directory (and may then mark the
    /// directory [`FAN_OUT_DURABLE`]).
    fn place(&self, temp: &Path, id: &BlobId, dest: &Path) -> Result<Placed, StageError> {
        let fan_out = dest.parent().unwrap_or(&self.root);
        let state = self.fan_out(id);
        let mut dir_new = match state.load(Ordering::Relaxed) {
            FAN_OUT_DURABLE => false,
            FAN_OUT_EXISTS => true,
            _ => {
                // Found or created: either way not known durable (another
                // thread may have created it a moment ago).
                create_dir_entry(fan_out)?;
                let _ = state.compare_exchange(
                    FAN_OUT_UNKNOWN,
                    FAN_OUT_EXISTS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                true
            }
        };
        let mut result = rename_no_replace(temp, dest);
        if matches!(&result, Err(e) if e.kind() == io::ErrorKind::NotFound) && temp.exists() {
            // The fan-out directory was removed behind the store's back.
            create_dir_entry(fan_out)?;
            dir_new = true;
            result = rename_no_replace(temp, dest);
        }
        match result {
            Ok(()) => Ok(Placed {
                placed_here: true,
                dir_new,
            }),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Placed {
                placed_here: false,
                dir_new,
            }),
            Err(e) => Err(store_error("renaming into", dest, e)),
        }
    }

    /// Makes the fan-out directory of `id` durable with what is in it: its
    /// own fsync, and one of `root` when [`BlobStore::place`] said
    /// `dir_new` or while the directory is not known durable there (a
    /// parallel [`BlobStore::publish`] may have created it and not synced
    /// `root` yet).
    fn sync_fan_out_dir(&self, id: &BlobId, dir_new: bool) -> Result<(), StageError> {
        let dir = self.root.join(&id.to_hex()[..2]);
        fsync_dir(&dir).map_err(|e| store_error("syncing directory", &dir, e))?;
        let state = self.fan_out(id);
        if dir_new || state.load(Ordering::Relaxed) != FAN_OUT_DURABLE {
            // The directory existed before this sync (the caller placed,
            // found or removed a blob in it).
            fsync_dir(&self.root).map_err(|e| store_error("syncing directory", &self.root, e))?;
            state.store(FAN_OUT_DURABLE, Ordering::Relaxed);
        }
        Ok(())
    }

    /// What this store knows of the fan-out directory of `id`.
    fn fan_out(&self, id: &BlobId) -> &AtomicU8 {
        &self.fan_outs[usize::from(id.0[0])]
    }

    /// One blob of `len` bytes left the store.
    fn subtract_staged(&self, len: u64) {
        // Saturating: a blob placed by hand outside the store's knowledge
        // must not wrap the counters.
        let _ = self
            .staged_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(len))
            });
        let _ = self
            .stored_blobs
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
    }

    /// Removes everything below `tmp/` but its shard directories.
    fn remove_leftover_temps(&self) -> Result<(), StageError> {
        let shards: Vec<PathBuf> = (0..TMP_SHARDS)
            .map(|n| self.tmp_dir.join(n.to_string()))
            .collect();
        let mut removed = 0usize;
        for dir in std::iter::once(&self.tmp_dir).chain(&shards) {
            let mut here = 0usize;
            for entry in fs::read_dir(dir).map_err(|e| store_error("listing", dir, e))? {
                let entry = entry.map_err(|e| store_error("listing", dir, e))?;
                let path = entry.path();
                if shards.contains(&path) {
                    continue;
                }
                let result = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                result.map_err(|e| store_error("removing leftover temp", &path, e))?;
                here += 1;
            }
            if here > 0 {
                fsync_dir(dir).map_err(|e| store_error("syncing directory", dir, e))?;
                removed += here;
            }
        }
        if removed > 0 {
            tracing::info!(removed, dir = %self.tmp_dir.display(), "removed leftover temp files");
        }
        Ok(())
    }

    /// Calls `f(id, size)` for every stored blob (size 0 with
    /// [`Sizes::No`]). Entries that are not blobs are logged and skipped,
    /// never deleted: they are not ours to judge.
    fn for_each_blob(
        &self,
        sizes: Sizes,
        mut f: impl FnMut(BlobId, u64),
    ) -> Result<(), StageError> {
        let listing_err = |dir: &Path| {
            let dir = dir.to_path_buf();
            move |e| store_error("listing", &dir, e)
        };
        for fan in fs::read_dir(&self.root).map_err(listing_err(&self.root))? {
            let fan = fan.map_err(listing_err(&self.root))?;
            let fan_name = fan.file_name();
            let fan_name = fan_name.to_string_lossy();
            if fan_name == TMP_DIR_NAME {
                continue;
            }
            let fan_path = fan.path();
            let is_fan_out = fan_name.len() == 2
                && fan_name
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                && fan.file_type().is_ok_and(|t| t.is_dir());
            if !is_fan_out {
                tracing::warn!(path = %fan_path.display(), "ignoring unexpected entry in blob store");
                continue;
            }
            for blob in fs::read_dir(&fan_path).map_err(listing_err(&fan_path))? {
                let blob = blob.map_err(listing_err(&fan_path))?;
                let name = blob.file_name();
                let name = name.to_string_lossy();
                let inspecting = |e| store_error("inspecting", &blob.path(), e);
                // `file_type` stats only where the directory has no type.
                let (is_file, len) = match sizes {
                    Sizes::Yes => {
                        let meta = blob.metadata().map_err(inspecting)?;
                        (meta.is_file(), meta.len())
                    }
                    Sizes::No => (blob.file_type().map_err(inspecting)?.is_file(), 0),
                };
                match BlobId::from_hex(&name) {
                    Some(id) if is_file && id.to_hex() == name && name.starts_with(&*fan_name) => {
                        f(id, len)
                    }
                    _ => tracing::warn!(
                        path = %blob.path().display(),
                        "ignoring unexpected entry in blob store"
                    ),
                }
            }
        }
        Ok(())
    }
}

/// Whether [`BlobStore::for_each_blob`] reports each blob's size (a stat
/// per blob).
#[derive(Clone, Copy)]
enum Sizes {
    Yes,
    No,
}

/// Why the bytes read from a source are not the expected file, or `None`.
/// Growth is caught as soon as it happens: reading on could take arbitrarily long.
fn check_length(copied: u64, expected: u64, at_end: bool) -> Option<String> {
    if copied > expected {
        Some(format!(
            "size > {expected} expected {expected} (grew while reading)"
        ))
    } else if at_end && copied != expected {
        Some(format!(
            "size {copied} expected {expected} (shrank while reading)"
        ))
    } else {
        None
    }
}

/// Reads once into `buf`, retrying on EINTR. `Err` describes a source problem.
fn read_chunk(src: &mut File, buf: &mut [u8], copied: u64) -> Result<usize, String> {
    loop {
        match src.read(buf) {
            Ok(n) => {
                heartbeat();
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read error after {copied} bytes: {e}")),
        }
    }
}

/// Copies `src` into `temp` inside the kernel (`copy_file_range`: no copy
/// through userspace) and hashes what the temp file holds — so the bytes
/// verified are exactly the bytes stored, read back from the page cache.
///
/// The copy goes in pieces of [`KERNEL_COPY_PIECE_BYTES`], and writeback of
/// the temp is started every [`WRITEBACK_CHUNK_BYTES`] (`TempBlob`'s
/// [`Writeback`]), so the disk writes the early pieces while the later ones
/// are copied and hashed, and the final `sync_data` waits for the tail
/// only. Each piece is read back and hashed as soon as it is copied, while
/// it is still in the page cache. For a file of at least
/// [`PIPELINE_MIN_BYTES`], sha256 runs on a second thread over the
/// buffers read back ([`BufferRing`]), beside the copy of the next pieces
/// and the file's own checksum on this thread, so one large file keeps
/// two cores busy; below that size both hashes run on this thread.
///
/// The length is checked as the other paths do: a source shorter than
/// `expected` ends the copy early, a longer one (it grew after it was
/// opened) is caught by an `fstat` after the copy.
///
/// `Ok(Err(hashing))` when the kernel cannot copy between these files
/// (other filesystem, not supported): the caller copies through userspace.
/// The outer `Err` is a store failure, the inner one a source problem.
fn copy_in_kernel(
    src: &File,
    temp: &mut TempBlob,
    expected: u64,
    mut hashing: Hashing,
) -> Result<Result<Result<Digests, String>, Hashing>, StageError> {
    let TempBlob {
        file,
        path,
        writeback,
        ..
    } = temp;
    let (file, path): (&File, &Path) = (file, path);
    // The first piece alone decides whether the kernel can copy these files
    // at all; the hashing is handed on only once it could.
    let first = match copy_piece(src, file, path, 0, expected.min(KERNEL_COPY_PIECE_BYTES)) {
        Ok(n) => n,
        Err(PieceError::Unsupported) => return Ok(Err(hashing)),
        Err(PieceError::Source(problem)) => return Ok(Ok(Err(problem))),
        Err(PieceError::Store(e)) => return Err(e),
    };
    writeback.wrote(file, first);
    let copied = if expected < PIPELINE_MIN_BYTES {
        let mut buf = vec![0u8; COPY_BUFFER_BYTES.min(expected as usize).max(1)];
        read_back(file, path, &mut buf, 0, first, |b| hashing.update(b))?;
        copy_rest(src, file, path, writeback, first, expected, |from, to| {
            read_back(file, path, &mut buf, from, to, |b| hashing.update(b))
        })?
    } else {
        let Hashing { sha, mut check } = hashing;
        // Capacity for every buffer, so neither side ever blocks on a send.
        let (to_hasher, filled) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIPELINE_BUFFERS);
        let (to_copier, free) = mpsc::sync_channel::<Vec<u8>>(PIPELINE_BUFFERS);
        let (copied, sha) = thread::scope(|scope| {
            let hasher = scope.spawn(move || {
                let mut sha = sha;
                for (buf, n) in filled {
                    sha.update(&buf[..n]);
                    // The copier may have stopped early; the buffer is then dropped.
                    let _ = to_copier.send(buf);
                }
                sha
            });
            let mut ring = BufferRing {
                to_hasher,
                free,
                allocated: 0,
            };
            let copied = ring
                .hash_back(file, path, 0, first, &mut check)
                .and_then(|()| {
                    copy_rest(src, file, path, writeback, first, expected, |from, to| {
                        ring.hash_back(file, path, from, to, &mut check)
                    })
                });
            // Closing the channel lets the hasher finish.
            drop(ring);
            match hasher.join() {
                Ok(sha) => (copied, sha),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        });
        hashing = Hashing { sha, check };
        copied?
    };
    let copied = match copied {
        Ok(copied) => copied,
        Err(problem) => return Ok(Ok(Err(problem))),
    };
    if let Some(problem) = check_length(copied, expected, true) {
        return Ok(Ok(Err(problem)));
    }
    // Growth after the last byte: the caller's `fstat` (copy_verified).
    Ok(Ok(Ok(hashing.finish())))
}

/// The read-back side of [`copy_in_kernel`] for a large file: reads each
/// copied piece back into one of [`PIPELINE_BUFFERS`] buffers, feeds it to
/// the file's own checksum on this thread and hands it to the sha256
/// thread, which gives it back. So the bytes are read back once, sha256
/// (the slowest step) runs beside the copy, the checksum and the read-back,
/// and memory stays bounded.
struct BufferRing {
    to_hasher: mpsc::SyncSender<(Vec<u8>, usize)>,
    free: mpsc::Receiver<Vec<u8>>,
    allocated: usize,
}

impl BufferRing {
    /// Reads bytes `from..to` of `file` back, feeding `check` and the
    /// sha256 thread. Returns early, without error, only when the sha256
    /// thread is gone: its join reports why.
    fn hash_back(
        &mut self,
        file: &File,
        path: &Path,
        from: u64,
        to: u64,
        check: &mut Option<Box<dyn StreamCheck>>,
    ) -> Result<(), StageError> {
        use std::os::unix::fs::FileExt;
        let mut at = from;
        while at < to {
            let mut buf = if self.allocated < PIPELINE_BUFFERS {
                self.allocated += 1;
                vec![0u8; COPY_BUFFER_BYTES]
            } else {
                match self.free.recv() {
                    Ok(buf) => buf,
                    Err(_) => return Ok(()),
                }
            };
            let n = buf.len().min((to - at) as usize);
            file.read_exact_at(&mut buf[..n], at)
                .map_err(|e| store_error("reading back", path, e))?;
            if let Some(check) = check.as_mut() {
                check.update(&buf[..n]);
            }
            heartbeat();
            if self.to_hasher.send((buf, n)).is_err() {
                return Ok(());
            }
            at += n as u64;
        }
        Ok(())
    }
}

/// Why [`copy_piece`] stopped.
enum PieceError {
    /// The kernel cannot copy between these files (only before any byte).
    Unsupported,
    /// Reading the source failed.
    Source(String),
    /// Writing the store failed (full disk).
    Store(StageError),
}

/// Copies up to `len` bytes from `src` to `dst` at both files' positions
/// with `copy_file_range`, `at` bytes having been copied before. Returns
/// the bytes copied: fewer than `len` only at the source's end.
fn copy_piece(
    src: &File,
    dst: &File,
    dst_path: &Path,
    at: u64,
    len: u64,
) -> Result<u64, PieceError> {
    use std::os::fd::AsRawFd;
    let mut done = 0u64;
    while done < len {
        // SAFETY: two valid open descriptors; null offsets use and advance
        // the files' own positions.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                (len - done) as usize,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            let copied = at + done;
            return match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
                    if copied == 0 =>
                {
                    Err(PieceError::Unsupported)
                }
                Some(libc::ENOSPC | libc::EDQUOT) => {
                    Err(PieceError::Store(store_error("writing", dst_path, e)))
                }
                _ => Err(PieceError::Source(format!(
                    "copy error after {copied} bytes: {e}"
                ))),
            };
        }
        if n == 0 {
            break; // the source is shorter than it said
        }
        heartbeat();
        done += n as u64;
    }
    Ok(done)
}

/// Copies pieces after the first `copied` bytes until `expected` or the
/// source's end, starting writeback as it goes and handing each piece's
/// range to `piece` (which hashes it, or has it hashed). Returns the bytes
/// copied in all; the inner `Err` is a source problem.
fn copy_rest(
    src: &File,
    dst: &File,
    dst_path: &Path,
    writeback: &mut Writeback,
    mut copied: u64,
    expected: u64,
    mut piece: impl FnMut(u64, u64) -> Result<(), StageError>,
) -> Result<Result<u64, String>, StageError> {
    while copied < expected {
        let want = (expected - copied).min(KERNEL_COPY_PIECE_BYTES);
        let n = match copy_piece(src, dst, dst_path, copied, want) {
            Ok(n) => n,
            Err(PieceError::Store(e)) => return Err(e),
            Err(PieceError::Source(problem)) => return Ok(Err(problem)),
            // Only before the first byte, which the caller copied.
            Err(PieceError::Unsupported) => {
                return Ok(Err(format!("copy error after {copied} bytes")))
            }
        };
        if n == 0 {
            break;
        }
        writeback.wrote(dst, n);
        piece(copied, copied + n)?;
        copied += n;
        #[cfg(test)]
        test_hooks::piece_copied();
        if n < want {
            break;
        }
    }
    Ok(Ok(copied))
}

/// Reads bytes `from..to` of the temp file `file` back (from the page
/// cache) through `buf`, handing every chunk to `f`. They are bytes this
/// process wrote, so a short read is a store failure.
fn read_back(
    file: &File,
    path: &Path,
    buf: &mut [u8],
    from: u64,
    to: u64,
    mut f: impl FnMut(&[u8]),
) -> Result<(), StageError> {
    use std::os::unix::fs::FileExt;
    let mut at = from;
    while at < to {
        let n = buf.len().min((to - at) as usize);
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, at)
            .map_err(|e| store_error("reading back", path, e))?;
        f(chunk);
        heartbeat();
        at += n as u64;
    }
    Ok(())
}

/// Copies `src` into `temp`, returning the digests of what was written. The
/// outer `Err` is a store failure, the inner one a source problem.
fn copy_sequential(
    src: &mut File,
    temp: &mut TempBlob,
    expected: u64,
    mut hashing: Hashing,
) -> Result<Result<Digests, String>, StageError> {
    let mut buf = vec![0u8; COPY_BUFFER_BYTES.min(expected as usize + 1).max(1)];
    let mut copied = 0u64;
    loop {
        let n = match read_chunk(src, &mut buf, copied) {
            Ok(n) => n,
            Err(problem) => return Ok(Err(problem)),
        };
        copied += n as u64;
        if let Some(problem) = check_length(copied, expected, n == 0) {
            return Ok(Err(problem));
        }
        if n == 0 {
            return Ok(Ok(hashing.finish()));
        }
        hashing.update(&buf[..n]);
        temp.write(&buf[..n])?;
    }
}

/// Like [`copy_sequential`], but hashes on a second thread. SHA-256 (even
/// with SHA-NI) is the slowest step, so overlapping it with the read and
/// write syscalls is what brings staging up to `cp` speed. Each buffer is
/// written first and then handed to the hasher, so exactly the bytes written
/// are hashed; a fixed set of buffers circulates, so memory stays bounded.
fn copy_pipelined(
    src: &mut File,
    temp: &mut TempBlob,
    expected: u64,
    mut hashing: Hashing,
) -> Result<Result<Digests, String>, StageError> {
    // Capacity for every buffer, so neither side ever blocks on a send.
    let (to_hasher, filled) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIPELINE_BUFFERS);
    let (to_reader, free) = mpsc::sync_channel::<Vec<u8>>(PIPELINE_BUFFERS);
    thread::scope(|scope| {
        let hasher = scope.spawn(move || {
            for (buf, n) in filled {
                hashing.update(&buf[..n]);
                // The reader may have stopped early; the buffer is then dropped.
                let _ = to_reader.send(buf);
            }
            hashing.finish()
        });

        let mut allocated = 0;
        let mut copied = 0u64;
        let outcome = loop {
            let mut buf = if allocated < PIPELINE_BUFFERS {
                allocated += 1;
                vec![0u8; COPY_BUFFER_BYTES]
            } else {
                match free.recv() {
                    Ok(buf) => buf,
                    // Only if the hasher died; its join below reports why.
                    Err(_) => break Ok(None),
                }
            };
            let n = match read_chunk(src, &mut buf, copied) {
                Ok(n) => n,
                Err(problem) => break Ok(Some(problem)),
            };
            copied += n as u64;
            if let Some(problem) = check_length(copied, expected, n == 0) {
                break Ok(Some(problem));
            }
            if n == 0 {
                break Ok(None);
            }
            if let Err(e) = temp.write(&buf[..n]) {
                break Err(e);
            }
            if to_hasher.send((buf, n)).is_err() {
                break Ok(None);
            }
        };
        // Closing the channel lets the hasher finish.
        drop(to_hasher);
        let digest = match hasher.join() {
            Ok(digest) => digest,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match outcome {
            Err(store_failure) => Err(store_failure),
            Ok(Some(problem)) => Ok(Err(problem)),
            Ok(None) => Ok(Ok(digest)),
        }
    })
}

/// A checksum other than sha256 that a file is checked with, fed the same
/// bytes in the same pass (Hive's HDFS file checksum).
pub trait StreamCheck: Send {
    fn update(&mut self, bytes: &[u8]);
    /// `Ok` when the bytes fed match; else what was found, and maybe
    /// another check to feed the same bytes before giving up.
    fn verify(self: Box<Self>) -> Result<(), CheckFailed>;
}

/// A [`StreamCheck`] that did not match.
pub struct CheckFailed {
    /// What was found (the whole story when `again` is `None`).
    pub problem: String,
    /// A further check of the same bytes that may still match (the HDFS
    /// checksum's other CRC type, needed only for old clusters): the stager
    /// feeds it the stored copy, never the source, which may have changed.
    pub again: Option<Box<dyn StreamCheck>>,
}

/// Verifies `check`, fed the whole copy; while it offers a further check,
/// feeds that the `size` bytes stored in `temp` and verifies it, so what is
/// verified is always the blob to be. The inner `Err` says why the copy is
/// unusable.
fn verify_stored(
    mut check: Box<dyn StreamCheck>,
    temp: &TempBlob,
    size: u64,
) -> Result<Result<(), String>, StageError> {
    let mut buf = Vec::new();
    loop {
        match check.verify() {
            Ok(()) => return Ok(Ok(())),
            Err(CheckFailed {
                problem,
                again: None,
            }) => return Ok(Err(problem)),
            Err(CheckFailed {
                again: Some(mut again),
                ..
            }) => {
                if buf.is_empty() {
                    buf = vec![0u8; COPY_BUFFER_BYTES.min(size as usize).max(1)];
                }
                read_back(&temp.file, &temp.path, &mut buf, 0, size, |b| {
                    again.update(b)
                })?;
                check = again;
            }
        }
    }
}

/// The hashes computed while copying: sha256 always (the blob's name),
/// and the file's own checksum when it has one.
struct Hashing {
    sha: Sha256,
    check: Option<Box<dyn StreamCheck>>,
}

/// The sha256 of the bytes copied, and the checksum still to be compared.
type Digests = (BlobId, Option<Box<dyn StreamCheck>>);

impl Hashing {
    fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        if let Some(check) = self.check.as_mut() {
            check.update(bytes);
        }
    }

    fn finish(self) -> Digests {
        (BlobId(self.sha.finalize().into()), self.check)
    }
}

/// Makes the check a file's [`Verify`] asks for beyond size and sha256
/// (which the store checks itself), for the source that knows what it
/// means: the Hive source's HDFS file checksum
/// (`crate::source::hive::checksum::HdfsChecks`). Handed to the store with
/// [`BlobStore::with_checks`] by whoever wires the pipeline.
pub trait SourceChecks: Send + Sync + std::fmt::Debug {
    /// The check for `verify`, ready to be fed; `Ok(None)` when there is
    /// none beyond sha256; `Err` when the expected value cannot be a
    /// checksum of its kind (or this source knows no such kind).
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn StreamCheck>>, String>;
}

/// The store's [`SourceChecks`] until it is given others: none.
#[derive(Debug)]
struct NoSourceChecks;

impl SourceChecks for NoSourceChecks {
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn StreamCheck>>, String> {
        Err(format!(
            "no check for {} checksums is configured",
            verify.label()
        ))
    }
}

/// The checksum `verify` asks for beyond sha256, ready to be fed; `Err`
/// when the expected value cannot be a checksum of that kind.
fn stream_check(
    checks: &dyn SourceChecks,
    verify: &Verify,
) -> Result<Option<Box<dyn StreamCheck>>, String> {
    match verify {
        Verify::Sha256 { .. } | Verify::None => Ok(None),
        Verify::Hdfs { .. } => checks.stream_check(verify),
    }
}

/// A verified copy of a file in `tmp/` ([`BlobStore::copy_verified`]),
/// with its content's sha256 and size.
struct Copied {
    temp: TempBlob,
    blob: BlobId,
    size: u64,
    /// The source's metadata through the descriptor read, after the copy.
    source_after: fs::Metadata,
}

/// What [`BlobStore::fetch_unsynced`] found.
#[derive(Debug)]
pub struct Fetched {
    pub outcome: FetchOutcome,
    /// The content's sha256.
    pub blob: BlobId,
    pub size: u64,
    /// The copy to publish; `None` when the blob was already stored.
    pub copy: Option<Unsynced>,
}

/// True for an absolute local path with no `.`, `..` or empty component.
fn is_valid_mapped_path(s: &str) -> bool {
    s.len() > 1
        && s.starts_with('/')
        && !s.contains('\0')
        && s[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// A verified copy waiting in `tmp/` for [`BlobStore::publish`]; dropping
/// it removes the temp file.
pub struct Unsynced {
    temp: TempBlob,
    id: BlobId,
    size: u64,
    /// Already fdatasynced by [`Unsynced::sync_data`]: publish skips it.
    synced: bool,
    /// The source's metadata through the descriptor read, after the copy.
    source_after: fs::Metadata,
}

impl Unsynced {
    pub fn id(&self) -> BlobId {
        self.id
    }

    /// The source file's metadata, read through the descriptor the bytes
    /// were copied from, after the copy: a caller that listed the file
    /// compares its identity with this instead of a `stat` of the path.
    pub fn source_after(&self) -> &fs::Metadata {
        &self.source_after
    }

    /// `fdatasync`s the copy now, so that [`BlobStore::publish`] only
    /// renames it: a caller with many copies syncs each as it is made,
    /// overlapping the wait with the copies still running. On error the
    /// copy is not durable; dropping it removes the temp.
    pub fn sync_data(&mut self) -> Result<(), StageError> {
        if !self.synced {
            self.temp.sync_data()?;
            self.synced = true;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Unsynced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unsynced({:?}, {} bytes)", self.id, self.size)
    }
}

/// Most threads [`BlobStore::publish`] fdatasyncs a group with. The syncs
/// mostly wait on the disk, so more threads than cores pay off: the
/// filesystem commits concurrent syncs together.
pub const PUBLISH_SYNC_THREADS: usize = 8;

/// `fdatasync`s every copy not yet synced through its own descriptor, on
/// up to [`PUBLISH_SYNC_THREADS`] threads; each copy with its own result.
fn sync_all_data(batch: Vec<Unsynced>) -> Vec<(Unsynced, Result<(), StageError>)> {
    let (done, todo): (Vec<Unsynced>, Vec<Unsynced>) = batch.into_iter().partition(|u| u.synced);
    let mut out: Vec<(Unsynced, Result<(), StageError>)> =
        done.into_iter().map(|u| (u, Ok(()))).collect();
    out.extend(in_parallel(todo, |mut u| {
        let r = u.sync_data();
        (u, r)
    }));
    out
}

/// [`BlobStore::publish`] by filesystem: one `syncfs` through `fd`, then
/// each copy's own writeback result, read through its descriptor. When the
/// `syncfs` fails, [`sync_all_data`] does it copy by copy instead.
fn sync_by_filesystem(fd: &File, batch: Vec<Unsynced>) -> Vec<(Unsynced, Result<(), StageError>)> {
    if let Err(e) = syncfs(fd) {
        tracing::warn!(error = %e, "syncfs of the blob store failed; syncing each copy");
        return sync_all_data(batch);
    }
    batch
        .into_iter()
        .map(|mut u| {
            let r = if u.synced {
                Ok(())
            } else {
                u.temp.writeback_result()
            };
            u.synced = r.is_ok();
            (u, r)
        })
        .collect()
}

/// `f` of every item, on up to [`PUBLISH_SYNC_THREADS`] threads (the
/// work mostly waits on the disk); results in no particular order.
fn in_parallel<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let threads = items.len().min(PUBLISH_SYNC_THREADS);
    if threads <= 1 {
        return items.into_iter().map(f).collect();
    }
    let mut shares: Vec<Vec<T>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        shares[i % threads].push(item);
    }
    let f = &f;
    thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|share| scope.spawn(move || share.into_iter().map(f).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(results) => results,
                // The syncs do not panic; if one did, the panic is the bug.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// A temp file in `blobs/tmp/<shard>/`, removed on drop unless it was renamed into place.
struct TempBlob {
    path: PathBuf,
    file: File,
    writeback: Writeback,
    keep: bool,
}

impl TempBlob {
    fn write(&mut self, bytes: &[u8]) -> Result<(), StageError> {
        #[cfg(test)]
        if let Some(errno) = test_hooks::injected_write_errno() {
            return Err(store_error(
                "writing",
                &self.path,
                io::Error::from_raw_os_error(errno),
            ));
        }
        self.file
            .write_all(bytes)
            .map_err(|e| store_error("writing", &self.path, e))?;
        self.writeback.wrote(&self.file, bytes.len() as u64);
        Ok(())
    }

    /// In tests: the sync failure injected for this temp's blob.
    fn injected_sync_failure(&self) -> Result<(), StageError> {
        #[cfg(test)]
        if let Some(errno) = test_hooks::injected_sync_errno(&self.path) {
            return Err(store_error(
                "syncing",
                &self.path,
                io::Error::from_raw_os_error(errno),
            ));
        }
        Ok(())
    }

    /// After a `syncfs` wrote this file back: the result of that writeback
    /// for this file (an error is reported once per descriptor, so a
    /// failure seen by another `syncfs` caller is still seen here).
    fn writeback_result(&self) -> Result<(), StageError> {
        use std::os::fd::AsRawFd;
        self.injected_sync_failure()?;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: sync_file_range on a descriptor we own, whole file.
        if unsafe { libc::sync_file_range(self.file.as_raw_fd(), 0, 0, flags) } == 0 {
            Ok(())
        } else {
            Err(store_error(
                "syncing",
                &self.path,
                io::Error::last_os_error(),
            ))
        }
    }

    fn sync_data(&self) -> Result<(), StageError> {
        self.injected_sync_failure()?;
        self.file
            .sync_data()
            .map_err(|e| store_error("syncing", &self.path, e))
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if !self.keep {
            if let Err(e) = fs::remove_file(&self.path) {
                // `open` removes it on the next start at the latest.
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove temp file");
            }
        }
    }
}

/// A place a file may be read from: a path that must resolve beneath its
/// root ([`open_beneath`]).
struct Place {
    root: PathBuf,
    relative: PathBuf,
}

impl Place {
    fn new(root: &Path, relative: impl Into<PathBuf>) -> Place {
        Place {
            root: root.to_owned(),
            relative: relative.into(),
        }
    }

    /// The joined path, for messages.
    fn shown(&self) -> PathBuf {
        self.root.join(&self.relative)
    }
}

/// The places to look for `file`, in order, with the outcome each stands for
/// (or why a place cannot be used). Native: the source root, then
/// `<cm-root>/<name>_<sha256>`. Hive: the mapped source path, then the URI's
/// change-management copy (only a file with a checksum has one, named after
/// the checksum), each beneath the `--source-map` directory it was mapped
/// through.
fn candidate_places(
    file: &FileRef,
    source_root: &Path,
    cm_root: Option<&Path>,
) -> Vec<(Result<Place, String>, FetchOutcome)> {
    let Some((sha, _)) = file.known() else {
        let mut places = vec![(
            mapped_place(file.source_dir.as_deref(), &file.path),
            FetchOutcome::FromSource,
        )];
        if let (Verify::Hdfs { .. }, Some(cm)) = (&file.verify, &file.cm_path) {
            places.push((
                mapped_place(file.cm_dir.as_deref(), cm),
                FetchOutcome::FromChangeManagement,
            ));
        }
        return places;
    };
    let mut places = vec![(
        Ok(Place::new(source_root, &file.path)),
        FetchOutcome::FromSource,
    )];
    if let Some(cm) = cm_root {
        let hex = sha.to_hex();
        let base = file.path.rsplit('/').next().unwrap_or(&file.path);
        places.push((
            Ok(Place::new(cm, format!("{base}_{hex}"))),
            FetchOutcome::FromChangeManagement,
        ));
        // The source names cm copies after the file; `name` can differ from
        // the path's last component, so look under both.
        if file.name != base {
            places.push((
                Ok(Place::new(cm, format!("{}_{hex}", file.name))),
                FetchOutcome::FromChangeManagement,
            ));
        }
    }
    places
}

/// A Hive file's `path` (absolute, from `--source-map`) opened beneath the
/// mapped directory `dir` it lies in: the part below `dir` comes from the
/// source and must not lead out of it, by `..` or by a symlink.
fn mapped_place(dir: Option<&str>, path: &str) -> Result<Place, String> {
    let Some(dir) = dir else {
        return Err(format!(
            "{path}: refused: the event names no --source-map directory to open it beneath"
        ));
    };
    match Path::new(path).strip_prefix(dir) {
        Ok(rest) if !rest.as_os_str().is_empty() => Ok(Place::new(Path::new(dir), rest)),
        _ => Err(format!(
            "{path}: refused: not below its mapped directory {dir}"
        )),
    }
}

/// Classifies a store-side I/O error: a full disk is its own kind so the
/// status can say so.
fn store_error(verb: &str, path: &Path, e: io::Error) -> StageError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => StageError::NoSpace {
            path: path.display().to_string(),
        },
        _ => StageError::Io {
            context: format!("{verb} {}", path.display()),
            source: e,
        },
    }
}

/// Creates `dir` if missing and makes its entry durable in the parent.
fn ensure_dir(dir: &Path) -> Result<(), StageError> {
    if create_dir_entry(dir)? {
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fsync_dir(parent).map_err(|e| store_error("syncing directory", parent, e))?;
    }
    Ok(())
}

/// Creates `dir` if missing (true: created now), without syncing its
/// parent: the caller makes the entry durable.
fn create_dir_entry(dir: &Path) -> Result<bool, StageError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
        Err(e) => Err(store_error("creating directory", dir, e)),
    }
}

/// What [`BlobStore::place`] did.
struct Placed {
    /// The temp was renamed to the blob's path (false: the blob was there).
    placed_here: bool,
    /// The fan-out directory's entry in `blobs/` is not known durable: the
    /// caller syncs `blobs/` too.
    dir_new: bool,
}

fn advise_sequential(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open fd; the call is advisory only. Failure just
        // means default readahead, so the result is ignored.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Renames `from` to `to` unless `to` exists (then `AlreadyExists`), in one
/// atomic step, so parallel fetches of one blob never count it twice.
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
        };
        let (cfrom, cto) = (c(from)?, c(to)?);
        // SAFETY: both are valid NUL-terminated paths resolved from the cwd.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cfrom.as_ptr(),
                libc::AT_FDCWD,
                cto.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // Filesystems without RENAME_NOREPLACE fall through to the link path.
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    // link(2) fails with EEXIST atomically, which is the no-replace we need;
    // the temp name is then dropped by the caller's guard or here.
    fs::hard_link(from, to)?;
    let _ = fs::remove_file(from);
    Ok(())
}

#[cfg(test)]
mod test_hooks {
    use std::cell::{Cell, RefCell};
    use std::path::Path;
    use std::sync::Mutex;

    use crate::event::BlobId;

    thread_local! {
        static WRITE_ERRNO: Cell<Option<i32>> = const { Cell::new(None) };
        static AFTER_PIECE: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
    }

    /// Runs `f` on this thread after every piece `copy_in_kernel` copies
    /// past the first (None: no longer).
    pub fn after_each_piece(f: Option<Box<dyn FnMut()>>) {
        AFTER_PIECE.with(|c| *c.borrow_mut() = f);
    }

    pub fn piece_copied() {
        AFTER_PIECE.with(|c| {
            if let Some(f) = c.borrow_mut().as_mut() {
                f();
            }
        });
    }

    /// Makes every temp-file write on this thread fail with `errno`.
    pub fn inject_write_errno(errno: Option<i32>) {
        WRITE_ERRNO.with(|c| c.set(errno));
    }

    pub fn injected_write_errno() -> Option<i32> {
        WRITE_ERRNO.with(|c| c.get())
    }

    /// Every `syncfs` of a blob store fails with the errno while set (all
    /// threads: a test running meanwhile takes the per-copy way, with the
    /// same result).
    static SYNCFS_ERRNO: Mutex<Option<i32>> = Mutex::new(None);

    pub fn inject_syncfs_errno(errno: Option<i32>) {
        *SYNCFS_ERRNO.lock().unwrap_or_else(|p| p.into_inner()) = errno;
    }

    pub fn injected_syncfs_errno() -> Option<i32> {
        *SYNCFS_ERRNO.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Temp files of these blobs fail `sync_data` with the errno, on every
    /// thread (publish syncs on its own threads). Keyed by blob, so tests
    /// running in parallel do not see each other's failures.
    static SYNC_ERRNO: Mutex<Vec<(BlobId, i32)>> = Mutex::new(Vec::new());

    pub fn inject_sync_errno(id: BlobId, errno: i32) {
        SYNC_ERRNO
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, errno));
    }

    pub fn injected_sync_errno(temp: &Path) -> Option<i32> {
        let name = temp.file_name()?.to_str()?;
        SYNC_ERRNO
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(id, _)| name.starts_with(&id.to_hex()))
            .map(|(_, errno)| *errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Fixture {
        _dir: tempfile::TempDir,
        state: PathBuf,
        src: PathBuf,
        cm: PathBuf,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (state, src, cm) = (
            dir.path().join("state"),
            dir.path().join("src"),
            dir.path().join("cm"),
        );
        for d in [&state, &src, &cm] {
            fs::create_dir_all(d).unwrap();
        }
        Fixture {
            _dir: dir,
            state,
            src,
            cm,
        }
    }

    fn sha(bytes: &[u8]) -> BlobId {
        BlobId(Sha256::digest(bytes).into())
    }

    fn file_ref(path: &str, content: &[u8]) -> FileRef {
        let name = path.rsplit('/').next().unwrap();
        FileRef::native(path, name, content.len() as u64, sha(content))
    }

    fn put(root: &Path, rel: &str, content: &[u8]) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    fn cm_name(f: &FileRef) -> String {
        format!("{}_{}", f.name, f.key().to_hex())
    }

    /// Temp files in the shards of `blobs/tmp`, and anything else there.
    fn temp_count(state: &Path) -> usize {
        let tmp = state.join("blobs/tmp");
        fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap())
            .map(
                |e| match e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
                    Some(n) if n < TMP_SHARDS => fs::read_dir(e.path()).unwrap().count(),
                    _ => 1,
                },
            )
            .sum()
    }

    /// A Hive reference to `dir/rel` (mapped through `--source-map` to `dir`).
    fn hive_ref(dir: &Path, rel: &str, verify: Verify) -> FileRef {
        let mut f = FileRef::native(rel, rel.rsplit('/').next().unwrap(), 0, sha(b""));
        f.path = dir.join(rel).display().to_string();
        f.verify = verify;
        f.key = Some(sha(rel.as_bytes()));
        f.source_dir = Some(dir.display().to_string());
        f
    }

    #[test]
    fn hive_file_behind_a_symlink_out_of_its_mapped_directory_is_refused_unread() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let secret = fx.cm.join("secret");
        fs::write(&secret, b"not the warehouse's").unwrap();
        fs::create_dir_all(fx.src.join("t")).unwrap();
        std::os::unix::fs::symlink(&secret, fx.src.join("t/000000_0")).unwrap();
        std::os::unix::fs::symlink(&fx.cm, fx.src.join("up")).unwrap();
        put(&fx.src, "t/000001_0", b"inside");
        for rel in ["t/000000_0", "up/secret"] {
            let f = hive_ref(&fx.src, rel, Verify::None);
            let err = store.fetch(&f, Path::new(""), None).unwrap_err();
            assert!(err.to_string().contains("leaves its root"), "{rel}: {err}");
        }
        // The same file through a cm copy mapped beneath the cm directory:
        // the cm copy is a symlink back out of it.
        let mut f = hive_ref(&fx.src, "t/000002_0", Verify::None);
        f.verify = Verify::Hdfs {
            checksum: "00".into(),
        };
        std::os::unix::fs::symlink(&secret, fx.src.join("cm_link")).unwrap();
        f.cm_path = Some(fx.src.join("cm_link").display().to_string());
        f.cm_dir = Some(fx.cm.display().to_string());
        let err = store.fetch(&f, Path::new(""), None).unwrap_err();
        assert!(
            err.to_string().contains("not below its mapped directory"),
            "{err}"
        );
        // Nothing was read into the store.
        assert!(store.list().unwrap().is_empty());
        assert_eq!(temp_count(&fx.state), 0);
        // Without its mapped directory a Hive file is not opened at all.
        let mut f = hive_ref(&fx.src, "t/000001_0", Verify::None);
        f.source_dir = None;
        let err = store.fetch(&f, Path::new(""), None).unwrap_err();
        assert!(
            err.to_string().contains("names no --source-map directory"),
            "{err}"
        );
        // A regular file beneath the mapped directory is staged.
        let f = hive_ref(&fx.src, "t/000001_0", Verify::None);
        store.fetch(&f, Path::new(""), None).unwrap();
        assert_eq!(store.list().unwrap(), vec![sha(b"inside")]);
    }

    #[test]
    fn unsynced_copies_are_in_place_only_after_publish() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let (a, b) = (file_ref("d/a", b"alpha"), file_ref("d/b", b"beta"));
        put(&fx.src, "d/a", b"alpha");
        put(&fx.src, "d/b", b"beta");
        let ca = store.fetch_unsynced(&a, &fx.src, None).unwrap().copy;
        let fb = store.fetch_unsynced(&b, &fx.src, None).unwrap();
        let (origin, cb) = (fb.outcome, fb.copy);
        assert_eq!(origin, FetchOutcome::FromSource);
        // Verified but not in place: nothing trusts it yet.
        assert!(!store.contains(&a.key()));
        assert_eq!(temp_count(&fx.state), 2);
        store.publish(vec![ca.unwrap(), cb.unwrap()]).unwrap();
        assert!(store.contains(&a.key()) && store.contains(&b.key()));
        assert_eq!(fs::read(store.path(&b.key())).unwrap(), b"beta");
        assert_eq!(store.staged_bytes(), 9);
        assert_eq!(temp_count(&fx.state), 0);
        let again = store.fetch_unsynced(&a, &fx.src, None).unwrap();
        let (outcome, none) = (again.outcome, again.copy);
        assert_eq!(
            (outcome, none.is_none()),
            (FetchOutcome::AlreadyPresent, true)
        );
    }

    #[test]
    fn a_fan_out_directory_removed_behind_the_store_is_created_again() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let a = file_ref("d/a", b"alpha");
        put(&fx.src, "d/a", b"alpha");
        store.fetch(&a, &fx.src, None).unwrap();
        // The store now knows `a`'s fan-out directory exists; take it away
        // (with the blob), then place the blob again both ways.
        let fan_out = store.path(&a.key()).parent().unwrap().to_path_buf();
        fs::remove_dir_all(&fan_out).unwrap();
        store.fetch(&a, &fx.src, None).unwrap();
        assert_eq!(fs::read(store.path(&a.key())).unwrap(), b"alpha");
        fs::remove_dir_all(&fan_out).unwrap();
        let copy = store.fetch_unsynced(&a, &fx.src, None).unwrap().copy;
        store.publish(vec![copy.unwrap()]).unwrap();
        assert_eq!(fs::read(store.path(&a.key())).unwrap(), b"alpha");
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn fan_out_directories_a_group_creates_are_durable_with_its_renames() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let state = |id: &BlobId| store.fan_out(id).load(Ordering::Relaxed);
        // Below and above GROUP_SYNC_MIN: per copy and by filesystem.
        for (tag, n) in [("few", 3), ("many", GROUP_SYNC_MIN + 8)] {
            let (blobs, copies) = copies_of(&fx, &store, tag, n);
            let new: Vec<&BlobId> = blobs
                .iter()
                .filter(|b| state(b) == FAN_OUT_UNKNOWN)
                .collect();
            assert!(!new.is_empty(), "{tag}: some fan-out directory is new");
            store.publish(copies).unwrap();
            for b in &blobs {
                assert!(store.contains(b), "{tag}");
                assert_eq!(state(b), FAN_OUT_DURABLE, "{tag}");
            }
        }
        // Placed but not synced: the caller is told to sync `blobs/`.
        let (blobs, mut copies) = copies_of(&fx, &store, "alone", 40);
        let i = blobs
            .iter()
            .position(|b| state(b) == FAN_OUT_UNKNOWN)
            .expect("40 random blobs leave some of 256 directories new");
        let mut copy = copies.swap_remove(i);
        let placed = store
            .place(&copy.temp.path, &blobs[i], &store.path(&blobs[i]))
            .unwrap();
        copy.temp.keep = true;
        assert!(placed.placed_here && placed.dir_new);
        assert_eq!(state(&blobs[i]), FAN_OUT_EXISTS);
        store.sync_fan_out_dir(&blobs[i], false).unwrap();
        assert_eq!(state(&blobs[i]), FAN_OUT_DURABLE);
    }

    #[test]
    fn failed_data_sync_of_one_copy_keeps_it_out_of_place_and_publishes_the_rest() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let names = ["sync-a", "sync-b", "sync-c"];
        let refs: Vec<FileRef> = names
            .iter()
            .map(|n| {
                let content = format!("content of {n} for the sync test");
                put(&fx.src, n, content.as_bytes());
                file_ref(n, content.as_bytes())
            })
            .collect();
        let blobs: Vec<BlobId> = refs.iter().map(|f| f.key()).collect();
        let copies: Vec<Unsynced> = refs
            .iter()
            .map(|f| {
                store
                    .fetch_unsynced(f, &fx.src, None)
                    .unwrap()
                    .copy
                    .unwrap()
            })
            .collect();
        test_hooks::inject_sync_errno(blobs[1], libc::EIO);

        let (err, failed) = store.publish(copies).expect_err("a data sync failed");
        assert_eq!(failed, vec![blobs[1]]);
        assert!(err.to_string().contains("syncing"), "{err}");
        // Never at its path without durable bytes; the others are in place.
        assert!(!store.contains(&blobs[1]));
        assert!(store.contains(&blobs[0]) && store.contains(&blobs[2]));
        assert_eq!(temp_count(&fx.state), 0);
    }

    /// `n` verified copies of distinct contents named `{tag}-{i}`.
    fn copies_of(
        fx: &Fixture,
        store: &BlobStore,
        tag: &str,
        n: usize,
    ) -> (Vec<BlobId>, Vec<Unsynced>) {
        (0..n)
            .map(|i| {
                let name = format!("{tag}-{i}");
                let content = format!("content of {name}");
                put(&fx.src, &name, content.as_bytes());
                let f = file_ref(&name, content.as_bytes());
                let copy = store
                    .fetch_unsynced(&f, &fx.src, None)
                    .unwrap()
                    .copy
                    .unwrap();
                (f.key(), copy)
            })
            .unzip()
    }

    #[test]
    fn a_large_group_is_durably_in_place_and_a_failed_writeback_keeps_only_that_copy_out() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        // The machine's /tmp is ext4 or tmpfs: the group takes one syncfs.
        eprintln!("group sync here: {:?}", store.group_sync());
        let (blobs, copies) = copies_of(&fx, &store, "group", GROUP_SYNC_MIN + 8);
        test_hooks::inject_sync_errno(blobs[7], libc::EIO);

        let (err, failed) = store.publish(copies).expect_err("one writeback failed");
        assert_eq!(failed, vec![blobs[7]]);
        assert!(err.to_string().contains("syncing"), "{err}");
        assert!(!store.contains(&blobs[7]));
        for (i, b) in blobs.iter().enumerate().filter(|(i, _)| *i != 7) {
            assert!(store.contains(b), "blob {i} is in place");
            assert_eq!(
                fs::read(store.path(b)).unwrap(),
                format!("content of group-{i}").as_bytes()
            );
        }
        assert_eq!(temp_count(&fx.state), 0);
        assert_eq!(store.stored_blobs(), blobs.len() as u64 - 1);
    }

    #[test]
    fn a_failing_syncfs_falls_back_to_one_sync_per_copy_with_the_same_result() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let (blobs, copies) = copies_of(&fx, &store, "fallback", GROUP_SYNC_MIN + 3);
        test_hooks::inject_sync_errno(blobs[2], libc::EIO);
        test_hooks::inject_syncfs_errno(Some(libc::EIO));
        let result = store.publish(copies);
        test_hooks::inject_syncfs_errno(None);

        let (_, failed) = result.expect_err("one data sync failed");
        assert_eq!(failed, vec![blobs[2]]);
        for (i, b) in blobs.iter().enumerate() {
            assert_eq!(store.contains(b), i != 2, "blob {i}");
        }
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn fifo_at_the_source_path_is_refused_without_blocking() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let f = file_ref("d/pipe", b"alpha");
        fs::create_dir_all(fx.src.join("d")).unwrap();
        let path = std::ffi::CString::new(fx.src.join("d/pipe").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
        let err = store.fetch(&f, &fx.src, None).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn dropped_unsynced_copy_leaves_no_temp() {
        let fx = fixture();
        let store = BlobStore::open(&fx.state).unwrap();
        let a = file_ref("d/a", b"alpha");
        put(&fx.src, "d/a", b"alpha");
        let copy = store.fetch_unsynced(&a, &fx.src, None).unwrap().copy;
        drop(copy);
        assert_eq!(temp_count(&fx.state), 0);
        assert!(!store.contains(&a.key()));
    }

    #[test]
    fn fetch_verifies_and_stores_once() {
        let fx = fixture();
        let content = b"hello, warehouse";
        put(&fx.src, "db/t/p=a/000000_0", content);
        put(&fx.src, "db/t/p=b/000000_0", content);
        let store = BlobStore::open(&fx.state).unwrap();
        let a = file_ref("db/t/p=a/000000_0", content);
        let b = file_ref("db/t/p=b/000000_0", content);

        assert_eq!(
            store.fetch(&a, &fx.src, None).unwrap(),
            FetchOutcome::FromSource
        );
        assert_eq!(
            store.fetch(&a, &fx.src, None).unwrap(),
            FetchOutcome::AlreadyPresent
        );
        assert_eq!(
            store.fetch(&b, &fx.src, None).unwrap(),
            FetchOutcome::AlreadyPresent
        );

        let hex = a.key().to_hex();
        assert_eq!(
            store.path(&a.key()),
            fx.state.join("blobs").join(&hex[..2]).join(&hex)
        );
        assert_eq!(fs::read(store.path(&a.key())).unwrap(), content);
        assert!(store.contains(&a.key()));
        assert_eq!(store.staged_bytes(), content.len() as u64);
        assert_eq!(store.list().unwrap(), vec![a.key()]);
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn corrupted_source_same_size_is_taken_from_cm() {
        let fx = fixture();
        let good = b"the original bytes";
        let f = file_ref("db/t/000000_0", good);
        put(&fx.src, &f.path, b"THE ORIGINAL BYTES");
        put(&fx.cm, &cm_name(&f), good);
        let store = BlobStore::open(&fx.state).unwrap();

        let outcome = store.fetch(&f, &fx.src, Some(&fx.cm)).unwrap();
        assert_eq!(outcome, FetchOutcome::FromChangeManagement);
        assert_eq!(fs::read(store.path(&f.key())).unwrap(), good);
    }

    #[test]
    fn large_file_is_verified_on_the_pipelined_path() {
        let fx = fixture();
        let good: Vec<u8> = (0..PIPELINE_MIN_BYTES as usize * 2 + 12345)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let f = file_ref("db/t/big", &good);
        let mut corrupt = good.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        put(&fx.src, &f.path, &corrupt);
        put(&fx.cm, &cm_name(&f), &good);
        let store = BlobStore::open(&fx.state).unwrap();

        assert_eq!(
            store.fetch(&f, &fx.src, Some(&fx.cm)).unwrap(),
            FetchOutcome::FromChangeManagement
        );
        assert!(fs::read(store.path(&f.key())).unwrap() == good);
        assert_eq!(store.staged_bytes(), good.len() as u64);
        assert_eq!(temp_count(&fx.state), 0);
    }

    fn store(fx: &Fixture) -> BlobStore {
        BlobStore::open(&fx.state).unwrap()
    }

    /// A store that checks Hive's HDFS checksums.
    fn hive_store(fx: &Fixture) -> BlobStore {
        store(fx).with_checks(Arc::new(crate::source::hive::HdfsChecks))
    }

    /// A file of `pieces` kernel-copy pieces and a bit, on the pipelined path.
    fn multi_piece_content(pieces: u64, seed: usize) -> Vec<u8> {
        let len = (KERNEL_COPY_PIECE_BYTES * pieces) as usize + 4321;
        assert!(len as u64 >= PIPELINE_MIN_BYTES);
        (0..len).map(|i| (i * seed % 251) as u8).collect()
    }

    /// Fetches `f` (the only copy is at the source) while `change` runs on
    /// the source file after the second piece was copied; the error text.
    fn fetch_while_changing(
        fx: &Fixture,
        store: BlobStore,
        f: &FileRef,
        change: impl FnOnce(&Path) + 'static,
    ) -> String {
        let path = fx.src.join(&f.path);
        let mut change = Some(change);
        test_hooks::after_each_piece(Some(Box::new(move || {
            if let Some(change) = change.take() {
                change(&path);
            }
        })));
        let result = store.fetch(f, &fx.src, None);
        test_hooks::after_each_piece(None);
        assert_eq!(temp_count(&fx.state), 0);
        assert!(store.list().unwrap().is_empty());
        result.unwrap_err().to_string()
    }

    fn append_to(path: &Path) {
        let mut file = OpenOptions::new().append(true).open(path).unwrap();
        file.write_all(b"appended").unwrap();
    }

    #[test]
    fn multi_piece_source_growing_mid_copy_is_unusable() {
        let fx = fixture();
        let content = multi_piece_content(3, 7);
        let f = file_ref("db/t/grows", &content);
        put(&fx.src, &f.path, &content);
        let err = fetch_while_changing(&fx, store(&fx), &f, append_to);
        assert!(err.contains("grew while reading"), "{err}");
    }

    #[test]
    fn multi_piece_source_shrinking_mid_copy_is_unusable() {
        let fx = fixture();
        let content = multi_piece_content(3, 11);
        let f = file_ref("db/t/shrinks", &content);
        put(&fx.src, &f.path, &content);
        let keep = KERNEL_COPY_PIECE_BYTES * 2 + 10;
        let err = fetch_while_changing(&fx, store(&fx), &f, move |path| {
            let file = OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(keep).unwrap();
        });
        assert!(err.contains("shrank while reading"), "{err}");
    }

    #[test]
    fn hive_file_known_by_checksum_only_growing_mid_copy_is_unusable() {
        use crate::source::hive::checksum::CrcType;
        let fx = fixture();
        let content = multi_piece_content(2, 13);
        put(&fx.src, "t/000000_0", &content);
        let checksum = hdfs_hex(&content, CrcType::Crc32c);
        let f = hive_ref(&fx.src, "t/000000_0", Verify::Hdfs { checksum });
        let err = fetch_while_changing(&fx, hive_store(&fx), &f, append_to);
        assert!(err.contains("grew while reading"), "{err}");
    }

    /// The HDFS checksum (hex) of `bytes` as a cluster using `ty` reports
    /// it: 512 bytes per CRC, 1 MiB blocks.
    fn hdfs_hex(bytes: &[u8], ty: crate::source::hive::checksum::CrcType) -> String {
        use crate::source::hive::checksum::{HdfsChecksum, HdfsChecksummer};
        let shape = HdfsChecksum::Md5Md5Crc {
            bytes_per_crc: 512,
            crc_per_block: 2048,
            md5: [0; 16],
        };
        let mut summer = HdfsChecksummer::new(&shape, &[ty]);
        summer.update(bytes);
        summer.finish()[0].1.to_hex()
    }

    #[test]
    fn hdfs_checksum_of_either_crc_type_verifies_small_and_large_files() {
        use crate::source::hive::checksum::CrcType;
        let fx = fixture();
        let store = hive_store(&fx);
        let large = KERNEL_COPY_PIECE_BYTES as usize * 2 + 777;
        for (i, size) in [1000, large].into_iter().enumerate() {
            for (j, ty) in [CrcType::Crc32c, CrcType::Crc32].into_iter().enumerate() {
                let seed = i * 2 + j + 1;
                let content: Vec<u8> = (0..size).map(|k| (k * seed % 253) as u8).collect();
                let rel = format!("t/{seed:06}_0");
                put(&fx.src, &rel, &content);
                let checksum = hdfs_hex(&content, ty);
                let f = hive_ref(&fx.src, &rel, Verify::Hdfs { checksum });
                let outcome = store.fetch(&f, Path::new(""), None);
                assert_eq!(outcome.unwrap(), FetchOutcome::FromSource, "{size} {ty:?}");
                assert!(fs::read(store.path(&sha(&content))).unwrap() == content);
            }
        }
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn large_hive_file_with_a_wrong_checksum_is_taken_from_cm_and_a_mismatch_names_both_crc_types()
    {
        use crate::source::hive::checksum::CrcType;
        let fx = fixture();
        let store = hive_store(&fx);
        let good = multi_piece_content(2, 7);
        let mut corrupt = good.clone();
        corrupt[KERNEL_COPY_PIECE_BYTES as usize + 5] ^= 1;
        put(&fx.src, "t/000000_0", &corrupt);
        put(&fx.cm, "000000_0_x", &good);
        // An old cluster's CRC32 checksum: the good copy passes on the
        // second pass, the corrupt one on neither.
        let checksum = hdfs_hex(&good, CrcType::Crc32);
        let mut f = hive_ref(&fx.src, "t/000000_0", Verify::Hdfs { checksum });
        f.cm_path = Some(fx.cm.join("000000_0_x").display().to_string());
        f.cm_dir = Some(fx.cm.display().to_string());
        assert_eq!(
            store.fetch(&f, Path::new(""), None).unwrap(),
            FetchOutcome::FromChangeManagement
        );
        assert!(fs::read(store.path(&sha(&good))).unwrap() == good);

        // Wrong at both places: the error names what both CRC types gave.
        put(&fx.cm, "000000_0_x", &corrupt);
        fs::remove_file(store.path(&sha(&good))).unwrap();
        let err = store
            .fetch(&f, Path::new(""), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("HDFS checksum mismatch"), "{err}");
        assert!(err.contains("(CRC32C)") && err.contains("(CRC32)"), "{err}");
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn missing_source_falls_back_to_cm() {
        let fx = fixture();
        let good = b"overwritten at the source";
        let f = file_ref("db/t/p=a/000000_0", good);
        put(&fx.cm, &cm_name(&f), good);
        let store = BlobStore::open(&fx.state).unwrap();

        assert_eq!(
            store.fetch(&f, &fx.src, Some(&fx.cm)).unwrap(),
            FetchOutcome::FromChangeManagement
        );
        assert_eq!(fs::read(store.path(&f.key())).unwrap(), good);
        assert_eq!(store.staged_bytes(), good.len() as u64);
    }

    #[test]
    fn cm_copy_is_found_under_the_file_name_when_it_differs_from_the_path() {
        let fx = fixture();
        let good = b"renamed file";
        let mut f = file_ref("db/t/staging-123", good);
        f.name = "000000_0".to_owned();
        put(&fx.cm, &format!("000000_0_{}", f.key().to_hex()), good);
        let store = BlobStore::open(&fx.state).unwrap();

        assert_eq!(
            store.fetch(&f, &fx.src, Some(&fx.cm)).unwrap(),
            FetchOutcome::FromChangeManagement
        );
    }

    #[test]
    fn missing_everywhere_is_unavailable_and_leaves_no_blob_or_temp() {
        let fx = fixture();
        let f = file_ref("db/t/000000_0", b"gone");
        // A cm copy under the right name but with the wrong bytes.
        put(&fx.cm, &cm_name(&f), b"GONE");
        let store = BlobStore::open(&fx.state).unwrap();

        let err = store.fetch(&f, &fx.src, Some(&fx.cm)).unwrap_err();
        let StageError::Unavailable { path, detail } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(path, "db/t/000000_0");
        let src_path = fx.src.join(&f.path).display().to_string();
        let cm_path = fx.cm.join(cm_name(&f)).display().to_string();
        assert!(detail.contains(&format!("{src_path}: missing")), "{detail}");
        assert!(
            detail.contains(&format!("{cm_path}: sha mismatch")),
            "{detail}"
        );
        assert_eq!(err.kind_label(), "unavailable");
        assert!(err.is_retryable());

        assert!(store.list().unwrap().is_empty());
        assert!(store.list().unwrap().is_empty());
        assert_eq!(store.staged_bytes(), 0);
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn size_mismatch_is_rejected() {
        let fx = fixture();
        let f = file_ref("db/t/000000_0", b"12345");
        put(&fx.src, &f.path, b"123");
        let store = BlobStore::open(&fx.state).unwrap();

        let err = store.fetch(&f, &fx.src, None).unwrap_err();
        let StageError::Unavailable { detail, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(detail.contains("size 3 expected 5"), "{detail}");
        assert!(detail.contains("no change-management root"), "{detail}");
        assert!(store.list().unwrap().is_empty());
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn path_escaping_the_source_root_is_rejected() {
        let fx = fixture();
        let mut f = file_ref("x", b"secret");
        f.path = fx.cm.join("x").display().to_string();
        put(&fx.cm, "x", b"secret");
        let store = BlobStore::open(&fx.state).unwrap();

        let err = store.fetch(&f, &fx.src, None).unwrap_err();
        assert!(matches!(err, StageError::Unavailable { .. }), "{err:?}");
        assert!(store.list().unwrap().is_empty());
    }

    #[test]
    fn leftover_temp_files_are_removed_on_open() {
        let fx = fixture();
        let content = b"kept";
        let f = file_ref("a", content);
        put(&fx.src, "a", content);
        {
            let store = BlobStore::open(&fx.state).unwrap();
            store.fetch(&f, &fx.src, None).unwrap();
        }
        let tmp = fx.state.join("blobs/tmp");
        fs::write(
            tmp.join(format!("{}.123.0.tmp", f.key().to_hex())),
            b"partial",
        )
        .unwrap();
        fs::write(tmp.join("junk"), b"x").unwrap();
        fs::write(tmp.join("3").join("c0ffee.9.1.tmp"), b"half").unwrap();

        let store = BlobStore::open(&fx.state).unwrap();
        assert_eq!(temp_count(&fx.state), 0);
        assert_eq!(store.list().unwrap(), vec![f.key()]);
        assert_eq!(
            store.staged_bytes(),
            content.len() as u64,
            "reopen rescans the total"
        );
    }

    #[test]
    fn remove_frees_bytes() {
        let fx = fixture();
        let (one, two) = (b"first blob".as_slice(), b"second, longer blob".as_slice());
        put(&fx.src, "one", one);
        put(&fx.src, "two", two);
        let (f1, f2) = (file_ref("one", one), file_ref("two", two));
        let store = BlobStore::open(&fx.state).unwrap();
        store.fetch(&f1, &fx.src, None).unwrap();
        store.fetch(&f2, &fx.src, None).unwrap();
        assert_eq!(store.staged_bytes(), (one.len() + two.len()) as u64);
        assert_eq!(store.stored_blobs(), 2);

        assert_eq!(store.remove(&f1.key()).unwrap(), one.len() as u64);
        assert_eq!(
            store.remove(&f1.key()).unwrap(),
            0,
            "removing twice is harmless"
        );
        assert!(!store.contains(&f1.key()));
        assert_eq!(store.staged_bytes(), two.len() as u64);
        assert_eq!(store.stored_blobs(), 1);
        assert_eq!(store.list().unwrap(), vec![f2.key()]);
        drop(store);
        let reopened = BlobStore::open(&fx.state).unwrap();
        assert_eq!(reopened.stored_blobs(), 1, "reopen counts the blobs");
    }

    #[test]
    fn parallel_fetches_of_one_blob_store_and_count_it_once() {
        let fx = fixture();
        let content = vec![7u8; PIPELINE_MIN_BYTES as usize + 1];
        for i in 0..4 {
            put(&fx.src, &format!("f{i}"), &content);
        }
        let store = Arc::new(BlobStore::open(&fx.state).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (store, src) = (Arc::clone(&store), fx.src.clone());
                let f = file_ref(&format!("f{i}"), &content);
                std::thread::spawn(move || store.fetch(&f, &src, None).unwrap())
            })
            .collect();
        let outcomes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(outcomes.contains(&FetchOutcome::FromSource), "{outcomes:?}");
        assert_eq!(store.staged_bytes(), content.len() as u64);
        assert_eq!(store.stored_blobs(), 1);
        assert_eq!(store.list().unwrap().len(), 1);
        assert_eq!(temp_count(&fx.state), 0);
    }

    /// A 1 MiB tmpfs mounted for one test, unmounted on drop.
    struct SmallTmpfs {
        dir: tempfile::TempDir,
    }

    impl SmallTmpfs {
        fn mount() -> Option<SmallTmpfs> {
            let dir = tempfile::tempdir().ok()?;
            let status = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
                .arg(dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .ok()?;
            status.success().then_some(SmallTmpfs { dir })
        }
    }

    impl Drop for SmallTmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.dir.path())
                .status();
        }
    }

    #[test]
    fn no_space_is_reported_as_no_space() {
        // Both copy paths: sequential (small) and pipelined (large).
        for size in [2 << 20, PIPELINE_MIN_BYTES as usize + 1] {
            let fx = fixture();
            let content = vec![1u8; size];
            let f = file_ref("big", &content);
            put(&fx.src, "big", &content);

            // A real full disk where we may mount one; otherwise an injected ENOSPC.
            let tmpfs = SmallTmpfs::mount();
            let state = tmpfs
                .as_ref()
                .map_or(fx.state.clone(), |t| t.dir.path().to_path_buf());
            if tmpfs.is_none() {
                test_hooks::inject_write_errno(Some(libc::ENOSPC));
            }
            let store = BlobStore::open(&state).unwrap();
            let result = store.fetch(&f, &fx.src, None);
            test_hooks::inject_write_errno(None);

            let err = result.unwrap_err();
            assert!(matches!(err, StageError::NoSpace { .. }), "{size}: {err:?}");
            assert_eq!(err.kind_label(), "disk full");
            assert!(err.is_retryable());
            assert!(store.list().unwrap().is_empty());
            assert_eq!(temp_count(&state), 0);
            assert_eq!(store.staged_bytes(), 0);
        }
    }

    #[test]
    fn backoff_is_exponential_and_capped_at_10s() {
        let ms = |a| backoff(a).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3)], [100, 200, 400, 800]);
        assert_eq!(ms(6), 6400);
        assert_eq!(ms(7), 10_000);
        assert_eq!(ms(40), 10_000);
        assert_eq!(ms(u32::MAX), 10_000);
    }

    #[test]
    fn blob_store_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<BlobStore>();
    }
}
