//! Resolutions: the content of files that are not known by content when
//! their event is accepted (Hive files carry an HDFS checksum or nothing,
//! never a sha256 and size).
//!
//! Such a file enters the catalog under its reference key
//! ([`crate::event::FileRef::key`]) with an empty [`Resolution`] cell. When
//! the stager has read it, [`Resolutions::resolve`] fills every cell of that
//! key (trees built by ingest, by the stager and by journal replay each have
//! their own nodes for it) and remembers the answer; [`Resolutions::flush`]
//! appends what is new to `<state>/resolved.log` and fsyncs it. The stager
//! flushes after the blobs are durable and before the commit record that
//! makes a state visible, so after a crash every file of a committed state
//! resolves again from this log, and replay rebuilds identical trees.
//!
//! The log is one line per key, `<key hex> <sha256 hex> <size> <verified>`;
//! a torn last line (a crash mid-append) is ignored: nothing committed
//! depended on it. It grows with every Hive file ever staged (about 140
//! bytes each) and is read whole at start.
//!
//! Shared by ingest, the stager and recovery behind one mutex; the stager is
//! the only writer of the file.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::tree::{AddedFile, Resolution};
use super::CatalogError;
use crate::event::BlobId;

const LOG_FILE: &str = "resolved.log";

/// The content learnt for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Resolved {
    blob: BlobId,
    size: u64,
    unverified: bool,
}

#[derive(Default)]
struct Inner {
    known: HashMap<BlobId, Resolved>,
    /// Resolved since the last flush, in order.
    unflushed: Vec<BlobId>,
    /// Cells of keys not resolved yet.
    waiting: HashMap<BlobId, Vec<Weak<Resolution>>>,
}

/// See the module docs.
pub struct Resolutions {
    inner: Mutex<Inner>,
    path: PathBuf,
    file: Mutex<Option<File>>,
    unverified: AtomicU64,
}

impl Resolutions {
    /// Loads `<state_dir>/resolved.log` (absent: nothing resolved yet).
    pub fn open(state_dir: &Path) -> Result<Resolutions, CatalogError> {
        let path = state_dir.join(LOG_FILE);
        let text = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(CatalogError::Load {
                    path,
                    detail: e.to_string(),
                })
            }
        };
        let mut inner = Inner::default();
        let mut unverified = 0;
        // Only newline-terminated lines count; the tail after the last
        // newline was never fsynced before a commit.
        let complete_len = text
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |end| end + 1);
        if complete_len < text.len() {
            // Cut the torn tail so the next append starts a fresh line.
            let cut = OpenOptions::new().write(true).open(&path).and_then(|f| {
                f.set_len(complete_len as u64)?;
                f.sync_data()
            });
            cut.map_err(|source| CatalogError::Persist {
                path: path.clone(),
                source,
            })?;
        }
        let complete = &text[..complete_len.saturating_sub(1)];
        for (n, line) in complete
            .split(|&b| b == b'\n')
            .enumerate()
            .filter(|_| complete_len > 0)
        {
            let (key, r) = parse_line(line).ok_or_else(|| CatalogError::Load {
                path: path.clone(),
                detail: format!("line {} is not `<key> <sha256> <size> <verified>`", n + 1),
            })?;
            if inner.known.insert(key, r).is_none() && r.unverified {
                unverified += 1;
            }
        }
        Ok(Resolutions {
            inner: Mutex::new(inner),
            path,
            file: Mutex::new(None),
            unverified: AtomicU64::new(unverified),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fills the cells of `added` whose key is resolved; the others are
    /// filled by [`Resolutions::resolve`] later. Call for every tree built.
    pub fn attach(&self, added: &[AddedFile]) {
        if added.iter().all(|f| f.resolution.is_none()) {
            return;
        }
        let mut inner = self.lock();
        for f in added {
            let Some(cell) = &f.resolution else { continue };
            match inner.known.get(&cell.key) {
                Some(r) => {
                    cell.set(r.blob, r.size);
                }
                None => inner
                    .waiting
                    .entry(cell.key)
                    .or_default()
                    .push(Arc::downgrade(cell)),
            }
        }
    }

    /// The stager read the file of `key`: its content is `blob`, `size`
    /// bytes. Fills every cell of the key. `Err` when the key was resolved
    /// before to different content (a file without checksum that changed
    /// between two reads): the first answer stands.
    pub fn resolve(
        &self,
        key: BlobId,
        blob: BlobId,
        size: u64,
        unverified: bool,
    ) -> Result<(), String> {
        let mut inner = self.lock();
        if let Some(r) = inner.known.get(&key) {
            return if (r.blob, r.size) == (blob, size) {
                Ok(())
            } else {
                Err(format!(
                    "its content changed since it was first staged ({} bytes, sha256 {}; now {size} bytes, sha256 {blob})",
                    r.size, r.blob
                ))
            };
        }
        inner.known.insert(
            key,
            Resolved {
                blob,
                size,
                unverified,
            },
        );
        inner.unflushed.push(key);
        if unverified {
            self.unverified.fetch_add(1, Ordering::Relaxed);
        }
        for cell in inner.waiting.remove(&key).unwrap_or_default() {
            if let Some(cell) = cell.upgrade() {
                cell.set(blob, size);
            }
        }
        Ok(())
    }

    /// Makes every resolution so far durable (append + fsync). The stager
    /// calls it before each commit record.
    pub fn flush(&self) -> Result<(), CatalogError> {
        let (keys, lines) = {
            let inner = self.lock();
            if inner.unflushed.is_empty() {
                return Ok(());
            }
            let mut lines = String::new();
            for key in &inner.unflushed {
                if let Some(r) = inner.known.get(key) {
                    let verified = if r.unverified { "none" } else { "checked" };
                    lines.push_str(&format!("{key} {} {} {verified}\n", r.blob, r.size));
                }
            }
            (inner.unflushed.len(), lines)
        };
        let persist = |source: std::io::Error| CatalogError::Persist {
            path: self.path.clone(),
            source,
        };
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(persist)?;
            // The file's own entry must survive a crash too.
            if let Some(dir) = self.path.parent() {
                crate::durable::fsync_dir(dir).map_err(persist)?;
            }
            *file = Some(f);
        }
        if let Some(f) = file.as_mut() {
            f.write_all(lines.as_bytes()).map_err(persist)?;
            f.sync_data().map_err(persist)?;
        }
        // Only the keys written leave the list; later ones stay for the next flush.
        self.lock().unflushed.drain(..keys);
        Ok(())
    }

    /// Files staged without any checksum to verify them with.
    pub fn unverified_files(&self) -> u64 {
        self.unverified.load(Ordering::Relaxed)
    }
}

fn parse_line(line: &[u8]) -> Option<(BlobId, Resolved)> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.split(' ');
    let key = BlobId::from_hex(parts.next()?)?;
    let blob = BlobId::from_hex(parts.next()?)?;
    let size = parts.next()?.parse().ok()?;
    let unverified = match parts.next()? {
        "none" => true,
        "checked" => false,
        _ => return None,
    };
    parts.next().is_none().then_some((
        key,
        Resolved {
            blob,
            size,
            unverified,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Tree;
    use crate::event::{Change, Event, FileRef, Op, StateId, Verify};

    fn hive_event(id: u64, key: u8) -> Event {
        let mut file = FileRef::native("x", "f", 0, BlobId([0; 32]));
        file.verify = Verify::None;
        file.key = Some(BlobId([key; 32]));
        file.path = "/src/f".into();
        let mut add = Change::new(Op::AddFiles, "d", "t");
        add.files = vec![file];
        Event {
            id: StateId(id),
            time_ms: None,
            changes: vec![
                Change::new(Op::CreateDatabase, "d", ""),
                Change::new(Op::CreateTable, "d", "t"),
                add,
            ],
        }
    }

    #[test]
    fn resolved_content_survives_a_restart_and_fills_new_trees() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, added) = Tree::empty().apply(&hive_event(1, 7)).unwrap();
        let r = Resolutions::open(dir.path()).unwrap();
        r.attach(&added);
        let file = || match tree.lookup(&["d".into(), "t".into()], "f") {
            Some(crate::catalog::Node::File(f)) => Arc::clone(f),
            _ => panic!("no file"),
        };
        assert!(!file().is_resolved());
        r.resolve(BlobId([7; 32]), BlobId([9; 32]), 5, true)
            .unwrap();
        assert_eq!((file().blob(), file().size()), (BlobId([9; 32]), 5));
        r.flush().unwrap();
        // A torn tail from a crash mid-append is ignored.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(LOG_FILE))
            .unwrap();
        f.write_all(b"0123").unwrap();

        let again = Resolutions::open(dir.path()).unwrap();
        assert_eq!(again.unverified_files(), 1);
        let (tree2, added2) = Tree::empty().apply(&hive_event(1, 7)).unwrap();
        again.attach(&added2);
        assert_eq!(tree2.root.files_below(), tree.root.files_below());
        assert!(again
            .resolve(BlobId([7; 32]), BlobId([8; 32]), 5, true)
            .is_err());
    }
}
