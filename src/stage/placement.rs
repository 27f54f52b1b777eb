//! Putting a verified copy in place: the rename of its temp file to the
//! blob's path (never replacing a blob already there), the fan-out
//! directory created when missing, and the directory syncs that make the
//! rename durable. [`Placement`] remembers per fan-out directory whether it
//! exists and whether its entry in `blobs/` is durable, so a group syncs
//! `blobs/` once, not once per directory, and counts the blobs in place.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::durable::fsync_dir;
use crate::event::BlobId;

use super::tmp::{create_dir_entry, TempBlob};
use super::{store_error, StageError};

/// [`Placement`]`::fan_outs`: not looked at yet by this store.
pub(super) const FAN_OUT_UNKNOWN: u8 = 0;

/// The fan-out directory exists (this store created or found it), but its
/// entry in `blobs/` may not be durable yet.
const FAN_OUT_EXISTS: u8 = 1;

/// The fan-out directory exists and `blobs/` was synced after it did.
pub(super) const FAN_OUT_DURABLE: u8 = 2;

/// Where a store's blobs are: their paths under `root`, what the store
/// knows of each fan-out directory, and how many blobs are in place and
/// their total size, kept as blobs are placed and removed.
#[derive(Debug)]
pub(super) struct Placement {
    /// `<state>/blobs`
    root: PathBuf,
    /// `fan_outs[b]`: what this store knows of the fan-out directory
    /// `<root>/<b as hex>` ([`FAN_OUT_UNKNOWN`], [`FAN_OUT_EXISTS`],
    /// [`FAN_OUT_DURABLE`]). Placing a blob in a directory known to exist
    /// needs no `mkdir`; one not known durable makes the placing caller
    /// sync `root` too (once per group, not once per directory). Fan-out
    /// directories are never removed; a rename that finds one gone anyway
    /// creates it again.
    fan_outs: Box<[AtomicU8]>,
    staged_bytes: AtomicU64,
    /// How many blobs are stored; kept with `staged_bytes`.
    stored_blobs: AtomicU64,
}

impl Placement {
    /// The blobs under `root`, none counted yet ([`Placement::found`]).
    pub(super) fn new(root: PathBuf) -> Placement {
        Placement {
            root,
            fan_outs: (0..256).map(|_| AtomicU8::new(FAN_OUT_UNKNOWN)).collect(),
            staged_bytes: AtomicU64::new(0),
            stored_blobs: AtomicU64::new(0),
        }
    }

    /// `<state>/blobs`
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob `id` is (or would be) stored.
    pub(super) fn path(&self, id: &BlobId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join(&hex[..2]).join(hex)
    }

    /// Total size of the stored blobs.
    pub(super) fn staged_bytes(&self) -> u64 {
        self.staged_bytes.load(Ordering::Relaxed)
    }

    /// How many blobs are stored.
    pub(super) fn stored_blobs(&self) -> u64 {
        self.stored_blobs.load(Ordering::Relaxed)
    }

    /// The blobs found in place when the store was opened: `count` of
    /// them, `bytes` in all.
    pub(super) fn found(&self, bytes: u64, count: u64) {
        self.staged_bytes.store(bytes, Ordering::Relaxed);
        self.stored_blobs.store(count, Ordering::Relaxed);
    }

    pub(super) fn count_placed(&self, size: u64) {
        self.staged_bytes.fetch_add(size, Ordering::Relaxed);
        self.stored_blobs.fetch_add(1, Ordering::Relaxed);
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

    /// Moves a verified, synced temp file to the blob path and makes the
    /// rename durable. Never replaces an existing blob: when a parallel fetch
    /// of the same content got there first, this temp is simply dropped.
    pub(super) fn install(
        &self,
        mut temp: TempBlob,
        id: &BlobId,
        size: u64,
    ) -> Result<(), StageError> {
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
    pub(super) fn place(
        &self,
        temp: &Path,
        id: &BlobId,
        dest: &Path,
    ) -> Result<Placed, StageError> {
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
    /// own fsync, and one of `root` when [`Placement::place`] said
    /// `dir_new` or while the directory is not known durable there (a
    /// parallel [`publish`](super::BlobStore::publish) may have created it
    /// and not synced `root` yet).
    pub(super) fn sync_fan_out_dir(&self, id: &BlobId, dir_new: bool) -> Result<(), StageError> {
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

    /// The fan-out directory of `id` is durable in `root` (a sync of `root`
    /// after it existed succeeded).
    pub(super) fn mark_durable(&self, id: &BlobId) {
        self.fan_out(id).store(FAN_OUT_DURABLE, Ordering::Relaxed);
    }

    /// What this store knows of the fan-out directory of `id`.
    pub(super) fn fan_out(&self, id: &BlobId) -> &AtomicU8 {
        &self.fan_outs[usize::from(id.0[0])]
    }
}

/// What [`Placement::place`] did.
pub(super) struct Placed {
    /// The temp was renamed to the blob's path (false: the blob was there).
    pub(super) placed_here: bool,
    /// The fan-out directory's entry in `blobs/` is not known durable: the
    /// caller syncs `blobs/` too.
    pub(super) dir_new: bool,
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
mod tests {
    use super::*;
    use crate::stage::testing::*;
    use crate::stage::{BlobStore, GROUP_SYNC_MIN};

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
        let state = |id: &BlobId| store.placement.fan_out(id).load(Ordering::Relaxed);
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
            .placement
            .place(&copy.temp.path, &blobs[i], &store.path(&blobs[i]))
            .unwrap();
        copy.temp.keep = true;
        assert!(placed.placed_here && placed.dir_new);
        assert_eq!(state(&blobs[i]), FAN_OUT_EXISTS);
        store.placement.sync_fan_out_dir(&blobs[i], false).unwrap();
        assert_eq!(state(&blobs[i]), FAN_OUT_DURABLE);
    }
}
