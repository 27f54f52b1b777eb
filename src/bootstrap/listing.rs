//! Listing a table's or partition's location and staging what is there.
//!
//! Listing follows Hive's readers: regular files below the location, in
//! subdirectories too (union and ACID directories), names starting with
//! `_` or `.` skipped at every level (`_SUCCESS`, `.hive-staging…`,
//! `.name.crc`). A location that does not exist is an empty partition, as
//! for Hive. Symbolic links and other special files are skipped.
//!
//! Staging copies each file into the content-addressed blob store
//! (`stage::BlobStore`: temp file, sha256 while copying) and publishes the
//! copies in groups of `PUBLISH_GROUP`. On a store whose filesystem
//! writes to a device itself (`stage::GroupSync::Filesystem`: ext4, XFS,
//! btrfs) a group is made durable by one `syncfs` before its renames and
//! one after; elsewhere each copy is fdatasynced on a sync thread as soon
//! as it is made (so the disk waits overlap the copies still running) and
//! each touched fan-out directory is fsynced after the renames. Either
//! way every blob is durable at its path
//! before the group's `staged.log` lines are written, and before the
//! driver writes any journal record naming it. A file that changed while
//! it was copied (size, mtime or ctime differ after the copy, read with
//! `fstat` through the descriptor copied from; an inode number other than
//! the one listed: the path was replaced) or vanished is not staged: its
//! table is listed again in a later round.
//!
//! `<state>/bootstrap/staged.log` remembers each staged file as
//! `<sha256> <size> <mtime ns> <ctime ns> <inode> <settled> <path>`,
//! appended and fdatasynced after every published group. A bootstrap
//! started again (after a crash, or after an id gap) does not copy a file
//! whose path, size, mtime, ctime and inode are unchanged and whose blob is
//! still stored: "copy each blob once" across `kill -9`.
//!
//! That identity must change with any rewrite, whatever the clock's
//! granularity. The ctime is set by the kernel on every change of the
//! inode (a write, a rename into place, a new file) and cannot be set by
//! tools that preserve mtimes (`cp -p`, `rsync -t`, `distcp -pt`); but on
//! a kernel with coarse timestamps (a tick of up to 10 ms) a same-size
//! rewrite in the same tick, on an inode number the filesystem reused,
//! could look unchanged. So an entry is *settled* (`1`) only when the
//! file's ctime was more than [`SETTLED_MARGIN_NS`] older than the clock
//! just before the file was listed: any later change then gets a later
//! ctime (the kernel stamps it from the same clock, at most a tick behind
//! it). A settled entry is trusted as it stands; an unsettled one (a file
//! written just before it was listed) is reused only after its bytes are
//! read again and hash to the logged blob (read, not copied). Lines of the
//! older five-field format are not trusted (the file is copied again).
//! Limit: the rule assumes the source filesystem stamps times from this
//! host's clock, or one within the margin of it (a network filesystem
//! whose server clock runs behind by more is trusted as if settled).
//!
//! Called by the bootstrap driver; the copies run on a few threads (the
//! driver's `copy_threads`), the syncs on `SYNC_THREADS` more.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use crate::event::{BlobId, FileRef, Verify};
use crate::source_file::{identity_of, Identity, Location, Remotes, Stamp};
use crate::stage::{BlobStore, GroupSync, Unsynced};

use super::progress::BootstrapProgress;

/// One file found below a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedFile {
    /// The local path, or the URI of a file read where it is (HDFS, S3).
    pub path: PathBuf,
    /// The `--source-map` directory `path` lies in: the file is opened
    /// beneath it, so no symlink in the source leads out of it. None for a
    /// file read where it is.
    pub source_dir: Option<PathBuf>,
    /// Path relative to the location (`delta_1_1/bucket_0`, `000000_0`).
    pub rel: String,
    pub size: u64,
    pub mtime_ns: i64,
    /// Local: the ctime and inode number. Remote: 0 and a digest of its
    /// [`Stamp`] (block size, ETag), so `staged.log` tells versions apart.
    pub ctime_ns: i64,
    pub ino: u64,
    /// What else identifies this version, by kind of place.
    pub stamp: Stamp,
    /// The file's ctime was more than [`SETTLED_MARGIN_NS`] older than the
    /// clock when it was listed (see the module docs).
    pub settled: bool,
}

impl ListedFile {
    /// What must be unchanged for a staged copy to stand for the file:
    /// size, mtime, ctime and inode as listed (remote: size, modification
    /// time and stamp).
    pub fn identity(&self) -> Identity {
        Identity {
            size: self.size,
            mtime_ns: self.mtime_ns,
            stamp: self.stamp,
        }
    }

    /// A file listed at a remote location (`base` its URI) as its reader
    /// lists it: `rel` below it, with its identity.
    fn remote(base: &str, rel: String, identity: Identity, listed_at: i64) -> ListedFile {
        let ino = match identity.stamp {
            Stamp::Local { ino, .. } => ino,
            Stamp::Hdfs { block_size } => block_size,
            Stamp::S3 { tag } => {
                let mut first = [0u8; 8];
                first.copy_from_slice(&tag[..8]);
                u64::from_le_bytes(first)
            }
        };
        ListedFile {
            path: PathBuf::from(format!("{}/{rel}", base.trim_end_matches('/'))),
            source_dir: None,
            rel,
            size: identity.size,
            mtime_ns: identity.mtime_ns,
            ctime_ns: 0,
            ino,
            stamp: identity.stamp,
            settled: identity.mtime_ns.saturating_add(SETTLED_MARGIN_NS) < listed_at,
        }
    }

    /// `(subdirectory, file name)` of [`ListedFile::rel`].
    pub fn split(&self) -> (Option<&str>, &str) {
        match self.rel.rsplit_once('/') {
            Some((dir, name)) => (Some(dir), name),
            None => (None, self.rel.as_str()),
        }
    }
}

/// How much older than the listing a file's ctime must be for its
/// `staged.log` entry to be trusted without reading it again: well above a
/// kernel timestamp tick (at most 10 ms) and small clock adjustments.
pub const SETTLED_MARGIN_NS: i64 = 1_000_000_000;

/// The realtime clock in ns since the epoch (the clock file times use).
fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Every file below `dir` (Hive's rules, see the module docs), sorted.
pub fn list_location(source_dir: &Path, dir: &Path) -> Result<Vec<ListedFile>, String> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        // Before the stats: a file settled against it is older still.
        let listed_at = now_ns();
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("listing {}: {e}", d.display())),
        };
        for entry in entries {
            let entry = entry.map_err(|e| format!("listing {}: {e}", d.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(format!("{}: a file name that is not UTF-8", d.display()));
            };
            if name.starts_with('_') || name.starts_with('.') {
                continue;
            }
            let child_rel = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Gone between readdir and stat: a change, seen as such
                // by the events that follow or by the next listing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("{}: {e}", entry.path().display())),
            };
            if meta.is_dir() {
                stack.push((entry.path(), child_rel));
            } else if meta.is_file() {
                let Identity {
                    size,
                    mtime_ns,
                    stamp,
                } = identity_of(&meta);
                // A local file's metadata always gives a local stamp.
                let Stamp::Local { ctime_ns, ino } = stamp else {
                    continue;
                };
                out.push(ListedFile {
                    path: entry.path(),
                    source_dir: Some(source_dir.to_owned()),
                    rel: child_rel,
                    size,
                    mtime_ns,
                    ctime_ns,
                    ino,
                    stamp,
                    settled: ctime_ns.saturating_add(SETTLED_MARGIN_NS) < listed_at,
                });
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Every file below the remote location `uri` (HDFS, S3: `location` is
/// its [`Location::remote`]) by Hive's rules (module docs), sorted. S3 has
/// no directories: a key's `/`-separated parts below the location stand
/// for them, and a part starting with `_` or `.` hides the key as a
/// directory of that name would.
pub fn list_remote(
    location: &Location,
    uri: &str,
    remotes: &Remotes,
) -> Result<Vec<ListedFile>, String> {
    let listed_at = now_ns();
    let found = match location {
        Location::Hdfs { .. } => crate::source_file::hdfs::list(uri)?,
        Location::S3 { .. } => crate::source_file::s3::list(&remotes.s3(), uri)?,
        Location::Local { .. } => return Err(format!("{uri} is not a remote location")),
    };
    let mut out = Vec::with_capacity(found.len());
    for (rel, identity) in found {
        if rel
            .split('/')
            .any(|c| c.is_empty() || c.starts_with('_') || c.starts_with('.'))
        {
            continue;
        }
        out.push(ListedFile::remote(uri, rel, identity, listed_at));
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// What staging one listed file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staged {
    /// Stored (copied now, or already from an earlier run).
    Stored { blob: BlobId, size: u64 },
    /// Not staged: why (changed while copied, vanished, unreadable).
    Changed(String),
}

const STAGED_LOG: &str = "staged.log";
/// Copies published (made durable) together: each group costs two
/// `syncfs`, or one fsync per fan-out directory it touches (up to 256), so
/// groups are large; each copy holds a descriptor until it is published.
const PUBLISH_GROUP: usize = 1024;
/// Threads that fdatasync copies as they are made: the syncs wait on the
/// disk, and the filesystem commits concurrent ones together.
const SYNC_THREADS: usize = 8;

/// A `staged.log` entry: the file's identity when it was copied, whether
/// it was settled then, and its blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    ino: u64,
    settled: bool,
    blob: BlobId,
}

impl Entry {
    fn matches(&self, f: &ListedFile) -> bool {
        (self.size, self.mtime_ns, self.ctime_ns, self.ino)
            == (f.size, f.mtime_ns, f.ctime_ns, f.ino)
    }
}

/// Copies listed files into the blob store; see the module docs.
pub struct FileStager {
    blobs: Arc<BlobStore>,
    /// path → its newest entry, from `staged.log`.
    known: Mutex<HashMap<PathBuf, Entry>>,
    log: Mutex<File>,
    threads: usize,
}

impl FileStager {
    /// Opens `<dir>/staged.log` (created when missing).
    pub fn open(dir: &Path, blobs: Arc<BlobStore>, threads: usize) -> Result<FileStager, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(STAGED_LOG);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let mut known = HashMap::new();
        // Only whole lines count: a torn tail was never synced.
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            if let Some((p, entry)) = parse_line(line) {
                known.insert(p, entry);
            }
        }
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        if complete < text.len() {
            log.set_len(complete as u64)
                .map_err(|e| format!("cutting {}: {e}", path.display()))?;
        }
        Ok(FileStager {
            blobs,
            known: Mutex::new(known),
            log: Mutex::new(log),
            threads: threads.max(1),
        })
    }

    /// Stages `files` (on up to `threads` threads), counting in `progress`.
    pub fn stage(&self, files: &[ListedFile], progress: &BootstrapProgress) -> Vec<Staged> {
        let mut results: Vec<Option<Staged>> = vec![None; files.len()];
        let mut to_copy = Vec::new();
        let mut to_check = Vec::new();
        {
            let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            for (i, f) in files.iter().enumerate() {
                match known.get(&f.path) {
                    Some(e) if e.matches(f) && self.blobs.contains(&e.blob) => {
                        if e.settled {
                            progress.reused(e.size);
                            results[i] = Some(Staged::Stored {
                                blob: e.blob,
                                size: e.size,
                            });
                        } else {
                            to_check.push((i, e.blob));
                        }
                    }
                    _ => to_copy.push(i),
                }
            }
        }
        // Unsettled entries: reused only if the bytes still hash to them.
        for (i, blob) in to_check {
            if reads_as(&files[i], &blob) {
                progress.reused(files[i].size);
                results[i] = Some(Staged::Stored {
                    blob,
                    size: files[i].size,
                });
            } else {
                to_copy.push(i);
            }
        }
        let next = AtomicUsize::new(0);
        type Copied = (usize, Result<(BlobId, u64, Unsynced), String>);
        // Copies go from the copy threads through the sync threads (which
        // fdatasync each, overlapping the wait with the copies still
        // running) to this thread, which publishes them in groups. Where
        // the store makes a group durable with one `syncfs`, there are no
        // sync threads: the copies go straight to this thread.
        let by_filesystem = self.blobs.group_sync() == GroupSync::Filesystem;
        let (tx, rx) = mpsc::channel::<Copied>();
        let (copied_tx, copied_rx) = mpsc::channel::<Copied>();
        let copied_rx = Mutex::new(copied_rx);
        std::thread::scope(|scope| {
            let copies_to = if by_filesystem { &tx } else { &copied_tx };
            for _ in 0..self.threads.min(to_copy.len()) {
                let copied_tx = copies_to.clone();
                let (next, to_copy) = (&next, &to_copy);
                scope.spawn(move || loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = to_copy.get(n) else { return };
                    if copied_tx.send((i, self.copy(&files[i]))).is_err() {
                        return;
                    }
                });
            }
            drop(copied_tx);
            let sync_threads = if by_filesystem { 0 } else { SYNC_THREADS };
            for _ in 0..sync_threads.min(to_copy.len()) {
                let tx = tx.clone();
                let copied_rx = &copied_rx;
                scope.spawn(move || loop {
                    let next = copied_rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok((i, result)) = next else { return };
                    let synced = result.and_then(|(blob, size, mut copy)| {
                        copy.sync_data().map(|()| (blob, size, copy)).map_err(|e| {
                            format!(
                                "{}: the copy could not be made durable: {e}",
                                files[i].path.display()
                            )
                        })
                    });
                    if tx.send((i, synced)).is_err() {
                        return;
                    }
                });
            }
            drop(tx);
            let mut group: Vec<(usize, BlobId, u64, Unsynced)> = Vec::new();
            for (i, result) in rx {
                match result {
                    Ok((blob, size, copy)) => group.push((i, blob, size, copy)),
                    Err(reason) => results[i] = Some(Staged::Changed(reason)),
                }
                if group.len() >= PUBLISH_GROUP {
                    self.publish(std::mem::take(&mut group), files, &mut results, progress);
                }
            }
            self.publish(group, files, &mut results, progress);
        });
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Staged::Changed("not staged".into())))
            .collect()
    }

    /// One file into `tmp/`, checked against its listing afterwards.
    fn copy(&self, f: &ListedFile) -> Result<(BlobId, u64, Unsynced), String> {
        let (_, name) = f.split();
        let file = FileRef {
            path: f.path.to_string_lossy().into_owned(),
            name: name.to_owned(),
            subdir: None,
            verify: Verify::None,
            key: Some(BlobId([0xbb; 32])),
            cm_path: None,
            uri: None,
            source_dir: f
                .source_dir
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned()),
            cm_dir: None,
        };
        let root = f.source_dir.as_deref().unwrap_or(Path::new(""));
        let fetched = self
            .blobs
            .fetch_unsynced(&file, root, None)
            .map_err(|e| e.to_string())?;
        let copy = fetched
            .copy
            .ok_or_else(|| format!("{}: no copy to publish", f.path.display()))?;
        // Through the descriptor copied from: the same inode as listed
        // (inode number), unchanged since (size, mtime, ctime).
        // A remote file: its identity read when the copy began.
        if fetched.size != f.size || *copy.source_after() != f.identity() {
            return Err(format!("{} changed while it was copied", f.path.display()));
        }
        Ok((fetched.blob, fetched.size, copy))
    }

    fn publish(
        &self,
        group: Vec<(usize, BlobId, u64, Unsynced)>,
        files: &[ListedFile],
        results: &mut [Option<Staged>],
        progress: &BootstrapProgress,
    ) {
        if group.is_empty() {
            return;
        }
        let mut copies = Vec::with_capacity(group.len());
        let mut done = Vec::with_capacity(group.len());
        for (i, blob, size, copy) in group {
            copies.push(copy);
            done.push((i, blob, size));
        }
        let failed: Vec<BlobId> = match self.blobs.publish(copies) {
            Ok(()) => Vec::new(),
            Err((e, failed)) => {
                tracing::warn!(error = %e, blobs = failed.len(), "cannot make staged files durable");
                failed
            }
        };
        let mut lines = String::new();
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        for (i, blob, size) in done {
            if failed.contains(&blob) {
                results[i] = Some(Staged::Changed(format!(
                    "{}: the copy could not be made durable",
                    files[i].path.display()
                )));
                continue;
            }
            let f = &files[i];
            progress.copied(size);
            results[i] = Some(Staged::Stored { blob, size });
            let shown = f.path.to_string_lossy();
            if !shown.contains('\n') {
                let entry = Entry {
                    size,
                    mtime_ns: f.mtime_ns,
                    ctime_ns: f.ctime_ns,
                    ino: f.ino,
                    settled: f.settled,
                    blob,
                };
                lines.push_str(&format!(
                    "{blob} {size} {} {} {} {} {shown}\n",
                    entry.mtime_ns,
                    entry.ctime_ns,
                    entry.ino,
                    u8::from(entry.settled)
                ));
                known.insert(f.path.clone(), entry);
            }
        }
        drop(known);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        // Losing this only costs copying again after a crash.
        if let Err(e) = log
            .write_all(lines.as_bytes())
            .and_then(|()| log.sync_data())
        {
            tracing::warn!(error = %e, "cannot record staged files; a restart copies them again");
        }
    }
}

/// Whether `f`'s bytes, read now beneath its source directory, hash to
/// `blob`, and the file is still the one listed (same identity after the
/// read).
fn reads_as(f: &ListedFile, blob: &BlobId) -> bool {
    use sha2::{Digest, Sha256};
    // A remote file is copied again rather than read twice.
    let Some(source_dir) = &f.source_dir else {
        return false;
    };
    let Ok(rel) = f.path.strip_prefix(source_dir) else {
        return false;
    };
    let Ok(file) = Location::local(source_dir, rel).open() else {
        return false;
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut len = 0u64;
    loop {
        match file.read_at(&mut buf, len) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let same = file.identity_now().is_ok_and(|now| now == f.identity());
    same && len == f.size && BlobId(h.finalize().into()) == *blob
}

/// One `staged.log` line (see the module docs); None for a torn or
/// older-format line, which is not trusted.
fn parse_line(line: &[u8]) -> Option<(PathBuf, Entry)> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.splitn(7, ' ');
    let blob = BlobId::from_hex(parts.next()?)?;
    let size = parts.next()?.parse().ok()?;
    let mtime_ns = parts.next()?.parse().ok()?;
    let ctime_ns = parts.next()?.parse().ok()?;
    let ino = parts.next()?.parse().ok()?;
    let settled = match parts.next()? {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    let path = PathBuf::from(parts.next()?);
    let entry = Entry {
        size,
        mtime_ns,
        ctime_ns,
        ino,
        settled,
        blob,
    };
    Some((path, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_skips_hidden_and_underscore_names_at_every_level() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("delta_1_1/.tmp")).unwrap();
        std::fs::create_dir_all(d.join("_staging")).unwrap();
        for f in [
            "000000_0",
            "_SUCCESS",
            ".000000_0.crc",
            "delta_1_1/bucket_0",
            "delta_1_1/_flush",
            "delta_1_1/.tmp/x",
            "_staging/y",
        ] {
            std::fs::write(d.join(f), f).unwrap();
        }
        let got: Vec<String> = list_location(d, d)
            .unwrap()
            .into_iter()
            .map(|f| f.rel)
            .collect();
        assert_eq!(got, vec!["000000_0", "delta_1_1/bucket_0"]);
        assert!(list_location(d, &d.join("absent")).unwrap().is_empty());
    }

    #[test]
    fn a_second_stager_on_the_same_state_copies_nothing_again() {
        let state = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(src.path().join(format!("f{i}")), format!("content {i}")).unwrap();
        }
        std::fs::write(src.path().join("same"), "content 0").unwrap();
        let blobs = Arc::new(BlobStore::open(state.path()).unwrap());
        let files = list_location(src.path(), src.path()).unwrap();
        let progress = BootstrapProgress::default();
        let stager =
            FileStager::open(&state.path().join("bootstrap"), Arc::clone(&blobs), 3).unwrap();
        let first = stager.stage(&files, &progress);
        assert!(first.iter().all(|r| matches!(r, Staged::Stored { .. })));
        assert_eq!(progress.report().files_copied, 6);
        drop(stager);
        let again = BootstrapProgress::default();
        let stager = FileStager::open(&state.path().join("bootstrap"), blobs, 3).unwrap();
        assert_eq!(stager.stage(&files, &again), first);
        let r = again.report();
        assert_eq!((r.files_copied, r.files_reused), (0, 6));
    }

    #[test]
    fn a_same_size_rewrite_that_keeps_the_mtime_is_copied_again() {
        // In place (same inode), same size, the mtime put back as `cp -p`
        // or `rsync -t` would: only the ctime tells the rewrite apart.
        let state = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        let path = src.path().join("000000_0");
        std::fs::write(&path, "old bytes").unwrap();
        let blobs = Arc::new(BlobStore::open(state.path()).unwrap());
        let first = list_location(src.path(), src.path()).unwrap();
        let stager =
            FileStager::open(&state.path().join("bootstrap"), Arc::clone(&blobs), 1).unwrap();
        let old = stager.stage(&first, &BootstrapProgress::default());
        drop(stager);
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, "new bytes").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let again = list_location(src.path(), src.path()).unwrap();
        assert_eq!(
            (again[0].size, again[0].mtime_ns, again[0].ino),
            (first[0].size, first[0].mtime_ns, first[0].ino),
            "size, mtime and inode alone cannot tell"
        );
        let progress = BootstrapProgress::default();
        let stager = FileStager::open(&state.path().join("bootstrap"), blobs, 1).unwrap();
        let new = stager.stage(&again, &progress);
        assert_ne!(new, old);
        let r = progress.report();
        assert_eq!((r.files_copied, r.files_reused), (1, 0));
    }

    #[test]
    fn an_unsettled_entry_is_reused_only_if_its_bytes_still_match() {
        let state = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        let blobs = Arc::new(BlobStore::open(state.path()).unwrap());
        // Written just before listing, so unsettled, unless this thread was
        // starved for the whole margin in between: then write it again.
        let files = (0..20)
            .map(|_| {
                std::fs::write(src.path().join("a"), "bytes of a").unwrap();
                list_location(src.path(), src.path()).unwrap()
            })
            .find(|files| !files[0].settled)
            .expect("a file listed right after it was written is unsettled");
        let stager =
            FileStager::open(&state.path().join("bootstrap"), Arc::clone(&blobs), 1).unwrap();
        let first = stager.stage(&files, &BootstrapProgress::default());
        drop(stager);
        // The log claims other content for the same identity (as a rewrite
        // within one coarse timestamp tick on a reused inode would look).
        let log = state.path().join("bootstrap").join(STAGED_LOG);
        let text = std::fs::read_to_string(&log).unwrap();
        let Staged::Stored { blob, .. } = &first[0] else {
            panic!("{first:?}")
        };
        // A second blob to point the entry at.
        std::fs::write(src.path().join("b"), "bytes of b").unwrap();
        let b = list_location(src.path(), src.path()).unwrap();
        let stager =
            FileStager::open(&state.path().join("bootstrap"), Arc::clone(&blobs), 1).unwrap();
        let staged_b = stager.stage(&b[1..], &BootstrapProgress::default());
        drop(stager);
        let Staged::Stored { blob: blob_b, .. } = &staged_b[0] else {
            panic!("{staged_b:?}")
        };
        std::fs::write(&log, text.replace(&blob.to_hex(), &blob_b.to_hex())).unwrap();
        let progress = BootstrapProgress::default();
        let stager = FileStager::open(&state.path().join("bootstrap"), blobs, 1).unwrap();
        assert_eq!(stager.stage(&files, &progress), first, "read again, copied");
        let r = progress.report();
        assert_eq!((r.files_copied, r.files_reused), (1, 0));
    }

    #[test]
    fn an_older_five_field_line_is_not_trusted() {
        let blob = BlobId([7; 32]);
        assert!(parse_line(format!("{blob} 3 100 12 /wh/t/000000_0").as_bytes()).is_none());
        let (path, e) = parse_line(format!("{blob} 3 100 200 12 1 /wh/t/a b").as_bytes()).unwrap();
        assert_eq!(path, PathBuf::from("/wh/t/a b"));
        assert_eq!(
            (e.size, e.mtime_ns, e.ctime_ns, e.ino, e.settled),
            (3, 100, 200, 12, true)
        );
    }

    #[test]
    fn a_vanished_file_is_reported_not_staged() {
        let state = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("a"), "a").unwrap();
        let files = list_location(src.path(), src.path()).unwrap();
        std::fs::remove_file(src.path().join("a")).unwrap();
        let blobs = Arc::new(BlobStore::open(state.path()).unwrap());
        let stager = FileStager::open(&state.path().join("bootstrap"), blobs, 1).unwrap();
        let got = stager.stage(&files, &BootstrapProgress::default());
        assert!(matches!(&got[0], Staged::Changed(_)), "{got:?}");
    }
}
