//! The store itself: opening it (temp files of a crash removed, sizes
//! summed), its paths and counters, the fetch of a file from the first
//! place that has a usable copy, the publishing of a group of copies,
//! and removal and listing for GC. It wires the parts below it: the temp
//! files (`tmp`), the copy engines (`copy`), the checks (`verify`), the
//! placement of blobs (`placement`) and group durability (`durability`).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::event::{is_valid_source_path, BlobId, FileRef, Verify};
use crate::source_file::{Location, Remotes};

use super::copy::{copy_verified, Copied};
use super::durability::{self, GroupSync, Unsynced};
use super::origins::{candidate_places, is_valid_mapped_path};
use super::placement::Placement;
use super::tmp::{ensure_dir, Temps, TMP_DIR_NAME};
use super::verify::{EventTimeMargin, NoSourceChecks, SourceChecks};
use super::{store_error, FetchOutcome, StageError};

/// The blob store. `Send + Sync`; share it through an `Arc`.
#[derive(Debug)]
pub struct BlobStore {
    /// The blobs under `<state>/blobs`: paths, fan-out directories, counts.
    pub(super) placement: Placement,
    /// The temp files in `<state>/blobs/tmp`.
    temps: Temps,
    /// Open on `<state>/blobs` when a whole group can be made durable with
    /// one `syncfs` (see [`GroupSync`]); `None`: one `fdatasync` per copy.
    group_sync: Option<File>,
    /// Makes the checks beyond sha256 that files name ([`SourceChecks`]).
    checks: Arc<dyn SourceChecks>,
    /// How remote places (S3) are reached.
    remotes: Remotes,
    /// How much later than its event a file without a checksum may be
    /// (`--event-time-margin`).
    event_time_margin: EventTimeMargin,
}

impl BlobStore {
    /// Opens (creating if needed) the store under `state_dir`, removes temp
    /// files left by a crash and sums the sizes of the stored blobs.
    /// `state_dir` itself must exist.
    pub fn open(state_dir: &Path) -> Result<BlobStore, StageError> {
        let root = state_dir.join("blobs");
        ensure_dir(&root)?;
        let temps = Temps::open(&root)?;
        // Opened before any copy is written, so its `syncfs` reports every
        // writeback error of the filesystem from now on.
        let group_sync = match GroupSync::for_store(&root) {
            GroupSync::Filesystem => {
                Some(File::open(&root).map_err(|e| store_error("opening", &root, e))?)
            }
            GroupSync::PerFile => None,
        };
        let store = BlobStore {
            placement: Placement::new(root),
            temps,
            group_sync,
            checks: Arc::new(NoSourceChecks),
            remotes: Remotes::default(),
            event_time_margin: EventTimeMargin::DEFAULT,
        };
        store.temps.remove_leftovers()?;
        let (mut total, mut count) = (0u64, 0u64);
        store.for_each_blob(Sizes::Yes, |_, len| {
            total += len;
            count += 1;
        })?;
        store.placement.found(total, count);
        Ok(store)
    }

    /// The store checking files also by what `checks` makes of their
    /// [`Verify`] (the Hive source's HDFS checksum); without it, a file
    /// that asks for more than size and sha256 is unusable.
    pub fn with_checks(mut self, checks: Arc<dyn SourceChecks>) -> BlobStore {
        self.checks = checks;
        self
    }

    /// The store reading remote places (S3) with `remotes`; without it, S3
    /// is read with the process's own AWS environment.
    pub fn with_remotes(mut self, remotes: Remotes) -> BlobStore {
        self.remotes = remotes;
        self
    }

    /// The store accepting a file without a checksum, read where it is,
    /// when modified at most `margin` after its event (default
    /// [`EventTimeMargin::DEFAULT`]).
    pub fn with_event_time_margin(mut self, margin: EventTimeMargin) -> BlobStore {
        self.event_time_margin = margin;
        self
    }

    /// Where the blob `id` is (or would be) stored.
    pub fn path(&self, id: &BlobId) -> PathBuf {
        self.placement.path(id)
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
        self.placement.staged_bytes()
    }

    /// How many blobs are stored.
    pub fn stored_blobs(&self) -> u64 {
        self.placement.stored_blobs()
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
                self.placement.sync_fan_out_dir(&id, false)?;
                return Ok(FetchOutcome::AlreadyPresent);
            }
        }
        let (origin, copy) = self.copy_from_first_usable(file, source_root, cm_root, true)?;
        if file.known().is_none() && self.contains(&copy.blob) {
            self.placement.sync_fan_out_dir(&copy.blob, false)?;
            return Ok(FetchOutcome::AlreadyPresent);
        }
        self.placement.install(copy.temp, &copy.blob, copy.size)?;
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
        if let Verify::Unproven { reason } = &file.verify {
            // Nothing to read: no copy can stand for content that cannot
            // be proven, so the state holding it waits (SPEC §3 rule 2).
            return Err(StageError::Unavailable {
                path: file.source_label().to_owned(),
                detail: reason.clone(),
            });
        }
        let path_ok = match file.known() {
            Some(_) => is_valid_source_path(&file.path),
            // Hive files carry the absolute local path `--source-map` gave,
            // or the URI of a file read where it is (HDFS).
            None => {
                is_valid_mapped_path(&file.path)
                    || matches!(Location::remote(&file.path), Some(Ok(_)))
            }
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
            match copy_verified(
                &self.temps,
                &*self.checks,
                &self.remotes,
                self.event_time_margin,
                &place,
                file,
                sync,
            )? {
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
            (Verify::Hdfs { .. } | Verify::S3Etag { .. }, None) => {
                findings.push("the file's URI names no change-management root".to_owned())
            }
            _ => {}
        }
        Err(StageError::Unavailable {
            path: file.source_label().to_owned(),
            detail: findings.join("; "),
        })
    }

    /// Makes a group of unsynced copies durable and puts them in place, in
    /// the durability order: first the bytes of every copy, then the
    /// renames into place, then the renames themselves. A blob is never at
    /// its path before its bytes are durable, and `Ok` means every blob of
    /// the group is durably at its path. On error, returns the blobs that
    /// are not durably in place (their temps are removed): fetch them again.
    ///
    /// Per copy ([`GroupSync::PerFile`], or fewer than
    /// [`GROUP_SYNC_MIN`](super::GROUP_SYNC_MIN) copies not yet synced): each
    /// temp file is fdatasynced through its own descriptor (on up to
    /// [`PUBLISH_SYNC_THREADS`](super::PUBLISH_SYNC_THREADS) threads, so the
    /// filesystem can commit many in one journal transaction; copies already
    /// synced through [`Unsynced::sync_data`] are skipped), and each touched
    /// fan-out directory is fsynced once after the renames (on as many threads,
    /// for the same reason).
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
        durability::publish(&self.placement, self.group_sync.as_ref(), batch)
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
        self.placement.subtract_staged(len);
        self.placement.sync_fan_out_dir(id, false)?;
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
        let root = self.placement.root();
        for fan in fs::read_dir(root).map_err(listing_err(root))? {
            let fan = fan.map_err(listing_err(root))?;
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
