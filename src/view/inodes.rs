//! The inode table: which inode number denotes what, and the kernel's
//! lookup counts.
//!
//! Three kinds of inode numbers (SPEC §4, DESIGN "Inodes"):
//! - fixed: [`ROOT`], [`STAGEFS_DIR`], [`STATUS_FILE`], [`SNAPSHOTS_DIR`];
//! - synthetic, below `tree::FIRST_NODE_ID`: one per live database name and
//!   one per snapshot id, allocated on first use and stable for the mount's
//!   lifetime ([`Synthetic`]), so a name never changes its number;
//! - catalog nodes: the [`NodeId`] itself, so an inode always denotes the
//!   same immutable content;
//! - rendered copies of the status file (no-open mode), from
//!   [`FIRST_RENDERED`] up: one per lookup, never reused.
//!
//! [`NodeTable`] holds what the kernel has looked up and not yet forgotten:
//! the node (so an old version stays reachable while the kernel references
//! it) and its lookup count. When the count drops to zero the entry goes,
//! and with it the last reference to an old version's nodes. It is sharded
//! so concurrent lookups in different directories rarely contend.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::catalog::{Name, Node, Tree};
use crate::event::StateId;

pub const ROOT: u64 = 1;
pub const STAGEFS_DIR: u64 = 2;
pub const STATUS_FILE: u64 = 3;
pub const SNAPSHOTS_DIR: u64 = 4;
/// First synthetic inode; everything between the fixed inodes and this is
/// unused, leaving room for more fixed entries.
const FIRST_SYNTHETIC: u64 = 16;
/// First inode of a rendered status copy: far above catalog node ids
/// (`tree::FIRST_NODE_ID` counts up from 2^32).
pub const FIRST_RENDERED: u64 = 1 << 62;

/// What a synthetic inode stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SynthKey {
    /// `MOUNT/<db>`: a dynamic directory resolved at each access.
    LiveDb(Name),
    /// `MOUNT/.stagefs/snapshots/<id>`.
    SnapshotRoot(StateId),
}

/// Allocates synthetic inode numbers; never forgets one, so a live
/// database keeps its inode across drops and re-creations.
#[derive(Default)]
pub struct Synthetic {
    inner: RwLock<SynthMaps>,
}

#[derive(Default)]
struct SynthMaps {
    by_key: HashMap<SynthKey, u64>,
    by_ino: HashMap<u64, SynthKey>,
}

impl Synthetic {
    pub fn ino(&self, key: &SynthKey) -> u64 {
        if let Some(&ino) = read(&self.inner).by_key.get(key) {
            return ino;
        }
        let mut maps = write(&self.inner);
        if let Some(&ino) = maps.by_key.get(key) {
            return ino;
        }
        let ino = FIRST_SYNTHETIC + maps.by_ino.len() as u64;
        maps.by_key.insert(key.clone(), ino);
        maps.by_ino.insert(ino, key.clone());
        ino
    }

    pub fn key(&self, ino: u64) -> Option<SynthKey> {
        read(&self.inner).by_ino.get(&ino).cloned()
    }
}

/// What a looked-up inode holds on to.
#[derive(Debug, Clone)]
pub enum Held {
    Node(Node),
    /// A snapshot root keeps its whole tree alive while referenced, even if
    /// retention drops the version meanwhile.
    SnapshotRoot(Arc<Tree>),
    /// A status copy rendered at lookup: its bytes never change.
    Rendered(Arc<[u8]>),
}

/// How a table directory was reached through `MOUNT/<db>/<table>`.
#[derive(Debug, Clone)]
pub struct LiveName {
    pub db: Name,
    pub table: Name,
    /// The tree its last live lookup resolved in: its snapshot path is
    /// `.stagefs/snapshots/<state>/<db>/<table>`, answerable from this
    /// tree even after retention dropped the version.
    pub tree: Arc<Tree>,
    /// The adapter moved its dentry to that snapshot path (a working
    /// directory outlived the live name); reset by the next live lookup.
    pub spliced: bool,
    /// The adapter's last attempt to move it there failed: a view move
    /// no longer waits for it ([`crate::view::View::splice_failed`]).
    pub splice_failed: bool,
}

#[derive(Debug, Clone)]
pub struct InodeEntry {
    pub held: Held,
    /// For a table directory reached through `MOUNT/<db>/<table>`: its
    /// name (what a `user.stagefs.pin` on it applies to) and version.
    pub live: Option<LiveName>,
    /// A file's blob, opened at its first read without a handle (no-open
    /// mode) and kept until the kernel forgets the inode.
    pub blob: Option<Arc<File>>,
    /// The newest state it was reached in (a node may be shared by several
    /// versions): what a directory handle on it holds (`None` for what
    /// belongs to no version, like a rendered status copy).
    pub state: Option<StateId>,
    lookups: u64,
}

const SHARDS: usize = 16;

pub struct NodeTable {
    shards: Box<[Mutex<HashMap<u64, InodeEntry>>]>,
}

impl Default for NodeTable {
    fn default() -> Self {
        NodeTable {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl NodeTable {
    fn shard(&self, ino: u64) -> MutexGuard<'_, HashMap<u64, InodeEntry>> {
        // A poisoned shard only means a panic elsewhere while holding it;
        // every update below is a single map operation, so it is consistent.
        self.shards[(ino as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Records one kernel lookup of `ino`, reached in `state`. A later live
    /// lookup of a table refreshes its name (a renamed table keeps its
    /// node) and version; a lookup in a newer state moves `state` forward.
    /// True when a live lookup found the directory moved to its snapshot
    /// path (the kernel now moves it back to the live name).
    pub fn looked_up(
        &self,
        ino: u64,
        held: Held,
        live: Option<LiveName>,
        state: Option<StateId>,
    ) -> bool {
        let mut shard = self.shard(ino);
        let entry = shard.entry(ino).or_insert_with(|| InodeEntry {
            held,
            live: None,
            blob: None,
            state: None,
            lookups: 0,
        });
        entry.lookups += 1;
        let mut was_spliced = false;
        if live.is_some() {
            was_spliced = entry.live.as_ref().is_some_and(|l| l.spliced);
            entry.live = live;
        }
        entry.state = entry.state.max(state);
        was_spliced
    }

    /// Whether `ino`'s dentry sits at its snapshot path for a working
    /// directory (true) or no longer needs to (false).
    pub fn set_spliced_to(&self, ino: u64, spliced: bool) {
        if let Some(live) = self.shard(ino).get_mut(&ino).and_then(|e| e.live.as_mut()) {
            live.spliced = spliced;
            live.splice_failed = false;
        }
    }

    /// The adapter could not move `ino`'s dentry to its snapshot path.
    pub fn set_splice_failed(&self, ino: u64) {
        if let Some(live) = self.shard(ino).get_mut(&ino).and_then(|e| e.live.as_mut()) {
            live.splice_failed = true;
        }
    }

    pub fn get(&self, ino: u64) -> Option<InodeEntry> {
        self.shard(ino).get(&ino).cloned()
    }

    /// Keeps `file` as the blob descriptor of `ino` unless one is kept
    /// already; returns the one kept (or `file` if `ino` is not referenced).
    pub fn keep_blob(&self, ino: u64, file: Arc<File>) -> Arc<File> {
        match self.shard(ino).get_mut(&ino) {
            Some(entry) => Arc::clone(entry.blob.get_or_insert(file)),
            None => file,
        }
    }

    /// The kernel dropped `n` references; frees the entry at zero.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut shard = self.shard(ino);
        if let Some(entry) = shard.get_mut(&ino) {
            entry.lookups = entry.lookups.saturating_sub(n);
            if entry.lookups == 0 {
                shard.remove(&ino);
            }
        }
    }

    /// Calls `f` on every entry the kernel references (GC roots, stale
    /// entry scans). Shards are visited one at a time.
    pub fn for_each(&self, mut f: impl FnMut(u64, &InodeEntry)) {
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (ino, entry) in shard.iter() {
                f(*ino, entry);
            }
        }
    }

    /// Number of inodes currently referenced by the kernel (tests, metrics).
    pub fn len(&self) -> usize {
        (0..SHARDS)
            .map(|i| {
                self.shards[i]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .len()
            })
            .sum()
    }

    pub fn lookups(&self, ino: u64) -> u64 {
        self.shard(ino).get(&ino).map_or(0, |e| e.lookups)
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}
