//! Open file and directory handles.
//!
//! A handle owns what it was opened on: a directory handle the listing (an
//! immutable node, or the names of a dynamic directory captured at
//! `opendir`), a file handle the blob's open descriptor, the status file
//! its rendered bytes. So an open handle keeps its version no matter what
//! the catalog does meanwhile (SPEC §3.4, §3.5).
//!
//! Directory offsets: `1` follows `.`, `2` follows `..`, child `i` (in name
//! order) has offset `3 + i`. For immutable directories the handle also
//! remembers the last entry it returned, so the usual sequential resume is
//! an `OrdMap::range` from that name — O(log n) even for a partition with a
//! million files; only a `seekdir` elsewhere costs a scan.
//!
//! A directory handle that a user other than the mounting user and root
//! opened on an immutable directory carries a [`Hold`]: the uid and the
//! state it was reached in, so the view can bound what such users keep
//! from garbage collection (`View::held_dirs`). A released hold is no GC
//! root any more and its handle answers `ESTALE`; release is final.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::catalog::{DirNode, Name, Node};
use crate::event::StateId;

/// The kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    RegularFile,
}

impl FileKind {
    pub fn of(node: &Node) -> FileKind {
        match node {
            Node::Dir(_) => FileKind::Directory,
            Node::File(_) => FileKind::RegularFile,
        }
    }
}

/// One `readdir` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// The offset of the *next* entry (what the kernel passes back).
    pub offset: u64,
    pub kind: FileKind,
    pub name: Name,
}

pub enum Listing {
    /// A dynamic directory's entries, captured at `opendir` (including `.`
    /// and `..`).
    Fixed(Vec<DirEntry>),
    /// An immutable directory.
    Tree {
        dir: Arc<DirNode>,
        ino: u64,
        parent: u64,
    },
}

/// What a directory handle of a user other than the mounting user and
/// root holds: its version, counted against that user's limit.
#[derive(Debug)]
pub struct Hold {
    pub uid: u32,
    pub state: StateId,
    released: AtomicBool,
}

impl Hold {
    pub fn new(uid: u32, state: StateId) -> Hold {
        Hold {
            uid,
            state,
            released: AtomicBool::new(false),
        }
    }

    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }

    /// Stops holding: no GC root from now on. True if it was held.
    pub fn release(&self) -> bool {
        !self.released.swap(true, Ordering::Relaxed)
    }
}

pub struct DirHandle {
    listing: Listing,
    /// Offset and name of the last child returned, for O(log n) resume.
    cursor: Mutex<Option<(u64, Name)>>,
    hold: Option<Hold>,
}

const FIRST_CHILD_OFFSET: u64 = 3;

impl DirHandle {
    pub fn new(listing: Listing, hold: Option<Hold>) -> DirHandle {
        DirHandle {
            listing,
            cursor: Mutex::new(None),
            hold,
        }
    }

    /// Whether its hold was released (its listing may name deleted blobs).
    pub fn is_released(&self) -> bool {
        self.hold.as_ref().is_some_and(Hold::is_released)
    }

    /// Feeds entries after `offset` to `add` until it reports the reply
    /// buffer full (returns `true`; that entry was not taken).
    pub fn read(&self, offset: u64, add: &mut dyn FnMut(DirEntry) -> bool) {
        self.read_nodes(offset, &mut |e, _| add(e));
    }

    /// [`DirHandle::read`], also handing over each child's node when the
    /// listing is an immutable directory (`None` for `.`, `..` and the
    /// entries of a dynamic directory), so `readdirplus` need not look the
    /// name up again.
    pub fn read_nodes(&self, offset: u64, add: &mut dyn FnMut(DirEntry, Option<&Node>) -> bool) {
        match &self.listing {
            Listing::Fixed(entries) => {
                for e in entries.iter().skip(offset as usize) {
                    if add(e.clone(), None) {
                        break;
                    }
                }
            }
            Listing::Tree { dir, ino, parent } => {
                let dots = [(".", *ino), ("..", *parent)];
                for (i, (name, ino)) in dots.iter().enumerate().skip(offset as usize) {
                    let e = DirEntry {
                        ino: *ino,
                        offset: i as u64 + 1,
                        kind: FileKind::Directory,
                        name: Name::from(*name),
                    };
                    if add(e, None) {
                        return;
                    }
                }
                let start = offset.max(FIRST_CHILD_OFFSET - 1);
                let mut cursor = lock(&self.cursor);
                let resume = cursor
                    .as_ref()
                    .filter(|(off, _)| *off == start)
                    .map(|(_, name)| Name::clone(name));
                let iter: Box<dyn Iterator<Item = (&Name, &Node)>> = match resume {
                    Some(name) => Box::new(
                        dir.children
                            .range::<_, Name>((Bound::Excluded(name), Bound::Unbounded)),
                    ),
                    None => Box::new(
                        dir.children
                            .iter()
                            .skip((start + 1 - FIRST_CHILD_OFFSET) as usize),
                    ),
                };
                for (next, (name, child)) in (start + 1..).zip(iter) {
                    let e = DirEntry {
                        ino: child.id().0,
                        offset: next,
                        kind: FileKind::of(child),
                        name: Name::clone(name),
                    };
                    if add(e, Some(child)) {
                        break;
                    }
                    *cursor = Some((next, Name::clone(name)));
                }
            }
        }
    }

    /// Whether the listing can never change (the kernel may cache it).
    pub fn is_immutable(&self) -> bool {
        matches!(self.listing, Listing::Tree { .. })
    }
}

pub enum Handle {
    Dir(DirHandle),
    /// A staged file of `size` bytes, opened read-only.
    Blob {
        ino: u64,
        file: Arc<File>,
        size: u64,
    },
    /// Generated content (status), rendered once at open.
    Generated(Arc<[u8]>),
    /// A reader host's file whose bytes are fetched as they are read.
    Fetched(Arc<dyn super::FetchedFile>),
}

const SHARDS: usize = 8;

type HandleMap = HashMap<u64, Arc<Handle>>;

pub struct Handles {
    next: AtomicU64,
    shards: Box<[Mutex<HandleMap>]>,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            next: AtomicU64::new(1),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl Handles {
    fn shard(&self, fh: u64) -> MutexGuard<'_, HandleMap> {
        lock(&self.shards[(fh as usize) % SHARDS])
    }

    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh).insert(fh, Arc::new(handle));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shard(fh).get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shard(fh).remove(&fh)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Calls `f` on each immutable directory open handles list, with the
    /// handle's hold (if another user's). Shards are visited one at a time.
    pub fn for_each_open_dir(&self, mut f: impl FnMut(&Arc<DirNode>, Option<&Hold>)) {
        for shard in self.shards.iter() {
            for handle in lock(shard).values() {
                if let Handle::Dir(DirHandle {
                    listing: Listing::Tree { dir, .. },
                    hold,
                    ..
                }) = &**handle
                {
                    f(dir, hold.as_ref());
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Handle state is updated by single assignments; a panic elsewhere
    // cannot leave it half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
