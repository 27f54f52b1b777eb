//! Making a group of verified copies durable at once
//! ([`BlobStore::publish`](super::BlobStore::publish)), in the durability
//! order: the bytes of every copy, then the renames into place, then the
//! renames themselves. Per copy (`fdatasync` each, on several threads) or by
//! filesystem (one `syncfs` where the filesystem writes to a device itself,
//! [`GroupSync`]).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::thread;

use crate::durable::fsync_dir;
use crate::event::BlobId;
use crate::source_file::Identity;

use super::placement::{Placed, Placement};
#[cfg(test)]
use super::test_hooks;
use super::tmp::TempBlob;
use super::{store_error, StageError};

/// Copies in one [`BlobStore::publish`](super::BlobStore::publish) from which a
/// `syncfs` of the store's filesystem replaces one `fdatasync` per copy.
/// Measured (docs/BENCHMARKS.md, "Blob group durability"): a single small blob
/// is faster with its own `fdatasync` (a `syncfs` also flushes every other
/// writer's dirty data), groups of 64 and more small blobs are 1.5–6× faster
/// with `syncfs`.
pub const GROUP_SYNC_MIN: usize = 32;

/// How [`BlobStore::publish`](super::BlobStore::publish) makes a large group
/// durable, chosen when the store is opened from the filesystem that holds it.
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
    pub(super) fn for_store(root: &Path) -> GroupSync {
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

/// [`BlobStore::publish`](super::BlobStore::publish) of the blobs in
/// `placement`: `group_sync` is open on the store's filesystem when a
/// group of [`GROUP_SYNC_MIN`] or more copies is made durable with
/// `syncfs` ([`GroupSync::Filesystem`]).
pub(super) fn publish(
    placement: &Placement,
    group_sync: Option<&File>,
    batch: Vec<Unsynced>,
) -> Result<(), (StageError, Vec<BlobId>)> {
    if batch.is_empty() {
        return Ok(());
    }
    let unsynced = batch.iter().filter(|u| !u.synced).count();
    let by_filesystem = group_sync.filter(|_| unsynced >= GROUP_SYNC_MIN);
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
        let dest = placement.path(&u.id);
        let fan_out = dest.parent().unwrap_or(placement.root()).to_path_buf();
        // placed_here: renamed into place (false: a parallel copy got
        // there first and this temp is dropped).
        let result = placement.place(&u.temp.path, &u.id, &dest);
        match result {
            Ok(Placed {
                placed_here,
                dir_new,
            }) => {
                if dir_new {
                    new_dirs.push(u.id);
                    touched.insert(placement.root().to_path_buf());
                }
                if placed_here {
                    u.temp.keep = true;
                    placement.count_placed(u.size);
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
            if fs::remove_file(placement.path(id)).is_ok() {
                placement.subtract_staged(*size);
            }
        }
        failed.extend(placed.iter().map(|(id, _)| *id));
        return Err((store_error("syncing directory", &dir, e), failed));
    }
    for id in &new_dirs {
        placement.mark_durable(id);
    }
    match first_error {
        Some(e) => Err((e, failed)),
        None => Ok(()),
    }
}

/// A verified copy waiting in `tmp/` for
/// [`BlobStore::publish`](super::BlobStore::publish); dropping it removes the
/// temp file.
pub struct Unsynced {
    pub(super) temp: TempBlob,
    pub(super) id: BlobId,
    pub(super) size: u64,
    /// Already fdatasynced by [`Unsynced::sync_data`]: publish skips it.
    pub(super) synced: bool,
    /// The source's identity through the file read, after the copy.
    pub(super) source_after: Identity,
}

impl Unsynced {
    pub fn id(&self) -> BlobId {
        self.id
    }

    /// The source file's identity, read through the file the bytes were
    /// copied from (for a local file its descriptor), after the copy: a
    /// caller that listed the file compares its identity with this instead
    /// of a `stat` of the path.
    pub fn source_after(&self) -> &Identity {
        &self.source_after
    }

    /// `fdatasync`s the copy now, so that
    /// [`BlobStore::publish`](super::BlobStore::publish) only renames it: a
    /// caller with many copies syncs each as it is made, overlapping the wait
    /// with the copies still running. On error the copy is not durable;
    /// dropping it removes the temp.
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

/// Most threads [`BlobStore::publish`](super::BlobStore::publish) fdatasyncs a
/// group with. The syncs mostly wait on the disk, so more threads than cores
/// pay off: the filesystem commits concurrent syncs together.
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

/// [`BlobStore::publish`](super::BlobStore::publish) by filesystem: one
/// `syncfs` through `fd`, then each copy's own writeback result, read through
/// its descriptor. When the `syncfs` fails, [`sync_all_data`] does it copy by
/// copy instead.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::FileRef;
    use crate::stage::testing::*;
    use crate::stage::{BlobStore, FetchOutcome};

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
}
