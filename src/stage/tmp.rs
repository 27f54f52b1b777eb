//! The temp files copies are made in (`blobs/tmp/<shard>/`, [`Temps`]):
//! created with unique names, written with early writeback, synced, and
//! removed on drop unless renamed into place; and the store's directories
//! created durably.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::durable::{fsync_dir, Writeback};
use crate::event::BlobId;

#[cfg(test)]
use super::test_hooks;
use super::{store_error, StageError};

/// Start writeback of the temp file every this many bytes, so that the final
/// `sync_data` waits for the tail only, and the disk works while we hash.
#[cfg(target_os = "linux")]
const WRITEBACK_CHUNK_BYTES: u64 = 16 << 20;

/// The directory below `blobs/` that holds the temp files.
pub(super) const TMP_DIR_NAME: &str = "tmp";

const TMP_SUFFIX: &str = ".tmp";

/// Temp files are spread over `tmp/0` … `tmp/15`. Creating a file takes
/// its directory's lock while the filesystem allocates the inode, so
/// parallel copies into one directory wait for each other: a bootstrap of
/// 15,000 small files spent 27 % of its samples spinning on the lock of
/// `tmp/` (`perf`, docs/benchmarks/HISTORY.md "Bootstrap").
pub(super) const TMP_SHARDS: u64 = 16;

/// The temp files of one store, in `<blobs>/tmp/<shard>/`.
#[derive(Debug)]
pub(super) struct Temps {
    /// `<state>/blobs/tmp`
    dir: PathBuf,
    /// Makes temp names unique within this process, so parallel fetches of
    /// one blob never share a temp file; the pid in the name is for humans
    /// reading a leftover.
    next: AtomicU64,
    /// This process's id, for the temp names (read once: `getpid` is a
    /// system call per temp otherwise).
    pid: u32,
}

impl Temps {
    /// The temp files under `root` (`<state>/blobs`), creating `tmp/` and
    /// its shards when missing.
    pub(super) fn open(root: &Path) -> Result<Temps, StageError> {
        let dir = root.join(TMP_DIR_NAME);
        ensure_dir(&dir)?;
        for shard in 0..TMP_SHARDS {
            ensure_dir(&dir.join(shard.to_string()))?;
        }
        Ok(Temps {
            dir,
            next: AtomicU64::new(0),
            pid: std::process::id(),
        })
    }

    /// A new temp file for a copy of blob `id` (the id is for humans
    /// reading a leftover; the blob is named by what the copy hashes to).
    pub(super) fn create(&self, id: &BlobId) -> Result<TempBlob, StageError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join((n % TMP_SHARDS).to_string()).join(format!(
            "{}.{}.{n}{TMP_SUFFIX}",
            id.to_hex(),
            self.pid
        ));
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

    /// Removes everything below `tmp/` but its shard directories.
    pub(super) fn remove_leftovers(&self) -> Result<(), StageError> {
        let shards: Vec<PathBuf> = (0..TMP_SHARDS)
            .map(|n| self.dir.join(n.to_string()))
            .collect();
        let mut removed = 0usize;
        for dir in std::iter::once(&self.dir).chain(&shards) {
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
            tracing::info!(removed, dir = %self.dir.display(), "removed leftover temp files");
        }
        Ok(())
    }
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
pub(super) fn ensure_dir(dir: &Path) -> Result<(), StageError> {
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
