//! The store itself: opening it (temp files of a crash removed, sizes
//! summed), its paths and counters, the fetch of a file from the first
//! place that has a usable copy, removal and listing for GC, and the temp
//! files copies are made in (`blobs/tmp/<shard>/`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crate::durable::{fsync_dir, Writeback};
use crate::event::{is_valid_source_path, BlobId, FileRef, Verify};

use super::durability::{GroupSync, Unsynced};
use super::origins::{candidate_places, is_valid_mapped_path};
use super::placement::FAN_OUT_UNKNOWN;
#[cfg(test)]
use super::test_hooks;
use super::verify::{Copied, NoSourceChecks, SourceChecks};
use super::{store_error, FetchOutcome, StageError};

/// Start writeback of the temp file every this many bytes, so that the final
/// `sync_data` waits for the tail only, and the disk works while we hash.
#[cfg(target_os = "linux")]
const WRITEBACK_CHUNK_BYTES: u64 = 16 << 20;

const TMP_DIR_NAME: &str = "tmp";

const TMP_SUFFIX: &str = ".tmp";

/// Temp files are spread over `tmp/0` … `tmp/15`. Creating a file takes
/// its directory's lock while the filesystem allocates the inode, so
/// parallel copies into one directory wait for each other: a bootstrap of
/// 15,000 small files spent 27 % of its samples spinning on the lock of
/// `tmp/` (`perf`, docs/benchmarks/HISTORY.md "Bootstrap").
pub(super) const TMP_SHARDS: u64 = 16;

/// The blob store. `Send + Sync`; share it through an `Arc`.
#[derive(Debug)]
pub struct BlobStore {
    /// `<state>/blobs`
    pub(super) root: PathBuf,
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
    pub(super) fan_outs: Box<[AtomicU8]>,
    /// Open on `root` when a whole group can be made durable with one
    /// `syncfs` (see [`GroupSync`]); `None`: one `fdatasync` per copy.
    pub(super) group_sync: Option<File>,
    /// Makes the checks beyond sha256 that files name ([`SourceChecks`]).
    pub(super) checks: Arc<dyn SourceChecks>,
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

    /// How [`BlobStore::publish`] makes groups of [`GROUP_SYNC_MIN`](super::GROUP_SYNC_MIN) or
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

    pub(super) fn count_placed(&self, size: u64) {
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
                            from = %place,
                            source_problem = %findings.join("; "),
                            "fetched from change management"
                        );
                    }
                    return Ok((origin, copied));
                }
                Err(problem) => findings.push(format!("{place}: {problem}")),
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

    pub(super) fn create_temp(&self, id: &BlobId) -> Result<TempBlob, StageError> {
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

    /// One blob of `len` bytes left the store.
    pub(super) fn subtract_staged(&self, len: u64) {
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

/// A temp file in `blobs/tmp/<shard>/`, removed on drop unless it was renamed into place.
pub(super) struct TempBlob {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) writeback: Writeback,
    pub(super) keep: bool,
}

impl TempBlob {
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), StageError> {
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
    pub(super) fn writeback_result(&self) -> Result<(), StageError> {
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

    pub(super) fn sync_data(&self) -> Result<(), StageError> {
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
pub(super) fn create_dir_entry(dir: &Path) -> Result<bool, StageError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
        Err(e) => Err(store_error("creating directory", dir, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::copy::PIPELINE_MIN_BYTES;
    use crate::stage::test_hooks;
    use crate::stage::testing::*;
    use crate::stage::StageError;

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
    fn blob_store_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<BlobStore>();
    }
}
