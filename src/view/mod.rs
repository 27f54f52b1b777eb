//! The filesystem without the kernel: every semantic of the mount (SPEC §3–5)
//! lives here as plain Rust, testable without FUSE.
//!
//! Owns the inode scheme, directory and file handles and the xattr rules.
//! The fuse adapter (`crate::fuse`) calls one `View` method per request and
//! only translates types; the daemon builds the `View` from the catalog.
//!
//! Invariants:
//! - An inode ≥ `tree::FIRST_NODE_ID` is a catalog node and always denotes
//!   the same content, so its entries and attributes get long TTLs.
//! - Names whose target can change (children of the root and of live
//!   database directories — where commits, pins and readers' views act)
//!   get entry TTL 0 and are resolved at every lookup in the state the
//!   caller's reader sees ([`readers`]: its session's state, else its
//!   view, with pins on top), so every walk of one reader resolves in one
//!   whole-mount state; a walk resolves each table once, so it never
//!   mixes versions inside a table.
//! - A table directory that the kernel still references after its live
//!   name moved on (a working directory) is moved by the adapter to its
//!   snapshot path ([`View::dentry_plan`]), so `getcwd()` keeps answering a
//!   real path; such directories are GC roots ([`View::held_dirs`]).
//! - Handles own what they were opened on (see `handles`).
//! - Nothing here writes except pins, which go through `Catalog::set_pin`.

mod blob_files;
mod driver_wait;
mod handles;
mod inodes;
pub mod readers;
mod xattr;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::catalog::tree::UNKNOWN_TIME;
use crate::catalog::{Catalog, DirKind, DirNode, Name, Node, PinError, Snapshot, Tree};
use crate::event::{BlobId, StateId};

pub use handles::{DirEntry, FileKind};
use handles::{DirHandle, Handle, Handles, Hold, Listing};
use inodes::{Held, LiveName, NodeTable, SynthKey, Synthetic, FIRST_RENDERED};
pub use inodes::{ROOT, SNAPSHOTS_DIR, STAGEFS_DIR, STATUS_FILE};
use readers::{Reader, Readers};
pub use xattr::{CONNECTION as CONNECTION_XATTR, WARM as WARM_XATTR};

/// Who sent a request: the pid FUSE passes (a thread id; 0 when the
/// kernel could not name the caller in the daemon's pid namespace) and the
/// caller's uid (what its directory handles count against, see
/// [`HOLD_LIMIT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
}

impl Caller {
    /// A request with no attributable caller (unit tests, kernel-internal):
    /// root, so nothing it holds is limited.
    pub const UNKNOWN: Caller = Caller { pid: 0, uid: 0 };
}

/// Old versions (neither retained nor pinned) that the directory handles
/// of one user other than the mounting user and root may keep from
/// garbage collection. Past it, that user's handles on its oldest such
/// versions are released: GC no longer keeps their blobs and `readdir` on
/// them answers `ESTALE` (docs/SEMANTICS.md "Bounds").
pub const HOLD_LIMIT: usize = 8;

/// What the fuse adapter's invalidation thread should do about one table
/// directory the kernel references (see [`View::dentry_plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DentryAction {
    /// Drop the cached entry `name` under directory inode `parent` (an
    /// unused dentry goes and its old version is forgotten; one in use
    /// stays usable).
    Invalidate { parent: u64, name: Name },
    /// Look this path up from the daemon: the kernel moves the table's
    /// directory entry there (one dentry per directory inode), so a
    /// working directory inside it keeps a real path.
    Splice { ino: u64, path: PathBuf },
}

/// What the view needs from the daemon for `.stagefs/status` and the
/// root's `user.stagefs.latest`.
pub trait StatusSource: Send + Sync {
    /// The status JSON object (SPEC §7), rendered fresh.
    fn status_json(&self) -> String;
    /// The newest state-id read from the source log.
    fn latest(&self) -> StateId;
}

#[derive(Debug, Clone)]
pub struct ViewConfig {
    pub uid: u32,
    pub gid: u32,
    /// Used as mtime where the source gave no time.
    pub mount_time: SystemTime,
}

/// How long a request of a job whose state is newer than the visible one
/// waits for it (a reader host a poll behind the job's).
const JOB_STATE_WAIT: Duration = Duration::from_secs(3);

/// Why an operation failed; [`ViewError::errno`] is the answer to the kernel.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("no such file or directory")]
    NotFound,
    #[error("inode {0} is not known (already forgotten)")]
    StaleInode(u64),
    #[error("state {0}, named by the process's STAGEFS_STATE_ID, is not served here")]
    JobStateGone(StateId),
    #[error("file handle {0} is not open")]
    BadHandle(u64),
    #[error(
        "directory handle {0} was released: its user held more than {HOLD_LIMIT} old versions"
    )]
    Released(u64),
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("the mount is read-only")]
    ReadOnly,
    #[error("no such attribute")]
    NoAttr,
    #[error("the calling process cannot be named (pid 0 or another pid namespace)")]
    Unattributed,
    #[error("the calling process leads no session of this mount")]
    NotInSession,
    #[error("attribute `{0}` cannot be changed here")]
    XattrNotSupported(String),
    #[error("pin: {0}")]
    Pin(#[from] PinError),
    #[error("opening staged file {path}: {source}")]
    OpenBlob {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading staged file {path}: {source}")]
    ReadBlob {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ViewError {
    pub fn errno(&self) -> i32 {
        match self {
            ViewError::NotFound => libc::ENOENT,
            ViewError::StaleInode(_) | ViewError::Released(_) | ViewError::JobStateGone(_) => {
                libc::ESTALE
            }
            ViewError::BadHandle(_) => libc::EBADF,
            ViewError::NotDir => libc::ENOTDIR,
            ViewError::IsDir => libc::EISDIR,
            ViewError::ReadOnly => libc::EROFS,
            ViewError::NoAttr => libc::ENODATA,
            ViewError::Unattributed => libc::EPERM,
            ViewError::NotInSession => libc::EINVAL,
            ViewError::XattrNotSupported(_) => libc::ENOTSUP,
            ViewError::Pin(p) => match p {
                PinError::BadValue | PinError::NotRetained(_) | PinError::NoTableAtState(..) => {
                    libc::EINVAL
                }
                PinError::NotPinnable => libc::ENOTSUP,
                PinError::Persist(_) => libc::EIO,
            },
            // The staged store is ours and verified; failing to read it is
            // an I/O error for the reader, logged by the adapter.
            ViewError::OpenBlob { .. } | ViewError::ReadBlob { .. } => libc::EIO,
        }
    }

    /// Expected outcomes (a miss, a probe) as opposed to faults worth a warning.
    pub fn is_routine(&self) -> bool {
        // User mistakes and misses: worth a debug line, not a warning.
        matches!(
            self,
            ViewError::NotFound
                | ViewError::NoAttr
                | ViewError::ReadOnly
                | ViewError::NotDir
                | ViewError::IsDir
                | ViewError::XattrNotSupported(_)
                | ViewError::Pin(
                    PinError::BadValue
                        | PinError::NotRetained(_)
                        | PinError::NoTableAtState(..)
                        | PinError::NotPinnable
                )
        )
    }
}

pub type Result<T, E = ViewError> = std::result::Result<T, E>;

/// Attributes of one inode (the adapter turns this into `FileAttr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    pub blocks: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    /// `st_blksize`: for a directory, sized to its listing (see
    /// `listing_blksize`), so one `getdents` buffer, and with it one
    /// READDIRPLUS request, takes the whole directory; 4096 otherwise.
    pub blksize: u32,
}

/// A successful lookup.
#[derive(Debug, Clone)]
pub struct Entry {
    pub attr: Attr,
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
}

/// What an `open` produced.
#[derive(Debug)]
pub struct Opened {
    pub fh: u64,
    pub content: OpenContent,
}

#[derive(Debug)]
pub enum OpenContent {
    /// A staged file of `size` bytes: immutable. The adapter may hand the
    /// descriptor to the kernel (passthrough) or serve reads from it with
    /// the page cache kept.
    Blob { file: Arc<File>, size: u64 },
    /// Generated per open (status): must bypass the page cache.
    Generated,
    /// A reader host's large file, fetched piece by piece as it is read:
    /// served in userspace (no backing file yet), page cache kept.
    Fetched,
}

/// A file whose bytes arrive as they are read (a reader host's large
/// file, SPEC §8).
pub trait FetchedFile: Send + Sync {
    /// Up to `size` bytes at `offset`, short only at the end of the file.
    /// The bytes may be shared with the file's own buffers (no copy).
    fn read_at(&self, offset: u64, size: u32) -> std::io::Result<Bytes>;
}

/// A reader host's content fetched on demand (SPEC §8): large files open
/// before they are whole, and `user.stagefs.warm` fetches ahead.
pub trait FetchedBlobs: Send + Sync {
    /// A reader for `blob` when it is not whole locally yet; `None`: open
    /// the blob's path as usual.
    fn open(&self, blob: &BlobId) -> std::io::Result<Option<Arc<dyn FetchedFile>>>;
    /// Fetches all of `blob` into the cache: the bytes fetched.
    fn warm(&self, blob: &BlobId) -> std::io::Result<u64>;
}

/// What an `opendir` produced.
#[derive(Debug, Clone, Copy)]
pub struct OpenedDir {
    pub fh: u64,
    /// The listing never changes: the kernel may cache it.
    pub immutable: bool,
}

/// TTL for immutable nodes: their content never changes.
const LONG_TTL: Duration = Duration::from_secs(24 * 3600);
/// Attributes of dynamic directories (mtime, nlink) may lag this long.
const SHORT_TTL: Duration = Duration::from_secs(1);
const NO_TTL: Duration = Duration::ZERO;

/// The mount's name for its hidden control directory.
pub const STAGEFS_NAME: &str = ".stagefs";

/// What an inode number currently denotes.
#[derive(Debug, Clone)]
enum Resolved {
    Root,
    StagefsDir,
    /// The status file: rendered per open (`None`, the fixed inode), or a
    /// copy rendered at lookup (no-open mode).
    StatusFile(Option<Arc<[u8]>>),
    SnapshotsDir,
    LiveDb(Name),
    SnapshotRoot(StateId, Arc<Tree>),
    Node {
        node: Node,
        live_table: Option<(Name, Name)>,
        /// The newest state it was reached in.
        state: Option<StateId>,
    },
}

pub struct View {
    catalog: Arc<Catalog>,
    blob_path: Arc<dyn Fn(&BlobId) -> PathBuf + Send + Sync>,
    status: Arc<dyn StatusSource>,
    cfg: ViewConfig,
    synthetic: Synthetic,
    nodes: NodeTable,
    handles: Handles,
    /// The kernel opens files without asking (see [`View::set_no_open`]).
    no_open: AtomicBool,
    next_rendered: AtomicU64,
    readers: Readers,
    /// Live table name → the inode its last lookup answered: the one the
    /// kernel's dentry at that name now points to.
    live_names: Mutex<HashMap<(Name, Name), u64>>,
    /// Directory handles released by `View::enforce_holds` so far.
    released_holds: AtomicU64,
    /// A reader host's states not retained here, loaded on demand from
    /// the URL (snapshot paths and jobs, SPEC §8).
    state_source: std::sync::OnceLock<StateSourceFn>,
    /// A reader host's fetched content (unset on a replicating mount).
    fetched: std::sync::OnceLock<Arc<dyn FetchedBlobs>>,
    /// Where the mount is (set by the adapter): working directories are
    /// read as paths under it.
    mountpoint: std::sync::OnceLock<PathBuf>,
    /// A table directory the kernel references may have left its live
    /// name, or must leave it before a reader's view moves: the adapter
    /// plans its entries at once ([`View::take_dentries_due`]).
    dentries_due: AtomicBool,
    /// Descriptors of blobs recently opened, reused by the next OPEN
    /// (shared with the views of sessions' own connections).
    blob_files: Arc<blob_files::BlobFiles>,
    /// A session's own connection (`stagefs run --private-mount`): the
    /// root shows this state and nothing else ([`View::session_view`]).
    fixed_root: std::sync::OnceLock<Arc<Tree>>,
    /// The views of sessions' own connections: each one's state is a GC
    /// root for as long as its connection lives.
    private_views: Mutex<Vec<std::sync::Weak<View>>>,
    /// Listings of directories read without a handle, by inode
    /// ([`View::unopened_dir`]).
    unopened_dirs: Mutex<HashMap<u64, Arc<Handle>>>,
}

/// Loads a state this mount does not retain (None: not available).
pub type StateSourceFn = Arc<dyn Fn(StateId) -> Option<Arc<Tree>> + Send + Sync>;

/// The catalog as one reader sees it: the snapshot (pins, retained
/// versions) and the tree its view shows where no pin applies.
struct Shown {
    snap: Arc<Snapshot>,
    base: Arc<Tree>,
}

impl Shown {
    /// The tree the mount root shows: the root pin, else the view.
    fn root_tree(&self) -> &Arc<Tree> {
        self.snap
            .pins
            .root
            .and_then(|s| self.snap.versions.get(&s))
            .unwrap_or(&self.base)
    }

    /// A table path resolves through its table pin, then the root's tree.
    fn table_tree(&self, db: &str, table: &str) -> &Arc<Tree> {
        self.snap
            .pins
            .tables
            .get(&format!("{db}.{table}"))
            .and_then(|s| self.snap.versions.get(s))
            .unwrap_or_else(|| self.root_tree())
    }
}

impl View {
    pub fn new(
        catalog: Arc<Catalog>,
        blob_path: Arc<dyn Fn(&BlobId) -> PathBuf + Send + Sync>,
        status: Arc<dyn StatusSource>,
        cfg: ViewConfig,
    ) -> View {
        View {
            catalog,
            blob_path,
            status,
            cfg,
            synthetic: Synthetic::default(),
            nodes: NodeTable::default(),
            handles: Handles::default(),
            no_open: AtomicBool::new(false),
            next_rendered: AtomicU64::new(FIRST_RENDERED),
            readers: Readers::from_env(),
            live_names: Mutex::new(HashMap::new()),
            released_holds: AtomicU64::new(0),
            state_source: std::sync::OnceLock::new(),
            fetched: std::sync::OnceLock::new(),
            mountpoint: std::sync::OnceLock::new(),
            dentries_due: AtomicBool::new(false),
            blob_files: Arc::new(blob_files::BlobFiles::for_this_process()),
            fixed_root: std::sync::OnceLock::new(),
            private_views: Mutex::new(Vec::new()),
            unopened_dirs: Mutex::new(HashMap::new()),
        }
    }

    /// The view of a connection of `caller`'s own, for its session
    /// (`stagefs run --private-mount`): its root is the session's state,
    /// so every name below it is immutable and cached by the kernel, and
    /// nothing on that connection depends on who asks. The state stays a
    /// GC root of this view (the one [`View::held_dirs`] is asked) for
    /// as long as the returned view lives: the adapter keeps it until the
    /// kernel ends the connection, so files a process of the session
    /// still reaches keep their bytes after the session's leader exited.
    pub fn session_view(&self, caller: Caller) -> Result<Arc<View>> {
        let Reader::Process(proc) = self.reader(caller) else {
            return Err(ViewError::Unattributed);
        };
        if self.fixed_root.get().is_some() {
            // Already a session's own connection: nothing to fix again.
            return Err(ViewError::NotInSession);
        }
        let snap = self.catalog.snapshot();
        let tree = self
            .readers
            .session_tree_of(proc, &snap)
            .ok_or(ViewError::NotInSession)?;
        let view = View {
            blob_files: Arc::clone(&self.blob_files),
            // One state for every process: no views to keep.
            readers: Readers::new(readers::ViewRule::default(), false),
            ..View::new(
                Arc::clone(&self.catalog),
                Arc::clone(&self.blob_path),
                Arc::clone(&self.status),
                self.cfg.clone(),
            )
        };
        let _ = view.fixed_root.set(tree);
        if let Some(fetched) = self.fetched.get() {
            view.set_fetched(Arc::clone(fetched));
        }
        if let Some(mountpoint) = self.mountpoint.get() {
            view.set_mountpoint(mountpoint);
        }
        let view = Arc::new(view);
        let mut privates = lock(&self.private_views);
        privates.retain(|v| v.strong_count() > 0);
        privates.push(Arc::downgrade(&view));
        Ok(view)
    }

    /// The states of the sessions' own connections the kernel still
    /// keeps (each one a GC root), one entry per connection, sorted.
    pub fn session_connection_states(&self) -> Vec<u64> {
        let mut states: Vec<u64> = lock(&self.private_views)
            .iter()
            .filter_map(|v| v.upgrade()?.fixed_state())
            .map(|s| s.0)
            .collect();
        states.sort_unstable();
        states
    }

    /// The state a session's own connection shows (None: a mount's
    /// ordinary view).
    pub fn fixed_state(&self) -> Option<StateId> {
        self.fixed_root.get().map(|t| t.state_id)
    }

    /// Whether `ino` is the mount's live root (the only node with the
    /// session, hold and visible attributes and the root pin); a
    /// session's own connection has none.
    fn is_live_root(&self, ino: u64) -> bool {
        ino == ROOT && self.fixed_root.get().is_none()
    }

    /// The mount's canonical path, set once by the adapter at mount.
    pub fn set_mountpoint(&self, path: &Path) {
        let _ = self.mountpoint.set(path.to_owned());
    }

    /// Whether a table directory's entry should be planned now rather
    /// than at the next pass ([`View::dentry_plan`]); clears the request.
    pub fn take_dentries_due(&self) -> bool {
        self.dentries_due.swap(false, Ordering::Relaxed)
    }

    /// A reader host's content: large files open before they are whole.
    pub fn set_fetched(&self, fetched: Arc<dyn FetchedBlobs>) {
        let _ = self.fetched.set(fetched);
    }

    /// Whether files may be fetched as they are read (a reader host):
    /// such reads need an open handle.
    pub fn serves_fetched(&self) -> bool {
        self.fetched.get().is_some()
    }

    /// `user.stagefs.warm` on a file: fetches it whole into the cache
    /// (a no-op where content is local); the bytes fetched.
    pub(crate) fn warm_file(&self, blob: &BlobId) -> Result<u64> {
        match self.fetched.get() {
            Some(f) => f.warm(blob).map_err(|source| ViewError::ReadBlob {
                path: PathBuf::from(blob.to_hex()),
                source,
            }),
            None => Ok(0),
        }
    }

    /// Where states this mount does not retain come from (a reader host:
    /// the URL). Set once, before mounting.
    pub fn set_state_source(&self, source: StateSourceFn) {
        let _ = self.state_source.set(source);
    }

    fn fetch_state(&self, id: StateId) -> Option<Arc<Tree>> {
        self.state_source.get().and_then(|f| f(id))
    }

    /// No-open mode: the kernel opens files without a request and reads
    /// without a handle ([`View::read_inode`]). The status file then cannot
    /// be rendered per open, so each lookup of it renders a fresh copy
    /// under a new inode (entry TTL zero: every path walk looks it up),
    /// which the kernel may cache like any immutable file. Set by the
    /// adapter at session start, before any lookup.
    pub fn set_no_open(&self, on: bool) {
        self.no_open.store(on, Ordering::Relaxed);
    }

    fn render_status(&self) -> Arc<[u8]> {
        let mut bytes = self.status_with_readers().into_bytes();
        if bytes.last() != Some(&b'\n') {
            bytes.push(b'\n');
        }
        bytes.into()
    }

    /// The readers' views and sessions of this mount.
    pub fn readers(&self) -> &Readers {
        &self.readers
    }

    fn reader(&self, caller: Caller) -> Reader {
        self.readers.identify(caller.pid)
    }

    /// The catalog as `reader` sees it now: a job's state (rule 10:
    /// `STAGEFS_STATE_ID`, `ESTALE` when this mount does not serve it;
    /// a state newer than the visible one is waited for a little, as a
    /// host a poll behind catches up), else its session's or view's.
    fn shown(&self, reader: Reader) -> Result<Shown> {
        let mut snap = self.catalog.snapshot();
        if let Some(job) = self.readers.job_state(reader, &snap) {
            let deadline = std::time::Instant::now() + JOB_STATE_WAIT;
            loop {
                if let Some(tree) = snap.versions.get(&job) {
                    let base = Arc::clone(tree);
                    return Ok(Shown { snap, base });
                }
                if job < snap.visible.state_id {
                    if let Some(base) = self.fetch_state(job) {
                        return Ok(Shown { snap, base });
                    }
                }
                if job <= snap.visible.state_id || std::time::Instant::now() >= deadline {
                    return Err(ViewError::JobStateGone(job));
                }
                std::thread::sleep(Duration::from_millis(20));
                snap = self.catalog.snapshot();
            }
        }
        let base = self
            .readers
            .tree_for_unless(reader, &snap, |proc, to| self.strands_cwd(proc, to, &snap));
        Ok(Shown { snap, base })
    }

    /// Whether moving `proc`'s view to `to` would strand its working
    /// directory (SPEC §3 rule 9): the directory is a table, or inside
    /// one, whose dentry still sits at the table's live name, and `to`
    /// answers another directory there. The process's next walk through
    /// that name would make the kernel drop the dentry in use, and
    /// `getcwd()` would fail until the adapter moved it to its snapshot
    /// path. So the move waits (the view keeps its state for this
    /// request) and the adapter is asked to move it now. Read only when
    /// the rule would move a view, and only while such a table exists.
    fn strands_cwd(&self, proc: readers::ProcId, to: &Tree, snap: &Snapshot) -> bool {
        let Some(mount) = self.mountpoint.get() else {
            return false;
        };
        // Pinned names answer the same in every view.
        if snap.pins.root.is_some() {
            return false;
        }
        let live_names = lock(&self.live_names).clone();
        let mut at_live = Vec::new();
        self.nodes.for_each(|ino, entry| {
            let Some(live) = entry
                .live
                .as_ref()
                .filter(|l| !l.spliced && !l.splice_failed)
            else {
                return;
            };
            let key = (Name::clone(&live.db), Name::clone(&live.table));
            let pinned = snap
                .pins
                .tables
                .contains_key(&format!("{}.{}", live.db, live.table));
            let answers = to.table(&live.db, &live.table).map(|t| t.meta.id.0);
            if live_names.get(&key) == Some(&ino) && !pinned && answers != Some(ino) {
                at_live.push(mount.join(&*live.db).join(&*live.table));
            }
        });
        if at_live.is_empty() {
            return false;
        }
        let Some(cwd) = readers::cwd_of(proc.pid) else {
            return false;
        };
        let stranded = at_live.iter().any(|table| cwd.starts_with(table));
        if stranded {
            self.dentries_due.store(true, Ordering::Relaxed);
        }
        stranded
    }

    /// Directories readers hold open, whose files must stay readable even
    /// after retention lets their version go (SPEC §3.4): garbage collection
    /// keeps the blobs below them while the handles are open. (An open file
    /// needs nothing: it holds its blob's descriptor; in no-open mode every
    /// directory the kernel references is held, see below.)
    ///
    /// Also held: the trees readers' views show, and table directories in
    /// use after their live name moved on (working directories, see
    /// [`View::dentry_plan`]), released once the kernel forgets them.
    ///
    /// Handles of users other than the mounting user and root hold at most
    /// [`HOLD_LIMIT`] old versions per user: holds past it are released
    /// here, oldest first, and are no roots (see `View::enforce_holds`).
    pub fn held_dirs(&self) -> Vec<Arc<DirNode>> {
        let snap = self.catalog.snapshot();
        self.enforce_holds(&snap);
        let mut out = Vec::new();
        // Sessions' own connections: each one's whole state, for as long
        // as the kernel keeps the connection (a process of the session
        // may walk anywhere in it at any time).
        lock(&self.private_views).retain(|v| match v.upgrade() {
            Some(private) => {
                out.extend(private.fixed_root.get().map(|t| Arc::clone(&t.root)));
                true
            }
            None => false,
        });
        self.handles.for_each_open_dir(|dir, hold| {
            if !hold.is_some_and(Hold::is_released) {
                out.push(Arc::clone(dir));
            }
        });
        if self.no_open.load(Ordering::Relaxed) {
            // No-open mode: a file is read without a handle holding its
            // blob, so every directory the kernel still references (a
            // dentry pins its parent) keeps the blobs below it.
            self.nodes.for_each(|_, entry| match &entry.held {
                Held::Node(Node::Dir(d)) => out.push(Arc::clone(d)),
                Held::SnapshotRoot(tree) => out.push(Arc::clone(&tree.root)),
                Held::Node(Node::File(_)) | Held::Rendered(_) => {}
            });
        }
        out.extend(
            self.readers
                .held_trees()
                .into_iter()
                .map(|t| Arc::clone(&t.root)),
        );
        // Table directories moved to their snapshot path because a working
        // directory is inside (or something else still holds them): only
        // those, not every cached dentry, or unused old entries the kernel
        // has not evicted yet would keep their blobs.
        self.nodes.for_each(|_, entry| {
            if let (Held::Node(Node::Dir(d)), Some(live)) = (&entry.held, &entry.live) {
                if live.spliced {
                    out.push(Arc::clone(d));
                }
            }
        });
        out
    }

    /// Whether `uid`'s holds count against [`HOLD_LIMIT`]: every user but
    /// the mounting user and root (only `--allow-other` lets them in).
    fn is_limited(&self, uid: u32) -> bool {
        uid != 0 && uid != self.cfg.uid
    }

    /// Per limited user, the old versions (neither retained nor pinned in
    /// `snap`) its unreleased holds keep.
    fn old_holds(&self, snap: &Snapshot) -> HashMap<u32, BTreeSet<StateId>> {
        let mut old: HashMap<u32, BTreeSet<StateId>> = HashMap::new();
        self.handles.for_each_open_dir(|_, hold| {
            if let Some(h) = hold.filter(|h| !h.is_released()) {
                if !snap.versions.contains_key(&h.state) {
                    old.entry(h.uid).or_default().insert(h.state);
                }
            }
        });
        old
    }

    /// Releases, per limited user, its holds on old versions past the
    /// newest [`HOLD_LIMIT`] distinct ones (counted in the status).
    fn enforce_holds(&self, snap: &Snapshot) {
        // Per user over the limit, the oldest version it may keep.
        let floor: HashMap<u32, StateId> = self
            .old_holds(snap)
            .into_iter()
            .filter_map(|(uid, states)| Some((uid, *states.iter().rev().nth(HOLD_LIMIT)?)))
            .collect();
        if floor.is_empty() {
            return;
        }
        let mut released = 0;
        self.handles.for_each_open_dir(|_, hold| {
            let Some(h) = hold else { return };
            let too_old = floor.get(&h.uid).is_some_and(|f| h.state <= *f);
            if too_old && !snap.versions.contains_key(&h.state) && h.release() {
                released += 1;
            }
        });
        self.released_holds.fetch_add(released, Ordering::Relaxed);
        tracing::warn!(
            released,
            limit = HOLD_LIMIT,
            "released directory handles of users who held too many old versions"
        );
    }

    /// The `holds` object of the status (docs/SEMANTICS.md "Bounds").
    fn holds_report(&self, snap: &Snapshot) -> serde_json::Value {
        let old = self.old_holds(snap);
        serde_json::json!({
            "limit_per_user": HOLD_LIMIT,
            "old_versions_held": old.values().map(BTreeSet::len).sum::<usize>(),
            "released_handles": self.released_holds.load(Ordering::Relaxed),
        })
    }

    /// What to do about table directories the kernel references through
    /// a live name (`MOUNT/<db>/<table>`) that no longer answers them: the
    /// visible state (with pins) moved on, or another reader's lookup
    /// answered another version there (the kernel then unhashed this one).
    /// `cwds` are the working directories of processes under the mount
    /// (`mount` is its path).
    ///
    /// - A working directory inside it (at its live path, or unhashed
    ///   there): [`DentryAction::Splice`] to the snapshot path of the
    ///   version it was reached in.
    /// - Otherwise, still at its live name: [`DentryAction::Invalidate`]
    ///   it, so an unused old version is forgotten (and collected) —
    ///   unless a reader's view, hold, session or job state (with no pin
    ///   over them) still answers it there: a process of that reader may
    ///   have entered it after the working directories were read, and the
    ///   invalidation would unhash its working directory (`getcwd`:
    ///   `ENOENT`). It is invalidated once no reader answers it.
    /// - A table already moved to a snapshot path that no working
    ///   directory uses any more: invalidate it there, so it is forgotten
    ///   once nothing holds it; likewise a snapshot root that retention
    ///   dropped.
    ///
    /// `cwds` is only called when some table needs a decision.
    pub fn dentry_plan(
        &self,
        mount: &Path,
        cwds: impl FnOnce() -> Vec<PathBuf>,
    ) -> Vec<DentryAction> {
        let snap = self.catalog.snapshot();
        let live_names = lock(&self.live_names).clone();
        let is_settled = |ino: u64, live: &LiveName| {
            let current = snap
                .table_tree(&live.db, &live.table)
                .table(&live.db, &live.table)
                .map(|t| t.meta.id.0);
            let key = (Name::clone(&live.db), Name::clone(&live.table));
            current == Some(ino) && live_names.get(&key) == Some(&ino)
        };
        let dropped_snapshot = |held: &Held| match held {
            Held::SnapshotRoot(tree) => !snap.versions.contains_key(&tree.state_id),
            Held::Node(_) | Held::Rendered(_) => false,
        };
        let mut pending = false;
        self.nodes.for_each(|ino, entry| {
            if let Some(live) = &entry.live {
                pending |= live.spliced || !is_settled(ino, live);
            }
            pending |= dropped_snapshot(&entry.held);
        });
        if !pending {
            return Vec::new();
        }
        let cwds = cwds();
        let under = |path: &Path| cwds.iter().any(|c| c.starts_with(path));
        let reader_trees = self.readers.answering_trees(&snap);
        // Pins win over readers' trees: a pinned table answers its pin.
        let answered_by_a_reader = |db: &str, table: &str, ino: u64| {
            Arc::ptr_eq(snap.table_tree(db, table), &snap.visible)
                && reader_trees
                    .iter()
                    .any(|t| t.table(db, table).map(|d| d.meta.id.0) == Some(ino))
        };
        let snapshots = mount.join(STAGEFS_NAME).join("snapshots");
        let mut out = Vec::new();
        let mut released = Vec::new();
        self.nodes.for_each(|ino, entry| {
            // A snapshot root that retention dropped stays reachable only
            // while something uses it; unused, the kernel should forget it.
            if let Held::SnapshotRoot(tree) = &entry.held {
                let name = tree.state_id.to_string();
                if dropped_snapshot(&entry.held) && !under(&snapshots.join(&name)) {
                    out.push(DentryAction::Invalidate {
                        parent: SNAPSHOTS_DIR,
                        name: name.into(),
                    });
                }
            }
            let Some(live) = &entry.live else {
                return;
            };
            let (db, table) = (&live.db, &live.table);
            let snapshot_path = mount
                .join(STAGEFS_NAME)
                .join("snapshots")
                .join(live.tree.state_id.to_string())
                .join(&**db)
                .join(&**table);
            if live.spliced {
                if !under(&snapshot_path) {
                    // No longer a working directory: stop holding it, and
                    // let the kernel drop it there. The snapshot path's
                    // database directory comes from the tree the table
                    // was reached in (the same nodes).
                    released.push(ino);
                    if let Some(parent) = live.tree.database(db).map(|d| d.meta.id.0) {
                        out.push(DentryAction::Invalidate {
                            parent,
                            name: Name::clone(table),
                        });
                    }
                }
                return;
            }
            if is_settled(ino, live) {
                return;
            }
            let hashed = live_names.get(&(Name::clone(db), Name::clone(table))) == Some(&ino);
            let live_path = mount.join(&**db).join(&**table);
            if under(&live_path) {
                out.push(DentryAction::Splice {
                    ino,
                    path: snapshot_path,
                });
            } else if hashed && !answered_by_a_reader(db, table, ino) {
                let parent = self.synthetic.ino(&SynthKey::LiveDb(Name::clone(db)));
                out.push(DentryAction::Invalidate {
                    parent,
                    name: Name::clone(table),
                });
            }
        });
        for ino in released {
            self.nodes.set_spliced_to(ino, false);
        }
        out
    }

    /// The adapter looked `ino`'s snapshot path up: its dentry lives there
    /// now (until a live lookup answers it again).
    pub fn spliced(&self, ino: u64) {
        self.nodes.set_spliced_to(ino, true);
    }

    /// The adapter's lookup of `ino`'s snapshot path did not move it
    /// there: views stop waiting for it (the next pass tries again).
    pub fn splice_failed(&self, ino: u64) {
        self.nodes.set_splice_failed(ino);
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Inodes the kernel currently references (catalog nodes and snapshot
    /// roots); for tests and metrics.
    pub fn referenced_inodes(&self) -> usize {
        self.nodes.len()
    }

    /// Open file and directory handles; for tests and metrics.
    pub fn open_handles(&self) -> usize {
        self.handles.len()
    }

    fn resolve(&self, ino: u64) -> Result<Resolved> {
        match ino {
            ROOT => {
                return Ok(match self.fixed_root.get() {
                    Some(tree) => Resolved::SnapshotRoot(tree.state_id, Arc::clone(tree)),
                    None => Resolved::Root,
                })
            }
            STAGEFS_DIR => return Ok(Resolved::StagefsDir),
            STATUS_FILE => return Ok(Resolved::StatusFile(None)),
            SNAPSHOTS_DIR => return Ok(Resolved::SnapshotsDir),
            _ => {}
        }
        if let Some(entry) = self.nodes.get(ino) {
            return Ok(match entry.held {
                Held::Node(node) => Resolved::Node {
                    node,
                    live_table: entry.live.filter(|l| !l.spliced).map(|l| (l.db, l.table)),
                    state: entry.state,
                },
                Held::SnapshotRoot(tree) => Resolved::SnapshotRoot(tree.state_id, tree),
                Held::Rendered(bytes) => Resolved::StatusFile(Some(bytes)),
            });
        }
        match self.synthetic.key(ino) {
            Some(SynthKey::LiveDb(db)) => Ok(Resolved::LiveDb(db)),
            // Forgotten by the kernel but asked about again (e.g. NFS-style
            // revalidation): serve it while the version is retained.
            Some(SynthKey::SnapshotRoot(id)) => {
                let snap = self.catalog.snapshot();
                let tree = self
                    .snapshot_tree(&snap, id)
                    .ok_or(ViewError::StaleInode(ino))?;
                Ok(Resolved::SnapshotRoot(id, tree))
            }
            None => Err(ViewError::StaleInode(ino)),
        }
    }

    // ---- lookup / forget / getattr -------------------------------------

    /// Resolves `name` in `parent` and counts one kernel reference to the
    /// result.
    pub fn lookup(&self, parent: u64, name: &OsStr, caller: Caller) -> Result<Entry> {
        let name = name.to_str().ok_or(ViewError::NotFound)?;
        let snap = self.catalog.snapshot();
        match self.resolve(parent)? {
            Resolved::Root => {
                if name == STAGEFS_NAME {
                    return Ok(self.fixed_entry(STAGEFS_DIR, &snap));
                }
                let shown = self.shown(self.reader(caller))?;
                if !live_db_exists(&shown, name) {
                    return Err(ViewError::NotFound);
                }
                let ino = self.synthetic.ino(&SynthKey::LiveDb(name.into()));
                Ok(Entry {
                    attr: self.live_db_attr(ino, &shown, name),
                    entry_ttl: NO_TTL,
                    attr_ttl: SHORT_TTL,
                })
            }
            Resolved::LiveDb(db) => {
                let shown = self.shown(self.reader(caller))?;
                let tree = shown.table_tree(&db, name);
                let table = tree.table(&db, name).ok_or(ViewError::NotFound)?;
                let node = Node::Dir(Arc::clone(table));
                let ino = node.id().0;
                let attr = self.node_attr(&node);
                let live = LiveName {
                    db: Name::clone(&db),
                    table: name.into(),
                    tree: Arc::clone(tree),
                    spliced: false,
                    splice_failed: false,
                };
                let state = Some(tree.state_id);
                let was_spliced = self
                    .nodes
                    .looked_up(ino, Held::Node(node), Some(live), state);
                let before = lock(&self.live_names).insert((db, name.into()), ino);
                // Another directory answered here (the kernel dropped the
                // one it had: a working directory?), or a moved one came
                // back: the adapter should look at once.
                if was_spliced || before.is_some_and(|b| b != ino) {
                    self.dentries_due.store(true, Ordering::Relaxed);
                }
                Ok(Entry {
                    attr,
                    entry_ttl: NO_TTL,
                    attr_ttl: LONG_TTL,
                })
            }
            Resolved::StagefsDir => match name {
                "status" if self.no_open.load(Ordering::Relaxed) => {
                    let bytes = self.render_status();
                    // Read-your-check, as at an open of the status file.
                    self.readers
                        .checked(self.reader(caller), &self.catalog.snapshot());
                    let ino = self.next_rendered.fetch_add(1, Ordering::Relaxed);
                    let attr = self.rendered_attr(ino, &bytes);
                    self.nodes.looked_up(ino, Held::Rendered(bytes), None, None);
                    Ok(Entry {
                        attr,
                        entry_ttl: NO_TTL,
                        attr_ttl: LONG_TTL,
                    })
                }
                "status" => Ok(self.fixed_entry(STATUS_FILE, &snap)),
                "snapshots" => Ok(self.fixed_entry(SNAPSHOTS_DIR, &snap)),
                _ => Err(ViewError::NotFound),
            },
            Resolved::SnapshotsDir => {
                let id = parse_state_id(name).ok_or(ViewError::NotFound)?;
                let tree = self.snapshot_tree(&snap, id).ok_or(ViewError::NotFound)?;
                let ino = self.synthetic.ino(&SynthKey::SnapshotRoot(id));
                let attr = self.snapshot_root_attr(ino, &tree);
                self.nodes
                    .looked_up(ino, Held::SnapshotRoot(tree), None, Some(id));
                // The name disappears when retention drops the version.
                Ok(Entry {
                    attr,
                    entry_ttl: NO_TTL,
                    attr_ttl: LONG_TTL,
                })
            }
            Resolved::SnapshotRoot(id, tree) => self.child_entry(&tree.root, name, Some(id)),
            Resolved::Node {
                node: Node::Dir(dir),
                state,
                ..
            } => self.child_entry(&dir, name, state),
            Resolved::Node {
                node: Node::File(_),
                ..
            }
            | Resolved::StatusFile(_) => Err(ViewError::NotDir),
        }
    }

    /// A retained version, or one a working directory still holds (the
    /// kernel references a table reached in it): its snapshot path stays
    /// reachable for the splice of [`View::dentry_plan`].
    fn snapshot_tree(&self, snap: &Snapshot, id: StateId) -> Option<Arc<Tree>> {
        if let Some(tree) = snap.versions.get(&id) {
            return Some(Arc::clone(tree));
        }
        let mut found = None;
        self.nodes.for_each(|_, entry| {
            if let Held::SnapshotRoot(tree) = &entry.held {
                if tree.state_id == id {
                    found = Some(Arc::clone(tree));
                }
            }
            if let Some(live) = &entry.live {
                if live.tree.state_id == id {
                    found = Some(Arc::clone(&live.tree));
                }
            }
        });
        found
            .or_else(|| {
                self.readers
                    .held_trees()
                    .into_iter()
                    .find(|t| t.state_id == id)
            })
            .or_else(|| self.fetch_state(id))
    }

    /// A child of `dir`, which was reached in `state`.
    fn child_entry(&self, dir: &DirNode, name: &str, state: Option<StateId>) -> Result<Entry> {
        let node = dir.child(name).ok_or(ViewError::NotFound)?.clone();
        Ok(self.node_entry(node, state))
    }

    /// The entry of an immutable `node` reached in `state`, counting one
    /// kernel reference.
    fn node_entry(&self, node: Node, state: Option<StateId>) -> Entry {
        let ino = node.id().0;
        let attr = self.node_attr(&node);
        self.nodes.looked_up(ino, Held::Node(node), None, state);
        Entry {
            attr,
            entry_ttl: LONG_TTL,
            attr_ttl: LONG_TTL,
        }
    }

    fn fixed_entry(&self, ino: u64, snap: &Snapshot) -> Entry {
        Entry {
            attr: self.fixed_attr(ino, snap),
            entry_ttl: LONG_TTL,
            attr_ttl: if ino == STATUS_FILE {
                NO_TTL
            } else {
                SHORT_TTL
            },
        }
    }

    /// The kernel dropped `nlookup` references to `ino`.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.nodes.forget(ino, nlookup);
    }

    /// How many references the kernel holds on `ino` (tests).
    pub fn lookup_count(&self, ino: u64) -> u64 {
        self.nodes.lookups(ino)
    }

    pub fn getattr(&self, ino: u64, caller: Caller) -> Result<(Attr, Duration)> {
        let snap = self.catalog.snapshot();
        Ok(match self.resolve(ino)? {
            Resolved::Root => {
                let shown = self.shown(self.reader(caller))?;
                (self.root_attr(&shown), SHORT_TTL)
            }
            Resolved::StatusFile(Some(bytes)) => (self.rendered_attr(ino, &bytes), LONG_TTL),
            r @ (Resolved::StagefsDir | Resolved::StatusFile(None) | Resolved::SnapshotsDir) => {
                let e = self.fixed_entry(fixed_ino(&r), &snap);
                (e.attr, e.attr_ttl)
            }
            Resolved::LiveDb(db) => {
                let shown = self.shown(self.reader(caller))?;
                (self.live_db_attr(ino, &shown, &db), SHORT_TTL)
            }
            Resolved::SnapshotRoot(_, tree) => (self.snapshot_root_attr(ino, &tree), LONG_TTL),
            Resolved::Node { node, .. } => (self.node_attr(&node), LONG_TTL),
        })
    }

    fn time(&self, time_ms: i64) -> SystemTime {
        if time_ms == UNKNOWN_TIME {
            return self.cfg.mount_time;
        }
        let d = Duration::from_millis(time_ms.unsigned_abs());
        let t = if time_ms >= 0 {
            UNIX_EPOCH.checked_add(d)
        } else {
            UNIX_EPOCH.checked_sub(d)
        };
        t.unwrap_or(self.cfg.mount_time)
    }

    /// A directory with `subdirs` subdirectories among its `entries`.
    fn dir_attr(&self, ino: u64, subdirs: usize, entries: usize, time_ms: i64) -> Attr {
        Attr {
            ino,
            kind: FileKind::Directory,
            size: 0,
            blocks: 0,
            perm: 0o555,
            nlink: 2u32.saturating_add(subdirs.try_into().unwrap_or(u32::MAX)),
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            mtime: self.time(time_ms),
            blksize: listing_blksize(entries),
        }
    }

    fn node_attr(&self, node: &Node) -> Attr {
        match node {
            Node::Dir(d) => self.dir_attr(
                d.meta.id.0,
                subdir_count(d),
                d.children.len(),
                d.meta.time_ms,
            ),
            Node::File(f) => Attr {
                ino: f.meta.id.0,
                kind: FileKind::RegularFile,
                size: f.size(),
                blocks: f.size().div_ceil(512),
                perm: 0o444,
                nlink: 1,
                uid: self.cfg.uid,
                gid: self.cfg.gid,
                mtime: self.time(f.meta.time_ms),
                blksize: FILE_BLKSIZE,
            },
        }
    }

    fn root_attr(&self, shown: &Shown) -> Attr {
        let tree = shown.root_tree();
        // + 1 for `.stagefs`, a subdirectory even if unlisted.
        let dbs = root_listing(shown).len() + 1;
        self.dir_attr(ROOT, dbs, dbs, tree.root.meta.time_ms)
    }

    fn fixed_attr(&self, ino: u64, snap: &Snapshot) -> Attr {
        match ino {
            STATUS_FILE => Attr {
                ino,
                kind: FileKind::RegularFile,
                // Rendered at open and read with direct I/O, so the size
                // is not known beforehand; readers read to EOF.
                size: 0,
                blocks: 0,
                perm: 0o444,
                nlink: 1,
                uid: self.cfg.uid,
                gid: self.cfg.gid,
                mtime: SystemTime::now(),
                blksize: FILE_BLKSIZE,
            },
            SNAPSHOTS_DIR => {
                let n = snap.versions.len();
                self.dir_attr(ino, n, n, UNKNOWN_TIME)
            }
            _ => self.dir_attr(ino, 1, 2, UNKNOWN_TIME),
        }
    }

    fn rendered_attr(&self, ino: u64, bytes: &[u8]) -> Attr {
        let size = bytes.len() as u64;
        Attr {
            ino,
            kind: FileKind::RegularFile,
            size,
            blocks: size.div_ceil(512),
            perm: 0o444,
            nlink: 1,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            mtime: SystemTime::now(),
            blksize: FILE_BLKSIZE,
        }
    }

    fn live_db_attr(&self, ino: u64, shown: &Shown, db: &str) -> Attr {
        let tables = live_db_tables(shown, db).len();
        let time = live_db_node(shown, db).map_or(UNKNOWN_TIME, |d| d.meta.time_ms);
        self.dir_attr(ino, tables, tables, time)
    }

    fn snapshot_root_attr(&self, ino: u64, tree: &Tree) -> Attr {
        let dbs = tree.root.children.len();
        self.dir_attr(ino, dbs, dbs, tree.time_ms)
    }

    // ---- directories ----------------------------------------------------

    pub fn opendir(&self, ino: u64, caller: Caller) -> Result<OpenedDir> {
        let (listing, version) = self.listing(ino, caller)?;
        let hold = version
            .filter(|_| self.is_limited(caller.uid))
            .map(|state| Hold::new(caller.uid, state));
        let handle = DirHandle::new(listing, hold);
        let immutable = handle.is_immutable();
        let fh = self.handles.insert(Handle::Dir(handle));
        Ok(OpenedDir { fh, immutable })
    }

    /// What `ino` lists for `caller`, and the version an immutable listing
    /// belongs to.
    fn listing(&self, ino: u64, caller: Caller) -> Result<(Listing, Option<StateId>)> {
        let snap = self.catalog.snapshot();
        let mut version = None;
        let listing = match self.resolve(ino)? {
            Resolved::Root => {
                let mut entries = dots(ino, ROOT);
                for (name, _) in root_listing(&self.shown(self.reader(caller))?) {
                    let child = self.synthetic.ino(&SynthKey::LiveDb(Name::clone(&name)));
                    push(&mut entries, child, FileKind::Directory, name);
                }
                Listing::Fixed(entries)
            }
            Resolved::StagefsDir => {
                let mut entries = dots(ino, ROOT);
                push(
                    &mut entries,
                    STATUS_FILE,
                    FileKind::RegularFile,
                    "status".into(),
                );
                push(
                    &mut entries,
                    SNAPSHOTS_DIR,
                    FileKind::Directory,
                    "snapshots".into(),
                );
                Listing::Fixed(entries)
            }
            Resolved::SnapshotsDir => {
                let mut entries = dots(ino, STAGEFS_DIR);
                for id in snap.versions.keys() {
                    let child = self.synthetic.ino(&SynthKey::SnapshotRoot(*id));
                    push(
                        &mut entries,
                        child,
                        FileKind::Directory,
                        id.to_string().into(),
                    );
                }
                Listing::Fixed(entries)
            }
            Resolved::LiveDb(db) => {
                let mut entries = dots(ino, ROOT);
                for (name, table) in live_db_tables(&self.shown(self.reader(caller))?, &db) {
                    push(&mut entries, table.meta.id.0, FileKind::Directory, name);
                }
                Listing::Fixed(entries)
            }
            Resolved::SnapshotRoot(id, tree) => {
                version = Some(id);
                Listing::Tree {
                    dir: Arc::clone(&tree.root),
                    ino,
                    // A session's own connection: the state is the root.
                    parent: if ino == ROOT { ROOT } else { SNAPSHOTS_DIR },
                }
            }
            Resolved::Node {
                node: Node::Dir(dir),
                state,
                ..
            } => {
                version = state;
                Listing::Tree {
                    dir,
                    ino,
                    // `..` of an immutable node is ambiguous (shared between
                    // versions); the kernel resolves `..` itself.
                    parent: ino,
                }
            }
            Resolved::Node {
                node: Node::File(_),
                ..
            }
            | Resolved::StatusFile(_) => return Err(ViewError::NotDir),
        };
        Ok((listing, version))
    }

    /// A directory the kernel opened without a request (a session's own
    /// connection, where every directory is immutable and the kernel
    /// caches its listing): read with file handle 0. Its listing is kept
    /// per inode (at most [`UNOPENED_DIRS`]) so that a sequential read
    /// resumes where the last request ended.
    fn unopened_dir(&self, ino: u64, caller: Caller) -> Result<Arc<Handle>> {
        if let Some(h) = lock(&self.unopened_dirs).get(&ino) {
            return Ok(Arc::clone(h));
        }
        let (listing, _) = self.listing(ino, caller)?;
        let handle = Arc::new(Handle::Dir(DirHandle::new(listing, None)));
        let mut dirs = lock(&self.unopened_dirs);
        if dirs.len() >= UNOPENED_DIRS {
            dirs.clear();
        }
        dirs.insert(ino, Arc::clone(&handle));
        Ok(handle)
    }

    /// [`View::readdir`] of a directory opened without a request.
    pub fn readdir_unopened(
        &self,
        ino: u64,
        offset: u64,
        caller: Caller,
        add: impl FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        read_dir_handle(&*self.unopened_dir(ino, caller)?, 0, offset, add)
    }

    /// Feeds the entries after `offset` to `add`, which returns `true` when
    /// the reply is full (that entry is not consumed).
    pub fn readdir(&self, fh: u64, offset: u64, add: impl FnMut(DirEntry) -> bool) -> Result<()> {
        let handle = self.handles.get(fh).ok_or(ViewError::BadHandle(fh))?;
        read_dir_handle(&handle, fh, offset, add)
    }

    /// `readdirplus`: the entries after `offset`, each with what a lookup
    /// of its name in `dir` answers now — the same [`View::lookup`], so
    /// root and database levels resolve through the same state (and keep
    /// their zero entry TTL) while immutable levels get long TTLs. Each
    /// entry `add` takes counts one kernel reference, as the kernel links
    /// it like a lookup; an entry `add` refuses (reply full) is not
    /// counted. `.` and `..` carry no reference (the kernel skips them).
    /// A name that no longer resolves (dropped since `opendir`) is left out.
    ///
    /// An immutable directory (`dir` is a catalog node or a snapshot root,
    /// whose inode always denotes the listing the handle holds) is resolved
    /// once per request, and each child comes with its node from the
    /// listing: what [`View::lookup`] would find, without finding it again.
    pub fn readdirplus(
        &self,
        dir: u64,
        fh: u64,
        offset: u64,
        caller: Caller,
        mut add: impl FnMut(&DirEntry, &Entry) -> bool,
    ) -> Result<()> {
        let handle = match fh {
            0 => self.unopened_dir(dir, caller)?,
            fh => self.handles.get(fh).ok_or(ViewError::BadHandle(fh))?,
        };
        let Handle::Dir(listing) = &*handle else {
            return Err(ViewError::NotDir);
        };
        if listing.is_released() {
            return Err(ViewError::Released(fh));
        }
        // The state a lookup in `dir` would record for its children.
        let reached = if listing.is_immutable() {
            match self.resolve(dir)? {
                Resolved::SnapshotRoot(id, _) => Some(Some(id)),
                Resolved::Node { state, .. } => Some(state),
                _ => None,
            }
        } else {
            None
        };
        let mut taken = 0usize;
        let mut failed = None;
        listing.read_nodes(offset, &mut |mut e, node| {
            if &*e.name == "." || &*e.name == ".." {
                let entry = Entry {
                    attr: self.dir_attr(e.ino, 0, 0, UNKNOWN_TIME),
                    entry_ttl: NO_TTL,
                    attr_ttl: NO_TTL,
                };
                return add(&e, &entry);
            }
            let looked_up = match (node, reached) {
                (Some(node), Some(state)) => Ok(self.node_entry(node.clone(), state)),
                _ => self.lookup(dir, OsStr::new(&*e.name), caller),
            };
            match looked_up {
                Ok(entry) => {
                    e.ino = entry.attr.ino;
                    let full = add(&e, &entry);
                    if full {
                        self.forget(entry.attr.ino, 1);
                    } else {
                        taken += 1;
                    }
                    full
                }
                Err(ViewError::NotFound) => false,
                Err(err) => {
                    failed = Some(err);
                    true
                }
            }
        });
        match failed {
            // Entries already taken are linked by the kernel: answer them
            // and let the next request meet the error.
            Some(err) if taken == 0 => Err(err),
            _ => Ok(()),
        }
    }

    pub fn releasedir(&self, fh: u64) {
        self.handles.remove(fh);
    }

    // ---- files ----------------------------------------------------------

    /// Opens a file for reading; any write intent is `EROFS`.
    pub fn open(&self, ino: u64, flags: i32, caller: Caller) -> Result<Opened> {
        let writes = (flags & libc::O_ACCMODE) != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) != 0;
        let handle = match self.resolve(ino)? {
            Resolved::StatusFile(rendered) => {
                if writes {
                    return Err(ViewError::ReadOnly);
                }
                let bytes = rendered.unwrap_or_else(|| self.render_status());
                // Read-your-check: whoever read the status sees at least
                // the visible state it reports.
                self.readers
                    .checked(self.reader(caller), &self.catalog.snapshot());
                Handle::Generated(bytes)
            }
            Resolved::Node {
                node: Node::File(f),
                ..
            } => {
                if writes {
                    return Err(ViewError::ReadOnly);
                }
                let fetched = match self.fetched.get() {
                    Some(blobs) => blobs
                        .open(&f.blob())
                        .map_err(|source| ViewError::OpenBlob {
                            path: PathBuf::from(f.blob().to_hex()),
                            source,
                        })?,
                    None => None,
                };
                if let Some(file) = fetched {
                    let fh = self.handles.insert(Handle::Fetched(file));
                    return Ok(Opened {
                        fh,
                        content: OpenContent::Fetched,
                    });
                }
                let blob = f.blob();
                let path = (self.blob_path)(&blob);
                // The handle owns its clone of the descriptor: its bytes
                // stay readable after the cache or GC lets them go.
                let file =
                    self.blob_files
                        .open(&blob, &path)
                        .map_err(|source| ViewError::OpenBlob {
                            path: path.clone(),
                            source,
                        })?;
                Handle::Blob {
                    ino,
                    file,
                    size: f.size(),
                }
            }
            Resolved::Root
            | Resolved::StagefsDir
            | Resolved::SnapshotsDir
            | Resolved::LiveDb(_)
            | Resolved::SnapshotRoot(..)
            | Resolved::Node {
                node: Node::Dir(_), ..
            } => {
                return Err(if writes {
                    ViewError::ReadOnly
                } else {
                    ViewError::IsDir
                })
            }
        };
        let content = match &handle {
            Handle::Blob { file, size, .. } => OpenContent::Blob {
                file: Arc::clone(file),
                size: *size,
            },
            Handle::Generated(_) | Handle::Dir(_) => OpenContent::Generated,
            Handle::Fetched(_) => OpenContent::Fetched,
        };
        let fh = self.handles.insert(handle);
        Ok(Opened { fh, content })
    }

    /// The status JSON with this mount's `readers` and `sessions` added
    /// (SPEC §7): views are the view layer's, not replication's.
    fn status_with_readers(&self) -> String {
        let json = self.status.status_json();
        let Ok(serde_json::Value::Object(mut map)) = serde_json::from_str(&json) else {
            return json;
        };
        let snap = self.catalog.snapshot();
        let r = self.readers.summary();
        let readers = crate::status::ReadersReport {
            views: r.views,
            oldest_view: r.oldest_view,
            unattributed_requests: r.unattributed_requests,
            view_moves: r.view_moves,
            starved_keeps: r.starved_keeps,
            busy_keeps: r.busy_keeps,
            cwd_keeps: r.cwd_keeps,
            dentry_invalidations: r.dentry_invalidations,
        };
        let sessions = crate::status::sessions_report(&snap.pins);
        if let (Ok(readers), Ok(sessions)) = (
            serde_json::to_value(readers),
            serde_json::to_value(sessions),
        ) {
            map.insert("readers".into(), readers);
            map.insert("sessions".into(), sessions);
        }
        map.insert("holds".into(), self.holds_report(&snap));
        map.insert(
            "session_connections".into(),
            serde_json::Value::from(self.session_connection_states()),
        );
        serde_json::to_string_pretty(&map).unwrap_or(json)
    }

    /// Reads up to `size` bytes at `offset` (short only at end of file).
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes> {
        let handle = self.handles.get(fh).ok_or(ViewError::BadHandle(fh))?;
        match &*handle {
            Handle::Generated(bytes) => Ok(slice_at(bytes, offset, size)),
            Handle::Blob { ino, file, .. } => read_blob(file, *ino, offset, size),
            Handle::Fetched(file) => {
                file.read_at(offset, size)
                    .map_err(|source| ViewError::ReadBlob {
                        path: PathBuf::from(format!("<handle {fh}>")),
                        source,
                    })
            }
            Handle::Dir(_) => Err(ViewError::IsDir),
        }
    }

    pub fn release(&self, fh: u64) {
        self.handles.remove(fh);
    }

    /// Closes kept blob descriptors whose blob garbage collection removed
    /// (from the adapter's maintenance pass), so no removed blob's disk
    /// space stays held by the cache; open handles keep their own.
    pub fn prune_blob_files(&self) {
        let closed = self.blob_files.prune();
        if closed > 0 {
            tracing::debug!(closed, "closed kept descriptors of removed blobs");
        }
    }

    /// Blob descriptors kept for the next OPEN (tests).
    pub fn kept_blob_files(&self) -> usize {
        self.blob_files.len()
    }

    /// Reads `ino` without a handle (no-open mode: the kernel sends file
    /// handle 0). A catalog file's blob is opened at its first read and
    /// kept until the kernel forgets the inode; the blob is still there
    /// because [`View::held_dirs`] keeps every referenced file's directory
    /// from garbage collection.
    pub fn read_inode(&self, ino: u64, offset: u64, size: u32) -> Result<Bytes> {
        match self.resolve(ino)? {
            Resolved::StatusFile(Some(bytes)) => Ok(slice_at(&bytes, offset, size)),
            Resolved::Node {
                node: Node::File(f),
                ..
            } => {
                let file = match self.nodes.get(ino).and_then(|e| e.blob) {
                    Some(file) => file,
                    None => {
                        let path = (self.blob_path)(&f.blob());
                        let file = File::open(&path)
                            .map_err(|source| ViewError::OpenBlob { path, source })?;
                        self.nodes.keep_blob(ino, Arc::new(file))
                    }
                };
                read_blob(&file, ino, offset, size)
            }
            // Rendered per open: never read without one.
            Resolved::StatusFile(None) => Err(ViewError::BadHandle(0)),
            Resolved::Root
            | Resolved::StagefsDir
            | Resolved::SnapshotsDir
            | Resolved::LiveDb(_)
            | Resolved::SnapshotRoot(..)
            | Resolved::Node {
                node: Node::Dir(_), ..
            } => Err(ViewError::IsDir),
        }
    }

    /// `access(2)`: any write request is refused, the rest allowed (modes
    /// already say read-only).
    pub fn access(&self, ino: u64, mask: i32) -> Result<()> {
        self.resolve(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(ViewError::ReadOnly);
        }
        Ok(())
    }
}

fn fixed_ino(r: &Resolved) -> u64 {
    match r {
        Resolved::StagefsDir => STAGEFS_DIR,
        Resolved::StatusFile(_) => STATUS_FILE,
        Resolved::SnapshotsDir => SNAPSHOTS_DIR,
        Resolved::Root
        | Resolved::LiveDb(_)
        | Resolved::SnapshotRoot(..)
        | Resolved::Node { .. } => ROOT,
    }
}

/// Up to `size` bytes of `bytes` from `offset`.
fn slice_at(bytes: &[u8], offset: u64, size: u32) -> Bytes {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    Bytes::copy_from_slice(&bytes[start..end])
}

/// Reads up to `size` bytes of a blob at `offset` (short only at its end).
fn read_blob(file: &File, ino: u64, offset: u64, size: u32) -> Result<Bytes> {
    let mut buf = vec![0u8; size as usize];
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(ViewError::ReadBlob {
                    path: PathBuf::from(format!("<inode {ino}>")),
                    source,
                })
            }
        }
    }
    buf.truncate(done);
    Ok(Bytes::from(buf))
}

/// `st_blksize` of files: the page size (stdio buffers, `cp`).
const FILE_BLKSIZE: u32 = 4096;

/// Bytes one READDIRPLUS entry takes in the kernel's buffer: the 128-byte
/// entry reply, the 24-byte dirent header and the name padded to 8 bytes
/// (24 bytes allowed for it).
const DIRENTPLUS_BYTES: usize = 176;

/// Largest `st_blksize` given to a directory: the kernel's readdir buffer
/// is capped at `max_pages` (256 pages, `/proc/sys/fs/fuse/max_pages_limit`).
const MAX_DIR_BLKSIZE: usize = 1 << 20;

/// `st_blksize` for a directory of `entries` names. glibc's `opendir`
/// sizes its `getdents` buffer from it (at least 32 KiB, at most 1 MiB),
/// and since Linux 6.16 the kernel sizes each READDIRPLUS request from
/// that buffer (up to `max_pages`). A buffer that fits the whole listing
/// lets a cold `find` or `ls -l` read a directory of a thousand files in
/// one request plus the end-of-listing one, instead of one per 32 KiB
/// (about 190 entries). A power of two (the kernel keeps its log2);
/// the page size while the listing fits glibc's default buffer.
fn listing_blksize(entries: usize) -> u32 {
    let bytes = entries.saturating_add(2).saturating_mul(DIRENTPLUS_BYTES);
    let size = bytes.next_power_of_two().clamp(4096, MAX_DIR_BLKSIZE);
    let size = if size <= 32 << 10 { 4096 } else { size };
    u32::try_from(size).unwrap_or(4096)
}

/// Number of subdirectories, for `nlink`. Partition levels hold only
/// directories; a leaf holds files and, from Hive, possibly a few
/// subdirectories (`delta_…`) among them: those are counted, except in a
/// leaf too large to scan per `getattr`, where the first child decides.
fn subdir_count(d: &DirNode) -> usize {
    const SCAN_LIMIT: usize = 4096;
    match d.kind {
        DirKind::Root | DirKind::Database => d.children.len(),
        DirKind::Table { .. } | DirKind::Partition { .. } | DirKind::Subdir => {
            if d.children.len() <= SCAN_LIMIT {
                d.children
                    .values()
                    .filter(|c| matches!(c, Node::Dir(_)))
                    .count()
            } else {
                match d.children.get_min() {
                    Some((_, Node::Dir(_))) => d.children.len(),
                    Some((_, Node::File(_))) | None => 0,
                }
            }
        }
    }
}

fn dots(ino: u64, parent: u64) -> Vec<DirEntry> {
    vec![
        DirEntry {
            ino,
            offset: 1,
            kind: FileKind::Directory,
            name: ".".into(),
        },
        DirEntry {
            ino: parent,
            offset: 2,
            kind: FileKind::Directory,
            name: "..".into(),
        },
    ]
}

fn push(entries: &mut Vec<DirEntry>, ino: u64, kind: FileKind, name: Name) {
    let offset = entries.len() as u64 + 1;
    entries.push(DirEntry {
        ino,
        offset,
        kind,
        name,
    });
}

/// A decimal state-id as written in `snapshots/<id>` (no sign, no leading
/// `+`, no leading zeros, so each id has exactly one name).
fn parse_state_id(s: &str) -> Option<StateId> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok().map(StateId)
}

/// `(db, table)` of every table pin.
fn table_pins(shown: &Shown) -> impl Iterator<Item = (&str, &str)> {
    shown
        .snap
        .pins
        .tables
        .keys()
        .filter_map(|label| label.split_once('.'))
}

/// The databases the root lists: those of the tree the root shows, plus
/// those that exist only through a table pin.
fn root_listing(snap: &Shown) -> std::collections::BTreeMap<Name, ()> {
    let mut out: std::collections::BTreeMap<Name, ()> = snap
        .root_tree()
        .root
        .children
        .keys()
        .map(|k| (Name::clone(k), ()))
        .collect();
    for (db, table) in table_pins(snap) {
        if snap.table_tree(db, table).table(db, table).is_some() {
            out.insert(db.into(), ());
        }
    }
    out
}

fn live_db_exists(snap: &Shown, db: &str) -> bool {
    live_db_node(snap, db).is_some()
}

/// The database node a live database directory takes its attributes from:
/// the root's tree, else the tree of a table pin inside it.
fn live_db_node<'a>(snap: &'a Shown, db: &str) -> Option<&'a Arc<DirNode>> {
    if let Some(node) = snap.root_tree().database(db) {
        return Some(node);
    }
    table_pins(snap)
        .filter(|(d, _)| *d == db)
        .find_map(|(d, t)| {
            let tree = snap.table_tree(d, t);
            tree.table(d, t)?;
            tree.database(d)
        })
}

/// The tables a live database directory lists, each resolved through its
/// own pin (table pin, else root pin, else visible).
fn live_db_tables(snap: &Shown, db: &str) -> Vec<(Name, Arc<DirNode>)> {
    let mut out = std::collections::BTreeMap::new();
    if let Some(d) = snap.root_tree().database(db) {
        for name in d.children.keys() {
            if let Some(t) = snap.table_tree(db, name).table(db, name) {
                out.insert(Name::clone(name), Arc::clone(t));
            }
        }
    }
    for (d, t) in table_pins(snap) {
        if d == db {
            if let Some(node) = snap.table_tree(d, t).table(d, t) {
                out.insert(Name::from(t), Arc::clone(node));
            }
        }
    }
    out.into_iter().collect()
}

/// Feeds the entries of directory handle `handle` (file handle `fh`)
/// after `offset` to `add`.
fn read_dir_handle(
    handle: &Handle,
    fh: u64,
    offset: u64,
    mut add: impl FnMut(DirEntry) -> bool,
) -> Result<()> {
    match handle {
        Handle::Dir(dir) if dir.is_released() => Err(ViewError::Released(fh)),
        Handle::Dir(dir) => {
            dir.read(offset, &mut add);
            Ok(())
        }
        Handle::Blob { .. } | Handle::Generated(_) | Handle::Fetched(_) => Err(ViewError::NotDir),
    }
}

/// Directories read without a handle whose listings are kept (a session's
/// own connection); past it the kept ones are dropped.
const UNOPENED_DIRS: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single map operations only: never half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
